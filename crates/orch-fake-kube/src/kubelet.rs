//! The kubelet: runs a bound pod's containers the way a container runtime runs them: each in
//! the root folder its image maps to (the builder's `.image(reference, root)`), in a mount
//! namespace of its own with `chroot` ([`crate::container`]), with a writable layer of its own
//! over the image, in its own process group. Volumes (emptyDir, Secret, ConfigMap and projected
//! folders of the pod, PVC host folders, `hostPath`) are bind-mounted at their `mountPath` (`subPath` and
//! `readOnly` honoured), the termination-log file at `terminationMessagePath`; `workingDir` is
//! a container path. Nothing of this host's file system reaches a container otherwise, and no
//! path in its command, args or env is translated. A pod on a GPU node that requests
//! `nvidia.com/gpu` gets the device plugin's choice of that node's GPUs (the lowest indices no
//! other live pod on the node holds) and, when the builder was given an NVML library
//! (`nvml_stub`), the NVIDIA container toolkit's injection of it. Also: image "pulls" from the
//! image map, env from Secrets, memory limits (OOMKilled by resident memory), graceful
//! termination and container logs. Each pod gets a loopback IP of its own and a managed
//! `/etc/hosts` (its name, and its peers under a headless Service: [`hosts_file`]);
//! `HOSTNAME` is `spec.hostname` (an Indexed Job's `<job>-<index>`), else the pod's name.
//!
//! Here: a pod's run (scheduling wait, autoscaling, finish); `kubelet/status.rs` (container
//! states, conditions, QoS), `kubelet/hosts.rs` (IP, hostname, `/etc/hosts`),
//! `kubelet/volumes.rs` (volumes, images, env), `kubelet/process.rs` (containers as processes).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};
use sha2::Digest as _;
use tokio::io::AsyncReadExt as _;
use tokio::sync::watch;

use super::sched::{arr, node_fits, pod_gpus, try_schedule, GPU};
use super::store::{lock, Inner};
use super::util::{hex, now, quantity_of, rfc3339_nano};
use crate::container::{self, normalize_image};

mod hosts;
mod process;
mod status;
mod volumes;
pub(crate) use hosts::hosts_file;
use hosts::*;
pub(crate) use process::killpg;
use process::*;
use status::*;
pub(crate) use volumes::check_image;
pub(crate) use volumes::ImageCheck;
use volumes::*;

/// Why and how a pod's containers must stop.
#[derive(Clone, Default, Debug)]
pub(crate) struct StopReq {
    /// The pod object goes away once its processes are gone.
    pub delete: bool,
    /// SIGKILL at once (eviction, force deletion).
    pub kill_now: bool,
    /// SIGTERM, then SIGKILL after this long.
    pub grace: Option<Duration>,
    /// Pod `status.reason` and `status.message` (Evicted, DeadlineExceeded).
    pub reason: Option<(String, String)>,
}

/// The kubelet's side of one pod.
pub(crate) struct PodRt {
    pub stop: watch::Sender<Option<StopReq>>,
    /// Running containers → process group.
    pub pgids: Mutex<BTreeMap<String, i32>>,
    pub logs: Mutex<BTreeMap<String, Arc<LogBuf>>>,
    /// `Some(succeeded)` once the pod is terminal (or will never run).
    pub done: watch::Sender<Option<bool>>,
    /// The node's GPUs the device plugin gave this pod (indices), while it runs.
    pub gpus: Mutex<Vec<u32>>,
}

impl PodRt {
    pub fn new() -> Self {
        PodRt {
            stop: watch::Sender::new(None),
            pgids: Mutex::new(BTreeMap::new()),
            logs: Mutex::new(BTreeMap::new()),
            done: watch::Sender::new(None),
            gpus: Mutex::new(Vec::new()),
        }
    }

    pub fn request_stop(&self, req: StopReq) {
        self.stop.send_modify(|cur| {
            let mut s = cur.take().unwrap_or_default();
            s.delete |= req.delete;
            s.kill_now |= req.kill_now;
            s.grace = match (s.grace, req.grace) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if req.reason.is_some() && (s.reason.is_none() || req.kill_now) {
                s.reason = req.reason;
            }
            *cur = Some(s);
        });
    }

