use super::*;
use orch_protocol::{
    Client, CommandWorkload, CompareWorkload, LoadGen, Readiness, ServerWorkload, TaskSpec, Variant, Workload,
};
use std::process::Command;

fn task(workload: Workload) -> TaskSpec {
    serde_json::from_value(serde_json::json!({
        "version": orch_protocol::PROTOCOL_VERSION,
        "run_id": "r",
        "cell_id": "c",
        "gpu": "none",
        "workload": serde_json::to_value(&workload).unwrap(),
        "measure": serde_json::to_value(orch_protocol::Measure::default()).unwrap(),
    }))
    .unwrap()
}

fn sh(dir: &Path, script: &str) {
    let ok = Command::new("sh")
        .args(["-ec", script])
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .status()
        .unwrap()
        .success();
    assert!(ok, "{script}");
}

fn command(workdir: &Path) -> Workload {
    Workload::Command(CommandWorkload {
        argv: vec!["python3".into(), "run.py".into()],
        workdir: Some(workdir.to_string_lossy().into()),
    })
}

/// A suite folder: `bench/` (a workdir with ignore files), `prompts.jsonl`,
/// `repo/` (a git repository with a branch `fast`), `fix.patch`.
fn suite() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    sh(
        d.path(),
        r#"
        mkdir -p bench/sub bench/ckpt bench/.git bench/cache
        echo 'print(1)' > bench/run.py; chmod +x bench/run.py
        echo 'x = 2' > bench/sub/util.py
        echo 'big' > bench/ckpt/model.bin
        echo 'x' > bench/.git/HEAD
        echo 'cache/' > bench/.gitignore
        echo 'c' > bench/cache/c.txt
        printf 'ckpt/\n' > bench/.dockerignore
        echo 'secret' > bench/notes.tmp
        echo '{"prompt": "hi"}' > prompts.jsonl
        git init -q -b main repo
        cd repo
        echo 'a = 1' > server.py
        git add server.py && git commit -q -m one
        git checkout -q -b fast
        echo 'a = 3' > server.py && git commit -q -am fast
        git checkout -q main
        cd ..
        printf -- '--- a/server.py\n+++ b/server.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n' > fix.patch
        "#,
    );
    d
}

fn compare(d: &Path, fast_ref: Option<&str>) -> Workload {
    let v = |name: &str, git_ref: Option<&str>, patch: Option<PathBuf>| Variant {
        name: name.into(),
        git_ref: git_ref.map(String::from),
        patch: patch.map(|p| p.to_string_lossy().into()),
        install: None,
    };
    Workload::Compare(CompareWorkload {
        repo: Some(d.join("repo").to_string_lossy().into()),
        variants: vec![
            v("baseline", None, None),
            v("human", None, Some(d.join("fix.patch"))),
            v("fast", fast_ref, None),
        ],
        rounds: 3,
        warmup_rounds: 0,
        noise: 0.02,
        max_rounds: None,
        primary_metric: None,
        seed: None,
        worktree_patch: None,
        max_warmup_rounds: None,
        output_check: None,
        check: None,
        defences: false,
        install_cache: None,
        server: ServerWorkload {
            argv: vec!["python3".into(), "server.py".into()],
            workdir: None,
            ready: Readiness::Tcp { port: 8000 },
            startup_timeout_s: 60.0,
            client: Some(Client::Loadgen(LoadGen {
                endpoint: "http://127.0.0.1:8000/v1".into(),
                model: None,
                num_prompts: 1,
                request_rate: None,
                burstiness: 1.0,
                max_concurrency: None,
                input_len: 8,
                output_len: 8,
                prompt_file: Some(d.join("prompts.jsonl").to_string_lossy().into()),
                warmup_requests: 0,
                stream: true,
                seed: 0,
                slo: None,
                tokenizer: None,
                range_ratio: 0.0,
                prefix_len: 0,
                prefix_groups: 0,
                sweep: None,
                saturation: None,
                ramp_up: None,
                multi_turn: false,
                turn_delay_ms: 0.0,
                nonce: None,
                ignore_eos: true,
            })),
        },
    })
}

