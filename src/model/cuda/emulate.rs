//! A host emulation of the integer and float matmul kernels of `mmq.cu`, line for line: the
//! same threads, lanes, warps and chunks, the same index arithmetic, shuffles emulated lane by
//! lane, and the same float operations in the same order (shared memory by its logical index:
//! the kernel pads each row of terms by one word against bank conflicts). Its tests check that it equals the
//! CPU's `QWeight::matmul` bit for bit for every weight type, batch size and row tile, which
//! checks the kernels' index arithmetic and reduction order on a machine without a GPU (the
//! GPU test `mmq_equals_the_cpu_matmul` then checks the device against the same reference).

// Index loops as in the CUDA source, so that the two read side by side.
#![allow(clippy::needless_range_loop)]

use crate::model::quant::WeightFormat;

use super::repack::{layout, Repacked};

const WARP: usize = 32;
const MQ_THREADS: usize = 128;
const MQ_RO: usize = 4;
const MQ_UNITS: usize = 4;

/// Quantized activation rows as the quantize kernels write them.
pub(crate) struct Acts {
    pub(crate) qs: Vec<i8>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
    pub(crate) sums: Vec<i32>,
}

fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

fn half_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// `__float2int_rn` (nearest, ties to even, saturating, NaN to 0), then clamped to i8.
fn round_even_i8(v: f32) -> i32 {
    (v.round_ties_even() as i32).clamp(-128, 127)
}

/// `fmaxf`: the larger, the other one when one is NaN.
fn fmaxf(a: f32, b: f32) -> f32 {
    a.max(b)
}

/// `__shfl_xor_sync` over a warp's 32 values.
fn shfl_xor<T: Copy>(v: &[T], lane: usize, off: usize) -> T {
    v[lane ^ off]
}

/// `__shfl_down_sync`: lane + off, or the lane's own value past the warp.
fn shfl_down(v: &[f32; WARP], lane: usize, off: usize) -> f32 {
    if lane + off < WARP {
        v[lane + off]
    } else {
        v[lane]
    }
}

/// `quantize_q8`: kind 0 (Q8_0) or 1 (Q8_1).
pub(crate) fn quantize_q8(x: &[f32], m: usize, k: usize, kind: u8) -> Acts {
    let nb = k / 32;
    let mut out = Acts {
        qs: vec![0; m * k],
        d: vec![f32::NAN; m * nb],
        s: vec![f32::NAN; m * nb],
        sums: vec![i32::MIN; m * nb],
    };
    for r in 0..m {
        for b in 0..nb {
            let v: [f32; WARP] = std::array::from_fn(|lane| x[r * k + b * 32 + lane]);
            let mut a: [f32; WARP] = std::array::from_fn(|lane| fmaxf(0.0, v[lane].abs()));
            let mut off = 16;
            while off > 0 {
                a = std::array::from_fn(|lane| fmaxf(a[lane], shfl_xor(&a, lane, off)));
                off >>= 1;
            }
            let mut sum = [0i32; WARP];
            for lane in 0..WARP {
                let id = if a[lane] != 0.0 { 127.0 / a[lane] } else { 0.0 };
                let q = round_even_i8(v[lane] * id);
                out.qs[r * k + b * 32 + lane] = q as i8;
                sum[lane] = q;
            }
            let mut off = 16;
            while off > 0 {
                sum = std::array::from_fn(|lane| sum[lane] + shfl_xor(&sum, lane, off));
                off >>= 1;
            }
            let dd = a[0] / 127.0;
            out.d[r * nb + b] = f16_round(dd);
            if kind == 1 {
                out.s[r * nb + b] = f16_round(sum[0] as f32 * dd);
            } else {
                out.sums[r * nb + b] = sum[0];
            }
        }
    }
    out
}

