//! Memory layouts of the quantized matmul: weight panels repacked from GGUF blocks, and the
//! activation rows quantized to Q8_0 / Q8_1 / Q8_K blocks exactly as ggml's reference code does.
//!
//! Weights are stored as *panels* of [`PANEL`] consecutive output rows. Within a panel, block
//! `b` of all eight rows forms one record. A GGUF block is a sequence of fields (say Q5_0: the
//! f16 scale, 4 bytes of high bits, 16 bytes of nibbles); a record holds, field after field,
//! that field of the eight rows, spread as [`Spread`] says: f16 scales row after row (the
//! eight f16 scales of a block are one 16-byte load), k-quant sub-block scales byte by byte
//! (byte `i` of the eight rows is one 8-byte load, widened to eight i32 lanes), quants by
//! 4-byte words (word
//! `w` of the eight rows side by side, so that one 32-byte vector holds the same four quants
//! of all eight rows, ready for `maddubs` / `dpbusd` against a broadcast group of four
//! activations), Q5_0 / Q5_1 high bits bit-permuted for the same purpose. A panel's records
//! are contiguous, so one pass over a panel streams its memory once. Rows past `n` in the
//! last panel are zero. This file only moves bytes, decodes blocks to f32 and quantizes
//! activations; it does no dot products (those are in `scalar.rs` and `x86.rs`).

use half::f16;

use rayon::prelude::*;

use super::error::QuantError;
use crate::weights::mapped::MappedBytes;

/// Output rows per weight panel (one AVX2 register of f32 results).
pub(crate) const PANEL: usize = 8;
/// Elements per block of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1).
pub(crate) const QK: usize = 32;
/// Elements per k-quant super-block (Q4_K, Q5_K, Q6_K, Q8_K).
pub(crate) const QK_K: usize = 256;

/// Offset of the quants in a Q8_0 record.
pub(crate) const Q8_0_QS: usize = PANEL * 2;
/// Offset of the minimums in a Q4_1 (and Q5_1) record.
pub(crate) const Q4_1_MS: usize = PANEL * 2;
/// Offset of the quants in a Q4_1 record.
pub(crate) const Q4_1_QS: usize = PANEL * 4;
/// Offset of the quants in a Q4_0 record (after 8 scales).
pub(crate) const Q4_0_QS: usize = PANEL * 2;
/// Offset of the high bits in a Q5_0 record; the quants follow 8 × 4 bytes later.
pub(crate) const Q5_0_QH: usize = PANEL * 2;
/// Offset of the quants in a Q5_0 record.
pub(crate) const Q5_0_QS: usize = Q5_0_QH + PANEL * 4;
/// Offset of the high bits in a Q5_1 record.
pub(crate) const Q5_1_QH: usize = PANEL * 4;
/// Offset of the quants in a Q5_1 record.
pub(crate) const Q5_1_QS: usize = Q5_1_QH + PANEL * 4;

/// Offset of the codes in an MXFP4 record (after the eight rows' E8M0 exponent bytes, `Rows`
/// of one byte; the codes are `Words` as Q4_0's nibbles).
pub(crate) const MXFP4_QS: usize = PANEL;

/// MXFP4's 16 E2M1 code values, doubled to integers (ggml's `kvalues_mxfp4`): the scale
/// [`e8m0_half`] carries the halving.
pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the value of an E8M0 exponent byte, `2^(e - 128)` (ggml's `ggml_e8m0_to_fp32_half`,
/// subnormal for `e < 2`): MXFP4's block scale against [`KVALUES_MXFP4`].
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e as u32 - 1) << 23
    })
}

/// Bytes of one GGUF Q6_K block: 128 bytes of low nibbles, 64 of 2-bit highs, 16 i8 scales, f16 d.
pub(crate) const BLOCK_Q6_K: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

