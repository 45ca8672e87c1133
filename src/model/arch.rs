//! What differs between the supported architectures, resolved once into a [`ModelConfig`]
//! that the one packed forward pass ([`super::transformer`]) reads: head geometry, RoPE layout and
//! frequencies, sliding-window layers, norms, activation, scales and soft-caps.
//!
//! Two readers fill it: GGUF metadata, with llama.cpp's key names (`<arch>.block_count`,
//! `<arch>.attention.sliding_window`, `<arch>.final_logit_softcapping`, ...; see llama.cpp's
//! `llama-arch.cpp` and `models/<arch>.cpp`), and a Hugging Face `config.json`. Weights come
//! through the [`TensorSource`] trait under GGUF tensor names, whatever the file format.
//! This module neither reads tensor data nor runs anything.

use std::f64::consts::PI;
use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QTensor};
use serde_json::Value as Json;

use super::error::{ModelError, Result};
use super::gguf::{md_f32, md_string, md_usize, GgufFile};
use super::quant::MappedBytes;

/// Architectures the forward pass implements, by their GGUF `general.architecture` name.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
];

/// A supported architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
}

impl Arch {
    /// From a GGUF `general.architecture` value.
    pub fn from_gguf_name(name: &str) -> Result<Arch> {
        Ok(match name {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma2" => Arch::Gemma2,
            "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_string())),
        })
    }

    /// From a Hugging Face `config.json` `model_type`.
    pub fn from_hf_model_type(name: &str) -> Result<Arch> {
        Ok(match name {
            "llama" => Arch::Llama,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma2" => Arch::Gemma2,
            "gemma3_text" | "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_string())),
        })
    }

    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
        }
    }

    /// Gemma 2 or 3: the family with post-attention and post-FFN norms, a scaled embedding
    /// and its own attention scale.
    pub fn is_gemma(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }

    /// Whether a checkpoint stores RMS-norm weights as `w` to be used as `1 + w` (Gemma's;
    /// llama.cpp's converter adds the 1 when writing GGUF).
    pub fn norm_plus_one(self) -> bool {
        self.is_gemma()
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
}

/// The former name of [`ModelConfig`] (it covers every architecture), kept for code written
/// against it.
#[doc(hidden)]
pub type LlamaConfig = ModelConfig;

