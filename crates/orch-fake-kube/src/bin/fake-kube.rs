//! `fake-kube`: a local fake Kubernetes API server (see `orch_fake_kube`) with one
//! 8×H100 node (`gpu-0`) and one CPU node (`cpu-0`), or `--nodes N` GPU nodes.
//!
//! ```text
//! fake-kube KUBECONFIG [--namespace NS] [--image REF=DIR]... [--busybox-image REF]...
//!           [--pvc NAME=DIR]... [--nvml-stub LIB] [--token T] [--cut-log-streams-after BYTES] [--role FILE]
//!           [--nodes N] [--gpus-per-node G] [--latency-ms MS] [--rate-limit QPS[:BURST]] [--stats FILE]
//!           [--kubernetes-version 1.MINOR] [--container-runtime RUNTIME://VERSION] [--image-volume-gate on|off]
//! ```
//!
//! Containers run in their image's root folder (a mount namespace and `chroot`): run it as root.
//!
//! Writes a kubeconfig to KUBECONFIG, prints `url http://127.0.0.1:PORT` as the first stdout
//! line, then serves until killed (SIGTERM/SIGINT/SIGHUP: its containers are killed too, and
//! with `--stats FILE` the requests it answered are written to FILE as JSON first).

use orch_fake_kube::{FakeKube, FakeNode};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str =
    "usage: fake-kube KUBECONFIG [--namespace NS] [--image REF=DIR]... [--busybox-image REF]...
                 [--pvc NAME=DIR]... [--nvml-stub LIB] [--token T] [--cut-log-streams-after BYTES] [--role FILE]
                 [--nodes N] [--gpus-per-node G] [--latency-ms MS] [--rate-limit QPS[:BURST]] [--stats FILE]
                 [--kubernetes-version 1.MINOR] [--container-runtime RUNTIME://VERSION] [--image-volume-gate on|off]

  KUBECONFIG                 where to write the kubeconfig (cluster, user and context `fake`)
  --namespace NS             the context's namespace (default: default)
  --image REF=DIR            image reference REF exists; DIR is its root folder (containers
                             chroot into it: needs root)
  --busybox-image REF        image reference REF is a static busybox and nothing else
  --pvc NAME=DIR             PersistentVolumeClaim NAME exists, backed by DIR
  --nvml-stub LIB            the NVML library GPU containers get (NVIDIA container toolkit style)
  --token T                  the bearer token to require (default: fake-token)
  --cut-log-streams-after N  followed log streams end after N bytes
  --role FILE                authorize requests by the Roles and bindings in FILE (RBAC: 403
                             for what they do not grant), e.g. deploy/kubernetes/orch-role.yaml
  --nodes N                  N GPU nodes, gpu-0 .. gpu-(N-1) (default 1)
  --gpus-per-node G          nvidia.com/gpu of each GPU node (default 8)
  --latency-ms MS            answer every request MS milliseconds late (an API server's
                             round trip; default 0)
  --rate-limit QPS[:BURST]   refuse requests past QPS a second (a bucket of BURST, default
                             QPS) with 429 and Retry-After, as Priority and Fairness does
  --kubernetes-version 1.M   the version `/version` and the kubelets report (default 1.33); from
                             1.35 the `ImageVolume` gate is on (`volumes[].image`)
  --container-runtime R://V  every node's containerRuntimeVersion (default containerd://2.0.0;
                             image volumes need containerd 2.1 or cri-o 1.31)
  --image-volume-gate on|off the `ImageVolume` feature gate, whatever the version's default
  --stats FILE               on exit, write the requests answered to FILE (JSON: counts by
                             verb and resource, requests per second, 429s)

Nodes: gpu-0 (8 × nvidia.com/gpu, NVIDIA-H100-80GB-HBM3, tainted nvidia.com/gpu=present:NoSchedule)
(or --nodes of them) and cpu-0. Lists and watches are served from memory with resourceVersion
semantics, as a watch cache serves them. The first stdout line is `url http://127.0.0.1:PORT`.";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-kube: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn pair(v: &str, what: &str) -> Result<(String, PathBuf), String> {
    let (a, b) = v
        .split_once('=')
        .ok_or_else(|| format!("`{what}` takes NAME=DIR"))?;
    Ok((a.to_string(), PathBuf::from(b)))
}

