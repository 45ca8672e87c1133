//! Gemma 4's per-layer geometry and per-layer token embeddings (llama.cpp's
//! `src/models/gemma4.cpp` and its hparams in `llama-hparams.cpp`): what the one
//! [`ModelConfig`] cannot say because it differs between layers.
//!
//! - Sliding-window layers (the GGUF's per-layer `attention.sliding_window_pattern`) have
//!   their own head size (`attention.key_length_swa`), RoPE dimensions
//!   (`rope.dimension_count_swa`) and base; full layers rotate with llama.cpp's
//!   "proportional" RoPE (the global `rope_freqs` factors, 1e30 for the pairs left unrotated).
//! - `attention.head_count_kv` and `feed_forward_length` may be arrays, one value per layer.
//! - The last `attention.shared_kv_layers` layers store no KV: each attends over the KV of
//!   layer `n − 2` (sliding) or `n − 1` (full), `n` the first sharing layer (llama.cpp's
//!   `layer_reuse_cb`).
//! - Per-layer token embeddings (`embedding_length_per_layer_input` > 0, E2B/E4B).
//!
//! The steps these take are in the plan (`Step::KeyAsValue`, `VNorm`, `AttendShared`,
//! `PerLayerInputs`, `PerLayerEmbed`, `LayerScale`); this module computes the per-layer
//! inputs and a layer's per-layer embedding.

use candle_core::quantized::gguf_file::Content;

use super::arch::{gguf_per_layer, Arch, ModelConfig, RopeFreqs, TensorSource};
use super::error::{ModelError, Result};
use super::quant::QWeight;
use super::transformer::{build_matrix, gated, rms_norm_in_place, to_f32_vec, WeightDType};
use crate::model::arch::Activation;
use crate::weights::gguf::{md_f32, md_usize};

/// One layer's attention and feed-forward geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerDims {
    pub n_head: usize,
    /// KV heads the layer stores (0 for a layer attending over another layer's KV).
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Leading dimensions of each head that RoPE rotates.
    pub rope_dim: usize,
    pub ffn_dim: usize,
    /// The layer whose KV it attends over: itself, or the earlier layer it shares.
    pub kv_layer: usize,
}

