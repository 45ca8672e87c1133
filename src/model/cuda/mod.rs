//! The packed forward pass on a CUDA device (`--device cuda[:N]`, `cuda` feature).
//!
//! Same contract as the CPU pass ([`super::transformer`]): rows packed back to back, each computed by
//! operations that do not depend on the batch (see `kernels.cu` for how each kernel keeps it).
//! The host model stays loaded for the configuration, the embedding lookup (rows are
//! dequantized on the host and uploaded) and the RoPE tables; every matrix is uploaded once,
//! in its stored format (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: a
//! kernel reads each), and its host copy is then released ([`release_host_matrices`]). A model
//! whose weights do not fit the card is refused in one line with the sizes. The KV cache lives in one pool of
//! device blocks in half precision; the engine's bookkeeping owns them through
//! [`DeviceBlock`] handles (a clone copies the block on the device: copy-on-write).
//!
//! CUDA is reached through cudarc with dynamic loading: nothing is linked at build time, so
//! `--features cuda` builds on any machine; the kernels are compiled at run time by NVRTC.
//! GPU tokens are not expected to equal CPU tokens (other summation order, f16 KV).

use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};

use super::arch::Activation;
use super::device::DeviceSpec;
use super::error::ModelError;
use super::kv::{KvSeq, Logits, SeqStep};
use super::quant::{QWeight, Stored, WeightFormat};
use super::transformer::{GateUp, Qkv, Transformer};

/// The kernels' source, compiled by NVRTC when a model is loaded on a GPU.
pub const KERNELS: &str = include_str!("kernels.cu");

/// Positions per attention chunk (`ATTN_CHUNK` in the kernels).
const ATTN_CHUNK: usize = 256;
/// Rows per matmul group (`MM_ROWS` in the kernels).
const MM_ROWS: usize = 8;
/// Warps per matmul block.
const MM_WARPS: usize = 4;
/// Outputs per warp of the wide matmul kernels (`MM_OUTS` in the kernels).
const MM_OUTS: usize = 4;
/// Steps of at least this many rows use the wide matmul kernels: with four or more row groups
/// they still launch as many warps as the one-output kernels do for a single group.
const MM_WIDE_ROWS: usize = 4 * MM_ROWS;
/// Threads per block of the element-wise kernels.
const EW: u32 = 256;

type Result<T> = std::result::Result<T, ModelError>;

fn dev_err(what: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Device(format!("cuda: {what}: {e}"))
}

pub mod nvrtc;
pub mod versions;

/// The version of the GPU kernels' numerics: bump it whenever a kernel's arithmetic changes
/// (a reply computed before may differ after). Part of the generation cache's key on a GPU.
pub const GPU_NUMERICS_VERSION: &str = "candor-cuda-1";

/// What a reply computed on CUDA device `ordinal` depends on besides the model and request:
/// the card (name and compute capability), the driver's and NVRTC's CUDA versions and
/// [`GPU_NUMERICS_VERSION`]; for the generation cache's key (`gpu=...;cc=...;driver=...`).
pub fn cache_identity(ordinal: usize) -> std::result::Result<String, String> {
    let driver = versions::driver_version()?;
    let nvrtc = versions::nvrtc_version()?;
    let dev = list_devices()?
        .into_iter()
        .find(|d| d.ordinal == ordinal)
        .ok_or_else(|| format!("no CUDA device cuda:{ordinal}"))?;
    Ok(format!(
        "gpu={};cc={}.{};driver=cuda-{driver};nvrtc={nvrtc};gpu_numerics={GPU_NUMERICS_VERSION}",
        dev.name, dev.cc.0, dev.cc.1
    ))
}

/// Compiles the kernels to PTX for compute capability `cc` (NVRTC's default architecture when
/// `None`); also the build-time check: `cuda::tests` runs it wherever libnvrtc can be loaded,
/// GPU or not.
pub fn compile_kernels(cc: Option<(i32, i32)>) -> Result<cudarc::nvrtc::Ptx> {
    let nvrtc = nvrtc::library().map_err(|e| ModelError::Device(format!("cuda: {e}")))?;
    // Fixed numerics: no flush-to-zero, IEEE division and square root.
    let mut options: Vec<String> = [
        "--std=c++17",
        "--ftz=false",
        "--prec-div=true",
        "--prec-sqrt=true",
        "--fmad=true",
    ]
    .map(String::from)
    .to_vec();
    if let Some(cc) = cc {
        options.push(format!("--gpu-architecture={}", versions::arch_name(cc)));
    }
    nvrtc
        .compile(KERNELS, &options)
        .map(cudarc::nvrtc::Ptx::from_src)
        .map_err(|e| dev_err("compiling the kernels", e))
}

/// A CUDA device as `candor devices` lists it.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_mem: usize,
    /// Compute capability `(major, minor)`.
    pub cc: (i32, i32),
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cuda:{}  {}  {:.1} GiB  compute capability {}.{}",
            self.ordinal,
            self.name,
            gib(self.total_mem),
            self.cc.0,
            self.cc.1
        )
    }
}

