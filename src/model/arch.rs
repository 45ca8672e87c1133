//! What differs between the supported architectures, resolved once into a [`ModelConfig`]
//! that the one packed forward pass ([`super::transformer`]) reads: head geometry, RoPE layout and
//! frequencies, sliding-window layers, norms, activation, scales and soft-caps.
//!
//! One reader fills it from either GGUF metadata, with llama.cpp's key names and defaults
//! (`<arch>.block_count`, `<arch>.attention.sliding_window`, ...; see llama.cpp's
//! `llama-arch.cpp` and `models/<arch>.cpp`), or a Hugging Face `config.json`, with
//! transformers' names and defaults, driven by one description per architecture
//! ([`ArchSpec`]). What a file says that changes the arithmetic and is not implemented is
//! refused, never ignored. Weights come
//! through the [`TensorSource`] trait under GGUF tensor names, whatever the file format.
//! This module neither reads tensor data nor runs anything.

use std::f64::consts::PI;
use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QTensor};
use serde_json::Value as Json;

use super::error::{ModelError, Result};
use crate::weights::error::WeightsError;
use crate::weights::gguf::{md_f32, md_string, md_usize, GgufFile};
use crate::weights::mapped::MappedBytes;
use crate::weights::stored::StoredType;

/// Architectures the forward pass implements, by their GGUF `general.architecture` name, for
/// messages: read from [`ARCH_SPECS`], the one list.
pub fn supported_architectures() -> String {
    ARCH_SPECS
        .iter()
        .map(|s| s.gguf_name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A supported architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    /// Qwen3's attention with a Mixture-of-Experts feed-forward block in every layer.
    Qwen3Moe,
    /// Qwen3-VL's language model (GGUF `qwen3vl`) on text: qwen3's layers with interleaved
    /// multi-section RoPE (`ModelConfig::rope_sections`). Its deepstack inputs are zero for
    /// text tokens (llama.cpp pads a token's embedding with zeros), so text needs nothing more.
    Qwen3Vl,
    /// Qwen3-VL-MoE's language model (GGUF `qwen3vlmoe`, e.g. 30B-A3B) on text: qwen3moe's
    /// layers with Qwen3-VL's RoPE.
    Qwen3VlMoe,
    Gemma2,
    Gemma3,
    Phi3,
    /// Phi-3.5-MoE (GGUF `phimoe`) as llama.cpp runs it: phi3's graph with separate q/k/v
    /// carrying biases, biases on every norm, on the attention output and on the logits, and
    /// Mixtral-style experts (softmax, top-k, renormalised).
    PhiMoe,
    /// OpenAI's gpt-oss: attention sinks, alternating sliding-window layers, YaRN RoPE, q/k/v
    /// and output biases, experts with biases and SwiGLU-OAI.
    GptOss,
    /// Qwen3.5 (GGUF `qwen35`): Gated DeltaNet linear-attention layers between
    /// full-attention layers whose queries carry a sigmoid output gate; q/k norms,
    /// interleaved multi-section RoPE (the layer pattern and the DeltaNet geometry:
    /// `model::deltanet::Hybrid`).
    Qwen35,
    /// Qwen3.5-MoE (GGUF `qwen35moe`, e.g. 35B-A3B): qwen35's layers with a
    /// Mixture-of-Experts feed-forward block in every layer (softmax, top-k, renormalised) and
    /// beside it a shared expert gated by a sigmoid.
    Qwen35Moe,
    /// Qwen3-Next (GGUF `qwen3next`, 80B-A3B): qwen35moe's layers with its own linear-attention
    /// layout (value heads grouped by key head, β and α fused in `ssm_ba`, older files' fused
    /// q|k|v|z `ssm_in`) and plain partial RoPE instead of multi-section RoPE
    /// ([`ArchSpec::grouped_ssm`]).
    Qwen3Next,
    /// Gemma 4 (GGUF `gemma4`): sliding-window layers named per layer, with head sizes, KV
    /// heads and RoPE of their own; layers that read an earlier layer's KV; per-layer token
    /// embeddings (E2B/E4B); values RMS-normed, attention scale 1 (the per-layer geometry:
    /// `model::gemma4::PerLayer`).
    Gemma4,
    /// Mistral's 2025 models as llama.cpp converts them (GGUF `mistral3`: Ministral 3,
    /// Mistral Small 3.1/3.2): llama's layers with YaRN RoPE read from the file's own keys
    /// (`yarn_log_multiplier`, betas) and Llama-4-style attention temperature tuning
    /// ([`AttnTemp`]).
    Mistral3,
    /// SmolLM3 (GGUF `smollm3`): llama's layers, every fourth of which attends without RoPE
    /// (`ModelConfig::nope_layers`).
    Smollm3,
    /// DeepSeek-V2/V3/R1 and the models converted as they are (GGUF `deepseek2`: GLM-4.7-Flash,
    /// Moonlight, GigaChat 3, Kimi K2's layers): Multi-head Latent Attention ([`Mla`]), leading
    /// dense layers, then experts routed by DeepSeek's router ([`Gating::Deepseek`]) beside
    /// ungated shared experts.
    Deepseek2,
    /// GLM-4.5/4.6/4.7 and GLM-4.5-Air (GGUF `glm4moe`): q/k/v with biases (q/k norms in some
    /// files), partial NeoX RoPE, then DeepSeek's experts ([`MoeSpec::Deepseek`]: sigmoid
    /// gating with a selection bias, ungated shared experts, leading dense layers), the FFN's
    /// pre-norm named `post_attention_norm`.
    Glm4Moe,
    /// Mistral Small 4 (GGUF `mistral4`): deepseek2's layers (llama.cpp runs both through one
    /// graph), without deepseek2's YaRN special case, with attention temperature tuning.
    Mistral4,
}

impl Arch {
    /// From a GGUF `general.architecture` value.
    pub fn from_gguf_name(name: &str) -> Result<Arch> {
        ARCH_SPECS
            .iter()
            .find(|s| s.gguf_name == name)
            .map(|s| s.arch)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(name.to_string()))
    }

    /// From a Hugging Face `config.json` `model_type`.
    pub fn from_hf_model_type(name: &str) -> Result<Arch> {
        ARCH_SPECS
            .iter()
            .find(|s| s.hf_model_types.contains(&name))
            .map(|s| s.arch)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(name.to_string()))
    }

    pub fn gguf_name(self) -> &'static str {
        ArchSpec::of(self).gguf_name
    }

    /// Gemma 2 or 3: the family with post-attention and post-FFN norms, a scaled embedding
    /// and its own attention scale.
    pub fn is_gemma(self) -> bool {
        ArchSpec::of(self).gemma
    }

    /// Whether a checkpoint stores RMS-norm weights as `w` to be used as `1 + w` (Gemma's,
    /// Qwen3.5's and Qwen3-Next's but for their linear attention's gated norm; llama.cpp's
    /// converter adds the 1 when writing GGUF).
    pub fn norm_plus_one(self) -> bool {
        self.is_gemma() || matches!(self, Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next)
    }

    /// The tensor (after `blk.N.`) of the feed-forward block's pre-norm: gpt-oss calls it the
    /// post-attention norm (as its checkpoint's `post_attention_layernorm`).
    pub fn ffn_norm_tensor(self) -> &'static str {
        match self {
            Arch::GptOss | Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next | Arch::Glm4Moe => {
                "post_attention_norm.weight"
            }
            _ => "ffn_norm.weight",
        }
    }

    /// Whether q/k/v and gate/up are stored fused (`attn_qkv`, a `2·ffn`-row `ffn_up`).
    pub fn fused(self) -> bool {
        matches!(self, Arch::Phi3)
    }
}

/// The gated feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) · up`.
    Silu,
    /// `gelu_tanh(gate) · up` (Gemma), computed in f32 as transformers does (checkpoints).
    GeluTanh,
    /// `gelu_tanh(gate) · up` (Gemma) as llama.cpp's CPU backend computes it for GGUF files:
    /// the gate rounded to f16 and looked up in a table of f16 values (`0` at or below -10,
    /// the identity at or above 10).
    GeluTanhF16,
    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`, alpha 1.702, limit 7): with
    /// `x = min(gate, 7)` and `y = clamp(up, -7, 7)`, `x / (1 + e^(-1.702·x)) · (y + 1)`.
    SwigluOai,
}

/// How a Mixture-of-Experts router turns its logits into the chosen experts and their
/// weights (llama.cpp's `build_moe_ffn` gating functions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, the `used` largest probabilities, then (with `normalize`)
    /// those divided by their sum (Mixtral, Qwen3-MoE).
    SoftmaxTopK { normalize: bool },
    /// The `used` largest logits, then a softmax over those (gpt-oss).
    TopKSoftmax,
    /// DeepSeek's router (llama.cpp's `build_moe_ffn` with deepseek2's options): the
    /// probabilities a sigmoid of each logit (else a softmax over all); the experts chosen by
    /// the probabilities plus the layer's selection bias (`exp_probs_b`, when it has one)
    /// within the best groups ([`MoeConfig::groups`]); their weights the unbiased
    /// probabilities, with `normalize` divided by their sum, then times
    /// [`MoeConfig::weights_scale`].
    Deepseek { sigmoid: bool, normalize: bool },
}

/// The Mixture-of-Experts feed-forward block of a model whose layers route each token to a
/// few of their experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token is routed to.
    pub used: usize,
    /// Each expert's feed-forward width.
    pub ffn_dim: usize,
    pub gating: Gating,
    /// The width of the shared expert every layer has beside the routed ones (Qwen3.5-MoE:
    /// `expert_shared_feed_forward_length`, else `feed_forward_length`); `None`: none.
    pub shared_ffn: Option<usize>,
    /// Whether the shared expert's output is gated by a sigmoid (Qwen3.5-MoE's
    /// `ffn_gate_inp_shexp`; DeepSeek's shared experts are added as they are).
    pub shared_gated: bool,
    /// The first `dense_lead` layers have the dense feed-forward block of `feed_forward_length`
    /// instead (DeepSeek's `leading_dense_block_count`; 0 elsewhere).
    pub dense_lead: usize,
    /// Group-limited routing (`expert_group_count`, `expert_group_used_count`): the experts in
    /// `groups.0` groups of consecutive indices, a group scored by the sum of its two best
    /// selection scores, only the best `groups.1` groups' experts eligible (DeepSeek-V3).
    pub groups: Option<(usize, usize)>,
    /// The routing weights' scale (`expert_weights_scale`; 1: none).
    pub weights_scale: f32,
}

/// Multi-head Latent Attention (DeepSeek-V2/V3, GLM-4.7-Flash, Mistral 4) as
/// llama.cpp runs it, absorbed into multi-query attention over one cached latent per position:
/// a position's key is its RMS-normed compressed KV (`kv_lora` wide) beside the RoPE part it
/// shares across heads; its value the same latent; each head's query its no-RoPE part times
/// that head's `attn_k_b` beside its RoPE part; each head's attention output times its
/// `attn_v_b`. The configuration's `head_dim` is the cached key's width (`kv_lora` + RoPE),
/// with one KV head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mla {
    /// `attention.q_lora_rank`: the queries' low-rank width (0: one query matrix `attn_q`).
    pub q_lora: usize,
    /// `attention.kv_lora_rank`: the width of the cached latent.
    pub kv_lora: usize,
    /// Per head, the query and key dimensions without RoPE (`key_length_mla` − RoPE).
    pub nope: usize,
    /// Per head, the value width after `attn_v_b` (`value_length_mla`).
    pub v_head: usize,
}

/// The hyperparameters of a supported model, resolved from GGUF metadata or `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: String,
    pub arch: Arch,
    pub n_layer: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Number of leading dimensions of each head that RoPE rotates.
    pub rope_dim: usize,
    /// Rotate halves (`x[i]`, `x[i + rope_dim/2]`, GPT-NeoX style) rather than adjacent pairs.
    pub rope_neox: bool,
    pub rope_base: f32,
    /// RoPE base of sliding-window layers.
    pub rope_base_swa: f32,
    /// Linear RoPE position scale (1 = none) of full-attention layers.
    pub rope_scale: f32,
    /// Linear RoPE position scale of sliding-window layers.
    pub rope_scale_swa: f32,
    pub rms_eps: f32,
    pub context_len: usize,
    pub vocab_size: usize,
    /// Multiplies the token embedding (Gemma: `sqrt(dim)`).
    pub embed_scale: Option<f32>,
    pub activation: Activation,
    /// Multiplies `q · k` before the softmax.
    pub attn_scale: f32,
    /// Attention-score soft-cap `c · tanh(s / c)` (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Final-logit soft-cap (Gemma 2).
    pub final_softcap: Option<f32>,
    /// Sliding-window size: a query at `p` sees keys at `p - window + 1 ..= p`.
    pub sliding_window: Option<usize>,
    /// Per layer, whether it uses the sliding window.
    pub swa_layers: Vec<bool>,
    /// The Mixture-of-Experts feed-forward block of every layer, when the model has one
    /// (else every layer has the dense gate/up/down block of `ffn_dim`).
    pub moe: Option<MoeConfig>,
    /// YaRN RoPE scaling (where [`ArchSpec::yarn`] reads it), with `rope_scale` its factor.
    pub yarn: Option<Yarn>,
    /// Attention temperature tuning: the queries scaled by their position (mistral3).
    pub attn_temp: Option<AttnTemp>,
    /// Per layer, whether it attends without RoPE (SmolLM3's NoPE layers); a layer past the
    /// end rotates.
    pub nope_layers: Vec<bool>,
    /// LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini), when the file has its two sets of
    /// frequency factors.
    pub long_rope: Option<LongRope>,
    /// `rope.dimension_sections` of interleaved multi-section RoPE (Qwen3.5, Qwen3-VL;
    /// [`ArchSpec::mrope`]).
    pub rope_sections: Option<[usize; 4]>,
    /// Biases after every norm and on the logits ([`ArchSpec::norm_bias`], phimoe).
    pub norm_bias: bool,
    /// Multi-head Latent Attention ([`ArchSpec::mla`]).
    pub mla: Option<Mla>,
}

/// Phi-3's LongRoPE as llama.cpp runs it: two sets of per-pair frequency factors (GGUF
/// `rope_factors_long`/`rope_factors_short`), of which a context longer than the original
/// takes the long set (llama.cpp's `get_rope_factors`: `n_ctx_seq > n_ctx_orig_yarn`; a
/// Candor sequence may run to `context_len`, as llama.cpp's with its default context), and
/// every cosine and sine of RoPE times `attn_factor` (GGUF `rope.scaling.attn_factor`,
/// llama.cpp's `rope_attn_factor`; ggml's `rope_yarn` without extrapolation). The choice
/// depends on the file alone, never on a prompt's length, so a prompt's keys never change
/// as it grows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongRope {
    /// `rope.scaling.original_context_length` (`original_max_position_embeddings`).
    pub orig_ctx: usize,
    pub attn_factor: f32,
}

impl LongRope {
    /// Whether a model of `context_len` runs with the long factors.
    pub fn long(&self, context_len: usize) -> bool {
        context_len > self.orig_ctx
    }
}

/// Llama 4's attention temperature tuning as llama.cpp's `mistral3` applies it
/// (`llm_graph_input_attn_temp`): every query of a token at position `p`, after RoPE, times
/// [`AttnTemp::factor`]`(p)`, which grows with the logarithm of `p / floor_scale` and is 1 for
/// the first `floor_scale` positions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemp {
    /// `attention.temperature_scale` (transformers' `llama_4_scaling_beta`).
    pub scale: f32,
    /// Positions per step of the factor: llama.cpp's `n_attn_temp_floor_scale`, which
    /// `mistral3` sets to the original context (`rope.scaling.original_context_length`,
    /// else `context_length`).
    pub floor_scale: usize,
}

impl AttnTemp {
    /// `1 + scale · ln(1 + ⌊p / floor_scale⌋)` with llama.cpp's types: the position, its
    /// quotient and floor in f32, then the logarithm, product and sum in f64, rounded to f32
    /// (libllama is built without FMA contraction: each operation rounds).
    pub fn factor(&self, pos: usize) -> f32 {
        // llama.cpp adds its offset, 0 for mistral3, to the f32 position first: no change.
        let steps = (pos as f32 / self.floor_scale as f32).floor();
        ((f64::from(steps) + 1.0).ln() * f64::from(self.scale) + 1.0) as f32
    }
}

