//! AVX2 (+FMA, F16C) versions of the kernels in `scalar.rs`, producing the same bits.
//!
//! Quantized panels: for each block, the eight rows' exact 32-element integer dot products
//! (`maddubs`/`madd`, then a horizontal-add transpose so lane `r` holds row `r`'s sum), then the
//! same per-block float expression as the scalar kernel, one lane per output row — no float
//! value is ever reassociated. Float dot products use four 8-lane FMA accumulators in the
//! lane order and reduction tree that `scalar::dot_f32` spells out. Callers get the portable
//! kernel instead when the CPU lacks AVX2, FMA or F16C (same bits, slower).

use std::arch::x86_64::*;

use super::layout::{QFormat, PANEL, Q4_1_MS, Q4_1_QS, Q8_0_QS, QK, REC_Q4_1, REC_Q8_0};
use super::scalar;

/// Whether this CPU runs the kernels of this file.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// One panel against one quantized activation row (see `scalar::panel_dot`).
pub(crate) fn panel_dot(
    format: QFormat,
    panel: &[u8],
    nb: usize,
    qs: &[i8],
    d: &[f32],
    s: &[f32],
) -> [f32; PANEL] {
    assert!(panel.len() >= nb * format.record() && qs.len() >= nb * QK && d.len() >= nb);
    if !available() {
        return scalar::panel_dot(format, panel, nb, qs, d, s);
    }
    // SAFETY: the features are present (checked above) and the asserts bound every read.
    unsafe {
        match format {
            QFormat::Q8_0 => panel_q8_0(panel, nb, qs, d),
            QFormat::Q4_1 => {
                assert!(s.len() >= nb);
                panel_q4_1(panel, nb, qs, d, s)
            }
        }
    }
}

/// F32 dot product (see `scalar::dot_f32`).
pub(crate) fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    assert_eq!(x.len(), w.len());
    if !available() {
        return scalar::dot_f32(x, w);
    }
    // SAFETY: features checked; lengths equal.
    unsafe { dot_f32_avx(x, w) }
}

/// F16-weight dot product (see `scalar::dot_f16`).
pub(crate) fn dot_f16(x: &[f32], w: &[u16]) -> f32 {
    assert_eq!(x.len(), w.len());
    if !available() {
        return scalar::dot_f16(x, w);
    }
    // SAFETY: features checked; lengths equal.
    unsafe { dot_f16_avx(x, w) }
}

/// Sums each of eight vectors of eight i32 lanes; lane `r` of the result is the sum of `v[r]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum8(v: [__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(v[0], v[1]);
    let h23 = _mm256_hadd_epi32(v[2], v[3]);
    let h45 = _mm256_hadd_epi32(v[4], v[5]);
    let h67 = _mm256_hadd_epi32(v[6], v[7]);
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h4567 = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    let hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    _mm256_add_epi32(lo, hi)
}

/// Eight i32 lanes of the signed 32 × i8 dot product of `w` (at `p`) and `a`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q8(p: *const u8, a: __m256i, ones: __m256i) -> __m256i {
    let w = _mm256_loadu_si256(p as *const __m256i);
    // |w| · (a · sign w): maddubs wants an unsigned left operand.
    let prod = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    _mm256_madd_epi16(prod, ones)
}

