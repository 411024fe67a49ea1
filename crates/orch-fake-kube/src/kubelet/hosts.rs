//! A pod's network identity: its IP, hostname and `/etc/hosts` (the
//! headless Service's names of an Indexed Job's pods).

use super::*;

/// A pod IP of its own on the loopback network (all of `127.0.0.0/8` reaches this host's
/// `lo`): pods share this host's network namespace, so a peer's name must resolve to an
/// address a listener bound to `0.0.0.0` (or to that address) answers on.
pub(super) fn pod_ip() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "127.{}.{}.{}",
        20 + (n / 62_500) % 200,
        (n / 250) % 250,
        2 + n % 250
    )
}

pub(super) fn hosts_path(ctx: &Ctx) -> PathBuf {
    ctx.dir.join("etc-hosts")
}

/// The pod's hostname: `spec.hostname`, else its name.
pub(super) fn hostname(pod: &Value) -> String {
    pod["spec"]["hostname"]
        .as_str()
        .filter(|h| !h.is_empty())
        .or(pod["metadata"]["name"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The `/etc/hosts` the kubelet writes for a pod (its own name, under its `subdomain` as
/// `<hostname>.<subdomain>.<ns>.svc.cluster.local`), with what cluster DNS would answer in
/// its place: every pod of the namespace whose `subdomain` names a headless Service
/// (`clusterIP: None`) selecting it, by `<hostname>.<subdomain>` and the longer forms, while
/// it has an IP (and is ready, unless the Service has `publishNotReadyAddresses`).
pub(crate) fn hosts_file(inner: &Inner, pod: &Value) -> String {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let mut out = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\n",
    );
    let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
    let host = hostname(pod);
    match pod["spec"]["subdomain"].as_str().filter(|s| !s.is_empty()) {
        Some(sub) if !ip.is_empty() => {
            out.push_str(&format!("{ip}\t{host}.{sub}.{ns}.svc.cluster.local\t{host}\n"))
        }
        _ if !ip.is_empty() => out.push_str(&format!("{ip}\t{host}\n")),
        _ => {}
    }
    let st = inner.lock();
    let services = crate::store::list_locked(&st, "services", Some(ns));
    let pods = crate::store::list_locked(&st, "pods", Some(ns));
    drop(st);
    let mut lines = Vec::new();
    for svc in services
        .iter()
        .filter(|s| s["spec"]["clusterIP"] == json!("None"))
    {
        let sname = svc["metadata"]["name"].as_str().unwrap_or_default();
        let Some(selector) = svc["spec"]["selector"].as_object().filter(|m| !m.is_empty()) else {
            continue;
        };
        let not_ready = svc["spec"]["publishNotReadyAddresses"] == json!(true);
        for p in &pods {
            let pip = p["status"]["podIP"].as_str().unwrap_or_default();
            let selected = selector.iter().all(|(k, v)| p["metadata"]["labels"][k] == *v);
            let ready = arr(&p["status"]["conditions"])
                .iter()
                .any(|c| c["type"] == json!("Ready") && c["status"] == json!("True"));
            if pip.is_empty()
                || !selected
                || (!not_ready && !ready)
                || p["spec"]["subdomain"].as_str() != Some(sname)
                || !p["metadata"]["deletionTimestamp"].is_null()
            {
                continue;
            }
            let h = hostname(p);
            lines.push(format!(
                "{pip}\t{h}.{sname}.{ns}.svc.cluster.local\t{h}.{sname}.{ns}.svc\t{h}.{sname}.{ns}\t{h}.{sname}\n"
            ));
        }
    }
    lines.sort();
    if !lines.is_empty() {
        out.push_str("# Cluster DNS (the fake's stand-in): pods under a headless Service.\n");
        out.extend(lines);
    }
    out
}

/// Write the pod's `/etc/hosts` now.
pub(super) fn write_hosts(ctx: &Ctx) {
    let pod = ctx
        .inner
        .get("pods", &ctx.ns, &ctx.name)
        .unwrap_or_else(|| ctx.pod.clone());
    let _ = std::fs::create_dir_all(&ctx.dir);
    let _ = std::fs::write(hosts_path(ctx), hosts_file(&ctx.inner, &pod));
}
