//! Multi-head Latent Attention on the device (DeepSeek-V2/V3, GLM-4.7-Flash, Mistral 4): a
//! layer's latent weights ([`DevLatent`]), the step buffers of its three plan steps
//! ([`MlaBufs`]), and their launches, each the CPU's `model::mla` step in the same order:
//!
//! - `LatentProject`: the queries (`attn_q`, or `attn_q_b · rms_norm(attn_q_a · x)`) and the
//!   compressed KV with its RoPE part (`attn_kv_a_mqa`), the existing matmuls and norm;
//! - `Absorb`: the latent RMS-normed, `mla_kv` writing each row's key `[k_pe | latent]` and
//!   value `[0 | latent]`, then per head its RoPE part copied into the query and its no-RoPE
//!   part times the head's `attn_k_b` (`copy_cols` out, the matmul, `copy_cols` back);
//! - `Expand`: per head its output's latent part times `attn_v_b`, gathered into the rows the
//!   output projection reads.
//!
//! A step of at most [`GROUPED_HEAD_ROWS`] rows (decode) takes every head's matrix in one
//! launch (`Gpu::matmul_experts`, each of the `rows × heads` head rows by its own head's
//! matrix, with one `copy_cols` before and after over every head): the launches of one head,
//! once, where there were as many per head. Each head row gets the bits of the launch per head.
//!
//! The per-head matrices are ordinary device weights, so their products are the integer
//! kernels' (the CPU's bits, as every matmul); the norms are the device's `rms_norm`.
//! Attention in between is the ordinary pass over one KV head of `kv_lora + rope` dimensions
//! (`attn_partial_wide` past 256). This module runs nothing of the plan's order (`forward.rs`
//! does).

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::kernels::{ew, ptr, ActBufs, DevWeight, Gpu, MatmulPath, Result};
use super::weights::{address_table, groupable, upload_weight};
use crate::model::arch::Mla;
use crate::model::mla::{Latent, Query};

/// The queries' projection on the device.
pub(super) enum DevQuery {
    Plain(DevWeight),
    LowRank {
        a: DevWeight,
        norm: CudaSlice<f32>,
        b: DevWeight,
    },
}

/// A latent-attention layer's weights beside its output projection.
pub(super) struct DevLatent {
    query: DevQuery,
    kv_a: DevWeight,
    kv_norm: CudaSlice<f32>,
    /// Per head, `kv_lora × nope` and `v_head × kv_lora`.
    k_b: Vec<DevWeight>,
    v_b: Vec<DevWeight>,
    /// The heads' `k_b` and `v_b` addresses for the launches over every head, where each
    /// set is of one quantized kind and layout ([`groupable`]).
    grouped: Option<[CudaSlice<u64>; 2]>,
    mla: Mla,
    heads: usize,
    rope: usize,
}

impl DevLatent {
    /// Drops the address tables of the launch over every head (tests); whether it had them.
    #[cfg(any(test, feature = "testkit"))]
    pub(super) fn drop_grouped(&mut self) -> bool {
        self.grouped.take().is_some()
    }
}

/// At most this many rows take one launch over every head's matrix; more (prefill) take a
/// launch per head, whose rows then share its matrix (and the tensor cores).
pub(super) const GROUPED_HEAD_ROWS: usize = 64;

/// The head rows the launches over every head take for a step buffer of `rows` rows.
pub(super) fn grouped_head_rows(rows: usize, heads: usize) -> usize {
    rows.min(GROUPED_HEAD_ROWS) * heads
}