/// Eight i32 lanes of the dot product of 32 nibbles (16 bytes at `p`, ggml order) and `a`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_q4(p: *const u8, a: __m256i, ones: __m256i, low: __m256i) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    let w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), low);
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_q8_0(panel: &[u8], nb: usize, qs: &[i8], d: &[f32]) -> [f32; PANEL] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (b, &dx) in d.iter().enumerate().take(nb) {
        let r = panel.as_ptr().add(b * REC_Q8_0);
        let a = _mm256_loadu_si256(qs.as_ptr().add(b * QK) as *const __m256i);
        let q = r.add(Q8_0_QS);
        let sum = hsum8([
            dot_q8(q, a, ones),
            dot_q8(q.add(QK), a, ones),
            dot_q8(q.add(2 * QK), a, ones),
            dot_q8(q.add(3 * QK), a, ones),
            dot_q8(q.add(4 * QK), a, ones),
            dot_q8(q.add(5 * QK), a, ones),
            dot_q8(q.add(6 * QK), a, ones),
            dot_q8(q.add(7 * QK), a, ones),
        ]);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(r as *const __m128i));
        let v = _mm256_mul_ps(
            _mm256_mul_ps(_mm256_cvtepi32_ps(sum), dw),
            _mm256_set1_ps(dx),
        );
        acc = _mm256_add_ps(acc, v);
    }
    let mut out = [0f32; PANEL];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_q4_1(panel: &[u8], nb: usize, qs: &[i8], d: &[f32], s: &[f32]) -> [f32; PANEL] {
    let ones = _mm256_set1_epi16(1);
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    for (b, &dx) in d.iter().enumerate().take(nb) {
        let r = panel.as_ptr().add(b * REC_Q4_1);
        let a = _mm256_loadu_si256(qs.as_ptr().add(b * QK) as *const __m256i);
        let q = r.add(Q4_1_QS);
        const H: usize = QK / 2;
        let sum = hsum8([
            dot_q4(q, a, ones, low),
            dot_q4(q.add(H), a, ones, low),
            dot_q4(q.add(2 * H), a, ones, low),
            dot_q4(q.add(3 * H), a, ones, low),
            dot_q4(q.add(4 * H), a, ones, low),
            dot_q4(q.add(5 * H), a, ones, low),
            dot_q4(q.add(6 * H), a, ones, low),
            dot_q4(q.add(7 * H), a, ones, low),
        ]);
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(r as *const __m128i));
        let mw = _mm256_cvtph_ps(_mm_loadu_si128(r.add(Q4_1_MS) as *const __m128i));
        let scaled = _mm256_mul_ps(
            _mm256_mul_ps(_mm256_cvtepi32_ps(sum), dw),
            _mm256_set1_ps(dx),
        );
        let v = _mm256_add_ps(scaled, _mm256_mul_ps(mw, _mm256_set1_ps(s[b])));
        acc = _mm256_add_ps(acc, v);
    }
    let mut out = [0f32; PANEL];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// Generates a float dot product over weights of element type `$t`, read 8 at a time with
/// `$load(ptr)` and one at a time with `$get(value)`, in `scalar::dot_f32`'s order.
macro_rules! float_dot {
    ($name:ident, $t:ty, $load:expr, $get:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(x: &[f32], w: &[$t]) -> f32 {
            let n = w.len();
            let full = n / scalar::F_LANES * scalar::F_LANES;
            let (xp, wp) = (x.as_ptr(), w.as_ptr());
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut c = 0;
            while c < full {
                for (q, acc) in acc.iter_mut().enumerate() {
                    let t = c + 8 * q;
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(xp.add(t)), $load(wp.add(t)), *acc);
                }
                c += scalar::F_LANES;
            }
            let mut sum = reduce(acc);
            for (&xt, &wt) in x[full..].iter().zip(&w[full..]) {
                sum = xt.mul_add($get(wt), sum);
            }
            sum
        }
    };
}

float_dot!(
    dot_f32_avx,
    f32,
    |p: *const f32| _mm256_loadu_ps(p),
    |v: f32| v
);
float_dot!(
    dot_f16_avx,
    u16,
    |p: *const u16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
    |v: u16| half::f16::from_bits(v).to_f32()
);

/// `(acc0 + acc1) + (acc2 + acc3)`, then lanes `l + l+4`, then `l + l+2`, then the last two.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn reduce(acc: [__m256; 4]) -> f32 {
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    let h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
    let h3 = _mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1));
    _mm_cvtss_f32(h3)
}
