//! The one forward pass over packed rows, for every supported architecture (llama, mistral,
//! qwen2, qwen3, gemma2, gemma3, phi3; llama.cpp's `src/models/<arch>.cpp` are the reference
//! implementations). What differs between them is data in [`ModelConfig`] and optional
//! weights (biases, q/k norms, post-norms, fused projections), never a second copy of the
//! pass: the layer sequence is the model's [`Plan`] (`model::plan`), which `forward` executes
//! step by step and the GPU lowers to its launches. Weights come from a GGUF file or a Hugging Face checkpoint through [`TensorSource`].
//!
//! One forward step takes several sequences, each contributing some new tokens (a prefill chunk
//! or one decode token) at its own positions, attending over its own KV state only. There is no
//! padding: rows are packed back to back. Every row's arithmetic is independent of the batch it
//! is in (row-independent matmuls, per-row norms, per-row attention with a fixed reduction
//! order), so a token's logits do not depend on batch size, neighbours or thread count. The KV
//! state itself belongs to the caller (the engine) behind the [`KvSeq`] trait (`model::kv`); this module owns
//! only immutable weights and reusable scratch buffers.

use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use rayon::prelude::*;

use super::arch::{
    Activation, Arch, ArchSpec, Gating, ModelConfig, MoeConfig, RopeFreqs, TensorSource,
};
use super::attention::{attend, attention_tasks, Geometry};
use super::deltanet::{out_gate, split_gate, DeltaNet, DeltaScratch, Hybrid};
use super::error::{ModelError, Result};
use super::expf::exp_shifted_in_place;
use super::gemma4::{LayerDims, LayerEmbedding, PerLayer, PerLayerEmbedding};
use super::kv::{KvSeq, Logits, SeqStep};
use super::memory::{ExpertPanels, Placement};
use super::mla::{Latent, LatentScratch};
use super::moe::{Expert, MlpBeside, Moe, MoeScratch, SharedExpert};
#[cfg(any(test, feature = "testkit"))]
use super::plan::{trace, Place};
use super::plan::{Block, LayerParts, Matrix, Plan, RopeTable, Step};
use super::quant::{has_stored_kernel, QWeight, PANEL_LAYOUT};
use crate::model::checkpoint::Checkpoint;
use crate::weights::error::WeightsError;
use crate::weights::gguf::GgufFile;
use crate::weights::mapped::MappedBytes;
use crate::weights::panel_file::{PanelFile, PanelKey};
use crate::weights::stored::StoredType;

/// How matrix weights are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDType {
    /// As stored (quantized matrices stay quantized); the default.
    #[default]
    Native,
    /// Everything dequantized to f32 (the accuracy reference mode).
    F32,
}

/// Whether the quantized kernels handle a stored type natively.
fn has_native_kernel(dtype: GgmlDType) -> bool {
    super::quant::has_kernel(dtype)
}

/// Builds a weight matrix: as stored (`Native`, quantized kernels, float types read in place
/// from the file's memory map) or dequantized (`F32`). A stored type without a native kernel
/// is an error in `Native` mode rather than a silent change of numerics.
pub(super) fn build_matrix(
    src: &mut dyn TensorSource,
    name: &str,
    shape: &[usize],
    dtype: WeightDType,
) -> Result<QWeight> {
    let err = |stored: GgmlDType, e: String| ModelError::UnsupportedTensorType {
        name: name.into(),
        dtype: format!("{stored:?} ({e})"),
    };
    match dtype {
        WeightDType::F32 => {
            let q = src.read_tensor(name, shape)?;
            QWeight::dequantized(&q).map_err(|e| err(q.dtype(), e.to_string()))
        }
        WeightDType::Native => {
            let (stored, bytes) = src.read_mapped(name, shape)?;
            if !has_native_kernel(stored) {
                return Err(err(
                    stored,
                    "no quantized kernel; load with --dtype f32".into(),
                ));
            }
            let &[n, k] = shape else {
                return Err(err(
                    stored,
                    format!("expected a 2-d weight matrix, got shape {shape:?}"),
                ));
            };
            QWeight::from_mapped(stored, n, k, bytes).map_err(|e| err(stored, e.to_string()))
        }
    }
}

/// Rows `rows` (in that order) of the `shape` matrix `name`, as one matrix held as `dtype`
/// says: a tensor that fuses several matrices row-wise, split (Qwen3-Next's `ssm_ba` and
/// `ssm_in`). Each row keeps the file's bytes, so each output of the split matrices is the
/// fused matrix's (a row's products depend on that row alone).
pub(super) fn build_matrix_rows(
    src: &mut dyn TensorSource,
    name: &str,
    shape: &[usize],
    rows: &[usize],
    dtype: WeightDType,
) -> Result<QWeight> {
    let (stored, bytes) = src.read_mapped(name, shape)?;
    let err = |e: String| ModelError::UnsupportedTensorType {
        name: name.into(),
        dtype: format!("{stored:?} ({e})"),
    };
    let &[n, k] = shape else {
        return Err(err(format!(
            "expected a 2-d weight matrix, got shape {shape:?}"
        )));
    };
    let raw = bytes.bytes();
    let row = raw.len() / n.max(1);
    let mut picked = Vec::with_capacity(rows.len() * row);
    for &r in rows {
        picked.extend_from_slice(&raw[r * row..(r + 1) * row]);
    }
    // Copied: the file's pages need not stay in this process's memory (as `from_mapped`).
    bytes.release();
    match dtype {
        WeightDType::F32 => {
            QWeight::dequantized_stored(StoredType::Ggml(stored), rows.len(), k, &picked)
        }
        WeightDType::Native if has_native_kernel(stored) => {
            QWeight::from_bytes(stored, rows.len(), k, &picked)
        }
        WeightDType::Native => {
            return Err(err("no quantized kernel; load with --dtype f32".into()));
        }
    }
    .map_err(|e| err(e.to_string()))
}

/// Layer `l`'s Mixture-of-Experts block: the router (`ffn_gate_inp`) and each expert's
/// matrices, sliced out of the 3-d `ffn_{gate,up,down}_exps` tensors (experts outermost).
fn load_moe(
    src: &mut dyn TensorSource,
    l: usize,
    c: &ModelConfig,
    moe: MoeConfig,
    dtype: WeightDType,
    panels: &Placement,
) -> Result<Moe> {
    let name = |suffix: &str| format!("blk.{l}.{suffix}");
    let (dim, ffn, n) = (c.dim, moe.ffn_dim, moe.experts);
    let router = build_matrix(src, &name("ffn_gate_inp.weight"), &[n, dim], dtype)?;
    for t in [
        "ffn_gate_exps.scale",
        "ffn_up_exps.scale",
        "ffn_gate_up_exps.weight",
    ] {
        if src.has_tensor(&name(t)) {
            return Err(ModelError::UnsupportedTensorType {
                name: name(t),
                dtype: "expert gate/up scales and fused gate|up experts are not implemented".into(),
            });
        }
    }
    let mut matrices = |suffix: &str, rows: usize, cols: usize| {
        expert_matrices(src, &name(suffix), n, rows, cols, dtype, panels)
    };
    let mut gate = matrices("ffn_gate_exps.weight", ffn, dim)?;
    let mut up = matrices("ffn_up_exps.weight", ffn, dim)?;
    let mut down = matrices("ffn_down_exps.weight", dim, ffn)?;
    // Biases (gpt-oss): of the router, and per expert of gate, up and down.
    let mut vector = |suffix: &str, shape: &[usize]| -> Result<Option<Vec<f32>>> {
        let n = name(suffix);
        if !src.has_tensor(&n) {
            return Ok(None);
        }
        to_f32_vec(&n, &src.read_tensor(&n, shape)?).map(Some)
    };
    let router_bias = vector("ffn_gate_inp.bias", &[n])?;
    let selection_bias = match moe.gating {
        Gating::Deepseek { .. } => vector("exp_probs_b.bias", &[n])?,
        _ => None,
    };
    // Each expert's output scale (llama.cpp's `ffn_down_exps_s`, Gemma 4's
    // `per_expert_scale`); the gate and up scales llama.cpp also reads have no converter
    // writing them for a model Candor runs.
    let down_scale = vector("ffn_down_exps.scale", &[n])?;
    let biases = [
        vector("ffn_gate_exps.bias", &[n, ffn])?,
        vector("ffn_up_exps.bias", &[n, ffn])?,
        vector("ffn_down_exps.bias", &[n, dim])?,
    ];
    let bias = |e: usize| -> Option<[Vec<f32>; 3]> {
        let [Some(g), Some(u), Some(d)] = &biases else {
            return None;
        };
        Some([
            g[e * ffn..(e + 1) * ffn].to_vec(),
            u[e * ffn..(e + 1) * ffn].to_vec(),
            d[e * dim..(e + 1) * dim].to_vec(),
        ])
    };
    if biases.iter().any(Option::is_some) && bias(0).is_none() {
        return Err(ModelError::MissingTensor(format!(
            "{}: expert biases of gate, up and down come together",
            name("ffn_*_exps.bias")
        )));
    }
    let experts = (0..n)
        .map(|e| Expert {
            gate: gate.next().expect("n experts"),
            up: up.next().expect("n experts"),
            down: down.next().expect("n experts"),
            bias: bias(e),
        })
        .collect();
    // Qwen3.5-MoE's shared expert: gate, up and down matrices as a dense layer's, and its
    // gate, one vector of `dim` (a `1 × dim` matrix, F32 in every file: llama-quantize keeps
    // vectors).
    let shared = match moe.shared_ffn {
        Some(f) => {
            let mut mat =
                |suffix: &str, shape: &[usize]| build_matrix(src, &name(suffix), shape, dtype);
            let (gate, up) = (
                mat("ffn_gate_shexp.weight", &[f, dim])?,
                mat("ffn_up_shexp.weight", &[f, dim])?,
            );
            let down = mat("ffn_down_shexp.weight", &[dim, f])?;
            let gate_inp = match moe.shared_gated {
                true => {
                    let n = name("ffn_gate_inp_shexp.weight");
                    let g = to_f32_vec(&n, &src.read_tensor(&n, &[dim])?)?;
                    Some(QWeight::from_f32(1, dim, g))
                }
                false => None,
            };
            Some(Box::new(SharedExpert {
                gate,
                up,
                down,
                gate_inp,
            }))
        }
        None => None,
    };
    Ok(Moe {
        router,
        router_bias,
        selection_bias,
        experts,
        config: moe,
        shared,
        down_scale,
        beside: None,
    })
}

