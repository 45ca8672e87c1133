//! The device layout of quantized weights for the integer matmuls (`mmq.cu`): a GGUF matrix's
//! blocks split into three regions so that every lane's load is 16 bytes and aligned.
//!
//! - A, the quants: `QB` bytes per block (a multiple of 16), row after row, block after block;
//! - B, 16 bytes of metadata per block (the k-quants' scales; Q4_K / Q5_K with `d`, `dmin`);
//! - C, the per-block scalars (`SB` bytes: f16 scales, Q5_0 / Q5_1 high bits, MXFP4's E8M0
//!   exponent byte).
//!
//! Each region starts at a multiple of 16 bytes. Nothing is converted: every byte is a byte of
//! the GGUF block, moved (Q5_0's C entry has two zero bytes of padding).

use crate::model::quant::WeightFormat;

/// One format's regions: bytes per block of A, B and C, the GGUF block's size and elements,
/// lanes per block in the kernel (`P`), and where each GGUF byte range goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) qb: usize,
    pub(crate) mb: usize,
    pub(crate) sb: usize,
    pub(crate) gguf: usize,
    pub(crate) block: usize,
    /// Lanes per block (`Fmt<T>::P` in `mmq.cu`; read by the kernel emulation's tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) parts: usize,
    /// (region 0/1/2 for A/B/C, source offset in the GGUF block, length, offset in the entry).
    moves: &'static [(u8, usize, usize, usize)],
}

/// The layout of a quantized format (`None` for the float formats, uploaded as stored).
pub(crate) fn layout(f: WeightFormat) -> Option<Layout> {
    let l = |qb, mb, sb, gguf, block, parts, moves| Layout {
        qb,
        mb,
        sb,
        gguf,
        block,
        parts,
        moves,
    };
    Some(match f {
        WeightFormat::Q8_0 => l(32, 0, 2, 34, 32, 2, &[(0, 2, 32, 0), (2, 0, 2, 0)]),
        WeightFormat::Q4_0 => l(16, 0, 2, 18, 32, 1, &[(0, 2, 16, 0), (2, 0, 2, 0)]),
        WeightFormat::Q4_1 => l(16, 0, 4, 20, 32, 1, &[(0, 4, 16, 0), (2, 0, 4, 0)]),
        WeightFormat::Q5_0 => l(
            16,
            0,
            8,
            22,
            32,
            1,
            &[(0, 6, 16, 0), (2, 0, 2, 0), (2, 2, 4, 4)],
        ),
        WeightFormat::Q5_1 => l(
            16,
            0,
            8,
            24,
            32,
            1,
            &[(0, 8, 16, 0), (2, 0, 4, 0), (2, 4, 4, 4)],
        ),
        WeightFormat::Q4K => l(128, 16, 0, 144, 256, 8, &[(0, 16, 128, 0), (1, 0, 16, 0)]),
        WeightFormat::Q5K => l(160, 16, 0, 176, 256, 8, &[(0, 16, 160, 0), (1, 0, 16, 0)]),
        WeightFormat::Q6K => l(
            192,
            16,
            2,
            210,
            256,
            8,
            &[(0, 0, 192, 0), (1, 192, 16, 0), (2, 208, 2, 0)],
        ),
        // The exponent byte in C, the codes (as Q4_0's nibbles) in A.
        WeightFormat::Mxfp4 => l(16, 0, 1, 17, 32, 1, &[(0, 1, 16, 0), (2, 0, 1, 0)]),
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => return None,
    })
}

/// A repacked matrix: the bytes and where regions B and C start.
#[derive(Debug, Clone)]
pub(crate) struct Repacked {
    pub(crate) bytes: Vec<u8>,
    pub(crate) b_off: usize,
    pub(crate) c_off: usize,
}

impl Layout {
    /// Bytes of the repacked `n × k` matrix and its region offsets `(b_off, c_off, total)`.
    pub(crate) fn offsets(&self, n: usize, k: usize) -> (usize, usize, usize) {
        let blocks = n * (k / self.block);
        let b_off = (blocks * self.qb).next_multiple_of(16);
        let c_off = (b_off + blocks * self.mb).next_multiple_of(16);
        (b_off, c_off, c_off + blocks * self.sb)
    }

    /// Repacks the row-major GGUF blocks `raw` of an `n × k` matrix.
    ///
    /// # Panics
    /// If `raw` is not `n · k / block` blocks.
    pub(crate) fn repack(&self, raw: &[u8], n: usize, k: usize) -> Repacked {
        let blocks = n * (k / self.block);
        assert!(
            k.is_multiple_of(self.block) && raw.len() == blocks * self.gguf,
            "repack: {} bytes for {n} × {k}",
            raw.len()
        );
        let (b_off, c_off, total) = self.offsets(n, k);
        let mut bytes = vec![0u8; total];
        let starts = [0, b_off, c_off];
        let sizes = [self.qb, self.mb, self.sb];
        for (i, blk) in raw.chunks_exact(self.gguf).enumerate() {
            for &(region, src, len, dst) in self.moves {
                let r = region as usize;
                let at = starts[r] + i * sizes[r] + dst;
                bytes[at..at + len].copy_from_slice(&blk[src..src + len]);
            }
        }
        Repacked {
            bytes,
            b_off,
            c_off,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every GGUF byte lands once, the entries are filled but for Q5_0's padding, and the
    /// regions are 16-byte aligned.
    #[test]
    fn every_byte_moves_once() {
        for f in [
            WeightFormat::Q8_0,
            WeightFormat::Q4_0,
            WeightFormat::Q4_1,
            WeightFormat::Q5_0,
            WeightFormat::Q5_1,
            WeightFormat::Q4K,
            WeightFormat::Q5K,
            WeightFormat::Q6K,
            WeightFormat::Mxfp4,
        ] {
            let l = layout(f).expect("quantized");
            let covered: usize = l.moves.iter().map(|m| m.2).sum();
            assert_eq!(covered, l.gguf, "{f:?}");
            let pad = if f == WeightFormat::Q5_0 { 2 } else { 0 };
            assert_eq!(l.qb + l.mb + l.sb, l.gguf + pad, "{f:?}");
            assert_eq!(l.qb % 16, 0, "{f:?}");
            let (n, k) = (3, 2 * l.block);
            // Distinct bytes (mod 251) so that a misplaced byte shows.
            let raw: Vec<u8> = (0..n * 2 * l.gguf).map(|i| (i % 251) as u8).collect();
            let r = l.repack(&raw, n, k);
            assert_eq!(r.b_off % 16, 0);
            assert_eq!(r.c_off % 16, 0);
            let mut seen: Vec<u8> = r.bytes.clone();
            seen.sort_unstable();
            let mut want = raw.clone();
            want.extend(std::iter::repeat_n(0u8, pad * n * 2));
            want.extend(std::iter::repeat_n(0u8, r.bytes.len() - want.len()));
            want.sort_unstable();
            assert_eq!(seen, want, "{f:?}");
        }
    }
}
