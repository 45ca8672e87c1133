//! Deterministic CPU matrix products against (quantized) weight matrices: [`QWeight`].
//!
//! A weight is an `n × k` matrix (output × input features, as stored in GGUF). Q8_0, Q4_0,
//! Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and MXFP4 weights stay quantized: each activation row is
//! quantized to Q8_0 / Q8_1 / Q8_K blocks as ggml does for that type, and every output element
//! is an in-order sum of per-block scaled integer dot products. F32, F16 and BF16 weights use
//! float dot products in a fixed order. Any other GGUF type is refused
//! ([`QuantError::UnsupportedType`]). Either way each output element is computed by one fixed sequence of
//! operations, so `out[i][j]` does not depend on `m`, on the other rows of `x`, on the rayon
//! thread count, or on whether the AVX2 or the portable kernel ran (see `scalar.rs` for the
//! order). Work is split across rayon's current pool by panels of eight output rows, never
//! inside a reduction. This module knows nothing of layers, attention or the KV cache.

mod act;
mod error;
mod layout;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use rayon::prelude::*;

use crate::weights::mapped::MappedBytes;
use crate::weights::stored::StoredType;

pub use error::{QuantError, SUPPORTED};

/// MXFP4's code values, which the GPU kernels' tests check their lookup against.
#[cfg(all(test, feature = "cuda"))]
pub(crate) use layout::KVALUES_MXFP4;
use layout::{ActKind, ActRow, Panels, QFormat, QuantizedRows, PANEL};

/// The MXFP4 quantizer of the tests (ggml's `quantize_row_mxfp4_ref`), shared with `tests/it`.
#[cfg(test)]
#[path = "../../../tests/it/quant/mxfp4.rs"]
pub(crate) mod mxfp4_ref;

/// The version of the panel layout (`layout.rs`): part of every panel file's key, so that a
/// change to how records are laid out never reads an older file. Bump it with any such change.
pub const PANEL_LAYOUT: &str = "candor-panels-1";

/// Below this many multiply-adds (`m · n · k`) a matmul runs on the calling thread only.
const PAR_MIN_WORK: usize = 1 << 18;

/// How a [`QWeight`] stores its values (and therefore which kernel its matmul runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// ggml Q8_0 blocks; activations quantized to Q8_0.
    Q8_0,
    /// ggml Q4_0 blocks; activations quantized to Q8_0.
    Q4_0,
    /// ggml Q4_1 blocks; activations quantized to Q8_1.
    Q4_1,
    /// ggml Q5_0 blocks; activations quantized to Q8_0.
    Q5_0,
    /// ggml Q5_1 blocks; activations quantized to Q8_1.
    Q5_1,
    /// ggml Q4_K super-blocks; activations quantized to Q8_K.
    Q4K,
    /// ggml Q5_K super-blocks; activations quantized to Q8_K.
    Q5K,
    /// ggml Q6_K super-blocks; activations quantized to Q8_K.
    Q6K,
    /// ggml MXFP4 blocks (E8M0 exponent, 4-bit E2M1 codes); activations quantized to Q8_0.
    Mxfp4,
    /// bfloat16; float dot products.
    BF16,
    /// IEEE half floats; float dot products.
    F16,
    /// f32; float dot products.
    F32,
}

