//! Top-level arguments; each subcommand's own arguments live beside its handler.

use clap::{Parser, Subcommand};

/// Candor: offline, reproducible evaluation of chat models with local judges.
#[derive(Debug, Parser)]
#[command(name = "candor", version, about)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per process: the size of the largest variant (`run`'s options) does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Fetch the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) into models/.
    Setup(super::setup::SetupArgs),
    /// Generate replies for chat conversations read from a JSONL file.
    Generate(super::generate::GenerateArgs),
    /// Rescore recorded outputs (the authors' published ones, or Candor's own).
    Score(super::score::ScoreArgs),
    /// Run a protocol end to end with local models into a resumable run directory.
    Run(super::run::RunArgs),
    /// Fetch the authors' data into the cache, or list what is cached.
    Data(super::data::DataArgs),
    /// Write one self-contained HTML page (index.html) for one run or a comparison of several.
    Report(super::report::ReportArgs),
    /// Paired comparisons of candidates scored on the same items (differences, intervals,
    /// tests, Holm, detectable differences).
    Compare(super::compare::CompareArgs),
    /// Join the shard directories of a `candor run … --shard I/N` into one run directory.
    Merge(super::merge::MergeArgs),
    /// Recompute a run's recorded steps on this machine and report any that differ.
    Verify(super::verify::VerifyArgs),
    /// Print a Slurm or Kubernetes script running a `candor run` as N shards, then the merge.
    Launch(super::launch::LaunchArgs),
    /// Prefill and decode throughput on synthetic prompts (llama-batched-bench's definitions).
    Bench(super::bench::BenchArgs),
    /// List the devices models can run on (`--device`): the CPU, and GPUs in a CUDA build.
    Devices(super::devices::DevicesArgs),
    /// Serve models over OpenAI-compatible HTTP (/v1/chat/completions, /v1/completions).
    Serve(super::serve::ServeArgs),
}
