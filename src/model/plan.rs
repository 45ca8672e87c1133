//! The layer sequence of a model, written once: the ordered [`Step`]s of each layer and of
//! the head (final norm, output projection, final softcap), built from the [`ModelConfig`] and
//! from what each layer holds ([`LayerParts`]: fused or split projections, biases, q/k norms,
//! post-norms, a sliding-window RoPE table). Every architecture's features are decided here
//! and nowhere else.
//!
//! Both devices execute a plan: the CPU's `Transformer::forward` runs its steps one by one (each
//! step is one call on the same buffers as before the plan existed), the GPU lowers it
//! ([`super::lowering`]) into launches that may cover several adjacent steps. This module
//! says *what* happens in which order; it computes nothing and knows no buffer or kernel.
//! The plan is built once per model, never per step.

use super::arch::{Activation, Gating, ModelConfig};

/// The two blocks of a layer, each with its pre-norm and optional post-norm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    Attn,
    Ffn,
}

/// The matrices one projection multiplies by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrix {
    /// Queries, keys and values (three matrices or one fused).
    Qkv,
    /// The attention output projection.
    Out,
    /// Gate and up (two matrices or one fused).
    GateUp,
    /// The feed-forward down projection.
    Down,
    /// The output projection to the vocabulary (the embedding when tied).
    Logits,
}

/// Which RoPE angles a layer rotates its queries and keys by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeTable {
    /// The full-attention layers' angles.
    Full,
    /// The sliding-window layers' own angles (Gemma 3).
    Swa,
}

