//! The shipped seed suites (`manifests/seed-*.yaml`): every one plans, the
//! vLLM 3-way gets its weights from `orch setup` after a gated-repo check, and
//! their CPU-capable parts run end to end at toy sizes: the builtin side of
//! `seed-sizes` with its OOM rows, and the 3-way comparison of
//! `seed-threeway-standin` with the stand-in server on NumPy. The toy runs use
//! the shipped manifest with only its sizes, GPU list and paths rewritten, and
//! assert that each rewrite matched.

use crate::support::{json, numpy_or_skip, orch_without_hub_token, text};
use orch_testkit::fixtures::{write_test_model, ModelOptions};
use orch_testkit::hub::HubServer;
use orch_testkit::skip;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root, canonical: the stand-in's `repo:` is rewritten to it.
fn repo() -> PathBuf {
    crate::support::repo().canonicalize().unwrap()
}

/// [`orch_without_hub_token`] with no prices file of this machine's user.
fn orch() -> Command {
    let mut c = orch_without_hub_token();
    c.env_remove("ORCH_PRICES");
    c
}

fn seed_manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo().join("manifests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("seed-") && name.ends_with(".yaml")
        })
        .collect();
    v.sort();
    v
}

/// `text` with `from` replaced by `to`, which must occur.
fn rewrite(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "the manifest no longer contains {from:?}");
    text.replace(from, to)
}

/// A copy of a shipped manifest, rewritten, in `tmp/manifests/` beside an
/// `examples` link to the repository's, so relative paths resolve the same.
fn toy_manifest(tmp: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("manifests").join(name)).unwrap();
    let dir = tmp.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let link = tmp.join("examples");
    if !link.exists() {
        std::os::unix::fs::symlink(repo().join("examples"), &link).unwrap();
    }
    let path = dir.join(name);
    std::fs::write(&path, edit(text)).unwrap();
    path
}

#[test]
fn every_seed_suite_plans() {
    let tmp = tempfile::tempdir().unwrap();
    let manifests = seed_manifests();
    let names: Vec<String> = manifests
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "seed-frameworks",
        "seed-threeway",
        "seed-threeway-standin",
        "seed-vision",
        "seed-sizes",
        "seed-multigpu",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    for m in &manifests {
        let out = orch()
            .arg("--store")
            .arg(tmp.path().join("store"))
            .args(["plan", "--json", "--weights-dir"])
            .arg(tmp.path().join("weights"))
            .arg("-f")
            .arg(m)
            .output()
            .unwrap();
        let v = json(&out);
        let cells = v["cells"].as_array().unwrap();
        assert!(!cells.is_empty(), "{}: no cells", m.display());
        let models = v["models"].as_array().unwrap();
        // Only a missing model (the vLLM suite's weights, not set up here) may
        // make the plan not ready.
        let missing = models.iter().any(|m| m["complete"] == false);
        assert_eq!(v["ready"], !missing, "{}: {}", m.display(), text(&out));
        assert_eq!(
            out.status.code(),
            Some(if missing { 1 } else { 0 }),
            "{}",
            text(&out)
        );
    }
}

