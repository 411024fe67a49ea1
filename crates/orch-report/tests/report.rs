//! The report of a fixture run: rankings and $ per 1k tokens against
//! hand-computed numbers, and what the markdown, CSV and JSON hold.

#[path = "support/fixture.rs"]
mod fixture;

use orch_record::FailureKind;
use orch_report::model::{competition_ranks, usd_per_1k_tokens};
use orch_report::{render, Format, Options, Report, ReportError};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

fn report() -> Report {
    Report::build(&fixture::run(), &Options::default()).unwrap()
}

#[test]
fn dollars_per_1k_tokens_by_hand() {
    // $0.002/s at 1000 tokens/s: 1000 tokens cost $0.002.
    assert!(close(usd_per_1k_tokens(0.002, 1000.0).unwrap(), 0.002));
    // Seed 000's H100: $0.001097/s at 650.3 tok/s = $0.0016869/1k.
    assert!(close(
        usd_per_1k_tokens(0.001097, 650.3).unwrap(),
        0.001097 / 650.3 * 1000.0
    ));
    assert!((usd_per_1k_tokens(0.001097, 650.3).unwrap() - 0.0016869).abs() < 1e-7);
    // A free backend costs nothing per token; no throughput, no figure.
    assert_eq!(usd_per_1k_tokens(0.0, 500.0), Some(0.0));
    assert_eq!(usd_per_1k_tokens(0.002, 0.0), None);
    assert_eq!(usd_per_1k_tokens(0.002, f64::NAN), None);
}

#[test]
fn competition_ranking_shares_ties() {
    assert_eq!(competition_ranks(&[9.0, 5.0, 5.0, 3.0]), [1, 2, 2, 4]);
    assert_eq!(competition_ranks(&[0.0, 0.0, 0.0]), [1, 1, 1]);
    assert!(competition_ranks(&[]).is_empty());
}

#[test]
fn rankings_by_throughput_and_cost() {
    let r = report();
    // One ranking per throughput metric, in plan order; failed cells and the
    // comparison's per-variant means are not ranked.
    let metrics: Vec<&str> = r.rankings.iter().map(|k| k.metric.as_str()).collect();
    assert_eq!(metrics, ["tokens_per_s", "output_throughput", "md5_mib_per_s"]);
    let tps = &r.rankings[0];
    let order: Vec<(&str, usize, f64)> = tps
        .entries
        .iter()
        .map(|e| (e.cell.as_str(), e.rank, e.value))
        .collect();
    assert_eq!(
        order,
        [
            ("transformer.h100.preset-small", 1, 1000.0),
            ("transformer.a100-80gb.preset-small", 2, 400.0),
            ("transformer.l4.preset-small", 3, 200.0),
        ]
    );
    assert_eq!(tps.unit, "output tokens");

    // $/1k tokens: H100 0.002/1000*1000 = 0.002; A100 0.001/400*1000 = 0.0025;
    // L4 0.0003/200*1000 = 0.0015; serve 0.004/500*1000 = 0.008.
    let cost: Vec<(&str, usize)> = r.cost_ranking.iter().map(|e| (e.cell.as_str(), e.rank)).collect();
    assert_eq!(
        cost,
        [
            ("transformer.l4.preset-small", 1),
            ("transformer.h100.preset-small", 2),
            ("transformer.a100-80gb.preset-small", 3),
            ("serve.h100x2.rate-4", 4),
        ]
    );
    let per_1k: Vec<f64> = r.cost_ranking.iter().map(|e| e.usd_per_1k_tokens).collect();
    for (got, want) in per_1k.iter().zip([0.0015, 0.002, 0.0025, 0.008]) {
        assert!(close(*got, want), "{got} != {want}");
    }
    // $/GPU-hour: the serving cell pays $0.004/s for 2 GPUs = $7.20/GPU-hour.
    assert!(close(r.cost_ranking[3].usd_per_gpu_hour.unwrap(), 7.2));
    assert_eq!(r.cost_ranking[3].token_metric, "output_throughput");
    // The flagged cell stays ranked, with its flag.
    assert_eq!(r.cost_ranking[0].flags, ["hardware_mismatch"]);

    let cell = |id: &str| r.cells.iter().find(|c| c.id == id).unwrap();
    let l4 = cell("transformer.l4.preset-small");
    assert_eq!((l4.throughput_rank, l4.cost_rank), (Some(3), Some(1)));
    // A failed cell has no $/1k (its cost is waste); an old cell no cost at all.
    assert_eq!(cell("transformer.l4.preset-2.7b").usd_per_1k_tokens, None);
    let old = cell("command.cpu");
    assert!(old.cost.is_none() && old.usd_per_1k_tokens.is_none());
    assert_eq!(old.throughput_rank, Some(1));
}