/// The `experts` matrices (`rows × cols` each) of one 3-d expert tensor, in expert order:
/// quantized ones repacked into memory or into a panel file read in place (see
/// [`super::memory`]), float ones read in place from the model file.
fn expert_matrices(
    src: &mut dyn TensorSource,
    name: &str,
    experts: usize,
    rows: usize,
    cols: usize,
    dtype: WeightDType,
    panels: &Placement,
) -> Result<std::vec::IntoIter<QWeight>> {
    let shape = [experts, rows, cols];
    let err = |stored: StoredType, e: String| ModelError::UnsupportedTensorType {
        name: name.into(),
        dtype: format!("{stored} ({e})"),
    };
    // MXFP4 (gpt-oss's experts) included; each expert's bytes (a checkpoint's lie apart).
    let (stored, parts) = src.read_experts_mapped(name, shape)?;
    if dtype == WeightDType::Native && !has_stored_kernel(stored) {
        return Err(err(
            stored,
            "no quantized kernel; load with --dtype f32".into(),
        ));
    }
    let raw = |e: usize| parts[e].bytes();
    let panel_len =
        QWeight::panel_bytes(stored, rows, cols).map_err(|e| err(stored, e.to_string()))?;
    let total: usize = parts.iter().map(|p| p.bytes().len()).sum();
    let folder = panels.experts.folder(total);
    let mut out = Vec::with_capacity(experts);
    match (dtype, panel_len, folder) {
        (WeightDType::Native, Some(len), Some(dir)) => {
            let key = PanelKey {
                model: src.tensor_path(name),
                tensor: name,
                layout: &format!("{stored} {experts}x{rows}x{cols} {PANEL_LAYOUT}"),
            };
            let file =
                PanelFile::open_or_write(&dir, &key, experts * len, panels.populate, |dst| {
                    for (e, d) in dst.chunks_exact_mut(len.max(1)).enumerate() {
                        QWeight::repack_stored(stored, rows, cols, raw(e), d)
                            .map_err(|x| std::io::Error::other(format!("{name}: {x}")))?;
                    }
                    Ok(())
                })
                .map_err(|e| ModelError::io(&dir, e))?;
            for e in 0..experts {
                let m = MappedBytes::new(file.map.clone(), e * len, len)
                    .expect("a panel file holds every expert");
                out.push(
                    QWeight::from_panel_file(stored, rows, cols, m)
                        .map_err(|x| err(stored, x.to_string()))?,
                );
            }
        }
        // Float experts: read in place from the model file's map, as other float weights.
        (WeightDType::Native, None, _) => {
            for m in parts {
                out.push(
                    QWeight::from_stored(stored, rows, cols, m)
                        .map_err(|x| err(stored, x.to_string()))?,
                );
            }
            return Ok(out.into_iter());
        }
        _ => {
            for e in 0..experts {
                let w = match dtype {
                    WeightDType::Native => QWeight::from_stored_bytes(stored, rows, cols, raw(e)),
                    WeightDType::F32 => QWeight::dequantized_stored(stored, rows, cols, raw(e)),
                }
                .map_err(|e| err(stored, e.to_string()))?;
                out.push(w);
            }
        }
    }
    // The file's pages of a repacked tensor are not read again.
    MappedBytes::release_all(&parts);
    Ok(out.into_iter())
}

/// A small tensor (a norm weight, RoPE factors) as f32 values.
pub(super) fn to_f32_vec(name: &str, q: &QTensor) -> Result<Vec<f32>> {
    let t = q.dequantize(&Device::Cpu)?;
    t.flatten_all()?
        .to_vec1::<f32>()
        .map_err(|e| ModelError::UnsupportedTensorType {
            name: name.into(),
            dtype: format!("{:?} ({e})", q.dtype()),
        })
}

/// Query, key and value projections: separate, or one fused matrix (Phi-3) whose rows are
/// the queries, then the keys, then the values.
pub(super) enum Qkv {
    Split {
        q: QWeight,
        k: QWeight,
        v: QWeight,
    },
    Fused(QWeight),
    /// Queries and keys; the values are the keys' projection (Gemma 4 layers without
    /// `attn_v`).
    QueryKey {
        q: QWeight,
        k: QWeight,
    },
    /// The queries alone: the layer attends over an earlier layer's KV (Gemma 4).
    Query(QWeight),
    /// Multi-head Latent Attention's projections (DeepSeek; [`Latent`]).
    Latent(Box<Latent>),
}

/// Gate and up projections: separate, or one fused matrix (Phi-3), gate rows first.
pub(super) enum GateUp {
    Split { gate: QWeight, up: QWeight },
    Fused(QWeight),
}

/// A layer's feed-forward block: dense, or a Mixture of Experts.
pub(super) enum Ffn {
    Dense { gate_up: GateUp, down: QWeight },
    Moe(Moe),
}

pub(super) struct Layer {
    pub(super) attn_norm: Vec<f32>,
    pub(super) qkv: Qkv,
    /// q/k/v biases (Qwen2).
    pub(super) bias: Option<[Vec<f32>; 3]>,
    /// Per-head RMS norms of queries and keys before RoPE (Qwen3, Gemma 3).
    pub(super) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub(super) wo: QWeight,
    /// The output projection's bias (gpt-oss).
    pub(super) out_bias: Option<Vec<f32>>,
    /// Per query head, the attention sink logit (gpt-oss).
    pub(super) sinks: Option<Vec<f32>>,
    /// Norm of the attention output before the residual add (Gemma).
    pub(super) post_attn_norm: Option<Vec<f32>>,
    pub(super) ffn_norm: Vec<f32>,
    pub(super) ffn: Ffn,
    /// Norm of the feed-forward output before the residual add (Gemma).
    pub(super) post_ffn_norm: Option<Vec<f32>>,
    /// Sliding-window layer (its own RoPE frequencies and attention window).
    pub(super) swa: bool,
    /// A linear-attention layer's weights (Qwen3.5): its `qkv` is then the fused q|k|v
    /// input projection and its `wo` the output projection.
    pub(super) delta: Option<DeltaNet>,
    /// The query projection carries each head's output gate after its query (Qwen3.5).
    pub(super) out_gate: bool,
    /// Values RMS-normed per head without weight (Gemma 4).
    pub(super) v_norm: bool,
    /// The earlier layer whose KV this layer attends over, storing none (Gemma 4).
    pub(super) kv_from: Option<usize>,
    /// The layer's per-layer embedding weights (Gemma 4 E2B/E4B).
    pub(super) ple: Option<LayerEmbedding>,
    /// The layer's output scale (Gemma 4's `layer_output_scale`).
    pub(super) out_scale: Option<f32>,
    /// The biases after the attention and feed-forward pre-norms (phimoe).
    pub(super) norm_bias: Option<[Vec<f32>; 2]>,
}

impl Layer {
    /// Every weight matrix of the layer: q/k/v (or the fused one), the output projection, the
    /// feed-forward's matrices (the router and every expert's for experts).
    pub(super) fn matrices(&self) -> Vec<&QWeight> {
        let mut ms: Vec<&QWeight> = match &self.qkv {
            Qkv::Split { q, k, v } => vec![q, k, v],
            Qkv::Fused(m) => vec![m],
            Qkv::QueryKey { q, k } => vec![q, k],
            Qkv::Query(q) => vec![q],
            Qkv::Latent(m) => m.matrices(),
        };
        ms.push(&self.wo);
        if let Some(p) = &self.ple {
            ms.extend(p.matrices());
        }
        match &self.ffn {
            Ffn::Dense { gate_up, down } => {
                match gate_up {
                    GateUp::Split { gate, up } => ms.extend([gate, up]),
                    GateUp::Fused(m) => ms.push(m),
                }
                ms.push(down);
            }
            Ffn::Moe(moe) => {
                ms.push(&moe.router);
                ms.extend(moe.experts.iter().flat_map(|e| [&e.gate, &e.up, &e.down]));
                if let Some(sh) = &moe.shared {
                    ms.extend([&sh.gate, &sh.up, &sh.down]);
                    ms.extend(&sh.gate_inp);
                }
                if let Some((gate_up, down)) = moe.mlp() {
                    match gate_up {
                        GateUp::Split { gate, up } => ms.extend([gate, up]),
                        GateUp::Fused(m) => ms.push(m),
                    }
                    ms.push(down);
                }
            }
        }
        ms
    }

    /// The dense feed-forward block's gate/up and down matrices: a dense layer's, or the MLP
    /// beside a Gemma 4 MoE layer's experts (`None` for other experts' layers).
    pub(super) fn mlp(&self) -> Option<(&GateUp, &QWeight)> {
        match &self.ffn {
            Ffn::Dense { gate_up, down } => Some((gate_up, down)),
            Ffn::Moe(moe) => moe.mlp(),
        }
    }

    /// What the layer holds that its steps depend on; `swa_table`: whether the model's
    /// sliding-window layers have RoPE angles of their own.
    fn parts(&self, swa_table: bool) -> LayerParts {
        LayerParts {
            fused: matches!(self.qkv, Qkv::Fused(_)) && self.delta.is_none(),
            bias: self.bias.is_some(),
            qk_norm: self.qk_norm.is_some(),
            post_norms: self.post_attn_norm.is_some(),
            swa_rope: self.swa && swa_table,
            moe: matches!(self.ffn, Ffn::Moe(_)),
            out_bias: self.out_bias.is_some(),
            sinks: self.sinks.is_some(),
            linear: self.delta.is_some(),
            out_gate: self.out_gate,
            shared_expert: matches!(&self.ffn, Ffn::Moe(m) if m.shared.is_some()),
            mlp_beside: matches!(&self.ffn, Ffn::Moe(m) if m.beside.is_some()),
            key_as_value: matches!(self.qkv, Qkv::QueryKey { .. }),
            latent: matches!(self.qkv, Qkv::Latent(_)),
            v_norm: self.v_norm,
            kv_from: self.kv_from,
            per_layer_input: self.ple.is_some(),
            out_scale: self.out_scale.is_some(),
            norm_bias: self.norm_bias.is_some(),
        }
    }
}