#[test]
fn seed_threeway_weights_come_from_setup_after_the_gated_check() {
    const TOKEN: &str = "hf_seedThreewayToken42";
    let tmp = tempfile::tempdir().unwrap();
    let manifest = repo().join("manifests/seed-threeway.yaml");
    let text_m = std::fs::read_to_string(&manifest).unwrap();
    let repo_id = "meta-llama/Llama-3.1-8B-Instruct";
    assert!(text_m.contains(&format!("repo: {repo_id}")));
    let root = tmp.path().join("hub");
    write_test_model(&root, repo_id, &ModelOptions::tiny().gated(TOKEN)).unwrap();
    let hub = HubServer::builder(&root).gated(repo_id, TOKEN).start().unwrap();
    let weights = tmp.path().join("weights");
    let setup = |token: Option<&str>| {
        let mut c = orch();
        c.env("HF_ENDPOINT", hub.endpoint());
        if let Some(t) = token {
            c.env("HF_TOKEN", t);
        }
        c.args(["setup", "--weights-dir"])
            .arg(&weights)
            .arg("-f")
            .arg(&manifest)
            .output()
            .unwrap()
    };
    let plan = || {
        orch()
            .arg("--store")
            .arg(tmp.path().join("store"))
            .args(["plan", "--json", "--weights-dir"])
            .arg(&weights)
            .arg("-f")
            .arg(&manifest)
            .output()
            .unwrap()
    };

    let out = plan();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(json(&out)["ready"], false);

    // No access to the gated repository: refused before any download.
    let out = setup(None);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains(repo_id) && text(&out).contains("hint:"),
        "{}",
        text(&out)
    );

    let out = setup(Some(TOKEN));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains(TOKEN));
    let out = plan();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(json(&out)["ready"], true);
}

#[test]
fn seed_sizes_builtin_side_runs_at_toy_sizes_and_records_oom_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let path = toy_manifest(tmp.path(), "seed-sizes.yaml", |t| {
        // Keep the builtin benchmark only (the PyTorch one needs a GPU), on
        // the CPU, at one toy size and the two sizes the 16 GiB limit refuses.
        let head_end = t.find("benchmarks:").unwrap();
        let builtin = t.find("  - name: builtin").unwrap();
        let t = format!("{}benchmarks:\n{}", &t[..head_end], &t[builtin..]);
        let t = rewrite(&t, "gpus: [H100]", "gpus: [none]");
        let t = rewrite(
            &t,
            "measure: {warmup: 5, repetitions: 10, timeout: 15m}",
            "measure: {warmup: 1, repetitions: 3, timeout: 2m}",
        );
        // The document's context (512) and batch: xl and 2.7B exceed the
        // 16 GiB limit there (a toy context would let xl fit).
        rewrite(
            &t,
            "preset: [small, medium, large, xl, 2.7B]",
            "preset: [nano, xl, 2.7B]",
        )
    });
    let out = orch()
        .arg("--store")
        .arg(tmp.path().join("store"))
        .args(["run", "--json", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "oom cells are not successes: {}",
        text(&out)
    );
    let v = json(&out);
    let cells = v["cells"].as_array().unwrap();
    let status = |id: &str| {
        cells
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no cell {id}: {v}"))["status"]
            .clone()
    };
    assert_eq!(status("builtin.cpu.preset-nano"), "succeeded");
    assert_eq!(status("builtin.cpu.preset-xl"), "oom");
    assert_eq!(status("builtin.cpu.preset-2.7b"), "oom");
    let xl = cells.iter().find(|c| c["id"] == "builtin.cpu.preset-xl").unwrap();
    assert_eq!(xl["diagnosis"]["kind"], "memory_estimate_exceeded", "{xl}");
    let nano = cells
        .iter()
        .find(|c| c["id"] == "builtin.cpu.preset-nano")
        .unwrap();
    for k in ["step_time_mean_ms", "step_time_cv_pct", "tokens_per_s"] {
        assert!(nano["metrics"][k].as_f64().unwrap() > 0.0, "{k}: {nano}");
    }
}

