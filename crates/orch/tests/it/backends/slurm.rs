//! The `slurm` backend against a real one-node Slurm cluster started by the
//! test (`orch_testkit::slurm`: munged, slurmctld, slurmd, `gpu:h100:8` on
//! placeholder devices). Under CI a machine without Slurm fails these
//! tests; elsewhere they are skipped with the reason (`orch_testkit::skip`).

use crate::support::{cell, json, repo};
use orch_testkit::skip;
use orch_testkit::slurm::SlurmCluster;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn cluster() -> Option<SlurmCluster> {
    if let Some(why) = orch_testkit::slurm::unavailable() {
        skip::skip_or_fail(
            &skip::current_test(),
            &format!("the slurm tests need a Slurm cluster here: {why}"),
        );
        return None;
    }
    Some(SlurmCluster::start().unwrap_or_else(|e| panic!("cannot start the test cluster: {e}")))
}

/// [`crate::support::orch`] at this cluster, with no prices file of this machine's user.
fn orch(c: &SlurmCluster) -> Command {
    let mut cmd = crate::support::orch();
    cmd.env_remove("ORCH_PRICES").envs(c.env());
    cmd
}

fn run(c: &SlurmCluster, manifest: &Path, store: &Path, extra: &[&str]) -> (Output, Value) {
    let out = orch(c)
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--backend",
            "slurm",
            "--json",
            "--store",
        ])
        .arg(store)
        .args(extra)
        .output()
        .unwrap();
    let v = json(&out);
    (out, v)
}

#[test]
fn quickstart_runs_on_slurm_with_logs_in_the_store() {
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let (out, rec) = run(
        &c,
        &repo().join("manifests/quickstart.yaml"),
        &store,
        &["-j", "4"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.logs()
    );
    assert_eq!(rec["backend"], "slurm");
    for cell in rec["cells"].as_array().unwrap() {
        assert_eq!(cell["status"], "succeeded", "{cell}");
        assert!(cell["info"]["slurm_job_id"].as_str().is_some(), "{cell}");
        assert!(cell["timings"]["provision"].as_f64().is_some(), "{cell}");
    }
    let run_dir = store.join(rec["id"].as_str().unwrap());
    let dir = run_dir.join("cells/command.cpu");
    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    assert!(stdout.contains("hello from command.cpu"), "{stdout}");
    let script = std::fs::read_to_string(dir.join("job.sh")).unwrap();
    assert!(script.contains("#SBATCH --time=4\n"), "{script}");
    // The job is gone from the queue; its logs stay.
    assert!(c.queued_jobs().is_empty());
    let logs = orch(&c)
        .args(["logs", rec["id"].as_str().unwrap(), "command.cpu", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&logs.stdout).contains("hello from command.cpu"));
}

#[test]
fn a_shared_dir_outside_the_store_is_mirrored_while_the_job_runs() {
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("shared");
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        format!(
            "name: mirror\nsecrets: [ORCH_TEST_SECRET]\nslurm: {{shared_dir: {}, partition: gpu}}\nbenchmarks:\n  - name: talk\n    workload:\n      shell: |\n        echo first; sleep 8; echo ORCH_METRIC x=1 secret_len=${{#ORCH_TEST_SECRET}}; echo second >&2\n",
            shared.display()
        ),
    )
    .unwrap();
    let secret = "s3cr3t-value-for-the-job-only";
    let mut child = orch(&c)
        .env("ORCH_TEST_SECRET", secret)
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--backend",
            "slurm",
            "--json",
            "--store",
        ])
        .arg(&store)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first line reaches the store before the job ends.
    let start = Instant::now();
    let mut seen_live = false;
    while start.elapsed() < Duration::from_secs(30) && child.try_wait().unwrap().is_none() {
        let live = std::fs::read_dir(&store)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("cells/talk.cpu/stdout.log"))
            .any(|p| std::fs::read_to_string(p).is_ok_and(|s| s.contains("first")));
        if live && !c.queued_jobs().is_empty() {
            seen_live = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(seen_live, "the log did not reach the store while the job ran");
    let rec = json(&out);
    let run_id = rec["id"].as_str().unwrap();
    let talk = cell(&rec, "talk.cpu");
    assert_eq!(talk["metrics"]["x"], 1.0, "{talk}");
    // The secret reached the job (through sbatch's environment) and no file.
    assert_eq!(talk["metrics"]["secret_len"], secret.len() as f64, "{talk}");
    for root in [&store, &shared.join("jobs")] {
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let bytes = std::fs::read(&p).unwrap();
                    assert!(
                        !String::from_utf8_lossy(&bytes).contains(secret),
                        "the secret is in {}",
                        p.display()
                    );
                }
            }
        }
    }
    let cell_dir = store.join(run_id).join("cells/talk.cpu");
    assert_eq!(
        std::fs::read_to_string(cell_dir.join("stderr.log")).unwrap(),
        "second\n"
    );
    // The agent and the job folder were on the shared folder.
    let job_dir = shared.join("jobs").join(run_id).join("talk.cpu");
    assert!(job_dir.join("agent-result.json").is_file());
    assert!(!job_dir.join("result.json").exists());
    assert!(std::fs::read_dir(shared.join("bin")).unwrap().count() == 1);
}

