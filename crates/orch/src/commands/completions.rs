//! `orch completions bash|zsh|fish`: the shell's completion script on stdout,
//! made by `clap_complete` from the CLI's own types.

use crate::cli::{Cli, CompletionsArgs, Shell};
use clap::CommandFactory;

pub fn completions(args: CompletionsArgs) -> anyhow::Result<i32> {
    let shell = match args.shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut cmd = Cli::command();
    clap_complete::generate(shell, &mut cmd, "orch", &mut std::io::stdout());
    Ok(0)
}
