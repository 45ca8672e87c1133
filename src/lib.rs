//! Candor: an offline evaluation engine for large language models.
//!
//! Candor runs four published judge and feedback protocols (FB-Bench, RefuteBench,
//! ReaLMistake, Fennec) end to end with local models, deterministically: at temperature 0 a
//! prompt's tokens do not depend on batch size, batch neighbours, thread count or run.
//!
//! # Layout
//!
//! Dependencies point down: `cli` → `serve` / `report` → `store` → `bench` → `judge` → `engine`
//! → `model` → `weights` / `text` → `budget` (`serve` uses only `engine`, `model` and `text`),
//! and `stats` (pure statistics) below them all.
//! No module imports one that imports it back, and no two files import each other.
//!
//! - [`budget`]: budgets for untrusted work (a model file's chat template): per-thread memory
//!   ([`budget::alloc_budget`], the global allocator) and CPU time ([`budget::cpu_budget`]).
//! - [`text`]: the tokenizer (byte-level BPE and its pre-tokenizers, SentencePiece), chat
//!   messages ([`text::message`]) and the chat template with its size checks.
//! - [`weights`]: model files and their sources: GGUF ([`weights::gguf`], header checks in
//!   [`weights::gguf_check`]), safetensors checkpoints, local paths and Hub ids
//!   ([`weights::source`]), digests.
//! - [`model`]: compute. One description per architecture ([`model::arch::ModelConfig`]), the
//!   one forward pass for all of them ([`model::transformer`], its attention in
//!   `model/attention.rs`), the KV contract with the engine, matmul kernels per device
//!   ([`model::quant`] and `model/cuda/`) and the loaded model ([`model::runner::Model`]).
//! - [`engine`]: the scheduler (packed batched decoding), per-sequence KV state, the prefix
//!   cache, sampling, chat requests ([`engine::chat`]) and the throughput benchmark
//!   ([`engine::throughput`], `candor bench`). Knows no protocol.
//! - [`judge`]: judge prompts and the parsers of judge outputs, one file per judge kind.
//! - [`bench`]: the evaluation protocols, one folder each (`data.rs`, `plan.rs`, `score.rs`)
//!   behind one interface ([`bench::protocol`]); what scoring produces
//!   ([`bench::BenchResults`]: metrics, [`bench::stats`], and typed tables, [`bench::table`]).
//! - [`store`]: the run directory, manifest, append-only samples, resume, the runner
//!   ([`store::run`]), the types of `results.json` ([`store::run_results`]) and the progress
//!   interface ([`store::progress`]).
//! - [`report`]: `report.md`, `report.html` and the progress bar, rendered from results; the
//!   one place table cells and metrics become text ([`report::format`], for Markdown, HTML
//!   and CSV alike).
//! - [`serve`]: `candor serve`, the engine behind OpenAI-compatible HTTP endpoints.
//! - [`stats`]: statistics on plain numbers, at the bottom (imports nothing of Candor's):
//!   agreement between raters ([`stats::agreement`]: Cohen's and Fleiss' κ with intervals) and
//!   paired comparisons ([`stats::paired`]: bootstrap, sign-flip and McNemar tests, Holm,
//!   detectable differences).
//! - [`cli`]: argument parsing, one file per command; `main.rs` only installs the allocator
//!   and calls [`cli::run`].
//! - `skip` (tests only): the rule for a test that finds what it needs absent (skip loudly and
//!   count it, or fail under `CI=true`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod bench;
pub mod budget;
pub mod cli;
pub mod engine;
pub mod judge;
pub mod model;
pub mod report;
pub mod serve;
#[cfg(any(test, feature = "testkit"))]
pub mod skip;
pub mod stats;
pub mod store;
pub mod text;
pub mod weights;

/// The unit tests render chat templates, which need the memory budget's allocator (the
/// library itself installs none; see [`budget::alloc_budget`]).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: budget::alloc_budget::BudgetAllocator =
    budget::alloc_budget::BudgetAllocator;
