//! What cells run and what comes of them: the real `orch` on the local backend, end to end.

mod compare_check;
mod hardware;
mod run;
mod safety;
mod seeds;
mod servers;