/// `quantize_q8k`.
pub(crate) fn quantize_q8k(x: &[f32], m: usize, k: usize) -> Acts {
    let nb = k / 256;
    let mut out = Acts {
        qs: vec![0; m * k],
        d: vec![f32::NAN; m * nb],
        s: Vec::new(),
        sums: vec![i32::MIN; m * k / 16],
    };
    for r in 0..m {
        for b in 0..nb {
            let e0 = |lane: usize| r * k + b * 256 + lane * 8;
            let mut st = [(0f32, 0f32, i32::MAX); WARP];
            for (lane, s) in st.iter_mut().enumerate() {
                for j in 0..8 {
                    let v = x[e0(lane) + j];
                    if v.abs() > s.0 {
                        *s = (v.abs(), v, (lane * 8 + j) as i32);
                    }
                }
            }
            let mut off = 16;
            while off > 0 {
                st = std::array::from_fn(|lane| {
                    let (mine, other) = (st[lane], shfl_xor(&st, lane, off));
                    if other.0 > mine.0 || (other.0 == mine.0 && other.2 < mine.2) {
                        other
                    } else {
                        mine
                    }
                });
                off >>= 1;
            }
            let mut s8 = [0i32; WARP];
            for lane in 0..WARP {
                let (amax, mx, _) = st[lane];
                let iscale = if amax == 0.0 { 0.0 } else { -127.0 / mx };
                for j in 0..8 {
                    let v = x[e0(lane) + j];
                    let q = if amax == 0.0 {
                        0
                    } else {
                        round_even_i8(iscale * v)
                    };
                    out.qs[e0(lane) + j] = q as i8;
                    s8[lane] += q;
                }
                if lane == 0 {
                    out.d[r * nb + b] = if amax == 0.0 { 0.0 } else { 1.0 / iscale };
                }
            }
            for lane in (0..WARP).step_by(2) {
                out.sums[r * (k / 16) + b * 16 + lane / 2] = s8[lane] + shfl_xor(&s8, lane, 1);
            }
        }
    }
    out
}

/// The activation kind a format's kernel wants: 0 Q8_0, 1 Q8_1, 2 Q8_K.
pub(crate) fn act_kind(f: WeightFormat) -> u8 {
    match f {
        WeightFormat::Q4_1 | WeightFormat::Q5_1 => 1,
        WeightFormat::Q4K | WeightFormat::Q5K | WeightFormat::Q6K => 2,
        _ => 0,
    }
}

/// Quantizes `m × k` rows for `f`'s kernel.
pub(crate) fn quantize(f: WeightFormat, x: &[f32], m: usize, k: usize) -> Acts {
    match act_kind(f) {
        2 => quantize_q8k(x, m, k),
        kind => quantize_q8(x, m, k, kind),
    }
}

pub(super) fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn ld16(b: &[u8], at: usize) -> [i32; 4] {
    std::array::from_fn(|j| i32_at(b, at + 4 * j))
}

fn ld16_i8(q: &[i8], at: usize) -> [i32; 4] {
    std::array::from_fn(|j| i32::from_le_bytes(std::array::from_fn(|i| q[at + 4 * j + i] as u8)))
}

/// `dp4a.s32.s32`.
fn dp4a(a: i32, b: i32, c: i32) -> i32 {
    let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
    c + (0..4)
        .map(|i| (a[i] as i8) as i32 * (b[i] as i8) as i32)
        .sum::<i32>()
}

fn dot16(w: [i32; 4], a: [i32; 4]) -> i32 {
    dp4a(
        w[0],
        a[0],
        dp4a(w[1], a[1], dp4a(w[2], a[2], dp4a(w[3], a[3], 0))),
    )
}

fn bits_to_b4(v: u32) -> i32 {
    (((v & 1) << 4) | ((v & 2) << 11) | ((v & 4) << 18) | ((v & 8) << 25)) as i32
}

/// `__byte_perm(x, y, s)`: byte n of the result is byte `(s >> 4n) & 7` of the pair y:x.
fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
    let b = (((y as u64) << 32) | x as u64).to_le_bytes();
    u32::from_le_bytes(std::array::from_fn(|n| b[((s >> (4 * n)) & 7) as usize]))
}

/// `mxfp4_values`.
fn mxfp4_values(q: u32) -> i32 {
    let t = q | (q >> 4);
    let sel = ((t & 0xFF) | ((t >> 8) & 0xFF00)) & 0x7777;
    let pos = byte_perm(0x0302_0100, 0x0C08_0604, sel);
    let neg = byte_perm(0xFDFE_FF00, 0xF4F8_FAFC, sel);
    let mask = ((q & 0x0808_0808) >> 3) * 0xFF;
    ((pos & !mask) | (neg & mask)) as i32
}

