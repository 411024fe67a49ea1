//! What a pod's containers see: volumes (emptyDir, Secrets, ConfigMaps,
//! PVCs), images checked, environment resolved (Secret and field refs).

use super::*;

/// Volume name → (host folder, mounted read-only whatever the mount says: a PVC claimed
/// `readOnly`, Secret volumes); `None` when stopped while waiting for a volume.
pub(super) async fn prepare_volumes(ctx: &Ctx) -> Option<BTreeMap<String, (PathBuf, bool)>> {
    let mut out = BTreeMap::new();
    for v in arr(&ctx.pod["spec"]["volumes"]) {
        let name = v["name"].as_str().unwrap_or_default().to_string();
        let own = ctx.dir.join("volumes").join(&name);
        let host = if v["image"].is_object() {
            image_volume(ctx, &name, v["image"]["reference"].as_str().unwrap_or_default()).await?
        } else if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
            ctx.inner.pvcs.get(claim).cloned().unwrap_or(own)
        } else if let Some(p) = v["hostPath"]["path"].as_str() {
            PathBuf::from(p)
        } else if v["secret"].is_object() || v["configMap"].is_object() || v["projected"].is_object() {
            // Secret, ConfigMap and projected volumes: their objects' keys as files, written
            // once every object is there (a missing one: the pod waits, `FailedMount`).
            let sources: Vec<(&str, &Value)> = if v["projected"].is_object() {
                arr(&v["projected"]["sources"])
                    .iter()
                    .filter_map(|s| {
                        if s["secret"].is_object() {
                            Some(("secret", &s["secret"]))
                        } else if s["configMap"].is_object() {
                            Some(("configMap", &s["configMap"]))
                        } else {
                            None
                        }
                    })
                    .collect()
            } else if v["secret"].is_object() {
                vec![("secret", &v["secret"])]
            } else {
                vec![("configMap", &v["configMap"])]
            };
            loop {
                let mut found = Vec::new();
                let mut missing = None;
                for (kind, src) in &sources {
                    let (resource, what, obj_name) = if *kind == "secret" {
                        let n = src["secretName"].as_str().or(src["name"].as_str());
                        ("secrets", "secret", n.unwrap_or_default())
                    } else {
                        (
                            "configmaps",
                            "configmap",
                            src["name"].as_str().unwrap_or_default(),
                        )
                    };
                    match ctx.inner.get(resource, &ctx.ns, obj_name) {
                        Some(o) => found.push((o, *src)),
                        None if src["optional"] == json!(true) => {}
                        None => {
                            missing = Some(format!("{what} \"{obj_name}\" not found"));
                            break;
                        }
                    }
                }
                let Some(why) = missing else {
                    let _ = std::fs::create_dir_all(&own);
                    let mode = v["projected"]["defaultMode"].as_u64();
                    for (o, src) in &found {
                        write_secret_files(&own, o, src, mode.or(src["defaultMode"].as_u64()));
                    }
                    break;
                };
                ctx.event(
                    None,
                    "Warning",
                    "FailedMount",
                    &format!("MountVolume.SetUp failed for volume \"{name}\" : {why}"),
                    "kubelet",
                );
                if ctx.sleep_or_stop(Duration::from_secs(1)).await {
                    return None;
                }
            }
            own
        } else {
            own
        };
        let _ = std::fs::create_dir_all(&host);
        let ro = v["persistentVolumeClaim"]["readOnly"] == json!(true)
            || v["image"].is_object()
            || v["secret"].is_object()
            || v["configMap"].is_object()
            || v["projected"].is_object();
        out.insert(name, (host, ro));
    }
    Some(out)
}

