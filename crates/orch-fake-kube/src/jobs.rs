//! The Job controller, activeDeadlineSeconds, ttlSecondsAfterFinished, and deletion with the
//! garbage collector's propagation policies.
//!
//! A NonIndexed Job gets one pod. An Indexed Job (`completionMode: Indexed`) gets a pod per
//! completion index, at most `parallelism` at a time, each as the real controller makes them:
//! named `<job>-<index>-<suffix>`, hostname `<job>-<index>` (under the template's
//! `subdomain`), the index in the `batch.kubernetes.io/job-completion-index` annotation and
//! label and in `JOB_COMPLETION_INDEX` (every container's env, from the annotation). Status:
//! `active`, `succeeded`, `failed`, `completedIndexes`, `terminating`, then `Complete`, or
//! `FailureTarget` and `Failed`. `backoffLimit` is treated as 0 (no pod is retried): the first
//! failed pod fails the Job, whose other active pods are deleted (gracefully) before the
//! `Failed` condition, as the controller does since pod replacement policy.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tokio::sync::watch;

use super::kubelet::{run_pod, PodRt, StopReq};
use super::sched::arr;
use super::store::{key_of, Inner};
use super::util::{details, now, rand_suffix, rfc3339, ApiError};

/// The controller's side of one Job.
pub(crate) struct JobRt {
    pub cancel: watch::Sender<bool>,
}

/// Store a new pod and start its kubelet. The caller checked the name is free.
pub(crate) fn start_pod(inner: &Arc<Inner>, st: &mut super::store::State, pod: Value) -> Value {
    let pod = inner.insert_locked(st, "pods", pod);
    let rt = Arc::new(PodRt::new());
    st.pods.insert(key_of(&pod), rt.clone());
    tokio::spawn(run_pod(inner.clone(), rt, pod.clone()));
    pod
}

/// `image` volumes as the API server stores them: with the `ImageVolume` gate off, dropped
/// with every mount of them (`dropImageVolumes`, before validation: no error); on, their
/// `pullPolicy` defaulted as a container's `imagePullPolicy` is (`Always` for `:latest` or no
/// tag, else `IfNotPresent`).
pub(crate) fn image_volumes(spec: &mut Value, gate: bool) {
    let Some(vols) = spec["volumes"].as_array_mut() else {
        return;
    };
    if gate {
        for v in vols.iter_mut().filter(|v| v["image"].is_object()) {
            if v["image"]["pullPolicy"].is_null() {
                let pull = pull_policy(v["image"]["reference"].as_str().unwrap_or_default());
                v["image"]["pullPolicy"] = json!(pull);
            }
        }
        return;
    }
    let dropped: Vec<String> = vols
        .iter()
        .filter(|v| v["image"].is_object())
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    if dropped.is_empty() {
        return;
    }
    vols.retain(|v| !v["image"].is_object());
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec[list].as_array_mut().into_iter().flatten() {
            if let Some(mounts) = c["volumeMounts"].as_array_mut() {
                mounts.retain(|m| !dropped.iter().any(|d| m["name"].as_str() == Some(d.as_str())));
            }
        }
    }
}

/// A container image's default pull policy: `Always` for `:latest` or no tag, else
/// `IfNotPresent` (a digest counts as a tag).
fn pull_policy(image: &str) -> &'static str {
    let tag = image.rsplit('/').next().unwrap_or_default();
    if image.contains('@') || (tag.contains(':') && !tag.ends_with(":latest")) {
        "IfNotPresent"
    } else {
        "Always"
    }
}