/// `e8m0_half`.
fn e8m0_half(e: u32) -> f32 {
    f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e - 1) << 23
    })
}

fn scale_min_i(j: usize, q: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((q[j] & 63) as i32, (q[j + 4] & 63) as i32)
    } else {
        (
            ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as i32,
            ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as i32,
        )
    }
}

/// `WPart`.
#[derive(Default, Clone, Copy)]
pub(super) struct WPart {
    pub(super) lo: [i32; 4],
    pub(super) hi: [i32; 4],
    pub(super) s0: i32,
    pub(super) s1: i32,
    pub(super) m0: i32,
    pub(super) m1: i32,
    i0: usize,
    i1: usize,
}

/// `unpack`.
pub(super) fn unpack(f: WeightFormat, w: &Repacked, blk: usize, p: usize) -> WPart {
    let l = layout(f).expect("quantized");
    let (a, bm, c) = (&w.bytes[..], &w.bytes[w.b_off..], &w.bytes[w.c_off..]);
    let qa = blk * l.qb;
    let lo = |v: [i32; 4]| v.map(|x| x & 0x0F0F_0F0F);
    let hi = |v: [i32; 4]| v.map(|x| (x >> 4) & 0x0F0F_0F0F);
    let mut wp = WPart::default();
    match f {
        WeightFormat::Q8_0 => wp.lo = ld16(a, qa + 16 * p),
        WeightFormat::Mxfp4 => {
            let q = ld16(a, qa);
            wp.lo = q.map(|v| mxfp4_values(v as u32 & 0x0F0F_0F0F));
            wp.hi = q.map(|v| mxfp4_values((v as u32 >> 4) & 0x0F0F_0F0F));
        }
        WeightFormat::Q4_0 | WeightFormat::Q4_1 | WeightFormat::Q5_0 | WeightFormat::Q5_1 => {
            let q = ld16(a, qa);
            (wp.lo, wp.hi) = (lo(q), hi(q));
            if matches!(f, WeightFormat::Q5_0 | WeightFormat::Q5_1) {
                let qh = i32_at(c, blk * 8 + 4) as u32;
                for j in 0..4 {
                    wp.lo[j] |= bits_to_b4(qh >> (4 * j));
                    wp.hi[j] |= bits_to_b4(qh >> (16 + 4 * j));
                }
            }
        }
        WeightFormat::Q4K | WeightFormat::Q5K => {
            let (cc, h) = (p / 2, p % 2);
            let q5 = f == WeightFormat::Q5K;
            let q = ld16(a, qa + if q5 { 32 } else { 0 } + 16 * p);
            (wp.lo, wp.hi) = (lo(q), hi(q));
            if q5 {
                let hv = ld16(a, qa + 16 * h);
                for j in 0..4 {
                    wp.lo[j] |= ((((hv[j] as u32) >> (2 * cc)) & 0x0101_0101) << 4) as i32;
                    wp.hi[j] |= ((((hv[j] as u32) >> (2 * cc + 1)) & 0x0101_0101) << 4) as i32;
                }
            }
            let sc12 = &bm[blk * 16 + 4..];
            (wp.s0, wp.m0) = scale_min_i(2 * cc, sc12);
            (wp.s1, wp.m1) = scale_min_i(2 * cc + 1, sc12);
            (wp.i0, wp.i1) = (cc, h);
        }
        WeightFormat::Q6K => {
            let (n, hh, s) = (p / 4, (p / 2) % 2, p % 2);
            let lw = ld16(a, qa + 16 * p);
            let hw = ld16(a, qa + 128 + 32 * n + 16 * s);
            for j in 0..4 {
                wp.lo[j] = (lw[j] & 0x0F0F_0F0F)
                    | ((((hw[j] as u32) >> (2 * hh)) & 0x0303_0303) << 4) as i32;
                wp.hi[j] = ((lw[j] >> 4) & 0x0F0F_0F0F)
                    | ((((hw[j] as u32) >> (2 * hh + 4)) & 0x0303_0303) << 4) as i32;
            }
            wp.i0 = 8 * n + 2 * hh + s;
            wp.i1 = wp.i0 + 4;
            wp.s0 = (bm[blk * 16 + wp.i0] as i8) as i32;
            wp.s1 = (bm[blk * 16 + wp.i1] as i8) as i32;
        }
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => unreachable!("float"),
    }
    wp
}

