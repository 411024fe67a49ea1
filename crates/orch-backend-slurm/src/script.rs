//! The batch script of one cell (`job.sh`, submitted with `sbatch`) and the
//! per-node script it starts with `srun` (`node.sh`). Pure text: no IO.
//!
//! ```text
//! job.sh   #SBATCH lines (name, comment, output, time, nodes, GPUs, CPUs, memory,
//!          partition, account, QOS, constraint, extra args), rendezvous variables,
//!          `srun ... sh node.sh`
//! node.sh  NODE_RANK/RANK from SLURM_NODEID; the agent, writing into the job folder
//!          (node 0) or `nodes/<rank>/` (the others), events on stdout, its stderr in
//!          `agent.log`
//! ```

use std::path::{Path, PathBuf};

/// How a GPU request is written for `sbatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuFlag {
    /// `--gres=gpu:TYPE:N` (per node): every Slurm version.
    #[default]
    Gres,
    /// `--gpus-per-node=TYPE:N`: clusters that configure GPUs as TRES.
    Gpus,
}

/// Everything one cell's job needs.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub run_id: String,
    pub cell_id: String,
    /// The folder on the shared filesystem the agent writes into.
    pub job_dir: PathBuf,
    /// Minutes for `--time`.
    pub time_minutes: u64,
    pub nodes: u32,
    /// GRES type (`h100`; empty: any type) and GPUs per node; `None`: CPU only.
    pub gpu: Option<(String, u32)>,
    pub gpu_flag: GpuFlag,
    /// CPUs of the (one) task on each node.
    pub cpus: Option<u32>,
    /// Memory per node, in MiB.
    pub mem_mib: Option<u64>,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub constraint: Option<String>,
    /// Further `sbatch` options, one per line (`--exclusive`, `--reservation=x`).
    pub extra_args: Vec<String>,
    /// The agent: program and the arguments before `run` (`orch agent`).
    pub agent: Vec<String>,
}

/// Job name of a cell: `orch-<run>-<cell>`, which `orch down` and cleanup look for.
pub fn job_name(run_id: &str, cell_id: &str) -> String {
    format!("orch-{}-{}", clean(run_id), clean(cell_id))
}

/// Job comment of a cell: `orch:<run>:<cell>` (no spaces: `scontrol -o` splits on them).
pub fn job_comment(run_id: &str, cell_id: &str) -> String {
    format!("orch:{}:{}", clean(run_id), clean(cell_id))
}

fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `--time` minutes for a cell: its timeout plus the kill grace plus a
/// minute for the agent's start and teardown, rounded up (Slurm counts minutes).
pub fn time_minutes(timeout_s: f64, kill_grace_s: f64) -> u64 {
    let s = timeout_s.max(0.0) + kill_grace_s.max(0.0) + 60.0;
    (s / 60.0).ceil().max(1.0) as u64
}

