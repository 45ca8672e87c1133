//! Portable kernels: the reference sequence of floating-point operations for every output
//! element. The AVX2 kernels (`x86.rs`) must reproduce these bits exactly; tests compare them.
//!
//! Quantized formats: per block an exact integer dot product `sumi` (and, for some formats, a
//! second exact integer `summ`), then one float expression per block, blocks in order from
//! `acc = 0`:
//!
//! | weights × activations | per-block update |
//! | --- | --- |
//! | Q8_0, Q4_0, Q5_0 × Q8_0 | `acc += (sumi as f32 * d_w) * d_x` |
//! | MXFP4 × Q8_0 | `acc += (sumi as f32 * e8m0_half(e_w)) * d_x` |
//! | Q4_1, Q5_1 × Q8_1 | `acc += (sumi as f32 * d_w) * d_x + m_w * s_x` |
//! | Q4_K, Q5_K × Q8_K | `acc += (d_x * d_w) * sumi as f32 - (d_x * dmin_w) * summ as f32` |
//! | Q6_K × Q8_K | `acc += (d_x * d_w) * sumi as f32` |
//!
//! where `sumi` is the sum over the block of `q_w · q_x` (Q4_0 / Q5_0 / Q6_K with the stored
//! offset subtracted from `q_w`; MXFP4 with `q_w` its code's doubled value; k-quants with each product times its sub-block scale) and
//! `summ` the sum over the eight sub-blocks of `min_j · sum(q_x in sub-block j)` — the
//! per-block expressions of ggml's generic `vec_dot`s.
//!
//! Float formats (F32, F16 and BF16 widened exactly): the first `32 * floor(k / 32)` elements
//! go into 32 fused multiply-add lanes (element `t` into lane `t % 32`), the lanes are summed in
//! a fixed tree (see [`dot_f32`]), and the remaining `k % 32` elements are added in order with
//! fused multiply-adds. This file does no threading and knows nothing of the output layout.

use half::f16;

use super::layout::{
    e8m0_half, f16_at, q5_value, q5k_value, q6k_value, scales_mins_k4, ActRow, QFormat, BLOCK_Q6_K,
    KVALUES_MXFP4, PANEL, QK, QK_K,
};

/// Lanes of the float dot product (4 AVX2 accumulators × 8).
pub(crate) const F_LANES: usize = 32;

/// The exact integer parts of one weight block (GGUF bytes `w`) against block `b` of `act`:
/// `(sumi, summ)` as in the module doc (`summ` is 0 where the format has none).
pub(crate) fn block_ints(format: QFormat, w: &[u8], act: &ActRow<'_>, b: usize) -> (i32, i32) {
    let a = &act.qs[b * format.block()..(b + 1) * format.block()];
    let dot = |q: &dyn Fn(usize) -> i32| -> i32 { (0..a.len()).map(|e| q(e) * a[e] as i32).sum() };
    let nib = |qs: &[u8], e: usize| -> i32 {
        if e < QK / 2 {
            (qs[e] & 0x0F) as i32
        } else {
            (qs[e - QK / 2] >> 4) as i32
        }
    };
    let qh = |at: usize| u32::from_le_bytes([w[at], w[at + 1], w[at + 2], w[at + 3]]);
    match format {
        QFormat::Q8_0 => (dot(&|e| (w[2 + e] as i8) as i32), 0),
        QFormat::Q4_0 => (dot(&|e| nib(&w[2..], e) - 8), 0),
        QFormat::Q4_1 => (dot(&|e| nib(&w[4..], e)), 0),
        QFormat::Q5_0 => {
            let h = qh(2);
            (dot(&|e| q5_value(&w[6..], h, e) as i32 - 16), 0)
        }
        QFormat::Q5_1 => {
            let h = qh(4);
            (dot(&|e| q5_value(&w[8..], h, e) as i32), 0)
        }
        QFormat::Q4K | QFormat::Q5K => {
            let (sc, m) = scales_mins_k4(&w[4..16]);
            let q = |e: usize| -> i32 {
                if format == QFormat::Q4K {
                    let byte = w[16 + 32 * (e / 64) + e % 32];
                    (if (e / 32).is_multiple_of(2) {
                        byte & 0x0F
                    } else {
                        byte >> 4
                    }) as i32
                } else {
                    q5k_value(w, e) as i32
                }
            };
            let sumi = dot(&|e| sc[e / 32] as i32 * q(e));
            let bs = &act.bsums[b * QK_K / 16..(b + 1) * QK_K / 16];
            let summ = (0..8)
                .map(|j| m[j] as i32 * (bs[2 * j] + bs[2 * j + 1]))
                .sum();
            (sumi, summ)
        }
        QFormat::Q6K => {
            let sumi = dot(&|e| (w[192 + e / 16] as i8) as i32 * (q6k_value(w, e) as i32 - 32));
            (sumi, 0)
        }
        QFormat::Mxfp4 => (dot(&|e| KVALUES_MXFP4[nib(&w[1..], e) as usize] as i32), 0),
    }
}