/// One step of the forward pass. Buffers named: `x` the residual stream, `xb` the normed
/// input of a block (then its output), `q`/`k`/`v`, `attn` the attention output, `gate`/`up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `xb = rms_norm(x) · w`, the block's pre-norm.
    Norm(Block),
    /// The block's input times the matrices (`xb` → q/k/v or gate/up, `attn` → `xb`,
    /// `gate` → `xb`, the head's normed rows → logits); a fused matrix writes its whole width.
    Project(Matrix),
    /// A fused projection's output split into its parts (q | k | v, gate | up).
    Split(Matrix),
    /// q, k and v plus their biases (Qwen2).
    Bias,
    /// Per-head RMS norms of the queries and keys (Qwen3, Gemma 3).
    QkNorm,
    /// Multi-head Latent Attention's projections of `xb` (DeepSeek): the queries (one matrix,
    /// or a low-rank one, its RMS norm and an up-projection) and the compressed KV with the
    /// RoPE part every head shares.
    LatentProject,
    /// The compressed KV RMS-normed, and from it and the queries `q`/`k`/`v` with their RoPE
    /// parts first: each position's key `[k_pe | latent]` and value `[0 | latent]` (one KV
    /// head), each head's query `[q_pe | attn_k_b · q_nope]`.
    Absorb,
    /// Each head's attention output, its latent part times the head's `attn_v_b`, into
    /// `attn` as the output projection reads it.
    Expand,
    /// RoPE of the queries and keys.
    Rope(RopeTable),
    /// The keys and values stored at their positions in each sequence's KV.
    KvWrite,
    /// `q *=` each row's attention temperature factor, from its position
    /// ([`AttnTemp`](super::arch::AttnTemp), mistral3): llama.cpp scales the queries right
    /// after RoPE; only the queries change, so the step follows the KV write, which stays in
    /// RoPE's launch on the GPU.
    QueryTemp,
    /// Causal attention over each sequence's KV into `attn`, over the last `window`
    /// positions when the layer has a sliding window; with `sinks`, each head's learned sink
    /// logit joins its softmax (gpt-oss).
    Attention { window: Option<usize>, sinks: bool },
    /// `xb = rms_norm(xb) · w`, the block's post-norm (Gemma).
    PostNorm(Block),
    /// `xb += b`, the attention output projection's bias (gpt-oss).
    OutBias,
    /// `xb += b`, the bias after the block's pre-norm (phimoe).
    NormBias(Block),
    /// Head: the bias after the final norm (phimoe).
    FinalNormBias,
    /// Head: `logits += b`, the output projection's bias (phimoe).
    LogitBias,
    /// `x += xb`.
    Residual,
    /// `gate = act(gate) · up`.
    Gated(Activation),
    /// Mixture of experts: the router's logits of `xb`, and from them each row's experts
    /// (ties to the lower index) and their weights, ranked by weight.
    Route(Gating),
    /// Each chosen expert's gate/up projection, activation and down projection on the rows
    /// routed to it (rows grouped by expert; every row's bits as if it were alone).
    Experts(Activation),
    /// `xb` = each row's expert outputs times their weights, added in rank order.
    Combine,
    /// The shared expert (Qwen3.5-MoE) on `xb`, before `Combine` overwrites it: its gate/up
    /// projection, activation and down projection, each row times `sigmoid(xb · g)` (`g` the
    /// shared expert's gate vector), kept apart until [`Step::AddShared`].
    SharedExpert(Activation),
    /// `xb +=` what was kept apart: the gated shared expert's output (Qwen3.5-MoE: the routed
    /// experts' sum first, then the shared expert added to it, llama.cpp's
    /// `moe_out + ffn_shexp`), or the dense MLP's set aside by [`Step::SetAside`] (Gemma 4:
    /// `cur_mlp + cur_moe`, the same bits in either order).
    AddShared,
    /// `aside = rms_norm(xb) · w`: the dense MLP's output under its own post-norm
    /// (`post_ffw_norm_1`), kept apart while the experts run (Gemma 4's MoE layers).
    SetAside,
    /// `xb = rms_norm(x) · (1/sqrt(dim)) · s`: the router's input, the residual stream
    /// RMS-normed without weight, scaled, times `ffn_gate_inp.scale` (Gemma 4).
    RouterNorm,
    /// `xb = rms_norm(x) · w`: the experts' own pre-norm (`pre_ffw_norm_2`, Gemma 4).
    ExpertNorm,
    /// `xb = rms_norm(xb) · w`: the experts' weighted sum under its own post-norm
    /// (`post_ffw_norm_2`, Gemma 4).
    ExpertPostNorm,
    /// A linear-attention layer's input projections of `xb` (Qwen3.5's Gated DeltaNet): the
    /// fused q|k|v channels, the output gate `z`, and per value head β's and the decay's
    /// logits.
    DeltaProject,
    /// Each sequence's causal conv1d of the q|k|v channels over the inputs its recurrent
    /// state keeps and its new rows, then SiLU; the state keeps the last `taps − 1` inputs.
    Conv,
    /// The gated delta rule: q/k L2-normed, β = sigmoid, decay = softplus(α + dt) · a, then
    /// per sequence and value head one token at a time (the same update for a prefill row
    /// and a decode step) through its state matrix, into `attn`.
    DeltaRule,
    /// `attn = rms_norm(attn) · w · silu(z)` per value head.
    GatedNorm,
    /// The query projection's per-head query | gate halves split into `q` and the output
    /// gate (Qwen3.5's full-attention layers).
    SplitGate,
    /// `attn = attn · sigmoid(gate)`, the attention output gated before its projection.
    OutGate,
    /// Head: the rows whose logits are wanted, gathered into `xb`.
    Gather,
    /// Head: the final norm of the gathered rows.
    FinalNorm,
    /// Head: `logits = tanh(logits / cap) · cap` (Gemma 2).
    Softcap,
    /// The values are the keys' projection, before the key norm (Gemma 4 layers without
    /// `attn_v`).
    KeyAsValue,
    /// Per-head RMS norms of the values, without weight (Gemma 4).
    VNorm,
    /// Causal attention over the KV that layer `layer` stored, over the last `window`
    /// positions when the layer has a sliding window: a layer that stores no KV of its own
    /// (Gemma 4's KV-sharing layers; its own projection is the queries alone).
    AttendShared { window: Option<usize>, layer: usize },
    /// Before the first layer: every layer's per-layer input of each row, from its token's
    /// per-layer embedding and a projection of its (scaled) embedding (Gemma 4 E2B/E4B).
    PerLayerInputs,
    /// `x += rms_norm(proj · (gelu(gate · x) · input)) · w` with this layer's per-layer
    /// input (Gemma 4 E2B/E4B).
    PerLayerEmbed,
    /// `x *= s`, the layer's output scale (Gemma 4).
    LayerScale,
}

