//! Model loading: GGUF weights, the one transformer forward pass for every architecture, the
//! tokenizer and the chat template.
//!
//! This module turns files into an immutable, shareable model; it never sees requests or
//! batches (that is [`crate::engine`]).

pub mod alloc_budget;
pub mod arch;
mod attention;
pub mod chat_template;
pub mod cpu_budget;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod digest;
pub mod error;
pub mod expf;
pub mod gguf;
pub mod gguf_check;
pub mod limits;
pub mod message;
pub mod pre_tokenizer;
pub mod quant;
pub mod runner;
pub mod safetensors;
pub mod source;
pub mod spm;
pub mod template_size;
pub mod tokenizer;
pub mod transformer;

pub use error::{ModelError, Result};
