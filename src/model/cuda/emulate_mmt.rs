//! A host emulation of the tensor-core kernels of `mmt.cu`, line for line: the same threads,
//! warps, tiles, stages and shared-memory arrays (byte for byte; every array is filled with a
//! poison pattern before each stage, so a read of something the stage did not write shows),
//! the fragment registers loaded by the kernel's own address arithmetic, and the MMA itself
//! emulated from the PTX ISA's fragment layouts lane by lane ([`mma`]: which element of A, B
//! and D each register byte or word is). Its tests check that it equals the CPU's
//! `QWeight::matmul` bit for bit for every quantized type, which checks the kernel's index
//! arithmetic, fragment layouts and reduction order on a machine without a GPU (the GPU test
//! `mmt_equals_the_cpu_matmul` then checks the device against the same reference).
//!
//! The stage's shared arrays are the kernel's: `xs`, `ws` (int8), `wsc` (the k-quants'
//! sub-block scales and mins), `xsum` (the activations' integer sums: Q6_K's 16 per row,
//! Q8_0 / Q4_0 / Q5_0's one per block), `xpair` (Q4_K / Q5_K: per row its 8 sub-block sums,
//! pairs of Q8_K's sums of 16 added while staging; `xsum` is not written for them), and the
//! float scales staged once per stage for the stage's blocks: `xd` / `xa` (the activations'
//! `d` / `s` per row, clamped to row m - 1) and `wd` / `wmn` (`load_wscale`'s `d` / `m` per
//! output, clamped to output n - 1), slot `r * sl + cb` (`sl` = 9 for the blocks of 32). The
//! float arrays are poisoned with a NaN. The k-quants' epilogue reads each row's 8 sub-block
//! sums and each output's 8 mins as one 16-byte load (`ld8s`, which checks the alignment).

// Index loops as in the CUDA source, so that the two read side by side.
#![allow(clippy::needless_range_loop)]

use crate::model::quant::WeightFormat;

use super::emulate::{block_expr, load_wscale, unpack, Acts, WPart, WScale};
use super::repack::{layout, Repacked};

const WARP: usize = 32;
const MT_THREADS: usize = 128;
const MT_BM: usize = 64;
const MT_BN: usize = 64;
const MT_SK: usize = 256;
const MT_LD: usize = MT_SK + 16;

/// The element (row, column) of A held by byte `i % 4` of register `i / 4` of `lane`, for
/// `mma.m16n8k32` (`k == 32`) or `mma.m16n8k16` (`k == 16`) with `.s8` (PTX ISA, "Matrix
/// Fragments for mma.m16n8k32" and "... m16n8k16 with integer type").
pub(crate) fn a_elem(k: usize, lane: usize, i: usize) -> (usize, usize) {
    let (g, q) = (lane >> 2, lane % 4);
    if k == 32 {
        let row = if i < 4 || (8..12).contains(&i) {
            g
        } else {
            g + 8
        };
        let col = q * 4 + (i & 3) + if i >= 8 { 16 } else { 0 };
        (row, col)
    } else {
        (if i < 4 { g } else { g + 8 }, q * 4 + (i & 3))
    }
}

/// The element (row = k index, column = n index) of B held by byte `i % 4` of register `i / 4`.
pub(crate) fn b_elem(k: usize, lane: usize, i: usize) -> (usize, usize) {
    let (g, q) = (lane >> 2, lane % 4);
    let row = q * 4 + (i & 3) + if k == 32 && i >= 4 { 16 } else { 0 };
    (row, g)
}

/// The element (row, column) of C / D in register `i` of `lane` (both shapes).
pub(crate) fn d_elem(lane: usize, i: usize) -> (usize, usize) {
    let (g, q) = (lane >> 2, lane % 4);
    (if i < 2 { g } else { g + 8 }, q * 2 + (i & 1))
}

fn byte(reg: i32, i: usize) -> i32 {
    reg.to_le_bytes()[i % 4] as i8 as i32
}

