//! A host emulation of the Mixture-of-Experts kernels of `moe.cu` (`cpu_expf`, `moe_route`,
//! `moe_group`, `gated_act_cpu`, `moe_combine`) and of the sink term of `attn_combine`, line
//! for line: the same loops and the same float operations in the same order. With the
//! matmul emulations (`emulate.rs`) it replays a whole MoE block as `forward.rs` launches it
//! (router matmul, routing, grouping, gather, each routed expert's matmuls, biases and
//! activation, combine; or the grouped launches, `mmqe`, each grouped row by its own
//! expert's weight in one launch per matrix), and its tests check that this equals the CPU's `Moe::route`,
//! `experts` and `combine` bit for bit: routing ties, several rows with different experts,
//! qwen3moe's and gpt-oss's gating, biases and activations, float and quantized experts.

// Index loops as in the CUDA source, so that the two read side by side.
#![allow(clippy::needless_range_loop)]

use super::emulate_mmt::mmt_block;
use super::forward::{gating_code, max_expert_tiles, ExpertLaunch};
use super::kernels::{MT_BM, MT_BN};
use crate::model::arch::{Activation, Gating};
// `CPU_EXP_TABLE` of `moe.cu` spells out the CPU's table.
use crate::model::expf::TABLE;
use crate::model::moe::Moe;
use crate::model::quant::{QWeight, Stored};

use super::emulate::{mmf, mmq, quantize, Acts};
use super::repack::layout;

/// `cpu_expf` (`__fma_rn` is `mul_add`, `__dmul_rn` etc. the plain operations).
pub(crate) fn cpu_expf(x: f32) -> f32 {
    if x < f32::from_bits(0xc2cff1b4) {
        return 0.0;
    }
    if x > f32::from_bits(0x42b17217) {
        return f32::INFINITY;
    }
    let inv_ln2_n = f64::from_bits(0x3ff71547652b82fe) * 32.0;
    let shift = f64::from_bits(0x4338000000000000);
    let c0 = f64::from_bits(0x3fac6af84b912394) / 32768.0;
    let c1 = f64::from_bits(0x3fcebfce50fac4f3) / 1024.0;
    let c2 = f64::from_bits(0x3fe62e42ff0c52d6) / 32.0;
    let xd = x as f64;
    let kd = inv_ln2_n.mul_add(xd, shift);
    let ki = kd.to_bits();
    let kd = kd - shift;
    let r = inv_ln2_n.mul_add(xd, -kd);
    let s = f64::from_bits(TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
    let z = c0.mul_add(r, c1);
    let r2 = r * r;
    let y = c2.mul_add(r, 1.0);
    (z.mul_add(r2, y) * s) as f32
}

/// `cpu_softmax`.
fn cpu_softmax(x: &mut [f32]) {
    let mut mx = f32::NEG_INFINITY;
    for v in x.iter() {
        mx = mx.max(*v);
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = cpu_expf(*v - mx);
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `total_key`.
fn total_key(v: f32) -> i32 {
    let k = v.to_bits() as i32;
    k ^ (((k >> 31) as u32) >> 1) as i32
}

/// `cpu_sigmoid`.
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + cpu_expf(-x))
}

/// `keep_best_groups`.
fn keep_best_groups(sel: &mut [f32], groups: usize, best: usize) {
    let per = sel.len() / groups;
    let mut score = vec![0f32; groups];
    let mut kept = vec![false; groups];
    for g in 0..groups {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for i in 0..per {
            let v = sel[g * per + i];
            if total_key(v) > total_key(a) {
                b = a;
                a = v;
            } else if total_key(v) > total_key(b) {
                b = v;
            }
        }
        score[g] = a + b;
    }
    for _ in 0..best {
        let (mut top, mut tk) = (usize::MAX, 0i32);
        for g in 0..groups {
            if kept[g] {
                continue;
            }
            let k = total_key(score[g]);
            if top == usize::MAX || k > tk {
                top = g;
                tk = k;
            }
        }
        kept[top] = true;
    }
    for g in 0..groups {
        if !kept[g] {
            sel[g * per..(g + 1) * per].fill(f32::NEG_INFINITY);
        }
    }
}

/// DeepSeek's routing arguments of `moe_route`: the selection bias, `(groups, best)` (none:
/// no groups) and the weights' scale.
#[derive(Clone, Copy)]
pub(crate) struct Selection<'a> {
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) groups: Option<(usize, usize)>,
    pub(crate) scale: f32,
}

