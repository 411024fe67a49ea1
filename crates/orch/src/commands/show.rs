use crate::cli::ShowArgs;
use crate::output;

pub fn show(store: &orch_store::Store, args: ShowArgs) -> anyhow::Result<i32> {
    let run = store.open_run(&args.run)?;
    let record = run.record()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!(
            "{}",
            output::run_text(&record, std::path::Path::new(&run.location()))
        );
    }
    Ok(if record.cells.iter().all(|c| c.status == "succeeded") {
        0
    } else {
        1
    })
}
