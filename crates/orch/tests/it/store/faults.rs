//! Faults on the local backend (issue 30): random `kill -9` of `orch run` and of
//! `orch run --resume`, two writers of one run, a full disk, too few open files. After
//! each fault the invariant holds: every cell is recorded exactly once once resumed to the
//! end, a finished record never changes (byte for byte), `costs.jsonl` counts each cell
//! attempt once, and `orch ls`, `orch cost` and `orch show` answer.
//!
//! Bounded for CI: a few seeded iterations of short cells. `scripts/chaos.sh` runs more
//! (`ORCH_FAULT_ITERS`, `ORCH_FAULT_SEED`) and collects what each scenario writes under
//! `ORCH_CHAOS_DIR` (scenario, iterations, cells lost, cells run twice) into
//! `results/chaos.json`. No timing is asserted: a kill lands wherever it lands.

use crate::support::{dump, orch, wait_for};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A small seeded generator (xorshift64*): the same seed, the same kills.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn suite(dir: &Path, cells: usize, shell: &str) -> PathBuf {
    let values: Vec<String> = (1..=cells).map(|i| i.to_string()).collect();
    let p = dir.join("faults.yaml");
    std::fs::write(
        &p,
        format!(
            "name: faults\nbenchmarks:\n  - name: f\n    workload:\n      shell: '{shell}'\n    matrix:\n      i: [{}]\n",
            values.join(", ")
        ),
    )
    .unwrap();
    p
}

/// The only run of `store`.
fn run_dir(store: &Path) -> Option<PathBuf> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(store)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("run.json").is_file())
        .collect();
    runs.sort();
    runs.pop()
}

/// The bytes of every host record under `cells/` (a `result.json` that is a record:
/// the host's, with its `attempt`; the agent's own result has `cell_id` instead).
fn records(run: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(run.join("cells")) else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(bytes) = std::fs::read(e.path().join("result.json")) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            continue;
        };
        if v.get("attempt").is_some() && v["status"] != "cancelled" {
            out.insert(e.file_name().to_string_lossy().into_owned(), bytes);
        }
    }
    out
}

/// What the scenario measured, for `scripts/chaos.sh`.
#[derive(Default)]
struct Tally {
    iterations: u64,
    kills: u64,
    cells_lost: u64,
    cells_run_twice: u64,
    notes: Vec<String>,
}

impl Tally {
    fn write(&self, scenario: &str) {
        let Some(dir) = std::env::var_os("ORCH_CHAOS_DIR") else {
            return;
        };
        let v = serde_json::json!({
            "scenario": scenario,
            "iterations": self.iterations,
            "kills": self.kills,
            "cells_lost": self.cells_lost,
            "cells_run_twice": self.cells_run_twice,
            "notes": self.notes,
        });
        let _ = std::fs::create_dir_all(&dir);
        std::fs::write(
            Path::new(&dir).join(format!("{scenario}.json")),
            serde_json::to_vec_pretty(&v).unwrap(),
        )
        .unwrap();
    }
}

/// The invariant after a fault: finished records unchanged, each recorded attempt once in
/// the ledger, and the read commands answer. Returns the records that changed.
fn check(store: &Path, run: &Path, finished: &mut BTreeMap<String, Vec<u8>>) -> u64 {
    let s = store.to_str().unwrap();
    let id = run.file_name().unwrap().to_str().unwrap();
    let mut changed = 0;
    let now = records(run);
    for (cell, bytes) in finished.iter() {
        if now.get(cell) != Some(bytes) {
            changed += 1;
        }
    }
    for (cell, bytes) in now {
        finished.entry(cell).or_insert(bytes);
    }
    for args in [vec!["ls", "--store", s], vec!["cost", "--store", s, "--json"]] {
        let out = orch().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "orch {args:?}: {}", dump(&out));
    }
    // `show` exits 1 while cells are pending; it must read the run either way.
    let out = orch()
        .args(["show", id, "--store", s, "--json"])
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "orch show: {}",
        dump(&out)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", dump(&out)));
    assert_eq!(shown["id"], id);
    ledger_once(run);
    changed
}

/// Each line of `costs.jsonl` is one cell attempt, none twice.
fn ledger_once(run: &Path) {
    let Ok(text) = std::fs::read_to_string(run.join("costs.jsonl")) else {
        return;
    };
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).unwrap();
        let key = (
            v["cell"].as_str().unwrap().to_string(),
            v["attempt"].as_u64().unwrap(),
        );
        assert!(
            seen.insert(key.clone()),
            "counted twice in costs.jsonl: {key:?}\n{text}"
        );
    }
}

