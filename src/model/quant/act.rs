//! Activations quantized to 8-bit blocks (Q8_0, Q8_1, Q8_K) for the integer kernels: the rows
//! of [`QuantizedRows`], each block by the AVX-512 quantizers where the machine has them, else
//! by the scalar loops, with the same bits either way.

use half::f16;
use rayon::prelude::*;

use super::layout::{round_even, ActKind, QuantizedRows, BS16};

impl QuantizedRows {
    /// Quantizes the `m × k` rows of `x` to `kind` blocks.
    ///
    /// Q8_0 / Q8_1 follow the `quantize_row_q8_0` / `quantize_row_q8_1` that ggml's CPU
    /// backend runs on x86 (AVX2; not the `_ref` versions): `d = amax / 127`,
    /// `q = round_half_even(x * (127 / amax))`, `s = f16(d * sum(q))` with the unrounded f32
    /// `d`. Q8_K follows `quantize_row_q8_K_ref` (which ggml's x86 `quantize_row_q8_K` calls):
    /// `iscale = -127 / x_amax` (the signed element of largest magnitude), `q = min(127,
    /// round_half_even(iscale * x))`, `d = 1 / iscale`.
    pub(crate) fn quantize(x: &[f32], k: usize, kind: ActKind) -> QuantizedRows {
        let block = kind.block();
        debug_assert_eq!(k % block, 0);
        let nb = k / block;
        let m = x.len() / k;
        let s_row = if kind == ActKind::Q8_1 { nb } else { 0 };
        let sums_row = match kind {
            ActKind::Q8K => k / 16,
            ActKind::Q8_0 => nb,
            ActKind::Q8_1 => 0,
        };
        let mut out = QuantizedRows {
            kind,
            nb,
            qs: vec![0; m * k],
            d: vec![0.0; m * nb],
            s: vec![0.0; m * s_row],
            bsums: vec![0; m * sums_row],
            bs16: Vec::new(),
        };
        // Rows are independent: blocks of rows go to rayon's threads when there are enough
        // (a prefill's activations), the same values whatever the split.
        let per = if m * k >= QUANTIZE_PAR_MIN {
            m.div_ceil(4 * rayon::current_num_threads()).max(1)
        } else {
            m.max(1)
        };
        let mut parts = Vec::with_capacity(m.div_ceil(per));
        let (mut qs, mut d) = (&mut out.qs[..], &mut out.d[..]);
        let (mut s, mut bsums) = (&mut out.s[..], &mut out.bsums[..]);
        for r0 in (0..m).step_by(per) {
            let n = per.min(m - r0);
            let (q0, q1) = std::mem::take(&mut qs).split_at_mut(n * k);
            let (d0, d1) = std::mem::take(&mut d).split_at_mut(n * nb);
            let (s0, s1) = std::mem::take(&mut s).split_at_mut(n * s_row);
            let (b0, b1) = std::mem::take(&mut bsums).split_at_mut(n * sums_row);
            parts.push(RowsPart {
                x: &x[r0 * k..(r0 + n) * k],
                qs: q0,
                d: d0,
                s: s0,
                bsums: b0,
            });
            (qs, d, s, bsums) = (q1, d1, s1, b1);
        }
        let run = |p: RowsPart<'_>| {
            for (i, xr) in p.x.chunks_exact(k).enumerate() {
                quantize_row(
                    xr,
                    kind,
                    &mut p.qs[i * k..(i + 1) * k],
                    &mut p.d[i * nb..(i + 1) * nb],
                    &mut p.s[i * s_row..(i + 1) * s_row],
                    &mut p.bsums[i * sums_row..(i + 1) * sums_row],
                );
            }
        };
        if parts.len() > 1 {
            parts.into_par_iter().for_each(run);
        } else {
            parts.into_iter().for_each(run);
        }
        if kind == ActKind::Q8K {
            out.bs16 = out
                .bsums
                .chunks_exact(16)
                .flat_map(|s| {
                    // |sum of 16 quants| <= 2,048: exact in i16, pairs too.
                    let pair = |j: usize| (s[2 * j] + s[2 * j + 1]) as i16;
                    let all: [i16; BS16] =
                        std::array::from_fn(|t| if t < 16 { s[t] as i16 } else { pair(t - 16) });
                    all
                })
                .collect();
        }
        out
    }
}

/// A block of rows for [`QuantizedRows::quantize`]: the inputs and their parts of the outputs.
struct RowsPart<'a> {
    x: &'a [f32],
    qs: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    bsums: &'a mut [i32],
}

/// Activation elements (`m · k`) from which [`QuantizedRows::quantize`] spreads rows over
/// threads.
const QUANTIZE_PAR_MIN: usize = 1 << 15;

