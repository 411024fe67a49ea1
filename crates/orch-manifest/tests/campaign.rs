//! `tasks:`: a task file's rows expanded into compare cells, and its errors
//! named by file, row line and field.

use orch_manifest::{load, ExpandOptions};
use orch_protocol::{Client, Workload};
use std::path::Path;

const SUITE: &str = r#"
name: camp
gpus: ["H100:1"]
benchmarks:
  - name: serve
    tasks: tasks.jsonl
    compare:
      repo: https://example.com/repo.git
      install: "pip install -e ."
      rounds: 3
    workload:
      server:
        command: [serve, "{{model}}", --tp, "{{gpu_count}}"]
        ready: {http: /health, port: 8000}
      client:
        loadgen: {model: "{{model}}", num_prompts: 10, input_len: 8, output_len: 8}
"#;

fn setup(dir: &Path, suite: &str, tasks: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("a.patch"), "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n").unwrap();
    std::fs::write(dir.join("tasks.jsonl"), tasks).unwrap();
    let m = dir.join("camp.yaml");
    std::fs::write(&m, suite).unwrap();
    m
}

fn opts(dir: &Path) -> ExpandOptions {
    ExpandOptions {
        patch_dir: Some(dir.join("inline")),
        ..Default::default()
    }
}

#[test]
fn rows_become_compare_cells() {
    let tmp = tempfile::tempdir().unwrap();
    let m = setup(
        tmp.path(),
        SUITE,
        r#"{"id": "c1", "base": "abc~1", "human_ref": "abc", "agent_patch": "a.patch", "model": "org/m1", "gpus": "H100:2"}
{"id": "c2", "base": "def~1", "human_patch": "a.patch", "agent_patches": ["a.patch", "a.patch"], "model": "org/m2", "install": "make", "load": {"num_prompts": 64}, "labels": {"suite": "x"}}
{"id": "c3", "base": "ghi~1", "human_ref": "ghi", "agent_patch": "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+c\n", "model": "org/m1", "repo": "other"}
"#,
    );
    let plan = load(&m, &opts(tmp.path())).unwrap();
    let ids: Vec<&str> = plan.cells.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        ["serve.h100x2.task-c1", "serve.h100.task-c2", "serve.h100.task-c3"]
    );
    // Each distinct model once, for `orch setup`.
    let models: Vec<&str> = plan.models.iter().map(|m| m.repo.as_str()).collect();
    assert_eq!(models, ["org/m1", "org/m2"]);
    let cmp = |i: usize| match &plan.cells[i].task.workload {
        Workload::Compare(c) => c.clone(),
        w => panic!("{w:?}"),
    };
    let c1 = cmp(0);
    let names: Vec<&str> = c1.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["baseline", "human", "agent"]);
    assert_eq!(c1.variants[0].git_ref.as_deref(), Some("abc~1"));
    assert_eq!(c1.variants[1].git_ref.as_deref(), Some("abc"));
    assert_eq!(c1.variants[2].git_ref.as_deref(), Some("abc~1"));
    assert!(c1.variants[2].patch.as_deref().unwrap().ends_with("a.patch"));
    assert_eq!(c1.variants[0].install.as_deref(), Some("pip install -e ."));
    assert_eq!(c1.server.argv, ["serve", "org/m1", "--tp", "2"]);
    let c2 = cmp(1);
    let names: Vec<&str> = c2.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["baseline", "human", "agent-1", "agent-2"]);
    assert_eq!(
        c2.variants[1].git_ref.as_deref(),
        Some("def~1"),
        "a human patch goes on the base"
    );
    assert_eq!(c2.variants[3].install.as_deref(), Some("make"));
    match &c2.server.client {
        Some(Client::Loadgen(l)) => {
            assert_eq!(l.num_prompts, 64);
            assert_eq!(l.model.as_deref(), Some("org/m2"));
        }
        c => panic!("{c:?}"),
    }
    let info = plan.cells[1].campaign.as_ref().unwrap();
    assert_eq!(info.agents, ["agent-1", "agent-2"]);
    assert_eq!(info.labels["suite"], "x");
    let c3 = cmp(2);
    assert!(c3.repo.as_deref().unwrap().ends_with("/other"));
    let inline = c3.variants[2].patch.as_deref().unwrap();
    assert!(std::fs::read_to_string(inline).unwrap().contains("+c"));
    // `--gpu` overrides every row.
    let plan = load(
        &m,
        &ExpandOptions {
            gpus: Some(orch_manifest::GpuSpec::parse_list("none").unwrap()),
            ..opts(tmp.path())
        },
    )
    .unwrap();
    assert!(plan.cells.iter().all(|c| c.gpu.count == 0));
}

#[test]
fn errors_name_the_task_file_row_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let err = |suite: &str, tasks: &str| {
        let m = setup(tmp.path(), suite, tasks);
        load(&m, &opts(tmp.path())).unwrap_err().to_string()
    };
    let row1 = "{\"id\": \"c1\", \"human_ref\": \"x\", \"model\": \"org/m\"}\n";
    let e = err(SUITE, &format!("{row1}{{\"id\": \"c2\", \"human_ref\": \"x\", \"model\": \"org/m\", \"load\": {{\"num_promts\": 3}}}}\n"));
    assert!(
        e.contains("tasks.jsonl:2:1: task row 2: `load.num_promts` is not a load generator field"),
        "{e}"
    );
    let e = err(
        SUITE,
        &format!("{row1}{{\"id\": \"c2\", \"human_ref\": \"x\", \"gpus\": \"H100:0x\"}}\n"),
    );
    assert!(e.contains("tasks.jsonl:2:1: task row 2: `gpus` `H100:0x`"), "{e}");
    // A row without a model leaves `{{model}}` unfilled: the cell is named.
    let e = err(SUITE, "{\"id\": \"c1\", \"human_ref\": \"x\"}\n");
    assert!(
        e.contains("cell `serve.h100.task-c1`") && e.contains("`{{model}}`"),
        "{e}"
    );
    let with_variants = SUITE.replace(
        "      rounds: 3\n",
        "      rounds: 3\n      variants: [{name: a}, {name: b}]\n",
    );
    let e = err(&with_variants, row1);
    assert!(e.contains("`variants` and `tasks` together"), "{e}");
    let e = err(&SUITE.replace("tasks: tasks.jsonl", "tasks: nope.jsonl"), row1);
    assert!(e.contains("nope.jsonl: cannot read the task file"), "{e}");
    let no_compare =
        "name: c\nbenchmarks:\n  - name: s\n    tasks: tasks.jsonl\n    workload: {noop: true}\n";
    let e = err(no_compare, row1);
    assert!(e.contains("`tasks` fill a `compare` template"), "{e}");
}
