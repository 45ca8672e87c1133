//! What scoring produces, for every benchmark alike: headline metrics with their bootstrap
//! intervals and unscored counts, and tables for reports.

use serde::{Deserialize, Serialize};

use super::stats::Interval;

/// One headline number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// snake_case, e.g. `error_correction`, `feedback_acceptance`, `f1`.
    pub name: String,
    /// The value with its seeded bootstrap 95% interval.
    pub interval: Interval,
    /// Units that entered the metric.
    pub n: usize,
    /// Units left out because a judge's output could not be parsed.
    pub unscored: usize,
}

/// A table for reports: a title, column names and rows of cells already formatted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// Everything a benchmark's scoring reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    pub metrics: Vec<Metric>,
    pub tables: Vec<Table>,
}