#[test]
fn totals_and_waste() {
    let t = report().totals;
    // 100 s × (0.002 + 0.001 + 0.0003) + 300 s × 0.004 + 40 s × 0.0003 + 1000 s × 0.004
    let usd = 0.33 + 1.2 + 0.012 + 4.0;
    assert!(close(t.usd.unwrap(), usd), "{:?}", t.usd);
    // The OOM cell and the failed comparison: 0.012 + 4.0.
    assert!(close(t.wasted_usd.unwrap(), 4.012));
    // GPU-hours: (3×100 + 2×300 + 40 + 2×1000) / 3600.
    assert!(close(t.gpu_hours.unwrap(), 2940.0 / 3600.0));
    assert_eq!((t.cells_with_cost, t.cells_without_cost), (6, 1));
    assert!(close(t.by_phase["measure"], usd * 0.75));
}

#[test]
fn latency_per_workload() {
    let r = report();
    let cell = |id: &str| r.cells.iter().find(|c| c.id == id).unwrap();
    let t = cell("transformer.h100.preset-small").latency.as_ref().unwrap();
    assert_eq!(t.family, "step_time");
    assert_eq!((t.mean, t.p95), (Some(8.0), Some(8.0 * 1.10)));
    let s = cell("serve.h100x2.rate-4").latency.as_ref().unwrap();
    assert_eq!(
        (s.family.as_str(), s.median, s.p99),
        ("ttft", Some(100.0), Some(260.0))
    );
    assert!(cell("command.cpu").latency.is_none());

    // `--latency e2el` and `--metric request_throughput` override.
    let r = Report::build(
        &fixture::run(),
        &Options {
            metric: Some("request_throughput".into()),
            latency: Some("e2el".into()),
        },
    )
    .unwrap();
    assert_eq!(r.rankings.len(), 1);
    assert_eq!(r.rankings[0].metric, "request_throughput");
    assert_eq!(r.rankings[0].unit, "requests");
    let s = r.cells.iter().find(|c| c.id == "serve.h100x2.rate-4").unwrap();
    assert_eq!(s.latency.as_ref().unwrap().mean, Some(2400.0));
    // $/1k tokens does not depend on the ranking metric.
    assert_eq!(r.cost_ranking.len(), 4);

    // A lower-is-better metric ranks ascending.
    let r = Report::build(
        &fixture::run(),
        &Options {
            metric: Some("step_time_mean_ms".into()),
            latency: None,
        },
    )
    .unwrap();
    let first = &r.rankings[0].entries[0];
    assert_eq!(
        (first.cell.as_str(), first.value),
        ("transformer.h100.preset-small", 8.0)
    );
}

