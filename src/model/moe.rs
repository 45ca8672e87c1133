//! Mixture-of-Experts feed-forward blocks, the three plan steps that replace a dense layer's
//! gate/up, activation and down projection: [`Moe::route`] (the router's logits, each row's
//! experts and weights), [`Moe::experts`] (each chosen expert's feed-forward on the rows routed
//! to it) and [`Moe::combine`] (the weighted sum). llama.cpp's `build_moe_ffn`
//! (`src/llama-graph.cpp`) is the reference for the order of operations.
//!
//! Gemma 4's MoE layers add [`MlpBeside`]: the dense MLP every row also runs, set aside
//! under its own post-norm, the router's own input (`Moe::router_norm`), the experts' pre- and
//! post-norms, and each expert's output scale (`Moe::down_scale`).
//!
//! Invariance: a row's experts, weights and outputs depend on that row alone. Ties in the
//! router's ranking go to the lower expert index; rows are grouped by expert for the matmuls,
//! whose every output row is computed as if it were alone (`QWeight::matmul`); each row's
//! expert outputs are added in rank order. So no bit depends on the batch, its order or the
//! thread count.

use super::arch::{Activation, Gating, MoeConfig};
use super::expf::exp_shifted_in_place;
use super::quant::{Gathered, QWeight};

/// One expert's feed-forward matrices (`ffn_{gate,up,down}_exps`, sliced by expert).
pub(super) struct Expert {
    pub(super) gate: QWeight,
    pub(super) up: QWeight,
    pub(super) down: QWeight,
    /// The gate, up and down biases (gpt-oss: `ffn_{gate,up,down}_exps.bias`).
    pub(super) bias: Option<[Vec<f32>; 3]>,
}

/// A layer's Mixture-of-Experts block.
pub(super) struct Moe {
    /// `experts × dim` (`ffn_gate_inp`).
    pub(super) router: QWeight,
    /// Added to the router's logits (gpt-oss: `ffn_gate_inp.bias`).
    pub(super) router_bias: Option<Vec<f32>>,
    /// Added to the probabilities to choose the experts, not to weigh them (DeepSeek-V3's
    /// `exp_probs_b`; [`Gating::Deepseek`]).
    pub(super) selection_bias: Option<Vec<f32>>,
    pub(super) experts: Vec<Expert>,
    pub(super) config: MoeConfig,
    /// The shared expert every row also runs (Qwen3.5-MoE; boxed: most layers have none).
    pub(super) shared: Option<Box<SharedExpert>>,
    /// Each expert's output scale, its down product times it (`ffn_down_exps.scale`, Gemma
    /// 4's `per_expert_scale`).
    pub(super) down_scale: Option<Vec<f32>>,
    /// The dense MLP beside the experts and the norms of both branches (Gemma 4).
    pub(super) beside: Option<Box<MlpBeside>>,
}

/// Gemma 4's MoE layer beyond its experts (llama.cpp's `gemma4.cpp`): the dense MLP every
/// row runs beside them (`ffn_{gate,up,down}`, after the layer's `ffn_norm`), each branch's
/// own norms and the scale of the router's input.
pub(super) struct MlpBeside {
    pub(super) gate_up: super::transformer::GateUp,
    pub(super) down: QWeight,
    /// `post_ffw_norm_1`: the MLP's output norm.
    pub(super) post_norm: Vec<f32>,
    /// `pre_ffw_norm_2`: the experts' input norm.
    pub(super) experts_norm: Vec<f32>,
    /// `post_ffw_norm_2`: the experts' output norm.
    pub(super) experts_post_norm: Vec<f32>,
    /// `ffn_gate_inp.scale`: the router input's scale per channel.
    pub(super) router_scale: Vec<f32>,
}

/// A shared expert (`ffn_{gate,up,down}_shexp`) and its gate (`ffn_gate_inp_shexp`, one
/// row of `dim`): every row runs it, its output scaled by the sigmoid of the gate's logit
/// (DeepSeek's: no gate, the output as it is).
pub(super) struct SharedExpert {
    pub(super) gate: QWeight,
    pub(super) up: QWeight,
    pub(super) down: QWeight,
    /// `1 × dim`.
    pub(super) gate_inp: Option<QWeight>,
}

