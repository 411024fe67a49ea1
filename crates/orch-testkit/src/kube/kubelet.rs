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

struct CStat {
    name: String,
    image: String,
    state: Value,
    ready: bool,
    started: bool,
    id: Option<String>,
    image_id: String,
}

impl CStat {
    fn json(&self) -> Value {
        let mut v = json!({
            "name": self.name,
            "state": self.state,
            "lastState": {},
            "ready": self.ready,
            "restartCount": 0,
            "image": self.image,
            "imageID": self.image_id,
            "started": self.started,
        });
        if let Some(id) = &self.id {
            v["containerID"] = json!(id);
        }
        v
    }
}

struct Cond {
    ty: &'static str,
    status: bool,
    reason: Option<String>,
    message: Option<String>,
    at: String,
}

/// What the kubelet (and before binding, the scheduler) reports as the pod's status.
struct Model {
    phase: &'static str,
    reason: Option<String>,
    message: Option<String>,
    conds: Vec<Cond>,
    init: Vec<CStat>,
    main: Vec<CStat>,
    bound: bool,
    start_time: String,
    pod_ip: String,
    qos: &'static str,
}

impl Model {
    fn new(pod: &Value) -> Self {
        let stat = |c: &Value, reason: &str| CStat {
            name: c["name"].as_str().unwrap_or_default().to_string(),
            image: c["image"].as_str().unwrap_or_default().to_string(),
            state: json!({"waiting": {"reason": reason}}),
            ready: false,
            started: false,
            id: None,
            image_id: String::new(),
        };
        let inits = arr(&pod["spec"]["initContainers"]);
        let main_reason = if inits.is_empty() {
            "ContainerCreating"
        } else {
            "PodInitializing"
        };
        Model {
            phase: "Pending",
            reason: None,
            message: None,
            conds: Vec::new(),
            init: inits.iter().map(|c| stat(c, "PodInitializing")).collect(),
            main: arr(&pod["spec"]["containers"])
                .iter()
                .map(|c| stat(c, main_reason))
                .collect(),
            bound: false,
            start_time: String::new(),
            pod_ip: String::new(),
            qos: qos_class(pod),
        }
    }

    fn cond(&mut self, ty: &'static str, status: bool, reason: Option<&str>, message: Option<&str>) {
        let at = now();
        match self.conds.iter_mut().find(|c| c.ty == ty) {
            Some(c) => {
                if c.status != status {
                    c.at = at;
                }
                c.status = status;
                c.reason = reason.map(str::to_string);
                c.message = message.map(str::to_string);
            }
            None => self.conds.push(Cond {
                ty,
                status,
                reason: reason.map(str::to_string),
                message: message.map(str::to_string),
                at,
            }),
        }
        let order = [
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        ];
        self.conds
            .sort_by_key(|c| order.iter().position(|o| *o == c.ty).unwrap_or(9));
    }

    fn json(&self) -> Value {
        let mut s = json!({"phase": self.phase, "qosClass": self.qos});
        s["conditions"] = self
            .conds
            .iter()
            .map(|c| {
                let mut v = json!({
                    "type": c.ty,
                    "status": if c.status { "True" } else { "False" },
                    "lastProbeTime": null,
                    "lastTransitionTime": c.at,
                });
                if let Some(r) = &c.reason {
                    v["reason"] = json!(r);
                }
                if let Some(m) = &c.message {
                    v["message"] = json!(m);
                }
                v
            })
            .collect();
        if let Some(r) = &self.reason {
            s["reason"] = json!(r);
        }
        if let Some(m) = &self.message {
            s["message"] = json!(m);
        }
        if self.bound {
            s["hostIP"] = json!("127.0.0.1");
            s["hostIPs"] = json!([{"ip": "127.0.0.1"}]);
            s["podIP"] = json!(self.pod_ip);
            s["podIPs"] = json!([{"ip": self.pod_ip}]);
            s["startTime"] = json!(self.start_time);
            if !self.init.is_empty() {
                s["initContainerStatuses"] = self.init.iter().map(CStat::json).collect();
            }
            s["containerStatuses"] = self.main.iter().map(CStat::json).collect();
        }
        s
    }
}

