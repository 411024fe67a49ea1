//! `orch`: the thin binary. Parsing in `cli`, behaviour in `commands`.
//!
//! ## What is where
//!
//! `cli.rs` (clap types only), `hosts.rs` (the backends' host sides, one
//! line each), `commands/` (setup, build, plan, run, down, ls, show, logs, diagnose,
//! report, compare, cost, prices, push: each a straight script over `Host`/`Backend`),
//! `output.rs` (progress bar or plain lines, tables), `error.rs` (exit codes from
//! `ErrorClass`; the soft open-file limit raised to the hard one at start), and the hidden `orch agent` subcommand that is the agent library. It
//! does not: hold logic another crate could own.

mod cli;
mod commands;
mod error;
mod hosts;
mod output;

use clap::Parser;

/// Raise the soft limit of open files to the hard one: a run of many cells
/// holds pipes and logs for each. Where it cannot be raised, a run that
/// runs out says so (`too many open files`) and stays resumable.
fn raise_open_files() {
    // SAFETY: plain syscalls on a struct owned here.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn main() {
    // `orch cell-init -- PROGRAM ...`: the agent's cell launcher, re-executed
    // from `orch agent` (hidden; returns at once otherwise).
    orch_agent::cellinit::dispatch();
    // `orch ... | head` ends quietly, like any Unix tool, instead of panicking.
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    raise_open_files();
    let cli = cli::Cli::parse();
    if let cli::Command::Agent { args } = &cli.command {
        std::process::exit(orch_agent::run::main_with_args(args));
    }
    // One TLS crypto provider for every TLS user in this binary (reqwest via
    // hf-hub today; cloud clients later). Installing twice is harmless.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = match runtime.block_on(commands::dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            let code = error::exit_code(&e);
            eprintln!("error: {}", error::render(&e));
            code
        }
    };
    std::process::exit(code);
}