/// An `image` volume: the image's root, mounted read-only (and executable: runtimes never
/// mounted it `noexec`, and the API's description stopped saying so in 1.36). Pulled as a
/// container image is (unknown: `ErrImagePull` events, then the pod waits); on a runtime too
/// old to mount one (containerd before 2.1, CRI-O before 1.31) the kubelet finds no mount
/// point and the pod's first container is never created (`CreateContainerError`, the
/// KEP-4639 behaviour; the message is the fake's). `None` when stopped while waiting.
async fn image_volume(ctx: &Ctx, name: &str, reference: &str) -> Option<PathBuf> {
    let first_waiting = |reason: &str, message: &str| {
        let w = json!({"waiting": {"reason": reason, "message": message}});
        ctx.with(|m| {
            let first = if m.init.is_empty() {
                &mut m.main
            } else {
                &mut m.init
            };
            if let Some(s) = first.first_mut() {
                s.state = w.clone();
            }
        })
    };
    if !runtime_mounts_images(&ctx.inner.runtime) {
        let msg = format!(
            "failed to generate container spec: image volume \"{name}\" has no mount point: the container runtime ({}) does not support image volumes",
            ctx.inner.runtime
        );
        first_waiting("CreateContainerError", &msg);
        ctx.event(None, "Warning", "Failed", &format!("Error: {msg}"), "kubelet");
        ctx.wait_stop().await;
        return None;
    }
    match check_image(&ctx.inner, reference) {
        ImageCheck::Known(root) => {
            ctx.event(
                None,
                "Normal",
                "Pulled",
                &format!("Container image \"{reference}\" already present on machine"),
                "kubelet",
            );
            Some(root)
        }
        ImageCheck::Invalid(msg) => {
            first_waiting("InvalidImageName", &msg);
            ctx.event(None, "Warning", "InspectFailed", &msg, "kubelet");
            ctx.wait_stop().await;
            None
        }
        ImageCheck::Unknown(full) => {
            ctx.event(
                None,
                "Normal",
                "Pulling",
                &format!("Pulling image \"{reference}\""),
                "kubelet",
            );
            let msg = format!(
                "rpc error: code = NotFound desc = failed to pull and unpack image \"{full}\": failed to resolve reference \"{full}\": {full}: not found"
            );
            first_waiting("ErrImagePull", &msg);
            ctx.event(
                None,
                "Warning",
                "Failed",
                &format!("Failed to pull image \"{reference}\": {msg}"),
                "kubelet",
            );
            ctx.wait_stop().await;
            None
        }
    }
}

/// Whether a node's `containerRuntimeVersion` mounts image volumes: containerd 2.1 or later,
/// CRI-O 1.31 or later.
pub(crate) fn runtime_mounts_images(runtime: &str) -> bool {
    let (name, version) = runtime.split_once("://").unwrap_or((runtime, ""));
    let mut parts = version.trim_start_matches('v').split(['.', '-', '+']);
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    match name {
        "containerd" => (major, minor) >= (2, 1),
        "cri-o" => (major, minor) >= (1, 31),
        _ => false,
    }
}

/// The files of a Secret's `data`, or a ConfigMap's `data` (text) and `binaryData` (base64),
/// under `dir` (all keys, or the source's `items`), with the source's `defaultMode` (else
/// 0644), as the kubelet's atomic writer leaves them.
pub(super) fn write_secret_files(dir: &Path, obj: &Value, vol: &Value, mode: Option<u64>) {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt as _;
    let text = obj["kind"] == json!("ConfigMap") || obj["binaryData"].is_object();
    let mut data: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (k, v) in obj["data"].as_object().cloned().unwrap_or_default() {
        let s = v.as_str().unwrap_or_default();
        let bytes = if text {
            s.as_bytes().to_vec()
        } else {
            base64::engine::general_purpose::STANDARD
                .decode(s)
                .unwrap_or_default()
        };
        data.insert(k, bytes);
    }
    for (k, v) in obj["binaryData"].as_object().cloned().unwrap_or_default() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap_or_default();
        data.insert(k, bytes);
    }
    let mode = mode.unwrap_or(0o644) as u32;
    let items = arr(&vol["items"]);
    let pairs: Vec<(String, String)> = if items.is_empty() {
        data.keys().map(|k| (k.clone(), k.clone())).collect()
    } else {
        items
            .iter()
            .filter_map(|i| Some((i["key"].as_str()?.to_string(), i["path"].as_str()?.to_string())))
            .collect()
    };
    for (key, path) in pairs {
        if path.split('/').any(|p| p == "..") {
            continue;
        }
        let Some(bytes) = data.get(&key) else {
            continue;
        };
        let p = dir.join(path);
        if let Some(d) = p.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        let _ = std::fs::write(&p, bytes);
        let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode));
    }
}

pub(crate) enum ImageCheck {
    Known(PathBuf),
    Unknown(String),
    Invalid(String),
}

pub(crate) fn check_image(inner: &Inner, image: &str) -> ImageCheck {
    let invalid = || {
        ImageCheck::Invalid(format!(
            "Failed to apply default image tag \"{image}\": couldn't parse image name \"{image}\": invalid reference format"
        ))
    };
    if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return invalid();
    }
    let name = image.split('@').next().unwrap_or_default();
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let repo = match name[slash..].rfind(':') {
        Some(i) => &name[..slash + i],
        None => name,
    };
    // The registry host may have upper case; the repository path may not.
    let path = match repo.split_once('/') {
        Some((host, rest)) if host.contains('.') || host.contains(':') || host == "localhost" => rest,
        _ => repo,
    };
    if path.is_empty() || path.chars().any(|c| c.is_ascii_uppercase()) || repo.ends_with('/') {
        return invalid();
    }
    match inner.images.get(image) {
        Some(root) => ImageCheck::Known(root.clone()),
        None => ImageCheck::Unknown(normalize_image(image)),
    }
}