/// Runs a call into the driver, turning a panic inside cudarc (a symbol this driver lacks is
/// one: cudarc's dynamic loading panics on it) into an error line.
fn guarded<T>(
    what: &str,
    f: impl FnOnce() -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!(
            "{what}: the CUDA driver lacks a function this build calls ({msg}); update the \
             NVIDIA driver (CUDA 12.0 or newer)"
        ))
    })
}

/// The CUDA devices this machine has, or why none can be used: the driver must be CUDA 12.0
/// or newer (the driver API is loaded at run time, so one build runs on 12.x and 13.x).
pub fn list_devices() -> std::result::Result<Vec<DeviceInfo>, String> {
    let driver = versions::driver_version()?;
    if driver.major < 12 {
        return Err(format!(
            "the driver's CUDA {driver} is older than 12.0: update the NVIDIA driver"
        ));
    }
    guarded("listing CUDA devices", || {
        let n = CudaContext::device_count().map_err(|e| format!("CUDA driver: {e}"))?;
        (0..n.max(0) as usize)
            .map(|i| {
                let ctx = CudaContext::new(i).map_err(|e| format!("cuda:{i}: {e}"))?;
                Ok(DeviceInfo {
                    ordinal: i,
                    name: ctx.name().unwrap_or_else(|_| "unknown".into()),
                    total_mem: ctx.total_mem().unwrap_or(0),
                    cc: ctx
                        .compute_capability()
                        .map_err(|e| format!("cuda:{i}: compute capability: {e}"))?,
                })
            })
            .collect()
    })
}

/// The weight types' names in the matmul kernels' names, in `WeightKind` order.
const MATMUL_TYPES: [&str; 11] = [
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "q5_0", "q5_1", "q5_k",
];

/// The compiled kernels.
struct Kernels {
    matmul: [CudaFunction; 11],
    /// The same products, MM_OUTS outputs per warp (identical bits).
    matmul_wide: [CudaFunction; 11],
    rms_norm: CudaFunction,
    add_bias: CudaFunction,
    add_in_place: CudaFunction,
    gated_act: CudaFunction,
    softcap: CudaFunction,
    split_cols: CudaFunction,
    gather_rows: CudaFunction,
    rope: CudaFunction,
    kv_write: CudaFunction,
    attn_partial: CudaFunction,
    attn_combine: CudaFunction,
    copy_block: CudaFunction,
}

impl Kernels {
    fn load(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Kernels> {
        let module = ctx
            .load_module(compile_kernels(Some(cc))?)
            .map_err(|e| dev_err("loading the kernels", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| dev_err(&format!("kernel {name}"), e))
        };
        // One kernel per weight type, in `WeightKind` order.
        let matmuls = |prefix: &str| -> Result<[CudaFunction; 11]> {
            let fs = MATMUL_TYPES
                .iter()
                .map(|t| f(&format!("{prefix}{t}")))
                .collect::<Result<Vec<_>>>()?;
            fs.try_into()
                .map_err(|_| dev_err(prefix, "one kernel per weight type"))
        };
        Ok(Kernels {
            matmul: matmuls("matmul_")?,
            matmul_wide: matmuls("matmul_wide_")?,
            rms_norm: f("rms_norm")?,
            add_bias: f("add_bias")?,
            add_in_place: f("add_in_place")?,
            gated_act: f("gated_act")?,
            softcap: f("softcap")?,
            split_cols: f("split_cols")?,
            gather_rows: f("gather_rows")?,
            rope: f("rope")?,
            kv_write: f("kv_write")?,
            attn_partial: f("attn_partial")?,
            attn_combine: f("attn_combine")?,
            copy_block: f("copy_block")?,
        })
    }
}

/// How a matrix is held on the device (the kernels' `W_*` codes, in `Kernels::matmul` order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    Q8_0 = 3,
    Q4_0 = 4,
    Q4_1 = 5,
    Q4K = 6,
    Q6K = 7,
    Q5_0 = 8,
    Q5_1 = 9,
    Q5K = 10,
}

/// A matrix in device memory.
struct DevWeight {
    kind: Kind,
    n: usize,
    k: usize,
    buf: CudaSlice<u8>,
}

/// Grid size for `total` elements at [`EW`] threads per block.
fn ew(total: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((total as u32).div_ceil(EW).max(1), 1, 1),
        block_dim: (EW, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// The device, its stream and kernels: shared by the model and its KV pool.
struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    k: Kernels,
}

impl Gpu {
    fn upload<T: cudarc::driver::DeviceRepr>(&self, what: &str, v: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(v)
            .map_err(|e| dev_err(&format!("uploading {what}"), e))
    }

    fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        what: &str,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(n.max(1))
            .map_err(|e| dev_err(&format!("allocating {what}"), e))
    }
}

/// One pool of KV blocks in device memory, in half precision: a block holds, for each layer,
/// `block_tokens` keys then as many values, `kv_dim` wide.
struct PoolInner {
    gpu: Arc<Gpu>,
    buf: CudaSlice<u16>,
    /// Halves per block.
    block_len: usize,
    capacity: usize,
    free: Mutex<Vec<u32>>,
}

/// A handle to a device's KV pool (cheap to clone).
#[derive(Clone)]
pub struct KvPool(Arc<PoolInner>);

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KvPool({} blocks of {} bytes)",
            self.0.capacity,
            self.block_bytes()
        )
    }
}