impl LayerDims {
    /// Layer `l` of a model whose layers all have `c`'s geometry.
    pub fn uniform(c: &ModelConfig, l: usize) -> LayerDims {
        LayerDims {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            rope_dim: c.rope_dim,
            ffn_dim: c.ffn_dim,
            kv_layer: l,
        }
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of the keys (or values) the layer stores.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

/// The per-layer geometry of a Gemma 4 GGUF.
#[derive(Debug, Clone, PartialEq)]
pub struct PerLayer {
    pub layers: Vec<LayerDims>,
    /// Each layer's `attention.head_count_kv` (a sharing layer's sizes the k/v projections
    /// its file may hold unused).
    pub kv_heads: Vec<usize>,
    /// Layers `0..kv_layers` store KV; the others read an earlier layer's.
    pub kv_layers: usize,
    /// Width of each layer's per-layer token embedding (0: none).
    pub ple_dim: usize,
    /// The RoPE angles of the sliding-window layers (their own dimensions and base, no
    /// frequency factors).
    pub swa_rope: RopeFreqs,
}

fn meta_err(key: &str, msg: String) -> ModelError {
    ModelError::Metadata {
        key: key.into(),
        msg,
    }
}

impl PerLayer {
    /// The geometry of a Gemma 4 GGUF (`None` for the other architectures).
    pub fn from_gguf(content: &Content, c: &ModelConfig) -> Result<Option<PerLayer>> {
        if c.arch != Arch::Gemma4 {
            return Ok(None);
        }
        let key = |k: &str| format!("{}.{k}", c.architecture);
        let has = |k: &str| content.metadata.contains_key(&key(k));
        let opt = |k: &str, d: usize| -> Result<usize> {
            match has(k) {
                true => Ok(md_usize(content, &key(k))?),
                false => Ok(d),
            }
        };
        let n = c.n_layer;
        if c.sliding_window.is_none() {
            return Err(meta_err(
                &key("attention.sliding_window"),
                "missing (Gemma 4 requires its window)".into(),
            ));
        }
        let hd_swa = md_usize(content, &key("attention.key_length_swa"))?;
        let v_swa = md_usize(content, &key("attention.value_length_swa"))?;
        if v_swa != hd_swa {
            return Err(meta_err(
                &key("attention.value_length_swa"),
                format!("{v_swa} differs from the key length {hd_swa}"),
            ));
        }
        let rd_swa = opt("rope.dimension_count_swa", c.rope_dim)?;
        if rd_swa > hd_swa || !rd_swa.is_multiple_of(2) || hd_swa == 0 {
            return Err(meta_err(
                &key("rope.dimension_count_swa"),
                format!("{rd_swa} is odd or exceeds the head dimension {hd_swa}"),
            ));
        }
        let kv_heads = match has("attention.head_count_kv") {
            true => gguf_per_layer(content, &key("attention.head_count_kv"), n)?,
            false => vec![c.n_head; n],
        };
        let ffn = gguf_per_layer(content, &key("feed_forward_length"), n)?;
        let shared = opt("attention.shared_kv_layers", 0)?;
        let kv_layers = n.saturating_sub(shared);
        let share_key = key("attention.shared_kv_layers");
        let source = |l: usize| -> Result<usize> {
            if l < kv_layers {
                return Ok(l);
            }
            // llama.cpp's rule: the last sliding and the last full layer that store KV.
            if kv_layers < 2 {
                return Err(meta_err(
                    &share_key,
                    format!("{shared} of {n} layers share KV: fewer than 2 layers store it"),
                ));
            }
            let src = kv_layers - if c.swa_layers[l] { 2 } else { 1 };
            if c.swa_layers[src] != c.swa_layers[l] {
                return Err(meta_err(
                    &share_key,
                    format!(
                        "layer {l} would read layer {src}'s KV, a layer of the other kind \
                         (sliding or full)"
                    ),
                ));
            }
            Ok(src)
        };
        let mut layers = Vec::with_capacity(n);
        for l in 0..n {
            let swa = c.swa_layers[l];
            let kv = kv_heads[l];
            if kv == 0 || !c.n_head.is_multiple_of(kv) {
                return Err(meta_err(
                    &key("attention.head_count_kv"),
                    format!("layer {l}: {kv} kv heads do not divide {} heads", c.n_head),
                ));
            }
            if ffn[l] == 0 {
                return Err(meta_err(
                    &key("feed_forward_length"),
                    format!("layer {l}: a zero width"),
                ));
            }
            let kv_layer = source(l)?;
            layers.push(LayerDims {
                n_head: c.n_head,
                n_kv_head: if kv_layer == l { kv } else { 0 },
                head_dim: if swa { hd_swa } else { c.head_dim },
                rope_dim: if swa { rd_swa } else { c.rope_dim },
                ffn_dim: ffn[l],
                kv_layer,
            });
        }
        // A sharing layer's queries match the heads of the KV it reads.
        for l in kv_layers..n {
            let src = layers[l].kv_layer;
            if layers[src].head_dim != layers[l].head_dim {
                return Err(meta_err(
                    &share_key,
                    format!("layer {l}'s head size differs from layer {src}'s"),
                ));
            }
        }
        let ple_dim = opt("embedding_length_per_layer_input", 0)?;
        let base_swa = c.rope_base_swa;
        let scale_swa = match has("rope.scaling.factor") {
            true => md_f32(content, &key("rope.scaling.factor"))?,
            false => 0.0,
        };
        if scale_swa != 0.0 && scale_swa != 1.0 {
            return Err(meta_err(
                &key("rope.scaling.factor"),
                format!("{scale_swa}: Candor's gemma4 forward pass scales no RoPE"),
            ));
        }
        let swa_rope = RopeFreqs {
            pairs: rd_swa / 2,
            theta_scale: base_swa.powf(-2.0 / rd_swa as f32),
            freq_scale: 1.0,
            factors: None,
            yarn: None,
            fixed: None,
            mscale: 1.0,
        };
        Ok(Some(PerLayer {
            layers,
            kv_heads,
            kv_layers,
            ple_dim,
            swa_rope,
        }))
    }

    /// The widest keys (or values) a layer stores.
    pub fn kv_width(&self) -> usize {
        self.layers.iter().map(LayerDims::kv_dim).max().unwrap_or(0)
    }
}

/// The model-wide weights of per-layer token embeddings.
pub(super) struct PerLayerEmbedding {
    /// `vocab × (n_layer · ple)`: each token's embedding for every layer.
    pub(super) tokens: QWeight,
    /// `(n_layer · ple) × dim`: the projection of the scaled token embedding.
    pub(super) proj: QWeight,
    /// The projection's RMS-norm weight (`ple`).
    pub(super) proj_norm: Vec<f32>,
    pub(super) ple: usize,
}

/// One layer's per-layer embedding weights.
pub(super) struct LayerEmbedding {
    /// `ple × dim`.
    pub(super) gate: QWeight,
    /// `dim × ple`.
    pub(super) proj: QWeight,
    pub(super) post_norm: Vec<f32>,
}

impl LayerEmbedding {
    pub(super) fn matrices(&self) -> [&QWeight; 2] {
        [&self.gate, &self.proj]
    }
}

impl PerLayerEmbedding {
    /// The model's per-layer embedding weights (`None` when `ple` is 0).
    pub(super) fn load(
        src: &mut dyn TensorSource,
        c: &ModelConfig,
        ple: usize,
        dtype: WeightDType,
    ) -> Result<Option<PerLayerEmbedding>> {
        if ple == 0 {
            return Ok(None);
        }
        let width = ple * c.n_layer;
        let tokens = build_matrix(
            src,
            "per_layer_token_embd.weight",
            &[c.vocab_size, width],
            dtype,
        )?;
        let proj = build_matrix(src, "per_layer_model_proj.weight", &[width, c.dim], dtype)?;
        let name = "per_layer_proj_norm.weight";
        let proj_norm = to_f32_vec(name, &src.read_tensor(name, &[ple])?)?;
        Ok(Some(PerLayerEmbedding {
            tokens,
            proj,
            proj_norm,
            ple,
        }))
    }

    /// Layer `l`'s weights.
    pub(super) fn load_layer(
        &self,
        src: &mut dyn TensorSource,
        l: usize,
        dim: usize,
        dtype: WeightDType,
    ) -> Result<LayerEmbedding> {
        let name = |s: &str| format!("blk.{l}.{s}");
        let gate = build_matrix(src, &name("inp_gate.weight"), &[self.ple, dim], dtype)?;
        let proj = build_matrix(src, &name("proj.weight"), &[dim, self.ple], dtype)?;
        let n = name("post_norm.weight");
        let post_norm = to_f32_vec(&n, &src.read_tensor(&n, &[dim])?)?;
        Ok(LayerEmbedding {
            gate,
            proj,
            post_norm,
        })
    }

    pub(super) fn matrices(&self) -> [&QWeight; 2] {
        [&self.tokens, &self.proj]
    }

    /// Every layer's input of each row (`[row][layer][ple]` into `out`), as llama.cpp's
    /// `build_inp_per_layer` and `project_per_layer_inputs`: the token's per-layer
    /// embedding times `sqrt(ple)`, plus the RMS-normed projection of the row's scaled
    /// embedding `x` times `1/sqrt(dim)`, the sum times `1/sqrt(2)`.
    pub(super) fn inputs(
        &self,
        tokens: &[u32],
        x: &[f32],
        dim: usize,
        eps: f32,
        proj: &mut [f32],
        out: &mut [f32],
    ) {
        let rows = tokens.len();
        let width = self.tokens.cols();
        self.proj
            .matmul(&x[..rows * dim], rows, &mut proj[..rows * width]);
        let proj_scale = 1.0 / (dim as f32).sqrt();
        for v in proj[..rows * width].iter_mut() {
            *v *= proj_scale;
        }
        rms_norm_in_place(&mut proj[..rows * width], &self.proj_norm, eps);
        let tok_scale = (self.ple as f32).sqrt();
        let input_scale = 1.0 / 2f32.sqrt();
        for (r, &t) in tokens.iter().enumerate() {
            let o = &mut out[r * width..(r + 1) * width];
            self.tokens.row_f32(t as usize, o);
            for (o, p) in o.iter_mut().zip(&proj[r * width..(r + 1) * width]) {
                *o = (*p + *o * tok_scale) * input_scale;
            }
        }
    }

    /// Layer `l`'s per-layer embedding added to the residual stream `x` (`rows` rows):
    /// `x += rms_norm(proj · (gelu(gate · x) · input)) · post_norm`, GELU as llama.cpp's CPU
    /// backend computes it (its f16 table).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn embed(
        &self,
        w: &LayerEmbedding,
        l: usize,
        n_layer: usize,
        inputs: &[f32],
        x: &mut [f32],
        rows: usize,
        eps: f32,
        gate: &mut [f32],
        input: &mut [f32],
        out: &mut [f32],
    ) {
        let (ple, dim) = (self.ple, w.post_norm.len());
        let gate = &mut gate[..rows * ple];
        let input = &mut input[..rows * ple];
        w.gate.matmul(&x[..rows * dim], rows, gate);
        for r in 0..rows {
            let at = (r * n_layer + l) * ple;
            input[r * ple..(r + 1) * ple].copy_from_slice(&inputs[at..at + ple]);
        }
        gated(Activation::GeluTanhF16, gate, input);
        let out = &mut out[..rows * dim];
        w.proj.matmul(gate, rows, out);
        rms_norm_in_place(out, &w.post_norm, eps);
        for (a, b) in x[..rows * dim].iter_mut().zip(out.iter()) {
            *a += b;
        }
    }
}