impl<'a> Selection<'a> {
    /// `moe`'s.
    pub(crate) fn of(moe: &'a Moe) -> Selection<'a> {
        Selection {
            bias: moe.selection_bias.as_deref(),
            groups: moe.config.groups,
            scale: moe.config.weights_scale,
        }
    }
}

/// `moe_route` over its grid (one thread per row, rows independent): `logits` in place,
/// returns each row's experts and weights in rank order.
pub(crate) fn route(
    logits: &mut [f32],
    bias: Option<&[f32]>,
    rows: usize,
    experts: usize,
    used: usize,
    gating: i32,
    sel: Selection<'_>,
) -> (Vec<i32>, Vec<f32>) {
    let mut chosen = vec![i32::MIN; rows * used];
    let mut weights = vec![f32::NAN; rows * used];
    let mut select = vec![f32::NAN; rows * experts];
    for r in 0..rows {
        let p = &mut logits[r * experts..(r + 1) * experts];
        if let Some(b) = bias {
            for e in 0..experts {
                p[e] += b[e];
            }
        }
        let deepseek = gating >= 3;
        let normalize = gating == 1 || (deepseek && (gating - 3) % 2 == 1);
        if gating >= 5 {
            for e in 0..experts {
                p[e] = sigmoid(p[e]);
            }
        } else if gating != 2 {
            cpu_softmax(p);
        }
        let rk: &[f32] = if deepseek {
            let s = &mut select[r * experts..(r + 1) * experts];
            for e in 0..experts {
                s[e] = match sel.bias {
                    Some(b) => p[e] + b[e],
                    None => p[e],
                };
            }
            if let Some((groups, best)) = sel.groups {
                keep_best_groups(s, groups, best);
            }
            s
        } else {
            p
        };
        let ch = &mut chosen[r * used..(r + 1) * used];
        let w = &mut weights[r * used..(r + 1) * used];
        for j in 0..used {
            let (mut top, mut tk) = (-1i32, 0i32);
            for e in 0..experts {
                let taken = ch[..j].contains(&(e as i32));
                if taken {
                    continue;
                }
                let k = total_key(rk[e]);
                if top < 0 || k > tk {
                    top = e as i32;
                    tk = k;
                }
            }
            ch[j] = top;
            w[j] = p[top as usize];
        }
        if gating == 2 {
            cpu_softmax(w);
        }
        if normalize {
            let mut sum = 0f64;
            for j in 0..used {
                sum += w[j] as f64;
            }
            let s = (sum as f32).max(1.0 / 16384.0);
            for j in 0..used {
                w[j] /= s;
            }
        }
        if deepseek && sel.scale != 1.0 {
            for j in 0..used {
                w[j] *= sel.scale;
            }
        }
    }
    (chosen, weights)
}

/// What `moe_group` writes: each grouped position's row (`idx`), each (row, rank)'s grouped
/// position (`slot`), each expert's row count (`counts`), each grouped position's expert
/// (`gexp`).
pub(crate) struct Grouping {
    pub(crate) idx: Vec<i32>,
    pub(crate) slot: Vec<i32>,
    pub(crate) counts: Vec<i32>,
    pub(crate) gexp: Vec<i32>,
}

/// `moe_group`'s one block: thread e's count, then (after the barrier) its offset and list.
pub(crate) fn group(chosen: &[i32], used: usize, experts: usize) -> Grouping {
    let pairs = chosen.len();
    let mut idx = vec![i32::MIN; pairs];
    let mut slot = vec![i32::MIN; pairs];
    let mut gexp = vec![i32::MIN; pairs];
    let mut counts = vec![i32::MIN; experts];
    let n_of: Vec<i32> = (0..experts)
        .map(|e| chosen.iter().filter(|&&c| c == e as i32).count() as i32)
        .collect();
    for e in 0..experts {
        let mut g: i32 = n_of[..e].iter().sum();
        counts[e] = n_of[e];
        for i in 0..pairs {
            if chosen[i] != e as i32 {
                continue;
            }
            idx[g as usize] = (i / used) as i32;
            slot[i] = g;
            gexp[g as usize] = e as i32;
            g += 1;
        }
    }
    Grouping {
        idx,
        slot,
        counts,
        gexp,
    }
}

/// `Gpu::matmul_experts` as the emulated kernels compute it: the `rows` grouped rows of `x`
/// quantized at once, then `mmqe`'s block row `p`: one row of the dp4a kernel (`mmq` with a
/// row tile of 1) on the weight of expert `gexp[p]`, its activations, scales and sums taken
/// at the kernel's offsets for row `p`.
pub(crate) fn matmul_experts(ws: &[&QWeight], gexp: &[i32], x: &[f32], rows: usize) -> Vec<f32> {
    let (n, k, f) = (ws[0].rows(), ws[0].cols(), ws[0].format());
    let l = layout(f).expect("a quantized weight");
    let acts = quantize(f, x, rows, k);
    // mmqe_body's offsets: k quants, nb scales (and Q8_1 sums), nb · (16 or 1) integer sums.
    let nb = k / l.block;
    let sums = nb * if l.block == 256 { 16 } else { 1 };
    let mut y = vec![f32::NAN; rows * n];
    for p in 0..rows {
        let w = ws[gexp[p] as usize];
        let Stored::Blocks(raw) = w.stored() else {
            panic!("a quantized weight")
        };
        let rep = l.repack(&raw, n, k);
        let row = Acts {
            qs: acts.qs[p * k..(p + 1) * k].to_vec(),
            d: acts.d[p * nb..(p + 1) * nb].to_vec(),
            s: match acts.s.is_empty() {
                true => Vec::new(),
                false => acts.s[p * nb..(p + 1) * nb].to_vec(),
            },
            sums: acts.sums[p * sums..(p + 1) * sums].to_vec(),
        };
        y[p * n..(p + 1) * n].copy_from_slice(&mmq(f, &rep, &row, 1, n, k, 1));
    }
    y
}

/// `moe_tiles`: for each expert in order with rows (its segment after the earlier experts'),
/// a tile every `tile_rows` of them, (expert, segment start, segment rows, first row in the
/// segment); `max_tiles` entries, the rest with 0 rows.
pub(crate) fn moe_tiles(counts: &[i32], tile_rows: usize, max_tiles: usize) -> Vec<[i32; 4]> {
    let mut tiles = Vec::with_capacity(max_tiles);
    let mut start = 0;
    for (e, &n) in counts.iter().enumerate() {
        for r0 in (0..n as usize).step_by(tile_rows) {
            if tiles.len() < max_tiles {
                tiles.push([e as i32, start, n, r0 as i32]);
            }
        }
        start += n;
    }
    tiles.resize(max_tiles, [0; 4]);
    tiles
}

/// `mmte_<type>` over its grid (tiles × output tiles): the grouped `rows` at `x`, each times
/// the weight in `ws` of its expert, a block per row tile of one expert in `tiles` and
/// slice of outputs, `mmt_body` on the expert's segment (`mmte_body`'s offsets).
pub(crate) fn matmul_expert_tiles(
    ws: &[&QWeight],
    tiles: &[[i32; 4]],
    x: &[f32],
    rows: usize,
) -> Vec<f32> {
    let (n, k, f) = (ws[0].rows(), ws[0].cols(), ws[0].format());
    let l = layout(f).expect("a quantized weight");
    let acts = quantize(f, x, rows, k);
    let nb = k / l.block;
    let sums = nb * if l.block == 256 { 16 } else { 1 };
    let reps: Vec<_> = (ws.iter())
        .map(|w| match w.stored() {
            Stored::Blocks(raw) => l.repack(&raw, n, k),
            _ => panic!("a quantized weight"),
        })
        .collect();
    let mut y = vec![f32::NAN; rows * n];
    for by in 0..n.div_ceil(MT_BN) {
        for &[e, start, seg, r0] in tiles {
            if seg == 0 {
                continue;
            }
            let [e, start, seg, r0] = [e, start, seg, r0].map(|v| v as usize);
            let part = |v: &[f32], per: usize| match v.is_empty() {
                true => Vec::new(),
                false => v[start * per..(start + seg) * per].to_vec(),
            };
            let seg_acts = Acts {
                qs: acts.qs[start * k..(start + seg) * k].to_vec(),
                d: part(&acts.d, nb),
                s: part(&acts.s, nb),
                sums: match acts.sums.is_empty() {
                    true => Vec::new(),
                    false => acts.sums[start * sums..(start + seg) * sums].to_vec(),
                },
            };
            let y_seg = &mut y[start * n..(start + seg) * n];
            mmt_block(
                f,
                &reps[e],
                &seg_acts,
                seg,
                n,
                k,
                y_seg,
                false,
                (r0, by * MT_BN),
            );
        }
    }
    y
}

/// `__fsub_rn`.
fn sub(a: f32, b: f32) -> f32 {
    a - b
}

/// `gated_act_cpu` (act 0 SwiGLU-OAI, 1 SiLU).
pub(crate) fn gated_cpu(g: &mut [f32], u: &[f32], act: i32) {
    for i in 0..g.len() {
        let (mut v, mut uu) = (g[i], u[i]);
        if act == 0 {
            v = v.min(7.0);
            let e = cpu_expf(sub(1.702f32 * -v, 0.0));
            // The kernel's two comparisons: NaN stays NaN, as `clamp`.
            uu = uu.clamp(-7.0, 7.0);
            g[i] = v / (1.0 + e) * (uu + 1.0);
        } else {
            let e = cpu_expf(sub(-v, 0.0));
            g[i] = v / (1.0 + e) * uu;
        }
    }
}

/// `moe_combine`.
pub(crate) fn combine(
    out: &[f32],
    slot: &[i32],
    w: &[f32],
    used: usize,
    dim: usize,
    rows: usize,
) -> Vec<f32> {
    let mut xb = vec![f32::NAN; rows * dim];
    for i in 0..rows * dim {
        let (r, c) = (i / dim, i % dim);
        let mut acc = 0f32;
        for k in 0..used {
            let v = out[slot[r * used + k] as usize * dim + c] * w[r * used + k];
            acc = if k == 0 { v } else { acc + v };
        }
        xb[i] = acc;
    }
    xb
}

/// `x += b` per row (`add_bias`).
fn add_bias(x: &mut [f32], b: &[f32]) {
    let width = b.len();
    for (i, v) in x.iter_mut().enumerate() {
        *v += b[i % width];
    }
}

/// `Gpu::matmul_into` on `m` rows as the emulated kernels compute it (the dp4a or float
/// kernel in the row tile it launches; the tensor-core kernel gives the same bits).
pub(crate) fn matmul(w: &QWeight, x: &[f32], m: usize) -> Vec<f32> {
    let (n, k) = (w.rows(), w.cols());
    let mr = if m == 1 { 1 } else { 8 };
    match w.stored() {
        Stored::Blocks(raw) => {
            let f = w.format();
            let rep = layout(f).expect("quantized").repack(&raw, n, k);
            mmq(f, &rep, &quantize(f, x, m, k), m, n, k, mr)
        }
        _ => {
            let mut wide = vec![0f32; n * k];
            for (o, row) in wide.chunks_exact_mut(k).enumerate() {
                w.row_f32(o, row);
            }
            mmf(&wide, x, m, n, k, mr)
        }
    }
}

/// One MoE block as `forward.rs` launches it on the rows `xb` (the ffn norm's output):
/// Route, Experts (a launch per expert) and Combine; the block's output (`xb` after Combine).
pub(crate) fn moe_block(moe: &Moe, act: Activation, xb: &[f32], rows: usize) -> Vec<f32> {
    moe_block_as(moe, act, xb, rows, ExpertLaunch::PerExpert)
}

/// [`moe_block`], the experts' matmuls launched as `how` says: per expert, or grouped row by
/// row (`mmqe`) or in row tiles of one expert (`moe_tiles`, `mmte`), for quantized experts of
/// one layout, as `GroupedExperts::of` requires; biases and output scales by each row's
/// expert.
pub(crate) fn moe_block_as(
    moe: &Moe,
    act: Activation,
    xb: &[f32],
    rows: usize,
    how: ExpertLaunch,
) -> Vec<f32> {
    let c = moe.config;
    let (experts, used, ffn) = (c.experts, c.used, c.ffn_dim);
    let dim = moe.router.cols();
    let mut logits = matmul(&moe.router, xb, rows);
    let (chosen, weights) = route(
        &mut logits,
        moe.router_bias.as_deref(),
        rows,
        experts,
        used,
        gating_code(c.gating),
        Selection::of(moe),
    );
    let Grouping {
        idx,
        slot,
        counts,
        gexp,
    } = group(&chosen, used, experts);
    let pairs = rows * used;
    let mut input = vec![f32::NAN; pairs * dim];
    for g in 0..pairs {
        let r = idx[g] as usize;
        input[g * dim..(g + 1) * dim].copy_from_slice(&xb[r * dim..(r + 1) * dim]);
    }
    let code = match act {
        Activation::SwigluOai => 0,
        Activation::Silu => 1,
        _ => panic!("no GPU kernel for {act:?} experts"),
    };
    if how != ExpertLaunch::PerExpert {
        let ws = |f: fn(&crate::model::moe::Expert) -> &QWeight| -> Vec<&QWeight> {
            moe.experts.iter().map(f).collect()
        };
        let tiles = moe_tiles(&counts, MT_BM, max_expert_tiles(pairs, experts));
        let matmul_experts = |ws: &[&QWeight], gexp: &[i32], x: &[f32], rows: usize| match how {
            ExpertLaunch::Tiles => matmul_expert_tiles(ws, &tiles, x, rows),
            _ => matmul_experts(ws, gexp, x, rows),
        };
        // `add_bias_experts`: each grouped row plus its own expert's bias `i`.
        let bias = |x: &mut [f32], i: usize| {
            let width = x.len() / pairs;
            for (p, row) in x.chunks_exact_mut(width).enumerate() {
                if let Some(b) = &moe.experts[gexp[p] as usize].bias {
                    add_bias(row, &b[i]);
                }
            }
        };
        let mut gate = matmul_experts(&ws(|x| &x.gate), &gexp, &input, pairs);
        let mut up = matmul_experts(&ws(|x| &x.up), &gexp, &input, pairs);
        bias(&mut up, 1);
        bias(&mut gate, 0);
        assert_eq!(gate.len(), pairs * ffn);
        gated_cpu(&mut gate, &up, code);
        let mut out = matmul_experts(&ws(|x| &x.down), &gexp, &gate, pairs);
        // `scale_experts`: each grouped row times its own expert's output scale.
        if let Some(s) = &moe.down_scale {
            for (p, row) in out.chunks_exact_mut(dim).enumerate() {
                row.iter_mut().for_each(|v| *v *= s[gexp[p] as usize]);
            }
        }
        bias(&mut out, 2);
        return combine(&out, &slot, &weights, used, dim, rows);
    }
    let mut out = vec![f32::NAN; pairs * dim];
    let mut off = 0;
    for (e, x) in moe.experts.iter().enumerate() {
        let n = counts[e] as usize;
        if n == 0 {
            continue;
        }
        let xi = &input[off * dim..(off + n) * dim];
        let mut gate = matmul(&x.gate, xi, n);
        let mut up = matmul(&x.up, xi, n);
        if let Some([bg, bu, _]) = &x.bias {
            add_bias(&mut up, bu);
            add_bias(&mut gate, bg);
        }
        assert_eq!(gate.len(), n * ffn);
        gated_cpu(&mut gate, &up, code);
        let mut down = matmul(&x.down, &gate, n);
        // `scale` by the expert's output scale (Gemma 4), before the bias.
        if let Some(s) = &moe.down_scale {
            down.iter_mut().for_each(|v| *v *= s[e]);
        }
        if let Some([_, _, bd]) = &x.bias {
            add_bias(&mut down, bd);
        }
        out[off * dim..(off + n) * dim].copy_from_slice(&down);
        off += n;
    }
    assert_eq!(off, pairs);
    combine(&out, &slot, &weights, used, dim, rows)
}

/// `attn_combine` for one row and head: chunk partials `(max, sum, acc)` (a sum of 0 marks
/// an empty chunk), the head's sink; the head's output. `expf` and `fmaf` as the device's
/// (here `exp` and `mul_add`: the device's `expf` is not the CPU's, so this checks the
/// structure, and its test compares with tolerance).
pub(crate) fn attn_combine(parts: &[(f32, f32, Vec<f32>)], sink: Option<f32>) -> Vec<f32> {
    let mut mx = f32::NEG_INFINITY;
    for (m, l, _) in parts {
        if *l > 0.0 && *m > mx {
            mx = *m;
        }
    }
    if let Some(s) = sink {
        if s > mx {
            mx = s;
        }
    }
    let hd = parts[0].2.len();
    let mut acc = vec![0f32; hd];
    let mut l = 0f32;
    for (m, pl, pa) in parts {
        if *pl <= 0.0 || pl.is_nan() {
            continue;
        }
        let f = (m - mx).exp();
        l = pl.mul_add(f, l);
        for i in 0..hd {
            acc[i] = pa[i].mul_add(f, acc[i]);
        }
    }
    if let Some(s) = sink {
        l += (s - mx).exp();
    }
    let inv = 1.0 / l;
    acc.iter().map(|a| a * inv).collect()
}

#[cfg(test)]
mod tests {
    use super::super::emulate::tests::{bits, quantized};
    use super::*;
    use crate::model::arch::MoeConfig;
    use crate::model::expf::exp_f32;
    use crate::model::moe::{Expert, MoeScratch};
    use crate::model::quant::tests::noise;
    use candle_core::quantized::GgmlDType;

