//! The kernel table (the compiled kernels, one per weight type for the matmuls), the device
//! handle that holds it, and the host side of each launch.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};

use crate::model::arch::ModelConfig;
use crate::model::error::ModelError;
use crate::model::gemma4::LayerDims;
use crate::model::lowering::ActBlocks;

use super::{nvrtc, versions};

/// The kernels' source, compiled by NVRTC when a model is loaded on a GPU.
pub const KERNELS: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("mmq.cu"),
    include_str!("mmt.cu"),
    include_str!("fused.cu"),
    include_str!("moe.cu"),
    include_str!("deltanet.cu")
);

/// The attention chunk length of a row at position `p` (`attn_chunk_len` in the kernels):
/// 32 positions while that makes at most 32 chunks, else the next power of two above `p`
/// over 32. The row's own position alone decides it, so a row's attention does not depend on
/// the step's other rows; short chunks give a decode step at batch 1 one block per chunk and
/// KV head (136 blocks at the 8B shape's 512 positions, against 24 with the 256-position
/// chunks before, which left a 512-position decode at 7.3 ms of attention per token on the
/// H200), and the bound on chunks bounds the partials' memory.
pub(super) fn attn_chunk_len(p: usize) -> usize {
    ((p + 1).next_power_of_two() / 32).max(32)
}

/// How many chunks a row at position `p` has (positions `0..=p`).
pub(super) fn attn_chunks(p: usize) -> usize {
    p / attn_chunk_len(p) + 1
}
/// Rows per matmul group (`MM_ROWS` in the kernels).
pub(super) const MM_ROWS: usize = 8;
/// Warps per matmul block.
pub(super) const MM_WARPS: usize = 4;
/// Outputs per warp of the wide matmul kernels (`MM_OUTS` in the kernels).
pub(super) const MM_OUTS: usize = 4;
/// Steps of at least this many rows use the wide matmul kernels: with four or more row groups
/// they still launch as many warps as the one-output kernels do for a single group.
pub(super) const MM_WIDE_ROWS: usize = 4 * MM_ROWS;
/// Threads per block of the element-wise kernels.
pub(super) const EW: u32 = 256;
/// Threads per block of the integer matmuls (`MQ_THREADS` in `mmq.cu`).
pub(super) const MQ_THREADS: usize = 128;
/// Outputs per block of the integer matmuls (`MQ_RO`).
pub(super) const MQ_RO: usize = 4;
/// Threads, rows and outputs per block of the tensor-core matmuls (`MT_*` in `mmt.cu`).
pub(super) const MT_THREADS: usize = 128;

/// A grouped matmul's kernel and its index into the grouped rows' experts: each row's expert
/// (`mmqe_`), or the row tiles of one expert (`mmte_`); device addresses.
#[derive(Clone, Copy)]
enum Grouped {
    Rows(u64),
    Tiles(u64),
}
pub(super) const MT_BM: usize = 64;
pub(super) const MT_BN: usize = 64;
/// Fewer rows than this never take the tensor cores (an m16 fragment per warp half-empty).
/// 16 since the first H200 call (2026-11-27): at 16 rows the tensor cores took 0.5–1.0× the
/// time of dp4a wherever the tiles fill half a wave (ffn_gate/up, the output matrix), in
/// every quantized type timed (Q4_K, Q6_K, Q8_0); 32 before.
pub(super) const MMA_MIN_ROWS: usize = 16;

/// Whether a quantized product of `m` rows and `n` outputs takes the tensor cores (`mmt.cu`)
/// rather than `dp4a` (`mmq.cu`) on a device of `sms` multiprocessors: from
/// [`MMA_MIN_ROWS`] rows when its 64 × 64 tiles fill at least half a wave (one block on every
/// second SM; dp4a launches `m/8 · n/4` blocks and fills the card at any shape). Chosen by the
/// shape alone, and both kernels give the CPU's bits (`emulate.rs` and `emulate_mmt.rs` each
/// equal `QWeight::matmul` bit for bit), so the choice changes no result.
pub(super) fn mma_pays(m: usize, n: usize, sms: usize) -> bool {
    m >= MMA_MIN_ROWS && 2 * m.div_ceil(MT_BM) * n.div_ceil(MT_BN) >= sms
}

pub(super) type Result<T> = std::result::Result<T, ModelError>;

pub(super) fn dev_err(what: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Device(format!("cuda: {what}: {e}"))
}

/// Whether `CANDOR_CUDA_SYNC` (its value, `None` when unset) asks for a synchronisation after
/// every launch: `1` does; unset, empty and `0` do not; anything else does not and is reported
/// (the second value: the warning line).
pub(super) fn parse_sync(value: Option<&str>) -> (bool, Option<String>) {
    match value {
        Some("1") => (true, None),
        None | Some("" | "0") => (false, None),
        Some(other) => (
            false,
            Some(format!(
                "CANDOR_CUDA_SYNC={other}: expected 1 (synchronise after every launch) or 0; \
                 not synchronising"
            )),
        ),
    }
}

/// Whether this process synchronises after every kernel launch (`CANDOR_CUDA_SYNC=1`), so
/// that a fault is reported by the launch that caused it; read once.
pub(super) fn sync_each_launch() -> bool {
    static SYNC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SYNC.get_or_init(|| {
        let (on, warning) = parse_sync(std::env::var("CANDOR_CUDA_SYNC").ok().as_deref());
        if let Some(w) = warning {
            eprintln!("{w}");
        }
        on
    })
}

/// The error of a launch of `kernel` that the driver refused (`synced` false) or that
/// faulted when the stream was synchronised right after it (`CANDOR_CUDA_SYNC=1`).
pub(super) fn launch_err(
    kernel: impl std::fmt::Display,
    synced: bool,
    e: impl std::fmt::Display,
) -> ModelError {
    if synced {
        ModelError::Device(format!("cuda: kernel {kernel} faulted: {e}"))
    } else {
        ModelError::Device(format!("cuda: launching kernel {kernel}: {e}"))
    }
}

/// The error of a step's closing synchronisation: a fault of some launch of the step, which
/// one unknown without `CANDOR_CUDA_SYNC=1`.
pub(super) fn step_err(e: impl std::fmt::Display) -> ModelError {
    if sync_each_launch() {
        dev_err("step", e)
    } else {
        ModelError::Device(format!(
            "cuda: step: {e} (launches are asynchronous: rerun with CANDOR_CUDA_SYNC=1 to name \
             the kernel)"
        ))
    }
}

/// Adds where a launch was (`at`, e.g. `layer 3, launch 5 (attn_partial)`) to its error.
pub(super) fn at_launch(e: ModelError, at: impl std::fmt::Display) -> ModelError {
    match e {
        ModelError::Device(m) => ModelError::Device(format!("{m} [at {at}]")),
        other => other,
    }
}

/// NVRTC's options for the kernels, for architecture `arch` (NVRTC's default when `None`).
fn nvrtc_options(arch: Option<&str>) -> Vec<String> {
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
    if let Some(arch) = arch {
        options.push(format!("--gpu-architecture={arch}"));
    }
    options
}

/// Compiles the kernels to PTX for compute capability `cc` (NVRTC's default architecture when
/// `None`); also the build-time check: `cuda::tests` runs it wherever libnvrtc can be loaded,
/// GPU or not.
pub fn compile_kernels(cc: Option<(i32, i32)>) -> Result<cudarc::nvrtc::Ptx> {
    let nvrtc = nvrtc::library().map_err(|e| ModelError::Device(format!("cuda: {e}")))?;
    nvrtc
        .compile(KERNELS, &nvrtc_options(cc.map(versions::arch_name)))
        .map(cudarc::nvrtc::Ptx::from_src)
        .map_err(|e| dev_err("compiling the kernels", e))
}

/// The kernels compiled for one compute capability, as the driver is given them.
pub struct CompiledKernels {
    /// A cubin for the card's `sm_XX` (loaded without the driver's JIT) or, where NVRTC
    /// could not make one, PTX for `compute_XX`.
    pub bytes: Vec<u8>,
    pub cubin: bool,
    /// The architecture compiled for (`sm_90`, or `compute_90` for PTX).
    pub arch: String,
    /// Why there is no cubin (PTX only).
    pub cubin_error: Option<String>,
}

