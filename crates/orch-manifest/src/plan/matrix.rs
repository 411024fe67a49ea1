//! The matrix: the cell count refused before expansion, the parameter
//! combinations, `exclude`, and stable cell ids.

use super::*;

pub(super) type LocMsg = (Option<Pos>, String, &'static str);

/// The number of cells the suite expands to, counted from the lengths of
/// its GPU lists and matrix axes (before `exclude`), without expanding
/// anything; refused over the suite's `max_cells`.
pub(super) fn check_cell_count(
    suite: &Suite,
    opts: &ExpandOptions,
    tasks: &BTreeMap<String, Vec<crate::tasks::Task>>,
) -> Result<(), LocMsg> {
    let cap = suite.max_cells.unwrap_or(DEFAULT_MAX_CELLS);
    let mut total: Option<u64> = Some(0);
    let mut biggest: Option<(u64, &Benchmark)> = None;
    for bench in &suite.benchmarks {
        let gpus = opts
            .gpus
            .as_ref()
            .or(bench.gpus.as_ref())
            .or(suite.gpus.as_ref())
            .map_or(1, Vec::len) as u64;
        // A task with its own GPU is one cell per combination.
        let gpus = match tasks.get(&bench.name.value) {
            None => gpus,
            Some(ts) => ts
                .iter()
                .map(|t| {
                    if t.gpu.is_some() && opts.gpus.is_none() {
                        1
                    } else {
                        gpus
                    }
                })
                .sum(),
        };
        let axes = bench.matrix.as_ref().map(|m| &m.value);
        // `None`: more than `u64::MAX`.
        let count = axes
            .into_iter()
            .flat_map(|m| m.values())
            .try_fold(gpus, |n, values| n.checked_mul(values.len() as u64));
        total = total.zip(count).and_then(|(t, c)| t.checked_add(c));
        let c = count.unwrap_or(u64::MAX);
        if biggest.is_none_or(|(b, _)| c > b) {
            biggest = Some((c, bench));
        }
    }
    if total.is_some_and(|t| t <= cap) {
        return Ok(());
    }
    let shown = total.map_or_else(|| "more than 18446744073709551615".to_string(), |t| t.to_string());
    let (pos, detail) = match biggest {
        Some((_, b)) => {
            let mut axes: Vec<String> = b
                .matrix
                .iter()
                .flat_map(|m| m.value.iter())
                .map(|(k, v)| format!("{k}: {}", v.len()))
                .collect();
            if axes.len() > 12 {
                let more = axes.len() - 12;
                axes.truncate(12);
                axes.push(format!("{more} more axes"));
            }
            (
                b.matrix
                    .as_ref()
                    .and_then(|m| Pos::from_loc(m.referenced))
                    .or_else(|| Pos::from_loc(b.name.referenced)),
                format!(
                    " (the largest, benchmark `{}`: {})",
                    b.name.value,
                    axes.join(", ")
                ),
            )
        }
        None => (None, String::new()),
    };
    Err((
        pos,
        format!("the suite expands to {shown} cells{detail}, more than the limit of {cap}"),
        "make the matrix smaller, or raise the limit with `max_cells: N` at the top of the suite",
    ))
}

pub(super) fn matrix_combos(bench: &Benchmark) -> Result<Vec<BTreeMap<String, Value>>, LocMsg> {
    let Some(matrix) = &bench.matrix else {
        return Ok(vec![BTreeMap::new()]);
    };
    let pos = Pos::from_loc(matrix.referenced);
    let mut combos = vec![BTreeMap::new()];
    for (key, values) in &matrix.value {
        if key == "gpu" || key == "gpus" {
            return Err((
                pos,
                "`matrix` may not have a `gpu` key".into(),
                "list GPUs under `gpus:` (suite or benchmark); they form the matrix's GPU axis",
            ));
        }
        if BUILTIN_VARS.contains(&key.as_str()) {
            return Err((
                pos,
                format!("`matrix` key `{key}` is reserved"),
                "rename the parameter",
            ));
        }
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err((
                pos,
                format!("`matrix` key `{key}` is not a valid name"),
                "parameter names use letters, digits and `_`",
            ));
        }
        if values.is_empty() {
            return Err((
                pos,
                format!("`matrix.{key}` has no values"),
                "give at least one value, or remove the key",
            ));
        }
        if let Some(v) = values
            .iter()
            .find(|v| v.is_array() || v.is_object() || v.is_null())
        {
            return Err((
                pos,
                format!("`matrix.{key}` has a value that is not a scalar: {v}"),
                "matrix values are strings, numbers or booleans",
            ));
        }
        let mut next = Vec::with_capacity(combos.len() * values.len());
        for c in &combos {
            for v in values {
                let mut c = c.clone();
                c.insert(key.clone(), v.clone());
                next.push(c);
            }
        }
        combos = next;
    }
    for ex in &bench.exclude {
        for k in ex.keys() {
            if k != "gpu" && !matrix.value.contains_key(k) {
                return Err((
                    pos,
                    format!("`exclude` names `{k}`, which is not a matrix parameter"),
                    "exclude entries use matrix keys (and `gpu`)",
                ));
            }
        }
    }
    Ok(combos)
}

pub(super) fn excluded(
    exclude: &[BTreeMap<String, Value>],
    gpu: &GpuSpec,
    params: &BTreeMap<String, Value>,
) -> bool {
    exclude.iter().any(|ex| {
        ex.iter().all(|(k, v)| {
            if k == "gpu" {
                let text = scalar_text(v);
                GpuSpec::parse(&text).map(|g| g == *gpu).unwrap_or(false)
            } else {
                params
                    .get(k)
                    .map(|p| scalar_text(p) == scalar_text(v))
                    .unwrap_or(false)
            }
        })
    })
}

pub(super) fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `<benchmark>.<gpu>[.<param>-<value>...]`, lowercase, filesystem-safe.
pub fn cell_id(bench: &str, gpu: &GpuSpec, params: &BTreeMap<String, Value>) -> String {
    let mut id = format!("{}.{}", bench, gpu.slug());
    for (k, v) in params {
        id.push('.');
        id.push_str(k);
        id.push('-');
        id.push_str(&scalar_text(v));
    }
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}
