//! AVX2 (+FMA, F16C) versions of the kernels in `scalar.rs`, producing the same bits.
//!
//! Quantized panels: for each block, the eight rows' exact integer dot products, lane `r` of an
//! i32 vector holding row `r`'s (the records keep quants by 4-byte words across the rows, see
//! `layout.rs`, so a broadcast group of four activations meets four quants of every row in
//! one `maddubs`/`madd` or, with AVX-512 VNNI, `dpbusd`), then the same per-block float
//! expression as the scalar kernel, one lane per output row — no float value is ever
//! reassociated. Each kernel is built for AVX2, for AVX-512 (more registers, same
//! instructions) and for AVX-512 VNNI; all give the same bits. Float dot products use four 8-lane FMA accumulators in the
//! lane order and reduction tree that `scalar::dot_f32` spells out. Callers get the portable
//! kernel instead when the CPU lacks AVX2, FMA or F16C (same bits, slower).

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use super::layout::{
    k_rec, ActRow, QFormat, BS16, KVALUES_MXFP4, MXFP4_QS, PANEL, Q4_0_QS, Q4_1_MS, Q4_1_QS,
    Q5_0_QH, Q5_0_QS, Q5_1_QH, Q5_1_QS, Q8_0_QS, QK, QK_K,
};
use super::scalar;
use super::FloatRows;

/// Whether this CPU runs the kernels of this file.
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// The widest kernel level the dispatch may pick: 0 AVX2, 1 AVX-512 registers, 2 AVX-512
/// VNNI, 3 AVX-512 VNNI on 512-bit registers, two panels at once (the k-quants,
/// [`panel_dot_pair`]). Every level gives the same bits; tests lower it to run each on one
/// machine.
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
            super::layout::ActKind::Q8K => {
                assert!(a.bsums.len() >= nb * QK_K / 16 && a.bs16.len() >= nb * BS16)
            }
        }
    }
    if !available() {
        return acts.map(|a| scalar::panel_dot(format, panel, nb, a));
    }
    // SAFETY: the features are present (checked above) and the asserts bound every read.
    unsafe { quant_panel(format, panel, nb, acts) }
}

/// Bytes ahead of the current weight record that the kernels prefetch (panels are contiguous,
/// so this runs into the next panels; prefetching never faults, even past the end), into L2
/// only: at one row (decoding) a record is used once, so the stream is bounded by how many
/// lines are in flight, and a near prefetch into L1 kept too few of them in flight (a
/// Qwen2.5-1.5B shape in Q4_K_M decoded 26 vs 36 tok/s with 2 KiB into L1 vs 16 KiB into L2 on
/// an AVX-512 EPYC; 8–32 KiB into L2 were within noise of each other). On a host without
/// AVX-512 (an AVX2 EPYC) 4 KiB decoded faster than 16 KiB in every one of eight interleaved
/// pairs, 8–23% (docs/speed-history.md, 2026-11-28): [`prefetch_ahead`] picks by host.
const PREFETCH: usize = 16384;
/// [`PREFETCH`] on hosts without AVX-512.
const PREFETCH_AVX2: usize = 4096;

/// The prefetch distance of this host, once decided (0 until then).
static AHEAD: AtomicUsize = AtomicUsize::new(0);

/// [`PREFETCH`], or [`PREFETCH_AVX2`] on a host without AVX-512 registers.
#[inline]
fn prefetch_ahead() -> usize {
    match AHEAD.load(Ordering::Relaxed) {
        0 => {
            let avx512 = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw");
            let d = if avx512 { PREFETCH } else { PREFETCH_AVX2 };
            AHEAD.store(d, Ordering::Relaxed);
            d
        }
        d => d,
    }
}

/// Prefetches the `len` bytes [`prefetch_ahead`] bytes after `r` into L2.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn prefetch(r: *const u8, len: usize) {
    unsafe {
        prefetch_l2(r.wrapping_add(prefetch_ahead()), len);
    }
}

/// Part `s` of eight of what [`prefetch`] would issue for the `len` bytes at `r`: lines
/// `s · L / 8 .. (s + 1) · L / 8` of its `L = ⌈len / 64⌉`. The one-row k-quant kernel spreads
/// a record's prefetches over its eight sub-blocks this way: issued as one burst at the record's
/// start (18 lines for Q4_K, 27 for Q6_K), they streamed a matrix from DRAM slower. On a 2-core
/// AVX2 EPYC, one process alternating the two on the same 32,768 × 2,560 matrices at one row,
/// two threads, 5 rounds (medians): Q4_K 11.9 → 15.0 GB/s, Q6_K 6.1 → 9.7 (without software
/// prefetch: 12.3 and 4.2). With more rows a record is reused from the caches and the burst
/// stays. Kept out of line: inlined, the compiler moved the parts back together and
/// Qwen3.5-35B-A3B-4l decoded 16.5 against 20.5 tok/s (6 pairs; docs/speed-history.md).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline(never)]
unsafe fn prefetch_part(r: *const u8, len: usize, s: usize) {
    unsafe {
        let lines = len.div_ceil(64);
        let (from, to) = (s * lines / 8, (s + 1) * lines / 8);
        prefetch_l2(
            r.wrapping_add(prefetch_ahead() + 64 * from),
            64 * (to - from),
        );
    }
}

/// Prefetches the `len` bytes at `r` into L2 (never faults, even past the end).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn prefetch_l2(r: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T1>(r.wrapping_add(off) as *const i8);
        off += 64;
    }
}

/// `s[i]` without a bounds check: the kernels' callers assert the lengths of every
/// activation slice against the block count up front (`panel_dot`).
#[inline(always)]
unsafe fn at<T: Copy>(s: &[T], i: usize) -> T {
    unsafe {
        debug_assert!(i < s.len());
        *s.get_unchecked(i)
    }
}

/// The float dot products of `R` activation rows (`k` values each) against weight rows `cols`
/// of `w`: `out[r][c] = dot(x[r], w[cols[c]])`, each pair bit-identical to `scalar::dot_f32`
/// (or `dot_f16`, `dot_bf16`): every pair keeps its own four accumulators, in the same lane
/// order and reduction. Each 8-value load of a weight row serves `R` rows and each activation
/// load `C` columns, where a lone dot product makes two loads per multiply-add.
pub(crate) fn float_block<const R: usize, const C: usize>(
    w: FloatRows<'_>,
    k: usize,
    x: [&[f32]; R],
    cols: [usize; C],
) -> [[f32; C]; R] {
    for xr in x {
        assert_eq!(
            xr.len(),
            k,
            "float_block: an activation row is not {k} long"
        );
    }
    let rows = match w {
        FloatRows::F32(w) => w.len(),
        FloatRows::F16(w) | FloatRows::BF16(w) => w.len(),
    };
    for c in cols {
        assert!(
            (c + 1) * k <= rows,
            "float_block: weight row {c} out of range"
        );
    }
    if !available() {
        return x.map(|xr| cols.map(|c| w.scalar_dot(xr, c, k)));
    }
    let wide = wide();
    // SAFETY: the features are present (checked above: AVX-512 by `wide`) and the asserts bound
    // every read.
    unsafe {
        match (w, wide) {
            (FloatRows::F32(w), false) => block_f32_avx2(w, k, x, cols),
            (FloatRows::F32(w), true) => block_f32_wide(w, k, x, cols),
            (FloatRows::F16(w), false) => block_f16_avx2(w, k, x, cols),
            (FloatRows::F16(w), true) => block_f16_wide(w, k, x, cols),
            (FloatRows::BF16(w), false) => block_bf16_avx2(w, k, x, cols),
            (FloatRows::BF16(w), true) => block_bf16_wide(w, k, x, cols),
        }
    }
}

