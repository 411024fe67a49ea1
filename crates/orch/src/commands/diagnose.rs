//! `orch diagnose`: name the cause of a failure from log files.

use crate::error::user;
use std::io::{IsTerminal, Read};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct DiagnoseArgs {
    /// Log file(s) to read, diagnosed as one log in the order given (e.g. stdout then stderr); `-` for stdin
    pub files: Vec<PathBuf>,
    /// Print `{"kind": ..., "evidence": [...], "hint": ...}` as JSON
    #[arg(long)]
    pub json: bool,
    /// Extra rule file layered over the defaults and the user's `~/.config/orch/diagnose.yaml`
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// Measure the rules on a folder of labelled logs (`<kind>__<name>.log`, sub-folders are
    /// splits) instead: accuracy by kind and leave-one-source-out (`--json` for the full report)
    #[arg(long, value_name = "DIR", conflicts_with = "files")]
    pub eval: Option<PathBuf>,
    /// Use only the `--rules` file, without the built-in rules and the user's file (to compare rule sets)
    #[arg(long, requires = "rules")]
    pub no_default_rules: bool,
}

/// Exit 0 whenever a diagnosis was printed, whatever its kind.
pub fn diagnose(args: DiagnoseArgs) -> anyhow::Result<i32> {
    let loaded = match (&args.rules, args.no_default_rules) {
        (Some(path), true) => orch_diagnose::Rules::from_path(path),
        _ => orch_diagnose::Rules::load_with_user(args.rules.as_deref()),
    };
    let rules = loaded.map_err(|e| {
        user(format!(
            "{e}\nhint: fix the rule file (format: crates/orch-diagnose/README.md), or unset `{}`",
            orch_diagnose::RULES_ENV
        ))
    })?;
    if let Some(dir) = &args.eval {
        let logs = orch_diagnose::eval::load_dir(dir).map_err(|e| {
            user(format!(
                "{e}\nhint: `--eval` takes a folder of `<kind>__<name>.log` files (see crates/orch-diagnose/README.md)"
            ))
        })?;
        let report = orch_diagnose::eval::evaluate(&logs, &rules);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.to_text());
        }
        return Ok(0);
    }
    let files = if args.files.is_empty() {
        if std::io::stdin().is_terminal() {
            return Err(user(
                "no log to read\nhint: name log file(s), or pipe one in with `-` (`orch logs <run> | orch diagnose -`)",
            ));
        }
        vec![PathBuf::from("-")]
    } else {
        args.files
    };
    let mut log = String::new();
    let mut stdin_read = false;
    for path in &files {
        let bytes = if path.as_os_str() == "-" {
            if stdin_read {
                continue;
            }
            stdin_read = true;
            let mut buf = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut buf)
                .map_err(|e| anyhow::anyhow!("cannot read stdin: {e}"))?;
            buf
        } else {
            std::fs::read(path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    user(format!(
                        "log file {} does not exist\nhint: check the path (`orch logs <run>` prints a run's logs)",
                        path.display()
                    ))
                } else {
                    user(format!("cannot read log file {}: {e}", path.display()))
                }
            })?
        };
        // Logs may hold stray non-UTF-8 bytes (progress bars, binary output).
        log.push_str(&String::from_utf8_lossy(&bytes));
        if !log.is_empty() && !log.ends_with('\n') {
            log.push('\n');
        }
    }
    let d = orch_diagnose::diagnose(&log, &rules);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        print!("{}", d.to_text());
    }
    Ok(0)
}
