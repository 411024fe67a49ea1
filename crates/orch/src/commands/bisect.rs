//! `orch bisect -f SUITE --good REF --bad REF`: the first commit of a
//! `compare:` benchmark's repository whose metric differs from the good
//! commit's. Each step is one normal run in the store: the benchmark's
//! compare cell with two variants, `good` (the good commit) and
//! `candidate`, interleaved and paired by the compare workload, through the
//! runner and any backend. The choice of the next commit, skips and stops
//! are `orch_history::bisect` (no IO); here: refs to commits, the step's
//! plan, its run, its verdict, and the state file `bisect/<id>.json` in the
//! store's folder (written atomically after every change), from which the
//! same command (or `--resume ID`) continues after a kill.

use super::run::exec::{self, Exec, Ready};
use super::run::{check, files_of, prepare_files, share_installs, stage_files, watch_signals};
use crate::cli::BisectArgs;
use crate::error::user;
use anyhow::Context;
use chrono::{DateTime, Utc};
use orch_backend::host::{Flags, Host};
use orch_history::bisect::{Bisection, Class, Effect, Next, Outcome, Step};
use orch_manifest::{CellPlan, ExpandOptions, Plan};
use orch_protocol::{Variant, Workload};
use orch_record::compare::{CompareInfo, VariantEntry};
use orch_record::FailureKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tokio::sync::watch;

/// The names of the two variants of every step.
const GOOD: &str = "good";
const CANDIDATE: &str = "candidate";

/// A step started whose result was not read yet (a kill may come between).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pending {
    index: usize,
    commit: String,
    run: String,
}

/// `bisect/<id>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    id: String,
    manifest: PathBuf,
    suite: String,
    benchmark: String,
    cell: String,
    #[serde(default)]
    metric: Option<String>,
    backend: String,
    repo: String,
    good_ref: String,
    bad_ref: String,
    bisection: Bisection,
    #[serde(default)]
    pending: Option<Pending>,
    #[serde(default)]
    outcome: Option<Outcome>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    /// Wall time of every invocation so far, in seconds.
    #[serde(default)]
    wall_s: f64,
    /// Steps re-measured because their run did not finish (a kill).
    #[serde(default)]
    restarted_steps: u32,
}

/// Where bisections are kept: `<store>/bisect/` for a folder store, the
/// local working folder of an object store.
fn state_dir(store: &orch_store::Store) -> PathBuf {
    store.backend().local_dir("bisect")
}

fn save(path: &Path, state: &mut State) -> anyhow::Result<()> {
    state.updated_at = Utc::now();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create `{}`", dir.display()))?;
    }
    orch_store::write_json(path, state)?;
    Ok(())
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

fn git(repo: &Path, args: &[&str]) -> Result<String, String> {
    match orch_files::run_git(repo, args) {
        Err(e) => Err(format!("cannot run `git`: {e}")),
        Ok(Ok(stdout)) => Ok(String::from_utf8_lossy(&stdout).trim().to_string()),
        Ok(Err(stderr)) => Err(stderr),
    }
}

/// A local clone of the repository to read its history: the repository
/// itself when local, else a bare clone in the cache (fetched each time).
fn local_repo(repo: &str) -> anyhow::Result<PathBuf> {
    if orch_protocol::paths::is_local_repo(repo) {
        let p = PathBuf::from(repo);
        if !p.exists() {
            return Err(user(format!(
                "the comparison's `repo:` `{repo}` does not exist\nhint: `repo:` is a git repository, a path relative to the manifest or a URL"
            )));
        }
        return Ok(p);
    }
    let name: String = repo
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let dir = orch_files::default_cache_dir().join("bisect-repos").join(name);
    let res = if dir.exists() {
        git(
            &dir,
            &[
                "fetch",
                "--quiet",
                "--tags",
                "origin",
                "+refs/heads/*:refs/heads/*",
            ],
        )
    } else {
        std::fs::create_dir_all(dir.parent().unwrap_or(&dir))?;
        git(
            Path::new("."),
            &["clone", "--quiet", "--bare", repo, &dir.to_string_lossy()],
        )
    };
    res.map_err(|e| {
        user(format!(
            "cannot fetch `{repo}`: {e}\nhint: check the URL and your access to it"
        ))
    })?;
    Ok(dir)
}