/// Generates a [`float_block`] kernel for weights of element type `$t`, read 8 at a time with
/// `$load(ptr)` and one at a time with `$get(value)`, in `scalar::dot_f32`'s order, built for
/// the features `$features` (AVX-512's only gain here: 32 registers, so more accumulators stay
/// in them).
macro_rules! float_block_kernel {
    ($name:ident, $features:literal, $t:ty, $load:expr, $get:expr) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const C: usize>(
            w: &[$t],
            k: usize,
            x: [&[f32]; R],
            cols: [usize; C],
        ) -> [[f32; C]; R] {
            unsafe {
                let full = k / scalar::F_LANES * scalar::F_LANES;
                let wp: [*const $t; C] = cols.map(|c| w.as_ptr().add(c * k));
                let xp: [*const f32; R] = x.map(|r| r.as_ptr());
                let mut acc = [[[_mm256_setzero_ps(); 4]; C]; R];
                let mut c = 0;
                while c < full {
                    for q in 0..4 {
                        let t = c + 8 * q;
                        let wv: [__m256; C] = std::array::from_fn(|j| $load(wp[j].add(t)));
                        for r in 0..R {
                            let xv = _mm256_loadu_ps(xp[r].add(t));
                            for j in 0..C {
                                acc[r][j][q] = _mm256_fmadd_ps(xv, wv[j], acc[r][j][q]);
                            }
                        }
                    }
                    c += scalar::F_LANES;
                }
                let mut out = [[0f32; C]; R];
                for r in 0..R {
                    for j in 0..C {
                        let mut sum = reduce(acc[r][j]);
                        for t in full..k {
                            sum = (*xp[r].add(t)).mul_add($get(*wp[j].add(t)), sum);
                        }
                        out[r][j] = sum;
                    }
                }
                out
            }
        }
    };
}

/// [`float_block_kernel`] for AVX2 and for AVX-512's registers, for one element type.
macro_rules! float_block_kernels {
    ($avx2:ident, $wide:ident, $t:ty, $load:expr, $get:expr) => {
        float_block_kernel!($avx2, "avx2,fma,f16c", $t, $load, $get);
        float_block_kernel!($wide, "avx2,fma,f16c,avx512f,avx512vl", $t, $load, $get);
    };
}

float_block_kernels!(
    block_f32_avx2,
    block_f32_wide,
    f32,
    |p: *const f32| _mm256_loadu_ps(p),
    |v: f32| v
);
float_block_kernels!(
    block_f16_avx2,
    block_f16_wide,
    u16,
    |p: *const u16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
    |v: u16| half::f16::from_bits(v).to_f32()
);
float_block_kernels!(
    block_bf16_avx2,
    block_bf16_wide,
    u16,
    |p: *const u16| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
        _mm_loadu_si128(p as *const __m128i)
    ))),
    scalar::bf16_to_f32
);

/// The output rows of a panel kernel's accumulators.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn lanes<const R: usize>(acc: [__m256; R]) -> [[f32; PANEL]; R] {
    unsafe {
        acc.map(|acc| {
            let mut out = [0f32; PANEL];
            _mm256_storeu_ps(out.as_mut_ptr(), acc);
            out
        })
    }
}

/// Instantiates a panel-kernel generator for AVX2, AVX-512 (registers only) and AVX-512 VNNI.
macro_rules! three_builds {
    ($generator:ident, $avx2:ident, $wide:ident, $vnni:ident) => {
        $generator!("avx2,fma,f16c", $avx2, false);
        $generator!("avx2,fma,f16c,avx512f,avx512vl,avx512bw", $wide, false);
        $generator!(
            "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
            $vnni,
            true
        );
    };
}

/// Tags for the 32-element formats in the kernels' const parameter.
const L_Q8_0: u8 = 0;
const L_Q4_0: u8 = 1;
const L_Q4_1: u8 = 2;
const L_Q5_0: u8 = 3;
const L_Q5_1: u8 = 4;
const L_MXFP4: u8 = 5;

/// Shifts each 16-bit lane of `v` left by `by` (right by `-by`); a runtime count.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn shift16(v: __m256i, by: i32) -> __m256i {
    if by >= 0 {
        _mm256_sll_epi16(v, _mm_cvtsi32_si128(by))
    } else {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128(-by))
    }
}

/// The eight rows' MXFP4 block scales `e8m0_half(e)` (`layout::e8m0_half`) from the eight
/// exponent bytes at `r`: `2^(e - 128)`, built from its bits.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn e8m0_half_x8(r: *const u8) -> __m256 {
    unsafe {
        let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(r as *const __m128i));
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
        let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small))
    }
}

/// What the kernels add to MXFP4's values (`-12..=12`) to make them unsigned `maddubs` and
/// `dpbusd` operands, taken back as `12 · Σ q_x` (as Q4_0's 8).
const MXFP4_OFFSET: i32 = 12;

/// [`KVALUES_MXFP4`] plus [`MXFP4_OFFSET`]: `0..=24`.
const MXFP4_PLUS_OFFSET: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_MXFP4[i] as i32 + MXFP4_OFFSET) as u8;
        i += 1;
    }
    t
};

/// The eight groups of four quants of a 32-element record at `r` (see the layout module
/// doc): group `g`'s 32 bytes, lane `l`'s four at bytes `4l..4l + 4`, as stored (Q8_0: i8;
/// MXFP4: its codes' values plus [`MXFP4_OFFSET`], unsigned, looked up 16 at a time with
/// `pshufb`; the others unsigned, without Q4_0's / Q5_0's offset).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn groups<const F: u8>(r: *const u8) -> [__m256i; 8] {
    unsafe {
        if F == L_Q8_0 {
            return std::array::from_fn(|g| {
                _mm256_loadu_si256(r.add(Q8_0_QS + 32 * g) as *const __m256i)
            });
        }
        if F == L_MXFP4 {
            // Word c of a row's codes holds elements 4c..4c + 4 (low) and 16 + 4c.. (high).
            let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                MXFP4_PLUS_OFFSET.as_ptr() as *const __m128i
            ));
            let low = _mm256_set1_epi8(0x0F);
            let mut out = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let t = _mm256_loadu_si256(r.add(MXFP4_QS + 32 * c) as *const __m256i);
                out[c] = _mm256_shuffle_epi8(table, _mm256_and_si256(t, low));
                let high = _mm256_and_si256(_mm256_srli_epi16::<4>(t), low);
                out[c + 4] = _mm256_shuffle_epi8(table, high);
            }
            return out;
        }
        let (qs, qh) = match F {
            L_Q4_0 => (Q4_0_QS, None),
            L_Q4_1 => (Q4_1_QS, None),
            L_Q5_0 => (Q5_0_QS, Some(Q5_0_QH)),
            _ => (Q5_1_QS, Some(Q5_1_QH)),
        };
        // Word c of a row's nibbles holds elements 4c..4c + 4 (low) and 16 + 4c.. (high).
        let low = _mm256_set1_epi8(0x0F);
        let mut out = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let t = _mm256_loadu_si256(r.add(qs + 32 * c) as *const __m256i);
            out[c] = _mm256_and_si256(t, low);
            out[c + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(t), low);
        }
        if let Some(qh) = qh {
            // Byte p of a row's spread high bits holds element 4g + p's in bit g.
            let t = _mm256_loadu_si256(r.add(qh) as *const __m256i);
            let m = _mm256_set1_epi8(0x10);
            for (g, v) in out.iter_mut().enumerate() {
                *v = _mm256_or_si256(*v, _mm256_and_si256(shift16(t, 4 - g as i32), m));
            }
        }
        out
    }
}