/// The activation quantization a weight format's kernel wants (as ggml's `vec_dot_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActKind {
    /// Blocks of 32, f16 scale.
    Q8_0,
    /// Blocks of 32, f16 scale and f16 `d * sum(q)`.
    Q8_1,
    /// Blocks of 256, f32 scale, integer sums of every 16 quants.
    Q8K,
}

impl ActKind {
    /// Elements per activation block.
    pub(crate) fn block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => QK,
            ActKind::Q8K => QK_K,
        }
    }
}

/// The quantized weight formats kept quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QFormat {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    Mxfp4,
}

impl QFormat {
    /// The byte lengths of the fields of one GGUF block, in order, and how a record spreads
    /// each over the eight rows (see the module doc).
    fn fields(self) -> &'static [(usize, Spread)] {
        use Spread::{Bits, Bytes, Rows, Words};
        match self {
            QFormat::Q8_0 => &[(2, Rows), (QK, Words)],
            QFormat::Q4_0 => &[(2, Rows), (QK / 2, Words)],
            QFormat::Q4_1 => &[(2, Rows), (2, Rows), (QK / 2, Words)],
            QFormat::Q5_0 => &[(2, Rows), (4, Bits), (QK / 2, Words)],
            QFormat::Q5_1 => &[(2, Rows), (2, Rows), (4, Bits), (QK / 2, Words)],
            QFormat::Q4K => &[(2, Rows), (2, Rows), (12, Bytes), (QK_K / 2, Words)],
            QFormat::Q5K => &[
                (2, Rows),
                (2, Rows),
                (12, Bytes),
                (QK_K / 8, Words),
                (QK_K / 2, Words),
            ],
            QFormat::Q6K => &[
                (QK_K / 2, Words),
                (QK_K / 4, Words),
                (QK_K / 16, Bytes),
                (2, Rows),
            ],
            QFormat::Mxfp4 => &[(1, Rows), (QK / 2, Words)],
        }
    }

    /// Bytes of one GGUF block of this format.
    pub(crate) fn gguf_block(self) -> usize {
        self.fields().iter().map(|&(len, _)| len).sum()
    }

    /// Elements per block.
    pub(crate) fn block(self) -> usize {
        match self {
            QFormat::Q4K | QFormat::Q5K | QFormat::Q6K => QK_K,
            _ => QK,
        }
    }

    /// Bytes of one panel record of this format.
    pub(crate) fn record(self) -> usize {
        PANEL * self.gguf_block()
    }

    /// The activation blocks this format's kernel multiplies with.
    pub(crate) fn act(self) -> ActKind {
        match self {
            QFormat::Q8_0 | QFormat::Q4_0 | QFormat::Q5_0 | QFormat::Mxfp4 => ActKind::Q8_0,
            QFormat::Q4_1 | QFormat::Q5_1 => ActKind::Q8_1,
            QFormat::Q4K | QFormat::Q5K | QFormat::Q6K => ActKind::Q8K,
        }
    }

    /// Copies lane `lane`'s GGUF block out of record `rec` into `out` (`gguf_block()` bytes).
    pub(crate) fn gather(self, rec: &[u8], lane: usize, out: &mut [u8]) {
        let (mut at, mut src) = (0, 0);
        for &(len, spread) in self.fields() {
            let (from, to) = (&rec[src..src + PANEL * len], &mut out[at..at + len]);
            match spread {
                Spread::Rows => to.copy_from_slice(&from[lane * len..(lane + 1) * len]),
                Spread::Bytes => {
                    for (i, to) in to.iter_mut().enumerate() {
                        *to = from[PANEL * i + lane];
                    }
                }
                Spread::Words => {
                    for (w, to) in to.chunks_exact_mut(4).enumerate() {
                        to.copy_from_slice(&from[4 * (PANEL * w + lane)..][..4]);
                    }
                }
                Spread::Bits => {
                    let v = u32::from_le_bytes(from[4 * lane..4 * lane + 4].try_into().expect("4"));
                    to.copy_from_slice(&unspread_bits(v).to_le_bytes());
                }
            }
            at += len;
            src += PANEL * len;
        }
    }

    /// Copies `blk` (one GGUF block) into lane `lane` of record `rec` (the inverse of
    /// [`QFormat::gather`]).
    fn scatter(self, blk: &[u8], lane: usize, rec: &mut [u8]) {
        let (mut at, mut to) = (0, 0);
        for &(len, spread) in self.fields() {
            let (from, dst) = (&blk[at..at + len], &mut rec[to..to + PANEL * len]);
            match spread {
                Spread::Rows => dst[lane * len..(lane + 1) * len].copy_from_slice(from),
                Spread::Bytes => {
                    for (i, &b) in from.iter().enumerate() {
                        dst[PANEL * i + lane] = b;
                    }
                }
                Spread::Words => {
                    for (w, from) in from.chunks_exact(4).enumerate() {
                        dst[4 * (PANEL * w + lane)..][..4].copy_from_slice(from);
                    }
                }
                Spread::Bits => {
                    let v = u32::from_le_bytes(from.try_into().expect("4"));
                    dst[4 * lane..4 * lane + 4].copy_from_slice(&spread_bits(v).to_le_bytes());
                }
            }
            at += len;
            to += PANEL * len;
        }
    }
}

