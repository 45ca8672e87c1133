//! Multi-head Latent Attention (DeepSeek-V2/V3, GLM-4.7-Flash, Mistral 4) as
//! llama.cpp's deepseek2.cpp runs it with its absorption, around the ordinary KV write and
//! attention steps: [`Latent::project`] (`Step::LatentProject`), [`Latent::absorb`]
//! (`Step::Absorb`) and [`Latent::expand`] (`Step::Expand`).
//!
//! A position stores one key, `[k_pe | latent]` (the RoPE part shared by every head, then the
//! RMS-normed compressed KV), and one value, `[0 | latent]`; every query head attends over
//! them as multi-query attention. Head `h`'s query is `[q_pe | attn_k_b[h] · q_nope]`, so its
//! scores are llama.cpp's `q_nope_absorbed · latent + q_pe · k_pe` (the RoPE parts first
//! here, where the RoPE step rotates them; the sum is the same dot product, in another
//! order), and its output's latent part times `attn_v_b[h]` is its value. The zeros in the
//! value give an output whose RoPE part is exactly 0, which `expand` skips.
//!
//! Every row's bits depend on that row alone: the projections are [`QWeight::matmul`]s (each
//! output row as if alone), the norms per row.

use super::arch::{Mla, ModelConfig, TensorSource};
use super::error::{ModelError, Result};
use super::quant::QWeight;
use super::transformer::{build_matrix, rms_norm_in_place, to_f32_vec, WeightDType};
use crate::weights::stored::StoredType;

/// The queries' projection: one matrix, or a low-rank pair with an RMS norm between.
pub(super) enum Query {
    /// `attn_q`: `heads · (nope + rope) × dim`.
    Plain(QWeight),
    /// `attn_q_a` (`q_lora × dim`), its norm `attn_q_a_norm`, `attn_q_b`
    /// (`heads · (nope + rope) × q_lora`).
    LowRank {
        a: QWeight,
        norm: Vec<f32>,
        b: QWeight,
    },
}

/// A latent-attention layer's weights beside its output projection.
pub(super) struct Latent {
    pub(super) query: Query,
    /// `(kv_lora + rope) × dim` (`attn_kv_a_mqa`): the compressed KV, then the RoPE part.
    pub(super) kv_a: QWeight,
    /// `attn_kv_a_norm` (`kv_lora`).
    pub(super) kv_norm: Vec<f32>,
    /// Per head, `kv_lora × nope` (`attn_k_b`): a no-RoPE query into the latent.
    pub(super) k_b: Vec<QWeight>,
    /// Per head, `v_head × kv_lora` (`attn_v_b`): an output's latent into its value.
    pub(super) v_b: Vec<QWeight>,
    pub(super) mla: Mla,
    pub(super) heads: usize,
    pub(super) rope: usize,
}

/// Reusable buffers of the latent steps, grown to the largest step seen.
#[derive(Debug, Default)]
pub struct LatentScratch {
    /// The low-rank queries (`rows × q_lora`).
    q_a: Vec<f32>,
    /// The full queries, `[q_nope | q_pe]` per head (`rows × heads · (nope + rope)`).
    q: Vec<f32>,
    /// The compressed KV and RoPE part (`rows × (kv_lora + rope)`).
    ckv: Vec<f32>,
    /// One head's inputs and outputs of its per-head matrix, rows in order.
    head_in: Vec<f32>,
    head_out: Vec<f32>,
    /// The values (`rows × heads · v_head`).
    out: Vec<f32>,
}

