mod build;
mod compare;
pub(crate) mod cost;
pub(crate) mod diagnose;
mod down;
mod logs;
mod ls;
mod plan;
mod prices;
mod report;
mod run;
mod setup;
mod show;

use crate::cli::{Cli, Command};

/// Run a command; `Ok` carries the exit code.
pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let store = orch_store::Store::new(&cli.store);
    let prices = cli.prices.clone();
    let prices = prices.as_deref();
    match cli.command {
        Command::Run(args) => run::run(&store, prices, args).await,
        Command::Setup(args) => setup::setup(args).await,
        Command::Plan(args) => plan::plan(&store, prices, args),
        Command::Build(args) => build::build(args).await,
        Command::Down(args) => down::down(&store, args).await,
        Command::Diagnose(args) => diagnose::diagnose(args),
        Command::Ls(args) => ls::ls(&store, args),
        Command::Show(args) => show::show(&store, args),
        Command::Logs(args) => logs::logs(&store, args),
        Command::Report(args) => report::report(&store, args),
        Command::Compare(args) => compare::compare(&store, args),
        Command::Prices(args) => prices::prices(prices, args),
        Command::Cost(args) => cost::cost(&store, args),
        Command::Agent { .. } => unreachable!("handled in main before the runtime starts"),
    }
}
