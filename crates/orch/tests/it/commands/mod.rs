//! The commands around a run: bisect, campaigns, cost and budgets, history, report, setup, and orch as installed.

mod bisect;
mod campaign;
mod cost;
mod history;
mod install;
mod report;
mod setup;