/// What one token costs the forward pass: the bytes of the weights it reads and its
/// multiply-adds, for the layers' matrices and for the output projection apart (prefill runs
/// the output projection for the last row of a sequence only). Attention's own work (which
/// grows with the context) is not included; the KV bytes per position are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    /// Bytes of the layers' matrices (q/k/v, output, gate/up, down), as the kernels read them.
    pub layer_bytes: usize,
    /// Multiply-adds per token of the layers' quantized matrices (8-bit integer products).
    pub layer_int_macs: usize,
    /// Multiply-adds per token of the layers' float matrices.
    pub layer_float_macs: usize,
    /// Bytes of the output projection (the embedding when tied).
    pub output_bytes: usize,
    /// Multiply-adds of the output projection for one row.
    pub output_macs: usize,
    /// Bytes of keys and values (f32) stored per position, all layers.
    pub kv_bytes_per_position: usize,
    /// Bytes of recurrent state (f32) each sequence holds, read and written every step
    /// (hybrid models; 0 otherwise).
    pub state_bytes_per_sequence: usize,
}

/// A loaded model of one of the supported architectures: configuration and immutable
/// weights. The name is historical: every architecture runs through this one forward pass,
/// parameterised by its [`ModelConfig`].
pub struct Transformer {
    pub(super) config: ModelConfig,
    pub(super) dtype: WeightDType,
    /// `vocab × dim`; rows are dequantized on lookup.
    pub(super) embedding: QWeight,
    pub(super) layers: Vec<Layer>,
    pub(super) output_norm: Vec<f32>,
    /// `None` when tied to the embedding.
    pub(super) output: Option<QWeight>,
    /// The biases after the final norm and on the logits (phimoe).
    pub(super) head_bias: Option<[Vec<f32>; 2]>,
    /// The RoPE angles of full-attention layers (Llama 3 frequency factors and linear scaling
    /// applied).
    pub(super) rope_freqs: RopeFreqs,
    /// The same for sliding-window layers, when they differ.
    pub(super) rope_swa_freqs: Option<RopeFreqs>,
    /// The steps of each layer and of the head, which every device executes.
    pub(super) plan: Plan,
    /// The linear-attention geometry of a hybrid model (Qwen3.5).
    pub(super) hybrid: Option<Hybrid>,
    /// Each layer's geometry (the configuration's for every layer but Gemma 4's).
    pub(super) dims: Vec<LayerDims>,
    /// Gemma 4's per-layer geometry.
    pub(super) per_layer: Option<PerLayer>,
    /// Gemma 4's per-layer token embeddings (E2B/E4B).
    pub(super) ple: Option<PerLayerEmbedding>,
}

/// One line naming the tensors a file holds that the forward pass did not read (the first
/// eight, and how many more), or nothing when there are none.
fn refuse_unused(
    unused: &[String],
    arch: Arch,
    err: impl FnOnce(String) -> ModelError,
) -> Result<()> {
    if unused.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 8;
    let more = unused.len().saturating_sub(SHOWN);
    let mut names = unused[..unused.len().min(SHOWN)].join(", ");
    if more > 0 {
        names += &format!(" and {more} more");
    }
    Err(err(format!(
        "{} tensor(s) that Candor's {} forward pass does not use: {names}; the file needs a \
         feature Candor does not implement, so it is refused rather than run as a different \
         model",
        unused.len(),
        arch.gguf_name()
    )))
}

/// Whether tensor `name` belongs to a layer `blk.N.` with `N ≥ n_layer`.
fn beyond_trunk(name: &str, n_layer: usize) -> bool {
    name.strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(n, _)| n.parse::<usize>().ok())
        .is_some_and(|n| n >= n_layer)
}

impl Transformer {
    /// Loads a GGUF file.
    pub fn from_gguf_path(path: &Path, dtype: WeightDType) -> Result<Transformer> {
        let mut file = GgufFile::open(path)?;
        Transformer::from_gguf(&mut file, dtype)
    }

    /// Builds the model from an open GGUF file, its experts (if any) kept where
    /// `$CANDOR_EXPERTS` says ([`ExpertPanels::from_env`]).
    pub fn from_gguf(file: &mut GgufFile, dtype: WeightDType) -> Result<Transformer> {
        Transformer::from_gguf_with(file, dtype, &ExpertPanels::from_env())
    }

    /// Builds the model from an open GGUF file, its experts kept as `panels` says; refuses it
    /// first when the weights it must hold in memory exceed what the machine has left
    /// ([`super::memory::check_fits`]).
    pub fn from_gguf_with(
        file: &mut GgufFile,
        dtype: WeightDType,
        panels: &ExpertPanels,
    ) -> Result<Transformer> {
        let config = ModelConfig::from_gguf(file.content())?;
        let hybrid = Hybrid::from_gguf(file.content(), &config)
            .map_err(|e| WeightsError::gguf(file.path(), e.to_string()))?;
        let per_layer = PerLayer::from_gguf(file.content(), &config)
            .map_err(|e| WeightsError::gguf(file.path(), e.to_string()))?;
        let arch = config.arch;
        let r = super::memory::residency(file, dtype, panels)?;
        let available = super::memory::available_bytes();
        super::memory::check_fits(file.path(), r.resident, available)?;
        let placement = Placement {
            experts: panels.clone(),
            populate: r.populate(available),
        };
        let model = Transformer::build(config, hybrid, per_layer, file, dtype, &placement)?;
        // A tensor the pass does not read is a feature it does not implement: refused, never
        // ignored (the model would compute something else without a word). The exception:
        // the multi-token-prediction layers after the trunk of a model whose files have them
        // (`ArchSpec::nextn`), which only drafting would run (none here).
        let mut unused = file.unread_tensors();
        if ArchSpec::of(model.config.arch).nextn {
            unused.retain(|t| !beyond_trunk(t, model.config.n_layer));
        }
        refuse_unused(&unused, arch, |msg| {
            WeightsError::gguf(file.path(), msg).into()
        })?;
        Ok(model)
    }

    /// Builds the model from an open Hugging Face checkpoint; like [`Transformer::from_gguf`],
    /// it refuses a checkpoint with language-model tensors the pass does not read.
    pub fn from_checkpoint(ck: &mut Checkpoint, dtype: WeightDType) -> Result<Transformer> {
        let config = ck.config().clone();
        let arch = config.arch;
        let hybrid = ck.hybrid()?;
        let placement = Placement {
            experts: ExpertPanels::from_env(),
            populate: false,
        };
        let model = Transformer::build(config, hybrid, None, ck, dtype, &placement)?;
        // As for a GGUF: the multi-token-prediction layers after the trunk (GLM-4.5 keeps them
        // as `layers.{n_layer}…`) go unread.
        let mut unused = ck.unread_tensors();
        if ArchSpec::of(arch).nextn {
            let n = model.config.n_layer;
            unused.retain(|t| !ck.beyond_trunk(t, n));
        }
        refuse_unused(&unused, arch, |msg| ModelError::Safetensors {
            path: ck.source_path().to_path_buf(),
            msg,
        })?;
        Ok(model)
    }

    /// Builds the model from tensors under GGUF names (a GGUF file or a checkpoint) of a
    /// model without linear-attention layers.
    pub fn from_source(
        config: ModelConfig,
        src: &mut dyn TensorSource,
        dtype: WeightDType,
    ) -> Result<Transformer> {
        let placement = Placement {
            experts: ExpertPanels::from_env(),
            populate: false,
        };
        Transformer::build(config, None, None, src, dtype, &placement)
    }

