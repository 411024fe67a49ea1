//! A fake Kubernetes API server over real HTTP, for tests: the subset a batch client uses
//! (Jobs, Pods, Services, Secrets, ConfigMaps, Events, Nodes, pod logs, watches), with a Job controller, a scheduler
//! and a kubelet that runs each container in its image's root folder, as a container runtime
//! would ([`crate::container`]: a mount namespace and `chroot`; needs root).
//!
//! - objects are JSON with uid, a global resourceVersion, creationTimestamp; errors are
//!   `Status` objects (`NotFound`, `AlreadyExists`, `Invalid`, `BadRequest`, `Unauthorized`);
//!   a ConfigMap is validated as the API server does (config keys, `binaryData` base64, at most
//!   1 MiB of data: `[]: Too long: must have at most 1048576 bytes`, 422), `immutable` honoured;
//! - watches replay changes after a given resourceVersion (or list the current objects as
//!   synthetic ADDED events first), honour `timeoutSeconds` and `sendInitialEvents`, send
//!   `BOOKMARK`s when asked (`allowWatchBookmarks`: after 5 s without a change and as the
//!   watch ends), and answer a version older than the last [`FakeKube::compact`] with
//!   `410 Gone`;
//! - lists and watches are served from memory, as an API server's watch cache serves them:
//!   the live objects and the change history (each change with its resourceVersion) are
//!   held by the server, a list says the resourceVersion it is current at, and a watch
//!   from that version misses nothing and repeats nothing;
//! - requests are counted by verb and resource ([`FakeKube::request_counts`]) and by second
//!   ([`FakeKube::requests_per_second`]) and, with [`FakeKubeBuilder::rate_limit`], refused
//!   past a rate with `429` and `Retry-After` (`limits.rs`); with
//!   [`FakeKubeBuilder::latency`] every request is answered that late (a real API server's
//!   round trip);
//! - a Job gets one pod, an Indexed Job one per completion index (`<job>-<index>-<suffix>`,
//!   hostname `<job>-<index>`, `JOB_COMPLETION_INDEX` and the completion-index annotation and
//!   label, `completedIndexes`); `backoffLimit` is treated as 0: the first failed pod fails the
//!   Job and its other pods are deleted (`jobs.rs`); the scheduler checks nodeSelector,
//!   required node affinity, NoSchedule taints, `nvidia.com/gpu` capacity and PVCs, with the
//!   default scheduler's messages and `FailedScheduling` events;
//! - a cluster autoscaler ([`FakeAutoscaler`]) may answer unschedulable pods with
//!   `TriggeredScaleUp` and a new node, or `NotTriggerScaleUp`, on a scripted timeline;
//! - the kubelet "pulls" images from the builder's map of references to root folders (unknown:
//!   `ErrImagePull` then `ImagePullBackOff`; malformed: `InvalidImageName`), resolves env from
//!   Secrets (`CreateContainerConfigError` until they exist), runs init containers then
//!   containers, each `chroot`ed in its image's root with a writable layer of its own and its
//!   volumes (emptyDir, Secret, ConfigMap, `projected` (Secret and ConfigMap sources), PVC and
//!   hostPath folders, `image` volumes (an image's root, read-only; the `ImageVolume` gate
//!   follows [`FakeKubeBuilder::kubernetes_minor`], and a runtime too old for them is
//!   [`FakeKubeBuilder::container_runtime`]); `subPath`, `readOnly`; a missing Secret or ConfigMap keeps the pod
//!   waiting with `FailedMount` events, as the kubelet does) and
//!   termination-log file bind-mounted at their container paths (nothing else of this host is
//!   visible, no path is translated: a program that needs a library the image lacks fails as
//!   it would on a cluster), in their own process groups; enforces memory limits (`OOMKilled`),
//!   writes termination messages, and terminates gracefully (SIGTERM, SIGKILL after the grace
//!   period);
//! - a pod on a GPU node that requests `nvidia.com/gpu: N` gets N of the node's GPUs, the
//!   lowest indices no other live pod on that node holds (the device plugin's choice), and,
//!   when the builder has an NVML library ([`FakeKubeBuilder::nvml_stub`]), the NVIDIA
//!   container toolkit's injection: the library at `libnvidia-ml.so.1` in the image and
//!   `NVIDIA_VISIBLE_DEVICES` naming those indices;
//! - deleting a Job through the API without a propagation policy orphans its pods, as
//!   batch/v1 does; `Background` and `Foreground` delete them; the garbage collector deletes a
//!   Service (or ConfigMap, Secret) whose owner references all name a deleted Job;
//! - Services (`type: ClusterIP` only; a DNS-1035 name, ports required unless headless, a
//!   cluster IP drawn unless `clusterIP: None`). Pods share this host's network namespace, each
//!   with an IP of its own on the loopback network (`127.20.x.y`: all of `127/8` reaches `lo`);
//!   the kubelet bind-mounts a managed `/etc/hosts` into every container (the pod's own name,
//!   and, standing in for cluster DNS, every pod under a headless Service of its namespace as
//!   `<hostname>.<subdomain>[.<ns>[.svc[.cluster.local]]]`, kept current while the pod runs), so
//!   a rank connects to `<job>-0.<service>:PORT` over real TCP (ports are this host's: two pods
//!   listening on one port collide, as on `hostNetwork`);
//! - with a Role file ([`FakeKubeBuilder::role`]: the Roles, ClusterRoles and bindings of
//!   e.g. `deploy/kubernetes/orch-role.yaml`), every request is authorized as RBAC does and
//!   a verb the Role lacks is `403 Forbidden` in the API server's words (`rbac.rs`);
//! - the API server going away: [`FakeKube::drop_connections`] closes every open
//!   connection (watches and log streams are cut mid-way) and resets new ones (TCP RST:
//!   the client sees `connection reset`) for a while, as a restarting or unreachable
//!   control plane does, while pods run on; [`FakeKube::drop_connections_on`] does the
//!   same when a given request comes (that request gets no answer);
//! - a disruption ([`FakeKube::disrupt`]): the `DisruptionTarget` condition set with a
//!   reason and message, then the pod deleted gracefully, as the Eviction API, the
//!   scheduler's preemption or the taint manager do ("Pod disruption conditions").
//!
//! Not shared: the fake depends on no `orch` crate and on no other fake but
//! `orch-fake-containers` (how a container runs); its objects, watches and kubelet are its own,
//! reached only over HTTP as a cluster's are. The `fake-kube` binary serves it for scripts
//! (`scripts/bench-kubernetes.sh`).
//!
//! ```no_run
//! use orch_fake_kube::{FakeKube, FakeNode};
//! let kube = FakeKube::builder()
//!     .node(FakeNode::h100("gpu-0", 8))
//!     .node(FakeNode::cpu("cpu-0"))
//!     .image("busybox:1.36", orch_fake_containers::container::busybox_root().unwrap())
//!     .start()
//!     .unwrap();
//! kube.write_kubeconfig(std::path::Path::new("/tmp/kubeconfig"), "default").unwrap();
//! ```