#[test]
fn impossible_requests_fail_at_once_with_their_cause_and_gpus_are_priced() {
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    // Beyond the GPU grammar: refused before anything is submitted.
    let out = orch(&c)
        .args(["run", "-f"])
        .arg(repo().join("manifests/quickstart.yaml"))
        .args(["--backend", "slurm", "--gpu", "H100:9", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("H100:9") && err.contains("hint:"), "{err}");

    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        "name: requests\nslurm: {partition: gpu, cpus: 2}\nbenchmarks:\n  - name: eight\n    gpus: [\"H100:8\"]\n    workload: {shell: \"echo gpus=$SLURM_GPUS_ON_NODE; echo $NNODES $WORLD_SIZE $NODE_RANK $MASTER_PORT\"}\n  - name: absent\n    gpus: [A100-80GB]\n    workload: {shell: \"true\"}\n  - name: twonodes\n    nodes: 2\n    workload: {shell: \"true\"}\n",
    )
    .unwrap();
    let prices = tmp.path().join("prices.yaml");
    std::fs::write(
        &prices,
        "backends:\n  slurm:\n    gpu: {H100: 0.001}\n    partitions:\n      gpu: {gpu: {H100: 0.0005}, cell_s: 0.0001}\n",
    )
    .unwrap();
    let started = Instant::now();
    let (out, rec) = run(
        &c,
        &manifest,
        &store,
        &["-j", "3", "--prices", prices.to_str().unwrap()],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    let eight = cell(&rec, "eight.h100x8");
    assert_eq!(eight["status"], "succeeded", "{eight}");
    let id = eight["info"]["slurm_job_id"].as_str().unwrap();
    let job = c.show_job(id);
    assert!(
        job.contains("gpu:h100:8") && job.contains("Partition=gpu"),
        "{job}"
    );
    let dir = store.join(rec["id"].as_str().unwrap()).join("cells/eight.h100x8");
    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    assert!(stdout.contains("gpus=8"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("1 1 0 ")), "{stdout}");
    // The partition's price: 8 GPUs x 0.0005 + 0.0001 per second.
    let cost = &eight["cost"];
    assert!(
        (cost["usd_per_s"].as_f64().unwrap() - 0.0041).abs() < 1e-9,
        "{cost}"
    );
    assert!(cost["usd"].as_f64().unwrap() > 0.0);
    for (id, what) in [
        (
            "absent.a100-80gb",
            "Requested node configuration is not available",
        ),
        ("twonodes.cpu", "pending reason Partition"),
    ] {
        let r = cell(&rec, id);
        assert_eq!(r["status"], "failed", "{r}");
        assert_eq!(r["failure"]["kind"], "unsatisfiable", "{r}");
        let msg = r["failure"]["message"].as_str().unwrap();
        assert!(msg.contains(what), "{msg}");
        assert_eq!(r["diagnosis"]["kind"], "slurm_unsatisfiable", "{r}");
        assert!(r["duration_s"].as_f64().unwrap() < 5.0, "{r}");
    }
}

#[test]
fn memory_and_time_limits_are_named() {
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        r#"name: limits
measure: {timeout: 1m}
slurm: {partition: gpu, poll: 0.5s}
benchmarks:
  - name: eat
    memory_limit: 300MiB
    workload: {shell: "echo eating; head -c 4000000000 /dev/zero | tail"}
  - name: sleepy
    measure: {timeout: 2s}
    workload: {shell: "sleep 30"}
"#,
    )
    .unwrap();
    let (out, rec) = run(&c, &manifest, &store, &["-j", "2"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let eat = cell(&rec, "eat.cpu");
    assert_eq!(eat["status"], "oom", "{eat}");
    assert!(
        eat["failure"]["message"].as_str().unwrap().contains("--mem=300M"),
        "{eat}"
    );
    assert_eq!(eat["diagnosis"]["kind"], "slurm_memory_limit", "{eat}");
    let sleepy = cell(&rec, "sleepy.cpu");
    assert_eq!(sleepy["status"], "timeout", "{sleepy}");
    assert!(sleepy["duration_s"].as_f64().unwrap() < 30.0);
    assert!(c.queued_jobs().is_empty());
}

#[test]
fn a_cell_pending_past_max_pending_fails_with_the_reason() {
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // Someone else's job holds every GPU of the cluster.
    let blocker = Command::new("sbatch")
        .args([
            "--parsable",
            "--gres=gpu:h100:8",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 120",
        ])
        .envs(c.env())
        .output()
        .unwrap();
    assert!(
        blocker.status.success(),
        "{}",
        String::from_utf8_lossy(&blocker.stderr)
    );
    let blocker = String::from_utf8_lossy(&blocker.stdout).trim().to_string();
    let start = Instant::now();
    while !c.show_job(&blocker).contains("JobState=RUNNING") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            c.show_job(&blocker)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        "name: queue\nslurm: {partition: gpu, max_pending: 3s, poll: 0.5s}\nbenchmarks:\n  - name: waiter\n    gpus: [H100]\n    workload: {shell: \"true\"}\n",
    )
    .unwrap();
    let (out, rec) = run(&c, &manifest, &store, &[]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let waiter = cell(&rec, "waiter.h100");
    assert_eq!(waiter["status"], "failed", "{waiter}");
    assert_eq!(waiter["failure"]["kind"], "pending_too_long", "{waiter}");
    assert!(
        waiter["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("Resources"),
        "{waiter}"
    );
    assert_eq!(waiter["diagnosis"]["kind"], "slurm_pending_too_long", "{waiter}");
    // The pending reason was shown live; the cell's job is gone, the other stays.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pending: Resources"), "{err}");
    assert_eq!(c.queued_jobs(), vec![blocker]);
}

#[test]
fn ctrl_c_and_down_leave_no_job_in_the_queue() {
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        "name: long\nslurm: {partition: gpu}\nbenchmarks:\n  - name: nap\n    workload: {shell: \"sleep 300\"}\n",
    )
    .unwrap();
    let wait_running = |c: &SlurmCluster| {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Some(id) = c.queued_jobs().first() {
                if c.show_job(id).contains("JobState=RUNNING") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no job started\n{}", c.logs());
    };

    // Ctrl-C: the job is cancelled, the cell recorded `cancelled`.
    let child = orch(&c)
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--backend",
            "slurm",
            "--json",
            "--store",
        ])
        .arg(&store)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_running(&c);
    // SAFETY: plain syscall on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(c.queued_jobs().is_empty(), "jobs left: {:?}", c.queued_jobs());
    let rec = json(&out);
    assert_eq!(cell(&rec, "nap.cpu")["status"], "cancelled");

    // kill -9 of orch leaves the job; `orch down RUN` cancels it.
    let mut child = orch(&c)
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--backend",
            "slurm",
            "--store",
        ])
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_running(&c);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(c.queued_jobs().len(), 1);
    let down = orch(&c)
        .args(["down", "latest", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert_eq!(
        down.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(c.queued_jobs().is_empty(), "jobs left: {:?}", c.queued_jobs());
}

#[test]
fn a_two_node_cell_gets_rendezvous_and_every_nodes_record() {
    if let Some(why) = orch_testkit::slurm::unavailable() {
        skip::skip_or_fail(
            "a_two_node_cell_gets_rendezvous_and_every_nodes_record",
            &format!("the slurm tests need a Slurm cluster here: {why}"),
        );
        return;
    }
    let c = SlurmCluster::start_nodes(2).unwrap_or_else(|e| panic!("cannot start the test cluster: {e}"));
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        r#"name: multi
slurm: {partition: gpu}
benchmarks:
  - name: ddp
    nodes: 2
    gpus: ["H100:8"]
    workload:
      shell: |
        echo "rank=$NODE_RANK/$RANK world=$WORLD_SIZE nnodes=$NNODES nproc=$NPROC_PER_NODE master=$MASTER_ADDR:$MASTER_PORT gpus=$SLURM_GPUS_ON_NODE"
        echo "ORCH_METRIC rank=$NODE_RANK"
"#,
    )
    .unwrap();
    let (out, rec) = run(&c, &manifest, &store, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.logs()
    );
    let ddp = cell(&rec, "ddp.h100x8");
    assert_eq!(ddp["status"], "succeeded", "{ddp}");
    assert_eq!(ddp["metrics"]["rank"], 0.0, "{ddp}");
    let nodes = ddp["info"]["nodes"].as_array().unwrap_or_else(|| panic!("{ddp}"));
    assert_eq!(nodes.len(), 2, "{ddp}");
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["rank"], i, "{n}");
        assert_eq!(n["host"], orch_testkit::slurm::node_name(i as u32 + 1), "{n}");
        assert_eq!(n["status"], "succeeded", "{n}");
        assert!(n["hardware"]["cpus"].as_u64().is_some(), "{n}");
    }
    let dir = store.join(rec["id"].as_str().unwrap()).join("cells/ddp.h100x8");
    let master = "master=orchnode1:";
    for (file, rank) in [(dir.join("stdout.log"), 0), (dir.join("nodes/1/stdout.log"), 1)] {
        let s = std::fs::read_to_string(&file).unwrap();
        assert!(
            s.contains(&format!("rank={rank}/{rank} world=2 nnodes=2 nproc=8 {master}"))
                && s.contains("gpus=8"),
            "{}: {s}",
            file.display()
        );
    }
    // The job asked for both nodes, 8 GPUs each.
    let job = c.show_job(ddp["info"]["slurm_job_id"].as_str().unwrap());
    assert!(job.contains("NumNodes=2") && job.contains("gpu:h100:8"), "{job}");
}

