//! What a benchmark's scoring reports ([`BenchResults`]), and where the authors' data is.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::stats::Metric;
use super::table::Table;

/// The environment variable that points at the authors' public data.
pub const DATA_ENV: &str = "CANDOR_DATA";

/// The folder holding the authors' public data: `$CANDOR_DATA`, else `../shared/data`.
pub fn data_root() -> PathBuf {
    std::env::var_os(DATA_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("../shared/data"))
}

/// Everything a benchmark's scoring reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchResults {
    pub metrics: Vec<Metric>,
    pub tables: Vec<Table>,
}