    /// The kernels' `expf` is the CPU's `exp_f32`, bit for bit, across its range and edges.
    #[test]
    fn cpu_expf_equals_the_cpu() {
        let mut xs: Vec<f32> = noise(5, 20000).iter().map(|v| v * 120.0).collect();
        xs.extend([
            0.0,
            -0.0,
            1.0,
            -1.0,
            88.72,
            -103.97,
            -87.3,
            f32::from_bits(0xc2cff1b4),
            f32::from_bits(0x42b17217),
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
        ]);
        for x in xs {
            assert_eq!(cpu_expf(x).to_bits(), exp_f32(x).to_bits(), "{x}");
        }
    }

    /// Ties rank the lower expert first; a row of equal logits chooses experts 0, 1, ...;
    /// -0.0 ranks below 0.0 (the CPU's `total_cmp`).
    #[test]
    fn routing_ties_go_to_the_lower_expert() {
        const NONE: Selection = Selection {
            bias: None,
            groups: None,
            scale: 1.0,
        };
        let mut l = vec![
            0.1, 0.5, 0.2, 0.5, 0.7, 1.0, 1.0, 1.0, 1.0, 0.3, -0.0, 0.0, 0.3, 0.0,
        ];
        let (ch, _) = route(&mut l[..5], None, 1, 5, 3, 2, NONE);
        assert_eq!(ch, [4, 1, 3]);
        let (ch, w) = route(&mut l[5..9], None, 1, 4, 3, 0, NONE);
        assert_eq!(ch, [0, 1, 2]);
        assert_eq!(w, [0.25; 3]);
        let (ch, _) = route(&mut l[9..14], None, 1, 5, 3, 2, NONE);
        assert_eq!(ch, [0, 3, 2]);
    }