/// What one layer holds beyond the matrices every layer has (the features its steps depend
/// on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerParts {
    /// q/k/v in one matrix and gate/up in one (Phi-3).
    pub fused: bool,
    /// q/k/v biases.
    pub bias: bool,
    /// Per-head q/k norms.
    pub qk_norm: bool,
    /// Post-attention and post-feed-forward norms.
    pub post_norms: bool,
    /// A sliding-window layer of a model whose sliding-window RoPE angles differ.
    pub swa_rope: bool,
    /// A Mixture-of-Experts feed-forward block (the model's `moe` configuration).
    pub moe: bool,
    /// A bias on the attention output projection.
    pub out_bias: bool,
    /// Attention sinks.
    pub sinks: bool,
    /// Linear attention (Gated DeltaNet) in place of attention: no KV, a recurrent state.
    pub linear: bool,
    /// The query projection carries a sigmoid output gate per head (Qwen3.5).
    pub out_gate: bool,
    /// A shared expert with a sigmoid gate beside the routed experts (Qwen3.5-MoE).
    pub shared_expert: bool,
    /// A dense MLP beside the routed experts, each branch with its own norms, and a router
    /// on the residual stream's own RMS norm (Gemma 4's MoE layers).
    pub mlp_beside: bool,
    /// The values are the keys' projection (Gemma 4 layers without `attn_v`).
    pub key_as_value: bool,
    /// Values RMS-normed per head without weight (Gemma 4).
    pub v_norm: bool,
    /// The layer stores no KV and attends over this earlier layer's (Gemma 4).
    pub kv_from: Option<usize>,
    /// A per-layer token embedding enters after the feed-forward block (Gemma 4 E2B/E4B).
    pub per_layer_input: bool,
    /// The layer's output is scaled (Gemma 4's `layer_output_scale`).
    pub out_scale: bool,
    /// A bias after each pre-norm (phimoe).
    pub norm_bias: bool,
    /// Multi-head Latent Attention (DeepSeek).
    pub latent: bool,
}

/// Where a step runs: in layer `l` or in the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Layer(usize),
    Head,
}

/// The steps of every layer and of the head, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    layers: Vec<Vec<Step>>,
    head: Vec<Step>,
}

impl Plan {
    /// The plan of a model with configuration `c` whose layers hold `parts` (one per layer).
    pub fn new(c: &ModelConfig, parts: impl IntoIterator<Item = LayerParts>) -> Plan {
        let layers = parts
            .into_iter()
            .enumerate()
            .map(|(l, p)| layer_steps(c, l, p))
            .collect();
        let mut head = vec![Step::Gather, Step::FinalNorm, Step::Project(Matrix::Logits)];
        if c.norm_bias {
            head.insert(2, Step::FinalNormBias);
            head.push(Step::LogitBias);
        }
        if c.final_softcap.is_some() {
            head.push(Step::Softcap);
        }
        Plan { layers, head }
    }

    /// The steps of layer `l`.
    pub fn layer(&self, l: usize) -> &[Step] {
        &self.layers[l]
    }

    /// The number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// The head's steps.
    pub fn head(&self) -> &[Step] {
        &self.head
    }

    /// The steps at `place`.
    pub fn steps(&self, place: Place) -> &[Step] {
        match place {
            Place::Layer(l) => self.layer(l),
            Place::Head => self.head(),
        }
    }

    /// Every place with its steps, layers first, in the order a forward pass runs them.
    pub fn places(&self) -> impl Iterator<Item = (Place, &[Step])> {
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(l, s)| (Place::Layer(l), s.as_slice()));
        layers.chain(std::iter::once((Place::Head, self.head.as_slice())))
    }
}