#[test]
fn a_command_that_runs_out_of_cuda_memory_is_recorded_oom_and_the_sweep_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = tmp.path().join("suite.yaml");
    std::fs::write(
        &suite,
        r#"
name: oom-sweep
benchmarks:
  - name: train
    workload:
      shell: |
        if [ "{{size}}" = big ]; then
          echo "Traceback (most recent call last):" >&2
          echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 15.70 GiB of which 1.06 GiB is free." >&2
          exit 1
        fi
        echo "ORCH_METRIC tokens_per_s=10"
    matrix:
      size: [small, big, small2]
"#,
    )
    .unwrap();
    let out = orch()
        .arg("--store")
        .arg(tmp.path().join("store"))
        .args(["run", "--json", "-f"])
        .arg(&suite)
        .output()
        .unwrap();
    let v = json(&out);
    let cells = v["cells"].as_array().unwrap();
    let cell = |id: &str| cells.iter().find(|c| c["id"] == id).unwrap().clone();
    let big = cell("train.cpu.size-big");
    assert_eq!(big["status"], "oom", "{big}");
    assert_eq!(big["diagnosis"]["kind"], "cuda_oom", "{big}");
    assert_eq!(big["failure"]["kind"], "oom", "{big}");
    assert_eq!(big["failure"]["exit_code"], 1, "{big}");
    assert_eq!(cell("train.cpu.size-small")["status"], "succeeded");
    assert_eq!(cell("train.cpu.size-small2")["status"], "succeeded");
}

#[test]
fn seed_threeway_standin_compares_three_variants_on_the_cpu() {
    let test = "seed_threeway_standin_compares_three_variants_on_the_cpu";
    if !numpy_or_skip("the stand-in server needs it: `pip install numpy`") {
        return;
    }
    let root = repo();
    let tracked = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["cat-file", "-e", "HEAD:examples/seed-threeway/server.py"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !tracked {
        skip::skip_or_fail(
            test,
            "this checkout's HEAD has no examples/seed-threeway/server.py (the variants are clones \
             of this repository's HEAD, which must hold the stand-in server)",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = toy_manifest(tmp.path(), "seed-threeway-standin.yaml", |t| {
        let t = rewrite(&t, "repo: ..\n", &format!("repo: {}\n", root.display()));
        let t = rewrite(
            &t,
            "rounds: auto\n      max_rounds: 5\n      warmup_rounds: auto\n      max_warmup_rounds: 4",
            "rounds: 2\n      warmup_rounds: 0",
        );
        let t = rewrite(
            &t,
            r#"--d-model, "1024", --layers, "8", --heads, "16", --max-len, "4096", --max-batch, "128""#,
            r#"--d-model, "32", --layers, "1", --heads, "2", --vocab, "256", --max-len, "256""#,
        );
        rewrite(
            &t,
            "num_prompts: 256, max_concurrency: 256, input_len: 128, output_len: 128, warmup_requests: 8",
            "num_prompts: 3, max_concurrency: 2, input_len: 8, output_len: 4, warmup_requests: 1",
        )
    });
    let out = orch()
        .env("OPENBLAS_NUM_THREADS", "1")
        .env("OMP_NUM_THREADS", "1")
        .arg("--store")
        .arg(tmp.path().join("store"))
        .args(["run", "--json", "--gpu", "none", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v = json(&out);
    let cell = &v["cells"][0];
    assert_eq!(cell["status"], "succeeded", "{cell}");
    for variant in ["baseline", "human", "agent"] {
        assert_eq!(cell["info"]["variants"][variant]["status"], "succeeded", "{cell}");
        assert_eq!(cell["info"]["variants"][variant]["rounds"], 2, "{cell}");
        let tput = cell["metrics"][format!("{variant}.output_throughput")].as_f64();
        assert!(tput.is_some_and(|x| x > 0.0), "{variant}: {cell}");
    }
    // The agent patch's window changes the answers: the output check gates it;
    // the human patch gives the baseline's tokens.
    let variants = &cell["info"]["variants"];
    assert_eq!(variants["agent"]["gate"]["kind"], "output_mismatch", "{cell}");
    assert!(variants["human"]["gate"].is_null(), "{cell}");
    let comparisons = cell["info"]["comparison"].to_string();
    for pair in ["human", "agent"] {
        assert!(comparisons.contains(pair), "{comparisons}");
    }
    for verdict in ["faster", "slower", "same"] {
        if comparisons.contains(verdict) {
            return;
        }
    }
    panic!("no verdict in {comparisons}");
}
