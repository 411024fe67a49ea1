//! `{{name}}` templates: the variables of a cell, their substitution in a
//! workload's commands and load settings, and the transformer's overrides.

use super::*;

pub(super) fn template_vars(
    params: &BTreeMap<String, Value>,
    gpu: &GpuSpec,
    id: &str,
    bench: &str,
) -> BTreeMap<String, String> {
    let mut vars: BTreeMap<String, String> =
        params.iter().map(|(k, v)| (k.clone(), scalar_text(v))).collect();
    vars.insert("gpu".into(), gpu.to_string());
    vars.insert("gpu_count".into(), gpu.count.to_string());
    // Where the cell's files are: the agent expands it in arguments, a
    // shell in a script (`orch-files` sets it on every backend).
    vars.insert("files".into(), "${ORCH_FILES}".into());
    vars.insert("cell".into(), id.to_string());
    vars.insert("benchmark".into(), bench.to_string());
    vars
}

/// Replace `{{name}}` by the value of `name`; an unknown name is an error.
pub(super) fn substitute(text: &str, vars: &BTreeMap<String, String>) -> Result<String, Msg> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let name = after[..end].trim();
        match vars.get(name) {
            Some(v) => out.push_str(v),
            None => {
                return Err((
                    format!(
                        "unknown placeholder `{{{{{name}}}}}`; known: {}",
                        vars.keys()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "placeholders name a matrix parameter or one of `gpu`, `gpu_count`, `cell`, `benchmark`, `files` (a campaign's cells also `task`, and `model` and `base` where the row sets them)",
                ))
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

pub(super) fn instantiate(
    w: &Workload,
    params: &BTreeMap<String, Value>,
    vars: &BTreeMap<String, String>,
) -> Result<Workload, Msg> {
    Ok(match w {
        Workload::Command(c) => Workload::Command(substitute_command(c, vars)?),
        Workload::Builtin(BuiltinWorkload::Transformer(cfg)) => {
            Workload::Builtin(BuiltinWorkload::Transformer(override_transformer(cfg, params)?))
        }
        Workload::Server(s) => Workload::Server(substitute_server(s, vars)?),
        Workload::Compare(c) => Workload::Compare(CompareWorkload {
            server: substitute_server(&c.server, vars)?,
            ..c.clone()
        }),
        other => other.clone(),
    })
}

pub(super) fn substitute_command(
    c: &CommandWorkload,
    vars: &BTreeMap<String, String>,
) -> Result<CommandWorkload, Msg> {
    Ok(CommandWorkload {
        argv: c
            .argv
            .iter()
            .map(|a| substitute(a, vars))
            .collect::<Result<_, _>>()?,
        workdir: c.workdir.as_deref().map(|d| substitute(d, vars)).transpose()?,
    })
}

pub(super) fn substitute_server(
    s: &ServerWorkload,
    vars: &BTreeMap<String, String>,
) -> Result<ServerWorkload, Msg> {
    let cmd = substitute_command(
        &CommandWorkload {
            argv: s.argv.clone(),
            workdir: s.workdir.clone(),
        },
        vars,
    )?;
    let client = match &s.client {
        Some(Client::Command(c)) => Some(Client::Command(substitute_command(c, vars)?)),
        Some(Client::Loadgen(l)) => {
            let mut l = l.clone();
            l.model = l.model.as_deref().map(|m| substitute(m, vars)).transpose()?;
            l.endpoint = substitute(&l.endpoint, vars)?;
            l.prompt_file = l
                .prompt_file
                .as_deref()
                .map(|p| substitute(p, vars))
                .transpose()?;
            l.tokenizer = l.tokenizer.as_deref().map(|p| substitute(p, vars)).transpose()?;
            Some(Client::Loadgen(l))
        }
        None => None,
    };
    Ok(ServerWorkload {
        argv: cmd.argv,
        workdir: cmd.workdir,
        ready: s.ready.clone(),
        startup_timeout_s: s.startup_timeout_s,
        client,
    })
}

/// Matrix parameters named like a transformer field set that field.
pub(super) fn override_transformer(
    cfg: &TransformerConfig,
    params: &BTreeMap<String, Value>,
) -> Result<TransformerConfig, Msg> {
    let mut map = match serde_json::to_value(cfg) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let mut touched = false;
    for (k, v) in params {
        if TRANSFORMER_FIELDS.contains(&k.as_str()) {
            let v = match (k.as_str(), v) {
                // `preset: 2.7B` is a string, but `preset: 1` would be a number.
                ("preset" | "dtype" | "device", Value::Number(n)) => Value::String(n.to_string()),
                _ => v.clone(),
            };
            map.insert(k.clone(), v);
            touched = true;
        }
    }
    if !touched {
        return Ok(cfg.clone());
    }
    serde_json::from_value(Value::Object(map)).map_err(|e| {
        (
            format!("a matrix parameter does not fit the transformer: {e}"),
            "parameters named like transformer fields (`preset`, `batch`, `context`, ...) must have that field's type",
        )
    })
}
