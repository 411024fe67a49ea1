//! `orch init [NAME] [--containers]`: a starter suite that runs at once on
//! the local backend (`NAME/orch.yaml`, or `./orch.yaml`), with comments
//! pointing at the other backends; `--containers` adds a
//! `containers/<name>/Dockerfile` skeleton. Never overwrites a file.

use crate::cli::InitArgs;
use crate::error::user;
use std::path::{Path, PathBuf};

/// A suite name from a folder name: letters, digits, `-`, `_` and `.`.
fn suite_name(dir: &Path) -> String {
    let raw = std::fs::canonicalize(dir)
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let name: String = raw
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string();
    if name.is_empty() {
        "starter".into()
    } else {
        name.chars().take(60).collect()
    }
}

/// The starter suite's text.
pub fn suite_text(name: &str, containers: bool) -> String {
    let image = if containers {
        format!(
            "# Container backends run every cell in this image, built from containers/{name}/\n# (`orch build -f orch.yaml`; kubernetes: `--push REGISTRY`). The local backend ignores it.\nimage: {{build: {name}}}\n"
        )
    } else {
        "# Container backends (docker, kubernetes) run each cell in an image, which this suite does not\n# name yet: `image: python:3.11-slim` (any image works: orch mounts its agent; `docker pull` it\n# first), or `image: {build: NAME}` built from containers/NAME/Dockerfile (`orch init --containers`).\n".to_string()
    };
    format!(
        r#"# A starter suite written by `orch init`. Run it on this machine (CPU, under a minute):
#   orch run -f orch.yaml          then: orch show latest, orch report latest
#
# Elsewhere (check first with `orch doctor`; it spends nothing):
#   orch run -f orch.yaml --backend docker       # a container per cell on this machine's Docker
#   orch run -f orch.yaml --backend kubernetes   # a Job per cell (`kubernetes:` section below)
#   orch run -f orch.yaml --backend modal        # a Modal sandbox per cell (`modal token new` first)
#   orch run -f orch.yaml --backend slurm        # a batch job per cell (`slurm:` section below)
# GPUs: `gpus: [H100, A100-80GB:2, L4]` below, or `--gpu H100:8` on the command line.
# Model weights: a `models:` list, then `orch setup -f orch.yaml` once.
name: {name}
description: a small CPU transformer sweep and one command cell
gpus: [none]
{image}measure:
  warmup: 1
  repetitions: 3
  timeout: 2m
benchmarks:
  # A decoder-only transformer built into orch: random weights, forward + backward.
  - name: transformer
    workload:
      transformer:
        context: 32
        batch: 2
        vocab: 512
        pass: train
    matrix:
      preset: [nano]

  # Any program: metrics from `ORCH_METRIC name=value` lines on stdout, or a
  # JSON object written to $ORCH_METRICS_FILE.
  - name: command
    workload:
      shell: |
        echo "hello from $ORCH_CELL_ID"
        echo "ORCH_PHASE measure"
        i=0; while [ $i -lt 20000 ]; do i=$((i + 1)); done
        echo "ORCH_METRIC loop_iterations=$i"

# kubernetes:                 # --backend kubernetes (deploy/kubernetes/orch-role.yaml: the Role it needs)
#   namespace: bench
#   agent_image: REGISTRY/orch-agent:TAG   # `orch build --agent --push REGISTRY` prints it
# slurm:                      # --backend slurm
#   partition: gpu
#   shared_dir: /shared/orch
"#
    )
}

const DOCKERFILE: &str = r#"# The image of this suite's cells on container backends (`orch build -f orch.yaml`).
# orch's agent is not in the image: the docker backend mounts a static agent, the
# kubernetes backend installs it from the agent image, modal mounts it; any image works.
FROM python:3.11-slim
# RUN pip install --no-cache-dir numpy torch
# COPY bench.py /app/bench.py
WORKDIR /app
"#;

/// Write `path` only when it does not exist.
fn create(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(user(format!(
                "`{}` already exists; `orch init` never overwrites a file\nhint: run `orch init NAME` to start a suite in a new folder, or remove `{}`",
                path.display(),
                path.display()
            )))
        }
        Err(e) => return Err(anyhow::anyhow!("cannot create `{}`: {e}", path.display())),
    };
    f.write_all(text.as_bytes())
        .map_err(|e| anyhow::anyhow!("cannot write `{}`: {e}", path.display()))
}

pub fn init(args: InitArgs) -> anyhow::Result<i32> {
    let dir: PathBuf = args.name.clone().unwrap_or_else(|| PathBuf::from("."));
    let suite = dir.join("orch.yaml");
    let name = suite_name(&dir);
    let dockerfile = dir.join("containers").join(&name).join("Dockerfile");
    // Refuse before writing anything.
    for p in std::iter::once(&suite).chain(args.containers.then_some(&dockerfile)) {
        if p.exists() {
            return Err(user(format!(
                "`{}` already exists; `orch init` never overwrites a file\nhint: run `orch init NAME` to start a suite in a new folder, or remove `{}`",
                p.display(),
                p.display()
            )));
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| anyhow::anyhow!("cannot create `{}`: {e}", dir.display()))?;
    create(&suite, &suite_text(&name, args.containers))?;
    println!("wrote {}", suite.display());
    if args.containers {
        let ctx = dockerfile.parent().unwrap_or(dir.as_path());
        std::fs::create_dir_all(ctx)
            .map_err(|e| anyhow::anyhow!("cannot create `{}`: {e}", ctx.display()))?;
        create(&dockerfile, DOCKERFILE)?;
        println!("wrote {}", dockerfile.display());
    }
    let cd = match &args.name {
        Some(n) => format!("cd {} && ", n.display()),
        None => String::new(),
    };
    println!("next: {cd}orch run -f orch.yaml   (then `orch doctor` to see which other backends are ready)");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_folder_and_suit_the_store() {
        assert_eq!(suite_name(Path::new("/tmp/My Bench!")), "my-bench");
        assert_eq!(suite_name(Path::new("/")), "starter");
    }

    #[test]
    fn the_starter_suite_parses_with_and_without_containers() {
        for containers in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let f = tmp.path().join("orch.yaml");
            std::fs::write(&f, suite_text("demo", containers)).unwrap();
            if containers {
                let c = tmp.path().join("containers/demo");
                std::fs::create_dir_all(&c).unwrap();
                std::fs::write(c.join("Dockerfile"), DOCKERFILE).unwrap();
            }
            let plan = orch_manifest::load(&f, &Default::default()).unwrap();
            assert_eq!(plan.suite, "demo");
            assert_eq!(
                plan.cells.len(),
                2,
                "{:?}",
                plan.cells.iter().map(|c| &c.id).collect::<Vec<_>>()
            );
            assert_eq!(plan.cells.iter().any(|c| c.image.is_some()), containers);
        }
    }
}