/// `mma.sync.aligned.m16n8k{k}.row.col.s32.s8.s8.s32 d, a, b, 0` over a warp's registers
/// (`a[lane]`: 4 registers, the first 2 for k = 16; `b[lane]`: 2, the first 1 for k = 16).
pub(crate) fn mma(k: usize, a: &[[i32; 4]; WARP], b: &[[i32; 2]; WARP]) -> [[i32; 4]; WARP] {
    let mut am = [[0i32; 32]; 16];
    let mut bm = [[0i32; 8]; 32];
    for lane in 0..WARP {
        for i in 0..k / 2 {
            let (r, c) = a_elem(k, lane, i);
            am[r][c] = byte(a[lane][i / 4], i);
        }
        for i in 0..k / 4 {
            let (r, c) = b_elem(k, lane, i);
            bm[r][c] = byte(b[lane][i / 4], i);
        }
    }
    std::array::from_fn(|lane| {
        std::array::from_fn(|i| {
            let (r, c) = d_elem(lane, i);
            (0..k).map(|e| am[r][e] * bm[e][c]).sum()
        })
    })
}

fn rd32(s: &[i8], at: usize) -> i32 {
    i32::from_le_bytes(std::array::from_fn(|i| s[at + i] as u8))
}

fn wr16(s: &mut [i8], at: usize, v: [i32; 4]) {
    for (j, w) in v.iter().enumerate() {
        for (i, b) in w.to_le_bytes().iter().enumerate() {
            s[at + 4 * j + i] = *b as i8;
        }
    }
}

/// `ld8s`: the 8 shorts of one 16-byte shared load at element `at` of a 16-byte aligned array
/// (so `at` must be a multiple of 8).
fn ld8s(s: &[i16], at: usize) -> [i32; 8] {
    assert_eq!(
        at % 8,
        0,
        "a 16-byte load at a short {at} not 16-byte aligned"
    );
    std::array::from_fn(|i| s[at + i] as i32)
}

/// `part_cols`.
fn part_cols(f: WeightFormat, p: usize) -> (usize, Option<usize>) {
    match f {
        WeightFormat::Q8_0 => (16 * p, None),
        WeightFormat::Q4_0
        | WeightFormat::Q4_1
        | WeightFormat::Q5_0
        | WeightFormat::Q5_1
        | WeightFormat::Mxfp4 => (0, Some(16)),
        WeightFormat::Q4K | WeightFormat::Q5K => {
            let (c, h) = (p / 2, p % 2);
            (64 * c + 16 * h, Some(64 * c + 32 + 16 * h))
        }
        WeightFormat::Q6K => {
            let g0 = 8 * (p / 4) + 2 * ((p / 2) % 2) + p % 2;
            (16 * g0, Some(16 * (g0 + 4)))
        }
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => unreachable!("float"),
    }
}

/// One thread's state: `acc[i][j][c]`, `sumi[i][j][c]`.
#[derive(Clone, Copy)]
struct Thread {
    acc: [[[f32; 4]; 4]; 2],
    sumi: [[[i32; 4]; 4]; 2],
}

/// `mmt_body<T>` over the whole grid: `y = x · Wᵀ` (or `y += x · Wᵀ` with `add`) for the
/// repacked quantized `w` and the quantized activations `acts` of `m` rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mmt(
    f: WeightFormat,
    w: &Repacked,
    acts: &Acts,
    m: usize,
    n: usize,
    k: usize,
    y: &mut [f32],
    add: bool,
) {
    let tiles = m.div_ceil(MT_BM);
    for bx in 0..tiles * n.div_ceil(MT_BN) {
        let tile = ((bx % tiles) * MT_BM, (bx / tiles) * MT_BN);
        mmt_block(f, w, acts, m, n, k, y, add, tile);
    }
}

