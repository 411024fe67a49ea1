//! The commands around a run: bisect, cost and budgets, history, report, setup, and orch as installed.

mod bisect;
mod cost;
mod history;
mod install;
mod report;
mod setup;