#[test]
fn setup_as_a_job_fills_the_shared_weights_that_plan_checks_and_cells_read() {
    use orch_testkit::fixtures::{write_test_model, ModelOptions};
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    write_test_model(&root, "acme/tiny", &ModelOptions::tiny()).unwrap();
    let hub = orch_testkit::hub::HubServer::start(&root);
    let shared = tmp.path().join("shared");
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        format!(
            "name: weights\nmodels: [{{repo: acme/tiny}}]\nslurm: {{shared_dir: {}, partition: gpu}}\nbenchmarks:\n  - name: look\n    workload: {{shell: \"ls $HF_HUB_CACHE; echo offline=$HF_HUB_OFFLINE\"}}\n",
            shared.display()
        ),
    )
    .unwrap();
    let cmd = |args: &[&str]| {
        orch(&c)
            .env("HF_ENDPOINT", hub.endpoint())
            .env_remove("HF_TOKEN")
            .env_remove("ORCH_WEIGHTS_DIR")
            .env("HF_HOME", "/nonexistent-orch-test-hf-home")
            .args(args)
            .arg("--store")
            .arg(&store)
            .output()
            .unwrap()
    };
    let m = manifest.to_str().unwrap();
    let weights = shared.join("weights");
    let plan = cmd(&["plan", "-f", m, "--backend", "slurm"]);
    assert_eq!(
        plan.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&plan.stdout)
    );
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(
        text.contains("MISSING") && text.contains(&weights.display().to_string()),
        "{text}"
    );
    let run = cmd(&["run", "-f", m, "--backend", "slurm"]);
    assert_eq!(
        run.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let setup = cmd(&["setup", "-f", m, "--backend", "slurm", "--as-job"]);
    let err = String::from_utf8_lossy(&setup.stderr);
    assert_eq!(setup.status.code(), Some(0), "{err}\n{}", c.logs());
    assert!(err.contains("submitted") && err.contains("acme/tiny"), "{err}");
    assert!(weights.join("models--acme--tiny/refs/main").is_file());
    let plan = cmd(&["plan", "-f", m, "--backend", "slurm"]);
    assert_eq!(
        plan.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&plan.stdout)
    );

    let run = cmd(&["run", "-f", m, "--backend", "slurm", "--json"]);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rec = json(&run);
    let dir = store.join(rec["id"].as_str().unwrap()).join("cells/look.cpu");
    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    assert!(
        stdout.contains("models--acme--tiny") && stdout.contains("offline=1"),
        "{stdout}"
    );
}

