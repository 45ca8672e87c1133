//! ReaLMistake (Kamoi et al., 2024): binary error detection in LLM responses on three tasks,
//! with expert labels for GPT-4 and Llama 2 70B responses.
//!
//! `data.rs` reads the encrypted archives into memory, `score.rs` computes the authors'
//! precision / recall / F1 / accuracy (error is the positive class) and their averages,
//! `reliability.rs` the detectors' κ against the expert labels and with each other, and
//! `plan.rs` turns an item into detection steps for Candor's own runs. The prompts and the
//! verdict rule are the judge's ([`crate::judge::error_detection`]).

pub mod data;
pub mod figures;
pub mod performance;
pub mod plan;
pub mod protocol;
pub mod reliability;
pub mod score;

pub use protocol::ReaLMistake;

/// Errors reading ReaLMistake files: the loaders' shared type.
pub use crate::bench::loader::DataError as Error;
