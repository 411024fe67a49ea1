//! `orch-test-support`: what every crate's tests may use without building
//! a server: [`skip`], the one rule for tests that need an outside tool
//! (skipped with a note outside CI, failed under CI). No dependency at all,
//! so `cargo test -p orch-report` (or any small crate) builds nothing of
//! the fakes (`orch-fake-*`); `orch-testkit` re-exports it as `orch_testkit::skip`.
//! [`child::spawn_url`]: a fake server's binary started, its URL read.

pub mod child;
pub mod skip;
