//! Memory layouts of the quantized matmul: weight panels repacked from GGUF blocks, and the
//! activation rows quantized to Q8_0 / Q8_1 blocks exactly as ggml's reference code does.
//!
//! Weights are stored as *panels* of [`PANEL`] consecutive output rows. Within a panel, block
//! `b` of all eight rows forms one record: the eight f16 scales side by side (and, for Q4_1,
//! the eight f16 minimums), then the eight rows' quants, each row's bytes exactly as in the GGUF
//! block. A panel's records are contiguous, so one pass over a panel streams its memory once
//! and a SIMD kernel loads the eight scales of a block with one instruction. Rows past `n` in
//! the last panel are zero. This file only moves bytes and quantizes activations; it does no
//! dot products (those are in `scalar.rs` and `avx2.rs`).

use half::f16;

use super::QuantError;

/// Output rows per weight panel (one AVX2 register of f32 results).
pub(crate) const PANEL: usize = 8;
/// Elements per quantization block (Q4_1, Q8_0, Q8_1).
pub(crate) const QK: usize = 32;

/// Bytes of one GGUF Q8_0 block: f16 scale, 32 × i8.
const GGUF_Q8_0: usize = 2 + QK;
/// Bytes of one GGUF Q4_1 block: f16 scale, f16 minimum, 16 bytes of nibbles.
const GGUF_Q4_1: usize = 2 + 2 + QK / 2;

/// Bytes of one panel record of Q8_0 weights: 8 f16 scales, then 8 × 32 i8.
pub(crate) const REC_Q8_0: usize = PANEL * 2 + PANEL * QK;
/// Bytes of one panel record of Q4_1 weights: 8 f16 scales, 8 f16 mins, then 8 × 16 bytes.
pub(crate) const REC_Q4_1: usize = PANEL * 2 * 2 + PANEL * QK / 2;
/// Offset of the quants in a Q8_0 record.
pub(crate) const Q8_0_QS: usize = PANEL * 2;
/// Offset of the minimums in a Q4_1 record.
pub(crate) const Q4_1_MS: usize = PANEL * 2;
/// Offset of the quants in a Q4_1 record.
pub(crate) const Q4_1_QS: usize = PANEL * 4;

/// The two quantized weight formats kept quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QFormat {
    Q8_0,
    Q4_1,
}

impl QFormat {
    /// Bytes of one GGUF block of this format.
    fn gguf_block(self) -> usize {
        match self {
            QFormat::Q8_0 => GGUF_Q8_0,
            QFormat::Q4_1 => GGUF_Q4_1,
        }
    }

    /// Bytes of one panel record of this format.
    pub(crate) fn record(self) -> usize {
        match self {
            QFormat::Q8_0 => REC_Q8_0,
            QFormat::Q4_1 => REC_Q4_1,
        }
    }
}

/// Quantized weights repacked into panels (see the module doc).
#[derive(Debug, Clone)]
pub(crate) struct Panels {
    pub(crate) format: QFormat,
    /// Blocks per row (`k / 32`).
    pub(crate) nb: usize,
    /// `ceil(n / 8) * nb` records.
    pub(crate) data: Vec<u8>,
}

impl Panels {
    /// Repacks the raw GGUF blocks of an `n × k` tensor (row-major, `k / 32` blocks per row).
    pub(crate) fn from_gguf(
        format: QFormat,
        raw: &[u8],
        n: usize,
        k: usize,
    ) -> Result<Panels, QuantError> {
        if !k.is_multiple_of(QK) {
            return Err(QuantError::RaggedBlocks { cols: k, block: QK });
        }
        let nb = k / QK;
        let blk = format.gguf_block();
        let want = n * nb * blk;
        if raw.len() != want {
            return Err(QuantError::DataSize {
                got: raw.len(),
                want,
            });
        }
        let rec = format.record();
        let n_panels = n.div_ceil(PANEL);
        let mut data = vec![0u8; n_panels * nb * rec];
        for row in 0..n {
            let (p, lane) = (row / PANEL, row % PANEL);
            for b in 0..nb {
                let src = &raw[(row * nb + b) * blk..(row * nb + b + 1) * blk];
                let dst = &mut data[(p * nb + b) * rec..(p * nb + b + 1) * rec];
                dst[lane * 2..lane * 2 + 2].copy_from_slice(&src[0..2]);
                match format {
                    QFormat::Q8_0 => {
                        let at = Q8_0_QS + lane * QK;
                        dst[at..at + QK].copy_from_slice(&src[2..]);
                    }
                    QFormat::Q4_1 => {
                        dst[Q4_1_MS + lane * 2..Q4_1_MS + lane * 2 + 2].copy_from_slice(&src[2..4]);
                        let at = Q4_1_QS + lane * QK / 2;
                        dst[at..at + QK / 2].copy_from_slice(&src[4..]);
                    }
                }
            }
        }
        Ok(Panels { format, nb, data })
    }