#[test]
fn unknown_metric_is_a_user_error_naming_the_flag() {
    for (opts, flag) in [
        (
            Options {
                metric: Some("tokens_per_sec".into()),
                latency: None,
            },
            "`--metric`",
        ),
        (
            Options {
                metric: None,
                latency: Some("queue".into()),
            },
            "`--latency`",
        ),
    ] {
        let e = Report::build(&fixture::run(), &opts).unwrap_err();
        assert!(matches!(e, ReportError::UnknownMetric { .. }) && e.is_user_error());
        let text = e.to_string();
        assert!(text.contains(flag), "{text}");
        assert!(text.contains("\nhint: this run has "), "{text}");
    }
    let text = Report::build(
        &fixture::run(),
        &Options {
            metric: Some("x".into()),
            latency: None,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(text.contains("`tokens_per_s`"), "{text}");
    let text = Report::build(
        &fixture::run(),
        &Options {
            metric: None,
            latency: Some("x".into()),
        },
    )
    .unwrap_err()
    .to_string();
    assert!(text.contains("`step_time`") && text.contains("`ttft`"), "{text}");
}

#[test]
fn comparisons_and_failures() {
    let r = report();
    assert_eq!(r.comparisons.len(), 1);
    let c = &r.comparisons[0];
    assert_eq!((c.rounds, c.noise), (Some(5), Some(0.02)));
    // Headline metrics first, in their documented order.
    let metrics: Vec<&str> = c.rows.iter().map(|x| x.metric.as_str()).collect();
    assert_eq!(metrics, ["output_throughput", "mean_ttft_ms", "completed"]);
    assert_eq!(c.rows[0].verdict, "faster");
    assert!(c.rows[0].key && !c.rows[2].key);
    let agent = c.variants.iter().find(|v| v.name == "agent").unwrap();
    assert_eq!(agent.diagnosis.as_ref().unwrap().kind, FailureKind::GatedRepo);

    let failed: Vec<&str> = r.failures.iter().map(|f| f.cell.as_str()).collect();
    assert_eq!(failed, ["transformer.l4.preset-2.7b", "vllm-3way.h100x2"]);
    assert_eq!(
        r.failures[0].diagnosis.as_ref().unwrap().kind,
        FailureKind::CudaOom
    );
    assert!(close(r.failures[0].wasted_usd.unwrap(), 0.012));
}

#[test]
fn markdown_holds_every_section() {
    let md = render(&report(), Format::Md).unwrap();
    let expect = [
        "# Report of `20261122-061502-lm-sweep-3fa2`\n",
        "suite `lm-sweep` · backend `modal` · complete · 2026-11-22 06:15 UTC · host `bench-host` · orch 0.1.0 · commit `0123456789ab`",
        "- **cost**: $5.54 total, $4.01 wasted by failures, 0.8167 GPU-hours (1 cells recorded without a cost)",
        "- **⚠ 1 cells flagged**",
        "## Ranking by throughput\n\n### `tokens_per_s` (higher is better)\n\n| # | cell | GPU | tokens_per_s | $/1k tokens |\n|--:|---|---|--:|--:|\n\
         | 1 | `transformer.h100.preset-small` | H100 | 1000 | $0.002 |\n\
         | 2 | `transformer.a100-80gb.preset-small` | A100-80GB | 400 | $0.0025 |\n\
         | 3 | `transformer.l4.preset-small` ⚠ | L4 | 200 | $0.0015 |\n",
        "### `md5_mib_per_s` (higher is better)\n\n| # | cell | GPU | md5_mib_per_s | $/1k tokens |\n|--:|---|---|--:|--:|\n| 1 | `command.cpu` | none | 400 |  |\n",
        "## Ranking by cost-efficiency ($ per 1k output tokens)\n\n",
        "| 1 | `transformer.l4.preset-small` ⚠ | L4 | $0.0015 | 200 `tokens_per_s` | $1.08 |\n",
        "| 4 | `serve.h100x2.rate-4` | H100:2 | $0.008 | 500 `output_throughput` | $7.20 |\n",
        "| `transformer.h100.preset-small` | succeeded | H100 | 1000 `tokens_per_s` | `step_time (ms)` | 8 | 7.84 | 8.8 | 9.6 | 0.4 | $0.20 | $0.002 |  |\n",
        "| `serve.h100x2.rate-4` | succeeded | H100:2 | 500 `output_throughput` | `ttft (ms)` | 120 | 100 |  | 260 | 40 | $1.20 | $0.008 |  |\n",
        "| `transformer.l4.preset-2.7b` | oom | L4 |  |  |  |  |  |  |  | $0.012 wasted |  |  |\n",
        "| `command.cpu` | succeeded | none | 400 `md5_mib_per_s` |  |  |  |  |  |  |  |  |  |\n",
        "## Comparisons\n\n### `vllm-3way.h100x2` (H100:2, failed, 5 rounds, noise threshold 2%, bootstrap interval)\n",
        "| `human` vs `baseline` | `output_throughput` |  | 1.120 | [1.080, 1.160] | 1.120 |  |  | **faster** |\n",
        "| `human` vs `baseline` | `mean_ttft_ms` |  | 1.010 | [0.970, 1.050] | 0.990 |  |  | **same** |\n",
        "- variant `agent` failed: round 1: server exited\n  - cause `gated_repo`; hint: accept the licence\n",
        "### `transformer.l4.preset-2.7b`: oom\n\n- **failure** `oom`: transformer build failed: CUDA out of memory\n- **cause** `cuda_oom`\n",
        "  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB <GPU 0>\n",
        // Free text is escaped in tables and lists.
        "- **hint**: use a GPU with more memory, or a smaller batch \\| context\n",
        "- **logs**: `orch logs 20261122-061502-lm-sweep-3fa2 transformer.l4.preset-2.7b`\n",
        "## Hardware\n\n| cell | asked | GPUs | driver | CUDA | CPU | flags |\n",
        "| `serve.h100x2.rate-4` | H100:2 | 2× NVIDIA H100 80GB HBM3 (80 GiB) | 580.159.04 | 13.0 | AMD EPYC 9654, 32 CPUs, 256 GiB |  |\n",
        "| `transformer.l4.preset-small` | L4 | 1× NVIDIA L4 (80 GiB) | 580.159.04 | 13.0 | AMD EPYC 9654, 32 CPUs, 256 GiB | ⚠ hardware_mismatch: asked L4, found 1× NVIDIA T4 |\n",
    ];
    for e in expect {
        assert!(md.contains(e), "markdown lacks:\n{e}\n--- in ---\n{md}");
    }
    // The comparison shows only headline metrics when there are any.
    assert!(!md.contains("`completed`"), "{md}");
}

#[test]
fn markdown_of_a_run_without_cost_or_hardware() {
    let mut run = fixture::run();
    for c in &mut run.cells {
        c.cost = None;
        c.hardware = None;
        c.flags.clear();
    }
    let r = Report::build(&run, &Options::default()).unwrap();
    assert!(r.cost_ranking.is_empty() && r.totals.usd.is_none());
    let md = render(&r, Format::Md).unwrap();
    assert!(md.contains("- **cost**: no cost recorded"), "{md}");
    assert!(
        md.contains("No cell has a cost (records made before cost tracking)"),
        "{md}"
    );
    assert!(md.contains("No cell recorded its hardware"), "{md}");
    // Throughput still ranks, with the cost column empty.
    assert!(
        md.contains("| 1 | `transformer.h100.preset-small` | H100 | 1000 |  |\n"),
        "{md}"
    );
    let csv = render(&r, Format::Csv).unwrap();
    assert_eq!(csv.lines().count(), 1 + run.cells.len());
}

fn parse_csv(text: &str) -> Vec<Vec<String>> {
    // Enough of RFC 4180 for the test: quoted fields with "" and commas.
    let mut rows = Vec::new();
    let (mut row, mut field, mut quoted, mut chars) =
        (Vec::new(), String::new(), false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => row.push(std::mem::take(&mut field)),
            ('\n', false) => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (c, _) => field.push(c),
        }
    }
    rows
}

#[test]
fn csv_has_one_row_per_cell_and_every_metric() {
    let csv = render(&report(), Format::Csv).unwrap();
    let rows = parse_csv(&csv);
    let header = &rows[0];
    assert_eq!(
        &header[..8],
        [
            "run",
            "cell",
            "benchmark",
            "status",
            "gpu",
            "duration_s",
            "throughput_metric",
            "throughput"
        ]
    );
    assert!(rows.iter().all(|r| r.len() == header.len()));
    assert_eq!(rows.len(), 1 + 7);
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name}"))
    };
    let row = |id: &str| rows.iter().find(|r| r[1] == id).unwrap();
    let l4 = row("transformer.l4.preset-small");
    assert_eq!(l4[col("usd_per_1k_tokens")], "0.0015");
    assert_eq!(l4[col("cost_rank")], "1");
    assert_eq!(l4[col("throughput_rank")], "3");
    assert_eq!(l4[col("latency_p95")], "44");
    assert_eq!(l4[col("flags")], "hardware_mismatch");
    assert_eq!(l4[col("param.preset")], "small");
    assert_eq!(l4[col("metric.tokens_per_s")], "200");
    assert_eq!(l4[col("hardware_gpus")], "1× NVIDIA L4 (80 GiB)");
    let serve = row("serve.h100x2.rate-4");
    assert_eq!(serve[col("param.rate")], "4");
    assert_eq!(serve[col("usd_per_gpu_hour")], "7.2");
    assert_eq!(serve[col("latency")], "ttft");
    let oom = row("transformer.l4.preset-2.7b");
    assert_eq!(oom[col("cost_wasted")], "true");
    assert_eq!(oom[col("diagnosis")], "cuda_oom");
    // A field with a comma and a pipe survives quoting.
    assert_eq!(
        oom[col("hint")],
        "use a GPU with more memory, or a smaller batch | context"
    );
    let old = row("command.cpu");
    assert_eq!(old[col("cost_usd")], "");
    assert_eq!(old[col("metric.md5_mib_per_s")], "400");
}

