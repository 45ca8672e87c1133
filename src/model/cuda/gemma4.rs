//! Gemma 4's per-layer token embeddings on the device (E2B/E4B): the model-wide projection
//! ([`DevPle`]), each layer's gate and projection ([`DevLayerEmbedding`]), their step buffers
//! ([`PleBufs`]) and the launches of the two plan steps, each the CPU's `model::gemma4` step in
//! the same order:
//!
//! - `PerLayerInputs`: the scaled embedding's projection (a matmul), times `1 / sqrt(dim)`
//!   (`scale`), RMS-normed per layer slice (`rms_norm` over `rows × n_layer` rows of `ple`),
//!   then `ple_combine` with each token's per-layer embedding, which the host looks up as it
//!   does the token embeddings;
//! - `PerLayerEmbed`: `x += rms_norm(proj · (gelu(gate · x) · input)) · w`: the gate's matmul,
//!   the layer's slice of the inputs (`copy_cols`), `gated_act` (the device's GELU, as for
//!   Gemma's feed-forward), the projection's matmul, `rms_norm` and `add_in_place`.
//!
//! Gemma 4's other steps need no module of their own (`forward.rs`: the values as the keys'
//! copy, the value norm with a weight of ones, the layer scale, attention over a shared
//! layer's KV). This module runs nothing of the plan's order.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::kernels::{ew, ActBufs, DevWeight, Gpu, MatmulPath, Result};
use super::weights::upload_weight;
use crate::model::gemma4::{LayerEmbedding, PerLayerEmbedding};

/// The model-wide per-layer embedding weights the device uses (the token table stays on the
/// host, which looks rows up).
pub(super) struct DevPle {
    proj: DevWeight,
    proj_norm: CudaSlice<f32>,
    ple: usize,
}

/// One layer's per-layer embedding weights.
pub(super) struct DevLayerEmbedding {
    gate: DevWeight,
    proj: DevWeight,
    post_norm: CudaSlice<f32>,
}

/// Uploads the model-wide projection.
pub(super) fn upload_ple(gpu: &Gpu, e: &PerLayerEmbedding, path: MatmulPath) -> Result<DevPle> {
    Ok(DevPle {
        proj: upload_weight(gpu, "per_layer_model_proj.weight", &e.proj, path)?,
        proj_norm: gpu.upload("per_layer_proj_norm", &e.proj_norm)?,
        ple: e.ple,
    })
}

/// Uploads layer `i`'s gate and projection.
pub(super) fn upload_layer_embedding(
    gpu: &Gpu,
    i: usize,
    w: &LayerEmbedding,
    path: MatmulPath,
) -> Result<DevLayerEmbedding> {
    let n = |t: &str| format!("blk.{i}.{t}");
    Ok(DevLayerEmbedding {
        gate: upload_weight(gpu, &n("inp_gate.weight"), &w.gate, path)?,
        proj: upload_weight(gpu, &n("proj.weight"), &w.proj, path)?,
        post_norm: gpu.upload("post_norm", &w.post_norm)?,
    })
}

/// Every row's tokens' per-layer embeddings (`rows × n_layer · ple`), looked up on the host.
pub(super) fn token_rows(e: &PerLayerEmbedding, tokens: &[u32]) -> Vec<f32> {
    let width = e.tokens.cols();
    let mut out = vec![0f32; tokens.len() * width];
    for (o, &t) in out.chunks_exact_mut(width).zip(tokens) {
        e.tokens.row_f32(t as usize, o);
    }
    out
}

/// The per-layer steps' buffers for a step of `rows` rows of a model of `n_layer` layers.
pub(super) struct PleBufs {
    /// The projection, then the per-layer inputs (`rows × n_layer · ple`).
    pub(super) inputs: CudaSlice<f32>,
    /// One layer's gate and input (`rows × ple`).
    gate: CudaSlice<f32>,
    input: CudaSlice<f32>,
}

