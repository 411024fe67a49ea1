//! `orch prices`: the prices in use and where each came from.

use crate::cli::PricesArgs;
use crate::output;
use std::path::Path;

pub fn prices(file: Option<&Path>, args: PricesArgs) -> anyhow::Result<i32> {
    let prices = orch_cost::Prices::load(file)?;
    let backend = args.backend.map(|k| k.as_str());
    let rows = prices.rows(backend);
    if args.json {
        let out = serde_json::json!({
            "user_file": prices.user_file,
            "catalog": "built in (crates/orch-cost/prices/catalog.yaml)",
            "prices": rows,
            "backends": prices
                .backends
                .values()
                .filter(|b| backend.is_none_or(|n| n == b.name))
                .map(|b| serde_json::json!({"name": b.name, "note": b.note, "default_free": b.default_free}))
                .collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let per_hour = if r.unit.starts_with("usd_") {
                format!("${:.4}/h", r.value * 3600.0)
            } else {
                String::new()
            };
            vec![
                r.backend.clone(),
                r.item.clone(),
                format!("{}", r.value),
                r.unit.clone(),
                per_hour,
                r.source.clone(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(
            &["BACKEND", "ITEM", "VALUE", "UNIT", "PER HOUR", "SOURCE"],
            &table
        )
    );
    for b in prices
        .backends
        .values()
        .filter(|b| backend.is_none_or(|n| n == b.name))
    {
        let unlisted = if b.default_free { "free" } else { "unpriced" };
        println!(
            "{}: {}; what is not listed is {unlisted}",
            b.name,
            b.note.as_deref().unwrap_or("")
        );
    }
    match &prices.user_file {
        Some(p) => println!("your prices: {}", p.display()),
        None => println!(
            "your prices: none (write `{}` or pass `--prices FILE`; see docs/cost.md)",
            orch_cost::catalog::default_user_path()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "~/.config/orch/prices.yaml".into())
        ),
    }
    Ok(0)
}
