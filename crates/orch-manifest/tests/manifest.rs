use orch_manifest::{load_str, ExpandOptions, GpuSpec, ManifestError};
use orch_protocol::{BuiltinWorkload, Workload};
use std::path::Path;

fn load(text: &str) -> Result<orch_manifest::Plan, ManifestError> {
    load_str(text, Path::new("suite.yaml"), &ExpandOptions::default())
}

const GOOD: &str = r#"
name: sweep
gpus: [H100, "a100-80gb:2"]
measure:
  warmup: 1
  repetitions: 3
  timeout: 5m
env:
  SUITE: "1"
benchmarks:
  - name: lm
    workload:
      transformer:
        context: 64
        batch: 2
    matrix:
      preset: [nano, tiny]
      pass: [forward, train]
    exclude:
      - {preset: tiny, gpu: "A100-80GB:2"}
  - name: hello
    gpus: [none]
    env:
      WHO: "{{cell}}"
    workload:
      command: [echo, "bs={{gpu_count}}"]
"#;

#[test]
fn expands_matrix_with_stable_ids() {
    let plan = load(GOOD).unwrap();
    let ids: Vec<&str> = plan.cells.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            "lm.h100.pass-forward.preset-nano",
            "lm.h100.pass-forward.preset-tiny",
            "lm.h100.pass-train.preset-nano",
            "lm.h100.pass-train.preset-tiny",
            "lm.a100-80gbx2.pass-forward.preset-nano",
            "lm.a100-80gbx2.pass-train.preset-nano",
            "hello.cpu",
        ]
    );
    let again = load(GOOD).unwrap();
    assert_eq!(plan, again);
    let lm = &plan.cells[1];
    assert_eq!(lm.task.measure.repetitions, 3);
    assert_eq!(lm.task.measure.timeout_s, 300.0);
    match &lm.task.workload {
        Workload::Builtin(BuiltinWorkload::Transformer(t)) => {
            assert_eq!(t.preset.as_deref(), Some("tiny"));
            assert_eq!(t.context, Some(64));
        }
        w => panic!("unexpected {w:?}"),
    }
    let hello = plan.cells.last().unwrap();
    assert_eq!(hello.task.env.get("WHO").map(String::as_str), Some("hello.cpu"));
    assert_eq!(hello.task.env.get("SUITE").map(String::as_str), Some("1"));
    match &hello.task.workload {
        Workload::Command(c) => assert_eq!(c.argv, vec!["echo", "bs=0"]),
        w => panic!("unexpected {w:?}"),
    }
}

#[test]
fn gpu_override_replaces_every_list() {
    let opts = ExpandOptions {
        gpus: Some(GpuSpec::parse_list("L4:2").unwrap()),
        ..Default::default()
    };
    let plan = load_str(GOOD, Path::new("suite.yaml"), &opts).unwrap();
    assert!(plan.cells.iter().all(|c| c.gpu.to_string() == "L4:2"));
    assert!(plan.cells.iter().any(|c| c.id == "hello.l4x2"));
}

fn err(text: &str) -> String {
    load(text).unwrap_err().to_string()
}

#[test]
fn unknown_field_names_field_line_and_hint() {
    let text =
        "name: s\nbenchmarks:\n  - name: a\n    workload:\n      noop: true\n    measure:\n      warmpu: 3\n";
    let e = load(text).unwrap_err();
    assert_eq!(e.line(), Some(7), "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with("suite.yaml:7:"), "{msg}");
    assert!(msg.contains("unknown field `warmpu`"), "{msg}");
    assert!(msg.contains("hint: did you mean `warmup`?"), "{msg}");
}

#[test]
fn wrong_type_and_bad_gpu_are_located() {
    let e =
        err("name: s\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n    measure: {warmup: lots}\n");
    assert!(e.starts_with("suite.yaml:5:"), "{e}");
    let e = err("name: s\ngpus: [H100, X9000:2]\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n");
    assert!(e.starts_with("suite.yaml:2:"), "{e}");
    assert!(
        e.contains("unknown GPU type `X9000`") && e.contains("H100"),
        "{e}"
    );
    assert!(e.contains("hint: GPU specs are"), "{e}");
    let e = err("name: s\ngpus: [\"H100:0\"]\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n");
    assert!(e.contains("invalid GPU count `0`"), "{e}");
}

#[test]
fn semantic_errors_are_located() {
    let e = err("name: s\nbenchmarks:\n  - name: a\n    workload:\n      noop: true\n      shell: echo\n");
    assert!(
        e.starts_with("suite.yaml:5:") || e.starts_with("suite.yaml:4:"),
        "{e}"
    );
    assert!(e.contains("several workloads"), "{e}");
    let e = err("name: s\nbenchmarks:\n  - name: a\n    workload: {shell: 'echo {{sise}}'}\n    matrix: {size: [1]}\n");
    assert!(e.contains("unknown placeholder `{{sise}}`"), "{e}");
    let e = err("name: s\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n  - name: a\n    workload: {noop: true}\n");
    assert!(e.starts_with("suite.yaml:5:"), "{e}");
    let e = err(
        "name: s\nbenchmarks:\n  - name: a\n    workload: {transformer: {}}\n    matrix: {batch: [big]}\n",
    );
    assert!(e.contains("does not fit the transformer"), "{e}");
    let e = err("name: bad name\nbenchmarks: []\n");
    assert!(e.starts_with("suite.yaml:1:"), "{e}");
}

#[test]
fn shipped_manifests_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) == Some("yaml") {
            orch_manifest::load(&path, &ExpandOptions::default()).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 1);
}