#[test]
fn max_cost_cancels_the_running_job() {
    let Some(c) = cluster() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        "name: budget\nslurm: {partition: gpu, poll: 0.5s}\nbenchmarks:\n  - name: nap\n    gpus: [H100]\n    workload: {shell: \"sleep $SLEEP_S\"}\n",
    )
    .unwrap();
    let prices = tmp.path().join("prices.yaml");
    std::fs::write(
        &prices,
        "backends:\n  slurm:\n    partitions:\n      gpu: {gpu: {H100: 0.01}}\n",
    )
    .unwrap();
    let p = prices.to_str().unwrap();
    // A first, short run gives the cell a history (its estimate)...
    let (first, _) = run(&c, &manifest, &store, &["--prices", p]);
    assert_eq!(first.status.code(), Some(1), "no SLEEP_S: the shell fails fast");
    let out = orch(&c)
        .env("SLEEP_S", "0.5")
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--backend",
            "slurm",
            "--prices",
            p,
            "--store",
        ])
        .arg(&store)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ... so a cap above that estimate starts; the long sleep passes it.
    let started = Instant::now();
    let out = orch(&c)
        .env("SLEEP_S", "120")
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--backend",
            "slurm",
            "--json",
            "--max-cost",
            "0.08",
            "--prices",
            p,
            "--store",
        ])
        .arg(&store)
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the budget stopped nothing"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("stopped by the budget"));
    let rec = json(&out);
    let nap = cell(&rec, "nap.h100");
    assert_eq!(nap["status"], "cancelled", "{nap}");
    assert_eq!(nap["failure"]["kind"], "budget", "{nap}");
    assert!(c.queued_jobs().is_empty(), "jobs left: {:?}", c.queued_jobs());
    let id = nap["info"]["slurm_job_id"].as_str().unwrap();
    assert!(
        c.show_job(id).contains("JobState=CANCELLED"),
        "{}",
        c.show_job(id)
    );
}

