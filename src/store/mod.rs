//! The run directory: a manifest written before the first sample, an append-only log of
//! finished steps (`samples.jsonl`), resume, and the runner that schedules a protocol's steps
//! over loaded models.
//!
//! A run directory holds `manifest.json` (what the run is: models, data, settings; compared on
//! resume), `samples.jsonl` (one line per finished step, in a deterministic order, fsynced per
//! batch), `results.json` and `report.md` (written last; present only once the run finished),
//! `attempts.jsonl` (the environment of each start, for provenance) and, while a run is under
//! way, `pending.jsonl` (finished steps waiting for their place in the log).
//! The log of a killed run is always a prefix of the log an uninterrupted run writes, so
//! resuming replays it and continues to byte-identical files. This module knows no protocol:
//! protocols reach it through [`crate::bench::plan::Plan`], models through [`Models`].
//!
//! - [`run_dir`]: paths, the directory lock, atomic writes, file hashes.
//! - [`gen_cache`]: replies stored by content and shared by runs (a layer around [`Models`]).
//! - [`manifest`]: what a run is, and the check that refuses a mismatched resume.
//! - [`samples`]: the sample line format, reading (torn tails cut) and appending.
//! - [`model_pool`]: where the runner gets a model for an actor.
//! - [`resume`]: replaying logged samples against the steps a plan asks for again.
//! - [`pending`]: finished steps not yet logged, kept across a kill.
//! - [`run`]: the scheduling loop, scoring and `results.json` (reports are rendered by the
//!   caller, from [`RunResults`]).
//! - [`run_results`]: what `results.json` holds.
//! - [`progress`]: what the runner tells a progress display.
//! - [`protocol_run`]: a [`crate::bench::Protocol`] run end to end (manifest, runner, extra files).
//! - [`shard`]: `--shard I/N` and merging shards into the unsharded run.
//! - [`devices`]: what each device of a replicated run did (`devices.json`).
//! - `testkit` (feature `testkit`, tests only): a scripted fake model and a toy protocol.

pub mod chat_settings;
pub mod data;
pub mod data_files;
pub mod devices;
pub mod error;
pub mod gen_cache;
pub mod manifest;
pub mod model_pool;
pub mod pending;
pub mod progress;
pub mod protocol_run;
pub mod resume;
pub mod run;
pub mod run_dir;
pub mod run_results;
pub mod samples;
pub mod shard;
pub mod shard_spec;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use error::{error_chain, ActorName, BoxError, StoreError};
pub use manifest::{DataFile, Environment, Manifest, ModelIdentity, RunIdentity};
pub use model_pool::{FnModels, Models};
pub use progress::{NoProgress, Progress};
pub use protocol_run::{ProtocolOutcome, ProtocolRun};
pub use run::{Run, RunOutcome};
pub use run_dir::RunDir;
pub use run_results::{FailedStep, RunModel, RunResults};
pub use samples::{Sample, SampleOutcome};