mod api;
mod jobs;
mod kubelet;
mod limits;
mod rbac;
mod sched;
mod store;
mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};

use kubelet::StopReq;
pub use limits::{RateLimit, Throttled};
use orch_fake_containers::container;
use store::{lock, Inner, State};

/// A node of the fake cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `nvidia.com/gpu` capacity.
    pub gpus: u32,
    pub taints: Vec<Taint>,
}

/// A node taint (`key=value:effect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

impl FakeNode {
    /// GPU node: labels `nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3`, `nvidia.com/gpu.count=N`,
    /// `nvidia.com/gpu.present=true`, `kubernetes.io/hostname=NAME`; taint
    /// `nvidia.com/gpu=present:NoSchedule`.
    pub fn h100(name: &str, gpus: u32) -> FakeNode {
        let labels = [
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3".to_string()),
            ("nvidia.com/gpu.count", gpus.to_string()),
            ("nvidia.com/gpu.present", "true".to_string()),
            ("kubernetes.io/hostname", name.to_string()),
            ("kubernetes.io/os", "linux".to_string()),
        ];
        FakeNode {
            name: name.to_string(),
            labels: labels.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            gpus,
            taints: vec![Taint {
                key: "nvidia.com/gpu".into(),
                value: "present".into(),
                effect: "NoSchedule".into(),
            }],
        }
    }

    /// CPU-only node, no taints, label `kubernetes.io/hostname=NAME`.
    pub fn cpu(name: &str) -> FakeNode {
        FakeNode {
            name: name.to_string(),
            labels: [
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("kubernetes.io/os".to_string(), "linux".to_string()),
            ]
            .into(),
            gpus: 0,
            taints: Vec::new(),
        }
    }