fn run() -> Result<(), String> {
    let mut b = FakeKube::builder();
    let (mut nodes, mut gpus) = (1u32, 8u32);
    let mut stats = None;
    let mut kubeconfig = None;
    let mut namespace = "default".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("`{a}` needs a value"));
        match a.as_str() {
            "--namespace" => namespace = val()?,
            "--image" => {
                let (r, d) = pair(&val()?, "--image")?;
                b = b.image(&r, d);
            }
            "--busybox-image" => {
                let root = orch_fake_containers::container::busybox_root()
                    .map_err(|e| format!("cannot make a busybox root: {e}"))?;
                b = b.image(&val()?, root);
            }
            "--pvc" => {
                let (n, d) = pair(&val()?, "--pvc")?;
                b = b.pvc(&n, d);
            }
            "--nvml-stub" => b = b.nvml_stub(val()?),
            "--token" => b = b.token(&val()?),
            "--role" => b = b.role(val()?),
            "--cut-log-streams-after" => {
                b = b.cut_log_streams_after(
                    val()?
                        .parse()
                        .map_err(|_| "`--cut-log-streams-after` takes a number".to_string())?,
                )
            }
            "--nodes" => nodes = number(&a, &val()?)?,
            "--gpus-per-node" => gpus = number(&a, &val()?)?,
            "--latency-ms" => b = b.latency(Duration::from_millis(number(&a, &val()?)?)),
            "--rate-limit" => {
                let v = val()?;
                let (qps, burst) = match v.split_once(':') {
                    Some((q, b)) => (number::<f64>(&a, q)?, number::<f64>(&a, b)?),
                    None => {
                        let q = number::<f64>(&a, &v)?;
                        (q, q)
                    }
                };
                if !(qps > 0.0 && burst >= 1.0) {
                    return Err("`--rate-limit` takes QPS > 0 and BURST >= 1".into());
                }
                b = b.rate_limit(qps, burst);
            }
            "--stats" => stats = Some(PathBuf::from(val()?)),
            "--kubernetes-version" => {
                let v = val()?;
                let minor = v
                    .trim_start_matches('v')
                    .strip_prefix("1.")
                    .and_then(|m| m.split('.').next())
                    .and_then(|m| m.parse::<u32>().ok())
                    .ok_or_else(|| format!("`--kubernetes-version` takes 1.MINOR, not `{v}`"))?;
                b = b.kubernetes_minor(minor);
            }
            "--container-runtime" => b = b.container_runtime(&val()?),
            "--image-volume-gate" => {
                b = b.image_volume_gate(match val()?.as_str() {
                    "on" | "true" => true,
                    "off" | "false" => false,
                    v => return Err(format!("`--image-volume-gate` takes on or off, not `{v}`")),
                })
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other if other.starts_with('-') => return Err(format!("unknown argument `{other}`")),
            path if kubeconfig.is_none() => kubeconfig = Some(PathBuf::from(path)),
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    let kubeconfig = kubeconfig.ok_or("the kubeconfig path is needed")?;
    if nodes == 0 {
        return Err("`--nodes` takes a number from 1".into());
    }
    for i in 0..nodes {
        b = b.node(FakeNode::h100(&format!("gpu-{i}"), gpus));
    }
    b = b.node(FakeNode::cpu("cpu-0"));
    // SIGTERM, SIGINT and SIGHUP are taken by `sigwait` below, so the server's drop kills every
    // process group it started. The mask is set before any thread starts (threads inherit it;
    // spawned containers get an empty mask from std's Command).
    // SAFETY: plain libc calls on a zeroed, then initialised, signal set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let server = b.start().map_err(|e| format!("cannot start: {e}"))?;
    server
        .write_kubeconfig(&kubeconfig, &namespace)
        .map_err(|e| format!("cannot write `{}`: {e}", kubeconfig.display()))?;
    println!("url {}", server.url());
    let _ = std::io::stdout().flush();
    let mut sig = 0;
    // SAFETY: `set` was initialised above; `sig` is a valid out pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    let written = match &stats {
        Some(path) => std::fs::write(path, stats_json(&server).to_string())
            .map_err(|e| format!("cannot write `{}`: {e}", path.display())),
        None => Ok(()),
    };
    drop(server);
    written
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("`{flag}` takes a number, not `{v}`"))
}

/// What `--stats` writes: requests by `"VERB RESOURCE"` and by verb, requests in each
/// second since the start, and the requests refused with 429.
fn stats_json(server: &FakeKube) -> serde_json::Value {
    let counts = server.request_counts();
    let mut by_verb = std::collections::BTreeMap::<String, u64>::new();
    for ((verb, _), n) in &counts {
        *by_verb.entry(verb.clone()).or_default() += n;
    }
    let throttled = server.throttled();
    serde_json::json!({
        "requests": counts.values().sum::<u64>(),
        "by_verb_resource": counts.iter().map(|((v, r), n)| (format!("{v} {r}"), *n)).collect::<std::collections::BTreeMap<_, _>>(),
        "by_verb": by_verb,
        "per_second": server.requests_per_second(),
        "throttled": throttled.len(),
        "throttled_retry_after_max_s": throttled.iter().map(|t| t.retry_after.as_secs()).max().unwrap_or(0),
    })
}