/// `row_ints`: `a0` the block's first activation in `aq`, `s0` its first integer sum in `asum`.
fn row_ints(
    f: WeightFormat,
    wp: &WPart,
    p: usize,
    aq: &[i8],
    a0: usize,
    asum: &[i32],
    s0: usize,
) -> (i32, i32) {
    match f {
        WeightFormat::Q8_0 => (dot16(wp.lo, ld16_i8(aq, a0 + 16 * p)), 0),
        WeightFormat::Q4_0
        | WeightFormat::Q4_1
        | WeightFormat::Q5_0
        | WeightFormat::Q5_1
        | WeightFormat::Mxfp4 => {
            let mut s = dot16(wp.lo, ld16_i8(aq, a0)) + dot16(wp.hi, ld16_i8(aq, a0 + 16));
            if f == WeightFormat::Q4_0 {
                s -= 8 * asum[s0];
            }
            if f == WeightFormat::Q5_0 {
                s -= 16 * asum[s0];
            }
            (s, 0)
        }
        WeightFormat::Q4K | WeightFormat::Q5K => {
            let (c, h) = (wp.i0, wp.i1);
            let d0 = dot16(wp.lo, ld16_i8(aq, a0 + 64 * c + 16 * h));
            let d1 = dot16(wp.hi, ld16_i8(aq, a0 + 64 * c + 32 + 16 * h));
            let bs = |i: usize| asum[s0 + i];
            let sm = if h == 0 {
                wp.m0 * (bs(4 * c) + bs(4 * c + 1)) + wp.m1 * (bs(4 * c + 2) + bs(4 * c + 3))
            } else {
                0
            };
            (wp.s0 * d0 + wp.s1 * d1, sm)
        }
        WeightFormat::Q6K => {
            let d0 = dot16(wp.lo, ld16_i8(aq, a0 + 16 * wp.i0));
            let d1 = dot16(wp.hi, ld16_i8(aq, a0 + 16 * wp.i1));
            (
                wp.s0 * (d0 - 32 * asum[s0 + wp.i0]) + wp.s1 * (d1 - 32 * asum[s0 + wp.i1]),
                0,
            )
        }
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => unreachable!("float"),
    }
}

/// `WScale`: a weight block's float scales, `d` and `m` (Q4_1 / Q5_1's min, the k-quants'
/// dmin; 0 for the others).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct WScale {
    pub(super) d: f32,
    pub(super) m: f32,
}

/// `load_wscale<T>`.
pub(super) fn load_wscale(f: WeightFormat, w: &Repacked, blk: usize) -> WScale {
    let (bm, c) = (&w.bytes[w.b_off..], &w.bytes[w.c_off..]);
    let sb = layout(f).expect("quantized").sb;
    let (d, m) = match f {
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0 => (half_at(c, blk * sb), 0.0),
        WeightFormat::Mxfp4 => (e8m0_half(c[blk] as u32), 0.0),
        WeightFormat::Q4_1 | WeightFormat::Q5_1 => (half_at(c, blk * sb), half_at(c, blk * sb + 2)),
        WeightFormat::Q4K | WeightFormat::Q5K => (half_at(bm, blk * 16), half_at(bm, blk * 16 + 2)),
        WeightFormat::Q6K => (half_at(c, blk * 2), 0.0),
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => unreachable!("float"),
    };
    WScale { d, m }
}

/// `block_expr<T>`: the CPU's `block_update` expression for one block and one row.
pub(super) fn block_expr(
    f: WeightFormat,
    s: WScale,
    sumi: i32,
    summ: i32,
    dx: f32,
    sx: f32,
) -> f32 {
    match f {
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0 | WeightFormat::Mxfp4 => {
            (sumi as f32 * s.d) * dx
        }
        WeightFormat::Q4_1 | WeightFormat::Q5_1 => (sumi as f32 * s.d) * dx + s.m * sx,
        WeightFormat::Q4K | WeightFormat::Q5K => {
            (dx * s.d) * sumi as f32 - (dx * s.m) * summ as f32
        }
        WeightFormat::Q6K => (dx * s.d) * sumi as f32,
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => unreachable!("float"),
    }
}