/// A weight's values as stored in its model file ([`QWeight::stored`]); the format is
/// [`QWeight::format`].
#[derive(Debug)]
pub enum Stored<'a> {
    F32(&'a [f32]),
    /// f16 bit patterns.
    F16(&'a [u16]),
    /// bf16 bit patterns.
    BF16(&'a [u16]),
    /// Quantized: GGUF blocks, row after row.
    Blocks(Vec<u8>),
}

#[derive(Debug, Clone)]
enum Storage {
    Quant(Panels),
    F32(Values<f32>),
    /// f16 bit patterns.
    F16(Values<u16>),
    /// bf16 bit patterns.
    BF16(Values<u16>),
}

/// An element type of float weights (f32 values, f16/bf16 bit patterns), stored
/// little-endian in model files.
trait Elem: Copy + std::fmt::Debug + 'static {
    fn from_le(b: &[u8]) -> Self;
}

impl Elem for f32 {
    fn from_le(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Elem for u16 {
    fn from_le(b: &[u8]) -> u16 {
        u16::from_le_bytes([b[0], b[1]])
    }
}

/// Float weight values: owned, or read in place from a model file's memory map.
#[derive(Debug, Clone)]
enum Values<T> {
    Owned(Vec<T>),
    /// Aligned for `T` and little-endian (checked when built).
    Mapped(MappedBytes),
}

impl<T: Elem> Values<T> {
    /// Copies `want` little-endian values out of `raw`.
    fn copied(raw: &[u8], want: usize) -> Result<Values<T>, QuantError> {
        let size = std::mem::size_of::<T>();
        check_len(raw.len(), want * size)?;
        Ok(Values::Owned(
            raw.chunks_exact(size).map(T::from_le).collect(),
        ))
    }

    /// The values in place when the range is aligned for `T` on a little-endian machine; a
    /// copy otherwise (the kernels need `&[T]`).
    fn mapped(m: MappedBytes, want: usize) -> Result<Values<T>, QuantError> {
        let size = std::mem::size_of::<T>();
        check_len(m.bytes().len(), want * size)?;
        let aligned = (m.bytes().as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>());
        if cfg!(target_endian = "little") && aligned {
            Ok(Values::Mapped(m))
        } else {
            Values::copied(m.bytes(), want)
        }
    }

    fn as_slice(&self) -> &[T] {
        match self {
            Values::Owned(v) => v,
            Values::Mapped(m) => {
                let b = m.bytes();
                // SAFETY: checked in `mapped`: aligned for T, little-endian, a whole number of
                // elements; f32 and u16 are valid for every bit pattern; the map is read-only
                // and outlives the borrow (the Arc is held by `m`).
                unsafe {
                    std::slice::from_raw_parts(
                        b.as_ptr() as *const T,
                        b.len() / std::mem::size_of::<T>(),
                    )
                }
            }
        }
    }
}

/// The quantized format of a GGUF type, if it has a quantized kernel.
fn qformat(dtype: GgmlDType) -> Option<QFormat> {
    Some(match dtype {
        GgmlDType::Q8_0 => QFormat::Q8_0,
        GgmlDType::Q4_0 => QFormat::Q4_0,
        GgmlDType::Q4_1 => QFormat::Q4_1,
        GgmlDType::Q5_0 => QFormat::Q5_0,
        GgmlDType::Q5_1 => QFormat::Q5_1,
        GgmlDType::Q4K => QFormat::Q4K,
        GgmlDType::Q5K => QFormat::Q5K,
        GgmlDType::Q6K => QFormat::Q6K,
        _ => return None,
    })
}

/// The quantized format of a stored type, if it is kept quantized (repacked into panels).
fn stored_qformat(stored: StoredType) -> Option<QFormat> {
    match stored {
        StoredType::Ggml(d) => qformat(d),
        StoredType::Mxfp4 => Some(QFormat::Mxfp4),
    }
}

/// Whether [`QWeight::from_qtensor`] keeps this GGUF type as stored (it refuses the others).
pub fn has_kernel(dtype: GgmlDType) -> bool {
    qformat(dtype).is_some() || matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

/// Whether [`QWeight::from_stored`] keeps this stored type as stored (it refuses the others):
/// [`has_kernel`]'s types and MXFP4.
pub fn has_stored_kernel(stored: StoredType) -> bool {
    match stored {
        StoredType::Ggml(d) => has_kernel(d),
        StoredType::Mxfp4 => true,
    }
}

/// An immutable `n × k` weight matrix with deterministic matmul kernels (see the module doc).
#[derive(Debug, Clone)]
pub struct QWeight {
    n: usize,
    k: usize,
    storage: Storage,
}

/// The instruction set a matmul runs with; both give identical bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Isa {
    fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            return Isa::Avx2;
        }
        Isa::Scalar
    }

    /// Whether 8-row groups pay off (enough vector registers to hold their partial sums).
    fn wide(self) -> bool {
        match self {
            Isa::Scalar => false,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::wide(),
        }
    }

    /// Whether two panels of `format` go through one kernel call ([`x86::panel_dot_pair`]).
    fn pairs(self, format: QFormat) -> bool {
        match self {
            Isa::Scalar => false,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::pairs(format),
        }
    }
}

fn dims2(t: &QTensor) -> Result<(usize, usize), QuantError> {
    match t.shape().dims() {
        &[n, k] => Ok((n, k)),
        other => Err(QuantError::NotMatrix {
            shape: other.to_vec(),
        }),
    }
}

fn dequantize_f32(t: &QTensor) -> Result<Vec<f32>, QuantError> {
    Ok(t.dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

impl QWeight {
    /// Loads a GGUF tensor as stored: the quantized types of [`SUPPORTED`] are repacked into
    /// panels (same bytes, about the tensor's size in memory), F32, F16 and BF16 are kept as
    /// they are; any other type is [`QuantError::UnsupportedType`].
    pub fn from_qtensor(t: &QTensor) -> Result<QWeight, QuantError> {
        let (n, k) = dims2(t)?;
        QWeight::from_bytes(t.dtype(), n, k, &t.data()?)
    }

    /// An `n × k` weight of GGUF type `dtype` from its raw bytes (row-major GGUF blocks),
    /// copied: repacked into panels, or float values.
    pub fn from_bytes(
        dtype: GgmlDType,
        n: usize,
        k: usize,
        raw: &[u8],
    ) -> Result<QWeight, QuantError> {
        let storage = match dtype {
            dtype if qformat(dtype).is_some() => {
                let format = qformat(dtype).expect("checked");
                Storage::Quant(Panels::from_gguf(format, raw, n, k)?)
            }
            GgmlDType::F32 => Storage::F32(Values::copied(raw, n * k)?),
            GgmlDType::F16 => Storage::F16(Values::copied(raw, n * k)?),
            GgmlDType::BF16 => Storage::BF16(Values::copied(raw, n * k)?),
            other => return Err(QuantError::UnsupportedType(other)),
        };
        Ok(QWeight { n, k, storage })
    }

    /// An `n × k` weight of GGUF type `dtype` read from a model file's memory map. F32, F16
    /// and BF16 values are used in place (no copy, the file's pages are the weight), unless
    /// the range is not aligned for its element type, when they are copied. Quantized types
    /// are repacked into panels (one copy, the kernels' layout) and the mapped pages are then
    /// released from this process's resident memory ([`MappedBytes::release`]).
    pub fn from_mapped(
        dtype: GgmlDType,
        n: usize,
        k: usize,
        m: MappedBytes,
    ) -> Result<QWeight, QuantError> {
        let storage = match dtype {
            dtype if qformat(dtype).is_some() => {
                let w = QWeight::from_bytes(dtype, n, k, m.bytes())?;
                m.release();
                return Ok(w);
            }
            GgmlDType::F32 => Storage::F32(Values::mapped(m, n * k)?),
            GgmlDType::F16 => Storage::F16(Values::mapped(m, n * k)?),
            GgmlDType::BF16 => Storage::BF16(Values::mapped(m, n * k)?),
            other => return Err(QuantError::UnsupportedType(other)),
        };
        Ok(QWeight { n, k, storage })
    }

    /// An `n × k` weight of any stored type Candor knows, from its raw bytes (row-major GGUF
    /// blocks), copied: [`QWeight::from_bytes`] for candle's types; MXFP4 is repacked into
    /// panels.
    pub fn from_stored_bytes(
        stored: StoredType,
        n: usize,
        k: usize,
        raw: &[u8],
    ) -> Result<QWeight, QuantError> {
        match stored {
            StoredType::Ggml(d) => QWeight::from_bytes(d, n, k, raw),
            StoredType::Mxfp4 => Ok(QWeight {
                n,
                k,
                storage: Storage::Quant(Panels::from_gguf(QFormat::Mxfp4, raw, n, k)?),
            }),
        }
    }

    /// An `n × k` weight of any stored type Candor knows, read from a model file's memory
    /// map (what [`crate::weights::gguf::GgufFile::mapped_stored`] returns):
    /// [`QWeight::from_mapped`] for candle's types; MXFP4 is repacked into panels and the
    /// mapped pages released, as the other quantized types.
    pub fn from_stored(
        stored: StoredType,
        n: usize,
        k: usize,
        m: MappedBytes,
    ) -> Result<QWeight, QuantError> {
        match stored {
            StoredType::Ggml(d) => QWeight::from_mapped(d, n, k, m),
            StoredType::Mxfp4 => {
                let w = QWeight::from_stored_bytes(stored, n, k, m.bytes())?;
                m.release();
                Ok(w)
            }
        }
    }

    /// Bytes of the panels an `n × k` weight of quantized type `stored` is repacked into (its
    /// GGUF blocks' bytes, rows padded to whole panels of 8); `None` for float types, which are
    /// used as stored.
    pub fn panel_bytes(
        stored: StoredType,
        n: usize,
        k: usize,
    ) -> Result<Option<usize>, QuantError> {
        stored_qformat(stored)
            .map(|f| Panels::size(f, n, k).map(|(_, len)| len))
            .transpose()
    }

    /// Repacks the raw GGUF blocks of an `n × k` weight of quantized type `stored` into `dst`
    /// ([`QWeight::panel_bytes`] bytes, zeros), for [`QWeight::from_panel_file`].
    pub fn repack_stored(
        stored: StoredType,
        n: usize,
        k: usize,
        raw: &[u8],
        dst: &mut [u8],
    ) -> Result<(), QuantError> {
        let format = stored_qformat(stored).ok_or(QuantError::NotRepacked(stored.to_string()))?;
        Panels::repack(format, raw, n, k, dst)
    }

    /// An `n × k` weight of quantized type `stored` whose panels were written by
    /// [`QWeight::repack_stored`] into a panel file: read in place from its map, page by page
    /// as the kernels touch them. Same bits as [`QWeight::from_stored_bytes`] of the raw blocks.
    pub fn from_panel_file(
        stored: StoredType,
        n: usize,
        k: usize,
        m: MappedBytes,
    ) -> Result<QWeight, QuantError> {
        let format = stored_qformat(stored).ok_or(QuantError::NotRepacked(stored.to_string()))?;
        Ok(QWeight {
            n,
            k,
            storage: Storage::Quant(Panels::mapped(format, n, k, m)?),
        })
    }

    /// Bytes this weight holds in the process's own memory; a weight read in place from a
    /// memory map (a panel file, or float values in the model file) holds none: its pages are
    /// the file's, read on demand and dropped under memory pressure.
    pub fn owned_bytes(&self) -> usize {
        match &self.storage {
            Storage::Quant(p) => match &p.data {
                layout::PanelBytes::Owned(v) => v.len(),
                layout::PanelBytes::Mapped(_) => 0,
            },
            Storage::F32(Values::Owned(v)) => v.len() * 4,
            Storage::F16(Values::Owned(v)) | Storage::BF16(Values::Owned(v)) => v.len() * 2,
            Storage::F32(Values::Mapped(_))
            | Storage::F16(Values::Mapped(_))
            | Storage::BF16(Values::Mapped(_)) => 0,
        }
    }

    /// An `n × k` weight of any stored type Candor knows, dequantized to F32 from its raw
    /// bytes (the `--dtype f32` mode): candle's types through candle's dequantization (as
    /// [`QWeight::dequantized`]); MXFP4 with ggml's `dequantize_row_mxfp4` ([`QWeight::row_f32`]).
    pub fn dequantized_stored(
        stored: StoredType,
        n: usize,
        k: usize,
        raw: &[u8],
    ) -> Result<QWeight, QuantError> {
        match stored {
            StoredType::Ggml(d) => {
                let blocks = n * k / d.block_size();
                if !(n * k).is_multiple_of(d.block_size()) {
                    return Err(QuantError::RaggedBlocks {
                        cols: k,
                        block: d.block_size(),
                    });
                }
                check_len(raw.len(), blocks * d.type_size())?;
                let data =
                    candle_core::quantized::QStorage::from_data(raw.into(), &Device::Cpu, d)?;
                QWeight::dequantized(&QTensor::new(data, (n, k))?)
            }
            StoredType::Mxfp4 => {
                let q = QWeight::from_stored_bytes(stored, n, k, raw)?;
                let mut values = vec![0f32; n * k];
                for (r, row) in values.chunks_exact_mut(k.max(1)).enumerate().take(n) {
                    q.row_f32(r, row);
                }
                Ok(QWeight::from_f32(n, k, values))
            }
        }
    }

    /// Whether the values are read in place from a model file's memory map.
    pub fn is_mapped(&self) -> bool {
        matches!(
            &self.storage,
            Storage::F32(Values::Mapped(_))
                | Storage::F16(Values::Mapped(_))
                | Storage::BF16(Values::Mapped(_))
        )
    }

    /// Loads any GGUF tensor dequantized to F32 (the `--dtype f32` reference mode).
    pub fn dequantized(t: &QTensor) -> Result<QWeight, QuantError> {
        let (n, k) = dims2(t)?;
        let values = dequantize_f32(t)?;
        check_len(values.len(), n * k)?;
        Ok(QWeight::from_f32(n, k, values))
    }

    /// An F32 weight from `n × k` row-major values.
    ///
    /// # Panics
    /// If `values.len() != n * k`.
    pub fn from_f32(n: usize, k: usize, values: Vec<f32>) -> QWeight {
        assert_eq!(values.len(), n * k, "from_f32: {n} × {k} weight");
        QWeight {
            n,
            k,
            storage: Storage::F32(Values::Owned(values)),
        }
    }

    /// Output features (`n`).
    pub fn rows(&self) -> usize {
        self.n
    }

    /// Input features (`k`).
    pub fn cols(&self) -> usize {
        self.k
    }

    /// Bytes the kernels read for one product: the quantized blocks (as in the file) or the
    /// float values.
    pub fn stored_bytes(&self) -> usize {
        match &self.storage {
            Storage::Quant(p) => p.data.len() / self.n.div_ceil(PANEL) / PANEL * self.n,
            Storage::F32(_) => self.n * self.k * 4,
            Storage::F16(_) | Storage::BF16(_) => self.n * self.k * 2,
        }
    }

    /// Whether the product runs on integer dot products (activations quantized to 8 bits).
    pub fn is_quantized(&self) -> bool {
        matches!(self.storage, Storage::Quant(_))
    }

    /// How the values are stored.
    pub fn format(&self) -> WeightFormat {
        match &self.storage {
            Storage::Quant(p) => match p.format {
                QFormat::Q8_0 => WeightFormat::Q8_0,
                QFormat::Q4_0 => WeightFormat::Q4_0,
                QFormat::Q4_1 => WeightFormat::Q4_1,
                QFormat::Q5_0 => WeightFormat::Q5_0,
                QFormat::Q5_1 => WeightFormat::Q5_1,
                QFormat::Q4K => WeightFormat::Q4K,
                QFormat::Q5K => WeightFormat::Q5K,
                QFormat::Q6K => WeightFormat::Q6K,
                QFormat::Mxfp4 => WeightFormat::Mxfp4,
            },
            Storage::F32(_) => WeightFormat::F32,
            Storage::F16(_) => WeightFormat::F16,
            Storage::BF16(_) => WeightFormat::BF16,
        }
    }

    /// The values as stored in the model file: float values in place, quantized blocks in
    /// GGUF's row-major layout (copied back out of the panels).
    pub fn stored(&self) -> Stored<'_> {
        match &self.storage {
            Storage::Quant(p) => Stored::Blocks(p.to_gguf(self.n)),
            Storage::F32(w) => Stored::F32(w.as_slice()),
            Storage::F16(w) => Stored::F16(w.as_slice()),
            Storage::BF16(w) => Stored::BF16(w.as_slice()),
        }
    }

    /// Dequantizes row `r` into `out` (length `k`), e.g. for an embedding lookup.
    ///
    /// # Panics
    /// If `r >= rows()` or `out.len() != cols()`.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.n, "row {r} of a {}-row weight", self.n);
        assert_eq!(out.len(), self.k, "row_f32: output length");
        match &self.storage {
            Storage::Quant(p) => p.row_f32(r, out),
            Storage::F32(w) => out.copy_from_slice(&w.as_slice()[r * self.k..(r + 1) * self.k]),
            Storage::F16(w) => {
                for (o, &h) in out
                    .iter_mut()
                    .zip(&w.as_slice()[r * self.k..(r + 1) * self.k])
                {
                    *o = half::f16::from_bits(h).to_f32();
                }
            }
            Storage::BF16(w) => {
                for (o, &h) in out
                    .iter_mut()
                    .zip(&w.as_slice()[r * self.k..(r + 1) * self.k])
                {
                    *o = scalar::bf16_to_f32(h);
                }
            }
        }
    }

    /// `out = x · Wᵀ`: `x` is `m × k` row-major, `out` is `m × n` row-major.
    ///
    /// Runs on rayon's current thread pool; the result is bit-identical for every `m`, every
    /// content of the other rows and every pool size.
    ///
    /// # Panics
    /// If `x.len() != m * cols()` or `out.len() != m * rows()`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        self.matmul_with(Isa::detect(), x, m, out)
    }

    /// `outs[t] = x · ws[t]ᵀ` for every `t`: bit-identical to calling [`QWeight::matmul`] on
    /// each pair, but `x` is quantized once for consecutive quantized weights that want the same
    /// activation blocks (e.g. the q/k/v or gate/up projections of one input).
    ///
    /// # Panics
    /// If `ws.len() != outs.len()`, or as [`QWeight::matmul`] for any pair.
    pub fn matmul_shared(ws: &[&QWeight], x: &[f32], m: usize, outs: &mut [&mut [f32]]) {
        Self::matmul_shared_with(Isa::detect(), ws, x, m, outs)
    }

    fn matmul_shared_with(isa: Isa, ws: &[&QWeight], x: &[f32], m: usize, outs: &mut [&mut [f32]]) {
        assert_eq!(ws.len(), outs.len(), "matmul_shared: weights vs outputs");
        // (activation kind, k, the quantized rows of x)
        let mut cached: Option<(ActKind, usize, QuantizedRows)> = None;
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            let Storage::Quant(p) = &w.storage else {
                w.matmul_with(isa, x, m, out);
                continue;
            };
            let (n, k) = (w.n, w.k);
            assert_eq!(x.len(), m * k, "matmul: x is not {m} × {k}");
            assert_eq!(out.len(), m * n, "matmul: out is not {m} × {n}");
            if m == 0 || n == 0 {
                continue;
            }
            let kind = p.format.act();
            if !matches!(&cached, Some((c, ck, _)) if *c == kind && *ck == k) {
                cached = None;
            }
            let (_, _, acts) =
                cached.get_or_insert_with(|| (kind, k, QuantizedRows::quantize(x, k, kind)));
            w.quantized_matmul(isa, p, acts, m, out);
        }
    }

    fn matmul_with(&self, isa: Isa, x: &[f32], m: usize, out: &mut [f32]) {
        let (n, k) = (self.n, self.k);
        assert_eq!(x.len(), m * k, "matmul: x is not {m} × {k}");
        assert_eq!(out.len(), m * n, "matmul: out is not {m} × {n}");
        if m == 0 || n == 0 {
            return;
        }
        match &self.storage {
            Storage::Quant(p) => {
                let acts = QuantizedRows::quantize(x, k, p.format.act());
                self.quantized_matmul(isa, p, &acts, m, out);
            }
            Storage::F32(w) => self.run_panels(m, out, &|panels, out| {
                float_panels(isa, panels, n, k, x, FloatRows::F32(w.as_slice()), out)
            }),
            Storage::F16(w) => self.run_panels(m, out, &|panels, out| {
                float_panels(isa, panels, n, k, x, FloatRows::F16(w.as_slice()), out)
            }),
            Storage::BF16(w) => self.run_panels(m, out, &|panels, out| {
                float_panels(isa, panels, n, k, x, FloatRows::BF16(w.as_slice()), out)
            }),
        }
    }

    /// The quantized product with activations already quantized.
    fn quantized_matmul(
        &self,
        isa: Isa,
        p: &Panels,
        acts: &QuantizedRows,
        m: usize,
        out: &mut [f32],
    ) {
        // Every row's slices once, not once per panel.
        let acts: Vec<ActRow<'_>> = (0..m).map(|i| acts.row(i)).collect();
        let acts = &acts[..];
        self.run_panels(m, out, &|panels: Range<usize>, out: &PanelOut| {
            quantized_panels(isa, p, acts, panels, out)
        });
    }

    /// For every job, `out[i] = x[rows[i]] · wᵀ` (`x` is `m × k` row-major, every job's weight
    /// `k` wide): each row of `x` is quantized once per activation kind however many jobs read
    /// it, and the panels of all quantized jobs are spread over the rayon pool in one parallel
    /// region (Mixture-of-Experts: the chosen experts' matrices of one step). Every output row
    /// is bit-identical to [`QWeight::matmul`] of that row alone.
    ///
    /// # Panics
    /// If a job's weight is not `k` wide, its `out` is not `rows.len() × n`, or a row index is
    /// out of range.
    pub(crate) fn matmul_gathered(x: &[f32], k: usize, jobs: &mut [Gathered<'_>]) {
        let isa = Isa::detect();
        assert_eq!(x.len() % k.max(1), 0, "matmul_gathered: x is not m × {k}");
        let mut kinds: Vec<(ActKind, QuantizedRows)> = Vec::new();
        let mut buf = Vec::new();
        for job in jobs.iter_mut() {
            assert_eq!(
                job.w.k, k,
                "matmul_gathered: weight is {} wide, not {k}",
                job.w.k
            );
            assert_eq!(
                job.out.len(),
                job.rows.len() * job.w.n,
                "matmul_gathered: out"
            );
            match &job.w.storage {
                Storage::Quant(p) => {
                    let kind = p.format.act();
                    if !kinds.iter().any(|(c, _)| *c == kind) {
                        kinds.push((kind, QuantizedRows::quantize(x, k, kind)));
                    }
                }
                // Float weights: the rows gathered, then the plain product.
                _ => {
                    buf.clear();
                    for &r in job.rows {
                        buf.extend_from_slice(&x[r * k..(r + 1) * k]);
                    }
                    job.w.matmul_with(isa, &buf, job.rows.len(), job.out);
                }
            }
        }
        // (panels, activation rows, output) of each quantized job.
        let mut quant = Vec::with_capacity(jobs.len());
        for job in jobs.iter_mut() {
            let (Storage::Quant(p), m) = (&job.w.storage, job.rows.len()) else {
                continue;
            };
            if m == 0 || job.w.n == 0 {
                continue;
            }
            let acts = &kinds
                .iter()
                .find(|(c, _)| *c == p.format.act())
                .expect("quantized")
                .1;
            let rows: Vec<ActRow<'_>> = job.rows.iter().map(|&r| acts.row(r)).collect();
            quant.push((p, rows, PanelOut::new(job.out, m, job.w.n)));
        }
        let panels: usize = quant.iter().map(|(_, _, o)| o.n.div_ceil(PANEL)).sum();
        let work: usize = quant.iter().map(|(_, rows, o)| rows.len() * o.n * k).sum();
        let threads = rayon::current_num_threads();
        if work < PAR_MIN_WORK || threads == 1 {
            for (p, rows, out) in &quant {
                quantized_panels(isa, p, rows, 0..out.n.div_ceil(PANEL), out);
            }
            return;
        }
        // Runs of an even number of panels (the last of a job may be shorter), about eight
        // per thread over all jobs.
        let chunk = panels.div_ceil(threads * 8).next_multiple_of(2);
        let tasks: Vec<(usize, Range<usize>)> = quant
            .iter()
            .enumerate()
            .flat_map(|(j, (_, _, out))| {
                let n = out.n.div_ceil(PANEL);
                (0..n.div_ceil(chunk)).map(move |c| (j, c * chunk..((c + 1) * chunk).min(n)))
            })
            .collect();
        tasks.into_par_iter().for_each(|(j, panels)| {
            let (p, rows, out) = &quant[j];
            quantized_panels(isa, p, rows, panels, out);
        });
    }

    /// Calls `kernel(panels, out)` for runs of consecutive panels that together cover the
    /// weight, spread over the current rayon pool (an even number of panels per run, but the
    /// last); each call writes its panels' columns of `out` (`m × n`, row-major) and no
    /// others.
    fn run_panels(
        &self,
        m: usize,
        out: &mut [f32],
        kernel: &(dyn Fn(Range<usize>, &PanelOut) + Sync),
    ) {
        let n_panels = self.n.div_ceil(PANEL);
        let work = m * self.n * self.k;
        let threads = rayon::current_num_threads();
        let out = PanelOut::new(out, m, self.n);
        if work < PAR_MIN_WORK || threads == 1 {
            kernel(0..n_panels, &out);
        } else {
            let chunk = n_panels.div_ceil(threads * 8).next_multiple_of(2);
            (0..n_panels.div_ceil(chunk)).into_par_iter().for_each(|c| {
                kernel(c * chunk..((c + 1) * chunk).min(n_panels), &out);
            });
        }
    }
}