/// How a record spreads one field of the eight rows' GGUF blocks (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spread {
    /// Row after row, each row's bytes as in its block.
    Rows,
    /// Byte by byte: byte `i` of row `l` at byte `8i + l` (k-quant scales: one 8-byte load
    /// holds byte `i` of every row, widened to the eight i32 lanes at once).
    Bytes,
    /// By 4-byte words: word `w` of row `l` at bytes `4 · (8w + l)`.
    Words,
    /// Q5_0 / Q5_1 high bits: row after row, each u32 through [`spread_bits`].
    Bits,
}

/// A Q5_0 / Q5_1 block's 32 high bits (bit `e` for element `e`) rearranged so that bit `k`
/// of byte `p` is element `4k + p`'s: byte `p` then serves element `p` of each group of four,
/// and one shift per group brings a group's bits to bit 4 of the bytes of its lanes.
pub(crate) fn spread_bits(v: u32) -> u32 {
    let mut out = 0;
    for e in 0..QK {
        out |= ((v >> e) & 1) << (8 * (e % 4) + e / 4);
    }
    out
}

/// The inverse of [`spread_bits`].
fn unspread_bits(v: u32) -> u32 {
    let mut out = 0;
    for e in 0..QK {
        out |= ((v >> (8 * (e % 4) + e / 4)) & 1) << e;
    }
    out
}

/// Offsets in the records of the k-quants (fields of 8 rows each, see [`QFormat::fields`]).
pub(crate) mod k_rec {
    use super::{PANEL, QK_K};
    /// Q4_K / Q5_K: the eight f16 `d`, the eight f16 `dmin`, the eight rows' 12 scale bytes
    /// (byte `i` of the eight rows side by side).
    pub(crate) const D: usize = 0;
    pub(crate) const DMIN: usize = PANEL * 2;
    pub(crate) const SCALES: usize = PANEL * 4;
    /// Q4_K nibbles.
    pub(crate) const Q4_QS: usize = PANEL * 16;
    /// Q5_K high bits, then nibbles.
    pub(crate) const Q5_QH: usize = PANEL * 16;
    pub(crate) const Q5_QS: usize = Q5_QH + PANEL * QK_K / 8;
    /// Q6_K low nibbles, 2-bit highs, the eight rows' 16 i8 scales (scale `g` of the eight
    /// rows side by side), the eight f16 `d`.
    pub(crate) const Q6_QL: usize = 0;
    pub(crate) const Q6_QH: usize = PANEL * QK_K / 2;
    pub(crate) const Q6_SCALES: usize = Q6_QH + PANEL * QK_K / 4;
    pub(crate) const Q6_D: usize = Q6_SCALES + PANEL * QK_K / 16;
}