/// `block_term` (= `block_expr` of `load_wscale`).
pub(super) fn block_term(
    f: WeightFormat,
    w: &Repacked,
    blk: usize,
    sumi: i32,
    summ: i32,
    dx: f32,
    sx: f32,
) -> f32 {
    block_expr(f, load_wscale(f, w, blk), sumi, summ, dx, sx)
}

/// `mmq_body<T, MR>` over the whole grid: `y = x · Wᵀ` for the repacked quantized `w`.
pub(crate) fn mmq(
    f: WeightFormat,
    w: &Repacked,
    acts: &Acts,
    m: usize,
    n: usize,
    k: usize,
    mr: usize,
) -> Vec<f32> {
    let l = layout(f).expect("quantized");
    let p_n = l.parts;
    let cb_n = MQ_UNITS * MQ_THREADS / (MQ_RO * p_n);
    let nb = k / l.block;
    let sums_per_block = if l.block == 256 { 16 } else { 1 };
    let mut y = vec![f32::NAN; m * n];
    for bx in 0..m.div_ceil(mr) {
        for by in 0..n.div_ceil(MQ_RO) {
            let (r0, o0) = (bx * mr, by * MQ_RO);
            let nr = (m - r0).min(mr);
            let mut acc = [0f32; MQ_THREADS];
            for b0 in (0..nb).step_by(cb_n) {
                let mut terms = vec![f32::NAN; mr * MQ_RO * cb_n];
                for it in 0..MQ_UNITS {
                    let unit = |t: usize| {
                        let u = it * MQ_THREADS + t;
                        let (o, rem) = (u / (cb_n * p_n), u % (cb_n * p_n));
                        let (cb, p) = (rem / p_n, rem % p_n);
                        let b = b0 + cb;
                        (o, cb, p, b, o0 + o < n && b < nb, (o0 + o) * nb + b)
                    };
                    // Each thread unpacks its part once for the tile's rows.
                    let parts: Vec<WPart> = (0..MQ_THREADS)
                        .map(|t| {
                            let (_, _, p, _, live, blk) = unit(t);
                            if live {
                                unpack(f, w, blk, p)
                            } else {
                                WPart::default()
                            }
                        })
                        .collect();
                    for r in 0..mr {
                        if r >= nr {
                            continue;
                        }
                        let row = r0 + r;
                        let mut si = [0i32; MQ_THREADS];
                        let mut sm = [0i32; MQ_THREADS];
                        for t in 0..MQ_THREADS {
                            let (_, _, p, b, live, _) = unit(t);
                            if live {
                                (si[t], sm[t]) = row_ints(
                                    f,
                                    &parts[t],
                                    p,
                                    &acts.qs,
                                    row * k + b * l.block,
                                    &acts.sums,
                                    row * (k / l.block) * sums_per_block + b * sums_per_block,
                                );
                            }
                        }
                        let mut off = p_n / 2;
                        while off > 0 {
                            // Lanes of one warp: t ^ off stays inside the warp (off < 32).
                            let (s2, m2) = (si, sm);
                            for t in 0..MQ_THREADS {
                                si[t] = s2[t] + shfl_xor(&s2, t, off);
                                sm[t] = m2[t] + shfl_xor(&m2, t, off);
                            }
                            off >>= 1;
                        }
                        for t in 0..MQ_THREADS {
                            let (o, cb, p, b, live, blk) = unit(t);
                            if live && p == 0 {
                                let dx = acts.d[row * nb + b];
                                let sx = if act_kind(f) == 1 {
                                    acts.s[row * nb + b]
                                } else {
                                    0.0
                                };
                                terms[(r * MQ_RO + o) * cb_n + cb] =
                                    block_term(f, w, blk, si[t], sm[t], dx, sx);
                            }
                        }
                    }
                }
                for (t, acc) in acc.iter_mut().enumerate().take(mr * MQ_RO) {
                    let (r, o) = (t / MQ_RO, t % MQ_RO);
                    let nc = (nb - b0).min(cb_n);
                    if r < nr && o0 + o < n {
                        for j in 0..nc {
                            *acc += terms[(r * MQ_RO + o) * cb_n + j];
                        }
                    }
                }
            }
            for (t, &acc) in acc.iter().enumerate().take(mr * MQ_RO) {
                let (r, o) = (t / MQ_RO, t % MQ_RO);
                if r < nr && o0 + o < n {
                    y[(r0 + r) * n + o0 + o] = acc;
                }
            }
        }
    }
    y
}

