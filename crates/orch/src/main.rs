//! `orch`: the thin binary. Parsing in `cli`, behaviour in `commands`.
//!
//! ## What is where
//!
//! `cli.rs` (clap types only), `hosts.rs` (the backends' host sides, one
//! line each), `commands/` (setup, build, plan, run, bisect, history, down, ls, show, logs,
//! diagnose, report, compare, cost, prices, push, pull, doctor, init, completions: each a
//! straight script over `Host`/`Backend`; `commands/run/exec.rs` the one run loop of
//! `orch run` and `orch bisect`), `build.rs` (the commit `--version` names),
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

/// What `orch --version` prints: the version and commit, how it was
/// built, and the agents it can find (the one built in, the static agent
/// container backends ship, the static `orch` remote setups run).
fn version_text() -> String {
    let mut out = format!(
        "orch {} (commit {}, {} build, {}-linux)\n",
        env!("CARGO_PKG_VERSION"),
        env!("ORCH_COMMIT"),
        if orch_backend::IS_STATIC {
            "static"
        } else {
            "dynamic"
        },
        std::env::consts::ARCH
    );
    out.push_str("agent (local backend): built in (`orch agent`)\n");
    match orch_backend::find_static_agent() {
        Ok(p) => {
            let sha = orch_backend::sha256_file(&p)
                .map(|s| s.chars().take(12).collect::<String>())
                .unwrap_or_else(|e| format!("unreadable: {e}"));
            out.push_str(&format!("agent (containers): {} (sha256 {sha})\n", p.display()));
        }
        Err(_) => out.push_str("agent (containers): none\n"),
    }
    match orch_backend::find_static_orch() {
        Ok(p) => out.push_str(&format!("static orch (remote setups): {}\n", p.display())),
        Err(_) => out.push_str("static orch (remote setups): none\n"),
    }
    out
}

/// Threads of the runtime's blocking pool at most (tokio's default is 512).
/// Cells are not threads: a cell's file IO, its claim and the batched
/// writes of records take a thread from here for a moment.
const MAX_BLOCKING_THREADS: usize = 32;

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
    // `orch --version`: the version, commit and the agents this `orch` can find.
    if let Some(flag) = std::env::args().nth(1) {
        if flag == "--version" || flag == "-V" {
            print!("{}", version_text());
            std::process::exit(0);
        }
    }
    let cli = cli::Cli::parse();
    if let cli::Command::Agent { args } = &cli.command {
        std::process::exit(orch_agent::run::main_with_args(args));
    }
    // One TLS crypto provider for every TLS user in this binary (reqwest via
    // hf-hub today; cloud clients later). Installing twice is harmless.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    // Blocking work (the store's reads and writes, the cells' file IO)
    // runs on a capped pool: tokio's default (512 threads) would grow with
    // the cells at once; past the cap it waits its turn.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()
    {
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
