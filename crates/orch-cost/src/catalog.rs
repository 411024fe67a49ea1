//! Prices: the catalog built in, the user's prices file over it, and the
//! price per second of one cell.
//!
//! The catalog (`prices/catalog.yaml`) and a user's file have one form:
//!
//! ```yaml
//! backends:
//!   local:
//!     gpu: {none: 0.0001, H100: 0.0012}   # USD per GPU-second; `none`: per second of a CPU-only cell
//!     cell_s: 0.00001                     # USD per second of any cell
//!     cpu_core_s: 0.0000131               # USD per core-second
//!     memory_gib_s: 0.00000222            # USD per GiB-second
//!     cpu_cores: 4                        # cores a cell is billed for
//!     memory_gib: 16                      # GiB a cell is billed for (without a memory limit)
//! ```
//!
//! A user's entry replaces the catalog's entry of the same backend and name;
//! everything else stays. Parsing is strict: an unknown field, backend or GPU
//! type, or a negative price, is an error naming `file:line:column`.

use orch_manifest::error::yaml_message;
use orch_manifest::{GpuSpec, KNOWN_GPUS};
use serde::{Deserialize, Serialize};
use serde_saphyr::{Location, Spanned};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The catalog built into orch.
pub const CATALOG_YAML: &str = include_str!("../prices/catalog.yaml");
/// Names a prices file to use instead of `~/.config/orch/prices.yaml`.
pub const PRICES_ENV: &str = "ORCH_PRICES";
/// The backends a prices file may name.
pub const BACKENDS: &[&str] = &["local", "docker", "kubernetes", "modal", "slurm"];
/// The GPU key that prices a CPU-only cell (per cell-second).
pub const CPU_ONLY: &str = "none";

#[derive(Debug, thiserror::Error)]
pub enum CostError {
    #[error("cannot read prices file `{}`: {source}\nhint: {hint}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
        hint: &'static str,
    },
    #[error("{origin}{}: {message}\nhint: {hint}", pos.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
    Invalid {
        origin: String,
        pos: Option<(u64, u64)>,
        message: String,
        hint: String,
    },
}

impl CostError {
    /// Every cost error is the user's to fix (a prices file).
    pub fn is_user_error(&self) -> bool {
        true
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    #[serde(default)]
    backends: BTreeMap<String, Spanned<BackendFile>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackendFile {
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    date: Option<String>,
    #[serde(default)]
    note: Option<String>,
    #[serde(default)]
    default_free: Option<bool>,
    #[serde(default)]
    gpu: BTreeMap<String, Spanned<f64>>,
    #[serde(default)]
    cpu_core_s: Option<Spanned<f64>>,
    #[serde(default)]
    memory_gib_s: Option<Spanned<f64>>,
    #[serde(default)]
    cell_s: Option<Spanned<f64>>,
    #[serde(default)]
    cpu_cores: Option<Spanned<f64>>,
    #[serde(default)]
    memory_gib: Option<Spanned<f64>>,
    #[serde(default)]
    region_multiplier: Option<Spanned<f64>>,
    /// Per partition (slurm): entries over the backend's own.
    #[serde(default)]
    partitions: BTreeMap<String, Spanned<BackendFile>>,
}

/// One price (or billed quantity) and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub value: f64,
    /// `catalog: modal, 2025-08, https://modal.com/pricing`, `user: FILE`.
    pub source: String,
}

/// Prices of one backend.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BackendPrices {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What is not listed costs nothing (this machine) rather than being unpriced.
    pub default_free: bool,
    /// USD per GPU-second by GPU type; `none`: USD per second of a CPU-only cell.
    pub gpu: BTreeMap<String, Entry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_core_s: Option<Entry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_gib_s: Option<Entry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cell_s: Option<Entry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<Entry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<Entry>,
    /// Every price of the backend times this (Modal: pinning a region costs
    /// a multiple of the base price; the multiple is the user's to set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region_multiplier: Option<Entry>,
    /// Per partition (slurm): prices over the backend's own for cells of
    /// that partition.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub partitions: BTreeMap<String, BackendPrices>,
}

impl BackendPrices {
    /// These prices with a partition's entries over them.
    fn with_partition(&self, part: &BackendPrices) -> BackendPrices {
        let mut out = self.clone();
        out.gpu.extend(part.gpu.clone());
        for (slot, given) in [
            (&mut out.cpu_core_s, &part.cpu_core_s),
            (&mut out.memory_gib_s, &part.memory_gib_s),
            (&mut out.cell_s, &part.cell_s),
            (&mut out.cpu_cores, &part.cpu_cores),
            (&mut out.memory_gib, &part.memory_gib),
            (&mut out.region_multiplier, &part.region_multiplier),
        ] {
            if given.is_some() {
                slot.clone_from(given);
            }
        }
        out
    }
}