    pub fn running(&self) -> bool {
        !lock(&self.pgids).is_empty()
    }

    pub fn log(&self, container: &str) -> Option<Arc<LogBuf>> {
        lock(&self.logs).get(container).cloned()
    }
}

/// One container's log: merged stdout and stderr as they arrived, with each line's arrival time.
pub(crate) struct LogBuf {
    pub data: Mutex<LogData>,
    pub tx: watch::Sender<u64>,
}

#[derive(Default)]
pub(crate) struct LogData {
    pub bytes: Vec<u8>,
    /// Offsets where lines start, with the time their first byte arrived.
    pub starts: Vec<(usize, SystemTime)>,
    /// The container ended and its output is drained.
    pub done: bool,
}

impl LogBuf {
    fn new() -> Self {
        LogBuf {
            data: Mutex::new(LogData::default()),
            tx: watch::Sender::new(0),
        }
    }

    fn push(&self, chunk: &[u8]) {
        let mut d = lock(&self.data);
        let t = SystemTime::now();
        let base = d.bytes.len();
        if base == 0 || d.bytes.last() == Some(&b'\n') {
            d.starts.push((base, t));
        }
        for (i, b) in chunk.iter().enumerate() {
            if *b == b'\n' && i + 1 < chunk.len() {
                d.starts.push((base + i + 1, t));
            }
        }
        d.bytes.extend_from_slice(chunk);
        drop(d);
        self.tx.send_modify(|n| *n += 1);
    }

    fn finish(&self) {
        lock(&self.data).done = true;
        self.tx.send_modify(|n| *n += 1);
    }
}

impl LogData {
    /// Where a log request starts: after `tailLines` and `sinceSeconds`.
    pub fn start(&self, tail: Option<usize>, since: Option<SystemTime>) -> usize {
        let mut idx = 0;
        if let Some(n) = tail {
            idx = self.starts.len().saturating_sub(n);
        }
        if let Some(s) = since {
            let j = self
                .starts
                .iter()
                .position(|(_, t)| *t >= s)
                .unwrap_or(self.starts.len());
            idx = idx.max(j);
        }
        self.starts.get(idx).map_or(self.bytes.len(), |s| s.0)
    }

    /// Bytes `from..to`, with an RFC 3339 timestamp before each line when asked.
    pub fn render(&self, from: usize, to: usize, timestamps: bool) -> Vec<u8> {
        if !timestamps {
            return self.bytes[from..to].to_vec();
        }
        let mut out = Vec::new();
        let mut pos = from;
        for &(s, t) in self.starts.iter().filter(|(s, _)| *s >= from && *s < to) {
            out.extend_from_slice(&self.bytes[pos..s]);
            out.extend_from_slice(format!("{} ", rfc3339_nano(t)).as_bytes());
            pos = s;
        }
        out.extend_from_slice(&self.bytes[pos..to]);
        out
    }
}

struct Ctx {
    inner: Arc<Inner>,
    rt: Arc<PodRt>,
    pod: Value,
    ns: String,
    name: String,
    model: Mutex<Model>,
    dir: PathBuf,
}

enum Outcome {
    Exited(i32),
    Stopped,
}

impl Ctx {
    fn publish(&self) {
        let m = lock(&self.model);
        let status = m.json();
        // Conditions others own (the control plane's `DisruptionTarget`) stay, as the
        // kubelet's status patch leaves them.
        self.inner.update("pods", &self.ns, &self.name, |p| {
            let keep: Vec<Value> = p["status"]["conditions"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|c| c["type"] == json!("DisruptionTarget"))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            p["status"] = status;
            if let Some(a) = p["status"]["conditions"].as_array_mut() {
                a.extend(keep);
            }
        });
    }

    fn with(&self, f: impl FnOnce(&mut Model)) {
        f(&mut lock(&self.model));
        self.publish();
    }

