//! The GPU's lowering of a [`Plan`]: the list of kernel launches of each layer and of the
//! head, each naming the plan steps it covers. Adjacent steps may share a launch (the norm and
//! the quantization of its output for the next projection; bias, RoPE and the KV write; a
//! projection and the residual add in its epilogue); one step may take several launches (three
//! split q/k/v matrices, attention's two passes).
//!
//! A pure function of the plan and of what it needs to know of the device's matrices
//! ([`Target`]): no cudarc, built with and without the `cuda` feature, so that every
//! architecture's lowering is checked on any machine. `cuda::forward` executes the launches
//! in this order and nothing else; it owns the kernels' arguments, this module only their
//! sequence.

use std::ops::Range;

use super::arch::Activation;
use super::plan::{Matrix, Place, Plan, Step};
use super::quant::{QWeight, WeightFormat};
use super::transformer::{GateUp, Qkv, Transformer};

/// The 8-bit activation blocks a quantized matrix's integer kernel reads (`quantize_q8` kinds
/// 0 and 1, `quantize_q8k`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActBlocks {
    Q8_0,
    Q8_1,
    Q8K,
}

impl ActBlocks {
    /// The kernels' code for these blocks (`Kind::act`'s value).
    pub fn code(self) -> i32 {
        match self {
            ActBlocks::Q8_0 => 0,
            ActBlocks::Q8_1 => 1,
            ActBlocks::Q8K => 2,
        }
    }

    /// From the kernels' code.
    pub fn from_code(code: i32) -> Option<ActBlocks> {
        match code {
            0 => Some(ActBlocks::Q8_0),
            1 => Some(ActBlocks::Q8_1),
            2 => Some(ActBlocks::Q8K),
            _ => None,
        }
    }
}

/// The activation blocks the CPU's (and the integer kernels') product with a matrix of
/// format `f` reads; `None` for float formats.
pub fn act_blocks(f: WeightFormat) -> Option<ActBlocks> {
    match f {
        WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16 => None,
        WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0 | WeightFormat::Mxfp4 => {
            Some(ActBlocks::Q8_0)
        }
        WeightFormat::Q4_1 | WeightFormat::Q5_1 => Some(ActBlocks::Q8_1),
        WeightFormat::Q4K | WeightFormat::Q5K | WeightFormat::Q6K => Some(ActBlocks::Q8K),
    }
}

/// The target of `model`'s matrices on a device running the integer matmuls (`integer`) or
/// the legacy ones, with or without the fused kernels.
pub fn target_of(model: &Transformer, integer: bool, fuse: bool) -> Target {
    let a = |w: &QWeight| act_blocks(w.format());
    let layers = model
        .layers
        .iter()
        .map(|l| Mats {
            qkv: match &l.qkv {
                Qkv::Split { q, k, v } => vec![a(q), a(k), a(v)],
                Qkv::Fused(w) => vec![a(w)],
                // Gemma 4's and latent attention's (their steps are not lowered).
                Qkv::QueryKey { q, k } => vec![a(q), a(k)],
                Qkv::Query(q) => vec![a(q)],
                Qkv::Latent(_) => Vec::new(),
            },
            out: a(&l.wo),
            // A Mixture-of-Experts layer has neither (its steps are not lowered).
            gate_up: match l.mlp() {
                Some((GateUp::Split { gate, up }, _)) => vec![a(gate), a(up)],
                Some((GateUp::Fused(w), _)) => vec![a(w)],
                None => Vec::new(),
            },
            down: l.mlp().and_then(|(_, down)| a(down)),
        })
        .collect();
    Target {
        integer,
        fuse,
        wide: model.dims.iter().any(|d| d.head_dim > NARROW_HEAD),
        layers,
        logits: a(model.output.as_ref().unwrap_or(&model.embedding)),
    }
}

/// The activation blocks of each matrix of a layer's projections, in the order each
/// projection multiplies them (`None`: a float matrix, or the legacy path's f32 kernels).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mats {
    pub qkv: Vec<Option<ActBlocks>>,
    pub out: Option<ActBlocks>,
    pub gate_up: Vec<Option<ActBlocks>>,
    pub down: Option<ActBlocks>,
}

/// The widest attention head of `attn_partial`, `attn_partial_gqa` and `attn_combine` (8
/// dimensions per lane); wider heads take `attn_partial_wide` and `attn_combine_wide`.
pub const NARROW_HEAD: usize = 256;

/// What the lowering needs to know of the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The integer matmuls (`mmq.cu`): activations quantized, the residual added in the
    /// epilogue, group attention. Otherwise the legacy f32 matmuls.
    pub integer: bool,
    /// Adjacent steps share a launch where a fused kernel exists; off, every step is launched
    /// on its own (the reference the fused kernels must equal bit for bit).
    pub fuse: bool,
    /// Attention runs the kernels for heads past [`NARROW_HEAD`] dimensions (latent
    /// attention's 576; the tests force it on narrower heads: the same bits).
    pub wide: bool,
    /// Each layer's matrices.
    pub layers: Vec<Mats>,
    /// The output projection's.
    pub logits: Option<ActBlocks>,
}