impl CompiledKernels {
    /// The image as the driver takes it.
    pub fn image(&self) -> cudarc::nvrtc::Ptx {
        if self.cubin {
            cudarc::nvrtc::Ptx::from_binary(self.bytes.clone())
        } else {
            cudarc::nvrtc::Ptx::from_src(String::from_utf8_lossy(&self.bytes))
        }
    }
}

impl std::fmt::Display for CompiledKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.cubin_error, self.cubin) {
            (_, true) => write!(f, "a cubin for {}", self.arch),
            (Some(e), false) => write!(f, "PTX for {} (no cubin: {e})", self.arch),
            (None, false) => write!(f, "PTX for {}", self.arch),
        }
    }
}

/// The kernels for compute capability `cc`, compiled once per process (each model load and
/// each test takes the same image): a cubin for `sm_XX` where this NVRTC makes one, else PTX.
pub fn kernels_for(cc: (i32, i32)) -> Result<Arc<CompiledKernels>> {
    type Cache = std::sync::Mutex<std::collections::HashMap<(i32, i32), Arc<CompiledKernels>>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    // The lock is held while compiling: a second thread waits for the first's image.
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(k) = cache.get(&cc) {
        return Ok(k.clone());
    }
    let nvrtc = nvrtc::library().map_err(|e| ModelError::Device(format!("cuda: {e}")))?;
    let sm = versions::sm_name(cc);
    let options = nvrtc_options(Some(&sm));
    let key = format!("{}\n{}\n{}", nvrtc.version, options.join(" "), KERNELS);
    let dir = crate::weights::panel_file::cache_dir("kernels");
    let cubin = cached_cubin(dir.as_deref(), &key, || {
        nvrtc.compile_cubin(KERNELS, &options)
    });
    let compiled = match cubin {
        Ok(bin) => CompiledKernels {
            bytes: bin,
            cubin: true,
            arch: sm,
            cubin_error: None,
        },
        Err(e) => CompiledKernels {
            bytes: nvrtc
                .compile(KERNELS, &nvrtc_options(Some(versions::arch_name(cc))))
                .map_err(|e| dev_err("compiling the kernels", e))?
                .into_bytes(),
            cubin: false,
            arch: versions::arch_name(cc).to_string(),
            cubin_error: Some(e.lines().next().unwrap_or_default().to_string()),
        },
    };
    let compiled = Arc::new(compiled);
    cache.insert(cc, compiled.clone());
    Ok(compiled)
}

/// A cubin from the kernel cache folder `dir` (`<sha256 of key>.cubin`, `key` naming the
/// NVRTC version, options and source), else from `compile` and written there for the next
/// process (each process would otherwise spend NVRTC's and ptxas's ~10–30 s again). A file
/// that is not an ELF image is compiled again; a failed write only costs the next process.
fn cached_cubin(
    dir: Option<&std::path::Path>,
    key: &str,
    compile: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
) -> std::result::Result<Vec<u8>, String> {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(key.as_bytes());
    let name: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.map(|d| d.join(format!("{name}.cubin")));
    if let Some(bin) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if bin.starts_with(b"\x7fELF") {
            return Ok(bin);
        }
    }
    let bin = compile()?;
    if let (Some(dir), Some(path)) = (dir, &path) {
        let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
        let written = std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&tmp, &bin))
            .and_then(|_| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(bin)
}

/// Which matmul kernels a device runs: the integer kernels with the CPU's arithmetic
/// (`mmq.cu`, the default) or, with `CANDOR_CUDA_MATMUL=legacy`, the f32 kernels of
/// `candor-cuda-1` and its attention with one warp per query head (kept so that one GPU run
/// can time both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MatmulPath {
    Integer,
    Legacy,
}

/// The matmul path this process runs (`CANDOR_CUDA_MATMUL`: `integer`, the default, `dp4a`
/// (the integer path without the tensor-core kernels: the same bits, for timing both) or
/// `legacy`); read once.
pub(super) fn matmul_path() -> MatmulPath {
    static PATH: std::sync::OnceLock<MatmulPath> = std::sync::OnceLock::new();
    *PATH.get_or_init(|| match std::env::var("CANDOR_CUDA_MATMUL").as_deref() {
        Ok("legacy") => MatmulPath::Legacy,
        Ok("integer" | "dp4a") | Err(_) => MatmulPath::Integer,
        Ok(other) => {
            eprintln!(
                "CANDOR_CUDA_MATMUL={other}: expected integer, dp4a or legacy; using integer"
            );
            MatmulPath::Integer
        }
    })
}

/// Which kernel takes a quantized product on the integer path: `dp4a` (`mmq.cu`) or the int8
/// tensor cores (`mmt.cu`). Both give the CPU's `QWeight::matmul` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IntKernel {
    Dp4a,
    Mma,
}

/// Whether `CANDOR_CUDA_MATMUL=dp4a` keeps every quantized product on `dp4a`; read once.
fn dp4a_only() -> bool {
    static DP4A: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DP4A.get_or_init(|| std::env::var("CANDOR_CUDA_MATMUL").as_deref() == Ok("dp4a"))
}

/// The weight types' names in the matmul kernels' names, in `WeightKind` order.
pub(super) const MATMUL_TYPES: [&str; 12] = [
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "q5_0", "q5_1", "q5_k", "mxfp4",
];

/// The compiled kernels.
pub(super) struct Kernels {
    /// What the driver loaded (a cubin for `sm_XX`, or PTX and why).
    pub(super) loaded: String,
    pub(super) matmul: [CudaFunction; 12],
    /// The same products, MM_OUTS outputs per warp (identical bits).
    pub(super) matmul_wide: [CudaFunction; 12],
    /// The integer (quantized types) and float kernels of `mmq.cu`, row tiles of 1 and of 8
    /// (identical bits).
    pub(super) mmq1: [CudaFunction; 12],
    pub(super) mmq8: [CudaFunction; 12],
    /// The tensor-core kernels of `mmt.cu` (quantized types; `None` for the float ones).
    pub(super) mmt: [Option<CudaFunction>; 12],
    /// `mmq.cu`'s grouped expert rows, each by its own expert's weight (quantized types).
    pub(super) mmqe: [Option<CudaFunction>; 12],
    /// `mmt.cu`'s grouped expert rows in row tiles of one expert (quantized types).
    pub(super) mmte: [Option<CudaFunction>; 12],
    /// Whether the device has the int8 MMA (compute capability 8.0 or newer).
    pub(super) mma: bool,
    pub(super) quantize_q8: CudaFunction,
    pub(super) quantize_q8k: CudaFunction,
    pub(super) rms_norm: CudaFunction,
    pub(super) add_bias: CudaFunction,
    pub(super) scale_rows: CudaFunction,
    pub(super) add_in_place: CudaFunction,
    pub(super) gated_act: CudaFunction,
    pub(super) softcap: CudaFunction,
    pub(super) split_cols: CudaFunction,
    pub(super) gather_rows: CudaFunction,
    pub(super) rope: CudaFunction,
    pub(super) kv_write: CudaFunction,
    pub(super) attn_partial: CudaFunction,
    /// The same pass with one block per KV head's query-head group (identical bits).
    pub(super) attn_partial_gqa: CudaFunction,
    pub(super) attn_combine: CudaFunction,
    /// The two passes for heads of up to 576 dimensions (latent attention).
    pub(super) attn_partial_wide: CudaFunction,
    pub(super) attn_combine_wide: CudaFunction,
    /// Latent attention's column copies between a head's slice and its rows, and its keys
    /// and values from the latent.
    pub(super) copy_cols: CudaFunction,
    pub(super) mla_kv: CudaFunction,
    /// Gemma 4's layer scale and per-layer inputs.
    pub(super) scale: CudaFunction,
    pub(super) ple_combine: CudaFunction,
    pub(super) copy_block: CudaFunction,
    /// `fused.cu`: launches that cover several plan steps (`model::lowering`).
    pub(super) rms_norm_q8: CudaFunction,
    pub(super) rope_kv_write: CudaFunction,
    /// `moe.cu`: Mixture-of-Experts routing, grouping and combine; the gated activations
    /// with the CPU's `expf`.
    pub(super) moe_route: CudaFunction,
    pub(super) moe_group: CudaFunction,
    pub(super) moe_tiles: CudaFunction,
    pub(super) moe_combine: CudaFunction,
    pub(super) add_bias_experts: CudaFunction,
    pub(super) scale_experts: CudaFunction,
    pub(super) gated_act_cpu: CudaFunction,
    /// `deltanet.cu`: Qwen3.5's linear attention, output gate and shared expert's gate.
    pub(super) delta_conv: CudaFunction,
    pub(super) delta_prep: CudaFunction,
    pub(super) delta_rule: CudaFunction,
    pub(super) gated_norm: CudaFunction,
    pub(super) out_gate: CudaFunction,
    pub(super) shared_gate: CudaFunction,
}