impl KvPool {
    /// Blocks not in use now (the engine's scheduler reserves a step's blocks against this
    /// before it grows any sequence: it gives back cached prefixes, makes requests wait, or
    /// fails with an error, so that [`KvPool::alloc`] never finds the pool empty).
    pub fn free_blocks(&self) -> usize {
        self.0.free.lock().map_or(0, |f| f.len())
    }

    /// Blocks in the pool.
    pub fn capacity(&self) -> usize {
        self.0.capacity
    }

    /// A free block.
    ///
    /// # Panics
    /// When every block is in use, which the scheduler rules out by reserving each step's
    /// blocks first ([`KvPool::free_blocks`]); only a caller growing device KV by hand, past
    /// the pool, gets here.
    pub fn alloc(&self) -> DeviceBlock {
        let slot = self.0.free.lock().expect("KV pool lock").pop();
        let slot = slot.unwrap_or_else(|| {
            panic!(
                "CUDA KV pool exhausted: all {} blocks in use (lower --batch-size or --kv-cache-mb)",
                self.0.capacity
            )
        });
        DeviceBlock {
            pool: self.clone(),
            slot,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.0.block_len * 2
    }

    fn base(&self) -> u64 {
        ptr(&self.0.buf, &self.0.gpu.stream)
    }
}

/// A block of KV positions in a device's pool; returned to the pool when dropped. Cloning
/// copies the block into a fresh one on the device (the engine's copy-on-write).
pub struct DeviceBlock {
    pool: KvPool,
    slot: u32,
}

impl std::fmt::Debug for DeviceBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBlock({})", self.slot)
    }
}