/// YaRN's parameters as llama.cpp derives them for a GGUF with `rope.scaling.type = yarn`
/// (`llama-context.cpp`, `ggml_rope_yarn_corr_dims`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// `rope.scaling.original_context_length`.
    pub orig_ctx: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub ext_factor: f32,
    /// llama.cpp's `yarn_attn_factor` after its corrections.
    pub attn_factor: f32,
    /// `rope.scaling.yarn_log_multiplier` as llama.cpp holds it (deepseek2's divided by 0.1,
    /// undoing its converter's factor; 0: none).
    pub log_mul: f32,
}

impl ModelConfig {
    /// Width of one token's keys (or values) across all KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Width of one token's queries across all heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The RoPE pairs that stay at position 0 for text (`None` without sections): llama.cpp's
    /// interleaved M-RoPE (`ggml_mrope_cache_init`, `is_imrope`) gives pair `i` the position
    /// of section `i % 3` while `i < 3 · sections[i % 3]`, else the fourth section's, which is
    /// 0 for text tokens (`llm_graph_input_pos::set_input`); the first three are the token's
    /// position.
    pub fn fixed_pairs(&self) -> Option<Vec<bool>> {
        Some(imrope_fixed_pairs(self.rope_sections?, self.rope_dim / 2))
    }

    /// Whether layer `l` rotates its queries and keys (every layer but SmolLM3's NoPE ones).
    pub fn rope(&self, l: usize) -> bool {
        !self.nope_layers.get(l).copied().unwrap_or(false)
    }

    /// The attention window of layer `l` (`None`: the whole context).
    pub fn window(&self, l: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| self.swa_layers.get(l).copied().unwrap_or(false))
    }

    /// Reads the configuration from a GGUF header; `vocab_size` comes from `token_embd`.
    pub fn from_gguf(content: &Content) -> Result<ModelConfig> {
        let name = md_string(content, "general.architecture")?;
        let spec = ArchSpec::of(Arch::from_gguf_name(&name)?);
        check_gguf_keys(spec, content)?;
        resolve(
            spec,
            &Fields::Gguf {
                content,
                prefix: &name,
            },
        )
    }

    /// Reads the configuration from a Hugging Face `config.json` (already parsed); `path`
    /// names the file in errors.
    pub fn from_hf_config(path: &Path, json: &Json) -> Result<ModelConfig> {
        let json = hf_text_config(path, json)?;
        let fields = Fields::Hf { path, json: &json };
        let model_type = json
            .get("model_type")
            .and_then(Json::as_str)
            .ok_or_else(|| fields.err_key("model_type", "missing".into()))?;
        let spec = ArchSpec::of(Arch::from_hf_model_type(model_type)?);
        check_hf_keys(spec, &fields)?;
        resolve(spec, &fields)
    }

    /// Consistency checks shared by both readers: `(key, message)` on failure.
    fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if self.n_kv_head == 0 || !self.n_head.is_multiple_of(self.n_kv_head) {
            return Err((
                "attention.head_count_kv",
                format!(
                    "{} kv heads do not divide {} heads",
                    self.n_kv_head, self.n_head
                ),
            ));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) || self.head_dim == 0 {
            return Err((
                "rope.dimension_count",
                format!(
                    "{} is odd or exceeds the head dimension {}",
                    self.rope_dim, self.head_dim
                ),
            ));
        }
        if let Some(s) = self.rope_sections {
            if s.iter().sum::<usize>() * 2 > self.head_dim || s[..3] == [0, 0, 0] {
                return Err((
                    "rope.dimension_sections",
                    format!("{s:?} do not fit heads of {}", self.head_dim),
                ));
            }
        }
        if self.n_layer == 0 || self.dim == 0 || self.ffn_dim == 0 || self.vocab_size == 0 {
            return Err(("block_count", "a zero dimension".into()));
        }
        Ok(())
    }

    /// The RoPE angles of full-attention (`swa = false`) or sliding-window layers; `factors`
    /// divide the frequencies (Llama 3 `rope_freqs`).
    pub fn rope_freqs(&self, swa: bool, factors: Option<&[f32]>) -> RopeFreqs {
        let (base, scale) = if swa {
            (self.rope_base_swa, self.rope_scale_swa)
        } else {
            (self.rope_base, self.rope_scale)
        };
        let freq_scale = 1.0 / scale;
        let yarn = self.yarn.map(|y| {
            // ggml_rope_yarn_corr_dims, and rope_yarn's magnitude scale.
            let n = self.rope_dim as f32;
            let dim = |rot: f32| {
                n * (y.orig_ctx as f32 / (rot * 2.0 * std::f32::consts::PI)).ln()
                    / (2.0 * base.ln())
            };
            let start = dim(y.beta_fast).floor();
            let end = dim(y.beta_slow).ceil();
            YarnRope {
                corr: [start.max(0.0), end.min(n - 1.0)],
                ext_factor: y.ext_factor,
                mscale: y.attn_factor * 0.1f32.mul_add((1.0 / freq_scale).ln(), 1.0),
            }
        });
        RopeFreqs {
            pairs: self.rope_dim / 2,
            theta_scale: base.powf(-2.0 / self.rope_dim as f32),
            freq_scale,
            factors: factors.map(|f| f[..self.rope_dim / 2].to_vec()),
            yarn,
            fixed: None,
            mscale: self.long_rope.map_or(1.0, |l| l.attn_factor),
        }
    }
}

/// How an architecture's layers use a sliding window, in both formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swa {
    /// Never (Llama): neither llama.cpp nor transformers applies one, so a window in the file
    /// (`> 0`) is refused.
    Never,
    /// Phi-3: a window in the file is accepted and not applied, as llama.cpp does (its
    /// converter writes Phi-3's `sliding_window`, its loader disables it).
    Disabled,
    /// Every layer slides when a window is set (Mistral).
    All,
    /// Gemma: `layer_types`, else `sliding_window_pattern`, else this pattern (llama.cpp's
    /// `set_swa_pattern`: the last layer of each group of `n` is full).
    Pattern(usize),
    /// Qwen 2/3: a GGUF has none (llama.cpp reads none, so `> 0` is refused); a `config.json`
    /// slides when `use_sliding_window`, on `layer_types`' sliding layers, else on the layers
    /// from `max_window_layers` (default 28) on, as transformers.
    Qwen,
}

/// Whether one format's reader takes a soft-cap key, and its value when the key is absent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cap {
    /// Not read for this architecture: a positive value in the file is refused.
    NotRead,
    /// Read; the default when absent (`None`: no cap).
    Read(Option<f32>),
}

/// Everything that differs between the architectures' readers, in one place: both the GGUF
/// reader (defaults as llama.cpp's loader) and the `config.json` reader (defaults as
/// transformers' config classes) are driven by it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArchSpec {
    pub arch: Arch,
    /// `general.architecture` and the GGUF key prefix.
    pub gguf_name: &'static str,
    /// `config.json` `model_type` values.
    pub hf_model_types: &'static [&'static str],
    /// `rms_norm_eps` when `config.json` omits it (a GGUF must carry its epsilon: llama.cpp
    /// requires the key).
    pub hf_rms_eps: f32,
    /// `max_position_embeddings` when omitted (a GGUF must carry `context_length`).
    pub hf_context_len: usize,
    /// `rope_theta` when omitted (GGUF: 10000 for every architecture, as llama.cpp).
    pub hf_rope_base: f32,
    /// RoPE base of sliding-window layers when the file gives none: `Some(b)`, or `None` for the
    /// full layers' base. `reads_rope_base_swa` says whether the file's key is read at all.
    pub rope_base_swa: Option<f32>,
    pub reads_rope_base_swa: bool,
    /// Whether sliding-window layers share the linear RoPE scaling (Gemma 3: only global
    /// layers are scaled).
    pub swa_rope_scaled: bool,
    pub swa: Swa,
    /// The window when the file gives none: GGUF (llama.cpp), `config.json` (transformers).
    pub default_window: (Option<usize>, Option<usize>),
    /// Attention-score soft-cap: GGUF, `config.json`.
    pub attn_softcap: (Cap, Cap),
    /// Final-logit soft-cap: GGUF, `config.json`.
    pub final_softcap: (Cap, Cap),
    /// GGUF q/k rows are permuted by llama.cpp's converter to rotate adjacent pairs (Llama,
    /// Mistral); every other case rotates halves.
    pub gguf_rope_adjacent: bool,
    /// Gemma: `sqrt(dim)` embedding scale, GELU, `query_pre_attn_scalar`, `1 + w` norms.
    pub gemma: bool,
    /// llama.cpp's layer count of the 27B model, whose GGUF attention scale is
    /// `1/sqrt(dim / heads)` (after gemma_pytorch).
    pub gguf_27b_layers: Option<usize>,
    /// `query_pre_attn_scalar` when omitted (transformers' Gemma default, 256).
    pub hf_query_pre_attn_scalar: Option<f32>,
    /// `config.json` `rope_scaling` of type `llama3` (frequency factors) is implemented.
    pub llama3_rope: bool,
    /// `tie_word_embeddings` when omitted (transformers).
    pub hf_tie_default: bool,
    /// Mixture-of-Experts feed-forward blocks: never, when the file declares experts
    /// (Mixtral is a `llama` file with `expert_count`), or always.
    pub moe: MoeSpec,
    /// GGUF `rope.scaling.type = yarn` is read (and a checkpoint's `rope_scaling` of type
    /// `yarn`, as llama.cpp's converter maps it). llama.cpp's loader reads it for every
    /// architecture (`llama-model.cpp`); Candor for those its YaRN is proven on against
    /// llama.cpp's tiny models: llama and Mixtral, qwen2, qwen3, qwen3moe and smollm3 (the
    /// generic keys only, `tests/it/yarn.rs`), gpt-oss, mistral3, deepseek2 and mistral4. Not
    /// for GGUF `mistral` (llama.cpp has no such architecture to check against), multi-section
    /// RoPE (qwen3vl*, qwen35*), qwen3next, glm4moe, Gemma or Phi-3.
    pub yarn: bool,
    /// The GGUF's `rope.scaling.yarn_beta_fast`, `yarn_beta_slow` and `yarn_log_multiplier`
    /// are read (llama.cpp's `mistral3` loader); elsewhere llama.cpp reads none of them, so a
    /// value other than its default is refused.
    pub yarn_keys: bool,
    /// `attention.temperature_scale` is read: Llama 4's attention temperature tuning
    /// ([`AttnTemp`], mistral3).
    pub attn_temp: bool,
    /// Gated DeltaNet layers between full-attention ones (Qwen3.5): the GGUF's `ssm.*`,
    /// `full_attention_interval` and `rope.dimension_sections` keys are read
    /// (`model::deltanet::Hybrid::from_gguf`).
    pub hybrid: bool,
    /// Each Mixture-of-Experts layer also has a shared expert with a sigmoid gate
    /// (`ffn_{gate,up,down}_shexp`, `ffn_gate_inp_shexp`; Qwen3.5-MoE); its width is read
    /// from `expert_shared_feed_forward_length`.
    pub shared_expert: bool,
    /// Geometry per layer (Gemma 4): `feed_forward_length` and `attention.head_count_kv` may
    /// be arrays (the config holds their largest value), sliding-window layers have their
    /// own head size and RoPE dimensions, the last layers share earlier layers' KV, and
    /// per-layer token embeddings (`model::gemma4::PerLayer::from_gguf`).
    pub per_layer: bool,
    /// The GGUF attention scale when it is fixed (Gemma 4: 1), else `1/sqrt(head_dim)`.
    pub gguf_attn_scale: Option<f32>,
    /// Every `n`-th layer (`(l + 1) % n == 0`) attends without RoPE: llama.cpp's
    /// `n_no_rope_layer_step`, which its smollm3 loader fixes at 4 (no GGUF key sets it).
    pub no_rope_step: Option<usize>,
    /// Qwen3-Next's linear-attention layout (llama.cpp's qwen3next.cpp): value head `h` reads
    /// key head `h / (v_heads / k_heads)` (its repeat-interleave; Qwen3.5's converter reorders
    /// the value heads so that qwen35 tiles them, `h mod k_heads`), β and α come fused per key
    /// head in `ssm_ba`, an older file's q|k|v|z come fused per key head in `ssm_in`, and the
    /// full-attention layers use plain RoPE (no `rope.dimension_sections`).
    pub grouped_ssm: bool,
    /// Every RMS norm is followed by a bias (`attn_norm.bias`, `ffn_norm.bias`,
    /// `output_norm.bias`, required), and the logits by one (`output.bias`): llama.cpp's
    /// phimoe (its `build_norm` with a bias after the weight).
    pub norm_bias: bool,
    /// Interleaved multi-section RoPE: the GGUF's `rope.dimension_sections` (required) says
    /// which pairs take which of a token's positions (Qwen3.5, Qwen3-VL; llama.cpp's
    /// `LLAMA_ROPE_TYPE_IMROPE`).
    pub mrope: bool,
    /// LongRoPE ([`LongRope`]) is read: the GGUF's `rope_factors_long`/`_short` tensors and
    /// `rope.scaling.attn_factor` (llama.cpp's phi3 loader), a `config.json`'s `rope_scaling`
    /// of type `longrope` (or `su`).
    pub long_rope: bool,
    /// Multi-head Latent Attention ([`Mla`]; llama.cpp's deepseek2 loader): the GGUF's
    /// `attention.q_lora_rank`, `kv_lora_rank`, `key_length_mla` and `value_length_mla` are
    /// read, `rope.scaling.yarn_log_multiplier` divided by 0.1, the attention scale
    /// `mscale² / sqrt(key_length_mla)`, and the attention temperature steps by
    /// `attention.temperature_length`; its layers' experts are [`MoeSpec::Deepseek`]'s.
    pub mla: bool,
    /// The file's `nextn_predict_layers` multi-token-prediction layers follow the trunk's in
    /// `block_count`; the forward pass runs the trunk (llama.cpp's `n_layer()`) and leaves
    /// their tensors unread (only drafting would run them).
    pub nextn: bool,
}

/// Whether an architecture's layers route tokens to experts, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoeSpec {
    /// Dense only: an expert count other than 0 is refused.
    Never,
    /// Experts when `expert_count` > 1 (llama.cpp's rule), with this gating; the experts'
    /// width is `feed_forward_length`.
    IfDeclared(Gating),
    /// Always experts, with this gating; their width is `expert_feed_forward_length`, else
    /// `feed_forward_length / expert_used_count` (llama.cpp's Qwen3-MoE loader).
    Always(Gating),
    /// Experts when `expert_count` > 1, with this gating; their width is
    /// `expert_feed_forward_length`, required (Gemma 4, whose `feed_forward_length` is the
    /// width of the dense MLP beside the experts).
    IfDeclaredOwnWidth(Gating),
    /// DeepSeek's experts when `expert_count` > 1 (llama.cpp's deepseek2 loader): width
    /// `expert_feed_forward_length`, `expert_shared_count` ungated shared experts of that
    /// width, `leading_dense_block_count` dense layers first, [`Gating::Deepseek`] as
    /// `expert_gating_func`, `expert_weights_norm` and `expert_weights_scale` say, and
    /// group-limited routing.
    Deepseek,
}

const BASE: ArchSpec = ArchSpec {
    arch: Arch::Llama,
    gguf_name: "llama",
    // Mixtral is a llama with experts (`num_local_experts`), in GGUF as in checkpoints.
    hf_model_types: &["llama", "mixtral"],
    hf_rms_eps: 1e-6,
    hf_context_len: 2048,
    hf_rope_base: 10_000.0,
    rope_base_swa: None,
    reads_rope_base_swa: false,
    swa_rope_scaled: true,
    swa: Swa::Never,
    default_window: (None, None),
    attn_softcap: (Cap::NotRead, Cap::NotRead),
    final_softcap: (Cap::NotRead, Cap::NotRead),
    gguf_rope_adjacent: true,
    gemma: false,
    gguf_27b_layers: None,
    hf_query_pre_attn_scalar: None,
    llama3_rope: true,
    hf_tie_default: false,
    moe: MoeSpec::IfDeclared(Gating::SoftmaxTopK { normalize: true }),
    yarn: false,
    yarn_keys: false,
    attn_temp: false,
    hybrid: false,
    shared_expert: false,
    per_layer: false,
    gguf_attn_scale: None,
    no_rope_step: None,
    mrope: false,
    norm_bias: false,
    grouped_ssm: false,
    long_rope: false,
    mla: false,
    nextn: false,
};

