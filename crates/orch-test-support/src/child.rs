//! A fake server started as a child process that prints `url URL` as its
//! first line of stdout once it listens (`fake-kube`, `fake-modal`).

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

/// Spawn `cmd` with stdout piped, and read its first line, `url URL`: the
/// child and its URL. Panics (a test's failure) when it prints anything else.
pub fn spawn_url(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let mut line = String::new();
    let out = child.stdout.take().expect("stdout was piped");
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .unwrap_or_else(|e| panic!("read the first line of {cmd:?}: {e}"));
    let url = line
        .trim()
        .strip_prefix("url ")
        .unwrap_or_else(|| panic!("first line of {cmd:?}: {line:?}"))
        .to_string();
    (child, url)
}
