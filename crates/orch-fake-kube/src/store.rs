//! The object store: every object as JSON, a global resourceVersion, and the history of changes
//! that watches replay.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use tokio::sync::watch;

use super::jobs::JobRt;
use super::kubelet::PodRt;
use super::util::{hex, now, uuid};
use super::{FakeAutoscaler, FakeNode};

/// What the API knows about one resource.
pub(crate) struct ResourceInfo {
    pub resource: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
}

impl ResourceInfo {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub(crate) const RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        resource: "pods",
        group: "",
        version: "v1",
        kind: "Pod",
        namespaced: true,
    },
    ResourceInfo {
        resource: "secrets",
        group: "",
        version: "v1",
        kind: "Secret",
        namespaced: true,
    },
    ResourceInfo {
        resource: "configmaps",
        group: "",
        version: "v1",
        kind: "ConfigMap",
        namespaced: true,
    },
    ResourceInfo {
        resource: "services",
        group: "",
        version: "v1",
        kind: "Service",
        namespaced: true,
    },
    ResourceInfo {
        resource: "events",
        group: "",
        version: "v1",
        kind: "Event",
        namespaced: true,
    },
    ResourceInfo {
        resource: "nodes",
        group: "",
        version: "v1",
        kind: "Node",
        namespaced: false,
    },
    ResourceInfo {
        resource: "jobs",
        group: "batch",
        version: "v1",
        kind: "Job",
        namespaced: true,
    },
];

pub(crate) fn info(group: &str, resource: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.resource == resource)
}

pub(crate) fn info_of(resource: &str) -> &'static ResourceInfo {
    // Invariant: callers pass one of the names in RESOURCES (internal constants).
    RESOURCES
        .iter()
        .find(|r| r.resource == resource)
        .unwrap_or(&RESOURCES[0])
}

/// One change, as a watch sends it.
pub(crate) struct Change {
    pub rv: u64,
    pub resource: &'static str,
    pub kind: &'static str,
    pub obj: Arc<Value>,
}

pub(crate) type Key = (String, String);

#[derive(Default)]
pub(crate) struct State {
    pub rv: u64,
    /// Watches from a resourceVersion below this are `410 Gone` (`FakeKube::compact`).
    pub compacted: u64,
    pub objs: BTreeMap<&'static str, BTreeMap<Key, Value>>,
    pub history: Vec<Change>,
    pub pods: HashMap<Key, Arc<PodRt>>,
    pub jobs: HashMap<Key, Arc<JobRt>>,
    /// The event already recorded for (namespace, involved object's uid,
    /// reason, message, component): a repeat bumps its count, as the
    /// kubelet's event correlator does (by key, not a scan of every event:
    /// 5,000 cells made tens of thousands of them).
    pub event_keys: HashMap<EventKey, String>,
}

/// What makes two events one (with a count).
pub(crate) type EventKey = (String, String, String, String, String);

pub(crate) struct Inner {
    pub state: Mutex<State>,
    /// The latest resourceVersion, for watches and log followers to wake on.
    pub changed: watch::Sender<u64>,
    pub token: String,
    /// The cluster's nodes (the autoscaler adds some).
    pub nodes: Mutex<Vec<FakeNode>>,
    pub autoscaler: Option<FakeAutoscaler>,
    /// Nodes the autoscaler added.
    pub scaled: Mutex<u32>,
    pub images: BTreeMap<String, PathBuf>,
    pub pvcs: BTreeMap<String, PathBuf>,
    /// The NVML library GPU containers get (`FakeKubeBuilder::nvml_stub`).
    pub nvml: Option<PathBuf>,
    pub cut_logs: Option<usize>,
    /// Watches drop a pod's changes once it ended (`lose_pod_endings_in_watches`).
    pub lose_pod_endings: bool,
    /// The cluster's Kubernetes minor version (`1.MINOR`: `/version`, the kubelets').
    pub minor: u32,
    /// The `ImageVolume` feature gate (API server and kubelets).
    pub image_volume: bool,
    /// Every node's `containerRuntimeVersion` (`containerd://2.0.0` by default).
    pub runtime: String,
    pub root: PathBuf,
    pub port: u16,
    pub requests: Mutex<Vec<String>>,
    /// Requests by verb and resource, and the rate limit (`FakeKubeBuilder::rate_limit`).
    pub limits: super::limits::Limits,
    /// How late every request is answered (`FakeKubeBuilder::latency`).
    pub latency: std::time::Duration,
    /// Process groups started and not yet reaped.
    pub pgids: Mutex<BTreeSet<i32>>,
    pub stopping: AtomicBool,
    /// The Role requests are authorized by (`FakeKubeBuilder::role`).
    pub rbac: Option<super::rbac::Rbac>,
    /// Bumped to close every open connection (`FakeKube::drop_connections`).
    pub drops: watch::Sender<u64>,
    /// New connections are reset until then.
    pub down_until: Mutex<Option<std::time::Instant>>,
    /// A request starting with this (`METHOD /path`) starts a drop of this long.
    pub drop_on: Mutex<Option<(String, std::time::Duration)>>,
}