/// One description per supported architecture.
pub const ARCH_SPECS: &[ArchSpec] = &[
    // llama, and Mixtral (a llama file with experts): YaRN as llama.cpp's generic loader
    // reads it (type, factor, original context; the betas' defaults, no log multiplier).
    ArchSpec { yarn: true, ..BASE },
    ArchSpec {
        arch: Arch::Mistral,
        gguf_name: "mistral",
        hf_model_types: &["mistral"],
        hf_context_len: 4096 * 32,
        swa: Swa::All,
        default_window: (None, Some(4096)),
        moe: MoeSpec::Never,
        ..BASE
    },
    ArchSpec {
        arch: Arch::Qwen2,
        gguf_name: "qwen2",
        hf_model_types: &["qwen2"],
        hf_context_len: 32768,
        swa: Swa::Qwen,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Never,
        yarn: true,
        ..BASE
    },
    ArchSpec {
        arch: Arch::Qwen3,
        gguf_name: "qwen3",
        hf_model_types: &["qwen3"],
        hf_context_len: 32768,
        swa: Swa::Qwen,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Never,
        yarn: true,
        ..BASE
    },
    // Checkpoints too: each expert's `mlp.experts.{e}.{gate,up,down}_proj` read in place as
    // one row of the GGUF's 3-d tensors (`Checkpoint::read_experts_mapped`).
    ArchSpec {
        arch: Arch::Qwen3Moe,
        gguf_name: "qwen3moe",
        hf_model_types: &["qwen3_moe"],
        hf_context_len: 32768,
        swa: Swa::Qwen,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Always(Gating::SoftmaxTopK { normalize: true }),
        yarn: true,
        ..BASE
    },
    // GGUF only: the language models of Qwen3-VL (text only).
    ArchSpec {
        arch: Arch::Qwen3Vl,
        gguf_name: "qwen3vl",
        hf_model_types: &[],
        hf_context_len: 262144,
        swa: Swa::Qwen,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Never,
        mrope: true,
        ..BASE
    },
    ArchSpec {
        arch: Arch::Qwen3VlMoe,
        gguf_name: "qwen3vlmoe",
        hf_model_types: &[],
        hf_context_len: 262144,
        swa: Swa::Qwen,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Always(Gating::SoftmaxTopK { normalize: true }),
        mrope: true,
        ..BASE
    },
    ArchSpec {
        arch: Arch::Gemma2,
        gguf_name: "gemma2",
        hf_model_types: &["gemma2"],
        hf_context_len: 8192,
        reads_rope_base_swa: true,
        swa: Swa::Pattern(2),
        default_window: (Some(4096), Some(4096)),
        attn_softcap: (Cap::Read(Some(50.0)), Cap::Read(Some(50.0))),
        final_softcap: (Cap::Read(Some(30.0)), Cap::Read(Some(30.0))),
        gguf_rope_adjacent: false,
        gemma: true,
        gguf_27b_layers: Some(46),
        hf_query_pre_attn_scalar: Some(256.0),
        llama3_rope: false,
        hf_tie_default: true,
        moe: MoeSpec::Never,
        ..BASE
    },
    ArchSpec {
        arch: Arch::Gemma3,
        gguf_name: "gemma3",
        hf_model_types: &["gemma3_text", "gemma3"],
        hf_context_len: 131072,
        hf_rope_base: 1_000_000.0,
        rope_base_swa: Some(10_000.0),
        reads_rope_base_swa: true,
        swa_rope_scaled: false,
        swa: Swa::Pattern(6),
        default_window: (None, Some(4096)),
        attn_softcap: (Cap::NotRead, Cap::Read(None)),
        final_softcap: (Cap::Read(None), Cap::Read(None)),
        gguf_rope_adjacent: false,
        gemma: true,
        gguf_27b_layers: Some(62),
        hf_query_pre_attn_scalar: Some(256.0),
        llama3_rope: false,
        hf_tie_default: true,
        moe: MoeSpec::Never,
        ..BASE
    },
    ArchSpec {
        arch: Arch::Phi3,
        gguf_name: "phi3",
        hf_model_types: &["phi3"],
        hf_rms_eps: 1e-5,
        hf_context_len: 4096,
        swa: Swa::Disabled,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Never,
        long_rope: true,
        ..BASE
    },
    // GGUF only: llama.cpp's phimoe (phi3's graph; its norms RMS norms with biases).
    ArchSpec {
        arch: Arch::PhiMoe,
        gguf_name: "phimoe",
        hf_model_types: &[],
        hf_rms_eps: 1e-5,
        hf_context_len: 4096,
        swa: Swa::Disabled,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::IfDeclared(Gating::SoftmaxTopK { normalize: true }),
        norm_bias: true,
        long_rope: true,
        ..BASE
    },
    // Checkpoints as OpenAI publishes them (MXFP4 experts) or dequantized
    // (`model::checkpoint`): the converted GGUF's model.
    ArchSpec {
        arch: Arch::GptOss,
        gguf_name: "gpt-oss",
        hf_model_types: &["gpt_oss"],
        hf_rms_eps: 1e-5,
        hf_rope_base: 150_000.0,
        hf_context_len: 131072,
        reads_rope_base_swa: true,
        swa: Swa::Pattern(2),
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Always(Gating::TopKSoftmax),
        yarn: true,
        ..BASE
    },
    // Checkpoints too: the DeltaNet geometry from `config.json` (`Hybrid::from_hf`).
    ArchSpec {
        arch: Arch::Qwen35,
        gguf_name: "qwen35",
        hf_model_types: &["qwen3_5_text"],
        hf_context_len: 262144,
        swa: Swa::Qwen,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Never,
        hybrid: true,
        nextn: true,
        mrope: true,
        ..BASE
    },
    // qwen35's layers, qwen3moe's routing (llama.cpp's qwen35moe.cpp: softmax, top-k, the
    // weights renormalised, no scale, as transformers' Qwen3.5-MoE) and a shared expert.
    ArchSpec {
        arch: Arch::Qwen35Moe,
        gguf_name: "qwen35moe",
        hf_model_types: &["qwen3_5_moe_text"],
        hf_context_len: 262144,
        swa: Swa::Qwen,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Always(Gating::SoftmaxTopK { normalize: true }),
        hybrid: true,
        nextn: true,
        shared_expert: true,
        mrope: true,
        ..BASE
    },
    // qwen35moe's blocks in Qwen3-Next's layout (llama.cpp's qwen3next.cpp), which is its
    // checkpoints' own (`in_proj_qkvz`, `in_proj_ba`).
    ArchSpec {
        arch: Arch::Qwen3Next,
        gguf_name: "qwen3next",
        hf_model_types: &["qwen3_next"],
        hf_context_len: 262144,
        swa: Swa::Qwen,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Always(Gating::SoftmaxTopK { normalize: true }),
        hybrid: true,
        nextn: true,
        shared_expert: true,
        grouped_ssm: true,
        ..BASE
    },
    // GGUF only (the per-layer geometry is read from GGUF keys). Norm weights are used as
    // stored (its converter adds no 1).
    ArchSpec {
        arch: Arch::Gemma4,
        gguf_name: "gemma4",
        hf_model_types: &[],
        hf_context_len: 131072,
        reads_rope_base_swa: true,
        swa: Swa::Pattern(5),
        final_softcap: (Cap::Read(None), Cap::NotRead),
        gguf_rope_adjacent: false,
        gemma: true,
        llama3_rope: false,
        hf_tie_default: true,
        moe: MoeSpec::IfDeclaredOwnWidth(Gating::SoftmaxTopK { normalize: true }),
        per_layer: true,
        gguf_attn_scale: Some(1.0),
        ..BASE
    },
    // GGUF only (Ministral 3's and Mistral Small 3.x's checkpoints are FP8 or multimodal:
    // convert to GGUF). llama.cpp's mistral3.cpp: llama's layers and experts (softmax,
    // top-k, renormalised), adjacent RoPE pairs, no sliding window; YaRN with its keys; the
    // attention temperature. Its loader reads no `attention.scale` (refused as unread).
    ArchSpec {
        arch: Arch::Mistral3,
        gguf_name: "mistral3",
        hf_model_types: &["ministral3"],
        hf_rms_eps: 1e-5,
        hf_rope_base: 1_000_000.0,
        hf_context_len: 262144,
        llama3_rope: false,
        yarn: true,
        yarn_keys: true,
        attn_temp: true,
        ..BASE
    },
    // A checkpoint's `no_rope_layers` is read as it says (`nope_layers`). llama.cpp's
    // smollm3.cpp: llama's layers (adjacent RoPE pairs, its converter permutes q/k as
    // llama's), RoPE skipped on every fourth layer (YaRN's rotation and scale with it), the
    // output tied to the embedding when the file has none; no experts, no window.
    ArchSpec {
        arch: Arch::Smollm3,
        gguf_name: "smollm3",
        hf_model_types: &["smollm3"],
        hf_rope_base: 2_000_000.0,
        hf_context_len: 32768,
        hf_tie_default: true,
        llama3_rope: false,
        moe: MoeSpec::Never,
        no_rope_step: Some(4),
        yarn: true,
        ..BASE
    },
    // deepseek2's, and mistral4's the same (llama.cpp runs both through deepseek2.cpp).
    DEEPSEEK2,
    ArchSpec {
        arch: Arch::Mistral4,
        gguf_name: "mistral4",
        ..DEEPSEEK2
    },
    // GGUF only. llama.cpp's glm4-moe.cpp: NeoX RoPE over the file's rotary dimensions, no
    // window, no scaling keys; text files carry no `rope.dimension_sections` (GLM-4.5V's
    // multi-section RoPE is refused as an unread key).
    ArchSpec {
        arch: Arch::Glm4Moe,
        gguf_name: "glm4moe",
        hf_model_types: &["glm4_moe"],
        hf_rms_eps: 1e-5,
        hf_context_len: 131072,
        gguf_rope_adjacent: false,
        llama3_rope: false,
        moe: MoeSpec::Deepseek,
        nextn: true,
        ..BASE
    },
];

// GGUF only (a checkpoint's `kv_b_proj` would have to be split into `attn_k_b`/`attn_v_b`:
// convert to GGUF). llama.cpp's deepseek2.cpp: adjacent RoPE pairs (its converter permutes
// none; `LLAMA_ROPE_TYPE_NORM`), YaRN with the betas' defaults, no window.
const DEEPSEEK2: ArchSpec = ArchSpec {
    arch: Arch::Deepseek2,
    gguf_name: "deepseek2",
    hf_model_types: &[],
    llama3_rope: false,
    moe: MoeSpec::Deepseek,
    yarn: true,
    attn_temp: true,
    mla: true,
    nextn: true,
    ..BASE
};

impl ArchSpec {
    pub fn of(arch: Arch) -> &'static ArchSpec {
        ARCH_SPECS
            .iter()
            .find(|s| s.arch == arch)
            .expect("every architecture has a description")
    }
}

/// A configuration quantity, named by each format in its own way.
#[derive(Debug, Clone, Copy)]
enum Field {
    Layers,
    Dim,
    Ffn,
    Heads,
    KvHeads,
    HeadDim,
    Eps,
    RopeBase,
    RopeBaseSwa,
    Context,
    Window,
    SwaPattern,
    AttnCap,
    FinalCap,
    Experts,
    ExpertsUsed,
    ExpertFfn,
    SharedFfn,
}

impl Field {
    /// (GGUF key after the architecture prefix, `config.json` key).
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Field::Layers => ("block_count", "num_hidden_layers"),
            Field::Dim => ("embedding_length", "hidden_size"),
            Field::Ffn => ("feed_forward_length", "intermediate_size"),
            Field::Heads => ("attention.head_count", "num_attention_heads"),
            Field::KvHeads => ("attention.head_count_kv", "num_key_value_heads"),
            Field::HeadDim => ("attention.key_length", "head_dim"),
            Field::Eps => ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
            Field::RopeBase => ("rope.freq_base", "rope_theta"),
            Field::RopeBaseSwa => ("rope.freq_base_swa", "rope_local_base_freq"),
            Field::Context => ("context_length", "max_position_embeddings"),
            Field::Window => ("attention.sliding_window", "sliding_window"),
            Field::SwaPattern => ("attention.sliding_window_pattern", "sliding_window_pattern"),
            Field::AttnCap => ("attn_logit_softcapping", "attn_logit_softcapping"),
            Field::FinalCap => ("final_logit_softcapping", "final_logit_softcapping"),
            Field::Experts => ("expert_count", "num_experts"),
            Field::ExpertsUsed => ("expert_used_count", "num_experts_per_tok"),
            Field::ExpertFfn => ("expert_feed_forward_length", "moe_intermediate_size"),
            Field::SharedFfn => (
                "expert_shared_feed_forward_length",
                "shared_expert_intermediate_size",
            ),
        }
    }

    /// The quantity's other names in `config.json`.
    fn hf_aliases(self) -> &'static [&'static str] {
        match self {
            // Mixtral's.
            Field::Experts => &["num_local_experts"],
            _ => &[],
        }
    }
}

/// The file a configuration is read from.
enum Fields<'a> {
    Gguf {
        content: &'a Content,
        prefix: &'a str,
    },
    Hf {
        path: &'a Path,
        json: &'a Json,
    },
}

impl Fields<'_> {
    fn gguf(&self) -> bool {
        matches!(self, Fields::Gguf { .. })
    }

    fn key(&self, f: Field) -> String {
        match self {
            Fields::Gguf { prefix, .. } => format!("{prefix}.{}", f.names().0),
            // The name the file uses, of the quantity's names (Mixtral's experts:
            // `num_local_experts`); the first when it names none.
            Fields::Hf { json, .. } => std::iter::once(f.names().1)
                .chain(f.hf_aliases().iter().copied())
                .find(|k| json.get(k).is_some_and(|v| !v.is_null()))
                .unwrap_or(f.names().1)
                .to_string(),
        }
    }

    fn err_key(&self, key: &str, msg: String) -> ModelError {
        match self {
            Fields::Gguf { .. } => ModelError::Metadata {
                key: key.to_string(),
                msg,
            },
            Fields::Hf { path, json } => ModelError::Config {
                path: path.to_path_buf(),
                key: v5_rope_key(json, key),
                msg,
            },
        }
    }

    fn err(&self, f: Field, msg: String) -> ModelError {
        self.err_key(&self.key(f), msg)
    }

    /// The `config.json` value of `key`, `null` counting as absent.
    fn json(&self, key: &str) -> Option<&Json> {
        match self {
            Fields::Hf { json, .. } => json.get(key).filter(|v| !v.is_null()),
            Fields::Gguf { .. } => None,
        }
    }

    /// Whether the file names the quantity at all (in `config.json`, even as `null`).
    fn present(&self, f: Field) -> bool {
        match self {
            Fields::Gguf { content, .. } => content.metadata.contains_key(&self.key(f)),
            Fields::Hf { json, .. } => json.get(self.key(f)).is_some(),
        }
    }

    /// A quantity read with `gguf` (a GGUF value) or `json` (a `config.json` value, `what`
    /// naming the expected kind in errors); `None` when absent.
    fn get<T>(
        &self,
        f: Field,
        gguf: fn(&Content, &str) -> Result<T, WeightsError>,
        json: fn(&Json) -> Option<T>,
        what: &str,
    ) -> Result<Option<T>> {
        match self {
            Fields::Gguf { content, .. } if self.present(f) => {
                Ok(Some(gguf(content, &self.key(f))?))
            }
            Fields::Gguf { .. } => Ok(None),
            Fields::Hf { .. } => match self.json(&self.key(f)) {
                None => Ok(None),
                Some(v) => json(v)
                    .map(Some)
                    .ok_or_else(|| self.err(f, format!("expected {what}, found {v}"))),
            },
        }
    }

    fn usize(&self, f: Field) -> Result<Option<usize>> {
        let json = |v: &Json| v.as_u64().map(|x| x as usize);
        self.get(f, md_usize, json, "an unsigned integer")
    }

    fn f32(&self, f: Field) -> Result<Option<f32>> {
        self.get(f, md_f32, |v| v.as_f64().map(|x| x as f32), "a number")
    }

    fn need(&self, f: Field) -> Result<usize> {
        self.usize(f)?.ok_or_else(|| self.err(f, "missing".into()))
    }

    /// A required quantity; with `per_layer`, a GGUF may give it as one value per layer
    /// (llama.cpp's `get_key_or_arr`), of which this is the largest (the per-layer values:
    /// [`gguf_per_layer`]).
    fn largest(&self, f: Field, per_layer: bool) -> Result<usize> {
        match self {
            Fields::Gguf { content, .. } if per_layer => {
                let key = self.key(f);
                if !content.metadata.contains_key(&key) {
                    return Err(self.err(f, "missing".into()));
                }
                let n = gguf_per_layer(content, &key, usize::MAX)?;
                n.into_iter()
                    .max()
                    .ok_or_else(|| self.err(f, "an empty array".into()))
            }
            _ => self.need(f),
        }
    }

    /// A soft-cap as `cap` reads it: the file's value (`0` or `config.json` `null`: none), else
    /// the default; a positive value where the reader takes none is refused.
    fn cap(&self, f: Field, cap: Cap, arch: Arch) -> Result<Option<f32>> {
        let present = self.present(f);
        let value = self.f32(f)?;
        match cap {
            // `0` (GGUF) or `null` (config.json) switches the cap off.
            Cap::Read(_) if present => Ok(value.filter(|&c| c > 0.0)),
            Cap::Read(default) => Ok(default),
            Cap::NotRead => match value.filter(|&c| c > 0.0) {
                Some(c) => Err(self.err(
                    f,
                    format!(
                        "{c}: Candor's {} forward pass applies no such soft-cap",
                        arch.gguf_name()
                    ),
                )),
                None => Ok(None),
            },
        }
    }
}

