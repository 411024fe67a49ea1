//! The context files a Dockerfile can read: the sources of its `COPY` and
//! `ADD` instructions, as patterns over the context.
//!
//! A builder that receives the context file by file (Modal's image builder:
//! the official client mounts only the files the Dockerfile's `COPY`s name)
//! needs no more than these. The rules:
//!
//! - instructions are read after joining `\`-continued lines; comments and
//!   blank lines are skipped; the instruction name is case-insensitive;
//! - `COPY --from=...` reads another stage or image, not the context;
//! - flags (`--chown=`, `--chmod=`, `--link`, `--parents`, `--exclude=`) are
//!   not sources; the last argument is the destination;
//! - the JSON form (`COPY ["a b", "dest/"]`) is read as such;
//! - `.` (or `./`) is the whole context; a leading `./` and a trailing `/`
//!   are dropped; a source names a file, a folder (with all it holds) or a
//!   glob (`*`, `?`, `[...]`, `**`);
//! - `ADD` of a URL or a git repository reads nothing local; other `ADD`
//!   sources count as `COPY` sources (the official client leaves them out,
//!   and such a build then fails on the platform);
//! - a source that names a build variable (`$VAR`, `${VAR}`) or a heredoc
//!   (`<<EOF`) cannot be known before the build: the whole context is kept
//!   ([`CopySources::All`]).

use std::path::{Path, PathBuf};

/// What of the context a Dockerfile can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopySources {
    /// Everything (a `.` source, or a source known only at build time).
    All,
    /// The files matching any of these patterns (relative to the context,
    /// no leading `./`); none when the Dockerfile copies nothing.
    Patterns(Vec<String>),
}

/// The `COPY`/`ADD` sources of a Dockerfile's text.
pub fn copy_sources(dockerfile: &str) -> CopySources {
    let mut patterns = Vec::new();
    for instruction in instructions(dockerfile) {
        let (name, rest) = match instruction.split_once(char::is_whitespace) {
            Some((n, r)) => (n.to_ascii_uppercase(), r.trim()),
            None => continue,
        };
        if name != "COPY" && name != "ADD" {
            continue;
        }
        if rest.starts_with("<<") || rest.contains(" <<") {
            // A heredoc: its body is inline; a mixed form is read as `All`.
            let words: Vec<&str> = rest.split_whitespace().collect();
            let sources = &words[..words.len().saturating_sub(1)];
            if sources.iter().all(|w| w.starts_with("<<") || w.starts_with("--")) {
                continue;
            }
            return CopySources::All;
        }
        let mut args = Vec::new();
        let mut words = rest;
        // Flags come first in both forms.
        loop {
            let w = words.trim_start();
            if let Some(stripped) = w.strip_prefix("--") {
                let end = stripped.find(char::is_whitespace).unwrap_or(stripped.len());
                let flag = &stripped[..end];
                if flag.starts_with("from=") {
                    args.clear();
                    words = "";
                    break;
                }
                words = &stripped[end..];
            } else {
                words = w;
                break;
            }
        }
        if words.is_empty() {
            continue;
        }
        if words.starts_with('[') {
            match serde_json::from_str::<Vec<String>>(words) {
                Ok(v) => args = v,
                Err(_) => return CopySources::All,
            }
        } else {
            args = split_words(words);
        }
        if args.len() < 2 {
            continue;
        }
        args.pop(); // the destination
        for source in args {
            if source.contains('$') {
                return CopySources::All;
            }
            if name == "ADD" && is_remote(&source) {
                continue;
            }
            let s = source.trim_start_matches("./");
            let s = s.trim_end_matches('/');
            if s.is_empty() || s == "." || s == "**" || s == "*" {
                return CopySources::All;
            }
            patterns.push(s.to_string());
        }
    }
    patterns.sort();
    patterns.dedup();
    CopySources::Patterns(patterns)
}