/// `mmf_body<T, MR>` over the whole grid: `w` the stored float values widened exactly.
pub(crate) fn mmf(w: &[f32], x: &[f32], m: usize, n: usize, k: usize, mr: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; m * n];
    let full = k / 32 * 32;
    for bx in 0..m.div_ceil(mr) {
        for by in 0..n.div_ceil(MQ_RO) {
            let r0 = bx * mr;
            let nr = (m - r0).min(mr);
            for warp in 0..MQ_RO {
                let o = by * MQ_RO + warp;
                if o >= n {
                    continue;
                }
                let mut acc = vec![[0f32; WARP]; mr];
                for c in (0..full).step_by(32) {
                    for lane in 0..WARP {
                        let wv = w[o * k + c + lane];
                        for (r, acc) in acc.iter_mut().enumerate().take(nr) {
                            acc[lane] = x[(r0 + r) * k + c + lane].mul_add(wv, acc[lane]);
                        }
                    }
                }
                for (r, acc) in acc.iter().enumerate().take(nr) {
                    let mut v = *acc;
                    for off in [8, 16, 4, 2, 1] {
                        v = std::array::from_fn(|lane| v[lane] + shfl_down(&v, lane, off));
                    }
                    let mut s = v[0];
                    for e in full..k {
                        s = x[(r0 + r) * k + e].mul_add(w[o * k + e], s);
                    }
                    y[(r0 + r) * n + o] = s;
                }
            }
        }
    }
    y
}

/// `rms_norm`'s scale of one row as its block of `threads` threads computes it: strided
/// `fmaf` partial sums, the shared-memory tree, `1 / sqrtf(sum / dim + eps)`.
pub(crate) fn rms_scale(x: &[f32], threads: usize, eps: f32) -> f32 {
    let mut part: Vec<f32> = (0..threads)
        .map(|t| {
            x.iter()
                .skip(t)
                .step_by(threads)
                .fold(0f32, |acc, &v| v.mul_add(v, acc))
        })
        .collect();
    let mut half = threads / 2;
    while half > 0 {
        for t in 0..half {
            part[t] += part[t + half];
        }
        half /= 2;
    }
    1.0 / (part[0] / x.len() as f32 + eps).sqrt()
}