/// One launch's kernel, with what tells apart several launches of one step (`part`: q, k, v
/// or gate, up, in that order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `rms_norm` (a pre-norm, a post-norm, the final norm; `part` 0 or 1 for q/k norms).
    RmsNorm { part: usize },
    /// `rms_norm_q8`: the pre-norm (its float rows written as `rms_norm` writes them) and
    /// the quantization of its rows into the activation blocks the projection's first
    /// matrix reads.
    NormQuant(ActBlocks),
    /// The matmul of matrix `part` of a projection: its activations quantized first (one
    /// more launch) unless `quantized` (already in the blocks `act` by the launch before);
    /// with `residual`, `x +=` the product in the epilogue.
    Matmul {
        part: usize,
        act: Option<ActBlocks>,
        quantized: bool,
        residual: bool,
    },
    /// `split_cols`: part `part` of a fused projection's rows.
    SplitCols { part: usize },
    /// `add_bias` of q, k or v.
    AddBias { part: usize },
    /// `rope` of q (`part` 0) or k (1).
    Rope { part: usize },
    /// `kv_write`.
    KvWrite,
    /// `scale_rows` of q by each row's attention temperature.
    QueryTemp,
    /// `rope_kv_write`: q, k, v plus their biases (with `bias`), RoPE of q and k, and the
    /// keys and values stored into the KV pool, in one launch.
    RopeKv { bias: bool },
    /// `attn_partial_gqa` (group), `attn_partial` (one warp per query head) or, with `wide`,
    /// `attn_partial_wide` (one warp per query head of up to 576 dimensions).
    AttnPartial { gqa: bool, wide: bool },
    /// `attn_combine`, or `attn_combine_wide`.
    AttnCombine { wide: bool },
    /// `add_in_place`: `x += xb`.
    AddInPlace,
    /// `gated_act`.
    GatedAct,
    /// `gather_rows`.
    GatherRows,
    /// `softcap`.
    Softcap,
    /// `add_bias`: the attention output projection's bias (`xb += b`), and phimoe's after a
    /// pre-norm (`xb`), after the final norm (the normed head rows) and on the logits.
    OutBias,
    /// The router's matmul (a float or integer kernel) and `moe_route`: each row's experts
    /// and weights in rank order.
    Route,
    /// `moe_group` (rows grouped by expert in a fixed order), `gather_rows`, then per routed
    /// expert its gate/up matmuls, biases, `gated_act_cpu` and down matmul on its rows.
    Experts,
    /// `moe_combine`: the weighted sum of each row's expert outputs in rank order.
    Combine,
    /// A linear layer's four input projections of `xb` (q|k|v, `z`, β, the decay), each
    /// matmul quantizing its input unless the one before left the blocks it reads.
    DeltaProject,
    /// `delta_conv`: each sequence's causal conv1d and SiLU, its kept inputs updated.
    Conv,
    /// `delta_prep`: the q/k L2 norms, β's sigmoid and the decay's softplus.
    DeltaPrep,
    /// `delta_rule`: each sequence's value heads through their state matrices.
    DeltaRule,
    /// `gated_norm`.
    GatedNorm,
    /// `split_cols` of the query projection's query (`part` 0) or gate (1) halves.
    SplitGate { part: usize },
    /// `out_gate`.
    OutGate,
    /// The shared expert: its gate/up matmuls, `gated_act_cpu`, down matmul, the gate's
    /// matmul and `shared_gate`.
    SharedExpert,
    /// `add_in_place`: `xb +=` the shared expert's output.
    AddShared,
    /// Latent attention's projections: the query matmul (or the low-rank one, `rms_norm` and
    /// the up-projection) and the compressed KV's (`model::cuda::mla`).
    LatentProject,
    /// The latent copied out and RMS-normed, `mla_kv` (keys and values), then per head
    /// `copy_cols` of its RoPE part, and `copy_cols`, the matmul by `attn_k_b` and `copy_cols`
    /// of its no-RoPE part.
    Absorb,
    /// Per head `copy_cols`, the matmul by `attn_v_b` and `copy_cols`; then the values copied
    /// back to the attention output.
    Expand,
    /// `copy_cols`: the values are the keys' projection (Gemma 4).
    KeyAsValue,
    /// `rms_norm` of `x` by the router's scale, then `scale` by `1 / sqrt(dim)` (Gemma 4).
    RouterNorm,
    /// `rms_norm` of each value head with a weight of ones (Gemma 4).
    VNorm,
    /// `scale`: `x *= s`, the layer's output scale (Gemma 4).
    LayerScale,
    /// The per-layer inputs (Gemma 4 E2B/E4B): the projection's matmul, `scale`, `rms_norm`
    /// of each layer's slice, and `ple_combine` with the token's per-layer embedding (looked up
    /// on the host).
    PerLayerInputs,
    /// The per-layer embedding: the gate's matmul, `copy_cols` of the layer's input,
    /// `gated_act` (GELU), the projection's matmul, `rms_norm`, `add_in_place` into `x`.
    PerLayerEmbed,
}

