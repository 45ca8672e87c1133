//! The model on a device and its packed forward pass (one step): the launches of the model's
//! plan as [`Lowering`] lists them, each matched to the plan step it covers; the layer
//! sequence itself is written only in `model::plan`.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::devices::open_gpu;
use super::gemma4::{token_rows, upload_layer_embedding, upload_ple, DevPle, PleBufs, PleRun};
use super::hybrid::{upload_delta, HybridBufs, SeqArgs};
use super::inputs::{Region, StepInputs, Values, REGIONS};
use super::kernels::DevWeight;
use super::kernels::{
    at_launch, attn_chunks, dev_err, ew, matmul_path, ptr, step_err, sync_each_launch, ActBufs,
    AttnArgs, Gpu, MatmulPath, Result, RopeKvArgs, MT_BM,
};
use super::mla::{grouped_head_rows, upload_latent, LatentRun, MlaBufs};
use super::pool::{new_pool, KvPool};
use super::weights::{check_fits, upload_moe, upload_weight, DevLayer, DevMoe};
use crate::model::arch::{Activation, Gating, ModelConfig};
use crate::model::deltanet::Hybrid;
use crate::model::device::DeviceSpec;
use crate::model::error::ModelError;
use crate::model::gemma4::LayerDims;
use crate::model::kv::{KvSeq, Logits, SeqStep};
use crate::model::lowering::{covered, target_of, ActBlocks, Kernel, Launch, Lowering, Target};
#[cfg(any(test, feature = "testkit"))]
use crate::model::plan::trace;
use crate::model::plan::{Block, Matrix, Place, RopeTable, Step};
use crate::model::quant::QWeight;
use crate::model::transformer::{Ffn, GateUp, Qkv, Transformer};

/// Device buffers of one step, grown to the largest step seen.
#[derive(Default)]
struct Buffers {
    rows: usize,
    chunks: usize,
    /// Bumped whenever `fit` allocates the step buffers anew (a captured graph holds the old
    /// addresses of those the graph key does not list: the MoE buffers).
    generation: u64,
    x: Option<CudaSlice<f32>>,
    xb: Option<CudaSlice<f32>>,
    q: Option<CudaSlice<f32>>,
    k: Option<CudaSlice<f32>>,
    v: Option<CudaSlice<f32>>,
    attn: Option<CudaSlice<f32>>,
    gate: Option<CudaSlice<f32>>,
    up: Option<CudaSlice<f32>>,
    fused: Option<CudaSlice<f32>>,
    part: Option<CudaSlice<f32>>,
    /// Quantized activations for the integer matmuls.
    act: Option<ActBufs>,
    /// The step's small inputs (positions, block tables, the wanted rows, RoPE tables, …)
    /// and its rows, from one pinned buffer; its logits, reused across steps (grown to a
    /// power of two when a step needs more): no allocation in a step that fits.
    inputs: StepInputs,
    logits: Option<CudaSlice<f32>>,
    /// Mixture-of-Experts layers: the router's logits (rows × experts), each row's experts
    /// and weights, the grouping (grouped position → row, (row, rank) → grouped position,
    /// rows per expert), and the grouped rows' input, gate, up and output.
    moe: Option<MoeBufs>,
    /// Hybrid models (qwen35, qwen35moe): the linear layers' and output gate's buffers, and
    /// the step's sequences for the linear-attention kernels.
    hybrid: Option<HybridBufs>,
    /// Latent-attention models: the latent steps' buffers.
    mla: Option<MlaBufs>,
    /// Gemma 4 E2B/E4B: the per-layer steps' buffers.
    ple: Option<PleBufs>,
}

struct MoeBufs {
    logits: CudaSlice<f32>,
    /// DeepSeek's selection scores (`rows × experts`).
    select: CudaSlice<f32>,
    chosen: CudaSlice<i32>,
    weights: CudaSlice<f32>,
    idx: CudaSlice<i32>,
    slot: CudaSlice<i32>,
    counts: CudaSlice<i32>,
    /// The expert of each grouped position.
    gexp: CudaSlice<i32>,
    /// The grouped rows' tiles of one expert (`moe_tiles`: 4 ints each).
    tiles: CudaSlice<i32>,
    input: CudaSlice<f32>,
    gate: CudaSlice<f32>,
    up: CudaSlice<f32>,
    out: CudaSlice<f32>,
    /// The shared expert's gate/up outputs, gate logits and output (none without one).
    shared_gate: CudaSlice<f32>,
    shared_up: CudaSlice<f32>,
    shared_logit: CudaSlice<f32>,
    shared_out: CudaSlice<f32>,
}

/// Grows the reused device buffer `slot` to hold at least `len` values.
fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    g: &Gpu,
    slot: &mut Option<CudaSlice<T>>,
    what: &str,
    len: usize,
) -> Result<()> {
    if slot.as_ref().is_none_or(|b| b.len() < len.max(1)) {
        *slot = Some(g.zeros(what, len.max(1).next_power_of_two())?);
    }
    Ok(())
}

/// Whether decode steps are captured as CUDA graphs and replayed (`CANDOR_CUDA_GRAPHS=1`; off
/// by default until a card shows that they pay). A replay makes the launches of its capture,
/// with the same arguments: the key holds every value a launch takes from the host.
fn graphs_wanted() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("CANDOR_CUDA_GRAPHS").as_deref() == Ok("1"))
}

/// Recurrent states of a hybrid model's sequences the KV pool leaves room for beside it (a
/// batch of 64; more are allocated while memory lasts).
const STATE_RESERVE: usize = 64;

/// At most this many graphs are kept per model (all dropped when one more is captured):
/// a decode step's shape changes with the batch's rows and every 256 positions.
const MAX_GRAPHS: usize = 64;

/// A model's captured decode steps.
struct Graphs {
    /// Off without `CANDOR_CUDA_GRAPHS=1`, for models whose layers synchronise with the host
    /// (MoE layers launched per expert), and after the driver refused a capture.
    on: bool,
    map: std::collections::HashMap<GraphKey, StepGraph>,
    /// Steps replayed from a graph.
    replays: usize,
}

impl Graphs {
    fn new(on: bool) -> Graphs {
        Graphs {
            on,
            map: Default::default(),
            replays: 0,
        }
    }
}

/// A captured step. CUDA graphs must not be used from two threads at once; the model's
/// `graphs` mutex serialises every use.
struct StepGraph(cudarc::driver::CudaGraph);

// SAFETY: only reached through `CudaModel::graphs`'s mutex (one thread at a time), on the
// stream and context the graph was captured on, which outlive it.
unsafe impl Send for StepGraph {}

/// What a step's launches take from the host besides the model's weights: the rows, the
/// wanted rows, the attention chunks, every buffer's address and the step buffers'
/// generation (the addresses of the MoE, hybrid, latent and per-layer buffers change only
/// with it). Positions, block tables, embeddings, RoPE tables, a hybrid model's sequences and
/// state addresses, and the per-layer token embeddings are uploaded into those buffers before
/// each replay. (A decode step's sequences are its rows, so the rows fix every grid.)
#[derive(Clone, PartialEq, Eq, Hash)]
struct GraphKey {
    rows: usize,
    m: usize,
    chunks: usize,
    generation: u64,
    addrs: [u64; 29],
}

impl GraphKey {
    fn of(run: &Run<'_>, rows: usize, m: usize, wanted: u64, generation: u64) -> GraphKey {
        let p = &run.p;
        let (aq, ad, asc, asum) = run.act.ptrs(&run.g.stream);
        GraphKey {
            rows,
            m,
            chunks: run.chunks,
            generation,
            addrs: [
                p.x,
                p.xb,
                p.q,
                p.k,
                p.v,
                p.attn,
                p.gate,
                p.up,
                p.fused,
                p.part,
                p.pool,
                p.block_len as u64,
                p.positions,
                p.table_offsets,
                p.tables,
                p.row_blocks,
                p.row_slots,
                p.rope,
                p.rope_swa.unwrap_or(0),
                p.temp.unwrap_or(0),
                p.spans,
                p.states,
                p.layer_tokens,
                p.logits,
                wanted,
                aq,
                ad,
                asc,
                asum,
            ],
        }
    }
}

/// At most this many grouped rows (a step's rows times the experts each uses) take the grouped
/// expert launches row by row (`mmqe`); more (prefill) take them in row tiles of one expert
/// (`mmte`), whose rows share the expert's weights and the tensor cores. The bits are the
/// same either way, and as a launch per expert.
const GROUPED_ROWS: usize = 256;

/// How a MoE layer with the grouped launches' address tables runs its experts' matmuls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ExpertLaunch {
    /// One launch per matrix, a row per block (`Gpu::matmul_experts`).
    Rows,
    /// One launch per matrix, row tiles of one expert (`Gpu::matmul_expert_tiles`).
    Tiles,
    /// The row counts read back, then a launch per routed expert.
    PerExpert,
}

/// The most rows one activation quantization takes (its grid's y dimension).
const QUANTIZE_ROWS_MAX: usize = 65_535;

/// The launches for `pairs` grouped rows: row by row up to `rows_max`, then in tiles where the
/// device has the int8 MMA (and the rows fit one quantization); a launch per expert without
/// it, and always with `CANDOR_CUDA_MOE=experts` (for timing both).
fn expert_launch(pairs: usize, rows_max: usize, mma: bool) -> ExpertLaunch {
    static PER_EXPERT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let per_expert =
        *PER_EXPERT.get_or_init(|| std::env::var("CANDOR_CUDA_MOE").as_deref() == Ok("experts"));
    let mma = mma && pairs <= QUANTIZE_ROWS_MAX;
    match (per_expert, pairs <= rows_max, mma) {
        (true, _, _) => ExpertLaunch::PerExpert,
        (false, true, _) => ExpertLaunch::Rows,
        (false, false, true) => ExpertLaunch::Tiles,
        (false, false, false) => ExpertLaunch::PerExpert,
    }
}

/// The most row tiles of one expert `pairs` grouped rows over `experts` experts can take.
pub(super) fn max_expert_tiles(pairs: usize, experts: usize) -> usize {
    pairs.div_ceil(MT_BM) + experts.min(pairs)
}

/// Whether adjacent plan steps share a launch where a fused kernel exists (the default), or
/// each step is launched alone (`CANDOR_CUDA_FUSE=0`: the same bits, for timing both).
fn fused_launches() -> bool {
    std::env::var("CANDOR_CUDA_FUSE").as_deref() != Ok("0")
}

/// A model's weights on a CUDA device, with its KV pool.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    spec: DeviceSpec,
    name: String,
    layers: Vec<DevLayer>,
    output_norm: CudaSlice<f32>,
    /// Gemma 4 E2B/E4B: the per-layer inputs' projection.
    ple: Option<DevPle>,
    /// Ones as wide as the widest head: the weight of Gemma 4's value norm.
    ones: CudaSlice<f32>,
    /// The biases after the final norm and on the logits (phimoe).
    head_bias: Option<[CudaSlice<f32>; 2]>,
    /// The output projection (the embedding when tied).
    output: DevWeight,
    pool: KvPool,
    block_tokens: usize,
    /// What the lowering knows of this device's matrices (kept to lower again: tests).
    #[cfg_attr(not(any(test, feature = "testkit")), allow(dead_code))]
    target: Target,
    /// The model's plan lowered to this device's launches.
    lowering: Lowering,
    buffers: Mutex<Buffers>,
    /// Decode steps captured as CUDA graphs, by shape (`CANDOR_CUDA_GRAPHS=1`).
    graphs: Mutex<Graphs>,
    /// At most this many grouped rows take the grouped expert launches row by row
    /// ([`GROUPED_ROWS`]; tests: 0, every step in tiles).
    grouped_rows: usize,
}