    fn object(&self, minor: u32, runtime: &str) -> Value {
        let mut capacity =
            json!({"cpu": "64", "memory": "527939160Ki", "pods": "110", "ephemeral-storage": "1845045268Ki"});
        if self.gpus > 0 {
            capacity[sched::GPU] = json!(self.gpus.to_string());
        }
        json!({
            "metadata": {"name": self.name, "namespace": "", "labels": self.labels},
            "spec": {"taints": self.taints.iter().map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect})).collect::<Vec<_>>()},
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": util::now(), "lastTransitionTime": util::now()}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.name}],
                "nodeInfo": {"kubeletVersion": format!("v1.{minor}.0-fake"), "containerRuntimeVersion": runtime, "operatingSystem": "linux", "architecture": "amd64", "osImage": "fake", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
            },
        })
    }
}

/// A cluster autoscaler with one node group (`pool`) that starts empty: on a pod the
/// scheduler cannot place it says, `decide_after` the pod went pending, `TriggeredScaleUp`
/// (the group's `node` would run the pod and fewer than `max` were added; source
/// `cluster-autoscaler`) or `NotTriggerScaleUp` (`pod didn't trigger scale-up: 1 max node
/// group size reached` or `... 1 node(s) didn't match Pod's node affinity/selector`), and
/// after a scale-up adds a copy of `node` (named `NAME-I`) `node_after` the pod went
/// pending. The real one says within ~15s; a new GPU node takes minutes.
#[derive(Debug, Clone)]
pub struct FakeAutoscaler {
    pub pool: String,
    pub node: FakeNode,
    pub max: u32,
    pub decide_after: Duration,
    pub node_after: Duration,
}

impl FakeAutoscaler {
    /// A GPU pool scaling from zero: `TriggeredScaleUp` at +15s, the node at +45s.
    pub fn gpu_pool(node: FakeNode) -> FakeAutoscaler {
        FakeAutoscaler {
            pool: "gpu-pool".into(),
            node,
            max: 4,
            decide_after: Duration::from_secs(15),
            node_after: Duration::from_secs(45),
        }
    }

    /// The same timeline at another pace (tests): verdict after `decide`, node after `node`.
    pub fn timings(mut self, decide: Duration, node: Duration) -> FakeAutoscaler {
        self.decide_after = decide;
        self.node_after = node;
        self
    }

    /// At most `max` nodes (0: every pod gets `NotTriggerScaleUp`, max size reached).
    pub fn max(mut self, max: u32) -> FakeAutoscaler {
        self.max = max;
        self
    }
}

/// Builds a [`FakeKube`].
pub struct FakeKubeBuilder {
    nodes: Vec<FakeNode>,
    autoscaler: Option<FakeAutoscaler>,
    images: BTreeMap<String, PathBuf>,
    pvcs: BTreeMap<String, PathBuf>,
    nvml: Option<PathBuf>,
    cut_logs: Option<usize>,
    token: String,
    role: Option<PathBuf>,
    rate_limit: Option<RateLimit>,
    latency: Duration,
    lose_pod_endings: bool,
    minor: u32,
    image_volume: Option<bool>,
    runtime: String,
}

impl FakeKubeBuilder {
    pub fn node(mut self, n: FakeNode) -> Self {
        self.nodes.push(n);
        self
    }

    /// A cluster autoscaler adding nodes for unschedulable pods ([`FakeAutoscaler`]).
    pub fn autoscaler(mut self, a: FakeAutoscaler) -> Self {
        self.autoscaler = Some(a);
        self
    }

    /// Image reference (exactly as written in a container's `image`) → the image's root
    /// folder on this host (its whole file system: containers `chroot` into it; see
    /// [`crate::container::busybox_root`]). Containers never change it: each writes to a layer
    /// of its own.
    pub fn image(mut self, reference: &str, root: impl Into<PathBuf>) -> Self {
        self.images.insert(reference.to_string(), root.into());
        self
    }

    /// The NVML library (`orch_fake_containers::gpu::nvml_stub()`, or any file) that containers given
    /// GPUs get at `libnvidia-ml.so.1`, as the NVIDIA container toolkit injects the driver's.
    /// Without it, GPU pods are scheduled on GPU nodes but see no GPU library.
    pub fn nvml_stub(mut self, lib: impl Into<PathBuf>) -> Self {
        self.nvml = Some(lib.into());
        self
    }