#[test]
fn compare_workloads_get_template_values() {
    let text = r#"
name: c
benchmarks:
  - name: cmp
    compare:
      rounds: 3
      variants: [{name: a}, {name: b}]
    matrix: {port: [8100]}
    workload:
      server: {command: [python3, server.py, "{{port}}"], ready: {tcp: 8100}}
      client: {shell: "curl localhost:{{port}}"}
"#;
    let plan = load(text).unwrap();
    match &plan.cells[0].task.workload {
        Workload::Compare(c) => {
            assert_eq!(c.server.argv, vec!["python3", "server.py", "8100"]);
            match &c.server.client {
                Some(orch_protocol::Client::Command(cmd)) => assert_eq!(cmd.argv[2], "curl localhost:8100"),
                other => panic!("unexpected client {other:?}"),
            }
        }
        w => panic!("unexpected {w:?}"),
    }
}

fn compare_manifest(fields: &str) -> String {
    format!(
        r#"
name: c
benchmarks:
  - name: cmp
    compare:
{fields}
      variants: [{{name: a}}, {{name: b}}]
    workload:
      server: {{command: [python3, server.py], ready: {{tcp: 8100}}}}
      client: {{shell: "true"}}
"#
    )
}

fn compare_of(text: &str) -> orch_protocol::CompareWorkload {
    match load(text).unwrap().cells.remove(0).task.workload {
        Workload::Compare(c) => c,
        w => panic!("unexpected {w:?}"),
    }
}

#[test]
fn compare_rounds_auto_primary_metric_and_seed() {
    let c = compare_of(&compare_manifest("      rounds: 5"));
    assert_eq!(
        (c.rounds, c.max_rounds, c.primary_metric, c.seed),
        (5, None, None, None)
    );
    let c = compare_of(&compare_manifest("      rounds: auto"));
    assert_eq!((c.rounds, c.max_rounds), (3, Some(12)));
    let c = compare_of(&compare_manifest(
        "      rounds: auto\n      max_rounds: 30\n      primary_metric: mean_tpot_ms\n      seed: 7",
    ));
    assert_eq!(
        (c.rounds, c.max_rounds, c.primary_metric.as_deref(), c.seed),
        (3, Some(30), Some("mean_tpot_ms"), Some(7))
    );
}

#[test]
fn compare_round_errors_name_the_field() {
    for (fields, want) in [
        ("      rounds: sometimes", "invalid `rounds` `sometimes`"),
        (
            "      rounds: 4\n      max_rounds: 9",
            "`max_rounds` is only for `rounds: auto`",
        ),
        (
            "      rounds: auto\n      max_rounds: 2",
            "`max_rounds` must be at least 3",
        ),
        ("      rounds: 1", "`rounds` must be at least 2"),
        ("      primary_metric: \" \"", "`primary_metric` is empty"),
    ] {
        let e = err(&compare_manifest(fields));
        assert!(e.contains(want), "{fields}: {e}");
        assert!(e.contains("hint:") || e.contains("suite.yaml:"), "{e}");
    }
}
#[test]
fn slurm_section_and_nodes_reach_the_plan() {
    let plan = load(
        r#"
name: cluster
slurm:
  partition: gpu
  account: lab
  extra_args: ["--exclusive"]
  max_pending: 30m
  gpu_types: {H100: h100_80gb}
benchmarks:
  - name: ddp
    nodes: 2
    gpus: ["H100:8"]
    workload: {shell: "true"}
  - name: one
    workload: {shell: "true"}
"#,
    )
    .unwrap();
    let s = plan.slurm.as_ref().unwrap();
    assert_eq!(s.partition.as_deref(), Some("gpu"));
    assert_eq!(s.max_pending.map(|d| d.0), Some(1800.0));
    assert_eq!(s.gpu_types["H100"], "h100_80gb");
    assert_eq!(plan.cells[0].nodes, 2);
    assert_eq!(plan.cells[1].nodes, 1);
    // The plan (stored with a run) keeps both through JSON.
    let back: orch_manifest::Plan = serde_json::from_str(&serde_json::to_string(&plan).unwrap()).unwrap();
    assert_eq!(back, plan);
}

#[test]
fn slurm_mistakes_are_named() {
    let e = load("name: x\nslurm: {partitoin: gpu}\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("suite.yaml:2:") && e.contains("partitoin"), "{e}");
    let e = load(
        "name: x\nslurm: {extra_args: [exclusive]}\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`exclusive` is not an option") && e.contains("hint:"),
        "{e}"
    );
    let e =
        load("name: x\nslurm: {gpu_request: tres}\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n")
            .unwrap_err()
            .to_string();
    assert!(e.contains("`tres`") && e.contains("hint:"), "{e}");
    let e = load("name: x\nbenchmarks:\n  - name: a\n    nodes: 0\n    workload: {noop: true}\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`nodes` must be at least 1") && e.contains("hint:"),
        "{e}"
    );
}

/// What must travel with a cell: the shipped 3-way comparison names its
/// local repository and its two patches as host paths (issue 28 ships them;
/// today only the local backend can read them).
#[test]
fn the_standin_comparison_names_its_repo_and_patches_as_host_paths() {
    use orch_protocol::paths::PathRole;
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/seed-threeway-standin.yaml");
    let plan = orch_manifest::load(&file, &ExpandOptions::default()).unwrap();
    let paths = plan.cells[0].task.local_paths();
    let roles: Vec<PathRole> = paths.iter().map(|(r, _)| *r).collect();
    assert!(roles.contains(&PathRole::Repo), "{paths:?}");
    assert_eq!(
        roles.iter().filter(|r| **r == PathRole::Patch).count(),
        2,
        "{paths:?}"
    );
    for (_, p) in &paths {
        assert!(Path::new(p).is_absolute() && Path::new(p).exists(), "{p}");
    }
}