    /// The row tiles of one expert: a tile every 64 rows of each segment, segments in expert
    /// order after the earlier experts' rows, none for an expert without rows, 0 rows past
    /// the last; the bound holds every tile of any counts.
    #[test]
    fn expert_tiles_cover_each_segment() {
        let counts = [130, 0, 64, 1, 65];
        let pairs: i32 = counts.iter().sum();
        let max = max_expert_tiles(pairs as usize, counts.len());
        let tiles = moe_tiles(&counts, 64, max);
        assert_eq!(tiles.len(), max);
        let want = [
            [0, 0, 130, 0],
            [0, 0, 130, 64],
            [0, 0, 130, 128],
            [2, 130, 64, 0],
            [3, 194, 1, 0],
            [4, 195, 65, 0],
            [4, 195, 65, 64],
        ];
        assert_eq!(&tiles[..want.len()], &want);
        assert!(tiles[want.len()..].iter().all(|t| t[2] == 0));
        // The bound: ceil(pairs / 64) + one partial tile per expert with rows.
        for counts in [vec![1; 128], vec![65; 7], vec![0, 64, 0, 64], vec![300]] {
            let pairs: i32 = counts.iter().sum();
            let need: usize = counts.iter().map(|&n| (n as usize).div_ceil(64)).sum();
            assert!(
                need <= max_expert_tiles(pairs as usize, counts.len()),
                "{counts:?}"
            );
        }
    }