impl ModelConfig {
    /// Width of one token's keys (or values) across all KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Width of one token's queries across all heads.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The attention window of layer `l` (`None`: the whole context).
    pub fn window(&self, l: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| self.swa_layers.get(l).copied().unwrap_or(false))
    }

    /// Reads the configuration from a GGUF header; `vocab_size` comes from `token_embd`.
    pub fn from_gguf(content: &Content) -> Result<ModelConfig> {
        let name = md_string(content, "general.architecture")?;
        let arch = Arch::from_gguf_name(&name)?;
        let key = |k: &str| format!("{name}.{k}");
        let has = |k: &str| content.metadata.contains_key(&key(k));
        let opt_usize = |k: &str| -> Result<Option<usize>> {
            if has(k) {
                md_usize(content, &key(k)).map(Some)
            } else {
                Ok(None)
            }
        };
        let opt_f32 = |k: &str| -> Result<Option<f32>> {
            if has(k) {
                md_f32(content, &key(k)).map(Some)
            } else {
                Ok(None)
            }
        };
        let n_layer = md_usize(content, &key("block_count"))?;
        let dim = md_usize(content, &key("embedding_length"))?;
        let ffn_dim = md_usize(content, &key("feed_forward_length"))?;
        let n_head = md_usize(content, &key("attention.head_count"))?;
        let n_kv_head = opt_usize("attention.head_count_kv")?.unwrap_or(n_head);
        let rms_eps = md_f32(content, &key("attention.layer_norm_rms_epsilon"))?;
        let rope_base = opt_f32("rope.freq_base")?.unwrap_or(10_000.0);
        let context_len = md_usize(content, &key("context_length"))?;
        let bad = |k: &str, msg: String| ModelError::Metadata { key: key(k), msg };
        // Before anything is sized by it: a corrupt count must not allocate per layer.
        check_layer_count(n_layer).map_err(|msg| bad("block_count", msg))?;
        if n_head == 0 {
            return Err(bad("attention.head_count", "zero heads".into()));
        }
        let head_dim = match opt_usize("attention.key_length")? {
            Some(h) => h,
            None if dim.is_multiple_of(n_head) => dim / n_head,
            None => {
                return Err(bad(
                    "attention.head_count",
                    format!("{n_head} heads do not divide embedding length {dim}"),
                ))
            }
        };
        if let Some(v) = opt_usize("attention.value_length")? {
            if v != head_dim {
                return Err(bad(
                    "attention.value_length",
                    format!("{v} differs from the key length {head_dim}"),
                ));
            }
        }
        let rope_dim = opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
        let rope_scale = match content.metadata.get(&key("rope.scaling.type")) {
            None => 1.0,
            Some(_) => match md_string(content, &key("rope.scaling.type"))?.as_str() {
                "none" => 1.0,
                "linear" => opt_f32("rope.scaling.factor")?.unwrap_or(1.0),
                other => {
                    return Err(bad(
                        "rope.scaling.type",
                        format!("`{other}` is not supported (supported: none, linear)"),
                    ))
                }
            },
        };
        // Keys that change the arithmetic in ways the pass does not implement: refused, never
        // ignored (Phi-3-128k and Phi-3.5 scale attention with `rope.scaling.attn_factor`
        // beside their long-context RoPE factors; mixture-of-experts models route tokens).
        if let Some(f) = opt_f32("rope.scaling.attn_factor")?.filter(|&f| f != 1.0) {
            return Err(bad(
                "rope.scaling.attn_factor",
                format!("{f}: scaled attention (long-context RoPE) is not supported"),
            ));
        }
        if let Some(n) = opt_usize("expert_count")?.filter(|&n| n > 0) {
            return Err(bad(
                "expert_count",
                format!("{n} experts: mixture-of-experts models are not supported"),
            ));
        }
        let vocab_size = match content.tensor_infos.get("token_embd.weight") {
            Some(info) => info.shape.dims()[0],
            None => return Err(ModelError::MissingTensor("token_embd.weight".into())),
        };
        let mut sliding_window = opt_usize("attention.sliding_window")?.filter(|&w| w > 0);
        let swa_pattern = opt_usize("attention.sliding_window_pattern")?;
        let swa_layers: Vec<bool> = match arch {
            // llama.cpp's default patterns: every other layer (Gemma 2), five of six (Gemma 3).
            Arch::Gemma2 => {
                sliding_window.get_or_insert(4096);
                pattern_layers(n_layer, swa_pattern.unwrap_or(2))
            }
            Arch::Gemma3 => pattern_layers(n_layer, swa_pattern.unwrap_or(6)),
            // llama.cpp disables Phi-3's sliding window.
            Arch::Phi3 => {
                sliding_window = None;
                vec![false; n_layer]
            }
            _ => vec![true; n_layer],
        };
        let gemma = arch.is_gemma();
        // llama.cpp (after gemma_pytorch): the 27B models scale by dim / heads.
        let is_27b =
            (arch == Arch::Gemma2 && n_layer == 46) || (arch == Arch::Gemma3 && n_layer == 62);
        let attn_scale = if is_27b {
            1.0 / ((dim / n_head) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let config = ModelConfig {
            architecture: name.clone(),
            arch,
            n_layer,
            dim,
            ffn_dim,
            n_head,
            n_kv_head,
            head_dim,
            rope_dim,
            rope_neox: !matches!(arch, Arch::Llama | Arch::Mistral),
            rope_base,
            rope_base_swa: match arch {
                Arch::Gemma3 => opt_f32("rope.freq_base_swa")?.unwrap_or(10_000.0),
                _ => opt_f32("rope.freq_base_swa")?.unwrap_or(rope_base),
            },
            rope_scale,
            rope_scale_swa: if arch == Arch::Gemma3 {
                1.0
            } else {
                rope_scale
            },
            rms_eps,
            context_len,
            vocab_size,
            embed_scale: gemma.then(|| (dim as f32).sqrt()),
            activation: if gemma {
                Activation::GeluTanhF16
            } else {
                Activation::Silu
            },
            attn_scale,
            attn_softcap: match arch {
                Arch::Gemma2 => opt_f32("attn_logit_softcapping")?.filter(|&c| c > 0.0),
                _ => None,
            },
            final_softcap: opt_f32("final_logit_softcapping")?.filter(|&c| c > 0.0),
            sliding_window,
            swa_layers,
        };
        config.check().map_err(|(k, msg)| bad(k, msg))?;
        Ok(config)
    }

    /// Reads the configuration from a Hugging Face `config.json` (already parsed); `path`
    /// names the file in errors.
    pub fn from_hf_config(path: &Path, json: &Json) -> Result<ModelConfig> {
        let err = |key: &str, msg: String| ModelError::Config {
            path: path.to_path_buf(),
            key: key.to_string(),
            msg,
        };
        // Gemma 3 multimodal checkpoints nest the language model's config.
        let json = json.get("text_config").unwrap_or(json);
        let model_type = json
            .get("model_type")
            .and_then(Json::as_str)
            .ok_or_else(|| err("model_type", "missing".into()))?;
        let arch = Arch::from_hf_model_type(model_type)?;
        let get = |k: &str| json.get(k).filter(|v| !v.is_null());
        let usize_of = |k: &str| -> Result<Option<usize>> {
            match get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(|x| Some(x as usize))
                    .ok_or_else(|| err(k, format!("expected an unsigned integer, found {v}"))),
            }
        };
        let f32_of = |k: &str| -> Result<Option<f32>> {
            match get(k) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(|x| Some(x as f32))
                    .ok_or_else(|| err(k, format!("expected a number, found {v}"))),
            }
        };
        let need =
            |k: &str| -> Result<usize> { usize_of(k)?.ok_or_else(|| err(k, "missing".into())) };
        let n_layer = need("num_hidden_layers")?;
        check_layer_count(n_layer).map_err(|msg| err("num_hidden_layers", msg))?;
        let dim = need("hidden_size")?;
        let ffn_dim = need("intermediate_size")?;
        let n_head = need("num_attention_heads")?;
        let n_kv_head = usize_of("num_key_value_heads")?.unwrap_or(n_head);
        let vocab_size = need("vocab_size")?;
        if n_head == 0 {
            return Err(err("num_attention_heads", "zero heads".into()));
        }
        let head_dim = match usize_of("head_dim")? {
            Some(h) => h,
            None if dim.is_multiple_of(n_head) => dim / n_head,
            None => {
                return Err(err(
                    "num_attention_heads",
                    format!("{n_head} heads do not divide hidden_size {dim}"),
                ))
            }
        };
        let rope_dim = match f32_of("partial_rotary_factor")? {
            Some(f) => ((head_dim as f32 * f) as usize) & !1,
            None => head_dim,
        };
        let rms_eps = f32_of("rms_norm_eps")?.unwrap_or(1e-6);
        let rope_base = f32_of("rope_theta")?.unwrap_or(10_000.0);
        let context_len = usize_of("max_position_embeddings")?.unwrap_or(4096);
        let mut rope_scale = 1.0;
        if let Some(rs) = get("rope_scaling") {
            let ty = rs
                .get("rope_type")
                .or_else(|| rs.get("type"))
                .and_then(Json::as_str)
                .unwrap_or("default");
            match ty {
                "default" => {}
                // The Llama 3 factors become per-pair frequency factors (see `rope_factors`).
                "llama3" => {}
                "linear" => {
                    rope_scale = rs.get("factor").and_then(Json::as_f64).unwrap_or(1.0) as f32
                }
                other => {
                    return Err(err(
                        "rope_scaling",
                        format!(
                            "type `{other}` is not supported (supported: default, linear, llama3)"
                        ),
                    ))
                }
            }
        }
        let use_swa = match arch {
            Arch::Qwen2 | Arch::Qwen3 => get("use_sliding_window")
                .and_then(Json::as_bool)
                .unwrap_or(false),
            // As llama.cpp: Phi-3's sliding window is not applied.
            Arch::Phi3 | Arch::Llama => false,
            _ => true,
        };
        let sliding_window = usize_of("sliding_window")?.filter(|&w| w > 0 && use_swa);
        let swa_layers = match get("layer_types").and_then(Json::as_array) {
            Some(types) => {
                if types.len() != n_layer {
                    return Err(err(
                        "layer_types",
                        format!("{} entries for {n_layer} layers", types.len()),
                    ));
                }
                types
                    .iter()
                    .map(|t| t.as_str() == Some("sliding_attention"))
                    .collect()
            }
            None => match arch {
                Arch::Gemma2 => pattern_layers(n_layer, 2),
                Arch::Gemma3 => {
                    pattern_layers(n_layer, usize_of("sliding_window_pattern")?.unwrap_or(6))
                }
                _ => vec![true; n_layer],
            },
        };
        let gemma = arch.is_gemma();
        let attn_scale = match f32_of("query_pre_attn_scalar")? {
            Some(s) if gemma => 1.0 / s.sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let act = get("hidden_activation")
            .or_else(|| get("hidden_act"))
            .and_then(Json::as_str)
            .unwrap_or("silu");
        let activation = match act {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_tanh" => Activation::GeluTanh,
            other => {
                return Err(err(
                    "hidden_act",
                    format!("`{other}` is not supported (supported: silu, gelu_pytorch_tanh)"),
                ))
            }
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
            rope_neox: true,
            rope_base,
            rope_base_swa: match arch {
                Arch::Gemma3 => f32_of("rope_local_base_freq")?.unwrap_or(10_000.0),
                _ => rope_base,
            },
            rope_scale,
            rope_scale_swa: if arch == Arch::Gemma3 {
                1.0
            } else {
                rope_scale
            },
            rms_eps,
            context_len,
            vocab_size,
            embed_scale: gemma.then(|| (dim as f32).sqrt()),
            activation,
            attn_scale,
            attn_softcap: f32_of("attn_logit_softcapping")?.filter(|&c| c > 0.0),
            final_softcap: f32_of("final_logit_softcapping")?.filter(|&c| c > 0.0),
            sliding_window,
            swa_layers,
        };
        config.check().map_err(|(k, msg)| err(k, msg))?;
        Ok(config)
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
        RopeFreqs {
            pairs: self.rope_dim / 2,
            theta_scale: base.powf(-2.0 / self.rope_dim as f32),
            freq_scale: 1.0 / scale,
            factors: factors.map(|f| f[..self.rope_dim / 2].to_vec()),
        }
    }
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
}