    /// [`Transformer::from_source`] with a hybrid model's linear-attention geometry and the
    /// experts placed as `panels` says.
    fn build(
        config: ModelConfig,
        hybrid: Option<Hybrid>,
        per_layer: Option<PerLayer>,
        src: &mut dyn TensorSource,
        dtype: WeightDType,
        panels: &Placement,
    ) -> Result<Transformer> {
        let c = &config;
        if ArchSpec::of(c.arch).hybrid && hybrid.is_none() {
            return Err(ModelError::Metadata {
                key: format!("{}.ssm.state_size", c.architecture),
                msg: "a hybrid model's linear-attention geometry comes from its GGUF".into(),
            });
        }
        if ArchSpec::of(c.arch).per_layer && per_layer.is_none() {
            return Err(ModelError::Metadata {
                key: format!("{}.attention.key_length_swa", c.architecture),
                msg: "a Gemma 4 model's per-layer geometry comes from its GGUF".into(),
            });
        }
        let dims: Vec<LayerDims> = match &per_layer {
            Some(p) => p.layers.clone(),
            None => (0..c.n_layer).map(|l| LayerDims::uniform(c, l)).collect(),
        };
        let embedding = build_matrix(src, "token_embd.weight", &[c.vocab_size, c.dim], dtype)?;
        let ple = match &per_layer {
            Some(p) => PerLayerEmbedding::load(src, c, p.ple_dim, dtype)?,
            None => None,
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for (i, &d) in dims.iter().enumerate() {
            let (dim, q_dim, kv_dim, ffn, hd) =
                (c.dim, d.q_dim(), d.kv_dim(), d.ffn_dim, d.head_dim);
            let name = |suffix: &str| format!("blk.{i}.{suffix}");
            if let Some(p) = &per_layer {
                layers.push(Self::load_gemma4_layer(
                    src,
                    c,
                    p,
                    ple.as_ref(),
                    i,
                    dtype,
                    panels,
                )?);
                continue;
            }
            let linear = hybrid.as_ref().filter(|h| h.linear[i]);
            let (delta, linear_qkv) = match linear {
                Some(h) => {
                    let (delta, qkv) = DeltaNet::load(src, i, h, dim, dtype)?;
                    (Some(delta), Some(qkv))
                }
                None => (None, None),
            };
            let latent = match c.mla {
                Some(mla) if linear.is_none() => Some(Latent::load(src, i, c, mla, dtype)?),
                _ => None,
            };
            let mut mat = |suffix: &str, shape: &[usize]| -> Result<QWeight> {
                build_matrix(src, &name(suffix), shape, dtype)
            };

            // Qwen3.5's full-attention queries carry an output gate per head.
            let out_gate = hybrid.is_some() && linear.is_none();
            let qkv = if let Some(qkv) = linear_qkv {
                Qkv::Fused(qkv)
            } else if let Some(l) = latent {
                Qkv::Latent(Box::new(l))
            } else if c.arch.fused() {
                Qkv::Fused(mat("attn_qkv.weight", &[q_dim + 2 * kv_dim, dim])?)
            } else {
                let q_rows = if out_gate { 2 * q_dim } else { q_dim };
                Qkv::Split {
                    q: mat("attn_q.weight", &[q_rows, dim])?,
                    k: mat("attn_k.weight", &[kv_dim, dim])?,
                    v: mat("attn_v.weight", &[kv_dim, dim])?,
                }
            };
            let wo = match (linear, c.mla) {
                (Some(h), _) => mat("ssm_out.weight", &[dim, h.value_dim()])?,
                (None, Some(m)) => mat("attn_output.weight", &[dim, c.n_head * m.v_head])?,
                (None, None) => mat("attn_output.weight", &[dim, q_dim])?,
            };

            // DeepSeek's leading layers are dense.
            let ffn = match c.moe.filter(|m| i >= m.dense_lead) {
                Some(moe) => Ffn::Moe(load_moe(src, i, c, moe, dtype, panels)?),
                None => Ffn::Dense {
                    gate_up: if c.arch.fused() {
                        GateUp::Fused(mat("ffn_up.weight", &[2 * ffn, dim])?)
                    } else {
                        GateUp::Split {
                            gate: mat("ffn_gate.weight", &[ffn, dim])?,
                            up: mat("ffn_up.weight", &[ffn, dim])?,
                        }
                    },
                    down: mat("ffn_down.weight", &[dim, ffn])?,
                },
            };
            let has_bias = src.has_tensor(&name("attn_q.bias"));
            let has_qk_norm = src.has_tensor(&name("attn_q_norm.weight"));
            let has_out_bias = src.has_tensor(&name("attn_output.bias"));
            let has_sinks = src.has_tensor(&name("attn_sinks.weight"));
            let mut vector = |suffix: &str, len: usize| -> Result<Vec<f32>> {
                let n = name(suffix);
                to_f32_vec(&n, &src.read_tensor(&n, &[len])?)
            };
            let attn_norm = vector("attn_norm.weight", dim)?;
            let ffn_norm = vector(c.arch.ffn_norm_tensor(), dim)?;
            let out_bias = if has_out_bias {
                Some(vector("attn_output.bias", dim)?)
            } else {
                None
            };
            let sinks = if has_sinks {
                Some(vector("attn_sinks.weight", c.n_head)?)
            } else {
                None
            };
            let bias = if has_bias {
                Some([
                    vector("attn_q.bias", q_dim)?,
                    vector("attn_k.bias", kv_dim)?,
                    vector("attn_v.bias", kv_dim)?,
                ])
            } else {
                None
            };
            let qk_norm = if has_qk_norm {
                Some((
                    vector("attn_q_norm.weight", hd)?,
                    vector("attn_k_norm.weight", hd)?,
                ))
            } else {
                None
            };
            let gemma = c.arch.is_gemma();
            let post_attn_norm = if gemma {
                Some(vector("post_attention_norm.weight", dim)?)
            } else {
                None
            };
            let post_ffn_norm = if gemma {
                Some(vector("post_ffw_norm.weight", dim)?)
            } else {
                None
            };
            let norm_bias = match c.norm_bias {
                true => Some([
                    vector("attn_norm.bias", dim)?,
                    vector("ffn_norm.bias", dim)?,
                ]),
                false => None,
            };
            layers.push(Layer {
                attn_norm,
                qkv,
                bias,
                qk_norm,
                wo,
                out_bias,
                sinks,
                post_attn_norm,
                ffn_norm,
                ffn,
                post_ffn_norm,
                swa: c.window(i).is_some(),
                delta,
                out_gate,
                v_norm: false,
                kv_from: None,
                ple: None,
                out_scale: None,
                norm_bias,
            });
        }
        let output_norm = to_f32_vec(
            "output_norm.weight",
            &src.read_tensor("output_norm.weight", &[c.dim])?,
        )?;
        let head_bias = match c.norm_bias {
            true => {
                let mut vector = |n: &str, len: usize| to_f32_vec(n, &src.read_tensor(n, &[len])?);
                Some([
                    vector("output_norm.bias", c.dim)?,
                    vector("output.bias", c.vocab_size)?,
                ])
            }
            false => None,
        };
        // Tied embeddings exactly when there is no `output.weight`.
        let output = if src.has_tensor("output.weight") {
            Some(build_matrix(
                src,
                "output.weight",
                &[c.vocab_size, c.dim],
                dtype,
            )?)
        } else {
            None
        };
        let factors = src.rope_factors(c)?;
        let fixed = c.fixed_pairs();
        let freqs = |swa: bool| RopeFreqs {
            fixed: fixed.clone(),
            ..c.rope_freqs(swa, factors.as_deref())
        };
        let rope_freqs = freqs(false);
        let rope_swa_freqs = match &per_layer {
            Some(p) => Some(p.swa_rope.clone()),
            None => Some(freqs(true)).filter(|f| *f != rope_freqs),
        };
        let swa_table = rope_swa_freqs.is_some();
        let plan = Plan::new(c, layers.iter().map(|l| l.parts(swa_table)));
        Ok(Transformer {
            config,
            dtype,
            embedding,
            layers,
            output_norm,
            output,
            head_bias,
            rope_freqs,
            rope_swa_freqs,
            plan,
            hybrid,
            dims,
            per_layer,
            ple,
        })
    }

    /// Layer `i` of a Gemma 4 model (llama.cpp's `llama_model_gemma4::load_arch_tensors`):
    /// queries, and unless the layer reads an earlier layer's KV its keys and (without
    /// `attn_v`: the keys' projection) values; q/k norms, post-norms, the dense GELU
    /// feed-forward block of the layer's width (with a router `ffn_gate_inp`: beside the
    /// layer's experts, see [`MlpBeside`]), its per-layer embedding and output scale.
    /// A sharing layer's k/v projections and key norm, which llama.cpp loads when present and
    /// never uses, are read and dropped.
    #[allow(clippy::too_many_arguments)]
    fn load_gemma4_layer(
        src: &mut dyn TensorSource,
        c: &ModelConfig,
        p: &PerLayer,
        ple: Option<&PerLayerEmbedding>,
        i: usize,
        dtype: WeightDType,
        panels: &Placement,
    ) -> Result<Layer> {
        let d = p.layers[i];
        let (dim, q_dim, hd, ffn) = (c.dim, d.q_dim(), d.head_dim, d.ffn_dim);
        let name = |suffix: &str| format!("blk.{i}.{suffix}");
        let mat = |src: &mut dyn TensorSource, suffix: &str, shape: &[usize]| {
            build_matrix(src, &name(suffix), shape, dtype)
        };
        let vector = |src: &mut dyn TensorSource, suffix: &str, len: usize| -> Result<Vec<f32>> {
            let n = name(suffix);
            to_f32_vec(&n, &src.read_tensor(&n, &[len])?)
        };
        let owns = d.kv_layer == i;
        let q = mat(src, "attn_q.weight", &[q_dim, dim])?;
        let qkv = if owns {
            let kv_dim = d.kv_dim();
            let k = mat(src, "attn_k.weight", &[kv_dim, dim])?;
            match src.has_tensor(&name("attn_v.weight")) {
                true => Qkv::Split {
                    q,
                    k,
                    v: mat(src, "attn_v.weight", &[kv_dim, dim])?,
                },
                false => Qkv::QueryKey { q, k },
            }
        } else {
            let unused_kv = p.kv_heads[i] * hd;
            for t in ["attn_k.weight", "attn_v.weight"] {
                if src.has_tensor(&name(t)) {
                    mat(src, t, &[unused_kv, dim])?;
                }
            }
            if src.has_tensor(&name("attn_k_norm.weight")) {
                vector(src, "attn_k_norm.weight", hd)?;
            }
            Qkv::Query(q)
        };
        let q_norm = vector(src, "attn_q_norm.weight", hd)?;
        let k_norm = match owns {
            true => vector(src, "attn_k_norm.weight", hd)?,
            false => Vec::new(),
        };
        let wo = mat(src, "attn_output.weight", &[dim, q_dim])?;
        let gate_up = GateUp::Split {
            gate: mat(src, "ffn_gate.weight", &[ffn, dim])?,
            up: mat(src, "ffn_up.weight", &[ffn, dim])?,
        };
        let down = mat(src, "ffn_down.weight", &[dim, ffn])?;
        // llama.cpp: a layer with a router is a MoE layer, its dense MLP beside the experts.
        let ffn = match (src.has_tensor(&name("ffn_gate_inp.weight")), c.moe) {
            (false, _) => Ffn::Dense { gate_up, down },
            (true, None) => {
                return Err(ModelError::Metadata {
                    key: format!("{}.expert_count", c.architecture),
                    msg: format!(
                        "missing or at most 1, yet {} holds a router",
                        name("ffn_gate_inp.weight")
                    ),
                })
            }
            (true, Some(moe)) => {
                let mut m = load_moe(src, i, c, moe, dtype, panels)?;
                m.beside = Some(Box::new(MlpBeside {
                    gate_up,
                    down,
                    post_norm: vector(src, "post_ffw_norm_1.weight", dim)?,
                    experts_norm: vector(src, "pre_ffw_norm_2.weight", dim)?,
                    experts_post_norm: vector(src, "post_ffw_norm_2.weight", dim)?,
                    router_scale: vector(src, "ffn_gate_inp.scale", dim)?,
                }));
                Ffn::Moe(m)
            }
        };
        let out_scale = match src.has_tensor(&name("layer_output_scale.weight")) {
            true => Some(vector(src, "layer_output_scale.weight", 1)?[0]),
            false => None,
        };
        let ple = match ple {
            Some(e) => Some(e.load_layer(src, i, dim, dtype)?),
            None => None,
        };
        Ok(Layer {
            attn_norm: vector(src, "attn_norm.weight", dim)?,
            qkv,
            bias: None,
            qk_norm: Some((q_norm, k_norm)),
            wo,
            out_bias: None,
            sinks: None,
            post_attn_norm: Some(vector(src, "post_attention_norm.weight", dim)?),
            ffn_norm: vector(src, "ffn_norm.weight", dim)?,
            ffn,
            post_ffn_norm: Some(vector(src, "post_ffw_norm.weight", dim)?),
            swa: c.window(i).is_some(),
            delta: None,
            out_gate: false,
            v_norm: owns,
            kv_from: (!owns).then_some(d.kv_layer),
            ple,
            out_scale,
            norm_bias: None,
        })
    }

    /// Layers that store KV (the others read an earlier layer's): every layer but Gemma 4's
    /// sharing ones.
    pub fn kv_layers(&self) -> usize {
        self.per_layer
            .as_ref()
            .map_or(self.config.n_layer, |p| p.kv_layers)
    }

    /// The widest keys (or values) one layer stores per position: what the KV layout
    /// reserves for every layer (Gemma 4's sliding and full layers differ).
    pub fn kv_width(&self) -> usize {
        self.per_layer
            .as_ref()
            .map_or(self.config.kv_dim(), PerLayer::kv_width)
    }

    /// Floats per position of one sequence's RoPE table ([`Scratch`]'s `rope`, `rope_swa`).
    fn rope_stride(&self) -> usize {
        self.dims
            .iter()
            .map(|d| d.rope_dim)
            .max()
            .unwrap_or(0)
            .max(self.config.rope_dim)
    }

    /// Floats of recurrent state each sequence holds (0 without linear-attention layers).
    pub fn state_len(&self) -> usize {
        self.hybrid.as_ref().map_or(0, Hybrid::state_len)
    }

    /// The steps every device executes for this model (see [`Plan`]).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The linear-attention geometry of a hybrid model (`None` for the others).
    pub fn hybrid(&self) -> Option<&Hybrid> {
        self.hybrid.as_ref()
    }

    /// The RoPE angles of the full-attention layers.
    pub fn rope_freqs(&self) -> &RopeFreqs {
        &self.rope_freqs
    }

    pub fn dtype(&self) -> WeightDType {
        self.dtype
    }

    /// What one token costs in weight reads and multiply-adds (see [`Work`]).
    pub fn work(&self) -> Work {
        let mut w = Work::default();
        let mut add = |m: &QWeight, out: bool| {
            let macs = m.rows() * m.cols();
            if out {
                w.output_bytes += m.stored_bytes();
                w.output_macs += macs;
            } else {
                w.layer_bytes += m.stored_bytes();
                if m.is_quantized() {
                    w.layer_int_macs += macs;
                } else {
                    w.layer_float_macs += macs;
                }
            }
        };
        for l in &self.layers {
            match &l.qkv {
                Qkv::Split { q, k, v } => [q, k, v].into_iter().for_each(|m| add(m, false)),
                Qkv::Fused(m) => add(m, false),
                Qkv::QueryKey { q, k } => [q, k].into_iter().for_each(|m| add(m, false)),
                Qkv::Query(q) => add(q, false),
                Qkv::Latent(m) => m.matrices().into_iter().for_each(|m| add(m, false)),
            }
            add(&l.wo, false);
            if let Some(p) = &l.ple {
                p.matrices().into_iter().for_each(|m| add(m, false));
            }
            if let Some(d) = &l.delta {
                d.matrices().into_iter().for_each(|m| add(m, false));
            }
            match &l.ffn {
                Ffn::Dense { gate_up, down } => {
                    match gate_up {
                        GateUp::Split { gate, up } => {
                            [gate, up].into_iter().for_each(|m| add(m, false))
                        }
                        GateUp::Fused(m) => add(m, false),
                    }
                    add(down, false);
                }
                // The router, and the experts a token is routed to (each token reads
                // `used` of them; all experts are the same size).
                Ffn::Moe(moe) => {
                    add(&moe.router, false);
                    if let Some(e) = moe.experts.first() {
                        for _ in 0..moe.config.used {
                            [&e.gate, &e.up, &e.down]
                                .into_iter()
                                .for_each(|m| add(m, false));
                        }
                    }
                    // The shared expert, which every token reads.
                    if let Some(sh) = &moe.shared {
                        [&sh.gate, &sh.up, &sh.down]
                            .into_iter()
                            .chain(&sh.gate_inp)
                            .for_each(|m| add(m, false));
                    }
                    // Gemma 4's dense MLP beside the experts, which every token reads.
                    if let Some((gate_up, down)) = moe.mlp() {
                        match gate_up {
                            GateUp::Split { gate, up } => {
                                [gate, up].into_iter().for_each(|m| add(m, false))
                            }
                            GateUp::Fused(m) => add(m, false),
                        }
                        add(down, false);
                    }
                }
            }
        }
        if let Some(p) = &self.ple {
            // The projection of each row's embedding (its table is read a row per token).
            add(p.matrices()[1], false);
        }
        add(self.output.as_ref().unwrap_or(&self.embedding), true);
        w.kv_bytes_per_position = self.kv_layers() * 2 * self.kv_width() * 4;
        w.state_bytes_per_sequence = self.state_len() * 4;
        w
    }

    /// Bytes of weights held in this process's memory ([`QWeight::owned_bytes`]): not those
    /// read in place from a memory map (float weights in the model file, experts in panel
    /// files).
    pub fn owned_bytes(&self) -> usize {
        let mut total = self.embedding.owned_bytes();
        if let Some(p) = &self.ple {
            total += p
                .matrices()
                .into_iter()
                .map(QWeight::owned_bytes)
                .sum::<usize>();
        }
        total += self.output.as_ref().map_or(0, QWeight::owned_bytes);
        for l in &self.layers {
            total += l
                .matrices()
                .into_iter()
                .map(QWeight::owned_bytes)
                .sum::<usize>();
        }
        total
    }

    /// Whether the output projection reuses the token embedding.
    pub fn tied_embeddings(&self) -> bool {
        self.output.is_none()
    }

    /// Runs one packed step. Every token id must be below the vocabulary size, and no sequence
    /// may grow past the context length (the engine checks both). Returns the requested logits
    /// rows back to back (`vocab` values each), sequences in order.
    pub fn forward<'s, K: KvSeq>(
        &self,
        seqs: &mut [SeqStep<'_, K>],
        scratch: &'s mut Scratch,
    ) -> &'s [f32] {
        let c = &self.config;
        let dim = c.dim;
        let rd = self.rope_stride();
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        scratch.prepare(c, rows);
        if let Some(h) = &self.hybrid {
            scratch.prepare_hybrid(c, h, rows);
        }
        if self.per_layer.is_some() {
            scratch.prepare_per_layer(self, rows);
        }
        let s = scratch;

        // Row bookkeeping: sequence start row, first position; then grow each KV.
        s.seq_spans.clear();
        s.tokens.clear();
        let mut row = 0;
        for seq in seqs.iter_mut() {
            let start_pos = seq.kv.len();
            s.seq_spans.push((row, seq.tokens.len(), start_pos));
            seq.kv.grow(seq.tokens.len());
            for (i, &t) in seq.tokens.iter().enumerate() {
                let x = &mut s.x[(row + i) * dim..(row + i + 1) * dim];
                self.embedding.row_f32(t as usize, x);
                if let Some(scale) = c.embed_scale {
                    for v in x.iter_mut() {
                        *v *= scale;
                    }
                }
                self.rope_freqs
                    .cos_sin(start_pos + i, &mut s.rope[(row + i) * rd..][..rd]);
                s.tokens.push(t);
                if let Some(f) = &self.rope_swa_freqs {
                    f.cos_sin(start_pos + i, &mut s.rope_swa[(row + i) * rd..][..rd]);
                }
                if let Some(t) = &c.attn_temp {
                    s.temp[row + i] = t.factor(start_pos + i);
                }
            }
            row += seq.tokens.len();
        }

        for (l, layer) in self.layers.iter().enumerate() {
            for &step in self.plan.layer(l) {
                #[cfg(any(test, feature = "testkit"))]
                trace::record(trace::Event::Step(Place::Layer(l), step));
                self.layer_step(step, l, layer, seqs, rows, s);
            }
        }

        // The head: final norm and output projection, only for the rows whose logits are
        // wanted.
        let mut m = 0;
        for &step in self.plan.head() {
            #[cfg(any(test, feature = "testkit"))]
            trace::record(trace::Event::Step(Place::Head, step));
            match step {
                Step::Gather => {
                    for (seq, &(r0, n, _)) in seqs.iter().zip(&s.seq_spans) {
                        let wanted = match seq.logits {
                            Logits::None => r0..r0,
                            Logits::Last => r0 + n.saturating_sub(1)..r0 + n,
                            Logits::All => r0..r0 + n,
                        };
                        for r in wanted {
                            s.xb[m * dim..(m + 1) * dim]
                                .copy_from_slice(&s.x[r * dim..(r + 1) * dim]);
                            m += 1;
                        }
                    }
                }
                Step::FinalNorm => {
                    let normed = &mut s.attn[..m * dim];
                    rms_norm_rows(&s.xb[..m * dim], &self.output_norm, c.rms_eps, normed);
                }
                Step::Project(Matrix::Logits) => {
                    s.logits.resize(m * c.vocab_size, 0.0);
                    self.output.as_ref().unwrap_or(&self.embedding).matmul(
                        &s.attn[..m * dim],
                        m,
                        &mut s.logits,
                    );
                }
                Step::FinalNormBias | Step::LogitBias => {
                    let Some([norm_b, logit_b]) = &self.head_bias else {
                        unreachable!("plan: {step:?} without head biases")
                    };
                    match step {
                        Step::FinalNormBias => add_rows(&mut s.attn[..m * dim], norm_b),
                        _ => add_rows(&mut s.logits[..m * c.vocab_size], logit_b),
                    }
                }
                Step::Softcap => {
                    let cap = c.final_softcap.expect("plan: a softcap step has a cap");
                    for v in s.logits.iter_mut() {
                        *v = (*v / cap).tanh() * cap;
                    }
                }
                other => unreachable!("plan: {other:?} in the head"),
            }
        }
        &s.logits
    }