    /// Grouping lists each expert's (row, rank) pairs in row order, experts in index order,
    /// and `slot` inverts `idx`.
    #[test]
    fn grouping_is_by_expert_then_row() {
        let chosen = [2, 0, 0, 1, 2, 1, 3, 0];
        let Grouping {
            idx,
            slot,
            counts,
            gexp,
        } = group(&chosen, 2, 5);
        assert_eq!(counts, [3, 2, 2, 1, 0]);
        assert_eq!(idx, [0, 1, 3, 1, 2, 0, 2, 3]);
        assert_eq!(gexp, [0, 0, 0, 1, 1, 2, 2, 3]);
        for (i, &s) in slot.iter().enumerate() {
            assert_eq!(idx[s as usize], (i / 2) as i32);
            assert_eq!(gexp[s as usize], chosen[i]);
        }
    }

    /// A MoE block of `experts` experts of `dtype` (MXFP4 for `None`; `dim` × `ffn`), the
    /// router F32 with rows 1, 3 and 4 equal (routing ties); with gpt-oss's biases when
    /// `biases`.
    fn moe(
        dtype: Option<GgmlDType>,
        dim: usize,
        ffn: usize,
        experts: usize,
        used: usize,
        gating: Gating,
        biases: bool,
    ) -> Moe {
        let mut r = noise(1, experts * dim);
        for e in [3, 4] {
            let row: Vec<f32> = r[dim..2 * dim].to_vec();
            r[e * dim..(e + 1) * dim].copy_from_slice(&row);
        }
        let mut rb = noise(2, experts);
        (rb[3], rb[4]) = (rb[1], rb[1]);
        let b =
            |seed: u64, n: usize| -> Vec<f32> { noise(seed, n).iter().map(|v| v * 0.1).collect() };
        Moe {
            router: QWeight::from_f32(experts, dim, r),
            router_bias: biases.then_some(rb),
            selection_bias: None,
            experts: (0..experts as u64)
                .map(|e| Expert {
                    gate: quantized(dtype, ffn, dim, 10 + e),
                    up: quantized(dtype, ffn, dim, 20 + e),
                    down: quantized(dtype, dim, ffn, 30 + e),
                    bias: biases.then(|| [b(40 + e, ffn), b(50 + e, ffn), b(60 + e, dim)]),
                })
                .collect(),
            config: MoeConfig {
                experts,
                used,
                ffn_dim: ffn,
                gating,
                shared_ffn: None,
                shared_gated: true,
                dense_lead: 0,
                groups: None,
                weights_scale: 1.0,
            },
            shared: None,
            down_scale: None,
            beside: None,
        }
    }

