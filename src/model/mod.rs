//! Compute: the architectures, the one transformer forward pass for every architecture, its
//! attention, the KV contract with the engine and the kernels per device (CPU in `quant`, CUDA
//! in `cuda`).
//!
//! This module turns files into an immutable, shareable model; it never sees requests or
//! batches (that is [`crate::engine`]).

pub mod arch;
mod attention;
pub mod checkpoint;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod deltanet;
pub mod device;
pub mod error;
pub mod expf;
pub mod gemma4;
pub mod kv;
pub mod limits;
pub mod lowering;
pub mod memory;
mod mla;
mod moe;
pub mod plan;
pub mod quant;
pub mod runner;
pub mod transformer;

pub use error::{ModelError, Result};
