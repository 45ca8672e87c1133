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
//! - `testkit` (feature `testkit`, tests only): a scripted fake model and a toy protocol.

pub mod data;
pub mod data_files;
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

use std::path::PathBuf;

use crate::bench::plan::Actor;

pub use manifest::{DataFile, Environment, Manifest, ModelIdentity, RunIdentity};
pub use model_pool::{FnModels, Models};
pub use progress::{NoProgress, Progress};
pub use protocol_run::{ProtocolOutcome, ProtocolRun};
pub use run::{Run, RunOutcome};
pub use run_dir::RunDir;
pub use run_results::{FailedStep, RunModel, RunResults};
pub use samples::{Sample, SampleOutcome};

/// A boxed error from outside the store (model loading, the engine).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong while running or resuming a run.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: {message}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: the run directory is in use by another candor process", path.display())]
    Locked { path: PathBuf },
    #[error(
        "{}: the run directory holds a run with different settings; differing fields: {}; \
         use another --out directory or restore the original settings",
        path.display(),
        fields.join(", ")
    )]
    ManifestMismatch { path: PathBuf, fields: Vec<String> },
    #[error(
        "{}: samples.jsonl exists but manifest.json does not; this is not a candor run directory",
        path.display()
    )]
    NotARunDir { path: PathBuf },
    #[error("{}:{line}: the logged step does not match the run: {message}", path.display())]
    LogMismatch {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("duplicate item id {id:?}: item ids must be unique")]
    DuplicateItem { id: String },
    #[error("item {item:?}: the plan asked for an invalid step: {message}")]
    Plan { item: String, message: String },
    #[error("loading the model for {actor}: {source}")]
    Load {
        actor: ActorName,
        #[source]
        source: BoxError,
    },
    #[error("the engine failed while generating for {actor}: {source}")]
    Engine {
        actor: ActorName,
        #[source]
        source: BoxError,
    },
    #[error("the engine broke its contract for {actor}: {message}")]
    EngineContract { actor: ActorName, message: String },
    #[error("internal runner error: {0}")]
    Internal(String),
    #[error("the batch size must be at least 1")]
    BatchSize,
    #[error("{}: cannot encode json: {source}", path.display())]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            path: path.into(),
            source,
        }
    }
}

/// An [`Actor`] as people read it: `candidate 0`, `judge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActorName(pub Actor);

impl std::fmt::Display for ActorName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Actor::Candidate(i) => write!(f, "candidate {i}"),
            Actor::Judge => f.write_str("judge"),
            Actor::Panel(j) => write!(f, "judge {j}"),
        }
    }
}

/// The whole chain of an error on one line (`outer: inner: root`), as recorded in samples.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let s = e.to_string();
        if !out.ends_with(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        next = e.source();
    }
    out
}
