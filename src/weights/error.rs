//! The weights layer's error type: what can go wrong opening, checking and mapping model
//! files and resolving a model source. Messages are lower-case and name the file or tensor at
//! fault; callers above wrap or print them, never match on their text.

use std::path::PathBuf;

/// Errors of the weights layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WeightsError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A GGUF file is malformed or lacks something the loader needs.
    #[error("{}: gguf: {msg}", path.display())]
    Gguf { path: PathBuf, msg: String },

    /// A metadata key the loader needs is absent or has the wrong type.
    #[error("gguf metadata key `{key}`: {msg}")]
    Metadata { key: String, msg: String },

    /// A safetensors file (or its shard index) is malformed or disagrees with its index.
    #[error("{}: safetensors: {msg}", path.display())]
    Safetensors { path: PathBuf, msg: String },

    /// `--model` could not be resolved to local files.
    #[error("model source `{source_name}`: {msg}")]
    Source { source_name: String, msg: String },

    /// A tensor the architecture needs is missing.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),

    /// A tensor has a shape other than the one the architecture expects.
    #[error("tensor `{name}`: expected shape {expected}, found {found}")]
    TensorShape {
        name: String,
        expected: String,
        found: String,
    },

    /// A candle operation failed (loading tensors, running the forward pass).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl WeightsError {
    /// An I/O error about `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        WeightsError::Io {
            path: path.into(),
            source,
        }
    }

    /// A GGUF error about `path`.
    pub fn gguf(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        WeightsError::Gguf {
            path: path.into(),
            msg: msg.into(),
        }
    }
}

/// The weights layer's result type.
pub type Result<T, E = WeightsError> = std::result::Result<T, E>;