impl Inner {
    /// Close every open connection and reset new ones for `d`.
    pub fn drop_connections(&self, d: std::time::Duration) {
        *lock(&self.down_until) = Some(std::time::Instant::now() + d);
        self.drops.send_modify(|n| *n += 1);
    }

    /// Is the API server away now?
    pub fn is_down(&self) -> bool {
        lock(&self.down_until).is_some_and(|t| std::time::Instant::now() < t)
    }
}

/// Lock a mutex, also after a panic elsewhere (the data stays usable for a test fake).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    pub fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn record(&self, st: &mut State, resource: &'static str, kind: &'static str, obj: &Value) {
        st.history.push(Change {
            rv: st.rv,
            resource,
            kind,
            obj: Arc::new(obj.clone()),
        });
        self.changed.send_replace(st.rv);
    }

    /// Store a new object (metadata filled in); the caller checked the name is free.
    pub fn insert_locked(&self, st: &mut State, resource: &'static str, mut obj: Value) -> Value {
        st.rv += 1;
        let info = info_of(resource);
        obj["kind"] = json!(info.kind);
        obj["apiVersion"] = json!(info.api_version());
        let m = &mut obj["metadata"];
        if m.get("uid").and_then(Value::as_str).is_none() {
            m["uid"] = json!(uuid());
        }
        m["resourceVersion"] = json!(st.rv.to_string());
        m["creationTimestamp"] = json!(now());
        if m["namespace"].as_str().is_some_and(str::is_empty) {
            if let Some(m) = m.as_object_mut() {
                m.remove("namespace");
            }
        }
        let key = key_of(&obj);
        st.objs.entry(resource).or_default().insert(key, obj.clone());
        self.record(st, resource, "ADDED", &obj);
        obj
    }

    pub fn get(&self, resource: &'static str, ns: &str, name: &str) -> Option<Value> {
        self.lock()
            .objs
            .get(resource)?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Change an object; a MODIFIED change is recorded when it really changed.
    pub fn update(
        &self,
        resource: &'static str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let mut st = self.lock();
        self.update_locked(&mut st, resource, ns, name, f)
    }

    pub fn update_locked(
        &self,
        st: &mut State,
        resource: &'static str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let key = (ns.to_string(), name.to_string());
        let obj = st.objs.get_mut(resource)?.get_mut(&key)?;
        let before = obj.clone();
        f(obj);
        if *obj == before {
            return Some(before);
        }
        st.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let out = obj.clone();
        self.record(st, resource, "MODIFIED", &out);
        Some(out)
    }

    pub fn remove(&self, resource: &'static str, ns: &str, name: &str) -> Option<Value> {
        let mut st = self.lock();
        self.remove_locked(&mut st, resource, ns, name)
    }

    pub fn remove_locked(
        &self,
        st: &mut State,
        resource: &'static str,
        ns: &str,
        name: &str,
    ) -> Option<Value> {
        let mut obj = st
            .objs
            .get_mut(resource)?
            .remove(&(ns.to_string(), name.to_string()))?;
        st.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        self.record(st, resource, "DELETED", &obj);
        if resource == "pods" {
            st.pods.remove(&(ns.to_string(), name.to_string()));
        }
        if resource == "jobs" {
            st.jobs.remove(&(ns.to_string(), name.to_string()));
            // The garbage collector: a Service (or ConfigMap, Secret) whose owners
            // are all gone goes with its last owner (pods have their own path).
            let uid = obj["metadata"]["uid"].clone();
            for r in ["services", "configmaps", "secrets"] {
                let owned: Vec<Key> = st
                    .objs
                    .get(r)
                    .map(|m| {
                        m.iter()
                            .filter(|(k, o)| {
                                k.0 == ns && {
                                    let refs = o["metadata"]["ownerReferences"].as_array();
                                    refs.is_some_and(|a| !a.is_empty() && a.iter().all(|o| o["uid"] == uid))
                                }
                            })
                            .map(|(k, _)| k.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                for (kns, kname) in owned {
                    self.remove_locked(st, r, &kns, &kname);
                }
            }
        }
        Some(obj)
    }

    /// Every object of a resource in a namespace (`None`: all namespaces).
    pub fn list(&self, resource: &'static str, ns: Option<&str>) -> Vec<Value> {
        let st = self.lock();
        list_locked(&st, resource, ns)
    }

    /// Record a core/v1 Event about `involved` (a Pod or Job object); an identical one (same
    /// object, reason, message, source) is counted again instead.
    pub fn event(
        &self,
        involved: &Value,
        field_path: Option<&str>,
        type_: &str,
        reason: &str,
        message: &str,
        component: &str,
    ) {
        let ns = involved["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = involved["metadata"]["name"].as_str().unwrap_or_default();
        let uid = involved["metadata"]["uid"].as_str().unwrap_or_default();
        let host = involved["spec"]["nodeName"].as_str().unwrap_or_default();
        let mut st = self.lock();
        let key: EventKey = (
            ns.clone(),
            uid.to_string(),
            reason.to_string(),
            message.to_string(),
            component.to_string(),
        );
        if let Some(ev) = st.event_keys.get(&key).cloned() {
            let bumped = self.update_locked(&mut st, "events", &ns, &ev, |e| {
                let n = e["count"].as_u64().unwrap_or(1);
                e["count"] = json!(n + 1);
                e["lastTimestamp"] = json!(now());
            });
            if bumped.is_some() {
                return;
            }
            // Deleted since (through the API): a new one.
            st.event_keys.remove(&key);
        }
        let mut io = json!({
            "kind": involved["kind"],
            "namespace": ns,
            "name": name,
            "uid": uid,
            "apiVersion": involved["apiVersion"],
            "resourceVersion": involved["metadata"]["resourceVersion"],
        });
        if let Some(fp) = field_path {
            io["fieldPath"] = json!(fp);
        }
        let mut source = json!({"component": component});
        if !host.is_empty() && component == "kubelet" {
            source["host"] = json!(host);
        }
        let t = now();
        let ev = json!({
            "metadata": {"name": format!("{name}.{}", hex(16)), "namespace": ns},
            "involvedObject": io,
            "reason": reason,
            "message": message,
            "source": source,
            "firstTimestamp": t,
            "lastTimestamp": t,
            "count": 1,
            "type": type_,
            "eventTime": null,
            "reportingComponent": component,
            "reportingInstance": if component == "kubelet" { host } else { "" },
        });
        let ev = self.insert_locked(&mut st, "events", ev);
        if let Some(name) = ev["metadata"]["name"].as_str() {
            st.event_keys.insert(key, name.to_string());
        }
    }
}

pub(crate) fn list_locked(st: &State, resource: &'static str, ns: Option<&str>) -> Vec<Value> {
    st.objs
        .get(resource)
        .map(|m| {
            m.iter()
                .filter(|(k, _)| ns.is_none_or(|n| k.0 == n))
                .map(|(_, v)| v.clone())
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn key_of(obj: &Value) -> Key {
    (
        obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        obj["metadata"]["name"].as_str().unwrap_or_default().to_string(),
    )
}
