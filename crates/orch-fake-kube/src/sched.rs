//! The scheduler: node selector, required node affinity, NoSchedule taints, `nvidia.com/gpu`
//! capacity and PersistentVolumeClaims, with the default scheduler's messages.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::store::{lock, Inner};
use super::util::{now, quantity_of};
use super::FakeNode;

pub(crate) const GPU: &str = "nvidia.com/gpu";

/// GPUs a pod asks for: the sum over its containers of `nvidia.com/gpu` limits (or requests),
/// or the largest init container's, whichever is more (the effective request).
pub(crate) fn pod_gpus(pod: &Value) -> u64 {
    let of = |c: &Value| {
        let r = &c["resources"];
        quantity_of(&r["limits"][GPU])
            .or_else(|| quantity_of(&r["requests"][GPU]))
            .unwrap_or(0.0) as u64
    };
    let sum: u64 = arr(&pod["spec"]["containers"]).iter().map(of).sum();
    let init = arr(&pod["spec"]["initContainers"])
        .iter()
        .map(of)
        .max()
        .unwrap_or(0);
    sum.max(init)
}

pub(crate) fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn tolerates(tols: &[Value], key: &str, value: &str, effect: &str) -> bool {
    tols.iter().any(|t| {
        let te = t["effect"].as_str().unwrap_or("");
        if !te.is_empty() && te != effect {
            return false;
        }
        let tk = t["key"].as_str().unwrap_or("");
        let op = t["operator"].as_str().unwrap_or("Equal");
        if tk.is_empty() {
            return op == "Exists";
        }
        tk == key && (op == "Exists" || t["value"].as_str().unwrap_or("") == value)
    })
}

