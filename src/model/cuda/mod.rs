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

mod devices;
mod forward;
mod kernels;
pub mod nvrtc;
mod pool;
pub mod versions;
mod weights;

pub use devices::{cache_identity, GPU_NUMERICS_VERSION};
pub use devices::{list_devices, DeviceInfo};
pub use forward::CudaModel;
pub use kernels::{compile_kernels, KERNELS};
pub use pool::{DeviceBlock, KvPool};
pub(crate) use weights::release_host_matrices;

#[cfg(test)]
mod tests {
    use cudarc::driver::CudaSlice;

    use super::devices::open_gpu;
    use super::kernels::{ptr, Gpu, MM_OUTS, MM_WIDE_ROWS};
    use super::weights::{device_bytes, upload_weight};
    use super::*;
    use crate::model::quant::tests::noise;
    use crate::model::quant::QWeight;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// The GPU, or `None` after saying loudly why not (a failure under `CANDOR_REQUIRE_GPU=1`).
    fn gpu_or_skip(test: &str) -> Option<std::sync::Arc<Gpu>> {
        match open_gpu(0) {
            Ok(g) => Some(g),
            Err(e) => {
                assert!(
                    std::env::var("CANDOR_REQUIRE_GPU").as_deref() != Ok("1"),
                    "CANDOR_REQUIRE_GPU=1 but the GPU cannot be used: {e}"
                );
                eprintln!("\n*** SKIPPED {test} (no GPU): {e} ***\n");
                None
            }
        }
    }

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
        let Some(gpu) = gpu_or_skip("matmul_of_every_type_is_row_invariant") else {
            return;
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