/// Adds one block's contribution to `acc` (the float expressions of the module doc).
#[inline]
pub(crate) fn block_update(format: QFormat, w: &[u8], act: &ActRow<'_>, b: usize, acc: &mut f32) {
    let (sumi, summ) = block_ints(format, w, act, b);
    let dx = act.d[b];
    match format {
        QFormat::Q8_0 | QFormat::Q4_0 | QFormat::Q5_0 => {
            *acc += (sumi as f32 * f16_at(w, 0)) * dx;
        }
        QFormat::Q4_1 | QFormat::Q5_1 => {
            *acc += (sumi as f32 * f16_at(w, 0)) * dx + f16_at(w, 2) * act.s[b];
        }
        QFormat::Q4K | QFormat::Q5K => {
            *acc += (dx * f16_at(w, 0)) * sumi as f32 - (dx * f16_at(w, 2)) * summ as f32;
        }
        QFormat::Q6K => {
            *acc += (dx * f16_at(w, 208)) * sumi as f32;
        }
        QFormat::Mxfp4 => {
            *acc += (sumi as f32 * e8m0_half(w[0])) * dx;
        }
    }
}

/// One panel of quantized weights against one quantized activation row: the 8 outputs.
pub(crate) fn panel_dot(format: QFormat, panel: &[u8], nb: usize, act: ActRow<'_>) -> [f32; PANEL] {
    let rec = format.record();
    let mut acc = [0f32; PANEL];
    let mut blk = [0u8; BLOCK_Q6_K];
    let blk = &mut blk[..format.gguf_block()];
    for b in 0..nb {
        let r = &panel[b * rec..(b + 1) * rec];
        for (lane, acc) in acc.iter_mut().enumerate() {
            format.gather(r, lane, blk);
            block_update(format, blk, &act, b, acc);
        }
    }
    acc
}

/// Float dot product of `x` and `w` in the documented order; `w` read through `get`.
#[inline]
fn dot_by(x: &[f32], n: usize, get: impl Fn(usize) -> f32) -> f32 {
    let full = n / F_LANES * F_LANES;
    let mut lanes = [0f32; F_LANES];
    for c in (0..full).step_by(F_LANES) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = x[c + l].mul_add(get(c + l), *lane);
        }
    }
    // acc0 + acc1, acc2 + acc3 (8 lanes each), then their sum.
    let mut v = [0f32; 8];
    for (l, v) in v.iter_mut().enumerate() {
        *v = (lanes[l] + lanes[8 + l]) + (lanes[16 + l] + lanes[24 + l]);
    }
    // 8 → 4 (l + l+4) → 2 (l + l+2) → 1.
    let h = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    let mut sum = (h[0] + h[2]) + (h[1] + h[3]);
    for (t, &xt) in x.iter().enumerate().take(n).skip(full) {
        sum = xt.mul_add(get(t), sum);
    }
    sum
}

/// F32 dot product (see the module doc for the order of operations).
pub(crate) fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    debug_assert_eq!(x.len(), w.len());
    dot_by(x, w.len(), |t| w[t])
}

/// F16-weight dot product: `w` widened exactly to f32, then as [`dot_f32`].
pub(crate) fn dot_f16(x: &[f32], w: &[u16]) -> f32 {
    debug_assert_eq!(x.len(), w.len());
    dot_by(x, w.len(), |t| f16::from_bits(w[t]).to_f32())
}

/// BF16-weight dot product: `w` widened exactly to f32, then as [`dot_f32`].
pub(crate) fn dot_bf16(x: &[f32], w: &[u16]) -> f32 {
    debug_assert_eq!(x.len(), w.len());
    dot_by(x, w.len(), |t| bf16_to_f32(w[t]))
}

/// The f32 with the same value as the bf16 bit pattern `h`.
#[inline]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::super::layout::Panels;
    use super::*;

    #[test]
    fn dot_f32_is_exact_on_small_integers() {
        for n in [0usize, 1, 31, 32, 33, 64, 100] {
            let x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
            let w: Vec<f32> = (0..n).map(|i| (i % 5) as f32 - 2.0).collect();
            let want: f32 = x.iter().zip(&w).map(|(a, b)| a * b).sum();
            assert_eq!(dot_f32(&x, &w), want, "n = {n}");
            let wh: Vec<u16> = w.iter().map(|&v| f16::from_f32(v).to_bits()).collect();
            assert_eq!(dot_f16(&x, &wh), want, "n = {n}");
        }
    }

    #[test]
    fn panel_dot_q8_0_matches_integer_formula() {
        // One block, lane r has weights all equal to r, scale 0.5; activation all 2, scale 0.25.
        let mut raw = Vec::new();
        for lane in 0..PANEL {
            raw.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
            raw.extend(std::iter::repeat_n((lane as i8 - 3) as u8, QK));
        }
        let panels = Panels::from_gguf(QFormat::Q8_0, &raw, PANEL, QK).expect("valid");
        let rec = panels.panel(0);
        let act = ActRow {
            qs: &[2i8; QK],
            d: &[0.25],
            s: &[],
            bsums: &[],
            bs16: &[],
        };
        let out = panel_dot(QFormat::Q8_0, rec, 1, act);
        for (lane, &o) in out.iter().enumerate() {
            assert_eq!(o, (lane as f32 - 3.0) * 64.0 * 0.5 * 0.25);
        }
    }
}