    /// A PersistentVolumeClaim that exists (in every namespace): name → host folder.
    pub fn pvc(mut self, name: &str, dir: impl Into<PathBuf>) -> Self {
        self.pvcs.insert(name.to_string(), dir.into());
        self
    }

    /// Cut every `follow=true` log stream after this many bytes (tests reconnection).
    pub fn cut_log_streams_after(mut self, bytes: usize) -> Self {
        self.cut_logs = Some(bytes);
        self
    }

    /// A fault: watches never send the change that ends a pod's container,
    /// or makes it `Succeeded` or `Failed` (nor a later change but its
    /// deletion): a lost watch event,
    /// as a fake whose bookmarks ran ahead of it once lost one; a GET or a
    /// list still shows it. A client that trusts its watch alone waits for ever.
    pub fn lose_pod_endings_in_watches(mut self) -> Self {
        self.lose_pod_endings = true;
        self
    }

    /// Authorize every request by the Roles and bindings of this YAML file (`kind: Role`,
    /// `RoleBinding`, `ClusterRole`, `ClusterRoleBinding`): a verb on a resource no bound
    /// rule grants is `403 Forbidden`. Without it every request is allowed.
    pub fn role(mut self, path: impl Into<PathBuf>) -> Self {
        self.role = Some(path.into());
        self
    }

    /// Refuse requests past `qps` a second (a token bucket of `burst`) with `429 Too Many
    /// Requests`, `Retry-After: SECONDS` (until the bucket holds a token again, at least 1)
    /// and the `X-Kubernetes-PF-*` headers, as Priority and Fairness does; each refusal is
    /// kept ([`FakeKube::throttled`]).
    pub fn rate_limit(mut self, qps: f64, burst: f64) -> Self {
        self.rate_limit = Some(RateLimit { qps, burst });
        self
    }

    /// Answer every request `d` late (the response, or a watch's or log stream's first
    /// byte, no sooner than `d` after the request came; a refused one too), as a real API
    /// server's round trip, admission and storage take tens of milliseconds. Default: none.
    pub fn latency(mut self, d: Duration) -> Self {
        self.latency = d;
        self
    }

    /// The cluster's Kubernetes version, `1.MINOR` (default 1.33): what `/version` and every
    /// node's `kubeletVersion` say, and the `ImageVolume` feature gate's default (on from
    /// 1.35, where it is beta and enabled by default; off before, beta-disabled in 1.33-1.34).
    pub fn kubernetes_minor(mut self, minor: u32) -> Self {
        self.minor = minor;
        self
    }

    /// The `ImageVolume` feature gate, whatever the version's default: off, the API server
    /// drops `image` volumes and the mounts of them from a pod spec as it stores it
    /// (`dropImageVolumes`: no error), so a container that needs one finds its mount path
    /// empty.
    pub fn image_volume_gate(mut self, on: bool) -> Self {
        self.image_volume = Some(on);
        self
    }

    /// Every node's `status.nodeInfo.containerRuntimeVersion` (default `containerd://2.0.0`).
    /// Image volumes need containerd 2.1 or CRI-O 1.31: on an older runtime the kubelet cannot
    /// mount one and the pod's containers are never created (`CreateContainerError`).
    pub fn container_runtime(mut self, version: &str) -> Self {
        self.runtime = version.to_string();
        self
    }

    /// Require `Authorization: Bearer TOKEN` (default `fake-token`; a 401 `Status` otherwise).
    pub fn token(mut self, t: &str) -> Self {
        self.token = t.to_string();
        self
    }