fn resolve(repo: &Path, flag: &str, r: &str) -> anyhow::Result<String> {
    git(repo, &["rev-parse", "--verify", "--quiet", &format!("{r}^{{commit}}")]).map_err(|_| {
        user(format!(
            "`{flag} {r}`: no such commit in `{}`\nhint: name a branch, tag or commit of the comparison's `repo:` (`git -C {} log --oneline`)",
            repo.display(),
            repo.display()
        ))
    })
}

/// The first-parent path from `good` (excluded) to `bad`, oldest first.
fn path(repo: &Path, good: &str, bad: &str, args: (&str, &str)) -> anyhow::Result<Vec<String>> {
    if git(repo, &["merge-base", "--is-ancestor", good, bad]).is_err() {
        return Err(user(format!(
            "`--good {}` is not an ancestor of `--bad {}`\nhint: the good commit comes first: swap them, or pick a good commit on the bad one's history",
            args.0, args.1
        )));
    }
    let list = git(
        repo,
        &[
            "rev-list",
            "--reverse",
            "--first-parent",
            "--ancestry-path",
            &format!("{good}..{bad}"),
        ],
    )
    .map_err(|e| anyhow::anyhow!("`git rev-list` failed in `{}`: {e}", repo.display()))?;
    Ok(list.lines().map(str::to_string).collect())
}