/// Generates the Q8_0, Q4_0, Q5_0, MXFP4 (× Q8_0) and Q4_1, Q5_1 (× Q8_1) panel kernel for
/// `$features`. Per block, each activation row's group `g` (4 quants) is broadcast and
/// multiplied with the weights' group `g` of all eight lanes, so the i32 lanes accumulate
/// the eight rows' exact block sums directly; then the scalar kernel's float expression,
/// lane-wise. MXFP4's values come with [`MXFP4_OFFSET`] added, unsigned. `$vnni`: `dpbusd`
/// (unsigned × signed, i32 accumulate), with Q8_0's signed weights made unsigned by flipping
/// their sign bit (`+128`, taken back as `128 · Σ q_x`); else `maddubs`, Q8_0's sign moved onto
/// the activations, the i16 products of a run of groups added in i16, then one `madd` per run.
/// Nothing saturates: a `maddubs` lane is at most 2 · 15 · 128 = 3,840 (Q4_0, Q4_1; runs of
/// 8), 2 · 24 · 128 = 6,144 (MXFP4; 4), 2 · 31 · 128 = 7,936 (Q5_0, Q5_1; 4) or
/// 2 · 128 · 127 = 32,512 (Q8_0; runs of 1), so every run stays below 32,768 and all give the
/// exact sums.
macro_rules! legacy_panel {
    ($features:literal, $name:ident, $vnni:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const F: u8>(
            panel: &[u8],
            nb: usize,
            acts: &[ActRow<'_>; R],
        ) -> [[f32; PANEL]; R] {
            unsafe {
                let (format, offset) = match F {
                    L_Q8_0 => (QFormat::Q8_0, if $vnni { 128 } else { 0 }),
                    L_Q4_0 => (QFormat::Q4_0, 8),
                    L_Q4_1 => (QFormat::Q4_1, 0),
                    L_Q5_0 => (QFormat::Q5_0, 16),
                    L_MXFP4 => (QFormat::Mxfp4, MXFP4_OFFSET),
                    _ => (QFormat::Q5_1, 0),
                };
                // Signed weights (Q8_0's) take the sign trick below.
                let signed = F == L_Q8_0;
                let with_min = F == L_Q4_1 || F == L_Q5_1;
                let rec = format.record();
                let ones = _mm256_set1_epi16(1);
                // Groups whose `maddubs` products are added in i16 before one `madd` (see
                // above): |w| <= 15 (Q4_0, Q4_1), 24 (MXFP4) or 31 (Q5_0, Q5_1); Q8_0 alone.
                let run = match F {
                    L_Q8_0 => 1,
                    L_Q5_0 | L_Q5_1 | L_MXFP4 => 4,
                    _ => 8,
                };
                let mut acc = [_mm256_setzero_ps(); R];
                for b in 0..nb {
                    let r = panel.as_ptr().add(b * rec);
                    prefetch(r, rec);
                    let w = groups::<F>(r);
                    // The unsigned left operands.
                    let wu: [__m256i; 8] = if !signed {
                        w
                    } else if $vnni {
                        w.map(|v| _mm256_xor_si256(v, _mm256_set1_epi8(-128)))
                    } else {
                        w.map(|v| _mm256_sign_epi8(v, v))
                    };
                    let dw = if F == L_MXFP4 {
                        e8m0_half_x8(r)
                    } else {
                        _mm256_cvtph_ps(_mm_loadu_si128(r as *const __m128i))
                    };
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let a = acts[i].qs.as_ptr().add(b * QK) as *const i32;
                        let mut sum = _mm256_setzero_si256();
                        if $vnni {
                            for g in 0..8 {
                                let ag = _mm256_set1_epi32(a.add(g).read_unaligned());
                                sum = _mm256_dpbusd_epi32(sum, wu[g], ag);
                            }
                        } else {
                            for g0 in (0..8).step_by(run) {
                                let mut p = _mm256_setzero_si256();
                                for g in g0..g0 + run {
                                    let ag = _mm256_set1_epi32(a.add(g).read_unaligned());
                                    let ag = if signed {
                                        _mm256_sign_epi8(ag, w[g])
                                    } else {
                                        ag
                                    };
                                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(wu[g], ag));
                                }
                                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, ones));
                            }
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
                            let mw =
                                _mm256_cvtph_ps(_mm_loadu_si128(r.add(Q4_1_MS) as *const __m128i));
                            _mm256_add_ps(
                                scaled,
                                _mm256_mul_ps(mw, _mm256_set1_ps(at(acts[i].s, b))),
                            )
                        } else {
                            scaled
                        };
                        *acc = _mm256_add_ps(*acc, v);
                    }
                }
                lanes(acc)
            }
        }
    };
}

three_builds!(
    legacy_panel,
    panel_legacy,
    panel_legacy_512,
    panel_legacy_vnni
);

/// Each lane's integer correction for one activation row's block sums (16 sums of 16 quants,
/// `bs`): Q4_K/Q5_K `Σ_j m_j · (bs[2j] + bs[2j+1])`, Q6_K `32 · Σ_g sc_g · bs[g]`, with the
/// coefficients in pairs, two products per `madd` (lane `l` of pair `t` holds coefficient `2t`
/// of lane `l` in its low i16 and `2t + 1` in its high; Q6_K: 8 pairs of the 16 scales, from
/// [`q6_coef_pairs`]; Q4_K/Q5_K: 4 pairs of the 8 mins, from [`k_min_pairs`]). The sums come
/// from the row's `bs16`: already i16 and in order (Q6_K the 16 sums; Q4_K/Q5_K, past them, the
/// pair sums `bs[2j] + bs[2j + 1]`), each dword broadcast straight from memory. Every
/// coefficient fits 7 signed bits and every (pair) sum 13, so the i16 operands and the i32 sums
/// are exact, and integer sums are exact in any order. Before `bs16`, the kernel packed and
/// permuted the i32 sums for every panel and row group: on an AVX2 EPYC one thread's Q4_K
/// product at 256 rows ran 40 → 45 GMAC/s with this and Q6_K's 30 → 35; at one row (with
/// [`k_scale_bytes`]) Q4_K from L3 33 → 35.
///
/// # Safety
/// `bs16` holds at least [`BS16`] entries.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_extra16(format: QFormat, pairs: &[__m256i; 8], bs16: &[i16]) -> __m256i {
    unsafe {
        debug_assert!(bs16.len() >= BS16);
        // Dword `t` of the block's i16 sums (Q6_K: `(bs[2t], bs[2t + 1])`; Q4_K / Q5_K, past
        // the 16 sums: `(P[2t], P[2t + 1])` with `P_j = bs[2j] + bs[2j + 1]`), broadcast.
        let dword =
            |t: usize| _mm256_set1_epi32((bs16.as_ptr().add(2 * t) as *const i32).read_unaligned());
        if format == QFormat::Q6K {
            let mut e = _mm256_madd_epi16(pairs[0], dword(0));
            for (t, c) in pairs.iter().enumerate().skip(1) {
                e = _mm256_add_epi32(e, _mm256_madd_epi16(*c, dword(t)));
            }
            _mm256_slli_epi32::<5>(e)
        } else {
            let e = _mm256_madd_epi16(pairs[0], dword(8));
            let e = _mm256_add_epi32(e, _mm256_madd_epi16(pairs[1], dword(9)));
            let e = _mm256_add_epi32(e, _mm256_madd_epi16(pairs[2], dword(10)));
            _mm256_add_epi32(e, _mm256_madd_epi16(pairs[3], dword(11)))
        }
    }
}