    /// The CPU's block: route, experts, combine.
    fn cpu(moe: &Moe, act: Activation, x: &[f32], rows: usize) -> Vec<f32> {
        let mut s = MoeScratch::default();
        let mut xb = x.to_vec();
        moe.route(&xb, rows, &mut s);
        moe.experts(act, &xb, rows, &mut s);
        moe.combine(&mut xb, rows, &s);
        xb
    }

    /// The emulated GPU block equals the CPU's bits on batches of 1 and 9 rows (a zero row:
    /// every logit tied; the router's equal rows: ties among the top experts), for
    /// qwen3moe's and Mixtral's gating with SiLU and gpt-oss's with its biases and
    /// SwiGLU-OAI, in a float, a 32-block and a k-quant format and in MXFP4 (gpt-oss's
    /// experts as published), with per-expert output scales (Gemma 4's) on three of them; the
    /// rows use several different experts and the tie rule decides some of them. Where the
    /// experts take the grouped launches (quantized: Q8_0, Q4_K, Q4_1 with its Q8_1 sums,
    /// Q6_K and MXFP4, with output scales, gpt-oss's biases on Q8_0, Q4_0 and MXFP4 here),
    /// those give the same bits, row by row and in row tiles of one expert (on 150 rows too:
    /// segments of several tiles, partial ones).
    #[test]
    fn the_emulated_moe_block_equals_the_cpu() {
        let cases = [
            (
                Some(GgmlDType::Q4_1),
                64,
                96,
                Gating::SoftmaxTopK { normalize: true },
                Activation::Silu,
                false,
            ),
            (
                Some(GgmlDType::Q6K),
                256,
                256,
                Gating::SoftmaxTopK { normalize: true },
                Activation::Silu,
                false,
            ),
            (
                None,
                64,
                96,
                Gating::SoftmaxTopK { normalize: true },
                Activation::Silu,
                false,
            ),
            (
                Some(GgmlDType::F32),
                64,
                96,
                Gating::SoftmaxTopK { normalize: true },
                Activation::Silu,
                false,
            ),
            (
                Some(GgmlDType::Q8_0),
                64,
                96,
                Gating::SoftmaxTopK { normalize: false },
                Activation::Silu,
                false,
            ),
            (
                Some(GgmlDType::Q4K),
                256,
                256,
                Gating::SoftmaxTopK { normalize: true },
                Activation::Silu,
                false,
            ),
            (
                Some(GgmlDType::Q8_0),
                64,
                64,
                Gating::TopKSoftmax,
                Activation::SwigluOai,
                true,
            ),
            (
                Some(GgmlDType::Q4_0),
                64,
                96,
                Gating::TopKSoftmax,
                Activation::SwigluOai,
                true,
            ),
            (
                None,
                64,
                96,
                Gating::TopKSoftmax,
                Activation::SwigluOai,
                true,
            ),
        ];
        let (experts, used, rows) = (6, 2, 9);
        let mut grouped = 0;
        for (dtype, dim, ffn, gating, act, biases) in cases {
            let mut m = moe(dtype, dim, ffn, experts, used, gating, biases);
            // Per-expert output scales (Gemma 4's), on the float case, a k-quant and one with
            // biases (scaled before the bias).
            let scaled = [Some(GgmlDType::F32), Some(GgmlDType::Q6K)];
            if scaled.contains(&dtype) || (dtype.is_none() && biases) {
                m.down_scale = Some(noise(7, experts).iter().map(|v| 1.0 + v).collect());
            }
            let mut x: Vec<f32> = noise(99, rows * dim).iter().map(|v| v * 2.0).collect();
            x[2 * dim..3 * dim].fill(0.0);
            let what = format!("{:?} {gating:?} {act:?}", m.experts[0].gate.format());
            // The routing the block used: several experts, and ties decided.
            let mut logits = matmul(&m.router, &x, rows);
            let (chosen, _) = route(
                &mut logits,
                m.router_bias.as_deref(),
                rows,
                experts,
                used,
                gating_code(gating),
                Selection::of(&m),
            );
            let distinct = (0..experts as i32).filter(|e| chosen.contains(e)).count();
            assert!(distinct >= 4, "{what}: experts used {chosen:?}");
            // Experts 1, 3 and 4 always tie: 4 is never chosen, 3 only after 1 (a tie).
            assert!(
                !chosen.contains(&4) && chosen.contains(&3),
                "{what}: {chosen:?}"
            );
            let want = cpu(&m, act, &x, rows);
            let got = moe_block(&m, act, &x, rows);
            assert_eq!(bits(&got), bits(&want), "{what}, {rows} rows");
            for r in [0, 2, 5] {
                let xr = &x[r * dim..(r + 1) * dim];
                let got = moe_block(&m, act, xr, 1);
                assert_eq!(
                    bits(&got),
                    bits(&want[r * dim..(r + 1) * dim]),
                    "{what}, row {r}"
                );
            }
            if dtype == Some(GgmlDType::F32) {
                continue;
            }
            grouped += 1;
            for how in [ExpertLaunch::Rows, ExpertLaunch::Tiles] {
                let got = moe_block_as(&m, act, &x, rows, how);
                assert_eq!(bits(&got), bits(&want), "{what}, {how:?}, {rows} rows");
                let got = moe_block_as(&m, act, &x[2 * dim..3 * dim], 1, how);
                assert_eq!(
                    bits(&got),
                    bits(&want[2 * dim..3 * dim]),
                    "{what}, {how:?}, row 2"
                );
            }
            // Tiles past the first of an expert's segment, and partial ones: 150 rows.
            let big = 150;
            let xb: Vec<f32> = noise(98, big * dim).iter().map(|v| v * 2.0).collect();
            let got = moe_block_as(&m, act, &xb, big, ExpertLaunch::Tiles);
            assert_eq!(
                bits(&got),
                bits(&cpu(&m, act, &xb, big)),
                "{what}, tiles, {big} rows"
            );
        }
        assert_eq!(grouped, 8, "cases on the grouped launches");
    }

