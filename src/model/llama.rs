//! The one forward pass over packed rows, for every supported architecture (llama, mistral,
//! qwen2, qwen3, gemma2, gemma3, phi3; llama.cpp's `src/models/<arch>.cpp` are the reference
//! implementations). What differs between them is data in [`LlamaConfig`] and optional
//! weights (biases, q/k norms, post-norms, fused projections), never a second copy of the
//! pass. Weights come from a GGUF file or a Hugging Face checkpoint through [`TensorSource`].
//!
//! One forward step takes several sequences, each contributing some new tokens (a prefill chunk
//! or one decode token) at its own positions, attending over its own KV state only. There is no
//! padding: rows are packed back to back. Every row's arithmetic is independent of the batch it
//! is in (row-independent matmuls, per-row norms, per-row attention with a fixed reduction
//! order), so a token's logits do not depend on batch size, neighbours or thread count. The KV
//! state itself belongs to the caller (the engine) behind the [`KvSeq`] trait; this module owns
//! only immutable weights and reusable scratch buffers.

use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use rayon::prelude::*;

use super::arch::{Activation, LlamaConfig, RopeFreqs, TensorSource};
use super::error::{ModelError, Result};
use super::expf::exp_shifted_in_place;
use super::gguf::GgufFile;
use super::quant::QWeight;

/// How matrix weights are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightDType {
    /// As stored (quantized matrices stay quantized); the default.
    #[default]
    Native,
    /// Everything dequantized to f32 (the accuracy reference mode).
    F32,
}

/// The KV state of one sequence as the forward pass sees it: `len` positions already stored,
/// room made for more with [`KvSeq::grow`]. Keys and values are `kv_dim` wide per layer and
/// position.
pub trait KvSeq: Sync {
    /// Positions stored so far.
    fn len(&self) -> usize;
    /// Whether nothing is stored yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Extends the sequence by `n` positions, to be filled by [`KvSeq::write`].
    fn grow(&mut self, n: usize);
    /// Stores one position's key and value for one layer.
    fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]);
    /// The key stored at `pos` for `layer` (`kv_dim` values).
    fn key(&self, layer: usize, pos: usize) -> &[f32];
    /// The value stored at `pos` for `layer` (`kv_dim` values).
    fn value(&self, layer: usize, pos: usize) -> &[f32];
    /// For KV kept in a device's memory: appends the pool slots of the blocks holding this
    /// sequence's positions, in order. Host KV has no slots and appends nothing (a device
    /// forward pass refuses a sequence whose slots do not cover its positions).
    fn device_blocks(&self, _out: &mut Vec<u32>) {}
}

/// Which logits a sequence wants back from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    /// Only for its last new token (sampling the next one).
    Last,
    /// For every new token (teacher forcing, scoring).
    All,
}

/// One sequence's share of a forward step.
pub struct SeqStep<'a, K: KvSeq> {
    pub tokens: &'a [u32],
    pub kv: &'a mut K,
    pub logits: Logits,
}

/// Whether the quantized kernels handle a stored type natively.
fn has_native_kernel(dtype: GgmlDType) -> bool {
    super::quant::has_kernel(dtype)
}

