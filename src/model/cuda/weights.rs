//! Weight upload: each matrix in its stored format, the per-layer device tensors, the check
//! that a model fits the card, and the release of the host copies afterwards.

use cudarc::driver::CudaSlice;

use crate::model::arch::MoeConfig;
use crate::model::error::ModelError;
use crate::model::moe::Moe;
use crate::model::quant::{QWeight, Stored, WeightFormat};
use crate::model::transformer::{Ffn, GateUp, Qkv, Transformer};

use super::gemma4::DevLayerEmbedding;
use super::hybrid::{upload_shared, DevDelta, DevShared};
use super::kernels::{dev_err, matmul_path, ptr, DevWeight, Gpu, Kind, MatmulPath, Result};
use super::mla::DevLatent;
use super::repack::layout;

/// Per-layer device tensors.
pub(super) struct DevLayer {
    pub(super) attn_norm: CudaSlice<f32>,
    pub(super) qkv: Vec<DevWeight>,
    pub(super) bias: Option<[CudaSlice<f32>; 3]>,
    pub(super) qk_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub(super) wo: DevWeight,
    pub(super) post_attn_norm: Option<CudaSlice<f32>>,
    pub(super) ffn_norm: CudaSlice<f32>,
    /// The dense feed-forward block's matrices (empty and `None` in an experts' layer).
    pub(super) gate_up: Vec<DevWeight>,
    pub(super) w_down: Option<DevWeight>,
    pub(super) post_ffn_norm: Option<CudaSlice<f32>>,
    /// The attention output projection's bias (gpt-oss).
    pub(super) out_bias: Option<CudaSlice<f32>>,
    /// The biases after the attention and feed-forward pre-norms (phimoe).
    pub(super) norm_bias: Option<[CudaSlice<f32>; 2]>,
    /// Per query head, the attention sink logit (gpt-oss).
    pub(super) sinks: Option<CudaSlice<f32>>,
    /// A Mixture-of-Experts layer's router and experts.
    pub(super) moe: Option<DevMoe>,
    /// A linear-attention layer's weights beside its q|k|v and output projections.
    pub(super) delta: Option<DevDelta>,
    /// A latent-attention layer's weights beside its output projection (`qkv` empty).
    pub(super) latent: Option<DevLatent>,
    /// Gemma 4: the layer's per-layer embedding weights and its output scale.
    pub(super) ple: Option<DevLayerEmbedding>,
    pub(super) out_scale: Option<f32>,
}

/// One expert's matrices and biases on the device.
pub(super) struct DevExpert {
    pub(super) gate: DevWeight,
    pub(super) up: DevWeight,
    pub(super) down: DevWeight,
    pub(super) bias: Option<[CudaSlice<f32>; 3]>,
}

/// A Mixture-of-Experts layer on the device.
pub(super) struct DevMoe {
    pub(super) router: DevWeight,
    pub(super) router_bias: Option<CudaSlice<f32>>,
    /// DeepSeek's selection bias (`exp_probs_b`).
    pub(super) selection_bias: Option<CudaSlice<f32>>,
    pub(super) experts: Vec<DevExpert>,
    pub(super) config: MoeConfig,
    /// Gemma 4: each expert's output scale (the host's copy for the launches per expert), and
    /// the norms of the MLP beside the experts (whose matrices are the layer's `gate_up` and
    /// `w_down`).
    pub(super) down_scale: Option<Vec<f32>>,
    pub(super) beside: Option<DevBeside>,
    /// The shared expert beside the routed ones (qwen35moe).
    pub(super) shared: Option<DevShared>,
    /// The experts' matrices as address tables for one launch over every routed row, where
    /// the layer allows it ([`GroupedExperts::of`]).
    pub(super) grouped: Option<GroupedExperts>,
}

/// Each expert's gate, up and down matrix addresses, in expert order, for the grouped launches
/// (`Gpu::matmul_experts`), its gate, up and down biases' (gpt-oss), and the experts' output
/// scales (Gemma 4).
pub(super) struct GroupedExperts {
    pub(super) gate: CudaSlice<u64>,
    pub(super) up: CudaSlice<u64>,
    pub(super) down: CudaSlice<u64>,
    pub(super) bias: Option<[CudaSlice<u64>; 3]>,
    pub(super) down_scale: Option<CudaSlice<f32>>,
}