/// Layer `l`'s steps: the attention block (or linear attention), then the feed-forward block.
fn layer_steps(c: &ModelConfig, l: usize, p: LayerParts) -> Vec<Step> {
    let mut s = if p.linear {
        vec![
            Step::Norm(Block::Attn),
            Step::DeltaProject,
            Step::Conv,
            Step::DeltaRule,
            Step::GatedNorm,
            Step::Project(Matrix::Out),
        ]
    } else {
        attention_steps(c, l, p)
    };
    if p.post_norms {
        s.push(Step::PostNorm(Block::Attn));
    }
    s.extend([Step::Residual, Step::Norm(Block::Ffn)]);
    if p.norm_bias {
        s.push(Step::NormBias(Block::Ffn));
    }
    match c.moe.filter(|_| p.moe) {
        // llama.cpp's gemma4.cpp: `ffn_post_norm(post_norm_1(mlp(ffn_norm(x))) +
        // post_norm_2(experts(pre_norm_2(x))))`, routed by `rms_norm(x) / sqrt(dim) · s`.
        Some(moe) if p.mlp_beside => s.extend([
            Step::Project(Matrix::GateUp),
            Step::Gated(c.activation),
            Step::Project(Matrix::Down),
            Step::SetAside,
            Step::RouterNorm,
            Step::Route(moe.gating),
            Step::ExpertNorm,
            Step::Experts(c.activation),
            Step::Combine,
            Step::ExpertPostNorm,
            Step::AddShared,
        ]),
        Some(moe) if p.shared_expert => s.extend([
            Step::Route(moe.gating),
            Step::Experts(c.activation),
            Step::SharedExpert(c.activation),
            Step::Combine,
            Step::AddShared,
        ]),
        Some(moe) => s.extend([
            Step::Route(moe.gating),
            Step::Experts(c.activation),
            Step::Combine,
        ]),
        None => {
            s.push(Step::Project(Matrix::GateUp));
            if p.fused {
                s.push(Step::Split(Matrix::GateUp));
            }
            s.extend([Step::Gated(c.activation), Step::Project(Matrix::Down)]);
        }
    }
    if p.post_norms {
        s.push(Step::PostNorm(Block::Ffn));
    }
    s.push(Step::Residual);
    if p.per_layer_input {
        if l == 0 {
            s.insert(0, Step::PerLayerInputs);
        }
        s.push(Step::PerLayerEmbed);
    }
    if p.out_scale {
        s.push(Step::LayerScale);
    }
    s
}

/// The attention block's steps up to its output projection (and bias).
fn attention_steps(c: &ModelConfig, l: usize, p: LayerParts) -> Vec<Step> {
    let mut s = vec![Step::Norm(Block::Attn)];
    if p.norm_bias {
        s.push(Step::NormBias(Block::Attn));
    }
    if p.latent {
        s.extend([Step::LatentProject, Step::Absorb]);
    } else {
        s.push(Step::Project(Matrix::Qkv));
    }
    if p.out_gate {
        s.push(Step::SplitGate);
    }
    if p.fused {
        s.push(Step::Split(Matrix::Qkv));
    }
    if p.key_as_value {
        s.push(Step::KeyAsValue);
    }
    if p.bias {
        s.push(Step::Bias);
    }
    if p.qk_norm {
        s.push(Step::QkNorm);
    }
    if p.v_norm {
        s.push(Step::VNorm);
    }
    let table = if p.swa_rope {
        RopeTable::Swa
    } else {
        RopeTable::Full
    };
    // SmolLM3's NoPE layers store and attend over their keys unrotated (llama.cpp skips
    // `ggml_rope_ext` on q and k alike).
    if c.rope(l) {
        s.push(Step::Rope(table));
    }
    if p.kv_from.is_none() {
        s.push(Step::KvWrite);
    }
    if c.attn_temp.is_some() {
        s.push(Step::QueryTemp);
    }
    s.push(match p.kv_from {
        Some(layer) => Step::AttendShared {
            window: c.window(l),
            layer,
        },
        None => Step::Attention {
            window: c.window(l),
            sinks: p.sinks,
        },
    });
    if p.out_gate {
        s.push(Step::OutGate);
    }
    if p.latent {
        s.push(Step::Expand);
    }
    s.push(Step::Project(Matrix::Out));
    if p.out_bias {
        s.push(Step::OutBias);
    }
    s
}

/// The steps a forward pass executed, recorded for tests (compiled for the unit tests and
/// with the `testkit` feature only: nothing is recorded, or compiled, in a release build).
/// Recording is per thread and off until [`trace::start`].
#[cfg(any(test, feature = "testkit"))]
pub mod trace {
    use std::cell::RefCell;

    use super::{Place, Step};

    /// One recorded event: a CPU step, or a GPU launch (its index in the place's lowering
    /// and its kernel's name).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Event {
        Step(Place, Step),
        Launch(Place, usize, &'static str),
    }

    thread_local! {
        static EVENTS: RefCell<Option<Vec<Event>>> = const { RefCell::new(None) };
    }