/// Builds a weight matrix: as stored (`Native`, quantized kernels, float types read in place
/// from the file's memory map) or dequantized (`F32`). A stored type without a native kernel
/// is an error in `Native` mode rather than a silent change of numerics.
fn build_matrix(
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

/// A small tensor (a norm weight, RoPE factors) as f32 values.
fn to_f32_vec(name: &str, q: &QTensor) -> Result<Vec<f32>> {
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
    Split { q: QWeight, k: QWeight, v: QWeight },
    Fused(QWeight),
}

/// Gate and up projections: separate, or one fused matrix (Phi-3), gate rows first.
pub(super) enum GateUp {
    Split { gate: QWeight, up: QWeight },
    Fused(QWeight),
}

pub(super) struct Layer {
    pub(super) attn_norm: Vec<f32>,
    pub(super) qkv: Qkv,
    /// q/k/v biases (Qwen2).
    pub(super) bias: Option<[Vec<f32>; 3]>,
    /// Per-head RMS norms of queries and keys before RoPE (Qwen3, Gemma 3).
    pub(super) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub(super) wo: QWeight,
    /// Norm of the attention output before the residual add (Gemma).
    pub(super) post_attn_norm: Option<Vec<f32>>,
    pub(super) ffn_norm: Vec<f32>,
    pub(super) gate_up: GateUp,
    pub(super) w_down: QWeight,
    /// Norm of the feed-forward output before the residual add (Gemma).
    pub(super) post_ffn_norm: Option<Vec<f32>>,
    /// Sliding-window layer (its own RoPE frequencies and attention window).
    pub(super) swa: bool,
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
}

/// A loaded model of one of the supported architectures: configuration and immutable
/// weights. The name is historical: every architecture runs through this one forward pass,
/// parameterised by its [`LlamaConfig`].
pub struct Llama {
    pub(super) config: LlamaConfig,
    pub(super) dtype: WeightDType,
    /// `vocab × dim`; rows are dequantized on lookup.
    pub(super) embedding: QWeight,
    pub(super) layers: Vec<Layer>,
    pub(super) output_norm: Vec<f32>,
    /// `None` when tied to the embedding.
    pub(super) output: Option<QWeight>,
    /// The RoPE angles of full-attention layers (Llama 3 frequency factors and linear scaling
    /// applied).
    pub(super) rope_freqs: RopeFreqs,
    /// The same for sliding-window layers, when they differ.
    pub(super) rope_swa_freqs: Option<RopeFreqs>,
}

impl Llama {
    /// Loads a GGUF file.
    pub fn from_gguf_path(path: &Path, dtype: WeightDType) -> Result<Llama> {
        let mut file = GgufFile::open(path)?;
        Llama::from_gguf(&mut file, dtype)
    }

    /// Builds the model from an open GGUF file.
    pub fn from_gguf(file: &mut GgufFile, dtype: WeightDType) -> Result<Llama> {
        let config = LlamaConfig::from_gguf(file.content())?;
        Llama::from_source(config, file, dtype)
    }

    /// Builds the model from tensors under GGUF names (a GGUF file or a checkpoint).
    pub fn from_source(
        config: LlamaConfig,
        src: &mut dyn TensorSource,
        dtype: WeightDType,
    ) -> Result<Llama> {
        let c = &config;
        let (dim, q_dim, kv_dim, ffn, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim, c.head_dim);
        let embedding = build_matrix(src, "token_embd.weight", &[c.vocab_size, dim], dtype)?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let name = |suffix: &str| format!("blk.{i}.{suffix}");
            let mut mat = |suffix: &str, shape: &[usize]| -> Result<QWeight> {
                build_matrix(src, &name(suffix), shape, dtype)
            };
            let qkv = if c.arch.fused() {
                Qkv::Fused(mat("attn_qkv.weight", &[q_dim + 2 * kv_dim, dim])?)
            } else {
                Qkv::Split {
                    q: mat("attn_q.weight", &[q_dim, dim])?,
                    k: mat("attn_k.weight", &[kv_dim, dim])?,
                    v: mat("attn_v.weight", &[kv_dim, dim])?,
                }
            };
            let wo = mat("attn_output.weight", &[dim, q_dim])?;
            let gate_up = if c.arch.fused() {
                GateUp::Fused(mat("ffn_up.weight", &[2 * ffn, dim])?)
            } else {
                GateUp::Split {
                    gate: mat("ffn_gate.weight", &[ffn, dim])?,
                    up: mat("ffn_up.weight", &[ffn, dim])?,
                }
            };
            let w_down = mat("ffn_down.weight", &[dim, ffn])?;
            let has_bias = src.has_tensor(&name("attn_q.bias"));
            let has_qk_norm = src.has_tensor(&name("attn_q_norm.weight"));
            let mut vector = |suffix: &str, len: usize| -> Result<Vec<f32>> {
                let n = name(suffix);
                to_f32_vec(&n, &src.read_tensor(&n, &[len])?)
            };
            let attn_norm = vector("attn_norm.weight", dim)?;
            let ffn_norm = vector("ffn_norm.weight", dim)?;
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
            let gemma = c.arch.norm_plus_one();
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
            layers.push(Layer {
                attn_norm,
                qkv,
                bias,
                qk_norm,
                wo,
                post_attn_norm,
                ffn_norm,
                gate_up,
                w_down,
                post_ffn_norm,
                swa: c.window(i).is_some(),
            });
        }
        let output_norm = to_f32_vec(
            "output_norm.weight",
            &src.read_tensor("output_norm.weight", &[dim])?,
        )?;
        // Tied embeddings exactly when there is no `output.weight`.
        let output = if src.has_tensor("output.weight") {
            Some(build_matrix(
                src,
                "output.weight",
                &[c.vocab_size, dim],
                dtype,
            )?)
        } else {
            None
        };
        let factors = src.rope_factors(c)?;
        let rope_freqs = c.rope_freqs(false, factors.as_deref());
        let rope_swa_freqs =
            Some(c.rope_freqs(true, factors.as_deref())).filter(|f| *f != rope_freqs);
        Ok(Llama {
            config,
            dtype,
            embedding,
            layers,
            output_norm,
            output,
            rope_freqs,
            rope_swa_freqs,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
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
            }
            add(&l.wo, false);
            match &l.gate_up {
                GateUp::Split { gate, up } => [gate, up].into_iter().for_each(|m| add(m, false)),
                GateUp::Fused(m) => add(m, false),
            }
            add(&l.w_down, false);
        }
        add(self.output.as_ref().unwrap_or(&self.embedding), true);
        w.kv_bytes_per_position = self.config.n_layer * 2 * self.config.kv_dim() * 4;
        w
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
        let (dim, q_dim, kv_dim, hd) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim);
        let rd = c.rope_dim;
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        scratch.prepare(c, rows);
        let s = scratch;

        // Row bookkeeping: sequence start row, first position; then grow each KV.
        s.seq_spans.clear();
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
                if let Some(f) = &self.rope_swa_freqs {
                    f.cos_sin(start_pos + i, &mut s.rope_swa[(row + i) * rd..][..rd]);
                }
            }
            row += seq.tokens.len();
        }

        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm_rows(&s.x, &layer.attn_norm, c.rms_eps, &mut s.xb[..rows * dim]);
            let xb = &s.xb[..rows * dim];
            let (q, k, v) = (
                &mut s.q[..rows * q_dim],
                &mut s.k[..rows * kv_dim],
                &mut s.v[..rows * kv_dim],
            );
            match &layer.qkv {
                Qkv::Split {
                    q: wq,
                    k: wk,
                    v: wv,
                } => {
                    QWeight::matmul_shared(&[wq, wk, wv], xb, rows, &mut [q, k, v]);
                }
                Qkv::Fused(w) => {
                    let width = q_dim + 2 * kv_dim;
                    let fused = &mut s.fused[..rows * width];
                    w.matmul(xb, rows, fused);
                    for (r, f) in fused.chunks_exact(width).enumerate() {
                        q[r * q_dim..(r + 1) * q_dim].copy_from_slice(&f[..q_dim]);
                        k[r * kv_dim..(r + 1) * kv_dim].copy_from_slice(&f[q_dim..q_dim + kv_dim]);
                        v[r * kv_dim..(r + 1) * kv_dim].copy_from_slice(&f[q_dim + kv_dim..]);
                    }
                }
            }
            if let Some([bq, bk, bv]) = &layer.bias {
                add_rows(q, bq);
                add_rows(k, bk);
                add_rows(v, bv);
            }
            if let Some((nq, nk)) = &layer.qk_norm {
                rms_norm_in_place(q, nq, c.rms_eps);
                rms_norm_in_place(k, nk, c.rms_eps);
            }
            let rope = match (&self.rope_swa_freqs, layer.swa) {
                (Some(_), true) => &s.rope_swa,
                _ => &s.rope,
            };
            for r in 0..rows {
                let cs = &rope[r * rd..(r + 1) * rd];
                for h in 0..c.n_head {
                    apply_rope(&mut q[r * q_dim + h * hd..][..hd], cs, rd, c.rope_neox);
                }
                for h in 0..c.n_kv_head {
                    apply_rope(&mut k[r * kv_dim + h * hd..][..hd], cs, rd, c.rope_neox);
                }
            }
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
            let attn = &mut s.attn[..rows * q_dim];
            self.attention(l, seqs, &s.seq_spans, q, attn);
            let out = &mut s.xb[..rows * dim];
            layer.wo.matmul(attn, rows, out);
            if let Some(w) = &layer.post_attn_norm {
                rms_norm_in_place(out, w, c.rms_eps);
            }
            add_in_place(&mut s.x, out);
            rms_norm_rows(&s.x, &layer.ffn_norm, c.rms_eps, &mut s.xb[..rows * dim]);
            let xb = &s.xb[..rows * dim];
            let (gate, up) = (&mut s.gate[..], &mut s.up[..]);
            match &layer.gate_up {
                GateUp::Split { gate: wg, up: wu } => {
                    QWeight::matmul_shared(&[wg, wu], xb, rows, &mut [gate, up]);
                }
                GateUp::Fused(w) => {
                    let ffn = c.ffn_dim;
                    let fused = &mut s.fused[..rows * 2 * ffn];
                    w.matmul(xb, rows, fused);
                    for (r, f) in fused.chunks_exact(2 * ffn).enumerate() {
                        gate[r * ffn..(r + 1) * ffn].copy_from_slice(&f[..ffn]);
                        up[r * ffn..(r + 1) * ffn].copy_from_slice(&f[ffn..]);
                    }
                }
            }
            gated(
                c.activation,
                &mut s.gate[..rows * c.ffn_dim],
                &s.up[..rows * c.ffn_dim],
            );
            let out = &mut s.xb[..rows * dim];
            layer.w_down.matmul(&s.gate, rows, out);
            if let Some(w) = &layer.post_ffn_norm {
                rms_norm_in_place(out, w, c.rms_eps);
            }
            add_in_place(&mut s.x, out);
        }

        // Final norm and output projection, only for the rows whose logits are wanted.
        let mut m = 0;
        for (seq, &(r0, n, _)) in seqs.iter().zip(&s.seq_spans) {
            let wanted = match seq.logits {
                Logits::None => r0..r0,
                Logits::Last => r0 + n.saturating_sub(1)..r0 + n,
                Logits::All => r0..r0 + n,
            };
            for r in wanted {
                s.xb[m * dim..(m + 1) * dim].copy_from_slice(&s.x[r * dim..(r + 1) * dim]);
                m += 1;
            }
        }
        let normed = &mut s.attn[..m * dim];
        rms_norm_rows(&s.xb[..m * dim], &self.output_norm, c.rms_eps, normed);
        s.logits.resize(m * c.vocab_size, 0.0);
        self.output
            .as_ref()
            .unwrap_or(&self.embedding)
            .matmul(normed, m, &mut s.logits);
        if let Some(cap) = c.final_softcap {
            for v in s.logits.iter_mut() {
                *v = (*v / cap).tanh() * cap;
            }
        }
        &s.logits
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
        seqs: &[SeqStep<'_, K>],
        spans: &[(usize, usize, usize)],
        q: &[f32],
        out: &mut [f32],
    ) {
        let c = &self.config;
        let geo = Geometry {
            dim: c.q_dim(),
            hd: c.head_dim,
            group: c.n_head / c.n_kv_head,
            scale: c.attn_scale,
            softcap: c.attn_softcap,
            window: c.window(layer),
        };
        let tasks = attention_tasks(spans, c.n_kv_head, geo.group, rayon::current_num_threads());
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

/// Rows per attention task when a sequence brings many (prefill).
const ATTN_ROW_BLOCK: usize = 32;

/// One attention task: rows `rows.0 .. rows.0 + rows.1` of sequence `seq` (relative to its
/// span) for query heads `heads.0 .. heads.0 + heads.1` of KV head `g`'s group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AttnTask {
    seq: usize,
    g: usize,
    heads: (usize, usize),
    rows: (usize, usize),
}