/// The one reader: `spec` says what the architecture reads and assumes, `f` is the file.
fn resolve(spec: &ArchSpec, f: &Fields) -> Result<ModelConfig> {
    let arch = spec.arch;
    let gguf = f.gguf();
    let n_layer = f.need(Field::Layers)?;
    // Before anything is sized by it: a corrupt count must not allocate per layer.
    check_layer_count(n_layer).map_err(|msg| f.err(Field::Layers, msg))?;
    // Multi-token-prediction (`nextn`) layers follow the trunk's in `block_count` (Qwen3.5,
    // DeepSeek, GLM: `ArchSpec::nextn`); the forward pass runs the trunk only (llama.cpp's
    // `n_layer()`).
    let n_layer = match f {
        Fields::Gguf { content, prefix } if spec.nextn => {
            let key = format!("{prefix}.nextn_predict_layers");
            let nextn = match content.metadata.contains_key(&key) {
                true => md_usize(content, &key)?,
                false => 0,
            };
            n_layer
                .checked_sub(nextn)
                .filter(|&n| n > 0)
                .ok_or_else(|| f.err_key(&key, format!("{nextn} of {n_layer} layers")))?
        }
        _ => n_layer,
    };
    let dim = f.need(Field::Dim)?;
    let ffn_dim = match spec.shared_expert && !f.present(Field::Ffn) {
        // A Qwen3.5-MoE file may give no dense width (llama.cpp reads the key as optional):
        // the shared expert's stands in for it, and must then be given.
        true => f.need(Field::SharedFfn)?,
        false => f.largest(Field::Ffn, spec.per_layer)?,
    };
    let n_head = f.need(Field::Heads)?;
    let n_kv_head = match f.present(Field::KvHeads) && spec.per_layer {
        true => f.largest(Field::KvHeads, true)?,
        false => f.usize(Field::KvHeads)?.unwrap_or(n_head),
    };
    if n_head == 0 {
        return Err(f.err(Field::Heads, "zero heads".into()));
    }
    let head_dim = match f.usize(Field::HeadDim)? {
        Some(h) => h,
        None if dim.is_multiple_of(n_head) => dim / n_head,
        None => {
            return Err(f.err(
                Field::Heads,
                format!("{n_head} heads do not divide the embedding length {dim}"),
            ))
        }
    };
    let rms_eps = match f.f32(Field::Eps)? {
        Some(e) => e,
        // llama.cpp requires the key.
        None if gguf => return Err(f.err(Field::Eps, "missing".into())),
        None => spec.hf_rms_eps,
    };
    let context_len = match f.usize(Field::Context)? {
        Some(c) => c,
        None if gguf => return Err(f.err(Field::Context, "missing".into())),
        None => spec.hf_context_len,
    };
    let rope_base =
        f.f32(Field::RopeBase)?
            .unwrap_or(if gguf { 10_000.0 } else { spec.hf_rope_base });
    let rope_base_swa = match f.f32(Field::RopeBaseSwa)? {
        Some(b) if spec.reads_rope_base_swa => b,
        Some(b) if b != rope_base => {
            return Err(f.err(
                Field::RopeBaseSwa,
                format!(
                    "{b}: Candor's {} forward pass has no separate sliding-window RoPE base",
                    arch.gguf_name()
                ),
            ))
        }
        _ => spec.rope_base_swa.unwrap_or(rope_base),
    };
    let (rope_dim, rope_scale, yarn, vocab_size, activation, attn_scale) = match f {
        Fields::Gguf { content, .. } => {
            let (rope_dim, rope_scale, yarn) = gguf_rope(spec, f, content, head_dim)?;
            let vocab_size = match content.tensor_infos.get("token_embd.weight") {
                Some(info) => info.shape.dims()[0],
                None => return Err(ModelError::MissingTensor("token_embd.weight".into())),
            };
            let activation = if spec.gemma {
                Activation::GeluTanhF16
            } else if arch == Arch::GptOss {
                Activation::SwigluOai
            } else {
                Activation::Silu
            };
            let attn_scale = if let Some(s) = spec.gguf_attn_scale {
                s
            } else if spec.gguf_27b_layers == Some(n_layer) {
                1.0 / ((dim / n_head) as f32).sqrt()
            } else {
                1.0 / (head_dim as f32).sqrt()
            };
            (
                rope_dim, rope_scale, yarn, vocab_size, activation, attn_scale,
            )
        }
        Fields::Hf { .. } => {
            let rope_dim = match f.json("partial_rotary_factor").and_then(Json::as_f64) {
                Some(p) => ((head_dim as f32 * p as f32) as usize) & !1,
                None => head_dim,
            };
            let vocab_size = f
                .json("vocab_size")
                .and_then(Json::as_u64)
                .ok_or_else(|| f.err_key("vocab_size", "missing".into()))?
                as usize;
            let act = f
                .json("hidden_activation")
                .or_else(|| f.json("hidden_act"))
                .and_then(Json::as_str)
                .unwrap_or(if spec.gemma {
                    "gelu_pytorch_tanh"
                } else {
                    "silu"
                });
            let activation = match act {
                // gpt-oss's experts clamp their SwiGLU whatever `hidden_act` says (its config
                // says `silu`); `check_hf_keys` holds its alpha and limit to Candor's.
                _ if arch == Arch::GptOss => Activation::SwigluOai,
                "silu" | "swish" => Activation::Silu,
                "gelu_pytorch_tanh" | "gelu_tanh" => Activation::GeluTanh,
                other => {
                    return Err(f.err_key(
                        "hidden_act",
                        format!("`{other}` is not supported (supported: silu, gelu_pytorch_tanh)"),
                    ))
                }
            };
            let qpas = match f.json("query_pre_attn_scalar") {
                Some(v) if spec.gemma => Some(v.as_f64().ok_or_else(|| {
                    f.err_key(
                        "query_pre_attn_scalar",
                        format!("expected a number, found {v}"),
                    )
                })? as f32),
                _ => spec.hf_query_pre_attn_scalar,
            };
            let attn_scale = 1.0 / qpas.unwrap_or(head_dim as f32).sqrt();
            let (rope_scale, yarn) = hf_rope_scale(spec, f)?;
            (
                rope_dim, rope_scale, yarn, vocab_size, activation, attn_scale,
            )
        }
    };
    let long_rope = match f {
        Fields::Gguf { content, .. } => gguf_long_rope(spec, f, content)?,
        Fields::Hf { .. } => hf_long_rope(spec, f, context_len)?,
    };
    let (sliding_window, swa_layers) = sliding(spec, f, n_layer)?;
    let moe = moe_config(spec, f, ffn_dim, n_layer, vocab_size)?;
    let attn_temp = match f {
        Fields::Gguf { .. } => gguf_attn_temp(spec, f)?,
        Fields::Hf { .. } => hf_attn_temp(spec, f)?,
    };
    let (mla, attn_scale) = match f {
        Fields::Gguf { content, prefix } if spec.mla => {
            let m = gguf_mla(f, content, prefix, head_dim, rope_dim, n_kv_head)?;
            (
                Some(m),
                mla_attn_scale(&m, rope_dim, rope_scale, yarn.as_ref()),
            )
        }
        _ => (None, attn_scale),
    };
    let config = ModelConfig {
        architecture: arch.gguf_name().to_string(),
        arch,
        n_layer,
        dim,
        ffn_dim,
        n_head,
        n_kv_head,
        head_dim,
        rope_dim,
        // Hugging Face checkpoints keep q/k unpermuted: rotate halves.
        rope_neox: !(gguf && spec.gguf_rope_adjacent),
        rope_base,
        rope_base_swa,
        rope_scale,
        rope_scale_swa: if spec.swa_rope_scaled {
            rope_scale
        } else {
            1.0
        },
        rms_eps,
        context_len,
        vocab_size,
        embed_scale: spec.gemma.then(|| (dim as f32).sqrt()),
        activation,
        attn_scale,
        attn_softcap: f.cap(
            Field::AttnCap,
            if gguf {
                spec.attn_softcap.0
            } else {
                spec.attn_softcap.1
            },
            arch,
        )?,
        final_softcap: f.cap(
            Field::FinalCap,
            if gguf {
                spec.final_softcap.0
            } else {
                spec.final_softcap.1
            },
            arch,
        )?,
        sliding_window,
        swa_layers,
        moe,
        yarn,
        attn_temp,
        nope_layers: nope_layers(spec, f, n_layer)?,
        long_rope,
        rope_sections: match f {
            Fields::Gguf { content, .. } if spec.mrope => Some(gguf_rope_sections(f, content)?),
            Fields::Hf { .. } if spec.mrope => Some(hf_rope_sections(f)?),
            _ => None,
        },
        norm_bias: spec.norm_bias,
        mla,
    };
    config.check().map_err(|(k, msg)| match f {
        Fields::Gguf { prefix, .. } => f.err_key(&format!("{prefix}.{k}"), msg),
        Fields::Hf { .. } => f.err_key(k, msg),
    })?;
    Ok(config)
}

/// A GGUF key holding one unsigned value, or an array of one per layer (`n_layer` of them;
/// `usize::MAX`: any length): the values.
pub fn gguf_per_layer(content: &Content, key: &str, n_layer: usize) -> Result<Vec<usize>> {
    use candle_core::quantized::gguf_file::Value;
    let err = |msg: String| ModelError::Metadata {
        key: key.to_string(),
        msg,
    };
    match content.metadata.get(key) {
        Some(Value::Array(a)) => {
            if n_layer != usize::MAX && a.len() != n_layer {
                return Err(err(format!("{} values for {n_layer} layers", a.len())));
            }
            a.iter()
                .map(|v| match v {
                    Value::U8(x) => Ok(usize::from(*x)),
                    Value::U16(x) => Ok(usize::from(*x)),
                    Value::U32(x) => Ok(*x as usize),
                    Value::U64(x) => Ok(*x as usize),
                    Value::I32(x) if *x >= 0 => Ok(*x as usize),
                    Value::I64(x) if *x >= 0 => Ok(*x as usize),
                    other => Err(err(format!("expected unsigned integers, found {other:?}"))),
                })
                .collect()
        }
        Some(_) => {
            let v = md_usize(content, key)?;
            Ok(vec![v; if n_layer == usize::MAX { 1 } else { n_layer }])
        }
        None => Err(err("missing".into())),
    }
}

/// Most experts a layer may declare (llama.cpp's `LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 512;

/// The Mixture-of-Experts block as `spec.moe` reads it: none for a dense architecture (or a
/// `llama` file declaring at most one expert, as llama.cpp), else the expert count, how many
/// each token uses and their width.
fn moe_config(
    spec: &ArchSpec,
    f: &Fields,
    ffn_dim: usize,
    n_layer: usize,
    vocab: usize,
) -> Result<Option<MoeConfig>> {
    let (gating, always, own_width) = match spec.moe {
        MoeSpec::Never => return Ok(None),
        MoeSpec::Deepseek => return deepseek_moe(spec, f, ffn_dim, n_layer, vocab),
        MoeSpec::IfDeclared(g) => (g, false, false),
        MoeSpec::Always(g) => (g, true, false),
        MoeSpec::IfDeclaredOwnWidth(g) => (g, false, true),
    };
    let experts = f.usize(Field::Experts)?.unwrap_or(0);
    if experts <= 1 {
        if always {
            return Err(f.err(
                Field::Experts,
                format!(
                    "{experts}: a {} model routes tokens to more than one expert",
                    spec.gguf_name
                ),
            ));
        }
        return Ok(None);
    }
    let used = experts_used(f, experts)?;
    let width = if own_width {
        f.need(Field::ExpertFfn)?
    } else if always {
        match f.usize(Field::ExpertFfn)? {
            Some(w) => w,
            // A gpt-oss config's `intermediate_size` is its experts' width (llama.cpp's
            // converter writes it as `expert_feed_forward_length`).
            None if spec.arch == Arch::GptOss && !f.gguf() => ffn_dim,
            None if f.present(Field::Ffn) => ffn_dim / used,
            None => return Err(f.err(Field::ExpertFfn, "missing".into())),
        }
    } else {
        ffn_dim
    };
    if width == 0 {
        return Err(f.err(Field::ExpertFfn, "a zero expert width".into()));
    }
    // llama.cpp: `expert_shared_feed_forward_length`, else `feed_forward_length`.
    let shared_ffn = match spec.shared_expert {
        true => Some(f.usize(Field::SharedFfn)?.unwrap_or(ffn_dim)),
        false => None,
    };
    if shared_ffn == Some(0) {
        return Err(f.err(Field::SharedFfn, "a zero shared-expert width".into()));
    }
    Ok(Some(MoeConfig {
        experts,
        used,
        ffn_dim: width,
        gating,
        shared_ffn,
        shared_gated: true,
        dense_lead: 0,
        groups: None,
        weights_scale: 1.0,
    }))
}

/// `expert_used_count` of a file declaring `experts` (> 1, at most [`MAX_EXPERTS`]) experts:
/// between 1 and the count.
fn experts_used(f: &Fields, experts: usize) -> Result<usize> {
    if experts > MAX_EXPERTS {
        return Err(f.err(
            Field::Experts,
            format!("{experts} experts, more than the {MAX_EXPERTS} any model has"),
        ));
    }
    let used = f.need(Field::ExpertsUsed)?;
    if used == 0 || used > experts {
        return Err(f.err(
            Field::ExpertsUsed,
            format!("{used} experts used per token of {experts}"),
        ));
    }
    Ok(used)
}