    /// Runs one step of layer `l` on the step's `rows` rows (see [`Step`] for the buffers).
    fn layer_step<K: KvSeq>(
        &self,
        step: Step,
        l: usize,
        layer: &Layer,
        seqs: &mut [SeqStep<'_, K>],
        rows: usize,
        s: &mut Scratch,
    ) {
        let c = &self.config;
        let d = self.dims[l];
        let (dim, q_dim, kv_dim, hd) = (c.dim, d.q_dim(), d.kv_dim(), d.head_dim);
        let rd = d.rope_dim;
        let missing =
            |what: &str| -> ! { unreachable!("plan: {step:?} on a layer without {what}") };
        match step {
            Step::Norm(block) => {
                let w = match block {
                    Block::Attn => &layer.attn_norm,
                    Block::Ffn => &layer.ffn_norm,
                };
                rms_norm_rows(&s.x, w, c.rms_eps, &mut s.xb[..rows * dim]);
            }
            Step::Project(Matrix::Qkv) => {
                let xb = &s.xb[..rows * dim];
                match &layer.qkv {
                    Qkv::Split {
                        q: wq,
                        k: wk,
                        v: wv,
                    } => {
                        // With an output gate the queries go to `fused` to be split.
                        let q = match layer.out_gate {
                            true => &mut s.fused[..rows * 2 * q_dim],
                            false => &mut s.q[..rows * q_dim],
                        };
                        let (k, v) = (&mut s.k[..rows * kv_dim], &mut s.v[..rows * kv_dim]);
                        QWeight::matmul_shared(&[wq, wk, wv], xb, rows, &mut [q, k, v]);
                    }
                    Qkv::Fused(w) => {
                        let width = q_dim + 2 * kv_dim;
                        w.matmul(xb, rows, &mut s.fused[..rows * width]);
                    }
                    Qkv::QueryKey { q: wq, k: wk } => {
                        let (q, k) = (&mut s.q[..rows * q_dim], &mut s.k[..rows * kv_dim]);
                        QWeight::matmul_shared(&[wq, wk], xb, rows, &mut [q, k]);
                    }
                    Qkv::Query(wq) => wq.matmul(xb, rows, &mut s.q[..rows * q_dim]),
                    Qkv::Latent(_) => unreachable!("plan: a latent layer projects its own"),
                }
            }
            Step::LatentProject | Step::Absorb | Step::Expand => {
                let Qkv::Latent(m) = &layer.qkv else {
                    missing("latent attention")
                };
                match step {
                    Step::LatentProject => {
                        m.project(&s.xb[..rows * dim], rows, c.rms_eps, &mut s.latent)
                    }
                    Step::Absorb => m.absorb(
                        rows,
                        c.rms_eps,
                        &mut s.latent,
                        &mut s.q[..rows * q_dim],
                        &mut s.k[..rows * kv_dim],
                        &mut s.v[..rows * kv_dim],
                    ),
                    _ => m.expand(&mut s.attn[..rows * q_dim], rows, &mut s.latent),
                }
            }
            Step::KeyAsValue => {
                s.v[..rows * kv_dim].copy_from_slice(&s.k[..rows * kv_dim]);
            }
            Step::VNorm => {
                for v in s.v[..rows * kv_dim].chunks_exact_mut(hd) {
                    let scale = rms_scale(v, c.rms_eps);
                    v.iter_mut().for_each(|x| *x *= scale);
                }
            }
            Step::AttendShared {
                window,
                layer: from,
            } => {
                let mut geo = self.geometry(l, window, None);
                geo.group = d.n_head / self.dims[from].n_kv_head;
                let attn = &mut s.attn[..rows * q_dim];
                self.attention(from, geo, seqs, &s.seq_spans, &s.q[..rows * q_dim], attn);
            }
            Step::PerLayerInputs | Step::PerLayerEmbed => {
                let Some(e) = &self.ple else {
                    missing("per-layer embeddings")
                };
                if step == Step::PerLayerInputs {
                    let x = &s.x[..rows * dim];
                    e.inputs(
                        &s.tokens,
                        x,
                        dim,
                        c.rms_eps,
                        &mut s.ple_proj,
                        &mut s.ple_inputs,
                    );
                } else {
                    let Some(w) = &layer.ple else {
                        missing("a per-layer embedding")
                    };
                    e.embed(
                        w,
                        l,
                        c.n_layer,
                        &s.ple_inputs,
                        &mut s.x,
                        rows,
                        c.rms_eps,
                        &mut s.ple_gate,
                        &mut s.ple_input,
                        &mut s.xb,
                    );
                }
            }
            Step::LayerScale => {
                let Some(scale) = layer.out_scale else {
                    missing("an output scale")
                };
                s.x[..rows * dim].iter_mut().for_each(|x| *x *= scale);
            }
            Step::Split(Matrix::Qkv) => {
                let width = q_dim + 2 * kv_dim;
                let (q, k, v) = (
                    &mut s.q[..rows * q_dim],
                    &mut s.k[..rows * kv_dim],
                    &mut s.v[..rows * kv_dim],
                );
                for (r, f) in s.fused[..rows * width].chunks_exact(width).enumerate() {
                    q[r * q_dim..(r + 1) * q_dim].copy_from_slice(&f[..q_dim]);
                    k[r * kv_dim..(r + 1) * kv_dim].copy_from_slice(&f[q_dim..q_dim + kv_dim]);
                    v[r * kv_dim..(r + 1) * kv_dim].copy_from_slice(&f[q_dim + kv_dim..]);
                }
            }
            Step::Bias => {
                let Some([bq, bk, bv]) = &layer.bias else {
                    missing("biases")
                };
                add_rows(&mut s.q[..rows * q_dim], bq);
                add_rows(&mut s.k[..rows * kv_dim], bk);
                add_rows(&mut s.v[..rows * kv_dim], bv);
            }
            Step::QkNorm => {
                let Some((nq, nk)) = &layer.qk_norm else {
                    missing("q/k norms")
                };
                rms_norm_in_place(&mut s.q[..rows * q_dim], nq, c.rms_eps);
                // A layer reading an earlier layer's KV has no keys of its own.
                if kv_dim > 0 {
                    rms_norm_in_place(&mut s.k[..rows * kv_dim], nk, c.rms_eps);
                }
            }
            Step::Rope(table) => {
                let rope = match table {
                    RopeTable::Swa => &s.rope_swa,
                    RopeTable::Full => &s.rope,
                };
                let (q, k) = (&mut s.q[..rows * q_dim], &mut s.k[..rows * kv_dim]);
                let stride = self.rope_stride();
                for r in 0..rows {
                    let cs = &rope[r * stride..][..rd];
                    for h in 0..d.n_head {
                        apply_rope(&mut q[r * q_dim + h * hd..][..hd], cs, rd, c.rope_neox);
                    }
                    for h in 0..d.n_kv_head {
                        apply_rope(&mut k[r * kv_dim + h * hd..][..hd], cs, rd, c.rope_neox);
                    }
                }
            }
            Step::QueryTemp => scale_rows(&mut s.q[..rows * q_dim], &s.temp[..rows], q_dim),
            Step::KvWrite => {
                let (k, v) = (&s.k[..rows * kv_dim], &s.v[..rows * kv_dim]);
                for (seq, &(r0, n, p0)) in seqs.iter_mut().zip(&s.seq_spans) {
                    for i in 0..n {
                        let r = r0 + i;
                        seq.kv.write(
                            l,
                            p0 + i,
                            &k[r * kv_dim..(r + 1) * kv_dim],
                            &v[r * kv_dim..(r + 1) * kv_dim],
                        );
                    }
                }
            }
            Step::Attention { window, sinks } => {
                let sinks = match (sinks, &layer.sinks) {
                    (false, _) => None,
                    (true, Some(v)) => Some(&v[..]),
                    (true, None) => missing("attention sinks"),
                };
                let geo = self.geometry(l, window, sinks);
                let attn = &mut s.attn[..rows * q_dim];
                self.attention(l, geo, seqs, &s.seq_spans, &s.q[..rows * q_dim], attn);
            }
            Step::NormBias(block) => {
                let Some([attn_b, ffn_b]) = &layer.norm_bias else {
                    missing("norm biases")
                };
                let b = match block {
                    Block::Attn => attn_b,
                    Block::Ffn => ffn_b,
                };
                add_rows(&mut s.xb[..rows * dim], b);
            }
            Step::OutBias => {
                let Some(b) = &layer.out_bias else {
                    missing("an output bias")
                };
                add_rows(&mut s.xb[..rows * dim], b);
            }
            Step::Project(Matrix::Out) => {
                // Attention's q_dim, or a linear layer's value width.
                let k = layer.wo.cols();
                layer
                    .wo
                    .matmul(&s.attn[..rows * k], rows, &mut s.xb[..rows * dim]);
            }
            Step::SplitGate => split_gate(
                &s.fused[..rows * 2 * q_dim],
                hd,
                &mut s.q[..rows * q_dim],
                &mut s.delta.gate[..rows * q_dim],
            ),
            Step::OutGate => out_gate(&mut s.attn[..rows * q_dim], &s.delta.gate[..rows * q_dim]),
            Step::DeltaProject | Step::Conv | Step::DeltaRule | Step::GatedNorm => {
                let (Some(d), Some(h)) = (&layer.delta, &self.hybrid) else {
                    missing("linear attention")
                };
                let Qkv::Fused(qkv) = &layer.qkv else {
                    missing("a fused q|k|v projection")
                };
                let vd = h.value_dim();
                match step {
                    Step::DeltaProject => d.project(qkv, &s.xb[..rows * dim], rows, &mut s.delta),
                    Step::Conv => d.conv(h, l, seqs, &s.seq_spans, &mut s.delta),
                    Step::DeltaRule => d.rule(
                        h,
                        l,
                        c.rms_eps,
                        seqs,
                        &s.seq_spans,
                        &mut s.delta,
                        &mut s.attn[..rows * vd],
                    ),
                    _ => d.gated_norm(h, c.rms_eps, rows, &mut s.delta, &mut s.attn[..rows * vd]),
                }
            }
            Step::PostNorm(block) => {
                let w = match block {
                    Block::Attn => &layer.post_attn_norm,
                    Block::Ffn => &layer.post_ffn_norm,
                };
                let Some(w) = w else { missing("post-norms") };
                rms_norm_in_place(&mut s.xb[..rows * dim], w, c.rms_eps);
            }
            Step::Residual => add_in_place(&mut s.x, &s.xb[..rows * dim]),
            Step::Project(Matrix::GateUp) => {
                let xb = &s.xb[..rows * dim];
                let Some((gate_up, _)) = layer.mlp() else {
                    missing("a dense feed-forward block")
                };
                match gate_up {
                    GateUp::Split { gate: wg, up: wu } => {
                        let n = rows * d.ffn_dim;
                        let (gate, up) = (&mut s.gate[..n], &mut s.up[..n]);
                        QWeight::matmul_shared(&[wg, wu], xb, rows, &mut [gate, up]);
                    }
                    GateUp::Fused(w) => {
                        w.matmul(xb, rows, &mut s.fused[..rows * 2 * c.ffn_dim]);
                    }
                }
            }
            Step::Split(Matrix::GateUp) => {
                let ffn = c.ffn_dim;
                let (gate, up) = (&mut s.gate[..], &mut s.up[..]);
                for (r, f) in s.fused[..rows * 2 * ffn].chunks_exact(2 * ffn).enumerate() {
                    gate[r * ffn..(r + 1) * ffn].copy_from_slice(&f[..ffn]);
                    up[r * ffn..(r + 1) * ffn].copy_from_slice(&f[ffn..]);
                }
            }
            Step::Gated(act) => gated(
                act,
                &mut s.gate[..rows * d.ffn_dim],
                &s.up[..rows * d.ffn_dim],
            ),
            Step::Project(Matrix::Down) => {
                let Some((_, down)) = layer.mlp() else {
                    missing("a dense feed-forward block")
                };
                down.matmul(&s.gate[..rows * d.ffn_dim], rows, &mut s.xb[..rows * dim]);
            }
            Step::Route(_) | Step::Experts(_) | Step::Combine => {
                let Ffn::Moe(moe) = &layer.ffn else {
                    missing("experts")
                };
                match step {
                    Step::Route(_) => moe.route(&s.xb[..rows * dim], rows, &mut s.moe),
                    Step::Experts(act) => moe.experts(act, &s.xb[..rows * dim], rows, &mut s.moe),
                    _ => moe.combine(&mut s.xb[..rows * dim], rows, &s.moe),
                }
            }
            Step::SharedExpert(_) | Step::AddShared => {
                let Ffn::Moe(moe) = &layer.ffn else {
                    missing("experts")
                };
                match step {
                    Step::SharedExpert(act) => {
                        moe.shared_expert(act, &s.xb[..rows * dim], rows, &mut s.moe)
                    }
                    _ => moe.add_shared(&mut s.xb[..rows * dim], rows, &s.moe),
                }
            }
            Step::SetAside | Step::RouterNorm | Step::ExpertNorm | Step::ExpertPostNorm => {
                let Ffn::Moe(moe) = &layer.ffn else {
                    missing("experts")
                };
                let (xb, eps) = (&mut s.xb[..rows * dim], c.rms_eps);
                match step {
                    Step::SetAside => moe.set_aside(xb, rows, eps, &mut s.moe),
                    Step::RouterNorm => moe.router_norm(&s.x[..rows * dim], xb, eps),
                    Step::ExpertNorm => moe.expert_norm(&s.x[..rows * dim], xb, eps),
                    _ => moe.expert_post_norm(xb, eps),
                }
            }
            Step::Project(Matrix::Logits)
            | Step::Split(_)
            | Step::Gather
            | Step::FinalNorm
            | Step::FinalNormBias
            | Step::LogitBias
            | Step::Softcap => unreachable!("plan: {step:?} in a layer"),
        }
    }

    /// The attention geometry of layer `l` with this window and these sinks.
    fn geometry<'a>(
        &self,
        l: usize,
        window: Option<usize>,
        sinks: Option<&'a [f32]>,
    ) -> Geometry<'a> {
        let c = &self.config;
        let d = &self.dims[l];
        Geometry {
            dim: d.q_dim(),
            hd: d.head_dim,
            group: d.n_head / d.n_kv_head.max(1),
            scale: c.attn_scale,
            softcap: c.attn_softcap,
            window,
            sinks,
        }
    }

    /// Causal attention of each sequence's new rows over its own KV, written into `out`
    /// (`[row][q_dim]`). Work is split into tasks of (sequence, KV head, block of rows), run in
    /// parallel, each handling the query heads sharing that KV head so that every key and value
    /// is read once per row; when that gives too few tasks for the threads (decoding a few
    /// sequences) each query head is a task of its own. Every row and head is computed by the
    /// same operations whatever the split, so the split never changes a bit.
    fn attention<K: KvSeq>(
        &self,
        layer: usize,
        geo: Geometry<'_>,
        seqs: &[SeqStep<'_, K>],
        spans: &[(usize, usize, usize)],
        q: &[f32],
        out: &mut [f32],
    ) {
        let n_kv = geo.dim / geo.hd / geo.group;
        let tasks = attention_tasks(spans, n_kv, geo.group, rayon::current_num_threads());
        let results: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|t| attend(seqs[t.seq].kv, layer, q, spans[t.seq], t, geo))
            .collect();
        for (t, res) in tasks.iter().zip(&results) {
            let (r0, _, _) = spans[t.seq];
            let w = t.heads.1 * geo.hd;
            let col = (t.g * geo.group + t.heads.0) * geo.hd;
            for (i, chunk) in res.chunks_exact(w).enumerate() {
                out[(r0 + t.rows.0 + i) * geo.dim + col..][..w].copy_from_slice(chunk);
            }
        }
    }
}

