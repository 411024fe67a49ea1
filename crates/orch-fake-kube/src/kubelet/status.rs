//! A pod's status as the kubelet reports it: container states, conditions,
//! the QoS class.

use super::*;

pub(super) struct CStat {
    pub(super) name: String,
    pub(super) image: String,
    pub(super) state: Value,
    pub(super) ready: bool,
    pub(super) started: bool,
    pub(super) id: Option<String>,
    pub(super) image_id: String,
}

impl CStat {
    pub(super) fn json(&self) -> Value {
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

pub(super) struct Cond {
    pub(super) ty: &'static str,
    pub(super) status: bool,
    pub(super) reason: Option<String>,
    pub(super) message: Option<String>,
    pub(super) at: String,
}

/// What the kubelet (and before binding, the scheduler) reports as the pod's status.
pub(super) struct Model {
    pub(super) phase: &'static str,
    pub(super) reason: Option<String>,
    pub(super) message: Option<String>,
    pub(super) conds: Vec<Cond>,
    pub(super) init: Vec<CStat>,
    pub(super) main: Vec<CStat>,
    pub(super) bound: bool,
    pub(super) start_time: String,
    pub(super) pod_ip: String,
    pub(super) qos: &'static str,
}

impl Model {
    pub(super) fn new(pod: &Value) -> Self {
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

    pub(super) fn cond(
        &mut self,
        ty: &'static str,
        status: bool,
        reason: Option<&str>,
        message: Option<&str>,
    ) {
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

    pub(super) fn json(&self) -> Value {
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

pub(super) fn qos_class(pod: &Value) -> &'static str {
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
