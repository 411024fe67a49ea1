mod build;
pub(crate) mod diagnose;
mod down;
mod logs;
mod ls;
mod plan;
mod run;
mod setup;
mod show;

use crate::cli::{Cli, Command};

/// Run a command; `Ok` carries the exit code.
pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let store = orch_store::Store::new(&cli.store);
    match cli.command {
        Command::Run(args) => run::run(&store, args).await,
        Command::Setup(args) => setup::setup(args).await,
        Command::Plan(args) => plan::plan(args),
        Command::Build(args) => build::build(args).await,
        Command::Down(args) => down::down(&store, args).await,
        Command::Diagnose(args) => diagnose::diagnose(args),
        Command::Ls(args) => ls::ls(&store, args),
        Command::Show(args) => show::show(&store, args),
        Command::Logs(args) => logs::logs(&store, args),
        Command::Agent { .. } => unreachable!("handled in main before the runtime starts"),
    }
}
