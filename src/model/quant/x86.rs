//! AVX2 (+FMA, F16C) versions of the kernels in `scalar.rs`, producing the same bits.
//!
//! Quantized panels: for each block, the eight rows' exact 32-element integer dot products
//! (`maddubs`/`madd`, then a horizontal-add transpose so lane `r` holds row `r`'s sum), then the
//! same per-block float expression as the scalar kernel, one lane per output row — no float
//! value is ever reassociated. Float dot products use four 8-lane FMA accumulators in the
//! lane order and reduction tree that `scalar::dot_f32` spells out. Callers get the portable
//! kernel instead when the CPU lacks AVX2, FMA or F16C (same bits, slower).

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use super::layout::{
    scales_mins_k4, ActRow, QFormat, PANEL, Q4_0_QS, Q4_1_MS, Q4_1_QS, Q5_0_QH, Q5_0_QS, Q5_1_QH,
    Q5_1_QS, Q8_0_QS, QK, QK_K,
};
use super::scalar;

/// Whether this CPU runs the kernels of this file.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The widest kernel level the dispatch may pick: 0 AVX2, 1 AVX-512 registers, 2 AVX-512
/// VNNI. Every level gives the same bits; tests lower it to run each on one machine.
static LEVEL_CAP: AtomicU8 = AtomicU8::new(u8::MAX);

/// Caps the kernel level (see [`LEVEL_CAP`]); returns the previous cap.
#[cfg(test)]
pub(crate) fn cap_level(level: u8) -> u8 {
    LEVEL_CAP.swap(level, Ordering::Relaxed)
}

/// Whether this CPU also has AVX-512F/VL/BW (32 vector registers for the 8-row kernels).
pub(crate) fn wide() -> bool {
    LEVEL_CAP.load(Ordering::Relaxed) >= 1
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
}

/// Whether this CPU also has AVX-512 VNNI (`dpbusd`: `maddubs` and `madd` in one instruction).
pub(crate) fn vnni() -> bool {
    LEVEL_CAP.load(Ordering::Relaxed) >= 2 && wide() && is_x86_feature_detected!("avx512vnni")
}

/// One panel against `R` quantized activation rows (see `scalar::panel_dot`); each weight
/// block is loaded and unpacked once for all `R` rows.
pub(crate) fn panel_dot<const R: usize>(
    format: QFormat,
    panel: &[u8],
    nb: usize,
    acts: &[ActRow<'_>; R],
) -> [[f32; PANEL]; R] {
    assert!(panel.len() >= nb * format.record());
    for a in acts {
        assert!(a.qs.len() >= nb * format.block() && a.d.len() >= nb);
        match format.act() {
            super::layout::ActKind::Q8_0 => assert!(a.bsums.len() >= nb),
            super::layout::ActKind::Q8_1 => assert!(a.s.len() >= nb),
            super::layout::ActKind::Q8K => assert!(a.bsums.len() >= nb * QK_K / 16),
        }
    }
    if !available() {
        return acts.map(|a| scalar::panel_dot(format, panel, nb, a));
    }
    // SAFETY: the features are present (checked above) and the asserts bound every read.
    unsafe {
        match format {
            QFormat::Q4K | QFormat::Q5K | QFormat::Q6K if R >= 8 && wide() => {
                panel_k_512(format, panel, nb, acts)
            }
            QFormat::Q4K | QFormat::Q5K | QFormat::Q6K => panel_k(format, panel, nb, acts),
            _ => legacy(format, panel, nb, acts),
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

/// BF16-weight dot product (see `scalar::dot_bf16`).
pub(crate) fn dot_bf16(x: &[f32], w: &[u16]) -> f32 {
    assert_eq!(x.len(), w.len());
    if !available() {
        return scalar::dot_bf16(x, w);
    }
    // SAFETY: features checked; lengths equal.
    unsafe { dot_bf16_avx(x, w) }
}

/// Lane `r` of the result is the sum of the eight i32 lanes of `v[r]`, given
/// `h01 = hadd(v0, v1)`, `h23 = hadd(v2, v3)`, `h45`, `h67` likewise.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn hsum8(h01: __m256i, h23: __m256i, h45: __m256i, h67: __m256i) -> __m256i {
    let h0123 = _mm256_hadd_epi32(h01, h23);
    let h4567 = _mm256_hadd_epi32(h45, h67);
    let lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    let hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    _mm256_add_epi32(lo, hi)
}

/// Bytes ahead of the current weight record that the kernels prefetch (panels are contiguous,
/// so this runs into the next panel; prefetching never faults, even past the end).
const PREFETCH: usize = 2048;

/// Prefetches the `len` bytes `PREFETCH` bytes after `r` into L1.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn prefetch(r: *const u8, len: usize) {
    let ahead = r.wrapping_add(PREFETCH);
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off) as *const i8);
        off += 64;
    }
}