impl Latent {
    /// Layer `l`'s latent-attention weights (llama.cpp's `load_arch_tensors` of deepseek2).
    pub(super) fn load(
        src: &mut dyn TensorSource,
        l: usize,
        c: &ModelConfig,
        mla: Mla,
        dtype: WeightDType,
    ) -> Result<Latent> {
        let name = |suffix: &str| format!("blk.{l}.{suffix}");
        let (dim, heads, rope) = (c.dim, c.n_head, c.rope_dim);
        let Mla {
            q_lora,
            kv_lora,
            nope,
            v_head,
        } = mla;
        let q_width = heads * (nope + rope);
        let mut mat =
            |suffix: &str, shape: &[usize]| build_matrix(src, &name(suffix), shape, dtype);
        let query = match q_lora {
            0 => Query::Plain(mat("attn_q.weight", &[q_width, dim])?),
            r => Query::LowRank {
                a: mat("attn_q_a.weight", &[r, dim])?,
                norm: Vec::new(),
                b: mat("attn_q_b.weight", &[q_width, r])?,
            },
        };
        let kv_a = mat("attn_kv_a_mqa.weight", &[kv_lora + rope, dim])?;
        if src.has_tensor(&name("attn_kv_b.weight")) {
            return Err(ModelError::UnsupportedTensorType {
                name: name("attn_kv_b.weight"),
                dtype: "an unsplit `attn_kv_b` (a file converted before llama.cpp split it into \
                        attn_k_b and attn_v_b): reconvert the model"
                    .into(),
            });
        }
        let k_b = head_matrices(src, &name("attn_k_b.weight"), heads, kv_lora, nope, dtype)?;
        let v_b = head_matrices(src, &name("attn_v_b.weight"), heads, v_head, kv_lora, dtype)?;
        let mut vector = |suffix: &str, len: usize| -> Result<Vec<f32>> {
            let n = name(suffix);
            to_f32_vec(&n, &src.read_tensor(&n, &[len])?)
        };
        let query = match query {
            Query::LowRank { a, b, .. } => Query::LowRank {
                a,
                norm: vector("attn_q_a_norm.weight", q_lora)?,
                b,
            },
            plain => plain,
        };
        Ok(Latent {
            query,
            kv_a,
            kv_norm: vector("attn_kv_a_norm.weight", kv_lora)?,
            k_b,
            v_b,
            mla,
            heads,
            rope,
        })
    }

    /// Every weight matrix of the layer's attention but its output projection.
    pub(super) fn matrices(&self) -> Vec<&QWeight> {
        let mut ms = match &self.query {
            Query::Plain(q) => vec![q],
            Query::LowRank { a, b, .. } => vec![a, b],
        };
        ms.push(&self.kv_a);
        ms.extend(&self.k_b);
        ms.extend(&self.v_b);
        ms
    }

    /// `Step::LatentProject`: the queries of the `rows` rows of `xb` (`attn_q`, or `attn_q_b ·
    /// rms_norm(attn_q_a · x)`) and their compressed KV with its RoPE part.
    pub(super) fn project(&self, xb: &[f32], rows: usize, eps: f32, s: &mut LatentScratch) {
        let Mla { kv_lora, nope, .. } = self.mla;
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        let q_width = self.heads * (nope + self.rope);
        fit(&mut s.q, rows * q_width);
        fit(&mut s.ckv, rows * (kv_lora + self.rope));
        let ckv = &mut s.ckv[..rows * (kv_lora + self.rope)];
        match &self.query {
            Query::Plain(wq) => {
                let q = &mut s.q[..rows * q_width];
                QWeight::matmul_shared(&[wq, &self.kv_a], xb, rows, &mut [q, ckv]);
            }
            Query::LowRank { a, norm, b } => {
                fit(&mut s.q_a, rows * a.rows());
                let q_a = &mut s.q_a[..rows * a.rows()];
                QWeight::matmul_shared(&[a, &self.kv_a], xb, rows, &mut [&mut *q_a, ckv]);
                rms_norm_in_place(q_a, norm, eps);
                b.matmul(q_a, rows, &mut s.q[..rows * q_width]);
            }
        }
    }