impl GroupedExperts {
    /// The tables, where every expert's gate (and up, and down) has one quantized kind, shape
    /// and repacked layout, and either every expert or none has biases; `None` otherwise
    /// (the launches stay per expert), and on the legacy path.
    fn of(
        gpu: &Gpu,
        experts: &[DevExpert],
        down_scale: Option<&[f32]>,
        path: MatmulPath,
    ) -> Result<Option<GroupedExperts>> {
        let Some(first) = experts.first() else {
            return Ok(None);
        };
        let matrices = |f: fn(&DevExpert) -> &DevWeight| experts.iter().map(f).collect::<Vec<_>>();
        let [gate, up, down] = [
            matrices(|x| &x.gate),
            matrices(|x| &x.up),
            matrices(|x| &x.down),
        ];
        let fits = [&gate, &up, &down].iter().all(|ws| groupable(ws, path))
            && experts
                .iter()
                .all(|x| x.bias.is_some() == first.bias.is_some());
        if !fits {
            return Ok(None);
        }
        let s = &gpu.stream;
        let table = |ws: &[&DevWeight]| address_table(gpu, "expert addresses", ws);
        let bias = |i: usize| -> Result<CudaSlice<u64>> {
            let at: Vec<u64> = (experts.iter())
                .map(|x| ptr(&x.bias.as_ref().expect("every expert's biases")[i], s))
                .collect();
            gpu.upload("expert bias addresses", &at)
        };
        Ok(Some(GroupedExperts {
            gate: table(&gate)?,
            up: table(&up)?,
            down: table(&down)?,
            bias: match first.bias {
                Some(_) => Some([bias(0)?, bias(1)?, bias(2)?]),
                None => None,
            },
            down_scale: down_scale
                .map(|v| gpu.upload("expert output scales", v))
                .transpose()?,
        }))
    }
}

/// Whether the matrices `ws` can be launched as one grouped matmul (`Gpu::matmul_experts`,
/// each row by its own matrix): on the integer path, all of one quantized kind, shape and
/// repacked layout.
pub(super) fn groupable(ws: &[&DevWeight], path: MatmulPath) -> bool {
    let alike = |a: &DevWeight, b: &DevWeight| {
        (a.kind, a.n, a.k, a.b_off, a.c_off) == (b.kind, b.n, b.k, b.b_off, b.c_off)
    };
    match ws.first() {
        Some(first) => {
            path == MatmulPath::Integer
                && first.kind.act().is_some()
                && ws.iter().all(|w| alike(w, first))
        }
        None => false,
    }
}

/// The device addresses of the matrices `ws`, in order, uploaded as the table a grouped
/// matmul reads (`what` names it in errors).
pub(super) fn address_table(gpu: &Gpu, what: &str, ws: &[&DevWeight]) -> Result<CudaSlice<u64>> {
    let at: Vec<u64> = ws.iter().map(|w| ptr(&w.buf, &gpu.stream)).collect();
    gpu.upload(what, &at)
}

/// The norms of the MLP beside Gemma 4's experts.
pub(super) struct DevBeside {
    /// `post_ffw_norm_1`, `pre_ffw_norm_2`, `post_ffw_norm_2`.
    pub(super) post_norm: CudaSlice<f32>,
    pub(super) experts_norm: CudaSlice<f32>,
    pub(super) experts_post_norm: CudaSlice<f32>,
    /// `ffn_gate_inp.scale`.
    pub(super) router_scale: CudaSlice<f32>,
}

