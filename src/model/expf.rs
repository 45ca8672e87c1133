//! `expf` for the attention softmax (and `logf` for the delta rule's softplus), the same bits
//! on every machine and instruction set.
//!
//! The algorithm is the one glibc's x86-64 `expf` runs on CPUs with FMA (its `__expf_fma`,
//! from Arm's optimized-routines): `x · 32 / ln 2 = k + r` in double precision, `2^(k/32)`
//! from a 32-entry table of `2^(i/32)`, and a cubic in `r`, each step with fused multiply-adds,
//! rounded to f32 once at the end. Checked against this workplace's glibc (2.36, FMA variant)
//! on every f32 in [-105, 88]: 2,239,889,410 inputs, no difference
//! (`cargo test --release --lib expf -- --ignored`). So on such machines the softmax keeps the
//! bits it had with libm, and elsewhere (a CPU without FMA, where glibc picks another variant;
//! another libm) it no longer depends on libm. The AVX2 version computes four doubles at a
//! time with the same operations, so it gives the portable version's bits.
//!
//! [`log_f32`] is glibc's `logf` in the same way (Arm's optimized-routines `logf.c`, its FMA
//! variant): a 16-entry table of `1/c` and `log c`, a cubic in `r = z/c − 1`, in double
//! precision, rounded once. It equals this workplace's glibc on every 7th f32 from 0 to
//! infinity (305,585,006 inputs checked, no difference). The GPU kernels compute both with
//! the same operations (`moe.cu`, `deltanet.cu`).

/// `2^(i/32)` as f64 bits, minus `i << 47` (so that adding `k << 47` scales by `2^(k/32)`).
/// Computed with 60-digit decimal arithmetic and rounded to nearest.
pub(crate) const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `32 / ln 2`.
const INV_LN2_N: f64 = f64::from_bits(0x3ff71547652b82fe) * 32.0;
/// `1.5 · 2^52`: adding it rounds to an integer, ties to even, left in the low bits.
const SHIFT: f64 = f64::from_bits(0x4338000000000000);
/// The cubic's coefficients for `2^(r/32) ≈ 1 + C2 r + C1 r² + C0 r³` (those of `2^u` in
/// `u = r / 32`, scaled).
const C0: f64 = f64::from_bits(0x3fac6af84b912394) / 32768.0;
const C1: f64 = f64::from_bits(0x3fcebfce50fac4f3) / 1024.0;
const C2: f64 = f64::from_bits(0x3fe62e42ff0c52d6) / 32.0;
/// Below this `exp` rounds to 0 in f32 (about `ln 2^-150`); above the other it overflows
/// (about `ln 2^128`).
const UNDERFLOW: f32 = f32::from_bits(0xc2cf_f1b4);
const OVERFLOW: f32 = f32::from_bits(0x42b1_7217);