/// Defaults the API server writes into a pod spec (and a Job's pod template).
pub(crate) fn default_pod_spec(spec: &mut Value) {
    let d = |v: &mut Value, k: &str, x: Value| {
        if v[k].is_null() {
            v[k] = x;
        }
    };
    d(spec, "dnsPolicy", json!("ClusterFirst"));
    d(spec, "schedulerName", json!("default-scheduler"));
    d(spec, "terminationGracePeriodSeconds", json!(30));
    d(spec, "securityContext", json!({}));
    d(spec, "restartPolicy", json!("Always"));
    for list in ["initContainers", "containers"] {
        if let Some(cs) = spec[list].as_array_mut() {
            for c in cs {
                d(c, "terminationMessagePath", json!("/dev/termination-log"));
                d(c, "terminationMessagePolicy", json!("File"));
                d(c, "resources", json!({}));
                let pull = pull_policy(c["image"].as_str().unwrap_or_default());
                d(c, "imagePullPolicy", json!(pull));
                // Extended resources: requests default to limits.
                if let Some(lim) = c["resources"]["limits"].as_object().cloned() {
                    for (k, v) in lim {
                        if c["resources"]["requests"][&k].is_null() {
                            if c["resources"]["requests"].is_null() {
                                c["resources"]["requests"] = json!({});
                            }
                            c["resources"]["requests"][&k] = v;
                        }
                    }
                }
            }
        }
    }
}