/// The attention tasks for `spans`: blocks of [`ATTN_ROW_BLOCK`] rows per (sequence, KV head),
/// each for a run of the query heads sharing that KV head (its keys and values read once for
/// the run). The run is the longest divisor of the group among those whose rounds of tasks
/// over the threads take the least head-work (`ceil(tasks / threads) · run`): whole groups
/// when there are blocks enough (prefill), shorter runs when decoding a few sequences would
/// otherwise leave threads idle.
fn attention_tasks(
    spans: &[(usize, usize, usize)],
    n_kv: usize,
    group: usize,
    threads: usize,
) -> Vec<AttnTask> {
    let blocks: usize = spans.iter().map(|s| s.1.div_ceil(ATTN_ROW_BLOCK)).sum();
    let threads = threads.max(1);
    let cost = |run: usize| (blocks * n_kv * (group / run)).div_ceil(threads) * run;
    let run = (1..=group)
        .filter(|&r| group.is_multiple_of(r))
        .min_by_key(|&r| (cost(r), std::cmp::Reverse(r)))
        .unwrap_or(1);
    let heads: Vec<(usize, usize)> = (0..group).step_by(run).map(|h| (h, run)).collect();
    let mut tasks = Vec::new();
    for (seq, &(_, n, _)) in spans.iter().enumerate() {
        for g in 0..n_kv {
            for &h in &heads {
                for b in (0..n).step_by(ATTN_ROW_BLOCK) {
                    tasks.push(AttnTask {
                        seq,
                        g,
                        heads: h,
                        rows: (b, ATTN_ROW_BLOCK.min(n - b)),
                    });
                }
            }
        }
    }
    tasks
}

