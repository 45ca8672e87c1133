//! A host emulation of the hybrid layers' kernels of `deltanet.cu` (`cpu_logf`, `delta_conv`,
//! `delta_prep`, `delta_rule`, `gated_norm`, `out_gate`, `shared_gate`), line for line: the
//! same loops over the same threads and the same float operations in the same order. Its
//! tests replay a linear-attention layer's steps as `forward.rs` launches them over several
//! steps of several sequences (prefills of a few rows, rows fewer than the conv's taps, decode
//! steps, a sequence sitting a step out), the full-attention layers' split and output gate and
//! Qwen3.5-MoE's shared expert, and check that each equals the CPU's `DeltaNet`, `split_gate`,
//! `out_gate` and `Moe::shared_expert`/`add_shared` bit for bit, recurrent states included.

// Index loops as in the CUDA source, so that the two read side by side.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use super::emulate_moe::{cpu_expf, sigmoid};
use crate::model::expf::{LOG_LN2, LOG_POLY, LOG_TABLE};

/// `cpu_logf` (`__fma_rn` is `mul_add`).
pub(crate) fn cpu_logf(x: f32) -> f32 {
    let mut ix = x.to_bits();
    if ix == 0x3f80_0000 {
        return 0.0;
    }
    if ix.wrapping_sub(0x0080_0000) >= 0x7f80_0000 - 0x0080_0000 {
        if ix.wrapping_mul(2) == 0 {
            return f32::from_bits(0xff80_0000);
        }
        if ix == 0x7f80_0000 {
            return x;
        }
        if ix & 0x8000_0000 != 0 || ix.wrapping_mul(2) >= 0xff00_0000 {
            return f32::from_bits(0x7fc0_0000);
        }
        ix = (x * 8_388_608.0).to_bits().wrapping_sub(23 << 23);
    }
    let tmp = ix.wrapping_sub(0x3f33_0000);
    let i = ((tmp >> 19) % 16) as usize;
    let k = (tmp as i32) >> 23;
    let z = f32::from_bits(ix.wrapping_sub(tmp & 0xff80_0000)) as f64;
    let invc = f64::from_bits(LOG_TABLE[i].0);
    let logc = f64::from_bits(LOG_TABLE[i].1);
    let ln2 = f64::from_bits(LOG_LN2);
    let [a0, a1, a2] = LOG_POLY.map(f64::from_bits);
    let r = z.mul_add(invc, -1.0);
    let y0 = (k as f64).mul_add(ln2, logc);
    let r2 = r * r;
    let y = a1.mul_add(r, a2);
    let y = a0.mul_add(r2, y);
    y.mul_add(r2, y0 + r) as f32
}

/// `cpu_silu`.
fn silu(x: f32) -> f32 {
    x / (1.0 + cpu_expf(-x - 0.0))
}

/// `cpu_rms_scale`.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let mut ss = 0f64;
    for i in 0..x.len() {
        ss += (x[i] * x[i]) as f64;
    }
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// `delta_conv` over its grid: thread (c, q) for every channel of every sequence; `spans[q]`
/// is sequence q's (first row, rows), `states[q]` its state.
pub(crate) fn conv(
    mixed: &[f32],
    out: &mut [f32],
    states: &mut [Vec<f32>],
    off: usize,
    spans: &[(usize, usize)],
    cd: usize,
    taps: usize,
    w: &[f32],
) {
    for q in 0..spans.len() {
        for c in 0..cd {
            let (r0, n) = spans[q];
            if n == 0 {
                continue;
            }
            let keep = taps - 1;
            let kept = &mut states[q][off + c * keep..off + (c + 1) * keep];
            let wc = &w[c * taps..(c + 1) * taps];
            for i in 0..n {
                let mut sum = 0f32;
                for t in 0..taps {
                    let at = i + t;
                    let x = if at < keep {
                        kept[at]
                    } else {
                        mixed[(r0 + at - keep) * cd + c]
                    };
                    sum += x * wc[t];
                }
                out[(r0 + i) * cd + c] = silu(sum);
            }
            for j in 0..keep {
                let at = n + j;
                kept[j] = if at < keep {
                    kept[at]
                } else {
                    mixed[(r0 + at - keep) * cd + c]
                };
            }
        }
    }
}

