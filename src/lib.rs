//! Candor: an offline evaluation engine for large language models.
//!
//! Candor runs four published judge and feedback protocols (FB-Bench, RefuteBench,
//! ReaLMistake, Fennec) end to end with local models, deterministically: at temperature 0 a
//! prompt's tokens do not depend on batch size, batch neighbours, thread count or run.
//!
//! # Layout
//!
//! Dependencies point down: `cli` → `report` / `store` → `bench` → `judge` → `engine` → `model`.
//!
//! - [`model`]: weights (GGUF), the llama architecture, tokenizer and chat template.
//! - [`engine`]: packed batched decoding, per-sequence KV state, sampling. Knows no benchmark.
//! - [`judge`]: judge prompts and the parsers of judge outputs, one file per judge kind.
//! - [`bench`]: one folder per protocol, each with `data.rs`, `plan.rs` and `score.rs`.
//! - [`store`]: the run directory, manifest, append-only samples and resume.
//! - [`report`]: tables and files written from results.
//! - [`cli`]: argument parsing; `main.rs` only calls [`cli::run`].

pub mod bench;
pub mod cli;
pub mod engine;
pub mod judge;
pub mod model;
pub mod report;
pub mod store;

/// The unit tests render chat templates, which need the memory budget's allocator (the
/// library itself installs none; see [`model::alloc_budget`]).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: model::alloc_budget::BudgetAllocator = model::alloc_budget::BudgetAllocator;