/// Uploads layer `i`'s latent-attention weights.
pub(super) fn upload_latent(
    gpu: &Gpu,
    i: usize,
    l: &Latent,
    path: MatmulPath,
) -> Result<DevLatent> {
    let n = |t: &str| format!("blk.{i}.{t}");
    let query = match &l.query {
        Query::Plain(q) => DevQuery::Plain(upload_weight(gpu, &n("attn_q.weight"), q, path)?),
        Query::LowRank { a, norm, b } => DevQuery::LowRank {
            a: upload_weight(gpu, &n("attn_q_a.weight"), a, path)?,
            norm: gpu.upload("attn_q_a_norm", norm)?,
            b: upload_weight(gpu, &n("attn_q_b.weight"), b, path)?,
        },
    };
    let heads = |name: &str, ws: &[crate::model::quant::QWeight]| -> Result<Vec<DevWeight>> {
        (ws.iter().enumerate())
            .map(|(h, w)| upload_weight(gpu, &n(&format!("{name}[{h}]")), w, path))
            .collect()
    };
    let (k_b, v_b) = (
        heads("attn_k_b.weight", &l.k_b)?,
        heads("attn_v_b.weight", &l.v_b)?,
    );
    let (kr, vr): (Vec<&DevWeight>, Vec<&DevWeight>) = (k_b.iter().collect(), v_b.iter().collect());
    let grouped = match groupable(&kr, path) && groupable(&vr, path) {
        true => Some([
            address_table(gpu, "attn_k_b addresses", &kr)?,
            address_table(gpu, "attn_v_b addresses", &vr)?,
        ]),
        false => None,
    };
    Ok(DevLatent {
        query,
        kv_a: upload_weight(gpu, &n("attn_kv_a_mqa.weight"), &l.kv_a, path)?,
        kv_norm: gpu.upload("attn_kv_a_norm", &l.kv_norm)?,
        k_b,
        v_b,
        grouped,
        mla: l.mla,
        heads: l.heads,
        rope: l.rope,
    })
}

/// The latent steps' buffers for a step of `rows` rows.
pub(super) struct MlaBufs {
    /// The low-rank queries (`rows × q_lora`).
    q_a: CudaSlice<f32>,
    /// The full queries, `[q_nope | q_pe]` per head.
    q_full: CudaSlice<f32>,
    /// The compressed KV and its RoPE part (`rows × (kv_lora + rope)`).
    ckv: CudaSlice<f32>,
    /// The latent alone, then RMS-normed (`rows × kv_lora`).
    latent: CudaSlice<f32>,
    /// The heads' inputs and outputs of their matrices: one head's rows (a launch per head),
    /// or every head's (`rows × heads`, up to [`GROUPED_HEAD_ROWS`] rows).
    head_in: CudaSlice<f32>,
    head_out: CudaSlice<f32>,
    /// Each head row's head (`p % heads`), the grouped launches' matrix index.
    head_of: CudaSlice<i32>,
    /// The values, `heads × v_head` per row.
    values: CudaSlice<f32>,
}

impl MlaBufs {
    /// Buffers for `rows` rows of a model of `heads` query heads whose RoPE parts are
    /// `rope` wide.
    pub(super) fn new(g: &Gpu, rows: usize, m: Mla, heads: usize, rope: usize) -> Result<MlaBufs> {
        let head = m.nope.max(m.kv_lora).max(m.v_head);
        let head_rows = grouped_head_rows(rows, heads).max(rows);
        let head_of: Vec<i32> = (0..grouped_head_rows(rows, heads))
            .map(|p| (p % heads) as i32)
            .collect();
        Ok(MlaBufs {
            q_a: g.zeros("low-rank queries", (rows * m.q_lora).max(1))?,
            q_full: g.zeros("latent queries", rows * heads * (m.nope + rope))?,
            ckv: g.zeros("compressed KV", rows * (m.kv_lora + rope))?,
            latent: g.zeros("latent", rows * m.kv_lora)?,
            head_in: g.zeros("head input", head_rows * head)?,
            head_out: g.zeros("head output", head_rows * head)?,
            head_of: g.upload("head rows' heads", &head_of)?,
            values: g.zeros("latent values", rows * heads * m.v_head)?,
        })
    }
}

/// What the latent steps of one launch read and write: the step's rows `xb`, queries `q`,
/// keys `k`, values `v` and attention output `attn` (device addresses), its row count, the
/// activation scratch and the norms' epsilon.
pub(super) struct LatentRun<'a> {
    pub(super) g: &'a Gpu,
    pub(super) act: &'a ActBufs,
    pub(super) b: &'a MlaBufs,
    pub(super) rows: usize,
    pub(super) eps: f32,
}

