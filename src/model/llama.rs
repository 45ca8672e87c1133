//! The llama architecture (Touvron et al., 2023, "LLaMA"; llama.cpp's `llm_build_llama` is the
//! reference implementation): weights built from a GGUF file and a forward pass over packed rows.
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

use super::error::{ModelError, Result};
use super::gguf::{GgufFile, LlamaConfig};
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

/// Builds a weight matrix: as stored (`Native`, quantized kernels) or dequantized (`F32`).
/// A stored type without a native kernel is an error in `Native` mode rather than a silent
/// change of numerics.
fn build_matrix(name: &str, q: &QTensor, dtype: WeightDType) -> Result<QWeight> {
    let built = match dtype {
        WeightDType::F32 => QWeight::dequantized(q),
        WeightDType::Native if has_native_kernel(q.dtype()) => QWeight::from_qtensor(q),
        WeightDType::Native => {
            return Err(ModelError::UnsupportedTensorType {
                name: name.into(),
                dtype: format!(
                    "{:?} (no quantized kernel; load with --dtype f32)",
                    q.dtype()
                ),
            })
        }
    };
    built.map_err(|e| ModelError::UnsupportedTensorType {
        name: name.into(),
        dtype: format!("{:?} ({e})", q.dtype()),
    })
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

struct Layer {
    attn_norm: Vec<f32>,
    wq: QWeight,
    wk: QWeight,
    wv: QWeight,
    wo: QWeight,
    ffn_norm: Vec<f32>,
    w_gate: QWeight,
    w_up: QWeight,
    w_down: QWeight,
}

/// A loaded llama-family model: configuration and immutable weights.
pub struct Llama {
    config: LlamaConfig,
    dtype: WeightDType,
    /// `vocab × dim`; rows are dequantized on lookup.
    embedding: QWeight,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    /// `None` when tied to the embedding.
    output: Option<QWeight>,
    /// Inverse RoPE frequency per rotated pair (llama 3 frequency factors applied).
    inv_freq: Vec<f64>,
}

impl Llama {
    /// Loads a llama-family GGUF file.
    pub fn from_gguf_path(path: &Path, dtype: WeightDType) -> Result<Llama> {
        let mut file = GgufFile::open(path)?;
        Llama::from_gguf(&mut file, dtype)
    }

    /// Builds the model from an open GGUF file.
    pub fn from_gguf(file: &mut GgufFile, dtype: WeightDType) -> Result<Llama> {
        let config = LlamaConfig::from_gguf(file.content())?;
        let c = &config;
        let (dim, kv_dim, ffn) = (c.dim, c.kv_dim(), c.ffn_dim);
        let embd_q = file.tensor("token_embd.weight", &[c.vocab_size, dim])?;
        let embedding = build_matrix("token_embd.weight", &embd_q, dtype)?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let mut mat = |suffix: &str, shape: &[usize]| -> Result<QWeight> {
                let name = format!("blk.{i}.{suffix}.weight");
                let q = file.tensor(&name, shape)?;
                build_matrix(&name, &q, dtype)
            };
            let wq = mat("attn_q", &[dim, dim])?;
            let wk = mat("attn_k", &[kv_dim, dim])?;
            let wv = mat("attn_v", &[kv_dim, dim])?;
            let wo = mat("attn_output", &[dim, dim])?;
            let w_gate = mat("ffn_gate", &[ffn, dim])?;
            let w_up = mat("ffn_up", &[ffn, dim])?;
            let w_down = mat("ffn_down", &[dim, ffn])?;
            let mut norm = |suffix: &str| -> Result<Vec<f32>> {
                let name = format!("blk.{i}.{suffix}.weight");
                let q = file.tensor(&name, &[dim])?;
                to_f32_vec(&name, &q)
            };
            let attn_norm = norm("attn_norm")?;
            let ffn_norm = norm("ffn_norm")?;
            layers.push(Layer {
                attn_norm,
                wq,
                wk,
                wv,
                wo,
                ffn_norm,
                w_gate,
                w_up,
                w_down,
            });
        }
        let output_norm = to_f32_vec(
            "output_norm.weight",
            &file.tensor("output_norm.weight", &[dim])?,
        )?;
        // Tied embeddings exactly when the file has no `output.weight`.
        let output = if file.has_tensor("output.weight") {
            let q = file.tensor("output.weight", &[c.vocab_size, dim])?;
            Some(build_matrix("output.weight", &q, dtype)?)
        } else {
            None
        };
        let n_pairs = c.rope_dim / 2;
        let factors = if file.has_tensor("rope_freqs.weight") {
            to_f32_vec(
                "rope_freqs.weight",
                &file.tensor("rope_freqs.weight", &[n_pairs])?,
            )?
        } else {
            vec![1.0; n_pairs]
        };
        let inv_freq = (0..n_pairs)
            .map(|i| {
                let f = (c.rope_base as f64).powf(-2.0 * i as f64 / c.rope_dim as f64);
                f / factors[i] as f64
            })
            .collect();
        Ok(Llama {
            config,
            dtype,
            embedding,
            layers,
            output_norm,
            output,
            inv_freq,
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    pub fn dtype(&self) -> WeightDType {
        self.dtype
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
        let (dim, kv_dim, hd) = (c.dim, c.kv_dim(), c.head_dim);
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
                self.embedding
                    .row_f32(t as usize, &mut s.x[(row + i) * dim..(row + i + 1) * dim]);
                self.rope_row(
                    start_pos + i,
                    &mut s.rope[(row + i) * c.rope_dim..][..c.rope_dim],
                );
            }
            row += seq.tokens.len();
        }

        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm_rows(&s.x, &layer.attn_norm, c.rms_eps, &mut s.xb);
            QWeight::matmul_shared(
                &[&layer.wq, &layer.wk, &layer.wv],
                &s.xb,
                rows,
                &mut [&mut s.q[..], &mut s.k[..], &mut s.v[..]],
            );
            for r in 0..rows {
                let cs = &s.rope[r * c.rope_dim..(r + 1) * c.rope_dim];
                for h in 0..c.n_head {
                    apply_rope(&mut s.q[r * dim + h * hd..][..c.rope_dim], cs);
                }
                for h in 0..c.n_kv_head {
                    apply_rope(&mut s.k[r * kv_dim + h * hd..][..c.rope_dim], cs);
                }
            }
            for (seq, &(r0, n, p0)) in seqs.iter_mut().zip(&s.seq_spans) {
                for i in 0..n {
                    let r = r0 + i;
                    seq.kv.write(
                        l,
                        p0 + i,
                        &s.k[r * kv_dim..(r + 1) * kv_dim],
                        &s.v[r * kv_dim..(r + 1) * kv_dim],
                    );
                }
            }
            self.attention(l, seqs, &s.seq_spans, &s.q, &mut s.xb);
            layer.wo.matmul(&s.xb, rows, &mut s.q);
            add_in_place(&mut s.x, &s.q);
            rms_norm_rows(&s.x, &layer.ffn_norm, c.rms_eps, &mut s.xb);
            QWeight::matmul_shared(
                &[&layer.w_gate, &layer.w_up],
                &s.xb,
                rows,
                &mut [&mut s.gate[..], &mut s.up[..]],
            );
            for (g, u) in s.gate.iter_mut().zip(&s.up) {
                *g = *g / (1.0 + (-*g).exp()) * u;
            }
            layer.w_down.matmul(&s.gate, rows, &mut s.q);
            add_in_place(&mut s.x, &s.q);
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
        let normed = &mut s.q[..m * dim];
        rms_norm_rows(&s.xb[..m * dim], &self.output_norm, c.rms_eps, normed);
        s.logits.resize(m * c.vocab_size, 0.0);
        self.output
            .as_ref()
            .unwrap_or(&self.embedding)
            .matmul(normed, m, &mut s.logits);
        &s.logits
    }

    /// Cosine and sine of each rotated pair's angle at `pos`, interleaved `[cos, sin, ...]`.
    fn rope_row(&self, pos: usize, out: &mut [f32]) {
        for (i, f) in self.inv_freq.iter().enumerate() {
            let a = pos as f64 * f;
            out[2 * i] = a.cos() as f32;
            out[2 * i + 1] = a.sin() as f32;
        }
    }

    /// Causal attention of each sequence's new rows over its own KV, written into `out`
    /// (`[row][dim]`). Tasks are (sequence, KV head) pairs, run in parallel; each handles the
    /// query heads sharing that KV head, so every key and value is read once per row.
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
            dim: c.dim,
            hd: c.head_dim,
            group: c.n_head / c.n_kv_head,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        };
        let n_kv = c.n_kv_head;
        let results: Vec<Vec<f32>> = (0..seqs.len() * n_kv)
            .into_par_iter()
            .map(|t| {
                let (si, g) = (t / n_kv, t % n_kv);
                attend_group(seqs[si].kv, layer, q, spans[si], g, geo)
            })
            .collect();
        let w = geo.group * geo.hd;
        for (t, res) in results.iter().enumerate() {
            let (si, g) = (t / n_kv, t % n_kv);
            let (r0, n, _) = spans[si];
            for i in 0..n {
                out[(r0 + i) * geo.dim + g * w..][..w].copy_from_slice(&res[i * w..(i + 1) * w]);
            }
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
}

/// Attention of one sequence's new rows for the query heads of KV head `g`; returns
/// `[row][head in group][head_dim]`. Uses AVX2 when available: the same operations in the
/// same order (no FMA), so the bits do not depend on the instruction set.
fn attend_group<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    span: (usize, usize, usize),
    g: usize,
    geo: Geometry,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { attend_group_avx2(kv, layer, q, span, g, geo) };
        }
    }
    attend_group_body(kv, layer, q, span, g, geo)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_group_avx2<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    span: (usize, usize, usize),
    g: usize,
    geo: Geometry,
) -> Vec<f32> {
    attend_group_body(kv, layer, q, span, g, geo)
}

