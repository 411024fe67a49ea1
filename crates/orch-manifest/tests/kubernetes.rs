//! The `kubernetes:` section is checked at parse time with the API
//! server's own rules: each mistake names its field, its line and column,
//! and ends with a hint.

use orch_manifest::{load_str, ExpandOptions};
use std::path::Path;

/// A suite whose `kubernetes:` section is `section` (block YAML, indented
/// two spaces, from line 3).
fn suite(section: &str) -> String {
    format!("name: x\nkubernetes:\n{section}benchmarks:\n  - name: a\n    workload: {{noop: true}}\n")
}

/// The error of a section; asserts the line and column, the field and a hint.
fn err(section: &str, line: u64, field: &str) -> String {
    let e = load_str(
        &suite(section),
        Path::new("suite.yaml"),
        &ExpandOptions::default(),
    )
    .expect_err("the section is wrong")
    .to_string();
    assert!(e.starts_with(&format!("suite.yaml:{line}:")), "{e}");
    assert!(e.contains(&format!("`kubernetes.{field}")), "{e}");
    assert!(e.contains("\nhint: "), "{e}");
    e
}

fn ok(section: &str) -> orch_manifest::KubernetesDef {
    load_str(
        &suite(section),
        Path::new("suite.yaml"),
        &ExpandOptions::default(),
    )
    .unwrap()
    .kubernetes
    .unwrap()
}

#[test]
fn a_valid_section_reaches_the_plan_with_its_new_timeout() {
    let k = ok("  namespace: team-a\n  node_selector: {cloud.google.com/gke-accelerator: nvidia-h100-80gb, pool: \"\"}\n  tolerations:\n    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n    - {operator: Exists}\n    - {key: dedicated, operator: Equal, value: gpu}\n  service_account: bench.runner\n  runtime_class: nvidia\n  image_pull_secrets: [regcred]\n  gpu_label: nvidia.com/gpu.product\n  gpu_types: {H100: [NVIDIA-H100-80GB-HBM3]}\n  cpu: 500m\n  unschedulable_grace: 2m\n  scale_up_timeout: 20m\n");
    assert_eq!(k.namespace.as_deref(), Some("team-a"));
    assert_eq!(k.node_selector["pool"], "");
    assert_eq!(k.tolerations.len(), 3);
    assert_eq!(k.image_pull_secrets, vec!["regcred".to_string()]);
    assert_eq!(k.gpu_types["H100"], vec!["NVIDIA-H100-80GB-HBM3".to_string()]);
    assert_eq!(k.cpu.as_deref(), Some("500m"));
    assert_eq!(k.scale_up_timeout.map(|s| s.0), Some(1200.0));
    assert_eq!(k.unschedulable_grace.map(|s| s.0), Some(120.0));
}

#[test]
fn a_node_selector_key_must_be_a_qualified_name() {
    let e = err("  node_selector:\n    \"gpu type\": h100\n", 4, "node_selector");
    assert!(e.contains("`gpu type` is not a label key"), "{e}");
    let e = err(
        "  node_selector:\n    Example.COM/pool: h100\n",
        4,
        "node_selector",
    );
    assert!(e.contains("prefix"), "{e}");
}

#[test]
fn a_node_selector_value_must_be_a_label_value() {
    let e = err(
        "  node_selector:\n    pool: \"h100 80gb\"\n",
        4,
        "node_selector.pool",
    );
    assert!(e.contains("`h100 80gb` is not a label value"), "{e}");
}

#[test]
fn a_toleration_with_exists_has_no_value() {
    let e = err(
        "  tolerations:\n    - {key: gpu, operator: Exists, value: yes}\n",
        4,
        "tolerations",
    );
    assert!(e.contains("`operator: Exists` takes no value"), "{e}");
}

#[test]
fn a_toleration_without_key_must_be_exists() {
    let e = err(
        "  tolerations:\n    - {value: gpu, effect: NoSchedule}\n",
        4,
        "tolerations",
    );
    assert!(e.contains("without `key` must have `operator: Exists`"), "{e}");
}

#[test]
fn a_toleration_key_must_be_a_qualified_name_and_its_effect_known() {
    let e = err(
        "  tolerations:\n    - {key: \"my taint\", operator: Exists}\n",
        4,
        "tolerations",
    );
    assert!(e.contains("key `my taint` is not a taint key"), "{e}");
    let e = err(
        "  tolerations:\n    - {key: gpu, operator: Exists, effect: NoSchedul}\n",
        4,
        "tolerations",
    );
    assert!(e.contains("effect `NoSchedul` is not a taint effect"), "{e}");
    let e = err(
        "  tolerations:\n    - {key: gpu, operator: In}\n",
        4,
        "tolerations",
    );
    assert!(e.contains("operator `In`"), "{e}");
}

#[test]
fn service_account_and_runtime_class_are_dns_subdomains() {
    let e = err("  service_account: Bench_Runner\n", 3, "service_account");
    assert!(e.contains("`Bench_Runner` is not an object name"), "{e}");
    let e = err("  runtime_class: NVIDIA\n", 3, "runtime_class");
    assert!(e.contains("`NVIDIA` is not an object name"), "{e}");
}

#[test]
fn image_pull_secret_names_are_dns_subdomains() {
    let e = err(
        "  image_pull_secrets:\n    - regcred\n    - Reg_Cred\n",
        5,
        "image_pull_secrets",
    );
    assert!(e.contains("`Reg_Cred` is not an object name"), "{e}");
}

#[test]
fn cpu_is_a_kubernetes_quantity() {
    let e = err("  cpu: \"8 cores\"\n", 3, "cpu");
    assert!(
        e.contains("`8 cores` is not a CPU quantity") && e.contains("`500m`"),
        "{e}"
    );
    err("  cpu: \"-2\"\n", 3, "cpu");
}

#[test]
fn gpu_types_lists_and_values_are_not_empty() {
    let e = err("  gpu_types:\n    H100: []\n", 4, "gpu_types.H100");
    assert!(e.contains("lists no label value"), "{e}");
    let e = err("  gpu_types:\n    H100: [\"\"]\n", 4, "gpu_types.H100");
    assert!(e.contains("it is empty"), "{e}");
    let e = err("  gpu_types:\n    H100: [\"H100 SXM\"]\n", 4, "gpu_types.H100");
    assert!(e.contains("`H100 SXM` is not a label value"), "{e}");
}

#[test]
fn gpu_label_is_a_label_key_and_namespace_a_dns_label() {
    let e = err("  gpu_label: \"gpu product\"\n", 3, "gpu_label");
    assert!(e.contains("is not a label key"), "{e}");
    let e = err("  namespace: Team_A\n", 3, "namespace");
    assert!(e.contains("`Team_A` is not a namespace name"), "{e}");
}

#[test]
fn gpu_affinity_is_auto_required_or_off() {
    assert_eq!(ok("  namespace: a\n").gpu_affinity, None);
    for (text, want) in [
        ("auto", orch_manifest::GpuAffinity::Auto),
        ("required", orch_manifest::GpuAffinity::Required),
        ("off", orch_manifest::GpuAffinity::Off),
    ] {
        assert_eq!(ok(&format!("  gpu_affinity: {text}\n")).gpu_affinity, Some(want));
    }
    let e = load_str(
        &suite("  gpu_affinity: sometimes\n"),
        Path::new("suite.yaml"),
        &ExpandOptions::default(),
    )
    .expect_err("not a choice")
    .to_string();
    assert!(e.starts_with("suite.yaml:3:") && e.contains("sometimes"), "{e}");
}