/// `e^x` rounded to f32 (see the module doc). NaN gives NaN.
pub fn exp_f32(x: f32) -> f32 {
    if x < UNDERFLOW {
        return 0.0;
    }
    if x > OVERFLOW {
        return f32::INFINITY;
    }
    let xd = x as f64;
    let kd = INV_LN2_N.mul_add(xd, SHIFT);
    let ki = kd.to_bits();
    let kd = kd - SHIFT;
    let r = INV_LN2_N.mul_add(xd, -kd);
    let s = f64::from_bits(TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
    let z = C0.mul_add(r, C1);
    let r2 = r * r;
    let y = C2.mul_add(r, 1.0);
    (z.mul_add(r2, y) * s) as f32
}

/// `1/c` and `log c` (f64 bits) of [`log_f32`]'s 16 subintervals (glibc's `__logf_data.tab`).
pub(crate) const LOG_TABLE: [(u64, u64); 16] = [
    (0x3ff661ec79f8f3be, 0xbfd57bf7808caade),
    (0x3ff571ed4aaf883d, 0xbfd2bef0a7c06ddb),
    (0x3ff49539f0f010b0, 0xbfd01eae7f513a67),
    (0x3ff3c995b0b80385, 0xbfcb31d8a68224e9),
    (0x3ff30d190c8864a5, 0xbfc6574f0ac07758),
    (0x3ff25e227b0b8ea0, 0xbfc1aa2bc79c8100),
    (0x3ff1bb4a4a1a343f, 0xbfba4e76ce8c0e5e),
    (0x3ff12358f08ae5ba, 0xbfb1973c5a611ccc),
    (0x3ff0953f419900a7, 0xbfa252f438e10c1e),
    (0x3ff0000000000000, 0x0000000000000000),
    (0x3fee608cfd9a47ac, 0x3faaa5aa5df25984),
    (0x3feca4b31f026aa0, 0x3fbc5e53aa362eb4),
    (0x3feb2036576afce6, 0x3fc526e57720db08),
    (0x3fe9c2d163a1aa2d, 0x3fcbc2860d224770),
    (0x3fe886e6037841ed, 0x3fd1058bc8a07ee1),
    (0x3fe767dcf5534862, 0x3fd4043057b6ee09),
];
/// `ln 2` and the cubic's coefficients of `r³`, `r²`, `r` less the first (glibc's
/// `__logf_data.ln2` and `.poly`), as f64 bits.
pub(crate) const LOG_LN2: u64 = 0x3fe62e42fefa39ef;
pub(crate) const LOG_POLY: [u64; 3] = [0xbfd00ea348b88334, 0x3fd5575b0be00b6a, 0xbfdffffef20a4123];

/// `ln x` rounded to f32 (see the module doc): `x = 2^k z` with `z` near a table point `c`,
/// `ln x = log1p(z/c − 1) + ln c + k ln 2`. Zero gives −∞, a negative number or NaN gives NaN.
pub fn log_f32(x: f32) -> f32 {
    let mut ix = x.to_bits();
    if ix == 0x3f80_0000 {
        return 0.0;
    }
    if ix.wrapping_sub(0x0080_0000) >= 0x7f80_0000 - 0x0080_0000 {
        if ix.wrapping_mul(2) == 0 {
            return f32::NEG_INFINITY;
        }
        if ix == 0x7f80_0000 {
            return x;
        }
        if ix & 0x8000_0000 != 0 || ix.wrapping_mul(2) >= 0xff00_0000 {
            return f32::NAN;
        }
        // A subnormal, normalized.
        ix = (x * 8_388_608.0).to_bits().wrapping_sub(23 << 23);
    }
    let tmp = ix.wrapping_sub(0x3f33_0000);
    let i = ((tmp >> 19) % 16) as usize;
    let k = (tmp as i32) >> 23;
    let z = f32::from_bits(ix.wrapping_sub(tmp & 0xff80_0000)) as f64;
    let (invc, logc) = (
        f64::from_bits(LOG_TABLE[i].0),
        f64::from_bits(LOG_TABLE[i].1),
    );
    let [a0, a1, a2] = LOG_POLY.map(f64::from_bits);
    let r = z.mul_add(invc, -1.0);
    let y0 = (k as f64).mul_add(f64::from_bits(LOG_LN2), logc);
    let r2 = r * r;
    let y = a1.mul_add(r, a2);
    let y = a0.mul_add(r2, y);
    y.mul_add(r2, y0 + r) as f32
}

/// `xs[i] = e^(xs[i] - shift)` for every element (the subtraction in f32), eight at a time
/// with AVX2 and FMA where the CPU has them; the same bits either way.
pub fn exp_shifted_in_place(xs: &mut [f32], shift: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just checked.
        unsafe { x86::exp_shifted_in_place(xs, shift) };
        return;
    }
    for v in xs {
        *v = exp_f32(*v - shift);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{exp_f32, C0, C1, C2, INV_LN2_N, OVERFLOW, SHIFT, TABLE, UNDERFLOW};

    /// [`exp_f32`] of four values widened to f64 (the out-of-range lanes fixed by the caller).
    #[target_feature(enable = "avx2,fma")]
    fn exp4(x: __m128) -> __m128 {
        let xd = _mm256_cvtps_pd(x);
        let kd = _mm256_fmadd_pd(_mm256_set1_pd(INV_LN2_N), xd, _mm256_set1_pd(SHIFT));
        let ki = _mm256_castpd_si256(kd);
        let kd = _mm256_sub_pd(kd, _mm256_set1_pd(SHIFT));
        let r = _mm256_fmsub_pd(_mm256_set1_pd(INV_LN2_N), xd, kd);
        let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        // SAFETY: every index is in 0..32, inside TABLE.
        let t = unsafe { _mm256_i64gather_epi64::<8>(TABLE.as_ptr() as *const i64, idx) };
        let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
        let z = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
        let r2 = _mm256_mul_pd(r, r);
        let y = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
        _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_fmadd_pd(z, r2, y), s))
    }

    /// See [`super::exp_shifted_in_place`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp_shifted_in_place(xs: &mut [f32], shift: f32) {
        let sh = _mm256_set1_ps(shift);
        let mut chunks = xs.chunks_exact_mut(8);
        for c in &mut chunks {
            // SAFETY: `c` holds eight floats.
            let x = _mm256_sub_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }, sh);
            let lo = exp4(_mm256_castps256_ps128(x));
            let hi = exp4(_mm256_extractf128_ps::<1>(x));
            let mut y = _mm256_set_m128(hi, lo);
            let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(UNDERFLOW));
            y = _mm256_andnot_ps(under, y);
            let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(OVERFLOW));
            y = _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), over);
            // NaN lanes: the scalar function's NaN (any NaN stays NaN either way).
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
            y = _mm256_blendv_ps(y, x, nan);
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(c.as_mut_ptr(), y) };
        }
        for v in chunks.into_remainder() {
            *v = exp_f32(*v - shift);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..200_000u32)
            .map(|i| -110.0 + 200.0 * (i.wrapping_mul(2_654_435_761) as f32 / u32::MAX as f32))
            .collect();
        v.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            UNDERFLOW,
            OVERFLOW,
            -f32::INFINITY,
            f32::INFINITY,
        ]);
        v.extend([-103.97, -87.33, -88.7, 88.72, -1e-8, 0.5, -0.5, 1.0, -1.0]);
        v
    }

    #[test]
    fn vector_and_scalar_give_the_same_bits() {
        #[cfg(target_arch = "x86_64")]
        let vector = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma");
        #[cfg(not(target_arch = "x86_64"))]
        let vector = false;
        if !vector {
            // The NaN check below still runs: the scalar path must keep NaN.
            crate::skip::absent(
                crate::skip::Need::CpuFeature,
                "no AVX2 and FMA here: the vector exp was not compared with the scalar one",
            );
        }
        for shift in [0.0f32, 3.25, -7.5] {
            let x = inputs();
            let mut got = x.clone();
            exp_shifted_in_place(&mut got, shift);
            for (&x, &g) in x.iter().zip(&got) {
                let want = exp_f32(x - shift);
                assert!(
                    g.to_bits() == want.to_bits(),
                    "exp({x} - {shift}): {g:e} vs {want:e}"
                );
            }
        }
        let mut nan = [f32::NAN; 9];
        exp_shifted_in_place(&mut nan, 0.0);
        assert!(nan.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn within_one_ulp_of_the_exact_value() {
        for x in inputs() {
            let (got, exact) = (exp_f32(x), (x as f64).exp());
            if exact > f32::MAX as f64 {
                assert_eq!(got, f32::INFINITY, "{x}");
            } else if exact >= f32::MIN_POSITIVE as f64 {
                let ulp = (f32::from_bits(got.to_bits() + 1) - got) as f64;
                assert!(
                    (got as f64 - exact).abs() <= ulp,
                    "exp({x}) = {got:e}, exact {exact:e}"
                );
            } else {
                assert!(
                    (got as f64 - exact).abs() <= 1.5e-45,
                    "exp({x}) = {got:e}, exact {exact:e}"
                );
            }
        }
    }

    /// `log_f32` against this machine's libm on 200,000 spread inputs and the edges (glibc's
    /// algorithm: equal on x86-64 glibc; elsewhere within an ulp).
    #[test]
    fn log_matches_libm() {
        let glibc = cfg!(all(target_arch = "x86_64", target_env = "gnu"));
        let mut xs: Vec<f32> = (0..200_000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) % 0x7f80_0000))
            .collect();
        xs.extend([
            1.0,
            2.0,
            0.5,
            1e-45,
            f32::MIN_POSITIVE,
            f32::MAX,
            1.0 + f32::EPSILON,
        ]);
        for x in xs {
            let (got, want) = (log_f32(x), x.ln());
            if glibc {
                assert_eq!(got.to_bits(), want.to_bits(), "ln {x:e}");
            } else {
                assert!(
                    (got - want).abs() <= want.abs() * 2.0 * f32::EPSILON,
                    "ln {x:e}"
                );
            }
        }
        assert_eq!(log_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(log_f32(-0.0), f32::NEG_INFINITY);
        assert_eq!(log_f32(f32::INFINITY), f32::INFINITY);
        assert!(log_f32(-1.0).is_nan() && log_f32(f32::NAN).is_nan());
    }

    /// Every positive finite f32 against this machine's libm (x86-64 glibc: no difference).
    #[test]
    #[ignore = "exhaustive; compares with this machine's libm"]
    fn log_matches_libm_everywhere() {
        let differ = (1..0x7f80_0000u32)
            .filter(|&b| {
                let x = f32::from_bits(b);
                log_f32(x).to_bits() != x.ln().to_bits()
            })
            .count();
        assert_eq!(differ, 0, "inputs where libm's logf differs");
    }

    /// Every f32 in [-105, 88] against this machine's libm (about a minute in release). On
    /// x86-64 glibc with FMA they agree exactly; elsewhere a few may differ in the last bit.
    #[test]
    #[ignore = "exhaustive; compares with this machine's libm"]
    fn matches_libm_expf_everywhere() {
        let mut differ = 0u64;
        let mut b = 0x8000_0000u32;
        while f32::from_bits(b) >= -105.0 {
            let x = f32::from_bits(b);
            differ += u64::from(exp_f32(x).to_bits() != x.exp().to_bits());
            b += 1;
        }
        let mut b = 0u32;
        while f32::from_bits(b) <= 88.0 {
            let x = f32::from_bits(b);
            differ += u64::from(exp_f32(x).to_bits() != x.exp().to_bits());
            b += 1;
        }
        assert_eq!(differ, 0, "inputs where libm's expf differs");
    }
}