fn files(cache: &Path, sync: SyncSpec) -> Files {
    Files::new(cache.to_path_buf(), sync)
}

#[test]
fn a_workdir_travels_with_its_ignore_rules_and_the_task_points_at_the_copies() {
    let d = suite();
    let cache = tempfile::tempdir().unwrap();
    let f = files(
        cache.path(),
        SyncSpec {
            ignore: vec!["*.tmp".into()],
            ..Default::default()
        },
    );
    let mut t = task(command(&d.path().join("bench")));
    // On this machine `$ORCH_FILES` is the folder the root stands for.
    f.prepare(&mut t).unwrap();
    let here = d.path().canonicalize().unwrap();
    assert_eq!(
        t.env.get(ENV_FILES).map(String::as_str),
        Some(&*here.to_string_lossy())
    );
    let s = f.shipment(&t).unwrap();
    let rels: Vec<&str> = s.items.iter().map(|i| i.rel.as_str()).collect();
    // `.git`, `.gitignore`d `cache/`, `.dockerignore`d `ckpt/` and the
    // `sync.ignore`d `*.tmp` stay home; the ignore files themselves travel.
    assert_eq!(
        rels,
        vec![
            "bench/.dockerignore",
            "bench/.gitignore",
            "bench/run.py",
            "bench/sub/util.py"
        ]
    );
    let run = s.items.iter().find(|i| i.rel == "bench/run.py").unwrap();
    assert!(run.executable);
    assert_eq!(std::fs::read(&run.blob).unwrap(), b"print(1)\n");
    assert_eq!(run.blob, cache.path().join("blobs").join(&run.sha256));

    s.apply(&mut t, CELL_ROOT, CELL_BLOBS);
    let Workload::Command(c) = &t.workload else {
        unreachable!()
    };
    assert_eq!(c.workdir.as_deref(), Some("/orch/files/bench"));
    assert_eq!(t.env.get(ENV_FILES).map(String::as_str), Some("/orch/files"));
    let set = t.files.as_ref().unwrap();
    assert_eq!(set.blobs, "/orch/blobs");
    assert!(set
        .files
        .iter()
        .any(|e| e.path == "/orch/files/bench/sub/util.py" && e.size == 6));
    // No host path is left in the task.
    let json = serde_json::to_string(&t).unwrap();
    assert!(!json.contains(&*d.path().to_string_lossy()), "{json}");

    // The listing for `--dry-run` names each file with size and digest.
    let listing = s.listing(CELL_ROOT);
    assert!(
        listing.contains("/orch/files/bench/run.py  9 B  sha256:"),
        "{listing}"
    );
    assert!(listing.contains("4 files"), "{listing}");
}

#[test]
fn a_comparison_ships_its_repo_as_a_bundle_that_clones_to_the_same_commits() {
    let d = suite();
    let cache = tempfile::tempdir().unwrap();
    let f = files(cache.path(), SyncSpec::default());
    let mut t = task(compare(d.path(), Some("fast")));
    f.prepare(&mut t).unwrap();
    let s = f.shipment(&t).unwrap();
    let rels: Vec<&str> = s.items.iter().map(|i| i.rel.as_str()).collect();
    assert_eq!(rels, vec!["fix.patch", "prompts.jsonl", "repo.bundle"]);
    s.apply(&mut t, "/orch/files", "/orch/blobs");
    let Workload::Compare(c) = &t.workload else {
        unreachable!()
    };
    assert_eq!(c.repo.as_deref(), Some("/orch/files/repo.bundle"));
    assert_eq!(c.variants[1].patch.as_deref(), Some("/orch/files/fix.patch"));

    // The bundle clones, and both HEAD and the branch check out.
    let bundle = &s.items.iter().find(|i| i.rel == "repo.bundle").unwrap().blob;
    let out = tempfile::tempdir().unwrap();
    sh(
        out.path(),
        &format!(
            "git clone -q --no-checkout {} src && cd src && git checkout -q HEAD && grep -q 'a = 1' server.py && git checkout -q fast && grep -q 'a = 3' server.py",
            bundle.display()
        ),
    );
    // Same refs, same bundle: nothing new to send.
    let again = files(cache.path(), SyncSpec::default())
        .shipment(&t_again(d.path()))
        .unwrap();
    assert_eq!(
        again
            .items
            .iter()
            .find(|i| i.rel == "repo.bundle")
            .unwrap()
            .sha256,
        s.items.iter().find(|i| i.rel == "repo.bundle").unwrap().sha256
    );
}