/// Tags for the k-quant formats in the kernels' const parameter.
const K_Q4: u8 = 0;
const K_Q5: u8 = 1;
const K_Q6: u8 = 2;

/// The eight groups of four quants of 32-element sub-block `s` of a k-quant record at `r`
/// (see the layout module doc), unsigned: group `g`'s 32 bytes, lane `l`'s four at bytes
/// `4l..4l + 4`. A row's nibble words `8c..8c + 8` hold sub-block `2c` (low nibbles) and
/// `2c + 1` (high) for Q4_K / Q5_K; for Q6_K, words `8(2n + t % 2)..` hold sub-block
/// `4n + t` in their low (`t < 2`) or high nibbles. Q5_K's high-bit word `g` holds group
/// `g` of every sub-block `s` in bit `s`; Q6_K's word `8n + g` holds group `g` of sub-block
/// `4n + t` in bits `2t..2t + 2`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_groups<const F: u8>(r: *const u8, s: usize) -> [__m256i; 8] {
    unsafe {
        let load = |at: usize| _mm256_loadu_si256(r.add(at) as *const __m256i);
        let (qs, chunk, high) = match F {
            K_Q4 => (k_rec::Q4_QS, s / 2, s % 2 == 1),
            K_Q5 => (k_rec::Q5_QS, s / 2, s % 2 == 1),
            _ => (k_rec::Q6_QL, 2 * (s / 4) + s % 2, s % 4 >= 2),
        };
        let low = _mm256_set1_epi8(0x0F);
        let mut w: [__m256i; 8] = std::array::from_fn(|g| {
            let t = load(qs + 32 * (8 * chunk + g));
            if high {
                _mm256_and_si256(_mm256_srli_epi16::<4>(t), low)
            } else {
                _mm256_and_si256(t, low)
            }
        });
        match F {
            K_Q5 => {
                let m = _mm256_set1_epi8(0x10);
                for (g, w) in w.iter_mut().enumerate() {
                    let t = load(k_rec::Q5_QH + 32 * g);
                    *w = _mm256_or_si256(*w, _mm256_and_si256(shift16(t, 4 - s as i32), m));
                }
            }
            K_Q6 => {
                let (n, t) = (s / 4, (s % 4) as i32);
                let m = _mm256_set1_epi8(0x30);
                for (g, w) in w.iter_mut().enumerate() {
                    let h = load(k_rec::Q6_QH + 32 * (8 * n + g));
                    *w = _mm256_or_si256(*w, _mm256_and_si256(shift16(h, 4 - 2 * t), m));
                }
            }
            _ => {}
        }
        w
    }
}

/// Runs `$body` for each sub-block `$s` in 0..8: when `$unrolled`, written out eight times so
/// that every use of `$s` (record offsets, nibble halves, Q6_K's shift counts) is a constant
/// in its copy, else as a loop. The k-quant kernels unroll at one activation row (decoding,
/// an expert's lone row): on an AVX2 EPYC one thread's Q6_K row ran 12–13 → 17–20 GB/s from
/// L3 and Qwen3.5-4B-8l decoded 9–10 → 11–12 tok/s; with more rows the copies' registers
/// spilled and prefill lost a quarter.
macro_rules! each_sub_block {
    ($unrolled:expr, $s:ident => $body:block) => {
        if $unrolled {
            { let $s: usize = 0; $body }
            { let $s: usize = 1; $body }
            { let $s: usize = 2; $body }
            { let $s: usize = 3; $body }
            { let $s: usize = 4; $body }
            { let $s: usize = 5; $body }
            { let $s: usize = 6; $body }
            { let $s: usize = 7; $body }
        } else {
            for $s in 0..8 $body
        }
    };
}

/// The k-quant format of a kernel tag.
const fn k_format(f: u8) -> QFormat {
    match f {
        K_Q4 => QFormat::Q4K,
        K_Q5 => QFormat::Q5K,
        _ => QFormat::Q6K,
    }
}