/// Reusable buffers of the three steps, grown to the largest step seen.
#[derive(Debug, Default)]
pub struct MoeScratch {
    /// Router logits, then probabilities: `rows × experts`.
    logits: Vec<f32>,
    /// Each row's `used` experts with their weights, in rank order.
    chosen: Vec<(u32, f32)>,
    /// For each expert, the (row, rank) pairs routed to it, rows in order.
    routed: Vec<Vec<(usize, usize)>>,
    /// (expert, first, count) of each expert with rows, in expert order: its part of the
    /// output order.
    spans: Vec<(usize, usize, usize)>,
    /// The row of `xb` behind each output, in output order.
    rows: Vec<usize>,
    /// `0, 1, …`: the down products' rows (the gate outputs in output order).
    seq: Vec<usize>,
    /// Where row `r`'s rank-`k` output is in the output order: `slot[r · used + k]`.
    slot: Vec<usize>,
    /// The gate/up outputs, `rows × used × ffn`, in output order.
    gate: Vec<f32>,
    up: Vec<f32>,
    /// The experts' outputs, `rows × used × dim`, in output order.
    out: Vec<f32>,
    /// Expert indices being ranked.
    order: Vec<u32>,
    /// One row's chosen logits, then their softmax ([`Gating::TopKSoftmax`]); one row's
    /// selection scores ([`Gating::Deepseek`]).
    weights: Vec<f32>,
    /// Each group's score, then the groups ranked ([`MoeConfig::groups`]).
    group_score: Vec<f32>,
    group_order: Vec<u32>,
    /// The shared expert's gate/up outputs (`rows × shared width`).
    shared_gate: Vec<f32>,
    shared_up: Vec<f32>,
    /// The shared expert's gate logit of each row.
    shared_logit: Vec<f32>,
    /// The shared expert's gated output, or the dense MLP's normed output set aside
    /// (Gemma 4), `rows × dim`.
    shared_out: Vec<f32>,
}

impl Moe {
    /// The router's logits of the `rows` rows of `xb`, and each row's experts and weights.
    pub(super) fn route(&self, xb: &[f32], rows: usize, s: &mut MoeScratch) {
        let MoeConfig { experts, used, .. } = self.config;
        s.logits.resize(rows * experts, 0.0);
        self.router
            .matmul(xb, rows, &mut s.logits[..rows * experts]);
        if let Some(b) = &self.router_bias {
            super::transformer::add_rows(&mut s.logits[..rows * experts], b);
        }
        s.chosen.clear();
        for r in 0..rows {
            let probs = &mut s.logits[r * experts..(r + 1) * experts];
            let first = s.chosen.len();
            match self.config.gating {
                Gating::SoftmaxTopK { normalize } => {
                    softmax_in_place(probs);
                    rank(probs, used, &mut s.order);
                    s.chosen
                        .extend(s.order[..used].iter().map(|&e| (e, probs[e as usize])));
                    if normalize {
                        normalize_weights(&mut s.chosen[first..]);
                    }
                }
                Gating::TopKSoftmax => {
                    rank(probs, used, &mut s.order);
                    s.weights.clear();
                    s.weights
                        .extend(s.order[..used].iter().map(|&e| probs[e as usize]));
                    softmax_in_place(&mut s.weights);
                    s.chosen.extend(
                        s.order[..used]
                            .iter()
                            .zip(&s.weights)
                            .map(|(&e, &w)| (e, w)),
                    );
                }
                Gating::Deepseek { sigmoid, normalize } => {
                    match sigmoid {
                        true => probs
                            .iter_mut()
                            .for_each(|v| *v = super::deltanet::sigmoid(*v)),
                        false => softmax_in_place(probs),
                    }
                    let select = &mut s.weights;
                    select.clear();
                    select.extend_from_slice(probs);
                    if let Some(b) = &self.selection_bias {
                        super::transformer::add_rows(select, b);
                    }
                    if let Some((groups, best)) = self.config.groups {
                        keep_best_groups(
                            select,
                            groups,
                            best,
                            &mut s.group_score,
                            &mut s.group_order,
                        );
                    }
                    rank(select, used, &mut s.order);
                    s.chosen
                        .extend(s.order[..used].iter().map(|&e| (e, probs[e as usize])));
                    if normalize {
                        normalize_weights(&mut s.chosen[first..]);
                    }
                    let scale = self.config.weights_scale;
                    if scale != 1.0 {
                        s.chosen[first..].iter_mut().for_each(|(_, w)| *w *= scale);
                    }
                }
            }
        }
    }

