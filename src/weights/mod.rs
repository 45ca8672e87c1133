//! Weights: model files and where they come from. GGUF (its header checks, metadata and split sets),
//! safetensors checkpoints, model sources (local files and folders, Hub ids) and file digests.
//!
//! Turns paths and names into checked, memory-mapped files; the architectures that read them
//! are in [`crate::model`].

pub mod digest;
pub mod error;
pub mod gguf;
pub mod gguf_check;
pub mod mapped;
pub mod panel_file;
pub mod safetensors;
pub mod source;
pub mod split;
pub mod stored;
