//! Command-line types (parsing only; behaviour lives in `commands/`).

use clap::{Args, Parser, Subcommand, ValueEnum};
use orch_backend::Kind;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "orch",
    version,
    about = "Run GPU benchmark suites and keep every number, log and failure cause"
)]
pub struct Cli {
    /// Result store: a folder, or `s3://bucket/prefix` (credentials from the AWS chain)
    #[arg(long, global = true, env = "ORCH_STORE", default_value = orch_store::DEFAULT_STORE)]
    pub store: String,
    /// Prices file over the built-in catalog (default: `$ORCH_PRICES`, else `~/.config/orch/prices.yaml`)
    #[arg(long, global = true, value_name = "FILE")]
    pub prices: Option<PathBuf>,
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
    /// Remove whatever a run left behind (containers, Jobs, sandboxes, slurm jobs)
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
    /// Write a run's report: rankings, $ per 1k tokens, comparisons, failures, hardware (md, csv, json, html)
    Report(ReportArgs),
    /// Compare two runs cell by cell with their cost (the same sweep on different GPUs, say)
    Compare(CompareArgs),
    /// The prices in use (catalog and your prices file) and where each came from
    Prices(PricesArgs),
    /// Spend across the runs in the store, with what failures wasted
    Cost(CostArgs),
    /// Copy a run of the store into a bucket (`--to s3://bucket/prefix`), verified
    Push(PushArgs),
    /// Copy a run from a bucket (`--from s3://bucket/prefix`) into the store, verified
    Pull(PullArgs),
    /// A suite's metrics across the store's runs: series per GPU and backend, change points, failures
    History(HistoryArgs),
    /// Find the first commit of a comparison's repository whose metric differs from a good one
    Bisect(BisectArgs),
    /// Check each backend and the store: what is configured, what works, what to do next; spends nothing
    Doctor(DoctorArgs),
    /// Write a starter suite that runs at once on this machine (`NAME/orch.yaml`, or `./orch.yaml`)
    Init(InitArgs),
    /// Print a shell completion script (`orch completions bash > ~/.local/share/bash-completion/completions/orch`)
    Completions(CompletionsArgs),
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
    pub backend: Kind,
    /// Cells run at once (default: the manifest's `concurrency`, else the backend's default, which `orch plan` shows)
    #[arg(short = 'j', long)]
    pub jobs: Option<usize>,
    /// Print the run record as JSON on stdout when done
    #[arg(long)]
    pub json: bool,
    /// Run the cells of an earlier run that did not finish (id, id prefix or `latest`)
    #[arg(long, value_name = "RUN")]
    pub resume: Option<String>,
    /// A new run that takes each cell unchanged since RUN and finished there from RUN's record, and runs the others (a campaign with rows added)
    #[arg(long, value_name = "RUN", requires = "file")]
    pub reuse: Option<String>,
    /// Weights volume of the local backend (a hub cache)
    #[arg(long, env = "ORCH_WEIGHTS_DIR", value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// Run even when the suite's model weights are not set up
    #[arg(long)]
    pub no_preflight: bool,
    /// Keep containers after their result is stored (docker backend)
    #[arg(long)]
    pub keep: bool,
    /// Fail a cell whose GPUs differ from what it asked for (default: flag it `hardware_mismatch`)
    #[arg(long)]
    pub strict_hardware: bool,
    /// Cap on the run's cost in US dollars: refuse to start above it, stop cells before passing it
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,
    /// Kubernetes: the kubeconfig context (default: the suite's, else the current one; `KUBECONFIG` names the file)
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Kubernetes: the namespace of the Jobs (default: the suite's, else the context's)
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Print what would be applied and run nothing (kubernetes: the Jobs as YAML)
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct PricesArgs {
    /// Only this backend's prices
    #[arg(long)]
    pub backend: Option<Kind>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CostBy {
    Gpu,
    Backend,
    Suite,
    Status,
    Model,
    Run,
}

#[derive(Debug, Args)]
pub struct CostArgs {
    /// Only cells that finished in this past period (`7d`, `24h`, `30m`)
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// Group the spend by
    #[arg(long, value_enum, default_value = "gpu")]
    pub by: CostBy,
    /// Print JSON
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV
    #[arg(long)]
    pub csv: bool,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Suite manifest whose images to build
    #[arg(short = 'f', long = "file", required_unless_present = "agent")]
    pub file: Option<PathBuf>,
    /// Build the agent image instead (`FROM scratch`, the static agent at `/orch-agent`): the
    /// kubernetes backend's init container installs the agent from it into any cell image
    #[arg(long, conflicts_with = "file")]
    pub agent: bool,
    /// Push the built images to this registry (credentials from the Docker config)
    #[arg(long, value_name = "REGISTRY")]
    pub push: Option<String>,
}

#[derive(Debug, Args)]
pub struct DownArgs {
    /// Run id, id prefix, or `latest`
    pub run: String,
    /// Kubernetes: the kubeconfig context (default: the current one)
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Kubernetes: the namespace (default: the run's suite's, else the context's)
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
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
    pub backend: Kind,
    /// Weights volume of the local backend (default: `<cache dir>/orch/weights`)
    #[arg(long, env = "ORCH_WEIGHTS_DIR", value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// HTTP requests in flight at once
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Print a JSON report on stdout
    #[arg(long)]
    pub json: bool,
    /// Download from a batch job on a compute node instead of here (`--backend slurm`, for login nodes that may not download)
    #[arg(long)]
    pub as_job: bool,
    /// Kubernetes: the kubeconfig context (default: the suite's, else the current one)
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Kubernetes: the namespace (default: the suite's, else the context's)
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Suite manifest
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Backend whose prices the estimate uses
    #[arg(long, default_value = "local")]
    pub backend: Kind,
    /// GPUs for every cell, replacing the manifest's lists
    #[arg(long)]
    pub gpu: Option<String>,
    /// Weights volume of the local backend
    #[arg(long, env = "ORCH_WEIGHTS_DIR", value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// Kubernetes: the kubeconfig context (the weights PVC is checked by a short Job there)
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Kubernetes: the namespace (default: the suite's, else the context's)
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The suite's name (as `orch ls` lists it)
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    pub suite: Option<String>,
    /// The suite's manifest (its `name:` is the suite)
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Only this benchmark
    #[arg(long)]
    pub benchmark: Option<String>,
    /// Only this metric (e.g. `output_throughput`)
    #[arg(long)]
    pub metric: Option<String>,
    /// Only runs of the last `30d`, `12h`, `2w`...
    #[arg(long)]
    pub since: Option<String>,
    /// Print the history as JSON
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print one CSV row per point
    #[arg(long)]
    pub csv: bool,
    /// Also write the charts as one HTML page to this file
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BisectArgs {
    /// Suite manifest with a `compare:` benchmark
    #[arg(short = 'f', long = "file", required_unless_present = "resume")]
    pub file: Option<PathBuf>,
    /// A commit (ref) of the benchmark's `repo:` that is good
    #[arg(long, value_name = "REF", required_unless_present = "resume")]
    pub good: Option<String>,
    /// A later commit (ref) that differs from the good one
    #[arg(long, value_name = "REF", required_unless_present = "resume")]
    pub bad: Option<String>,
    /// The `compare:` benchmark (needed when the suite has several)
    #[arg(long)]
    pub benchmark: Option<String>,
    /// The metric that decides each step (default: the benchmark's `primary_metric`)
    #[arg(long)]
    pub metric: Option<String>,
    /// Where the steps run
    #[arg(long, default_value = "local")]
    pub backend: Kind,
    /// Weights volume of the local backend (a hub cache)
    #[arg(long, env = "ORCH_WEIGHTS_DIR", value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// Cap on the whole bisection's cost in US dollars: no step starts that would pass it
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,
    /// Continue the bisection with this id (as printed when it started)
    #[arg(long, value_name = "ID")]
    pub resume: Option<String>,
    /// Run even when the suite's model weights are not set up
    #[arg(long)]
    pub no_preflight: bool,
    /// Print the bisection (steps and result) as JSON on stdout
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
    #[command(flatten)]
    pub score: ScoreArgs,
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
    /// Keep printing what a running cell writes until it ends (one cell, one stream at a time)
    #[arg(short = 'f', long)]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run id, id prefix, or `latest`
    pub run: String,
    /// Formats, comma-separated: `md`, `csv`, `json`, `html` (or `all`)
    #[arg(long, default_value = "md", value_name = "FORMATS")]
    pub format: String,
    /// Folder for the files (`<run>.<format>`); without it one format prints on stdout and several go to `<store>/<run>/report/`
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Throughput metric to rank by (default: `output_throughput`, `tokens_per_s`, ... see docs/report.md)
    #[arg(long, value_name = "NAME")]
    pub metric: Option<String>,
    /// Latency family to summarise (`step_time`, `ttft`, `tpot`, `itl`, `e2el`, ...)
    #[arg(long, value_name = "NAME")]
    pub latency: Option<String>,
    #[command(flatten)]
    pub score: ScoreArgs,
}

/// How a campaign (a suite with `tasks:`) is scored; each default is its
/// paper's (docs/campaigns.md). Re-scoring reads the store and runs nothing.
#[derive(Debug, Clone, Default, Args)]
pub struct ScoreArgs {
    /// ISO-Bench: the agent within this fraction of the human's speed is `matched` [default: 0.05]
    #[arg(long, value_name = "FRACTION")]
    pub match_band: Option<f64>,
    /// GSO Opt@K: the share of the human's speedup an attempt must exceed [default: 0.95]
    #[arg(long, value_name = "FRACTION")]
    pub opt_threshold: Option<f64>,
    /// GSO Opt@K: the least speedup over the baseline, rounded to 0.1 [default: 1.2]
    #[arg(long, value_name = "X")]
    pub opt_min_speedup: Option<f64>,
}

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The first run (id, id prefix, or `latest`)
    pub run_a: String,
    /// The second run
    pub run_b: String,
    /// Metric to compare (default: each cell's throughput metric)
    #[arg(long, value_name = "NAME")]
    pub metric: Option<String>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub score: ScoreArgs,
}

#[derive(Debug, Args)]
pub struct PushArgs {
    /// Run ids, id prefixes, or `latest` (in `--store`)
    #[arg(required = true)]
    pub runs: Vec<String>,
    /// The bucket: `s3://bucket/prefix`
    #[arg(long, value_name = "URL")]
    pub to: String,
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// Run id, id prefix, or `latest` (in the bucket)
    pub run: String,
    /// The bucket: `s3://bucket/prefix`
    #[arg(long, value_name = "URL")]
    pub from: String,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Only this backend (default: every backend)
    #[arg(long)]
    pub backend: Option<Kind>,
    /// A suite: its backend sections, models and GPUs narrow what is checked
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// Weights volume of the local and slurm backends
    #[arg(long, env = "ORCH_WEIGHTS_DIR", value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// Kubernetes: the kubeconfig context (default: the suite's, else the current one)
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Kubernetes: the namespace (default: the suite's, else the context's)
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Folder to create the suite in (default: the current folder)
    pub name: Option<PathBuf>,
    /// Also write a `containers/<name>/Dockerfile` skeleton for container backends
    #[arg(long)]
    pub containers: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: Shell,
}