/// The prices in use: the catalog with the user's file over it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Prices {
    pub backends: BTreeMap<String, BackendPrices>,
    /// The user's prices file applied, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_file: Option<PathBuf>,
}

/// What one cell costs per second on a backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub backend: String,
    /// Normalised GPU type, `None` for a CPU-only cell.
    pub gpu_type: Option<String>,
    pub gpus: u32,
    pub usd_per_gpu_s: f64,
    /// Everything billed per second: GPUs, CPU, memory, the per-cell rate.
    pub usd_per_s: f64,
    /// False when the GPU type has no price on this backend.
    pub priced: bool,
    /// Where the prices came from.
    pub source: String,
}

impl Rate {
    /// A flat rate (tests, synthetic stores).
    pub fn flat(backend: &str, usd_per_s: f64) -> Rate {
        Rate {
            backend: backend.into(),
            gpu_type: None,
            gpus: 0,
            usd_per_gpu_s: 0.0,
            usd_per_s,
            priced: true,
            source: "flat".into(),
        }
    }
}

/// One line of `orch prices`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PriceRow {
    pub backend: String,
    /// `gpu H100`, `gpu none`, `cpu_core_s`, `memory_gib_s`, `cell_s`,
    /// `cpu_cores`, `memory_gib`.
    pub item: String,
    pub value: f64,
    /// `usd_per_gpu_s`, `usd_per_cell_s`, `usd_per_core_s`, `usd_per_gib_s`, `cores`, `gib`.
    pub unit: String,
    pub source: String,
}

fn loc(l: Location) -> Option<(u64, u64)> {
    (l.line() > 0).then(|| (l.line(), l.column()))
}

/// `$XDG_CONFIG_HOME/orch/prices.yaml`, else `~/.config/orch/prices.yaml`.
pub fn default_user_path() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".config"),
    };
    Some(base.join("orch").join("prices.yaml"))
}

impl Prices {
    /// The catalog built into orch.
    pub fn builtin() -> Result<Prices, CostError> {
        let mut p = Prices::default();
        p.apply_str(CATALOG_YAML, "catalog", None)?;
        Ok(p)
    }