    /// Every chosen expert's feed-forward (`act(x·gateᵀ) · (x·upᵀ)`, then `·downᵀ`) on the
    /// rows of `xb` routed to it. The outputs are laid out expert by expert (experts in index
    /// order, each one's rows in row order); `slot[r · used + k]` says where row `r`'s rank-`k`
    /// output is. All experts' gate/up products run as one gathered matmul, then all their
    /// down products (each row quantized once, the panels of every expert in one parallel
    /// region: [`QWeight::matmul_gathered`], the bits of each row alone).
    pub(super) fn experts(&self, act: Activation, xb: &[f32], rows: usize, s: &mut MoeScratch) {
        let MoeConfig {
            experts,
            used,
            ffn_dim,
            ..
        } = self.config;
        let dim = self.router.cols();
        let total = rows * used;
        s.routed.resize_with(experts, Vec::new);
        s.routed.iter_mut().for_each(Vec::clear);
        for (i, &(e, _)) in s.chosen[..total].iter().enumerate() {
            s.routed[e as usize].push((i / used, i % used));
        }
        // Each expert's span of the output order, and its rows' indices in `xb`.
        s.spans.clear();
        s.rows.clear();
        s.slot.resize(total, 0);
        for (e, routed) in s.routed.iter().enumerate() {
            if routed.is_empty() {
                continue;
            }
            s.spans.push((e, s.rows.len(), routed.len()));
            for &(r, k) in routed {
                s.slot[r * used + k] = s.rows.len();
                s.rows.push(r);
            }
        }
        s.seq.clear();
        s.seq.extend(0..total);
        s.gate.resize(total * ffn_dim, 0.0);
        s.up.resize(total * ffn_dim, 0.0);
        s.out.resize(total * dim, 0.0);
        {
            let (mut gate, mut up) = (&mut s.gate[..], &mut s.up[..]);
            let mut jobs = Vec::with_capacity(2 * s.spans.len());
            for &(e, start, n) in &s.spans {
                let (g, g_rest) = std::mem::take(&mut gate).split_at_mut(n * ffn_dim);
                let (u, u_rest) = std::mem::take(&mut up).split_at_mut(n * ffn_dim);
                (gate, up) = (g_rest, u_rest);
                let rows = &s.rows[start..start + n];
                let ex = &self.experts[e];
                jobs.push(Gathered {
                    w: &ex.gate,
                    rows,
                    out: g,
                });
                jobs.push(Gathered {
                    w: &ex.up,
                    rows,
                    out: u,
                });
            }
            QWeight::matmul_gathered(&xb[..rows * dim], dim, &mut jobs);
        }
        for &(e, start, n) in &s.spans {
            let span = start * ffn_dim..(start + n) * ffn_dim;
            let (gate, up) = (&mut s.gate[span.clone()], &mut s.up[span]);
            // ggml adds the up bias, then the gate's, before the activation.
            if let Some([bg, bu, _]) = &self.experts[e].bias {
                super::transformer::add_rows(up, bu);
                super::transformer::add_rows(gate, bg);
            }
            super::transformer::gated(act, gate, up);
        }
        {
            let mut out = &mut s.out[..];
            let mut jobs = Vec::with_capacity(s.spans.len());
            for &(e, start, n) in &s.spans {
                let (o, rest) = std::mem::take(&mut out).split_at_mut(n * dim);
                out = rest;
                let rows = &s.seq[start..start + n];
                jobs.push(Gathered {
                    w: &self.experts[e].down,
                    rows,
                    out: o,
                });
            }
            QWeight::matmul_gathered(&s.gate, ffn_dim, &mut jobs);
        }
        for &(e, start, n) in &s.spans {
            let out = &mut s.out[start * dim..(start + n) * dim];
            // ggml's `mul` of the down product by the expert's scale, before any bias.
            if let Some(scale) = &self.down_scale {
                out.iter_mut().for_each(|v| *v *= scale[e]);
            }
            if let Some([_, _, bd]) = &self.experts[e].bias {
                super::transformer::add_rows(out, bd);
            }
        }
    }

    /// `xb[r] = Σₖ wₖ · outₖ[r]` over each row's experts in rank order (each product rounded
    /// to f32, then added to the running sum, as ggml's `mul` then chained `add`s).
    pub(super) fn combine(&self, xb: &mut [f32], rows: usize, s: &MoeScratch) {
        let used = self.config.used;
        let dim = self.router.cols();
        for r in 0..rows {
            let acc = &mut xb[r * dim..(r + 1) * dim];
            for k in 0..used {
                let w = s.chosen[r * used + k].1;
                let o = &s.out[s.slot[r * used + k] * dim..][..dim];
                if k == 0 {
                    for (a, &v) in acc.iter_mut().zip(o) {
                        *a = v * w;
                    }
                } else {
                    for (a, &v) in acc.iter_mut().zip(o) {
                        *a += v * w;
                    }
                }
            }
        }
    }
}