/// Resume until the run is complete (a few tries at most); the last output.
fn resume_to_end(store: &Path, id: &str) -> Output {
    let mut last = None;
    for _ in 0..3 {
        let out = orch()
            .args([
                "run",
                "--resume",
                id,
                "--store",
                store.to_str().unwrap(),
                "--json",
            ])
            .output()
            .unwrap();
        let done = out.status.code() == Some(0);
        last = Some(out);
        if done {
            break;
        }
    }
    let out = last.unwrap();
    assert_eq!(out.status.code(), Some(0), "resume to the end: {}", dump(&out));
    out
}

/// After the last resume: every planned cell has exactly one record, every one succeeded,
/// and the ledger has one line per cell (kills leave no cancelled attempts).
fn complete_once(store: &Path, run: &Path, cells: usize) -> u64 {
    let now = records(run);
    let lost = cells.saturating_sub(now.len()) as u64;
    let out = orch()
        .args(["cost", "--store", store.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    let ledger = std::fs::read_to_string(run.join("costs.jsonl")).unwrap_or_default();
    let lines = ledger.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(lines, cells, "one ledger line per cell:\n{ledger}");
    ledger_once(run);
    for bytes in now.values() {
        let v: Value = serde_json::from_slice(bytes).unwrap();
        assert_eq!(v["status"], "succeeded", "{v}");
    }
    lost
}

/// Start `orch run` (or `--resume ID`), kill it with SIGKILL after a random while, wait.
fn start_and_kill(store: &Path, what: &[&str], rng: &mut Rng, tally: &mut Tally) {
    let mut child = orch()
        .args(what)
        .args(["--store", store.to_str().unwrap(), "--jobs", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100 + rng.below(1600)));
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    tally.kills += 1;
}

/// `iterations` random kills: of `orch run` (each followed by a resume to the end), or,
/// with `resumes`, of `orch run --resume` (a run killed once, then its resumes killed
/// until it is done; then a new run).
fn kill_loop(scenario: &str, seed: u64, iterations: u64, resumes: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let cells = 8;
    let m = suite(tmp.path(), cells, "sleep 0.{{i}}; echo ORCH_METRIC i={{i}}");
    let manifest = m.to_str().unwrap().to_string();
    let store = tmp.path().join("s");
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let mut finished = BTreeMap::new();
    let mut run: Option<PathBuf> = None;
    for it in 0..iterations {
        tally.iterations += 1;
        if run.is_none() {
            start_and_kill(&store, &["run", "-f", &manifest], &mut rng, &mut tally);
            run = run_dir(&store);
            let Some(r) = &run else {
                tally
                    .notes
                    .push(format!("iteration {it}: killed before the run existed"));
                continue;
            };
            tally.cells_run_twice += check(&store, r, &mut finished);
            if resumes {
                continue;
            }
        }
        let Some(r) = run.clone() else { continue };
        let id = r.file_name().unwrap().to_str().unwrap().to_string();
        if resumes && records(&r).len() < cells {
            start_and_kill(&store, &["run", "--resume", &id], &mut rng, &mut tally);
            tally.cells_run_twice += check(&store, &r, &mut finished);
        }
        if !resumes || records(&r).len() == cells {
            resume_to_end(&store, &id);
            tally.cells_run_twice += check(&store, &r, &mut finished);
            tally.cells_lost += complete_once(&store, &r, cells);
            std::fs::remove_dir_all(&store).unwrap();
            finished.clear();
            run = None;
        }
    }
    if let Some(r) = &run {
        let id = r.file_name().unwrap().to_str().unwrap().to_string();
        let out = resume_to_end(&store, &id);
        let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(rec["state"], "complete", "{}", dump(&out));
        tally.cells_run_twice += check(&store, r, &mut finished);
        tally.cells_lost += complete_once(&store, r, cells);
    }
    tally.write(scenario);
    assert_eq!(
        tally.cells_run_twice, 0,
        "a finished record changed (seed {seed})"
    );
    assert_eq!(tally.cells_lost, 0, "cells lost (seed {seed})");
}

#[test]
fn random_kills_of_run_lose_and_repeat_nothing() {
    let seed = env_u64("ORCH_FAULT_SEED", 30);
    kill_loop("kill_run", seed, env_u64("ORCH_FAULT_ITERS", 4), false);
}

#[test]
fn random_kills_of_resume_lose_and_repeat_nothing() {
    let seed = env_u64("ORCH_FAULT_SEED", 31) + 1;
    kill_loop("kill_resume", seed, env_u64("ORCH_FAULT_ITERS", 4), true);
}

#[test]
fn the_agents_result_left_at_the_records_place_costs_only_its_cell() {
    // What `kill -9` of `orch` right after a workload ended left before the agent
    // wrote `agent-result.json`: its own `result.json` where the host's record goes
    // (a run made by an older version); and the agent's file of this version.
    let tmp = tempfile::tempdir().unwrap();
    let m = suite(tmp.path(), 3, "echo ORCH_METRIC i={{i}}");
    let store = tmp.path().join("s");
    let s = store.to_str().unwrap();
    let out = orch()
        .args(["run", "-f", m.to_str().unwrap(), "--store", s])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    let run = run_dir(&store).unwrap();
    let id = run.file_name().unwrap().to_str().unwrap().to_string();
    let mut ids: Vec<String> = records(&run).into_keys().collect();
    ids.sort();
    let cell = ids[1].as_str();
    let path = run.join("cells").join(cell).join("result.json");
    let agents = serde_json::json!({
        "version": 1, "cell_id": cell, "status": "succeeded", "metrics": {"i": 2.0},
        "timings": {}, "failure": null
    });
    std::fs::write(&path, serde_json::to_vec(&agents).unwrap()).unwrap();
    let kept: BTreeMap<String, Vec<u8>> = records(&run);
    assert_eq!(kept.len(), 2);
    for args in [
        vec!["show", id.as_str(), "--store", s],
        vec!["report", id.as_str(), "--store", s, "--format", "md"],
        vec!["logs", id.as_str(), "--store", s],
        vec!["ls", "--store", s],
        vec!["cost", "--store", s],
    ] {
        let out = orch().args(&args).output().unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "orch {args:?}: {}",
            dump(&out)
        );
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("error:"),
            "orch {args:?}: {}",
            dump(&out)
        );
        if args[0] != "show" {
            assert_eq!(out.status.code(), Some(0), "orch {args:?}: {}", dump(&out));
        }
        let err = String::from_utf8_lossy(&out.stderr);
        if args[0] != "ls" && args[0] != "cost" {
            assert!(
                err.contains("warning:") && err.contains(&path.display().to_string()),
                "orch {args:?}: {err}"
            );
        }
    }
    let out = resume_to_end(&store, &id);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains("running 1"),
        "only the damaged cell runs again: {err}"
    );
    let mut finished = kept;
    assert_eq!(check(&store, &run, &mut finished), 0);
    assert_eq!(complete_once(&store, &run, 3), 0);
    assert!(run
        .join("interrupted")
        .join(format!("{cell}.1"))
        .join("result.unrecorded.json")
        .is_file());
}

