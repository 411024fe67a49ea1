//! The verdicts of each interval method on the same rounds, side by side
//! (`scripts/bench-compare.sh` feeds it the rounds of real A/A and
//! known-effect runs).
//!
//! stdin: a JSON list of `{"metric": M, "base": [...], "other": [...], "noise": 0.02}`;
//! stdout: a JSON list of `{"student_t": {...}, "percentile_bootstrap": {...}}`.

use orch_stats::{compare, Method, Options};
use serde_json::{json, Value};
use std::io::Read;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text)?;
    let items: Vec<Value> = serde_json::from_str(&text)?;
    let mut out = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let vals = |k: &str| -> Vec<f64> {
            it[k]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default()
        };
        let (base, other) = (vals("base"), vals("other"));
        let metric = it["metric"].as_str().unwrap_or("output_throughput");
        let noise = it["noise"].as_f64().unwrap_or(0.02);
        let mut row = serde_json::Map::new();
        for method in [Method::StudentT, Method::PercentileBootstrap] {
            let o = Options {
                method,
                seed: i as u64,
                ..Options::new(noise)
            };
            let c = compare(metric, &base, &other, &o);
            row.insert(
                serde_json::to_value(method)?.as_str().unwrap_or("?").to_string(),
                match c {
                    Some(c) => json!({"verdict": c.verdict, "ci_low": c.ci_low, "ci_high": c.ci_high, "ratio": c.ratio}),
                    None => Value::Null,
                },
            );
        }
        out.push(Value::Object(row));
    }
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