/// [`MoeSpec::Deepseek`]'s experts as llama.cpp's deepseek2 loader and `build_moe_ffn` read
/// them (GGUF only): none without `expert_count` > 1.
fn deepseek_moe(
    spec: &ArchSpec,
    f: &Fields,
    ffn_dim: usize,
    n_layer: usize,
    vocab: usize,
) -> Result<Option<MoeConfig>> {
    let Fields::Gguf { content, prefix } = f else {
        return hf_deepseek_moe(spec, f, n_layer);
    };
    let key = |k: &str| format!("{prefix}.{k}");
    let opt = |k: &str| -> Result<Option<usize>> {
        match content.metadata.contains_key(&key(k)) {
            true => Ok(Some(md_usize(content, &key(k))?)),
            false => Ok(None),
        }
    };
    let experts = f.usize(Field::Experts)?.unwrap_or(0);
    if experts <= 1 {
        return Ok(None);
    }
    let used = experts_used(f, experts)?;
    // glm4moe's loader falls back to `feed_forward_length / expert_used_count`.
    let width = match (f.usize(Field::ExpertFfn)?, spec.arch) {
        (Some(w), _) => w,
        (None, Arch::Glm4Moe) => ffn_dim / used,
        (None, _) => return Err(f.err(Field::ExpertFfn, "missing".into())),
    };
    if width == 0 {
        return Err(f.err(Field::ExpertFfn, "a zero expert width".into()));
    }
    // llama.cpp requires the key.
    let shared = opt("expert_shared_count")?
        .ok_or_else(|| f.err_key(&key("expert_shared_count"), "missing".into()))?;
    let normalize = match content.metadata.get(&key("expert_weights_norm")) {
        None => false,
        Some(v) => v
            .to_bool()
            .map_err(|e| f.err_key(&key("expert_weights_norm"), format!("expected a bool: {e}")))?,
    };
    let scale = match content.metadata.contains_key(&key("expert_weights_scale")) {
        true => md_f32(content, &key("expert_weights_scale"))?,
        false => 0.0,
    };
    // 0 (none): glm4moe's sigmoid; deepseek2's files: DeepSeek-V2's softmax, GLM-4.7-Flash's
    // (47 or 48 layers, its vocabulary of 154,880) sigmoid — llama.cpp's rules for files
    // without the key.
    let sigmoid = match opt("expert_gating_func")?.unwrap_or(0) {
        0 if spec.arch == Arch::Glm4Moe => true,
        0 => matches!(n_layer, 47 | 48) && vocab == 154_880,
        1 => false,
        2 => true,
        g => {
            return Err(f.err_key(
                &key("expert_gating_func"),
                format!("{g}: only softmax (1) and sigmoid (2) gating are implemented"),
            ))
        }
    };
    let groups = expert_groups(
        f,
        (experts, used),
        opt("expert_group_count")?.unwrap_or(0),
        opt("expert_group_used_count")?.unwrap_or(0),
        [&key("expert_group_count"), &key("expert_group_used_count")],
    )?;
    let dense_lead = opt("leading_dense_block_count")?.unwrap_or(0);
    Ok(Some(MoeConfig {
        experts,
        used,
        ffn_dim: width,
        gating: Gating::Deepseek { sigmoid, normalize },
        shared_ffn: (shared > 0).then_some(width * shared),
        shared_gated: false,
        dense_lead,
        // llama.cpp scales unless the scale is 0 or 1.
        weights_scale: if scale == 0.0 { 1.0 } else { scale },
        groups,
    }))
}

/// DeepSeek's group-limited routing of `experts` experts, `used` a token: `g` groups of which
/// `used_groups` are chosen (none for 0 or 1 group), checked as llama.cpp's loader needs them;
/// `keys` name the two counts in errors.
fn expert_groups(
    f: &Fields,
    (experts, used): (usize, usize),
    g: usize,
    used_groups: usize,
    keys: [&str; 2],
) -> Result<Option<(usize, usize)>> {
    if g <= 1 {
        return Ok(None);
    }
    if !experts.is_multiple_of(g) || used_groups == 0 || used_groups >= g {
        return Err(f.err_key(
            keys[0],
            format!("{g} groups of {experts} experts, {used_groups} used"),
        ));
    }
    // Each group's score is the sum of its two best experts'.
    if experts / g < 2 || used > used_groups * (experts / g) {
        return Err(f.err_key(
            keys[1],
            format!(
                "{used_groups} groups of {} cannot hold {used} experts",
                experts / g
            ),
        ));
    }
    Ok(Some((g, used_groups)))
}

/// [`MoeSpec::Deepseek`]'s experts from a GLM-4.5 checkpoint's `config.json` (`glm4_moe`:
/// `n_routed_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `n_shared_experts`,
/// `first_k_dense_replace`, `n_group`/`topk_group`, `norm_topk_prob`, `routed_scaling_factor`;
/// sigmoid gating with `e_score_correction_bias`), each required (transformers' defaults are
/// the largest model's), as llama.cpp's converter writes them ([`expert_groups`] checks the
/// groups). Only glm4moe reads checkpoints of these experts.
fn hf_deepseek_moe(spec: &ArchSpec, f: &Fields, n_layer: usize) -> Result<Option<MoeConfig>> {
    if spec.arch != Arch::Glm4Moe {
        return Ok(None);
    }
    let need = |k: &str| -> Result<&Json> {
        f.json(k).ok_or_else(|| {
            f.err_key(
                k,
                "missing: transformers' default is the largest model's".into(),
            )
        })
    };
    let count = |k: &str| -> Result<usize> {
        let v = need(k)?;
        v.as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| f.err_key(k, format!("expected an unsigned integer, found {v}")))
    };
    let experts = count("n_routed_experts")?;
    if experts <= 1 {
        return Ok(None);
    }
    let used = experts_used(f, experts)?;
    let width = count("moe_intermediate_size")?;
    if width == 0 {
        return Err(f.err_key("moe_intermediate_size", "a zero expert width".into()));
    }
    let shared = count("n_shared_experts")?;
    let dense_lead = count("first_k_dense_replace")?;
    if dense_lead > n_layer {
        return Err(f.err_key(
            "first_k_dense_replace",
            format!("{dense_lead} dense layers of {n_layer}"),
        ));
    }
    let normalize = need("norm_topk_prob")?
        .as_bool()
        .ok_or_else(|| f.err_key("norm_topk_prob", "expected a bool".into()))?;
    let scale = need("routed_scaling_factor")?
        .as_f64()
        .ok_or_else(|| f.err_key("routed_scaling_factor", "expected a number".into()))?
        as f32;
    let groups = expert_groups(
        f,
        (experts, used),
        count("n_group")?,
        count("topk_group")?,
        ["n_group", "topk_group"],
    )?;
    Ok(Some(MoeConfig {
        experts,
        used,
        ffn_dim: width,
        gating: Gating::Deepseek {
            sigmoid: true,
            normalize,
        },
        shared_ffn: (shared > 0).then_some(width * shared),
        shared_gated: false,
        dense_lead,
        weights_scale: if scale == 0.0 { 1.0 } else { scale },
        groups,
    }))
}

/// GGUF `rope.dimension_count` and the linear RoPE scale: `rope.scaling.type` defaults to
/// `linear` as in llama.cpp, with `rope.scaling.factor` (0 or absent: 1).
fn gguf_rope(
    spec: &ArchSpec,
    f: &Fields,
    content: &Content,
    head_dim: usize,
) -> Result<(usize, f32, Option<Yarn>)> {
    let Fields::Gguf { prefix, .. } = f else {
        unreachable!("GGUF fields")
    };
    let key = |k: &str| format!("{prefix}.{k}");
    let opt_usize = |k: &str| -> Result<Option<usize>> {
        match content.metadata.contains_key(&key(k)) {
            true => Ok(Some(md_usize(content, &key(k))?)),
            false => Ok(None),
        }
    };
    let opt_f32 = |k: &str| -> Result<Option<f32>> {
        match content.metadata.contains_key(&key(k)) {
            true => Ok(Some(md_f32(content, &key(k))?)),
            false => Ok(None),
        }
    };
    let rope_dim = opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
    if let Some(v) = opt_usize("attention.value_length")? {
        // Latent attention's cached value is the key without its RoPE part.
        let want = match spec.mla {
            true => head_dim.saturating_sub(rope_dim),
            false => head_dim,
        };
        if v != want {
            return Err(f.err_key(
                &key("attention.value_length"),
                format!("{v} differs from the key length {head_dim}"),
            ));
        }
    }
    let ty = match content.metadata.get(&key("rope.scaling.type")) {
        None => "linear".to_string(),
        Some(_) => md_string(content, &key("rope.scaling.type"))?,
    };
    let factor = match content.metadata.get(&key("rope.scaling.factor")) {
        None => 1.0,
        Some(_) => md_f32(content, &key("rope.scaling.factor"))?,
    };
    let scale = if factor == 0.0 { 1.0 } else { factor };
    match ty.as_str() {
        "none" => Ok((rope_dim, 1.0, None)),
        "linear" => Ok((rope_dim, scale, None)),
        "yarn" if spec.yarn => {
            // llama.cpp: the original context defaults to the training context; the betas
            // and `yarn_log_multiplier` are the file's where the loader reads them
            // (`spec.yarn_keys`), else its defaults (their values are checked by
            // `check_gguf_keys`); ext_factor 1; the attention factor (llama-context.cpp)
            // `get_mscale(factor, 1)`, or with a log multiplier `m`
            // `get_mscale(factor, 1) / get_mscale(factor, m)`, then times
            // `1 / (1 + 0.1 ln factor)`, which cancels the scale ggml's rope multiplies by.
            let orig_ctx = match opt_usize("rope.scaling.original_context_length")? {
                Some(c) if c > 0 => c,
                // llama.cpp's context takes the training context for 0 as for none.
                _ => md_usize(content, &key("context_length"))?,
            };
            let read = |k: &str, default: f32| -> Result<f32> {
                match spec.yarn_keys && content.metadata.contains_key(&key(k)) {
                    true => Ok(md_f32(content, &key(k))?),
                    false => Ok(default),
                }
            };
            let log_mul = match spec.mla {
                // llama.cpp's deepseek2 loader undoes its converter's factor 0.1
                // ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]).
                true => match opt_f32("rope.scaling.yarn_log_multiplier")? {
                    Some(m) => m / 0.1,
                    None => 0.0,
                },
                false => read("rope.scaling.yarn_log_multiplier", 0.0)?,
            };
            // llama.cpp's context special-cases deepseek2 (not mistral4): its `mscale` is the
            // log multiplier too, unless that is 1.
            let first = match spec.arch == Arch::Deepseek2 && log_mul != 1.0 {
                true => log_mul,
                false => 1.0,
            };
            let yarn = Yarn {
                orig_ctx,
                beta_fast: read("rope.scaling.yarn_beta_fast", YARN_BETA_FAST)?,
                beta_slow: read("rope.scaling.yarn_beta_slow", YARN_BETA_SLOW)?,
                ext_factor: 1.0,
                attn_factor: yarn_attn_factor(scale, first, log_mul),
                log_mul,
            };
            Ok((rope_dim, scale, Some(yarn)))
        }
        other => Err(f.err_key(
            &key("rope.scaling.type"),
            format!(
                "`{other}` is not supported for {} (supported: none, linear{})",
                spec.gguf_name,
                if spec.yarn { ", yarn" } else { "" }
            ),
        )),
    }
}

/// A GGUF's latent-attention geometry ([`Mla`], llama.cpp's deepseek2 loader): the KV and
/// query ranks (`q_lora_rank` 0: plain queries) and the per-head key and value widths, checked
/// against the cached key (`key_length` = `kv_lora_rank` + RoPE) and its one KV head.
fn gguf_mla(
    f: &Fields,
    content: &Content,
    prefix: &str,
    head_dim: usize,
    rope_dim: usize,
    n_kv_head: usize,
) -> Result<Mla> {
    let key = |k: &str| format!("{prefix}.{k}");
    let need = |k: &str| md_usize(content, &key(k)).map_err(ModelError::from);
    let q_lora = match content.metadata.contains_key(&key("attention.q_lora_rank")) {
        true => need("attention.q_lora_rank")?,
        false => 0,
    };
    let kv_lora = need("attention.kv_lora_rank")?;
    let k_mla = need("attention.key_length_mla")?;
    let v_head = need("attention.value_length_mla")?;
    if kv_lora == 0 || kv_lora + rope_dim != head_dim {
        return Err(f.err_key(
            &key("attention.key_length"),
            format!(
                "{head_dim}: latent attention caches kv_lora_rank {kv_lora} + RoPE {rope_dim} \
                 per position (a file converted without MLA is not supported: reconvert it)"
            ),
        ));
    }
    if k_mla <= rope_dim || v_head == 0 {
        return Err(f.err_key(
            &key("attention.key_length_mla"),
            format!("{k_mla} (value {v_head}): no room beside RoPE's {rope_dim} dimensions"),
        ));
    }
    if n_kv_head != 1 {
        return Err(f.err_key(
            &key("attention.head_count_kv"),
            format!("{n_kv_head}: latent attention caches one latent per position"),
        ));
    }
    Ok(Mla {
        q_lora,
        kv_lora,
        nope: k_mla - rope_dim,
        v_head,
    })
}

/// deepseek2's attention scale (llama.cpp's deepseek2.cpp, each operation rounded to f32):
/// `mscale² / sqrt(key_length_mla)` with `mscale = a · (1 + 0.1 ln s) · (1 + 0.1 m ln s)`,
/// where `a` is the YaRN attention factor (1 without YaRN), `s` the RoPE scale and `m` the
/// YaRN log multiplier.
fn mla_attn_scale(m: &Mla, rope_dim: usize, rope_scale: f32, yarn: Option<&Yarn>) -> f32 {
    let inv = 1.0 / (1.0 / rope_scale);
    let (attn_factor, log_mul) = yarn.map_or((1.0, 0.0), |y| (y.attn_factor, y.log_mul));
    let ln = inv.ln();
    let org = attn_factor * (1.0 + 0.1 * ln);
    let mscale = org * (1.0 + 0.1 * log_mul * ln);
    mscale * mscale / ((m.nope + rope_dim) as f32).sqrt()
}

/// YaRN's attention factor as `llama-context.cpp` derives it from the factor `scale`: the
/// `mscale` of `first` (1, or deepseek2's log multiplier) over that of the log multiplier
/// `log_mul` (when not 0), then times `1 / (1 + 0.1 ln factor)`, which cancels the scale ggml's
/// rope multiplies by.
fn yarn_attn_factor(scale: f32, first: f32, log_mul: f32) -> f32 {
    let factor = 1.0 / (1.0 / scale);
    // libllama is built without FMA contraction: each operation rounds.
    let mscale = |m: f32| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    let attn_factor = if log_mul != 0.0 {
        mscale(first) / mscale(log_mul)
    } else {
        mscale(1.0)
    };
    attn_factor * (1.0 / (1.0 + 0.1 * factor.ln()))
}

/// llama.cpp's YaRN betas (`llama-hparams.h`): a file's `rope.scaling.yarn_beta_*` where the
/// loader reads them (`ArchSpec::yarn_keys`), else the only values those keys may carry.
const YARN_BETA_FAST: f32 = 32.0;
const YARN_BETA_SLOW: f32 = 1.0;

/// GGUF `attention.temperature_scale` where `spec` reads it (mistral3; absent or 0: none),
/// its steps the original context as llama.cpp's loader sets `n_ctx_orig_yarn`
/// (`rope.scaling.original_context_length`, else `context_length`), which must not be 0.
fn gguf_attn_temp(spec: &ArchSpec, f: &Fields) -> Result<Option<AttnTemp>> {
    let Fields::Gguf { content, prefix } = f else {
        return Ok(None);
    };
    let key = |k: &str| format!("{prefix}.{k}");
    let scale_key = key("attention.temperature_scale");
    if !spec.attn_temp || !content.metadata.contains_key(&scale_key) {
        return Ok(None);
    }
    let scale = md_f32(content, &scale_key)?;
    if scale == 0.0 {
        return Ok(None);
    }
    let orig_key = match content
        .metadata
        .contains_key(&key("rope.scaling.original_context_length"))
    {
        true => key("rope.scaling.original_context_length"),
        false => key("context_length"),
    };
    // deepseek2's loader steps by `attention.temperature_length`, required with a scale.
    let orig_key = match spec.mla {
        true => key("attention.temperature_length"),
        false => orig_key,
    };
    let floor_scale = match content.metadata.contains_key(&orig_key) {
        true => md_usize(content, &orig_key)?,
        false => 0,
    };
    if floor_scale == 0 {
        return Err(f.err_key(
            &orig_key,
            format!("0: the attention temperature ({scale_key} = {scale}) steps by it"),
        ));
    }
    Ok(Some(AttnTemp { scale, floor_scale }))
}