/// Quantized weights repacked into panels (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct Panels {
    pub(crate) format: QFormat,
    /// Blocks per row (`k / block`).
    pub(crate) nb: usize,
    /// `ceil(n / 8) * nb` records.
    pub(crate) data: PanelBytes,
}

/// Where a weight's panels are: in this process's memory, or in a memory-mapped panel file
/// ([`crate::weights::panel_file`]), read in place.
#[derive(Debug, Clone)]
pub(crate) enum PanelBytes {
    Owned(OwnedBytes),
    Mapped(MappedBytes),
}

impl std::ops::Deref for PanelBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            PanelBytes::Owned(v) => v,
            PanelBytes::Mapped(m) => m.bytes(),
        }
    }
}

/// Panels repacked into this process's memory, zeroed when made. From [`HUGE_MIN`] bytes up, an
/// anonymous map advised as huge pages before its first touch, so that its pages are 2 MiB where
/// the kernel has them free (with transparent huge pages in `madvise` mode, the common default,
/// nothing else gets them): the one-row kernels stream every weight once per decode step, and
/// on a 2-core AMD EPYC (Zen 5) Llama-3-8B-4l decoded 48.6–50.0 tok/s against 39.8–45.0 from a
/// `Vec` in 4 KiB pages, Qwen3.5-4B-8l 43.0–43.5 against 38.1–40.3 (3 pairs, alternated), prefill
/// the same. Smaller ones, and where no map can be made, a `Vec`.
#[derive(Debug)]
pub(crate) enum OwnedBytes {
    Small(Vec<u8>),
    Large(memmap2::MmapMut),
}

/// The size from which [`OwnedBytes`] takes an anonymous map: one huge page.
pub(crate) const HUGE_MIN: usize = 2 << 20;

impl OwnedBytes {
    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> OwnedBytes {
        if len >= HUGE_MIN {
            if let Ok(m) = memmap2::MmapMut::map_anon(len) {
                #[cfg(target_os = "linux")]
                let _ = m.advise(memmap2::Advice::HugePage);
                return OwnedBytes::Large(m);
            }
        }
        OwnedBytes::Small(vec![0u8; len])
    }
}

impl Clone for OwnedBytes {
    fn clone(&self) -> OwnedBytes {
        let mut c = OwnedBytes::zeroed(self.len());
        c.copy_from_slice(self);
        c
    }
}

impl std::ops::Deref for OwnedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            OwnedBytes::Small(v) => v,
            OwnedBytes::Large(m) => m,
        }
    }
}

impl std::ops::DerefMut for OwnedBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            OwnedBytes::Small(v) => v,
            OwnedBytes::Large(m) => m,
        }
    }
}

impl Panels {
    /// Blocks per row and bytes of the panels of an `n × k` tensor of `format`.
    pub(crate) fn size(format: QFormat, n: usize, k: usize) -> Result<(usize, usize), QuantError> {
        let block = format.block();
        if !k.is_multiple_of(block) {
            return Err(QuantError::RaggedBlocks { cols: k, block });
        }
        let nb = k / block;
        Ok((nb, n.div_ceil(PANEL) * nb * format.record()))
    }

    /// Repacks the raw GGUF blocks of an `n × k` tensor (row-major, `k / block` blocks per row).
    pub(crate) fn from_gguf(
        format: QFormat,
        raw: &[u8],
        n: usize,
        k: usize,
    ) -> Result<Panels, QuantError> {
        let (nb, len) = Panels::size(format, n, k)?;
        let mut data = OwnedBytes::zeroed(len);
        Panels::repack(format, raw, n, k, &mut data)?;
        Ok(Panels {
            format,
            nb,
            data: PanelBytes::Owned(data),
        })
    }