/// `s[i]` without a bounds check: the kernels' callers assert the lengths of every
/// activation slice against the block count up front (`panel_dot`).
#[inline(always)]
unsafe fn at<T: Copy>(s: &[T], i: usize) -> T {
    debug_assert!(i < s.len());
    *s.get_unchecked(i)
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

float_dot!(
    dot_bf16_avx,
    u16,
    |p: *const u16| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
        _mm_loadu_si128(p as *const __m128i)
    ))),
    scalar::bf16_to_f32
);

/// Byte `e` of the result is `0x10` where bit `e` of `qh` is set, else 0.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn high_bits(qh: u32) -> __m256i {
    // Byte e gets byte e / 8 of qh, then is tested against bit e % 8.
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let hit = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    _mm256_and_si256(hit, _mm256_set1_epi8(0x10))
}

/// Tags for the 32-element formats in the kernels' const parameter.
const L_Q8_0: u8 = 0;
const L_Q4_0: u8 = 1;
const L_Q4_1: u8 = 2;
const L_Q5_0: u8 = 3;
const L_Q5_1: u8 = 4;

/// The eight interleaved groups of an interleaved record at `r` (see `QFormat::interleave`):
/// group `g`'s 32 bytes, lane `l`'s four quants at bytes `4l..4l + 4`, as stored (Q8_0: i8;
/// the others unsigned, without Q4_0's / Q5_0's offset).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn groups<const F: u8>(r: *const u8) -> [__m256i; 8] {
    if F == L_Q8_0 {
        return std::array::from_fn(|g| {
            _mm256_loadu_si256(r.add(Q8_0_QS + 32 * g) as *const __m256i)
        });
    }
    let (qs, qh) = match F {
        L_Q4_0 => (Q4_0_QS, None),
        L_Q4_1 => (Q4_1_QS, None),
        L_Q5_0 => (Q5_0_QS, Some(Q5_0_QH)),
        _ => (Q5_1_QS, Some(Q5_1_QH)),
    };
    let low = _mm256_set1_epi8(0x0F);
    let mut out = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        let t = _mm256_loadu_si256(r.add(qs + 32 * c) as *const __m256i);
        out[2 * c] = _mm256_and_si256(t, low);
        out[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(t), low);
    }
    if let Some(qh) = qh {
        for (g, v) in out.iter_mut().enumerate() {
            let bits = (r.add(qh + 4 * g) as *const u32).read_unaligned();
            *v = _mm256_or_si256(*v, high_bits(bits));
        }
    }
    out
}