/// The `compare:` cell to bisect with: `--benchmark`, else the suite's one.
fn pick_cell(plan: &Plan, benchmark: Option<&str>, file: &Path) -> anyhow::Result<CellPlan> {
    let compares: Vec<&CellPlan> = plan
        .cells
        .iter()
        .filter(|c| matches!(c.task.workload, Workload::Compare(_)))
        .collect();
    let mut names: Vec<&str> = compares.iter().map(|c| c.benchmark.as_str()).collect();
    names.dedup();
    let name = match benchmark {
        Some(b) => {
            if !plan.cells.iter().any(|c| c.benchmark == b) {
                return Err(user(format!(
                    "`--benchmark {b}`: no such benchmark in `{}`\nhint: its `compare:` benchmarks: {}",
                    file.display(),
                    list(&names)
                )));
            }
            if !names.contains(&b) {
                return Err(user(format!(
                    "`--benchmark {b}` in `{}` is not a `compare:` benchmark\nhint: bisect needs a benchmark with `compare: {{repo: ...}}`; its `compare:` benchmarks: {}",
                    file.display(),
                    list(&names)
                )));
            }
            b
        }
        None => match names.as_slice() {
            [] => {
                return Err(user(format!(
                    "`{}` has no `compare:` benchmark\nhint: bisect runs a benchmark with `compare: {{repo: ...}}` (docs/manifest.md, \"Compare\")",
                    file.display()
                )))
            }
            [one] => one,
            many => {
                return Err(user(format!(
                    "`{}` has {} `compare:` benchmarks\nhint: pick one with `--benchmark`: {}",
                    file.display(),
                    many.len(),
                    list(many)
                )))
            }
        },
    };
    let cells: Vec<&&CellPlan> = compares.iter().filter(|c| c.benchmark == name).collect();
    if cells.len() > 1 {
        eprintln!(
            "note: benchmark `{name}` has {} cells; bisecting the first, `{}`",
            cells.len(),
            cells[0].id
        );
    }
    let cell = (*cells[0]).clone();
    if let Workload::Compare(c) = &cell.task.workload {
        if c.repo.is_none() {
            return Err(user(format!(
                "benchmark `{name}` in `{}` has no `compare.repo`\nhint: bisect walks the commits of the comparison's git repository: set `repo:`",
                file.display()
            )));
        }
    }
    Ok(cell)
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The plan of one step: the cell alone, its variants `good` and
/// `candidate` (the first variant's `install`, no patches).
fn step_plan(plan: &Plan, cell: &CellPlan, good: &str, candidate: &str, metric: Option<&str>) -> Plan {
    let mut cell = cell.clone();
    if let Workload::Compare(c) = &mut cell.task.workload {
        let install = c.variants.first().and_then(|v| v.install.clone());
        let variant = |name: &str, sha: &str| Variant {
            name: name.into(),
            git_ref: Some(sha.into()),
            patch: None,
            install: install.clone(),
        };
        c.variants = vec![variant(GOOD, good), variant(CANDIDATE, candidate)];
        c.worktree_patch = None;
        if let Some(m) = metric {
            c.primary_metric = Some(m.into());
        }
    }
    let mut plan = plan.clone();
    plan.description = Some(format!(
        "orch bisect: {} against {}",
        short(candidate),
        short(good)
    ));
    plan.cells = vec![cell];
    plan
}

/// The cause of a failed variant or cell, with its diagnosis when named.
fn cause_of(c: &orch_store::CellView, variant: Option<&VariantEntry>) -> String {
    let mut why = match variant.and_then(|v| v.failure.as_deref()) {
        Some(f) => f.to_string(),
        None => c
            .failure
            .as_ref()
            .map(|f| format!("{}: {}", f.kind, f.message))
            .unwrap_or_else(|| format!("the cell is {}", c.status)),
    };
    if let Some(d) = &c.diagnosis {
        why = format!("{} ({why})", d.kind);
    }
    why
}

/// What a finished step's run says of its commit; an error when its
/// comparison does not read (`orch_record::CompareInfo`).
fn classify(
    rec: &orch_store::RunRecord,
    index: usize,
    commit: &str,
    bad: Option<&Effect>,
) -> anyhow::Result<Step> {
    let mut step = Step {
        index,
        commit: commit.to_string(),
        class: Class::Skip,
        effect: None,
        cause: None,
        run: Some(rec.id.clone()),
        cost_usd: 0.0,
        wall_s: 0.0,
    };
    let Some(c) = rec.cells.first() else {
        step.cause = Some("the run has no cell".into());
        return Ok(step);
    };
    step.cost_usd = c.cost.as_ref().map(|x| x.usd).unwrap_or(0.0);
    step.wall_s = c.duration_s.unwrap_or(0.0);
    let cmp = CompareInfo::from_info(&c.info)
        .transpose()
        .with_context(|| format!("cannot read the comparison of run `{}`", rec.id))?;
    let variant = |name: &str| cmp.as_ref().and_then(|x| x.variants.get(name));
    let failed = |name: &str| variant(name).is_some_and(VariantEntry::failed);
    if failed(GOOD) {
        step.class = Class::Fatal;
        step.cause = Some(cause_of(c, variant(GOOD)));
        return Ok(step);
    }
    if failed(CANDIDATE) {
        step.cause = Some(cause_of(c, variant(CANDIDATE)));
        return Ok(step);
    }
    let Some((cmp, pair)) = cmp.as_ref().and_then(|x| x.pair(GOOD, CANDIDATE).map(|p| (x, p))) else {
        // No verdict: the cell failed as a whole (a config the rounds cannot
        // meet is the suite's fault, so nothing can be compared; anything
        // else is this commit's).
        let cause = cause_of(c, None);
        if c.failure
            .as_ref()
            .is_some_and(|f| f.kind == FailureKind::InvalidConfig)
        {
            step.class = Class::Fatal;
        }
        step.cause = Some(cause);
        return Ok(step);
    };
    let verdict = pair.verdict.to_string();
    let metric = pair.metric.clone();
    let row = cmp
        .comparison
        .iter()
        .find(|x| x.base == GOOD && x.other == CANDIDATE && x.metric == metric);
    let effect = Effect {
        metric,
        verdict: verdict.clone(),
        ratio: row.map_or(pair.speedup, |x| x.ratio),
        ci_low: row.map_or(pair.ci_low, |x| x.ci_low),
        ci_high: row.map_or(pair.ci_high, |x| x.ci_high),
        n: pair.n as u32,
    };
    let class = orch_history::bisect::classify(&effect, bad);
    step.effect = Some(effect);
    match class {
        Some(class) => step.class = class,
        None => step.cause = Some(format!("the pair's verdict `{verdict}` is not one bisect knows")),
    }
    Ok(step)
}

fn step_line(n: usize, s: &Step) -> String {
    let what = match (&s.effect, s.class) {
        (_, Class::Skip) => format!("skipped: {}", s.cause.as_deref().unwrap_or("")),
        (_, Class::Fatal) => format!("the good commit failed: {}", s.cause.as_deref().unwrap_or("")),
        (Some(e), class) => format!(
            "{} {} x{:.3} [{:.3}, {:.3}] n={}: {}",
            e.verdict,
            e.metric,
            e.ratio,
            e.ci_low,
            e.ci_high,
            e.n,
            if class == Class::Same {
                "like good"
            } else {
                "differs"
            }
        ),
        (None, _) => format!("{:?}", s.class).to_lowercase(),
    };
    format!(
        "step {n}: {} {what} (run {})",
        short(&s.commit),
        s.run.as_deref().unwrap_or("-")
    )
}

/// What runs the steps: the host, its backend (made for the first step
/// that runs, `run::check` once) and what every run needs.
struct Runner<'a> {
    store: &'a orch_store::Store,
    host: Box<dyn Host>,
    prices: orch_cost::Prices,
    no_preflight: bool,
    backend: Option<Ready>,
    cancel: watch::Receiver<bool>,
    text: String,
    manifest: PathBuf,
}