impl Kernels {
    pub(super) fn load(ctx: &Arc<CudaContext>, cc: (i32, i32)) -> Result<Kernels> {
        let compiled = kernels_for(cc)?;
        let (module, loaded) = match ctx.load_module(compiled.image()) {
            Ok(m) => (m, compiled.to_string()),
            // A cubin the driver refuses: the PTX, which the driver compiles itself.
            Err(e) if compiled.cubin => {
                let ptx = compile_kernels(Some(cc))?;
                let m = ctx
                    .load_module(ptx)
                    .map_err(|e| dev_err("loading the kernels", e))?;
                let arch = versions::arch_name(cc);
                (m, format!("PTX for {arch} (the cubin did not load: {e})"))
            }
            Err(e) => return Err(dev_err("loading the kernels", e)),
        };
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| dev_err(&format!("kernel {name}"), e))
        };
        // One kernel per weight type, in `WeightKind` order.
        let matmuls = |prefix: &str| -> Result<[CudaFunction; 12]> {
            let fs = MATMUL_TYPES
                .iter()
                .map(|t| f(&format!("{prefix}{t}")))
                .collect::<Result<Vec<_>>>()?;
            fs.try_into()
                .map_err(|_| dev_err(prefix, "one kernel per weight type"))
        };
        // One kernel per quantized weight type (`None` for the float ones, the first three).
        let quantized = |prefix: &str| -> Result<[Option<CudaFunction>; 12]> {
            let fs = (MATMUL_TYPES.iter().enumerate())
                .map(|(i, t)| match i {
                    0..=2 => Ok(None),
                    _ => f(&format!("{prefix}{t}")).map(Some),
                })
                .collect::<Result<Vec<_>>>()?;
            fs.try_into()
                .map_err(|_| dev_err(prefix, "one kernel per weight type"))
        };
        Ok(Kernels {
            loaded,
            matmul: matmuls("matmul_")?,
            matmul_wide: matmuls("matmul_wide_")?,
            mmq1: matmuls("mmq1_")?,
            mmq8: matmuls("mmq8_")?,
            mmt: quantized("mmt_")?,
            mmqe: quantized("mmqe_")?,
            mmte: quantized("mmte_")?,
            mma: cc >= (8, 0),
            quantize_q8: f("quantize_q8")?,
            quantize_q8k: f("quantize_q8k")?,
            rms_norm: f("rms_norm")?,
            add_bias: f("add_bias")?,
            scale_rows: f("scale_rows")?,
            add_in_place: f("add_in_place")?,
            gated_act: f("gated_act")?,
            softcap: f("softcap")?,
            split_cols: f("split_cols")?,
            gather_rows: f("gather_rows")?,
            rope: f("rope")?,
            kv_write: f("kv_write")?,
            attn_partial: f("attn_partial")?,
            attn_partial_gqa: f("attn_partial_gqa")?,
            attn_combine: f("attn_combine")?,
            attn_partial_wide: f("attn_partial_wide")?,
            attn_combine_wide: f("attn_combine_wide")?,
            copy_cols: f("copy_cols")?,
            mla_kv: f("mla_kv")?,
            scale: f("scale")?,
            ple_combine: f("ple_combine")?,
            copy_block: f("copy_block")?,
            rms_norm_q8: f("rms_norm_q8")?,
            rope_kv_write: f("rope_kv_write")?,
            moe_route: f("moe_route")?,
            moe_group: f("moe_group")?,
            moe_tiles: f("moe_tiles")?,
            moe_combine: f("moe_combine")?,
            add_bias_experts: f("add_bias_experts")?,
            scale_experts: f("scale_experts")?,
            gated_act_cpu: f("gated_act_cpu")?,
            delta_conv: f("delta_conv")?,
            delta_prep: f("delta_prep")?,
            delta_rule: f("delta_rule")?,
            gated_norm: f("gated_norm")?,
            out_gate: f("out_gate")?,
            shared_gate: f("shared_gate")?,
        })
    }
}

/// How a matrix is held on the device (the kernels' `W_*` codes, in `Kernels::matmul` order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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
    Mxfp4 = 11,
}

impl Kind {
    /// The activation blocks the integer kernel of a quantized kind wants (the
    /// `quantize_q8` kind 0 = Q8_0, 1 = Q8_1, or 2 = Q8_K); `None` for the float kinds.
    pub(super) fn act(self) -> Option<i32> {
        match self {
            Kind::F32 | Kind::F16 | Kind::BF16 => None,
            Kind::Q8_0 | Kind::Q4_0 | Kind::Q5_0 | Kind::Mxfp4 => Some(0),
            Kind::Q4_1 | Kind::Q5_1 => Some(1),
            Kind::Q4K | Kind::Q5K | Kind::Q6K => Some(2),
        }
    }
}

/// A matrix in device memory: as stored (the legacy kernels, and float types), or repacked
/// for the integer kernels (`repack.rs`: regions B and C at `b_off`, `c_off`).
pub(super) struct DevWeight {
    pub(super) kind: Kind,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) buf: CudaSlice<u8>,
    pub(super) b_off: usize,
    pub(super) c_off: usize,
}

/// Device scratch for activations quantized to 8-bit blocks: quants, block scales, Q8_1 sums,
/// integer sums (of every 16 for Q8_K, of every block for Q8_0), for up to `elems` activations.
pub(super) struct ActBufs {
    pub(super) qs: CudaSlice<u8>,
    pub(super) d: CudaSlice<f32>,
    pub(super) s: CudaSlice<f32>,
    pub(super) sums: CudaSlice<i32>,
    pub(super) elems: usize,
}

impl ActBufs {
    /// The device addresses of the quants, scales, Q8_1 sums and integer sums, in the
    /// kernels' argument order.
    pub(super) fn ptrs(&self, s: &CudaStream) -> (u64, u64, u64, u64) {
        (
            ptr(&self.qs, s),
            ptr(&self.d, s),
            ptr(&self.s, s),
            ptr(&self.sums, s),
        )
    }
}

/// The launch of `rms_norm` and of the fused `rms_norm_q8` over `rows` rows of `dim`: one
/// block per row, a power of two of threads (at most 1024). Both must use it: the block size
/// sets the partial sums, so the same size gives the same bits.
fn norm_launch(rows: usize, dim: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: ((dim.next_power_of_two() as u32).clamp(32, 1024), 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The arguments of [`Gpu::rope_kv_write`].
pub(super) struct RopeKvArgs<'a> {
    pub(super) q: u64,
    pub(super) k: u64,
    pub(super) v: u64,
    pub(super) bias: Option<&'a [CudaSlice<f32>; 3]>,
    /// The RoPE table (`rows × rope_dim`).
    pub(super) cs: u64,
    pub(super) rows: usize,
    pub(super) c: &'a ModelConfig,
    /// The layer's geometry (its heads and head size, its RoPE dimensions).
    pub(super) d: LayerDims,
    /// Halves between two positions' keys in a block (the widest layer's `kv_dim`).
    pub(super) stride: usize,
    pub(super) pool: u64,
    pub(super) row_blocks: u64,
    pub(super) row_slots: u64,
    pub(super) layer: usize,
    pub(super) bt: usize,
    pub(super) block_len: i64,
}

/// The arguments of [`Gpu::attn_partial`] and [`Gpu::attn_combine`]: one layer's attention
/// of `rows` query rows over the KV pool, in chunks of positions.
pub(super) struct AttnArgs {
    /// The queries (`rows × heads × head_dim` floats).
    pub(super) q: u64,
    pub(super) pool: u64,
    pub(super) tables: u64,
    pub(super) table_offsets: u64,
    pub(super) positions: u64,
    /// The chunks' partial results (`rows × heads × chunks × (head_dim + 2)` floats).
    pub(super) part: u64,
    /// The output (`rows × heads × head_dim` floats).
    pub(super) out: u64,
    /// Each head's attention sink (gpt-oss), or 0.
    pub(super) sinks: u64,
    pub(super) rows: usize,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) head_dim: usize,
    /// Halves between two positions' keys in a block (the widest layer's `kv_dim`).
    pub(super) kv_stride: usize,
    /// The KV layer read (the layer's own, or the earlier one it shares).
    pub(super) layer: usize,
    pub(super) bt: usize,
    pub(super) block_len: i64,
    pub(super) scale: f32,
    /// The logit soft-cap (0: none).
    pub(super) cap: f32,
    /// The sliding window (0: none).
    pub(super) window: i32,
    /// Chunks per row (the step's largest, `attn_chunks`).
    pub(super) chunks: usize,
    /// The group kernel (each K/V tile staged once for a KV head's query heads), taken when
    /// the group has at most 32 query heads; else a warp per query head (the same bits).
    pub(super) gqa: bool,
    /// The wide-head kernels (`attn_partial_wide`, `attn_combine_wide`).
    pub(super) wide: bool,
}

