//! Fennec (Liang et al., 2024): a judge that branches into evaluation criteria, writes a
//! scoring guideline per criterion, scores both responses per branch in both orders, merges
//! the branch scores and corrects low-scored responses.
//!
//! `data.rs` reads the evaluation sets (Auto-J pairwise, PandaLM, MT-Bench) and verdict files;
//! `score.rs` computes Auto-J's Agreement and Consistency and single-evaluation Accuracy with
//! seeded bootstrap intervals; `plan.rs` lays out the judge chain for Candor's own runs. The
//! prompts and parsers are the judge's ([`crate::judge::fennec`]).

pub mod data;
pub mod plan;
pub mod score;

use std::path::PathBuf;

/// Errors reading Fennec's evaluation sets and verdict files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Json { path: PathBuf, message: String },
    #[error("{}: item {item}: {message}", path.display())]
    Item {
        path: PathBuf,
        item: usize,
        message: String,
    },
    #[error("{}: {found} verdicts for {expected} items", path.display())]
    Count {
        path: PathBuf,
        found: usize,
        expected: usize,
    },
}