/// Generates the Q4_K, Q5_K, Q6_K (× Q8_K) panel kernel for `$features`: per block, each
/// activation row's groups of four are broadcast against the eight lanes' groups (as in
/// `legacy_panel!`), each sub-block's i32 lane sums are multiplied by the lanes' sub-block
/// scales and added, so the i32 lanes end as the rows' exact scaled block sums; then
/// `scalar::block_update`'s float expression lane-wise. `$vnni`: `dpbusd` per group and
/// `mullo` per sub-block; else `maddubs` per group, the i16 products of a run of groups with
/// one scale added in i16 (Q4_K: all 8, Q5_K: 4, Q6_K: 2), then one `madd` with the scale in
/// both i16 halves. Nothing saturates: a `maddubs` lane is at most 2 · 15 · 128 = 3,840 (Q4_K),
/// 2 · 31 · 128 = 7,936 (Q5_K) or 2 · 63 · 128 = 16,128 (Q6_K), so a run's i16 sum stays
/// within 32,256 (`extreme_quants_do_not_saturate_the_i16_sums`); the integer sums, exact,
/// are those of one `madd` per group.
macro_rules! k_panel {
    ($features:literal, $name:ident, $vnni:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const F: u8>(
            panel: &[u8],
            nb: usize,
            acts: &[ActRow<'_>; R],
        ) -> [[f32; PANEL]; R] {
            unsafe {
                let format = k_format(F);
                let rec = format.record();
                let q6 = F == K_Q6;
                let mut acc = [_mm256_setzero_ps(); R];
                for b in 0..nb {
                    let r = panel.as_ptr().add(b * rec);
                    if R > 1 {
                        prefetch(r, rec);
                    }
                    // Q6_K's scales are read straight from the record's bytes; Q4_K's and
                    // Q5_K's bit fields are decoded once per block.
                    let mut kb = [0u8; 128];
                    if !q6 {
                        k_scale_bytes(r, &mut kb);
                    }
                    let pairs = if q6 {
                        q6_coef_pairs(r)
                    } else {
                        k_min_pairs(&kb)
                    };
                    let scv = |j: usize| {
                        if q6 {
                            _mm256_cvtepi8_epi32(q6_scale_bytes(r, j))
                        } else {
                            k_scale32(&kb, j)
                        }
                    };
                    // `madd` operand: lane l's scale in both of its i16 halves.
                    let sc16 = |j: usize| {
                        if q6 {
                            let twice =
                                _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
                            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(q6_scale_bytes(r, j), twice))
                        } else {
                            k_scale16(&kb, j)
                        }
                    };
                    let mut sums = [_mm256_setzero_si256(); R];
                    each_sub_block!(R == 1, s => {
                        if R == 1 {
                            prefetch_part(r, rec, s);
                        }
                        let w = k_groups::<F>(r, s);
                        // Scales of groups 0..4 and 4..8 of this sub-block.
                        let (j0, j1) = if q6 { (2 * s, 2 * s + 1) } else { (s, s) };
                        if $vnni {
                            let (s0, s1) = (scv(j0), scv(j1));
                            for (i, sum) in sums.iter_mut().enumerate() {
                                let a = acts[i].qs.as_ptr().add(b * QK_K + 32 * s) as *const i32;
                                let z = _mm256_setzero_si256();
                                let (mut t0, mut t1) = (z, z);
                                for g in 0..4 {
                                    let ag = _mm256_set1_epi32(a.add(g).read_unaligned());
                                    t0 = _mm256_dpbusd_epi32(t0, w[g], ag);
                                    let ag = _mm256_set1_epi32(a.add(g + 4).read_unaligned());
                                    t1 = _mm256_dpbusd_epi32(t1, w[g + 4], ag);
                                }
                                let t = if q6 {
                                    _mm256_add_epi32(
                                        _mm256_mullo_epi32(t0, s0),
                                        _mm256_mullo_epi32(t1, s1),
                                    )
                                } else {
                                    _mm256_mullo_epi32(_mm256_add_epi32(t0, t1), s0)
                                };
                                *sum = _mm256_add_epi32(*sum, t);
                            }
                        } else {
                            let (s0, s1) = (sc16(j0), sc16(j1));
                            for (i, sum) in sums.iter_mut().enumerate() {
                                let a = acts[i].qs.as_ptr().add(b * QK_K + 32 * s) as *const i32;
                                // The i16 products of groups `g0..g0 + len`, added in i16.
                                let run = |g0: usize, len: usize| {
                                    let prod = |g: usize| {
                                        let ag = _mm256_set1_epi32(a.add(g).read_unaligned());
                                        _mm256_maddubs_epi16(w[g], ag)
                                    };
                                    let mut p = prod(g0);
                                    for g in g0 + 1..g0 + len {
                                        p = _mm256_add_epi16(p, prod(g));
                                    }
                                    p
                                };
                                let (m0, m1) =
                                    (|v| _mm256_madd_epi16(v, s0), |v| _mm256_madd_epi16(v, s1));
                                let t = match F {
                                    K_Q4 => m0(run(0, 8)),
                                    K_Q5 => _mm256_add_epi32(m0(run(0, 4)), m0(run(4, 4))),
                                    _ => _mm256_add_epi32(
                                        _mm256_add_epi32(m0(run(0, 2)), m0(run(2, 2))),
                                        _mm256_add_epi32(m1(run(4, 2)), m1(run(6, 2))),
                                    ),
                                };
                                *sum = _mm256_add_epi32(*sum, t);
                            }
                        }
                    });
                    let half8 =
                        |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(r.add(at) as *const __m128i));
                    let dwv = half8(if q6 { k_rec::Q6_D } else { k_rec::D });
                    let dmv = half8(k_rec::DMIN);
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let sum = sums[i];
                        let ex = k_extra16(format, &pairs, acts[i].bs16.get_unchecked(b * BS16..));
                        let dx = _mm256_set1_ps(at(acts[i].d, b));
                        let v = if q6 {
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
                lanes(acc)
            }
        }
    };
}

three_builds!(k_panel, panel_k, panel_k_512, panel_k_vnni);

/// A Q4_K / Q5_K record's sub-block scales and mins, decoded from its byte-spread
/// `scale_min_k4` bit fields (see `layout.rs`) 32 bytes at a time into `out`: scale `j` of
/// lane `l` at byte `8j + l`, min `j` at `64 + 8j + l` (six bits each). The record's bytes
/// 0..4, 4..8 and 8..12 of the eight lanes are three 32-byte loads; scales and mins 0..4 are
/// the low six bits of the first two, 4..8 a nibble of the third with the first two's top
/// bits above it.
///
/// # Safety
/// `r` points at a whole Q4_K or Q5_K record.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_scale_bytes(r: *const u8, out: &mut [u8; 128]) {
    unsafe {
        let load = |i: usize| _mm256_loadu_si256(r.add(k_rec::SCALES + 32 * i) as *const __m256i);
        let (a, b, c) = (load(0), load(1), load(2));
        let (m63, m15) = (_mm256_set1_epi8(63), _mm256_set1_epi8(15));
        // Bits 6 and 7 of each byte as bits 4 and 5 (what the 16-bit shift brings in from the
        // next byte is masked off).
        let top = |v: __m256i| _mm256_and_si256(_mm256_srli_epi16::<2>(v), _mm256_set1_epi8(0x30));
        let parts = [
            _mm256_and_si256(a, m63),
            _mm256_or_si256(_mm256_and_si256(c, m15), top(a)),
            _mm256_and_si256(b, m63),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(c), m15), top(b)),
        ];
        for (i, v) in parts.into_iter().enumerate() {
            _mm256_storeu_si256(out.as_mut_ptr().add(32 * i) as *mut __m256i, v);
        }
    }
}

/// The `madd` operand of sub-block `j`'s scales from [`k_scale_bytes`]: lane `l`'s scale in
/// both i16 halves of dword `l` (the eight bytes broadcast, then spread and zero-extended).
///
/// # Safety
/// `j < 8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_scale16(kb: &[u8; 128], j: usize) -> __m256i {
    unsafe {
        let v = _mm256_set1_epi64x((kb.as_ptr().add(8 * j) as *const i64).read_unaligned());
        #[rustfmt::skip]
        let twice = _mm256_setr_epi8(
            0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
            4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1,
        );
        _mm256_shuffle_epi8(v, twice)
    }
}

/// Sub-block `j`'s scales from [`k_scale_bytes`] as eight i32 lanes.
///
/// # Safety
/// `j < 8`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_scale32(kb: &[u8; 128], j: usize) -> __m256i {
    unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(kb.as_ptr().add(8 * j) as *const __m128i)) }
}

/// [`k_extra16`]'s pairs of a Q4_K / Q5_K record, from [`k_scale_bytes`]: pair `t` holds lane `l`'s
/// mins `2t` and `2t + 1` as the i16 halves of dword `l` (their sixteen bytes broadcast to
/// both 128-bit halves, then interleaved and zero-extended); pairs 4..8 are zero.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn k_min_pairs(kb: &[u8; 128]) -> [__m256i; 8] {
    unsafe {
        #[rustfmt::skip]
        let zip = _mm256_setr_epi8(
            0, -1, 8, -1, 1, -1, 9, -1, 2, -1, 10, -1, 3, -1, 11, -1,
            4, -1, 12, -1, 5, -1, 13, -1, 6, -1, 14, -1, 7, -1, 15, -1,
        );
        std::array::from_fn(|t| {
            if t < 4 {
                let b = _mm_loadu_si128(kb.as_ptr().add(64 + 16 * t) as *const __m128i);
                _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(b), zip)
            } else {
                _mm256_setzero_si256()
            }
        })
    }
}

/// The eight lanes' i8 scales of 16-element sub-block `j` of the Q6_K record at `r`, in the
/// low eight bytes.
///
/// # Safety
/// `r` points at a whole Q6_K record and `j < 16`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q6_scale_bytes(r: *const u8, j: usize) -> __m128i {
    unsafe { _mm_loadl_epi64(r.add(k_rec::Q6_SCALES + PANEL * j) as *const __m128i) }
}