impl CudaModel {
    /// Uploads `model`'s weights to CUDA device `ordinal` and sizes a KV pool of blocks of
    /// `block_tokens` positions from the memory left, at most `kv_limit` bytes when given.
    pub fn load(
        model: &Transformer,
        ordinal: usize,
        block_tokens: usize,
        kv_limit: Option<usize>,
    ) -> Result<CudaModel> {
        if let Some(why) = crate::model::lowering::not_lowered(model) {
            return Err(ModelError::Device(format!("cuda: {why}")));
        }
        if let Some(d) =
            (model.dims.iter()).find(|d| !d.head_dim.is_multiple_of(32) || d.head_dim > WIDE_HEAD)
        {
            return Err(ModelError::Device(format!(
                "cuda: head dimension {} is not supported on the GPU (a multiple of 32, at most \
                 {WIDE_HEAD})",
                d.head_dim
            )));
        }
        if let Some(h) = model.hybrid.as_ref().filter(|h| h.head_dim > 1024) {
            return Err(ModelError::Device(format!(
                "cuda: linear-attention heads of {} are not supported on the GPU (at most 1024)",
                h.head_dim
            )));
        }
        let gpu = open_gpu(ordinal)?;
        let name = gpu.ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        check_fits(&gpu, ordinal, &name, model)?;
        let path = matmul_path();
        let mat = |name: String, w: &QWeight| upload_weight(&gpu, &name, w, path);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let mut latent = None;
            let qkv = match &l.qkv {
                Qkv::Split { q, k, v } => vec![
                    mat(n("attn_q.weight"), q)?,
                    mat(n("attn_k.weight"), k)?,
                    mat(n("attn_v.weight"), v)?,
                ],
                Qkv::Fused(w) => vec![mat(n("attn_qkv.weight"), w)?],
                Qkv::Latent(m) => {
                    latent = Some(upload_latent(&gpu, i, m, path)?);
                    Vec::new()
                }
                // Gemma 4: values from the keys' projection, or queries alone (a layer reading
                // an earlier layer's KV).
                Qkv::QueryKey { q, k } => {
                    vec![mat(n("attn_q.weight"), q)?, mat(n("attn_k.weight"), k)?]
                }
                Qkv::Query(q) => vec![mat(n("attn_q.weight"), q)?],
            };
            // A dense layer's feed-forward block, or the MLP beside Gemma 4's experts.
            let (gate_up, w_down) = match l.mlp() {
                Some((gate_up, down)) => (
                    match gate_up {
                        GateUp::Split { gate, up } => vec![
                            mat(n("ffn_gate.weight"), gate)?,
                            mat(n("ffn_up.weight"), up)?,
                        ],
                        GateUp::Fused(w) => vec![mat(n("ffn_up.weight"), w)?],
                    },
                    Some(mat(n("ffn_down.weight"), down)?),
                ),
                None => (Vec::new(), None),
            };
            let moe = match &l.ffn {
                Ffn::Dense { .. } => None,
                Ffn::Moe(m) => {
                    if m.config.experts > 1024 || m.config.used > m.config.experts {
                        return Err(ModelError::Device(format!(
                            "cuda: {} experts, {} used: the GPU routes at most 1024",
                            m.config.experts, m.config.used
                        )));
                    }
                    if let Some((groups, _)) = m.config.groups.filter(|&(g, _)| g > MOE_MAX_GROUPS)
                    {
                        return Err(ModelError::Device(format!(
                            "cuda: {groups} expert groups: the GPU routes at most \
                             {MOE_MAX_GROUPS}"
                        )));
                    }
                    Some(upload_moe(&gpu, i, m, path)?)
                }
            };
            let wo = mat(n("attn_output.weight"), &l.wo)?;
            let vec = |what: &str, v: &[f32]| gpu.upload(what, v);
            let opt =
                |what: &str, v: &Option<Vec<f32>>| v.as_deref().map(|v| vec(what, v)).transpose();
            layers.push(DevLayer {
                attn_norm: vec("attn_norm", &l.attn_norm)?,
                qkv,
                bias: match &l.bias {
                    Some([a, b, c]) => Some([vec("bias", a)?, vec("bias", b)?, vec("bias", c)?]),
                    None => None,
                },
                qk_norm: match &l.qk_norm {
                    Some((a, b)) => Some((vec("q_norm", a)?, vec("k_norm", b)?)),
                    None => None,
                },
                wo,
                post_attn_norm: opt("post_attention_norm", &l.post_attn_norm)?,
                ffn_norm: vec("ffn_norm", &l.ffn_norm)?,
                gate_up,
                w_down,
                post_ffn_norm: opt("post_ffw_norm", &l.post_ffn_norm)?,
                out_bias: opt("attn_output.bias", &l.out_bias)?,
                norm_bias: match &l.norm_bias {
                    Some([a, f]) => Some([vec("attn_norm.bias", a)?, vec("ffn_norm.bias", f)?]),
                    None => None,
                },
                sinks: opt("attn_sinks", &l.sinks)?,
                moe,
                delta: l
                    .delta
                    .as_ref()
                    .map(|d| {
                        let taps = model.hybrid.as_ref().map_or(1, |h| h.conv_kernel);
                        upload_delta(&gpu, i, d, taps, path)
                    })
                    .transpose()?,
                latent,
                ple: (l.ple.as_ref())
                    .map(|w| upload_layer_embedding(&gpu, i, w, path))
                    .transpose()?,
                out_scale: l.out_scale,
            });
        }
        let output = match &model.output {
            Some(w) => mat("output.weight".into(), w)?,
            None => mat("token_embd.weight".into(), &model.embedding)?,
        };
        let output_norm = gpu.upload("output_norm", &model.output_norm)?;
        let ple = (model.ple.as_ref())
            .map(|e| upload_ple(&gpu, e, path))
            .transpose()?;
        let widest = model.dims.iter().map(|d| d.head_dim).max().unwrap_or(0);
        let ones = gpu.upload("ones", &vec![1f32; widest.max(1)])?;
        let head_bias = match &model.head_bias {
            Some([n, o]) => Some([
                gpu.upload("output_norm.bias", n)?,
                gpu.upload("output.bias", o)?,
            ]),
            None => None,
        };
        // Room beside the pool for the recurrent states of a hybrid model's sequences.
        let reserve = model.state_len() * 4 * STATE_RESERVE;
        // Every layer that stores KV (Gemma 4's sharing layers store none), each position the
        // widest layer's keys and values apart.
        let pool = new_pool(
            &gpu,
            model.kv_layers() * 2 * block_tokens * model.kv_width(),
            kv_limit,
            reserve,
        )?;
        let target = target_of(model, path == MatmulPath::Integer, fused_launches());
        let lowering = Lowering::new(model.plan(), &target);
        // Every plan step launched, in order (checked once per model; the tests check it for
        // every architecture).
        for (place, steps) in model.plan().places() {
            covered(steps, lowering.launches(place))
                .map_err(|e| ModelError::Device(format!("cuda: lowering {place:?}: {e}")))?;
        }
        let mut cuda = CudaModel {
            gpu,
            spec: DeviceSpec::Cuda(ordinal),
            name,
            layers,
            output_norm,
            ple,
            ones,
            head_bias,
            output,
            pool,
            block_tokens,
            target,
            lowering,
            buffers: Mutex::new(Buffers::default()),
            graphs: Mutex::new(Graphs::new(false)),
            grouped_rows: GROUPED_ROWS,
        };
        let on = graphs_wanted() && cuda.graphable();
        cuda.graphs.get_mut().expect("CUDA graphs lock").on = on;
        Ok(cuda)
    }

    /// Whether this model's decode steps can be captured as graphs: no layer synchronises
    /// with the host in a decode step. MoE layers do so only on the launches per expert, so
    /// every MoE layer must have the grouped launches' address tables. Every other layer's
    /// launches read only buffers that `fit` allocates (their addresses change with the
    /// key's generation) and the step's inputs (their addresses are in the key): a hybrid
    /// layer's sequences and states, and Gemma 4's per-layer token embeddings, among them.
    fn graphable(&self) -> bool {
        self.layers
            .iter()
            .all(|l| l.moe.as_ref().is_none_or(|m| m.grouped.is_some()))
    }

    /// The device's name as the driver reports it (for manifests).
    pub fn device_name(&self) -> &str {
        &self.name
    }

    pub fn spec(&self) -> DeviceSpec {
        self.spec
    }

    /// The launches each layer and the head run (see [`Lowering`]).
    pub fn lowering(&self) -> &Lowering {
        &self.lowering
    }

    /// Lowers `plan` again with or without the fused launches (tests: the two must give the
    /// same bits).
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_fusion(&mut self, plan: &crate::model::plan::Plan, fuse: bool) {
        self.target.fuse = fuse;
        self.relower(plan);
    }

    /// Lowers `plan` again with the wide attention kernels whatever the head size (tests:
    /// they give the bits of the one-warp-per-head kernels).
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_wide_attention(&mut self, plan: &crate::model::plan::Plan) {
        self.target.wide = true;
        self.relower(plan);
    }

    /// Every MoE layer's experts launched one by one (tests: the grouped launches must give
    /// their bits); how many layers took the grouped launches before.
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_moe_per_expert(&mut self) -> usize {
        let moe = self.layers.iter_mut().filter_map(|l| l.moe.as_mut());
        let had = moe.filter_map(|m| m.grouped.take()).count();
        // Launches per expert read the row counts back: no graphs.
        let g = self.graphs.get_mut().expect("CUDA graphs lock");
        g.on = g.on && had == 0;
        g.map.clear();
        had
    }

    /// Every MoE step's grouped expert launches in row tiles of one expert (tests: they must
    /// give the bits of the launches row by row and per expert, on steps of any size).
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_moe_tiles(&mut self) {
        self.grouped_rows = 0;
        self.graphs.get_mut().expect("CUDA graphs lock").map.clear();
    }

    /// Every latent-attention layer's heads launched one by one (tests: the launch over every
    /// head must give their bits); how many layers took that launch before.
    #[cfg(any(test, feature = "testkit"))]
    pub fn set_mla_per_head(&mut self) -> usize {
        let latent = self.layers.iter_mut().filter_map(|l| l.latent.as_mut());
        let had = latent.map(|d| d.drop_grouped()).filter(|&had| had).count();
        // The captured launches were the launches over every head.
        self.graphs.get_mut().expect("CUDA graphs lock").map.clear();
        had
    }

    #[cfg(any(test, feature = "testkit"))]
    fn relower(&mut self, plan: &crate::model::plan::Plan) {
        self.lowering = Lowering::new(plan, &self.target);
        // The captured launches were the old lowering's.
        self.graphs.get_mut().expect("CUDA graphs lock").map.clear();
    }

    /// Whether decode steps are captured as CUDA graphs and replayed (the default from
    /// `CANDOR_CUDA_GRAPHS`; never for models whose layers synchronise with the host: MoE
    /// layers launched per expert).
    pub fn set_graphs(&mut self, on: bool) {
        let on = on && self.graphable();
        let g = self.graphs.get_mut().expect("CUDA graphs lock");
        g.on = on;
        g.map.clear();
    }

    /// How many steps were replayed from a captured graph.
    pub fn graph_replays(&self) -> usize {
        self.graphs.lock().expect("CUDA graphs lock").replays
    }

    /// The model's KV pool (the engine allocates its blocks there).
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// One packed step on the device; the wanted logits are copied into `logits` (rows back
    /// to back, sequences in order), as [`Transformer::forward`] returns them.
    pub fn forward<K: KvSeq>(
        &self,
        model: &Transformer,
        seqs: &mut [SeqStep<'_, K>],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let c = &model.config;
        let (dim, rd) = (c.dim, c.rope_dim);
        // The sliding-window layers' RoPE dimensions (Gemma 4's are their own).
        let rd_swa = (model.dims.iter().zip(&c.swa_layers))
            .find(|(_, &swa)| swa)
            .map_or(rd, |(d, _)| d.rope_dim);
        let bt = self.block_tokens;
        let rows: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if rows == 0 {
            logits.clear();
            return Ok(());
        }

        // Host side: embeddings, RoPE tables, each row's position and KV block.
        let mut x = vec![0f32; rows * dim];
        let mut cs = vec![0f32; rows * rd];
        // Sliding-window layers' own RoPE table, only for models that have one.
        let swa_len = model.rope_swa_freqs.as_ref().map_or(0, |_| rows * rd_swa);
        let mut cs_swa = vec![0f32; swa_len];
        // The queries' attention temperature per row, computed as the CPU's (`AttnTemp`).
        let mut temp = Vec::new();
        let (mut pos, mut table_off, mut row_block, mut row_slot) = (
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::new(),
            Vec::new(),
        );
        let mut table: Vec<u32> = Vec::new();
        let mut wanted: Vec<i32> = Vec::new();
        // The step's tokens in row order (Gemma 4's per-layer embeddings are looked up here).
        let mut tokens: Vec<u32> = Vec::with_capacity(rows);
        // Hybrid models: each sequence's (first row, rows) and recurrent state.
        let (mut spans, mut states) = (Vec::new(), Vec::new());
        let mut r = 0;
        for seq in seqs.iter_mut() {
            if model.hybrid.is_some() {
                let state = seq.kv.device_state().ok_or_else(|| {
                    ModelError::Device(
                        "cuda: a sequence of a hybrid model without a recurrent state on the \
                         device (host KV given to a GPU model?)"
                            .into(),
                    )
                })?;
                spans.extend([r as i32, seq.tokens.len() as i32]);
                states.push(state);
            }
            let p0 = seq.kv.len();
            seq.kv.grow(seq.tokens.len());
            let off = table.len();
            seq.kv.device_blocks(&mut table);
            let blocks = table.len() - off;
            if blocks != (p0 + seq.tokens.len()).div_ceil(bt) {
                return Err(ModelError::Device(format!(
                    "cuda: a sequence's KV has {blocks} device blocks for {} positions (host KV \
                     given to a GPU model?)",
                    p0 + seq.tokens.len()
                )));
            }
            for (i, &t) in seq.tokens.iter().enumerate() {
                tokens.push(t);
                let xr = &mut x[(r + i) * dim..(r + i + 1) * dim];
                model.embedding.row_f32(t as usize, xr);
                if let Some(scale) = c.embed_scale {
                    xr.iter_mut().for_each(|v| *v *= scale);
                }
                let p = p0 + i;
                model.rope_freqs.cos_sin(p, &mut cs[(r + i) * rd..][..rd]);
                if let Some(f) = &model.rope_swa_freqs {
                    f.cos_sin(p, &mut cs_swa[(r + i) * rd_swa..][..rd_swa]);
                }
                if let Some(t) = &c.attn_temp {
                    temp.push(t.factor(p));
                }
                pos.push(p as i32);
                table_off.push(off as i32);
                row_block.push(table[off + p / bt] as i32);
                row_slot.push((p % bt) as i32);
            }
            let n = seq.tokens.len();
            match seq.logits {
                Logits::None => {}
                Logits::Last if n > 0 => wanted.push((r + n - 1) as i32),
                Logits::Last => {}
                Logits::All => wanted.extend((r..r + n).map(|i| i as i32)),
            }
            r += n;
        }
        let table: Vec<i32> = table.into_iter().map(|s| s as i32).collect();
        let chunks = pos
            .iter()
            .map(|&p| attn_chunks(p as usize))
            .max()
            .expect("rows > 0");

        let g = &self.gpu;
        let s = &*g.stream;
        let mut bufs = self.buffers.lock().expect("CUDA buffers lock");
        self.fit(&mut bufs, model, rows, chunks)?;
        let b = &mut *bufs;
        // Gemma 4 E2B/E4B: each row's token's per-layer embeddings.
        let layer_tokens = model
            .ple
            .as_ref()
            .map_or_else(Vec::new, |e| token_rows(e, &tokens));
        // Every small input and the rows in two copies from one pinned buffer.
        let mut regions: [&[u8]; REGIONS] = [&[]; REGIONS];
        for (r, v) in [
            (Region::Positions, pos.bytes()),
            (Region::TableOffsets, table_off.bytes()),
            (Region::Tables, table.bytes()),
            (Region::RowBlocks, row_block.bytes()),
            (Region::RowSlots, row_slot.bytes()),
            (Region::Wanted, wanted.bytes()),
            (Region::Rope, cs.bytes()),
            (Region::RopeSwa, cs_swa.bytes()),
            (Region::Temp, temp.bytes()),
            (Region::Spans, spans.bytes()),
            (Region::States, states.bytes()),
            (Region::LayerTokens, layer_tokens.bytes()),
        ] {
            regions[r as usize] = v;
        }
        let at = b
            .inputs
            .upload(g, regions, &x, b.x.as_mut().expect("fit"))?;
        let addr = |r: Region| at[r as usize];
        let (ppos, ptoff, ptab, prb, prs) = (
            addr(Region::Positions),
            addr(Region::TableOffsets),
            addr(Region::Tables),
            addr(Region::RowBlocks),
            addr(Region::RowSlots),
        );
        let pcs = addr(Region::Rope);
        let pcs_swa = (!cs_swa.is_empty()).then(|| addr(Region::RopeSwa));
        let ptemp = (!temp.is_empty()).then(|| addr(Region::Temp));
        let seq_args = b.hybrid.is_some().then(|| SeqArgs {
            spans: addr(Region::Spans),
            states: addr(Region::States),
            seqs: states.len(),
        });

        let p = |o: &Option<CudaSlice<f32>>| ptr(o.as_ref().expect("fit"), s);
        let (px, pxb, pq, pk, pv, pattn, pgate, pup, pfused, ppart) = (
            p(&b.x),
            p(&b.xb),
            p(&b.q),
            p(&b.k),
            p(&b.v),
            p(&b.attn),
            p(&b.gate),
            p(&b.up),
            p(&b.fused),
            p(&b.part),
        );
        let pool = self.pool.base();
        let block_len = self.pool.0.block_len as i64;

        let ptrs = Ptrs {
            x: px,
            xb: pxb,
            q: pq,
            k: pk,
            v: pv,
            attn: pattn,
            gate: pgate,
            up: pup,
            fused: pfused,
            part: ppart,
            pool,
            block_len,
            positions: ppos,
            table_offsets: ptoff,
            tables: ptab,
            row_blocks: prb,
            row_slots: prs,
            rope: pcs,
            rope_swa: pcs_swa,
            temp: ptemp,
            spans: addr(Region::Spans),
            states: addr(Region::States),
            layer_tokens: addr(Region::LayerTokens),
            logits: 0,
        };
        // The head's inputs: the wanted rows' indices and room for their logits.
        let m = wanted.len();
        let vocab = c.vocab_size;
        let pw = if m == 0 {
            0
        } else {
            grow(g, &mut b.logits, "logits", m * vocab)?;
            addr(Region::Wanted)
        };
        let plogits = b.logits.as_ref().map_or(0, |o| ptr(o, s));
        let act = b.act.as_ref().expect("fit");
        let hybrid = match (b.hybrid.as_ref(), seq_args, model.hybrid.as_ref()) {
            (Some(hb), Some(q), Some(h)) => Some(HybridRun { b: hb, q, h }),
            _ => None,
        };
        let run = Run {
            g,
            c,
            act,
            moe: b.moe.as_ref(),
            hybrid,
            mla: b.mla.as_ref(),
            dims: &model.dims,
            ple: b.ple.as_ref().zip(self.ple.as_ref()),
            ones: &self.ones,
            kv_stride: model.kv_width(),
            grouped_rows: self.grouped_rows,
            p: Ptrs {
                logits: plogits,
                ..ptrs
            },
            chunks,
            bt,
        };
        // A decode step (one token per sequence) replays the graph captured for its shape
        // and buffers, or is captured as one; every other step launches as it goes.
        let decode = seqs.iter().all(|q| q.tokens.len() == 1);
        // A MoE step is captured only on the grouped expert launches (no host read).
        let grouped = c.moe.is_none_or(|e| {
            expert_launch(rows * e.used, self.grouped_rows, g.has_mma()) != ExpertLaunch::PerExpert
        });
        let generation = b.generation;
        let mut graphs = self.graphs.lock().expect("CUDA graphs lock");
        let key = (graphs.on && decode && grouped && !sync_each_launch())
            .then(|| GraphKey::of(&run, rows, m, pw, generation));
        match key {
            Some(key) if graphs.map.contains_key(&key) => {
                let graph = &graphs.map[&key].0;
                g.launched("decode_graph", graph.launch())?;
                graphs.replays += 1;
            }
            Some(key) => match self.capture(model, &run, pw, m, rows)? {
                Some(graph) => {
                    g.launched("decode_graph", graph.launch())?;
                    if graphs.map.len() >= MAX_GRAPHS {
                        graphs.map.clear();
                    }
                    graphs.map.insert(key, StepGraph(graph));
                }
                None => {
                    graphs.on = false;
                    self.launch_step(model, &run, pw, m, rows)?;
                }
            },
            None => self.launch_step(model, &run, pw, m, rows)?,
        }
        drop(graphs);

        logits.clear();
        if m == 0 {
            s.synchronize().map_err(step_err)?;
            return Ok(());
        }
        let out = b.logits.as_ref().expect("grown");
        logits.resize(m * vocab, 0.0);
        g.stream
            .memcpy_dtoh(&out.slice(..m * vocab), logits.as_mut_slice())
            .map_err(|e| dev_err("downloading logits", e))?;
        s.synchronize().map_err(step_err)?;
        Ok(())
    }

    /// Every launch of one step: the layers', then the head's on the `m` wanted rows (their
    /// indices at `pw`).
    fn launch_step(
        &self,
        model: &Transformer,
        run: &Run<'_>,
        pw: u64,
        m: usize,
        rows: usize,
    ) -> Result<()> {
        for (l, dl) in self.layers.iter().enumerate() {
            let place = Place::Layer(l);
            let steps = model.plan.layer(l);
            for (i, launch) in self.lowering.launches(place).iter().enumerate() {
                #[cfg(any(test, feature = "testkit"))]
                trace::record(trace::Event::Launch(place, i, launch.kernel.name()));
                run.layer(launch, steps, l, dl, rows).map_err(|e| {
                    let at = format_args!("layer {l}, launch {i} ({})", launch.kernel.name());
                    at_launch(e, at)
                })?;
            }
        }
        if m == 0 {
            return Ok(());
        }
        let steps = model.plan.head();
        for (i, launch) in self.lowering.launches(Place::Head).iter().enumerate() {
            #[cfg(any(test, feature = "testkit"))]
            trace::record(trace::Event::Launch(Place::Head, i, launch.kernel.name()));
            run.head(launch, steps, self, pw, m).map_err(|e| {
                at_launch(
                    e,
                    format_args!("head, launch {i} ({})", launch.kernel.name()),
                )
            })?;
        }
        Ok(())
    }

    /// One step's launches captured into a CUDA graph (not run: the caller launches it), or
    /// `None` where the driver refused the capture (said once; the model then launches each
    /// step as before). An error of a launch itself is returned as without a graph.
    fn capture(
        &self,
        model: &Transformer,
        run: &Run<'_>,
        pw: u64,
        m: usize,
        rows: usize,
    ) -> Result<Option<cudarc::driver::CudaGraph>> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let s = &run.g.stream;
        if let Err(e) = s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) {
            eprintln!("cuda: decode steps are not captured as graphs ({e}); launching each step");
            return Ok(None);
        }
        let launched = self.launch_step(model, run, pw, m, rows);
        let graph = s.end_capture(CUgraphInstantiate_flags(0));
        launched?;
        match graph {
            Ok(Some(graph)) => Ok(Some(graph)),
            Ok(None) => {
                eprintln!("cuda: a decode step's capture held no graph; launching each step");
                Ok(None)
            }
            Err(e) => {
                eprintln!("cuda: a decode step's capture failed ({e}); launching each step");
                Ok(None)
            }
        }
    }

    /// Grows the step buffers to `rows` rows and `chunks` attention chunks.
    fn fit(&self, b: &mut Buffers, model: &Transformer, rows: usize, chunks: usize) -> Result<()> {
        let c = &model.config;
        if rows <= b.rows && chunks <= b.chunks && b.x.is_some() {
            return Ok(());
        }
        let rows = rows.max(b.rows).next_power_of_two();
        let chunks = chunks.max(b.chunks);
        let g = &self.gpu;
        let h = model.hybrid.as_ref();
        // A linear layer's value width, the width its output projection reads.
        let vd = h.map_or(0, Hybrid::value_dim);
        // The widest layer's (Gemma 4's layers differ).
        let most = |f: fn(&LayerDims) -> usize| model.dims.iter().map(f).max().unwrap_or(0);
        let (q_dim, kv_dim, ffn) = (
            most(LayerDims::q_dim),
            most(LayerDims::kv_dim),
            most(|d| d.ffn_dim),
        );
        let part = most(|d| d.n_head * (d.head_dim + 2));
        let wide = c.dim.max(q_dim).max(vd);
        let fused = (q_dim + 2 * kv_dim).max(2 * ffn);
        // The full-attention layers' query | gate halves (hybrid models).
        let fused_rows = match (c.arch.fused(), h) {
            (true, _) => fused,
            (false, Some(_)) => 2 * c.q_dim(),
            (false, None) => 0,
        };
        b.x = Some(g.zeros("x", rows * c.dim)?);
        b.xb = Some(g.zeros("xb", rows * c.dim)?);
        b.q = Some(g.zeros("q", rows * q_dim)?);
        b.k = Some(g.zeros("k", (rows * kv_dim).max(1))?);
        b.v = Some(g.zeros("v", (rows * kv_dim).max(1))?);
        b.attn = Some(g.zeros("attn", rows * wide)?);
        b.gate = Some(g.zeros("gate", rows * ffn)?);
        b.up = Some(g.zeros("up", rows * ffn)?);
        b.fused = Some(g.zeros("fused", (rows * fused_rows).max(1))?);
        b.part = Some(g.zeros("attention partials", rows * chunks * part)?);
        let shared = c.moe.and_then(|m| m.shared_ffn).unwrap_or(0);
        let mut act_elems = rows * wide.max(ffn).max(shared).next_multiple_of(256);
        b.hybrid = match h {
            Some(h) => Some(HybridBufs::new(g, rows, c.q_dim(), h)?),
            None => None,
        };
        b.ple = match &model.ple {
            Some(e) => Some(PleBufs::new(g, rows, c.n_layer, e.ple)?),
            None => None,
        };
        b.mla = match c.mla {
            Some(m) => Some(MlaBufs::new(g, rows, m, c.n_head, c.rope_dim)?),
            None => None,
        };
        // The latent heads' matrices over every head at once quantize `rows × heads` rows.
        if let Some(m) = c.mla {
            let k = m.nope.max(m.kv_lora).next_multiple_of(256);
            act_elems = act_elems.max(grouped_head_rows(rows, c.n_head) * k);
        }
        if let Some(m) = c.moe {
            let pairs = rows * m.used;
            let shared_rows = if shared > 0 { rows } else { 0 };
            // The MLP beside Gemma 4's experts is kept in `shared_out` too.
            let beside = model
                .layers
                .iter()
                .any(|l| matches!(&l.ffn, Ffn::Moe(m) if m.beside.is_some()));
            let out_rows = if shared > 0 || beside { rows } else { 0 };
            b.moe = Some(MoeBufs {
                logits: g.zeros("router logits", rows * m.experts)?,
                select: g.zeros("expert selection scores", rows * m.experts)?,
                chosen: g.zeros("experts chosen", pairs)?,
                weights: g.zeros("expert weights", pairs)?,
                idx: g.zeros("expert rows", pairs)?,
                slot: g.zeros("expert slots", pairs)?,
                counts: g.zeros("expert counts", m.experts)?,
                gexp: g.zeros("grouped rows' experts", pairs)?,
                tiles: g.zeros("expert row tiles", 4 * max_expert_tiles(pairs, m.experts))?,
                input: g.zeros("expert input", pairs * c.dim)?,
                gate: g.zeros("expert gate", pairs * m.ffn_dim)?,
                up: g.zeros("expert up", pairs * m.ffn_dim)?,
                out: g.zeros("expert output", pairs * c.dim)?,
                shared_gate: g.zeros("shared expert gate", shared_rows * shared)?,
                shared_up: g.zeros("shared expert up", shared_rows * shared)?,
                shared_logit: g.zeros("shared expert gate logits", shared_rows)?,
                shared_out: g.zeros("shared expert output", out_rows * c.dim)?,
            });
            act_elems = act_elems.max(pairs * c.dim.max(m.ffn_dim).next_multiple_of(256));
        }
        b.act = Some(g.act_bufs(act_elems)?);
        b.rows = rows;
        b.chunks = chunks;
        b.generation += 1;
        Ok(())
    }
}

