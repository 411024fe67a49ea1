//! Hostile manifests are refused before they cost anything, with the
//! `file:line:column` and the reason in our words (issue 30).

use orch_manifest::{load, load_str, ExpandOptions, ManifestError};
use std::path::Path;

fn err(text: &str) -> String {
    let e = load_str(text, Path::new("suite.yaml"), &ExpandOptions::default())
        .expect_err("the manifest must be refused")
        .to_string();
    // Shown with `--nocapture`: the messages as users read them.
    eprintln!("{e}\n");
    e
}

/// A 10^10-cell matrix: ten axes of ten values.
fn bomb_matrix(extra: &str) -> String {
    let mut axes = String::new();
    for a in 0..10 {
        axes.push_str(&format!("      p{a}: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"));
    }
    format!("name: bomb\n{extra}benchmarks:\n  - name: b\n    workload: {{command: [\"true\"]}}\n    matrix:\n{axes}")
}

#[test]
fn a_matrix_of_ten_billion_cells_is_refused_before_it_is_expanded() {
    let text = bomb_matrix("");
    assert!(text.len() < 2000, "a small file: {}", text.len());
    // Expanding 10^10 cells would take hundreds of GB: an answer at all
    // means the count came first.
    let e = err(&text);
    assert!(e.contains("10000000000 cells"), "{e}");
    assert!(e.contains("limit of 100000"), "{e}");
    assert!(e.contains("hint:") && e.contains("max_cells"), "{e}");
    assert!(e.starts_with("suite.yaml:6:"), "located at the matrix: {e}");
}

#[test]
fn the_cell_limit_counts_gpus_and_every_benchmark_and_can_be_raised() {
    let text = r#"
name: s
max_cells: 11
gpus: [H100, A100]
benchmarks:
  - name: a
    workload: {command: ["true"]}
    matrix: {x: [1, 2, 3]}
  - name: b
    workload: {command: ["true"]}
    matrix: {x: [1, 2, 3]}
"#;
    let e = err(text);
    assert!(e.contains("expands to 12 cells"), "{e}");
    assert!(e.contains("limit of 11"), "{e}");
    let ok = text.replace("max_cells: 11", "max_cells: 12");
    let plan = load_str(&ok, Path::new("suite.yaml"), &ExpandOptions::default()).unwrap();
    assert_eq!(plan.cells.len(), 12);
}

#[test]
fn a_cell_count_past_u64_does_not_overflow() {
    let mut axes = String::new();
    for a in 0..25 {
        axes.push_str(&format!("      p{a}: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"));
    }
    let text = format!(
        "name: s\nbenchmarks:\n  - name: b\n    workload: {{command: [\"true\"]}}\n    matrix:\n{axes}"
    );
    let e = err(&text);
    assert!(e.contains("more than 18446744073709551615 cells"), "{e}");
}

#[test]
fn a_huge_duration_is_refused_at_its_line_and_column() {
    let text = "name: s\nmeasure:\n  timeout: 18446744073709551615\nbenchmarks:\n  - name: b\n    workload: {command: [\"true\"]}\n";
    let e = err(text);
    assert!(e.starts_with("suite.yaml:3:"), "{e}");
    assert!(e.contains("too long") && e.contains("30 days"), "{e}");
    for v in ["\"18446744073709551615s\"", "31d", "1e300", "99999999999h"] {
        let e = err(&text.replace("18446744073709551615", v));
        assert!(e.starts_with("suite.yaml:3:"), "{v}: {e}");
    }
    // 30 days is allowed.
    let ok = text.replace("18446744073709551615", "30d");
    load_str(&ok, Path::new("suite.yaml"), &ExpandOptions::default()).unwrap();
}

#[test]
fn a_huge_size_is_refused_at_its_line_and_column() {
    let text = "name: s\nmemory_limit: 18446744073709551615\nbenchmarks:\n  - name: b\n    workload: {command: [\"true\"]}\n";
    let e = err(text);
    assert!(e.starts_with("suite.yaml:2:"), "{e}");
    assert!(e.contains("too large") && e.contains("1 PiB"), "{e}");
    let e = err(&text.replace("18446744073709551615", "99999999999TB"));
    assert!(e.contains("too large"), "{e}");
}

#[test]
fn a_long_benchmark_name_is_refused_with_the_real_limit() {
    let name = "b".repeat(300);
    let text = format!("name: s\nbenchmarks:\n  - name: {name}\n    workload: {{command: [\"true\"]}}\n");
    let e = err(&text);
    assert!(e.starts_with("suite.yaml:3:"), "{e}");
    assert!(
        e.contains("is 300 bytes long") && e.contains("most is 200"),
        "{e}"
    );
    assert!(!e.contains("`..`"), "the reason, not a hint about `..`: {e}");
    // A name under the limit whose cell id is over it.
    let name = "b".repeat(190);
    let text = format!(
        "name: s\nbenchmarks:\n  - name: {name}\n    workload: {{command: [\"true\"]}}\n    matrix: {{size: [large-value-here]}}\n"
    );
    let e = err(&text);
    assert!(e.contains("cell id") && e.contains("most is 200"), "{e}");
    let e = err("name: s\nbenchmarks:\n  - name: '..'\n    workload: {command: [\"true\"]}\n");
    assert!(e.contains("is not a name"), "{e}");
}

#[test]
fn an_alias_bomb_is_refused_in_our_words() {
    // Billion laughs: each level nine aliases of the one before, where the
    // schema reads them (matrix values are any YAML).
    let mut text = String::from(
        "name: s\nbenchmarks:\n  - name: b\n    workload: {command: [\"true\"]}\n    matrix:\n      x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
    );
    for i in 1..10 {
        let p = i - 1;
        text.push_str(&format!(
            "      x{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    let e = err(&text);
    assert!(e.contains("too many aliases/nodes"), "{e}");
    assert!(!e.contains("budget breached") && !e.contains("Nodes {"), "{e}");
    assert!(e.contains("hint:"), "{e}");
    assert!(e.starts_with("suite.yaml"), "{e}");
}

#[test]
fn a_duplicated_key_is_named_with_its_location() {
    let text = "name: s\nbenchmarks:\n  - name: b\n    workload: {command: [\"true\"]}\n    name: c\n";
    let e = err(text);
    assert!(e.contains("duplicate key `name`"), "{e}");
    assert!(!e.contains("DuplicateKeyPolicy"), "{e}");
    assert!(e.starts_with("suite.yaml:5:"), "{e}");
}

#[test]
fn an_oversized_file_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let mut text = String::from("name: s\n");
    while (text.len() as u64) <= orch_manifest::MAX_MANIFEST_BYTES {
        text.push_str(&format!("# {}\n", "x".repeat(1000)));
    }
    std::fs::write(&path, text).unwrap();
    let e = load(&path, &ExpandOptions::default()).unwrap_err();
    assert!(matches!(e, ManifestError::Invalid { .. }));
    assert!(e.to_string().contains("larger than 16 MiB"), "{e}");
}