    /// DeepSeek's router in the emulated block equals the CPU's bits: sigmoid scores with a
    /// selection bias, 4 groups of 2 experts of which the 2 best are eligible, renormalised
    /// weights times 2.5 (DeepSeek-V3, GLM-4.5); softmax scores without groups, bias or
    /// renormalising (DeepSeek-V2-Lite). On 9 rows and on single rows, in F32 and Q4_K; and
    /// the groups and the bias decide: the experts differ from those of the plain ranking on
    /// some rows, and the weights are the unbiased scores.
    #[test]
    fn the_emulated_deepseek_router_equals_the_cpu() {
        let (experts, used, rows) = (8, 3, 9);
        for (dtype, dim, ffn, sigmoid) in [
            (Some(GgmlDType::F32), 64, 96, true),
            (Some(GgmlDType::Q4K), 256, 256, true),
            (Some(GgmlDType::Q8_0), 64, 96, false),
        ] {
            let gating = Gating::Deepseek {
                sigmoid,
                normalize: sigmoid,
            };
            let mut m = moe(dtype, dim, ffn, experts, used, gating, false);
            if sigmoid {
                m.selection_bias = Some(noise(5, experts).iter().map(|v| v * 0.5).collect());
                m.config.groups = Some((4, 2));
                m.config.weights_scale = 2.5;
            }
            let x: Vec<f32> = noise(98, rows * dim).iter().map(|v| v * 2.0).collect();
            let what = format!("{dtype:?} {gating:?}");
            let mut logits = matmul(&m.router, &x, rows);
            let plain = route(
                &mut logits.clone(),
                None,
                rows,
                experts,
                used,
                gating_code(Gating::SoftmaxTopK { normalize: false }),
                Selection::of(&m),
            );
            let (chosen, weights) = route(
                &mut logits,
                None,
                rows,
                experts,
                used,
                gating_code(gating),
                Selection::of(&m),
            );
            if sigmoid {
                assert_ne!(chosen, plain.0, "{what}: groups and bias change the choice");
                // Normalised, then scaled: each row's weights sum to 2.5.
                for w in weights.chunks(used) {
                    let sum: f32 = w.iter().sum();
                    assert!((sum - 2.5).abs() < 1e-5, "{what}: {w:?}");
                }
            } else {
                assert_eq!(chosen, plain.0, "{what}: softmax ranks as the plain router");
                assert_eq!(bits(&weights), bits(&plain.1), "{what}");
            }
            let want = cpu(&m, Activation::Silu, &x, rows);
            let got = moe_block(&m, Activation::Silu, &x, rows);
            assert_eq!(bits(&got), bits(&want), "{what}, {rows} rows");
            for r in [0, 4, 8] {
                let xr = &x[r * dim..(r + 1) * dim];
                let got = moe_block(&m, Activation::Silu, xr, 1);
                assert_eq!(
                    bits(&got),
                    bits(&want[r * dim..(r + 1) * dim]),
                    "{what}, row {r}"
                );
            }
        }
    }