#[test]
fn a_second_writer_exits_2_naming_the_holder_and_a_dead_ones_run_is_taken_over() {
    let tmp = tempfile::tempdir().unwrap();
    let cells = 4;
    let m = suite(tmp.path(), cells, "sleep 1; echo ORCH_METRIC i={{i}}");
    let store = tmp.path().join("s");
    let s = store.to_str().unwrap();
    let mut first = orch()
        .args(["run", "-f", m.to_str().unwrap(), "--store", s, "--jobs", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = wait_for(
        "the run never started",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || run_dir(&store).filter(|r| r.join("writer.json").is_file()),
    );
    let id = run.file_name().unwrap().to_str().unwrap().to_string();
    let mut tally = Tally::default();
    for _ in 0..2 {
        tally.iterations += 1;
        let out = orch()
            .args(["run", "--resume", &id, "--store", s])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", dump(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("pid {}", first.id())), "{err}");
        assert!(
            err.contains("host `") && err.contains("since ") && err.contains("hint:"),
            "{err}"
        );
        // Which cells the holder has to run.
        assert!(err.contains("without a record: `f."), "{err}");
    }
    let mut finished = BTreeMap::new();
    tally.cells_run_twice += check(&store, &run, &mut finished);
    first.kill().unwrap();
    first.wait().unwrap();
    tally.kills += 1;
    // The holder is dead: its lock went with it.
    let out = resume_to_end(&store, &id);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("taking over") && err.contains(&format!("pid {}", first.id())),
        "{err}"
    );
    tally.cells_run_twice += check(&store, &run, &mut finished);
    tally.cells_lost += complete_once(&store, &run, cells);
    assert!(
        !run.join("writer.json").exists(),
        "a writer that ended leaves no name"
    );
    tally.write("concurrent_resume");
    assert_eq!(tally.cells_run_twice, 0);
}

#[test]
fn a_resume_started_while_another_runs_names_the_cells_and_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let cells = 4;
    let m = suite(tmp.path(), cells, "sleep 1; echo ORCH_METRIC i={{i}}");
    let store = tmp.path().join("s");
    let s = store.to_str().unwrap();
    // A run killed at once, then two resumes 1.5 s apart.
    let mut killed = orch()
        .args(["run", "-f", m.to_str().unwrap(), "--store", s, "--jobs", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = wait_for(
        "the run never started",
        Duration::from_secs(60),
        Duration::from_millis(20),
        || run_dir(&store).filter(|r| r.join("writer.json").is_file()),
    );
    killed.kill().unwrap();
    killed.wait().unwrap();
    let id = run.file_name().unwrap().to_str().unwrap().to_string();
    let first = orch()
        .args(["run", "--resume", &id, "--store", s, "--jobs", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let second = orch()
        .args(["run", "--resume", &id, "--store", s])
        .output()
        .unwrap();
    let first_pid = first.id();
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", dump(&first));
    assert_eq!(second.status.code(), Some(2), "{}", dump(&second));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("is being written by another orch")
            && err.contains(&format!("pid {first_pid}"))
            && err.contains("without a record: `f.")
            && err.contains("hint:"),
        "{err}"
    );
    let mut finished = BTreeMap::new();
    assert_eq!(check(&store, &run, &mut finished), 0);
    assert_eq!(complete_once(&store, &run, cells), 0);
}

/// Mount a tmpfs of `size` at `dir` (root only); unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        // SAFETY: a plain syscall without arguments.
        if unsafe { libc::geteuid() } != 0 {
            return Err("mounting a tmpfs needs root".into());
        }
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run `mount`: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`mount -t tmpfs` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_names_the_cause_and_the_run_resumes() {
    let test = "store::faults::a_full_disk_names_the_cause_and_the_run_resumes";
    let tmp = tempfile::tempdir().unwrap();
    let disk = tmp.path().join("disk");
    let Some(_fs) = orch_testkit::skip::require(test, Tmpfs::mount(&disk, "2m")) else {
        return;
    };
    let cells = 6;
    // Each cell writes 24 KiB of logs.
    let m = suite(
        tmp.path(),
        cells,
        "head -c 24576 /dev/zero | tr \"\\\\0\" x; echo; echo ORCH_METRIC i={{i}}",
    );
    let store = disk.join("s");
    let s = store.to_str().unwrap();
    // Fill the disk but for about 96 KiB: the run starts, then runs out.
    let filler = disk.join("filler");
    let mut left: u64 = 2 * 1024 * 1024 - 96 * 1024;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if f.write_all(&chunk[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
        let _ = f.sync_all();
    }
    let out = orch()
        .args(["run", "-f", m.to_str().unwrap(), "--store", s, "--jobs", "2"])
        .output()
        .unwrap();
    let mut tally = Tally {
        iterations: 1,
        ..Tally::default()
    };
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    if out.status.code() != Some(0) {
        assert!(
            err.contains("no space left on device") || err.contains("disk is full"),
            "the cause is named: {}",
            dump(&out)
        );
    } else {
        tally.notes.push("the run fit on the disk".into());
    }
    std::fs::remove_file(&filler).unwrap();
    let Some(run) = run_dir(&store) else {
        // The run could not even be created; it was refused with the cause.
        tally.write("full_disk");
        return;
    };
    let meta: Value = serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    if out.status.code() != Some(0) && meta["state"] == "running" {
        // With no space left even `run.json` cannot be rewritten; `--resume` treats a
        // `running` run the same as an `interrupted` one.
        tally
            .notes
            .push("run.json could not be marked interrupted on the full disk".into());
    }
    let mut finished = records(&run);
    let id = run.file_name().unwrap().to_str().unwrap().to_string();
    tally.cells_run_twice += check(&store, &run, &mut finished);
    resume_to_end(&store, &id);
    tally.cells_run_twice += check(&store, &run, &mut finished);
    let now = records(&run);
    tally.cells_lost += cells.saturating_sub(now.len()) as u64;
    ledger_once(&run);
    tally.write("full_disk");
    assert_eq!(tally.cells_lost, 0);
    assert_eq!(tally.cells_run_twice, 0);
}

#[test]
fn a_low_open_file_limit_names_the_cause_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let cells = 40;
    let m = suite(tmp.path(), cells, "sleep 0.5; echo ORCH_METRIC i={{i}}");
    let store = tmp.path().join("s");
    let s = store.to_str().unwrap();
    // `ulimit -n` sets the hard limit too: orch cannot raise it.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 48 && exec \"$0\" run -f '{}' --store '{s}' --jobs 40",
            m.display()
        ))
        .arg(env!("CARGO_BIN_EXE_orch"))
        .env_remove("ORCH_STORE")
        .env_remove("ORCH_AGENT")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let mut tally = Tally {
        iterations: 1,
        ..Tally::default()
    };
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    if out.status.code() != Some(0) {
        assert!(
            err.contains("too many open files"),
            "the cause is named: {}",
            dump(&out)
        );
    } else {
        tally.notes.push("the run fit in the limit".into());
    }
    let run = run_dir(&store).unwrap_or_else(|| panic!("no run: {}", dump(&out)));
    let meta: Value = serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    assert_ne!(meta["state"], "running", "{}", dump(&out));
    let mut finished = records(&run);
    let id = run.file_name().unwrap().to_str().unwrap().to_string();
    tally.cells_run_twice += check(&store, &run, &mut finished);
    resume_to_end(&store, &id);
    tally.cells_run_twice += check(&store, &run, &mut finished);
    let now = records(&run);
    tally.cells_lost += cells.saturating_sub(now.len()) as u64;
    ledger_once(&run);
    tally.write("low_open_files");
    assert_eq!(tally.cells_lost, 0);
    assert_eq!(tally.cells_run_twice, 0);
}

/// Issue 47: cells that end together are recorded in one batch (the runner's group
/// commit). 120 cells wait on one FIFO and end in the same instant when it is opened;
/// `orch` is killed with SIGKILL as soon as the first records appear, while the rest of
/// the batch is being written. Every record present then stays as it was, and the resume
/// runs exactly the cells without one: each cell recorded once, one ledger line each.
#[test]
fn a_run_killed_while_a_batch_of_records_is_written_resumes_with_every_finished_cell_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let cells = 120;
    let fifo = tmp.path().join("release.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let manifest = suite(tmp.path(), cells, &format!("cat {} >/dev/null", fifo.display()));
    let mut child = orch()
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ])
        .args(["--jobs", &cells.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Every cell's workload waits in `open` of the FIFO (a guard against a hang, not a timing).
    let waiting = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                    c.starts_with(b"cat\0")
                        && c.windows(fifo.as_os_str().len())
                            .any(|w| w == fifo.as_os_str().as_encoded_bytes())
                })
            })
            .count()
    };
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while waiting() < cells && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(waiting(), cells, "every cell waits on the FIFO");
    let run = run_dir(&store).unwrap();
    assert!(records(&run).is_empty());
    // One writer lets every waiting reader through; they read EOF when it closes.
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    drop(writer);
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while records(&run).is_empty() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = child.kill(); // SIGKILL, in the middle of the batch or just after it
    let _ = child.wait();
    let kept = records(&run);
    assert!(!kept.is_empty(), "records were being written");
    eprintln!("killed with {} of {cells} records written", kept.len());

    let id = run.file_name().unwrap().to_str().unwrap().to_string();
    // Cells not recorded run again; they must not wait on the FIFO this time.
    std::fs::remove_file(&fifo).unwrap();
    std::fs::write(&fifo, "").unwrap();
    let _ = resume_to_end(&store, &id);
    let now = records(&run);
    assert_eq!(now.len(), cells, "every cell recorded");
    for (cell, bytes) in &kept {
        assert_eq!(
            now.get(cell),
            Some(bytes),
            "`{cell}`'s record changed: it ran again"
        );
    }
    assert_eq!(complete_once(&store, &run, cells), 0);
}