/// Generates the Q8_0, Q4_0, Q5_0 (× Q8_0) and Q4_1, Q5_1 (× Q8_1) panel kernel for
/// `$features`. Per block, each activation row's group `g` (4 quants) is broadcast and
/// multiplied with the weights' group `g` of all eight lanes, so the i32 lanes accumulate
/// the eight rows' exact block sums directly; then the scalar kernel's float expression,
/// lane-wise. `$vnni`: `dpbusd` (unsigned × signed, i32 accumulate), with Q8_0's weights made
/// unsigned by flipping their sign bit (`+128`, taken back as `128 · Σ q_x`); else `maddubs`
/// and `madd`, with Q8_0's sign moved onto the activations. Neither can saturate (weights
/// below 32, or |w| <= 128 against |q_x| <= 127 in pairs), so both give the exact sums.
macro_rules! legacy_panel {
    ($features:literal, $name:ident, $vnni:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const F: u8>(
            panel: &[u8],
            nb: usize,
            acts: &[ActRow<'_>; R],
        ) -> [[f32; PANEL]; R] {
            let (format, offset) = match F {
                L_Q8_0 => (QFormat::Q8_0, if $vnni { 128 } else { 0 }),
                L_Q4_0 => (QFormat::Q4_0, 8),
                L_Q4_1 => (QFormat::Q4_1, 0),
                L_Q5_0 => (QFormat::Q5_0, 16),
                _ => (QFormat::Q5_1, 0),
            };
            let with_min = F == L_Q4_1 || F == L_Q5_1;
            let rec = format.record();
            let ones = _mm256_set1_epi16(1);
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..nb {
                let r = panel.as_ptr().add(b * rec);
                prefetch(r, rec);
                let w = groups::<F>(r);
                // The unsigned left operands.
                let wu: [__m256i; 8] = if F != L_Q8_0 {
                    w
                } else if $vnni {
                    w.map(|v| _mm256_xor_si256(v, _mm256_set1_epi8(-128)))
                } else {
                    w.map(|v| _mm256_sign_epi8(v, v))
                };
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(r as *const __m128i));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let a = acts[i].qs.as_ptr().add(b * QK) as *const i32;
                    let mut sum = _mm256_setzero_si256();
                    for g in 0..8 {
                        let ag = _mm256_set1_epi32(a.add(g).read_unaligned());
                        sum = if $vnni {
                            _mm256_dpbusd_epi32(sum, wu[g], ag)
                        } else {
                            let ag = if F == L_Q8_0 {
                                _mm256_sign_epi8(ag, w[g])
                            } else {
                                ag
                            };
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wu[g], ag), ones);
                            _mm256_add_epi32(sum, p)
                        };
                    }
                    if offset != 0 {
                        let off = _mm256_set1_epi32(offset * at(acts[i].bsums, b));
                        sum = _mm256_sub_epi32(sum, off);
                    }
                    let scaled = _mm256_mul_ps(
                        _mm256_mul_ps(_mm256_cvtepi32_ps(sum), dw),
                        _mm256_set1_ps(at(acts[i].d, b)),
                    );
                    let v = if with_min {
                        let mw = _mm256_cvtph_ps(_mm_loadu_si128(r.add(Q4_1_MS) as *const __m128i));
                        _mm256_add_ps(scaled, _mm256_mul_ps(mw, _mm256_set1_ps(at(acts[i].s, b))))
                    } else {
                        scaled
                    };
                    *acc = _mm256_add_ps(*acc, v);
                }
            }
            acc.map(|acc| {
                let mut out = [0f32; PANEL];
                _mm256_storeu_ps(out.as_mut_ptr(), acc);
                out
            })
        }
    };
}

legacy_panel!("avx2,fma,f16c", panel_legacy, false);
legacy_panel!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw",
    panel_legacy_512,
    false
);
legacy_panel!(
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    panel_legacy_vnni,
    true
);

/// The panel of a 32-element `format` on the widest kernel this CPU runs.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<const R: usize>(
    format: QFormat,
    panel: &[u8],
    nb: usize,
    acts: &[ActRow<'_>; R],
) -> [[f32; PANEL]; R] {
    macro_rules! pick {
        ($f:expr) => {
            if vnni() {
                panel_legacy_vnni::<R, { $f }>(panel, nb, acts)
            } else if R >= 8 && wide() {
                panel_legacy_512::<R, { $f }>(panel, nb, acts)
            } else {
                panel_legacy::<R, { $f }>(panel, nb, acts)
            }
        };
    }
    match format {
        QFormat::Q8_0 => pick!(L_Q8_0),
        QFormat::Q4_0 => pick!(L_Q4_0),
        QFormat::Q4_1 => pick!(L_Q4_1),
        QFormat::Q5_0 => pick!(L_Q5_0),
        _ => pick!(L_Q5_1),
    }
}