impl Moe {
    /// `Step::SharedExpert`: the shared expert's feed-forward on the `rows` rows of `xb`
    /// (`act(x·gateᵀ) · (x·upᵀ)`, then `·downᵀ`, as a dense layer's), each row times
    /// `sigmoid(x · gate_inp)` (ggml's `mul` of the product by the gate, rounded to f32).
    pub(super) fn shared_expert(
        &self,
        act: Activation,
        xb: &[f32],
        rows: usize,
        s: &mut MoeScratch,
    ) {
        let sh = self
            .shared
            .as_ref()
            .expect("plan: a shared-expert step on a layer with one");
        let (dim, f) = (self.router.cols(), sh.down.cols());
        s.shared_gate.resize(rows * f, 0.0);
        s.shared_up.resize(rows * f, 0.0);
        s.shared_out.resize(rows * dim, 0.0);
        s.shared_logit.resize(rows, 0.0);
        let (gate, up) = (&mut s.shared_gate[..rows * f], &mut s.shared_up[..rows * f]);
        QWeight::matmul_shared(&[&sh.gate, &sh.up], xb, rows, &mut [&mut *gate, &mut *up]);
        super::transformer::gated(act, gate, up);
        sh.down.matmul(gate, rows, &mut s.shared_out[..rows * dim]);
        let Some(gate_inp) = &sh.gate_inp else {
            return;
        };
        gate_inp.matmul(xb, rows, &mut s.shared_logit[..rows]);
        for (out, &logit) in s.shared_out[..rows * dim]
            .chunks_exact_mut(dim)
            .zip(&s.shared_logit)
        {
            let g = super::deltanet::sigmoid(logit);
            for v in out.iter_mut() {
                *v *= g;
            }
        }
    }

    /// `Step::AddShared`: `xb += ` the gated shared expert's output, or the dense MLP's set
    /// aside, after [`Moe::combine`].
    pub(super) fn add_shared(&self, xb: &mut [f32], rows: usize, s: &MoeScratch) {
        let dim = self.router.cols();
        super::transformer::add_in_place(xb, &s.shared_out[..rows * dim]);
    }

    fn beside(&self) -> &MlpBeside {
        self.beside
            .as_deref()
            .expect("plan: a Gemma 4 MoE step on a layer with the MLP beside its experts")
    }

    /// `Step::SetAside`: the dense MLP's output `xb` RMS-normed by its own post-norm, kept
    /// for [`Moe::add_shared`].
    pub(super) fn set_aside(&self, xb: &[f32], rows: usize, eps: f32, s: &mut MoeScratch) {
        let b = self.beside();
        let dim = b.post_norm.len();
        s.shared_out.resize(rows * dim, 0.0);
        super::transformer::rms_norm_rows(xb, &b.post_norm, eps, &mut s.shared_out[..rows * dim]);
    }

    /// `Step::RouterNorm`: `xb = rms_norm(x) · (1/sqrt(dim)) · s`, each product rounded to
    /// f32 in that order (ggml's `rms_norm`, `scale`, `mul`).
    pub(super) fn router_norm(&self, x: &[f32], xb: &mut [f32], eps: f32) {
        let b = self.beside();
        let dim = b.router_scale.len();
        let inv = 1.0 / (dim as f32).sqrt();
        for (xr, or) in x.chunks_exact(dim).zip(xb.chunks_exact_mut(dim)) {
            let scale = super::transformer::rms_scale(xr, eps);
            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(&b.router_scale) {
                *o = v * scale * inv * g;
            }
        }
    }

    /// `Step::ExpertNorm`: `xb = rms_norm(x) · w`, the experts' own pre-norm.
    pub(super) fn expert_norm(&self, x: &[f32], xb: &mut [f32], eps: f32) {
        super::transformer::rms_norm_rows(x, &self.beside().experts_norm, eps, xb);
    }

    /// `Step::ExpertPostNorm`: the experts' weighted sum `xb` RMS-normed by their post-norm.
    pub(super) fn expert_post_norm(&self, xb: &mut [f32], eps: f32) {
        super::transformer::rms_norm_in_place(xb, &self.beside().experts_post_norm, eps);
    }