#[inline(always)]
fn attend_group_body<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    (r0, n, p0): (usize, usize, usize),
    g: usize,
    geo: Geometry,
) -> Vec<f32> {
    let Geometry {
        dim,
        hd,
        group,
        scale,
    } = geo;
    let kvo = g * hd;
    let cap = p0 + n;
    let mut scores = vec![0f32; group * cap];
    let mut out = vec![0f32; n * group * hd];
    let mut max = vec![f32::NEG_INFINITY; group];
    let mut sum = vec![0f32; group];
    for i in 0..n {
        let r = r0 + i;
        let ctx = p0 + i + 1;
        let qrow = &q[r * dim + g * group * hd..][..group * hd];
        max.fill(f32::NEG_INFINITY);
        for p in 0..ctx {
            let k = &kv.key(layer, p)[kvo..kvo + hd];
            for hh in 0..group {
                let sc = dot(&qrow[hh * hd..(hh + 1) * hd], k) * scale;
                max[hh] = max[hh].max(sc);
                scores[hh * cap + p] = sc;
            }
        }
        for hh in 0..group {
            let mut s = 0f32;
            for sc in scores[hh * cap..hh * cap + ctx].iter_mut() {
                *sc = (*sc - max[hh]).exp();
                s += *sc;
            }
            sum[hh] = s;
        }
        let o = &mut out[i * group * hd..(i + 1) * group * hd];
        for p in 0..ctx {
            let v = &kv.value(layer, p)[kvo..kvo + hd];
            for hh in 0..group {
                let w = scores[hh * cap + p];
                for (a, b) in o[hh * hd..(hh + 1) * hd].iter_mut().zip(v) {
                    *a += w * b;
                }
            }
        }
        for hh in 0..group {
            let inv = 1.0 / sum[hh];
            for a in o[hh * hd..(hh + 1) * hd].iter_mut() {
                *a *= inv;
            }
        }
    }
    out
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
    rope: Vec<f32>,
    logits: Vec<f32>,
    seq_spans: Vec<(usize, usize, usize)>,
}

impl Scratch {
    fn prepare(&mut self, c: &LlamaConfig, rows: usize) {
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        fit(&mut self.x, rows * c.dim);
        fit(&mut self.xb, rows * c.dim);
        fit(&mut self.q, rows * c.dim);
        fit(&mut self.k, rows * c.kv_dim());
        fit(&mut self.v, rows * c.kv_dim());
        fit(&mut self.gate, rows * c.ffn_dim);
        fit(&mut self.up, rows * c.ffn_dim);
        fit(&mut self.rope, rows * c.rope_dim);
    }
}

/// RMS norm of each row (sum of squares in f64, fixed order), times the weight.
fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f64 = xr.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let scale = (1.0 / (ss / d as f64 + eps as f64).sqrt()) as f32;
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// Rotates adjacent pairs `(v[2i], v[2i+1])` (llama.cpp's NORM RoPE mode).
fn apply_rope(v: &mut [f32], cs: &[f32]) {
    for (pair, c) in v.chunks_exact_mut(2).zip(cs.chunks_exact(2)) {
        let (x0, x1) = (pair[0], pair[1]);
        pair[0] = x0 * c[0] - x1 * c[1];
        pair[1] = x0 * c[1] + x1 * c[0];
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

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
