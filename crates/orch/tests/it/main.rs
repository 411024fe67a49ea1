//! orch's integration tests: one test binary (one link of the CLI and orch-testkit's
//! servers, not one per file), its tests grouped by topic. Each group's `mod.rs` says what
//! it covers; `support` holds what they share (the one `orch` command, reading its output).
//! A test's path is `GROUP::FILE::NAME`: `cargo test -p orch --test it backends::slurm::`.

mod support;

mod backends;
mod commands;
mod store;
mod workloads;