    pub fn start(self) -> std::io::Result<FakeKube> {
        static N: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "fake-kube-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            util::hex(6)
        ));
        std::fs::create_dir_all(&root)?;
        let rbac = match &self.role {
            Some(p) => Some(rbac::Rbac::parse(&std::fs::read_to_string(p)?).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", p.display()))
            })?),
            None => None,
        };
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            changed: tokio::sync::watch::Sender::new(0),
            token: self.token,
            nodes: Mutex::new(self.nodes),
            autoscaler: self.autoscaler,
            scaled: Mutex::new(0),
            images: self.images,
            pvcs: self.pvcs,
            nvml: self.nvml,
            cut_logs: self.cut_logs,
            lose_pod_endings: self.lose_pod_endings,
            minor: self.minor,
            image_volume: self.image_volume.unwrap_or(self.minor >= 35),
            runtime: self.runtime,
            root: root.clone(),
            port: addr.port(),
            requests: Mutex::new(Vec::new()),
            limits: limits::Limits::new(self.rate_limit),
            latency: self.latency,
            pgids: Mutex::new(BTreeSet::new()),
            stopping: AtomicBool::new(false),
            rbac,
            drops: tokio::sync::watch::Sender::new(0),
            down_until: Mutex::new(None),
            drop_on: Mutex::new(None),
        });
        {
            let mut st = inner.lock();
            for n in lock(&inner.nodes).iter() {
                inner.insert_locked(&mut st, "nodes", n.object(inner.minor, &inner.runtime));
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fake-kube")
            .enable_all()
            .build()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("fake-kube-main".into())
                .spawn(move || {
                    rt.block_on(accept_loop(listener, inner, rx));
                    rt.shutdown_timeout(Duration::from_secs(2));
                })?
        };
        Ok(FakeKube {
            inner,
            url: format!("http://{addr}"),
            shutdown: Some(tx),
            thread: Some(thread),
            root,
        })
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    inner: Arc<Inner>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fake-kube: cannot register the listener: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            acc = listener.accept() => match acc {
                Ok((stream, _)) => {
                    if inner.is_down() {
                        // Reset at once (SO_LINGER 0: RST, not FIN). Deprecated
                        // because a non-zero linger blocks the thread on drop;
                        // a zero one does not.
                        #[allow(deprecated)]
                        let _ = stream.set_linger(Some(Duration::ZERO));
                        drop(stream);
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let inner = inner.clone();
                    tokio::spawn(async move {
                        let mut drops = inner.drops.subscribe();
                        drops.borrow_and_update();
                        let svc = {
                            let inner = inner.clone();
                            service_fn(move |req| api::handle(inner.clone(), req))
                        };
                        let conn = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .keep_alive(true)
                            .serve_connection(TokioIo::new(stream), svc);
                        // A drop ends the connection where it is (its streams cut).
                        tokio::select! {
                            _ = conn => {}
                            _ = drops.changed() => {}
                        }
                    });
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

/// The running fake API server (on 127.0.0.1). Dropping it stops the server and kills every
/// process group it started.
pub struct FakeKube {
    inner: Arc<Inner>,
    url: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    root: PathBuf,
}

impl FakeKube {
    pub fn builder() -> FakeKubeBuilder {
        FakeKubeBuilder {
            nodes: Vec::new(),
            autoscaler: None,
            images: BTreeMap::new(),
            pvcs: BTreeMap::new(),
            nvml: None,
            cut_logs: None,
            token: "fake-token".to_string(),
            role: None,
            rate_limit: None,
            latency: Duration::ZERO,
            lose_pod_endings: false,
            minor: 33,
            image_volume: None,
            runtime: "containerd://2.0.0".to_string(),
        }
    }

    /// The API server goes away for `d`: every open connection is closed (watches and log
    /// streams cut mid-way, requests unanswered) and new ones are reset, while pods run on.
    pub fn drop_connections(&self, d: Duration) {
        self.inner.drop_connections(d);
    }

    /// [`Self::drop_connections`] for `d` when the first request whose `"METHOD /path?query"`
    /// starts with `request` comes (it gets no answer). Once.
    pub fn drop_connections_on(&self, request: &str, d: Duration) {
        *lock(&self.inner.drop_on) = Some((request.to_string(), d));
    }

    /// Is the API server away now (a drop in progress)?
    pub fn is_down(&self) -> bool {
        self.inner.is_down()
    }

    /// Disrupt a pod as the control plane does ("Pod disruption conditions"): the condition
    /// `DisruptionTarget` (status `True`, the given reason, e.g. `EvictionByEvictionAPI`,
    /// `PreemptionByScheduler`, `DeletionByTaintManager`, and message) is added to its status,
    /// then it is deleted with its grace period (its containers get SIGTERM, then SIGKILL).
    pub fn disrupt(&self, namespace: &str, pod: &str, reason: &str, message: &str) {
        self.inner.update("pods", namespace, pod, |p| {
            let cond = json!({"type": "DisruptionTarget", "status": "True", "reason": reason,
                "message": message, "lastTransitionTime": util::now(), "lastProbeTime": null});
            let list = &mut p["status"]["conditions"];
            if !list.is_array() {
                *list = json!([]);
            }
            if let Some(a) = list.as_array_mut() {
                a.retain(|c| c["type"] != json!("DisruptionTarget"));
                a.push(cond);
            }
        });
        let _ = jobs::delete_pod(&self.inner, namespace, pod, None);
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Writes a kubeconfig: cluster `fake` (server = url), user `fake` (token), context `fake`
    /// with the given default namespace, current-context `fake`.
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) -> std::io::Result<()> {
        let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {}\ncurrent-context: fake\npreferences: {{}}\nusers:\n- name: fake\n  user:\n    token: {}\n",
            q(&self.url),
            q(namespace),
            q(&self.inner.token)
        );
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(path, text)
    }

    /// Every live object of a resource (`jobs`, `pods`, `services`, `secrets`, `configmaps`, `events`, `nodes`), all
    /// namespaces, as JSON.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        match store::RESOURCES.iter().find(|r| r.resource == resource) {
            Some(ri) => self.inner.list(ri.resource, None),
            None => Vec::new(),
        }
    }

    /// Every object of a resource ever created (as created, deleted ones too), in order: what a
    /// client sent, after the API server's defaults.
    pub fn created(&self, resource: &str) -> Vec<Value> {
        let st = self.inner.lock();
        st.history
            .iter()
            .filter(|c| c.resource == resource && c.kind == "ADDED")
            .map(|c| (*c.obj).clone())
            .collect()
    }

    /// Pods whose container processes are still running (names).
    pub fn running_pods(&self) -> Vec<String> {
        let st = self.inner.lock();
        let mut out: Vec<String> = st
            .pods
            .iter()
            .filter(|(_, rt)| rt.running())
            .map(|(k, _)| k.1.clone())
            .collect();
        out.sort();
        out
    }

    /// Evict a running pod: kill its processes, phase Failed, reason Evicted, the given message.
    pub fn evict(&self, namespace: &str, pod: &str, message: &str) {
        let rt = self
            .inner
            .lock()
            .pods
            .get(&(namespace.to_string(), pod.to_string()))
            .cloned();
        if let Some(rt) = rt {
            rt.request_stop(StopReq {
                kill_now: true,
                reason: Some(("Evicted".into(), message.into())),
                ..Default::default()
            });
            for pgid in lock(&rt.pgids).values() {
                kubelet::killpg(*pgid, libc::SIGKILL);
            }
        }
    }

    /// Requests by (verb, resource), as RBAC names them: `get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`, `deletecollection`; `pods`, `pods/log`, `jobs`, ...
    /// (`("get", "discovery")` for the rest). Refused ones included.
    pub fn request_counts(&self) -> BTreeMap<(String, String), u64> {
        self.inner.limits.counts()
    }

    /// Requests in each second since the server started (index 0: the first second),
    /// refused ones included: the request rate over time.
    pub fn requests_per_second(&self) -> Vec<u64> {
        self.inner.limits.per_second()
    }

    /// Every request refused by the rate limit ([`FakeKubeBuilder::rate_limit`]), in order.
    pub fn throttled(&self) -> Vec<Throttled> {
        self.inner.limits.throttled()
    }

    /// Forget the history before now, as etcd's compaction does: a watch from an older
    /// resourceVersion is answered `410 Gone` (an `ERROR` event, reason `Expired`).
    pub fn compact(&self) {
        let mut st = self.inner.lock();
        st.compacted = st.rv;
    }

    /// `"METHOD /path?query"` of every request, in order.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.inner.requests).clone()
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        let pgids: Vec<i32> = lock(&self.inner.pgids).iter().copied().collect();
        for pgid in &pgids {
            kubelet::killpg(*pgid, libc::SIGKILL);
        }
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Group leaders whose container task never got to reap them (the runtime is gone).
        let left: Vec<i32> = lock(&self.inner.pgids).iter().copied().collect();
        for pgid in left {
            kubelet::killpg(pgid, libc::SIGKILL);
            for _ in 0..200 {
                let mut status = 0;
                // SAFETY: plain syscall on a pid this process spawned and has not reaped.
                let r = unsafe { libc::waitpid(pgid, &mut status, libc::WNOHANG) };
                if r != 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[cfg(test)]
mod tests;