/// `gate[i] = act(gate[i]) · up[i]`, on rayon's threads in chunks when there are many (a
/// prefill's rows); element by element, so the same values whatever the split.
fn gated(act: Activation, gate: &mut [f32], up: &[f32]) {
    let f = |g: &mut [f32], u: &[f32]| match act {
        Activation::Silu => {
            for (g, u) in g.iter_mut().zip(u) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
        }
        Activation::GeluTanh => {
            for (g, u) in g.iter_mut().zip(u) {
                *g = gelu_tanh(*g) * u;
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
fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        add_in_place(row, b);
    }
}

/// RMS norm of every `w.len()`-wide slice of `x` in place (per head for q/k norms).
fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let d = w.len();
    for xr in x.chunks_exact_mut(d) {
        let scale = rms_scale(xr, eps);
        for (v, &g) in xr.iter_mut().zip(w) {
            *v = *v * scale * g;
        }
    }
}

/// Head geometry for attention.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    dim: usize,
    hd: usize,
    /// Query heads per KV head.
    group: usize,
    scale: f32,
    /// Attention-score soft-cap (Gemma 2).
    softcap: Option<f32>,
    /// Sliding window: keys at positions `p - window + 1 ..= p` only.
    window: Option<usize>,
}

/// One attention task's output, `[row][head][head_dim]`. Uses AVX2 when available: the same
/// operations in the same order (no FMA), so the bits do not depend on the instruction set.
fn attend<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    span: (usize, usize, usize),
    task: &AttnTask,
    geo: Geometry,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { attend_avx2(kv, layer, q, span, task, geo, SCORE_FLOATS) };
        }
    }
    attend_body(kv, layer, q, span, task, geo, dot)
}

