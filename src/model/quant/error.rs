//! What can go wrong building a quantized weight.

use candle_core::quantized::GgmlDType;

/// Errors building a [`QWeight`].
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// The tensor is not a matrix.
    #[error("expected a 2-d weight matrix, got shape {shape:?}")]
    NotMatrix { shape: Vec<usize> },
    /// A block-quantized row length is not a whole number of blocks.
    #[error("{cols} input features is not a multiple of the block size {block}")]
    RaggedBlocks { cols: usize, block: usize },
    /// The raw tensor data has the wrong length for its type and shape.
    #[error("tensor data has {got} bytes, expected {want}")]
    DataSize { got: usize, want: usize },
    /// No kernel for this GGUF tensor type.
    #[error("unsupported GGUF tensor type {0:?} (supported: {SUPPORTED})")]
    UnsupportedType(GgmlDType),
    /// A float type has no panels to repack into.
    #[error("{0} weights are used as stored, not repacked into panels")]
    NotRepacked(String),
    /// Candle failed to read or dequantize the tensor.
    #[error("reading the tensor: {0}")]
    Candle(#[from] candle_core::Error),
}

/// The GGUF tensor types a [`QWeight`] loads, as named in error messages.
pub const SUPPORTED: &str = "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4, BF16, F16, F32";