/// `files` (relative to the context) that `sources` names; `keep` always stays.
pub fn filter_files(files: Vec<PathBuf>, sources: &CopySources, keep: &[&Path]) -> Vec<PathBuf> {
    let CopySources::Patterns(patterns) = sources else {
        return files;
    };
    let mut b = ignore::gitignore::GitignoreBuilder::new("/");
    let mut bad = false;
    for p in patterns {
        // Anchored at the context's root, as the Dockerfile means them.
        bad |= b.add_line(None, &format!("/{p}")).is_err();
    }
    let Ok(matcher) = b.build() else {
        return files;
    };
    if bad {
        return files;
    }
    files
        .into_iter()
        .filter(|f| {
            keep.iter().any(|k| f == k) || {
                let abs = Path::new("/").join(f);
                matcher.matched_path_or_any_parents(&abs, false).is_ignore()
            }
        })
        .collect()
}

fn is_remote(source: &str) -> bool {
    let s = source.to_ascii_lowercase();
    s.starts_with("http://") || s.starts_with("https://") || s.starts_with("git@") || s.ends_with(".git")
}

/// The Dockerfile's instructions, continuation lines joined.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        let (body, continued) = match line.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (line, false),
        };
        if !current.is_empty() && !body.is_empty() {
            current.push(' ');
        }
        current.push_str(body);
        if !continued {
            if !current.trim().is_empty() {
                out.push(std::mem::take(&mut current));
            }
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        out.push(current);
    }
    out
}

/// Shell-like words: whitespace-separated, with `'...'`, `"..."` and `\`.
fn split_words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(n) = chars.next() {
                    word.push(n);
                    in_word = true;
                }
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pats(text: &str) -> Vec<String> {
        match copy_sources(text) {
            CopySources::Patterns(p) => p,
            CopySources::All => panic!("all for {text}"),
        }
    }

    #[test]
    fn sources_of_copy_and_add() {
        assert_eq!(pats("FROM x\ncoPY files/dir1 ./smth\n"), vec!["files/dir1"]);
        assert_eq!(
            pats("COPY files/*.txt /dest/\nCOPY files/**/*.py /dest/\n"),
            vec!["files/**/*.py", "files/*.txt"]
        );
        assert_eq!(pats("COPY a \\\n   b \\\n  /dst/\n"), vec!["a", "b"]);
        assert_eq!(
            pats("COPY --chown=1000:1000 --chmod=644 ./app/ /app\n"),
            vec!["app"]
        );
        assert_eq!(
            pats("COPY --from=builder /out/bin /usr/bin/\nRUN true\n"),
            Vec::<String>::new()
        );
        assert_eq!(
            pats("COPY [\"my file.txt\", \"b\", \"/d/\"]\n"),
            vec!["b", "my file.txt"]
        );
        assert_eq!(pats("COPY 'sp ace' /d\n"), vec!["sp ace"]);
        assert_eq!(
            pats("ADD https://example.com/x.tgz /x\nADD local.tgz /y\n# COPY secret /z\n"),
            vec!["local.tgz"]
        );
        assert_eq!(pats("COPY <<EOF /etc/x\nhello\nEOF\n"), Vec::<String>::new());
        assert_eq!(pats("FROM debian\nRUN echo\n"), Vec::<String>::new());
        assert_eq!(copy_sources("COPY . /app\n"), CopySources::All);
        assert_eq!(copy_sources("COPY ./ /app\n"), CopySources::All);
        assert_eq!(copy_sources("ARG D=x\nCOPY $D /app\n"), CopySources::All);
        assert_eq!(copy_sources("COPY [\"a\", \n"), CopySources::All);
    }

    #[test]
    fn files_named_by_the_sources_are_kept() {
        let files: Vec<PathBuf> = [
            "Dockerfile",
            "app/main.py",
            "app/sub/x.py",
            "data/big.bin",
            "files/a.txt",
            "files/deep/b.py",
            "files/deep/c.txt",
            "req.txt",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let s = copy_sources("COPY app /app\nCOPY files/*.txt files/**/*.py req.txt /d/\n");
        let kept = filter_files(files.clone(), &s, &[Path::new("Dockerfile")]);
        let names: Vec<_> = kept.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            names,
            vec![
                "Dockerfile",
                "app/main.py",
                "app/sub/x.py",
                "files/a.txt",
                "files/deep/b.py",
                "req.txt"
            ]
        );
        assert_eq!(
            filter_files(files.clone(), &CopySources::All, &[]).len(),
            files.len()
        );
    }
}