#[test]
fn json_is_the_model() {
    let r = report();
    let text = render(&r, Format::Json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["report_version"], 1);
    assert_eq!(v["run"]["id"], "20261122-061502-lm-sweep-3fa2");
    assert_eq!(v["cost_ranking"][0]["cell"], "transformer.l4.preset-small");
    assert_eq!(v["rankings"][0]["better"], "higher");
    assert_eq!(v["cells"][0]["latency"]["family"], "step_time");
    assert_eq!(v["cells"][0]["hardware"]["driver_version"], "580.159.04");
    let back: Report = serde_json::from_value(v).unwrap();
    assert_eq!(back.cost_ranking, r.cost_ranking);
}

#[test]
fn html_is_self_contained() {
    let html = render(&report(), Format::Html).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    for external in ["<link", "src=", "@import", "url(", "href=\"http", "cdn"] {
        assert!(
            !html.to_lowercase().contains(external),
            "HTML references `{external}`"
        );
    }
    // Free text is escaped, the embedded JSON cannot close its script.
    assert!(html.contains("2.00 GiB &lt;GPU 0&gt;"));
    let data_start = html.find("id=\"orch-report-data\">").unwrap();
    let data_end = data_start + html[data_start..].find("</script>").unwrap();
    assert!(!html[data_start..data_end].contains("<GPU"));
    assert_eq!(html.matches("data-chart=\"throughput\"").count(), 3);
    assert_eq!(html.matches("data-chart=\"cost\"").count(), 1);
    assert_eq!(html.matches("data-chart=\"latency\"").count(), 2);
    assert_eq!(html.matches("data-chart=\"comparison\"").count(), 1);
}

