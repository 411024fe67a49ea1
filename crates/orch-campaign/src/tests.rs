//! Scores of hand-built tasks, each outcome computed by hand.

use super::*;
use orch_protocol::Status;
use orch_record::compare::{Gate, Method, MetricComparison, Pair, PairDrift, Role};

/// A variant with throughput rounds (higher is better), or failed.
enum V {
    Ok(&'static str, Vec<f64>),
    Failed(&'static str, &'static str),
    Gated(&'static str, Vec<f64>, GateKind),
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

fn info(vs: Vec<V>) -> BTreeMap<String, serde_json::Value> {
    let mut variants = BTreeMap::new();
    let mut rounds: Vec<(String, Vec<f64>, Option<GateKind>)> = Vec::new();
    for v in vs {
        match v {
            V::Ok(n, xs) => rounds.push((n.into(), xs, None)),
            V::Gated(n, xs, g) => rounds.push((n.into(), xs, Some(g))),
            V::Failed(n, kind) => {
                variants.insert(
                    n.to_string(),
                    VariantEntry {
                        status: Status::Failed,
                        failure: Some("server exited with 1".into()),
                        rounds: 0,
                        values: BTreeMap::new(),
                        warmup_values: vec![],
                        drift: None,
                        output_check: None,
                        flags: vec![],
                        lengths: None,
                        gate: None,
                        logs: format!("variants/{n}"),
                        diagnosis: Some(orch_record::Diagnosis {
                            kind: orch_record::FailureKind::new(kind),
                            evidence: vec![],
                            hint: String::new(),
                        }),
                    },
                );
            }
        }
    }
    for (n, xs, g) in &rounds {
        variants.insert(
            n.clone(),
            VariantEntry {
                status: Status::Succeeded,
                failure: None,
                rounds: xs.len(),
                values: BTreeMap::from([("output_throughput".to_string(), xs.clone())]),
                warmup_values: vec![],
                drift: None,
                output_check: None,
                flags: if *g == Some(GateKind::Flagged) {
                    vec!["shorter_outputs".into()]
                } else {
                    vec![]
                },
                lengths: None,
                gate: g.map(|kind| Gate {
                    kind,
                    why: "planted".into(),
                }),
                logs: format!("variants/{n}"),
                diagnosis: None,
            },
        );
    }
    let mut pairs = Vec::new();
    let mut comparison = Vec::new();
    for (i, (a, xa, _)) in rounds.iter().enumerate() {
        for (b, xb, gb) in rounds.iter().skip(i + 1) {
            let speedup = mean(xb) / mean(xa);
            let verdict = match gb {
                Some(g) => (*g).into(),
                None if speedup > 1.02 => Verdict::Faster,
                None if speedup < 0.98 => Verdict::Slower,
                None => Verdict::Same,
            };
            pairs.push(Pair {
                base: a.clone(),
                other: b.clone(),
                metric: "output_throughput".into(),
                verdict,
                speedup,
                ci_low: speedup * 0.97,
                ci_high: speedup * 1.03,
                n: xa.len(),
                mde: None,
                method: Method::StudentT,
                drift: PairDrift {
                    base: None,
                    other: None,
                },
                speed_verdict: None,
                gate: None,
            });
            comparison.push(MetricComparison {
                base: a.clone(),
                other: b.clone(),
                metric: "output_throughput".into(),
                better: Better::Higher,
                ratio: speedup,
                ci_low: speedup * 0.97,
                ci_high: speedup * 1.03,
                speedup,
                verdict,
                n_base: xa.len(),
                n_other: xb.len(),
                n: None,
                method: None,
                confidence: None,
                p_value: None,
                p_adjusted: None,
                role: Some(Role::Primary),
                mde: None,
                precision: None,
                base_values: None,
                other_values: None,
                speed_verdict: None,
                gate: None,
                drift: None,
            });
        }
    }
    let ci = CompareInfo {
        variants,
        comparison,
        pairs,
        rounds: 5,
        rounds_requested: None,
        max_rounds: None,
        stopped_by: None,
        warmup_rounds: 1,
        warmup_rounds_requested: None,
        max_warmup_rounds: None,
        warmup_stopped_by: None,
        output_check: None,
        defences: true,
        nonces: vec![],
        noise: 0.02,
        primary_metric: Some("output_throughput".into()),
        method: None,
        confidence: None,
        seed: None,
        order: vec![],
    };
    let mut m = BTreeMap::new();
    ci.write_into(&mut m);
    m
}

fn rounds(x: f64) -> Vec<f64> {
    vec![x * 0.995, x * 1.005, x, x * 0.998, x * 1.002]
}

fn cell(
    id: &str,
    agents: &[&str],
    human: bool,
    status: CellStatus,
    info: BTreeMap<String, serde_json::Value>,
) -> TaskCell {
    TaskCell {
        task: TaskInfo {
            id: id.into(),
            row: 1,
            file: "t.jsonl".into(),
            labels: BTreeMap::new(),
            model: None,
            base: Some("abc".into()),
            human: human.then(|| "human".to_string()),
            agents: agents.iter().map(|a| a.to_string()).collect(),
            aa: None,
        },
        view: CellView {
            id: format!("serve.cpu.task-{id}"),
            benchmark: "serve".into(),
            status,
            gpu: "none".into(),
            params: BTreeMap::new(),
            metrics: BTreeMap::new(),
            timings: BTreeMap::new(),
            failure: None,
            duration_s: None,
            info,
            diagnosis: None,
            hardware: None,
            flags: vec![],
            cost: Some(orch_record::CellCost {
                usd: 1.0,
                ..Default::default()
            }),
        },
        folder: None,
    }
}

fn opts() -> Options {
    Options {
        resamples: 500,
        ..Options::default()
    }
}

#[test]
fn outcomes_follow_the_bands_and_gates() {
    let ok = CellStatus::Succeeded;
    let failed = CellStatus::Failed;
    let cells = vec![
        // agent 1.5x base, human 1.3x: won (1.5/1.3 = 1.154 > 1.05), Opt (> 0.95, >= 1.2)
        cell(
            "won",
            &["agent"],
            true,
            ok,
            info(vec![
                V::Ok("baseline", rounds(100.0)),
                V::Ok("human", rounds(130.0)),
                V::Ok("agent", rounds(150.0)),
            ]),
        ),
        // agent 1.27x vs human 1.3x: 0.977, matched; Opt (> 0.95, round(1.27)=1.3 >= 1.2)
        cell(
            "matched",
            &["agent"],
            true,
            ok,
            info(vec![
                V::Ok("baseline", rounds(100.0)),
                V::Ok("human", rounds(130.0)),
                V::Ok("agent", rounds(127.0)),
            ]),
        ),
        // agent 1.1x vs human 1.3x: 0.846, lost; no Opt
        cell(
            "lost",
            &["agent"],
            true,
            ok,
            info(vec![
                V::Ok("baseline", rounds(100.0)),
                V::Ok("human", rounds(130.0)),
                V::Ok("agent", rounds(110.0)),
            ]),
        ),
        // faster but different answers: failed
        cell(
            "mismatch",
            &["agent"],
            true,
            failed,
            info(vec![
                V::Ok("baseline", rounds(100.0)),
                V::Ok("human", rounds(130.0)),
                V::Gated("agent", rounds(200.0), GateKind::OutputMismatch),
            ]),
        ),
        // the patch does not apply: failed
        cell(
            "noapply",
            &["agent"],
            true,
            failed,
            info(vec![
                V::Ok("baseline", rounds(100.0)),
                V::Ok("human", rounds(130.0)),
                V::Failed("agent", "patch_does_not_apply"),
            ]),
        ),
        // the baseline died of a CUDA OOM: invalid
        cell(
            "oom",
            &["agent"],
            true,
            failed,
            info(vec![
                V::Failed("baseline", "cuda_oom"),
                V::Ok("human", rounds(130.0)),
                V::Ok("agent", rounds(150.0)),
            ]),
        ),
        // never ran
        cell("pending", &["agent"], true, CellStatus::Pending, BTreeMap::new()),
        // two attempts: the first lost, the second meets GSO's condition
        cell(
            "k2",
            &["agent-1", "agent-2"],
            true,
            ok,
            info(vec![
                V::Ok("baseline", rounds(100.0)),
                V::Ok("human", rounds(130.0)),
                V::Ok("agent-1", rounds(105.0)),
                V::Ok("agent-2", rounds(140.0)),
            ]),
        ),
    ];
    let c = score("r1", "s", &cells, &opts()).unwrap();
    let by = |id: &str| c.tasks.iter().find(|t| t.id == id).unwrap();
    assert_eq!(by("won").outcome, Some(Outcome::Won));
    assert_eq!(by("matched").outcome, Some(Outcome::Matched));
    assert_eq!(by("lost").outcome, Some(Outcome::Lost));
    assert_eq!(by("mismatch").outcome, Some(Outcome::Failed));
    assert_eq!(by("noapply").outcome, Some(Outcome::Failed));
    assert!(!by("oom").valid && by("oom").outcome.is_none());
    assert_eq!(by("oom").cause.as_ref().unwrap().kind, "cuda_oom");
    assert_eq!(by("oom").cause.as_ref().unwrap().variant, "baseline");
    assert_eq!(by("pending").cause.as_ref().unwrap().kind, "not_run");
    assert_eq!(by("won").opt_at, vec![true]);
    assert_eq!(by("matched").opt_at, vec![true]);
    assert_eq!(by("lost").opt_at, vec![false]);
    assert_eq!(by("k2").opt_at, vec![false, true]);
    assert_eq!(by("k2").outcome, Some(Outcome::Lost));
    let h = &c.headline;
    assert_eq!(h.tasks, 8);
    assert_eq!((h.valid.count, h.valid.of), (6, 8));
    assert_eq!(h.with_human, 6);
    assert_eq!(h.iso[&Outcome::Won].count, 1);
    assert_eq!(h.iso[&Outcome::Matched].count, 1);
    assert_eq!(h.iso[&Outcome::Lost].count, 2);
    assert_eq!(h.iso[&Outcome::Failed].count, 2);
    // Opt@1: won, matched (k2's first attempt fails) = 2/6; Opt@2: + k2 = 3/6.
    assert_eq!(h.opt_at.len(), 2);
    assert_eq!((h.opt_at[0].count, h.opt_at[0].of), (2, 6));
    assert_eq!(h.opt_at[1].count, 3);
    // SWE-Perf: five rounds with 0.5% spread: the gains are a little under
    // 1 - 100/150 = 33%, 21%, 9% for won, matched, lost; 0 for failures.
    let g = |id: &str| by(id).agent().unwrap().gain;
    assert!(g("won") > 0.30 && g("won") < 0.34, "{}", g("won"));
    assert!(g("matched") > 0.19 && g("matched") < 0.22);
    assert!(g("lost") > 0.07 && g("lost") < 0.1);
    assert_eq!(g("mismatch"), 0.0);
    let total = g("won") + g("matched") + g("lost") + g("k2");
    assert!((h.swe_perf_agent.value - total / 6.0).abs() < 1e-12);
    // The failure table: invalid causes first.
    assert!(c.failures[0].invalidates);
    let kinds: Vec<(&str, &str)> = c
        .failures
        .iter()
        .map(|f| (f.kind.as_str(), f.variant.as_str()))
        .collect();
    assert!(kinds.contains(&("cuda_oom", "baseline")));
    assert!(kinds.contains(&("patch_does_not_apply", "agent")));
    assert!(kinds.contains(&("output_mismatch", "agent")));
    assert!(kinds.contains(&("not_run", "cell")));
    assert!((h.cost_usd - 8.0).abs() < 1e-9);
    assert!((h.cost_per_valid_usd.unwrap() - 8.0 / 6.0).abs() < 1e-9);
    // Renders.
    let md = render::markdown(&c);
    assert!(md.contains("| won |") && md.contains("cuda_oom"));
    let csv = render::csv(&c);
    assert_eq!(csv.lines().count(), 9);
    let html = render::html(&c);
    assert_eq!(
        html.matches("class=\"task\" ").count(),
        4,
        "one forest row per correct first attempt"
    );
    // JSON reads back (floats to serde_json's parsing precision).
    let back: Campaign = serde_json::from_str(&render::json(&c)).unwrap();
    assert_eq!(back.failures, c.failures);
    assert_eq!(back.headline.iso[&Outcome::Lost].count, 2);
    assert_eq!(back.tasks.len(), c.tasks.len());
}

#[test]
fn a_row_without_a_human_change_scores_against_the_baseline_only() {
    let cells = vec![cell(
        "solo",
        &["agent"],
        false,
        CellStatus::Succeeded,
        info(vec![
            V::Ok("baseline", rounds(100.0)),
            V::Ok("agent", rounds(120.0)),
        ]),
    )];
    let c = score("r", "s", &cells, &opts()).unwrap();
    assert!(c.tasks[0].valid);
    assert_eq!(c.tasks[0].outcome, None);
    assert_eq!(c.headline.with_human, 0);
    assert!(c.headline.swe_perf_agent.value > 0.15);
}

#[test]
fn an_aa_pair_that_is_not_same_raises_an_alarm() {
    let mut quiet = cell(
        "quiet",
        &["agent"],
        true,
        CellStatus::Succeeded,
        info(vec![
            V::Ok("baseline", rounds(100.0)),
            V::Ok("human", rounds(130.0)),
            V::Ok("agent", rounds(150.0)),
            V::Ok("baseline-again", rounds(100.0)),
        ]),
    );
    quiet.task.aa = Some("baseline-again".into());
    let mut noisy = cell(
        "noisy",
        &["agent"],
        true,
        CellStatus::Succeeded,
        info(vec![
            V::Ok("baseline", rounds(100.0)),
            V::Ok("human", rounds(130.0)),
            V::Ok("agent", rounds(150.0)),
            V::Ok("baseline-again", rounds(110.0)),
        ]),
    );
    noisy.task.aa = Some("baseline-again".into());
    let c = score("r", "s", &[quiet, noisy], &opts()).unwrap();
    assert_eq!(c.tasks[0].aa.as_ref().unwrap().verdict, Verdict::Same);
    assert_eq!(c.headline.aa_alarms, vec!["noisy".to_string()]);
    assert!(render::headline(&c).contains("A/A               1 of 2 tasks not `same` (noisy)"));
}

#[test]
fn two_campaigns_compare_task_by_task() {
    let mk = |a: f64| {
        let cells: Vec<TaskCell> = (0..6)
            .map(|i| {
                cell(
                    &format!("t{i}"),
                    &["agent"],
                    true,
                    CellStatus::Succeeded,
                    info(vec![
                        V::Ok("baseline", rounds(100.0)),
                        V::Ok("human", rounds(130.0)),
                        V::Ok("agent", rounds(a + i as f64)),
                    ]),
                )
            })
            .collect();
        score("r", "s", &cells, &opts()).unwrap()
    };
    let (a, b) = (mk(105.0), mk(140.0));
    let cmp = compare(&a, &b, &opts()).unwrap();
    assert_eq!(cmp.tasks.len(), 6);
    assert!(cmp.speedup_ratio.value > 1.25);
    // Six tasks all the same way: the exact sign-flip p is 2/64.
    assert!((cmp.speedup_p - 2.0 / 64.0).abs() < 1e-12);
    assert_eq!(cmp.opt_only_b.len(), 6);
    assert!(render::comparison(&cmp).contains("6 common valid tasks"));
}