    /// `Step::Absorb`: the compressed KV RMS-normed; each row's query `q` (`heads × hd`,
    /// `hd = rope + kv_lora`), key `k` and value `v` (`hd` each) as the module says.
    pub(super) fn absorb(
        &self,
        rows: usize,
        eps: f32,
        s: &mut LatentScratch,
        q: &mut [f32],
        k: &mut [f32],
        v: &mut [f32],
    ) {
        let Mla { kv_lora, nope, .. } = self.mla;
        let (rope, heads) = (self.rope, self.heads);
        let (hd, qh) = (rope + kv_lora, nope + rope);
        let ckv_w = kv_lora + rope;
        for r in 0..rows {
            let c = &mut s.ckv[r * ckv_w..(r + 1) * ckv_w];
            let (latent, pe) = c.split_at_mut(kv_lora);
            rms_norm_in_place(latent, &self.kv_norm, eps);
            let (kr, vr) = (&mut k[r * hd..(r + 1) * hd], &mut v[r * hd..(r + 1) * hd]);
            kr[..rope].copy_from_slice(pe);
            kr[rope..].copy_from_slice(latent);
            vr[..rope].fill(0.0);
            vr[rope..].copy_from_slice(latent);
        }
        s.head_in.resize(rows * nope, 0.0);
        s.head_out.resize(rows * kv_lora, 0.0);
        for (h, k_b) in self.k_b.iter().enumerate() {
            for r in 0..rows {
                let src = &s.q[r * heads * qh + h * qh..][..qh];
                s.head_in[r * nope..(r + 1) * nope].copy_from_slice(&src[..nope]);
                q[r * heads * hd + h * hd..][..rope].copy_from_slice(&src[nope..]);
            }
            k_b.matmul(
                &s.head_in[..rows * nope],
                rows,
                &mut s.head_out[..rows * kv_lora],
            );
            for r in 0..rows {
                q[r * heads * hd + h * hd + rope..][..kv_lora]
                    .copy_from_slice(&s.head_out[r * kv_lora..(r + 1) * kv_lora]);
            }
        }
    }

    /// `Step::Expand`: each head's attention output in `attn` (`heads × hd` per row), its
    /// latent part times the head's `attn_v_b`, written back as `heads × v_head` per row.
    pub(super) fn expand(&self, attn: &mut [f32], rows: usize, s: &mut LatentScratch) {
        let Mla {
            kv_lora, v_head, ..
        } = self.mla;
        let (rope, heads) = (self.rope, self.heads);
        let hd = rope + kv_lora;
        s.head_in.resize(rows * kv_lora, 0.0);
        s.head_out.resize(rows * v_head, 0.0);
        s.out.resize(rows * heads * v_head, 0.0);
        for (h, v_b) in self.v_b.iter().enumerate() {
            for r in 0..rows {
                s.head_in[r * kv_lora..(r + 1) * kv_lora]
                    .copy_from_slice(&attn[r * heads * hd + h * hd + rope..][..kv_lora]);
            }
            v_b.matmul(
                &s.head_in[..rows * kv_lora],
                rows,
                &mut s.head_out[..rows * v_head],
            );
            for r in 0..rows {
                s.out[r * heads * v_head + h * v_head..][..v_head]
                    .copy_from_slice(&s.head_out[r * v_head..(r + 1) * v_head]);
            }
        }
        attn[..rows * heads * v_head].copy_from_slice(&s.out[..rows * heads * v_head]);
    }
}

/// The `heads` matrices (`rows × cols` each) of the 3-d tensor `name` (heads outermost), held
/// as `dtype` says.
fn head_matrices(
    src: &mut dyn TensorSource,
    name: &str,
    heads: usize,
    rows: usize,
    cols: usize,
    dtype: WeightDType,
) -> Result<Vec<QWeight>> {
    let (stored, bytes) = src.read_mapped(name, &[heads, rows, cols])?;
    let err = |e: String| ModelError::UnsupportedTensorType {
        name: name.into(),
        dtype: format!("{stored:?} ({e})"),
    };
    if dtype == WeightDType::Native && !super::quant::has_kernel(stored) {
        return Err(err("no quantized kernel; load with --dtype f32".into()));
    }
    let raw = bytes.bytes();
    let per = raw.len() / heads.max(1);
    let out = (0..heads)
        .map(|h| {
            let b = &raw[h * per..(h + 1) * per];
            match dtype {
                WeightDType::F32 => {
                    QWeight::dequantized_stored(StoredType::Ggml(stored), rows, cols, b)
                }
                WeightDType::Native => QWeight::from_bytes(stored, rows, cols, b),
            }
            .map_err(|e| err(e.to_string()))
        })
        .collect::<Result<Vec<_>>>()?;
    // Copied: the file's pages need not stay in this process's memory.
    bytes.release();
    Ok(out)
}