    /// Starts recording on this thread (dropping anything recorded before).
    pub fn start() {
        EVENTS.with(|e| *e.borrow_mut() = Some(Vec::new()));
    }

    /// Stops recording on this thread; what was recorded since [`start`].
    pub fn take() -> Vec<Event> {
        EVENTS.with(|e| e.borrow_mut().take().unwrap_or_default())
    }

    /// Records `event` when this thread is recording.
    pub fn record(event: Event) {
        EVENTS.with(|e| {
            if let Some(v) = e.borrow_mut().as_mut() {
                v.push(event);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::arch::Arch;
    use Block::*;
    use Matrix::*;
    use Step::*;

    fn config(arch: Arch, act: Activation, window: Option<usize>, cap: Option<f32>) -> ModelConfig {
        ModelConfig {
            architecture: arch.gguf_name().into(),
            arch,
            n_layer: 2,
            dim: 64,
            ffn_dim: 128,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 16,
            rope_dim: 16,
            rope_neox: false,
            rope_base: 10000.0,
            rope_base_swa: 10000.0,
            rope_scale: 1.0,
            rope_scale_swa: 1.0,
            rms_eps: 1e-5,
            context_len: 64,
            vocab_size: 32,
            embed_scale: None,
            activation: act,
            attn_scale: 0.25,
            attn_softcap: None,
            final_softcap: cap,
            sliding_window: window,
            swa_layers: vec![true, false],
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

    /// Table: each feature adds its steps at its place, and only there.
    #[test]
    fn each_feature_adds_its_steps_in_place() {
        let llama = config(Arch::Llama, Activation::Silu, None, None);
        let plain = Plan::new(&llama, [LayerParts::default(); 2]);
        let base = [
            Norm(Attn),
            Project(Qkv),
            Rope(RopeTable::Full),
            KvWrite,
            Attention {
                window: None,
                sinks: false,
            },
            Project(Out),
            Residual,
            Norm(Ffn),
            Project(GateUp),
            Gated(Activation::Silu),
            Project(Down),
            Residual,
        ];
        assert_eq!(plain.layer(0), base);
        assert_eq!(plain.head(), [Gather, FinalNorm, Project(Logits)]);

        let phi3 = Plan::new(
            &llama,
            [LayerParts {
                fused: true,
                ..LayerParts::default()
            }],
        );
        let l = phi3.layer(0);
        assert_eq!(l[2], Split(Qkv));
        assert_eq!(l[10], Split(GateUp));
        assert_eq!(l.len(), base.len() + 2);

        let qwen2 = LayerParts {
            bias: true,
            ..LayerParts::default()
        };
        assert_eq!(
            Plan::new(&llama, [qwen2]).layer(0)[2..4],
            [Bias, Rope(RopeTable::Full)]
        );

        let gemma3 = config(Arch::Gemma3, Activation::GeluTanh, Some(8), Some(30.0));
        let parts = LayerParts {
            qk_norm: true,
            post_norms: true,
            swa_rope: true,
            ..LayerParts::default()
        };
        let p = Plan::new(
            &gemma3,
            [
                parts,
                LayerParts {
                    swa_rope: false,
                    ..parts
                },
            ],
        );
        assert_eq!(
            p.layer(0),
            [
                Norm(Attn),
                Project(Qkv),
                QkNorm,
                Rope(RopeTable::Swa),
                KvWrite,
                Attention {
                    window: Some(8),
                    sinks: false,
                },
                Project(Out),
                PostNorm(Attn),
                Residual,
                Norm(Ffn),
                Project(GateUp),
                Gated(Activation::GeluTanh),
                Project(Down),
                PostNorm(Ffn),
                Residual,
            ]
        );
        assert_eq!(
            p.layer(1)[3..6],
            [
                Rope(RopeTable::Full),
                KvWrite,
                Attention {
                    window: None,
                    sinks: false
                }
            ]
        );
        assert_eq!(p.head().last(), Some(&Softcap));
        let places: Vec<Place> = p.places().map(|(pl, _)| pl).collect();
        assert_eq!(places, [Place::Layer(0), Place::Layer(1), Place::Head]);
    }

    /// A Mixture-of-Experts layer routes, runs its experts and combines them where a dense
    /// layer projects gate/up, gates and projects down; the attention block is unchanged.
    #[test]
    fn an_moe_layer_routes_instead_of_the_dense_block() {
        use crate::model::arch::MoeConfig;
        let gating = Gating::SoftmaxTopK { normalize: true };
        let mut c = config(Arch::Qwen3Moe, Activation::Silu, None, None);
        c.moe = Some(MoeConfig {
            experts: 8,
            used: 2,
            ffn_dim: 32,
            gating,
            shared_ffn: None,
            shared_gated: true,
            dense_lead: 0,
            groups: None,
            weights_scale: 1.0,
        });
        let moe = LayerParts {
            qk_norm: true,
            moe: true,
            ..LayerParts::default()
        };
        let p = Plan::new(&c, [moe, LayerParts { moe: false, ..moe }]);
        assert_eq!(
            p.layer(0)[8..],
            [
                Norm(Ffn),
                Route(gating),
                Experts(Activation::Silu),
                Combine,
                Residual
            ]
        );
        assert_eq!(
            p.layer(1)[8..],
            [
                Norm(Ffn),
                Project(GateUp),
                Gated(Activation::Silu),
                Project(Down),
                Residual
            ]
        );
        assert_eq!(p.layer(0)[..8], p.layer(1)[..8]);
    }

    /// Qwen3.5: a linear layer projects, convolves, runs the delta rule and its gated norm
    /// where attention was; a full-attention layer splits its output gate off the queries and
    /// gates the attention output before projecting it; the feed-forward block is unchanged.
    #[test]
    fn a_hybrid_model_has_linear_and_gated_attention_layers() {
        let c = config(Arch::Qwen35, Activation::Silu, None, None);
        let linear = LayerParts {
            linear: true,
            ..LayerParts::default()
        };
        let full = LayerParts {
            qk_norm: true,
            out_gate: true,
            ..LayerParts::default()
        };
        let p = Plan::new(&c, [linear, full]);
        // A dense layer's steps after its output projection.
        let dense = Plan::new(&c, [LayerParts::default()]);
        let ffn = &dense.layer(0)[6..];
        assert_eq!(ffn[0], Residual);
        let mut want = vec![
            Norm(Attn),
            DeltaProject,
            Conv,
            DeltaRule,
            GatedNorm,
            Project(Out),
        ];
        want.extend(ffn);
        assert_eq!(p.layer(0), want);
        let mut want = vec![
            Norm(Attn),
            Project(Qkv),
            SplitGate,
            QkNorm,
            Rope(RopeTable::Full),
            KvWrite,
            Attention {
                window: None,
                sinks: false,
            },
            OutGate,
            Project(Out),
        ];
        want.extend(ffn);
        assert_eq!(p.layer(1), want);
    }

    /// Qwen3.5-MoE: a layer with a shared expert routes and runs its experts, then its shared
    /// expert (on the same normed input), combines the routed experts and adds the shared
    /// expert's output to their sum; the block before is the hybrid layer's.
    #[test]
    fn a_shared_expert_runs_after_the_routed_experts_and_is_added_to_their_sum() {
        use crate::model::arch::MoeConfig;
        let gating = Gating::SoftmaxTopK { normalize: true };
        let mut c = config(Arch::Qwen35Moe, Activation::Silu, None, None);
        c.moe = Some(MoeConfig {
            experts: 8,
            used: 2,
            ffn_dim: 32,
            gating,
            shared_ffn: Some(32),
            shared_gated: true,
            dense_lead: 0,
            groups: None,
            weights_scale: 1.0,
        });
        let linear = LayerParts {
            linear: true,
            moe: true,
            shared_expert: true,
            ..LayerParts::default()
        };
        let p = Plan::new(
            &c,
            [
                linear,
                LayerParts {
                    shared_expert: false,
                    ..linear
                },
            ],
        );
        assert_eq!(
            p.layer(0)[6..],
            [
                Residual,
                Norm(Ffn),
                Route(gating),
                Experts(Activation::Silu),
                SharedExpert(Activation::Silu),
                Combine,
                AddShared,
                Residual
            ]
        );
        assert_eq!(
            p.layer(1)[8..],
            [Route(gating), Experts(Activation::Silu), Combine, Residual]
        );
        assert_eq!(p.layer(0)[..8], p.layer(1)[..8]);
    }

    /// Gemma 4: values from the keys' projection before the q/k norms, the value norm after
    /// them, a sharing layer's attention over the earlier layer's KV with no KV write, the
    /// per-layer inputs before the first layer, each layer's per-layer embedding and output
    /// scale after its last residual.
    #[test]
    fn a_gemma4_model_has_its_steps_in_place() {
        let c = config(Arch::Gemma4, Activation::GeluTanhF16, Some(8), Some(30.0));
        let own = LayerParts {
            qk_norm: true,
            post_norms: true,
            swa_rope: true,
            key_as_value: true,
            v_norm: true,
            per_layer_input: true,
            out_scale: true,
            ..LayerParts::default()
        };
        let shared = LayerParts {
            swa_rope: false,
            key_as_value: false,
            v_norm: false,
            kv_from: Some(0),
            ..own
        };
        let p = Plan::new(&c, [own, shared]);
        let ffn = [
            PostNorm(Attn),
            Residual,
            Norm(Ffn),
            Project(GateUp),
            Gated(Activation::GeluTanhF16),
            Project(Down),
            PostNorm(Ffn),
            Residual,
            PerLayerEmbed,
            LayerScale,
        ];
        let mut want = vec![
            PerLayerInputs,
            Norm(Attn),
            Project(Qkv),
            KeyAsValue,
            QkNorm,
            VNorm,
            Rope(RopeTable::Swa),
            KvWrite,
            Attention {
                window: Some(8),
                sinks: false,
            },
            Project(Out),
        ];
        want.extend(ffn);
        assert_eq!(p.layer(0), want);
        let mut want = vec![
            Norm(Attn),
            Project(Qkv),
            QkNorm,
            Rope(RopeTable::Full),
            AttendShared {
                window: None,
                layer: 0,
            },
            Project(Out),
        ];
        want.extend(ffn);
        assert_eq!(p.layer(1), want);
    }

    /// Gemma 4's MoE layers: the dense MLP's output set aside, the router on its own norm, the
    /// experts on theirs, their post-norm, the two branches added before the feed-forward
    /// post-norm; a layer without a router keeps the dense block.
    #[test]
    fn a_gemma4_moe_layer_runs_the_mlp_beside_its_experts() {
        use crate::model::arch::MoeConfig;
        let gating = Gating::SoftmaxTopK { normalize: true };
        let act = Activation::GeluTanhF16;
        // No window: both layers' attention blocks are the same.
        let mut c = config(Arch::Gemma4, act, None, Some(30.0));
        c.moe = Some(MoeConfig {
            experts: 8,
            used: 2,
            ffn_dim: 32,
            gating,
            shared_ffn: None,
            shared_gated: true,
            dense_lead: 0,
            groups: None,
            weights_scale: 1.0,
        });
        let moe = LayerParts {
            qk_norm: true,
            post_norms: true,
            moe: true,
            mlp_beside: true,
            v_norm: true,
            ..LayerParts::default()
        };
        let dense = LayerParts {
            moe: false,
            mlp_beside: false,
            ..moe
        };
        let p = Plan::new(&c, [moe, dense]);
        let at = |l: usize| p.layer(l).iter().position(|&s| s == Norm(Ffn)).unwrap();
        assert_eq!(
            p.layer(0)[at(0)..],
            [
                Norm(Ffn),
                Project(GateUp),
                Gated(act),
                Project(Down),
                SetAside,
                RouterNorm,
                Route(gating),
                ExpertNorm,
                Experts(act),
                Combine,
                ExpertPostNorm,
                AddShared,
                PostNorm(Ffn),
                Residual,
            ]
        );
        assert_eq!(
            p.layer(1)[at(1)..],
            [
                Norm(Ffn),
                Project(GateUp),
                Gated(act),
                Project(Down),
                PostNorm(Ffn),
                Residual,
            ]
        );
        assert_eq!(p.layer(0)[..at(0)], p.layer(1)[..at(1)]);
    }

    /// mistral3's attention temperature: the queries scaled after RoPE and the KV write, right
    /// before attention (or before a shared-KV layer's attention, after RoPE); nothing else
    /// changes.
    #[test]
    fn the_attention_temperature_scales_the_queries_before_attention() {
        use crate::model::arch::AttnTemp;
        let mut c = config(Arch::Mistral3, Activation::Silu, None, None);
        let shared = LayerParts {
            kv_from: Some(0),
            ..LayerParts::default()
        };
        let plain = Plan::new(&c, [LayerParts::default(), shared]);
        c.attn_temp = Some(AttnTemp {
            scale: 0.1,
            floor_scale: 16,
        });
        let p = Plan::new(&c, [LayerParts::default(), shared]);
        for l in 0..2 {
            let at = plain
                .layer(l)
                .iter()
                .position(|s| matches!(s, Attention { .. } | AttendShared { .. }));
            let at = at.expect("attention");
            let mut want = plain.layer(l).to_vec();
            want.insert(at, QueryTemp);
            assert_eq!(p.layer(l), want, "layer {l}");
        }
        assert_eq!(
            p.layer(0)[2..6],
            [
                Rope(RopeTable::Full),
                KvWrite,
                QueryTemp,
                Attention {
                    window: None,
                    sinks: false
                }
            ]
        );
        assert_eq!(p.head(), plain.head());
    }

    /// Multi-head Latent Attention (DeepSeek): its projections and the absorption replace the
    /// q/k/v projection, the expansion of each head's output comes right before the output
    /// projection, and the rest (RoPE, KV write, the temperature, attention, the feed-forward
    /// block, the head) is the plain layer's.
    #[test]
    fn a_latent_layer_projects_absorbs_and_expands_around_attention() {
        use crate::model::arch::AttnTemp;
        let mut c = config(Arch::Deepseek2, Activation::Silu, None, None);
        let latent = LayerParts {
            latent: true,
            ..LayerParts::default()
        };
        let plain = Plan::new(&c, [LayerParts::default()]);
        let p = Plan::new(&c, [latent]);
        let mut want = plain.layer(0).to_vec();
        let qkv = want.iter().position(|s| *s == Project(Qkv)).expect("qkv");
        want.splice(qkv..qkv + 1, [LatentProject, Absorb]);
        let out = want.iter().position(|s| *s == Project(Out)).expect("out");
        want.insert(out, Expand);
        assert_eq!(p.layer(0), want);
        assert_eq!(p.head(), plain.head());
        c.attn_temp = Some(AttnTemp {
            scale: 0.1,
            floor_scale: 16,
        });
        let p = Plan::new(&c, [latent]);
        assert_eq!(
            p.layer(0)[1..8],
            [
                LatentProject,
                Absorb,
                Rope(RopeTable::Full),
                KvWrite,
                QueryTemp,
                Attention {
                    window: None,
                    sinks: false
                },
                Expand
            ]
        );
    }

    /// SmolLM3's NoPE layers: the layer named in `nope_layers` is the other's steps without
    /// RoPE (biases and q/k norms kept, the KV still written), and nothing
    /// else changes.
    #[test]
    fn a_nope_layer_is_the_same_layer_without_rope() {
        let mut c = config(Arch::Smollm3, Activation::Silu, None, None);
        c.nope_layers = vec![false, true];
        for parts in [
            LayerParts::default(),
            LayerParts {
                bias: true,
                qk_norm: true,
                ..LayerParts::default()
            },
        ] {
            let p = Plan::new(&c, [parts, parts]);
            let mut want = p.layer(0).to_vec();
            let at = want.iter().position(|s| matches!(s, Rope(_)));
            want.remove(at.expect("layer 0 rotates"));
            assert_eq!(p.layer(1), want);
            assert_eq!(p.layer(1)[at.unwrap()], KvWrite);
            let plain = Plan::new(&config(Arch::Llama, Activation::Silu, None, None), [parts]);
            assert_eq!((p.layer(0), p.head()), (plain.layer(0), plain.head()));
        }
        assert!(c.rope(0) && !c.rope(1) && c.rope(2), "past the end: RoPE");
    }

    #[test]
    fn the_trace_records_only_while_started() {
        trace::record(trace::Event::Step(Place::Head, Gather));
        trace::start();
        trace::record(trace::Event::Step(Place::Head, Softcap));
        assert_eq!(trace::take(), [trace::Event::Step(Place::Head, Softcap)]);
        trace::record(trace::Event::Step(Place::Head, Gather));
        assert!(trace::take().is_empty());
    }
}