#[test]
fn gpu_telemetry_by_hand() {
    let r = report();
    // The cells with `gpu_*` metrics, in plan order.
    let cells: Vec<&str> = r.telemetry.iter().map(|t| t.cell.as_str()).collect();
    assert_eq!(
        cells,
        [
            "transformer.h100.preset-small",
            "transformer.a100-80gb.preset-small",
            "serve.h100x2.rate-4"
        ]
    );
    let h100 = &r.telemetry[0];
    assert_eq!(
        (h100.util_mean_pct, h100.power_mean_w, h100.energy_j),
        (Some(97.5), Some(620.0), Some(4960.0))
    );
    assert_eq!(
        (h100.energy_per_step_j, h100.energy_per_token_j),
        (Some(4.96), Some(0.0124))
    );
    assert_eq!(h100.peak_memory_bytes, Some(36.0 * (1u64 << 30) as f64));
    assert_eq!(
        (h100.sm_clock_mean_mhz, h100.temp_max_c),
        (Some(1980.0), Some(71.0))
    );
    // The serving cell has no steps: no energy per step.
    assert_eq!(r.telemetry[2].energy_per_step_j, None);
    assert_eq!(r.energy_chart_figure(), Some("energy_per_step_j"));
    assert!(r.calibration.is_empty());

    let md = render(&r, Format::Md).unwrap();
    let expect = [
        "## GPU telemetry\n\n| cell | GPU | util % | power W | energy J | J/step | mJ/token | peak memory | SM MHz | max °C |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|\n\
         | `transformer.h100.preset-small` | H100 | 97.5 | 620 | 4960 | 4.96 | 12.4 | 36 GiB | 1980 | 71 |\n\
         | `transformer.a100-80gb.preset-small` | A100-80GB | 95 | 350 | 7000 | 14 | 35 | 32 GiB | 1410 | 64 |\n\
         | `serve.h100x2.rate-4` | H100:2 | 60 | 900 | 54000 |  | 360 | 70 GiB | 1755 | 68 |\n\n",
        "mJ (millijoules) per measured token.\n",
    ];
    for e in expect {
        assert!(md.contains(e), "markdown lacks:\n{e}\n--- in ---\n{md}");
    }
    assert!(!md.contains("## Calibration"), "{md}");
    // After the cells, before the comparisons.
    let at = |s: &str| md.find(s).unwrap();
    assert!(at("## Cells") < at("## GPU telemetry") && at("## GPU telemetry") < at("## Comparisons"));

    let v: serde_json::Value = serde_json::from_str(&render(&r, Format::Json).unwrap()).unwrap();
    assert_eq!(v["telemetry"][0]["cell"], "transformer.h100.preset-small");
    assert_eq!(v["telemetry"][0]["energy_per_step_j"], 4.96);
    assert_eq!(v["telemetry"][0]["energy_per_token_j"], 0.0124);
    assert_eq!(v["telemetry"][1]["power_mean_w"], 350.0);
    assert!(v["telemetry"][2]["energy_per_step_j"].is_null());
    assert_eq!(v["telemetry"][2]["energy_per_token_j"], 0.36);
    assert!(v.get("calibration").is_none(), "{v}");
    let back: Report = serde_json::from_value(v).unwrap();
    assert_eq!(back.telemetry, r.telemetry);

    let html = render(&r, Format::Html).unwrap();
    assert_eq!(html.matches("data-chart=\"energy\"").count(), 1);
    assert!(html.contains("data-figure=\"energy_per_step_j\""));
    assert!(html.contains("<a href=\"#telemetry\">") && !html.contains("<a href=\"#calibration\">"));

    // Telemetry metrics are CSV metric columns like any other.
    let rows = parse_csv(&render(&r, Format::Csv).unwrap());
    let col = |name: &str| rows[0].iter().position(|h| h == name).unwrap();
    assert_eq!(rows[1][col("metric.gpu_energy_per_step_j")], "4.96");
    assert!(!rows[0].iter().any(|h| h.starts_with("calibration")));

    // Without per-step figures the chart shows energy per token.
    let mut run = fixture::run();
    for c in &mut run.cells {
        c.metrics.remove("gpu_energy_per_step_j");
    }
    let r = Report::build(&run, &Options::default()).unwrap();
    assert_eq!(r.energy_chart_figure(), Some("energy_per_token_j"));
    assert!(render(&r, Format::Html)
        .unwrap()
        .contains("data-figure=\"energy_per_token_j\""));
}