/// A checkpoint's attention temperature where `spec` reads one (Ministral 3's
/// `llama_4_scaling_beta` in `rope_scaling`, stepping by its `original_max_position_embeddings`,
/// as llama.cpp's converter writes `attention.temperature_scale` and its loader steps); a
/// beta of 0 is none. Elsewhere the key is refused.
fn hf_attn_temp(spec: &ArchSpec, f: &Fields) -> Result<Option<AttnTemp>> {
    let rs = f.json("rope_scaling");
    let Some(v) = rs
        .and_then(|r| r.get("llama_4_scaling_beta"))
        .filter(|v| !v.is_null())
    else {
        return Ok(None);
    };
    let key = "rope_scaling.llama_4_scaling_beta";
    if !spec.attn_temp {
        return Err(f.err_key(key, format!("{v}: not read for {}", spec.gguf_name)));
    }
    let scale =
        v.as_f64()
            .ok_or_else(|| f.err_key(key, format!("expected a number, found {v}")))? as f32;
    if scale == 0.0 {
        return Ok(None);
    }
    let orig = rs
        .and_then(|r| r.get("original_max_position_embeddings"))
        .or_else(|| f.json("original_max_position_embeddings"))
        .and_then(Json::as_u64)
        .filter(|&o| o > 0)
        .ok_or_else(|| {
            f.err_key(
                "rope_scaling.original_max_position_embeddings",
                format!("missing: the attention temperature ({key} = {scale}) steps by it"),
            )
        })?;
    Ok(Some(AttnTemp {
        scale,
        floor_scale: orig as usize,
    }))
}

/// `config.json` `rope_scaling`: `default`, `linear` (its factor), `llama3` where the
/// architecture implements it (frequency factors, see [`llama3_rope_factors`]), or `yarn`
/// where it reads YaRN ([`ArchSpec::yarn`]), as llama.cpp's converter writes it and its
/// generic loader reads it: the factor and `original_max_position_embeddings` (in
/// `rope_scaling`, else beside it); betas only at llama.cpp's defaults, and no
/// `extrapolation_factor` or `attention_factor`, which the converter writes but those loaders
/// never read. Returns the RoPE scale and the YaRN parameters.
fn hf_rope_scale(spec: &ArchSpec, f: &Fields) -> Result<(f32, Option<Yarn>)> {
    let Some(rs) = f.json("rope_scaling") else {
        return Ok((1.0, None));
    };
    let ty = rs
        .get("rope_type")
        .or_else(|| rs.get("type"))
        .and_then(Json::as_str)
        .unwrap_or("default");
    let factor = rs.get("factor").and_then(Json::as_f64);
    match ty {
        "default" => Ok((1.0, None)),
        "llama3" if spec.llama3_rope => Ok((1.0, None)),
        "longrope" | "su" if spec.long_rope => Ok((1.0, None)),
        "linear" => Ok((factor.unwrap_or(1.0) as f32, None)),
        "yarn" if spec.yarn => {
            let bad = |k: &str, msg: String| f.err_key(&format!("rope_scaling.{k}"), msg);
            let scale = factor.ok_or_else(|| bad("factor", "missing".into()))? as f32;
            let orig = rs
                .get("original_max_position_embeddings")
                .or_else(|| f.json("original_max_position_embeddings"))
                .and_then(Json::as_u64)
                .ok_or_else(|| bad("original_max_position_embeddings", "missing".into()))?;
            let num = |k: &str| -> Result<Option<f32>> {
                match rs.get(k).filter(|v| !v.is_null()) {
                    None => Ok(None),
                    Some(v) => v
                        .as_f64()
                        .map(|x| Some(x as f32))
                        .ok_or_else(|| bad(k, format!("expected a number, found {v}"))),
                }
            };
            // Ministral 3's (llama.cpp's mistral3 loader reads them, `ArchSpec::yarn_keys`):
            // the betas, `mscale_all_dim` as the log multiplier; its converter drops `mscale`,
            // which llama.cpp then takes as 1.
            let (beta_fast, beta_slow, log_mul) = match spec.yarn_keys {
                true => {
                    if let Some(m) = num("mscale")?.filter(|&m| m != 1.0) {
                        return Err(bad(
                            "mscale",
                            format!("{m}: llama.cpp's {} loader takes 1", spec.gguf_name),
                        ));
                    }
                    (
                        num("beta_fast")?.unwrap_or(YARN_BETA_FAST),
                        num("beta_slow")?.unwrap_or(YARN_BETA_SLOW),
                        num("mscale_all_dim")?.unwrap_or(0.0),
                    )
                }
                false => (YARN_BETA_FAST, YARN_BETA_SLOW, 0.0),
            };
            for (k, default) in [("beta_fast", YARN_BETA_FAST), ("beta_slow", YARN_BETA_SLOW)] {
                if let Some(v) = rs
                    .get(k)
                    .and_then(Json::as_f64)
                    .filter(|&v| v as f32 != default && !spec.yarn_keys)
                {
                    return Err(bad(
                        k,
                        format!(
                            "{v}: llama.cpp's {} loader reads only {default}",
                            spec.gguf_name
                        ),
                    ));
                }
            }
            // `truncate` (gpt-oss's config: false) is not read: llama.cpp rounds the ramp's ends
            // to whole pairs whatever it says, as transformers does for `true`; with `false`
            // transformers' frequencies near the ramp's ends differ slightly from llama.cpp's.
            for k in ["extrapolation_factor", "attention_factor", "attn_factor"] {
                if rs.get(k).is_some() {
                    return Err(bad(
                        k,
                        format!("not read by llama.cpp's {} loader", spec.gguf_name),
                    ));
                }
            }
            let yarn = Yarn {
                orig_ctx: orig as usize,
                beta_fast,
                beta_slow,
                ext_factor: 1.0,
                attn_factor: yarn_attn_factor(scale, 1.0, log_mul),
                log_mul,
            };
            Ok((scale, Some(yarn)))
        }
        other => Err(f.err_key(
            "rope_scaling",
            format!(
                "type `{other}` is not supported for {} (supported: default, linear{}{}{})",
                spec.arch.gguf_name(),
                if spec.llama3_rope { ", llama3" } else { "" },
                if spec.long_rope { ", longrope" } else { "" },
                if spec.yarn { ", yarn" } else { "" }
            ),
        )),
    }
}

/// A GGUF's LongRoPE ([`LongRope`]) where `spec` reads it, as llama.cpp's phi3 loader: the
/// factor tensors `rope_factors_long.weight` and `rope_factors_short.weight` (both or
/// neither; their shapes are checked where they are read), the original context (else the
/// training context, as `n_ctx_orig_yarn`) and `rope.scaling.attn_factor` (else 1). Without
/// the factors the attention factor must be 1.
fn gguf_long_rope(spec: &ArchSpec, f: &Fields, content: &Content) -> Result<Option<LongRope>> {
    let Fields::Gguf { prefix, .. } = f else {
        unreachable!("GGUF fields")
    };
    if !spec.long_rope {
        return Ok(None);
    }
    let key = |k: &str| format!("{prefix}.{k}");
    let attn_key = key("rope.scaling.attn_factor");
    let attn_factor = match content.metadata.contains_key(&attn_key) {
        true => md_f32(content, &attn_key)?,
        false => 1.0,
    };
    let has = |t: &str| content.tensor_infos.contains_key(t);
    match (has(LONG_ROPE_FACTORS[0]), has(LONG_ROPE_FACTORS[1])) {
        (false, false) if attn_factor == 1.0 => Ok(None),
        (false, false) => Err(f.err_key(
            &attn_key,
            format!("{attn_factor} without LongRoPE's factor tensors `rope_factors_long`/`_short`"),
        )),
        (true, true) => {
            let orig_key = key("rope.scaling.original_context_length");
            let orig_ctx = match content.metadata.contains_key(&orig_key) {
                true => md_usize(content, &orig_key)?,
                false => 0,
            };
            let orig_ctx = match orig_ctx {
                0 => md_usize(content, &key("context_length"))?,
                c => c,
            };
            Ok(Some(LongRope {
                orig_ctx,
                attn_factor,
            }))
        }
        // The other one is missing: llama.cpp would run without factors where it picks it.
        (long, _) => Err(ModelError::MissingTensor(
            LONG_ROPE_FACTORS[usize::from(long)].into(),
        )),
    }
}

/// The GGUF names of LongRoPE's factor tensors: long, short.
pub const LONG_ROPE_FACTORS: [&str; 2] = ["rope_factors_long.weight", "rope_factors_short.weight"];

/// A `config.json`'s LongRoPE (`rope_scaling` of type `longrope`, or its old name `su`) where
/// `spec` reads it, as llama.cpp's converter writes it into a GGUF: the original context from
/// `original_max_position_embeddings` (in `rope_scaling`, else beside it: required), and the
/// attention factor `sqrt(1 + ln(s) / ln(original))` for `s = max_position_embeddings /
/// original` above 1, else 1 (computed in f64, stored as f32, as the converter writes it).
/// An explicit `attention_factor`, which transformers would use and the converter ignores,
/// is refused. The factor lists themselves are read with the weights
/// ([`TensorSource::rope_factors`]).
fn hf_long_rope(spec: &ArchSpec, f: &Fields, context_len: usize) -> Result<Option<LongRope>> {
    let Some(rs) = f.json("rope_scaling") else {
        return Ok(None);
    };
    let ty = rs
        .get("rope_type")
        .or_else(|| rs.get("type"))
        .and_then(Json::as_str);
    if !spec.long_rope || !matches!(ty, Some("longrope" | "su")) {
        return Ok(None);
    }
    if rs.get("attention_factor").is_some_and(|v| !v.is_null()) {
        return Err(f.err_key(
            "rope_scaling",
            "an explicit `attention_factor` is not supported (llama.cpp's converter computes \
             its own)"
                .into(),
        ));
    }
    let orig_ctx = rs
        .get("original_max_position_embeddings")
        .filter(|v| !v.is_null())
        .or_else(|| f.json("original_max_position_embeddings"))
        .and_then(Json::as_u64)
        .filter(|&c| c > 0)
        .ok_or_else(|| {
            f.err_key(
                "original_max_position_embeddings",
                "missing: LongRoPE needs the original context".into(),
            )
        })? as usize;
    let scale = context_len as f64 / orig_ctx as f64;
    let attn_factor = match scale > 1.0 {
        true => (1.0 + scale.ln() / (orig_ctx as f64).ln()).sqrt() as f32,
        false => 1.0,
    };
    Ok(Some(LongRope {
        orig_ctx,
        attn_factor,
    }))
}

/// [`ModelConfig::fixed_pairs`] of `pairs` rotated pairs under `sections`.
fn imrope_fixed_pairs(s: [usize; 4], pairs: usize) -> Vec<bool> {
    let dims: usize = s.iter().sum();
    (0..pairs)
        .map(|i| {
            let sector = i % dims.max(1);
            sector >= 3 * s[sector % 3]
        })
        .collect()
}

/// A GGUF's `rope.dimension_sections`: four section sizes in rotated pairs (int or uint
/// elements), the first three not all 0, no more pairs than a head has (checked by
/// [`ModelConfig::check`] against the head size).
fn gguf_rope_sections(f: &Fields, content: &Content) -> Result<[usize; 4]> {
    let Fields::Gguf { prefix, .. } = f else {
        unreachable!("GGUF fields")
    };
    let sk = format!("{prefix}.rope.dimension_sections");
    let bad = |msg: String| f.err_key(&sk, msg);
    let Some(candle_core::quantized::gguf_file::Value::Array(a)) = content.metadata.get(&sk) else {
        return Err(match content.metadata.contains_key(&sk) {
            true => bad("expected an array of 4 integers".into()),
            false => bad("missing".into()),
        });
    };
    if a.len() != 4 {
        return Err(bad("expected an array of 4 integers".into()));
    }
    let mut s = [0usize; 4];
    for (o, v) in s.iter_mut().zip(a) {
        let n = v
            .to_i32()
            .map(i64::from)
            .or_else(|_| v.to_u32().map(i64::from))
            .map_err(|e| bad(e.to_string()))?;
        *o = usize::try_from(n).map_err(|_| bad(format!("{n}")))?;
    }
    Ok(s)
}

/// Which layers attend without RoPE: every `n`-th where the architecture says so
/// ([`ArchSpec::no_rope_step`], llama.cpp's fixed step), or as a checkpoint's `no_rope_layers`
/// says (SmolLM3's: 1 where a layer rotates, 0 where it does not; transformers' default is
/// every fourth).
fn nope_layers(spec: &ArchSpec, f: &Fields, n_layer: usize) -> Result<Vec<bool>> {
    let Some(step) = spec.no_rope_step else {
        return Ok(vec![false; n_layer]);
    };
    let Some(v) = f.json("no_rope_layers") else {
        return Ok((0..n_layer).map(|l| (l + 1) % step == 0).collect());
    };
    let bad = || {
        f.err_key(
            "no_rope_layers",
            format!("expected {n_layer} flags of 0 or 1, found {v}"),
        )
    };
    let flags = v
        .as_array()
        .filter(|a| a.len() == n_layer)
        .ok_or_else(bad)?;
    flags
        .iter()
        .map(|x| match x.as_u64() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(bad()),
        })
        .collect()
}

/// A checkpoint's multi-section RoPE: `rope_scaling.mrope_section` (transformers 5's
/// `rope_parameters.mrope_section`; three or four counts of pairs), else Qwen3.5's
/// [11, 11, 10], as llama.cpp's converter writes it.
fn hf_rope_sections(f: &Fields) -> Result<[usize; 4]> {
    let Some(v) = f.json("rope_scaling").and_then(|r| r.get("mrope_section")) else {
        return Ok([11, 11, 10, 0]);
    };
    let bad = || {
        f.err_key(
            "rope_scaling.mrope_section",
            format!("{v}: expected three or four counts"),
        )
    };
    let list = v
        .as_array()
        .filter(|l| (3..=4).contains(&l.len()))
        .ok_or_else(bad)?;
    let mut s = [0usize; 4];
    for (o, x) in s.iter_mut().zip(list) {
        *o = x.as_u64().ok_or_else(bad)? as usize;
    }
    Ok(s)
}

/// The sliding window and which layers use it, as `spec.swa` says.
fn sliding(spec: &ArchSpec, f: &Fields, n_layer: usize) -> Result<(Option<usize>, Vec<bool>)> {
    let gguf = f.gguf();
    let given = f.usize(Field::Window)?;
    let default = if gguf {
        spec.default_window.0
    } else {
        spec.default_window.1
    };
    // An explicit `null` (config.json) or 0 means no window.
    let window = if f.present(Field::Window) {
        given.filter(|&w| w > 0)
    } else {
        default
    };
    let refuse = |w: usize| {
        Err(f.err(
            Field::Window,
            format!(
                "{w}: Candor's {} forward pass applies no sliding window (neither does the \
                 reference implementation), so the file is refused rather than run unlike its \
                 training",
                spec.arch.gguf_name()
            ),
        ))
    };
    let layer_types = || -> Result<Option<Vec<bool>>> {
        let Some(types) = f.json("layer_types").and_then(Json::as_array) else {
            return Ok(None);
        };
        if types.len() != n_layer {
            return Err(f.err_key(
                "layer_types",
                format!("{} entries for {n_layer} layers", types.len()),
            ));
        }
        Ok(Some(
            types
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect(),
        ))
    };
    Ok(match spec.swa {
        Swa::Never => match window {
            Some(w) => return refuse(w),
            None => (None, vec![false; n_layer]),
        },
        Swa::Qwen if gguf => match window {
            Some(w) => return refuse(w),
            None => (None, vec![false; n_layer]),
        },
        Swa::Disabled => (None, vec![false; n_layer]),
        Swa::All => (window, vec![window.is_some(); n_layer]),
        Swa::Qwen => {
            let on = f
                .json("use_sliding_window")
                .and_then(Json::as_bool)
                .unwrap_or(false);
            let window = window.filter(|_| on);
            let layers = match layer_types()? {
                Some(t) => t,
                None => {
                    let from = f
                        .json("max_window_layers")
                        .and_then(Json::as_u64)
                        .unwrap_or(28) as usize;
                    (0..n_layer).map(|l| l >= from).collect()
                }
            };
            let layers = layers.into_iter().map(|s| s && window.is_some()).collect();
            (window, layers)
        }
        Swa::Pattern(n) => {
            let layers = match layer_types()? {
                Some(t) => t,
                None => swa_pattern(f, n_layer, n)?,
            };
            (
                window,
                layers.into_iter().map(|s| s && window.is_some()).collect(),
            )
        }
    })
}