/// The device addresses of one step's buffers.
#[derive(Clone, Copy)]
struct Ptrs {
    x: u64,
    xb: u64,
    q: u64,
    k: u64,
    v: u64,
    attn: u64,
    gate: u64,
    up: u64,
    fused: u64,
    part: u64,
    pool: u64,
    block_len: i64,
    positions: u64,
    table_offsets: u64,
    tables: u64,
    row_blocks: u64,
    row_slots: u64,
    rope: u64,
    /// The sliding-window layers' RoPE table, for models that have one.
    rope_swa: Option<u64>,
    /// Each row's attention temperature factor, for models that have one.
    temp: Option<u64>,
    /// A hybrid model's sequences and their recurrent states' addresses.
    spans: u64,
    states: u64,
    /// Gemma 4 E2B/E4B: the rows' tokens' per-layer embeddings.
    layer_tokens: u64,
    logits: u64,
}

/// What every launch of one step needs: the device, the model's configuration, the
/// activation scratch, the buffers, the attention chunks and the KV block size.
#[derive(Clone, Copy)]
struct Run<'a> {
    g: &'a Gpu,
    c: &'a ModelConfig,
    act: &'a ActBufs,
    /// The Mixture-of-Experts buffers (models with experts).
    moe: Option<&'a MoeBufs>,
    /// The hybrid layers' buffers, sequences and geometry (hybrid models).
    hybrid: Option<HybridRun<'a>>,
    /// The latent steps' buffers (latent-attention models).
    mla: Option<&'a MlaBufs>,
    /// Each layer's geometry (Gemma 4's differ).
    dims: &'a [LayerDims],
    /// The per-layer embeddings' buffers and projection (Gemma 4 E2B/E4B).
    ple: Option<(&'a PleBufs, &'a DevPle)>,
    /// Ones as wide as the widest head (Gemma 4's value norm).
    ones: &'a CudaSlice<f32>,
    /// Halves between two positions' keys in a KV block (the widest layer's `kv_dim`).
    kv_stride: usize,
    /// The model's [`CudaModel::grouped_rows`].
    grouped_rows: usize,
    p: Ptrs,
    chunks: usize,
    bt: usize,
}