#[test]
fn a_run_without_telemetry_has_no_gpu_sections() {
    let r = Report::build(&fixture::without_telemetry(fixture::run()), &Options::default()).unwrap();
    assert!(r.telemetry.is_empty() && r.calibration.is_empty());
    assert_eq!(r.energy_chart_figure(), None);
    let md = render(&r, Format::Md).unwrap();
    assert!(
        !md.contains("GPU telemetry") && !md.contains("## Calibration"),
        "{md}"
    );
    let json = render(&r, Format::Json).unwrap();
    assert!(!json.contains("\"telemetry\"") && !json.contains("\"calibration\""));
    let html = render(&r, Format::Html).unwrap();
    assert!(!html.contains("data-chart=\"energy\"") && !html.contains("id=\"telemetry\""));
    let csv = render(&r, Format::Csv).unwrap();
    assert!(!csv.lines().next().unwrap().contains("calibration"));
    // An older report (no such fields) still reads.
    let back: Report = serde_json::from_str(&json).unwrap();
    assert!(back.telemetry.is_empty());
}

#[test]
fn calibration_against_expected_figures() {
    let r = Report::build(&fixture::run_with_calibration(), &Options::default()).unwrap();
    assert_eq!(r.calibration.len(), 1);
    let c = &r.calibration[0];
    assert_eq!(c.cell, "calibrate.h100");
    assert_eq!((c.model.as_deref(), c.threshold), (Some("H100"), Some(0.8)));
    assert_eq!(c.gpu_name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    let figures: Vec<(&str, f64, Option<f64>, Option<bool>)> = c
        .figures
        .iter()
        .map(|f| (f.metric.as_str(), f.measured, f.expected, f.below))
        .collect();
    assert_eq!(
        figures,
        [
            ("matmul_bf16_tflops", 700.0, Some(760.0), Some(false)),
            ("matmul_f16_tflops", 570.0, Some(760.0), Some(true)),
            ("matmul_f32_tflops", 50.0, Some(50.0), Some(false)),
            ("bandwidth_gbs", 3000.0, Some(3000.0), Some(false)),
        ]
    );
    assert!(close(c.figures[0].ratio.unwrap(), 700.0 / 760.0));
    assert_eq!(
        (c.figures[0].unit.as_str(), c.figures[3].unit.as_str()),
        ("TFLOP/s", "GB/s")
    );
    // The calibrate cell has telemetry too, without steps or tokens.
    let t = r.telemetry.last().unwrap();
    assert_eq!(
        (t.cell.as_str(), t.energy_j, t.energy_per_step_j),
        ("calibrate.h100", Some(5600.0), None)
    );

    let md = render(&r, Format::Md).unwrap();
    let expect = [
        "## Calibration\n\n| cell | GPU | figure | measured | expected | ratio | unit | check |\n|---|---|---|--:|--:|--:|---|---|\n\
         | `calibrate.h100` ⚠ | H100 (NVIDIA H100 80GB HBM3) | `matmul_bf16_tflops` | 700 | 760 | 0.921 | TFLOP/s | ok (≥ 0.8×) |\n\
         | `calibrate.h100` ⚠ | H100 (NVIDIA H100 80GB HBM3) | `matmul_f16_tflops` | 570 | 760 | 0.750 | TFLOP/s | ⚠ below 0.8× |\n\
         | `calibrate.h100` ⚠ | H100 (NVIDIA H100 80GB HBM3) | `matmul_f32_tflops` | 50 | 50 | 1.000 | TFLOP/s | ok (≥ 0.8×) |\n\
         | `calibrate.h100` ⚠ | H100 (NVIDIA H100 80GB HBM3) | `bandwidth_gbs` | 3000 | 3000 | 1.000 | GB/s | ok (≥ 0.8×) |\n",
        "| `calibrate.h100` ⚠ | H100 | 98 | 625 | 5600 |  |  | 10 GiB | 1630 | 73 |\n",
    ];
    for e in expect {
        assert!(md.contains(e), "markdown lacks:\n{e}\n--- in ---\n{md}");
    }

    let v: serde_json::Value = serde_json::from_str(&render(&r, Format::Json).unwrap()).unwrap();
    let cal = &v["calibration"][0];
    assert_eq!(cal["cell"], "calibrate.h100");
    assert_eq!(cal["threshold"], 0.8);
    assert_eq!(cal["figures"][1]["metric"], "matmul_f16_tflops");
    assert_eq!(cal["figures"][1]["ratio"], 0.75);
    assert_eq!(cal["figures"][1]["below"], true);
    assert_eq!(cal["figures"][3]["expected"], 3000.0);

    let rows = parse_csv(&render(&r, Format::Csv).unwrap());
    let col = |name: &str| {
        rows[0]
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name}"))
    };
    let cal = rows.iter().find(|x| x[1] == "calibrate.h100").unwrap();
    assert_eq!(cal[col("calibration_threshold")], "0.8");
    assert_eq!(cal[col("calibration_below")], "matmul_f16_tflops");
    assert_eq!(cal[col("calibration.matmul_f16_tflops.expected")], "760");
    assert_eq!(cal[col("calibration.matmul_f16_tflops.ratio")], "0.75");
    assert_eq!(cal[col("metric.matmul_f16_tflops")], "570");
    let other = rows.iter().find(|x| x[1] == "command.cpu").unwrap();
    assert_eq!(other[col("calibration_below")], "");

    // Measured figures without a check: no expected figure, no verdict.
    let mut run = fixture::run_with_calibration();
    run.cells.last_mut().unwrap().info.clear();
    let r = Report::build(&run, &Options::default()).unwrap();
    let f = &r.calibration[0].figures[1];
    assert_eq!((f.expected, f.ratio, f.below), (None, None, None));
    assert!(render(&r, Format::Md)
        .unwrap()
        .contains("| `matmul_f16_tflops` | 570 |  |  | TFLOP/s | no expected figure |\n"));
}