/// The quantized product of activation rows `acts` with the panels `panels` of `p` into
/// `out` (rows in groups of 16, 8, 4, 2, 1: each weight block is unpacked once for all rows of
/// a group; the same bits for a row whatever its group); the caller owns those panels.
fn quantized_panels(
    isa: Isa,
    p: &Panels,
    acts: &[ActRow<'_>],
    panels: Range<usize>,
    out: &PanelOut,
) {
    let eight = isa.wide();
    let m = acts.len();
    // Two panels at once where a kernel takes them (same bits as one by one), for groups of
    // sixteen rows only: each weight block is then read from memory once per sixteen rows (a
    // decode step of sixteen sequences reads it once). With fewer rows the one-panel kernels
    // were as fast or faster on a 2-core AMD EPYC (Zen 5, AVX-512 VNNI), one process
    // alternating the two on Q4_K / Q6_K matrices above the L3, two threads, medians of 7, GB/s:
    // 2 rows 37.9 → 60.6 / 29.3 → 55.1, 4 rows 33.2 → 40.6 / 26.5 → 41.9, 8 rows 24.1 → 22.7 /
    // 18.6 → 26.0, and at one row the `maddubs` kernel (see `x86::quant_panel`) 42.9 → 56.0 /
    // 36.3 → 50.7 (docs/speed-history.md, 2026-11-29).
    let pairs = isa.pairs(p.format) && m >= 16;
    let mut pi = panels.start;
    while pi < panels.end {
        let two = pairs && pi + 1 < panels.end;
        let mut i = 0;
        if two {
            let both = Panel::Two(p.panel(pi), p.panel(pi + 1));
            while i + 16 <= m {
                group::<16>(isa, p, both, pi, acts, i, out);
                i += 16;
            }
        }
        // The other rows in groups of 8, 4, 2, 1, panel by panel: each weight block is
        // unpacked once for all rows of a group.
        let done = i;
        for q in pi..pi + if two { 2 } else { 1 } {
            let one = Panel::One(p.panel(q));
            let mut i = done;
            while eight && i + 8 <= m {
                group::<8>(isa, p, one, q, acts, i, out);
                i += 8;
            }
            while i + 4 <= m {
                group::<4>(isa, p, one, q, acts, i, out);
                i += 4;
            }
            if i + 2 <= m {
                group::<2>(isa, p, one, q, acts, i, out);
                i += 2;
            }
            if i < m {
                group::<1>(isa, p, one, q, acts, i, out);
            }
        }
        pi += if two { 2 } else { 1 };
    }
}

/// One product of [`QWeight::matmul_gathered`]: `out[i] = x[rows[i]] · wᵀ`.
pub(crate) struct Gathered<'a> {
    pub(crate) w: &'a QWeight,
    pub(crate) rows: &'a [usize],
    /// `rows.len() × w.n`, row-major.
    pub(crate) out: &'a mut [f32],
}

