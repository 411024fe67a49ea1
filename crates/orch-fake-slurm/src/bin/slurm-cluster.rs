//! `slurm-cluster [--nodes N] [--max-submit-jobs N] -- COMMAND...`: start a test Slurm
//! cluster (`orch_fake_slurm`), run COMMAND with `SLURM_CONF` pointing at it, stop the
//! cluster, and exit with COMMAND's status. With `--max-submit-jobs N`, a one-node cluster
//! with accounting (MariaDB, slurmdbd) whose user may have at most N jobs queued or running
//! (`MaxSubmitJobs`: `sbatch` refuses the next). For scripts (`scripts/bench-slurm.sh`,
//! `scripts/bench-scale.sh`).

use std::process::{exit, Command};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (opts, cmd) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (&args[..0], &args[..]),
    };
    let (mut nodes, mut max_submit) = (1u32, None);
    let mut opts = opts.iter();
    while let Some(flag) = opts.next() {
        let n: u32 = opts
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| usage());
        match flag.as_str() {
            "--nodes" => nodes = n,
            "--max-submit-jobs" => max_submit = Some(n),
            _ => usage(),
        }
    }
    if max_submit.is_some() && nodes != 1 {
        eprintln!("slurm-cluster: `--max-submit-jobs` starts a one-node cluster: leave out `--nodes`");
        exit(2);
    }
    if cmd.is_empty() {
        usage();
    }
    let started = match max_submit {
        Some(n) => orch_fake_slurm::SlurmCluster::start_with_submit_limit(n),
        None => orch_fake_slurm::SlurmCluster::start_nodes(nodes),
    };
    let cluster = match started {
        Ok(c) => c,
        Err(e) => {
            eprintln!("slurm-cluster: cannot start the cluster: {e}");
            exit(1);
        }
    };
    let status = Command::new(&cmd[0]).args(&cmd[1..]).envs(cluster.env()).status();
    drop(cluster);
    match status {
        Ok(s) => exit(s.code().unwrap_or(1)),
        Err(e) => {
            eprintln!("slurm-cluster: cannot run `{}`: {e}", cmd[0]);
            exit(1);
        }
    }
}

fn usage() -> ! {
    eprintln!("usage: slurm-cluster [--nodes N] [--max-submit-jobs N] -- COMMAND [ARGS...]");
    exit(2);
}