/// `gate[i] = act(gate[i]) · up[i]`, on rayon's threads in chunks when there are many (a
/// prefill's rows); element by element, so the same values whatever the split.
pub(super) fn gated(act: Activation, gate: &mut [f32], up: &[f32]) {
    let f = |g: &mut [f32], u: &[f32]| match act {
        Activation::Silu => {
            // `g / (1 + e^-g) · u`, the exponentials a vector at a time ([`exp_f32`](super::expf::exp_f32)'s bits:
            // glibc's `expf` on x86-64 with FMA, and the same on every other machine).
            let mut e = [0f32; 256];
            for (g, u) in g.chunks_mut(e.len()).zip(u.chunks(e.len())) {
                let e = &mut e[..g.len()];
                for (e, g) in e.iter_mut().zip(g.iter()) {
                    *e = -*g;
                }
                exp_shifted_in_place(e, 0.0);
                for ((g, u), e) in g.iter_mut().zip(u).zip(e.iter()) {
                    *g = *g / (1.0 + e) * u;
                }
            }
        }
        Activation::GeluTanh => {
            for (g, u) in g.iter_mut().zip(u) {
                *g = gelu_tanh(*g) * u;
            }
        }
        Activation::SwigluOai => {
            // ggml's swiglu_oai: `x / (1 + expf(alpha · -x)) · (y + 1)`, the exponentials a
            // vector at a time (glibc's `expf` bits, as `exp_f32`).
            const ALPHA: f32 = 1.702;
            const LIMIT: f32 = 7.0;
            let mut e = [0f32; 256];
            for (g, u) in g.chunks_mut(e.len()).zip(u.chunks(e.len())) {
                let e = &mut e[..g.len()];
                for (e, g) in e.iter_mut().zip(g.iter_mut()) {
                    *g = g.min(LIMIT);
                    *e = ALPHA * -*g;
                }
                exp_shifted_in_place(e, 0.0);
                for ((g, u), e) in g.iter_mut().zip(u).zip(e.iter()) {
                    *g = *g / (1.0 + e) * (u.clamp(-LIMIT, LIMIT) + 1.0);
                }
            }
        }
        Activation::GeluTanhF16 => {
            let table = gelu_f16_table();
            for (g, u) in g.iter_mut().zip(u) {
                *g = if *g <= -10.0 {
                    0.0
                } else if *g >= 10.0 {
                    *g * u
                } else {
                    table[usize::from(half::f16::from_f32(*g).to_bits())] * u
                };
            }
        }
    };
    const CHUNK: usize = 1 << 14;
    if gate.len() >= 2 * CHUNK {
        gate.par_chunks_mut(CHUNK)
            .zip(up.par_chunks(CHUNK))
            .for_each(|(g, u)| f(g, u));
    } else {
        f(gate, up);
    }
}