/// [`k_extra16`]'s pairs of a Q6_K record, from its scale bytes: the sixteen bytes of sub-blocks
/// `2t` and `2t + 1` interleaved lane by lane, then widened to i16.
///
/// # Safety
/// `r` points at a whole Q6_K record.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q6_coef_pairs(r: *const u8) -> [__m256i; 8] {
    unsafe {
        let zip = _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
        std::array::from_fn(|t| {
            let b = _mm_loadu_si128(r.add(k_rec::Q6_SCALES + 2 * PANEL * t) as *const __m128i);
            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(b, zip))
        })
    }
}

/// Whether [`panel_dot_pair`] runs for `format` on this CPU: the k-quants with AVX-512 VNNI
/// on 512-bit registers (kernel level 3; the same bits as one panel at a time).
pub(crate) fn pairs(format: QFormat) -> bool {
    LEVEL_CAP.load(Ordering::Relaxed) >= 3
        && matches!(format, QFormat::Q4K | QFormat::Q5K | QFormat::Q6K)
        && vnni()
}

/// Two panels (`a`, `b`, each `nb` records of `format`) against `R` quantized activation rows
/// at once, one 16-lane register holding both panels' eight rows: each broadcast group of four
/// activations meets sixteen output rows in one `dpbusd`, so there are half the instructions
/// per multiply-add of [`panel_dot`]. Every lane runs the same integer sums (exact in any
/// order) and the same float expression as the one-panel kernel, so the results are
/// bit-identical to `[panel_dot(a), panel_dot(b)]`.
///
/// # Panics
/// If [`pairs`] is false for `format`, or as [`panel_dot`].
pub(crate) fn panel_dot_pair<const R: usize>(
    format: QFormat,
    a: &[u8],
    b: &[u8],
    nb: usize,
    acts: &[ActRow<'_>; R],
) -> [[[f32; PANEL]; R]; 2] {
    assert!(
        pairs(format),
        "panel_dot_pair: no two-panel kernel for {format:?}"
    );
    assert!(a.len() >= nb * format.record() && b.len() >= nb * format.record());
    for act in acts {
        assert!(act.qs.len() >= nb * format.block() && act.d.len() >= nb);
        assert!(act.bsums.len() >= nb * QK_K / 16);
    }
    // SAFETY: `pairs` checked the CPU features; the asserts bound every read.
    let out = unsafe {
        match format {
            QFormat::Q4K => panel_k_pair::<R, K_Q4>(a, b, nb, acts),
            QFormat::Q5K => panel_k_pair::<R, K_Q5>(a, b, nb, acts),
            _ => panel_k_pair::<R, K_Q6>(a, b, nb, acts),
        }
    };
    let half = |h: usize| out.map(|lanes| std::array::from_fn(|l| lanes[PANEL * h + l]));
    [half(0), half(1)]
}

/// 32 bytes at offset `at` of record `a` in the low half, of record `b` in the high half.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn load_pair(a: *const u8, b: *const u8, at: usize) -> __m512i {
    unsafe {
        let lo = _mm256_loadu_si256(a.add(at) as *const __m256i);
        let hi = _mm256_loadu_si256(b.add(at) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// Eight bytes at offset `at` of records `a` and `b`, side by side.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn load8_pair(a: *const u8, b: *const u8, at: usize) -> __m128i {
    unsafe {
        _mm_unpacklo_epi64(
            _mm_loadl_epi64(a.add(at) as *const __m128i),
            _mm_loadl_epi64(b.add(at) as *const __m128i),
        )
    }
}

/// Shifts each 16-bit lane of `v` left by `by` (right by `-by`); a runtime count.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn shift16_zmm(v: __m512i, by: i32) -> __m512i {
    if by >= 0 {
        _mm512_sll_epi16(v, _mm_cvtsi32_si128(by))
    } else {
        _mm512_srl_epi16(v, _mm_cvtsi32_si128(-by))
    }
}

/// [`k_groups`] of records `a` and `b` (lanes 0..8 and 8..16).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn k_groups_pair<const F: u8>(a: *const u8, b: *const u8, s: usize) -> [__m512i; 8] {
    unsafe {
        let load = |at: usize| load_pair(a, b, at);
        let (qs, chunk, high) = match F {
            K_Q4 => (k_rec::Q4_QS, s / 2, s % 2 == 1),
            K_Q5 => (k_rec::Q5_QS, s / 2, s % 2 == 1),
            _ => (k_rec::Q6_QL, 2 * (s / 4) + s % 2, s % 4 >= 2),
        };
        let low = _mm512_set1_epi8(0x0F);
        let mut w: [__m512i; 8] = std::array::from_fn(|g| {
            let t = load(qs + 32 * (8 * chunk + g));
            if high {
                _mm512_and_si512(_mm512_srli_epi16::<4>(t), low)
            } else {
                _mm512_and_si512(t, low)
            }
        });
        match F {
            K_Q5 => {
                let m = _mm512_set1_epi8(0x10);
                for (g, w) in w.iter_mut().enumerate() {
                    let t = load(k_rec::Q5_QH + 32 * g);
                    *w = _mm512_or_si512(*w, _mm512_and_si512(shift16_zmm(t, 4 - s as i32), m));
                }
            }
            K_Q6 => {
                let (n, t) = (s / 4, (s % 4) as i32);
                let m = _mm512_set1_epi8(0x30);
                for (g, w) in w.iter_mut().enumerate() {
                    let h = load(k_rec::Q6_QH + 32 * (8 * n + g));
                    *w = _mm512_or_si512(*w, _mm512_and_si512(shift16_zmm(h, 4 - 2 * t), m));
                }
            }
            _ => {}
        }
        w
    }
}

/// The sub-block scales and [`k_extra16`]'s coefficients of records `a` and `b` (lanes 0..8 and
/// 8..16) as i32 lanes (Q4_K / Q5_K: entries 8..16 zero).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn k_scales_pair(
    q6: bool,
    a: *const u8,
    b: *const u8,
) -> ([[i32; 2 * PANEL]; 16], [[i32; 2 * PANEL]; 16]) {
    unsafe {
        let mut sc = [[0i32; 2 * PANEL]; 16];
        let mut coef = [[0i32; 2 * PANEL]; 16];
        let store = |to: &mut [i32; 2 * PANEL], v: __m512i| {
            _mm512_storeu_si512(to.as_mut_ptr() as *mut __m512i, v);
        };
        if q6 {
            for g in 0..16 {
                let v = _mm512_cvtepi8_epi32(load8_pair(a, b, k_rec::Q6_SCALES + PANEL * g));
                store(&mut sc[g], v);
                store(&mut coef[g], v);
            }
        } else {
            let q = |i: usize| _mm512_cvtepu8_epi32(load8_pair(a, b, k_rec::SCALES + PANEL * i));
            let (m63, m15) = (_mm512_set1_epi32(63), _mm512_set1_epi32(15));
            for j in 0..4 {
                store(&mut sc[j], _mm512_and_si512(q(j), m63));
                store(&mut coef[j], _mm512_and_si512(q(j + 4), m63));
            }
            for j in 4..8 {
                let (lo, s_hi, m_hi) = (q(j + 4), q(j - 4), q(j));
                let hi = |v: __m512i| _mm512_slli_epi32::<4>(_mm512_srli_epi32::<6>(v));
                store(
                    &mut sc[j],
                    _mm512_or_si512(_mm512_and_si512(lo, m15), hi(s_hi)),
                );
                store(
                    &mut coef[j],
                    _mm512_or_si512(_mm512_srli_epi32::<4>(lo), hi(m_hi)),
                );
            }
        }
        (sc, coef)
    }
}