impl LatentRun<'_> {
    fn ptr(&self, v: &CudaSlice<f32>) -> u64 {
        super::kernels::ptr(v, &self.g.stream)
    }

    /// The address table of `d`'s `k_b` (`which` 0) or `v_b` (1) and the head rows' heads,
    /// where this step takes the launches over every head.
    fn grouped(&self, d: &DevLatent, which: usize) -> Option<(u64, u64)> {
        let tabs = d.grouped.as_ref()?;
        let s = &self.g.stream;
        (self.rows <= GROUPED_HEAD_ROWS).then(|| (ptr(&tabs[which], s), ptr(&self.b.head_of, s)))
    }

    /// `Step::LatentProject` of the rows `xb`.
    pub(super) fn project(&self, d: &DevLatent, xb: u64) -> Result<()> {
        let (g, b, rows) = (self.g, self.b, self.rows);
        let (q_full, ckv) = (self.ptr(&b.q_full), self.ptr(&b.ckv));
        match &d.query {
            DevQuery::Plain(wq) => {
                let q = g.matmul_into(wq, xb, rows, q_full, self.act, None, false)?;
                g.matmul_into(&d.kv_a, xb, rows, ckv, self.act, q, false)?;
            }
            DevQuery::LowRank { a, norm, b: wb } => {
                let q_a = self.ptr(&b.q_a);
                let q = g.matmul_into(a, xb, rows, q_a, self.act, None, false)?;
                g.matmul_into(&d.kv_a, xb, rows, ckv, self.act, q, false)?;
                g.rms_norm(q_a, norm, q_a, rows, d.mla.q_lora, self.eps)?;
                g.matmul_into(wb, q_a, rows, q_full, self.act, None, false)?;
            }
        }
        Ok(())
    }

    /// `Step::Absorb`: the keys `k` and values `v` from the normed latent, the queries `q`
    /// (`heads × (rope + kv_lora)` per row) from the full queries.
    pub(super) fn absorb(&self, d: &DevLatent, q: u64, k: u64, v: u64) -> Result<()> {
        let (g, b, rows) = (self.g, self.b, self.rows);
        let Mla { kv_lora, nope, .. } = d.mla;
        let (rope, heads) = (d.rope, d.heads);
        let (hd, qh, ckv_w) = (rope + kv_lora, nope + rope, kv_lora + rope);
        let (ckv, latent) = (self.ptr(&b.ckv), self.ptr(&b.latent));
        let (q_full, head_in, head_out) = (
            self.ptr(&b.q_full),
            self.ptr(&b.head_in),
            self.ptr(&b.head_out),
        );
        g.copy_cols(ckv, ckv_w, 0, latent, kv_lora, 0, kv_lora, rows)?;
        g.rms_norm(latent, &d.kv_norm, latent, rows, kv_lora, self.eps)?;
        g.mla_kv(latent, ckv, kv_lora, rope, k, v, rows)?;
        if let Some((k_tab, head_of)) = self.grouped(d, 0) {
            // The `rows × heads` head rows at once: `q_full` is `hr` rows of `qh`, `q` of
            // `hd`.
            let hr = rows * heads;
            g.copy_cols(q_full, qh, nope, q, hd, 0, rope, hr)?;
            g.copy_cols(q_full, qh, 0, head_in, nope, 0, nope, hr)?;
            let tab = (k_tab, head_of);
            g.matmul_experts(&d.k_b[0], tab, head_in, hr, head_out, self.act, None)?;
            return g.copy_cols(head_out, kv_lora, 0, q, hd, rope, kv_lora, hr);
        }
        let q_w = heads * hd;
        for (h, k_b) in d.k_b.iter().enumerate() {
            g.copy_cols(
                q_full,
                heads * qh,
                h * qh + nope,
                q,
                q_w,
                h * hd,
                rope,
                rows,
            )?;
            g.copy_cols(q_full, heads * qh, h * qh, head_in, nope, 0, nope, rows)?;
            g.matmul_into(k_b, head_in, rows, head_out, self.act, None, false)?;
            g.copy_cols(head_out, kv_lora, 0, q, q_w, h * hd + rope, kv_lora, rows)?;
        }
        Ok(())
    }

    /// `Step::Expand`: each head's output in `attn` (`heads × (rope + kv_lora)` per row), its
    /// latent part times the head's `attn_v_b`, written back to `attn` as `heads × v_head`
    /// per row.
    pub(super) fn expand(&self, d: &DevLatent, attn: u64) -> Result<()> {
        let (g, b, rows) = (self.g, self.b, self.rows);
        let Mla {
            kv_lora, v_head, ..
        } = d.mla;
        let (rope, heads) = (d.rope, d.heads);
        let hd = rope + kv_lora;
        let (head_in, head_out, values) = (
            self.ptr(&b.head_in),
            self.ptr(&b.head_out),
            self.ptr(&b.values),
        );
        let out_w = heads * v_head;
        if let Some((v_tab, head_of)) = self.grouped(d, 1) {
            // `attn` is `hr` rows of `hd`, `values` `hr` rows of `v_head`.
            let hr = rows * heads;
            g.copy_cols(attn, hd, rope, head_in, kv_lora, 0, kv_lora, hr)?;
            let tab = (v_tab, head_of);
            g.matmul_experts(&d.v_b[0], tab, head_in, hr, values, self.act, None)?;
            return g.copy_cols(values, out_w, 0, attn, out_w, 0, out_w, rows);
        }
        for (h, v_b) in d.v_b.iter().enumerate() {
            g.copy_cols(
                attn,
                heads * hd,
                h * hd + rope,
                head_in,
                kv_lora,
                0,
                kv_lora,
                rows,
            )?;
            g.matmul_into(v_b, head_in, rows, head_out, self.act, None, false)?;
            g.copy_cols(head_out, v_head, 0, values, out_w, h * v_head, v_head, rows)?;
        }
        g.copy_cols(values, out_w, 0, attn, out_w, 0, out_w, rows)
    }
}