impl Kernel {
    /// A short name (for traces and counts).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::RmsNorm { .. } => "rms_norm",
            Kernel::NormQuant(_) => "rms_norm_q8",
            Kernel::Matmul { .. } => "matmul",
            Kernel::SplitCols { .. } => "split_cols",
            Kernel::AddBias { .. } => "add_bias",
            Kernel::Rope { .. } => "rope",
            Kernel::KvWrite => "kv_write",
            Kernel::QueryTemp => "scale_rows",
            Kernel::RopeKv { .. } => "rope_kv_write",
            Kernel::AttnPartial { wide: false, .. } => "attn_partial",
            Kernel::AttnPartial { wide: true, .. } => "attn_partial_wide",
            Kernel::AttnCombine { wide: false } => "attn_combine",
            Kernel::AttnCombine { wide: true } => "attn_combine_wide",
            Kernel::AddInPlace => "add_in_place",
            Kernel::GatedAct => "gated_act",
            Kernel::GatherRows => "gather_rows",
            Kernel::Softcap => "softcap",
            Kernel::OutBias => "add_bias",
            Kernel::Route => "moe_route",
            Kernel::Experts => "moe_experts",
            Kernel::Combine => "moe_combine",
            Kernel::DeltaProject => "delta_project",
            Kernel::Conv => "delta_conv",
            Kernel::DeltaPrep => "delta_prep",
            Kernel::DeltaRule => "delta_rule",
            Kernel::GatedNorm => "gated_norm",
            Kernel::SplitGate { .. } => "split_cols",
            Kernel::OutGate => "out_gate",
            Kernel::SharedExpert => "shared_expert",
            Kernel::AddShared => "add_in_place",
            Kernel::LatentProject => "latent_project",
            Kernel::Absorb => "absorb",
            Kernel::Expand => "expand",
            Kernel::KeyAsValue => "copy_cols",
            Kernel::RouterNorm => "router_norm",
            Kernel::VNorm => "rms_norm",
            Kernel::LayerScale => "scale",
            Kernel::PerLayerInputs => "per_layer_inputs",
            Kernel::PerLayerEmbed => "per_layer_embed",
        }
    }

    /// Kernel launches on the device (a matmul that quantizes its input first takes two;
    /// the router's matmul and routing two). `Experts` counts its two fixed launches only:
    /// each routed expert adds its matmuls, biases and activation, known at run time; the
    /// linear layer's projections and the shared expert count their matmuls and kernels,
    /// not their quantizations; the latent steps count their launches before the heads'
    /// (each head adds four to `Absorb` and three to `Expand`).
    pub fn device_launches(self) -> usize {
        match self {
            Kernel::Route | Kernel::Experts | Kernel::LatentProject | Kernel::RouterNorm => 2,
            Kernel::Absorb => 3,
            Kernel::PerLayerInputs => 4,
            Kernel::PerLayerEmbed => 6,
            Kernel::DeltaProject => 4,
            Kernel::SharedExpert => 6,
            Kernel::Matmul {
                act: Some(_),
                quantized: false,
                ..
            } => 2,
            _ => 1,
        }
    }
}

/// One launch and the plan steps it covers (indices into its place's steps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    pub kernel: Kernel,
    pub steps: Range<usize>,
}

/// The launches of every layer and of the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lowering {
    layers: Vec<Vec<Launch>>,
    head: Vec<Launch>,
}

impl Lowering {
    /// Lowers `plan` for `target` (one [`Mats`] per layer of the plan).
    pub fn new(plan: &Plan, target: &Target) -> Lowering {
        assert_eq!(plan.n_layers(), target.layers.len(), "one Mats per layer");
        Lowering {
            layers: (0..plan.n_layers())
                .map(|l| lower(plan.layer(l), Some(&target.layers[l]), target))
                .collect(),
            head: lower(plan.head(), None, target),
        }
    }

    /// The launches at `place`.
    pub fn launches(&self, place: Place) -> &[Launch] {
        match place {
            Place::Layer(l) => &self.layers[l],
            Place::Head => &self.head,
        }
    }

    /// Device launches of layer `l` (a matmul that quantizes counts two).
    pub fn device_launches(&self, place: Place) -> usize {
        self.launches(place)
            .iter()
            .map(|l| l.kernel.device_launches())
            .sum()
    }
}

/// What of `model` the GPU has no kernels for, named in one line (`None`: it runs). Every
/// weight format has integer kernels (MXFP4 included) and every plan step of the architectures
/// Candor loads lowers ([`Lowering::new`]), Qwen3.5's linear attention, output gate and shared
/// expert, DeepSeek's router, Multi-head Latent Attention and Gemma 4's layers (its MoE
/// layers' MLP beside the experts, their norms and GELU experts) included: what is named here
/// is a step, or a variant of one, without a kernel: a shared expert with a GELU activation
/// (no architecture has one).
pub fn not_lowered(model: &Transformer) -> Option<String> {
    steps_not_lowered(model.plan())
}

/// The steps of `plan` without a GPU kernel, named in one line.
fn steps_not_lowered(plan: &Plan) -> Option<String> {
    let has = |f: fn(&Step) -> bool| plan.places().any(|(_, steps)| steps.iter().any(f));
    let mut missing = Vec::new();
    if has(|s| {
        matches!(
            s,
            Step::SharedExpert(Activation::GeluTanh | Activation::GeluTanhF16)
        )
    }) {
        missing.push("a GELU shared expert");
    }
    (!missing.is_empty()).then(|| {
        format!(
            "the GPU path has no kernels yet for {}; run this model with --device cpu",
            missing.join(", ")
        )
    })
}

/// The steps `launches` cover, in order: consecutive launches cover either the same steps
/// (several launches of one step or group) or the steps right after; an error names the first
/// launch that breaks this, or the steps left uncovered.
pub fn covered<'a>(steps: &'a [Step], launches: &[Launch]) -> Result<Vec<&'a Step>, String> {
    let mut out = Vec::new();
    let mut end = 0;
    let mut last: Option<&Range<usize>> = None;
    for (i, l) in launches.iter().enumerate() {
        if last == Some(&l.steps) {
            continue;
        }
        if l.steps.start != end || l.steps.is_empty() || l.steps.end > steps.len() {
            return Err(format!(
                "launch {i} ({:?}) covers steps {:?}; expected a range starting at {end}",
                l.kernel, l.steps
            ));
        }
        out.extend(&steps[l.steps.clone()]);
        end = l.steps.end;
        last = Some(&l.steps);
    }
    if end != steps.len() {
        return Err(format!("steps {end}..{} not launched", steps.len()));
    }
    Ok(out)
}