/// [`attend_body`] with AVX2, eight positions (scores) or eight head-dimension lanes (values)
/// at a time. Each score is the eight lane sums of [`dot`] reduced by the same tree, and each
/// output element adds its weighted values in position order, one multiply and one add each
/// (no FMA), so the bits are [`attend_body`]'s; only the maximum (exact in any order) is taken
/// over vectors.
///
/// The task's rows go through in passes whose scores fit [`SCORE_FLOATS`]. A pass reads the
/// keys in blocks of [`KEY_BLOCK`] positions and scores every row of the pass against a block
/// before the next, then the values in blocks of [`VALUE_BLOCK`] positions, each block added
/// into every row: a block is read from memory once per pass and reused from the L1 cache by
/// every row and head, where a row at a time streamed the whole context once per row. Each
/// output element still adds its positions in order (across blocks through its f32 slot),
/// so the blocking changes no bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_avx2<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    span: (usize, usize, usize),
    task: &AttnTask,
    geo: Geometry,
    score_floats: usize,
) -> Vec<f32> {
    use std::arch::x86_64::*;
    let (r0, _, p0) = span;
    let Geometry {
        dim,
        hd,
        group,
        scale,
        softcap,
        window,
    } = geo;
    if hd % 8 != 0 {
        // SAFETY: this function only runs where AVX2 is available.
        return attend_body(kv, layer, q, span, task, geo, |a, b| unsafe {
            dot_avx2(a, b)
        });
    }
    let (h0, nh) = task.heads;
    let (i0, ni) = task.rows;
    let kvo = task.g * hd;
    // Row `i` of the task sees positions `lo(i) .. ctx(i)`.
    let ctx = |i: usize| p0 + i0 + i + 1;
    let lo = |i: usize| window.map_or(0, |w| ctx(i).saturating_sub(w));
    let cap = ctx(ni - 1);
    let pass = (score_floats / (nh * cap)).clamp(1, ni);
    // The thread's score buffer, kept between tasks (zeroing half a megabyte per task cost
    // more than some of the arithmetic). Every score a row reads is written first.
    let mut buffer = SCORES.take();
    if buffer.len() < pass * nh * cap {
        buffer = vec![0f32; pass * nh * cap];
    }
    let scores = &mut buffer[..pass * nh * cap];
    let mut out = vec![0f32; ni * nh * hd];
    let mut max = vec![f32::NEG_INFINITY; pass * nh];
    let mut vmax = vec![_mm256_set1_ps(f32::NEG_INFINITY); pass * nh];
    let mut sum = vec![0f32; nh];
    let mut inv = vec![0f32; pass * nh];
    let decode = ni <= 2;
    let vscale = _mm256_set1_ps(scale);
    let mut keys: [&[f32]; KEY_BLOCK] = [&[]; KEY_BLOCK];
    let mut rows: [&[f32]; VALUE_BLOCK] = [&[]; VALUE_BLOCK];
    for a0 in (0..ni).step_by(pass) {
        let a1 = (a0 + pass).min(ni);
        let (first, last) = (lo(a0), ctx(a1 - 1));
        max.fill(f32::NEG_INFINITY);
        vmax.fill(_mm256_set1_ps(f32::NEG_INFINITY));
        // Scores, a block of keys against every row of the pass.
        for kb in (first..last).step_by(KEY_BLOCK) {
            let ke = (kb + KEY_BLOCK).min(last);
            for (slot, p) in keys.iter_mut().zip(kb..ke) {
                *slot = &kv.key(layer, p)[kvo..kvo + hd];
            }
            for i in a0..a1 {
                let (s, e) = (kb.max(lo(i)), ke.min(ctx(i)));
                if s >= e {
                    continue;
                }
                let r = r0 + i0 + i;
                let qrow = &q[r * dim + (task.g * group + h0) * hd..][..nh * hd];
                let base = (i - a0) * nh;
                let mut p = s;
                while p + 8 <= e {
                    if decode {
                        // Decoding streams each key once: ask for those a few positions on.
                        for a in (p + PREFETCH..p + PREFETCH + 8).take_while(|&a| a < last) {
                            prefetch_row(&kv.key(layer, a)[kvo..kvo + hd]);
                        }
                    }
                    let k8: &[&[f32]; 8] = keys[p - kb..p - kb + 8].try_into().unwrap();
                    for hh in 0..nh {
                        let sv = _mm256_mul_ps(dot8(&qrow[hh * hd..(hh + 1) * hd], k8), vscale);
                        let dst = &mut scores[(base + hh) * cap + p..][..8];
                        // SAFETY: `dst` holds eight floats.
                        unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), sv) };
                        match softcap {
                            None => vmax[base + hh] = _mm256_max_ps(sv, vmax[base + hh]),
                            Some(c) => {
                                for sc in dst.iter_mut() {
                                    *sc = (*sc / c).tanh() * c;
                                    max[base + hh] = max[base + hh].max(*sc);
                                }
                            }
                        }
                    }
                    p += 8;
                }
                for p in p..e {
                    for hh in 0..nh {
                        // SAFETY: this function only runs where AVX2 is available.
                        let mut sc =
                            unsafe { dot_avx2(&qrow[hh * hd..(hh + 1) * hd], keys[p - kb]) }
                                * scale;
                        if let Some(c) = softcap {
                            sc = (sc / c).tanh() * c;
                        }
                        max[base + hh] = max[base + hh].max(sc);
                        scores[(base + hh) * cap + p] = sc;
                    }
                }
            }
        }
        // Each row's weights: the exponentials, then each head's sum in position order.
        for i in a0..a1 {
            let base = (i - a0) * nh;
            let (l, c) = (lo(i), ctx(i));
            for hh in 0..nh {
                let mut lanes = [0f32; 8];
                // SAFETY: `lanes` holds eight floats.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), vmax[base + hh]) };
                let m = lanes.iter().fold(max[base + hh], |m, &v| m.max(v));
                exp_shifted_in_place(&mut scores[(base + hh) * cap + l..][..c - l], m);
            }
            let heads = &scores[base * cap..(base + nh) * cap];
            sum_in_order(heads, cap, l..c, &mut sum);
            for (hh, s) in sum.iter().enumerate() {
                inv[base + hh] = 1.0 / s;
            }
        }
        // Values, a block of positions added into every row of the pass.
        for pb in (first..last).step_by(VALUE_BLOCK) {
            let pe = (pb + VALUE_BLOCK).min(last);
            for (slot, p) in rows.iter_mut().zip(pb..pe) {
                *slot = &kv.value(layer, p)[kvo..kvo + hd];
            }
            if decode {
                for a in pe..(pe + VALUE_BLOCK).min(last) {
                    prefetch_row(&kv.value(layer, a)[kvo..kvo + hd]);
                }
            }
            for i in a0..a1 {
                let (s, e) = (pb.max(lo(i)), pe.min(ctx(i)));
                if s >= e {
                    continue;
                }
                let base = (i - a0) * nh;
                let o = &mut out[i * nh * hd..(i + 1) * nh * hd];
                for hh in 0..nh {
                    let w = &scores[(base + hh) * cap + s..(base + hh) * cap + e];
                    let oh = &mut o[hh * hd..(hh + 1) * hd];
                    for d0 in (0..hd).step_by(64) {
                        weighted_sum8(&mut oh[d0..hd.min(d0 + 64)], w, &rows[s - pb..e - pb], d0);
                    }
                }
            }
        }
        for i in a0..a1 {
            let base = (i - a0) * nh;
            let o = &mut out[i * nh * hd..(i + 1) * nh * hd];
            for hh in 0..nh {
                let iv = _mm256_set1_ps(inv[base + hh]);
                for a in o[hh * hd..(hh + 1) * hd].chunks_exact_mut(8) {
                    // SAFETY: `a` holds eight floats.
                    unsafe {
                        _mm256_storeu_ps(
                            a.as_mut_ptr(),
                            _mm256_mul_ps(_mm256_loadu_ps(a.as_ptr()), iv),
                        )
                    };
                }
            }
        }
    }
    SCORES.set(buffer);
    out
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// [`attend_avx2`]'s score buffer on this thread.
    static SCORES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Scores (floats) one pass of [`attend_avx2`] may hold: 512 KiB, within a core's L2 cache.
#[cfg(target_arch = "x86_64")]
const SCORE_FLOATS: usize = 1 << 17;

/// Positions whose keys [`attend_avx2`] scores every row of a pass against before the next
/// block (16 KiB at 64 dimensions).
#[cfg(target_arch = "x86_64")]
const KEY_BLOCK: usize = 64;