/// What the hybrid layers' launches of one step need: their buffers, the step's sequences
/// and the model's linear-attention geometry.
#[derive(Clone, Copy)]
struct HybridRun<'a> {
    b: &'a HybridBufs,
    q: SeqArgs,
    h: &'a Hybrid,
}

impl Run<'_> {
    /// The RoPE table a step's launch reads (the covered `Rope` step's).
    fn rope_table(&self, covered: &[Step]) -> u64 {
        let swa = covered.contains(&Step::Rope(RopeTable::Swa));
        match (swa, self.p.rope_swa) {
            (true, Some(t)) => t,
            _ => self.p.rope,
        }
    }

    /// The activations already quantized for a matmul (see [`Kernel::Matmul`]).
    fn quantized(act: Option<ActBlocks>, quantized: bool) -> Option<i32> {
        act.filter(|_| quantized).map(ActBlocks::code)
    }

    /// One launch of layer `l` (its plan steps `steps`), on `rows` rows.
    fn layer(
        &self,
        launch: &Launch,
        steps: &[Step],
        l: usize,
        dl: &DevLayer,
        rows: usize,
    ) -> Result<()> {
        let (g, c, p) = (self.g, self.c, &self.p);
        let d = self.dims[l];
        let (dim, q_dim, kv_dim, hd) = (c.dim, d.q_dim(), d.kv_dim(), d.head_dim);
        let covered = &steps[launch.steps.clone()];
        let step = covered[0];
        let missing = |what: &str| {
            ModelError::Device(format!(
                "cuda: plan step {step:?} on a layer without {what}"
            ))
        };
        match (launch.kernel, step) {
            (Kernel::RmsNorm { .. } | Kernel::NormQuant(_), Step::Norm(block)) => {
                let w = match block {
                    Block::Attn => &dl.attn_norm,
                    Block::Ffn => &dl.ffn_norm,
                };
                match launch.kernel {
                    Kernel::NormQuant(a) => {
                        g.rms_norm_q8(p.x, w, p.xb, rows, dim, c.rms_eps, a, self.act)
                    }
                    _ => g.rms_norm(p.x, w, p.xb, rows, dim, c.rms_eps),
                }
            }
            (Kernel::RmsNorm { part }, Step::QkNorm) => {
                let (nq, nk) = dl.qk_norm.as_ref().ok_or_else(|| missing("q/k norms"))?;
                match part {
                    0 => g.rms_norm(p.q, nq, p.q, rows * d.n_head, hd, c.rms_eps),
                    // A layer reading another layer's KV has no keys of its own.
                    _ if d.n_kv_head == 0 => Ok(()),
                    _ => g.rms_norm(p.k, nk, p.k, rows * d.n_kv_head, hd, c.rms_eps),
                }
            }
            (Kernel::RmsNorm { .. }, Step::PostNorm(block)) => {
                let w = match block {
                    Block::Attn => dl.post_attn_norm.as_ref(),
                    Block::Ffn => dl.post_ffn_norm.as_ref(),
                };
                let w = w.ok_or_else(|| missing("post-norms"))?;
                g.rms_norm(p.xb, w, p.xb, rows, dim, c.rms_eps)
            }
            (
                Kernel::Matmul {
                    part,
                    act,
                    quantized,
                    residual,
                },
                Step::Project(m),
            ) => {
                let (w, x, y) = match m {
                    // One matrix for q|k|v, to be split (Phi-3); Gemma 4's queries alone are
                    // one matrix too.
                    Matrix::Qkv if steps.contains(&Step::Split(Matrix::Qkv)) => {
                        (&dl.qkv[0], p.xb, p.fused)
                    }
                    // The queries with their gate halves, to be split (Qwen3.5).
                    Matrix::Qkv if part == 0 && steps.contains(&Step::SplitGate) => {
                        (&dl.qkv[0], p.xb, p.fused)
                    }
                    Matrix::Qkv => (&dl.qkv[part], p.xb, [p.q, p.k, p.v][part]),
                    Matrix::GateUp if dl.gate_up.len() == 1 => (&dl.gate_up[0], p.xb, p.fused),
                    Matrix::GateUp => (&dl.gate_up[part], p.xb, [p.gate, p.up][part]),
                    Matrix::Out => (&dl.wo, p.attn, if residual { p.x } else { p.xb }),
                    Matrix::Down => (
                        dl.w_down
                            .as_ref()
                            .ok_or_else(|| missing("a down projection"))?,
                        p.gate,
                        if residual { p.x } else { p.xb },
                    ),
                    Matrix::Logits => return Err(missing("an output projection")),
                };
                g.matmul_into(
                    w,
                    x,
                    rows,
                    y,
                    self.act,
                    Self::quantized(act, quantized),
                    residual,
                )?;
                Ok(())
            }
            (Kernel::SplitCols { part }, Step::Split(m)) => {
                let (width, off, w, dst) = match (m, part) {
                    (Matrix::Qkv, 0) => (q_dim + 2 * kv_dim, 0, q_dim, p.q),
                    (Matrix::Qkv, 1) => (q_dim + 2 * kv_dim, q_dim, kv_dim, p.k),
                    (Matrix::Qkv, _) => (q_dim + 2 * kv_dim, q_dim + kv_dim, kv_dim, p.v),
                    (_, 0) => (2 * d.ffn_dim, 0, d.ffn_dim, p.gate),
                    _ => (2 * d.ffn_dim, d.ffn_dim, d.ffn_dim, p.up),
                };
                g.split(p.fused, width, off, w, dst, rows)
            }
            (Kernel::AddBias { part }, Step::Bias) => {
                let b = dl.bias.as_ref().ok_or_else(|| missing("biases"))?;
                let (x, width) = [(p.q, q_dim), (p.k, kv_dim), (p.v, kv_dim)][part];
                g.add_bias(x, &b[part], width, rows * width)
            }
            (Kernel::Rope { part }, Step::Rope(_)) => {
                let (x, heads) = [(p.q, d.n_head), (p.k, d.n_kv_head)][part];
                g.rope(
                    x,
                    self.rope_table(covered),
                    rows,
                    heads,
                    hd,
                    d.rope_dim,
                    c.rope_neox,
                )
            }
            (Kernel::RopeKv { bias }, _) => {
                let b = if bias {
                    Some(dl.bias.as_ref().ok_or_else(|| missing("biases"))?)
                } else {
                    None
                };
                g.rope_kv_write(&RopeKvArgs {
                    q: p.q,
                    k: p.k,
                    v: p.v,
                    bias: b,
                    cs: self.rope_table(covered),
                    rows,
                    c,
                    d,
                    stride: self.kv_stride,
                    pool: p.pool,
                    row_blocks: p.row_blocks,
                    row_slots: p.row_slots,
                    layer: l,
                    bt: self.bt,
                    block_len: p.block_len,
                })
            }
            (Kernel::QueryTemp, Step::QueryTemp) => {
                let t = p.temp.ok_or_else(|| missing("attention temperatures"))?;
                g.scale_rows(p.q, t, q_dim, rows * q_dim)
            }
            (Kernel::KvWrite, Step::KvWrite) => g.kv_write(
                (p.k, p.v),
                rows,
                (kv_dim, self.kv_stride),
                l,
                self.bt,
                (p.pool, p.row_blocks, p.row_slots),
                p.block_len,
            ),
            (Kernel::AttnPartial { gqa, wide }, Step::Attention { window, .. }) => {
                g.attn_partial(&self.attn_args(gqa, wide, window, (l, l), rows, 0))
            }
            (Kernel::AttnPartial { gqa, wide }, Step::AttendShared { window, layer }) => {
                g.attn_partial(&self.attn_args(gqa, wide, window, (l, layer), rows, 0))
            }
            (Kernel::AttnCombine { wide }, Step::Attention { .. } | Step::AttendShared { .. }) => {
                let sinks = matches!(step, Step::Attention { sinks: true, .. });
                let psinks = match (sinks, &dl.sinks) {
                    (false, _) => 0u64,
                    (true, Some(sk)) => ptr(sk, &g.stream),
                    (true, None) => return Err(missing("attention sinks")),
                };
                // The combine reads neither the window nor the KV layer.
                g.attn_combine(&self.attn_args(false, wide, None, (l, l), rows, psinks))
            }
            (Kernel::LatentProject, Step::LatentProject) => {
                let m = dl
                    .latent
                    .as_ref()
                    .ok_or_else(|| missing("latent attention"))?;
                self.latent(rows)?.project(m, p.xb)
            }
            (Kernel::Absorb, Step::Absorb) => {
                let m = dl
                    .latent
                    .as_ref()
                    .ok_or_else(|| missing("latent attention"))?;
                self.latent(rows)?.absorb(m, p.q, p.k, p.v)
            }
            (Kernel::Expand, Step::Expand) => {
                let m = dl
                    .latent
                    .as_ref()
                    .ok_or_else(|| missing("latent attention"))?;
                self.latent(rows)?.expand(m, p.attn)
            }
            // A layer reading another layer's KV has no keys or values of its own (and no
            // launch may have an empty grid).
            (Kernel::KeyAsValue | Kernel::VNorm, _) if kv_dim == 0 => Ok(()),
            (Kernel::KeyAsValue, Step::KeyAsValue) => {
                g.copy_cols(p.k, kv_dim, 0, p.v, kv_dim, 0, kv_dim, rows)
            }
            (Kernel::VNorm, Step::VNorm) => {
                g.rms_norm(p.v, self.ones, p.v, rows * d.n_kv_head, hd, c.rms_eps)
            }
            (Kernel::LayerScale, Step::LayerScale) => {
                let s = dl.out_scale.ok_or_else(|| missing("an output scale"))?;
                g.scale(p.x, s, rows * dim)
            }
            (Kernel::PerLayerInputs, Step::PerLayerInputs) => self.ple(rows)?.inputs(p.x),
            (Kernel::PerLayerEmbed, Step::PerLayerEmbed) => {
                let w = dl
                    .ple
                    .as_ref()
                    .ok_or_else(|| missing("a per-layer embedding"))?;
                self.ple(rows)?.embed(w, l, p.x, p.xb)
            }
            (Kernel::AddInPlace, Step::Residual) => g.add(p.x, p.xb, rows * dim),
            (Kernel::GatedAct, Step::Gated(activation)) => {
                let ffn = d.ffn_dim;
                let act = match activation {
                    Activation::Silu => 0i32,
                    // llama.cpp's CUDA backend computes GELU in f32, without the CPU's table.
                    Activation::GeluTanh | Activation::GeluTanhF16 => 1i32,
                    // The CPU's expf (`gated_act_cpu`).
                    Activation::SwigluOai => return g.gated_cpu(p.gate, p.up, rows * ffn, 0),
                };
                g.gated(p.gate, p.up, rows * ffn, act)
            }
            (Kernel::OutBias, Step::OutBias) => {
                let b = dl
                    .out_bias
                    .as_ref()
                    .ok_or_else(|| missing("an output bias"))?;
                g.add_bias(p.xb, b, dim, rows * dim)
            }
            (Kernel::OutBias, Step::NormBias(block)) => {
                let [a, f] = dl
                    .norm_bias
                    .as_ref()
                    .ok_or_else(|| missing("norm biases"))?;
                let b = match block {
                    Block::Attn => a,
                    Block::Ffn => f,
                };
                g.add_bias(p.xb, b, dim, rows * dim)
            }
            (Kernel::Route, Step::Route(gating)) => {
                let (m, b) = self.moe_of(dl).ok_or_else(|| missing("experts"))?;
                self.route(m, b, gating, rows)
            }
            (Kernel::Experts, Step::Experts(activation)) => {
                let (m, b) = self.moe_of(dl).ok_or_else(|| missing("experts"))?;
                self.experts(m, b, activation, rows)
            }
            (Kernel::Combine, Step::Combine) => {
                let (m, b) = self.moe_of(dl).ok_or_else(|| missing("experts"))?;
                let s = &*g.stream;
                let (used_i, dim_i, total) =
                    (m.config.used as i32, dim as i32, (rows * dim) as i64);
                let (pout, pslot, pw) = (ptr(&b.out, s), ptr(&b.slot, s), ptr(&b.weights, s));
                let mut lb = s.launch_builder(&g.k.moe_combine);
                lb.arg(&pout)
                    .arg(&pslot)
                    .arg(&pw)
                    .arg(&used_i)
                    .arg(&dim_i)
                    .arg(&p.xb)
                    .arg(&total);
                // SAFETY: out holds rows × used grouped rows of dim (Experts wrote them), slot
                // and weights rows × used entries; xb rows × dim.
                g.launched("moe_combine", unsafe { lb.launch(ew(rows * dim)) })?;
                Ok(())
            }
            (Kernel::SharedExpert, Step::SharedExpert(act)) => {
                let (m, b) = self.moe_of(dl).ok_or_else(|| missing("experts"))?;
                let sh = m
                    .shared
                    .as_ref()
                    .ok_or_else(|| missing("a shared expert"))?;
                let code = match act {
                    Activation::SwigluOai => 0,
                    Activation::Silu => 1,
                    Activation::GeluTanh | Activation::GeluTanhF16 => {
                        return Err(ModelError::Device(
                            "cuda: a GELU shared expert has no GPU kernel; run this model with \
                             --device cpu"
                                .into(),
                        ))
                    }
                };
                let s = &*g.stream;
                let f = sh.down.k;
                let (sg, su, so, sl) = (
                    ptr(&b.shared_gate, s),
                    ptr(&b.shared_up, s),
                    ptr(&b.shared_out, s),
                    ptr(&b.shared_logit, s),
                );
                let q = g.matmul_into(&sh.gate, p.xb, rows, sg, self.act, None, false)?;
                g.matmul_into(&sh.up, p.xb, rows, su, self.act, q, false)?;
                g.gated_cpu(sg, su, rows * f, code)?;
                g.matmul_into(&sh.down, sg, rows, so, self.act, None, false)?;
                // DeepSeek's shared experts are ungated.
                let Some(gate_inp) = &sh.gate_inp else {
                    return Ok(());
                };
                g.matmul_into(gate_inp, p.xb, rows, sl, self.act, None, false)?;
                g.shared_gate(so, sl, dim, rows)
            }
            (Kernel::RmsNorm { .. }, Step::SetAside | Step::ExpertNorm | Step::ExpertPostNorm) => {
                let (m, b) = self.moe_of(dl).ok_or_else(|| missing("experts"))?;
                let n = m
                    .beside
                    .as_ref()
                    .ok_or_else(|| missing("an MLP beside its experts"))?;
                let (w, x, y) = match step {
                    Step::SetAside => (&n.post_norm, p.xb, ptr(&b.shared_out, &g.stream)),
                    Step::ExpertNorm => (&n.experts_norm, p.x, p.xb),
                    _ => (&n.experts_post_norm, p.xb, p.xb),
                };
                g.rms_norm(x, w, y, rows, dim, c.rms_eps)
            }
            (Kernel::RouterNorm, Step::RouterNorm) => {
                let (m, _) = self.moe_of(dl).ok_or_else(|| missing("experts"))?;
                let n = m
                    .beside
                    .as_ref()
                    .ok_or_else(|| missing("an MLP beside its experts"))?;
                g.rms_norm(p.x, &n.router_scale, p.xb, rows, dim, c.rms_eps)?;
                g.scale(p.xb, 1.0 / (dim as f32).sqrt(), rows * dim)
            }
            (Kernel::AddShared, Step::AddShared) => {
                let (_, b) = self.moe_of(dl).ok_or_else(|| missing("experts"))?;
                g.add(p.xb, ptr(&b.shared_out, &g.stream), rows * dim)
            }
            (
                Kernel::DeltaProject
                | Kernel::Conv
                | Kernel::DeltaPrep
                | Kernel::DeltaRule
                | Kernel::GatedNorm
                | Kernel::SplitGate { .. }
                | Kernel::OutGate,
                _,
            ) => {
                let hy = self
                    .hybrid
                    .ok_or_else(|| missing("a hybrid model's buffers"))?;
                self.hybrid_launch((launch.kernel, step), l, dl, hy, rows, &missing)
            }
            (kernel, step) => Err(ModelError::Device(format!(
                "cuda: no launch of {kernel:?} for plan step {step:?} in a layer"
            ))),
        }
    }

    /// One launch of a hybrid layer's steps (linear attention, the output gate) of layer `l`,
    /// on `rows` rows; `lacks` names what the layer lacks.
    fn hybrid_launch(
        &self,
        (kernel, step): (Kernel, Step),
        l: usize,
        dl: &DevLayer,
        hy: HybridRun<'_>,
        rows: usize,
        lacks: &dyn Fn(&str) -> ModelError,
    ) -> Result<()> {
        let (g, c, p) = (self.g, self.c, &self.p);
        let (b, h) = (hy.b, hy.h);
        let s = &*g.stream;
        let delta = || dl.delta.as_ref().ok_or_else(|| lacks("linear attention"));
        match (kernel, step) {
            (Kernel::DeltaProject, Step::DeltaProject) => {
                let d = delta()?;
                let w = dl.qkv.first().ok_or_else(|| lacks("a q|k|v projection"))?;
                // One quantization of xb for the four while their blocks agree.
                let mut q = None;
                for (w, y) in [
                    (w, &b.mixed),
                    (&d.z, &b.z),
                    (&d.beta, &b.beta),
                    (&d.alpha, &b.alpha),
                ] {
                    q = g.matmul_into(w, p.xb, rows, ptr(y, s), self.act, q, false)?;
                }
                Ok(())
            }
            (Kernel::Conv, Step::Conv) => {
                let (mixed, conv) = (ptr(&b.mixed, s), ptr(&b.conv, s));
                g.delta_conv(mixed, conv, hy.q, h, l, &delta()?.conv)
            }
            (Kernel::DeltaPrep, Step::DeltaRule) => g.delta_prep(b, delta()?, h, rows, c.rms_eps),
            (Kernel::DeltaRule, Step::DeltaRule) => {
                delta()?;
                g.delta_rule(b, hy.q, h, l, p.attn)
            }
            (Kernel::GatedNorm, Step::GatedNorm) => {
                g.gated_norm(p.attn, &b.z, &delta()?.norm, h, rows, c.rms_eps)
            }
            (Kernel::SplitGate { part }, Step::SplitGate) => {
                let hd = c.head_dim;
                let dst = [p.q, ptr(&b.gate, s)][part];
                g.split(p.fused, 2 * hd, part * hd, hd, dst, rows * c.n_head)
            }
            (Kernel::OutGate, Step::OutGate) => g.out_gate(p.attn, &b.gate, rows * c.q_dim()),
            (kernel, step) => Err(ModelError::Device(format!(
                "cuda: no launch of {kernel:?} for plan step {step:?} in a layer"
            ))),
        }
    }

    /// The per-layer embedding steps' launches on `rows` rows.
    fn ple(&self, rows: usize) -> Result<PleRun<'_>> {
        let (b, e) = self.ple.ok_or_else(|| {
            ModelError::Device("cuda: a per-layer embedding step without its weights".into())
        })?;
        Ok(PleRun {
            g: self.g,
            act: self.act,
            b,
            e,
            tokens: self.p.layer_tokens,
            rows,
            n_layer: self.c.n_layer,
            dim: self.c.dim,
            eps: self.c.rms_eps,
        })
    }

    /// The latent steps' launches on `rows` rows.
    fn latent(&self, rows: usize) -> Result<LatentRun<'_>> {
        let b = self.mla.ok_or_else(|| {
            ModelError::Device("cuda: a latent-attention step without its buffers".into())
        })?;
        Ok(LatentRun {
            g: self.g,
            act: self.act,
            b,
            rows,
            eps: self.c.rms_eps,
        })
    }

    /// A Mixture-of-Experts layer's device weights and the step's buffers for them.
    fn moe_of<'b>(&'b self, dl: &'b DevLayer) -> Option<(&'b DevMoe, &'b MoeBufs)> {
        Some((dl.moe.as_ref()?, self.moe?))
    }

    /// The router's logits of `xb` (its matmul), then `moe_route`: each row's experts and
    /// weights in rank order, ties to the lower expert.
    fn route(&self, m: &DevMoe, b: &MoeBufs, gating: Gating, rows: usize) -> Result<()> {
        let (g, p) = (self.g, &self.p);
        let s = &*g.stream;
        let plogits = ptr(&b.logits, s);
        g.matmul_into(&m.router, p.xb, rows, plogits, self.act, None, false)?;
        let code = gating_code(gating);
        let pbias = m.router_bias.as_ref().map_or(0u64, |v| ptr(v, s));
        let psel_bias = m.selection_bias.as_ref().map_or(0u64, |v| ptr(v, s));
        let (rows_i, experts_i, used_i) =
            (rows as i32, m.config.experts as i32, m.config.used as i32);
        let (groups, best) = m
            .config
            .groups
            .map_or((0, 0), |(g, b)| (g as i32, b as i32));
        let (pch, pw, psel) = (ptr(&b.chosen, s), ptr(&b.weights, s), ptr(&b.select, s));
        let mut lb = s.launch_builder(&g.k.moe_route);
        lb.arg(&plogits)
            .arg(&pbias)
            .arg(&rows_i)
            .arg(&experts_i)
            .arg(&used_i)
            .arg(&code)
            .arg(&pch)
            .arg(&pw)
            .arg(&psel_bias)
            .arg(&psel)
            .arg(&groups)
            .arg(&best)
            .arg(&m.config.weights_scale);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(64) as u32, 1, 1),
            block_dim: (64, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: logits and select hold rows × experts floats, each bias (when given)
        // experts, chosen and weights rows × used (fit); groups divide the experts and are at
        // most MOE_MAX_GROUPS (checked at load).
        g.launched("moe_route", unsafe { lb.launch(cfg) })?;
        Ok(())
    }

    /// Rows grouped by expert (`moe_group`), the grouped rows gathered, then their gate/up
    /// matmuls, biases (up, then gate, as ggml), activation (SiLU and SwiGLU-OAI with the
    /// CPU's `expf`; Gemma 4's GELU as its feed-forward's), down matmul, output scale (Gemma
    /// 4) and bias, into the grouped output. Where the layer has address tables, each matmul
    /// is one launch over every grouped row by its own expert ([`ExpertLaunch`]: row by row
    /// up to [`GROUPED_ROWS`] grouped rows, else in row tiles of one expert); else each
    /// expert's row count is read back to the host, which launches the routed experts one by
    /// one in index order. Each row's bits are the same every way.
    fn experts(&self, m: &DevMoe, b: &MoeBufs, act: Activation, rows: usize) -> Result<()> {
        let (g, c, p) = (self.g, self.c, &self.p);
        let s = &*g.stream;
        let (experts, used, ffn, dim) = (m.config.experts, m.config.used, m.config.ffn_dim, c.dim);
        // `gated_act_cpu`'s code, or `None`: `gated_act`'s GELU.
        let code = match act {
            Activation::SwigluOai => Some(0),
            Activation::Silu => Some(1),
            Activation::GeluTanh | Activation::GeluTanhF16 => None,
        };
        let pairs = rows * used;
        let (pairs_i, used_i, experts_i) = (pairs as i32, used as i32, experts as i32);
        let (pch, pidx, pslot, pcounts, pgexp) = (
            ptr(&b.chosen, s),
            ptr(&b.idx, s),
            ptr(&b.slot, s),
            ptr(&b.counts, s),
            ptr(&b.gexp, s),
        );
        let mut lb = s.launch_builder(&g.k.moe_group);
        lb.arg(&pch)
            .arg(&pairs_i)
            .arg(&used_i)
            .arg(&experts_i)
            .arg(&pidx)
            .arg(&pslot)
            .arg(&pcounts)
            .arg(&pgexp);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (experts as u32, 1, 1),
            shared_mem_bytes: (experts * 4) as u32,
        };
        // SAFETY: chosen holds pairs expert indices < experts (moe_route), idx, slot and gexp
        // pairs entries, counts experts; one thread per expert (at most 1024, checked at load).
        g.launched("moe_group", unsafe { lb.launch(cfg) })?;
        let (dim_i, total) = (dim as i32, (pairs * dim) as i64);
        let pin = ptr(&b.input, s);
        let (pgate, pup, pout) = (ptr(&b.gate, s), ptr(&b.up, s), ptr(&b.out, s));
        let mut lb = s.launch_builder(&g.k.gather_rows);
        lb.arg(&p.xb).arg(&pidx).arg(&dim_i).arg(&pin).arg(&total);
        // SAFETY: every idx is a row of this step; input holds pairs × dim floats.
        g.launched("gather_rows", unsafe { lb.launch(ew(pairs * dim)) })?;
        let how = expert_launch(pairs, self.grouped_rows, g.has_mma());
        if let (Some(t), false) = (&m.grouped, how == ExpertLaunch::PerExpert) {
            let x = &m.experts[0];
            let tab = |t: &CudaSlice<u64>| (ptr(t, s), pgexp);
            let max_tiles = max_expert_tiles(pairs, experts);
            let ptiles = ptr(&b.tiles, s);
            if how == ExpertLaunch::Tiles {
                g.moe_tiles(pcounts, experts, ptiles, max_tiles)?;
            }
            // One grouped matmul: `w` of each row's expert (its address table `wt`).
            let mm = |w, wt: &CudaSlice<u64>, x, y, q| match how {
                ExpertLaunch::Tiles => {
                    let tiles = (ptr(wt, s), ptiles, max_tiles);
                    g.matmul_expert_tiles(w, tiles, x, pairs, y, self.act, q)
                }
                _ => g.matmul_experts(w, tab(wt), x, pairs, y, self.act, q),
            };
            let q = mm(&x.gate, &t.gate, pin, pgate, None)?;
            mm(&x.up, &t.up, pin, pup, q)?;
            if let Some([bg, bu, _]) = &t.bias {
                g.add_bias_experts(pup, tab(bu), ffn, pairs * ffn)?;
                g.add_bias_experts(pgate, tab(bg), ffn, pairs * ffn)?;
            }
            match code {
                Some(code) => g.gated_cpu(pgate, pup, pairs * ffn, code)?,
                None => g.gated(pgate, pup, pairs * ffn, 1)?,
            }
            mm(&x.down, &t.down, pgate, pout, None)?;
            // Each row's expert's output scale, before any bias (as below).
            if let Some(sc) = &t.down_scale {
                g.scale_experts(pout, (ptr(sc, s), pgexp), dim, pairs * dim)?;
            }
            if let Some([_, _, bd]) = &t.bias {
                g.add_bias_experts(pout, tab(bd), dim, pairs * dim)?;
            }
            return Ok(());
        }
        let mut counts = vec![0i32; experts];
        g.stream
            .memcpy_dtoh(&b.counts, counts.as_mut_slice())
            .map_err(|e| dev_err("reading the experts' row counts", e))?;
        s.synchronize().map_err(|e| dev_err("moe_group", e))?;
        let mut off = 0usize;
        for (e, x) in m.experts.iter().enumerate() {
            let n = counts[e] as usize;
            if n == 0 {
                continue;
            }
            let at = |base: u64, width: usize| base + (off * width * 4) as u64;
            let (xi, gt, up, out) = (at(pin, dim), at(pgate, ffn), at(pup, ffn), at(pout, dim));
            let q = g.matmul_into(&x.gate, xi, n, gt, self.act, None, false)?;
            g.matmul_into(&x.up, xi, n, up, self.act, q, false)?;
            if let Some([bg, bu, _]) = &x.bias {
                g.add_bias(up, bu, ffn, n * ffn)?;
                g.add_bias(gt, bg, ffn, n * ffn)?;
            }
            match code {
                Some(code) => g.gated_cpu(gt, up, n * ffn, code)?,
                None => g.gated(gt, up, n * ffn, 1)?,
            }
            g.matmul_into(&x.down, gt, n, out, self.act, None, false)?;
            // ggml's `mul` of the down product by the expert's scale, before any bias.
            if let Some(s) = &m.down_scale {
                g.scale(out, s[e], n * dim)?;
            }
            if let Some([_, _, bd]) = &x.bias {
                g.add_bias(out, bd, dim, n * dim)?;
            }
            off += n;
        }
        if off != pairs {
            return Err(ModelError::Device(format!(
                "cuda: {off} of {pairs} routed rows grouped"
            )));
        }
        Ok(())
    }

    /// The attention launches' arguments for layer `l`'s queries over the KV of layer
    /// `from` (itself, or the earlier layer it shares: the same head size); `gqa` asks for
    /// the group kernel (each tile of K/V staged once for the query heads of a KV head, the
    /// same bits as one warp per query head).
    fn attn_args(
        &self,
        gqa: bool,
        wide: bool,
        window: Option<usize>,
        (l, from): (usize, usize),
        rows: usize,
        sinks: u64,
    ) -> AttnArgs {
        let (c, p, d) = (self.c, &self.p, self.dims[l]);
        AttnArgs {
            q: p.q,
            pool: p.pool,
            tables: p.tables,
            table_offsets: p.table_offsets,
            positions: p.positions,
            part: p.part,
            out: p.attn,
            sinks,
            rows,
            heads: d.n_head,
            kv_heads: self.dims[from].n_kv_head,
            head_dim: d.head_dim,
            kv_stride: self.kv_stride,
            layer: from,
            bt: self.bt,
            block_len: p.block_len,
            scale: c.attn_scale,
            cap: c.attn_softcap.unwrap_or(0.0),
            window: window.map_or(0, |w| w as i32),
            chunks: self.chunks,
            gqa,
            wide,
        }
    }

    /// One launch of the head (its plan steps `steps`) on the `m` wanted rows (indices at
    /// `wanted`).
    fn head(
        &self,
        launch: &Launch,
        steps: &[Step],
        model: &CudaModel,
        wanted: u64,
        m: usize,
    ) -> Result<()> {
        let (g, c, p) = (self.g, self.c, &self.p);
        let dim = c.dim;
        match (launch.kernel, steps[launch.steps.start]) {
            (Kernel::GatherRows, Step::Gather) => {
                let (dim_i, total) = (dim as i32, (m * dim) as i64);
                let mut lb = g.stream.launch_builder(&g.k.gather_rows);
                lb.arg(&p.x).arg(&wanted).arg(&dim_i).arg(&p.xb).arg(&total);
                // SAFETY: every wanted index is a row of this step; xb holds rows × dim floats.
                g.launched("gather_rows", unsafe { lb.launch(ew(m * dim)) })?;
                Ok(())
            }
            (Kernel::RmsNorm { .. }, Step::FinalNorm) => {
                g.rms_norm(p.xb, &model.output_norm, p.attn, m, dim, c.rms_eps)
            }
            (Kernel::NormQuant(a), Step::FinalNorm) => g.rms_norm_q8(
                p.xb,
                &model.output_norm,
                p.attn,
                m,
                dim,
                c.rms_eps,
                a,
                self.act,
            ),
            (Kernel::Matmul { act, quantized, .. }, Step::Project(Matrix::Logits)) => {
                let q = Self::quantized(act, quantized);
                g.matmul_into(&model.output, p.attn, m, p.logits, self.act, q, false)?;
                Ok(())
            }
            (Kernel::OutBias, step @ (Step::FinalNormBias | Step::LogitBias)) => {
                let [n, o] = model.head_bias.as_ref().ok_or_else(|| {
                    ModelError::Device("cuda: a head bias step without head biases".into())
                })?;
                match step {
                    Step::FinalNormBias => g.add_bias(p.attn, n, dim, m * dim),
                    _ => g.add_bias(p.logits, o, c.vocab_size, m * c.vocab_size),
                }
            }
            (Kernel::Softcap, Step::Softcap) => {
                let cap = c.final_softcap.ok_or_else(|| {
                    ModelError::Device("cuda: a softcap step without a cap".into())
                })?;
                let total = (m * c.vocab_size) as i64;
                let mut lb = g.stream.launch_builder(&g.k.softcap);
                lb.arg(&p.logits).arg(&cap).arg(&total);
                // SAFETY: logits holds m × vocab floats.
                g.launched("softcap", unsafe { lb.launch(ew(m * c.vocab_size)) })?;
                Ok(())
            }
            (kernel, step) => Err(ModelError::Device(format!(
                "cuda: no launch of {kernel:?} for plan step {step:?} in the head"
            ))),
        }
    }
}