/// `rms_norm` over its grid (a block per row of `dim`, `dim.next_power_of_two()` threads
/// clamped to 32..=1024): `y = x · scale · w`, in place.
pub(crate) fn rms_norm(x: &mut [f32], w: &[f32], dim: usize, eps: f32) {
    let threads = dim.next_power_of_two().clamp(32, 1024);
    for row in x.chunks_exact_mut(dim) {
        let scale = rms_scale(row, threads, eps);
        for (v, &wi) in row.iter_mut().zip(w) {
            *v = *v * scale * wi;
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::quant::tests::noise;
    use crate::model::quant::{QWeight, Stored};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// A `n × k` weight of `dtype` quantized from seeded noise (`seed`).
    pub(in crate::model::cuda) fn weight(
        dtype: GgmlDType,
        n: usize,
        k: usize,
        seed: u64,
    ) -> QWeight {
        let t = Tensor::from_vec(noise(seed, n * k), (n, k), &Device::Cpu).expect("tensor");
        QWeight::from_qtensor(&QTensor::quantize(&t, dtype).expect("quantize")).expect("weight")
    }

    /// The quantized weight types of candle's quantizer, and MXFP4 (ggml's quantizer).
    pub(in crate::model::cuda) const QUANTIZED: [Option<GgmlDType>; 9] = [
        Some(GgmlDType::Q8_0),
        Some(GgmlDType::Q4_0),
        Some(GgmlDType::Q4_1),
        Some(GgmlDType::Q5_0),
        Some(GgmlDType::Q5_1),
        Some(GgmlDType::Q4K),
        Some(GgmlDType::Q5K),
        Some(GgmlDType::Q6K),
        None,
    ];

    /// A `n × k` weight of `dtype` ([`weight`]), or MXFP4 (`None`) from the same noise.
    pub(in crate::model::cuda) fn quantized(
        dtype: Option<GgmlDType>,
        n: usize,
        k: usize,
        seed: u64,
    ) -> QWeight {
        match dtype {
            Some(d) => weight(d, n, k, seed),
            None => crate::model::quant::tests::mxfp4(n, k, seed).0,
        }
    }

    /// Activations with what the quantizers must get right: a zero row, ties of magnitude
    /// of either sign (the first wins), large and tiny values.
    fn activations(m: usize, k: usize) -> Vec<f32> {
        let mut x: Vec<f32> = noise(77, m * k).iter().map(|v| v * 3.0).collect();
        if m > 2 {
            x[2 * k..3 * k].fill(0.0);
        }
        if m > 1 {
            x[k + 5] = -7.5;
            x[k + 9] = 7.5;
            x[k + 300] = 7.5;
            x[k + 40] = 1e-30;
        }
        if m > 4 {
            for v in &mut x[4 * k..5 * k] {
                *v *= 1e6;
            }
        }
        x
    }

    /// Floats as their bits, so that comparisons are bit for bit (NaN included).
    pub(in crate::model::cuda) fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    /// Every quantized type (MXFP4 included): the emulated kernels give `QWeight::matmul`'s
    /// bits for batches of 1 to 17 rows, in row tiles of 1 and 8, with a partial output tile
    /// (13 outputs) and k = 4608, which leaves a partial last chunk for every format (CB = 64,
    /// 128 or 16 blocks).
    #[test]
    fn integer_kernels_equal_the_cpu_matmul() {
        let (n, k) = (13, 4608);
        for dtype in QUANTIZED {
            let w = quantized(dtype, n, k, 21);
            let f = w.format();
            let Stored::Blocks(raw) = w.stored() else {
                panic!("{dtype:?} is quantized")
            };
            let rep = layout(f).expect("quantized").repack(&raw, n, k);
            for (m, tiles) in [(1, &[1, 8][..]), (5, &[1, 8]), (17, &[8])] {
                let x = activations(m, k);
                let mut want = vec![0f32; m * n];
                w.matmul(&x, m, &mut want);
                let acts = quantize(f, &x, m, k);
                for &mr in tiles {
                    let got = mmq(f, &rep, &acts, m, n, k, mr);
                    assert_eq!(bits(&got), bits(&want), "{f:?} m={m} tile {mr}");
                }
            }
        }
    }

    /// `mxfp4_values` gives every code's value (ggml's `kvalues_mxfp4`) in every byte, the
    /// other bytes' codes whatever they are.
    #[test]
    fn mxfp4_values_looks_every_code_up() {
        use crate::model::quant::KVALUES_MXFP4;
        for c in 0..16u32 {
            for at in 0..4 {
                for other in [0u32, 7, 8, 15] {
                    let q = ((0x0101_0101 * other) & !(0xFF << (8 * at))) | (c << (8 * at));
                    let v = mxfp4_values(q).to_le_bytes();
                    for (i, &b) in v.iter().enumerate() {
                        let code = if i == at { c } else { other };
                        assert_eq!(b as i8, KVALUES_MXFP4[code as usize], "{c} at {at}");
                    }
                }
            }
        }
    }

    /// The float types: the emulated kernel gives `QWeight::matmul`'s bits, with a k % 32
    /// tail.
    #[test]
    fn float_kernels_equal_the_cpu_matmul() {
        let (n, k) = (6, 32 * 9 + 13);
        for dtype in [GgmlDType::F32, GgmlDType::F16, GgmlDType::BF16] {
            let w = weight(dtype, n, k, 23);
            let mut wide = vec![0f32; n * k];
            for (o, row) in wide.chunks_exact_mut(k).enumerate() {
                w.row_f32(o, row);
            }
            for m in [1, 3, 9] {
                let x = activations(m, k);
                let mut want = vec![0f32; m * n];
                w.matmul(&x, m, &mut want);
                for mr in [1, 8] {
                    let got = mmf(&wide, &x, m, n, k, mr);
                    assert_eq!(bits(&got), bits(&want), "{dtype:?} m={m} tile {mr}");
                }
            }
        }
    }
}