impl Gpu {
    /// `copy_cols`: `w` columns of each of `rows` rows, from column `src_off` of rows
    /// `src_w` wide to column `dst_off` of rows `dst_w` wide.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_cols(
        &self,
        src: u64,
        src_w: usize,
        src_off: usize,
        dst: u64,
        dst_w: usize,
        dst_off: usize,
        w: usize,
        rows: usize,
    ) -> Result<()> {
        let s = &*self.stream;
        let [sw, so, dw, dof, wi] = [src_w, src_off, dst_w, dst_off, w].map(|v| v as i32);
        let total = (rows * w) as i64;
        let mut lb = s.launch_builder(&self.k.copy_cols);
        lb.arg(&src)
            .arg(&sw)
            .arg(&so)
            .arg(&dst)
            .arg(&dw)
            .arg(&dof)
            .arg(&wi)
            .arg(&total);
        // SAFETY: src holds rows × src_w floats and dst rows × dst_w, the offsets plus w
        // within them (the callers' widths).
        self.launched("copy_cols", unsafe { lb.launch(ew(rows * w)) })?;
        Ok(())
    }

    /// `mla_kv`: each of `rows` rows' key and value from its normed latent and the RoPE
    /// part in `ckv`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mla_kv(
        &self,
        latent: u64,
        ckv: u64,
        kv_lora: usize,
        rope: usize,
        k: u64,
        v: u64,
        rows: usize,
    ) -> Result<()> {
        let s = &*self.stream;
        let (kl, r) = (kv_lora as i32, rope as i32);
        let total = rows * (kv_lora + rope);
        let t = total as i64;
        let mut lb = s.launch_builder(&self.k.mla_kv);
        lb.arg(&latent)
            .arg(&ckv)
            .arg(&kl)
            .arg(&r)
            .arg(&k)
            .arg(&v)
            .arg(&t);
        // SAFETY: latent holds rows × kv_lora floats, ckv, k and v rows × (kv_lora + rope).
        self.launched("mla_kv", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    // Index loops as in the CUDA source, so that the two read side by side.
    #![allow(clippy::needless_range_loop)]

    use candle_core::quantized::GgmlDType;

    use super::super::emulate::rms_norm;
    use super::super::emulate::tests::{bits, quantized};
    use super::super::emulate_moe::{matmul, matmul_experts};
    use crate::model::arch::Mla;
    use crate::model::mla::{Latent, LatentScratch, Query};
    use crate::model::quant::tests::noise;
    use crate::model::quant::QWeight;

    /// `copy_cols` over its grid.
    #[allow(clippy::too_many_arguments)]
    fn copy_cols(
        src: &[f32],
        src_w: usize,
        src_off: usize,
        dst: &mut [f32],
        dst_w: usize,
        dst_off: usize,
        w: usize,
        rows: usize,
    ) {
        for i in 0..rows * w {
            let (r, c) = (i / w, i % w);
            dst[r * dst_w + dst_off + c] = src[r * src_w + src_off + c];
        }
    }

    /// `mla_kv` over its grid.
    fn mla_kv(
        latent: &[f32],
        ckv: &[f32],
        kv_lora: usize,
        rope: usize,
        k: &mut [f32],
        v: &mut [f32],
    ) {
        let hd = kv_lora + rope;
        for i in 0..k.len() {
            let (r, c) = (i / hd, i % hd);
            if c < rope {
                k[i] = ckv[r * hd + kv_lora + c];
                v[i] = 0.0;
            } else {
                k[i] = latent[r * kv_lora + c - rope];
                v[i] = k[i];
            }
        }
    }

    /// The three latent steps as `LatentRun` launches them, on the host: the queries `q`,
    /// keys and values of `xb`'s rows, then `attn` expanded; the heads' matrices a launch per
    /// head, or with `grouped` one launch over every head (`matmul_experts`).
    fn emulated(
        d: &Latent,
        xb: &[f32],
        attn: &[f32],
        rows: usize,
        eps: f32,
        grouped: bool,
    ) -> [Vec<f32>; 4] {
        let Mla {
            q_lora,
            kv_lora,
            nope,
            v_head,
        } = d.mla;
        let (rope, heads) = (d.rope, d.heads);
        let (hd, qh, ckv_w) = (rope + kv_lora, nope + rope, kv_lora + rope);
        // LatentProject.
        let q_full = match &d.query {
            Query::Plain(wq) => matmul(wq, xb, rows),
            Query::LowRank { a, norm, b } => {
                let mut q_a = matmul(a, xb, rows);
                rms_norm(&mut q_a, norm, q_lora, eps);
                matmul(b, &q_a, rows)
            }
        };
        let ckv = matmul(&d.kv_a, xb, rows);
        // Absorb.
        let mut latent = vec![f32::NAN; rows * kv_lora];
        copy_cols(&ckv, ckv_w, 0, &mut latent, kv_lora, 0, kv_lora, rows);
        rms_norm(&mut latent, &d.kv_norm, kv_lora, eps);
        let (mut k, mut v) = (vec![f32::NAN; rows * hd], vec![f32::NAN; rows * hd]);
        mla_kv(&latent, &ckv, kv_lora, rope, &mut k, &mut v);
        let q_w = heads * hd;
        let mut q = vec![f32::NAN; rows * q_w];
        let (hr, out_w) = (rows * heads, heads * v_head);
        let head_of: Vec<i32> = (0..hr).map(|p| (p % heads) as i32).collect();
        if grouped {
            let mut head_in = vec![f32::NAN; hr * nope];
            copy_cols(&q_full, qh, nope, &mut q, hd, 0, rope, hr);
            copy_cols(&q_full, qh, 0, &mut head_in, nope, 0, nope, hr);
            let k_b: Vec<&QWeight> = d.k_b.iter().collect();
            let head_out = matmul_experts(&k_b, &head_of, &head_in, hr);
            copy_cols(&head_out, kv_lora, 0, &mut q, hd, rope, kv_lora, hr);
            let mut head_in = vec![f32::NAN; hr * kv_lora];
            copy_cols(attn, hd, rope, &mut head_in, kv_lora, 0, kv_lora, hr);
            let v_b: Vec<&QWeight> = d.v_b.iter().collect();
            let values = matmul_experts(&v_b, &head_of, &head_in, hr);
            assert_eq!(values.len(), rows * out_w);
            return [q, k, v, values];
        }
        let mut head_in = vec![f32::NAN; rows * nope];
        for (h, k_b) in d.k_b.iter().enumerate() {
            copy_cols(
                &q_full,
                heads * qh,
                h * qh + nope,
                &mut q,
                q_w,
                h * hd,
                rope,
                rows,
            );
            copy_cols(
                &q_full,
                heads * qh,
                h * qh,
                &mut head_in,
                nope,
                0,
                nope,
                rows,
            );
            let head_out = matmul(k_b, &head_in, rows);
            copy_cols(
                &head_out,
                kv_lora,
                0,
                &mut q,
                q_w,
                h * hd + rope,
                kv_lora,
                rows,
            );
        }
        // Expand.
        let mut values = vec![f32::NAN; rows * out_w];
        let mut head_in = vec![f32::NAN; rows * kv_lora];
        for (h, v_b) in d.v_b.iter().enumerate() {
            copy_cols(
                attn,
                heads * hd,
                h * hd + rope,
                &mut head_in,
                kv_lora,
                0,
                kv_lora,
                rows,
            );
            let head_out = matmul(v_b, &head_in, rows);
            copy_cols(
                &head_out,
                v_head,
                0,
                &mut values,
                out_w,
                h * v_head,
                v_head,
                rows,
            );
        }
        [q, k, v, values]
    }

    /// The emulated latent steps give the CPU's `Latent::project`, `absorb` and `expand`:
    /// the same bits wherever no norm is on the path (the queries of a plain `attn_q`, every
    /// key's RoPE part, every value's zeros, the expanded values), within f32 rounding where
    /// the device's norm (a tree of f32 sums) replaces the CPU's (f64 in order); for a plain
    /// and a low-rank query projection, F32, Q8_0 and Q4_1 weights, one row and five. A head
    /// or column out of place would be far outside that tolerance. The quantized heads'
    /// matrices in one launch over every head give the bits of a launch per head.
    #[test]
    fn the_emulated_latent_steps_equal_the_cpu() {
        let (dim, heads, rope, eps) = (64, 3, 32, 1e-6);
        let mla = |q_lora| Mla {
            q_lora,
            kv_lora: 64,
            nope: 32,
            v_head: 32,
        };
        for (dtype, q_lora) in [
            (GgmlDType::F32, 0),
            (GgmlDType::Q8_0, 0),
            (GgmlDType::Q8_0, 64),
            (GgmlDType::Q4_1, 64),
        ] {
            let m = mla(q_lora);
            let w = |n, k, seed| quantized(Some(dtype), n, k, seed);
            let q_width = heads * (m.nope + rope);
            let d = Latent {
                query: match q_lora {
                    0 => Query::Plain(w(q_width, dim, 1)),
                    r => Query::LowRank {
                        a: w(r, dim, 2),
                        norm: noise(3, r).iter().map(|v| 1.0 + v).collect(),
                        b: w(q_width, r, 4),
                    },
                },
                kv_a: w(m.kv_lora + rope, dim, 5),
                kv_norm: noise(6, m.kv_lora).iter().map(|v| 1.0 + v).collect(),
                k_b: (0..heads as u64)
                    .map(|h| w(m.kv_lora, m.nope, 10 + h))
                    .collect(),
                v_b: (0..heads as u64)
                    .map(|h| w(m.v_head, m.kv_lora, 20 + h))
                    .collect(),
                mla: m,
                heads,
                rope,
            };
            let hd = rope + m.kv_lora;
            for rows in [1, 5] {
                let what = format!("{dtype:?} q_lora {q_lora}, {rows} rows");
                let x: Vec<f32> = noise(7, rows * dim).iter().map(|v| v * 2.0).collect();
                let attn = noise(8, rows * heads * hd);
                let [q, k, v, values] = emulated(&d, &x, &attn, rows, eps, false);
                // Every head's matrix in one launch (quantized heads): the per-head bits.
                if dtype != GgmlDType::F32 {
                    let grouped = emulated(&d, &x, &attn, rows, eps, true);
                    for (part, (a, b)) in ["q", "k", "v", "values"]
                        .iter()
                        .zip(grouped.iter().zip([&q, &k, &v, &values]))
                    {
                        assert_eq!(bits(a), bits(b), "{what}: {part}, over every head");
                    }
                }

                let mut s = LatentScratch::default();
                let (mut cq, mut ck, mut cv) = (
                    vec![f32::NAN; rows * heads * hd],
                    vec![f32::NAN; rows * hd],
                    vec![f32::NAN; rows * hd],
                );
                d.project(&x, rows, eps, &mut s);
                d.absorb(rows, eps, &mut s, &mut cq, &mut ck, &mut cv);
                let mut cattn = attn.clone();
                d.expand(&mut cattn, rows, &mut s);
                let cvalues = &cattn[..rows * heads * m.v_head];

                assert_eq!(bits(&values), bits(cvalues), "{what}: expanded values");
                let close = |a: &[f32], b: &[f32], part: &str| {
                    assert_eq!(a.len(), b.len());
                    for (i, (x, y)) in a.iter().zip(b).enumerate() {
                        let tol = 1e-5 * (1.0 + y.abs());
                        assert!((x - y).abs() <= tol, "{what}: {part}[{i}] {x} vs {y}");
                    }
                };
                for r in 0..rows {
                    let (kr, ckr) = (&k[r * hd..(r + 1) * hd], &ck[r * hd..(r + 1) * hd]);
                    let (vr, cvr) = (&v[r * hd..(r + 1) * hd], &cv[r * hd..(r + 1) * hd]);
                    assert_eq!(bits(&kr[..rope]), bits(&ckr[..rope]), "{what}: k_pe");
                    assert_eq!(
                        bits(&vr[..rope]),
                        vec![0; rope],
                        "{what}: the value's zeros"
                    );
                    close(&kr[rope..], &ckr[rope..], "k latent");
                    assert_eq!(
                        bits(&vr[rope..]),
                        bits(&kr[rope..]),
                        "{what}: v = k's latent"
                    );
                    close(&cvr[rope..], &ckr[rope..], "CPU v");
                }
                match q_lora {
                    0 => assert_eq!(bits(&q), bits(&cq), "{what}: queries"),
                    _ => close(&q, &cq, "q"),
                }
            }
        }
    }
}
