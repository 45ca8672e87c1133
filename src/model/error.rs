//! The model layer's error type: what can go wrong turning checked files into a model
//! (configuration, architecture, tensors) and running it on a device; the errors of the
//! rooms below ([`crate::text`], [`crate::weights`]) pass through unchanged.
//!
//! Messages are lower-case and name the file or item at fault; callers above (`engine`,
//! `cli`) wrap or print them, never match on their text. New failure kinds get a new variant
//! rather than a stringly `Other`.

use std::path::PathBuf;

use crate::text::error::TextError;
use crate::weights::error::WeightsError;

/// Errors of the model layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A metadata key the loader needs is absent or has the wrong type.
    #[error("gguf metadata key `{key}`: {msg}")]
    Metadata { key: String, msg: String },

    /// A Hugging Face `config.json` key is missing, mistyped or unsupported.
    #[error("{}: config key `{key}`: {msg}", path.display())]
    Config {
        path: PathBuf,
        key: String,
        msg: String,
    },

    /// A safetensors file (or its shard index) is malformed or disagrees with its index.
    #[error("{}: safetensors: {msg}", path.display())]
    Safetensors { path: PathBuf, msg: String },

    /// The model's architecture (GGUF `general.architecture`) is not implemented.
    #[error(
        "unsupported model architecture `{0}` (supported: {supported})",
        supported = super::arch::supported_architectures()
    )]
    UnsupportedArchitecture(String),

    /// A tensor is stored in a type the loader cannot use.
    #[error("tensor `{name}`: unsupported tensor type {dtype}")]
    UnsupportedTensorType { name: String, dtype: String },

    /// A tensor has a shape other than the one the architecture expects.
    #[error("tensor `{name}`: expected shape {expected}, found {found}")]
    TensorShape {
        name: String,
        expected: String,
        found: String,
    },

    /// A tensor the architecture needs is missing.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),

    /// The machine has too little memory left for the model's weights.
    #[error("{}: {msg}", path.display())]
    Memory { path: PathBuf, msg: String },

    /// The device cannot run the model: not built in, no driver, out of memory, a kernel or
    /// copy that failed.
    #[error("{0}")]
    Device(String),

    /// A candle operation failed (loading tensors, running the forward pass).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// Building the tokenizer or the chat template failed ([`crate::text`]).
    #[error(transparent)]
    Text(#[from] TextError),

    /// A model file or source could not be read ([`crate::weights`]).
    #[error(transparent)]
    Weights(#[from] WeightsError),
}

impl ModelError {
    /// An I/O error about `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}

/// The model layer's result type.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