/// Every cell of a record succeeded, with its own job, recorded once (one
/// cell folder each, no interrupted attempt).
fn each_recorded_once(rec: &Value, store: &Path, cells: usize) {
    let list = rec["cells"].as_array().unwrap();
    assert_eq!(list.len(), cells, "{rec}");
    let mut jobs = std::collections::BTreeSet::new();
    for cell in list {
        assert_eq!(cell["status"], "succeeded", "{cell}");
        assert!(jobs.insert(cell["info"]["slurm_job_id"].as_str().unwrap().to_string()));
    }
    let run_dir = store.join(rec["id"].as_str().unwrap());
    let folders = std::fs::read_dir(run_dir.join("cells")).unwrap().count();
    assert_eq!(folders, cells);
    assert!(!run_dir.join("interrupted").exists());
}

#[test]
fn a_run_past_the_submission_limit_waits_for_slots_and_retries_refusals() {
    if let Some(why) = orch_testkit::slurm::unavailable_accounting() {
        skip::skip_or_fail(
            &skip::current_test(),
            &format!("this test needs a Slurm cluster with accounting here: {why}"),
        );
        return;
    }
    const LIMIT: u32 = 3;
    let c = SlurmCluster::start_with_submit_limit(LIMIT)
        .unwrap_or_else(|e| panic!("cannot start the test cluster: {e}"));
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let suite = |partition: &str| {
        let m = tmp.path().join(format!("{partition}.yaml"));
        std::fs::write(
            &m,
            format!("name: many\nslurm: {{partition: {partition}, poll: 0.5s}}\nbenchmarks:\n  - name: nap\n    workload: {{shell: 'sleep 2; echo ORCH_METRIC x=1'}}\n    matrix:\n      i: [1, 2, 3, 4, 5, 6, 7, 8]\n"),
        )
        .unwrap();
        m
    };
    // `orch plan` says the default: the association's limit.
    let m = suite(orch_testkit::slurm::PARTITION);
    let plan = orch(&c)
        .args(["plan", "-f", m.to_str().unwrap(), "--backend", "slurm", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&plan.stdout);
    assert!(
        text.contains(&format!(
            "jobs: {LIMIT} at a time (slurm default: the submission limit, `MaxSubmitJobs` of the association"
        )),
        "{text}\n{}",
        String::from_utf8_lossy(&plan.stderr)
    );

    // Eight cells at once against a limit of three: five wait for a slot.
    let (out, rec) = run(&c, &m, &store, &["-j", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}\n{}", c.logs());
    each_recorded_once(&rec, &store, 8);
    assert!(err.contains("waiting to submit"), "{err}");
    assert!(!err.contains("refused"), "{err}");

    // A limit the run cannot read (the partition's QOS allows one job
    // fewer): the refused submissions are made again, no cell fails.
    let m = suite(orch_testkit::slurm::CAPPED_PARTITION);
    let (out, rec) = run(&c, &m, &store, &["-j", "8"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}\n{}", c.logs());
    each_recorded_once(&rec, &store, 8);
    assert!(
        err.contains("slurm refused the job for now (QOSMaxSubmitJobPerUserLimit)"),
        "{err}"
    );
    assert!(c.queued_jobs().is_empty(), "jobs left: {:?}", c.queued_jobs());
}