/// Grid size for `total` elements at [`EW`] threads per block.
pub(super) fn ew(total: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((total as u32).div_ceil(EW).max(1), 1, 1),
        block_dim: (EW, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

/// The device, its stream and kernels: shared by the model and its KV pool.
pub(super) struct Gpu {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) stream: Arc<CudaStream>,
    pub(super) k: Kernels,
    /// Multiprocessors (the tensor-core dispatch weighs tiles against them).
    pub(super) sms: usize,
}

impl Gpu {
    /// Every kernel launch goes through here: the driver's answer to the launch of `kernel`
    /// as an error naming it, and with `CANDOR_CUDA_SYNC=1` the stream synchronised at once,
    /// so that a fault names the kernel that caused it (the caller adds the layer and step).
    pub(super) fn launched<T>(
        &self,
        kernel: impl std::fmt::Display,
        r: std::result::Result<T, cudarc::driver::DriverError>,
    ) -> Result<()> {
        r.map_err(|e| launch_err(&kernel, false, e))?;
        if sync_each_launch() {
            self.stream
                .synchronize()
                .map_err(|e| launch_err(&kernel, true, e))?;
        }
        Ok(())
    }

    pub(super) fn upload<T: cudarc::driver::DeviceRepr>(
        &self,
        what: &str,
        v: &[T],
    ) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(v)
            .map_err(|e| dev_err(&format!("uploading {what}"), e))
    }

    pub(super) fn zeros<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        what: &str,
        n: usize,
    ) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros(n.max(1))
            .map_err(|e| dev_err(&format!("allocating {what}"), e))
    }

    /// Scratch for `elems` quantized activations ([`ActBufs`]).
    pub(super) fn act_bufs(&self, elems: usize) -> Result<ActBufs> {
        Ok(ActBufs {
            qs: self.zeros("quantized activations", elems)?,
            d: self.zeros("activation scales", elems / 32)?,
            s: self.zeros("activation sums", elems / 32)?,
            sums: self.zeros("activation sums", elems / 16)?,
            elems,
        })
    }
}