    /// Repacks the raw GGUF blocks of an `n × k` tensor into `dst` ([`Panels::size`] bytes,
    /// zeros: rows past `n` stay zero).
    pub(crate) fn repack(
        format: QFormat,
        raw: &[u8],
        n: usize,
        k: usize,
        dst: &mut [u8],
    ) -> Result<(), QuantError> {
        let (nb, len) = Panels::size(format, n, k)?;
        let blk = format.gguf_block();
        let want = n * nb * blk;
        if raw.len() != want {
            return Err(QuantError::DataSize {
                got: raw.len(),
                want,
            });
        }
        if dst.len() != len {
            return Err(QuantError::DataSize {
                got: dst.len(),
                want: len,
            });
        }
        let rec = format.record();
        if nb == 0 {
            return Ok(());
        }
        dst.par_chunks_mut(nb * rec)
            .enumerate()
            .for_each(|(p, panel)| {
                for lane in 0..PANEL.min(n - p * PANEL) {
                    let row = p * PANEL + lane;
                    for (b, dst) in panel.chunks_exact_mut(rec).enumerate() {
                        format.scatter(&raw[(row * nb + b) * blk..][..blk], lane, dst);
                    }
                }
            });
        Ok(())
    }

    /// The panels of an `n × k` tensor already repacked ([`Panels::repack`]) into a mapped
    /// panel file, read in place.
    pub(crate) fn mapped(
        format: QFormat,
        n: usize,
        k: usize,
        m: MappedBytes,
    ) -> Result<Panels, QuantError> {
        let (nb, len) = Panels::size(format, n, k)?;
        if m.bytes().len() != len {
            return Err(QuantError::DataSize {
                got: m.bytes().len(),
                want: len,
            });
        }
        Ok(Panels {
            format,
            nb,
            data: PanelBytes::Mapped(m),
        })
    }

    /// The raw GGUF blocks of the first `n` rows again (row-major), as they were before
    /// repacking (for a device that takes GGUF's own layout).
    pub(crate) fn to_gguf(&self, n: usize) -> Vec<u8> {
        let blk = self.format.gguf_block();
        let rec = self.format.record();
        let mut out = vec![0u8; n * self.nb * blk];
        for (row, dst) in out.chunks_exact_mut(self.nb * blk).enumerate() {
            let (panel, lane) = (self.panel(row / PANEL), row % PANEL);
            for (b, d) in dst.chunks_exact_mut(blk).enumerate() {
                self.format.gather(&panel[b * rec..(b + 1) * rec], lane, d);
            }
        }
        out
    }

    /// The records of panel `p` (all `nb` blocks).
    pub(crate) fn panel(&self, p: usize) -> &[u8] {
        let size = self.nb * self.format.record();
        &self.data[p * size..(p + 1) * size]
    }

