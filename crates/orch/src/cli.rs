//! Command-line types (parsing only; behaviour lives in `commands/`).

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "orch",
    version,
    about = "Run GPU benchmark suites and keep every number, log and failure cause"
)]
pub struct Cli {
    /// Result store folder
    #[arg(long, global = true, env = "ORCH_STORE", default_value = orch_store::DEFAULT_STORE)]
    pub store: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every cell of a suite (or the unfinished cells of an earlier run)
    Run(RunArgs),
    /// Download the suite's model weights once into the weights volume (hub cache layout)
    Setup(SetupArgs),
    /// Build the suite's images from `containers/<name>/`, skipping what has not changed
    Build(BuildArgs),
    /// Remove whatever a run left behind (containers)
    Down(DownArgs),
    /// Name the cause of a failed server or command from its logs
    Diagnose(crate::commands::diagnose::DiagnoseArgs),
    /// Expand the matrix and check what a run needs (weights, GPU memory fit); spends nothing
    Plan(PlanArgs),
    /// List the runs in the store
    Ls(LsArgs),
    /// Show one run: its cells, statuses, metrics and failures
    Show(ShowArgs),
    /// Print the logs of a run's cells, kept after the cell is gone
    Logs(LogsArgs),
    /// The agent built into `orch` (used by the local backend)
    #[command(hide = true, disable_help_flag = true)]
    Agent {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Suite manifest (YAML)
    #[arg(
        short = 'f',
        long = "file",
        required_unless_present = "resume",
        conflicts_with = "resume"
    )]
    pub file: Option<PathBuf>,
    /// GPUs for every cell, replacing the manifest's lists (comma-separated: `H100:8,A100-80GB:2`, `none`)
    #[arg(long)]
    pub gpu: Option<String>,
    /// Where cells run
    #[arg(long, default_value = "local")]
    pub backend: String,
    /// Cells run at once (default: the manifest's `concurrency`, else 1)
    #[arg(short = 'j', long)]
    pub jobs: Option<usize>,
    /// Print the run record as JSON on stdout when done
    #[arg(long)]
    pub json: bool,
    /// Run the cells of an earlier run that did not finish (id, id prefix or `latest`)
    #[arg(long, value_name = "RUN")]
    pub resume: Option<String>,
    /// Weights volume of the local backend (a hub cache)
    #[arg(long, env = "ORCH_WEIGHTS_DIR", value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// Run even when the suite's model weights are not set up
    #[arg(long)]
    pub no_preflight: bool,
    /// Keep containers after their result is stored (docker backend)
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Suite manifest whose images to build
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Push the built images to this registry (credentials from the Docker config)
    #[arg(long, value_name = "REGISTRY")]
    pub push: Option<String>,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    /// Run id, id prefix, or `latest`
    pub run: String,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Suite manifest whose `models` to set up
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// A model to set up: `org/name` or `org/name@revision` (repeatable)
    #[arg(long = "model", value_name = "REPO[@REVISION]")]
    pub models: Vec<String>,
    /// Where the weights go
    #[arg(long, default_value = "local")]
    pub backend: String,
    /// Weights volume of the local backend (default: `<cache dir>/orch/weights`)
    #[arg(long, env = "ORCH_WEIGHTS_DIR", value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// HTTP requests in flight at once
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Print a JSON report on stdout
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Suite manifest
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// GPUs for every cell, replacing the manifest's lists
    #[arg(long)]
    pub gpu: Option<String>,
    /// Weights volume of the local backend
    #[arg(long, env = "ORCH_WEIGHTS_DIR", value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Run id, id prefix, or `latest`
    pub run: String,
    /// Print the run record as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Stream {
    Stdout,
    Stderr,
    Agent,
}

impl Stream {
    pub fn file_stem(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
            Stream::Agent => "agent",
        }
    }
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Run id, id prefix, or `latest`
    pub run: String,
    /// Cell id (default: the failed cells, or every cell when none failed)
    pub cell: Option<String>,
    /// Only this stream (default: stdout and stderr)
    #[arg(long, value_enum)]
    pub stream: Option<Stream>,
    /// Only the last N lines of each log
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
}
