//! `orch doctor [--backend B] [-f SUITE] [--json]`: for each backend (its
//! host side's [`orch_backend::Host::doctor`]), the store, the Hub and the
//! prices, what is configured, what works and what to do next; checked for
//! real but cheaply, spending nothing. Exit 0 when no check failed, 1
//! otherwise. Names no backend: `hosts.rs` dispatches.

use crate::cli::DoctorArgs;
use crate::error::user;
use orch_backend::host::{first_line, Check, CheckStatus, Flags};
use orch_backend::Kind;
use orch_manifest::{ExpandOptions, Plan};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::Path;

/// The checks of one backend, or of the store, the Hub or the prices.
#[derive(Debug, Serialize)]
struct Section {
    name: String,
    checks: Vec<Check>,
}

pub async fn doctor(store: &str, prices_file: Option<&Path>, args: DoctorArgs) -> anyhow::Result<i32> {
    let plan = match &args.file {
        Some(f) => Some(orch_manifest::load(f, &ExpandOptions::default())?),
        None => None,
    };
    let flags = Flags {
        weights_dir: args.weights_dir.clone(),
        context: args.context.clone(),
        namespace: args.namespace.clone(),
        keep: false,
    };
    let kinds: Vec<Kind> = match args.backend {
        Some(k) => vec![k],
        None => Kind::ALL.to_vec(),
    };
    let mut sections = Vec::new();
    for kind in &kinds {
        let host = crate::hosts::host(*kind, flags.clone());
        let mut checks = host.doctor(plan.as_ref()).await;
        if checks.is_empty() {
            checks.push(Check::ok("backend", "nothing to check"));
        }
        sections.push(Section {
            name: kind.to_string(),
            checks,
        });
    }
    sections.push(Section {
        name: "store".into(),
        checks: store_checks(store).await,
    });
    sections.push(Section {
        name: "hub".into(),
        checks: hub_checks(plan.as_ref()).await,
    });
    sections.push(Section {
        name: "prices".into(),
        checks: price_checks(prices_file, plan.as_ref(), &kinds, &flags)?,
    });
    let all = || sections.iter().flat_map(|s| s.checks.iter());
    let count = |st: CheckStatus| all().filter(|c| c.status == st).count();
    let failed = count(CheckStatus::Fail);
    if args.json {
        let out = serde_json::json!({
            "ok": failed == 0,
            "suite": plan.as_ref().map(|p| p.suite.clone()),
            "sections": sections,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let width = all().map(|c| c.name.len()).max().unwrap_or(0);
        for s in &sections {
            println!("{}", s.name);
            for c in &s.checks {
                println!("  {:<7} {:<width$}  {}", c.status.as_str(), c.name, c.detail);
                if let Some(n) = &c.next {
                    if c.status != CheckStatus::Ok {
                        println!("  {:<7} {:<width$}  next: {n}", "", "");
                    }
                }
            }
        }
        println!(
            "{} ok, {} warn, {} fail, {} skipped (not configured here)",
            count(CheckStatus::Ok),
            count(CheckStatus::Warn),
            failed,
            count(CheckStatus::Skipped)
        );
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// The text of an error split into its first line and its `hint:`.
fn split_hint(text: &str, default: &str) -> (String, String) {
    let hint = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("hint: "))
        .unwrap_or(default)
        .to_string();
    (first_line(text), hint)
}

/// The store: a folder that can be written (or made), or a bucket that
/// can be listed and written with a conditional create (a probe key,
/// deleted again).
async fn store_checks(location: &str) -> Vec<Check> {
    if !location.starts_with("s3://") {
        let dir = Path::new(location);
        let found = dir.ancestors().find(|a| a.is_dir() || a.as_os_str().is_empty());
        let probe_dir = match found {
            Some(d) if d.as_os_str().is_empty() => Path::new("."),
            Some(d) => d,
            None => Path::new("."),
        };
        let probe = probe_dir.join(format!(".orch-doctor-{}", std::process::id()));
        return vec![match std::fs::write(&probe, b"") {
            Ok(()) => {
                let _ = std::fs::remove_file(&probe);
                Check::ok(
                    "folder",
                    format!(
                        "`{location}`{}",
                        if dir.is_dir() {
                            " (writable)"
                        } else {
                            " (made by the first run)"
                        }
                    ),
                )
            }
            Err(e) => Check::fail(
                "folder",
                format!("`{}` is not writable: {e}", probe_dir.display()),
                "pass `--store DIR` (or `ORCH_STORE`) naming a folder you can write, or `s3://bucket/prefix`",
            ),
        }];
    }
    let location = location.to_string();
    match tokio::task::spawn_blocking(move || s3_checks(&location)).await {
        Ok(c) => c,
        Err(e) => vec![Check::fail(
            "bucket",
            format!("the check stopped: {e}"),
            "run it again",
        )],
    }
}

fn s3_checks(url: &str) -> Vec<Check> {
    let creds_next = "check the credentials (`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`) and `AWS_ENDPOINT_URL` for S3-compatible servers";
    let store = match orch_store_s3::S3Store::open(url) {
        Ok(s) => s,
        Err(e) => {
            let (d, n) = split_hint(&e.to_string(), creds_next);
            return vec![Check::fail("bucket", d, n)];
        }
    };
    let prefix = match orch_store_s3::parse_url(url) {
        Ok((_, p)) if p.is_empty() => String::new(),
        Ok((_, p)) => format!("{p}/"),
        Err(e) => {
            return vec![Check::fail(
                "bucket",
                first_line(&e.to_string()),
                "write `s3://BUCKET/PREFIX`",
            )]
        }
    };
    let objects = store.objects();
    let mut out = Vec::new();
    match objects.list_dirs(&prefix) {
        Ok(runs) => out.push(Check::ok(
            "read",
            format!("`{url}` lists ({} folder(s) under the prefix)", runs.len()),
        )),
        Err(e) => {
            let (d, n) = split_hint(&e.to_string(), creds_next);
            out.push(Check::fail("read", d, n));
            return out;
        }
    }
    let token = format!(
        "doctor-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let key = format!("{prefix}.orch/doctor/{token}");
    let body = format!("{{\"writer\":\"{token}\"}}").into_bytes();
    match objects.create(&key, body, &token) {
        Ok(orch_store_s3::objects::Created::Ours) => {}
        Ok(orch_store_s3::objects::Created::Theirs(_)) => {
            out.push(Check::fail(
                "write",
                format!("the probe key `{key}` existed before orch wrote it"),
                "run `orch doctor` again",
            ));
            return out;
        }
        Err(e) => {
            let (d, _) = split_hint(&e.to_string(), "");
            out.push(Check::fail(
                "write",
                format!("cannot write to `{url}`: {d}"),
                "grant the credentials `s3:PutObject` and `s3:DeleteObject` on the bucket and prefix (runs are written there)",
            ));
            return out;
        }
    }
    let second = objects.create(&key, b"{\"writer\":\"second-writer\"}".to_vec(), "second-writer");
    let _ = objects.delete(std::slice::from_ref(&key));
    out.push(match second {
        Ok(orch_store_s3::objects::Created::Theirs(_)) => Check::ok(
            "write",
            "a conditional create (`If-None-Match: *`) was written once and refused the second time; the probe key was deleted",
        ),
        Ok(orch_store_s3::objects::Created::Ours) => Check::fail(
            "write",
            "the server ignores conditional writes (`If-None-Match: *`): a second create overwrote the first",
            format!(
                "use a server that supports conditional writes (AWS S3, MinIO, R2, recent Ceph), or set `{}=1` if only one process ever writes a run",
                orch_store_s3::UNCONDITIONAL_ENV
            ),
        ),
        Err(e) => Check::warn("write", format!("the second, conditional create failed: {}", first_line(&e.to_string())), "run `orch doctor` again"),
    });
    out
}

/// The Hub token, and each model of the suite: found, gated, and whether
/// the token may read it (a `HEAD` of one file of a gated model).
pub(crate) async fn hub_checks(plan: Option<&Plan>) -> Vec<Check> {
    let token = orch_hub::token::resolve_token();
    let models: Vec<_> = plan.map(orch_backend::host::model_requests).unwrap_or_default();
    let mut out = vec![match (&token, models.is_empty()) {
        (Some(_), _) => Check::ok("token", "a Hub token is set (`HF_TOKEN` or the token file)"),
        (None, true) => Check::skipped(
            "token",
            "no Hub token (none needed without gated models)",
            "`hf auth login`, or set `HF_TOKEN`, before setting up gated models",
        ),
        (None, false) => Check::warn(
            "token",
            "no Hub token: gated models will refuse `orch setup`",
            "`hf auth login`, or set `HF_TOKEN`",
        ),
    }];
    if models.is_empty() {
        return out;
    }
    let client = match orch_hub::client() {
        Ok(c) => c,
        Err(e) => {
            out.push(Check::fail(
                "hub",
                first_line(&e.to_string()),
                "check `HF_ENDPOINT`",
            ));
            return out;
        }
    };
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    for m in models {
        let name = format!("{}@{}", m.repo, m.revision);
        if m.repo_type != "model" {
            out.push(Check::skipped(
                &name,
                format!("a {} (only models are checked)", m.repo_type),
                "`orch setup` checks it before any byte",
            ));
            continue;
        }
        let Some((owner, repo)) = m.repo.split_once('/') else {
            out.push(Check::fail(&name, "not `org/name`", "name models `org/name`"));
            continue;
        };
        let repo_h = client.model(owner, repo);
        let info = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            repo_h.info().revision(m.revision.clone()).send(),
        )
        .await;
        let info = match info {
            Ok(Ok(i)) => i,
            Ok(Err(e)) => {
                out.push(Check::fail(
                    &name,
                    first_line(&e.to_string()),
                    format!("check the name and revision at {endpoint}/{}", m.repo),
                ));
                continue;
            }
            Err(_) => {
                out.push(Check::warn(
                    &name,
                    "the Hub did not answer within 20 s",
                    "check the network, or `HF_ENDPOINT`",
                ));
                continue;
            }
        };
        let gated = info
            .gated
            .as_ref()
            .is_some_and(|g| !(g.is_null() || g == &serde_json::Value::Bool(false)));
        if !gated {
            out.push(Check::ok(&name, "found, not gated"));
            continue;
        }
        let file = info
            .siblings
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.rfilename)
            .find(|f| f.ends_with(".json"))
            .unwrap_or_else(|| "config.json".into());
        let head = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            repo_h
                .get_file_metadata()
                .filepath(file)
                .revision(&m.revision)
                .send(),
        )
        .await;
        out.push(match head {
            Ok(Ok(_)) => Check::ok(&name, "gated; the token may read it"),
            Ok(Err(e)) => Check::fail(
                &name,
                format!(
                    "gated, and the token may not read it: {}",
                    first_line(&e.to_string())
                ),
                format!(
                    "accept the model's terms at {endpoint}/{} with the token's account{}",
                    m.repo,
                    if token.is_none() {
                        ", then set `HF_TOKEN`"
                    } else {
                        ""
                    }
                ),
            ),
            Err(_) => Check::warn(
                &name,
                "gated; the Hub did not answer within 20 s",
                "check the network, or `HF_ENDPOINT`",
            ),
        });
    }
    out
}

/// A price for each GPU type the suite asks for, on each backend checked.
fn price_checks(
    prices_file: Option<&Path>,
    plan: Option<&Plan>,
    kinds: &[Kind],
    flags: &Flags,
) -> anyhow::Result<Vec<Check>> {
    let prices = match orch_cost::Prices::load(prices_file) {
        Ok(p) => p,
        Err(e) if e.is_user_error() => {
            let (d, n) = split_hint(&e.to_string(), "fix the prices file (see `orch prices`)");
            return Ok(vec![Check::fail("prices file", d, n)]);
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = vec![Check::ok(
        "prices file",
        match &prices.user_file {
            Some(p) => format!("`{}` over the built-in catalog", p.display()),
            None => "the built-in catalog (no prices file of yours)".to_string(),
        },
    )];
    let Some(plan) = plan else {
        out.push(Check::skipped(
            "gpus",
            "no suite given",
            "`orch doctor -f SUITE` checks a price for each GPU it asks for",
        ));
        return Ok(out);
    };
    let gpus: BTreeSet<String> = plan
        .cells
        .iter()
        .filter(|c| !c.gpu.is_cpu())
        .map(|c| c.gpu.to_string())
        .collect();
    if gpus.is_empty() {
        out.push(Check::ok("gpus", "the suite's cells use no GPU"));
        return Ok(out);
    }
    for kind in kinds {
        let host = crate::hosts::host(*kind, flags.clone());
        let mut unpriced = Vec::new();
        let mut priced = Vec::new();
        for g in &gpus {
            let spec = orch_manifest::GpuSpec::parse(g)
                .map_err(|e| user(format!("`{g}`: {e}\nhint: check the suite's `gpus`")))?;
            let rate = prices.rate_in(kind.as_str(), host.price_partition(plan), &spec, None);
            if rate.priced {
                priced.push(format!("{g} ${:.2}/h", rate.usd_per_s * 3600.0));
            } else {
                unpriced.push(g.clone());
            }
        }
        out.push(if unpriced.is_empty() {
            Check::ok(kind.as_str(), priced.join(", "))
        } else {
            Check::warn(
                kind.as_str(),
                format!(
                    "no price for {} (cells run, their cost is unknown)",
                    unpriced.join(", ")
                ),
                format!(
                    "add them under `{kind}:` in `{}` (see `orch prices --backend {kind}`)",
                    orch_cost::catalog::default_user_path()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "~/.config/orch/prices.yaml".into())
                ),
            )
        });
    }
    Ok(out)
}
