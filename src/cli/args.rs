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
}
