//! The backend sections of a suite (`kubernetes:`, `slurm:`) checked as far
//! as parsing alone can: names, quantities, paths made absolute.

use super::*;

/// The `kubernetes:` section's values that parsing alone does not check,
/// by the API server's own rules ([`crate::k8s`]), each at its line and column.
pub(super) fn check_kubernetes(
    section: Option<Spanned<KubernetesSection>>,
    path: &Path,
) -> Result<Option<KubernetesDef>, ManifestError> {
    let Some(section) = section else { return Ok(None) };
    let section_pos = Pos::from_loc(section.referenced);
    let def = section.value;
    let at = |l: serde_saphyr::Location| Pos::from_loc(l).or(section_pos);
    let invalid = |pos: Option<Pos>, msg: String, hint: &str| ManifestError::invalid(path, pos, msg, hint);
    for (key, value) in &def.node_selector {
        if let Some(why) = k8s::qualified_name_error(key) {
            return Err(invalid(
                at(value.referenced),
                format!("`kubernetes.node_selector`: `{key}` is not a label key: {why}"),
                "label keys are `[PREFIX/]NAME`, e.g. `cloud.google.com/gke-accelerator` or `pool`",
            ));
        }
        if let Some(why) = k8s::label_value_error(&value.value) {
            return Err(invalid(
                at(value.referenced),
                format!(
                    "`kubernetes.node_selector.{key}`: `{}` is not a label value: {why}",
                    value.value
                ),
                "write the node label's value as `kubectl get nodes --show-labels` shows it",
            ));
        }
    }
    for t in &def.tolerations {
        let pos = at(t.referenced);
        let t = &t.value;
        let example = "write e.g. `{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}`";
        if let Some(op) = t
            .operator
            .as_deref()
            .filter(|o| !matches!(*o, "Exists" | "Equal"))
        {
            return Err(invalid(
                pos,
                format!("`kubernetes.tolerations`: operator `{op}` is neither `Exists` nor `Equal`"),
                example,
            ));
        }
        let exists = t.operator.as_deref() == Some("Exists");
        if let Some(e) = t
            .effect
            .as_deref()
            .filter(|e| !matches!(*e, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute"))
        {
            return Err(invalid(
                pos,
                format!("`kubernetes.tolerations`: effect `{e}` is not a taint effect"),
                "the effects are `NoSchedule`, `PreferNoSchedule` and `NoExecute`",
            ));
        }
        match t.key.as_deref().unwrap_or_default() {
            "" if !exists => {
                return Err(invalid(
                    pos,
                    "`kubernetes.tolerations`: a toleration without `key` must have `operator: Exists`"
                        .into(),
                    "give the taint's `key`, or `operator: Exists` to tolerate every taint",
                ))
            }
            "" => {}
            key => {
                if let Some(why) = k8s::qualified_name_error(key) {
                    return Err(invalid(
                        pos,
                        format!("`kubernetes.tolerations`: key `{key}` is not a taint key: {why}"),
                        example,
                    ));
                }
            }
        }
        let value = t.value.as_deref().unwrap_or_default();
        if exists && !value.is_empty() {
            return Err(invalid(
                pos,
                format!("`kubernetes.tolerations`: `operator: Exists` takes no value (`{value}`)"),
                "leave `value` out, or use `operator: Equal`",
            ));
        }
        if let Some(why) = k8s::label_value_error(value) {
            return Err(invalid(
                pos,
                format!("`kubernetes.tolerations`: value `{value}` is not a taint value: {why}"),
                example,
            ));
        }
    }
    if let Some(ns) = def.namespace.as_ref().filter(|n| !k8s::is_dns_label(&n.value)) {
        return Err(invalid(
            at(ns.referenced),
            format!("`kubernetes.namespace`: `{}` is not a namespace name", ns.value),
            "namespaces are lowercase letters, digits and `-` (at most 63)",
        ));
    }
    let names = [
        ("service_account", def.service_account.as_ref()),
        ("runtime_class", def.runtime_class.as_ref()),
        ("weights_pvc", def.weights_pvc.as_ref()),
        ("secret", def.secret.as_ref()),
    ]
    .into_iter()
    .filter_map(|(f, v)| Some((f, v?)))
    .chain(def.image_pull_secrets.iter().map(|v| ("image_pull_secrets", v)));
    for (field, name) in names {
        if !k8s::is_dns_subdomain(&name.value) {
            return Err(invalid(
                at(name.referenced),
                format!("`kubernetes.{field}`: `{}` is not an object name", name.value),
                "object names are lowercase letters, digits, `-` and `.` (at most 253), as `kubectl get` lists them",
            ));
        }
    }
    if let Some(label) = &def.gpu_label {
        if let Some(why) = k8s::qualified_name_error(&label.value) {
            return Err(invalid(
                at(label.referenced),
                format!(
                    "`kubernetes.gpu_label`: `{}` is not a label key: {why}",
                    label.value
                ),
                "write a node label key, e.g. `nvidia.com/gpu.product`",
            ));
        }
    }
    for (gpu, values) in &def.gpu_types {
        if values.value.is_empty() {
            return Err(invalid(
                at(values.referenced),
                format!("`kubernetes.gpu_types.{gpu}` lists no label value"),
                "list the node label's values, e.g. `gpu_types: {H100: [NVIDIA-H100-80GB-HBM3]}`, or leave the type out",
            ));
        }
        for v in &values.value {
            let why = if v.value.is_empty() {
                Some("it is empty")
            } else {
                k8s::label_value_error(&v.value)
            };
            if let Some(why) = why {
                return Err(invalid(
                    at(v.referenced),
                    format!(
                        "`kubernetes.gpu_types.{gpu}`: `{}` is not a label value: {why}",
                        v.value
                    ),
                    "write the node label's value as `kubectl get nodes --show-labels` shows it",
                ));
            }
        }
    }
    if let Some(cpu) = &def.cpu {
        if !k8s::is_quantity(&cpu.value) || cpu.value.starts_with('-') {
            return Err(invalid(
                at(cpu.referenced),
                format!("`kubernetes.cpu`: `{}` is not a CPU quantity", cpu.value),
                "write cores as `8`, `1.5` or `500m` (millicores)",
            ));
        }
    }
    Ok(Some(def.into_def()))
}

/// The `slurm:` section's values that parsing alone does not check.
pub(super) fn check_slurm(def: Option<SlurmDef>, path: &Path) -> Result<Option<SlurmDef>, ManifestError> {
    let Some(def) = def else { return Ok(None) };
    let invalid = |msg: String, hint: &str| ManifestError::invalid(path, None, msg, hint);
    if let Some(a) = def.extra_args.iter().find(|a| !a.starts_with('-')) {
        return Err(invalid(
            format!("`slurm.extra_args`: `{a}` is not an option"),
            "write each `sbatch` option whole, e.g. `extra_args: [\"--exclusive\", \"--reservation=lab\"]`",
        ));
    }
    if let Some(g) = def
        .gpu_request
        .as_deref()
        .filter(|g| !matches!(*g, "gres" | "gpus"))
    {
        return Err(invalid(
            format!("`slurm.gpu_request`: `{g}` is neither `gres` nor `gpus`"),
            "`gres` asks `--gres=gpu:TYPE:N`, `gpus` asks `--gpus-per-node=TYPE:N`",
        ));
    }
    if def.cpus == Some(0) {
        return Err(invalid(
            "`slurm.cpus` must be at least 1".into(),
            "leave it out for the partition's default",
        ));
    }
    Ok(Some(def))
}
