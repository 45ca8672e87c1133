//! Fennec (Liang et al., 2024): a judge that branches into evaluation criteria, writes a
//! scoring guideline per criterion, scores both responses per branch in both orders, merges
//! the branch scores and corrects low-scored responses.
//!
//! `data.rs` reads the evaluation sets (Auto-J pairwise, PandaLM, MT-Bench) and verdict files;
//! `score.rs` computes Auto-J's Agreement and Consistency and single-evaluation Accuracy with
//! seeded bootstrap intervals; `plan.rs` lays out the judge chain for Candor's own runs. The
//! prompts and parsers are the judge's ([`crate::judge::fennec`]).

pub mod data;
pub mod figures;
pub mod plan;
pub mod protocol;
pub mod score;

pub use protocol::Fennec;

/// Errors reading Fennec's evaluation sets and verdict files: the loaders' shared type.
pub use crate::bench::loader::DataError as Error;