/// `sum[h] = Σ heads[h * stride + p]` over `range`, positions in order from `0.0`, for every
/// head `h`: [`attend_body`]'s sums. Up to four heads' chains run side by side in registers
/// (a chain through memory waits on a store for every add).
fn sum_in_order(heads: &[f32], stride: usize, range: std::ops::Range<usize>, sum: &mut [f32]) {
    fn chains<const N: usize>(rows: [&[f32]; N]) -> [f32; N] {
        let mut s = [0f32; N];
        let n = rows[0].len();
        assert!(rows.iter().all(|r| r.len() == n));
        for p in 0..n {
            for (s, r) in s.iter_mut().zip(&rows) {
                *s += r[p];
            }
        }
        s
    }
    let row = |h: usize| &heads[h * stride + range.start..h * stride + range.end];
    let mut h = 0;
    while h < sum.len() {
        let n = (sum.len() - h).min(4);
        match n {
            4 => {
                sum[h..h + 4].copy_from_slice(&chains([row(h), row(h + 1), row(h + 2), row(h + 3)]))
            }
            3 => sum[h..h + 3].copy_from_slice(&chains([row(h), row(h + 1), row(h + 2)])),
            2 => sum[h..h + 2].copy_from_slice(&chains([row(h), row(h + 1)])),
            _ => sum[h] = chains([row(h)])[0],
        }
        h += n;
    }
}

/// Positions whose value rows [`attend_avx2`] reads as one block (8 KiB at 64 dimensions).
const VALUE_BLOCK: usize = 32;

/// Eight dot products of `q` with eight keys, each [`dot`]'s: lane `l` of key `j` sums
/// `q[c + l] * k_j[c + l]` over chunks `c` in order, then `((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7))`
/// (pairwise horizontal adds give exactly that tree), plus `dot`'s empty tail, `+0.0`.
/// `q.len()` is a multiple of eight and every key at least as long.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn dot8(q: &[f32], keys: &[&[f32]; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let n = q.len();
    debug_assert!(n.is_multiple_of(8) && keys.iter().all(|k| k.len() >= n));
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut c = 0;
    while c < n {
        // SAFETY: c + 8 <= n, inside `q` and every key.
        unsafe {
            let x = _mm256_loadu_ps(q.as_ptr().add(c));
            for (a, k) in acc.iter_mut().zip(keys) {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, _mm256_loadu_ps(k.as_ptr().add(c))));
            }
        }
        c += 8;
    }
    _mm256_set_m128(reduce4(&acc[4..]), reduce4(&acc[..4]))
}

/// [`dot`]'s reduction of four accumulators at once: `a0+a4 .. a3+a7` per accumulator, then
/// the horizontal adds `(v0+v1, v2+v3)` and `((v0+v1)+(v2+v3))`, then `+0.0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn reduce4(acc: &[std::arch::x86_64::__m256]) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    let mut half = [_mm_setzero_ps(); 4];
    for (h, &a) in half.iter_mut().zip(acc) {
        *h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    }
    let x = _mm_hadd_ps(half[0], half[1]);
    let y = _mm_hadd_ps(half[2], half[3]);
    _mm_add_ps(_mm_hadd_ps(x, y), _mm_setzero_ps())
}

/// `o[d] += w[p] * rows[p][d0 + d]` for every `d` of `o` (at most 64), positions in order:
/// the accumulators stay in registers across the block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn weighted_sum8(o: &mut [f32], w: &[f32], rows: &[&[f32]], d0: usize) {
    use std::arch::x86_64::*;
    let nv = o.len() / 8;
    debug_assert!(o.len().is_multiple_of(8) && nv <= 8 && w.len() == rows.len());
    let mut acc = [_mm256_setzero_ps(); 8];
    // SAFETY: every load and store below is inside `o` (nv * 8 floats) or inside a row
    // (d0 + nv * 8 <= the row's length, a head of `hd` values).
    unsafe {
        if nv == 8 {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(o.as_ptr().add(8 * j));
            }
            for (&wp, row) in w.iter().zip(rows) {
                let wv = _mm256_set1_ps(wp);
                let v = row.as_ptr().add(d0);
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(wv, _mm256_loadu_ps(v.add(8 * j))));
                }
            }
            for (j, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * j), *a);
            }
        } else {
            for (j, a) in acc[..nv].iter_mut().enumerate() {
                *a = _mm256_loadu_ps(o.as_ptr().add(8 * j));
            }
            for (&wp, row) in w.iter().zip(rows) {
                let wv = _mm256_set1_ps(wp);
                let v = row.as_ptr().add(d0);
                for (j, a) in acc[..nv].iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(wv, _mm256_loadu_ps(v.add(8 * j))));
                }
            }
            for (j, a) in acc[..nv].iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * j), *a);
            }
        }
    }
}

#[inline(always)]
fn attend_body<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    (r0, _, p0): (usize, usize, usize),
    task: &AttnTask,
    geo: Geometry,
    dot: impl Fn(&[f32], &[f32]) -> f32,
) -> Vec<f32> {
    let Geometry {
        dim,
        hd,
        group,
        scale,
        softcap,
        window,
    } = geo;
    let (h0, nh) = task.heads;
    let (i0, ni) = task.rows;
    let kvo = task.g * hd;
    let cap = p0 + i0 + ni;
    let mut scores = vec![0f32; nh * cap];
    let mut out = vec![0f32; ni * nh * hd];
    let mut max = vec![f32::NEG_INFINITY; nh];
    let mut sum = vec![0f32; nh];
    // Decoding (a row or two per task) streams each key and value once: prefetch them. Rows of
    // a prefill chunk reread the same keys from the cache, where hints would only cost.
    let decode = ni <= 2;
    for i in 0..ni {
        let r = r0 + i0 + i;
        let ctx = p0 + i0 + i + 1;
        let lo = window.map_or(0, |w| ctx.saturating_sub(w));
        let qrow = &q[r * dim + (task.g * group + h0) * hd..][..nh * hd];
        max.fill(f32::NEG_INFINITY);
        for p in lo..ctx {
            if decode && p + PREFETCH < ctx {
                prefetch_row(&kv.key(layer, p + PREFETCH)[kvo..kvo + hd]);
            }
            let k = &kv.key(layer, p)[kvo..kvo + hd];
            for hh in 0..nh {
                let mut sc = dot(&qrow[hh * hd..(hh + 1) * hd], k) * scale;
                if let Some(c) = softcap {
                    sc = (sc / c).tanh() * c;
                }
                max[hh] = max[hh].max(sc);
                scores[hh * cap + p] = sc;
            }
        }
        for hh in 0..nh {
            let scores = &mut scores[hh * cap + lo..hh * cap + ctx];
            exp_shifted_in_place(scores, max[hh]);
            sum[hh] = scores.iter().fold(0f32, |s, &v| s + v);
        }
        let o = &mut out[i * nh * hd..(i + 1) * nh * hd];
        for p in lo..ctx {
            if decode && p + PREFETCH < ctx {
                prefetch_row(&kv.value(layer, p + PREFETCH)[kvo..kvo + hd]);
            }
            let v = &kv.value(layer, p)[kvo..kvo + hd];
            for hh in 0..nh {
                let w = scores[hh * cap + p];
                for (a, b) in o[hh * hd..(hh + 1) * hd].iter_mut().zip(v) {
                    *a += w * b;
                }
            }
        }
        for hh in 0..nh {
            let inv = 1.0 / sum[hh];
            for a in o[hh * hd..(hh + 1) * hd].iter_mut() {
                *a *= inv;
            }
        }
    }
    out
}