    /// The catalog, with the user's prices file over it: `explicit` (the
    /// `--prices` flag), else `$ORCH_PRICES`, else `~/.config/orch/prices.yaml`
    /// when it exists. A file named by the flag or the variable must exist.
    pub fn load(explicit: Option<&Path>) -> Result<Prices, CostError> {
        let mut prices = Prices::builtin()?;
        let named = explicit.map(Path::to_path_buf).or_else(|| {
            std::env::var_os(PRICES_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        let path = match named {
            Some(p) => Some(p),
            None => default_user_path().filter(|p| p.is_file()),
        };
        if let Some(path) = path {
            let text = std::fs::read_to_string(&path).map_err(|source| CostError::Read {
                path: path.clone(),
                source,
                hint: "check the path given to `--prices` or `$ORCH_PRICES`",
            })?;
            prices.apply_str(&text, &path.display().to_string(), Some(&path))?;
        }
        Ok(prices)
    }

    /// Apply a prices file's text over these prices. `origin` names it in
    /// errors; `user` is its path when it is the user's file.
    pub fn apply_str(&mut self, text: &str, origin: &str, user: Option<&Path>) -> Result<(), CostError> {
        let file: PriceFile = serde_saphyr::from_str(text).map_err(|e| {
            let message = yaml_message(&e);
            CostError::Invalid {
                origin: origin.to_string(),
                pos: e.location().and_then(loc),
                hint: yaml_hint(&message),
                message,
            }
        })?;
        let invalid = |pos: Location, message: String, hint: String| CostError::Invalid {
            origin: origin.to_string(),
            pos: loc(pos),
            message,
            hint,
        };
        for (name, b) in file.backends {
            if !BACKENDS.contains(&name.as_str()) {
                return Err(invalid(
                    b.referenced,
                    format!("unknown backend `{name}`"),
                    format!("the backends are {}", BACKENDS.join(", ")),
                ));
            }
            let b = b.value;
            let source_of = |date: &Option<String>, src: &Option<String>| match user {
                Some(p) => format!("user: {}", p.display()),
                None => {
                    let mut s = format!("catalog: {name}");
                    if let Some(d) = date {
                        s.push_str(&format!(", {d}"));
                    }
                    if let Some(u) = src {
                        s.push_str(&format!(", {u}"));
                    }
                    s
                }
            };
            let entry_source = source_of(&b.date, &b.source);
            let check = |v: &Spanned<f64>, what: &str| -> Result<Entry, CostError> {
                if !v.value.is_finite() || v.value < 0.0 {
                    return Err(invalid(
                        v.referenced,
                        format!("`{what}` of backend `{name}` is {}: a price or quantity must be a number of at least 0", v.value),
                        "write prices in US dollars per second, e.g. `0.001097`".into(),
                    ));
                }
                Ok(Entry {
                    value: v.value,
                    source: entry_source.clone(),
                })
            };
            let target = self
                .backends
                .entry(name.clone())
                .or_insert_with(|| BackendPrices {
                    name: name.clone(),
                    ..Default::default()
                });
            fill(target, &b, &name, &check, &invalid)?;
            for (part, pb) in &b.partitions {
                if !pb.value.partitions.is_empty() {
                    return Err(invalid(
                        pb.referenced,
                        format!("partition `{part}` of `{name}` has `partitions` of its own"),
                        "partitions are one level under a backend".into(),
                    ));
                }
                let slot = target
                    .partitions
                    .entry(part.clone())
                    .or_insert_with(|| BackendPrices {
                        name: format!("{name}/{part}"),
                        ..Default::default()
                    });
                let check = |v: &Spanned<f64>, what: &str| check(v, &format!("partitions.{part}.{what}"));
                fill(slot, &pb.value, &name, &check, &invalid)?;
            }
        }
        if let Some(p) = user {
            self.user_file = Some(p.to_path_buf());
        }
        Ok(())
    }

    /// What one cell of `gpu` costs per second on `backend`.
    /// `memory_limit_bytes` (the manifest's memory limit) replaces the
    /// backend's billed `memory_gib` when given.
    pub fn rate(&self, backend: &str, gpu: &GpuSpec, memory_limit_bytes: Option<u64>) -> Rate {
        self.rate_in(backend, None, gpu, memory_limit_bytes)
    }

    /// [`Prices::rate`] of a cell in a partition (slurm): the partition's
    /// entries, when the prices have any, over the backend's.
    pub fn rate_in(
        &self,
        backend: &str,
        partition: Option<&str>,
        gpu: &GpuSpec,
        memory_limit_bytes: Option<u64>,
    ) -> Rate {
        let empty = BackendPrices {
            name: backend.to_string(),
            ..Default::default()
        };
        let base = self.backends.get(backend).unwrap_or(&empty);
        let merged;
        let b = match partition.and_then(|p| base.partitions.get(p)) {
            Some(part) => {
                merged = base.with_partition(part);
                &merged
            }
            None => base,
        };
        let key = gpu
            .gpu
            .map(|g| g.name.to_string())
            .unwrap_or_else(|| CPU_ONLY.to_string());
        let mut sources: Vec<String> = Vec::new();
        let mut used = |e: &Entry| {
            if !sources.contains(&e.source) {
                sources.push(e.source.clone());
            }
            e.value
        };
        let gpu_entry = b.gpu.get(&key);
        let gpu_price = gpu_entry.map(&mut used).unwrap_or(0.0);
        let (gpus, usd_per_gpu_s, cpu_only_s) = if gpu.is_cpu() {
            (0, 0.0, gpu_price)
        } else {
            (gpu.count, gpu_price, 0.0)
        };
        let mut usd_per_s = f64::from(gpus) * usd_per_gpu_s + cpu_only_s;
        let mut resources_billed = false;
        if let (Some(rate), Some(cores)) = (&b.cpu_core_s, &b.cpu_cores) {
            usd_per_s += used(rate) * used(cores);
            resources_billed = true;
        }
        if let Some(rate) = &b.memory_gib_s {
            let gib = match memory_limit_bytes {
                Some(bytes) => Some(bytes as f64 / (1u64 << 30) as f64),
                None => b.memory_gib.as_ref().map(&mut used),
            };
            if let Some(gib) = gib {
                usd_per_s += used(rate) * gib;
                resources_billed = true;
            }
        }
        if let Some(c) = &b.cell_s {
            usd_per_s += used(c);
        }
        let mut usd_per_gpu_s = usd_per_gpu_s;
        if let Some(m) = &b.region_multiplier {
            let m = used(m);
            usd_per_s *= m;
            usd_per_gpu_s *= m;
        }
        // A GPU cell needs its GPU's price; a CPU-only cell is priced by
        // `none`, or by the CPU and memory the backend bills.
        let priced = gpu_entry.is_some() || b.default_free || (gpu.is_cpu() && resources_billed);
        if !priced {
            sources.insert(0, format!("unpriced: no price for `{key}` on `{backend}`"));
        } else if sources.is_empty() {
            sources.push(format!("default: {backend} is free"));
        }
        Rate {
            backend: backend.to_string(),
            gpu_type: gpu.gpu.map(|g| g.name.to_string()),
            gpus,
            usd_per_gpu_s,
            usd_per_s,
            priced,
            source: sources.join("; "),
        }
    }

    /// Every price in use (of one backend, or all), for `orch prices`.
    pub fn rows(&self, backend: Option<&str>) -> Vec<PriceRow> {
        let mut out = Vec::new();
        // A backend's own rows, then its partitions' (`partition P gpu H100`).
        let entries = self
            .backends
            .values()
            .filter(|b| backend.is_none_or(|n| n == b.name))
            .flat_map(|b| {
                std::iter::once((b.name.clone(), String::new(), b)).chain(
                    b.partitions
                        .iter()
                        .map(|(p, pb)| (b.name.clone(), format!("partition {p} "), pb)),
                )
            });
        for (name, prefix, b) in entries {
            let mut push = |item: String, e: &Entry, unit: &str| {
                out.push(PriceRow {
                    backend: name.clone(),
                    item: format!("{prefix}{item}"),
                    value: e.value,
                    unit: unit.into(),
                    source: e.source.clone(),
                })
            };
            // Most expensive GPU first, `none` last.
            let mut gpus: Vec<(&String, &Entry)> = b.gpu.iter().collect();
            gpus.sort_by(|x, y| {
                (x.0 == CPU_ONLY)
                    .cmp(&(y.0 == CPU_ONLY))
                    .then(y.1.value.total_cmp(&x.1.value))
            });
            for (ty, e) in gpus {
                if ty == CPU_ONLY {
                    push(format!("gpu {ty}"), e, "usd_per_cell_s");
                } else {
                    push(format!("gpu {ty}"), e, "usd_per_gpu_s");
                }
            }
            let rest = [
                (&b.cpu_core_s, "cpu_core_s", "usd_per_core_s"),
                (&b.memory_gib_s, "memory_gib_s", "usd_per_gib_s"),
                (&b.cell_s, "cell_s", "usd_per_cell_s"),
                (&b.cpu_cores, "cpu_cores", "cores"),
                (&b.memory_gib, "memory_gib", "gib"),
            ];
            for (e, item, unit) in rest {
                if let Some(e) = e {
                    push(item.into(), e, unit);
                }
            }
        }
        out
    }
}

/// Checks one price of a prices file and makes its entry.
type CheckPrice<'a> = dyn Fn(&Spanned<f64>, &str) -> Result<Entry, CostError> + 'a;

/// One backend's (or partition's) entries of a prices file into `target`.
fn fill(
    target: &mut BackendPrices,
    b: &BackendFile,
    name: &str,
    check: &CheckPrice,
    invalid: &dyn Fn(Location, String, String) -> CostError,
) -> Result<(), CostError> {
    if let Some(n) = &b.note {
        target.note = Some(n.clone());
    }
    if let Some(f) = b.default_free {
        target.default_free = f;
    }
    for (ty, v) in &b.gpu {
        let key = normalise_gpu_key(ty).ok_or_else(|| {
            invalid(
                v.referenced,
                format!("unknown GPU type `{ty}` in the prices of `{name}`"),
                format!(
                    "the GPU types are {}, and `{CPU_ONLY}` for a CPU-only cell",
                    KNOWN_GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
        target.gpu.insert(key, check(v, &format!("gpu.{ty}"))?);
    }
    let fields = [
        (&b.cpu_core_s, "cpu_core_s", &mut target.cpu_core_s),
        (&b.memory_gib_s, "memory_gib_s", &mut target.memory_gib_s),
        (&b.cell_s, "cell_s", &mut target.cell_s),
        (&b.cpu_cores, "cpu_cores", &mut target.cpu_cores),
        (&b.memory_gib, "memory_gib", &mut target.memory_gib),
        (
            &b.region_multiplier,
            "region_multiplier",
            &mut target.region_multiplier,
        ),
    ];
    for (given, what, slot) in fields {
        if let Some(v) = given {
            *slot = Some(check(v, what)?);
        }
    }
    Ok(())
}

/// `H100`, `h100`, `A100` (alias) → the normalised type; `none`/`cpu` → `none`.
fn normalise_gpu_key(ty: &str) -> Option<String> {
    if ty.contains(':') {
        return None;
    }
    match GpuSpec::parse(ty) {
        Ok(spec) => Some(
            spec.gpu
                .map(|g| g.name.to_string())
                .unwrap_or_else(|| CPU_ONLY.into()),
        ),
        Err(_) => None,
    }
}

fn yaml_hint(message: &str) -> String {
    if message.starts_with("unknown field") {
        return "the fields are `backends:` then per backend `gpu`, `cpu_core_s`, `memory_gib_s`, `cell_s`, `cpu_cores`, `memory_gib`, `default_free`, `note`, `source`, `date` (and `partitions` for slurm); see docs/cost.md".into();
    }
    "see docs/cost.md for the form of a prices file".into()
}

impl orch_protocol::ErrorClass for CostError {
    fn is_user_error(&self) -> bool {
        Self::is_user_error(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> GpuSpec {
        GpuSpec::parse(s).unwrap()
    }

    #[test]
    fn catalog_parses_with_modal_prices_and_date() {
        let p = Prices::builtin().unwrap();
        let modal = &p.backends["modal"];
        let expect = [
            ("H100", 0.001097),
            ("H200", 0.001261),
            ("A100-80GB", 0.000694),
            ("A100-40GB", 0.000583),
            ("L40S", 0.000542),
            ("A10G", 0.000306),
            ("L4", 0.000222),
            ("T4", 0.000164),
            ("B200", 0.001736),
        ];
        for (ty, usd) in expect {
            assert_eq!(modal.gpu[ty].value, usd, "{ty}");
            assert!(modal.gpu[ty].source.contains("2025-08"));
            assert!(modal.gpu[ty].source.contains("https://modal.com/pricing"));
        }
        assert_eq!(modal.cpu_core_s.as_ref().unwrap().value, 0.0000131);
        assert_eq!(modal.memory_gib_s.as_ref().unwrap().value, 0.00000222);
        // This machine is free; a cluster without prices is unpriced.
        let local = p.rate("local", &spec("H100:2"), None);
        assert!(local.priced && local.usd_per_s == 0.0, "{local:?}");
        assert!(local.source.starts_with("default:"));
        let k8s = p.rate("kubernetes", &spec("H100"), None);
        assert!(!k8s.priced && k8s.source.starts_with("unpriced:"), "{k8s:?}");
    }

    #[test]
    fn user_file_overrides_entries_and_prices_cpu_cells() {
        let mut p = Prices::builtin().unwrap();
        let path = Path::new("/home/u/.config/orch/prices.yaml");
        p.apply_str(
            "backends:\n  local:\n    gpu: {none: 0.01, h100: 0.002}\n    cell_s: 0.001\n  modal:\n    gpu:\n      H100: 0.0015\n",
            "prices.yaml",
            Some(path),
        )
        .unwrap();
        let cpu = p.rate("local", &GpuSpec::CPU, None);
        assert!((cpu.usd_per_s - 0.011).abs() < 1e-12, "{cpu:?}");
        assert_eq!(cpu.source, "user: /home/u/.config/orch/prices.yaml");
        let h = p.rate("local", &spec("H100:4"), None);
        assert!((h.usd_per_s - (4.0 * 0.002 + 0.001)).abs() < 1e-12);
        let m = p.rate("modal", &spec("H100"), None);
        assert_eq!(m.usd_per_gpu_s, 0.0015);
        // The overridden entry is the user's; the others stay the catalog's.
        assert!(
            m.source.starts_with("user:") && m.source.contains("catalog: modal"),
            "{}",
            m.source
        );
        assert_eq!(p.rate("modal", &spec("L4"), None).usd_per_gpu_s, 0.000222);
        let rows = p.rows(Some("local"));
        assert!(rows.iter().any(|r| r.item == "gpu none" && r.value == 0.01));
        assert!(rows.iter().all(|r| r.backend == "local"));
    }

    #[test]
    fn memory_limit_replaces_billed_memory() {
        let p = Prices::builtin().unwrap();
        let base = p.rate("modal", &GpuSpec::CPU, None);
        let big = p.rate("modal", &GpuSpec::CPU, Some(16 << 30));
        assert!(base.priced);
        let diff = big.usd_per_s - base.usd_per_s;
        assert!((diff - (16.0 - 0.125) * 0.00000222).abs() < 1e-12, "{diff}");
    }

    #[test]
    fn strict_errors_name_line_column_and_hint() {
        let mut p = Prices::builtin().unwrap();
        let e = p
            .apply_str("backends:\n  local:\n    gpus: {none: 1}\n", "p.yaml", None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml:3:"), "{e}");
        assert!(e.contains("`gpus`") && e.contains("\nhint: "), "{e}");

        let e = p
            .apply_str("backends:\n  local:\n    gpu:\n      H900: 1\n", "p.yaml", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("p.yaml:4:") && e.contains("`H900`") && e.contains("hint:"),
            "{e}"
        );

        let e = p
            .apply_str("backends:\n  lokal:\n    cell_s: 1\n", "p.yaml", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown backend `lokal`") && e.contains("hint:"),
            "{e}"
        );

        let e = p
            .apply_str("backends:\n  local:\n    cell_s: -1\n", "p.yaml", None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml:3:") && e.contains("at least 0"), "{e}");
    }

    #[test]
    fn slurm_partitions_price_over_the_backend() {
        let mut p = Prices::builtin().unwrap();
        // Without prices a cluster's cells are unpriced.
        assert!(!p.rate("slurm", &spec("H100"), None).priced);
        p.apply_str(
            "backends:\n  slurm:\n    gpu: {H100: 0.001, L4: 0.0002}\n    partitions:\n      preempt:\n        gpu: {H100: 0.0004}\n        cell_s: 0.0001\n",
            "prices.yaml",
            Some(Path::new("/p.yaml")),
        )
        .unwrap();
        let h = p.rate_in("slurm", Some("preempt"), &spec("H100:8"), None);
        assert!(
            h.priced && (h.usd_per_s - (8.0 * 0.0004 + 0.0001)).abs() < 1e-12,
            "{h:?}"
        );
        // Other GPU types of the partition keep the backend's price.
        let l = p.rate_in("slurm", Some("preempt"), &spec("L4"), None);
        assert!((l.usd_per_s - 0.0003).abs() < 1e-12, "{l:?}");
        // Another (or no) partition: the backend's prices.
        assert_eq!(
            p.rate_in("slurm", Some("gpu"), &spec("H100:8"), None).usd_per_s,
            0.008
        );
        assert_eq!(p.rate("slurm", &spec("H100"), None).usd_per_s, 0.001);
        let rows = p.rows(Some("slurm"));
        assert!(rows
            .iter()
            .any(|r| r.item == "partition preempt gpu H100" && r.value == 0.0004));
        let e = p
            .apply_str(
                "backends:\n  slurm:\n    partitions:\n      a:\n        gpu: {H900: 1}\n",
                "p.yaml",
                None,
            )
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("p.yaml:5:") && e.contains("`H900`"), "{e}");
        let e = p
            .apply_str(
                "backends:\n  slurm:\n    partitions:\n      a: {cell_s: -1}\n",
                "p.yaml",
                None,
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("partitions.a.cell_s") && e.contains("at least 0"),
            "{e}"
        );
    }

    #[test]
    fn load_reads_the_named_file_and_refuses_a_missing_one() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("prices.yaml");
        std::fs::write(&f, "backends:\n  docker:\n    gpu: {L4: 0.5}\n").unwrap();
        let p = Prices::load(Some(&f)).unwrap();
        assert_eq!(p.rate("docker", &spec("L4:2"), None).usd_per_s, 1.0);
        assert_eq!(p.user_file.as_deref(), Some(f.as_path()));
        let e = Prices::load(Some(&tmp.path().join("nope.yaml"))).unwrap_err();
        assert!(e.to_string().contains("hint:"));
    }
}

#[cfg(test)]
mod region_tests {
    use super::*;

    #[test]
    fn a_region_multiplier_scales_every_price_of_the_backend() {
        let mut p = Prices::builtin().unwrap();
        let gpu = GpuSpec::parse("H100:2").unwrap();
        let base = p.rate("modal", &gpu, None);
        p.apply_str(
            "backends:\n  modal:\n    region_multiplier: 1.25\n",
            "p.yaml",
            None,
        )
        .unwrap();
        let r = p.rate("modal", &gpu, None);
        assert!((r.usd_per_s - base.usd_per_s * 1.25).abs() < 1e-12, "{r:?}");
        assert!((r.usd_per_gpu_s - base.usd_per_gpu_s * 1.25).abs() < 1e-12);
    }
}
