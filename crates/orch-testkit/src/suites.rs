//! Suites whose files must travel with their cells: the shipped stand-in
//! 3-way comparison at toy sizes (a local repository, two local patches)
//! and a server in a local workdir loaded from a local prompt file. A test
//! runs them on a backend whose containers see only their image's root and
//! compares with `--backend local`.

use std::path::{Path, PathBuf};

/// What an image root needs for these suites (debootstrap's `--include`):
/// `crate::rootfs::debian_root_with("bookworm", PACKAGES)`.
pub const PACKAGES: &[&str] = &["git", "python3", "python3-numpy"];

/// This checkout (the stand-in's repository).
pub fn checkout() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

/// A TCP port free on this machine now, for a server that runs on the host
/// (`--backend local`, slurm) beside other tests.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn rewrite(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "the shipped manifest no longer has {from:?}");
    text.replacen(from, to, 1)
}

/// `manifests/seed-threeway-standin.yaml` at toy sizes under `dir`, with
/// `image` and `gpus: [none]`: its repository is this checkout (it travels
/// as a git bundle; `sync: {dirty: patch}` carries uncommitted changes), its
/// patches are this checkout's files. Returns the manifest's path.
pub fn standin_toy(dir: &Path, image: &str) -> PathBuf {
    let root = checkout();
    let text = std::fs::read_to_string(root.join("manifests/seed-threeway-standin.yaml"))
        .expect("manifests/seed-threeway-standin.yaml");
    let t = rewrite(&text, "repo: ..\n", &format!("repo: {}\n", root.display()));
    let t = rewrite(
        &t,
        "../examples/seed-threeway/patches/human.patch",
        &root
            .join("examples/seed-threeway/patches/human.patch")
            .to_string_lossy(),
    );
    let t = rewrite(
        &t,
        "../examples/seed-threeway/patches/agent.patch",
        &root
            .join("examples/seed-threeway/patches/agent.patch")
            .to_string_lossy(),
    );
    let t = rewrite(
        &t,
        "image: {build: seed-ml}\n",
        &format!("image: {image}\nsync: {{dirty: patch}}\n"),
    );
    let t = rewrite(&t, r#"gpus: ["H100:2", "H100:4", "H100:8"]"#, "gpus: [none]");
    let port = free_port();
    let t = rewrite(&t, r#"--port, "8000""#, &format!(r#"--port, "{port}""#));
    let t = rewrite(&t, "port: 8000}", &format!("port: {port}}}"));
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
    let t = rewrite(
        &t,
        "num_prompts: 256, max_concurrency: 256, input_len: 128, output_len: 128, warmup_requests: 8",
        "num_prompts: 3, max_concurrency: 2, input_len: 8, output_len: 4, warmup_requests: 1, seed: 7",
    );
    let t = rewrite(
        &t,
        "PYTHONUNBUFFERED: \"1\"\n",
        "PYTHONUNBUFFERED: \"1\"\n  OPENBLAS_NUM_THREADS: \"1\"\n  OMP_NUM_THREADS: \"1\"\n",
    );
    std::fs::create_dir_all(dir).expect("suite folder");
    let path = dir.join("standin.yaml");
    std::fs::write(&path, t).expect("write the manifest");
    path
}

/// A server (the stand-in's `server.py`, copied into `dir/bench/` and named as
/// `{{files}}/bench/server.py`, with a
/// `.gitignore`d `cache/` that must not travel) started in its workdir, and
/// the load generator reading `dir/prompts.json`. Returns the manifest's path.
pub fn workdir_toy(dir: &Path, image: &str) -> PathBuf {
    let bench = dir.join("bench");
    std::fs::create_dir_all(bench.join("cache")).expect("bench folder");
    std::fs::copy(
        checkout().join("examples/seed-threeway/server.py"),
        bench.join("server.py"),
    )
    .expect("server.py");
    std::fs::write(bench.join(".gitignore"), "cache/\n").expect(".gitignore");
    std::fs::write(bench.join("cache/big.bin"), vec![0u8; 1 << 16]).expect("cache file");
    std::fs::write(
        dir.join("prompts.json"),
        r#"["the files travel with the cell", {"prompt": "a prompt from a file on the host"}]"#,
    )
    .expect("prompts.json");
    let port = free_port();
    let text = format!(
        r#"name: travelling-workdir
image: {image}
gpus: [none]
env: {{PYTHONUNBUFFERED: "1", OPENBLAS_NUM_THREADS: "1", OMP_NUM_THREADS: "1"}}
measure: {{timeout: 5m}}
benchmarks:
  - name: serve
    workload:
      server:
        command: [python3, "{{{{files}}}}/bench/server.py", --port, "{port}", --gpus, "{{{{gpu_count}}}}", --d-model, "32", --layers, "1", --heads, "2", --vocab, "256", --max-len, "256"]
        workdir: bench
        ready: {{http: /health, port: {port}}}
        startup_timeout: 2m
      client:
        loadgen: {{model: standin, num_prompts: 4, max_concurrency: 1, output_len: 4, prompt_file: prompts.json, seed: 7}}
"#
    );
    let path = dir.join("workdir.yaml");
    std::fs::write(&path, text).expect("write the manifest");
    path
}