    /// The records of panel `p` (all `nb` blocks).
    pub(crate) fn panel(&self, p: usize) -> &[u8] {
        let size = self.nb * self.format.record();
        &self.data[p * size..(p + 1) * size]
    }

    /// Dequantizes row `row` into `out` (length `k`), with ggml's formulas
    /// (`q * d` for Q8_0, `q * d + m` for Q4_1).
    pub(crate) fn row_f32(&self, row: usize, out: &mut [f32]) {
        let (p, lane) = (row / PANEL, row % PANEL);
        let rec = self.format.record();
        let panel = self.panel(p);
        for (b, out) in out.chunks_exact_mut(QK).enumerate().take(self.nb) {
            let r = &panel[b * rec..(b + 1) * rec];
            let d = f16_at(r, lane * 2);
            match self.format {
                QFormat::Q8_0 => {
                    let qs = &r[Q8_0_QS + lane * QK..Q8_0_QS + (lane + 1) * QK];
                    for (o, &q) in out.iter_mut().zip(qs) {
                        *o = (q as i8) as f32 * d;
                    }
                }
                QFormat::Q4_1 => {
                    let m = f16_at(r, Q4_1_MS + lane * 2);
                    let qs = &r[Q4_1_QS + lane * QK / 2..Q4_1_QS + (lane + 1) * QK / 2];
                    for (j, &q) in qs.iter().enumerate() {
                        out[j] = (q & 0x0F) as f32 * d + m;
                        out[j + QK / 2] = (q >> 4) as f32 * d + m;
                    }
                }
            }
        }
    }
}

/// `v.round() as i8` (NaN → 0, saturating), without the libm call: truncate, then
/// step away from zero when the exact remainder is at least one half.
#[inline]
fn round_away(v: f32) -> i8 {
    let t = v as i32;
    let rem = v - t as f32;
    // Branch-free: the remainder's side of ±0.5 is data, not a predictable branch.
    let r = t
        .saturating_add((rem >= 0.5) as i32)
        .saturating_sub((rem <= -0.5) as i32);
    r.clamp(-128, 127) as i8
}

/// Reads the little-endian f16 at `at` as f32 (exact).
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// `m` activation rows quantized to blocks of 32 (Q8_0, or Q8_1 with the block sums).
///
/// Scales are stored already rounded through f16 and widened back to f32, so kernels read
/// exactly the values ggml's `block_q8_0.d` / `block_q8_1.{d,s}` would hold.
#[derive(Debug, Default, Clone)]
pub(crate) struct QuantizedRows {
    pub(crate) nb: usize,
    /// `m × k` quants.
    pub(crate) qs: Vec<i8>,
    /// `m × nb` block scales.
    pub(crate) d: Vec<f32>,
    /// `m × nb` values of `d * sum(qs)` (Q8_1 only; empty for Q8_0).
    pub(crate) s: Vec<f32>,
}