/// One k-quant block (`blk`, GGUF bytes) against block `b` of each activation row: per row, 8
/// i32 lanes whose sum is the block's scaled integer dot product (for Q6_K before the
/// `32 · Σ sc · bsum` offset correction). The block's coefficients of the activation sums go
/// into `coef[..][lane]` (Q4_K/Q5_K: its 8 mins; Q6_K: its 16 scales), for [`k_extra`].
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lane_k<const R: usize>(
    format: QFormat,
    blk: *const u8,
    acts: &[ActRow<'_>; R],
    b: usize,
    coef: &mut [[i32; PANEL]; 16],
    lane: usize,
) -> [__m256i; R] {
    let mut s = [_mm256_setzero_si256(); R];
    let low = _mm256_set1_epi8(0x0F);
    let act = |i: usize, at: usize| {
        _mm256_loadu_si256(acts[i].qs.as_ptr().add(b * QK_K + at) as *const __m256i)
    };
    if format == QFormat::Q6K {
        let sc = std::slice::from_raw_parts(blk.add(192) as *const i8, 16);
        let three = _mm256_set1_epi8(3);
        for n in 0..2 {
            let ql0 = _mm256_loadu_si256(blk.add(64 * n) as *const __m256i);
            let ql1 = _mm256_loadu_si256(blk.add(64 * n + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(blk.add(128 + 32 * n) as *const __m256i);
            let high = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(v, three));
            let u = [
                _mm256_or_si256(_mm256_and_si256(ql0, low), high(qh)),
                _mm256_or_si256(_mm256_and_si256(ql1, low), high(_mm256_srli_epi16::<2>(qh))),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low),
                    high(_mm256_srli_epi16::<4>(qh)),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low),
                    high(_mm256_srli_epi16::<6>(qh)),
                ),
            ];
            for (t, &u) in u.iter().enumerate() {
                let c = 4 * n + t;
                let sv = _mm256_set_m128i(
                    _mm_set1_epi16(sc[2 * c + 1] as i16),
                    _mm_set1_epi16(sc[2 * c] as i16),
                );
                for (i, s) in s.iter_mut().enumerate() {
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, act(i, 32 * c)), sv);
                    *s = _mm256_add_epi32(*s, p);
                }
            }
        }
        for (c, &v) in coef.iter_mut().zip(sc) {
            c[lane] = v as i32;
        }
        return s;
    }
    let scales = std::slice::from_raw_parts(blk.add(4), 12);
    let (sc, m) = scales_mins_k4(scales);
    let (qs, qh) = if format == QFormat::Q5K {
        (48, Some(_mm256_loadu_si256(blk.add(16) as *const __m256i)))
    } else {
        (16, None)
    };
    let one = _mm256_set1_epi8(1);
    for j in 0..4 {
        let raw = _mm256_loadu_si256(blk.add(qs + 32 * j) as *const __m256i);
        let mut lo = _mm256_and_si256(raw, low);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
        if let Some(qh) = qh {
            let bit = |sh: usize| {
                let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(sh as i32));
                _mm256_slli_epi16::<4>(_mm256_and_si256(v, one))
            };
            lo = _mm256_or_si256(lo, bit(2 * j));
            hi = _mm256_or_si256(hi, bit(2 * j + 1));
        }
        let (s0, s1) = (
            _mm256_set1_epi16(sc[2 * j] as i16),
            _mm256_set1_epi16(sc[2 * j + 1] as i16),
        );
        for (i, s) in s.iter_mut().enumerate() {
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, act(i, 64 * j)), s0);
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, act(i, 64 * j + 32)), s1);
            *s = _mm256_add_epi32(*s, _mm256_add_epi32(p0, p1));
        }
    }
    for (c, &v) in coef.iter_mut().zip(&m) {
        c[lane] = v as i32;
    }
    s
}