/// Validation of a pod spec at `path` (`spec` or `spec.template.spec`).
pub(crate) fn validate_pod_spec(spec: &Value, path: &str, job: bool) -> Vec<(String, &'static str, String)> {
    let mut errs = Vec::new();
    let cs = arr(&spec["containers"]);
    if cs.is_empty() {
        errs.push((
            format!("{path}.containers"),
            "FieldValueRequired",
            "Required value".to_string(),
        ));
    }
    if job {
        let rp = spec["restartPolicy"].as_str().unwrap_or("");
        if rp != "Never" && rp != "OnFailure" {
            let msg = if rp.is_empty() {
                "Required value: valid values: \"OnFailure\", \"Never\"".to_string()
            } else {
                format!("Unsupported value: \"{rp}\": supported values: \"OnFailure\", \"Never\"")
            };
            let reason = if rp.is_empty() {
                "FieldValueRequired"
            } else {
                "FieldValueNotSupported"
            };
            errs.push((format!("{path}.restartPolicy"), reason, msg));
        }
    }
    let vols: Vec<&str> = arr(&spec["volumes"])
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for (i, v) in arr(&spec["volumes"]).iter().enumerate() {
        if v["image"].is_object() && v["image"]["reference"].as_str().is_none_or(str::is_empty) {
            errs.push((
                format!("{path}.volumes[{i}].image.reference"),
                "FieldValueRequired",
                "Required value".to_string(),
            ));
        }
    }
    let mut names = Vec::new();
    for list in ["initContainers", "containers"] {
        for (i, c) in arr(&spec[list]).iter().enumerate() {
            let p = format!("{path}.{list}[{i}]");
            match c["name"].as_str() {
                None | Some("") => errs.push((format!("{p}.name"), "FieldValueRequired", "Required value".into())),
                Some(n) if names.contains(&n) => {
                    errs.push((format!("{p}.name"), "FieldValueDuplicate", format!("Duplicate value: \"{n}\"")))
                }
                Some(n) if !is_dns_label(n) => errs.push((
                    format!("{p}.name"),
                    "FieldValueInvalid",
                    format!("Invalid value: \"{n}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
                )),
                Some(n) => names.push(n),
            }
            for (j, vm) in arr(&c["volumeMounts"]).iter().enumerate() {
                let vn = vm["name"].as_str().unwrap_or_default();
                if !vols.contains(&vn) {
                    errs.push((
                        format!("{p}.volumeMounts[{j}].name"),
                        "FieldValueNotFound",
                        format!("Not found: \"{vn}\""),
                    ));
                }
            }
            for (j, e) in arr(&c["env"]).iter().enumerate() {
                if e["name"].as_str().is_none_or(str::is_empty) {
                    errs.push((
                        format!("{p}.env[{j}].name"),
                        "FieldValueRequired",
                        "Required value".into(),
                    ));
                }
            }
            if let Some(lim) = c["resources"]["limits"].as_object() {
                for (k, v) in lim {
                    let q = super::util::quantity_of(v);
                    if q.is_none() {
                        errs.push((format!("{p}.resources.limits[{k}]"), "FieldValueInvalid", format!("Invalid value: {v}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")));
                    } else if k.contains('/') && !k.starts_with("kubernetes.io/") {
                        if q.is_some_and(|q| q.fract() != 0.0) {
                            errs.push((
                                format!("{p}.resources.requests[{k}]"),
                                "FieldValueInvalid",
                                format!("Invalid value: {v}: must be an integer"),
                            ));
                        }
                        let req = &c["resources"]["requests"][k];
                        if !req.is_null() && super::util::quantity_of(req) != q {
                            errs.push((
                                format!("{p}.resources.requests"),
                                "FieldValueInvalid",
                                format!("Invalid value: {req}: must be equal to {k} limit of {v}"),
                            ));
                        }
                    }
                }
            }
        }
    }
    errs
}

pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Defaults and labels the API server adds to a new Job; validation errors.
pub(crate) fn prepare_job(job: &mut Value) -> Result<(), ApiError> {
    let name = job["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let uid = job["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let mut errs = Vec::new();
    if !is_dns_label(&name) {
        errs.push((
            "metadata.name".to_string(),
            "FieldValueInvalid",
            format!("Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
        ));
    }
    let spec = &mut job["spec"];
    match spec["completionMode"].as_str() {
        None | Some("NonIndexed") => {}
        Some("Indexed") => {
            if spec["completions"].as_u64().is_none() {
                errs.push((
                    "spec.completions".to_string(),
                    "FieldValueRequired",
                    "Required value: when completion mode is Indexed".to_string(),
                ));
            }
        }
        Some(other) => errs.push((
            "spec.completionMode".to_string(),
            "FieldValueNotSupported",
            format!("Unsupported value: \"{other}\": supported values: \"NonIndexed\", \"Indexed\""),
        )),
    }
    if let Some(sub) = spec["template"]["spec"]["subdomain"].as_str() {
        if !is_dns_label(sub) {
            errs.push((
                "spec.template.spec.subdomain".to_string(),
                "FieldValueInvalid",
                format!("Invalid value: \"{sub}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
            ));
        }
    }
    if spec["template"].is_null() {
        errs.push((
            "spec.template".to_string(),
            "FieldValueRequired",
            "Required value".to_string(),
        ));
    }
    errs.extend(validate_pod_spec(
        &spec["template"]["spec"],
        "spec.template.spec",
        true,
    ));
    if !errs.is_empty() {
        return Err(ApiError::invalid("Job", "batch", &name, &errs));
    }
    let d = |v: &mut Value, k: &str, x: Value| {
        if v[k].is_null() {
            v[k] = x;
        }
    };
    d(spec, "parallelism", json!(1));
    d(spec, "completions", json!(1));
    d(spec, "backoffLimit", json!(6));
    d(spec, "completionMode", json!("NonIndexed"));
    d(spec, "suspend", json!(false));
    d(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    d(spec, "manualSelector", json!(null));
    if spec["manualSelector"].is_null() {
        spec.as_object_mut().map(|m| m.remove("manualSelector"));
    }
    spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    let labels = &mut spec["template"]["metadata"]["labels"];
    if labels.is_null() {
        *labels = json!({});
    }
    labels["batch.kubernetes.io/controller-uid"] = json!(uid);
    labels["batch.kubernetes.io/job-name"] = json!(name);
    labels["controller-uid"] = json!(uid);
    labels["job-name"] = json!(name);
    default_pod_spec(&mut spec["template"]["spec"]);
    if job["metadata"]["labels"].is_null() {
        job["metadata"]["labels"] = job["spec"]["template"]["metadata"]["labels"].clone();
    }
    job["metadata"]["generation"] = json!(1);
    job["status"] = json!({});
    Ok(())
}

fn set_job_status(inner: &Inner, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
    inner.update("jobs", ns, name, |j| {
        if !j["status"].is_object() {
            j["status"] = json!({});
        }
        f(&mut j["status"]);
    });
}

fn condition(ty: &str, reason: &str, message: &str) -> Value {
    let t = now();
    json!({"type": ty, "status": "True", "lastProbeTime": t, "lastTransitionTime": t, "reason": reason, "message": message})
}

fn push_condition(status: &mut Value, c: Value) {
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    if let Some(a) = status["conditions"].as_array_mut() {
        a.push(c);
    }
}

/// The completion index annotation and label of an Indexed Job's pods.
pub(crate) const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// A pod of the Job, as the controller makes it (`index`: of an Indexed Job).
fn job_pod(job: &Value, index: Option<usize>) -> Value {
    let (ns, name) = key_of(job);
    let uid = job["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let tmpl = &job["spec"]["template"];
    let pod_name = match index {
        Some(i) => format!("{name}-{i}-{}", rand_suffix(5)),
        None => format!("{name}-{}", rand_suffix(5)),
    };
    let mut meta = tmpl["metadata"].clone();
    if !meta.is_object() {
        meta = json!({});
    }
    meta["name"] = json!(pod_name);
    meta["namespace"] = json!(ns);
    meta["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
        "controller": true, "blockOwnerDeletion": true,
    }]);
    meta["finalizers"] = json!(["batch.kubernetes.io/job-tracking"]);
    if meta["annotations"].is_null() {
        meta["annotations"] = json!({});
    }
    meta["annotations"]["batch.kubernetes.io/job-tracking"] = json!("");
    let mut spec = tmpl["spec"].clone();
    if let Some(i) = index {
        meta["annotations"][COMPLETION_INDEX] = json!(i.to_string());
        if meta["labels"].is_null() {
            meta["labels"] = json!({});
        }
        meta["labels"][COMPLETION_INDEX] = json!(i.to_string());
        if spec["hostname"].is_null() {
            spec["hostname"] = json!(format!("{name}-{i}"));
        }
        let env = json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": format!("metadata.annotations['{COMPLETION_INDEX}']")}}});
        for list in ["initContainers", "containers"] {
            if let Some(cs) = spec[list].as_array_mut() {
                for c in cs {
                    if !c["env"].is_array() {
                        c["env"] = json!([]);
                    }
                    if let Some(e) = c["env"].as_array_mut() {
                        e.push(env.clone());
                    }
                }
            }
        }
    }
    default_pod_spec(&mut spec);
    json!({"metadata": meta, "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}})
}

/// `0-2,4`: completed indexes as the Job's status lists them.
pub(crate) fn index_ranges(done: &[usize]) -> String {
    let mut v: Vec<usize> = done.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// One pod the controller made.
struct Made {
    index: Option<usize>,
    name: String,
    done: watch::Receiver<Option<bool>>,
    /// `Some(succeeded)` once counted.
    ended: Option<bool>,
}

/// The Job controller's work for one Job, until it finishes (and its TTL, if any, runs out).
pub(crate) async fn run_job(inner: Arc<Inner>, job: Value, mut cancel: watch::Receiver<bool>) {
    let (ns, name) = key_of(&job);
    let started = SystemTime::now();
    let indexed = job["spec"]["completionMode"] == json!("Indexed");
    let completions = if indexed {
        job["spec"]["completions"].as_u64().unwrap_or(1).max(1) as usize
    } else {
        1
    };
    let parallelism = (job["spec"]["parallelism"].as_u64().unwrap_or(1) as usize).clamp(1, completions);
    let grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    let mut made: Vec<Made> = Vec::new();
    let mut next = 0usize;
    // Start pods up to `parallelism` for the indexes not yet made; `false`: the Job is gone.
    let start_more = |made: &mut Vec<Made>, next: &mut usize| -> bool {
        let active = made.iter().filter(|m| m.ended.is_none()).count();
        let want = parallelism.saturating_sub(active).min(completions - *next);
        let mut created = Vec::new();
        {
            let mut st = inner.lock();
            if !st
                .objs
                .get("jobs")
                .is_some_and(|m| m.contains_key(&(ns.clone(), name.clone())))
            {
                return false;
            }
            for _ in 0..want {
                let index = indexed.then_some(*next);
                *next += 1;
                let pod = start_pod(&inner, &mut st, job_pod(&job, index));
                let key = key_of(&pod);
                let Some(rt) = st.pods.get(&key).cloned() else {
                    continue;
                };
                created.push(key.1.clone());
                made.push(Made {
                    index,
                    name: key.1,
                    done: rt.done.subscribe(),
                    ended: None,
                });
            }
            let active = made.iter().filter(|m| m.ended.is_none()).count();
            let first = made.len() == created.len();
            inner.update_locked(&mut st, "jobs", &ns, &name, |j| {
                if first {
                    j["status"] = json!({"startTime": rfc3339(started), "active": active, "ready": 0, "terminating": 0, "uncountedTerminatedPods": {}});
                } else {
                    j["status"]["active"] = json!(active);
                }
            });
        }
        for p in created {
            inner.event(
                &job,
                None,
                "Normal",
                "SuccessfulCreate",
                &format!("Created pod: {p}"),
                "job-controller",
            );
        }
        true
    };
    if !start_more(&mut made, &mut next) || made.is_empty() {
        return;
    }
    let deadline = job["spec"]["activeDeadlineSeconds"]
        .as_u64()
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let mut deadline_hit = false;
    let mut failed_pod = false;
    loop {
        let dl = async {
            match deadline {
                Some(d) if !deadline_hit => tokio::time::sleep_until(d).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = dl => {
                deadline_hit = true;
                let msg = "Job was active longer than specified deadline";
                set_job_status(&inner, &ns, &name, |s| push_condition(s, condition("FailureTarget", "DeadlineExceeded", msg)));
                inner.event(&job, None, "Warning", "DeadlineExceeded", msg, "job-controller");
                let st = inner.lock();
                for m in made.iter().filter(|m| m.ended.is_none()) {
                    if let Some(rt) = st.pods.get(&(ns.clone(), m.name.clone())) {
                        rt.request_stop(StopReq {
                            grace: Some(Duration::from_secs(grace)),
                            reason: Some(("DeadlineExceeded".into(), "Pod was active on the node longer than the specified deadline".into())),
                            ..Default::default()
                        });
                    }
                }
            }
            _ = cancel.wait_for(|c| *c) => return,
        }
        if *cancel.borrow() {
            return;
        }
        // Pods that finished since: their job-tracking finalizer comes off, they are counted.
        let mut changed = false;
        for m in made.iter_mut().filter(|m| m.ended.is_none()) {
            let done = *m.done.borrow();
            if let Some(ok) = done {
                m.ended = Some(ok);
                changed = true;
                failed_pod |= !ok;
                inner.update("pods", &ns, &m.name, |p| {
                    if let Some(o) = p["metadata"].as_object_mut() {
                        o.remove("finalizers");
                    }
                });
            }
        }
        if changed {
            let ok: Vec<usize> = made
                .iter()
                .filter(|m| m.ended == Some(true))
                .map(|m| m.index.unwrap_or(0))
                .collect();
            let failed = made.iter().filter(|m| m.ended == Some(false)).count();
            let active = made.iter().filter(|m| m.ended.is_none()).count();
            set_job_status(&inner, &ns, &name, |s| {
                s["active"] = json!(active);
                if !ok.is_empty() {
                    s["succeeded"] = json!(ok.len());
                    if indexed {
                        s["completedIndexes"] = json!(index_ranges(&ok));
                    }
                }
                if failed > 0 {
                    s["failed"] = json!(failed);
                }
            });
        }
        let active = made.iter().filter(|m| m.ended.is_none()).count();
        if failed_pod || deadline_hit {
            if !deadline_hit && active > 0 {
                // backoffLimit 0 is passed: the Job fails, its other pods are terminated first.
                let msg = "Job has reached the specified backoff limit";
                set_job_status(&inner, &ns, &name, |s| {
                    push_condition(s, condition("FailureTarget", "BackoffLimitExceeded", msg));
                    s["terminating"] = json!(active);
                });
                for m in made.iter().filter(|m| m.ended.is_none()) {
                    let _ = delete_pod(&inner, &ns, &m.name, None);
                    inner.event(
                        &job,
                        None,
                        "Normal",
                        "SuccessfulDelete",
                        &format!("Deleted pod: {}", m.name),
                        "job-controller",
                    );
                }
                let until = tokio::time::Instant::now() + Duration::from_secs(grace + 5);
                while made
                    .iter()
                    .any(|m| m.ended.is_none() && m.done.borrow().is_none())
                    && tokio::time::Instant::now() < until
                {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                        _ = cancel.wait_for(|c| *c) => return,
                    }
                }
                for m in made.iter_mut().filter(|m| m.ended.is_none()) {
                    m.ended = Some(false);
                }
            }
            if active == 0 || !deadline_hit {
                break;
            }
            continue;
        }
        if active == 0 && next >= completions {
            break;
        }
        if next < completions && !start_more(&mut made, &mut next) {
            return;
        }
    }
    let t = now();
    let failed = made.iter().filter(|m| m.ended == Some(false)).count();
    if !failed_pod && !deadline_hit {
        set_job_status(&inner, &ns, &name, |s| {
            push_condition(
                s,
                condition(
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
            );
            push_condition(
                s,
                condition(
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ),
            );
            s["succeeded"] = json!(completions);
            s["completionTime"] = json!(t);
            s["ready"] = json!(0);
            s["terminating"] = json!(0);
            if let Some(m) = s.as_object_mut() {
                m.remove("active");
            }
        });
        inner.event(
            &job,
            None,
            "Normal",
            "Completed",
            "Job completed",
            "job-controller",
        );
    } else {
        let (reason, msg) = if deadline_hit {
            (
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            )
        } else {
            (
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            )
        };
        set_job_status(&inner, &ns, &name, |s| {
            let has_target = s["conditions"]
                .as_array()
                .is_some_and(|a| a.iter().any(|c| c["type"] == json!("FailureTarget")));
            if !has_target {
                push_condition(s, condition("FailureTarget", reason, msg));
            }
            push_condition(s, condition("Failed", reason, msg));
            s["failed"] = json!(failed.max(1));
            s["ready"] = json!(0);
            s["terminating"] = json!(0);
            if let Some(m) = s.as_object_mut() {
                m.remove("active");
            }
        });
        if !deadline_hit {
            inner.event(&job, None, "Warning", reason, msg, "job-controller");
        }
    }
    if let Some(ttl) = job["spec"]["ttlSecondsAfterFinished"].as_u64() {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(ttl)) => {
                let _ = delete_job(&inner, &ns, &name, Some("Foreground"), None);
            }
            _ = cancel.wait_for(|c| *c) => {}
        }
    }
}

/// Pods whose ownerReferences name this uid.
fn owned_pods(inner: &Inner, ns: &str, uid: &str) -> Vec<String> {
    inner
        .list("pods", Some(ns))
        .iter()
        .filter(|p| {
            arr(&p["metadata"]["ownerReferences"])
                .iter()
                .any(|o| o["uid"] == json!(uid))
        })
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// DELETE of a Job: `Orphan` (the default for batch/v1 Jobs through the API) leaves its pods,
/// `Background` deletes the Job now and its pods after, `Foreground` deletes the pods first.
pub(crate) fn delete_job(
    inner: &Arc<Inner>,
    ns: &str,
    name: &str,
    policy: Option<&str>,
    grace: Option<i64>,
) -> Result<Value, ApiError> {
    let job = inner
        .get("jobs", ns, name)
        .ok_or_else(|| ApiError::not_found("jobs", "batch", name))?;
    if !job["metadata"]["deletionTimestamp"].is_null() {
        return Ok(job);
    }
    let uid = job["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let policy = policy.unwrap_or("Orphan");
    if let Some(rt) = inner.lock().jobs.get(&(ns.to_string(), name.to_string())) {
        rt.cancel.send_replace(true);
    }
    let (ns, name) = (ns.to_string(), name.to_string());
    match policy {
        "Background" => {
            inner.remove("jobs", &ns, &name);
            let inner = inner.clone();
            let owner = uid.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                for p in owned_pods(&inner, &ns, &owner) {
                    let _ = delete_pod(&inner, &ns, &p, grace);
                }
            });
            let mut d = details(&name, "batch", "jobs");
            d["uid"] = json!(uid);
            Ok(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d}))
        }
        "Foreground" | "Orphan" => {
            let fin = if policy == "Orphan" { "orphan" } else { "foregroundDeletion" };
            let out = inner
                .update("jobs", &ns, &name, |j| {
                    j["metadata"]["deletionTimestamp"] = json!(now());
                    j["metadata"]["deletionGracePeriodSeconds"] = json!(0);
                    j["metadata"]["finalizers"] = json!([fin]);
                })
                .unwrap_or(job);
            let inner = inner.clone();
            let orphan = policy == "Orphan";
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let pods = owned_pods(&inner, &ns, &uid);
                if orphan {
                    // Every dependent is orphaned: its ownerReference to the Job goes.
                    for svc in inner.list("services", Some(&ns)) {
                        let owned = arr(&svc["metadata"]["ownerReferences"])
                            .iter()
                            .any(|o| o["uid"] == json!(uid));
                        if owned {
                            let (_, sname) = key_of(&svc);
                            inner.update("services", &ns, &sname, |s| {
                                if let Some(refs) = s["metadata"]["ownerReferences"].as_array_mut() {
                                    refs.retain(|o| o["uid"] != json!(uid));
                                    if refs.is_empty() {
                                        s["metadata"].as_object_mut().map(|m| m.remove("ownerReferences"));
                                    }
                                }
                            });
                        }
                    }
                    for p in pods {
                        inner.update("pods", &ns, &p, |p| {
                            if let Some(m) = p["metadata"].as_object_mut() {
                                m.remove("finalizers");
                            }
                            if let Some(refs) = p["metadata"]["ownerReferences"].as_array_mut() {
                                refs.retain(|o| o["uid"] != json!(uid));
                                if refs.is_empty() {
                                    p["metadata"].as_object_mut().map(|m| m.remove("ownerReferences"));
                                }
                            }
                        });
                    }
                } else {
                    for p in &pods {
                        let _ = delete_pod(&inner, &ns, p, grace);
                    }
                    while !owned_pods(&inner, &ns, &uid).is_empty() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                inner.remove("jobs", &ns, &name);
            });
            Ok(out)
        }
        other => Err(ApiError::bad_request(format!(
            "propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
        ))),
    }
}

/// DELETE of a pod: graceful (SIGTERM, SIGKILL after the grace period) when its containers may
/// run; at once when it never got a node or has finished.
pub(crate) fn delete_pod(
    inner: &Arc<Inner>,
    ns: &str,
    name: &str,
    grace: Option<i64>,
) -> Result<Value, ApiError> {
    let pod = inner
        .get("pods", ns, name)
        .ok_or_else(|| ApiError::not_found("pods", "", name))?;
    let grace = grace
        .or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64())
        .unwrap_or(30)
        .max(0);
    let rt = inner
        .lock()
        .pods
        .get(&(ns.to_string(), name.to_string()))
        .cloned();
    let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
    let unbound = pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty);
    let terminal = phase == "Succeeded" || phase == "Failed";
    let immediate = unbound || (terminal && !rt.as_ref().is_some_and(|r| r.running())) || grace == 0;
    if let Some(rt) = &rt {
        rt.request_stop(StopReq {
            delete: true,
            kill_now: immediate,
            grace: Some(Duration::from_secs(grace as u64)),
            reason: None,
        });
    }
    if immediate {
        let mut st = inner.lock();
        // Finalizers that only this fake's controllers hold are dropped with the object.
        let out = inner.remove_locked(&mut st, "pods", ns, name).unwrap_or(pod);
        return Ok(out);
    }
    let dt = rfc3339(SystemTime::now() + Duration::from_secs(grace as u64));
    Ok(inner
        .update("pods", ns, name, |p| {
            if p["metadata"]["deletionTimestamp"].is_null() {
                p["metadata"]["deletionTimestamp"] = json!(dt);
                p["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            }
        })
        .unwrap_or(pod))
}