    /// The emulated activations equal the CPU's `gated` (SwiGLU-OAI's clamps included).
    #[test]
    fn gated_cpu_equals_the_cpu() {
        let mut g: Vec<f32> = noise(3, 1000).iter().map(|v| v * 20.0).collect();
        let u: Vec<f32> = noise(4, 1000).iter().map(|v| v * 20.0).collect();
        g[0] = 7.0;
        g[1] = -90.0;
        for (act, code) in [(Activation::SwigluOai, 0), (Activation::Silu, 1)] {
            let mut want = g.clone();
            crate::model::transformer::gated(act, &mut want, &u);
            let mut got = g.clone();
            gated_cpu(&mut got, &u, code);
            assert_eq!(bits(&got), bits(&want), "{act:?}");
        }
    }

    /// `attn_combine` with a sink: the softmax over the chunks' scores and the sink (f64
    /// reference, within f32 rounding); a sink far below changes nothing, and without one
    /// the result is the sink-free softmax.
    #[test]
    fn attention_sinks_join_the_combine_softmax() {
        let hd = 32;
        let scores: Vec<f32> = noise(8, 40).iter().map(|v| v * 4.0).collect();
        let values: Vec<Vec<f32>> = (0..40).map(|p| noise(100 + p, hd)).collect();
        // Two chunks of 20 positions each, as attn_partial writes them.
        let part = |r: std::ops::Range<usize>| {
            let m = scores[r.clone()]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            let mut l = 0f32;
            let mut acc = vec![0f32; hd];
            for p in r {
                let e = (scores[p] - m).exp();
                l += e;
                for i in 0..hd {
                    acc[i] += e * values[p][i];
                }
            }
            (m, l, acc)
        };
        let parts = [part(0..20), part(20..40)];
        for sink in [None, Some(1.5f32), Some(9.0), Some(-200.0)] {
            let got = attn_combine(&parts, sink);
            let mx = scores
                .iter()
                .map(|&s| s as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            let mx = sink.map_or(mx, |s| mx.max(s as f64));
            let mut l: f64 = scores.iter().map(|&s| (s as f64 - mx).exp()).sum();
            l += sink.map_or(0.0, |s| (s as f64 - mx).exp());
            for i in 0..hd {
                let want: f64 = (0..40)
                    .map(|p| (scores[p] as f64 - mx).exp() * values[p][i] as f64)
                    .sum::<f64>()
                    / l;
                assert!((got[i] as f64 - want).abs() < 1e-5, "{sink:?} {i}");
            }
        }
        assert_eq!(
            bits(&attn_combine(&parts, Some(-200.0))),
            bits(&attn_combine(&parts, None))
        );
        assert_ne!(
            bits(&attn_combine(&parts, Some(1.5))),
            bits(&attn_combine(&parts, None))
        );
    }
}