impl DeviceBlock {
    /// The block's slot in its pool.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

impl Clone for DeviceBlock {
    fn clone(&self) -> DeviceBlock {
        let copy = self.pool.alloc();
        let p = &self.pool.0;
        let (base, src, dst, len) = (
            self.pool.base(),
            self.slot as i32,
            copy.slot as i32,
            p.block_len as i64,
        );
        let stream = &p.gpu.stream;
        let mut b = stream.launch_builder(&p.gpu.k.copy_block);
        b.arg(&base).arg(&src).arg(&dst).arg(&len);
        // SAFETY: both slots lie inside the pool (slots < capacity) and differ; the kernel
        // reads block_len halves of one and writes the other's.
        unsafe { b.launch(ew(p.block_len)) }
            .unwrap_or_else(|e| panic!("CUDA: copying a KV block failed: {e}"));
        copy
    }
}

impl Drop for DeviceBlock {
    fn drop(&mut self) {
        if let Ok(mut free) = self.pool.0.free.lock() {
            free.push(self.slot);
        }
    }
}

/// Per-layer device tensors.
struct DevLayer {
    attn_norm: CudaSlice<f32>,
    qkv: Vec<DevWeight>,
    bias: Option<[CudaSlice<f32>; 3]>,
    qk_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    wo: DevWeight,
    post_attn_norm: Option<CudaSlice<f32>>,
    ffn_norm: CudaSlice<f32>,
    gate_up: Vec<DevWeight>,
    w_down: DevWeight,
    post_ffn_norm: Option<CudaSlice<f32>>,
}

/// Device buffers of one step, grown to the largest step seen.
#[derive(Default)]
struct Buffers {
    rows: usize,
    chunks: usize,
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
}

/// A model's weights on a CUDA device, with its KV pool.
pub struct CudaModel {
    gpu: Arc<Gpu>,
    spec: DeviceSpec,
    name: String,
    layers: Vec<DevLayer>,
    output_norm: CudaSlice<f32>,
    /// The output projection (the embedding when tied).
    output: DevWeight,
    pool: KvPool,
    block_tokens: usize,
    buffers: Mutex<Buffers>,
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
        let c = &model.config;
        if !c.head_dim.is_multiple_of(32) || c.head_dim > 256 {
            return Err(ModelError::Device(format!(
                "cuda: head dimension {} is not supported on the GPU (a multiple of 32, at most 256)",
                c.head_dim
            )));
        }
        let gpu = open_gpu(ordinal)?;
        let name = gpu.ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        check_fits(&gpu, ordinal, &name, model)?;
        let mat = |name: String, w: &QWeight| upload_weight(&gpu, &name, w);
        let mut layers = Vec::with_capacity(model.layers.len());
        for (i, l) in model.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let qkv = match &l.qkv {
                Qkv::Split { q, k, v } => vec![
                    mat(n("attn_q.weight"), q)?,
                    mat(n("attn_k.weight"), k)?,
                    mat(n("attn_v.weight"), v)?,
                ],
                Qkv::Fused(w) => vec![mat(n("attn_qkv.weight"), w)?],
            };
            let gate_up = match &l.gate_up {
                GateUp::Split { gate, up } => vec![
                    mat(n("ffn_gate.weight"), gate)?,
                    mat(n("ffn_up.weight"), up)?,
                ],
                GateUp::Fused(w) => vec![mat(n("ffn_up.weight"), w)?],
            };
            let wo = mat(n("attn_output.weight"), &l.wo)?;
            let w_down = mat(n("ffn_down.weight"), &l.w_down)?;
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
            });
        }
        let output = match &model.output {
            Some(w) => mat("output.weight".into(), w)?,
            None => mat("token_embd.weight".into(), &model.embedding)?,
        };
        let output_norm = gpu.upload("output_norm", &model.output_norm)?;
        let pool = new_pool(&gpu, c.n_layer * 2 * block_tokens * c.kv_dim(), kv_limit)?;
        Ok(CudaModel {
            gpu,
            spec: DeviceSpec::Cuda(ordinal),
            name,
            layers,
            output_norm,
            output,
            pool,
            block_tokens,
            buffers: Mutex::new(Buffers::default()),
        })
    }

    /// The device's name as the driver reports it (for manifests).
    pub fn device_name(&self) -> &str {
        &self.name
    }

    pub fn spec(&self) -> DeviceSpec {
        self.spec
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
        let (dim, q_dim, kv_dim, hd, rd) = (c.dim, c.q_dim(), c.kv_dim(), c.head_dim, c.rope_dim);
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
        let swa_len = model.rope_swa_freqs.as_ref().map_or(0, |_| rows * rd);
        let mut cs_swa = vec![0f32; swa_len];
        let (mut pos, mut table_off, mut row_block, mut row_slot) = (
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::new(),
            Vec::new(),
        );
        let mut table: Vec<u32> = Vec::new();
        let mut wanted: Vec<i32> = Vec::new();
        let mut r = 0;
        for seq in seqs.iter_mut() {
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
                let xr = &mut x[(r + i) * dim..(r + i + 1) * dim];
                model.embedding.row_f32(t as usize, xr);
                if let Some(scale) = c.embed_scale {
                    xr.iter_mut().for_each(|v| *v *= scale);
                }
                let p = p0 + i;
                model.rope_freqs.cos_sin(p, &mut cs[(r + i) * rd..][..rd]);
                if let Some(f) = &model.rope_swa_freqs {
                    f.cos_sin(p, &mut cs_swa[(r + i) * rd..][..rd]);
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
        let max_pos = *pos.iter().max().expect("rows > 0") as usize;
        let chunks = max_pos / ATTN_CHUNK + 1;

        let g = &self.gpu;
        let s = &*g.stream;
        let mut bufs = self.buffers.lock().expect("CUDA buffers lock");
        self.fit(&mut bufs, c, rows, chunks)?;
        let b = &mut *bufs;
        let up = |what: &str, v: &[i32]| g.upload(what, v);
        let (d_pos, d_toff, d_table, d_rblock, d_rslot) = (
            up("positions", &pos)?,
            up("table offsets", &table_off)?,
            up("block tables", &table)?,
            up("row blocks", &row_block)?,
            up("row slots", &row_slot)?,
        );
        let d_cs = g.upload("rope", &cs)?;
        let d_cs_swa = if cs_swa.is_empty() {
            None
        } else {
            Some(g.upload("rope", &cs_swa)?)
        };
        let bx = b.x.as_mut().expect("fit");
        g.stream
            .memcpy_htod(&x, bx)
            .map_err(|e| dev_err("uploading rows", e))?;

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

        for (l, (layer, dl)) in model.layers.iter().zip(&self.layers).enumerate() {
            g.rms_norm(px, &dl.attn_norm, pxb, rows, dim, c.rms_eps)?;
            if dl.qkv.len() == 3 {
                g.matmul(&dl.qkv[0], pxb, rows, pq)?;
                g.matmul(&dl.qkv[1], pxb, rows, pk)?;
                g.matmul(&dl.qkv[2], pxb, rows, pv)?;
            } else {
                let width = q_dim + 2 * kv_dim;
                g.matmul(&dl.qkv[0], pxb, rows, pfused)?;
                g.split(pfused, width, 0, q_dim, pq, rows)?;
                g.split(pfused, width, q_dim, kv_dim, pk, rows)?;
                g.split(pfused, width, q_dim + kv_dim, kv_dim, pv, rows)?;
            }
            if let Some([bq, bk, bv]) = &dl.bias {
                g.add_bias(pq, bq, q_dim, rows * q_dim)?;
                g.add_bias(pk, bk, kv_dim, rows * kv_dim)?;
                g.add_bias(pv, bv, kv_dim, rows * kv_dim)?;
            }
            if let Some((nq, nk)) = &dl.qk_norm {
                g.rms_norm(pq, nq, pq, rows * c.n_head, hd, c.rms_eps)?;
                g.rms_norm(pk, nk, pk, rows * c.n_kv_head, hd, c.rms_eps)?;
            }
            let cs = match (&d_cs_swa, layer.swa) {
                (Some(t), true) => ptr(t, s),
                _ => ptr(&d_cs, s),
            };
            g.rope(pq, cs, rows, c.n_head, hd, rd, c.rope_neox)?;
            g.rope(pk, cs, rows, c.n_kv_head, hd, rd, c.rope_neox)?;
            {
                let (rows_i, kv_i, l_i, bt_i) = (rows as i32, kv_dim as i32, l as i32, bt as i32);
                let (prb, prs) = (ptr(&d_rblock, s), ptr(&d_rslot, s));
                let mut lb = s.launch_builder(&g.k.kv_write);
                lb.arg(&pk).arg(&pv).arg(&pool).arg(&prb).arg(&prs);
                lb.arg(&rows_i)
                    .arg(&kv_i)
                    .arg(&l_i)
                    .arg(&bt_i)
                    .arg(&block_len);
                // SAFETY: k and v hold rows × kv_dim values; every row's block and slot were
                // given by its sequence's KV (grown above, so inside the pool).
                unsafe { lb.launch(ew(rows * kv_dim)) }.map_err(|e| dev_err("kv_write", e))?;
            }
            {
                let (heads, group, hd_i, kv_i, l_i, bt_i) = (
                    c.n_head as i32,
                    (c.n_head / c.n_kv_head) as i32,
                    hd as i32,
                    kv_dim as i32,
                    l as i32,
                    bt as i32,
                );
                let (scale, cap) = (c.attn_scale, c.attn_softcap.unwrap_or(0.0));
                let window = c.window(l).map_or(0, |w| w as i32);
                let chunks_i = chunks as i32;
                let (ptab, ptoff, ppos) = (ptr(&d_table, s), ptr(&d_toff, s), ptr(&d_pos, s));
                let mut lb = s.launch_builder(&g.k.attn_partial);
                lb.arg(&pq).arg(&pool).arg(&ptab).arg(&ptoff).arg(&ppos);
                lb.arg(&heads)
                    .arg(&group)
                    .arg(&hd_i)
                    .arg(&kv_i)
                    .arg(&l_i)
                    .arg(&bt_i);
                lb.arg(&block_len)
                    .arg(&scale)
                    .arg(&cap)
                    .arg(&window)
                    .arg(&chunks_i);
                lb.arg(&ppart);
                let cfg = LaunchConfig {
                    grid_dim: (chunks as u32, c.n_head as u32, rows as u32),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: part holds rows × heads × chunks × (hd + 2) floats (fit); positions
                // and tables come from the sequences' KV, whose blocks cover every position.
                unsafe { lb.launch(cfg) }.map_err(|e| dev_err("attn_partial", e))?;
                let mut lb = s.launch_builder(&g.k.attn_combine);
                lb.arg(&ppart)
                    .arg(&ppos)
                    .arg(&heads)
                    .arg(&hd_i)
                    .arg(&chunks_i)
                    .arg(&pattn);
                let cfg = LaunchConfig {
                    grid_dim: (c.n_head as u32, rows as u32, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: attn holds rows × q_dim floats.
                unsafe { lb.launch(cfg) }.map_err(|e| dev_err("attn_combine", e))?;
            }
            g.matmul(&dl.wo, pattn, rows, pxb)?;
            if let Some(w) = &dl.post_attn_norm {
                g.rms_norm(pxb, w, pxb, rows, dim, c.rms_eps)?;
            }
            g.add(px, pxb, rows * dim)?;
            g.rms_norm(px, &dl.ffn_norm, pxb, rows, dim, c.rms_eps)?;
            let ffn = c.ffn_dim;
            if dl.gate_up.len() == 2 {
                g.matmul(&dl.gate_up[0], pxb, rows, pgate)?;
                g.matmul(&dl.gate_up[1], pxb, rows, pup)?;
            } else {
                g.matmul(&dl.gate_up[0], pxb, rows, pfused)?;
                g.split(pfused, 2 * ffn, 0, ffn, pgate, rows)?;
                g.split(pfused, 2 * ffn, ffn, ffn, pup, rows)?;
            }
            {
                let total = (rows * ffn) as i64;
                let act = match c.activation {
                    Activation::Silu => 0i32,
                    // llama.cpp's CUDA backend computes GELU in f32, without the CPU's table.
                    Activation::GeluTanh | Activation::GeluTanhF16 => 1i32,
                };
                let mut lb = s.launch_builder(&g.k.gated_act);
                lb.arg(&pgate).arg(&pup).arg(&total).arg(&act);
                // SAFETY: gate and up hold rows × ffn floats.
                unsafe { lb.launch(ew(rows * ffn)) }.map_err(|e| dev_err("gated_act", e))?;
            }
            g.matmul(&dl.w_down, pgate, rows, pxb)?;
            if let Some(w) = &dl.post_ffn_norm {
                g.rms_norm(pxb, w, pxb, rows, dim, c.rms_eps)?;
            }
            g.add(px, pxb, rows * dim)?;
        }

        // Final norm and output projection for the wanted rows only.
        let m = wanted.len();
        logits.clear();
        if m == 0 {
            s.synchronize().map_err(|e| dev_err("step", e))?;
            return Ok(());
        }
        let d_wanted = up("wanted rows", &wanted)?;
        {
            let (dim_i, total) = (dim as i32, (m * dim) as i64);
            let pw = ptr(&d_wanted, s);
            let mut lb = s.launch_builder(&g.k.gather_rows);
            lb.arg(&px).arg(&pw).arg(&dim_i).arg(&pxb).arg(&total);
            // SAFETY: every wanted index is a row of this step; xb holds rows × dim floats.
            unsafe { lb.launch(ew(m * dim)) }.map_err(|e| dev_err("gather_rows", e))?;
        }
        g.rms_norm(pxb, &self.output_norm, pattn, m, dim, c.rms_eps)?;
        let vocab = c.vocab_size;
        let out: CudaSlice<f32> = g.zeros("logits", m * vocab)?;
        let pout = ptr(&out, s);
        g.matmul(&self.output, pattn, m, pout)?;
        if let Some(cap) = c.final_softcap {
            let total = (m * vocab) as i64;
            let mut lb = s.launch_builder(&g.k.softcap);
            lb.arg(&pout).arg(&cap).arg(&total);
            // SAFETY: out holds m × vocab floats.
            unsafe { lb.launch(ew(m * vocab)) }.map_err(|e| dev_err("softcap", e))?;
        }
        logits.resize(m * vocab, 0.0);
        g.stream
            .memcpy_dtoh(&out, logits.as_mut_slice())
            .map_err(|e| dev_err("downloading logits", e))?;
        s.synchronize().map_err(|e| dev_err("step", e))?;
        Ok(())
    }

    /// Grows the step buffers to `rows` rows and `chunks` attention chunks.
    fn fit(
        &self,
        b: &mut Buffers,
        c: &super::arch::ModelConfig,
        rows: usize,
        chunks: usize,
    ) -> Result<()> {
        if rows <= b.rows && chunks <= b.chunks && b.x.is_some() {
            return Ok(());
        }
        let rows = rows.max(b.rows).next_power_of_two();
        let chunks = chunks.max(b.chunks);
        let g = &self.gpu;
        let wide = c.dim.max(c.q_dim());
        let fused = (c.q_dim() + 2 * c.kv_dim()).max(2 * c.ffn_dim);
        b.x = Some(g.zeros("x", rows * c.dim)?);
        b.xb = Some(g.zeros("xb", rows * c.dim)?);
        b.q = Some(g.zeros("q", rows * c.q_dim())?);
        b.k = Some(g.zeros("k", rows * c.kv_dim())?);
        b.v = Some(g.zeros("v", rows * c.kv_dim())?);
        b.attn = Some(g.zeros("attn", rows * wide)?);
        b.gate = Some(g.zeros("gate", rows * c.ffn_dim)?);
        b.up = Some(g.zeros("up", rows * c.ffn_dim)?);
        b.fused = Some(g.zeros("fused", if c.arch.fused() { rows * fused } else { 1 })?);
        b.part = Some(g.zeros(
            "attention partials",
            rows * c.n_head * chunks * (c.head_dim + 2),
        )?);
        b.rows = rows;
        b.chunks = chunks;
        Ok(())
    }
}

/// Launches of the step kernels.
impl Gpu {
    fn matmul(&self, w: &DevWeight, x: u64, m: usize, y: u64) -> Result<()> {
        let s = &*self.stream;
        let pw = ptr(&w.buf, s);
        let (m_i, n_i, k_i) = (m as i32, w.n as i32, w.k as i32);
        // Either kernel gives the same bits (see kernels.cu); the wide one reads less.
        let (kernels, outs) = if m >= MM_WIDE_ROWS {
            (&self.k.matmul_wide, MM_OUTS)
        } else {
            (&self.k.matmul, 1)
        };
        let mut lb = s.launch_builder(&kernels[w.kind as usize]);
        lb.arg(&x).arg(&m_i).arg(&pw).arg(&n_i).arg(&k_i).arg(&y);
        let cfg = LaunchConfig {
            grid_dim: (
                w.n.div_ceil(MM_WARPS * outs) as u32,
                m.div_ceil(MM_ROWS) as u32,
                1,
            ),
            block_dim: ((32 * MM_WARPS) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x holds m × k floats and y m × n (the step buffers are sized for the largest
        // projection); w holds n rows of its format.
        unsafe { lb.launch(cfg) }.map_err(|e| dev_err("matmul", e))?;
        Ok(())
    }

    fn rms_norm(
        &self,
        x: u64,
        w: &CudaSlice<f32>,
        y: u64,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let s = &*self.stream;
        let pw = ptr(w, s);
        let dim_i = dim as i32;
        let threads = (dim.next_power_of_two() as u32).clamp(32, 1024);
        let mut lb = s.launch_builder(&self.k.rms_norm);
        lb.arg(&x).arg(&pw).arg(&y).arg(&dim_i).arg(&eps);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x and y hold rows × dim floats, w dim.
        unsafe { lb.launch(cfg) }.map_err(|e| dev_err("rms_norm", e))?;
        Ok(())
    }

    fn add_bias(&self, x: u64, b: &CudaSlice<f32>, width: usize, total: usize) -> Result<()> {
        let s = &*self.stream;
        let pb = ptr(b, s);
        let (w_i, t) = (width as i32, total as i64);
        let mut lb = s.launch_builder(&self.k.add_bias);
        lb.arg(&x).arg(&pb).arg(&w_i).arg(&t);
        // SAFETY: x holds total floats, b width.
        unsafe { lb.launch(ew(total)) }.map_err(|e| dev_err("add_bias", e))?;
        Ok(())
    }

    fn add(&self, x: u64, y: u64, total: usize) -> Result<()> {
        let s = &*self.stream;
        let t = total as i64;
        let mut lb = s.launch_builder(&self.k.add_in_place);
        lb.arg(&x).arg(&y).arg(&t);
        // SAFETY: both hold total floats.
        unsafe { lb.launch(ew(total)) }.map_err(|e| dev_err("add_in_place", e))?;
        Ok(())
    }

    fn split(
        &self,
        src: u64,
        width: usize,
        off: usize,
        w: usize,
        dst: u64,
        rows: usize,
    ) -> Result<()> {
        let s = &*self.stream;
        let (wd, o, wi, t) = (width as i32, off as i32, w as i32, (rows * w) as i64);
        let mut lb = s.launch_builder(&self.k.split_cols);
        lb.arg(&src).arg(&wd).arg(&o).arg(&wi).arg(&dst).arg(&t);
        // SAFETY: src holds rows × width floats, dst rows × w.
        unsafe { lb.launch(ew(rows * w)) }.map_err(|e| dev_err("split_cols", e))?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: u64,
        cs: u64,
        rows: usize,
        heads: usize,
        hd: usize,
        rd: usize,
        neox: bool,
    ) -> Result<()> {
        let s = &*self.stream;
        let (r, h, d, rdi, nx) = (rows as i32, heads as i32, hd as i32, rd as i32, neox as i32);
        let mut lb = s.launch_builder(&self.k.rope);
        lb.arg(&x)
            .arg(&cs)
            .arg(&r)
            .arg(&h)
            .arg(&d)
            .arg(&rdi)
            .arg(&nx);
        // SAFETY: x holds rows × heads × hd floats, cs rows × rd.
        unsafe { lb.launch(ew(rows * heads * rd / 2)) }.map_err(|e| dev_err("rope", e))?;
        Ok(())
    }
}

/// Opens CUDA device `ordinal`: one context, one stream, the kernels compiled for its compute
/// capability by an NVRTC no newer than the driver, and loaded.
fn open_gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    let fail = |e: String| ModelError::Device(format!("cuda: {e}"));
    let driver = versions::driver_version().map_err(|e| {
        fail(format!(
            "{e}; is this a GPU machine with the NVIDIA driver installed?"
        ))
    })?;
    if driver.major < 12 {
        return Err(fail(format!(
            "the driver's CUDA {driver} is older than 12.0: update the NVIDIA driver"
        )));
    }
    let nvrtc = versions::nvrtc_version().map_err(fail)?;
    versions::check_pair(driver, nvrtc).map_err(ModelError::Device)?;
    let opened = guarded(&format!("opening cuda:{ordinal}"), || {
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("opening cuda:{ordinal}: {e}"))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| format!("cuda:{ordinal}: compute capability: {e}"))?;
        Ok((ctx, cc))
    });
    let (ctx, cc) = opened.map_err(fail)?;
    // One stream, raw pointers: ordering comes from the stream alone.
    // SAFETY: every kernel and copy of this model is issued on the one stream below.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.default_stream();
    Ok(Arc::new(Gpu {
        k: Kernels::load(&ctx, cc)?,
        ctx,
        stream,
    }))
}

/// The kernel that reads a stored format (every format has one: nothing is widened).
fn kind_of(f: WeightFormat) -> Kind {
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
    }
}

/// Uploads one matrix as stored, for the kernel of its format.
fn upload_weight(gpu: &Gpu, name: &str, w: &QWeight) -> Result<DevWeight> {
    let (n, k) = (w.rows(), w.cols());
    if !k.is_multiple_of(8) {
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
    Ok(DevWeight {
        kind: kind_of(w.format()),
        n,
        k,
        buf: gpu.upload(name, &raw)?,
    })
}

/// Bytes a matrix takes on the device: its stored blocks.
fn device_bytes(w: &QWeight) -> usize {
    let (n, k) = (w.rows(), w.cols());
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
    };
    n * k.div_ceil(elems) * bytes
}

fn gib(b: usize) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// Refuses, in one line with the sizes, a model whose weights (plus 1 GiB for the step
/// buffers and a minimal KV pool) do not fit the memory free on the device.
fn check_fits(gpu: &Gpu, ordinal: usize, name: &str, model: &Transformer) -> Result<()> {
    let mut need = match &model.output {
        Some(w) => device_bytes(w),
        None => device_bytes(&model.embedding),
    };
    for l in &model.layers {
        let mats: Vec<&QWeight> = match (&l.qkv, &l.gate_up) {
            (Qkv::Split { q, k, v }, GateUp::Split { gate, up }) => vec![q, k, v, gate, up],
            (Qkv::Split { q, k, v }, GateUp::Fused(g)) => vec![q, k, v, g],
            (Qkv::Fused(w), GateUp::Split { gate, up }) => vec![w, gate, up],
            (Qkv::Fused(w), GateUp::Fused(g)) => vec![w, g],
        };
        need += mats.into_iter().map(device_bytes).sum::<usize>();
        need += device_bytes(&l.wo) + device_bytes(&l.w_down);
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
        l.gate_up = GateUp::Fused(empty());
        l.wo = empty();
        l.w_down = empty();
    }
    if model.output.is_some() {
        model.output = Some(empty());
    }
}

/// A KV pool of blocks of `block_len` halves: 90% of the memory left on the device after the
/// weights, less 1 GiB for step buffers.
fn new_pool(gpu: &Arc<Gpu>, block_len: usize, limit: Option<usize>) -> Result<KvPool> {
    let (free, _total) = gpu
        .ctx
        .mem_get_info()
        .map_err(|e| dev_err("reading free memory", e))?;
    let budget = (free.saturating_sub(1 << 30)) / 10 * 9;
    let budget = limit.map_or(budget, |l| l.min(budget));
    let capacity = (budget / (block_len * 2)).min(u32::MAX as usize);
    if capacity == 0 {
        return Err(ModelError::Device(format!(
            "cuda: no memory left for the KV cache ({free} bytes free after the weights)"
        )));
    }
    let buf = gpu.zeros::<u16>("KV pool", capacity * block_len)?;
    Ok(KvPool(Arc::new(PoolInner {
        gpu: Arc::clone(gpu),
        buf,
        block_len,
        capacity,
        free: Mutex::new((0..capacity as u32).rev().collect()),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::tests::noise;

    /// The kernels compile wherever NVRTC can be loaded (no GPU needed). Without libnvrtc the
    /// test says loudly that it did not run; under CI it must run.
    #[test]
    fn kernels_compile_with_nvrtc() {
        if let Err(e) = nvrtc::library() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but libnvrtc is not loadable (see .ci/run): {e}"
            );
            eprintln!("\n*** SKIPPED kernels_compile_with_nvrtc: {e} ***\n");
            return;
        }
        let ptx = compile_kernels(None).expect("kernels compile");
        for cc in [(8, 0), (9, 0)] {
            compile_kernels(Some(cc)).unwrap_or_else(|e| panic!("compute {cc:?}: {e}"));
        }
        let src = ptx.to_src();
        for name in [
            "matmul_q4_k",
            "matmul_q6_k",
            "matmul_q5_0",
            "matmul_q5_1",
            "matmul_q5_k",
            "matmul_wide_q4_k",
            "matmul_wide_q6_k",
            "attn_partial",
            "attn_combine",
            "kv_write",
        ] {
            assert!(src.contains(name), "PTX lacks {name}");
        }
    }

    /// Every weight type's matmul on the GPU: a row's result has the same bits whatever the
    /// number of rows, their group and the kernel (one or MM_OUTS outputs per warp), and matches the host's dequantized weights (f64 sums).
    #[test]
    fn matmul_of_every_type_is_row_invariant_and_dequantizes_like_the_host() {
        use candle_core::quantized::{GgmlDType, QTensor};
        use candle_core::{Device, Tensor};
        let gpu = match open_gpu(0) {
            Ok(g) => g,
            Err(e) => {
                assert!(
                    std::env::var("CANDOR_REQUIRE_GPU").as_deref() != Ok("1"),
                    "CANDOR_REQUIRE_GPU=1 but the GPU cannot be used: {e}"
                );
                eprintln!("SKIPPED matmul_of_every_type_is_row_invariant (no GPU): {e}");
                return;
            }
        };
        // 45 rows take the wide kernels (MM_OUTS outputs per warp), a single row the
        // one-output ones; 37 outputs leave a partial group of MM_OUTS.
        let (n, k, m) = (37, 512, 45);
        assert!(m >= MM_WIDE_ROWS && n % MM_OUTS != 0);
        let x = noise(1, m * k);
        let dx = gpu.upload("x", &x).expect("x");
        for dtype in [
            GgmlDType::F32,
            GgmlDType::F16,
            GgmlDType::BF16,
            GgmlDType::Q8_0,
            GgmlDType::Q4_0,
            GgmlDType::Q4_1,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
            GgmlDType::Q5K,
        ] {
            let t = Tensor::from_vec(noise(2, n * k), (n, k), &Device::Cpu).expect("tensor");
            let q = QTensor::quantize(&t, dtype).expect("quantize");
            let w = QWeight::from_qtensor(&q).expect("weight");
            let dw = upload_weight(&gpu, "w", &w).expect("upload");
            // Every type is held as stored (none is widened).
            assert_eq!(dw.buf.len(), device_bytes(&w), "{dtype:?}");
            let all: CudaSlice<f32> = gpu.zeros("y", m * n).expect("y");
            let one: CudaSlice<f32> = gpu.zeros("y1", n).expect("y1");
            let s = &gpu.stream;
            gpu.matmul(&dw, ptr(&dx, s), m, ptr(&all, s))
                .expect("matmul");
            let all = s.clone_dtoh(&all).expect("download");
            let mut row = vec![0f32; k];
            for r in 0..m {
                let dxr = gpu.upload("x row", &x[r * k..(r + 1) * k]).expect("row");
                gpu.matmul(&dw, ptr(&dxr, s), 1, ptr(&one, s))
                    .expect("matmul");
                let single = s.clone_dtoh(&one).expect("download");
                for o in 0..n {
                    let (a, b) = (all[r * n + o], single[o]);
                    assert_eq!(a.to_bits(), b.to_bits(), "{dtype:?} row {r} output {o}");
                    w.row_f32(o, &mut row);
                    let want: f64 = row
                        .iter()
                        .zip(&x[r * k..(r + 1) * k])
                        .map(|(&w, &x)| w as f64 * x as f64)
                        .sum();
                    let tol = 1e-3;
                    assert!(
                        (a as f64 - want).abs() < tol,
                        "{dtype:?} [{r}][{o}]: {a} vs {want}"
                    );
                }
            }
        }
    }
}