    fn event(&self, field: Option<&str>, type_: &str, reason: &str, message: &str, component: &str) {
        let pod = self
            .inner
            .get("pods", &self.ns, &self.name)
            .unwrap_or_else(|| self.pod.clone());
        self.inner.event(&pod, field, type_, reason, message, component);
    }

    fn stopping(&self) -> bool {
        self.rt.stop.borrow().is_some()
    }

    /// Sleep; `true` when a stop came first.
    async fn sleep_or_stop(&self, d: Duration) -> bool {
        let mut rx = self.rt.stop.subscribe();
        tokio::select! {
            _ = tokio::time::sleep(d) => self.stopping(),
            _ = rx.wait_for(Option::is_some) => true,
        }
    }

    async fn wait_stop(&self) {
        let mut rx = self.rt.stop.subscribe();
        let _ = rx.wait_for(Option::is_some).await;
    }
}

/// The whole life of one pod: scheduling, then the kubelet.
pub(crate) async fn run_pod(inner: Arc<Inner>, rt: Arc<PodRt>, pod: Value) {
    let ns = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_string();
    let dir = inner
        .root
        .join("pods")
        .join(format!("{ns}_{name}_{}", &uid[..uid.len().min(8)]));
    let ctx = Ctx {
        model: Mutex::new(Model::new(&pod)),
        inner,
        rt,
        pod,
        ns,
        name,
        dir,
    };
    let ok = pod_flow(&ctx).await;
    finish(&ctx, ok);
    // A pod deleted after it ended takes its folder (the containers' roots,
    // the agent's copy from the init container) with it, as a kubelet's
    // does: a long run of pods does not fill the disk.
    let mut stop = ctx.rt.stop.subscribe();
    let _ = stop.wait_for(|s| s.as_ref().is_some_and(|s| s.delete)).await;
    let _ = std::fs::remove_dir_all(&ctx.dir);
}

fn finish(ctx: &Ctx, ok: Option<bool>) {
    let stop = ctx.rt.stop.borrow().clone();
    let succeeded = stop.as_ref().is_none_or(|s| s.reason.is_none()) && ok == Some(true);
    ctx.with(|m| {
        m.phase = if succeeded { "Succeeded" } else { "Failed" };
        if let Some((r, msg)) = stop.as_ref().and_then(|s| s.reason.clone()) {
            m.reason = Some(r);
            m.message = Some(msg);
        }
        if m.bound {
            let why = if succeeded { "PodCompleted" } else { "PodFailed" };
            m.cond("Ready", false, Some(why), None);
            m.cond("ContainersReady", false, Some(why), None);
            m.cond("PodReadyToStartContainers", false, None, None);
        }
    });
    lock(&ctx.rt.gpus).clear();
    ctx.rt.done.send_replace(Some(succeeded));
    if stop.is_some_and(|s| s.delete) {
        ctx.inner.remove("pods", &ctx.ns, &ctx.name);
        let _ = std::fs::remove_dir_all(&ctx.dir);
    }
}

/// The autoscaler's work for one pending pod.
#[derive(Default)]
struct Autoscaling {
    since: Option<Instant>,
    /// `Some(true)`: scale-up triggered; `Some(false)`: not.
    verdict: Option<bool>,
    added: bool,
}