/// Quote for `sh`.
pub fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.' | ':' | '=' | ',' | '+'))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Quote a `#SBATCH` value (sbatch reads these lines with shell-like quoting).
fn directive_value(s: &str) -> String {
    if s.chars().any(|c| c.is_whitespace() || c == '"' || c == '\'') {
        format!("\"{}\"", s.replace('\\', r"\\").replace('"', "\\\""))
    } else {
        s.to_string()
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The `#SBATCH` options of a job, in order.
pub fn sbatch_options(spec: &JobSpec) -> Vec<String> {
    let mut o = vec![
        format!("--job-name={}", job_name(&spec.run_id, &spec.cell_id)),
        format!("--comment={}", job_comment(&spec.run_id, &spec.cell_id)),
        format!("--output={}", path_str(&spec.job_dir.join("slurm.log"))),
        "--open-mode=append".to_string(),
        format!("--time={}", spec.time_minutes),
        format!("--nodes={}", spec.nodes.max(1)),
        "--ntasks-per-node=1".to_string(),
        // A preempted or failed node's cell is orch's to retry (`--resume`),
        // never rerun by Slurm behind its back.
        "--no-requeue".to_string(),
    ];
    if let Some((ty, n)) = &spec.gpu {
        let what = if ty.is_empty() {
            n.to_string()
        } else {
            format!("{ty}:{n}")
        };
        o.push(match spec.gpu_flag {
            GpuFlag::Gres => format!("--gres=gpu:{what}"),
            GpuFlag::Gpus => format!("--gpus-per-node={what}"),
        });
    }
    if let Some(c) = spec.cpus {
        o.push(format!("--cpus-per-task={c}"));
    }
    if let Some(m) = spec.mem_mib {
        o.push(format!("--mem={}M", m.max(1)));
    }
    for (flag, v) in [
        ("partition", &spec.partition),
        ("account", &spec.account),
        ("qos", &spec.qos),
        ("constraint", &spec.constraint),
    ] {
        if let Some(v) = v {
            o.push(format!("--{flag}={v}"));
        }
    }
    o.extend(spec.extra_args.iter().cloned());
    o
}

/// `job.sh`: the batch script.
pub fn job_script(spec: &JobSpec) -> String {
    let mut s = String::from("#!/bin/sh\n");
    for opt in sbatch_options(spec) {
        let line = match opt.split_once('=') {
            Some((k, v)) => format!("#SBATCH {k}={}", directive_value(v)),
            None => format!("#SBATCH {opt}"),
        };
        s.push_str(&line);
        s.push('\n');
    }
    let gpus_per_node = spec.gpu.as_ref().map(|g| g.1).unwrap_or(0);
    let nodes = spec.nodes.max(1);
    s.push_str(&format!(
        r#"# Written by orch for cell {cell} of run {run}.
# Rendezvous for multi-node workloads (torchrun-style): the first node of the
# allocation, a port per job, one process per node started by orch.
MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | head -n 1)"
[ -n "$MASTER_ADDR" ] || MASTER_ADDR="$(hostname)"
export MASTER_ADDR
export MASTER_PORT="${{ORCH_MASTER_PORT:-$((20000 + ${{SLURM_JOB_ID:-0}} % 20000))}}"
export NNODES={nodes} WORLD_SIZE={nodes} NPROC_PER_NODE={nproc}
exec srun --kill-on-bad-exit=1 --nodes={nodes} --ntasks-per-node=1 sh {node}
"#,
        cell = spec.cell_id,
        run = spec.run_id,
        nproc = gpus_per_node.max(1),
        node = sh_quote(&path_str(&spec.job_dir.join("node.sh"))),
    ));
    s
}

/// `node.sh`: what `srun` starts on every node of the job.
pub fn node_script(spec: &JobSpec) -> String {
    let dir = sh_quote(&path_str(&spec.job_dir));
    let task = sh_quote(&path_str(&spec.job_dir.join("task.json")));
    let agent: Vec<String> = spec.agent.iter().map(|a| sh_quote(a)).collect();
    format!(
        r#"#!/bin/sh
# One per node of the job (srun). Node 0 writes into the job folder; the others
# into nodes/<rank>/, so every node's hardware and telemetry are kept.
NODE_RANK="${{SLURM_NODEID:-0}}"
export NODE_RANK
export RANK="$NODE_RANK"
out={dir}
if [ "$NODE_RANK" != 0 ]; then
  out={dir}/nodes/"$NODE_RANK"
  mkdir -p "$out"
fi
echo "${{SLURMD_NODENAME:-$(hostname)}}" > "$out/node"
exec {agent} run --task {task} --out "$out" > "$out/events.jsonl" 2> "$out/agent.log"
"#,
        agent = agent.join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            run_id: "20261123-0100-q-ab12".into(),
            cell_id: "t.h100x8.bs-8".into(),
            job_dir: PathBuf::from("/shared/orch jobs/r/c"),
            time_minutes: 11,
            nodes: 2,
            gpu: Some(("h100".into(), 8)),
            gpu_flag: GpuFlag::Gres,
            cpus: Some(16),
            mem_mib: Some(4096),
            partition: Some("gpu".into()),
            account: Some("lab".into()),
            qos: None,
            constraint: Some("ib&h100".into()),
            extra_args: vec!["--exclusive".into()],
            agent: vec!["/shared/bin/orch".into(), "agent".into()],
        }
    }

    #[test]
    fn job_script_asks_for_everything_and_sets_rendezvous() {
        let s = job_script(&spec());
        for line in [
            "#SBATCH --job-name=orch-20261123-0100-q-ab12-t.h100x8.bs-8",
            "#SBATCH --comment=orch:20261123-0100-q-ab12:t.h100x8.bs-8",
            "#SBATCH --output=\"/shared/orch jobs/r/c/slurm.log\"",
            "#SBATCH --time=11",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --gres=gpu:h100:8",
            "#SBATCH --cpus-per-task=16",
            "#SBATCH --mem=4096M",
            "#SBATCH --partition=gpu",
            "#SBATCH --account=lab",
            "#SBATCH --constraint=ib&h100",
            "#SBATCH --exclusive",
            "#SBATCH --no-requeue",
            "export NNODES=2 WORLD_SIZE=2 NPROC_PER_NODE=8",
            "exec srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=1 sh '/shared/orch jobs/r/c/node.sh'",
        ] {
            assert!(s.lines().any(|l| l == line), "no `{line}` in\n{s}");
        }
        assert!(!s.contains("--qos"));
        assert!(s.contains("MASTER_ADDR=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\""));
        assert!(s.contains("export MASTER_PORT="));
        let mut g = spec();
        g.gpu_flag = GpuFlag::Gpus;
        g.gpu = Some((String::new(), 2));
        assert!(job_script(&g).contains("#SBATCH --gpus-per-node=2\n"));
        g.gpu = None;
        assert!(!job_script(&g).contains("--gres") && !job_script(&g).contains("--gpus"));
    }

    #[test]
    fn node_script_gives_each_node_its_folder_and_rank() {
        let s = node_script(&spec());
        assert!(s.contains("NODE_RANK=\"${SLURM_NODEID:-0}\""), "{s}");
        assert!(
            s.contains("out='/shared/orch jobs/r/c'/nodes/\"$NODE_RANK\""),
            "{s}"
        );
        assert!(s.contains(
            "exec /shared/bin/orch agent run --task '/shared/orch jobs/r/c/task.json' --out \"$out\" > \"$out/events.jsonl\" 2> \"$out/agent.log\""
        ), "{s}");
    }

    #[test]
    fn quoting_and_minutes() {
        assert_eq!(sh_quote("/a/b-c.d"), "/a/b-c.d");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(time_minutes(3.0, 5.0), 2);
        assert_eq!(time_minutes(1800.0, 10.0), 32);
        assert_eq!(job_name("r", "a/b c"), "orch-r-a_b_c");
    }
}