impl PleBufs {
    pub(super) fn new(g: &Gpu, rows: usize, n_layer: usize, ple: usize) -> Result<PleBufs> {
        Ok(PleBufs {
            inputs: g.zeros("per-layer inputs", rows * n_layer * ple)?,
            gate: g.zeros("per-layer gate", rows * ple)?,
            input: g.zeros("per-layer input", rows * ple)?,
        })
    }
}

/// What the per-layer steps of one launch need.
pub(super) struct PleRun<'a> {
    pub(super) g: &'a Gpu,
    pub(super) act: &'a ActBufs,
    pub(super) b: &'a PleBufs,
    pub(super) e: &'a DevPle,
    /// The rows' tokens' per-layer embeddings (`rows × n_layer · ple`, uploaded with the
    /// step's inputs).
    pub(super) tokens: u64,
    pub(super) rows: usize,
    pub(super) n_layer: usize,
    pub(super) dim: usize,
    pub(super) eps: f32,
}

impl PleRun<'_> {
    fn ptr(&self, v: &CudaSlice<f32>) -> u64 {
        super::kernels::ptr(v, &self.g.stream)
    }

    /// `Step::PerLayerInputs` from the (scaled) embeddings `x`, before the first layer.
    pub(super) fn inputs(&self, x: u64) -> Result<()> {
        let (g, rows, ple) = (self.g, self.rows, self.e.ple);
        let width = self.n_layer * ple;
        let (inputs, tokens) = (self.ptr(&self.b.inputs), self.tokens);
        g.matmul_into(&self.e.proj, x, rows, inputs, self.act, None, false)?;
        g.scale(inputs, 1.0 / (self.dim as f32).sqrt(), rows * width)?;
        g.rms_norm(
            inputs,
            &self.e.proj_norm,
            inputs,
            rows * self.n_layer,
            ple,
            self.eps,
        )?;
        let (tok_scale, input_scale) = ((ple as f32).sqrt(), 1.0 / 2f32.sqrt());
        let total = rows * width;
        let t = total as i64;
        let s = &*g.stream;
        let mut lb = s.launch_builder(&g.k.ple_combine);
        lb.arg(&inputs)
            .arg(&tokens)
            .arg(&tok_scale)
            .arg(&input_scale)
            .arg(&t);
        // SAFETY: inputs and tokens hold rows × n_layer · ple floats.
        g.launched("ple_combine", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    /// `Step::PerLayerEmbed` of layer `l`: `x +=` its per-layer embedding, through `xb`.
    pub(super) fn embed(&self, w: &DevLayerEmbedding, l: usize, x: u64, xb: u64) -> Result<()> {
        let (g, rows, ple, dim) = (self.g, self.rows, self.e.ple, self.dim);
        let (gate, input) = (self.ptr(&self.b.gate), self.ptr(&self.b.input));
        let inputs = self.ptr(&self.b.inputs);
        g.matmul_into(&w.gate, x, rows, gate, self.act, None, false)?;
        g.copy_cols(
            inputs,
            self.n_layer * ple,
            l * ple,
            input,
            ple,
            0,
            ple,
            rows,
        )?;
        // GELU (`gated_act`'s 1), as the device computes Gemma's feed-forward.
        g.gated(gate, input, rows * ple, 1)?;
        g.matmul_into(&w.proj, gate, rows, xb, self.act, None, false)?;
        g.rms_norm(xb, &w.post_norm, xb, rows, dim, self.eps)?;
        g.add(x, xb, rows * dim)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::GgmlDType;

    use super::super::emulate::rms_norm;
    use super::super::emulate::tests::quantized;
    use super::super::emulate_moe::matmul;
    use crate::model::gemma4::{LayerEmbedding, PerLayerEmbedding};
    use crate::model::quant::tests::noise;

    /// `gated_act`'s GELU (act 1), f32 as the kernel writes it.
    fn gelu(v: f32) -> f32 {
        let c = 0.797_884_6_f32;
        0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
    }

    /// The two per-layer steps as `PleRun` launches them, on the host: the inputs of `x`'s
    /// rows, then layer `l`'s embedding added to `x`.
    fn emulated(
        e: &PerLayerEmbedding,
        w: &LayerEmbedding,
        l: usize,
        n_layer: usize,
        (tokens, x): (&[u32], &[f32]),
        dim: usize,
        eps: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        let (rows, ple) = (tokens.len(), e.ple);
        let width = n_layer * ple;
        let mut inputs = matmul(&e.proj, x, rows);
        let s = 1.0 / (dim as f32).sqrt();
        inputs.iter_mut().for_each(|v| *v *= s);
        rms_norm(&mut inputs, &e.proj_norm, ple, eps);
        let tok = super::token_rows(e, tokens);
        let (ts, is) = ((ple as f32).sqrt(), 1.0 / 2f32.sqrt());
        for (p, t) in inputs.iter_mut().zip(&tok) {
            *p = (*p + *t * ts) * is;
        }
        let mut gate = matmul(&w.gate, x, rows);
        for r in 0..rows {
            let input = &inputs[r * width + l * ple..][..ple];
            for (g, u) in gate[r * ple..(r + 1) * ple].iter_mut().zip(input) {
                *g = gelu(*g) * u;
            }
        }
        let mut out = matmul(&w.proj, &gate, rows);
        rms_norm(&mut out, &w.post_norm, dim, eps);
        let mut x = x.to_vec();
        for (a, b) in x.iter_mut().zip(&out) {
            *a += b;
        }
        (inputs, x)
    }

    /// The emulated per-layer steps give the CPU's `inputs` and `embed` of every layer,
    /// within f32 rounding where the device's norm (a tree of f32 sums) replaces the CPU's (f64
    /// in order) and within the CPU's f16 GELU table's rounding on the embedding; for F32 and
    /// Q8_0 weights, one row and four, each of three layers. A layer's slice read at another
    /// layer's offset, or a row's at another row's, is far outside that.
    #[test]
    fn the_emulated_per_layer_steps_equal_the_cpu() {
        let (dim, ple, n_layer, vocab, eps) = (64, 32, 3, 7, 1e-6);
        for dtype in [GgmlDType::F32, GgmlDType::Q8_0] {
            let w = |n, k, seed| quantized(Some(dtype), n, k, seed);
            let e = PerLayerEmbedding {
                tokens: w(vocab, n_layer * ple, 1),
                proj: w(n_layer * ple, dim, 2),
                proj_norm: noise(3, ple).iter().map(|v| 1.0 + v).collect(),
                ple,
            };
            let layers: Vec<LayerEmbedding> = (0..n_layer as u64)
                .map(|l| LayerEmbedding {
                    gate: w(ple, dim, 10 + l),
                    proj: w(dim, ple, 20 + l),
                    post_norm: noise(30 + l, dim).iter().map(|v| 1.0 + v).collect(),
                })
                .collect();
            for tokens in [vec![4u32], vec![0, 6, 2, 6]] {
                let rows = tokens.len();
                let x: Vec<f32> = noise(8, rows * dim).iter().map(|v| v * 3.0).collect();
                let width = n_layer * ple;
                let (mut proj, mut want_inputs) =
                    (vec![0f32; rows * width], vec![0f32; rows * width]);
                e.inputs(&tokens, &x, dim, eps, &mut proj, &mut want_inputs);
                for (l, lw) in layers.iter().enumerate() {
                    let what = format!("{dtype:?} {rows} rows, layer {l}");
                    let (inputs, got) = emulated(&e, lw, l, n_layer, (&tokens, &x), dim, eps);
                    for (i, (a, b)) in inputs.iter().zip(&want_inputs).enumerate() {
                        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{what}: input {i}");
                    }
                    let mut want = x.clone();
                    let (mut gate, mut input, mut out) = (
                        vec![0f32; rows * ple],
                        vec![0f32; rows * ple],
                        vec![0f32; rows * dim],
                    );
                    e.embed(
                        lw,
                        l,
                        n_layer,
                        &want_inputs,
                        &mut want,
                        rows,
                        eps,
                        &mut gate,
                        &mut input,
                        &mut out,
                    );
                    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 2e-2 * (1.0 + b.abs()),
                            "{what}: x {i}: {a} {b}"
                        );
                    }
                }
            }
        }
    }
}