/// The fake cluster autoscaler ([`super::FakeAutoscaler`]) on an unschedulable pod: its
/// verdict as an event after `decide_after`, the pool's node after `node_after`.
fn autoscale(ctx: &Ctx, s: &mut Autoscaling) {
    let Some(a) = &ctx.inner.autoscaler else { return };
    let waited = s.since.get_or_insert_with(Instant::now).elapsed();
    if s.verdict.is_none() && waited >= a.decide_after {
        let fits = node_fits(&ctx.pod, &a.node);
        let count = *lock(&ctx.inner.scaled);
        if fits && count < a.max {
            s.verdict = Some(true);
            let msg = format!(
                "pod triggered scale-up: [{{{} {count}->{} (max: {})}}]",
                a.pool,
                count + 1,
                a.max
            );
            ctx.event(None, "Normal", "TriggeredScaleUp", &msg, "cluster-autoscaler");
        } else {
            s.verdict = Some(false);
            let why = if fits {
                "1 max node group size reached"
            } else {
                "1 node(s) didn't match Pod's node affinity/selector"
            };
            let msg = format!("pod didn't trigger scale-up: {why}");
            ctx.event(None, "Normal", "NotTriggerScaleUp", &msg, "cluster-autoscaler");
        }
    }
    if s.verdict == Some(true) && !s.added && waited >= a.node_after {
        s.added = true;
        let mut node = a.node.clone();
        {
            let mut count = lock(&ctx.inner.scaled);
            node.name = format!("{}-{}", a.node.name, *count);
            *count += 1;
        }
        node.labels
            .insert("kubernetes.io/hostname".into(), node.name.clone());
        let obj = node.object(ctx.inner.minor, &ctx.inner.runtime);
        lock(&ctx.inner.nodes).push(node);
        let mut st = ctx.inner.lock();
        ctx.inner.insert_locked(&mut st, "nodes", obj);
    }
}

/// `Some(all containers exited 0)`, or `None` when the containers never (all) ran.
async fn pod_flow(ctx: &Ctx) -> Option<bool> {
    if ctx.sleep_or_stop(Duration::from_millis(100)).await {
        return None;
    }
    let mut scale = Autoscaling::default();
    let node = loop {
        match try_schedule(&ctx.inner, &ctx.ns, &ctx.name) {
            Ok(Some(n)) => break n,
            Ok(None) => return None,
            Err(msg) => {
                ctx.with(|m| m.cond("PodScheduled", false, Some("Unschedulable"), Some(&msg)));
                ctx.event(None, "Warning", "FailedScheduling", &msg, "default-scheduler");
                autoscale(ctx, &mut scale);
                if ctx.sleep_or_stop(Duration::from_secs(1)).await {
                    return None;
                }
            }
        }
    };
    ctx.event(
        None,
        "Normal",
        "Scheduled",
        &format!("Successfully assigned {}/{} to {node}", ctx.ns, ctx.name),
        "default-scheduler",
    );
    let has_init = !arr(&ctx.pod["spec"]["initContainers"]).is_empty();
    ctx.with(|m| {
        m.bound = true;
        m.start_time = now();
        m.pod_ip = pod_ip();
        m.cond("PodScheduled", true, None, None);
        m.cond("PodReadyToStartContainers", true, None, None);
        if has_init {
            m.cond("Initialized", false, Some("ContainersNotInitialized"), None);
        } else {
            m.cond("Initialized", true, None, None);
        }
        m.cond("Ready", false, Some("ContainersNotReady"), None);
        m.cond("ContainersReady", false, Some("ContainersNotReady"), None);
    });
    // The kubelet-managed `/etc/hosts`, kept current while the pod lives (its peers' names).
    write_hosts(ctx);
    let hosts = {
        let (inner, rt, ns, name, path) = (
            ctx.inner.clone(),
            ctx.rt.clone(),
            ctx.ns.clone(),
            ctx.name.clone(),
            hosts_path(ctx),
        );
        tokio::spawn(async move {
            let mut done = rt.done.subscribe();
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = done.wait_for(Option::is_some) => return,
                }
                if let Some(pod) = inner.get("pods", &ns, &name) {
                    let text = hosts_file(&inner, &pod);
                    if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
                        let _ = std::fs::write(&path, text);
                    }
                }
            }
        })
    };
    let out = run_pod_containers(ctx, &node).await;
    hosts.abort();
    out
}