/// The widest attention head the kernels take (`attn_partial_wide`: 18 dimensions per lane;
/// Multi-head Latent Attention's 512 + 64); `attn_partial` and `attn_partial_gqa` take 256.
const WIDE_HEAD: usize = 576;

/// `moe.cu`'s `MOE_MAX_GROUPS`: the most expert groups `moe_route` keeps scores of.
const MOE_MAX_GROUPS: usize = 64;

/// The kernels' gating code (`moe_route`'s `gating`).
pub(super) fn gating_code(g: Gating) -> i32 {
    match g {
        Gating::SoftmaxTopK { normalize: false } => 0,
        Gating::SoftmaxTopK { normalize: true } => 1,
        Gating::TopKSoftmax => 2,
        Gating::Deepseek { sigmoid, normalize } => {
            3 + 2 * i32::from(sigmoid) + i32::from(normalize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::devices::open_gpu;
    use super::super::emulate::{quantize_q8, quantize_q8k, Acts};
    use super::super::kernels::{compile_kernels, Kind};
    use super::super::nvrtc;
    use super::super::weights::{kind_of, upload_weight};
    use super::*;
    use crate::model::arch::Arch;
    use crate::model::lowering::act_blocks;
    use crate::model::quant::tests::noise;
    use crate::model::quant::WeightFormat;
    use crate::model::transformer::{add_rows, apply_rope};

    fn config(n_head: usize, n_kv_head: usize, hd: usize, rd: usize, neox: bool) -> ModelConfig {
        ModelConfig {
            architecture: "qwen2".into(),
            arch: Arch::Qwen2,
            n_layer: 3,
            dim: 512,
            ffn_dim: 1024,
            n_head,
            n_kv_head,
            head_dim: hd,
            rope_dim: rd,
            rope_neox: neox,
            rope_base: 1e4,
            rope_base_swa: 1e4,
            rope_scale: 1.0,
            rope_scale_swa: 1.0,
            rms_eps: 1e-6,
            context_len: 64,
            vocab_size: 32,
            embed_scale: None,
            activation: Activation::Silu,
            attn_scale: 0.125,
            attn_softcap: None,
            final_softcap: None,
            sliding_window: None,
            swa_layers: vec![false; 3],
            moe: None,
            yarn: None,
            attn_temp: None,
            nope_layers: Vec::new(),
            long_rope: None,
            rope_sections: None,
            norm_bias: false,
            mla: None,
        }
    }

    /// The fused kernels are in the PTX NVRTC compiles (no GPU needed).
    /// A graph replays its capture's arguments, so its key must hold every buffer address a
    /// launch takes: each field of `Ptrs` (read from this file's source) and the activation
    /// scratch are in `GraphKey::of`, and each `Run` field is either there or the model's.
    #[test]
    fn the_graph_key_holds_every_buffer_a_launch_takes() {
        let src = include_str!("forward.rs");
        let body = |start: &str| {
            let at = src
                .find(start)
                .unwrap_or_else(|| panic!("{start} not found"));
            let rest = &src[at..];
            &rest[..rest.find("\n}\n").expect("end")]
        };
        // A struct's field names, from its definition.
        let fields_of = |start: &str| -> Vec<&str> {
            body(start)
                .lines()
                .skip(1)
                .map(str::trim)
                .filter(|l| !l.starts_with("//"))
                .filter_map(|l| l.split(':').next())
                .filter(|f| !f.is_empty())
                .collect()
        };
        let key =
            body("    fn of(run: &Run<'_>, rows: usize, m: usize, wanted: u64, generation: u64)");
        let fields = fields_of("struct Ptrs {");
        assert!(fields.len() >= 20, "{fields:?}");
        let names = |f: &str| {
            let word = format!("p.{f}");
            key.match_indices(&word).any(|(i, _)| {
                let next = key[i + word.len()..].chars().next();
                !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        };
        for f in fields {
            assert!(names(f), "GraphKey::of leaves out Ptrs::{f}");
        }
        for f in [
            "run.chunks",
            "run.act.ptrs",
            "rows",
            "m,",
            "wanted",
            "generation",
        ] {
            assert!(key.contains(f), "GraphKey::of leaves out {f}");
        }
        // `Run`'s other fields: the device, the configuration, the MoE, hybrid, latent and
        // per-layer buffers (reallocated only with the generation; a hybrid step's sequences
        // and states are in `Ptrs`), the grouped expert launches' limit (a test's change of it
        // drops the graphs) and the KV block size are the model's for its lifetime.
        assert_eq!(
            fields_of("struct Run<'a> {"),
            [
                "g",
                "c",
                "act",
                "moe",
                "hybrid",
                "mla",
                "dims",
                "ple",
                "ones",
                "kv_stride",
                "grouped_rows",
                "p",
                "chunks",
                "bt"
            ]
        );
    }

    #[test]
    fn fused_kernels_compile_with_nvrtc() {
        if let Err(e) = nvrtc::library() {
            crate::skip::absent(
                crate::skip::Need::Nvrtc,
                format!("libnvrtc is not loadable (see .ci/run): {e}"),
            );
            return;
        }
        let src = compile_kernels(Some((9, 0))).expect("compile").to_src();
        for name in ["rms_norm_q8", "rope_kv_write"] {
            assert!(src.contains(name), "PTX lacks {name}");
        }
    }

    /// The lowering's activation blocks are the kernels' codes for every format.
    #[test]
    fn the_lowering_and_the_kernels_agree_on_activation_blocks() {
        use WeightFormat::*;
        for f in [
            F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4K, Q5K, Q6K, Mxfp4,
        ] {
            let kind: Kind = kind_of(f);
            assert_eq!(kind.act(), act_blocks(f).map(ActBlocks::code), "{f:?}");
        }
    }

    /// The pool as `rope_kv_write` leaves it and q, thread by thread as the kernel runs
    /// (`fused.cu`), on the host: Rust's f32 `+`, `*`, `-` round as `__fadd_rn` and friends.
    #[allow(clippy::too_many_arguments)]
    fn emulate_rope_kv_write(
        c: &ModelConfig,
        q: &mut [f32],
        k: &[f32],
        v: &[f32],
        bias: Option<&[Vec<f32>; 3]>,
        cs: &[f32],
        rows: usize,
        pool: &mut [u16],
        row_block: &[usize],
        row_slot: &[usize],
        layer: usize,
        bt: usize,
        block_len: usize,
    ) {
        let (heads, kv_heads, hd, rd) = (c.n_head, c.n_kv_head, c.head_dim, c.rope_dim);
        let (pairs, rpairs, all) = (hd / 2, rd / 2, heads + 2 * kv_heads);
        let kv_dim = kv_heads * hd;
        for i in 0..rows * all * pairs {
            let p = i % pairs;
            let rh = i / pairs;
            let (h, r) = (rh % all, rh / all);
            let (a, b) = if p < rpairs {
                if c.rope_neox {
                    (p, p + rpairs)
                } else {
                    (2 * p, 2 * p + 1)
                }
            } else {
                let a = rd + 2 * (p - rpairs);
                (a, a + 1)
            };
            let (src, part, col): (&[f32], usize, usize) = if h < heads {
                (&q[r * heads * hd..], 0, h * hd)
            } else if h < heads + kv_heads {
                (&k[r * kv_dim..], 1, (h - heads) * hd)
            } else {
                (&v[r * kv_dim..], 2, (h - heads - kv_heads) * hd)
            };
            let (mut x0, mut x1) = (src[col + a], src[col + b]);
            if let Some(bs) = bias {
                x0 += bs[part][col + a];
                x1 += bs[part][col + b];
            }
            if h < heads + kv_heads && p < rpairs {
                let (cc, sn) = (cs[r * rd + 2 * p], cs[r * rd + 2 * p + 1]);
                (x0, x1) = (x0 * cc - x1 * sn, x0 * sn + x1 * cc);
            }
            if h < heads {
                q[r * heads * hd + col + a] = x0;
                q[r * heads * hd + col + b] = x1;
                continue;
            }
            let is_value = usize::from(h >= heads + kv_heads);
            let at = row_block[r] * block_len
                + ((layer * 2 + is_value) * bt + row_slot[r]) * kv_dim
                + col;
            pool[at + a] = half::f16::from_f32(x0).to_bits();
            pool[at + b] = half::f16::from_f32(x1).to_bits();
        }
    }

    /// `rope_kv_write`'s threads, emulated, give the CPU's bias + RoPE bits for q, and write
    /// the CPU's keys and values (rounded to f16) at `kv_write`'s offsets, touching nothing
    /// else: adjacent and NEOX pairs, partial rotary dimensions, with and without biases.
    #[test]
    fn rope_kv_write_emulated_gives_the_cpu_bias_rope_and_kv_write() {
        let (rows, bt, layer, blocks) = (3usize, 4usize, 1usize, 5usize);
        for (neox, rd, with_bias) in [
            (false, 64, true),
            (true, 64, false),
            (true, 32, true),
            (false, 48, false),
        ] {
            let c = config(4, 2, 64, rd, neox);
            let (q_dim, kv_dim, hd) = (c.q_dim(), c.kv_dim(), c.head_dim);
            let q0 = noise(1, rows * q_dim);
            let (k0, v0) = (noise(2, rows * kv_dim), noise(3, rows * kv_dim));
            let bias = [noise(4, q_dim), noise(5, kv_dim), noise(6, kv_dim)];
            let cs = noise(7, rows * rd);
            let block_len = c.n_layer * 2 * bt * kv_dim;
            let (row_block, row_slot) = ([3usize, 0, 3], [1usize, 2, 3]);
            // The CPU: biases, then RoPE per head.
            let (mut q, mut k, mut v) = (q0.clone(), k0.clone(), v0.clone());
            if with_bias {
                add_rows(&mut q, &bias[0]);
                add_rows(&mut k, &bias[1]);
                add_rows(&mut v, &bias[2]);
            }
            for r in 0..rows {
                let t = &cs[r * rd..(r + 1) * rd];
                for h in 0..c.n_head {
                    apply_rope(&mut q[r * q_dim + h * hd..][..hd], t, rd, neox);
                }
                for h in 0..c.n_kv_head {
                    apply_rope(&mut k[r * kv_dim + h * hd..][..hd], t, rd, neox);
                }
            }
            let sentinel = 0x7e00u16;
            let mut pool = vec![sentinel; blocks * block_len];
            let mut gq = q0.clone();
            let b = with_bias.then_some(&bias);
            emulate_rope_kv_write(
                &c, &mut gq, &k0, &v0, b, &cs, rows, &mut pool, &row_block, &row_slot, layer, bt,
                block_len,
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&gq), bits(&q), "q, neox {neox} rd {rd}");
            let mut want = vec![sentinel; blocks * block_len];
            for r in 0..rows {
                for (is_value, src) in [(0, &k), (1, &v)] {
                    let at = row_block[r] * block_len
                        + ((layer * 2 + is_value) * bt + row_slot[r]) * kv_dim;
                    for (d, &x) in want[at..at + kv_dim].iter_mut().zip(&src[r * kv_dim..]) {
                        *d = half::f16::from_f32(x).to_bits();
                    }
                }
            }
            assert_eq!(pool, want, "pool, neox {neox} rd {rd}");
        }
    }

    /// `scale_rows`' threads on the host: thread `i` multiplies value `i` by its row's factor
    /// (`__fmul_rn`, Rust's f32 `*`).
    fn emulate_scale_rows(x: &mut [f32], s: &[f32], width: usize) {
        for (i, v) in x.iter_mut().enumerate() {
            *v *= s[i / width];
        }
    }

    /// `scale_rows`, emulated, gives the CPU's query temperature bits, factors from rows at
    /// positions on both sides of the temperature's steps.
    #[test]
    fn scale_rows_emulated_gives_the_cpu_query_temperature() {
        use crate::model::arch::AttnTemp;
        use crate::model::transformer::scale_rows;
        let c = config(4, 2, 64, 64, false);
        let (rows, q_dim) = (6, c.q_dim());
        let t = AttnTemp {
            scale: 0.1,
            floor_scale: 2,
        };
        let s: Vec<f32> = (0..rows).map(|r| t.factor(3 * r)).collect();
        let q = noise(1, rows * q_dim);
        let (mut cpu, mut gpu) = (q.clone(), q.clone());
        scale_rows(&mut cpu, &s, q_dim);
        emulate_scale_rows(&mut gpu, &s, q_dim);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&gpu), bits(&cpu));
        assert_ne!(
            bits(&cpu),
            bits(&q),
            "the factors above 1 change the queries"
        );
    }

    /// `rms_norm_q8` (`fused.cu`) over the whole grid, as its threads run it: y, and the
    /// activation blocks each warp writes in its loop over the row's blocks.
    fn emulate_rms_norm_q8(
        x: &[f32],
        w: &[f32],
        rows: usize,
        dim: usize,
        eps: f32,
        kind: ActBlocks,
    ) -> (Vec<f32>, Acts) {
        let threads = dim.next_power_of_two().clamp(32, 1024);
        let warps = threads / 32;
        let mut y = vec![0f32; rows * dim];
        let nb32 = dim / 32;
        let mut acts = Acts {
            qs: vec![0; rows * dim],
            d: vec![f32::NAN; rows * nb32],
            s: if kind == ActBlocks::Q8_1 {
                vec![f32::NAN; rows * nb32]
            } else {
                Vec::new()
            },
            sums: vec![
                i32::MIN;
                if kind == ActBlocks::Q8K {
                    rows * dim / 16
                } else {
                    rows * nb32
                }
            ],
        };
        if kind == ActBlocks::Q8K {
            acts.d.truncate(rows * dim / 256);
        }
        for r in 0..rows {
            let base = r * dim;
            let scale = super::super::emulate::rms_scale(&x[base..base + dim], threads, eps);
            for i in 0..dim {
                y[base + i] = x[base + i] * scale * w[i];
            }
            let normed = |c: usize| x[base + c] * scale * w[c];
            for warp in 0..warps {
                if kind != ActBlocks::Q8K {
                    let nb = dim / 32;
                    let mut b = warp;
                    while b < nb {
                        let v: [f32; 32] = std::array::from_fn(|lane| normed(b * 32 + lane));
                        let a = v.iter().fold(0f32, |a, v| a.max(v.abs()));
                        let id = if a != 0.0 { 127.0 / a } else { 0.0 };
                        let mut sum = 0;
                        for (lane, &v) in v.iter().enumerate() {
                            let q = ((v * id).round_ties_even() as i32).clamp(-128, 127);
                            acts.qs[base + b * 32 + lane] = q as i8;
                            sum += q;
                        }
                        let dd = a / 127.0;
                        acts.d[r * nb + b] = half::f16::from_f32(dd).to_f32();
                        if kind == ActBlocks::Q8_1 {
                            acts.s[r * nb + b] = half::f16::from_f32(sum as f32 * dd).to_f32();
                        } else {
                            acts.sums[r * nb + b] = sum;
                        }
                        b += warps;
                    }
                    continue;
                }
                let nb = dim / 256;
                let mut b = warp;
                while b < nb {
                    let c0 = |lane: usize| b * 256 + lane * 8;
                    // The element of largest magnitude, the first of equal ones.
                    let (mut amax, mut mx) = (0f32, 0f32);
                    for i in 0..256 {
                        let v = normed(b * 256 + i);
                        if v.abs() > amax {
                            (amax, mx) = (v.abs(), v);
                        }
                    }
                    let iscale = if amax == 0.0 { 0.0 } else { -127.0 / mx };
                    let mut s8 = [0i32; 32];
                    for (lane, s8) in s8.iter_mut().enumerate() {
                        for j in 0..8 {
                            let v = normed(c0(lane) + j);
                            let q = if amax == 0.0 {
                                0
                            } else {
                                ((iscale * v).round_ties_even() as i32).clamp(-128, 127)
                            };
                            acts.qs[base + c0(lane) + j] = q as i8;
                            *s8 += q;
                        }
                    }
                    for lane in (0..32).step_by(2) {
                        acts.sums[r * (dim / 16) + b * 16 + lane / 2] = s8[lane] + s8[lane + 1];
                    }
                    acts.d[r * nb + b] = if amax == 0.0 { 0.0 } else { 1.0 / iscale };
                    b += warps;
                }
            }
        }
        (y, acts)
    }

    /// `rms_norm_q8` emulated equals `rms_norm` followed by the separate quantize kernels
    /// (`emulate.rs`'s `quantize_q8` / `quantize_q8k`, which the matmul tests check against
    /// the CPU): the same normed rows and every activation block, scale and sum at the same
    /// offsets, for the three kinds, with a zero row, rows wider than a block of threads
    /// (4608: several blocks per warp) and narrower (256: idle warps for Q8_K).
    #[test]
    fn rms_norm_q8_emulated_equals_rms_norm_then_quantize() {
        for dim in [4608usize, 256, 1536] {
            let rows = 3;
            let mut x: Vec<f32> = noise(21, rows * dim).iter().map(|v| v * 4.0).collect();
            x[dim..2 * dim].fill(0.0);
            x[7] = -x.iter().fold(0f32, |a, v| a.max(v.abs())) * 2.0;
            let w = noise(22, dim);
            let eps = 1e-6;
            let threads = dim.next_power_of_two().clamp(32, 1024);
            let mut y = vec![0f32; rows * dim];
            for r in 0..rows {
                let scale =
                    super::super::emulate::rms_scale(&x[r * dim..(r + 1) * dim], threads, eps);
                for i in 0..dim {
                    y[r * dim + i] = x[r * dim + i] * scale * w[i];
                }
            }
            for kind in [ActBlocks::Q8_0, ActBlocks::Q8_1, ActBlocks::Q8K] {
                let want = match kind {
                    ActBlocks::Q8K => quantize_q8k(&y, rows, dim),
                    _ => quantize_q8(&y, rows, dim, kind.code() as u8),
                };
                let (gy, got) = emulate_rms_norm_q8(&x, &w, rows, dim, eps, kind);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&gy), bits(&y), "{kind:?} dim {dim}: y");
                assert_eq!(got.qs, want.qs, "{kind:?} dim {dim}: quants");
                assert_eq!(bits(&got.d), bits(&want.d), "{kind:?} dim {dim}: scales");
                if kind == ActBlocks::Q8_1 {
                    assert_eq!(bits(&got.s), bits(&want.s), "{kind:?} dim {dim}: sums · d");
                } else {
                    assert_eq!(got.sums, want.sums, "{kind:?} dim {dim}: integer sums");
                }
            }
        }
    }

    /// On a GPU: `rms_norm_q8` writes the normed rows `rms_norm` writes and the activation
    /// blocks the matmul's own quantization writes (the three kinds), and `rope_kv_write`
    /// the q and pool bits of `add_bias` + `rope` + `kv_write`.
    #[test]
    fn fused_kernels_write_the_bits_of_the_separate_ones() {
        let gpu = match open_gpu(0) {
            Ok(g) => g,
            Err(e) => {
                crate::skip::absent(crate::skip::Need::Gpu, format!("no GPU: {e}"));
                return;
            }
        };
        let s = &gpu.stream;
        let (rows, dim) = (5usize, 4608usize);
        let mut x: Vec<f32> = noise(11, rows * dim).iter().map(|v| v * 3.0).collect();
        x[dim..2 * dim].fill(0.0);
        let w = gpu.upload("w", &noise(12, dim)).expect("w");
        let dx = gpu.upload("x", &x).expect("x");
        for (dtype, a) in [
            (candle_core::quantized::GgmlDType::Q8_0, ActBlocks::Q8_0),
            (candle_core::quantized::GgmlDType::Q4_1, ActBlocks::Q8_1),
            (candle_core::quantized::GgmlDType::Q4K, ActBlocks::Q8K),
        ] {
            let t = candle_core::Tensor::from_vec(
                noise(13, 8 * dim),
                (8, dim),
                &candle_core::Device::Cpu,
            )
            .expect("t");
            let qt = candle_core::quantized::QTensor::quantize(&t, dtype).expect("quantize");
            let qw = QWeight::from_qtensor(&qt).expect("weight");
            let dw = upload_weight(&gpu, "w", &qw, MatmulPath::Integer).expect("upload");
            let run = |fused: bool| {
                let act = gpu.act_bufs(rows * dim).expect("act");
                let y: CudaSlice<f32> = gpu.zeros("y", rows * dim).expect("y");
                let out: CudaSlice<f32> = gpu.zeros("out", rows * 8).expect("out");
                let (py, pout) = (ptr(&y, s), ptr(&out, s));
                if fused {
                    gpu.rms_norm_q8(ptr(&dx, s), &w, py, rows, dim, 1e-6, a, &act)
                        .expect("fused");
                    gpu.matmul_into(&dw, py, rows, pout, &act, Some(a.code()), false)
                        .expect("mm");
                } else {
                    gpu.rms_norm(ptr(&dx, s), &w, py, rows, dim, 1e-6)
                        .expect("norm");
                    gpu.matmul_into(&dw, py, rows, pout, &act, None, false)
                        .expect("mm");
                }
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                (
                    bits(s.clone_dtoh(&y).expect("y")),
                    bits(s.clone_dtoh(&out).expect("out")),
                    s.clone_dtoh(&act.qs).expect("qs"),
                    bits(s.clone_dtoh(&act.d).expect("d")),
                    bits(s.clone_dtoh(&act.s).expect("s")),
                    s.clone_dtoh(&act.sums).expect("sums"),
                )
            };
            assert_eq!(run(true), run(false), "{a:?}");
        }

        let (bt, layer, blocks) = (4usize, 1usize, 5usize);
        for (neox, rd, with_bias) in [(false, 64, true), (true, 32, false)] {
            let c = config(4, 2, 64, rd, neox);
            let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());
            let rows = 3;
            let up = |seed, n| gpu.upload("v", &noise(seed, n)).expect("upload");
            let bias = [up(4, q_dim), up(5, kv_dim), up(6, kv_dim)];
            let cs = up(7, rows * rd);
            let block_len = c.n_layer * 2 * bt * kv_dim;
            let rb = gpu.upload("rb", &[3i32, 0, 3]).expect("rb");
            let rs = gpu.upload("rs", &[1i32, 2, 3]).expect("rs");
            let run = |fused: bool| {
                let (q, k, v) = (
                    up(1, rows * q_dim),
                    up(2, rows * kv_dim),
                    up(3, rows * kv_dim),
                );
                let pool: CudaSlice<u16> = gpu
                    .upload("pool", &vec![0x7e00u16; blocks * block_len])
                    .expect("pool");
                let (pq, pk, pv, pp) = (ptr(&q, s), ptr(&k, s), ptr(&v, s), ptr(&pool, s));
                let (prb, prs) = (ptr(&rb, s), ptr(&rs, s));
                if fused {
                    gpu.rope_kv_write(&RopeKvArgs {
                        q: pq,
                        k: pk,
                        v: pv,
                        bias: with_bias.then_some(&bias),
                        cs: ptr(&cs, s),
                        rows,
                        c: &c,
                        d: LayerDims::uniform(&c, layer),
                        stride: kv_dim,
                        pool: pp,
                        row_blocks: prb,
                        row_slots: prs,
                        layer,
                        bt,
                        block_len: block_len as i64,
                    })
                    .expect("fused");
                } else {
                    if with_bias {
                        gpu.add_bias(pq, &bias[0], q_dim, rows * q_dim)
                            .expect("bias");
                        gpu.add_bias(pk, &bias[1], kv_dim, rows * kv_dim)
                            .expect("bias");
                        gpu.add_bias(pv, &bias[2], kv_dim, rows * kv_dim)
                            .expect("bias");
                    }
                    gpu.rope(pq, ptr(&cs, s), rows, c.n_head, c.head_dim, rd, neox)
                        .expect("rope");
                    gpu.rope(pk, ptr(&cs, s), rows, c.n_kv_head, c.head_dim, rd, neox)
                        .expect("rope");
                    gpu.kv_write(
                        (pk, pv),
                        rows,
                        (kv_dim, kv_dim),
                        layer,
                        bt,
                        (pp, prb, prs),
                        block_len as i64,
                    )
                    .expect("kv_write");
                }
                let q: Vec<u32> = s
                    .clone_dtoh(&q)
                    .expect("q")
                    .into_iter()
                    .map(f32::to_bits)
                    .collect();
                (q, s.clone_dtoh(&pool).expect("pool"))
            };
            assert_eq!(
                run(true),
                run(false),
                "neox {neox} rd {rd} bias {with_bias}"
            );
        }
    }
}