pub async fn bisect(
    store: &orch_store::Store,
    prices_file: Option<&Path>,
    args: BisectArgs,
) -> anyhow::Result<i32> {
    let t0 = Instant::now();
    if let Some(max) = args.max_cost {
        if !max.is_finite() || max <= 0.0 {
            return Err(user(format!(
                "`--max-cost {max}` must be a positive number of US dollars\nhint: e.g. `--max-cost 25`"
            )));
        }
    }
    let dir = state_dir(store);
    let (mut state, plan, cell) = match &args.resume {
        Some(id) => {
            orch_store::check_name("bisection id", id).map_err(|e| user(e.to_string()))?;
            let file = dir.join(format!("{id}.json"));
            if !file.is_file() {
                return Err(user(format!(
                    "no bisection `{id}` in `{}`\nhint: the ids are the names of the files in `{}`",
                    store.location(),
                    dir.display()
                )));
            }
            let state: State = orch_store::read_json(&file)?;
            if state.backend != args.backend.as_str() {
                return Err(user(format!(
                    "bisection `{id}` runs on backend `{}`, not `{}`\nhint: resume it with `--backend {}`",
                    state.backend, args.backend, state.backend
                )));
            }
            let plan = orch_manifest::load(&state.manifest, &ExpandOptions::default())?;
            let cell = pick_cell(&plan, Some(&state.benchmark), &state.manifest)?;
            (state, plan, cell)
        }
        None => {
            // clap requires all three without `--resume`.
            let (Some(file), Some(good), Some(bad)) = (&args.file, &args.good, &args.bad) else {
                return Err(user(
                    "`orch bisect` needs `-f FILE --good REF --bad REF` or `--resume ID`\nhint: `orch bisect -f suite.yaml --good v1.0 --bad main`",
                ));
            };
            let plan = orch_manifest::load(file, &ExpandOptions::default())?;
            let cell = pick_cell(&plan, args.benchmark.as_deref(), file)?;
            let repo = match &cell.task.workload {
                Workload::Compare(c) => c.repo.clone().unwrap_or_default(),
                _ => String::new(),
            };
            let local = local_repo(&repo)?;
            let good_sha = resolve(&local, "--good", good)?;
            let bad_sha = resolve(&local, "--bad", bad)?;
            if good_sha == bad_sha {
                return Err(user(format!(
                    "`--good {good}` and `--bad {bad}` are the same commit {}\nhint: name the last good commit and a later one that differs",
                    short(&good_sha)
                )));
            }
            let commits = path(&local, &good_sha, &bad_sha, (good, bad))?;
            let Some(bisection) = Bisection::new(good_sha.clone(), commits) else {
                return Err(user(format!(
                    "no commits from `--good {good}` to `--bad {bad}` on the first-parent history\nhint: `git -C {} log --first-parent --oneline {good}..{bad}`",
                    local.display()
                )));
            };
            let mut id = format!(
                "{}-{}-{}-{}",
                plan.suite,
                cell.benchmark,
                &good_sha[..8.min(good_sha.len())],
                &bad_sha[..8.min(bad_sha.len())]
            );
            if let Some(m) = &args.metric {
                id.push('-');
                id.extend(m.chars().map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        c
                    } else {
                        '-'
                    }
                }));
            }
            let file_abs = std::fs::canonicalize(file).unwrap_or_else(|_| file.clone());
            let state_file = dir.join(format!("{id}.json"));
            let state = if state_file.is_file() {
                let s: State = orch_store::read_json(&state_file)?;
                if s.backend != args.backend.as_str() {
                    return Err(user(format!(
                        "bisection `{id}` runs on backend `{}`, not `{}`\nhint: continue it with `--backend {}`",
                        s.backend, args.backend, s.backend
                    )));
                }
                if s.outcome.is_none() {
                    eprintln!(
                        "note: continuing bisection {id} ({} steps done)",
                        s.bisection.steps.len()
                    );
                }
                s
            } else {
                let now = Utc::now();
                State {
                    id: id.clone(),
                    manifest: file_abs,
                    suite: plan.suite.clone(),
                    benchmark: cell.benchmark.clone(),
                    cell: cell.id.clone(),
                    metric: args.metric.clone(),
                    backend: args.backend.as_str().to_string(),
                    repo,
                    good_ref: good.clone(),
                    bad_ref: bad.clone(),
                    bisection,
                    pending: None,
                    outcome: None,
                    created_at: now,
                    updated_at: now,
                    wall_s: 0.0,
                    restarted_steps: 0,
                }
            };
            (state, plan, cell)
        }
    };
    let state_file = dir.join(format!("{}.json", state.id));
    // A bisection the cap stopped goes on under this invocation's cap.
    if matches!(state.outcome, Some(Outcome::Budget { .. })) {
        state.outcome = None;
    }
    let prior_wall = state.wall_s;
    let (cancel_tx, cancel_rx) = watch::channel(false);
    tokio::spawn(watch_signals(cancel_tx));
    let text = std::fs::read_to_string(&state.manifest)
        .with_context(|| format!("cannot read `{}`", state.manifest.display()))?;
    let mut runner = Runner {
        store,
        host: crate::hosts::host(
            args.backend,
            Flags {
                weights_dir: args.weights_dir.clone(),
                context: None,
                namespace: None,
                keep: false,
            },
        ),
        prices: orch_cost::Prices::load(prices_file)?,
        no_preflight: args.no_preflight,
        backend: None,
        cancel: cancel_rx,
        text,
        manifest: state.manifest.clone(),
    };
    if state.outcome.is_none() {
        eprintln!(
            "bisect {}: {} commits from {} ({}) to {} ({}), benchmark `{}`",
            state.id,
            state.bisection.commits.len(),
            short(&state.bisection.good),
            state.good_ref,
            short(state.bisection.bad()),
            state.bad_ref,
            state.benchmark
        );
    }
    let code = loop {
        if state.outcome.is_some() {
            break 0;
        }
        // A step a killed invocation started: its run may have finished.
        if let Some(p) = state.pending.take() {
            match finished(store, &p.run)? {
                Some(rec) => {
                    let step = classify(&rec, p.index, &p.commit, state.bisection.bad_effect())?;
                    eprintln!("{}", step_line(state.bisection.steps.len() + 1, &step));
                    state.bisection.record(step);
                }
                None => {
                    eprintln!(
                        "note: the step of {} (run {}) did not finish; measuring it again",
                        short(&p.commit),
                        p.run
                    );
                    state.restarted_steps += 1;
                }
            }
            save(&state_file, &mut state)?;
            continue;
        }
        let (index, commit) = match state.bisection.next() {
            Next::Done(o) => {
                state.outcome = Some(o);
                save(&state_file, &mut state)?;
                continue;
            }
            Next::Measure { index, commit } => (index, commit),
        };
        let mut step_plan = step_plan(
            &plan,
            &cell,
            &state.bisection.good,
            &commit,
            state.metric.as_deref(),
        );
        // Where the host keeps installs, each commit's checkout is installed
        // once and reused by later steps (the good commit runs in every step).
        share_installs(runner.host.as_ref(), &mut step_plan.cells);
        // Budget: what the steps spent plus this one's estimate.
        let spent: f64 = state.bisection.steps.iter().map(|s| s.cost_usd).sum();
        let estimates =
            crate::commands::cost::estimate_cells(store, &step_plan, runner.host.as_ref(), &runner.prices)?;
        let estimate: f64 = estimates.iter().map(|c| c.estimate.usd).sum();
        if let Some(max) = args.max_cost {
            if spent + estimate > max {
                state.outcome = Some(Outcome::Budget {
                    commits: state.bisection.remaining(),
                    why: format!(
                        "spent ${spent:.2}, the next step is estimated at ${estimate:.2}, the cap is ${max:.2}"
                    ),
                });
                save(&state_file, &mut state)?;
                break 1;
            }
        }
        let todo = vec![cell.id.clone()];
        let cost =
            crate::commands::cost::cost_options(&estimates, &todo, args.max_cost.map(|m| m - spent), 0.0)?;
        eprintln!(
            "step {}: measuring {} against {} ({} commits left)",
            state.bisection.steps.len() + 1,
            short(&commit),
            short(&state.bisection.good),
            state.bisection.remaining().len()
        );
        let files = files_of(&step_plan);
        prepare_files(&files, &mut step_plan)?;
        let (run, outcome) = runner
            .start(step_plan, files, cost, |run| {
                state.pending = Some(Pending {
                    index,
                    commit: commit.clone(),
                    run: run.to_string(),
                });
                save(&state_file, &mut state)
            })
            .await?;
        if outcome.cancelled {
            state.wall_s = prior_wall + t0.elapsed().as_secs_f64();
            save(&state_file, &mut state)?;
            eprintln!(
                "interrupted: the finished steps are kept; `orch bisect --resume {}` (or the same command) continues",
                state.id
            );
            return Ok(130);
        }
        let rec = run.record()?;
        let step = classify(&rec, index, &commit, state.bisection.bad_effect())?;
        eprintln!("{}", step_line(state.bisection.steps.len() + 1, &step));
        state.bisection.record(step);
        state.pending = None;
        if let Some(why) = outcome.budget_stopped {
            state.outcome = Some(Outcome::Budget {
                commits: state.bisection.remaining(),
                why,
            });
        }
        state.wall_s = prior_wall + t0.elapsed().as_secs_f64();
        save(&state_file, &mut state)?;
    };
    state.wall_s = prior_wall + t0.elapsed().as_secs_f64();
    save(&state_file, &mut state)?;
    let outcome = state
        .outcome
        .clone()
        .unwrap_or(Outcome::NoChange { effect: None });
    if args.json {
        let mut v = serde_json::to_value(&state)?;
        v["state_file"] = Value::String(state_file.display().to_string());
        v["steps_taken"] = state.bisection.steps.len().into();
        v["summary"] = outcome.summary().into();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("{}", outcome.summary());
        for (i, s) in state.bisection.steps.iter().enumerate() {
            println!("  {}", step_line(i + 1, s));
        }
        println!(
            "{} steps, {:.0}s; state in {}",
            state.bisection.steps.len(),
            state.wall_s,
            state_file.display()
        );
    }
    if let Outcome::Budget { .. } = outcome {
        eprintln!(
            "hint: `orch bisect --resume {} --max-cost USD` with a higher cap goes on",
            state.id
        );
    }
    Ok(match outcome {
        Outcome::NoChange { .. } | Outcome::Culprit { .. } | Outcome::Ambiguous { .. } => code,
        _ => 1,
    })
}