impl RopeFreqs {
    /// Cosine and sine of each pair's angle at `pos`, interleaved `[cos, sin, ...]` (libm's
    /// `cosf` and `sinf`, as llama.cpp).
    pub fn cos_sin(&self, pos: usize, out: &mut [f32]) {
        let mut theta = pos as f32;
        for i in 0..self.pairs {
            let ff = self.factors.as_ref().map_or(1.0, |f| f[i]);
            let (sin, cos) = (self.freq_scale * (theta / ff)).sin_cos();
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
    /// Whether a tensor of this name exists.
    fn has_tensor(&self, name: &str) -> bool;
    /// Reads a tensor and checks its shape (outermost dimension first).
    fn read_tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor>;
    /// A tensor's stored GGUF type and its bytes, in place in the file's memory map (row-major,
    /// as GGUF stores them), after checking its shape: what weight matrices are built from.
    fn read_mapped(&mut self, name: &str, shape: &[usize]) -> Result<(GgmlDType, MappedBytes)>;
    /// Per-pair RoPE frequency factors, when the model has them (Llama 3).
    fn rope_factors(&mut self, config: &ModelConfig) -> Result<Option<Vec<f32>>>;
}

impl TensorSource for GgufFile {
    fn source_path(&self) -> &Path {
        self.path()
    }

    fn has_tensor(&self, name: &str) -> bool {
        GgufFile::has_tensor(self, name)
    }

    fn read_tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        self.tensor(name, shape)
    }

    fn read_mapped(&mut self, name: &str, shape: &[usize]) -> Result<(GgmlDType, MappedBytes)> {
        self.mapped(name, shape)
    }

    fn rope_factors(&mut self, config: &ModelConfig) -> Result<Option<Vec<f32>>> {
        if !GgufFile::has_tensor(self, "rope_freqs.weight") {
            return Ok(None);
        }
        let q = self.tensor("rope_freqs.weight", &[config.rope_dim / 2])?;
        let v = q
            .dequantize(&candle_core::Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swa_patterns_match_llama_cpp() {
        assert_eq!(pattern_layers(4, 2), [true, false, true, false]);
        assert_eq!(
            pattern_layers(7, 6),
            [true, true, true, true, true, false, true]
        );
        assert_eq!(pattern_layers(2, 0), [true, true]);
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