    /// Dequantizes row `row` into `out` (length `k`) with ggml's formulas (see [`dequantize`]).
    pub(crate) fn row_f32(&self, row: usize, out: &mut [f32]) {
        let (p, lane) = (row / PANEL, row % PANEL);
        let rec = self.format.record();
        let panel = self.panel(p);
        let mut blk = [0u8; BLOCK_Q6_K];
        let blk = &mut blk[..self.format.gguf_block()];
        for (b, out) in out
            .chunks_exact_mut(self.format.block())
            .enumerate()
            .take(self.nb)
        {
            self.format
                .gather(&panel[b * rec..(b + 1) * rec], lane, blk);
            dequantize(self.format, blk, out);
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block's 12 scale bytes.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight (scale, min) pairs of a Q4_K / Q5_K block's 12 scale bytes.
#[inline]
pub(crate) fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        (sc[j], m[j]) = scale_min_k4(j, q);
    }
    (sc, m)
}

/// The unsigned 5-bit value of element `e` of a Q5_0 / Q5_1 block (nibbles `qs`, high bits `qh`).
#[inline]
pub(crate) fn q5_value(qs: &[u8], qh: u32, e: usize) -> u8 {
    let nib = if e < QK / 2 {
        qs[e] & 0x0F
    } else {
        qs[e - QK / 2] >> 4
    };
    nib | (((qh >> e) & 1) << 4) as u8
}

/// The unsigned 5-bit value of element `e` (0..256) of a Q5_K block.
#[inline]
pub(crate) fn q5k_value(blk: &[u8], e: usize) -> u8 {
    let (qh, qs) = (&blk[16..48], &blk[48..]);
    let (j, l) = (e / 64, e % 64);
    let (nib, bit) = if l < 32 {
        (qs[32 * j + l] & 0x0F, 2 * j)
    } else {
        (qs[32 * j + l - 32] >> 4, 2 * j + 1)
    };
    nib | (((qh[l % 32] >> bit) & 1) << 4)
}

/// The unsigned 6-bit value (0..64, the stored value + 32) of element `e` of a Q6_K block.
#[inline]
pub(crate) fn q6k_value(blk: &[u8], e: usize) -> u8 {
    let (ql, qh) = (&blk[..128], &blk[128..192]);
    let (n, t, l) = (e / 128, (e % 128) / 32, e % 32);
    let low = ql[64 * n + 32 * (t % 2) + l];
    let nib = if t < 2 { low & 0x0F } else { low >> 4 };
    nib | (((qh[32 * n + l] >> (2 * t)) & 3) << 4)
}

/// Decodes one GGUF block of `format` (`bytes`) into `out` (`format.block()` values), with
/// the expressions of ggml's `dequantize_row_*`.
pub(crate) fn dequantize(format: QFormat, bytes: &[u8], out: &mut [f32]) {
    let d = f16_at(bytes, 0);
    let qh32 =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    match format {
        QFormat::Q8_0 => {
            for (o, &q) in out.iter_mut().zip(&bytes[2..2 + QK]) {
                *o = (q as i8) as f32 * d;
            }
        }
        QFormat::Q4_0 => {
            for (j, &q) in bytes[2..2 + QK / 2].iter().enumerate() {
                out[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
                out[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
            }
        }
        QFormat::Q4_1 => {
            let m = f16_at(bytes, 2);
            for (j, &q) in bytes[4..4 + QK / 2].iter().enumerate() {
                out[j] = (q & 0x0F) as f32 * d + m;
                out[j + QK / 2] = (q >> 4) as f32 * d + m;
            }
        }
        QFormat::Q5_0 => {
            let qh = qh32(2);
            for (e, o) in out.iter_mut().enumerate().take(QK) {
                *o = (q5_value(&bytes[6..], qh, e) as i32 - 16) as f32 * d;
            }
        }
        QFormat::Q5_1 => {
            let (m, qh) = (f16_at(bytes, 2), qh32(4));
            for (e, o) in out.iter_mut().enumerate().take(QK) {
                *o = q5_value(&bytes[8..], qh, e) as f32 * d + m;
            }
        }
        QFormat::Q4K | QFormat::Q5K => {
            let dmin = f16_at(bytes, 2);
            let (sc, m) = scales_mins_k4(&bytes[4..16]);
            for (e, o) in out.iter_mut().enumerate().take(QK_K) {
                let j = e / 32;
                let q = if format == QFormat::Q4K {
                    let b = bytes[16 + 32 * (e / 64) + e % 32];
                    if (e / 32).is_multiple_of(2) {
                        b & 0x0F
                    } else {
                        b >> 4
                    }
                } else {
                    q5k_value(bytes, e)
                };
                *o = (d * sc[j] as f32) * q as f32 - dmin * m[j] as f32;
            }
        }
        QFormat::Q6K => {
            let d = f16_at(bytes, 208);
            for (e, o) in out.iter_mut().enumerate().take(QK_K) {
                let sc = bytes[192 + e / 16] as i8;
                let q = q6k_value(bytes, e) as i32 - 32;
                *o = (d * sc as f32) * q as f32;
            }
        }
        QFormat::Mxfp4 => {
            let d = e8m0_half(bytes[0]);
            for (j, &q) in bytes[1..1 + QK / 2].iter().enumerate() {
                out[j] = KVALUES_MXFP4[(q & 0x0F) as usize] as f32 * d;
                out[j + QK / 2] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
            }
        }
    }
}

/// `v` rounded to the nearest integer, ties to even (as `_mm256_round_ps(v, _MM_ROUND_NEAREST)`
/// in ggml's AVX2 `quantize_row_q8_0` / `quantize_row_q8_1`), saturated to i8. Exact for
/// `|v| < 2^22` (adding and subtracting 1.5 · 2^23 leaves the nearest-even integer, as
/// ggml's `nearest_int`); the callers' `|v|` is at most about 127. NaN gives 0.
#[inline]
pub(crate) fn round_even(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    if v.abs() >= 4_194_304.0 {
        return v.clamp(-128.0, 127.0) as i8;
    }
    ((v + MAGIC) - MAGIC) as i8
}

/// Reads the little-endian f16 at `at` as f32 (exact).
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// `m` activation rows quantized to blocks (Q8_0, Q8_1 with the block sums, or Q8_K).
///
/// Q8_0 / Q8_1 scales are stored already rounded through f16 and widened back to f32, so
/// kernels read exactly the values ggml's `block_q8_0.d` / `block_q8_1.{d,s}` would hold;
/// Q8_K scales are f32 as in ggml.
#[derive(Debug, Clone)]
pub(crate) struct QuantizedRows {
    pub(crate) kind: ActKind,
    /// Blocks per row.
    pub(crate) nb: usize,
    /// `m × k` quants.
    pub(crate) qs: Vec<i8>,
    /// `m × nb` block scales.
    pub(crate) d: Vec<f32>,
    /// `m × nb` values of `d * sum(qs)` (Q8_1 only; else empty).
    pub(crate) s: Vec<f32>,
    /// Integer sums of quants: `m × k / 16` sums of 16 consecutive quants (Q8_K), `m × nb`
    /// block sums (Q8_0, for the weight offsets of Q4_0 / Q5_0), else empty.
    pub(crate) bsums: Vec<i32>,
    /// Q8_K only (else empty): per block, its 16 `bsums` as i16, then the 8 sums of their
    /// pairs (`bsums[2j] + bsums[2j + 1]`), [`BS16`] per block: the AVX2 k-quant kernels read
    /// them as they are, where they were packed and permuted for every panel and row group.
    pub(crate) bs16: Vec<i16>,
}

/// Entries of [`QuantizedRows::bs16`] per Q8_K block.
pub(crate) const BS16: usize = 24;

impl QuantizedRows {
    /// Row `i`'s blocks.
    pub(crate) fn row(&self, i: usize) -> ActRow<'_> {
        let k = self.nb * self.kind.block();
        ActRow {
            qs: &self.qs[i * k..(i + 1) * k],
            d: &self.d[i * self.nb..(i + 1) * self.nb],
            s: if self.s.is_empty() {
                &[]
            } else {
                &self.s[i * self.nb..(i + 1) * self.nb]
            },
            bsums: match self.kind {
                ActKind::Q8K => &self.bsums[i * k / 16..(i + 1) * k / 16],
                ActKind::Q8_0 => &self.bsums[i * self.nb..(i + 1) * self.nb],
                ActKind::Q8_1 => &[],
            },
            bs16: match self.kind {
                ActKind::Q8K => &self.bs16[i * self.nb * BS16..(i + 1) * self.nb * BS16],
                _ => &[],
            },
        }
    }
}

/// One quantized activation row: quants, block scales, block sums `d * sum(q)` (Q8_1; else
/// empty), integer sums `bsums` of every 16 quants (Q8_K) or of every block (Q8_0; else
/// empty).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub(crate) qs: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) s: &'a [f32],
    pub(crate) bsums: &'a [i32],
    /// [`QuantizedRows::bs16`] of this row.
    pub(crate) bs16: &'a [i16],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repack_rejects_bad_sizes() {
        assert!(matches!(
            Panels::from_gguf(QFormat::Q8_0, &[0u8; 34], 1, 33),
            Err(QuantError::RaggedBlocks { .. })
        ));
        assert!(matches!(
            Panels::from_gguf(QFormat::Q4_1, &[0u8; 19], 1, 32),
            Err(QuantError::DataSize { got: 19, want: 20 })
        ));
        assert!(matches!(
            Panels::from_gguf(QFormat::Q4K, &[0u8; 144 * 3], 1, 576),
            Err(QuantError::RaggedBlocks {
                cols: 576,
                block: 256
            })
        ));
    }

