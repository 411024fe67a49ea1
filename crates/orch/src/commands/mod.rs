mod bisect;
mod build;
mod campaign;
mod compare;
mod completions;
pub(crate) mod cost;
pub(crate) mod diagnose;
pub(crate) mod doctor;
mod down;
mod history;
mod init;
mod logs;
mod ls;
mod plan;
mod prices;
mod push;
mod report;
mod run;
mod setup;
mod show;

use crate::cli::{Cli, Command};

/// Run a command; `Ok` carries the exit code.
pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let store = match &cli.command {
        // Neither reads the store; opening a bucket would cost a request.
        Command::Diagnose(_)
        | Command::Prices(_)
        | Command::Setup(_)
        | Command::Build(_)
        | Command::Doctor(_)
        | Command::Init(_)
        | Command::Completions(_) => orch_store::Store::new(&cli.store),
        _ => open_store(&cli.store)?,
    };
    let prices = cli.prices.clone();
    let prices = prices.as_deref();
    let result = match cli.command {
        // The store is one of what it checks: by its location, never opened first.
        Command::Doctor(args) => doctor::doctor(&cli.store, prices, args).await,
        command_ => command(&store, prices, command_).await,
    };
    // What reading skipped (a damaged record, an unreadable run): named,
    // each costing only its own cell or run.
    for w in store.take_warnings() {
        eprintln!("warning: {w}");
    }
    result
}

async fn command(
    store: &orch_store::Store,
    prices: Option<&std::path::Path>,
    command: Command,
) -> anyhow::Result<i32> {
    match command {
        Command::Run(args) => run::run(store, prices, args).await,
        Command::Setup(args) => setup::setup(args).await,
        Command::Plan(args) => plan::plan(store, prices, args).await,
        Command::Build(args) => build::build(args).await,
        Command::Down(args) => down::down(store, args).await,
        Command::Diagnose(args) => diagnose::diagnose(args),
        Command::Ls(args) => ls::ls(store, args),
        Command::History(args) => history::history(store, args),
        Command::Bisect(args) => bisect::bisect(store, prices, args).await,
        Command::Show(args) => show::show(store, args),
        Command::Logs(args) => logs::logs(store, args),
        Command::Report(args) => report::report(store, args),
        Command::Compare(args) => compare::compare(store, args),
        Command::Prices(args) => prices::prices(prices, args),
        Command::Cost(args) => cost::cost(store, args),
        Command::Push(args) => push::push(store, args),
        Command::Pull(args) => push::pull(store, args),
        Command::Init(args) => init::init(args),
        Command::Completions(args) => completions::completions(args),
        Command::Doctor(_) => unreachable!("handled in dispatch: it opens the store itself"),
        Command::Agent { .. } => unreachable!("handled in main before the runtime starts"),
    }
}

/// The store named by `--store`/`ORCH_STORE`: `s3://bucket/prefix` or a folder.
pub(crate) fn open_store(location: &str) -> anyhow::Result<orch_store::Store> {
    if location.starts_with("s3://") {
        let s3 = orch_store_s3::S3Store::open(location)?;
        return Ok(orch_store::Store::with_backend(std::sync::Arc::new(s3)));
    }
    Ok(orch_store::Store::new(location))
}
