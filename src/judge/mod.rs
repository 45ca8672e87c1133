//! Judge prompts and the parsers of judge outputs, one file per judge kind.
//!
//! A judge's output that cannot be parsed is [`Verdict::Unscored`] with a reason: it is left
//! out of the metric and counted beside it, never turned into a grade.

pub mod checklist;
pub mod error_detection;
pub mod feedback_acceptance;
pub mod fennec;

use serde::{Deserialize, Serialize};

/// The parsed outcome of one judge output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict<T> {
    Scored(T),
    Unscored { reason: String },
}

impl<T> Verdict<T> {
    pub fn unscored(reason: impl Into<String>) -> Self {
        Verdict::Unscored {
            reason: reason.into(),
        }
    }
    pub fn scored(&self) -> Option<&T> {
        match self {
            Verdict::Scored(t) => Some(t),
            Verdict::Unscored { .. } => None,
        }
    }
}