/// `sliding_window_pattern` (a period, or in a GGUF also one flag per layer, as llama.cpp's
/// `load_swa_pattern`), else the architecture's period `n`.
fn swa_pattern(f: &Fields, n_layer: usize, n: usize) -> Result<Vec<bool>> {
    if let Fields::Gguf { content, .. } = f {
        let key = f.key(Field::SwaPattern);
        if let Some(candle_core::quantized::gguf_file::Value::Array(flags)) =
            content.metadata.get(&key)
        {
            if flags.len() != n_layer {
                return Err(f.err_key(&key, format!("{} flags for {n_layer} layers", flags.len())));
            }
            return flags
                .iter()
                .map(|v| v.to_bool().map_err(|e| f.err_key(&key, e.to_string())))
                .collect();
        }
    }
    let period = match f.usize(Field::SwaPattern)? {
        Some(p) => p,
        // transformers' Gemma 3 config keeps it as `_sliding_window_pattern`.
        None => f
            .json("_sliding_window_pattern")
            .and_then(Json::as_u64)
            .map_or(n, |p| p as usize),
    };
    Ok(pattern_layers(n_layer, period))
}

/// GGUF keys (after the architecture prefix) every architecture's reader takes or that do
/// not change the arithmetic (`vocab_size`: the embedding's rows count; the original context
/// and `finetuned` only matter to YaRN and the attention temperature, read where implemented).
const GGUF_KEYS: &[&str] = &[
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "rope.scaling.finetuned",
    "vocab_size",
    // Informational (older llama conversions write "Meta AI original pth").
    "tensor_data_layout",
];

/// The keys `spec`'s GGUF reader takes beyond [`GGUF_KEYS`].
fn gguf_arch_keys(spec: &ArchSpec) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if spec.swa != Swa::Never && spec.swa != Swa::Qwen {
        keys.push("attention.sliding_window");
    }
    if matches!(spec.swa, Swa::Pattern(_)) {
        keys.push("attention.sliding_window_pattern");
    }
    if spec.reads_rope_base_swa {
        keys.push("rope.freq_base_swa");
    }
    if spec.attn_softcap.0 != Cap::NotRead {
        keys.push("attn_logit_softcapping");
    }
    if spec.final_softcap.0 != Cap::NotRead {
        keys.push("final_logit_softcapping");
    }
    if spec.per_layer {
        keys.extend([
            "attention.key_length_swa",
            "attention.value_length_swa",
            "rope.dimension_count_swa",
            "attention.shared_kv_layers",
            "embedding_length_per_layer_input",
        ]);
    }
    if spec.hybrid {
        keys.extend([
            "ssm.conv_kernel",
            "ssm.inner_size",
            "ssm.state_size",
            "ssm.time_step_rank",
            "ssm.group_count",
            "full_attention_interval",
            "attention.recurrent_layers",
        ]);
    }
    if spec.mrope {
        keys.push("rope.dimension_sections");
    }
    if matches!(spec.arch, Arch::Qwen3Vl | Arch::Qwen3VlMoe) {
        // Deepstack inputs: zero for text tokens (see [`Arch::Qwen3Vl`]).
        keys.push("n_deepstack_layers");
    }
    match spec.moe {
        MoeSpec::Never => {}
        MoeSpec::IfDeclared(_) => keys.extend(["expert_count", "expert_used_count"]),
        MoeSpec::Always(_) | MoeSpec::IfDeclaredOwnWidth(_) => keys.extend([
            "expert_count",
            "expert_used_count",
            "expert_feed_forward_length",
        ]),
        MoeSpec::Deepseek => keys.extend([
            "expert_count",
            "expert_used_count",
            "expert_feed_forward_length",
            "expert_shared_count",
            "expert_weights_scale",
            "expert_weights_norm",
            "expert_gating_func",
            "expert_group_count",
            "expert_group_used_count",
            "leading_dense_block_count",
        ]),
    }
    if spec.mla {
        keys.extend([
            "attention.q_lora_rank",
            "attention.kv_lora_rank",
            "attention.key_length_mla",
            "attention.value_length_mla",
            "attention.temperature_length",
            "rope.scaling.yarn_log_multiplier",
        ]);
    }
    if spec.nextn {
        keys.push("nextn_predict_layers");
    }
    if spec.shared_expert {
        keys.push("expert_shared_feed_forward_length");
    }
    if spec.yarn_keys {
        keys.extend([
            "rope.scaling.yarn_beta_fast",
            "rope.scaling.yarn_beta_slow",
            "rope.scaling.yarn_log_multiplier",
        ]);
    }
    if spec.long_rope {
        keys.push("rope.scaling.attn_factor");
    }
    if spec.attn_temp {
        keys.push("attention.temperature_scale");
    }
    keys
}

/// Every `<arch>.*` key of a GGUF must be one the reader takes ([`GGUF_KEYS`],
/// [`gguf_arch_keys`]), or carry the value that changes nothing (a RoPE attention factor of 1,
/// no experts, a sliding window of 0, the same sliding-window RoPE base or soft-cap 0 where
/// none is read). Anything else (`rope.scaling.attn_factor` of Phi-3-128k, YaRN parameters,
/// `attention.layer_norm_epsilon`, `attention.scale`, `embedding_scale`, ...) changes the
/// arithmetic in a way Candor does not implement: refused with one line naming the keys.
fn check_gguf_keys(spec: &ArchSpec, content: &Content) -> Result<()> {
    let prefix = format!("{}.", spec.gguf_name);
    let arch_keys = gguf_arch_keys(spec);
    let f32_is = |key: &str, v: f32| md_f32(content, key).is_ok_and(|x| x == v);
    let usize_is = |key: &str, v: usize| md_usize(content, key).is_ok_and(|x| x == v);
    let mut refused: Vec<String> = Vec::new();
    let mut keys: Vec<&String> = content.metadata.keys().collect();
    keys.sort();
    for key in keys {
        let Some(rest) = key.strip_prefix(&prefix) else {
            continue;
        };
        if GGUF_KEYS.contains(&rest) || arch_keys.contains(&rest) {
            continue;
        }
        let neutral = match rest {
            "rope.scaling.attn_factor" => f32_is(key, 1.0),
            "rope.scaling.yarn_beta_fast" => spec.yarn && f32_is(key, YARN_BETA_FAST),
            "rope.scaling.yarn_beta_slow" => spec.yarn && f32_is(key, YARN_BETA_SLOW),
            "expert_count" | "expert_used_count" => usize_is(key, 0),
            "attention.sliding_window" => usize_is(key, 0),
            "attn_logit_softcapping" | "final_logit_softcapping" => f32_is(key, 0.0),
            // Read below: refused there with its value when it differs from the base.
            "rope.freq_base_swa" => true,
            _ => false,
        };
        if !neutral {
            let value = content
                .metadata
                .get(key)
                .map(|v| match v {
                    candle_core::quantized::gguf_file::Value::Array(a) => {
                        format!("[{} values]", a.len())
                    }
                    candle_core::quantized::gguf_file::Value::String(s) => format!("{s:?}"),
                    other => format!("{other:?}")
                        .split_once('(')
                        .map_or(String::new(), |(_, x)| x.trim_end_matches(')').to_string()),
                })
                .unwrap_or_default();
            refused.push(format!("{key} = {value}"));
        }
    }
    if refused.is_empty() {
        return Ok(());
    }
    Err(ModelError::Metadata {
        key: refused[0]
            .split(" = ")
            .next()
            .unwrap_or_default()
            .to_string(),
        msg: format!(
            "{} key(s) that change the arithmetic in ways Candor's {} forward pass does not \
             implement: {}; refused rather than run as a different model",
            refused.len(),
            spec.gguf_name,
            refused.join(", ")
        ),
    })
}

/// The language model's `config.json` object (Gemma 3 multimodal checkpoints nest it in
/// `text_config`), with transformers 5's `rope_parameters` read into the keys earlier
/// versions wrote and the readers here take ([`hf_legacy_rope`]).
pub(crate) fn hf_text_config(path: &Path, json: &Json) -> Result<Json> {
    hf_legacy_rope(path, json.get("text_config").unwrap_or(json))
}

/// The name in a transformers 5 `config.json` (its `rope_parameters`, see
/// [`hf_legacy_rope`]) of a key the readers take under its earlier name.
fn v5_rope_key(json: &Json, key: &str) -> String {
    let lifted = |k: &str| json.get(LIFTED)?.get(k)?.as_str().map(str::to_string);
    if let Some(name) = lifted(key) {
        return name;
    }
    match (key.strip_prefix("rope_scaling."), lifted("rope_scaling")) {
        (Some(rest), Some(full)) => format!("{full}.{rest}"),
        _ => key.to_string(),
    }
}

/// The key under which [`hf_legacy_rope`] notes the names it read each key from (not a
/// name transformers can write: it is no identifier).
const LIFTED: &str = "(read from rope_parameters)";

/// transformers 5 writes a model's RoPE as one `rope_parameters` object (its `rope_theta`,
/// `rope_type` and the type's own keys, `partial_rotary_factor` among them), or, for a model
/// whose sliding-window layers have their own RoPE (Gemma 3), one such object per layer type
/// (`full_attention`, `sliding_attention`); earlier versions wrote `rope_theta`,
/// `rope_scaling` and `rope_local_base_freq` beside the other keys. This returns `json` with
/// those keys made from `rope_parameters`, as llama.cpp's converter reads it (the
/// full-attention layers' object, the sliding layers' base): a key given both ways must agree.
/// The sliding layers' RoPE may only differ in its base (`rope_type` `default`). Errors name
/// `rope_parameters`' keys ([`Fields::err_key`]).
fn hf_legacy_rope(path: &Path, json: &Json) -> Result<Json> {
    let Some(rp) = json.get("rope_parameters").filter(|v| !v.is_null()) else {
        return Ok(json.clone());
    };
    let bad = |key: &str, msg: String| ModelError::Config {
        path: path.to_path_buf(),
        key: format!("rope_parameters{key}"),
        msg,
    };
    let object = |v: &Json, key: &str| {
        v.as_object()
            .cloned()
            .ok_or_else(|| bad(key, format!("expected an object, found {v}")))
    };
    let rp = object(rp, "")?;
    let layered = rp.contains_key("full_attention") || rp.contains_key("sliding_attention");
    let (mut full, sliding) = match layered {
        true => {
            let full = rp
                .get("full_attention")
                .ok_or_else(|| bad(".full_attention", "missing".into()))?;
            let sliding = match rp.get("sliding_attention") {
                Some(s) => Some(object(s, ".sliding_attention")?),
                None => None,
            };
            (object(full, ".full_attention")?, sliding)
        }
        false => (rp, None),
    };
    let full_key = if layered { ".full_attention" } else { "" };
    let mut out = json.as_object().cloned().unwrap_or_default();
    let mut names = serde_json::Map::new();
    // A key given both ways must agree; the legacy one is then kept.
    let mut lift = |from: Option<Json>, to: &str, key: String| -> Result<()> {
        let Some(v) = from.filter(|v| !v.is_null()) else {
            return Ok(());
        };
        match out.get(to).filter(|o| !o.is_null()) {
            Some(o) if o.as_f64() != v.as_f64() || o.is_number() != v.is_number() => {
                Err(bad(&key, format!("{v}, but `{to}` beside it is {o}")))
            }
            Some(_) => Ok(()),
            None => {
                out.insert(to.to_string(), v);
                names.insert(to.into(), format!("rope_parameters{key}").into());
                Ok(())
            }
        }
    };
    lift(
        full.remove("rope_theta"),
        "rope_theta",
        format!("{full_key}.rope_theta"),
    )?;
    lift(
        full.remove("partial_rotary_factor"),
        "partial_rotary_factor",
        format!("{full_key}.partial_rotary_factor"),
    )?;
    if let Some(mut s) = sliding {
        let ty = s.remove("rope_type").or_else(|| s.remove("type"));
        if let Some(t) = ty.filter(|t| t.as_str() != Some("default")) {
            return Err(bad(
                ".sliding_attention.rope_type",
                format!("{t}: only the sliding-window layers' base may differ (`default`)"),
            ));
        }
        lift(
            s.remove("rope_theta"),
            "rope_local_base_freq",
            ".sliding_attention.rope_theta".into(),
        )?;
        if let Some(k) = s.keys().next() {
            return Err(bad(
                &format!(".sliding_attention.{k}"),
                "not read: the sliding-window layers' RoPE is their base alone".into(),
            ));
        }
    }
    // The rest is the scaling; `rope_scaling` beside it must be the same.
    let scaling = Json::Object(full);
    match out.get("rope_scaling").filter(|v| !v.is_null()) {
        Some(old) if *old != scaling => {
            return Err(bad(
                full_key,
                format!("{scaling}, but `rope_scaling` beside it is {old}"),
            ))
        }
        _ => {
            out.insert("rope_scaling".into(), scaling);
            names.insert(
                "rope_scaling".into(),
                format!("rope_parameters{full_key}").into(),
            );
        }
    }
    out.insert(LIFTED.into(), Json::Object(names));
    Ok(Json::Object(out))
}

/// `config.json` keys that change transformers' arithmetic in ways Candor does not implement
/// (the others, with [`resolve`]'s own refusals: `rope_scaling` types, soft-caps and windows
/// where the architecture has none).
fn check_hf_keys(spec: &ArchSpec, f: &Fields) -> Result<()> {
    let method = f
        .json("quantization_config")
        .and_then(|q| q.get("quant_method"))
        .and_then(Json::as_str);
    // gpt-oss as OpenAI publishes it: MXFP4 experts (`model::checkpoint` reads their blocks).
    let oss_mxfp4 = spec.arch == Arch::GptOss && method == Some("mxfp4");
    if f.json("quantization_config").is_some() && !oss_mxfp4 {
        return Err(f.err_key(
            "quantization_config",
            "quantized checkpoints (GPTQ, AWQ, bitsandbytes, FP8, ...) are not supported; \
             convert to GGUF"
                .into(),
        ));
    }
    // A Mixtral config read as llama's: where it leaves out a quantity whose default differs
    // between transformers' two configs, llama's would be taken silently.
    if f.json("model_type").and_then(Json::as_str) == Some("mixtral") {
        for key in ["rms_norm_eps", "rope_theta", "max_position_embeddings"] {
            if f.json(key).is_none() {
                return Err(f.err_key(
                    key,
                    "absent: Mixtral's default differs from llama's; the config must name it"
                        .into(),
                ));
            }
        }
    }
    if spec.arch == Arch::GptOss {
        // transformers' defaults (YaRN over 4096 positions, a window of 128) would apply where
        // the config is silent, Candor's generic ones here: it must name them.
        for key in ["rope_scaling", "sliding_window"] {
            if f.json(key).is_none() {
                return Err(f.err_key(
                    key,
                    "absent: gpt-oss's default is transformers'; the config must name it".into(),
                ));
            }
        }
        // ggml's `swiglu_oai`: alpha 1.702, limit 7.
        for (key, want) in [("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)] {
            match f.json(key).map(|v| v.as_f64()) {
                None => {}
                Some(Some(v)) if v as f32 == want as f32 => {}
                Some(_) => {
                    return Err(f.err_key(
                        key,
                        format!(
                            "{}: only {want} is implemented",
                            f.json(key).expect("given")
                        ),
                    ))
                }
            }
        }
    }
    if spec.arch == Arch::Qwen3Moe || spec.arch == Arch::Qwen3Next {
        // llama.cpp's qwen3moe and qwen3next graphs renormalise the chosen experts' weights,
        // have an expert block in every layer and no sliding window: a checkpoint must say
        // the same (transformers' `norm_topk_prob` is false when absent for Qwen3-MoE).
        if f.json("norm_topk_prob").and_then(Json::as_bool) != Some(true) {
            return Err(f.err_key(
                "norm_topk_prob",
                "false or absent: only renormalised expert weights (true) are implemented".into(),
            ));
        }
        if f.json("use_sliding_window").and_then(Json::as_bool) == Some(true) {
            return Err(f.err_key(
                "use_sliding_window",
                "true: Qwen3-MoE's sliding window is not implemented".into(),
            ));
        }
        let step = f.json("decoder_sparse_step").and_then(Json::as_u64);
        if let Some(s) = step.filter(|&s| s != 1) {
            return Err(f.err_key(
                "decoder_sparse_step",
                format!("{s}: only an expert block in every layer (1) is implemented"),
            ));
        }
        let dense = f.json("mlp_only_layers").and_then(Json::as_array);
        if dense.is_some_and(|l| !l.is_empty()) {
            return Err(f.err_key(
                "mlp_only_layers",
                "dense layers among the expert layers are not implemented".into(),
            ));
        }
    }
    if spec.gemma
        && f.json("use_bidirectional_attention")
            .and_then(Json::as_bool)
            .unwrap_or(false)
    {
        return Err(f.err_key(
            "use_bidirectional_attention",
            "true: bidirectional attention is not supported".into(),
        ));
    }
    Ok(())
}

/// The RoPE angle of pair `i` at position `p` as llama.cpp's CPU backend computes it (its
/// rope cache): `freq_scale · (p · theta_scaleⁱ / factorᵢ)`, where the power is taken by `i`
/// successive f32 multiplications from `p` and `theta_scale = powf(base, -2 / rope_dim)`.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeFreqs {
    pub pairs: usize,
    pub theta_scale: f32,
    pub freq_scale: f32,
    pub factors: Option<Vec<f32>>,
    pub yarn: Option<YarnRope>,
    /// Pairs that stay at position 0 (angle 0: not rotated): multi-section RoPE's fourth
    /// section, whose position llama.cpp sets to 0 for text (Qwen3.5; `None`: none).
    pub fixed: Option<Vec<bool>>,
    /// The magnitude scale of cosines and sines without YaRN (LongRoPE's attention factor;
    /// 1 elsewhere, which changes no bit).
    pub mscale: f32,
}