/// `delta_prep` over its grid (one thread per q/k head of each row, then per value head).
pub(crate) fn prep(
    conv: &mut [f32],
    beta: &mut [f32],
    alpha: &mut [f32],
    dt_bias: &[f32],
    a: &[f32],
    rows: usize,
    cd: usize,
    s: usize,
    qk_heads: usize,
    v_heads: usize,
    n_eps: f32,
    inv: f32,
) {
    let nqk = rows * qk_heads;
    for thread in 0..nqk + rows * v_heads {
        if thread < nqk {
            let at = (thread / qk_heads) * cd + (thread % qk_heads) * s;
            let x = &mut conv[at..at + s];
            let scale = rms_scale(x, n_eps);
            for c in 0..s {
                x[c] = x[c] * scale * inv;
            }
            continue;
        }
        let i = thread - nqk;
        let v = i % v_heads;
        beta[i] = sigmoid(beta[i]);
        let x = alpha[i] + dt_bias[v];
        let sp = if x > 20.0 {
            x
        } else {
            cpu_logf(1.0 + cpu_expf(x))
        };
        alpha[i] = sp * a[v];
    }
}

/// `delta_rule` over its grid: block (v, q) of `s` threads for every value head of every
/// sequence, each token's threads between its two barriers.
pub(crate) fn rule(
    conv: &[f32],
    beta: &[f32],
    alpha: &[f32],
    states: &mut [Vec<f32>],
    off: usize,
    spans: &[(usize, usize)],
    (cd, kd, s): (usize, usize, usize),
    (k_div, k_heads): (usize, usize),
    v_heads: usize,
    inv: f32,
    out: &mut [f32],
) {
    for q in 0..spans.len() {
        for v in 0..v_heads {
            let (r0, n) = spans[q];
            let kh = (v / k_div) % k_heads;
            let mut staged = vec![f32::NAN; 3 * s];
            for t in 0..n {
                let row = &conv[(r0 + t) * cd..(r0 + t + 1) * cd];
                for j in 0..s {
                    staged[j] = row[kh * s + j];
                    staged[s + j] = row[kd + kh * s + j];
                    staged[2 * s + j] = row[2 * kd + v * s + j];
                }
                let (sq, rest) = staged.split_at(s);
                let (sk, sv) = rest.split_at(s);
                for j in 0..s {
                    let at = off + v * s * s + j;
                    let m = &mut states[q][at..];
                    let bi = (r0 + t) * v_heads + v;
                    let (b, decay) = (beta[bi], cpu_expf(alpha[bi]));
                    let mut dot = 0f32;
                    for i in 0..s {
                        let x = m[i * s] * decay;
                        m[i * s] = x;
                        dot += x * sk[i];
                    }
                    let d = (sv[j] - dot) * b;
                    let mut o = 0f32;
                    for i in 0..s {
                        let x = sk[i].mul_add(d, m[i * s]);
                        m[i * s] = x;
                        o += x * sq[i];
                    }
                    out[(r0 + t) * v_heads * s + v * s + j] = o * inv;
                }
            }
        }
    }
}

/// `gated_norm` (one thread per row and value head; `heads` of them).
pub(crate) fn gated_norm(attn: &mut [f32], z: &[f32], w: &[f32], s: usize, heads: usize, eps: f32) {
    for i in 0..heads {
        let o = &mut attn[i * s..(i + 1) * s];
        let zz = &z[i * s..(i + 1) * s];
        let scale = rms_scale(o, eps);
        for c in 0..s {
            o[c] = o[c] * scale * w[c] * silu(zz[c]);
        }
    }
}