/// Uploads layer `i`'s Mixture-of-Experts block.
pub(super) fn upload_moe(gpu: &Gpu, i: usize, m: &Moe, path: MatmulPath) -> Result<DevMoe> {
    let n = |s: &str| format!("blk.{i}.{s}");
    let experts = (m.experts.iter().enumerate())
        .map(|(e, x)| {
            let w = |s: &str, w: &QWeight| upload_weight(gpu, &n(&format!("{s}[{e}]")), w, path);
            Ok(DevExpert {
                gate: w("ffn_gate_exps.weight", &x.gate)?,
                up: w("ffn_up_exps.weight", &x.up)?,
                down: w("ffn_down_exps.weight", &x.down)?,
                bias: match &x.bias {
                    Some([a, b, c]) => Some([
                        gpu.upload("expert bias", a)?,
                        gpu.upload("expert bias", b)?,
                        gpu.upload("expert bias", c)?,
                    ]),
                    None => None,
                },
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let grouped = GroupedExperts::of(gpu, &experts, m.down_scale.as_deref(), path)?;
    Ok(DevMoe {
        grouped,
        router: upload_weight(gpu, &n("ffn_gate_inp.weight"), &m.router, path)?,
        router_bias: m
            .router_bias
            .as_deref()
            .map(|b| gpu.upload("router bias", b))
            .transpose()?,
        selection_bias: m
            .selection_bias
            .as_deref()
            .map(|b| gpu.upload("selection bias", b))
            .transpose()?,
        experts,
        down_scale: m.down_scale.clone(),
        beside: m
            .beside
            .as_deref()
            .map(|b| -> Result<DevBeside> {
                Ok(DevBeside {
                    post_norm: gpu.upload("post_ffw_norm_1", &b.post_norm)?,
                    experts_norm: gpu.upload("pre_ffw_norm_2", &b.experts_norm)?,
                    experts_post_norm: gpu.upload("post_ffw_norm_2", &b.experts_post_norm)?,
                    router_scale: gpu.upload("ffn_gate_inp.scale", &b.router_scale)?,
                })
            })
            .transpose()?,
        config: m.config,
        shared: m
            .shared
            .as_deref()
            .map(|s| upload_shared(gpu, i, s, path))
            .transpose()?,
    })
}

/// The kernel that reads a stored format (every format has one: nothing is widened).
pub(super) fn kind_of(f: WeightFormat) -> Kind {
    match f {
        WeightFormat::F32 => Kind::F32,
        WeightFormat::F16 => Kind::F16,
        WeightFormat::BF16 => Kind::BF16,
        WeightFormat::Q8_0 => Kind::Q8_0,
        WeightFormat::Q4_0 => Kind::Q4_0,
        WeightFormat::Q4_1 => Kind::Q4_1,
        WeightFormat::Q4K => Kind::Q4K,
        WeightFormat::Q6K => Kind::Q6K,
        WeightFormat::Q5_0 => Kind::Q5_0,
        WeightFormat::Q5_1 => Kind::Q5_1,
        WeightFormat::Q5K => Kind::Q5K,
        WeightFormat::Mxfp4 => Kind::Mxfp4,
    }
}

/// Uploads one matrix for the kernels of `path` (the forward pass: this process's
/// [`matmul_path`]): quantized types repacked for the integer kernels (`repack.rs`), or as
/// stored for the legacy ones; float types as stored.
pub(super) fn upload_weight(
    gpu: &Gpu,
    name: &str,
    w: &QWeight,
    path: MatmulPath,
) -> Result<DevWeight> {
    let (n, k) = (w.rows(), w.cols());
    let legacy = path == MatmulPath::Legacy;
    if legacy && !k.is_multiple_of(8) {
        return Err(ModelError::Device(format!(
            "cuda: tensor `{name}`: {k} columns (the GPU kernels need a multiple of 8)"
        )));
    }
    let bytes = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let raw = match w.stored() {
        Stored::Blocks(b) => b,
        Stored::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Stored::F16(v) | Stored::BF16(v) => bytes(v),
    };
    if let (false, Some(l)) = (legacy, layout(w.format())) {
        let r = l.repack(&raw, n, k);
        return Ok(DevWeight {
            kind: kind_of(w.format()),
            n,
            k,
            buf: gpu.upload(name, &r.bytes)?,
            b_off: r.b_off,
            c_off: r.c_off,
        });
    }
    Ok(DevWeight {
        kind: kind_of(w.format()),
        n,
        k,
        buf: gpu.upload(name, &raw)?,
        b_off: 0,
        c_off: 0,
    })
}

/// Bytes a matrix takes on the device for the kernels of `path`: its stored blocks, or their
/// repacked layout.
pub(super) fn device_bytes(w: &QWeight, path: MatmulPath) -> usize {
    let (n, k) = (w.rows(), w.cols());
    if let (MatmulPath::Integer, Some(l)) = (path, layout(w.format())) {
        return l.offsets(n, k).2;
    }
    let (elems, bytes) = match w.format() {
        WeightFormat::F32 => (1, 4),
        WeightFormat::F16 | WeightFormat::BF16 => (1, 2),
        WeightFormat::Q8_0 => (32, 34),
        WeightFormat::Q4_0 => (32, 18),
        WeightFormat::Q4_1 => (32, 20),
        WeightFormat::Q5_0 => (32, 22),
        WeightFormat::Q5_1 => (32, 24),
        WeightFormat::Q4K => (256, 144),
        WeightFormat::Q5K => (256, 176),
        WeightFormat::Q6K => (256, 210),
        WeightFormat::Mxfp4 => (32, 17),
    };
    n * k.div_ceil(elems) * bytes
}

pub(super) fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Refuses, in one line with the sizes, a model whose weights (plus 1 GiB for the step
/// buffers and a minimal KV pool) do not fit the memory free on the device.
pub(super) fn check_fits(gpu: &Gpu, ordinal: usize, name: &str, model: &Transformer) -> Result<()> {
    let path = matmul_path();
    let mut need = match &model.output {
        Some(w) => device_bytes(w, path),
        None => device_bytes(&model.embedding, path),
    };
    for l in &model.layers {
        let mats = l.matrices();
        need += mats
            .into_iter()
            .map(|w| device_bytes(w, path))
            .sum::<usize>();
    }
    let (free, total) = gpu
        .ctx
        .mem_get_info()
        .map_err(|e| dev_err("reading free memory", e))?;
    if need + (1 << 30) > free {
        return Err(ModelError::Device(format!(
            "cuda:{ordinal} ({name}): out of memory: the weights need {:.2} GiB plus 1 GiB for \
             the step buffers and KV cache, and {:.2} GiB of the card's {:.2} GiB is free",
            gib(need),
            gib(free),
            gib(total)
        )));
    }
    Ok(())
}

/// Drops the host copy of the matrices that [`CudaModel::load`] uploaded (the GPU forward pass
/// reads only the configuration, the embedding rows, the RoPE tables and the layers' window
/// flags on the host): each becomes an empty weight, so the host keeps the embedding alone.
pub(crate) fn release_host_matrices(model: &mut Transformer) {
    let empty = || QWeight::from_f32(0, 0, Vec::new());
    for l in &mut model.layers {
        l.qkv = Qkv::Fused(empty());
        l.wo = empty();
        l.ffn = Ffn::Dense {
            gate_up: GateUp::Fused(empty()),
            down: empty(),
        };
    }
    if model.output.is_some() {
        model.output = Some(empty());
    }
}