/// YaRN's per-model constants of ggml's `rope_yarn`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnRope {
    /// The correction dimensions (`ggml_rope_yarn_corr_dims`).
    pub corr: [f32; 2],
    pub ext_factor: f32,
    /// The magnitude scale of cosines and sines.
    pub mscale: f32,
}

impl RopeFreqs {
    /// Cosine and sine of each pair's angle at `pos`, interleaved `[cos, sin, ...]` (libm's
    /// `cosf` and `sinf`, as llama.cpp); with YaRN, ggml's `rope_yarn`: the angle blended
    /// between interpolation and extrapolation by the ramp, the values times its scale.
    pub fn cos_sin(&self, pos: usize, out: &mut [f32]) {
        let mut theta = pos as f32;
        for i in 0..self.pairs {
            if self.fixed.as_ref().is_some_and(|f| f[i]) {
                (out[2 * i], out[2 * i + 1]) = (1.0, 0.0);
                theta *= self.theta_scale;
                continue;
            }
            let ff = self.factors.as_ref().map_or(1.0, |f| f[i]);
            let extrap = theta / ff;
            let interp = self.freq_scale * extrap;
            let (sin, cos) = match &self.yarn {
                None => {
                    let (s, c) = interp.sin_cos();
                    (s * self.mscale, c * self.mscale)
                }
                Some(y) => {
                    let ramp = (i as f32 - y.corr[0]) / (y.corr[1] - y.corr[0]).max(0.001);
                    let mix = (1.0 - ramp.clamp(0.0, 1.0)) * y.ext_factor;
                    let (s, c) = (interp * (1.0 - mix) + extrap * mix).sin_cos();
                    (s * y.mscale, c * y.mscale)
                }
            };
            out[2 * i] = cos;
            out[2 * i + 1] = sin;
            theta *= self.theta_scale;
        }
    }
}

/// Most layers a model may declare (llama.cpp's `LLAMA_MAX_LAYERS`).
pub const MAX_LAYERS: usize = 512;

fn check_layer_count(n_layer: usize) -> std::result::Result<(), String> {
    if n_layer > MAX_LAYERS {
        return Err(format!(
            "{n_layer} layers, more than the {MAX_LAYERS} any model has"
        ));
    }
    Ok(())
}

/// llama.cpp's `set_swa_pattern`: layer `l` slides unless it is the last of each group of
/// `n` (`n = 0`: every layer slides).
fn pattern_layers(n_layer: usize, n: usize) -> Vec<bool> {
    (0..n_layer).map(|l| n == 0 || l % n < n - 1).collect()
}

/// Llama 3's per-pair RoPE frequency factors from a Hugging Face `rope_scaling` object, as
/// llama.cpp's converter writes them into `rope_freqs.weight`.
pub fn llama3_rope_factors(config: &ModelConfig, rope_scaling: &Json) -> Option<Vec<f32>> {
    let ty = rope_scaling
        .get("rope_type")
        .or_else(|| rope_scaling.get("type"))
        .and_then(Json::as_str)?;
    if ty != "llama3" {
        return None;
    }
    let num = |k: &str, d: f64| rope_scaling.get(k).and_then(Json::as_f64).unwrap_or(d);
    let factor = num("factor", 8.0);
    let low = num("low_freq_factor", 1.0);
    let high = num("high_freq_factor", 4.0);
    let old_ctx = num("original_max_position_embeddings", 8192.0);
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    Some(
        (0..config.rope_dim / 2)
            .map(|i| {
                let freq = (config.rope_base as f64).powf(-2.0 * i as f64 / config.rope_dim as f64);
                let wavelen = 2.0 * PI / freq;
                let f = if wavelen < high_wavelen {
                    1.0
                } else if wavelen > low_wavelen {
                    factor
                } else {
                    let smooth = (old_ctx / wavelen - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                };
                f as f32
            })
            .collect(),
    )
}

/// Tensors by their GGUF names (`token_embd.weight`, `blk.3.attn_q.weight`, ...), from a GGUF
/// file or a Hugging Face checkpoint.
pub trait TensorSource {
    /// The file or folder, for error messages.
    fn source_path(&self) -> &Path;
    /// The file a tensor is read from (the source's path unless its tensors lie in several
    /// files: a GGUF split set).
    fn tensor_path(&self, _name: &str) -> &Path {
        self.source_path()
    }
    /// Whether a tensor of this name exists.
    fn has_tensor(&self, name: &str) -> bool;
    /// Reads a tensor and checks its shape (outermost dimension first).
    fn read_tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor>;
    /// A tensor's stored GGUF type and its bytes, in place in the file's memory map (row-major,
    /// as GGUF stores them), after checking its shape: what weight matrices are built from.
    fn read_mapped(&mut self, name: &str, shape: &[usize]) -> Result<(GgmlDType, MappedBytes)>;
    /// [`TensorSource::read_mapped`] for any stored type Candor knows, MXFP4 included (GGUF
    /// only; a checkpoint's types are candle's).
    fn read_mapped_stored(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Result<(StoredType, MappedBytes)> {
        let (d, b) = self.read_mapped(name, shape)?;
        Ok((StoredType::Ggml(d), b))
    }
    /// The experts of a 3-d expert tensor (`shape`: experts, rows, columns), each one's
    /// bytes in place: the tensor's rows (GGUF), or a checkpoint's tensor per expert.
    fn read_experts_mapped(
        &mut self,
        name: &str,
        shape: [usize; 3],
    ) -> Result<(StoredType, Vec<MappedBytes>)> {
        let (stored, bytes) = self.read_mapped_stored(name, &shape)?;
        let per = bytes.bytes().len() / shape[0].max(1);
        let parts = (0..shape[0])
            .map(|e| bytes.slice(e * per, per).expect("experts × per bytes"))
            .collect();
        Ok((stored, parts))
    }
    /// Per-pair RoPE frequency factors, when the model has them (Llama 3).
    fn rope_factors(&mut self, config: &ModelConfig) -> Result<Option<Vec<f32>>>;
}

impl GgufFile {
    /// A RoPE frequency-factor tensor (one per rotated pair) as f32.
    fn read_factors(&mut self, name: &str, config: &ModelConfig) -> Result<Vec<f32>> {
        let q = self.tensor(name, &[config.rope_dim / 2])?;
        Ok(q.dequantize(&candle_core::Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }
}

impl TensorSource for GgufFile {
    fn source_path(&self) -> &Path {
        self.path()
    }

    fn tensor_path(&self, name: &str) -> &Path {
        GgufFile::tensor_path(self, name)
    }

    fn has_tensor(&self, name: &str) -> bool {
        GgufFile::has_tensor(self, name)
    }

    fn read_tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        Ok(self.tensor(name, shape)?)
    }

    fn read_mapped(&mut self, name: &str, shape: &[usize]) -> Result<(GgmlDType, MappedBytes)> {
        Ok(self.mapped(name, shape)?)
    }

    fn read_mapped_stored(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Result<(StoredType, MappedBytes)> {
        Ok(self.mapped_stored(name, shape)?)
    }

    fn rope_factors(&mut self, config: &ModelConfig) -> Result<Option<Vec<f32>>> {
        if let Some(lr) = config.long_rope {
            // Both are read (their shapes checked); the context picks one.
            let [long, short] = LONG_ROPE_FACTORS;
            let long = self.read_factors(long, config)?;
            let short = self.read_factors(short, config)?;
            return Ok(Some(match lr.long(config.context_len) {
                true => long,
                false => short,
            }));
        }
        match GgufFile::has_tensor(self, "rope_freqs.weight") {
            true => Ok(Some(self.read_factors("rope_freqs.weight", config)?)),
            false => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's interleaved M-RoPE for text: with Qwen3.5's sections every pair takes the
    /// token's position; a fourth section's pairs stay at 0, and so do the pairs past three
    /// times a section (Qwen3-VL's [24, 20, 20, 0]: pairs 61 and 62 of 64).
    #[test]
    fn imrope_pairs_at_position_zero() {
        assert!(imrope_fixed_pairs([11, 11, 10, 0], 32).iter().all(|f| !f));
        let f = imrope_fixed_pairs([2, 2, 2, 2], 8);
        assert_eq!(f, [false, false, false, false, false, false, true, true]);
        let fixed: Vec<usize> = (0..64)
            .filter(|&i| imrope_fixed_pairs([24, 20, 20, 0], 64)[i])
            .collect();
        assert_eq!(fixed, [61, 62]);
    }

    /// An unknown architecture's error names every one Candor runs (the list comes from the
    /// specs, so a new architecture cannot be missing from it).
    #[test]
    fn an_unknown_architecture_lists_every_supported_one() {
        let msg = Arch::from_gguf_name("rwkv7").unwrap_err().to_string();
        for spec in ARCH_SPECS {
            assert!(
                msg.contains(&format!(" {}", spec.gguf_name)),
                "{} missing from: {msg}",
                spec.gguf_name
            );
        }
        assert!(msg.contains("`rwkv7`"), "{msg}");
    }

    #[test]
    fn swa_patterns_match_llama_cpp() {
        assert_eq!(pattern_layers(4, 2), [true, false, true, false]);
        assert_eq!(
            pattern_layers(7, 6),
            [true, true, true, true, true, false, true]
        );
        assert_eq!(pattern_layers(2, 0), [true, true]);
    }

    /// The attention temperature is exactly 1 for the first `floor_scale` positions, then
    /// `1 + scale · ln(1 + ⌊p / floor_scale⌋)` rounded once to f32, constant within each step.
    #[test]
    fn the_attention_temperature_steps_with_the_log_of_the_position() {
        let t = AttnTemp {
            scale: 0.1,
            floor_scale: 16,
        };
        for p in 0..16 {
            assert_eq!(t.factor(p).to_bits(), 1f32.to_bits(), "{p}");
        }
        for (p, step) in [(16, 1), (31, 1), (32, 2), (63, 3), (16384, 1024)] {
            let want = (1.0 + f64::from(0.1f32) * (1.0 + step as f64).ln()) as f32;
            assert_eq!(t.factor(p).to_bits(), want.to_bits(), "{p}");
        }
        assert!(t.factor(16) > 1.069 && t.factor(16) < 1.07);
    }

    #[test]
    fn hf_config_rejects_unknown_architectures_with_the_list() {
        let json: Json = serde_json::json!({"model_type": "falcon"});
        let err = ModelConfig::from_hf_config(Path::new("x/config.json"), &json)
            .unwrap_err()
            .to_string();
        assert!(err.contains("falcon") && err.contains("gemma2"), "{err}");
    }

    #[test]
    fn a_corrupt_layer_count_is_refused_before_anything_is_sized_by_it() {
        // Found by the GGUF fuzz target: 2e9 layers spent seconds and gigabytes on per-layer
        // tables before any tensor was looked at.
        let json = serde_json::json!({
            "model_type": "llama", "num_hidden_layers": 1_996_488_705u64, "hidden_size": 128,
            "intermediate_size": 8, "num_attention_heads": 1, "vocab_size": 4,
        });
        let err = ModelConfig::from_hf_config(Path::new("c.json"), &json)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("num_hidden_layers") && err.contains("512"),
            "{err}"
        );
    }

    /// transformers 5's `rope_parameters` (as transformers 5.24 writes them: per layer type
    /// for Gemma 3, with `partial_rotary_factor` inside for Phi-3) resolve as the keys
    /// transformers 4 wrote; a key given both ways must agree; the sliding layers' RoPE may
    /// differ only in its base; errors name the key the file has.
    #[test]
    fn transformers_5_rope_parameters_read_as_the_earlier_keys() {
        let read = |j: &Json| ModelConfig::from_hf_config(Path::new("c.json"), j);
        let base = |model_type: &str| {
            serde_json::json!({
                "model_type": model_type, "num_hidden_layers": 6, "hidden_size": 64,
                "intermediate_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
                "head_dim": 32, "vocab_size": 4, "max_position_embeddings": 131072,
                "sliding_window": 6,
            })
        };
        let with = |model_type: &str, extra: Json| {
            let mut j = base(model_type);
            j.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            j
        };
        let ones = vec![1.0; 8];
        let cases = [
            (
                "gemma3_text",
                serde_json::json!({"rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}),
                serde_json::json!({"rope_theta": 1e6, "rope_local_base_freq": 10000.0,
                    "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
            ),
            (
                "phi3",
                serde_json::json!({"original_max_position_embeddings": 4096,
                    "rope_parameters": {"rope_type": "longrope", "long_factor": ones,
                    "short_factor": ones, "original_max_position_embeddings": 4096,
                    "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}),
                serde_json::json!({"original_max_position_embeddings": 4096,
                    "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
                    "rope_scaling": {"rope_type": "longrope", "long_factor": ones,
                    "short_factor": ones, "original_max_position_embeddings": 4096}}),
            ),
            (
                "qwen3",
                serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                    "original_max_position_embeddings": 32768, "rope_theta": 1e6}}),
                serde_json::json!({"rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn",
                    "factor": 4.0, "original_max_position_embeddings": 32768}}),
            ),
        ];
        for (model_type, v5, legacy) in cases {
            let v5 = read(&with(model_type, v5)).unwrap();
            assert_eq!(v5, read(&with(model_type, legacy)).unwrap(), "{model_type}");
            assert_ne!(
                v5,
                read(&base(model_type)).unwrap(),
                "{model_type}: no change"
            );
        }
        let err = |model_type: &str, extra: Json| read(&with(model_type, extra)).unwrap_err();
        let e = err(
            "qwen3",
            serde_json::json!({"rope_theta": 1e6, "rope_parameters": {"rope_theta": 1e5}}),
        )
        .to_string();
        assert!(
            e.contains("rope_parameters.rope_theta") && e.contains("1000000"),
            "{e}"
        );
        let e = err(
            "gemma3_text",
            serde_json::json!({"rope_parameters": {
                "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}),
        )
        .to_string();
        assert!(
            e.contains("rope_parameters.sliding_attention.rope_type"),
            "{e}"
        );
        let e = err(
            "qwen3",
            serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 32768, "beta_fast": 8.0,
                "rope_theta": 1e6}}),
        )
        .to_string();
        assert!(e.contains("rope_parameters.beta_fast"), "{e}");
        let e = err(
            "qwen3",
            serde_json::json!({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}),
        )
        .to_string();
        assert!(
            e.contains("`rope_parameters`:") && e.contains("dynamic"),
            "{e}"
        );
        // A sliding base on an architecture with none of its own is refused under its name.
        let e = err(
            "qwen3",
            serde_json::json!({"rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}),
        )
        .to_string();
        assert!(
            e.contains("rope_parameters.sliding_attention.rope_theta"),
            "{e}"
        );
    }

    #[test]
    fn llama3_factors_are_one_for_high_frequencies_and_factor_for_low() {
        let json = serde_json::json!({
            "model_type": "llama", "num_hidden_layers": 1, "hidden_size": 128,
            "intermediate_size": 8, "num_attention_heads": 1, "vocab_size": 4,
            "rope_theta": 500000.0,
        });
        let c = ModelConfig::from_hf_config(Path::new("c.json"), &json).unwrap();
        let rs = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192});
        let f = llama3_rope_factors(&c, &rs).unwrap();
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }
}