/// Kubernetes `$(VAR)` expansion (`$$` escapes `$`; unknown references stay as written).
pub(super) fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(a) = after.strip_prefix('$') {
            out.push('$');
            rest = a;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(j) => {
                    let var = &body[..j];
                    match env.get(var) {
                        Some(v) => out.push_str(v),
                        None => out.push_str(&format!("$({var})")),
                    }
                    rest = &body[j + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

pub(super) fn secret_value(inner: &Inner, ns: &str, name: &str, key: &str) -> Result<Option<String>, String> {
    use base64::Engine as _;
    let s = inner
        .get("secrets", ns, name)
        .ok_or_else(|| format!("secret \"{name}\" not found"))?;
    match s["data"][key].as_str() {
        Some(b) => Ok(Some(
            String::from_utf8_lossy(
                &base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .unwrap_or_default(),
            )
            .into_owned(),
        )),
        None => Err(format!("couldn't find key {key} in Secret {ns}/{name}")),
    }
}

/// The container's environment (`env`, `envFrom`), or the kubelet's CreateContainerConfigError.
pub(super) fn resolve_env(inner: &Inner, pod: &Value, c: &Value) -> Result<BTreeMap<String, String>, String> {
    use base64::Engine as _;
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let mut env = BTreeMap::new();
    for ef in arr(&c["envFrom"]) {
        let prefix = ef["prefix"].as_str().unwrap_or_default();
        if let Some(name) = ef["secretRef"]["name"].as_str() {
            match inner.get("secrets", ns, name) {
                Some(s) => {
                    for (k, v) in s["data"].as_object().cloned().unwrap_or_default() {
                        let b = base64::engine::general_purpose::STANDARD
                            .decode(v.as_str().unwrap_or_default())
                            .unwrap_or_default();
                        env.insert(format!("{prefix}{k}"), String::from_utf8_lossy(&b).into_owned());
                    }
                }
                None if ef["secretRef"]["optional"] == json!(true) => {}
                None => return Err(format!("secret \"{name}\" not found")),
            }
        }
        if let Some(name) = ef["configMapRef"]["name"].as_str() {
            if ef["configMapRef"]["optional"] != json!(true) {
                return Err(format!("configmap \"{name}\" not found"));
            }
        }
    }
    for e in arr(&c["env"]) {
        let Some(name) = e["name"].as_str() else {
            continue;
        };
        let vf = &e["valueFrom"];
        let value = if let Some(v) = e["value"].as_str() {
            expand(v, &env)
        } else if let Some(r) = vf.get("secretKeyRef") {
            let optional = r["optional"] == json!(true);
            let sname = r["name"].as_str().unwrap_or_default();
            let key = r["key"].as_str().unwrap_or_default();
            match secret_value(inner, ns, sname, key) {
                Ok(Some(v)) => v,
                Ok(None) => continue,
                Err(_) if optional => continue,
                Err(e) => return Err(e),
            }
        } else if let Some(r) = vf.get("configMapKeyRef") {
            if r["optional"] == json!(true) {
                continue;
            }
            return Err(format!(
                "configmap \"{}\" not found",
                r["name"].as_str().unwrap_or_default()
            ));
        } else if let Some(path) = vf["fieldRef"]["fieldPath"].as_str() {
            field_ref(pod, path)
        } else if let Some(res) = vf["resourceFieldRef"]["resource"].as_str() {
            let (kind, what) = res.split_once('.').unwrap_or(("limits", res));
            let div = quantity_of(&vf["resourceFieldRef"]["divisor"]).unwrap_or(1.0);
            let q = quantity_of(&c["resources"][kind][what]).unwrap_or(0.0);
            format!("{}", (q / div).ceil() as i64)
        } else {
            String::new()
        };
        env.insert(name.to_string(), value);
    }
    Ok(env)
}

pub(super) fn field_ref(pod: &Value, path: &str) -> String {
    let ann = |field: &str, p: &str| {
        p.strip_prefix(&format!("metadata.{field}['"))
            .and_then(|k| k.strip_suffix("']"))
            .and_then(|k| pod["metadata"][field][k].as_str())
            .map(str::to_string)
    };
    if let Some(v) = ann("labels", path).or_else(|| ann("annotations", path)) {
        return v;
    }
    let v = match path {
        "status.hostIP" => json!("127.0.0.1"),
        "status.podIP" => pod["status"]["podIP"].clone(),
        "spec.serviceAccountName" => json!(pod["spec"]["serviceAccountName"].as_str().unwrap_or("default")),
        p => {
            let mut v = pod;
            for part in p.split('.') {
                v = &v[part];
            }
            v.clone()
        }
    };
    v.as_str().unwrap_or_default().to_string()
}
