//! The model layer's error type: everything that can go wrong turning files into a model,
//! a tokenizer or a rendered prompt.
//!
//! One enum for the whole `model` layer (weights, architecture, tokenizer, chat template,
//! model sources). Messages are lower-case and name the file or item at fault; callers above
//! (`engine`, `cli`) wrap or print them, never match on their text. New failure kinds get a new
//! variant here rather than a stringly `Other`.

use std::path::PathBuf;

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

    /// A GGUF file is malformed or lacks something the loader needs.
    #[error("{}: gguf: {msg}", path.display())]
    Gguf { path: PathBuf, msg: String },

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
    #[error("unsupported model architecture `{0}` (supported: llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3)")]
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

    /// Building or running the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// The tokenizer's pre-tokenizer profile (GGUF `tokenizer.ggml.pre`) is not implemented.
    #[error(
        "unsupported pre-tokenizer `{0}` (supported: smollm, gpt2, llama-bpe, qwen2, default)"
    )]
    UnsupportedPreTokenizer(String),

    /// The chat template could not be parsed or rendered, or it raised an exception.
    #[error("chat template: {0}")]
    Template(String),

    /// The chat template went over its budget of work, output or memory.
    #[error("{origin}: chat template over budget: {what}")]
    TemplateBudget { origin: String, what: String },

    /// The chat template called `raise_exception` (it refuses these messages).
    #[error("chat template raised an exception: {0}")]
    TemplateRaised(String),

    /// The model has no chat template and none was supplied.
    #[error("no chat template: the model has none (`tokenizer.chat_template`, tokenizer_config.json), as base models do; chat prompts need one: give a Jinja template with --chat-template FILE (`candor generate` also takes raw `prompt` lines)")]
    NoChatTemplate,

    /// `--model` could not be resolved to local files.
    #[error("model source `{source_name}`: {msg}")]
    Source { source_name: String, msg: String },

    /// The device cannot run the model: not built in, no driver, out of memory, a kernel or
    /// copy that failed.
    #[error("{0}")]
    Device(String),

    /// A candle operation failed (loading tensors, running the forward pass).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl ModelError {
    /// An I/O error about `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }

    /// A GGUF error about `path`.
    pub fn gguf(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        ModelError::Gguf {
            path: path.into(),
            msg: msg.into(),
        }
    }
}

/// The model layer's result type.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
