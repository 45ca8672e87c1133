//! FB-Bench (Li et al., 2024): how chat models respond to human feedback on a preset first
//! response — correcting a deficient one (Error Correction) or holding a right one against
//! misleading feedback (Response Maintenance) — graded by a judge against a per-item
//! checklist. Reference implementation: PKU-Baichuan-MLSystemLab/FB-Bench.
//!
//! `data` loads the authors' files, `prompts` builds the follow-up and judge conversations,
//! `plan` turns an item into its generation steps (`panel`: several judges' verdicts into one), `score` turns verdicts into the published
//! tables (with `pynum`, the Python arithmetic those numbers depend on), `published` reads the
//! authors' own tables back for comparison. This module only wires them.

pub mod data;
pub mod figures;
pub mod panel;
pub mod plan;
pub mod prompts;
pub mod protocol;
pub mod published;
pub mod pynum;
pub mod score;

pub use protocol::FbBench;

pub use data::{BenchType, Dataset, FbBenchError, Item, JudgementRecord, Version};
pub use plan::FbBenchPlan;
pub use score::{ModelUnits, Rule, Unit};