/// One row of [`QuantizedRows::quantize`]: its quants, block scales, Q8_1 block sums `s` and
/// integer sums `bsums` (each slice this row's part; `s` / `bsums` empty where the kind has
/// none), all zero on entry.
fn quantize_row(
    x: &[f32],
    kind: ActKind,
    qs: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    bsums: &mut [i32],
) {
    let block = kind.block();
    #[cfg(target_arch = "x86_64")]
    let wide = super::x86::wide();
    #[cfg(not(target_arch = "x86_64"))]
    let wide = false;
    for (b, (xs, q)) in x
        .chunks_exact(block)
        .zip(qs.chunks_exact_mut(block))
        .enumerate()
    {
        if kind == ActKind::Q8K {
            let sums = &mut bsums[b * block / 16..(b + 1) * block / 16];
            #[cfg(target_arch = "x86_64")]
            let vector = if wide {
                super::x86::quantize_q8k_block(xs, q, sums)
            } else {
                None
            };
            #[cfg(not(target_arch = "x86_64"))]
            let vector = None;
            d[b] = vector.unwrap_or_else(|| quantize_q8k_block(xs, q, sums));
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        let vector = if wide {
            super::x86::quantize_q8_block(xs, q)
        } else {
            None
        };
        #[cfg(not(target_arch = "x86_64"))]
        let vector = None;
        let (amax, sum) = vector.unwrap_or_else(|| quantize_q8_block(xs, q));
        let dd = amax / 127.0;
        d[b] = f16::from_f32(dd).to_f32();
        match kind {
            ActKind::Q8_0 => bsums[b] = sum,
            ActKind::Q8_1 => s[b] = f16::from_f32(sum as f32 * dd).to_f32(),
            ActKind::Q8K => unreachable!("handled above"),
        }
    }
}

/// One Q8_K block of [`quantize_row`]: writes its quants `q` and the sums of every 16 into
/// `sums`, and returns `d` (an all-zero block leaves everything zero and gives 0).
fn quantize_q8k_block(xs: &[f32], q: &mut [i8], sums: &mut [i32]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in xs {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        // Quants, scale and sums stay zero.
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in q.iter_mut().zip(xs) {
        // |iscale · v| <= 127 up to rounding, so `round_even`'s saturation is
        // `min(127)`; it avoids a libm `rintf` call per element.
        *q = round_even(iscale * v);
    }
    for (sum, c) in sums.iter_mut().zip(q.chunks_exact(16)) {
        *sum = c.iter().map(|&v| v as i32).sum::<i32>();
    }
    1.0 / iscale
}

/// One Q8_0 / Q8_1 block of [`quantize_row`]: writes its quants `q`, returns the largest
/// magnitude and the quants' sum.
fn quantize_q8_block(xs: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = xs.iter().fold(0f32, |a, &v| a.max(v.abs()));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(xs) {
        *q = round_even(v * id);
    }
    (amax, q.iter().map(|&q| q as i32).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows spread over threads (enough of them for [`QUANTIZE_PAR_MIN`]) quantize exactly
    /// as each row alone, for every activation kind, zero rows included.
    #[test]
    fn quantize_in_parallel_is_row_by_row() {
        let k = 512;
        let m = QUANTIZE_PAR_MIN / k + 3;
        let mut x: Vec<f32> = (0..m * k)
            .map(|i| ((i as f32 * 0.618).sin() * 3.0) * if i % 97 == 0 { 40.0 } else { 1.0 })
            .collect();
        x[5 * k..6 * k].fill(0.0);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        for kind in [ActKind::Q8_0, ActKind::Q8_1, ActKind::Q8K] {
            let all = pool.install(|| QuantizedRows::quantize(&x, k, kind));
            for i in 0..m {
                let one = QuantizedRows::quantize(&x[i * k..(i + 1) * k], k, kind);
                let (a, b) = (all.row(i), one.row(0));
                assert_eq!(a.qs, b.qs, "{kind:?} row {i}");
                assert_eq!(a.bsums, b.bsums, "{kind:?} row {i}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(a.d), bits(b.d), "{kind:?} row {i}");
                assert_eq!(bits(a.s), bits(b.s), "{kind:?} row {i}");
            }
        }
    }

    /// The AVX-512 block quantizers give the scalar loops' bits, for every kind, on rows with
    /// ties of magnitude (the first wins), zero blocks, a NaN (the scalar loop runs), tiny,
    /// huge and subnormal values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_quantizers_give_the_scalar_bits() {
        if !super::super::x86::wide() {
            crate::skip::absent(
                crate::skip::Need::CpuFeature,
                "no AVX-512 here: the AVX-512 activation quantizers were not compared",
            );
            return;
        }
        let k = 512;
        let mut x: Vec<f32> = (0..8 * k)
            .map(|i| ((i as f32 * 0.37).sin() * 5.0) * if i % 61 == 0 { 30.0 } else { 1.0 })
            .collect();
        x[k..2 * k].fill(0.0);
        // Row 2: the largest magnitude twice, negative first, then positive.
        x[2 * k + 3] = -1000.0;
        x[2 * k + 200] = 1000.0;
        x[2 * k + 300] = 1000.0;
        x[3 * k + 17] = f32::NAN;
        for v in &mut x[4 * k..5 * k] {
            *v *= 1e-40;
        }
        for v in &mut x[5 * k..6 * k] {
            *v *= 1e30;
        }
        x[6 * k + 40] = 1e-38;
        x[6 * k + 41] = -0.0;
        for kind in [ActKind::Q8_0, ActKind::Q8_1, ActKind::Q8K] {
            let vector = QuantizedRows::quantize(&x, k, kind);
            let level = super::super::x86::cap_level(0);
            let scalar = QuantizedRows::quantize(&x, k, kind);
            super::super::x86::cap_level(level);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(vector.qs, scalar.qs, "{kind:?}");
            assert_eq!(vector.bsums, scalar.bsums, "{kind:?}");
            assert_eq!(bits(&vector.d), bits(&scalar.d), "{kind:?}");
            assert_eq!(bits(&vector.s), bits(&scalar.s), "{kind:?}");
        }
    }

    #[test]
    fn q8_0_round_trip_matches_ggml_rule() {
        let mut x = vec![0f32; 64];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 20.0) * 0.37;
        }
        x[40] = 0.0;
        let q = QuantizedRows::quantize(&x, 64, ActKind::Q8_1);
        // amax of block 0 is 20 * 0.37 at i = 0.
        let d0 = 20.0f32 * 0.37 / 127.0;
        assert_eq!(q.d[0], f16::from_f32(d0).to_f32());
        assert_eq!(q.qs[0], -127);
        assert_eq!(q.qs[20], 0);
        let sum: i32 = q.qs[..32].iter().map(|&v| v as i32).sum();
        assert_eq!(q.s[0], f16::from_f32(sum as f32 * d0).to_f32());
        // A zero block has d = 0 and all-zero quants.
        let z = QuantizedRows::quantize(&[0f32; 32], 32, ActKind::Q8_0);
        assert_eq!(z.d, vec![0.0]);
        assert!(z.qs.iter().all(|&v| v == 0));
        assert!(z.s.is_empty());
    }

    #[test]
    fn q8_k_follows_ggml_rule() {
        // The largest-magnitude element is negative: iscale = -127 / -4 > 0.
        let mut x = vec![0f32; 256];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i % 9) as f32 * 0.25;
        }
        x[7] = -4.0;
        let q = QuantizedRows::quantize(&x, 256, ActKind::Q8K);
        let iscale = -127.0f32 / -4.0;
        assert_eq!(q.d, vec![1.0 / iscale]);
        assert_eq!(q.qs[7], -127);
        // 0.5 * 31.75 = 15.875 → 16; 0.25 * 31.75 = 7.9375 → 8.
        assert_eq!((q.qs[2], q.qs[1]), (16, 8));
        assert_eq!(q.bsums.len(), 16);
        for g in 0..16 {
            let want: i32 = q.qs[g * 16..(g + 1) * 16].iter().map(|&v| v as i32).sum();
            assert_eq!(q.bsums[g], want);
        }
        // A positive maximum gives -127 / max < 0 and clamps +128 to 127.
        let mut y = [0f32; 256];
        y[0] = 2.0;
        y[1] = -2.0;
        let q = QuantizedRows::quantize(&y, 256, ActKind::Q8K);
        assert_eq!((q.qs[0], q.qs[1]), (-127, 127));
        let z = QuantizedRows::quantize(&[0f32; 256], 256, ActKind::Q8K);
        assert_eq!((z.d[0], z.bsums.len()), (0.0, 16));
    }

    #[test]
    fn round_half_to_even_through_127_over_amax() {
        // amax 127 ⇒ id = 1, so quants are round_half_even(x): 2.5 → 2, -2.5 → -2, 3.5 → 4.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        x[3] = 3.5;
        let q = QuantizedRows::quantize(&x, 32, ActKind::Q8_0);
        assert_eq!(&q.qs[..4], &[127, 2, -2, 4]);
        // The multiplier is 127 / amax, not 1 / (amax / 127): for amax = 0.3 they differ by
        // an ulp, and 0.1547244 · 127 / 0.3 = 65.49999 → 65 where 1 / (0.3 / 127) gives 65.5 → 66.
        let mut y = [0f32; 32];
        y[0] = 0.3;
        y[1] = 0.1547244;
        let q = QuantizedRows::quantize(&y, 32, ActKind::Q8_0);
        assert_eq!(&q.qs[..2], &[127, 65]);
    }

    #[test]
    fn round_even_equals_round_ties_even() {
        let mut vals = vec![
            0.5f32, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 127.0, -127.0, 0.0, -0.0, 127.4,
            -128.4, 300.0, -300.0, 1e9, -1e9,
        ];
        vals.extend([0.49999997f32, -0.49999997, 2.4999998]);
        vals.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 0.00127));
        for v in vals {
            assert_eq!(round_even(v), v.round_ties_even() as i8, "{v}");
        }
        assert_eq!(round_even(f32::NAN), 0);
    }
}
