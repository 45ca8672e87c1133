//! The four protocols, each in the same parts: `data.rs` (files to typed items), `plan.rs`
//! (one item to its generation steps), `score.rs` (transcripts to metrics), and
//! `protocol.rs`, which puts them behind the one [`protocol::Protocol`] interface the runner
//! and the command line use.
//!
//! Shared here: where the authors' public data lives ([`data_root`]), the loaders' error type
//! and JSONL reader ([`loader`]), what every benchmark's scoring produces ([`BenchResults`]:
//! headline metrics with the statistics behind them, [`stats`], and typed report tables,
//! [`table`]), and the per-item values behind the metrics ([`item_scores`]).

pub mod fbbench;
pub mod fennec;
pub mod figure;
pub mod item_scores;
pub mod loader;
pub mod own_data;
pub mod panel;
pub mod plan;
pub mod protocol;
pub mod realmistake;
pub mod refutebench;
pub mod reliability;
pub mod stats;
pub mod table;

pub use loader::DataError;
pub use protocol::{Protocol, ProtocolError, ProtocolOptions};

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use stats::Metric;
use table::Table;

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

/// The report figures of every protocol that declares them, in report order.
pub fn declared_figures() -> [figure::Figures; 4] {
    [
        fbbench::figures::FIGURES,
        refutebench::figures::FIGURES,
        realmistake::figures::FIGURES,
        fennec::figures::FIGURES,
    ]
}

/// The figures `protocol` declares, if it does.
pub fn figures(protocol: &str) -> Option<figure::Figures> {
    declared_figures()
        .into_iter()
        .find(|f| f.protocol == protocol)
}