#[test]
fn a_comparison_with_a_primary_metric_ranks_its_variants_and_prints_its_rounds() {
    let mut run = fixture::run();
    let cmp = run.cells.iter_mut().find(|c| c.id == "vllm-3way.h100x2").unwrap();
    cmp.info
        .insert("primary_metric".into(), serde_json::json!("output_throughput"));
    cmp.info.insert("method".into(), serde_json::json!("student_t"));
    cmp.info
        .insert("stopped_by".into(), serde_json::json!("max_rounds"));
    cmp.info
        .insert("rounds_requested".into(), serde_json::json!("auto"));
    cmp.info.insert("seed".into(), serde_json::json!(7));
    let vars = cmp.info.get_mut("variants").unwrap();
    vars["baseline"]["values"] = serde_json::json!({"output_throughput": [490.0, 510.0]});
    vars["human"]["values"] = serde_json::json!({"output_throughput": [550.0, 570.0]});
    let rows = cmp.info.get_mut("comparison").unwrap().as_array_mut().unwrap();
    rows[0]["role"] = "primary".into();
    rows[0]["n"] = 2.into();
    rows[0]["mde"] = 0.25.into();
    rows[0]["p_value"] = 0.01.into();
    rows[1]["role"] = "secondary".into();
    rows[1]["p_value"] = 0.2.into();
    rows[1]["p_adjusted"] = 0.4.into();
    let r = Report::build(&run, &Options::default()).unwrap();
    let ranking = r
        .rankings
        .iter()
        .find(|k| k.metric == "output_throughput")
        .unwrap();
    let names: Vec<&str> = ranking.entries.iter().map(|e| e.cell.as_str()).collect();
    assert!(
        names.contains(&"vllm-3way.h100x2[human]") && names.contains(&"vllm-3way.h100x2[baseline]"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"vllm-3way.h100x2[agent]"),
        "a failed variant is not ranked"
    );
    let c = &r.comparisons[0];
    assert!(c.rows[0].primary && c.rows[0].n == Some(2) && c.rows[1].p == Some(0.4));
    let md = render(&r, Format::Md).unwrap();
    for want in [
        "primary metric output_throughput, paired log-ratios, Student t, rounds: auto, stopped by max_rounds, order seed 7",
        "| `human` vs `baseline` | `output_throughput` (primary) | 2 | 1.120 | [1.080, 1.160] | 1.120 | 25% | 0.010 | **faster** |",
        "| `human` vs `baseline` | `mean_ttft_ms` |  | 1.010 | [0.970, 1.050] | 0.990 |  | 0.400 | same |",
        "- `output_throughput` per round, `human`: 550, 570",
    ] {
        assert!(md.contains(want), "markdown lacks:\n{want}\n--- in ---\n{md}");
    }
    let html = render(&r, Format::Html).unwrap();
    assert!(html.contains("(primary)") && html.contains("per round"), "{html}");
}

#[test]
fn a_comparison_with_a_renamed_key_is_an_error_naming_the_cell() {
    let mut run = fixture::run();
    let cmp = run.cells.iter_mut().find(|c| c.id == "vllm-3way.h100x2").unwrap();
    let vars = cmp.info.get_mut("variants").unwrap();
    vars["human"]["gates"] = serde_json::json!(null);
    let e = Report::build(&run, &Options::default()).unwrap_err();
    assert!(matches!(e, ReportError::Comparison { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("`vllm-3way.h100x2`") && text.contains("`gates`"),
        "{text}"
    );
    assert!(!e.is_user_error());
}