/// One block of `mmt_body<T>`: rows `r0..` (up to `MT_BM`, below `m`) and outputs `o0..` (up
/// to `MT_BN`, below `n`) of `y`, as [`mmt`] says.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mmt_block(
    f: WeightFormat,
    w: &Repacked,
    acts: &Acts,
    m: usize,
    n: usize,
    k: usize,
    y: &mut [f32],
    add: bool,
    (r0, o0): (usize, usize),
) {
    let l = layout(f).expect("quantized");
    let (block, parts) = (l.block, l.parts);
    let kq = block == 256;
    let sb = MT_SK / block;
    let units = MT_BN * sb * parts;
    let sums = if kq { 16 } else { 8 };
    let mins = matches!(f, WeightFormat::Q4K | WeightFormat::Q5K);
    let xs1 = matches!(f, WeightFormat::Q4_1 | WeightFormat::Q5_1);
    let wm1 = xs1 || mins;
    let sl = if sb == 1 { 1 } else { sb + 1 };
    let q6 = f == WeightFormat::Q6K;
    let ks = if q6 { 16 } else { 32 };
    let nb = k / block;
    let mut th = [Thread {
        acc: [[[0.0; 4]; 4]; 2],
        sumi: [[[0; 4]; 4]; 2],
    }; MT_THREADS];
    // Shared memory, poisoned before each stage (below).
    let mut xs = vec![0x5Ai8; MT_BM * MT_LD];
    let mut ws = vec![-0x5Bi8; MT_BN * MT_LD];
    let mut wsc = vec![0x3A5Ai16; MT_BN * 16];
    let mut xsum = vec![-0x25A5i16; MT_BM * 16];
    let mut xpair = vec![0x2A5Ai16; MT_BM * 8];
    // The float scales' poison: a NaN (any term it reaches is NaN).
    let fpoison = f32::from_bits(0x7FC0_5A5A);
    let mut xd = vec![fpoison; MT_BM * sl];
    let mut xa = vec![fpoison; MT_BM * sl];
    let mut wd = vec![fpoison; MT_BN * sl];
    let mut wmn = vec![fpoison; MT_BN * sl];
    for k0 in (0..k).step_by(MT_SK) {
        let b0 = k0 / block;
        xs.fill(0x5A);
        ws.fill(-0x5B);
        wsc.fill(0x3A5A);
        xsum.fill(-0x25A5);
        xpair.fill(0x2A5A);
        xd.fill(fpoison);
        xa.fill(fpoison);
        wd.fill(fpoison);
        wmn.fill(fpoison);
        for it in 0..MT_BM * (MT_SK / 16) / MT_THREADS {
            for t in 0..MT_THREADS {
                let u = it * MT_THREADS + t;
                let (r, c) = (u / (MT_SK / 16), u % (MT_SK / 16));
                let at = r * MT_LD + 16 * c;
                if r0 + r < m && k0 + 16 * c < k {
                    let src = (r0 + r) * k + k0 + 16 * c;
                    xs[at..at + 16].copy_from_slice(&acts.qs[src..src + 16]);
                } else {
                    xs[at..at + 16].fill(0);
                }
            }
        }
        if mins {
            for it in 0..MT_BM * 8 / MT_THREADS {
                for t in 0..MT_THREADS {
                    let u = it * MT_THREADS + t;
                    let (r, sb) = (u / 8, u % 8);
                    let mut v = 0;
                    if r0 + r < m {
                        let sr = (r0 + r) * (k / 16) + b0 * 16 + 2 * sb;
                        v = acts.sums[sr] + acts.sums[sr + 1];
                    }
                    xpair[r * 8 + sb] = v as i16;
                }
            }
        } else if kq
            || matches!(
                f,
                WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0
            )
        {
            for it in 0..MT_BM * sums / MT_THREADS {
                for t in 0..MT_THREADS {
                    let u = it * MT_THREADS + t;
                    let (r, c) = (u / sums, u % sums);
                    let mut v = 0;
                    if kq {
                        if r0 + r < m {
                            v = acts.sums[(r0 + r) * (k / 16) + b0 * 16 + c];
                        }
                    } else if r0 + r < m && b0 + c < nb {
                        v = acts.sums[(r0 + r) * nb + b0 + c];
                    }
                    xsum[r * 16 + c] = v as i16;
                }
            }
        }
        for it in 0..(MT_BM + MT_BN) * sb / MT_THREADS {
            for t in 0..MT_THREADS {
                let u = it * MT_THREADS + t;
                if u < MT_BM * sb {
                    let (r, cb) = (u / sb, u % sb);
                    let b = b0 + cb;
                    let rr = (r0 + r).min(m - 1);
                    xd[r * sl + cb] = if b < nb { acts.d[rr * nb + b] } else { 0.0 };
                    if xs1 {
                        xa[r * sl + cb] = if b < nb { acts.s[rr * nb + b] } else { 0.0 };
                    }
                } else {
                    let (o, cb) = ((u - MT_BM * sb) / sb, u % sb);
                    let b = b0 + cb;
                    let oo = (o0 + o).min(n - 1);
                    let sc = if b < nb {
                        load_wscale(f, w, oo * nb + b)
                    } else {
                        WScale::default()
                    };
                    wd[o * sl + cb] = sc.d;
                    if wm1 {
                        wmn[o * sl + cb] = sc.m;
                    }
                }
            }
        }
        for it in 0..units / MT_THREADS {
            for t in 0..MT_THREADS {
                let u = it * MT_THREADS + t;
                let (o, rem) = (u / (sb * parts), u % (sb * parts));
                let (cb, p) = (rem / parts, rem % parts);
                let b = b0 + cb;
                let live = o0 + o < n && b < nb;
                let wp = if live {
                    unpack(f, w, (o0 + o) * nb + b, p)
                } else {
                    WPart::default()
                };
                let (lo, hi) = part_cols(f, p);
                let dst = o * MT_LD + cb * block;
                wr16(&mut ws, dst + lo, if live { wp.lo } else { [0; 4] });
                if let Some(hi) = hi {
                    wr16(&mut ws, dst + hi, if live { wp.hi } else { [0; 4] });
                }
                let z = |v: i32| (if live { v } else { 0 }) as i16;
                match f {
                    WeightFormat::Q4K | WeightFormat::Q5K if p % 2 == 0 => {
                        let c2 = p;
                        wsc[o * 16 + c2] = z(wp.s0);
                        wsc[o * 16 + c2 + 1] = z(wp.s1);
                        wsc[o * 16 + 8 + c2] = z(wp.m0);
                        wsc[o * 16 + 8 + c2 + 1] = z(wp.m1);
                    }
                    WeightFormat::Q6K => {
                        let g0 = lo / 16;
                        wsc[o * 16 + g0] = z(wp.s0);
                        wsc[o * 16 + g0 + 4] = z(wp.s1);
                    }
                    _ => {}
                }
            }
        }
        // __syncthreads()
        if kq {
            for th in th.iter_mut() {
                th.sumi = [[[0; 4]; 4]; 2];
            }
        }
        for warp in 0..MT_THREADS / WARP {
            let (wm, wn) = (warp >> 1, warp & 1);
            for s in 0..MT_SK / ks {
                if !kq && b0 + s >= nb {
                    break;
                }
                let kk = ks * s;
                let mut a = [[[0i32; 4]; WARP]; 2];
                let mut bq = [[[0i32; 2]; WARP]; 4];
                for lane in 0..WARP {
                    let (g, q) = (lane >> 2, lane & 3);
                    for i in 0..2 {
                        let xr = (32 * wm + 16 * i + g) * MT_LD + kk + 4 * q;
                        a[i][lane][0] = rd32(&xs, xr);
                        a[i][lane][1] = rd32(&xs, xr + 8 * MT_LD);
                        if ks == 32 {
                            a[i][lane][2] = rd32(&xs, xr + 16);
                            a[i][lane][3] = rd32(&xs, xr + 8 * MT_LD + 16);
                        }
                    }
                    for j in 0..4 {
                        let wr = (32 * wn + 8 * j + g) * MT_LD + kk + 4 * q;
                        bq[j][lane][0] = rd32(&ws, wr);
                        if ks == 32 {
                            bq[j][lane][1] = rd32(&ws, wr + 16);
                        }
                    }
                }
                let d: Vec<Vec<[[i32; 4]; WARP]>> = (0..2)
                    .map(|i| (0..4).map(|j| mma(ks, &a[i], &bq[j])).collect())
                    .collect();
                for lane in 0..WARP {
                    let (g, q) = (lane >> 2, lane & 3);
                    let th = &mut th[warp * WARP + lane];
                    if kq {
                        let sc: [[i32; 2]; 4] = std::array::from_fn(|j| {
                            std::array::from_fn(|e| {
                                wsc[(32 * wn + 8 * j + 2 * q + e) * 16 + s] as i32
                            })
                        });
                        let xo: [[i32; 2]; 2] = std::array::from_fn(|i| {
                            std::array::from_fn(|h| {
                                if q6 {
                                    32 * xsum[(32 * wm + 16 * i + g + 8 * h) * 16 + s] as i32
                                } else {
                                    0
                                }
                            })
                        });
                        for i in 0..2 {
                            for j in 0..4 {
                                for c in 0..4 {
                                    th.sumi[i][j][c] +=
                                        sc[j][c & 1] * (d[i][j][lane][c] - xo[i][c >> 1]);
                                }
                            }
                        }
                    } else {
                        let mut dx = [[0f32; 2]; 2];
                        let mut sx = [[0f32; 2]; 2];
                        let mut off = [[0i32; 2]; 2];
                        for i in 0..2 {
                            for h in 0..2 {
                                let rl = 32 * wm + 16 * i + g + 8 * h;
                                dx[i][h] = xd[rl * sl + s];
                                if xs1 {
                                    sx[i][h] = xa[rl * sl + s];
                                }
                                off[i][h] = match f {
                                    WeightFormat::Q4_0 => 8 * xsum[rl * 16 + s] as i32,
                                    WeightFormat::Q5_0 => 16 * xsum[rl * 16 + s] as i32,
                                    _ => 0,
                                };
                            }
                        }
                        let wsv: [[WScale; 2]; 4] = std::array::from_fn(|j| {
                            std::array::from_fn(|e| {
                                let ol = 32 * wn + 8 * j + 2 * q + e;
                                WScale {
                                    d: wd[ol * sl + s],
                                    m: if wm1 { wmn[ol * sl + s] } else { 0.0 },
                                }
                            })
                        });
                        for i in 0..2 {
                            for j in 0..4 {
                                for c in 0..4 {
                                    let term = block_expr(
                                        f,
                                        wsv[j][c & 1],
                                        d[i][j][lane][c] - off[i][c >> 1],
                                        0,
                                        dx[i][c >> 1],
                                        sx[i][c >> 1],
                                    );
                                    th.acc[i][j][c] += term;
                                }
                            }
                        }
                    }
                }
            }
            if kq {
                for lane in 0..WARP {
                    let (g, q) = (lane >> 2, lane & 3);
                    let th = &mut th[warp * WARP + lane];
                    let mut dx = [[0f32; 2]; 2];
                    let mut px = [[[0i32; 8]; 2]; 2];
                    for i in 0..2 {
                        for h in 0..2 {
                            let rl = 32 * wm + 16 * i + g + 8 * h;
                            dx[i][h] = xd[rl];
                            if mins {
                                px[i][h] = ld8s(&xpair, rl * 8);
                            }
                        }
                    }
                    for j in 0..4 {
                        for e in 0..2 {
                            let ol = 32 * wn + 8 * j + 2 * q + e;
                            let wv = WScale {
                                d: wd[ol],
                                m: if wm1 { wmn[ol] } else { 0.0 },
                            };
                            let mn = if mins {
                                ld8s(&wsc, ol * 16 + 8)
                            } else {
                                [0; 8]
                            };
                            for i in 0..2 {
                                for h in 0..2 {
                                    let c = 2 * h + e;
                                    let mut summ = 0i32;
                                    if mins {
                                        for sb in 0..8 {
                                            summ += mn[sb] * px[i][h][sb];
                                        }
                                    }
                                    let term =
                                        block_expr(f, wv, th.sumi[i][j][c], summ, dx[i][h], 0.0);
                                    th.acc[i][j][c] += term;
                                }
                            }
                        }
                    }
                }
            }
        }
        // __syncthreads()
    }
    for warp in 0..MT_THREADS / WARP {
        let (wm, wn) = (warp >> 1, warp & 1);
        for lane in 0..WARP {
            let (g, q) = (lane >> 2, lane & 3);
            let th = &th[warp * WARP + lane];
            for i in 0..2 {
                for j in 0..4 {
                    for c in 0..4 {
                        let r = r0 + 32 * wm + 16 * i + g + 8 * (c >> 1);
                        let o = o0 + 32 * wn + 8 * j + 2 * q + (c & 1);
                        if r < m && o < n {
                            let yo = &mut y[r * n + o];
                            *yo = if add {
                                *yo + th.acc[i][j][c]
                            } else {
                                th.acc[i][j][c]
                            };
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::emulate::quantize;
    use super::super::emulate::tests::{bits, quantized, QUANTIZED};
    use super::*;
    use crate::model::quant::tests::noise;
    use crate::model::quant::Stored;

    /// The fragment layouts are bijections: every element of A (16 × k), B (k × 8) and D
    /// (16 × 8) is held by exactly one (lane, register byte).
    #[test]
    fn fragment_layouts_cover_each_element_once() {
        for k in [16, 32] {
            let mut a = vec![0; 16 * k];
            let mut b = vec![0; k * 8];
            let mut d = [0; 16 * 8];
            for lane in 0..WARP {
                for i in 0..k / 2 {
                    let (r, c) = a_elem(k, lane, i);
                    a[r * k + c] += 1;
                }
                for i in 0..k / 4 {
                    let (r, c) = b_elem(k, lane, i);
                    b[r * 8 + c] += 1;
                }
                for i in 0..4 {
                    let (r, c) = d_elem(lane, i);
                    d[r * 8 + c] += 1;
                }
            }
            assert!(a.iter().chain(&b).chain(&d).all(|&c| c == 1), "k = {k}");
        }
    }

    /// The emulated MMA is the integer matrix product (registers filled from known matrices by
    /// the layouts).
    #[test]
    fn emulated_mma_multiplies() {
        for k in [16, 32] {
            let av = |r: usize, c: usize| ((r * 37 + c * 11) % 255) as i32 - 128;
            let bv = |r: usize, c: usize| ((r * 13 + c * 29 + 7) % 255) as i32 - 127;
            let mut a = [[0i32; 4]; WARP];
            let mut b = [[0i32; 2]; WARP];
            for lane in 0..WARP {
                for i in 0..k / 2 {
                    let (r, c) = a_elem(k, lane, i);
                    a[lane][i / 4] |= ((av(r, c) as u8 as u32) << (8 * (i % 4))) as i32;
                }
                for i in 0..k / 4 {
                    let (r, c) = b_elem(k, lane, i);
                    b[lane][i / 4] |= ((bv(r, c) as u8 as u32) << (8 * (i % 4))) as i32;
                }
            }
            let d = mma(k, &a, &b);
            for lane in 0..WARP {
                for i in 0..4 {
                    let (r, c) = d_elem(lane, i);
                    let want: i32 = (0..k).map(|e| av(r, e) * bv(e, c)).sum();
                    assert_eq!(d[lane][i], want, "k {k} lane {lane} reg {i}");
                }
            }
        }
    }

    /// Every quantized type (MXFP4 included): the emulated tensor-core kernel gives
    /// `QWeight::matmul`'s bits,
    /// with the residual epilogue too, at m = 70 (a full and a partial row tile), n = 67 (a
    /// partial output tile), and k with a partial last stage for the blocks of 32 (k = 1120:
    /// 4 stages and 3 blocks); the k-quants at k = 1280 (5 blocks). Activations with a zero
    /// row, ties of magnitude, and a row scaled by 1e6.
    #[test]
    fn tensor_core_kernel_equals_the_cpu_matmul() {
        let (m, n) = (70, 67);
        for dtype in QUANTIZED {
            let k = if dtype.is_some_and(|d| d.block_size() == 256) {
                1280
            } else {
                1120
            };
            let w = quantized(dtype, n, k, 29);
            let f = w.format();
            let Stored::Blocks(raw) = w.stored() else {
                panic!("{dtype:?} is quantized")
            };
            let rep = layout(f).expect("quantized").repack(&raw, n, k);
            let mut x: Vec<f32> = noise(78, m * k).iter().map(|v| v * 3.0).collect();
            x[2 * k..3 * k].fill(0.0);
            x[k + 5] = -7.5;
            x[k + 9] = 7.5;
            x[k + 300] = 7.5;
            x[k + 40] = 1e-30;
            for v in &mut x[66 * k..67 * k] {
                *v *= 1e6;
            }
            let mut want = vec![0f32; m * n];
            w.matmul(&x, m, &mut want);
            let acts = quantize(f, &x, m, k);
            let mut got = vec![f32::NAN; m * n];
            mmt(f, &rep, &acts, m, n, k, &mut got, false);
            assert_eq!(bits(&got), bits(&want), "{f:?}");
            // The residual epilogue: y + x · Wᵀ, as the CPU's `x += out`.
            let resid = noise(79, m * n);
            let mut got = resid.clone();
            mmt(f, &rep, &acts, m, n, k, &mut got, true);
            let want_add: Vec<f32> = resid.iter().zip(&want).map(|(r, w)| r + w).collect();
            assert_eq!(bits(&got), bits(&want_add), "{f:?} add");
        }
    }
}