/// `out_gate`.
pub(crate) fn out_gate(attn: &mut [f32], gate: &[f32]) {
    for i in 0..attn.len() {
        attn[i] *= sigmoid(gate[i]);
    }
}

/// `shared_gate`.
pub(crate) fn shared_gate(out: &mut [f32], logit: &[f32], dim: usize) {
    for i in 0..out.len() {
        out[i] *= sigmoid(logit[i / dim]);
    }
}

/// `split_cols` of `rows × heads` pairs of `hd` (the query | gate halves): part 0 the queries,
/// part 1 the gate (`SplitGate`'s two launches).
pub(crate) fn split_gate(fused: &[f32], hd: usize, part: usize) -> Vec<f32> {
    let total = fused.len() / 2;
    (0..total)
        .map(|i| fused[(i / hd) * 2 * hd + part * hd + i % hd])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::emulate::tests::{bits, quantized};
    use super::super::emulate_moe::{gated_cpu, matmul};
    use super::*;
    use crate::model::arch::{Activation, Gating, MoeConfig};
    use crate::model::deltanet::{DeltaNet, DeltaScratch, Hybrid};
    use crate::model::expf::log_f32;
    use crate::model::kv::{KvSeq, Logits, SeqStep};
    use crate::model::moe::{Moe, MoeScratch, SharedExpert};
    use crate::model::quant::tests::noise;
    use crate::model::quant::QWeight;
    use candle_core::quantized::GgmlDType;

    /// The kernels' `logf` is the CPU's `log_f32`, bit for bit, over the positive floats, the
    /// softplus range and the edges; and `deltanet.cu` spells out the CPU's table.
    #[test]
    fn cpu_logf_equals_the_cpu() {
        let mut xs: Vec<f32> = (0..100_000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761) % 0x7f80_0000))
            .collect();
        xs.extend(noise(3, 20000).iter().map(|v| 1.0 + (v * 20.0).exp()));
        xs.extend([
            0.0,
            -0.0,
            1.0,
            -1.0,
            1e-45,
            f32::INFINITY,
            f32::MAX,
            f32::NAN,
        ]);
        for x in xs {
            assert_eq!(cpu_logf(x).to_bits(), log_f32(x).to_bits(), "{x:e}");
        }
        let src = include_str!("deltanet.cu");
        let table = &src[src.find("CPU_LOG_TABLE[32] = {").expect("table")..];
        let table = &table[..table.find("};").expect("end")];
        let words: Vec<u64> = table
            .split("0x")
            .skip(1)
            .map(|w| u64::from_str_radix(&w[..16], 16).expect("hex"))
            .collect();
        let want: Vec<u64> = LOG_TABLE.iter().flat_map(|&(a, b)| [a, b]).collect();
        assert_eq!(words, want);
    }

    /// A sequence's length and state alone (linear layers keep no KV).
    struct State {
        len: usize,
        state: Vec<f32>,
    }

    impl KvSeq for State {
        fn len(&self) -> usize {
            self.len
        }
        fn grow(&mut self, n: usize) {
            self.len += n;
        }
        fn write(&mut self, _: usize, _: usize, _: &[f32], _: &[f32]) {
            unreachable!("a linear layer stores no KV")
        }
        fn key(&self, _: usize, _: usize) -> &[f32] {
            unreachable!("a linear layer reads no KV")
        }
        fn value(&self, _: usize, _: usize) -> &[f32] {
            unreachable!("a linear layer reads no KV")
        }
        fn state(&self) -> &[f32] {
            &self.state
        }
        fn state_mut(&mut self) -> &mut [f32] {
            &mut self.state
        }
    }

    /// Qwen3.5's geometry at a small size: 4 taps, 2 key heads, 4 value heads of 16; layers
    /// 0 and 2 linear (so layer 2's state sits after layer 0's).
    fn hybrid() -> Hybrid {
        Hybrid {
            conv_kernel: 4,
            k_heads: 2,
            v_heads: 4,
            head_dim: 16,
            linear: vec![true, false, true],
            grouped: false,
        }
    }

    fn layer(h: &Hybrid, dim: usize, dtype: GgmlDType, seed: u64) -> (QWeight, DeltaNet) {
        let scaled = |s: u64, n: usize, by: f32| -> Vec<f32> {
            noise(s, n).iter().map(|v| v * by).collect()
        };
        let conv = scaled(seed + 4, h.conv_dim() * h.conv_kernel, 0.5);
        let d = DeltaNet {
            z: quantized(Some(dtype), h.value_dim(), dim, seed + 1),
            beta: quantized(Some(dtype), h.v_heads, dim, seed + 2),
            alpha: quantized(Some(dtype), h.v_heads, dim, seed + 3),
            conv: crate::model::deltanet::transpose(&conv, h.conv_dim(), h.conv_kernel),
            dt_bias: scaled(seed + 5, h.v_heads, 0.5),
            a: noise(seed + 6, h.v_heads)
                .iter()
                .map(|v| -(v * 2.0).exp())
                .collect(),
            norm: scaled(seed + 7, h.head_dim, 1.0)
                .iter()
                .map(|v| 1.0 + v)
                .collect(),
        };
        (quantized(Some(dtype), h.conv_dim(), dim, seed), d)
    }

    /// Layer `l`'s linear-attention block as `forward.rs` launches it: the four projections,
    /// `delta_conv`, `delta_prep`, `delta_rule`, `gated_norm`; the block's output (`attn`).
    fn emulated(
        h: &Hybrid,
        l: usize,
        (qkv, d): &(QWeight, DeltaNet),
        xb: &[f32],
        spans: &[(usize, usize)],
        states: &mut [Vec<f32>],
        eps: f32,
    ) -> Vec<f32> {
        let rows: usize = spans.iter().map(|s| s.1).sum();
        let (cd, s, kd, vd) = (h.conv_dim(), h.head_dim, h.key_dim(), h.value_dim());
        let mixed = matmul(qkv, xb, rows);
        let z = matmul(&d.z, xb, rows);
        let mut beta = matmul(&d.beta, xb, rows);
        let mut alpha = matmul(&d.alpha, xb, rows);
        let mut c = vec![f32::NAN; rows * cd];
        let off = h.state_offset(l);
        conv(
            &mixed,
            &mut c,
            states,
            off,
            spans,
            cd,
            h.conv_kernel,
            &crate::model::deltanet::transpose(&d.conv, h.conv_kernel, cd),
        );
        let (n_eps, inv) = (eps / s as f32, 1.0 / (s as f32).sqrt());
        prep(
            &mut c,
            &mut beta,
            &mut alpha,
            &d.dt_bias,
            &d.a,
            rows,
            cd,
            s,
            2 * h.k_heads,
            h.v_heads,
            n_eps,
            inv,
        );
        let mut out = vec![f32::NAN; rows * vd];
        let off = off + h.conv_state_len();
        let dims = (cd, kd, s);
        rule(
            &c,
            &beta,
            &alpha,
            states,
            off,
            spans,
            dims,
            (h.k_div(), h.k_heads),
            h.v_heads,
            inv,
            &mut out,
        );
        gated_norm(&mut out, &z, &d.norm, s, rows * h.v_heads, eps);
        out
    }

    /// The CPU's steps (`DeltaProject`, `Conv`, `DeltaRule`, `GatedNorm`) on the same rows.
    fn cpu(
        h: &Hybrid,
        l: usize,
        (qkv, d): &(QWeight, DeltaNet),
        xb: &[f32],
        spans: &[(usize, usize)],
        seqs: &mut [State],
        eps: f32,
    ) -> Vec<f32> {
        let rows: usize = spans.iter().map(|s| s.1).sum();
        let mut scratch = DeltaScratch::default();
        scratch.prepare(h, 0, rows);
        let tokens = vec![0u32; rows];
        let mut steps: Vec<SeqStep<'_, State>> = seqs
            .iter_mut()
            .zip(spans)
            .map(|(kv, &(r0, n))| SeqStep {
                tokens: &tokens[r0..r0 + n],
                kv,
                logits: Logits::None,
            })
            .collect();
        let spans3: Vec<(usize, usize, usize)> = spans
            .iter()
            .zip(&steps)
            .map(|(&(r0, n), q)| (r0, n, q.kv.len()))
            .collect();
        let mut out = vec![f32::NAN; rows * h.value_dim()];
        d.project(qkv, xb, rows, &mut scratch);
        d.conv(h, l, &mut steps, &spans3, &mut scratch);
        d.rule(h, l, eps, &mut steps, &spans3, &mut scratch, &mut out);
        d.gated_norm(h, eps, rows, &mut scratch, &mut out);
        out
    }

    /// Three sequences through five steps of both linear layers, the emulated kernels beside
    /// the CPU: prefills of 5 and 2 rows (fewer than the taps: the kept inputs are partly the
    /// zero start), a sequence sitting a step out (0 rows), a chunk of 7 after a decode step,
    /// decode steps of all three; F32 and Q8_0 projections; value heads tiled over the key
    /// heads (Qwen3.5) and grouped by key head (Qwen3-Next). Every step's output and every
    /// sequence's state (conv inputs and matrices of both layers) equal bit for bit.
    #[test]
    fn the_emulated_linear_attention_equals_the_cpu() {
        let (dim, eps) = (64, 1e-6);
        let steps: [&[usize]; 5] = [&[5, 2, 0], &[1, 1, 3], &[7, 0, 1], &[1, 1, 1], &[2, 6, 1]];
        for (grouped, dtype) in [
            (false, GgmlDType::F32),
            (false, GgmlDType::Q8_0),
            (true, GgmlDType::F32),
            (true, GgmlDType::Q8_0),
        ] {
            let h = Hybrid {
                grouped,
                ..hybrid()
            };
            let layers = [layer(&h, dim, dtype, 10), layer(&h, dim, dtype, 20)];
            let mut seqs: Vec<State> = (0..3)
                .map(|_| State {
                    len: 0,
                    state: vec![0.0; h.state_len()],
                })
                .collect();
            let mut states: Vec<Vec<f32>> = vec![vec![0.0; h.state_len()]; 3];
            for (k, lens) in steps.iter().enumerate() {
                let mut spans = Vec::new();
                let mut r0 = 0;
                for &n in lens.iter() {
                    spans.push((r0, n));
                    r0 += n;
                }
                let xb: Vec<f32> = noise(100 + k as u64, r0 * dim)
                    .iter()
                    .map(|v| v * 2.0)
                    .collect();
                for (l, w) in [(0, &layers[0]), (2, &layers[1])] {
                    let got = emulated(&h, l, w, &xb, &spans, &mut states, eps);
                    let want = cpu(&h, l, w, &xb, &spans, &mut seqs, eps);
                    assert!(want.iter().all(|v| v.is_finite()), "step {k}");
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{dtype:?} grouped {grouped} step {k} layer {l}"
                    );
                }
                for (q, &n) in seqs.iter_mut().zip(lens.iter()) {
                    q.grow(n);
                }
                for (i, (q, st)) in seqs.iter().zip(&states).enumerate() {
                    assert_eq!(bits(&q.state), bits(st), "{dtype:?} step {k} sequence {i}");
                }
            }
            assert!(states.iter().all(|s| s.iter().any(|&v| v != 0.0)));
        }
    }

    /// The full-attention layers' gate: `split_cols` of the query | gate halves and
    /// `out_gate` give the CPU's `split_gate` and `out_gate` bits.
    #[test]
    fn the_emulated_split_and_output_gate_equal_the_cpu() {
        let (rows, heads, hd) = (3, 4, 16);
        let q_dim = heads * hd;
        let fused: Vec<f32> = noise(5, rows * 2 * q_dim)
            .iter()
            .map(|v| v * 30.0)
            .collect();
        let (mut q, mut gate) = (vec![0f32; rows * q_dim], vec![0f32; rows * q_dim]);
        crate::model::deltanet::split_gate(&fused, hd, &mut q, &mut gate);
        assert_eq!(bits(&split_gate(&fused, hd, 0)), bits(&q));
        assert_eq!(bits(&split_gate(&fused, hd, 1)), bits(&gate));
        let attn = noise(6, rows * q_dim);
        let mut want = attn.clone();
        crate::model::deltanet::out_gate(&mut want, &gate);
        let mut got = attn;
        out_gate(&mut got, &split_gate(&fused, hd, 1));
        assert_eq!(bits(&got), bits(&want));
    }

    /// Qwen3.5-MoE's shared expert as `forward.rs` launches it (gate and up matmuls,
    /// `gated_act_cpu`, down matmul, the gate's matmul, `shared_gate`, then `add_in_place`
    /// after the routed experts' sum) equals the CPU's `shared_expert` and `add_shared`, in
    /// F32, Q8_0 and Q4_K, for one row and for seven; and so does DeepSeek's ungated one (no
    /// gate: the down matmul's output added).
    #[test]
    fn the_emulated_shared_expert_equals_the_cpu() {
        let (dim, f) = (256, 256);
        let cases = [GgmlDType::F32, GgmlDType::Q8_0, GgmlDType::Q4K]
            .into_iter()
            .flat_map(|d| [(d, true), (d, false)]);
        for (dtype, gated) in cases {
            let moe = Moe {
                router: QWeight::from_f32(4, dim, noise(1, 4 * dim)),
                router_bias: None,
                selection_bias: None,
                experts: Vec::new(),
                config: MoeConfig {
                    experts: 4,
                    used: 2,
                    ffn_dim: f,
                    gating: Gating::SoftmaxTopK { normalize: true },
                    shared_ffn: Some(f),
                    shared_gated: gated,
                    dense_lead: 0,
                    groups: None,
                    weights_scale: 1.0,
                },
                shared: Some(Box::new(SharedExpert {
                    gate: quantized(Some(dtype), f, dim, 2),
                    up: quantized(Some(dtype), f, dim, 3),
                    down: quantized(Some(dtype), dim, f, 4),
                    gate_inp: gated.then(|| quantized(Some(dtype), 1, dim, 5)),
                })),
                down_scale: None,
                beside: None,
            };
            let sh = moe.shared.as_deref().expect("shared");
            for rows in [1, 7] {
                let x: Vec<f32> = noise(6, rows * dim).iter().map(|v| v * 3.0).collect();
                let routed = noise(7, rows * dim);
                let mut s = MoeScratch::default();
                moe.shared_expert(Activation::Silu, &x, rows, &mut s);
                let mut want = routed.clone();
                moe.add_shared(&mut want, rows, &s);

                let mut gate = matmul(&sh.gate, &x, rows);
                let up = matmul(&sh.up, &x, rows);
                gated_cpu(&mut gate, &up, 1);
                let mut out = matmul(&sh.down, &gate, rows);
                if let Some(gate_inp) = &sh.gate_inp {
                    let logit = matmul(gate_inp, &x, rows);
                    shared_gate(&mut out, &logit, dim);
                }
                let mut got = routed.clone();
                for (g, o) in got.iter_mut().zip(&out) {
                    *g += o;
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{dtype:?} gated {gated}, {rows} rows"
                );
                assert_ne!(bits(&got), bits(&routed), "{dtype:?}: the expert added");
            }
        }
    }
}
