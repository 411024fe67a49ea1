//! Write synthetic runs into a folder store, for `scripts/bench-history.sh`:
//! `cargo run -p orch-history --features synth --example synth -- STORE SUITE N SEED [INDEX:SHIFT...]`
//! (`500:-0.1`: a 10% drop from run 500 on). Prints the number of runs written.

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return Err("usage: synth STORE SUITE N SEED [INDEX:SHIFT...]".into());
    }
    let n: usize = args[2].parse()?;
    let seed: u64 = args[3].parse()?;
    let mut shifts = Vec::new();
    for s in &args[4..] {
        let (i, f) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}` is not a shift\nhint: INDEX:FRACTION, `500:-0.1`"))?;
        shifts.push((i.parse::<usize>()?, f.parse::<f64>()?));
    }
    let store = orch_store::Store::new(&args[0]);
    let ids = orch_history::synth::write_runs(&store, &args[1], n, &shifts, seed)?;
    println!("{}", ids.len());
    Ok(())
}