/// Positions ahead of the one being read whose key (or value) is prefetched.
const PREFETCH: usize = 8;

/// Asks the cache for `row` (a key or value read a few positions later). A hint only: it
/// neither faults nor changes any value, so results are the same with or without it. KV
/// blocks are separate allocations of 16 positions, so the hardware prefetcher loses the
/// stream at every block boundary; at 1k positions attention is most of a decode step.
#[inline(always)]
fn prefetch_row(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in row.chunks(16) {
        // SAFETY: a prefetch is a hint that never faults; SSE is part of every x86_64 CPU.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr() as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// Reusable buffers for [`Llama::forward`], grown to the largest step seen.
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
    logits: Vec<f32>,
    seq_spans: Vec<(usize, usize, usize)>,
}

impl Scratch {
    /// The logits buffer, for a forward pass that runs elsewhere and copies its logits here.
    #[cfg(feature = "cuda")]
    pub(super) fn logits_mut(&mut self) -> &mut Vec<f32> {
        &mut self.logits
    }

    fn prepare(&mut self, c: &LlamaConfig, rows: usize) {
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
    }
}

/// `1 / sqrt(mean(x²) + eps)` as ggml's `rms_norm` computes it: each square in f32, summed
/// in f64 in order, the mean rounded to f32, then `1 / sqrtf(mean + eps)` in f32.
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// RMS norm of each row (as ggml computes it: [`rms_scale`]), times the weight.
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
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
fn apply_rope(v: &mut [f32], cs: &[f32], rd: usize, neox: bool) {
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

/// Dot product with a fixed order: eight lanes, then a fixed pairwise reduction.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// [`dot`] with AVX2 intrinsics: the same eight lane sums and the same reduction, so the
/// same bits (the compiler's own vectorisation of [`dot`] shuffles lanes one by one).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let full = n / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < full {
        // SAFETY: i + 8 <= n, inside both slices.
        let x = unsafe { _mm256_loadu_ps(a.as_ptr().add(i)) };
        let y = unsafe { _mm256_loadu_ps(b.as_ptr().add(i)) };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
        i += 8;
    }
    let mut tail = 0f32;
    for j in full..n {
        tail += a[j] * b[j];
    }
    // (acc0+acc4, acc1+acc5, acc2+acc6, acc3+acc7), then ((v0+v1) + (v2+v3)) + tail.
    let v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let w = _mm_add_ps(v, _mm_movehdup_ps(v));
    let r = _mm_add_ss(w, _mm_movehl_ps(w, w));
    _mm_cvtss_f32(r) + tail
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn avx2_dot_has_the_portable_bits() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            for n in [0, 1, 7, 8, 9, 63, 64, 80, 128, 131] {
                let (a, b) = (noise(n as u64, n), noise(1000 + n as u64, n));
                let scaled: Vec<f32> = a.iter().map(|v| v * 1e3).collect();
                for x in [&a, &scaled] {
                    // SAFETY: AVX2 checked above.
                    let fast = unsafe { dot_avx2(x, &b) };
                    assert_eq!(fast.to_bits(), dot(x, &b).to_bits(), "length {n}");
                }
            }
        }
    }

    /// Keys and values of one layer, `kv_dim` wide.
    struct Kv {
        kv_dim: usize,
        keys: Vec<f32>,
        values: Vec<f32>,
    }

    impl KvSeq for Kv {
        fn len(&self) -> usize {
            self.keys.len() / self.kv_dim
        }
        fn grow(&mut self, _: usize) {}
        fn write(&mut self, _: usize, _: usize, _: &[f32], _: &[f32]) {}
        fn key(&self, _: usize, pos: usize) -> &[f32] {
            &self.keys[pos * self.kv_dim..][..self.kv_dim]
        }
        fn value(&self, _: usize, pos: usize) -> &[f32] {
            &self.values[pos * self.kv_dim..][..self.kv_dim]
        }
    }

    #[test]
    fn attention_split_never_changes_a_bit() {
        let (n_kv, group, hd) = (3, 3, 64);
        let geo = Geometry {
            dim: n_kv * group * hd,
            hd,
            group,
            scale: 0.125,
            softcap: None,
            window: None,
        };
        let ctx = 300;
        let kv = Kv {
            kv_dim: n_kv * hd,
            keys: noise(1, ctx * n_kv * hd),
            values: noise(2, ctx * n_kv * hd),
        };
        // Rows 200..300 of one sequence: a prefill of 100 rows after 200 positions.
        let (n, p0) = (100, 200);
        let q = noise(3, n * geo.dim);
        let span = (0, n, p0);
        let run = |threads: usize| {
            let mut out = vec![0f32; n * geo.dim];
            for t in attention_tasks(&[span], n_kv, group, threads) {
                let res = attend(&kv, 0, &q, span, &t, geo);
                let w = t.heads.1 * hd;
                let col = (t.g * group + t.heads.0) * hd;
                for (i, c) in res.chunks_exact(w).enumerate() {
                    out[(t.rows.0 + i) * geo.dim + col..][..w].copy_from_slice(c);
                }
            }
            out
        };
        // 1 thread: whole groups in row blocks; 64 threads: single heads.
        let (a, b) = (run(1), run(64));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        // A decode step (one row) is the same row of the prefill.
        let last = (n - 1, 1, p0 + n - 1);
        let q_last = &q[(n - 1) * geo.dim..];
        for threads in [1, 2, 64] {
            let mut row = vec![0f32; geo.dim];
            for t in attention_tasks(&[(0, 1, last.2)], n_kv, group, threads) {
                let res = attend(&kv, 0, q_last, (0, 1, last.2), &t, geo);
                let col = (t.g * group + t.heads.0) * hd;
                row[col..col + res.len()].copy_from_slice(&res);
            }
            let want = &a[(n - 1) * geo.dim..];
            assert!(row
                .iter()
                .zip(want)
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    /// The AVX2 kernel (eight positions per score pass, key and value blocks, row passes of
    /// one row, a few rows and the whole task) against the portable body, bit for bit: head
    /// sizes with and without whole 64- and 8-lane chunks, groups, soft-capping, windows,
    /// prefill row blocks and decode rows at every context length around the 8-position and
    /// block edges.
    #[test]
    fn avx2_attention_has_the_portable_bits() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let n_kv = 2;
            let mut cases = 0;
            for (hd, group, softcap, window) in [
                (64, 3, None, None),
                (128, 4, None, Some(37)),
                (96, 1, Some(20.0), None),
                (80, 2, None, None),
                (72, 3, Some(5.0), Some(9)),
                (20, 2, None, None),
            ] {
                let geo = Geometry {
                    dim: n_kv * group * hd,
                    hd,
                    group,
                    scale: 1.0 / (hd as f32).sqrt(),
                    softcap,
                    window,
                };
                let ctx = 90;
                let spread = |v: Vec<f32>| v.into_iter().map(|x| x * 4.0).collect::<Vec<_>>();
                let kv = Kv {
                    kv_dim: n_kv * hd,
                    keys: spread(noise(hd as u64, ctx * n_kv * hd)),
                    values: noise(hd as u64 + 1, ctx * n_kv * hd),
                };
                let q = spread(noise(hd as u64 + 2, ctx * geo.dim));
                // A prefill of 40 rows after 50 positions, and decode rows at every length.
                let mut spans = vec![(0, 40, 50)];
                spans.extend((0..ctx).map(|p| (p, 1, p)));
                for span in spans {
                    for threads in [1, 64] {
                        for t in attention_tasks(&[span], n_kv, group, threads) {
                            let slow = attend_body(&kv, 0, &q, span, &t, geo, dot);
                            // The default passes, and passes of one row and of a few rows.
                            for score_floats in [SCORE_FLOATS, 1, 700] {
                                // SAFETY: AVX2 was checked above.
                                let fast =
                                    unsafe { attend_avx2(&kv, 0, &q, span, &t, geo, score_floats) };
                                let same = fast
                                    .iter()
                                    .zip(&slow)
                                    .all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(
                                    same && fast.len() == slow.len(),
                                    "hd {hd}, span {span:?}, {t:?}, {score_floats}"
                                );
                                cases += 1;
                            }
                        }
                    }
                }
            }
            assert!(cases > 1000);
        }
    }

    #[test]
    fn attention_tasks_keep_query_groups_together_when_the_threads_are_busy() {
        let heads = |spans: &[(usize, usize, usize)], n_kv, group, threads| {
            attention_tasks(spans, n_kv, group, threads)
                .iter()
                .map(|t| t.heads.1)
                .collect::<Vec<_>>()
        };
        // Decoding one sequence of a 12/2-head model on 2 threads: one task per KV head,
        // each reading its keys and values once for all six query heads.
        assert_eq!(heads(&[(0, 1, 900)], 2, 6, 2), vec![6, 6]);
        // On 8 threads the group is cut into runs: 2 × 3 runs of 2 heads take one round.
        assert_eq!(heads(&[(0, 1, 900)], 2, 6, 8), vec![2; 6]);
        // 9/3 heads on 2 threads: 3 tasks of 3 heads take two rounds (6 heads' work), 9
        // single heads five.
        assert_eq!(heads(&[(0, 1, 900)], 3, 3, 2), vec![1; 9]);
        // Prefill: enough row blocks for whole groups.
        assert!(heads(&[(0, 256, 0)], 2, 6, 2).iter().all(|&h| h == 6));
    }

    #[test]
    fn attention_tasks_cover_every_row_and_head_once() {
        let spans = [(0, 1, 5), (1, 70, 0), (71, 32, 9)];
        for threads in [1, 2, 8, 1000] {
            let mut seen = std::collections::HashSet::new();
            for t in attention_tasks(&spans, 2, 4, threads) {
                for r in t.rows.0..t.rows.0 + t.rows.1 {
                    for h in t.heads.0..t.heads.0 + t.heads.1 {
                        assert!(seen.insert((t.seq, r, t.g, h)));
                    }
                }
            }
            assert_eq!(seen.len(), (1 + 70 + 32) * 2 * 4);
        }
    }
}
