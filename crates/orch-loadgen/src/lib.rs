//! `orch-loadgen`: the load generator of the agent's `server` workload and of
//! comparisons, with what it needs and nothing of the GPU path (no candle).
//!
//! `loadgen.rs`: OpenAI-compatible load (gamma arrivals, ramps or a trace's
//! times, multi-turn conversations, sweeps and the saturation search, SLO
//! goodput, latency from the intended send time, nonces and anti-gaming signals,
//! `outputs.jsonl`) with vllm bench serve field names, its stages and `run` there, with
//! `loadgen/prompts.rs` (requests and bodies), `loadgen/driver.rs` (the schedule and the
//! event-loop driver), `loadgen/stream.rs` (answers parsed, tokens counted, checks) and
//! `loadgen/summary.rs` (per-request lines, a stage's metrics); `evclient.rs`: the
//! one-thread mio HTTP/1.1 client (keep-alive, chunked, SSE lines, timeouts);
//! `tokens.rs`: the model's `tokenizer.json` loaded as `transformers` runs it
//! (padding and truncation off; counts, random prompts of exact lengths as the
//! server counts them); `dataset.rs`: prompt files (lists, ShareGPT, JSONL,
//! traces); `lengths.rs`: the answers of `outputs.jsonl` ([`lengths::Answer`])
//! and each variant's answers paired with the baseline's for the same prompts
//! every round (`shorter_outputs`, `inflated_token_counts`: the defence that does
//! not rest on the server's own `usage`). A workload reports through
//! `orch-workload`'s `Ctx`; no async runtime, clap or cloud SDK.

pub mod dataset;
pub mod evclient;
pub mod lengths;
pub mod loadgen;
pub mod tokens;

pub use tokens::TokensError;