/// `gelu(x)` with the tanh approximation (PyTorch's `gelu(approximate="tanh")`).
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// `gelu_tanh` of every f16 value (by its bits), rounded to f16, as llama.cpp's CPU backend
/// tabulates it at start-up: its `ggml_gelu_f32` expression in f32, with the one fused
/// multiply-add its x86 build compiles it to (`1 + a·x·x`), libm's `tanhf`.
fn gelu_f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        const COEF_A: f32 = 0.044_715;
        (0..=u16::MAX)
            .map(|bits| {
                let x = half::f16::from_bits(bits).to_f32();
                let inner = (COEF_A * x).mul_add(x, 1.0);
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh());
                half::f16::from_f32(y).to_f32()
            })
            .collect()
    })
}

/// Adds `b` to every `b.len()`-wide row of `x`.
pub(super) fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        add_in_place(row, b);
    }
}

/// Multiplies each `width`-wide row of `x` by its factor in `s` (one per row): the attention
/// temperature of the queries, an f32 product as ggml's broadcast `ggml_mul`.
pub(super) fn scale_rows(x: &mut [f32], s: &[f32], width: usize) {
    for (row, &f) in x.chunks_exact_mut(width).zip(s) {
        row.iter_mut().for_each(|v| *v *= f);
    }
}

/// RMS norm of every `w.len()`-wide slice of `x` in place (per head for q/k norms).
pub(super) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let scale = rms_scale(xr, eps);
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// Reusable buffers for [`Transformer::forward`], grown to the largest step seen.
#[derive(Debug, Default)]
pub struct Scratch {
    x: Vec<f32>,
    xb: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Attention output (`q_dim` wide).
    attn: Vec<f32>,
    /// Output of a fused projection before it is split.
    fused: Vec<f32>,
    rope: Vec<f32>,
    rope_swa: Vec<f32>,
    /// Each row's attention temperature factor (models with [`AttnTemp`](super::arch::AttnTemp)).
    temp: Vec<f32>,
    logits: Vec<f32>,
    seq_spans: Vec<(usize, usize, usize)>,
    /// The Mixture-of-Experts steps' buffers.
    moe: MoeScratch,
    /// The linear-attention steps' buffers.
    delta: DeltaScratch,
    /// The latent-attention steps' buffers.
    latent: LatentScratch,
    /// The step's token ids, rows in order.
    tokens: Vec<u32>,
    /// Per-layer embeddings (Gemma 4): every layer's input of each row, the projection
    /// they are made from, and one layer's gate and input.
    ple_inputs: Vec<f32>,
    ple_proj: Vec<f32>,
    ple_gate: Vec<f32>,
    ple_input: Vec<f32>,
}

