//! Portable kernels: the reference sequence of floating-point operations for every output
//! element. The AVX2 kernels (`avx2.rs`) must reproduce these bits exactly; tests compare them.
//!
//! Quantized formats: per 32-element block an exact integer dot product `sumi`, then
//! `acc += (sumi as f32 * d_w) * d_x` (Q8_0 × Q8_0) or
//! `acc += (sumi as f32 * d_w) * d_x + m_w * s_x` (Q4_1 × Q8_1), blocks in order from
//! `acc = 0` — the same per-block expression as ggml's and candle's generic `vec_dot`.
//!
//! Float formats (F32, F16 widened exactly): the first `32 * floor(k / 32)` elements go into 32
//! fused multiply-add lanes (element `t` into lane `t % 32`), the lanes are summed in a fixed
//! tree (see [`dot_f32`]), and the remaining `k % 32` elements are added in order with fused
//! multiply-adds. This file does no threading and knows nothing of the output layout.

use half::f16;

use super::layout::{f16_at, ActRow, QFormat, PANEL, Q4_1_MS, Q4_1_QS, Q8_0_QS, QK};

/// Lanes of the float dot product (4 AVX2 accumulators × 8).
pub(crate) const F_LANES: usize = 32;

/// One panel of quantized weights against one quantized activation row: the 8 outputs.
pub(crate) fn panel_dot(format: QFormat, panel: &[u8], nb: usize, act: ActRow<'_>) -> [f32; PANEL] {
    let (qs, d, s) = (act.qs, act.d, act.s);
    let rec = format.record();
    let mut acc = [0f32; PANEL];
    for b in 0..nb {
        let r = &panel[b * rec..(b + 1) * rec];
        let a = &qs[b * QK..(b + 1) * QK];
        let dx = d[b];
        for (lane, acc) in acc.iter_mut().enumerate() {
            let dw = f16_at(r, lane * 2);
            match format {
                QFormat::Q8_0 => {
                    let w = &r[Q8_0_QS + lane * QK..Q8_0_QS + (lane + 1) * QK];
                    let sumi: i32 = w
                        .iter()
                        .zip(a)
                        .map(|(&w, &a)| (w as i8) as i32 * a as i32)
                        .sum();
                    *acc += (sumi as f32 * dw) * dx;
                }
                QFormat::Q4_1 => {
                    let w = &r[Q4_1_QS + lane * QK / 2..Q4_1_QS + (lane + 1) * QK / 2];
                    let mut sumi = 0i32;
                    for (j, &q) in w.iter().enumerate() {
                        sumi += (q & 0x0F) as i32 * a[j] as i32
                            + (q >> 4) as i32 * a[j + QK / 2] as i32;
                    }
                    let mw = f16_at(r, Q4_1_MS + lane * 2);
                    *acc += (sumi as f32 * dw) * dx + mw * s[b];
                }
            }
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

#[cfg(test)]
mod tests {
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
        let mut rec = vec![0u8; QFormat::Q8_0.record()];
        for lane in 0..PANEL {
            rec[lane * 2..lane * 2 + 2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
            for j in 0..QK {
                rec[Q8_0_QS + lane * QK + j] = (lane as i8 - 3) as u8;
            }
        }
        let act = ActRow {
            qs: &[2i8; QK],
            d: &[0.25],
            s: &[],
        };
        let out = panel_dot(QFormat::Q8_0, &rec, 1, act);
        for (lane, &o) in out.iter().enumerate() {
            assert_eq!(o, (lane as f32 - 3.0) * 64.0 * 0.5 * 0.25);
        }
    }
}