impl QuantizedRows {
    /// Quantizes the `m × k` rows of `x`: Q8_1 (with sums) when `with_sums`, else Q8_0.
    ///
    /// Follows ggml's `quantize_row_q8_0_ref` / `quantize_row_q8_1_ref`: `d = amax / 127`,
    /// `q = round(x / d)` (half away from zero, through `id = 1 / d`), `s = f16(d * sum(q))`
    /// with the unrounded f32 `d`.
    pub(crate) fn quantize(x: &[f32], k: usize, with_sums: bool) -> QuantizedRows {
        debug_assert_eq!(k % QK, 0);
        let nb = k / QK;
        let blocks = x.len() / QK;
        let mut qs = vec![0i8; x.len()];
        let mut d = Vec::with_capacity(blocks);
        let mut s = Vec::with_capacity(if with_sums { blocks } else { 0 });
        for (xs, q) in x.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)) {
            let amax = xs.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let dd = amax / 127.0;
            let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
            for (q, &v) in q.iter_mut().zip(xs) {
                *q = round_away(v * id);
            }
            let sum: i32 = q.iter().map(|&q| q as i32).sum();
            d.push(f16::from_f32(dd).to_f32());
            if with_sums {
                s.push(f16::from_f32(sum as f32 * dd).to_f32());
            }
        }
        QuantizedRows { nb, qs, d, s }
    }

    /// Row `i`'s blocks.
    pub(crate) fn row(&self, i: usize) -> ActRow<'_> {
        ActRow {
            qs: self.row_qs(i),
            d: self.row_d(i),
            s: self.row_s(i),
        }
    }

    /// Quants of row `i`.
    pub(crate) fn row_qs(&self, i: usize) -> &[i8] {
        &self.qs[i * self.nb * QK..(i + 1) * self.nb * QK]
    }

    /// Scales of row `i`.
    pub(crate) fn row_d(&self, i: usize) -> &[f32] {
        &self.d[i * self.nb..(i + 1) * self.nb]
    }

    /// Scaled sums of row `i` (Q8_1; empty slice for Q8_0).
    pub(crate) fn row_s(&self, i: usize) -> &[f32] {
        if self.s.is_empty() {
            &[]
        } else {
            &self.s[i * self.nb..(i + 1) * self.nb]
        }
    }
}

/// One quantized activation row: quants, block scales, block sums (Q8_1; else empty).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub(crate) qs: &'a [i8],
    pub(crate) d: &'a [f32],
    pub(crate) s: &'a [f32],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_round_trip_matches_ggml_rule() {
        let mut x = vec![0f32; 64];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 20.0) * 0.37;
        }
        x[40] = 0.0;
        let q = QuantizedRows::quantize(&x, 64, true);
        // amax of block 0 is 20 * 0.37 at i = 0.
        let d0 = 20.0f32 * 0.37 / 127.0;
        assert_eq!(q.d[0], f16::from_f32(d0).to_f32());
        assert_eq!(q.qs[0], -127);
        assert_eq!(q.qs[20], 0);
        let sum: i32 = q.qs[..32].iter().map(|&v| v as i32).sum();
        assert_eq!(q.s[0], f16::from_f32(sum as f32 * d0).to_f32());
        // A zero block has d = 0 and all-zero quants.
        let z = QuantizedRows::quantize(&[0f32; 32], 32, false);
        assert_eq!(z.d, vec![0.0]);
        assert!(z.qs.iter().all(|&v| v == 0));
        assert!(z.s.is_empty());
    }

    #[test]
    fn round_half_away_from_zero() {
        // amax 127 ⇒ d = 1, so quants are round(x): 2.5 → 3, -2.5 → -3.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let q = QuantizedRows::quantize(&x, 32, false);
        assert_eq!(&q.qs[..3], &[127, 3, -3]);
    }

    #[test]
    fn round_away_equals_libm_round() {
        let mut vals = vec![
            0.5f32, -0.5, 1.5, -1.5, 126.5, -126.5, 127.0, -127.0, 0.0, -0.0,
        ];
        vals.extend([0.49999997f32, -0.49999997, 2.4999998, f32::NAN]);
        vals.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 0.00127));
        for v in vals {
            assert_eq!(round_away(v), v.round() as i8, "{v}");
        }
    }

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
        assert_eq!(p.data.len(), 2 * REC_Q4_1);
        let mut out = [0f32; 32];
        for row in 0..9usize {
            p.row_f32(row, &mut out);
            let (lo, hi) = ((row * 17) & 0x0F, (row * 17) >> 4);
            let (d, m) = (row as f32 + 1.0, -(row as f32));
            assert_eq!(out[0], lo as f32 * d + m, "row {row}");
            assert_eq!(out[31], hi as f32 * d + m, "row {row}");
        }
    }
}