impl Scratch {
    /// The logits buffer, for a forward pass that runs elsewhere and copies its logits here.
    #[cfg(feature = "cuda")]
    pub(super) fn logits_mut(&mut self) -> &mut Vec<f32> {
        &mut self.logits
    }

    fn prepare(&mut self, c: &ModelConfig, rows: usize) {
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        let wide = c.dim.max(c.q_dim());
        fit(&mut self.x, rows * c.dim);
        fit(&mut self.xb, rows * c.dim);
        fit(&mut self.q, rows * c.q_dim());
        fit(&mut self.k, rows * c.kv_dim());
        fit(&mut self.v, rows * c.kv_dim());
        fit(&mut self.gate, rows * c.ffn_dim);
        fit(&mut self.up, rows * c.ffn_dim);
        fit(&mut self.attn, rows * wide);
        if c.arch.fused() {
            let w = (c.q_dim() + 2 * c.kv_dim()).max(2 * c.ffn_dim);
            fit(&mut self.fused, rows * w);
        }
        fit(&mut self.rope, rows * c.rope_dim);
        fit(&mut self.rope_swa, rows * c.rope_dim);
        if c.attn_temp.is_some() {
            fit(&mut self.temp, rows);
        }
    }

    /// The buffers a model with per-layer geometry (Gemma 4) needs beyond
    /// [`Scratch::prepare`]'s: its widest layer's, the RoPE tables' stride, per-layer
    /// embeddings'.
    fn prepare_per_layer(&mut self, m: &Transformer, rows: usize) {
        let c = &m.config;
        let max = |f: fn(&LayerDims) -> usize| m.dims.iter().map(f).max().unwrap_or(0);
        let (q, kv, ffn) = (
            max(LayerDims::q_dim),
            max(LayerDims::kv_dim),
            max(|d| d.ffn_dim),
        );
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        fit(&mut self.q, rows * q);
        fit(&mut self.k, rows * kv);
        fit(&mut self.v, rows * kv);
        fit(&mut self.gate, rows * ffn);
        fit(&mut self.up, rows * ffn);
        fit(&mut self.attn, rows * c.dim.max(q));
        fit(&mut self.rope, rows * m.rope_stride());
        fit(&mut self.rope_swa, rows * m.rope_stride());
        let ple = m.per_layer.as_ref().map_or(0, |p| p.ple_dim);
        fit(&mut self.ple_inputs, rows * ple * c.n_layer);
        fit(&mut self.ple_proj, rows * ple * c.n_layer);
        fit(&mut self.ple_gate, rows * ple);
        fit(&mut self.ple_input, rows * ple);
    }

    /// The buffers a hybrid model's steps need beyond [`Scratch::prepare`]'s.
    fn prepare_hybrid(&mut self, c: &ModelConfig, h: &Hybrid, rows: usize) {
        self.delta.prepare(h, c.q_dim(), rows);
        let wide = c.dim.max(c.q_dim()).max(h.value_dim());
        self.attn.resize(rows * wide, 0.0);
        self.fused.resize(rows * 2 * c.q_dim(), 0.0);
    }
}

/// `1 / sqrt(mean(x²) + eps)` as ggml's `rms_norm` computes it: each square in f32, summed
/// in f64 in order, the mean rounded to f32, then `1 / sqrtf(mean + eps)` in f32.
pub(super) fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// RMS norm of each row (as ggml computes it: [`rms_scale`]), times the weight.
pub(super) fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let scale = rms_scale(xr, eps);
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// Rotates the first `rd` dimensions of one head: adjacent pairs `(v[2i], v[2i+1])`
/// (llama.cpp's NORM mode) or halves `(v[i], v[i + rd/2])` (NEOX mode).
pub(super) fn apply_rope(v: &mut [f32], cs: &[f32], rd: usize, neox: bool) {
    if neox {
        let half = rd / 2;
        for (i, c) in cs.chunks_exact(2).enumerate() {
            let (x0, x1) = (v[i], v[i + half]);
            v[i] = x0 * c[0] - x1 * c[1];
            v[i + half] = x0 * c[1] + x1 * c[0];
        }
    } else {
        for (pair, c) in v[..rd].chunks_exact_mut(2).zip(cs.chunks_exact(2)) {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * c[0] - x1 * c[1];
            pair[1] = x0 * c[1] + x1 * c[0];
        }
    }
}

pub(super) fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::lowering::{covered, target_of, ActBlocks, Lowering, Target};
    use crate::model::plan::trace::{self, Event};

    /// One sequence's keys and values, every layer.
    struct VecKv {
        kv_dim: usize,
        keys: Vec<Vec<f32>>,
        values: Vec<Vec<f32>>,
        len: usize,
    }

    impl KvSeq for VecKv {
        fn len(&self) -> usize {
            self.len
        }
        fn grow(&mut self, n: usize) {
            self.len += n;
            for l in 0..self.keys.len() {
                self.keys[l].resize(self.len * self.kv_dim, 0.0);
                self.values[l].resize(self.len * self.kv_dim, 0.0);
            }
        }
        fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
            let d = self.kv_dim;
            self.keys[layer][pos * d..(pos + 1) * d].copy_from_slice(key);
            self.values[layer][pos * d..(pos + 1) * d].copy_from_slice(value);
        }
        fn key(&self, layer: usize, pos: usize) -> &[f32] {
            &self.keys[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
        }
        fn value(&self, layer: usize, pos: usize) -> &[f32] {
            &self.values[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
        }
    }

    const ARCHS: [&str; 7] = [
        "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
    ];

    fn tiny(arch: &str) -> Transformer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny")
            .join(arch);
        let mut ck = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{arch}: {e}"));
        Transformer::from_checkpoint(&mut ck, WeightDType::F32)
            .unwrap_or_else(|e| panic!("{arch}: {e}"))
    }

    /// The features each architecture's tiny model shows in its plan (what the test below
    /// would not notice if the plan forgot one on both devices).
    fn expected_features(arch: &str) -> (bool, bool, bool, bool, bool) {
        // (split, bias, qk norm, post-norms, softcap)
        match arch {
            "llama" | "mistral" => (false, false, false, false, false),
            "qwen2" => (false, true, false, false, false),
            "qwen3" => (false, false, true, false, false),
            "gemma2" => (false, false, false, true, true),
            "gemma3" => (false, false, true, true, false),
            "phi3" => (true, false, false, false, false),
            _ => unreachable!(),
        }
    }

    /// Every architecture's tiny model: the CPU executes exactly its plan's steps, layer by
    /// layer then the head, in a prefill and a decode step; its plan shows the architecture's
    /// features; and the GPU's lowering of the same plan (integer and legacy matmuls, fused
    /// or not, float matrices as the model holds them or every matrix quantized) covers
    /// exactly the plan's steps in order.
    #[test]
    fn every_tiny_model_runs_its_plan_on_the_cpu_and_the_gpu_lowering_covers_it() {
        for arch in ARCHS {
            let model = tiny(arch);
            let c = model.config().clone();
            let plan = model.plan();
            let has = |s: Step| (0..plan.n_layers()).any(|l| plan.layer(l).contains(&s));
            let features = (
                has(Step::Split(Matrix::Qkv)),
                has(Step::Bias),
                has(Step::QkNorm),
                has(Step::PostNorm(Block::Ffn)),
                plan.head().contains(&Step::Softcap),
            );
            assert_eq!(features, expected_features(arch), "{arch}");
            if c.sliding_window.is_some() && model.rope_swa_freqs.is_some() {
                assert!(
                    has(Step::Rope(RopeTable::Swa)),
                    "{arch}: a sliding-window RoPE table"
                );
            }
            let want: Vec<Event> = plan
                .places()
                .flat_map(|(p, steps)| steps.iter().map(move |&s| Event::Step(p, s)))
                .collect();
            let mut kv = VecKv {
                kv_dim: c.kv_dim(),
                keys: vec![Vec::new(); c.n_layer],
                values: vec![Vec::new(); c.n_layer],
                len: 0,
            };
            let mut scratch = Scratch::default();
            for (tokens, logits) in [
                (vec![1u32, 5, 9, 2, 7], Logits::Last),
                (vec![3], Logits::All),
            ] {
                trace::start();
                let out = model.forward(
                    &mut [SeqStep {
                        tokens: &tokens,
                        kv: &mut kv,
                        logits,
                    }],
                    &mut scratch,
                );
                assert_eq!(out.len(), c.vocab_size, "{arch}");
                assert_eq!(trace::take(), want, "{arch}: the CPU's steps");
            }

            let quantized = |t: Target| Target {
                layers: t
                    .layers
                    .into_iter()
                    .map(|mut m| {
                        let k = Some(ActBlocks::Q8K);
                        m.qkv.iter_mut().for_each(|a| *a = k);
                        m.gate_up.iter_mut().for_each(|a| *a = k);
                        (m.out, m.down) = (Some(ActBlocks::Q8_0), Some(ActBlocks::Q8_1));
                        m
                    })
                    .collect(),
                logits: Some(ActBlocks::Q8K),
                ..t
            };
            for integer in [true, false] {
                for fuse in [true, false] {
                    let t = target_of(&model, integer, fuse);
                    for t in [t.clone(), quantized(t)] {
                        let low = Lowering::new(plan, &t);
                        for (place, steps) in plan.places() {
                            let got = covered(steps, low.launches(place))
                                .unwrap_or_else(|e| panic!("{arch} {place:?}: {e}"));
                            assert_eq!(got.into_iter().copied().collect::<Vec<_>>(), steps);
                        }
                    }
                }
            }
        }
    }
}