/// The `m × n` output of a matmul while panel kernels fill it: each worker writes the columns
/// of the panels it was given ([`QWeight::run_panels`] gives every panel to one worker only),
/// straight into the row-major result (no panel-major buffer to scatter afterwards).
struct PanelOut<'a> {
    ptr: *mut f32,
    m: usize,
    n: usize,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: workers write disjoint columns (their own panels', see `put`), so sharing the
// pointer between threads races on nothing.
unsafe impl Sync for PanelOut<'_> {}

impl<'a> PanelOut<'a> {
    fn new(out: &'a mut [f32], m: usize, n: usize) -> PanelOut<'a> {
        assert_eq!(out.len(), m * n, "matmul output is not {m} × {n}");
        PanelOut {
            ptr: out.as_mut_ptr(),
            m,
            n,
            _out: std::marker::PhantomData,
        }
    }

    /// Writes panel `panel`'s outputs for row `row` (the lanes past `n` are dropped).
    ///
    /// # Safety
    /// No other thread writes panel `panel` while this runs.
    unsafe fn put(&self, row: usize, panel: usize, values: &[f32; PANEL]) {
        assert!(
            row < self.m && panel * PANEL < self.n,
            "row {row}, panel {panel}"
        );
        let j0 = panel * PANEL;
        let width = PANEL.min(self.n - j0);
        // SAFETY: `row * n + j0 + width <= m * n` (asserted), and the caller owns the panel.
        unsafe {
            let dst = self.ptr.add(row * self.n + j0);
            if width == PANEL {
                // A whole panel: one fixed-size (vector) store, not a `memmove` call.
                (dst as *mut [f32; PANEL]).write_unaligned(*values);
            } else {
                std::ptr::copy_nonoverlapping(values.as_ptr(), dst, width);
            }
        };
    }
}

fn check_len(got: usize, want: usize) -> Result<(), QuantError> {
    if got == want {
        Ok(())
    } else {
        Err(QuantError::DataSize { got, want })
    }
}

/// A float weight matrix's rows, `k` values each, for the float kernels.
#[derive(Clone, Copy)]
pub(crate) enum FloatRows<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    BF16(&'a [u16]),
}

impl FloatRows<'_> {
    /// The portable dot product of `x` (`k` values) with weight row `j`: the bits every float
    /// kernel gives.
    pub(crate) fn scalar_dot(self, x: &[f32], j: usize, k: usize) -> f32 {
        match self {
            FloatRows::F32(w) => scalar::dot_f32(x, &w[j * k..(j + 1) * k]),
            FloatRows::F16(w) => scalar::dot_f16(x, &w[j * k..(j + 1) * k]),
            FloatRows::BF16(w) => scalar::dot_bf16(x, &w[j * k..(j + 1) * k]),
        }
    }
}

/// Writes the float dot products of `panels` into `out`: rows three at a time against one
/// or two columns at a time ([`x86::float_block`], each dot product with the bits of a lone
/// `scalar::dot_f32`), so each load serves several multiply-adds.
fn float_panels(
    isa: Isa,
    panels: Range<usize>,
    n: usize,
    k: usize,
    x: &[f32],
    w: FloatRows<'_>,
    out: &PanelOut,
) {
    let m = x.len() / k.max(1);
    for pi in panels {
        let mut i = 0;
        while i < m {
            let rows = (m - i).min(3);
            let mut values = [[0f32; PANEL]; 3];
            match rows {
                3 => float_rows::<3>(isa, w, n, k, x, i, pi, &mut values),
                2 => float_rows::<2>(isa, w, n, k, x, i, pi, &mut values),
                _ => float_rows::<1>(isa, w, n, k, x, i, pi, &mut values),
            }
            for (r, v) in values[..rows].iter().enumerate() {
                // SAFETY: `run_panels` gave this worker panel `pi`.
                unsafe { out.put(i + r, pi, v) };
            }
            i += rows;
        }
    }
}

/// Rows `first..first + R` of `x` against panel `pi`'s columns, into `values[..R]`.
#[allow(clippy::too_many_arguments)]
fn float_rows<const R: usize>(
    isa: Isa,
    w: FloatRows<'_>,
    n: usize,
    k: usize,
    x: &[f32],
    first: usize,
    pi: usize,
    values: &mut [[f32; PANEL]; 3],
) {
    let xs: [&[f32]; R] = std::array::from_fn(|r| &x[(first + r) * k..(first + r + 1) * k]);
    match isa {
        Isa::Scalar => {
            for (r, xr) in xs.iter().enumerate() {
                for (lane, v) in values[r].iter_mut().enumerate() {
                    let j = pi * PANEL + lane;
                    if j < n {
                        *v = w.scalar_dot(xr, j, k);
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            // Columns past `n` repeat the last one; their results are dropped by `put`.
            let col = |lane: usize| (pi * PANEL + lane).min(n - 1);
            if isa.wide() {
                for lane in (0..PANEL).step_by(2) {
                    let got = x86::float_block(w, k, xs, [col(lane), col(lane + 1)]);
                    for (v, g) in values.iter_mut().zip(&got) {
                        v[lane..lane + 2].copy_from_slice(g);
                    }
                }
            } else {
                for lane in 0..PANEL {
                    let got = x86::float_block(w, k, xs, [col(lane)]);
                    for (v, g) in values.iter_mut().zip(&got) {
                        v[lane] = g[0];
                    }
                }
            }
        }
    }
}

/// One panel's records, or two consecutive panels' for a two-panel kernel.
#[derive(Clone, Copy)]
enum Panel<'a> {
    One(&'a [u8]),
    Two(&'a [u8], &'a [u8]),
}

/// Activation rows `first..first + R` against panel `pi` (and `pi + 1` for two), into
/// `out`; the caller was given those panels by [`QWeight::run_panels`].
fn group<const R: usize>(
    isa: Isa,
    p: &Panels,
    panels: Panel<'_>,
    pi: usize,
    acts: &[ActRow<'_>],
    first: usize,
    out: &PanelOut,
) {
    let rows: &[ActRow<'_>; R] = acts[first..first + R].try_into().expect("R rows");
    let put = |panel: usize, results: [[f32; PANEL]; R]| {
        for (r, values) in results.iter().enumerate() {
            // SAFETY: the caller owns `panel` (see above).
            unsafe { out.put(first + r, panel, values) };
        }
    };
    match panels {
        Panel::One(panel) => put(pi, panel_dot(isa, p.format, panel, p.nb, rows)),
        Panel::Two(a, b) => {
            #[cfg(target_arch = "x86_64")]
            {
                let [ra, rb] = x86::panel_dot_pair(p.format, a, b, p.nb, rows);
                put(pi, ra);
                put(pi + 1, rb);
            }
            #[cfg(not(target_arch = "x86_64"))]
            unreachable!(
                "two-panel kernels are x86 only ({} + {} bytes)",
                a.len(),
                b.len()
            );
        }
    }
}

fn panel_dot<const R: usize>(
    isa: Isa,
    format: QFormat,
    panel: &[u8],
    nb: usize,
    acts: &[ActRow<'_>; R],
) -> [[f32; PANEL]; R] {
    match isa {
        Isa::Scalar => acts.map(|a| scalar::panel_dot(format, panel, nb, a)),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::panel_dot(format, panel, nb, acts),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::quantized::QMatMul;
    use candle_core::{Module, Tensor};

    /// Deterministic pseudo-random values in [-1, 1) (xorshift64*).
    pub(crate) fn noise(seed: u64, len: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s >> 12;
                s ^= s << 25;
                s ^= s >> 27;
                let v = s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40;
                v as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn qtensor(n: usize, k: usize, dtype: GgmlDType, seed: u64) -> QTensor {
        let w = Tensor::from_vec(noise(seed, n * k), (n, k), &Device::Cpu).expect("tensor");
        QTensor::quantize(&w, dtype).expect("quantize")
    }

    const FORMATS: [GgmlDType; 11] = [
        GgmlDType::Q8_0,
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
        GgmlDType::BF16,
        GgmlDType::F16,
        GgmlDType::F32,
    ];

    /// `k` rounded up to a whole number of the type's blocks (256 for the k-quants).
    fn kdim(dtype: GgmlDType, k: usize) -> usize {
        k.div_ceil(dtype.block_size()) * dtype.block_size()
    }

    /// An `n × k` MXFP4 weight of seeded values, quantized as llama-quantize does.
    pub(crate) fn mxfp4(n: usize, k: usize, seed: u64) -> (QWeight, Vec<u8>) {
        let raw = mxfp4_ref::quantize(&noise(seed, n * k));
        assert_eq!(
            raw.len(),
            n * k / mxfp4_ref::QK_MXFP4 * mxfp4_ref::BLOCK_MXFP4
        );
        let w = QWeight::from_stored_bytes(StoredType::Mxfp4, n, k, &raw).expect("MXFP4");
        (w, raw)
    }

    /// One `n × k` weight (k rounded up to whole blocks) of every format with a kernel.
    fn every_format(n: usize, k: usize, seed: u64) -> Vec<(String, QWeight)> {
        let mut ws: Vec<(String, QWeight)> = FORMATS
            .iter()
            .map(|&d| {
                let w = QWeight::from_qtensor(&qtensor(n, kdim(d, k), d, seed)).expect("load");
                (format!("{d:?}"), w)
            })
            .collect();
        ws.push(("MXFP4".into(), mxfp4(n, k.next_multiple_of(32), seed).0));
        ws
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
    }

    fn run(w: &QWeight, isa: Isa, x: &[f32], m: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; m * w.rows()];
        w.matmul_with(isa, x, m, &mut out);
        out
    }

    /// The blocked float products (rows three at a time, one or two columns at a time) give
    /// each output the bits of the portable lone dot product, for F32, F16 and BF16 weights,
    /// at every kernel level, with tails past 32 lanes, single columns, and a last panel and
    /// row group cut short.
    #[test]
    fn float_blocks_equal_lone_dot_products() {
        for (n, k) in [(1, 1), (3, 31), (13, 45), (17, 109), (9, 576)] {
            let v = noise(11, n * k);
            let f16: Vec<u16> = v
                .iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect();
            let bf16: Vec<u16> = v
                .iter()
                .map(|&x| half::bf16::from_f32(x).to_bits())
                .collect();
            let le = |h: &[u16]| h.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>();
            let ws = [
                ("F32", QWeight::from_f32(n, k, v.clone())),
                (
                    "F16",
                    QWeight::from_bytes(GgmlDType::F16, n, k, &le(&f16)).unwrap(),
                ),
                (
                    "BF16",
                    QWeight::from_bytes(GgmlDType::BF16, n, k, &le(&bf16)).unwrap(),
                ),
            ];
            let x = noise(12, 7 * k);
            for (name, w) in &ws {
                let want: Vec<f32> = (0..7 * n)
                    .map(|o| {
                        let (i, j) = (o / n, o % n);
                        let xi = &x[i * k..(i + 1) * k];
                        let rows = match *name {
                            "F32" => FloatRows::F32(&v),
                            "F16" => FloatRows::F16(&f16),
                            _ => FloatRows::BF16(&bf16),
                        };
                        rows.scalar_dot(xi, j, k)
                    })
                    .collect();
                for level in [0u8, 1] {
                    #[cfg(target_arch = "x86_64")]
                    x86::cap_level(level);
                    for m in 1..=7 {
                        for isa in [Isa::Scalar, Isa::detect()] {
                            let got = run(w, isa, &x[..m * k], m);
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&got),
                                bits(&want[..m * n]),
                                "{name} {n}x{k} m={m} {isa:?} level {level}"
                            );
                        }
                    }
                }
                #[cfg(target_arch = "x86_64")]
                x86::cap_level(u8::MAX);
            }
        }
    }

    /// A gathered product (rows out of order, repeated, an empty job, two weights) equals
    /// each row's product alone, for every format, serial and over two threads.
    #[test]
    fn gathered_rows_are_each_row_alone() {
        let (n, k) = (300, 512);
        for ((name, a), (_, b)) in every_format(n, k, 3)
            .iter()
            .zip(every_format(n, k, 4).iter())
        {
            let k = a.cols();
            let x = noise(9, 7 * k);
            let jobs_rows: [(&QWeight, &[usize]); 3] = [(a, &[3, 0, 3, 6]), (b, &[5]), (a, &[])];
            for threads in [1, 2] {
                let mut outs: Vec<Vec<f32>> = jobs_rows
                    .iter()
                    .map(|(w, r)| vec![f32::NAN; r.len() * w.rows()])
                    .collect();
                let mut jobs: Vec<Gathered<'_>> = jobs_rows
                    .iter()
                    .zip(outs.iter_mut())
                    .map(|(&(w, rows), out)| Gathered { w, rows, out })
                    .collect();
                pool(threads).install(|| QWeight::matmul_gathered(&x, k, &mut jobs));
                for ((w, rows), out) in jobs_rows.iter().zip(&outs) {
                    for (i, &r) in rows.iter().enumerate() {
                        let alone = run(w, Isa::detect(), &x[r * k..(r + 1) * k], 1);
                        let got = &out[i * n..(i + 1) * n];
                        assert!(
                            got.iter()
                                .zip(&alone)
                                .all(|(g, a)| g.to_bits() == a.to_bits()),
                            "{name}, {threads} threads: row {r} differs from the row alone"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn stored_gives_back_the_file_bytes() {
        // 13 rows: a last panel with five padding rows.
        for dtype in FORMATS {
            let t = qtensor(13, kdim(dtype, 512), dtype, 7);
            let raw = t.data().expect("data").to_vec();
            let w = QWeight::from_qtensor(&t).expect("load");
            let bytes: Vec<u8> = match w.stored() {
                Stored::Blocks(b) => b,
                Stored::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                Stored::F16(v) | Stored::BF16(v) => {
                    v.iter().flat_map(|x| x.to_le_bytes()).collect()
                }
            };
            assert!(
                bytes == raw,
                "{dtype:?}: stored bytes differ from the file's"
            );
        }
    }

    #[test]
    fn keeps_the_formats_it_supports() {
        for (dtype, want) in [
            (GgmlDType::Q8_0, WeightFormat::Q8_0),
            (GgmlDType::Q4_1, WeightFormat::Q4_1),
            (GgmlDType::F16, WeightFormat::F16),
            (GgmlDType::F32, WeightFormat::F32),
            (GgmlDType::Q4_0, WeightFormat::Q4_0),
            (GgmlDType::Q5_0, WeightFormat::Q5_0),
            (GgmlDType::Q5_1, WeightFormat::Q5_1),
            (GgmlDType::Q4K, WeightFormat::Q4K),
            (GgmlDType::Q5K, WeightFormat::Q5K),
            (GgmlDType::Q6K, WeightFormat::Q6K),
            (GgmlDType::BF16, WeightFormat::BF16),
        ] {
            let w = QWeight::from_qtensor(&qtensor(8, 256, dtype, 1)).expect("load");
            assert_eq!(w.format(), want, "{dtype:?}");
            assert_eq!((w.rows(), w.cols()), (8, 256));
            assert!(has_kernel(dtype));
        }
        let err = QWeight::from_qtensor(&qtensor(8, 256, GgmlDType::Q2K, 1)).expect_err("Q2_K");
        assert!(!has_kernel(GgmlDType::Q2K));
        assert!(
            err.to_string()
                .starts_with("unsupported GGUF tensor type Q2K (supported: Q4_0"),
            "{err}"
        );
    }

    /// Random blocks of every type decode (`row_f32`, the embedding lookup) to the values
    /// llama.cpp's gguf-py gives (`tests/fixtures/quant/dequant.jsonl`, `make_dequant.py`).
    #[test]
    fn row_f32_matches_gguf_py_dequantize() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/quant/dequant.jsonl");
        let text = std::fs::read_to_string(&path).expect("committed fixture");
        let mut seen = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).expect("json");
            let name = v["type"].as_str().expect("type").to_string();
            let hex = v["raw"].as_str().expect("raw");
            let raw: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            let want: Vec<f32> = v["bits"]
                .as_array()
                .expect("bits")
                .iter()
                .map(|b| f32::from_bits(b.as_u64().expect("u32") as u32))
                .collect();
            let k = want.len();
            let storage = match name.as_str() {
                "F16" => Storage::F16(Values::copied(&raw, k).expect("len")),
                "BF16" => Storage::BF16(Values::copied(&raw, k).expect("len")),
                other => {
                    let format = match other {
                        "Q4_0" => QFormat::Q4_0,
                        "Q4_1" => QFormat::Q4_1,
                        "Q5_0" => QFormat::Q5_0,
                        "Q5_1" => QFormat::Q5_1,
                        "Q8_0" => QFormat::Q8_0,
                        "Q4_K" => QFormat::Q4K,
                        "Q5_K" => QFormat::Q5K,
                        "Q6_K" => QFormat::Q6K,
                        "MXFP4" => QFormat::Mxfp4,
                        _ => panic!("unknown type {other}"),
                    };
                    Storage::Quant(Panels::from_gguf(format, &raw, 1, k).expect("blocks"))
                }
            };
            let w = QWeight { n: 1, k, storage };
            let mut got = vec![0f32; k];
            w.row_f32(0, &mut got);
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), e.to_bits(), "{name} value {i}: {g} vs {e}");
            }
            seen.push(name);
        }
        assert_eq!(seen.len(), 11, "{seen:?}");
    }

    /// The tests' MXFP4 quantizer (`tests/it/quant/mxfp4.rs`) writes the bytes gguf-py's
    /// quantizer writes (`tests/fixtures/quant/mxfp4_quantize.jsonl`, `make_mxfp4.py`).
    #[test]
    fn mxfp4_quantizer_matches_gguf_py() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/quant/mxfp4_quantize.jsonl");
        let text = std::fs::read_to_string(&path).expect("committed fixture");
        let mut cases = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).expect("json");
            let name = v["name"].as_str().expect("name");
            let x: Vec<f32> = (v["bits"].as_array().expect("bits").iter())
                .map(|b| f32::from_bits(b.as_u64().expect("u32") as u32))
                .collect();
            let hex = v["raw"].as_str().expect("raw");
            let want: Vec<u8> = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            let got = mxfp4_ref::quantize(&x);
            for (b, (g, w)) in got.chunks(17).zip(want.chunks(17)).enumerate() {
                assert_eq!(g, w, "{name}: block {b}");
            }
            assert_eq!(got.len(), want.len(), "{name}");
            cases += 1;
        }
        assert_eq!(cases, 8);
    }

    /// MXFP4 loads as stored (`stored()` gives back the file's bytes, `stored_bytes` counts
    /// them) and its matmul equals, bit for bit, ggml's `ggml_vec_dot_mxfp4_q8_0_generic`
    /// written out on the GGUF bytes (`d = d_x · e8m0_half(e)`, `sumf += d · sumi`: the
    /// same value as the kernels' `(sumi · e8m0_half(e)) · d_x`, since `e8m0_half` is a power
    /// of two) against the same Q8_0 activation blocks, on the portable and the AVX2 kernel.
    #[test]
    fn mxfp4_equals_ggml_generic_dot_and_keeps_the_file_bytes() {
        // 13 rows: a last panel with five padding rows.
        let (n, k, m) = (13, 160, 3);
        let (w, raw) = mxfp4(n, k, 21);
        assert_eq!(w.format(), WeightFormat::Mxfp4);
        assert!(w.is_quantized() && !w.is_mapped());
        assert_eq!(w.stored_bytes(), raw.len());
        let Stored::Blocks(back) = w.stored() else {
            panic!("MXFP4 is stored as blocks")
        };
        assert!(back == raw, "stored bytes differ from the file's");
        assert!(has_stored_kernel(StoredType::Mxfp4));
        let x: Vec<f32> = noise(22, m * k).iter().map(|v| v * 3.0).collect();
        let acts = QuantizedRows::quantize(&x, k, ActKind::Q8_0);
        let nb = k / 32;
        let kv = layout::KVALUES_MXFP4;
        let mut want = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut sumf = 0f32;
                for b in 0..nb {
                    let blk = &raw[(j * nb + b) * 17..][..17];
                    let q = &acts.qs[i * k + b * 32..][..32];
                    let d = acts.d[i * nb + b] * layout::e8m0_half(blk[0]);
                    let (mut s1, mut s2) = (0i32, 0i32);
                    for t in 0..16 {
                        s1 += q[t] as i32 * kv[(blk[1 + t] & 0x0F) as usize] as i32;
                        s2 += q[t + 16] as i32 * kv[(blk[1 + t] >> 4) as usize] as i32;
                    }
                    sumf += d * (s1 + s2) as f32;
                }
                want[i * n + j] = sumf;
            }
        }
        let mut isas = vec![Isa::Scalar];
        if Isa::detect() != Isa::Scalar {
            isas.push(Isa::detect());
        }
        for isa in isas {
            let got = run(&w, isa, &x, m);
            for (t, (g, e)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), e.to_bits(), "{isa:?} output {t}: {g} vs {e}");
            }
        }
        // And the dequantized weight times the dequantized activations, up to f32 rounding.
        let mut row = vec![0f32; k];
        for j in 0..n {
            w.row_f32(j, &mut row);
            for i in 0..m {
                let exact: f64 = (0..k)
                    .map(|t| {
                        row[t] as f64 * acts.qs[i * k + t] as f64 * acts.d[i * nb + t / 32] as f64
                    })
                    .sum();
                let g = want[i * n + j] as f64;
                assert!(
                    (g - exact).abs() <= 1e-5 * exact.abs().max(1.0),
                    "{i},{j}: {g} vs {exact}"
                );
            }
        }
        // Dequantized (the `--dtype f32` mode): an F32 weight of `row_f32`'s values.
        let f = QWeight::dequantized_stored(StoredType::Mxfp4, n, k, &raw).expect("f32");
        assert_eq!(f.format(), WeightFormat::F32);
        let mut frow = vec![0f32; k];
        for j in 0..n {
            w.row_f32(j, &mut row);
            f.row_f32(j, &mut frow);
            assert_eq!(row, frow, "row {j}");
        }
        // A byte length other than 17 per block is refused.
        let err =
            QWeight::from_stored_bytes(StoredType::Mxfp4, n, k, &raw[1..]).expect_err("short");
        assert!(matches!(err, QuantError::DataSize { .. }), "{err}");
        let err =
            QWeight::from_stored_bytes(StoredType::Mxfp4, 1, 48, &raw[..34]).expect_err("ragged");
        assert!(
            matches!(
                err,
                QuantError::RaggedBlocks {
                    cols: 48,
                    block: 32
                }
            ),
            "{err}"
        );
    }

    /// The AVX2 scale vector equals `e8m0_half` for every exponent byte, the subnormal ones
    /// (0, 1) included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn mxfp4_scales_agree_for_every_exponent() {
        if Isa::detect() == Isa::Scalar {
            crate::skip::absent(
                crate::skip::Need::CpuFeature,
                "no AVX2: only the portable kernel",
            );
            return;
        }
        // One row per exponent byte, codes all 1 (value 1 · 2^(e-128)), against small ones.
        let raw: Vec<u8> = (0..=255u8)
            .flat_map(|e| std::iter::once(e).chain([0x11u8; 16]))
            .collect();
        let w = QWeight::from_stored_bytes(StoredType::Mxfp4, 256, 32, &raw).expect("w");
        let x = vec![1e-3f32; 32];
        let (a, b) = (run(&w, Isa::Scalar, &x, 1), run(&w, Isa::detect(), &x, 1));
        for (e, (a, b)) in a.iter().zip(&b).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "e = {e}: {a} vs {b}");
        }
        assert!(
            a[0] > 0.0 && a[0] < f32::MIN_POSITIVE,
            "e = 0 is subnormal: {}",
            a[0]
        );
    }

    #[test]
    fn rejects_a_vector() {
        let v = Tensor::from_vec(noise(2, 64), 64, &Device::Cpu).expect("tensor");
        let t = QTensor::quantize(&v, GgmlDType::F32).expect("quantize");
        let err = QWeight::from_qtensor(&t).expect_err("1-d");
        assert!(matches!(err, QuantError::NotMatrix { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "expected a 2-d weight matrix, got shape [64]"
        );
    }

    #[test]
    fn row_f32_matches_candle_dequantize() {
        for dtype in FORMATS {
            let k = kdim(dtype, 64);
            let t = qtensor(13, k, dtype, 3);
            let want = t
                .dequantize(&Device::Cpu)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .expect("dequantize");
            for w in [
                QWeight::from_qtensor(&t).expect("load"),
                QWeight::dequantized(&t).expect("load"),
            ] {
                let mut row = vec![0f32; k];
                for r in 0..13 {
                    w.row_f32(r, &mut row);
                    assert_eq!(row, &want[r * k..(r + 1) * k], "{dtype:?} row {r}");
                }
            }
        }
    }

    /// Every row of a batch equals that row computed alone, whatever the batch size, the
    /// neighbouring rows, the pool size and the instruction set.
    #[test]
    fn shared_quantization_matches_separate_matmuls() {
        let (m, k) = (9, 64);
        let ws: Vec<QWeight> = [
            (24, GgmlDType::Q4_1),
            (8, GgmlDType::Q4_1),
            (16, GgmlDType::Q8_0),
            (8, GgmlDType::F32),
            (13, GgmlDType::Q4_1),
        ]
        .iter()
        .enumerate()
        .map(|(i, &(n, t))| QWeight::from_qtensor(&qtensor(n, k, t, 40 + i as u64)).expect("w"))
        .collect();
        let x = noise(99, m * k);
        let mut isas = vec![Isa::Scalar];
        if Isa::detect() != Isa::Scalar {
            isas.push(Isa::detect());
        }
        for isa in isas {
            let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; m * w.rows()]).collect();
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|o| o.as_mut_slice()).collect();
            let wr: Vec<&QWeight> = ws.iter().collect();
            QWeight::matmul_shared_with(isa, &wr, &x, m, &mut refs);
            for (w, o) in ws.iter().zip(&outs) {
                let want = run(w, isa, &x, m);
                let same = want.iter().zip(o).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{:?} {} × {}", w.format(), w.rows(), w.cols());
            }
        }
    }

    #[test]
    fn rows_are_bit_identical_across_batch_threads_and_isa() {
        let mut isas = vec![Isa::Scalar];
        if Isa::detect() != Isa::Scalar {
            isas.push(Isa::detect());
        }
        // The levels this CPU lacks run as the widest it has: say which were not compared.
        use crate::skip::{absent, Need};
        #[cfg(target_arch = "x86_64")]
        let lacks = if Isa::detect() == Isa::Scalar {
            Some("AVX2/FMA/F16C: only the portable kernel ran")
        } else if !(std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw"))
        {
            Some("AVX-512: kernel levels 1-3 ran as level 0 (AVX2)")
        } else if !std::arch::is_x86_feature_detected!("avx512vnni") {
            Some("AVX-512 VNNI: kernel levels 2-3 ran as level 1")
        } else {
            None
        };
        #[cfg(not(target_arch = "x86_64"))]
        let lacks = Some("an x86-64 CPU: only the portable kernel ran");
        if let Some(what) = lacks {
            absent(Need::CpuFeature, format!("no {what}"));
        }
        // (n, k): padded last panel and a tail past 32 lanes; one large enough to go parallel.
        for (n, k) in [(44, 96), (520, 576)] {
            for (dtype, w) in every_format(n, k, 4) {
                let k = w.cols();
                let x = noise(5, 25 * k);
                let alone: Vec<Vec<f32>> = (0..25)
                    .map(|i| run(&w, Isa::Scalar, &x[i * k..(i + 1) * k], 1))
                    .collect();
                // A different batch containing row 3 of x among other rows.
                let mut other = noise(6, 7 * k);
                other[2 * k..3 * k].copy_from_slice(&x[3 * k..4 * k]);
                // Each kernel level this CPU has (AVX2, AVX-512, AVX-512 VNNI).
                let levels: Vec<(Isa, u8)> = isas
                    .iter()
                    .flat_map(|&isa| match isa {
                        Isa::Scalar => vec![(isa, 0)],
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx2 => vec![(isa, 0), (isa, 1), (isa, 2), (isa, 3)],
                    })
                    .collect();
                for &(isa, level) in &levels {
                    #[cfg(target_arch = "x86_64")]
                    x86::cap_level(level);
                    #[cfg(not(target_arch = "x86_64"))]
                    let _ = level;
                    for threads in [1, 2] {
                        pool(threads).install(|| {
                            for m in [1usize, 7, 16, 25] {
                                let out = run(&w, isa, &x[..m * k], m);
                                for i in 0..m {
                                    assert_eq!(
                                        &out[i * n..(i + 1) * n],
                                        &alone[i][..],
                                        "{dtype} {n}x{k} {isa:?} level {level} threads={threads} m={m} row {i}"
                                    );
                                }
                            }
                            let out = run(&w, isa, &other, 7);
                            assert_eq!(&out[2 * n..3 * n], &alone[3][..], "{dtype} {isa:?}");
                        });
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        x86::cap_level(u8::MAX);
    }

    /// Without VNNI the kernels add a run of `maddubs` products in i16 before widening: 8
    /// groups for Q4_0, Q4_1 and Q4_K, 4 for Q5_0, Q5_1, MXFP4 (its values plus 12) and Q5_K,
    /// 2 for Q6_K, 1 for Q8_0. The bound that keeps those sums from saturating holds at the extremes: every quant
    /// at its largest magnitude against activations of magnitude 127, at every kernel level,
    /// equal to the portable kernel.
    #[test]
    fn extreme_quants_do_not_saturate_the_i16_sums() {
        let (n, k) = (16, 512);
        let one = half::f16::from_f32(1.0).to_le_bytes();
        /// (type, block bytes, offsets of f16 ones, a byte range of i8 scales, quant byte)
        type Extreme = (
            StoredType,
            usize,
            &'static [usize],
            std::ops::Range<usize>,
            u8,
        );
        let kinds: [Extreme; 9] = [
            (StoredType::Ggml(GgmlDType::Q4_0), 18, &[0], 0..0, 0xFF),
            (StoredType::Ggml(GgmlDType::Q4_1), 20, &[0, 2], 0..0, 0xFF),
            (StoredType::Ggml(GgmlDType::Q5_0), 22, &[0], 0..0, 0xFF),
            (StoredType::Ggml(GgmlDType::Q5_1), 24, &[0, 2], 0..0, 0xFF),
            (StoredType::Ggml(GgmlDType::Q8_0), 34, &[0], 0..0, 0x80),
            (StoredType::Mxfp4, 17, &[], 0..0, 0x77),
            (StoredType::Ggml(GgmlDType::Q4K), 144, &[0, 2], 0..0, 0xFF),
            (StoredType::Ggml(GgmlDType::Q5K), 176, &[0, 2], 0..0, 0xFF),
            // Q6_K's i8 scales at 127, the largest.
            (
                StoredType::Ggml(GgmlDType::Q6K),
                210,
                &[208],
                192..208,
                0xFF,
            ),
        ];
        for (stored, size, ones, scales, quant) in kinds {
            let mut b = vec![quant; size];
            for &at in ones {
                b[at..at + 2].copy_from_slice(&one);
            }
            b[scales].fill(0x7F);
            if stored == StoredType::Mxfp4 {
                b[0] = 127; // the E8M0 scale, 2^0
            }
            let per = stored.block_size();
            let w =
                QWeight::from_stored_bytes(stored, n, k, &b.repeat(n * k / per)).expect("weight");
            let mut x = vec![-1.0f32; k];
            x.extend(vec![1.0f32; k]);
            x.extend((0..k).map(|i| if i % 3 == 0 { 1.0 } else { -1.0 }));
            let m = x.len() / k;
            let want = run(&w, Isa::Scalar, &x, m);
            assert!(want.iter().all(|v| v.is_finite() && *v != 0.0), "{stored}");
            for level in 0..4 {
                #[cfg(target_arch = "x86_64")]
                x86::cap_level(level);
                #[cfg(not(target_arch = "x86_64"))]
                let _ = level;
                for rows in [1, m] {
                    let got = run(&w, Isa::detect(), &x[..rows * k], rows);
                    assert_eq!(got, want[..rows * n], "{stored} level {level} m={rows}");
                }
            }
            #[cfg(target_arch = "x86_64")]
            x86::cap_level(u8::MAX);
        }
    }

    /// Our quantized and float paths agree with candle's own `QMatMul` on the same tensors.
    #[test]
    fn agrees_with_candle_qmatmul() {
        let (n, m) = (72, 5);
        for dtype in FORMATS {
            let k = kdim(dtype, 576);
            let x = noise(7, m * k);
            let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).expect("tensor");
            let t = qtensor(n, k, dtype, 8);
            let want = QMatMul::from_qtensor(qtensor(n, k, dtype, 8))
                .and_then(|q| q.forward(&xt))
                .and_then(|y| y.flatten_all())
                .and_then(|y| y.to_vec1::<f32>())
                .expect("candle matmul");
            let w = QWeight::from_qtensor(&t).expect("load");
            let mut got = vec![0f32; m * n];
            w.matmul(&x, m, &mut got);
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            // Q4_1: candle rounds the Q8_1 block sum as f16(f16(sum) * f16(d)) where ggml
            // (and we) store f16(sum * d); `q4_1_equals_candle_bitwise_with_its_sum_rounding`
            // shows that this is the only difference.
            // BF16: candle rounds the activations to bf16, we keep them f32.
            let tol = match dtype {
                GgmlDType::Q4_1 | GgmlDType::Q5_1 => 1e-3,
                GgmlDType::BF16 => 1e-2,
                _ => 1e-4,
            };
            assert!(
                worst <= tol * scale,
                "{dtype:?}: max |ours - candle| = {worst} for outputs up to {scale}"
            );
        }
    }

    /// With the Q8_1 sums rounded as candle rounds them, our Q4_1 matmul (scalar and AVX2)
    /// equals candle's `QMatMul` bit for bit: same quantization, same per-block expression.
    #[test]
    fn q4_1_equals_candle_bitwise_with_its_sum_rounding() {
        let (n, k, m) = (40, 576, 3);
        let x = noise(11, m * k);
        let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).expect("tensor");
        let want = QMatMul::from_qtensor(qtensor(n, k, GgmlDType::Q4_1, 12))
            .and_then(|q| q.forward(&xt))
            .and_then(|y| y.flatten_all())
            .and_then(|y| y.to_vec1::<f32>())
            .expect("candle matmul");
        let w = QWeight::from_qtensor(&qtensor(n, k, GgmlDType::Q4_1, 12)).expect("load");
        let Storage::Quant(p) = &w.storage else {
            panic!("Q4_1 stays quantized")
        };
        let mut acts = QuantizedRows::quantize(&x, k, ActKind::Q8_1);
        for (b, s) in acts.s.iter_mut().enumerate() {
            let sum: i32 = acts.qs[b * 32..(b + 1) * 32]
                .iter()
                .map(|&q| q as i32)
                .sum();
            let d = half::f16::from_f32(acts.d[b]);
            *s = (half::f16::from_f32(sum as f32) * d).to_f32();
        }
        for isa in [Isa::Scalar, Isa::detect()] {
            let mut got = vec![0f32; m * n];
            w.quantized_matmul(isa, p, &acts, m, &mut got);
            assert_eq!(got, want, "{isa:?}");
        }
    }

    /// On the default model's real tensors (Q4_1 projection, Q8_0 tied head): agreement with
    /// candle and batch independence. Skips loudly when the model file is absent.
    #[test]
    fn real_model_tensors_agree_with_candle_and_are_batch_independent() {
        use candle_core::quantized::gguf_file;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
        let Ok(mut f) = std::fs::File::open(&path) else {
            crate::skip::absent(
                crate::skip::Need::Model,
                format!("the default model not found at {}", path.display()),
            );
            return;
        };
        let content = gguf_file::Content::read(&mut f).expect("gguf header");
        for (name, dtype) in [
            ("blk.0.ffn_down.weight", GgmlDType::Q4_1),
            ("token_embd.weight", GgmlDType::Q8_0),
        ] {
            let t = content.tensor(&mut f, name, &Device::Cpu).expect("tensor");
            assert_eq!(t.dtype(), dtype, "{name}");
            let w = QWeight::from_qtensor(&t).expect("load");
            let (n, k, m) = (w.rows(), w.cols(), 3);
            let x: Vec<f32> = noise(13, m * k).iter().map(|v| v * 4.0).collect();
            let mut got = vec![0f32; m * n];
            w.matmul(&x, m, &mut got);
            let mut alone = vec![0f32; n];
            w.matmul(&x[k..2 * k], 1, &mut alone);
            assert_eq!(&got[n..2 * n], &alone[..], "{name}: batch independence");
            let xt = Tensor::from_vec(x, (m, k), &Device::Cpu).expect("tensor");
            let want = QMatMul::from_qtensor(t)
                .and_then(|q| q.forward(&xt))
                .and_then(|y| y.flatten_all())
                .and_then(|y| y.to_vec1::<f32>())
                .expect("candle matmul");
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let worst = got
                .iter()
                .zip(&want)
                .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            assert!(worst <= 1e-3 * scale, "{name}: {worst} vs scale {scale}");
        }
    }

    /// The Q4_1 path equals the float product of the dequantized weight with the
    /// Q8_1-dequantized activations, up to f32 rounding (checks the `m * s` term).
    #[test]
    fn q4_1_matches_dequantized_product() {
        let (n, k) = (16, 128);
        let t = qtensor(n, k, GgmlDType::Q4_1, 9);
        let w = QWeight::from_qtensor(&t).expect("load");
        let x = noise(10, k);
        let acts = QuantizedRows::quantize(&x, k, ActKind::Q8_1);
        let xq: Vec<f32> = (0..k).map(|t| acts.qs[t] as f32 * acts.d[t / 32]).collect();
        let mut got = vec![0f32; n];
        w.matmul(&x, 1, &mut got);
        let mut row = vec![0f32; k];
        for (j, &g) in got.iter().enumerate() {
            w.row_f32(j, &mut row);
            // The Q8_1 sum term uses s = f16(d * sum q) instead of d * sum q: allow its rounding.
            let exact: f64 = row
                .iter()
                .zip(&xq)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            assert!((g as f64 - exact).abs() < 2e-3, "row {j}: {g} vs {exact}");
        }
    }
}
