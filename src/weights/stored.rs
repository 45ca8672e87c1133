//! The type of a tensor as stored in a GGUF file, as far as Candor knows it: one of candle's
//! [`GgmlDType`]s, or a ggml type candle 0.11 does not know but Candor reads in place (MXFP4).
//!
//! Only names and block geometry live here; how a type is multiplied is `model::quant`'s.

use candle_core::quantized::GgmlDType;

/// ggml's type id of MXFP4 (`GGML_TYPE_MXFP4`).
pub const MXFP4_TYPE_ID: u32 = 39;

/// A stored tensor type Candor knows (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredType {
    /// A type of candle's GGUF reader.
    Ggml(GgmlDType),
    /// ggml's MXFP4: blocks of 32 elements in 17 bytes, one E8M0 exponent byte then 16
    /// bytes of 4-bit E2M1 codes (low nibbles elements 0..16, high nibbles 16..32).
    Mxfp4,
}

impl StoredType {
    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            StoredType::Ggml(d) => d.block_size(),
            StoredType::Mxfp4 => 32,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            StoredType::Ggml(d) => d.type_size(),
            StoredType::Mxfp4 => 17,
        }
    }

    /// candle's type, when candle has one.
    pub fn ggml(self) -> Option<GgmlDType> {
        match self {
            StoredType::Ggml(d) => Some(d),
            StoredType::Mxfp4 => None,
        }
    }
}

impl From<GgmlDType> for StoredType {
    fn from(d: GgmlDType) -> StoredType {
        StoredType::Ggml(d)
    }
}

impl std::fmt::Display for StoredType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoredType::Ggml(d) => write!(f, "{d:?}"),
            StoredType::Mxfp4 => f.write_str("MXFP4"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_and_names() {
        assert_eq!(
            (
                StoredType::Mxfp4.block_size(),
                StoredType::Mxfp4.type_size()
            ),
            (32, 17)
        );
        let q = StoredType::from(GgmlDType::Q4_0);
        assert_eq!((q.block_size(), q.type_size()), (32, 18));
        assert_eq!(q.ggml(), Some(GgmlDType::Q4_0));
        assert_eq!(StoredType::Mxfp4.ggml(), None);
        assert_eq!(StoredType::Mxfp4.to_string(), "MXFP4");
        assert_eq!(StoredType::Ggml(GgmlDType::Q6K).to_string(), "Q6K");
        // The header scan's table agrees.
        let (block, bytes) = crate::weights::gguf_check::type_block(MXFP4_TYPE_ID).expect("39");
        assert_eq!((block, bytes), (32, 17));
    }
}