/// Launches of the step kernels.
impl Gpu {
    /// `y = x · Wᵀ` (`x` m × k, `y` m × n), or `y += x · Wᵀ` with `add` (the residual), on
    /// the path the weight was uploaded for. Integer path: the activations are quantized into
    /// `act` first unless `quantized` says they already are for this kind (q, k and v, or
    /// gate and up, share one quantization); returns the kind now in `act`. A quantized
    /// product runs on the tensor cores where its tiles fill the card ([`mma_pays`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_into(
        &self,
        w: &DevWeight,
        x: u64,
        m: usize,
        y: u64,
        act: &ActBufs,
        quantized: Option<i32>,
        add: bool,
    ) -> Result<Option<i32>> {
        let kernel = self.int_kernel(w, m);
        self.matmul_with(w, x, m, y, act, quantized, add, kernel)
    }

    /// The integer kernel for a quantized product of `m` rows: by the shape alone (and
    /// `CANDOR_CUDA_MATMUL=dp4a`, and whether the device has the int8 MMA).
    pub(super) fn int_kernel(&self, w: &DevWeight, m: usize) -> IntKernel {
        if self.k.mma && mma_pays(m, w.n, self.sms) && w.kind.act().is_some() && !dp4a_only() {
            IntKernel::Mma
        } else {
            IntKernel::Dp4a
        }
    }

    /// [`Gpu::matmul_into`] with the integer kernel chosen by the caller (`kernel` is
    /// ignored for float weights and on the legacy path; the timings run both kernels).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_with(
        &self,
        w: &DevWeight,
        x: u64,
        m: usize,
        y: u64,
        act: &ActBufs,
        quantized: Option<i32>,
        add: bool,
        kernel: IntKernel,
    ) -> Result<Option<i32>> {
        if m == 0 {
            return Ok(quantized);
        }
        if matmul_path() == MatmulPath::Legacy {
            if add {
                return Err(dev_err("matmul", "the legacy kernels add no residual"));
            }
            self.matmul(w, x, m, y)?;
            return Ok(quantized);
        }
        let s = &*self.stream;
        let mr = if m == 1 { 1 } else { 8 };
        let f = if mr == 1 { &self.k.mmq1 } else { &self.k.mmq8 };
        let f = &f[w.kind as usize];
        let (m_i, n_i, k_i, add_i) = (m as i32, w.n as i32, w.k as i32, add as i32);
        let pw = ptr(&w.buf, s);
        let cfg = LaunchConfig {
            grid_dim: ((m.div_ceil(mr) * w.n.div_ceil(MQ_RO)) as u32, 1, 1),
            block_dim: (MQ_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let Some(kind) = w.kind.act() else {
            let mut lb = s.launch_builder(f);
            lb.arg(&x)
                .arg(&m_i)
                .arg(&pw)
                .arg(&n_i)
                .arg(&k_i)
                .arg(&y)
                .arg(&add_i);
            // SAFETY: x holds m × k floats, y m × n; w holds n × k values of its type.
            let name = MATMUL_TYPES[w.kind as usize];
            self.launched(format_args!("mmq{mr}_{name}"), unsafe { lb.launch(cfg) })?;
            return Ok(quantized);
        };
        if m * w.k > act.elems {
            return Err(dev_err(
                "matmul",
                format!("{m} × {} activations past the scratch's {}", w.k, act.elems),
            ));
        }
        if quantized != Some(kind) {
            self.quantize(x, m, w.k, kind, act)?;
        }
        let (pq, pd, ps, psum) = act.ptrs(s);
        let (b_off, c_off) = (w.b_off as i64, w.c_off as i64);
        let (f, cfg, family) = match (kernel, &self.k.mmt[w.kind as usize]) {
            (IntKernel::Mma, Some(mmt)) if self.k.mma => (
                mmt,
                LaunchConfig {
                    grid_dim: ((m.div_ceil(MT_BM) * w.n.div_ceil(MT_BN)) as u32, 1, 1),
                    block_dim: (MT_THREADS as u32, 1, 1),
                    shared_mem_bytes: 0,
                },
                "mmt",
            ),
            _ => (f, cfg, if mr == 1 { "mmq1" } else { "mmq8" }),
        };
        let mut lb = s.launch_builder(f);
        lb.arg(&pq).arg(&pd).arg(&ps).arg(&psum).arg(&m_i);
        lb.arg(&pw)
            .arg(&b_off)
            .arg(&c_off)
            .arg(&n_i)
            .arg(&k_i)
            .arg(&y)
            .arg(&add_i);
        // SAFETY: act holds m × k quantized activations of this kind (just written or
        // written for the same x); w is repacked (regions at b_off, c_off); y holds m × n.
        let name = MATMUL_TYPES[w.kind as usize];
        self.launched(format_args!("{family}_{name}"), unsafe { lb.launch(cfg) })?;
        Ok(Some(kind))
    }

    /// Grouped expert rows: row `p` of the `rows` at `x` (grouped by `moe_group`) times the
    /// weight of expert `gexp[p]`, whose address is `wtab[gexp[p]]`, into row `p` of `y`; every
    /// expert's matrix has `w`'s kind, shape and layout. Each row gets the bits of
    /// [`Gpu::matmul_into`] on its expert's rows alone. `quantized` as there; returns the kind
    /// now in `act`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_experts(
        &self,
        w: &DevWeight,
        (wtab, gexp): (u64, u64),
        x: u64,
        rows: usize,
        y: u64,
        act: &ActBufs,
        quantized: Option<i32>,
    ) -> Result<Option<i32>> {
        let grid = (w.n.div_ceil(MQ_RO) as u32, rows as u32);
        let how = Grouped::Rows(gexp);
        self.grouped_matmul(w, how, wtab, grid, x, rows, y, act, quantized)
    }

    /// `moe_tiles`: the row tiles of `mmte_` from the experts' row counts at `counts`, into
    /// `tiles` (`max_tiles` entries of 4 ints).
    pub(super) fn moe_tiles(
        &self,
        counts: u64,
        experts: usize,
        tiles: u64,
        max_tiles: usize,
    ) -> Result<()> {
        let (e_i, bm, t_i) = (experts as i32, MT_BM as i32, max_tiles as i32);
        let mut lb = self.stream.launch_builder(&self.k.moe_tiles);
        lb.arg(&counts).arg(&e_i).arg(&bm).arg(&tiles).arg(&t_i);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: counts holds `experts` ints, tiles 4 × max_tiles.
        self.launched("moe_tiles", unsafe { lb.launch(cfg) })?;
        Ok(())
    }

    /// Grouped expert rows on the tensor cores: the `rows` at `x` (grouped by `moe_group`),
    /// each times the weight of its expert, in the row tiles of one expert each that
    /// `moe_tiles` wrote at `tiles` (`max_tiles` entries, enough for `rows` rows), the
    /// experts' addresses in `wtab`; as [`Gpu::matmul_experts`] otherwise (the same bits).
    /// Needs the int8 MMA ([`Gpu::has_mma`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_expert_tiles(
        &self,
        w: &DevWeight,
        (wtab, tiles, max_tiles): (u64, u64, usize),
        x: u64,
        rows: usize,
        y: u64,
        act: &ActBufs,
        quantized: Option<i32>,
    ) -> Result<Option<i32>> {
        let grid = (max_tiles as u32, w.n.div_ceil(MT_BN) as u32);
        let how = Grouped::Tiles(tiles);
        self.grouped_matmul(w, how, wtab, grid, x, rows, y, act, quantized)
    }

    /// One grouped launch (`mmqe_` row by row, or `mmte_` in tiles) of `w`'s kind over `rows`
    /// grouped rows on grid `grid`, after quantizing them unless `quantized` says they are.
    #[allow(clippy::too_many_arguments)]
    fn grouped_matmul(
        &self,
        w: &DevWeight,
        how: Grouped,
        wtab: u64,
        (gx, gy): (u32, u32),
        x: u64,
        rows: usize,
        y: u64,
        act: &ActBufs,
        quantized: Option<i32>,
    ) -> Result<Option<i32>> {
        let (what, prefix, table, index) = match how {
            Grouped::Rows(gexp) => ("grouped experts", "mmqe", &self.k.mmqe, gexp),
            Grouped::Tiles(tiles) => ("grouped expert tiles", "mmte", &self.k.mmte, tiles),
        };
        let mma = self.k.mma || matches!(how, Grouped::Rows(_));
        let (Some(kind), Some(f), true) = (w.kind.act(), &table[w.kind as usize], mma) else {
            return Err(dev_err(what, "no grouped kernel for this weight or device"));
        };
        if rows == 0 {
            return Ok(quantized);
        }
        if rows * w.k > act.elems {
            return Err(dev_err(
                what,
                format!(
                    "{rows} × {} activations past the scratch's {}",
                    w.k, act.elems
                ),
            ));
        }
        if quantized != Some(kind) {
            self.quantize(x, rows, w.k, kind, act)?;
        }
        let s = &*self.stream;
        let (pq, pd, ps, psum) = act.ptrs(s);
        let (b_off, c_off, n_i, k_i) = (w.b_off as i64, w.c_off as i64, w.n as i32, w.k as i32);
        let mut lb = s.launch_builder(f);
        lb.arg(&pq).arg(&pd).arg(&ps).arg(&psum);
        lb.arg(&index)
            .arg(&wtab)
            .arg(&b_off)
            .arg(&c_off)
            .arg(&n_i)
            .arg(&k_i)
            .arg(&y);
        let threads = match how {
            Grouped::Rows(_) => MQ_THREADS,
            Grouped::Tiles(_) => MT_THREADS,
        };
        let cfg = LaunchConfig {
            grid_dim: (gx, gy, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: act holds rows × k quantized activations of this kind; the index (each
        // row's expert, or the tiles `moe_tiles` wrote from the rows' counts) names experts
        // whose addresses in wtab are matrices repacked as w (regions at b_off, c_off), rows
        // inside the `rows`; y holds rows × n.
        let name = MATMUL_TYPES[w.kind as usize];
        self.launched(format_args!("{prefix}_{name}"), unsafe { lb.launch(cfg) })?;
        Ok(Some(kind))
    }

    /// Whether the device has the int8 MMA the tensor-core kernels need.
    pub(super) fn has_mma(&self) -> bool {
        self.k.mma
    }

    /// Quantizes the `m × k` activations at `x` into `act` (`kind` as [`Kind::act`]).
    fn quantize(&self, x: u64, m: usize, k: usize, kind: i32, act: &ActBufs) -> Result<()> {
        let s = &*self.stream;
        let block = if kind == 2 { 256 } else { 32 };
        let cfg = LaunchConfig {
            grid_dim: ((k / block).div_ceil(8) as u32, m as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let k_i = k as i32;
        let (pq, pd, ps, psum) = act.ptrs(s);
        if kind == 2 {
            let mut lb = s.launch_builder(&self.k.quantize_q8k);
            lb.arg(&x).arg(&k_i).arg(&pq).arg(&pd).arg(&psum);
            // SAFETY: x holds m × k floats (k a multiple of 256); act holds m × k (checked).
            self.launched("quantize_q8k", unsafe { lb.launch(cfg) })?;
        } else {
            let mut lb = s.launch_builder(&self.k.quantize_q8);
            lb.arg(&x)
                .arg(&k_i)
                .arg(&kind)
                .arg(&pq)
                .arg(&pd)
                .arg(&ps)
                .arg(&psum);
            // SAFETY: x holds m × k floats (k a multiple of 32); act holds m × k (checked).
            self.launched("quantize_q8", unsafe { lb.launch(cfg) })?;
        }
        Ok(())
    }

    /// The legacy f32 kernels (`matmul_*`, `matmul_wide_*`) on a weight uploaded as stored.
    pub(super) fn matmul(&self, w: &DevWeight, x: u64, m: usize, y: u64) -> Result<()> {
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
        let wide = if outs > 1 { "wide_" } else { "" };
        let name = MATMUL_TYPES[w.kind as usize];
        self.launched(format_args!("matmul_{wide}{name}"), unsafe {
            lb.launch(cfg)
        })?;
        Ok(())
    }

    pub(super) fn rms_norm(
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
        let mut lb = s.launch_builder(&self.k.rms_norm);
        lb.arg(&x).arg(&pw).arg(&y).arg(&dim_i).arg(&eps);
        // SAFETY: x and y hold rows × dim floats, w dim.
        self.launched("rms_norm", unsafe { lb.launch(norm_launch(rows, dim)) })?;
        Ok(())
    }

    /// `rms_norm` of `rows` rows of `dim` values from `x` into `y`, and the normed rows
    /// quantized into `act` as [`Gpu::quantize`] writes blocks `a` (one launch,
    /// `fused.cu`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rms_norm_q8(
        &self,
        x: u64,
        w: &CudaSlice<f32>,
        y: u64,
        rows: usize,
        dim: usize,
        eps: f32,
        a: ActBlocks,
        act: &ActBufs,
    ) -> Result<()> {
        let block = if a == ActBlocks::Q8K { 256 } else { 32 };
        if rows * dim > act.elems || !dim.is_multiple_of(block) {
            return Err(dev_err(
                "rms_norm_q8",
                format!(
                    "{rows} × {dim} activations in blocks of {block}, scratch {}",
                    act.elems
                ),
            ));
        }
        let s = &*self.stream;
        let pw = ptr(w, s);
        let (dim_i, kind) = (dim as i32, a.code());
        let (pq, pd, ps, psum) = act.ptrs(s);
        let mut lb = s.launch_builder(&self.k.rms_norm_q8);
        lb.arg(&x).arg(&pw).arg(&y).arg(&dim_i).arg(&eps);
        lb.arg(&kind).arg(&pq).arg(&pd).arg(&ps).arg(&psum);
        // SAFETY: x and y hold rows × dim floats, w dim; act holds rows × dim activations
        // (checked), dim a multiple of the block.
        self.launched("rms_norm_q8", unsafe { lb.launch(norm_launch(rows, dim)) })?;
        Ok(())
    }

    /// Bias (when given), RoPE of q and k, and the KV write, in one launch (`fused.cu`).
    pub(super) fn rope_kv_write(&self, a: &RopeKvArgs) -> Result<()> {
        let s = &*self.stream;
        let c = a.c;
        let null = 0u64;
        let (bq, bk, bv) = match a.bias {
            Some([q, k, v]) => (ptr(q, s), ptr(k, s), ptr(v, s)),
            None => (null, null, null),
        };
        let d = a.d;
        let (rows, heads, kv_heads, hd, rd, neox) = (
            a.rows as i32,
            d.n_head as i32,
            d.n_kv_head as i32,
            d.head_dim as i32,
            d.rope_dim as i32,
            c.rope_neox as i32,
        );
        let (stride, layer, bt) = (a.stride as i32, a.layer as i32, a.bt as i32);
        let mut lb = s.launch_builder(&self.k.rope_kv_write);
        lb.arg(&a.q)
            .arg(&a.k)
            .arg(&a.v)
            .arg(&bq)
            .arg(&bk)
            .arg(&bv)
            .arg(&a.cs);
        lb.arg(&rows)
            .arg(&heads)
            .arg(&kv_heads)
            .arg(&hd)
            .arg(&rd)
            .arg(&neox);
        lb.arg(&a.pool)
            .arg(&a.row_blocks)
            .arg(&a.row_slots)
            .arg(&stride)
            .arg(&layer)
            .arg(&bt);
        lb.arg(&a.block_len);
        let total = a.rows * (d.n_head + 2 * d.n_kv_head) * d.head_dim / 2;
        // SAFETY: q holds rows × q_dim floats, k and v rows × kv_dim, the biases their widths,
        // cs rows × rope_dim; every row's block and slot were given by its sequence's KV.
        self.launched("rope_kv_write", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    /// Attention's first pass: each row's chunks of positions, one partial (max, sum,
    /// weighted values) per row, head and chunk.
    pub(super) fn attn_partial(&self, a: &AttnArgs) -> Result<()> {
        let hd = a.head_dim;
        let group = a.heads / a.kv_heads;
        let (heads, group_i, hd_i, kv_i, l_i, bt_i) = (
            a.heads as i32,
            group as i32,
            hd as i32,
            a.kv_stride as i32,
            a.layer as i32,
            a.bt as i32,
        );
        let chunks_i = a.chunks as i32;
        // The group kernel's block is a warp per query head of the group (at most 32): a
        // larger group runs a warp per query head (the same bits).
        let gqa = a.gqa && group <= 32;
        let kernel = match (a.wide, gqa) {
            (true, _) => &self.k.attn_partial_wide,
            (false, true) => &self.k.attn_partial_gqa,
            (false, false) => &self.k.attn_partial,
        };
        let mut lb = self.stream.launch_builder(kernel);
        lb.arg(&a.q)
            .arg(&a.pool)
            .arg(&a.tables)
            .arg(&a.table_offsets)
            .arg(&a.positions);
        lb.arg(&heads)
            .arg(&group_i)
            .arg(&hd_i)
            .arg(&kv_i)
            .arg(&l_i)
            .arg(&bt_i);
        lb.arg(&a.block_len)
            .arg(&a.scale)
            .arg(&a.cap)
            .arg(&a.window)
            .arg(&chunks_i);
        lb.arg(&a.part);
        let cfg = if gqa {
            LaunchConfig {
                grid_dim: (a.chunks as u32, a.kv_heads as u32, a.rows as u32),
                block_dim: (32 * group as u32, 1, 1),
                // ATTN_TILE (32) positions of keys and of values, in halves.
                shared_mem_bytes: (2 * 32 * hd * 2) as u32,
            }
        } else {
            LaunchConfig {
                grid_dim: (a.chunks as u32, a.heads as u32, a.rows as u32),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            }
        };
        // SAFETY: part holds rows × heads × chunks × (hd + 2) floats; positions and tables
        // come from the sequences' KV, whose blocks cover every position; the group kernel's
        // tile is 2 × 32 × hd halves (hd <= 256: 32 KiB), its block heads / kv_heads warps.
        self.launched("attn_partial", unsafe { lb.launch(cfg) })?;
        Ok(())
    }

    /// Attention's second pass: each row's and head's chunks merged in chunk order (and the
    /// head's sink, when given) into `out`.
    pub(super) fn attn_combine(&self, a: &AttnArgs) -> Result<()> {
        let (heads, hd_i, chunks_i) = (a.heads as i32, a.head_dim as i32, a.chunks as i32);
        let kernel = match a.wide {
            true => &self.k.attn_combine_wide,
            false => &self.k.attn_combine,
        };
        let mut lb = self.stream.launch_builder(kernel);
        lb.arg(&a.part)
            .arg(&a.positions)
            .arg(&heads)
            .arg(&hd_i)
            .arg(&chunks_i)
            .arg(&a.sinks)
            .arg(&a.out);
        let cfg = LaunchConfig {
            grid_dim: (a.heads as u32, a.rows as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: out holds rows × heads × hd floats; sinks (when given) heads.
        self.launched("attn_combine", unsafe { lb.launch(cfg) })?;
        Ok(())
    }

    /// `gated_act`: `g = act(g) · u` over `total` values (`act` 0 SiLU, 1 GELU, the device's
    /// own `expf` and `tanhf`).
    pub(super) fn gated(&self, g: u64, u: u64, total: usize, act: i32) -> Result<()> {
        let t = total as i64;
        let mut lb = self.stream.launch_builder(&self.k.gated_act);
        lb.arg(&g).arg(&u).arg(&t).arg(&act);
        // SAFETY: g and u hold total floats.
        self.launched("gated_act", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    /// `scale`: `x *= s` over `total` values.
    pub(super) fn scale(&self, x: u64, s: f32, total: usize) -> Result<()> {
        let t = total as i64;
        let mut lb = self.stream.launch_builder(&self.k.scale);
        lb.arg(&x).arg(&s).arg(&t);
        // SAFETY: x holds total floats.
        self.launched("scale", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    /// `kv_write`: the `rows` keys and values (`kv_dim` wide) of layer `layer` into their
    /// slots (`row_blocks`, `row_slots`), positions `stride` halves apart in a block of
    /// `block_len` halves holding `bt` positions.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kv_write(
        &self,
        (k, v): (u64, u64),
        rows: usize,
        (kv_dim, stride): (usize, usize),
        layer: usize,
        bt: usize,
        (pool, row_blocks, row_slots): (u64, u64, u64),
        block_len: i64,
    ) -> Result<()> {
        let [rows_i, kv_i, stride_i, l_i, bt_i] =
            [rows, kv_dim, stride, layer, bt].map(|v| v as i32);
        let mut lb = self.stream.launch_builder(&self.k.kv_write);
        lb.arg(&k)
            .arg(&v)
            .arg(&pool)
            .arg(&row_blocks)
            .arg(&row_slots);
        lb.arg(&rows_i)
            .arg(&kv_i)
            .arg(&stride_i)
            .arg(&l_i)
            .arg(&bt_i)
            .arg(&block_len);
        // SAFETY: k and v hold rows × kv_dim values (kv_dim <= stride); every row's block and
        // slot were given by its sequence's KV (grown before the step, so inside the pool).
        self.launched("kv_write", unsafe { lb.launch(ew(rows * kv_dim)) })?;
        Ok(())
    }

    pub(super) fn add_bias(
        &self,
        x: u64,
        b: &CudaSlice<f32>,
        width: usize,
        total: usize,
    ) -> Result<()> {
        let s = &*self.stream;
        let pb = ptr(b, s);
        let (w_i, t) = (width as i32, total as i64);
        let mut lb = s.launch_builder(&self.k.add_bias);
        lb.arg(&x).arg(&pb).arg(&w_i).arg(&t);
        // SAFETY: x holds total floats, b width.
        self.launched("add_bias", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    /// `add_bias_experts`: each `width`-wide grouped row `p` of `x` (`total` values) plus the
    /// bias of its expert `gexp[p]`, whose address is `btab[gexp[p]]`.
    pub(super) fn add_bias_experts(
        &self,
        x: u64,
        tab: (u64, u64),
        width: usize,
        total: usize,
    ) -> Result<()> {
        let f = &self.k.add_bias_experts;
        self.by_expert(f, "add_bias_experts", x, tab, width, total)
    }

    /// `scale_experts`: each `width`-wide grouped row `p` of `x` (`total` values) times the
    /// output scale of its expert `gexp[p]` in `scale` (one float per expert).
    pub(super) fn scale_experts(
        &self,
        x: u64,
        tab: (u64, u64),
        width: usize,
        total: usize,
    ) -> Result<()> {
        self.by_expert(&self.k.scale_experts, "scale_experts", x, tab, width, total)
    }

    /// One of `moe.cu`'s per-row expert kernels `f` (`name`): `x[i]` with the entry of `tab`
    /// for the expert `gexp[i / width]` of its grouped row, over `total` values.
    fn by_expert(
        &self,
        f: &CudaFunction,
        name: &str,
        x: u64,
        (tab, gexp): (u64, u64),
        width: usize,
        total: usize,
    ) -> Result<()> {
        let (w_i, t) = (width as i32, total as i64);
        let mut lb = self.stream.launch_builder(f);
        lb.arg(&x).arg(&gexp).arg(&tab).arg(&w_i).arg(&t);
        // SAFETY: x holds total floats, gexp total / width experts, each with its entry in
        // tab (a bias's address, or a scale).
        self.launched(name, unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    /// `scale_rows`: each `width`-wide row of `x` (`total` values) times its factor in `s`.
    pub(super) fn scale_rows(&self, x: u64, s: u64, width: usize, total: usize) -> Result<()> {
        let (w_i, t) = (width as i32, total as i64);
        let mut lb = self.stream.launch_builder(&self.k.scale_rows);
        lb.arg(&x).arg(&s).arg(&w_i).arg(&t);
        // SAFETY: x holds total floats, s one per row of width.
        self.launched("scale_rows", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    /// `gated_act_cpu`: `g = act(g) · u` with the CPU's `expf` (act 0 SwiGLU-OAI, 1 SiLU).
    pub(super) fn gated_cpu(&self, g: u64, u: u64, total: usize, act: i32) -> Result<()> {
        let t = total as i64;
        let mut lb = self.stream.launch_builder(&self.k.gated_act_cpu);
        lb.arg(&g).arg(&u).arg(&t).arg(&act);
        // SAFETY: g and u hold total floats.
        self.launched("gated_act_cpu", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    pub(super) fn add(&self, x: u64, y: u64, total: usize) -> Result<()> {
        let s = &*self.stream;
        let t = total as i64;
        let mut lb = s.launch_builder(&self.k.add_in_place);
        lb.arg(&x).arg(&y).arg(&t);
        // SAFETY: both hold total floats.
        self.launched("add_in_place", unsafe { lb.launch(ew(total)) })?;
        Ok(())
    }

    pub(super) fn split(
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
        self.launched("split_cols", unsafe { lb.launch(ew(rows * w)) })?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn rope(
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
        self.launched("rope", unsafe { lb.launch(ew(rows * heads * rd / 2)) })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_sync_is_on_for_1_only() {
        assert_eq!(parse_sync(Some("1")), (true, None));
        for off in [None, Some(""), Some("0")] {
            assert_eq!(parse_sync(off), (false, None), "{off:?}");
        }
        let (on, warning) = parse_sync(Some("yes"));
        assert!(!on);
        let w = warning.expect("a warning for an unknown value");
        assert!(
            w.starts_with("CANDOR_CUDA_SYNC=yes: expected 1") && !w.contains('\n'),
            "{w}"
        );
    }

    #[test]
    fn a_fault_names_the_kernel_and_where_it_ran() {
        let e = launch_err(
            format_args!("mmq8_{}", "q4_k"),
            true,
            "an illegal memory access",
        );
        let e = at_launch(e, format_args!("layer 3, launch 2 ({})", "matmul"));
        assert_eq!(
            e.to_string(),
            "cuda: kernel mmq8_q4_k faulted: an illegal memory access \
             [at layer 3, launch 2 (matmul)]"
        );
        let e = launch_err("rope", false, "too many resources requested");
        assert_eq!(
            e.to_string(),
            "cuda: launching kernel rope: too many resources requested"
        );
    }

    /// The kernels compile to a cubin for sm_80 and sm_90 (no GPU needed), once per process
    /// and compute capability.
    #[test]
    fn kernels_compile_to_a_cubin_once() {
        if nvrtc::library().is_err() {
            // `kernels_compile_with_nvrtc` records the skip.
            return;
        }
        for cc in [(8, 0), (9, 0)] {
            let k = kernels_for(cc).unwrap_or_else(|e| panic!("{cc:?}: {e}"));
            assert!(k.cubin, "{cc:?}: {k}");
            assert_eq!(
                k.to_string(),
                format!("a cubin for {}", versions::sm_name(cc))
            );
            let again = kernels_for(cc).expect("cached");
            assert!(Arc::ptr_eq(&k, &again), "{cc:?} compiled twice");
        }
        let bin = &kernels_for((9, 0)).expect("cached").bytes;
        // An ELF image with the kernels' (extern "C") names in its symbol table.
        assert_eq!(&bin[..4], b"\x7fELF");
        let has = |name: &str| bin.windows(name.len()).any(|w| w == name.as_bytes());
        for name in [
            "mmt_q4_k",
            "mmq1_q6_k",
            "attn_partial_gqa",
            "rms_norm_q8",
            "moe_route",
            "delta_rule",
        ] {
            assert!(has(name), "{name} not in the cubin");
        }
    }

    /// The tensor cores from half a wave of 64 × 64 tiles (132 SMs: H100/H200).
    /// The chunk length: the kernels' formula (`1 << (32 - clz(p))` over 32, at least 32) is
    /// the Rust one; every row has at most 32 chunks, which tile `0..=p` exactly.
    #[test]
    fn attention_chunks_by_position_alone() {
        let kernel_len = |p: u32| {
            let np2 = if p == 0 {
                1u32
            } else {
                1 << (32 - p.leading_zeros())
            };
            (np2 / 32).max(32) as usize
        };
        let mut ps: Vec<usize> = (0..5000).collect();
        ps.extend((13..31).flat_map(|b| [(1usize << b) - 1, 1 << b, (1 << b) + 1]));
        for p in ps {
            let len = attn_chunk_len(p);
            assert_eq!(len, kernel_len(p as u32), "position {p}");
            let n = attn_chunks(p);
            assert!(n <= 32, "position {p}: {n} chunks");
            // Chunk c holds c·len ..= min(c·len + len − 1, p): none empty, all of 0..=p.
            assert!((n - 1) * len <= p && p < n * len, "position {p}");
        }
        assert_eq!((attn_chunk_len(511), attn_chunks(511)), (32, 16));
        assert_eq!((attn_chunk_len(543), attn_chunks(543)), (32, 17));
        assert_eq!((attn_chunk_len(1024), attn_chunks(1024)), (64, 17));
        assert_eq!((attn_chunk_len(32767), attn_chunks(32767)), (1024, 32));
    }

    /// `attn_partial_gqa`'s two ways of staging a tile of keys and values (16-byte vectors, or
    /// one half at a time), emulated index for index on a random pool: the same halves land in
    /// the same places, for head sizes 64, 128 and 256, several KV heads and block sizes.
    #[test]
    fn attention_tiles_stage_the_same_halves_with_16_byte_loads() {
        #[allow(clippy::too_many_arguments)]
        fn stage(
            vec16: bool,
            pool: &[u16],
            tab: &[i32],
            (hd, kv_dim, kvo, layer, bt, block_len): (usize, usize, usize, usize, usize, usize),
            t0: usize,
            nt: usize,
            threads: usize,
        ) -> (Vec<u16>, Vec<u16>) {
            let (mut ks, mut vs) = (vec![u16::MAX; 32 * hd], vec![u16::MAX; 32 * hd]);
            for thread in 0..threads {
                if vec16 {
                    let vec = hd / 8;
                    let mut i = thread;
                    while i < nt * vec {
                        let (tt, j) = (i / vec, i % vec);
                        let t = t0 + tt;
                        let ko = tab[t / bt] as usize * block_len
                            + ((layer * 2) * bt + t % bt) * kv_dim
                            + kvo
                            + j * 8;
                        ks[i * 8..i * 8 + 8].copy_from_slice(&pool[ko..ko + 8]);
                        let vo = ko + bt * kv_dim;
                        vs[i * 8..i * 8 + 8].copy_from_slice(&pool[vo..vo + 8]);
                        i += threads;
                    }
                } else {
                    let mut i = thread;
                    while i < nt * hd {
                        let (tt, d) = (i / hd, i % hd);
                        let t = t0 + tt;
                        let base = tab[t / bt] as usize * block_len;
                        ks[i] = pool[base + ((layer * 2) * bt + t % bt) * kv_dim + kvo + d];
                        vs[i] = pool[base + ((layer * 2 + 1) * bt + t % bt) * kv_dim + kvo + d];
                        i += threads;
                    }
                }
            }
            (ks, vs)
        }
        let mut rng = crate::stats::rng::SplitMix64::new(7);
        for (hd, kv_heads, group, bt) in [(64, 2, 2, 16), (128, 8, 4, 16), (256, 4, 2, 32)] {
            let (layers, kv_dim) = (3, hd * kv_heads);
            let block_len = layers * 2 * bt * kv_dim;
            let blocks = 9;
            let pool: Vec<u16> = (0..blocks * block_len)
                .map(|_| (rng.next_u64() % 65535) as u16)
                .collect();
            let mut tab: Vec<i32> = (0..blocks as i32).collect();
            tab.reverse();
            for kvh in 0..kv_heads {
                for (t0, nt) in [(0, 32), (32, 7), (96, 32), (100, 1)] {
                    let args = (hd, kv_dim, kvh * hd, 2, bt, block_len);
                    let threads = 32 * group;
                    let a = stage(true, &pool, &tab, args, t0, nt, threads);
                    let b = stage(false, &pool, &tab, args, t0, nt, threads);
                    assert_eq!(a, b, "hd {hd}, KV head {kvh}, tile at {t0} of {nt}");
                    assert!(a.0[..nt * hd].iter().all(|&h| h != u16::MAX), "unwritten");
                }
            }
        }
    }

    #[test]
    fn tensor_cores_by_tiles_against_the_sms() {
        let sms = 132;
        // The 8B shape's attn_k/v (1024 outputs), attn_q/o (4096) and ffn_gate (14336).
        assert!(!mma_pays(8, 14336, sms), "too few rows");
        assert!(mma_pays(16, 14336, sms), "224 tiles");
        assert!(!mma_pays(16, 4096, sms), "64 tiles");
        assert!(!mma_pays(64, 4096, sms), "64 tiles");
        assert!(mma_pays(128, 4096, sms), "128 tiles");
        assert!(!mma_pays(256, 1024, sms), "64 tiles");
        assert!(mma_pays(512, 1024, sms), "128 tiles");
        assert!(mma_pays(64, 4096, 100), "a smaller card");
    }

    #[test]
    fn a_cubin_is_compiled_once_and_then_read_from_the_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let calls = std::cell::Cell::new(0);
        let compile = |bin: &'static [u8]| {
            calls.set(calls.get() + 1);
            Ok::<_, String>(bin.to_vec())
        };
        let elf = b"\x7fELF cubin";
        let d = Some(dir.path());
        assert_eq!(cached_cubin(d, "k", || compile(elf)).unwrap(), elf);
        assert_eq!(
            cached_cubin(d, "k", || compile(b"\x7fELF other")).unwrap(),
            elf
        );
        assert_eq!(calls.get(), 1, "the second process reads the cache");
        // Another key (NVRTC version, options or source) compiles again.
        assert_eq!(
            cached_cubin(d, "k2", || compile(b"\x7fELF 2")).unwrap(),
            b"\x7fELF 2"
        );
        assert_eq!(calls.get(), 2);
        // A damaged file is compiled again and replaced.
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(files.len(), 2, "no temporary files left");
        for f in &files {
            std::fs::write(f.path(), b"junk").unwrap();
        }
        assert_eq!(cached_cubin(d, "k", || compile(elf)).unwrap(), elf);
        assert_eq!(calls.get(), 3);
        assert_eq!(cached_cubin(d, "k", || compile(b"\x7fELF x")).unwrap(), elf);
        // No cache folder: always compiled; a compile error is returned.
        assert_eq!(cached_cubin(None, "k", || compile(elf)).unwrap(), elf);
        assert_eq!(calls.get(), 4);
        assert!(cached_cubin(d, "k3", || Err("no".into())).is_err());
    }

    /// Each launch of a kernel named in the source (`launch_builder(&… .k.name)`) passes as
    /// many arguments as `name` has parameters in `KERNELS` (`.arg(` calls up to its
    /// `.launch(`): a kernel given a parameter the launch lacks reads garbage on the card,
    /// which no machine without one would notice.
    #[test]
    fn every_named_launch_passes_as_many_arguments_as_its_kernel_takes() {
        let params = |name: &str| -> Option<usize> {
            let head = format!("__global__ void {name}(");
            let at = KERNELS.find(&head)?;
            let list = &KERNELS[at + head.len()..];
            let list = &list[..list.find(')').expect("parameter list")];
            Some(list.split(',').count())
        };
        let own = include_str!("kernels.rs");
        let own = &own[..own.find("\n#[cfg(test)]\nmod tests").expect("tests module")];
        let mut checked = 0;
        for (file, src) in [
            ("kernels.rs", own),
            ("forward.rs", include_str!("forward.rs")),
            ("hybrid.rs", include_str!("hybrid.rs")),
            ("pool.rs", include_str!("pool.rs")),
            ("timing.rs", include_str!("timing.rs")),
        ] {
            for (at, _) in src.match_indices("launch_builder(&") {
                let call = &src[at..];
                let target = &call["launch_builder(&".len()..call.find(')').expect("call")];
                let Some(name) = target.rsplit_once(".k.").map(|(_, n)| n) else {
                    continue;
                };
                let body = &call[..call.find(".launch(").expect("launched")];
                let want = params(name).unwrap_or_else(|| panic!("{file}: no kernel {name}"));
                assert_eq!(
                    body.matches(".arg(").count(),
                    want,
                    "{file}: the launch of {name} passes a different number of arguments"
                );
                checked += 1;
            }
        }
        assert!(checked >= 25, "{checked} launches checked");
    }

    /// Every kernel launch of the model goes through [`Gpu::launched`] (so that
    /// `CANDOR_CUDA_SYNC=1` covers it): each `launch(` of a launch builder is that call's
    /// argument, and there are as many `launched(` calls as launch builders.
    #[test]
    fn every_launch_goes_through_launched() {
        let own = include_str!("kernels.rs");
        let own = &own[..own.find("\n#[cfg(test)]\nmod tests").expect("tests module")];
        let sources = [
            ("kernels.rs", own),
            ("forward.rs", include_str!("forward.rs")),
            ("pool.rs", include_str!("pool.rs")),
            ("timing.rs", include_str!("timing.rs")),
            ("devices.rs", include_str!("devices.rs")),
        ];
        let mut builders = 0;
        for (file, src) in sources {
            let count = |pat: &str| src.matches(pat).count();
            let calls = count(".launched(");
            // A captured CUDA graph's launch is safe (its kernels' were checked at capture).
            let graphs = count("graph.launch()");
            assert_eq!(
                count("launch_builder(") + graphs,
                calls,
                "{file}: a launch builder or graph not launched through Gpu::launched"
            );
            for (at, _) in src.match_indices(".launch(") {
                let before = &src[at.saturating_sub(120)..at];
                let graph = before.ends_with("graph");
                assert!(
                    before.contains(".launched(") && (graph || before.contains("unsafe {")),
                    "{file}: a launch not inside Gpu::launched: {}",
                    &src[at.saturating_sub(120)..at + 20]
                );
            }
            builders += calls;
        }
        // The kernels of the forward pass, the matmuls and the KV block copy at least.
        assert!(builders >= 24, "{builders} launch sites");
    }
}
