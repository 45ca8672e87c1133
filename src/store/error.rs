//! What can go wrong while running or resuming a run ([`StoreError`]), and how an error and an
//! actor read in one line.

use std::path::PathBuf;

use crate::bench::plan::Actor;

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