    #[test]
    fn large_panels_are_a_huge_page_map_with_the_same_bytes() {
        // 67 rows (nine panels, the last padded) of 1,024 Q8_0 blocks: 2.5 MB of panels.
        let (n, k) = (67, 1024 * 32);
        let raw: Vec<u8> = (0..n * (k / 32) * 34)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let p = Panels::from_gguf(QFormat::Q8_0, &raw, n, k).expect("valid");
        let PanelBytes::Owned(owned) = &p.data else {
            panic!("repacked panels are owned");
        };
        assert!(owned.len() >= HUGE_MIN);
        assert!(matches!(owned, OwnedBytes::Large(_)));
        let mut want = vec![0u8; owned.len()];
        Panels::repack(QFormat::Q8_0, &raw, n, k, &mut want).expect("valid");
        assert_eq!(&p.data[..], &want[..]);
        assert_eq!(&p.clone().data[..], &want[..]);
        // Below a huge page: a vector, zeroed as well.
        let small = OwnedBytes::zeroed(HUGE_MIN - 1);
        assert!(matches!(small, OwnedBytes::Small(_)) && small.iter().all(|&b| b == 0));
    }

    #[test]
    fn repack_keeps_each_rows_bytes() {
        // 9 rows (two panels, the second padded) of one Q4_1 block each.
        let mut raw = Vec::new();
        for row in 0..9u8 {
            raw.extend_from_slice(&f16::from_f32(row as f32 + 1.0).to_le_bytes());
            raw.extend_from_slice(&f16::from_f32(-(row as f32)).to_le_bytes());
            raw.extend(std::iter::repeat_n(row * 17, 16));
        }
        let p = Panels::from_gguf(QFormat::Q4_1, &raw, 9, 32).expect("valid");
        assert_eq!(p.data.len(), 2 * QFormat::Q4_1.record());
        let mut out = [0f32; 32];
        for row in 0..9usize {
            p.row_f32(row, &mut out);
            let (lo, hi) = ((row * 17) & 0x0F, (row * 17) >> 4);
            let (d, m) = (row as f32 + 1.0, -(row as f32));
            assert_eq!(out[0], lo as f32 * d + m, "row {row}");
            assert_eq!(out[31], hi as f32 * d + m, "row {row}");
        }
        // gather undoes the repacking for every format.
        for format in [
            QFormat::Q8_0,
            QFormat::Q4_0,
            QFormat::Q4_1,
            QFormat::Q5_0,
            QFormat::Q5_1,
            QFormat::Q4K,
            QFormat::Q5K,
            QFormat::Q6K,
            QFormat::Mxfp4,
        ] {
            let blk = format.gguf_block();
            let raw: Vec<u8> = (0..9 * blk).map(|i| (i * 7 % 251) as u8).collect();
            let p = Panels::from_gguf(format, &raw, 9, format.block()).expect("valid");
            let mut got = vec![0u8; blk];
            for row in 0..9 {
                let rec = &p.panel(row / PANEL)[..format.record()];
                format.gather(rec, row % PANEL, &mut got);
                assert_eq!(
                    &got[..],
                    &raw[row * blk..(row + 1) * blk],
                    "{format:?} {row}"
                );
            }
        }
    }
}
