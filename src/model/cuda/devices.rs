//! Device discovery: the CUDA devices this machine has, and opening one (its context, stream
//! and compiled kernels).

use std::sync::Arc;

use cudarc::driver::CudaContext;

use crate::model::error::ModelError;

use super::kernels::{matmul_path, Gpu, Kernels, MatmulPath, Result};
use super::weights::gib;
use super::{nvrtc, versions};

/// The version of the GPU kernels' numerics: bump it whenever a kernel's arithmetic changes
/// (a reply computed before may differ after). Part of the generation cache's key on a GPU.
/// `candor-cuda-2`: the integer matmuls with the CPU's arithmetic (`mmq.cu`) and RoPE with the
/// CPU's expression; a process run with `CANDOR_CUDA_MATMUL=legacy` computes the f32 matmuls
/// of `candor-cuda-1` instead (with the new RoPE) and says so in its key
/// ([`numerics_version`]: `candor-cuda-3-legacy-matmul`). `candor-cuda-3`: attention's chunks
/// by each row's position (`attn_chunk_len`: 32 positions up to 1,023, at most 32 chunks;
/// 256 positions before), so the softmax's partial sums and their combination differ.
pub const GPU_NUMERICS_VERSION: &str = "candor-cuda-3";

/// The numerics version this process computes (see [`GPU_NUMERICS_VERSION`]).
pub fn numerics_version() -> &'static str {
    match matmul_path() {
        MatmulPath::Integer => GPU_NUMERICS_VERSION,
        MatmulPath::Legacy => "candor-cuda-3-legacy-matmul",
    }
}

/// What a reply computed on CUDA device `ordinal` depends on besides the model and request:
/// the card (name and compute capability), the driver's and NVRTC's CUDA versions and
/// [`GPU_NUMERICS_VERSION`]; for the generation cache's key (`gpu=...;cc=...;driver=...`).
pub fn cache_identity(ordinal: usize) -> std::result::Result<String, String> {
    let driver = versions::driver_version()?;
    let nvrtc = nvrtc::version()?;
    let dev = list_devices()?
        .into_iter()
        .find(|d| d.ordinal == ordinal)
        .ok_or_else(|| format!("no CUDA device cuda:{ordinal}"))?;
    Ok(format!(
        "gpu={};cc={}.{};driver=cuda-{driver};nvrtc={nvrtc};gpu_numerics={}",
        dev.name,
        dev.cc.0,
        dev.cc.1,
        numerics_version()
    ))
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
pub(super) fn guarded<T>(
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

/// Opens CUDA device `ordinal`: one context, one stream, the kernels compiled for its compute
/// capability by an NVRTC no newer than the driver, and loaded.
pub(super) fn open_gpu(ordinal: usize) -> Result<Arc<Gpu>> {
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
    let nvrtc = nvrtc::version().map_err(fail)?;
    versions::check_pair(driver, nvrtc).map_err(ModelError::Device)?;
    let opened = guarded(&format!("opening cuda:{ordinal}"), || {
        let ctx = CudaContext::new(ordinal).map_err(|e| format!("opening cuda:{ordinal}: {e}"))?;
        let cc = ctx
            .compute_capability()
            .map_err(|e| format!("cuda:{ordinal}: compute capability: {e}"))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| format!("cuda:{ordinal}: multiprocessor count: {e}"))?;
        Ok((ctx, cc, sms.max(1) as usize))
    });
    let (ctx, cc, sms) = opened.map_err(fail)?;
    // One stream, raw pointers: ordering comes from the stream alone.
    // SAFETY: every kernel and copy of this model is issued on the one stream below.
    unsafe { ctx.disable_event_tracking() };
    // A stream of its own, not the legacy default one: CUDA graphs cannot be captured on that
    // (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, seen on the H200 on 2026-11-27).
    let stream = ctx
        .new_stream()
        .map_err(|e| fail(format!("a stream: {e}")))?;
    Ok(Arc::new(Gpu {
        k: Kernels::load(&ctx, cc)?,
        ctx,
        stream,
        sms,
    }))
}

/// `candor devices --check-kernels` on a GPU: opens CUDA device `ordinal` as a model load does
/// (the kernels compiled for its compute capability and loaded by the driver, every kernel
/// looked up by name); what was loaded, or the one-line error.
pub fn check_kernels(ordinal: usize) -> std::result::Result<String, String> {
    let gpu = open_gpu(ordinal).map_err(|e| e.to_string())?;
    Ok(format!("{} loaded on cuda:{ordinal}", gpu.k.loaded))
}
