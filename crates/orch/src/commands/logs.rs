use crate::cli::{LogsArgs, Stream};
use orch_record::CellStatus;
use std::io::Write;

pub fn logs(store: &orch_store::Store, args: LogsArgs) -> anyhow::Result<i32> {
    let run = store.open_run(&args.run)?;
    let record = run.record()?;
    let cells: Vec<&orch_record::CellView> = match &args.cell {
        Some(id) => {
            // Fail with the store's message when the cell does not exist.
            run.check_cell(id)?;
            record.cells.iter().filter(|c| &c.id == id).collect()
        }
        None => {
            let failed: Vec<_> = record
                .cells
                .iter()
                .filter(|c| !matches!(c.status, CellStatus::Succeeded | CellStatus::Pending))
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
            let name = format!("{}.log", s.file_stem());
            if headers {
                writeln!(out, "==> cells/{}/{name} <==", cell.id)?;
            }
            if args.follow {
                out.flush()?;
                follow(&run, &cell.id, &name, args.tail)?;
                continue;
            }
            match run.read_cell_file(&cell.id, &name, 0)? {
                Some(bytes) => {
                    out.write_all(tail_text(&bytes, args.tail).as_bytes())?;
                }
                None => {
                    writeln!(out, "(no {} log: the cell has not started)", s.file_stem())?;
                }
            }
        }
    }
    Ok(0)
}

/// The last `n` lines of a log (all of it without `n`).
fn tail_text(bytes: &[u8], n: Option<usize>) -> String {
    let text = String::from_utf8_lossy(bytes);
    match n {
        Some(n) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n") + if lines.is_empty() { "" } else { "\n" }
        }
        None => text.into_owned(),
    }
}

/// Print a cell's log as it grows (from another machine too, for a store
/// in a bucket) until the cell has its record and the log is read whole.
fn follow(run: &orch_store::Run, cell: &str, name: &str, tail: Option<usize>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut offset = 0u64;
    let mut first = true;
    loop {
        // The record is read before the log: once it is there, the read
        // that follows sees the whole file.
        let done = run.cell_record(cell)?.is_some();
        if let Some(bytes) = run.read_cell_file(cell, name, offset)? {
            if !bytes.is_empty() {
                let text = if first {
                    tail_text(&bytes, tail)
                } else {
                    String::from_utf8_lossy(&bytes).into_owned()
                };
                out.write_all(text.as_bytes())?;
                out.flush()?;
                offset += bytes.len() as u64;
            }
            first = false;
        }
        if done {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(1000));
    }
}
