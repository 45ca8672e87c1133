//! The text layer's error type: what can go wrong building a tokenizer, reading a chat
//! template or rendering a prompt. Messages are lower-case and name the file or item at fault;
//! callers above wrap or print them, never match on their text.

use std::path::PathBuf;

/// Errors of the text layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
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

    /// Building or running the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// The tokenizer's pre-tokenizer profile (GGUF `tokenizer.ggml.pre`) is not implemented.
    #[error(
        "unsupported pre-tokenizer `{0}` (supported: smollm, gpt2, llama-bpe, qwen2, qwen35, gpt-4o, tekken, smaug-bpe, dbrx, default)"
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
}

impl TextError {
    /// An I/O error about `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TextError::Io {
            path: path.into(),
            source,
        }
    }

    /// A GGUF error about `path`.
    pub fn gguf(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        TextError::Gguf {
            path: path.into(),
            msg: msg.into(),
        }
    }
}

/// The text layer's result type.
pub type Result<T, E = TextError> = std::result::Result<T, E>;