/// Each lane's integer correction for one activation row's block sums `bs` (16 sums of 16
/// quants): Q4_K/Q5_K `Σ_j m_j · (bs[2j] + bs[2j+1])`, Q6_K `32 · Σ_g sc_g · bs[g]`, with the
/// coefficients [`lane_k`] left in `coef`. Integer sums: exact in any order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_extra(format: QFormat, coef: &[[i32; PANEL]; 16], bs: &[i32]) -> __m256i {
    let c = |j: usize| _mm256_loadu_si256(coef[j].as_ptr() as *const __m256i);
    let mut e = _mm256_setzero_si256();
    if format == QFormat::Q6K {
        for (g, &b) in bs[..16].iter().enumerate() {
            e = _mm256_add_epi32(e, _mm256_mullo_epi32(c(g), _mm256_set1_epi32(b)));
        }
        _mm256_slli_epi32::<5>(e)
    } else {
        for j in 0..8 {
            let b = _mm256_set1_epi32(bs[2 * j] + bs[2 * j + 1]);
            e = _mm256_add_epi32(e, _mm256_mullo_epi32(c(j), b));
        }
        e
    }
}

macro_rules! k_panel {
    ($features:literal, $name:ident) => {
        /// Q4_K, Q5_K, Q6_K (× Q8_K) panels: per block, the eight rows' exact integer sums
        /// (one lane per row), then `scalar::block_update`'s float expression lane-wise.
        /// Generated twice: the AVX-512 build only adds registers (same operations, same bits).
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize>(
            format: QFormat,
            panel: &[u8],
            nb: usize,
            acts: &[ActRow<'_>; R],
        ) -> [[f32; PANEL]; R] {
            let (rec, blk) = (format.record(), format.gguf_block());
            let (d_at, dmin_at) = if format == QFormat::Q6K {
                (208, 0)
            } else {
                (0, 2)
            };
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..nb {
                let r = panel.as_ptr().add(b * rec);
                prefetch(r, rec);
                let mut dw = [0u16; PANEL];
                let mut dm = [0u16; PANEL];
                let mut coef = [[0i32; PANEL]; 16];
                let mut h = [[_mm256_setzero_si256(); R]; 4];
                for (pair, h) in h.iter_mut().enumerate() {
                    let l0 = 2 * pair;
                    let v0 = lane_k(format, r.add(l0 * blk), acts, b, &mut coef, l0);
                    let v1 = lane_k(format, r.add((l0 + 1) * blk), acts, b, &mut coef, l0 + 1);
                    for i in 0..R {
                        h[i] = _mm256_hadd_epi32(v0[i], v1[i]);
                    }
                    for lane in [l0, l0 + 1] {
                        let p = r.add(lane * blk);
                        dw[lane] = (p.add(d_at) as *const u16).read_unaligned();
                        dm[lane] = (p.add(dmin_at) as *const u16).read_unaligned();
                    }
                }
                let dwv = _mm256_cvtph_ps(_mm_loadu_si128(dw.as_ptr() as *const __m128i));
                let dmv = _mm256_cvtph_ps(_mm_loadu_si128(dm.as_ptr() as *const __m128i));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let sum = hsum8(h[0][i], h[1][i], h[2][i], h[3][i]);
                    let ex = k_extra(format, &coef, acts[i].bsums.get_unchecked(b * QK_K / 16..));
                    let dx = _mm256_set1_ps(at(acts[i].d, b));
                    let v = if format == QFormat::Q6K {
                        let sumi = _mm256_sub_epi32(sum, ex);
                        _mm256_mul_ps(_mm256_mul_ps(dx, dwv), _mm256_cvtepi32_ps(sumi))
                    } else {
                        _mm256_sub_ps(
                            _mm256_mul_ps(_mm256_mul_ps(dx, dwv), _mm256_cvtepi32_ps(sum)),
                            _mm256_mul_ps(_mm256_mul_ps(dx, dmv), _mm256_cvtepi32_ps(ex)),
                        )
                    };
                    *acc = _mm256_add_ps(*acc, v);
                }
            }
            acc.map(|acc| {
                let mut out = [0f32; PANEL];
                _mm256_storeu_ps(out.as_mut_ptr(), acc);
                out
            })
        }
    };
}

k_panel!("avx2,fma,f16c", panel_k);
k_panel!("avx2,fma,f16c,avx512f,avx512vl,avx512bw", panel_k_512);

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
