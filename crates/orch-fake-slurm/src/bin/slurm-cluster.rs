//! `slurm-cluster [--nodes N] -- COMMAND...`: start a test Slurm cluster
//! (`orch_fake_slurm`), run COMMAND with `SLURM_CONF` pointing at it,
//! stop the cluster, and exit with COMMAND's status. For scripts
//! (`scripts/bench-slurm.sh`).

use std::process::{exit, Command};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (opts, cmd) = match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (&args[..0], &args[..]),
    };
    let nodes = match opts {
        [] => 1,
        [flag, n] if flag == "--nodes" => n.parse().unwrap_or_else(|_| usage()),
        _ => usage(),
    };
    if cmd.is_empty() {
        usage();
    }
    let cluster = match orch_fake_slurm::SlurmCluster::start_nodes(nodes) {
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
    eprintln!("usage: slurm-cluster [--nodes N] -- COMMAND [ARGS...]");
    exit(2);
}