fn t_again(d: &Path) -> TaskSpec {
    task(compare(d, Some("fast")))
}

#[test]
fn a_ref_the_repo_lacks_is_a_user_error() {
    let d = suite();
    let cache = tempfile::tempdir().unwrap();
    let f = files(cache.path(), SyncSpec::default());
    let e = f.shipment(&task(compare(d.path(), Some("nope")))).unwrap_err();
    assert!(e.is_user());
    assert!(e.to_string().contains("no commit `nope`"), "{e}");
    assert!(e.to_string().contains("\nhint: "), "{e}");
}

#[test]
fn a_dirty_tree_is_refused_or_shipped_as_a_patch() {
    let d = suite();
    sh(d.path(), "echo 'a = 9' > repo/server.py");
    let cache = tempfile::tempdir().unwrap();
    let mut t = task(compare(d.path(), Some("fast")));
    let e = files(cache.path(), SyncSpec::default())
        .prepare(&mut t)
        .unwrap_err();
    assert!(e.to_string().contains("uncommitted changes (`server.py`)"), "{e}");
    assert!(e.to_string().contains("sync: {dirty: patch}"), "{e}");

    let f = files(
        cache.path(),
        SyncSpec {
            dirty: Dirty::Patch,
            ..Default::default()
        },
    );
    f.prepare(&mut t).unwrap();
    let Workload::Compare(c) = &t.workload else {
        unreachable!()
    };
    let patch = c.worktree_patch.clone().unwrap();
    assert!(std::fs::read_to_string(&patch).unwrap().contains("+a = 9"));
    // The patch travels like the others.
    let s = f.shipment(&t).unwrap();
    assert!(s.items.iter().any(|i| i.role == "patch" && i.blob.exists()));
    s.apply(&mut t, CELL_ROOT, CELL_BLOBS);
    let Workload::Compare(c) = &t.workload else {
        unreachable!()
    };
    // It lands in `.orch/`; the root stays the suite's folder.
    assert!(
        c.worktree_patch
            .as_deref()
            .unwrap()
            .starts_with("/orch/files/.orch/"),
        "{c:?}"
    );
    assert_eq!(c.repo.as_deref(), Some("/orch/files/repo.bundle"));
}

#[test]
fn too_many_bytes_name_the_largest_files() {
    let d = suite();
    sh(d.path(), "head -c 5000 /dev/zero > bench/data.bin");
    let cache = tempfile::tempdir().unwrap();
    let f = files(
        cache.path(),
        SyncSpec {
            max_bytes: 1000,
            ..Default::default()
        },
    );
    let e = f.shipment(&task(command(&d.path().join("bench")))).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("over `sync.max_size` (1000 B)"), "{msg}");
    assert!(msg.contains("`bench/data.bin` (4.9 KiB)"), "{msg}");
    assert!(msg.contains("hint: "), "{msg}");
}

#[test]
fn a_missing_path_and_sync_paths_keep_their_layout() {
    let d = suite();
    let cache = tempfile::tempdir().unwrap();
    let e = files(cache.path(), SyncSpec::default())
        .shipment(&task(command(&d.path().join("nope"))))
        .unwrap_err();
    assert!(e.to_string().contains("the workdir `"), "{e}");

    // A shared folder beside the workdir lands beside it.
    sh(d.path(), "mkdir common && echo 'y = 1' > common/shared.py");
    let f = files(
        cache.path(),
        SyncSpec {
            paths: vec![d.path().join("common")],
            ..Default::default()
        },
    );
    let s = f
        .shipment(&task(command(&d.path().join("bench").join("sub"))))
        .unwrap();
    let rels: Vec<&str> = s.items.iter().map(|i| i.rel.as_str()).collect();
    assert_eq!(rels, vec!["bench/sub/util.py", "common/shared.py"]);
}
