//! The four protocols, each in the same parts: `data.rs` (files to typed items), `plan.rs`
//! (one item to its generation steps), `score.rs` (transcripts to metrics), and
//! `protocol.rs`, which puts them behind the one [`protocol::Protocol`] interface the runner
//! and the command line use.
//!
//! Shared here: where the authors' public data lives ([`data_root`]), the loaders' error type
//! and JSONL reader ([`loader`]), what every benchmark's scoring produces ([`BenchResults`]:
//! headline metrics with the statistics behind them, [`stats`], and typed report tables,
//! [`table`]), and the per-item values behind the metrics ([`item_scores`]).

pub mod catalog;
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
pub mod results;
pub mod stats;
pub mod table;

pub use catalog::{declared_figures, figures};
pub use loader::DataError;
pub use protocol::{Protocol, ProtocolError, ProtocolOptions};
pub use results::{data_root, BenchResults, DATA_ENV};