    /// The dense MLP's matrices (Gemma 4).
    pub(super) fn mlp(&self) -> Option<(&super::transformer::GateUp, &QWeight)> {
        self.beside.as_deref().map(|b| (&b.gate_up, &b.down))
    }
}

/// `x = softmax(x)` as ggml's `soft_max`: the exponentials of `x - max`, their sum in f64,
/// then each exponential times `1 / sum` rounded to f32.
fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    exp_shifted_in_place(x, max);
    let sum: f64 = x.iter().map(|&v| f64::from(v)).sum();
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// The first `k` of `order` become the indices of `v`'s `k` largest values, largest first;
/// equal values rank the lower index first (a total order, so the result is unique).
fn rank(v: &[f32], k: usize, order: &mut Vec<u32>) {
    order.clear();
    order.extend(0..v.len() as u32);
    let cmp = |a: &u32, b: &u32| {
        v[*b as usize]
            .total_cmp(&v[*a as usize])
            .then_with(|| a.cmp(b))
    };
    if k < order.len() {
        order.select_nth_unstable_by(k, cmp);
    }
    order[..k].sort_unstable_by(cmp);
}

/// Group-limited routing as llama.cpp's `build_moe_ffn`: `select` in `groups` groups of
/// consecutive experts, each scored by the sum of its two largest values (largest first,
/// rounded to f32), the `best` best groups kept (ties to the lower group) and every other
/// group's values set to `-∞`, so that no expert of theirs is chosen.
fn keep_best_groups(
    select: &mut [f32],
    groups: usize,
    best: usize,
    score: &mut Vec<f32>,
    order: &mut Vec<u32>,
) {
    let per = select.len() / groups;
    score.clear();
    for g in select.chunks_exact(per) {
        // The two largest values (which of equal ones is taken changes no sum).
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &v in g {
            if v.total_cmp(&a).is_gt() {
                (a, b) = (v, a);
            } else if v.total_cmp(&b).is_gt() {
                b = v;
            }
        }
        score.push(a + b);
    }
    let mut keep = std::mem::take(order);
    rank(score, best, &mut keep);
    let kept = &keep[..best];
    for (i, g) in select.chunks_exact_mut(per).enumerate() {
        if !kept.contains(&(i as u32)) {
            g.fill(f32::NEG_INFINITY);
        }
    }
    *order = keep;
}