/// The record of a step's run when its cell finished: recorded, not
/// cancelled (`CellStatus::is_finished`, what `--resume` goes by).
fn finished(store: &orch_store::Store, run: &str) -> anyhow::Result<Option<orch_store::RunRecord>> {
    let Ok(r) = store.open_exact(run) else {
        return Ok(None);
    };
    let rec = r.record()?;
    let done = rec.cells.first().is_some_and(|c| c.status.is_finished());
    Ok(done.then_some(rec))
}

impl Runner<'_> {
    /// One step: the run created (`created` is told its id before anything
    /// runs), its cell executed, the backend cleaned up.
    async fn start(
        &mut self,
        plan: Plan,
        files: orch_files::Files,
        cost: orch_runner::CostOptions,
        created: impl FnOnce(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<(orch_store::Run, orch_runner::Outcome)> {
        let host = self.host.as_ref();
        let ready = match &self.backend {
            Some(ready) => ready.clone(),
            None => {
                let ready = check(host, &plan, self.no_preflight)
                    .await?
                    .ready(host, &plan)
                    .await?;
                self.backend.insert(ready).clone()
            }
        };
        stage_files(&files, &plan, ready.backend.as_ref())?;
        let (mut run, _lock) = exec::create(self.store, &plan, &self.text, host, &self.manifest)?;
        created(run.id())?;
        let exec = Exec {
            store: self.store,
            host,
            ready,
            files,
            jobs: Some(1),
            cost,
            cancel: self.cancel.clone(),
            show: None,
        };
        let outcome = exec::execute(&mut run, exec)
            .await?
            .with_context(|| format!("step run {} stopped", run.id()))?;
        Ok((run, outcome))
    }
}
