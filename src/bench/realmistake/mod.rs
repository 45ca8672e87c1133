//! ReaLMistake (Kamoi et al., 2024): binary error detection in LLM responses on three tasks,
//! with expert labels for GPT-4 and Llama 2 70B responses.
//!
//! `data.rs` reads the encrypted archives into memory, `score.rs` computes the authors'
//! precision / recall / F1 / accuracy (error is the positive class) and their averages, and
//! `plan.rs` turns an item into detection steps for Candor's own runs. The prompts and the
//! verdict rule are the judge's ([`crate::judge::error_detection`]).

pub mod data;
pub mod performance;
pub mod plan;
pub mod score;

use std::path::PathBuf;

/// Errors reading ReaLMistake files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{member}: {source}", path.display())]
    Zip {
        path: PathBuf,
        member: String,
        source: zip::result::ZipError,
    },
    #[error("{}:{member}: {message}", path.display())]
    Member {
        path: PathBuf,
        member: String,
        message: String,
    },
    #[error("{}:{member}:{line}: {message}", path.display())]
    Line {
        path: PathBuf,
        member: String,
        line: usize,
        message: String,
    },
    #[error("{}: no files named {what}", path.display())]
    Empty { path: PathBuf, what: &'static str },
    #[error("{task}/{response_model}: {message}")]
    Mismatch {
        task: String,
        response_model: String,
        message: String,
    },
}