/// Each weight divided by their sum (in f64, in rank order, rounded to f32 and kept at least
/// f16's smallest normal, as ggml's `sum_rows`, `clamp` and `div`).
fn normalize_weights(chosen: &mut [(u32, f32)]) {
    let sum: f64 = chosen.iter().map(|&(_, w)| f64::from(w)).sum();
    // 2⁻¹⁴, f16's smallest normal.
    let sum = (sum as f32).max(1.0 / 16384.0);
    for (_, w) in chosen.iter_mut() {
        *w /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_rank_the_lower_index_first_and_the_largest_first() {
        let mut order = Vec::new();
        rank(&[0.1, 0.5, 0.2, 0.5, 0.7], 3, &mut order);
        assert_eq!(order[..3], [4, 1, 3]);
        rank(&[1.0; 6], 6, &mut order);
        assert_eq!(order, [0, 1, 2, 3, 4, 5]);
        rank(&[0.3, -0.0, 0.0, 0.3], 2, &mut order);
        assert_eq!(order[..2], [0, 3]);
    }

    #[test]
    fn softmax_sums_to_one_and_normalized_weights_too() {
        let mut x = [1.0f32, 2.0, 3.0, -1.0];
        softmax_in_place(&mut x);
        let s: f32 = x.iter().sum();
        assert!((s - 1.0).abs() < 1e-6, "{s}");
        assert!(x[2] > x[1] && x[1] > x[0] && x[0] > x[3]);
        let mut w = [(2, x[2]), (1, x[1])];
        normalize_weights(&mut w);
        assert!((w[0].1 + w[1].1 - 1.0).abs() < 1e-6);
        assert!((w[0].1 / w[1].1 - x[2] / x[1]).abs() < 1e-5);
        // All-zero weights are divided by the clamp, not by zero.
        let mut z = [(0, 0.0f32), (1, 0.0)];
        normalize_weights(&mut z);
        assert_eq!(z, [(0, 0.0), (1, 0.0)]);
    }

    /// DeepSeek's router: groups limit the choice (the second-best expert overall, alone in a
    /// weak group, is passed over), the selection bias changes which experts are chosen but
    /// not their weights, which are the sigmoids renormalised and scaled.
    #[test]
    fn deepseek_routing_keeps_the_best_groups_and_weighs_by_unbiased_probabilities() {
        let n = 8;
        let identity: Vec<f32> = (0..n * n)
            .map(|i| if i / n == i % n { 1.0 } else { 0.0 })
            .collect();
        let moe = |bias: Option<Vec<f32>>, groups| Moe {
            router: QWeight::from_f32(n, n, identity.clone()),
            router_bias: None,
            selection_bias: bias,
            experts: Vec::new(),
            config: MoeConfig {
                experts: n,
                used: 2,
                ffn_dim: 4,
                gating: Gating::Deepseek {
                    sigmoid: true,
                    normalize: true,
                },
                shared_ffn: None,
                shared_gated: false,
                dense_lead: 0,
                groups,
                weights_scale: 2.0,
            },
            shared: None,
            down_scale: None,
            beside: None,
        };
        // Groups of two: {0, 1} scores σ(3) + σ(-1), {2, 3} σ(2.9) + σ(2.8), {6, 7}
        // σ(-3) + σ(2.95): the two best are {2, 3} and {0, 1}.
        let logits = [3.0f32, -1.0, 2.9, 2.8, 0.0, 0.1, -3.0, 2.95];
        let sig = |e: usize| crate::model::deltanet::sigmoid(logits[e]);
        let route = |m: &Moe| {
            let mut s = MoeScratch::default();
            m.route(&logits, 1, &mut s);
            s.chosen
        };
        let weigh = |a: usize, b: usize| {
            let sum = ((f64::from(sig(a)) + f64::from(sig(b))) as f32).max(1.0 / 16384.0);
            vec![
                (a as u32, sig(a) / sum * 2.0),
                (b as u32, sig(b) / sum * 2.0),
            ]
        };
        assert_eq!(route(&moe(None, None)), weigh(0, 7));
        assert_eq!(route(&moe(None, Some((4, 2)))), weigh(0, 2));
        let mut bias = vec![0.0; n];
        bias[3] = 1.0;
        assert_eq!(route(&moe(Some(bias), Some((4, 2)))), weigh(3, 0));
    }

    /// Routing, experts and combine on a batch give every row the bits it gets alone, in any
    /// order of the batch.
    #[test]
    fn every_row_is_computed_as_if_alone() {
        let (dim, ffn, experts, used) = (16, 24, 6, 2);
        let mat = |seed: u64, n: usize, k: usize| {
            QWeight::from_f32(n, k, crate::model::quant::tests::noise(seed, n * k))
        };
        let moe = Moe {
            router: mat(1, experts, dim),
            experts: (0..experts as u64)
                .map(|e| Expert {
                    gate: mat(10 + e, ffn, dim),
                    up: mat(20 + e, ffn, dim),
                    down: mat(30 + e, dim, ffn),
                    bias: None,
                })
                .collect(),
            router_bias: None,
            selection_bias: None,
            config: MoeConfig {
                experts,
                used,
                ffn_dim: ffn,
                gating: Gating::SoftmaxTopK { normalize: true },
                shared_ffn: None,
                shared_gated: true,
                dense_lead: 0,
                groups: None,
                weights_scale: 1.0,
            },
            shared: None,
            down_scale: None,
            beside: None,
        };
        let rows = 7;
        let x = crate::model::quant::tests::noise(99, rows * dim);
        let run = |x: &[f32], n: usize| {
            let mut s = MoeScratch::default();
            let mut xb = x.to_vec();
            moe.route(&xb, n, &mut s);
            moe.experts(Activation::Silu, &xb, n, &mut s);
            moe.combine(&mut xb, n, &s);
            xb
        };
        let batch = run(&x, rows);
        for r in 0..rows {
            let alone = run(&x[r * dim..(r + 1) * dim], 1);
            assert_eq!(alone, batch[r * dim..(r + 1) * dim], "row {r}");
        }
        let reversed: Vec<f32> = x.chunks_exact(dim).rev().flatten().copied().collect();
        let rev = run(&reversed, rows);
        for r in 0..rows {
            assert_eq!(
                rev[(rows - 1 - r) * dim..(rows - r) * dim],
                batch[r * dim..(r + 1) * dim]
            );
        }
    }
}