fn expr_matches(e: &Value, get: &dyn Fn(&str) -> Option<String>) -> bool {
    let key = e["key"].as_str().unwrap_or("");
    let vals: Vec<&str> = arr(&e["values"]).iter().filter_map(Value::as_str).collect();
    let have = get(key);
    match e["operator"].as_str().unwrap_or("") {
        "In" => have.is_some_and(|h| vals.contains(&h.as_str())),
        "NotIn" => have.is_none_or(|h| !vals.contains(&h.as_str())),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        "Gt" | "Lt" => {
            let (Some(h), Some(v)) = (
                have.and_then(|h| h.parse::<i64>().ok()),
                vals.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if e["operator"] == "Gt" {
                h > v
            } else {
                h < v
            }
        }
        _ => false,
    }
}

/// Could `node`, empty, run `pod`? (Its taints, selector and affinity, GPUs: what the
/// autoscaler asks of a node group's template.)
pub(crate) fn node_fits(pod: &Value, node: &FakeNode) -> bool {
    let tols = arr(&pod["spec"]["tolerations"]);
    node.taints.iter().all(|t| {
        !(t.effect == "NoSchedule" || t.effect == "NoExecute") || tolerates(tols, &t.key, &t.value, &t.effect)
    }) && affinity_matches(pod, node)
        && u64::from(node.gpus) >= pod_gpus(pod)
}

fn affinity_matches(pod: &Value, node: &FakeNode) -> bool {
    let labels = |k: &str| node.labels.get(k).cloned();
    if let Some(sel) = pod["spec"]["nodeSelector"].as_object() {
        if !sel
            .iter()
            .all(|(k, v)| node.labels.get(k).map(String::as_str) == v.as_str())
        {
            return false;
        }
    }
    let req = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    if req.is_null() {
        return true;
    }
    arr(&req["nodeSelectorTerms"]).iter().any(|term| {
        let exprs = arr(&term["matchExpressions"]);
        let fields = arr(&term["matchFields"]);
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        let name = |k: &str| (k == "metadata.name").then(|| node.name.clone());
        exprs.iter().all(|e| expr_matches(e, &labels)) && fields.iter().all(|e| expr_matches(e, &name))
    })
}

/// Try to bind a pending pod. `Ok(Some(node))`: bound (spec.nodeName and PodScheduled=True
/// written); `Ok(None)`: the pod is gone; `Err(message)`: unschedulable, in the scheduler's words.
pub(crate) fn try_schedule(inner: &Inner, ns: &str, name: &str) -> Result<Option<String>, String> {
    let mut st = inner.lock();
    let Some(pod) = st
        .objs
        .get("pods")
        .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
        .cloned()
    else {
        return Ok(None);
    };
    let nodes = lock(&inner.nodes).clone();
    let n = nodes.len();
    for v in arr(&pod["spec"]["volumes"]) {
        if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
            if !inner.pvcs.contains_key(claim) {
                return Err(format!(
                    "0/{n} nodes are available: persistentvolumeclaim \"{claim}\" not found. preemption: 0/{n} nodes are available: {n} Preemption is not helpful for scheduling."
                ));
            }
        }
    }
    let want = pod_gpus(&pod);
    let mut used: BTreeMap<String, u64> = BTreeMap::new();
    if let Some(pods) = st.objs.get("pods") {
        for p in pods.values() {
            let phase = p["status"]["phase"].as_str().unwrap_or("Pending");
            if let Some(node) = p["spec"]["nodeName"].as_str() {
                if phase != "Succeeded" && phase != "Failed" && p["metadata"]["uid"] != pod["metadata"]["uid"]
                {
                    *used.entry(node.to_string()).or_default() += pod_gpus(p);
                }
            }
        }
    }
    let tols = arr(&pod["spec"]["tolerations"]);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut preempt: BTreeMap<&str, usize> = BTreeMap::new();
    let mut chosen = None;
    for node in &nodes {
        let untolerated = node.taints.iter().find(|t| {
            (t.effect == "NoSchedule" || t.effect == "NoExecute")
                && !tolerates(tols, &t.key, &t.value, &t.effect)
        });
        let reason = if let Some(t) = untolerated {
            Some((
                format!("node(s) had untolerated taint {{{}: {}}}", t.key, t.value),
                "Preemption is not helpful for scheduling",
            ))
        } else if !affinity_matches(&pod, node) {
            Some((
                "node(s) didn't match Pod's node affinity/selector".to_string(),
                "Preemption is not helpful for scheduling",
            ))
        } else if want > 0
            && u64::from(node.gpus).saturating_sub(used.get(&node.name).copied().unwrap_or(0)) < want
        {
            Some((
                format!("Insufficient {GPU}"),
                "No preemption victims found for incoming pod",
            ))
        } else {
            None
        };
        match reason {
            Some((r, p)) => {
                *reasons.entry(r).or_default() += 1;
                *preempt.entry(p).or_default() += 1;
            }
            None => {
                chosen = Some(node.name.clone());
                break;
            }
        }
    }
    let Some(node) = chosen else {
        let mut rs: Vec<String> = reasons.iter().map(|(r, c)| format!("{c} {r}")).collect();
        rs.sort();
        let mut ps: Vec<String> = preempt.iter().map(|(r, c)| format!("{c} {r}")).collect();
        ps.sort();
        return Err(format!(
            "0/{n} nodes are available: {}. preemption: 0/{n} nodes are available: {}.",
            rs.join(", "),
            ps.join(", ")
        ));
    };
    let t = now();
    inner.update_locked(&mut st, "pods", ns, name, |p| {
        p["spec"]["nodeName"] = json!(node);
        let conds = p["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let mut conds: Vec<Value> = conds
            .into_iter()
            .filter(|c| c["type"] != "PodScheduled")
            .collect();
        conds.push(
            json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": t}),
        );
        p["status"]["conditions"] = json!(conds);
    });
    Ok(Some(node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerations() {
        let t = [json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})];
        assert!(tolerates(&t, "nvidia.com/gpu", "present", "NoSchedule"));
        assert!(!tolerates(&t, "other", "x", "NoSchedule"));
        let all = [json!({"operator": "Exists"})];
        assert!(tolerates(&all, "k", "v", "NoSchedule"));
        let eq = [json!({"key": "k", "value": "v"})];
        assert!(tolerates(&eq, "k", "v", "NoSchedule"));
        assert!(!tolerates(&eq, "k", "w", "NoSchedule"));
    }

    #[test]
    fn affinity() {
        let node = FakeNode::h100("g", 8);
        let pod = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100"]}]},
            {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "Exists"}, {"key": "x", "operator": "DoesNotExist"}]}
        ]}}}}});
        assert!(affinity_matches(&pod, &node));
        let pod = json!({"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100"}}});
        assert!(!affinity_matches(&pod, &node));
        assert!(!affinity_matches(&pod, &FakeNode::cpu("c")));
    }
}