/// [`k_extra16`]'s pairs on sixteen lanes, from `k_scales_pair`'s coefficients.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn k_coef_pairs_zmm(coef: &[[i32; 2 * PANEL]; 16]) -> [__m512i; 8] {
    unsafe {
        let c = |j: usize| _mm512_loadu_si512(coef[j].as_ptr() as *const __m512i);
        std::array::from_fn(|t| {
            let lo = _mm512_and_si512(c(2 * t), _mm512_set1_epi32(0xFFFF));
            _mm512_or_si512(lo, _mm512_slli_epi32::<16>(c(2 * t + 1)))
        })
    }
}

/// [`k_extra16`] on sixteen lanes: the activation row's packed pair sums are the same for every
/// lane, so each is broadcast into one `dpwssd` (`madd` and add in one instruction; exact).
///
/// # Safety
/// `bs` holds at least 16 sums.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
#[inline]
unsafe fn k_extra_zmm(format: QFormat, pairs: &[__m512i; 8], bs: &[i32]) -> __m512i {
    unsafe {
        debug_assert!(bs.len() >= 16);
        let b0 = _mm256_loadu_si256(bs.as_ptr() as *const __m256i);
        let b1 = _mm256_loadu_si256(bs.as_ptr().add(8) as *const __m256i);
        let mut v = [0i32; PANEL];
        let z = _mm512_setzero_si512();
        if format == QFormat::Q6K {
            // i16 bs[0..16] in order: dword t = (bs[2t], bs[2t + 1]).
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(b0, b1));
            _mm256_storeu_si256(v.as_mut_ptr() as *mut __m256i, p);
            let mut e = z;
            for (t, c) in pairs.iter().enumerate() {
                e = _mm512_dpwssd_epi32(e, *c, _mm512_set1_epi32(v[t]));
            }
            _mm512_slli_epi32::<5>(e)
        } else {
            // P_j = bs[2j] + bs[2j + 1] (i32: P0 P1 P4 P5 | P2 P3 P6 P7), reordered to P0..P7,
            // then i16 pairs: dwords 0, 1, 4, 5 hold (P0, P1), (P2, P3), (P4, P5), (P6, P7).
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_hadd_epi32(b0, b1));
            _mm256_storeu_si256(v.as_mut_ptr() as *mut __m256i, _mm256_packs_epi32(p, p));
            let mut e = z;
            for (t, dword) in [(0, 0), (1, 1), (2, 4), (3, 5)] {
                e = _mm512_dpwssd_epi32(e, pairs[t], _mm512_set1_epi32(v[dword]));
            }
            e
        }
    }
}

/// The two-panel form of `k_panel!`'s VNNI build (see [`panel_dot_pair`]): lanes 0..8 are
/// panel `a`'s rows, 8..16 panel `b`'s, each computed exactly as the one-panel kernel does.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn panel_k_pair<const R: usize, const F: u8>(
    pa: &[u8],
    pb: &[u8],
    nb: usize,
    acts: &[ActRow<'_>; R],
) -> [[f32; 2 * PANEL]; R] {
    unsafe {
        let format = k_format(F);
        let rec = format.record();
        let q6 = F == K_Q6;
        let mut acc = [_mm512_setzero_ps(); R];
        // The two panels are consecutive, and so are the next two: the same records of those are
        // what this pair's reads are followed by, so they are what to prefetch (a fixed distance
        // ahead of each panel, as the one-panel kernel does, fetched the partner panel's records
        // already read when a panel is about that size, and left half the stream unfetched).
        let ahead = 2 * nb * rec;
        for b in 0..nb {
            let ra = pa.as_ptr().add(b * rec);
            let rb = pb.as_ptr().add(b * rec);
            prefetch_l2(ra.wrapping_add(ahead), rec);
            prefetch_l2(rb.wrapping_add(ahead), rec);
            let (sc, coef) = k_scales_pair(q6, ra, rb);
            let pairs = k_coef_pairs_zmm(&coef);
            let scv = |j: usize| _mm512_loadu_si512(sc[j].as_ptr() as *const __m512i);
            let mut sums = [_mm512_setzero_si512(); R];
            for s in 0..8 {
                let w = k_groups_pair::<F>(ra, rb, s);
                let (j0, j1) = if q6 { (2 * s, 2 * s + 1) } else { (s, s) };
                let (s0, s1) = (scv(j0), scv(j1));
                for (i, sum) in sums.iter_mut().enumerate() {
                    let x = acts[i].qs.as_ptr().add(b * QK_K + 32 * s) as *const i32;
                    let z = _mm512_setzero_si512();
                    let (mut t0, mut t1) = (z, z);
                    for g in 0..4 {
                        let xg = _mm512_set1_epi32(x.add(g).read_unaligned());
                        t0 = _mm512_dpbusd_epi32(t0, w[g], xg);
                        let xg = _mm512_set1_epi32(x.add(g + 4).read_unaligned());
                        t1 = _mm512_dpbusd_epi32(t1, w[g + 4], xg);
                    }
                    let t = if q6 {
                        _mm512_add_epi32(_mm512_mullo_epi32(t0, s0), _mm512_mullo_epi32(t1, s1))
                    } else {
                        _mm512_mullo_epi32(_mm512_add_epi32(t0, t1), s0)
                    };
                    *sum = _mm512_add_epi32(*sum, t);
                }
            }
            let half16 = |at: usize| {
                let lo = _mm_loadu_si128(ra.add(at) as *const __m128i);
                let hi = _mm_loadu_si128(rb.add(at) as *const __m128i);
                _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
            };
            let dwv = half16(if q6 { k_rec::Q6_D } else { k_rec::D });
            let dmv = half16(k_rec::DMIN);
            for (i, acc) in acc.iter_mut().enumerate() {
                let sum = sums[i];
                let ex = k_extra_zmm(format, &pairs, acts[i].bsums.get_unchecked(b * QK_K / 16..));
                let dx = _mm512_set1_ps(at(acts[i].d, b));
                let v = if q6 {
                    let sumi = _mm512_sub_epi32(sum, ex);
                    _mm512_mul_ps(_mm512_mul_ps(dx, dwv), _mm512_cvtepi32_ps(sumi))
                } else {
                    _mm512_sub_ps(
                        _mm512_mul_ps(_mm512_mul_ps(dx, dwv), _mm512_cvtepi32_ps(sum)),
                        _mm512_mul_ps(_mm512_mul_ps(dx, dmv), _mm512_cvtepi32_ps(ex)),
                    )
                };
                *acc = _mm512_add_ps(*acc, v);
            }
        }
        acc.map(|acc| {
            let mut out = [0f32; 2 * PANEL];
            _mm512_storeu_ps(out.as_mut_ptr(), acc);
            out
        })
    }
}