/// A bound pod's volumes, GPUs, init containers and containers.
async fn run_pod_containers(ctx: &Ctx, node: &str) -> Option<bool> {
    let node = node.to_string();
    let has_init = !arr(&ctx.pod["spec"]["initContainers"]).is_empty();
    let volumes = prepare_volumes(ctx).await?;
    let gpus = allocate_gpus(ctx, &node);
    for (i, c) in arr(&ctx.pod["spec"]["initContainers"]).iter().enumerate() {
        let mine: Vec<u32> = gpus.iter().take(container_gpus(c)).copied().collect();
        match run_container(ctx, true, i, c, &volumes, &mine).await {
            Outcome::Exited(0) => {}
            Outcome::Exited(_) => return Some(false),
            Outcome::Stopped => return None,
        }
    }
    if has_init {
        ctx.with(|m| {
            m.cond("Initialized", true, None, None);
            for s in &mut m.main {
                s.state = json!({"waiting": {"reason": "ContainerCreating"}});
            }
        });
    }
    let mut next = 0;
    let mut shares = Vec::new();
    for c in arr(&ctx.pod["spec"]["containers"]) {
        let n = container_gpus(c);
        shares.push(gpus.iter().skip(next).take(n).copied().collect::<Vec<u32>>());
        next += n;
    }
    let runs = arr(&ctx.pod["spec"]["containers"])
        .iter()
        .zip(&shares)
        .enumerate()
        .map(|(i, (c, mine))| run_container(ctx, false, i, c, &volumes, mine));
    let outs = futures_util::future::join_all(runs).await;
    if outs.iter().any(|o| matches!(o, Outcome::Stopped))
        && outs.iter().all(|o| !matches!(o, Outcome::Exited(c) if *c != 0))
    {
        return None;
    }
    Some(outs.iter().all(|o| matches!(o, Outcome::Exited(0))))
}

/// `nvidia.com/gpu` of one container (limits, else requests).
fn container_gpus(c: &Value) -> usize {
    let r = &c["resources"];
    quantity_of(&r["limits"][GPU])
        .or_else(|| quantity_of(&r["requests"][GPU]))
        .unwrap_or(0.0) as usize
}

/// The device plugin's choice for a pod bound to `node`: the lowest GPU indices of the node
/// that no other live pod there holds (`pod_gpus` of them; none on a node without GPUs).
fn allocate_gpus(ctx: &Ctx, node: &str) -> Vec<u32> {
    let want = pod_gpus(&ctx.pod) as usize;
    let Some(n) = lock(&ctx.inner.nodes).iter().find(|n| n.name == node).cloned() else {
        return Vec::new();
    };
    if want == 0 || n.gpus == 0 {
        return Vec::new();
    }
    let st = ctx.inner.lock();
    let mut used = BTreeSet::new();
    for (key, rt) in &st.pods {
        if Arc::ptr_eq(rt, &ctx.rt) || rt.done.borrow().is_some() {
            continue;
        }
        let there = st
            .objs
            .get("pods")
            .and_then(|m| m.get(key))
            .is_some_and(|p| p["spec"]["nodeName"].as_str() == Some(node));
        if there {
            used.extend(lock(&rt.gpus).iter().copied());
        }
    }
    let mine: Vec<u32> = (0..n.gpus).filter(|i| !used.contains(i)).take(want).collect();
    *lock(&ctx.rt.gpus) = mine.clone();
    mine
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_normalize_and_validate() {
        assert_eq!(normalize_image("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalize_image("acme/x:v1"), "docker.io/acme/x:v1");
        assert_eq!(normalize_image("reg.io:5000/a/b"), "reg.io:5000/a/b:latest");
        assert_eq!(normalize_image("localhost/a@sha256:ab"), "localhost/a@sha256:ab");
    }

    #[test]
    fn expansion() {
        let env: BTreeMap<String, String> = [("A".to_string(), "1".to_string())].into();
        assert_eq!(expand("x$(A)y$(B)$$(A)$", &env), "x1y$(B)$(A)$");
    }

    #[test]
    fn log_rendering() {
        let b = LogBuf::new();
        b.push(b"a\nb");
        b.push(b"c\nd\n");
        let d = lock(&b.data);
        assert_eq!(d.starts.len(), 3);
        let from = d.start(Some(2), None);
        assert_eq!(&d.bytes[from..], b"bc\nd\n");
        let r = String::from_utf8(d.render(0, d.bytes.len(), true)).unwrap();
        assert_eq!(r.lines().count(), 3);
        assert!(r.lines().all(|l| l.contains("Z ")), "{r}");
    }
}
