use crate::cli::{LogsArgs, Stream};
use std::io::Write;

pub fn logs(store: &orch_store::Store, args: LogsArgs) -> anyhow::Result<i32> {
    let run = store.open_run(&args.run)?;
    let record = run.record()?;
    let cells: Vec<&orch_store::CellView> = match &args.cell {
        Some(id) => {
            // Fail with the store's message when the cell does not exist.
            run.log_path(id, "stdout")?;
            record.cells.iter().filter(|c| &c.id == id).collect()
        }
        None => {
            let failed: Vec<_> = record
                .cells
                .iter()
                .filter(|c| c.status != "succeeded" && c.status != "pending")
                .collect();
            if failed.is_empty() {
                record.cells.iter().collect()
            } else {
                failed
            }
        }
    };
    let streams: Vec<Stream> = match args.stream {
        Some(s) => vec![s],
        None => vec![Stream::Stdout, Stream::Stderr],
    };
    let mut out = std::io::stdout().lock();
    let headers = cells.len() > 1 || streams.len() > 1;
    for cell in cells {
        if let Some(f) = &cell.failure {
            eprintln!("# {} {}: {} ({})", cell.id, cell.status, f.message, f.kind);
        }
        if let Some(d) = &cell.diagnosis {
            eprintln!("# cause: {}", d.kind);
            for e in &d.evidence {
                eprintln!("#   | {e}");
            }
            eprintln!("# hint: {}", d.hint);
        }
        for s in &streams {
            let path = run.log_path(&cell.id, s.file_stem())?;
            if headers {
                writeln!(
                    out,
                    "==> {} <==",
                    path.strip_prefix(run.dir()).unwrap_or(&path).display()
                )?;
            }
            match std::fs::read(&path) {
                Ok(bytes) => {
                    let text = String::from_utf8_lossy(&bytes);
                    let text = match args.tail {
                        Some(n) => {
                            let lines: Vec<&str> = text.lines().collect();
                            lines[lines.len().saturating_sub(n)..].join("\n")
                                + if lines.is_empty() { "" } else { "\n" }
                        }
                        None => text.into_owned(),
                    };
                    out.write_all(text.as_bytes())?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    writeln!(out, "(no {} log: the cell has not started)", s.file_stem())?;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(0)
}