/// The panel of `format` on the widest build of its kernel this CPU runs (all give the same
/// bits), but for a k-quant at one row, which takes the `maddubs` build even where VNNI is
/// there.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quant_panel<const R: usize>(
    format: QFormat,
    panel: &[u8],
    nb: usize,
    acts: &[ActRow<'_>; R],
) -> [[f32; PANEL]; R] {
    unsafe {
        // A k-quant at one activation row (batch-1 decoding, an expert's lone row): the
        // `maddubs` build's i16 sums and one `madd` per sub-block are fewer dependent steps
        // than `dpbusd` chains and a `mullo`, and the unrolled VNNI copy spilled to the stack.
        // On a 2-core AMD EPYC (Zen 5, AVX-512 VNNI, 70 GB/s read), one process alternating
        // the kernels on 14,336 × 4,096 Q4_K and 4,096 × 14,336 Q6_K matrices (above the L3),
        // two threads, medians of 7: Q4_K 56.0 GB/s against 42.9 (two-panel VNNI, as before)
        // and 34.2 (one-panel VNNI), Q6_K 50.7 against 36.3 and 39.9 (docs/speed-history.md,
        // 2026-11-29). The legacy formats keep VNNI (Q8_0 44.7 against 40.1 GB/s).
        let k_one_row = R == 1 && matches!(format, QFormat::Q4K | QFormat::Q5K | QFormat::Q6K);
        macro_rules! pick {
            ($vnni:ident, $wide:ident, $avx2:ident, $f:expr) => {
                if vnni() && !k_one_row {
                    $vnni::<R, { $f }>(panel, nb, acts)
                } else if R >= 8 && wide() {
                    $wide::<R, { $f }>(panel, nb, acts)
                } else {
                    $avx2::<R, { $f }>(panel, nb, acts)
                }
            };
        }
        match format {
            QFormat::Q8_0 => pick!(panel_legacy_vnni, panel_legacy_512, panel_legacy, L_Q8_0),
            QFormat::Q4_0 => pick!(panel_legacy_vnni, panel_legacy_512, panel_legacy, L_Q4_0),
            QFormat::Q4_1 => pick!(panel_legacy_vnni, panel_legacy_512, panel_legacy, L_Q4_1),
            QFormat::Q5_0 => pick!(panel_legacy_vnni, panel_legacy_512, panel_legacy, L_Q5_0),
            QFormat::Q5_1 => pick!(panel_legacy_vnni, panel_legacy_512, panel_legacy, L_Q5_1),
            QFormat::Q4K => pick!(panel_k_vnni, panel_k_512, panel_k, K_Q4),
            QFormat::Q5K => pick!(panel_k_vnni, panel_k_512, panel_k, K_Q5),
            QFormat::Q6K => pick!(panel_k_vnni, panel_k_512, panel_k, K_Q6),
            QFormat::Mxfp4 => pick!(panel_legacy_vnni, panel_legacy_512, panel_legacy, L_MXFP4),
        }
    }
}

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

/// One Q8_K block (256 values) as `layout::quantize_row` quantizes it, sixteen values at a
/// time: writes `q` and `bsums` and returns `d` (0 for an all-zero block, which writes
/// nothing), or `None` for a block holding a NaN (the caller's scalar loop then runs).
/// Bit-identical to the scalar loop: the largest magnitude is the same value in any order,
/// and its first position is found by comparison; each quant is the same f32 product rounded
/// to nearest-even and saturated as `round_even` does ([`round_even_i8`]; a subnormal
/// largest magnitude makes the scale infinite, so the saturation and NaN cases do occur).
///
/// # Panics
/// If `xs` and `q` do not hold 256 values or `bsums` 16 sums, or without [`wide`].
pub(crate) fn quantize_q8k_block(xs: &[f32], q: &mut [i8], bsums: &mut [i32]) -> Option<f32> {
    assert!(xs.len() == QK_K && q.len() == QK_K && bsums.len() == QK_K / 16);
    assert!(wide(), "quantize_q8k_block without AVX-512");
    // SAFETY: AVX-512F/BW/VL present (asserted); the lengths bound every access.
    unsafe { q8k_block(xs, q, bsums) }
}

/// Each lane of `p` rounded to nearest-even and saturated to i8 as `layout::round_even` does
/// (NaN gives 0, infinities and huge values the nearest bound), widened to i32.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
#[inline]
unsafe fn round_even_i8(p: __m512) -> __m512i {
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(p, p);
    let p = _mm512_mask_blend_ps(nan, p, _mm512_setzero_ps());
    let p = _mm512_min_ps(
        _mm512_max_ps(p, _mm512_set1_ps(-128.0)),
        _mm512_set1_ps(127.0),
    );
    _mm512_cvtps_epi32(p)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
unsafe fn q8k_block(xs: &[f32], q: &mut [i8], bsums: &mut [i32]) -> Option<f32> {
    unsafe {
        let x = |c: usize| _mm512_loadu_ps(xs.as_ptr().add(16 * c));
        let mut acc = _mm512_setzero_ps();
        let mut nan = 0u16;
        for c in 0..QK_K / 16 {
            let v = x(c);
            nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            acc = _mm512_max_ps(_mm512_abs_ps(v), acc);
        }
        if nan != 0 {
            return None;
        }
        let amax = _mm512_reduce_max_ps(acc);
        if amax == 0.0 {
            return Some(0.0);
        }
        // The first value of that magnitude (the scalar loop keeps the first with `>`).
        let am = _mm512_set1_ps(amax);
        let mut max = amax;
        for c in 0..QK_K / 16 {
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(x(c)), am);
            if hit != 0 {
                max = at(xs, 16 * c + hit.trailing_zeros() as usize);
                break;
            }
        }
        let iscale = -127.0 / max;
        let is = _mm512_set1_ps(iscale);
        for c in 0..QK_K / 16 {
            let r = round_even_i8(_mm512_mul_ps(is, x(c)));
            *bsums.get_unchecked_mut(c) = _mm512_reduce_add_epi32(r);
            _mm_storeu_si128(
                q.as_mut_ptr().add(16 * c) as *mut __m128i,
                _mm512_cvtsepi32_epi8(r),
            );
        }
        Some(1.0 / iscale)
    }
}

/// One 32-value block of Q8_0 / Q8_1 as `layout::quantize_row` quantizes it: writes `q` and
/// returns `(amax, Σ q)`, or `None` for a block holding a NaN (the scalar loop then runs).
/// Bit-identical to the scalar loop for the same reasons as [`quantize_q8k_block`].
///
/// # Panics
/// If `xs` and `q` do not hold 32 values, or without [`wide`].
pub(crate) fn quantize_q8_block(xs: &[f32], q: &mut [i8]) -> Option<(f32, i32)> {
    assert!(xs.len() == QK && q.len() == QK);
    assert!(wide(), "quantize_q8_block without AVX-512");
    // SAFETY: AVX-512F/BW/VL present (asserted); the lengths bound every access.
    unsafe { q8_block(xs, q) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
unsafe fn q8_block(xs: &[f32], q: &mut [i8]) -> Option<(f32, i32)> {
    unsafe {
        let v0 = _mm512_loadu_ps(xs.as_ptr());
        let v1 = _mm512_loadu_ps(xs.as_ptr().add(16));
        let nan =
            _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v0, v0) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v1, v1);
        if nan != 0 {
            return None;
        }
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let mut sum = _mm512_setzero_si512();
        for (c, v) in [v0, v1].into_iter().enumerate() {
            let r = round_even_i8(_mm512_mul_ps(v, id));
            sum = _mm512_add_epi32(sum, r);
            _mm_storeu_si128(
                q.as_mut_ptr().add(16 * c) as *mut __m128i,
                _mm512_cvtsepi32_epi8(r),
            );
        }
        Some((amax, _mm512_reduce_add_epi32(sum)))
    }
}