fn qos_class(pod: &Value) -> &'static str {
    let cs = arr(&pod["spec"]["containers"]);
    let any = cs.iter().any(|c| {
        let r = &c["resources"];
        ["cpu", "memory"]
            .iter()
            .any(|k| !r["limits"][k].is_null() || !r["requests"][k].is_null())
    });
    if !any {
        return "BestEffort";
    }
    let guaranteed = cs.iter().all(|c| {
        let r = &c["resources"];
        ["cpu", "memory"].iter().all(|k| {
            let l = quantity_of(&r["limits"][k]);
            l.is_some() && (r["requests"][k].is_null() || quantity_of(&r["requests"][k]) == l)
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
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
        let obj = node.object();
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

/// A pod IP of its own on the loopback network (all of `127.0.0.0/8` reaches this host's
/// `lo`): pods share this host's network namespace, so a peer's name must resolve to an
/// address a listener bound to `0.0.0.0` (or to that address) answers on.
fn pod_ip() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(
        "127.{}.{}.{}",
        20 + (n / 62_500) % 200,
        (n / 250) % 250,
        2 + n % 250
    )
}

fn hosts_path(ctx: &Ctx) -> PathBuf {
    ctx.dir.join("etc-hosts")
}

/// The pod's hostname: `spec.hostname`, else its name.
fn hostname(pod: &Value) -> String {
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
    let services = super::store::list_locked(&st, "services", Some(ns));
    let pods = super::store::list_locked(&st, "pods", Some(ns));
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
fn write_hosts(ctx: &Ctx) {
    let pod = ctx
        .inner
        .get("pods", &ctx.ns, &ctx.name)
        .unwrap_or_else(|| ctx.pod.clone());
    let _ = std::fs::create_dir_all(&ctx.dir);
    let _ = std::fs::write(hosts_path(ctx), hosts_file(&ctx.inner, &pod));
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

/// Volume name → (host folder, mounted read-only whatever the mount says: a PVC claimed
/// `readOnly`, Secret volumes); `None` when stopped while waiting for a volume.
async fn prepare_volumes(ctx: &Ctx) -> Option<BTreeMap<String, (PathBuf, bool)>> {
    let mut out = BTreeMap::new();
    for v in arr(&ctx.pod["spec"]["volumes"]) {
        let name = v["name"].as_str().unwrap_or_default().to_string();
        let own = ctx.dir.join("volumes").join(&name);
        let host = if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
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
            || v["secret"].is_object()
            || v["configMap"].is_object()
            || v["projected"].is_object();
        out.insert(name, (host, ro));
    }
    Some(out)
}

/// The files of a Secret's `data`, or a ConfigMap's `data` (text) and `binaryData` (base64),
/// under `dir` (all keys, or the source's `items`), with the source's `defaultMode` (else
/// 0644), as the kubelet's atomic writer leaves them.
fn write_secret_files(dir: &Path, obj: &Value, vol: &Value, mode: Option<u64>) {
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
fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
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

fn secret_value(inner: &Inner, ns: &str, name: &str, key: &str) -> Result<Option<String>, String> {
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
fn resolve_env(inner: &Inner, pod: &Value, c: &Value) -> Result<BTreeMap<String, String>, String> {
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

fn field_ref(pod: &Value, path: &str) -> String {
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

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid two-int array; pipe2 fills it on success.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub(crate) fn killpg(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: plain syscall; a negative pid names the process group.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// Every process of a container: its process group and every descendant
/// of its main process (a real container is a cgroup: processes that leave
/// the group, like a supervisor's workload in a group of its own, are still
/// in it). (pid, resident bytes) of each.
fn container_procs(root: i32) -> Vec<(i32, u64)> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    // pid -> (ppid, pgid, rss)
    let mut all: BTreeMap<i32, (i32, i32, u64)> = BTreeMap::new();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(i) = stat.rfind(')') else { continue };
        let f: Vec<&str> = stat[i + 1..].split_whitespace().collect();
        let num = |k: usize| f.get(k).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        all.insert(pid, (num(1) as i32, num(2) as i32, num(21).max(0) as u64 * page));
    }
    let inside = |mut pid: i32| {
        for _ in 0..64 {
            if pid == root {
                return true;
            }
            match all.get(&pid) {
                Some((ppid, _, _)) if *ppid > 1 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    all.iter()
        .filter(|(pid, (_, pgid, _))| *pgid == root || inside(**pid))
        .map(|(pid, (_, _, rss))| (*pid, *rss))
        .collect()
}

/// Resident memory of every process of a container.
fn group_rss(root: i32) -> u64 {
    container_procs(root).iter().map(|(_, r)| r).sum()
}

/// Signal every process of a container.
fn kill_container(root: i32, sig: i32) {
    let procs = container_procs(root);
    killpg(root, sig);
    for (pid, _) in procs {
        if pid > 1 {
            // SAFETY: plain syscall on a pid of this container.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }
}

async fn run_container(
    ctx: &Ctx,
    init: bool,
    idx: usize,
    c: &Value,
    volumes: &BTreeMap<String, (PathBuf, bool)>,
    gpus: &[u32],
) -> Outcome {
    let cname = c["name"].as_str().unwrap_or_default().to_string();
    let image = c["image"].as_str().unwrap_or_default().to_string();
    let field = if init {
        format!("spec.initContainers{{{cname}}}")
    } else {
        format!("spec.containers{{{cname}}}")
    };
    let field = Some(field.as_str());
    let set = |f: &dyn Fn(&mut CStat)| {
        ctx.with(|m| {
            let list = if init { &mut m.init } else { &mut m.main };
            if let Some(s) = list.get_mut(idx) {
                f(s);
            }
        })
    };
    let waiting = |reason: &str, message: Option<&str>| {
        let mut w = json!({"reason": reason});
        if let Some(m) = message {
            w["message"] = json!(m);
        }
        set(&|s| s.state = json!({ "waiting": w.clone() }));
    };
    if ctx.stopping() {
        return Outcome::Stopped;
    }
    let image_root = match check_image(&ctx.inner, &image) {
        ImageCheck::Invalid(msg) => {
            waiting("InvalidImageName", Some(&msg));
            ctx.event(field, "Warning", "InspectFailed", &msg, "kubelet");
            ctx.event(field, "Warning", "Failed", "Error: InvalidImageName", "kubelet");
            ctx.wait_stop().await;
            return Outcome::Stopped;
        }
        ImageCheck::Unknown(full) => {
            ctx.event(
                field,
                "Normal",
                "Pulling",
                &format!("Pulling image \"{image}\""),
                "kubelet",
            );
            let msg = format!(
                "rpc error: code = NotFound desc = failed to pull and unpack image \"{full}\": failed to resolve reference \"{full}\": {full}: not found"
            );
            waiting("ErrImagePull", Some(&msg));
            ctx.event(
                field,
                "Warning",
                "Failed",
                &format!("Failed to pull image \"{image}\": {msg}"),
                "kubelet",
            );
            ctx.event(field, "Warning", "Failed", "Error: ErrImagePull", "kubelet");
            if ctx.sleep_or_stop(Duration::from_secs(1)).await {
                return Outcome::Stopped;
            }
            let back = format!("Back-off pulling image \"{image}\"");
            waiting("ImagePullBackOff", Some(&back));
            ctx.event(field, "Normal", "BackOff", &back, "kubelet");
            ctx.event(field, "Warning", "Failed", "Error: ImagePullBackOff", "kubelet");
            ctx.wait_stop().await;
            return Outcome::Stopped;
        }
        ImageCheck::Known(root) => {
            ctx.event(
                field,
                "Normal",
                "Pulled",
                &format!("Container image \"{image}\" already present on machine"),
                "kubelet",
            );
            root
        }
    };
    let env = loop {
        match resolve_env(&ctx.inner, &ctx.pod, c) {
            Ok(env) => break env,
            Err(msg) => {
                waiting("CreateContainerConfigError", Some(&msg));
                ctx.event(field, "Warning", "Failed", &format!("Error: {msg}"), "kubelet");
                if ctx.sleep_or_stop(Duration::from_secs(1)).await {
                    return Outcome::Stopped;
                }
            }
        }
    };
    // The container: its image's root, a writable layer of its own, the termination message
    // file and the volume mounts.
    let cdir = ctx.dir.join("containers").join(&cname);
    let term = cdir.join("termination-log");
    let _ = std::fs::create_dir_all(&cdir);
    let _ = std::fs::write(&term, b"");
    let term_path = c["terminationMessagePath"]
        .as_str()
        .unwrap_or("/dev/termination-log")
        .to_string();
    let mut mounts = vec![container::Mount {
        host: term.clone(),
        target: term_path,
        read_only: false,
    }];
    // The kubelet-managed hosts file, unless a volume is mounted there.
    let hosts = hosts_path(ctx);
    let own_hosts = arr(&c["volumeMounts"])
        .iter()
        .any(|vm| vm["mountPath"] == json!("/etc/hosts"));
    if hosts.is_file() && !own_hosts {
        mounts.push(container::Mount {
            host: hosts,
            target: "/etc/hosts".into(),
            read_only: false,
        });
    }
    for vm in arr(&c["volumeMounts"]) {
        let (Some(name), Some(target)) = (vm["name"].as_str(), vm["mountPath"].as_str()) else {
            continue;
        };
        let Some((host, vol_ro)) = volumes.get(name) else {
            continue;
        };
        let host = match vm["subPath"].as_str().filter(|s| !s.is_empty()) {
            Some(sp) if !sp.split('/').any(|p| p == "..") && !sp.starts_with('/') => {
                let p = host.join(sp);
                // The kubelet makes a missing subPath as a folder.
                if !p.exists() {
                    let _ = std::fs::create_dir_all(&p);
                }
                p
            }
            Some(_) => continue,
            None => host.clone(),
        };
        mounts.push(container::Mount {
            host,
            target: target.to_string(),
            read_only: *vol_ro || vm["readOnly"] == json!(true),
        });
    }
    let gpu = match (&ctx.inner.nvml, gpus.is_empty()) {
        (Some(lib), false) => Some(container::Gpu {
            nvml_lib: lib.clone(),
            visible_devices: gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        }),
        _ => None,
    };
    let spec = container::Spec {
        root: image_root,
        mounts,
        gpu,
        workdir: c["workingDir"].as_str().unwrap_or("/").to_string(),
        layer: Some(cdir.join("layer")),
    };
    let argv: Vec<String> = arr(&c["command"])
        .iter()
        .chain(arr(&c["args"]))
        .filter_map(Value::as_str)
        .map(|a| expand(a, &env))
        .collect();
    let log = Arc::new(LogBuf::new());
    lock(&ctx.rt.logs).insert(cname.clone(), log.clone());
    let started_at = now();
    let id = format!("containerd://{}", hex(64));
    let image_id = format!(
        "{}@sha256:{:x}",
        normalize_image(&image)
            .split([':', '@'])
            .next()
            .unwrap_or_default(),
        sha2::Sha256::digest(image.as_bytes())
    );
    let spawned = spawn(ctx, &spec, &argv, &env);
    let (mut child, reader) = match spawned {
        Ok(x) => x,
        Err(msg) => {
            log.finish();
            let message = format!(
                "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: {msg}: unknown"
            );
            let t = now();
            set(&|s| {
                s.id = Some(id.clone());
                s.image_id = image_id.clone();
                s.state = json!({"terminated": {"exitCode": 128, "reason": "StartError", "message": message, "startedAt": "1970-01-01T00:00:00Z", "finishedAt": t, "containerID": id}});
            });
            ctx.event(
                field,
                "Normal",
                "Created",
                &format!("Created container: {cname}"),
                "kubelet",
            );
            ctx.event(
                field,
                "Warning",
                "Failed",
                &format!("Error: {message}"),
                "kubelet",
            );
            return Outcome::Exited(128);
        }
    };
    let pid = child.id().map_or(0, |p| p as i32);
    lock(&ctx.rt.pgids).insert(cname.clone(), pid);
    lock(&ctx.inner.pgids).insert(pid);
    let reader = tokio::spawn(read_into(reader, log.clone()));
    ctx.event(
        field,
        "Normal",
        "Created",
        &format!("Created container: {cname}"),
        "kubelet",
    );
    ctx.event(
        field,
        "Normal",
        "Started",
        &format!("Started container {cname}"),
        "kubelet",
    );
    ctx.with(|m| {
        let list = if init { &mut m.init } else { &mut m.main };
        if let Some(s) = list.get_mut(idx) {
            s.state = json!({"running": {"startedAt": started_at}});
            s.started = true;
            s.ready = !init;
            s.id = Some(id.clone());
            s.image_id = image_id.clone();
        }
        if !init {
            m.phase = "Running";
            if m.main.iter().all(|s| s.ready) {
                m.cond("Ready", true, None, None);
                m.cond("ContainersReady", true, None, None);
            }
        }
    });
    let mem_limit = quantity_of(&c["resources"]["limits"]["memory"]).map(|q| q as u64);
    let mut stop_rx = ctx.rt.stop.subscribe();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let mut termed = false;
    let mut kill_at: Option<Instant> = None;
    let mut oom = false;
    let status = loop {
        if let Some(s) = stop_rx.borrow_and_update().clone() {
            if s.kill_now {
                killpg(pid, libc::SIGKILL);
            } else {
                let grace = s.grace.unwrap_or(Duration::from_secs(30));
                if !termed {
                    termed = true;
                    ctx.event(
                        field,
                        "Normal",
                        "Killing",
                        &format!("Stopping container {cname}"),
                        "kubelet",
                    );
                    killpg(pid, libc::SIGTERM);
                }
                let at = Instant::now() + grace;
                kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
            }
        }
        tokio::select! {
            st = child.wait() => break st.ok(),
            r = stop_rx.changed() => { if r.is_err() { tokio::time::sleep(Duration::from_millis(50)).await; } }
            _ = tick.tick() => {
                if kill_at.is_some_and(|k| Instant::now() >= k) {
                    kill_container(pid, libc::SIGKILL);
                }
                if let Some(limit) = mem_limit {
                    if !oom && group_rss(pid) > limit {
                        oom = true;
                        kill_container(pid, libc::SIGKILL);
                    }
                }
            }
        }
    };
    // The container is gone: so is everything else in it.
    kill_container(pid, libc::SIGKILL);
    lock(&ctx.rt.pgids).remove(&cname);
    lock(&ctx.inner.pgids).remove(&pid);
    let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    log.finish();
    let code = status.map_or(137, |s| {
        use std::os::unix::process::ExitStatusExt as _;
        s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
    });
    let code = if oom { 137 } else { code };
    let reason = if oom {
        "OOMKilled"
    } else if code == 0 {
        "Completed"
    } else {
        "Error"
    };
    let mut message = std::fs::read(&term).unwrap_or_default();
    message.truncate(4096);
    let mut message = String::from_utf8_lossy(&message).into_owned();
    if message.is_empty() && code != 0 && c["terminationMessagePolicy"] == json!("FallbackToLogsOnError") {
        let d = lock(&log.data);
        let from = d.start(Some(80), None).max(d.bytes.len().saturating_sub(2048));
        message = String::from_utf8_lossy(&d.bytes[from..]).into_owned();
    }
    let mut t = json!({"exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now(), "containerID": id});
    if !message.is_empty() {
        t["message"] = json!(message);
    }
    ctx.with(|m| {
        let list = if init { &mut m.init } else { &mut m.main };
        if let Some(s) = list.get_mut(idx) {
            s.state = json!({ "terminated": t.clone() });
            s.ready = init && code == 0;
            s.started = false;
        }
        if !init {
            m.cond("Ready", false, Some("ContainersNotReady"), None);
            m.cond("ContainersReady", false, Some("ContainersNotReady"), None);
        }
    });
    Outcome::Exited(code)
}

fn spawn(
    ctx: &Ctx,
    spec: &container::Spec,
    argv: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(tokio::process::Child, OwnedFd), String> {
    if ctx.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return Err("the fake is shutting down".to_string());
    }
    let Some(prog) = argv.first() else {
        return Err("no command specified".to_string());
    };
    let mut env = env.clone();
    env.insert("HOSTNAME".into(), hostname(&ctx.pod));
    env.insert("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into());
    env.insert("KUBERNETES_SERVICE_PORT".into(), ctx.inner.port.to_string());
    let (r, w) = pipe().map_err(|e| format!("pipe: {e}"))?;
    let w2 = w.try_clone().map_err(|e| format!("pipe: {e}"))?;
    let mut cmd = container::command(spec, argv, &env).map_err(|e| e.to_string())?;
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(w))
        .stderr(std::process::Stdio::from(w2))
        .process_group(0)
        .kill_on_drop(true);
    let spawned = cmd.spawn();
    // Our copies of the write end close with `cmd`, so the reader sees EOF when the group is gone.
    drop(cmd);
    let child = spawned.map_err(|e| {
        // What the setup wrote before it failed (which mount, which folder).
        let said = drain(&r);
        let said = said.trim();
        if e.kind() == std::io::ErrorKind::NotFound && said.is_empty() {
            format!("exec: \"{prog}\": executable file not found in $PATH")
        } else if said.is_empty() {
            format!("exec: \"{prog}\": {e}")
        } else {
            format!("{said}: {e}")
        }
    })?;
    Ok((child, r))
}

/// Whatever is waiting in a pipe whose writers are gone (non-blocking).
fn drain(fd: &OwnedFd) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: read(2) into a stack buffer of the given length, on a descriptor we own.
        let n = unsafe {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
            libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
        };
        if n <= 0 || out.len() > 64 * 1024 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn read_into(fd: OwnedFd, log: Arc<LogBuf>) {
    let Ok(mut rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) else {
        return;
    };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match rx.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => log.push(&buf[..n]),
        }
    }
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