/// The matrices' activation blocks of projection `m` (the head's output projection when
/// `mats` is `None`).
fn acts(m: Matrix, mats: Option<&Mats>, t: &Target) -> Vec<Option<ActBlocks>> {
    let pick = |a: Option<ActBlocks>| a.filter(|_| t.integer);
    match (m, mats) {
        (Matrix::Logits, _) | (_, None) => vec![pick(t.logits)],
        (Matrix::Qkv, Some(x)) => x.qkv.iter().map(|&a| pick(a)).collect(),
        (Matrix::Out, Some(x)) => vec![pick(x.out)],
        (Matrix::GateUp, Some(x)) => x.gate_up.iter().map(|&a| pick(a)).collect(),
        (Matrix::Down, Some(x)) => vec![pick(x.down)],
    }
}

/// The launches of one place's steps.
fn lower(steps: &[Step], mats: Option<&Mats>, t: &Target) -> Vec<Launch> {
    let mut out = Vec::new();
    let mut push = |kernel: Kernel, steps: Range<usize>| out.push(Launch { kernel, steps });
    // The activation blocks now quantized from the input of the next projection.
    let mut quantized: Option<ActBlocks> = None;
    let mut i = 0;
    while i < steps.len() {
        let next = |k: usize| steps.get(i + k).copied();
        let mut span = 1;
        match steps[i] {
            Step::Norm(_) | Step::FinalNorm => {
                quantized = None;
                let first = match next(1) {
                    Some(Step::Project(m)) => acts(m, mats, t).first().copied().flatten(),
                    _ => None,
                };
                match first {
                    Some(a) if t.fuse => {
                        push(Kernel::NormQuant(a), i..i + 1);
                        quantized = Some(a);
                    }
                    _ => push(Kernel::RmsNorm { part: 0 }, i..i + 1),
                }
            }
            Step::Project(m) => {
                let residual = t.integer
                    && matches!(m, Matrix::Out | Matrix::Down)
                    && next(1) == Some(Step::Residual);
                if residual {
                    span = 2;
                }
                for (part, act) in acts(m, mats, t).into_iter().enumerate() {
                    let reuse = act.is_some() && act == quantized;
                    if act.is_some() {
                        quantized = act;
                    }
                    push(
                        Kernel::Matmul {
                            part,
                            act,
                            quantized: reuse,
                            residual,
                        },
                        i..i + span,
                    );
                }
                quantized = None;
            }
            Step::Split(m) => {
                let parts = if m == Matrix::Qkv { 3 } else { 2 };
                for part in 0..parts {
                    push(Kernel::SplitCols { part }, i..i + 1);
                }
            }
            Step::Bias => {
                if t.fuse
                    && matches!(
                        (next(1), next(2)),
                        (Some(Step::Rope(_)), Some(Step::KvWrite))
                    )
                {
                    span = 3;
                    push(Kernel::RopeKv { bias: true }, i..i + 3);
                } else {
                    for part in 0..3 {
                        push(Kernel::AddBias { part }, i..i + 1);
                    }
                }
            }
            Step::QkNorm => {
                for part in 0..2 {
                    push(Kernel::RmsNorm { part }, i..i + 1);
                }
            }
            Step::Rope(_) => {
                if t.fuse && next(1) == Some(Step::KvWrite) {
                    span = 2;
                    push(Kernel::RopeKv { bias: false }, i..i + 2);
                } else {
                    // A layer reading another layer's KV has queries alone.
                    let shared = steps.iter().any(|s| matches!(s, Step::AttendShared { .. }));
                    for part in 0..if shared { 1 } else { 2 } {
                        push(Kernel::Rope { part }, i..i + 1);
                    }
                }
            }
            Step::KvWrite => push(Kernel::KvWrite, i..i + 1),
            Step::QueryTemp => push(Kernel::QueryTemp, i..i + 1),
            Step::Attention { .. } | Step::AttendShared { .. } => {
                let wide = t.wide;
                push(
                    Kernel::AttnPartial {
                        gqa: t.integer && !wide,
                        wide,
                    },
                    i..i + 1,
                );
                push(Kernel::AttnCombine { wide }, i..i + 1);
            }
            Step::PostNorm(_) => push(Kernel::RmsNorm { part: 0 }, i..i + 1),
            Step::Residual => push(Kernel::AddInPlace, i..i + 1),
            Step::Gated(_) => push(Kernel::GatedAct, i..i + 1),
            Step::Gather => push(Kernel::GatherRows, i..i + 1),
            Step::Softcap => push(Kernel::Softcap, i..i + 1),
            Step::OutBias | Step::NormBias(_) | Step::FinalNormBias | Step::LogitBias => {
                push(Kernel::OutBias, i..i + 1)
            }
            Step::Route(_) => push(Kernel::Route, i..i + 1),
            Step::Experts(_) => push(Kernel::Experts, i..i + 1),
            Step::Combine => push(Kernel::Combine, i..i + 1),
            Step::DeltaProject => {
                quantized = None;
                push(Kernel::DeltaProject, i..i + 1);
            }
            Step::Conv => push(Kernel::Conv, i..i + 1),
            Step::DeltaRule => {
                push(Kernel::DeltaPrep, i..i + 1);
                push(Kernel::DeltaRule, i..i + 1);
            }
            Step::GatedNorm => push(Kernel::GatedNorm, i..i + 1),
            Step::SplitGate => {
                for part in 0..2 {
                    push(Kernel::SplitGate { part }, i..i + 1);
                }
            }
            Step::OutGate => push(Kernel::OutGate, i..i + 1),
            Step::SharedExpert(_) => push(Kernel::SharedExpert, i..i + 1),
            Step::AddShared => push(Kernel::AddShared, i..i + 1),
            Step::LatentProject => {
                quantized = None;
                push(Kernel::LatentProject, i..i + 1);
            }
            Step::Absorb => push(Kernel::Absorb, i..i + 1),
            Step::Expand => push(Kernel::Expand, i..i + 1),
            Step::KeyAsValue => push(Kernel::KeyAsValue, i..i + 1),
            Step::VNorm => push(Kernel::VNorm, i..i + 1),
            Step::LayerScale => push(Kernel::LayerScale, i..i + 1),
            Step::PerLayerInputs => push(Kernel::PerLayerInputs, i..i + 1),
            Step::PerLayerEmbed => push(Kernel::PerLayerEmbed, i..i + 1),
            Step::SetAside | Step::ExpertNorm | Step::ExpertPostNorm => {
                push(Kernel::RmsNorm { part: 0 }, i..i + 1)
            }
            Step::RouterNorm => push(Kernel::RouterNorm, i..i + 1),
        }
        i += span;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::{Arch, ModelConfig};
    use crate::model::plan::{Block, LayerParts, RopeTable};

    fn plan(parts: LayerParts, cap: Option<f32>) -> Plan {
        Plan::new(&config(cap), [parts])
    }

    fn config(cap: Option<f32>) -> ModelConfig {
        ModelConfig {
            architecture: "llama".into(),
            arch: Arch::Llama,
            n_layer: 1,
            dim: 256,
            ffn_dim: 512,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 64,
            rope_dim: 64,
            rope_neox: false,
            rope_base: 1e4,
            rope_base_swa: 1e4,
            rope_scale: 1.0,
            rope_scale_swa: 1.0,
            rms_eps: 1e-5,
            context_len: 64,
            vocab_size: 32,
            embed_scale: None,
            activation: Activation::Silu,
            attn_scale: 0.125,
            attn_softcap: None,
            final_softcap: cap,
            sliding_window: None,
            swa_layers: vec![false],
            moe: None,
            yarn: None,
            attn_temp: None,
            nope_layers: Vec::new(),
            long_rope: None,
            rope_sections: None,
            norm_bias: false,
            mla: None,
        }
    }

    /// A one-layer gpt-oss configuration (8 experts of FFN 64, 2 used, top-k then softmax,
    /// SwiGLU-OAI) and its layer's parts (sinks, output bias, q/k/v biases, experts).
    fn gpt_oss() -> (ModelConfig, LayerParts) {
        use crate::model::arch::{Gating, MoeConfig};
        let mut c = config(None);
        c.activation = Activation::SwigluOai;
        c.moe = Some(MoeConfig {
            experts: 8,
            used: 2,
            ffn_dim: 64,
            gating: Gating::TopKSoftmax,
            shared_ffn: None,
            shared_gated: true,
            dense_lead: 0,
            groups: None,
            weights_scale: 1.0,
        });
        let oss = LayerParts {
            sinks: true,
            out_bias: true,
            bias: true,
            moe: true,
            ..LayerParts::default()
        };
        (c, oss)
    }

    /// Every step of a Mixture-of-Experts layer and of gpt-oss's layer (sinks, an alternating
    /// window, an output bias, q/k/v biases, SwiGLU-OAI experts) has its launch, in order, on
    /// every target; the output bias keeps the residual out of the output projection's
    /// epilogue, and the experts' layer has no dense matrices.
    #[test]
    fn moe_and_gpt_oss_layers_lower_every_step() {
        use crate::model::arch::{Gating, MoeConfig};
        let (mut c, oss) = gpt_oss();
        c.n_layer = 2;
        c.sliding_window = Some(128);
        c.swa_layers = vec![true, false];
        let p = Plan::new(&c, [oss, oss]);
        assert!(matches!(
            p.layer(0)[5],
            Step::Attention {
                window: Some(128),
                sinks: true
            }
        ));
        assert!(matches!(
            p.layer(1)[5],
            Step::Attention {
                window: None,
                sinks: true
            }
        ));
        for (integer, fuse) in [(true, true), (true, false), (false, true), (false, false)] {
            let t = moe_only(target(integer, fuse, true, true));
            let low = Lowering::new(&p, &t);
            for (place, steps) in p.places() {
                let got = covered(steps, low.launches(place))
                    .unwrap_or_else(|e| panic!("{place:?} integer {integer} fuse {fuse}: {e}"));
                assert_eq!(got.into_iter().copied().collect::<Vec<_>>(), steps);
            }
            let l = low.launches(Place::Layer(0));
            let names: Vec<&str> = l.iter().map(|x| x.kernel.name()).collect();
            let at = |n: &str| names.iter().position(|&x| x == n).expect(n);
            assert!(at("moe_route") < at("moe_experts") && at("moe_experts") < at("moe_combine"));
            assert!(l
                .iter()
                .all(|x| !matches!(x.kernel, Kernel::Matmul { residual: true, .. })));
            assert!(l.iter().any(|x| x.kernel == Kernel::OutBias));
        }
        // Mixtral's and qwen3moe's gating lower the same way.
        c.moe = c.moe.map(|m| MoeConfig {
            gating: Gating::SoftmaxTopK { normalize: true },
            ..m
        });
        let plain = LayerParts {
            moe: true,
            ..LayerParts::default()
        };
        let p = Plan::new(&c, [plain, plain]);
        let t = moe_only(target(true, true, true, false));
        let low = Lowering::new(&p, &t);
        assert!(covered(p.layer(0), low.launches(Place::Layer(0))).is_ok());
    }

    /// The GPU refuses only what has no kernel: no dense plan, no MoE plan with SiLU experts
    /// (qwen3moe, Mixtral) or gpt-oss's (SwiGLU-OAI, sinks, output bias; its MXFP4 experts
    /// are a weight format, which every kernel reads), but experts with a GELU activation,
    /// named in one line.
    #[test]
    fn the_gpu_refuses_only_steps_without_kernels() {
        assert_eq!(
            steps_not_lowered(&plan(LayerParts::default(), Some(30.0))),
            None
        );
        let (mut c, oss) = gpt_oss();
        for act in [Activation::Silu, Activation::SwigluOai] {
            c.activation = act;
            assert_eq!(steps_not_lowered(&Plan::new(&c, [oss])), None, "{act:?}");
        }
        // GELU experts (Gemma 4's) and a dense GELU feed-forward (Gemma's) have kernels.
        for act in [Activation::GeluTanh, Activation::GeluTanhF16] {
            c.activation = act;
            assert_eq!(steps_not_lowered(&Plan::new(&c, [oss])), None, "{act:?}");
            let dense = Plan::new(&c, [LayerParts::default()]);
            assert_eq!(steps_not_lowered(&dense), None, "{act:?}");
        }
        // qwen35's layers: Gated DeltaNet, and full attention with its output gate, lower.
        let c = config(None);
        for parts in [
            LayerParts {
                linear: true,
                ..LayerParts::default()
            },
            LayerParts {
                out_gate: true,
                qk_norm: true,
                ..LayerParts::default()
            },
        ] {
            assert_eq!(
                steps_not_lowered(&Plan::new(&c, [parts])),
                None,
                "{parts:?}"
            );
        }
        // gemma4's layers: each of its features alone lowers, the MLP beside the experts too.
        let gemma4 = [
            LayerParts {
                v_norm: true,
                ..LayerParts::default()
            },
            LayerParts {
                key_as_value: true,
                ..LayerParts::default()
            },
            LayerParts {
                kv_from: Some(0),
                ..LayerParts::default()
            },
            LayerParts {
                per_layer_input: true,
                ..LayerParts::default()
            },
            LayerParts {
                out_scale: true,
                ..LayerParts::default()
            },
        ];
        for parts in gemma4 {
            assert_eq!(
                steps_not_lowered(&Plan::new(&c, [parts])),
                None,
                "{parts:?}"
            );
        }
        let (mut c4, oss) = gpt_oss();
        c4.activation = Activation::Silu;
        let beside = LayerParts {
            mlp_beside: true,
            ..oss
        };
        assert_eq!(steps_not_lowered(&Plan::new(&c4, [beside])), None);
        // qwen35moe's shared expert lowers with SiLU; with GELU (no architecture has it) it is
        // refused in one line.
        let (mut c, oss) = gpt_oss();
        c.activation = Activation::Silu;
        let shared = LayerParts {
            shared_expert: true,
            linear: true,
            ..oss
        };
        assert_eq!(steps_not_lowered(&Plan::new(&c, [shared])), None);
        c.activation = Activation::GeluTanh;
        let why = steps_not_lowered(&Plan::new(&c, [shared])).expect("refused");
        assert!(
            why.contains("a GELU shared expert") && !why.contains('\n'),
            "{why}"
        );
    }

    /// Qwen3.5's layers lower every step, in order, on every target: a linear layer's
    /// projections, conv, delta rule (its two launches) and gated norm; a full-attention
    /// layer's query | gate split (two launches) and output gate; qwen35moe's shared expert
    /// between the routed experts and their combine, and its add after it.
    #[test]
    fn hybrid_layers_lower_every_step() {
        let (mut c, _) = gpt_oss();
        c.activation = Activation::Silu;
        c.n_layer = 2;
        c.swa_layers = vec![false, false];
        let linear = LayerParts {
            linear: true,
            moe: true,
            shared_expert: true,
            ..LayerParts::default()
        };
        let full = LayerParts {
            linear: false,
            qk_norm: true,
            out_gate: true,
            ..linear
        };
        let dense = Plan::new(
            &config(None),
            [LayerParts {
                linear: true,
                ..LayerParts::default()
            }],
        );
        let p = Plan::new(&c, [linear, full]);
        for (integer, fuse) in [(true, true), (true, false), (false, true), (false, false)] {
            let t = moe_only(target(integer, fuse, true, true));
            let mut t1 = target(integer, fuse, true, true);
            t1.layers[0].qkv = vec![Some(ActBlocks::Q8_0)];
            for (plan, t) in [(&p, &t), (&dense, &t1)] {
                let low = Lowering::new(plan, t);
                for (place, steps) in plan.places() {
                    let got = covered(steps, low.launches(place))
                        .unwrap_or_else(|e| panic!("{place:?} integer {integer} fuse {fuse}: {e}"));
                    assert_eq!(got.into_iter().copied().collect::<Vec<_>>(), steps);
                }
            }
            let low = Lowering::new(&p, &t);
            let names = |l: usize| -> Vec<&str> {
                low.launches(Place::Layer(l))
                    .iter()
                    .map(|x| x.kernel.name())
                    .collect()
            };
            let (l0, l1) = (names(0), names(1));
            let at = |n: &[&str], k: &str| n.iter().position(|&x| x == k).expect(k);
            assert_eq!(
                l0[1..6],
                [
                    "delta_project",
                    "delta_conv",
                    "delta_prep",
                    "delta_rule",
                    "gated_norm"
                ]
            );
            assert!(at(&l0, "moe_experts") < at(&l0, "shared_expert"));
            assert!(at(&l0, "shared_expert") < at(&l0, "moe_combine"));
            assert_eq!(l0[at(&l0, "moe_combine") + 1], "add_in_place");
            assert_eq!(
                l1.iter().filter(|&&n| n == "split_cols").count(),
                2,
                "{l1:?}"
            );
            assert!(at(&l1, "attn_combine") < at(&l1, "out_gate"));
            assert_eq!(l1[at(&l1, "out_gate") + 1], "matmul");
        }
    }

    /// `t` with two layers whose feed-forward is all experts (no dense gate/up or down).
    fn moe_only(mut t: Target) -> Target {
        t.layers = vec![
            Mats {
                gate_up: Vec::new(),
                down: None,
                ..t.layers[0].clone()
            };
            2
        ];
        t
    }

    /// Q8_K blocks for every matrix (the 8B Q4_K_M file: Q4_K and Q6_K), but Q8_0 for attn_k
    /// with `mixed` (the tiny models' Q5_0 attn_k).
    fn target(integer: bool, fuse: bool, split: bool, mixed: bool) -> Target {
        let k = Some(ActBlocks::Q8K);
        let attn_k = if mixed { Some(ActBlocks::Q8_0) } else { k };
        let layer = Mats {
            qkv: if split { vec![k, attn_k, k] } else { vec![k] },
            out: k,
            gate_up: if split { vec![k, k] } else { vec![k] },
            down: Some(ActBlocks::Q8K),
        };
        Target {
            integer,
            fuse,
            wide: false,
            layers: vec![layer],
            logits: None,
        }
    }

    /// The Llama-3-8B layer in Q4_K_M (split q/k/v, every matrix reading Q8_K blocks): 19
    /// device launches unfused, 15 fused, and which steps each fused launch covers.
    #[test]
    fn the_8b_layer_fuses_norm_quant_rope_kv_and_residuals() {
        let p = plan(LayerParts::default(), None);
        let unfused = Lowering::new(&p, &target(true, false, true, false));
        let fused = Lowering::new(&p, &target(true, true, true, false));
        let l0 = Place::Layer(0);
        assert_eq!(unfused.device_launches(l0), 19);
        assert_eq!(fused.device_launches(l0), 15);
        let steps = p.layer(0);
        for low in [&unfused, &fused] {
            let got: Vec<Step> = covered(steps, low.launches(l0))
                .unwrap()
                .into_iter()
                .copied()
                .collect();
            assert_eq!(got, steps);
        }
        let f = fused.launches(l0);
        assert_eq!(f[0].kernel, Kernel::NormQuant(ActBlocks::Q8K));
        let reuse = |f: &[Launch]| -> Vec<bool> {
            f[1..4]
                .iter()
                .map(|l| {
                    matches!(
                        l.kernel,
                        Kernel::Matmul {
                            quantized: true,
                            ..
                        }
                    )
                })
                .collect()
        };
        assert_eq!(reuse(f), [true, true, true]);
        // With attn_k reading Q8_0 blocks: q reuses the norm's quantization, k quantizes
        // its own, v (Q8_K) quantizes again.
        let mixed = Lowering::new(&p, &target(true, true, true, true));
        assert_eq!(reuse(mixed.launches(l0)), [true, false, false]);
        assert_eq!(f[4].kernel, Kernel::RopeKv { bias: false });
        assert_eq!(
            steps[f[4].steps.clone()],
            [Step::Rope(RopeTable::Full), Step::KvWrite]
        );
        let out = f
            .iter()
            .find(|l| steps[l.steps.start] == Step::Project(Matrix::Out))
            .unwrap();
        assert_eq!(out.steps.len(), 2, "the residual in the epilogue");
        // The legacy path: no quantization, no epilogue; the plain norms and adds.
        let legacy = Lowering::new(&p, &target(false, true, true, false));
        let kinds: Vec<&str> = legacy
            .launches(l0)
            .iter()
            .map(|l| l.kernel.name())
            .collect();
        assert!(kinds.contains(&"add_in_place") && !kinds.contains(&"rms_norm_q8"));
        assert_eq!(legacy.device_launches(l0), legacy.launches(l0).len());
    }

    /// Biases fuse with RoPE and the KV write; q/k norms between them keep the bias apart;
    /// post-norms keep the residual out of the epilogue; a fused q/k/v is split in three.
    #[test]
    fn every_feature_is_covered_in_order() {
        let all = [
            LayerParts::default(),
            LayerParts {
                bias: true,
                ..Default::default()
            },
            LayerParts {
                qk_norm: true,
                post_norms: true,
                swa_rope: true,
                ..Default::default()
            },
            LayerParts {
                fused: true,
                ..Default::default()
            },
            LayerParts {
                bias: true,
                qk_norm: true,
                fused: true,
                post_norms: true,
                swa_rope: false,
                moe: false,
                out_bias: false,
                sinks: false,
                ..Default::default()
            },
        ];
        for parts in all {
            for cap in [None, Some(30.0)] {
                let p = plan(parts, cap);
                for (integer, fuse) in [(true, true), (true, false), (false, true), (false, false)]
                {
                    let t = target(integer, fuse, !parts.fused, true);
                    let low = Lowering::new(&p, &t);
                    for (place, steps) in p.places() {
                        let got = covered(steps, low.launches(place))
                            .unwrap_or_else(|e| panic!("{parts:?} {place:?}: {e}"));
                        assert_eq!(got.into_iter().copied().collect::<Vec<_>>(), steps);
                    }
                }
            }
        }
        let qwen2 = plan(
            LayerParts {
                bias: true,
                ..Default::default()
            },
            None,
        );
        let low = Lowering::new(&qwen2, &target(true, true, true, false));
        assert!(low
            .launches(Place::Layer(0))
            .iter()
            .any(|l| l.kernel == Kernel::RopeKv { bias: true } && l.steps.len() == 3));
        let gemma = plan(
            LayerParts {
                post_norms: true,
                ..Default::default()
            },
            None,
        );
        let low = Lowering::new(&gemma, &target(true, true, true, false));
        let l = low.launches(Place::Layer(0));
        assert!(l
            .iter()
            .all(|l| !matches!(l.kernel, Kernel::Matmul { residual: true, .. })));
        assert!(l
            .iter()
            .any(|x| gemma.layer(0)[x.steps.start] == Step::PostNorm(Block::Ffn)));
    }

    /// The attention temperature (mistral3) is a `scale_rows` launch of its own between the
    /// KV write (still in RoPE's `rope_kv_write` when fused, biases or not) and attention, on
    /// every target.
    #[test]
    fn the_attention_temperature_lowers_to_scale_rows_before_attention() {
        use crate::model::arch::AttnTemp;
        let mut c = config(None);
        c.attn_temp = Some(AttnTemp {
            scale: 0.1,
            floor_scale: 16,
        });
        for bias in [false, true] {
            let p = Plan::new(
                &c,
                [LayerParts {
                    bias,
                    ..LayerParts::default()
                }],
            );
            assert_eq!(steps_not_lowered(&p), None);
            for (integer, fuse) in [(true, true), (true, false), (false, true), (false, false)] {
                let low = Lowering::new(&p, &target(integer, fuse, true, false));
                for (place, steps) in p.places() {
                    let got = covered(steps, low.launches(place))
                        .unwrap_or_else(|e| panic!("{place:?} fuse {fuse}: {e}"));
                    assert_eq!(got.into_iter().copied().collect::<Vec<_>>(), steps);
                }
                let l = low.launches(Place::Layer(0));
                let at = l.iter().position(|x| x.kernel == Kernel::QueryTemp);
                let at = at.expect("a scale_rows launch");
                assert_eq!(p.layer(0)[l[at].steps.clone()], [Step::QueryTemp]);
                let before = if fuse { "rope_kv_write" } else { "kv_write" };
                assert_eq!(
                    (l[at - 1].kernel.name(), l[at + 1].kernel.name()),
                    (before, "attn_partial")
                );
            }
        }
    }

    /// A NoPE layer (SmolLM3) has no RoPE launch: its keys and values go to the KV by
    /// `kv_write` alone, after the biases' own launches when it has biases, on every target;
    /// every step is covered in order.
    #[test]
    fn a_nope_layer_writes_its_kv_without_a_rope_launch() {
        let mut c = config(None);
        c.nope_layers = vec![true];
        for bias in [false, true] {
            let parts = LayerParts {
                bias,
                ..LayerParts::default()
            };
            let p = Plan::new(&c, [parts]);
            assert_eq!(steps_not_lowered(&p), None);
            for (integer, fuse) in [(true, true), (true, false), (false, true), (false, false)] {
                let (_, names) = lowered(&p, &target(integer, fuse, true, false));
                assert!(!names.iter().any(|n| n.starts_with("rope")), "{names:?}");
                let at = names.iter().position(|&n| n == "kv_write");
                let at = at.expect("a kv_write launch");
                assert_eq!(names[at + 1], "attn_partial");
                let biases = names.iter().filter(|&&n| n == "add_bias").count();
                assert_eq!(biases, if bias { 3 } else { 0 });
            }
        }
    }

    /// `p` lowered for `t`, each place's launches covering its steps one for one, in order;
    /// and the names of layer 0's launches.
    fn lowered(p: &Plan, t: &Target) -> (Lowering, Vec<&'static str>) {
        let low = Lowering::new(p, t);
        for (place, steps) in p.places() {
            let got = covered(steps, low.launches(place))
                .unwrap_or_else(|e| panic!("{place:?} fuse {}: {e}", t.fuse));
            assert_eq!(got.into_iter().copied().collect::<Vec<_>>(), steps);
        }
        let names = (low.launches(Place::Layer(0)).iter())
            .map(|x| x.kernel.name())
            .collect();
        (low, names)
    }

    /// A latent-attention layer lowers on every target: its three steps one launch each,
    /// RoPE and the KV write as for any layer, attention on the wide kernels when the target
    /// says so (never the group kernel then), the narrow ones otherwise.
    #[test]
    fn a_latent_layer_lowers_with_wide_or_narrow_attention() {
        let c = config(None);
        let parts = LayerParts {
            latent: true,
            ..LayerParts::default()
        };
        let p = Plan::new(&c, [parts]);
        assert_eq!(steps_not_lowered(&p), None);
        for wide in [false, true] {
            for (integer, fuse) in [(true, true), (true, false), (false, true), (false, false)] {
                let t = Target {
                    wide,
                    ..target(integer, fuse, true, false)
                };
                let (low, names) = lowered(&p, &t);
                let at = |n: &str| names.iter().position(|&x| x == n).expect(n);
                assert!(at("latent_project") < at("absorb"), "{names:?}");
                let (partial, combine) = match wide {
                    true => ("attn_partial_wide", "attn_combine_wide"),
                    false => ("attn_partial", "attn_combine"),
                };
                assert!(at("absorb") < at(partial) && at(partial) < at(combine));
                assert!(at(combine) < at("expand") && at("expand") < at("matmul"));
                if wide {
                    let gqa = low
                        .launches(Place::Layer(0))
                        .iter()
                        .any(|l| matches!(l.kernel, Kernel::AttnPartial { gqa: true, .. }));
                    assert!(!gqa, "{names:?}");
                }
            }
        }
    }

    #[test]
    fn covered_refuses_a_gap_an_overlap_and_a_missing_tail() {
        let p = plan(LayerParts::default(), None);
        let steps = p.head();
        let l = |a: usize, b: usize| Launch {
            kernel: Kernel::GatherRows,
            steps: a..b,
        };
        assert!(covered(steps, &[l(0, 1), l(1, 2), l(2, 3)]).is_ok());
        assert!(covered(steps, &[l(0, 1), l(2, 3)]).is_err());
        assert!(covered(steps, &[l(0, 2), l(1, 3)]).is_err());
        assert!(covered(steps, &[l(0, 1), l(1, 2)]).is_err());
    }
}
