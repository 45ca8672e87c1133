//! The packed forward pass on a CUDA device (`--device cuda[:N]`, `cuda` feature).
//!
//! Same contract as the CPU pass ([`super::transformer`]): rows packed back to back, each computed by
//! operations that do not depend on the batch (see `kernels.cu` for how each kernel keeps it).
//! The host model stays loaded for the configuration, the embedding lookup (rows are
//! dequantized on the host and uploaded) and the RoPE tables; every matrix is uploaded once,
//! in its stored type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4: a
//! kernel reads each; quantized blocks repacked, byte for byte, into 16-byte aligned quants with the
//! scales apart, `repack.rs`), and its host copy is then released ([`release_host_matrices`]).
//! A model whose weights do not fit the card is refused in one line with the sizes. The KV
//! cache lives in one pool of
//! device blocks in half precision; the engine's bookkeeping owns them through
//! [`DeviceBlock`] handles (a clone copies the block on the device: copy-on-write).
//!
//! CUDA is reached through cudarc with dynamic loading: nothing is linked at build time, so
//! `--features cuda` builds on any machine; the kernels are compiled at run time by NVRTC.
//! Every matmul gives the CPU's `QWeight::matmul` bits (`mmq.cu`: the activations quantized
//! to the CPU's 8-bit blocks on the device, exact integer block products, the CPU's per-block
//! float expression, blocks added in order; `emulate.rs` checks the kernels' structure on the
//! host); the rest of a step (norms, RoPE, the attention's order, the f16 KV cache) does not,
//! so GPU tokens are not expected to equal CPU tokens. `CANDOR_CUDA_MATMUL=legacy` runs the
//! f32 matmuls and per-query-head attention of numerics version `candor-cuda-1` instead (for
//! timing both in one call).

mod devices;
#[cfg(test)]
mod emulate;
#[cfg(test)]
mod emulate_deltanet;
#[cfg(test)]
mod emulate_mmt;
#[cfg(test)]
mod emulate_moe;
mod forward;
mod gemma4;
mod hybrid;
mod inputs;
mod kernels;
mod mla;
pub mod nvrtc;
mod pool;
mod repack;
mod timing;
pub mod versions;
mod weights;

pub use devices::{cache_identity, numerics_version, GPU_NUMERICS_VERSION};
pub use devices::{check_kernels, list_devices, DeviceInfo};
pub use forward::CudaModel;
pub use hybrid::DeviceState;
pub use kernels::{compile_kernels, kernels_for, CompiledKernels, KERNELS};
pub use pool::{DeviceBlock, KvPool};
pub use timing::time_kernels;
pub(crate) use weights::release_host_matrices;

#[cfg(test)]
mod tests {
    use cudarc::driver::CudaSlice;

    use super::devices::open_gpu;
    use super::emulate::tests::{quantized, QUANTIZED};
    use super::kernels::{mma_pays, ptr, Gpu, IntKernel, MatmulPath, MM_OUTS, MM_WIDE_ROWS};
    use super::weights::{device_bytes, upload_weight};
    use super::*;
    use crate::model::quant::tests::noise;
    use candle_core::quantized::GgmlDType;

    /// Every weight type: the float ones, then the quantized ones (`None`: MXFP4).
    fn types() -> impl Iterator<Item = Option<GgmlDType>> {
        [GgmlDType::F32, GgmlDType::F16, GgmlDType::BF16]
            .map(Some)
            .into_iter()
            .chain(QUANTIZED)
    }

    /// The GPU, or `None` after recording the skip (the one rule, `crate::skip`: a failure
    /// under `CANDOR_REQUIRE_GPU=1`).
    #[track_caller]
    pub(super) fn gpu_or_skip(test: &str) -> Option<std::sync::Arc<Gpu>> {
        match open_gpu(0) {
            Ok(g) => Some(g),
            Err(e) => {
                crate::skip::absent(crate::skip::Need::Gpu, format!("{test}: no GPU: {e}"));
                None
            }
        }
    }

    /// The kernels compile wherever NVRTC can be loaded (no GPU needed). Without libnvrtc the
    /// skip is recorded; under CI it must run.
    #[test]
    fn kernels_compile_with_nvrtc() {
        if let Err(e) = nvrtc::library() {
            crate::skip::absent(
                crate::skip::Need::Nvrtc,
                format!("libnvrtc is not loadable (see .ci/run): {e}"),
            );
            return;
        }
        let ptx = compile_kernels(None).expect("kernels compile");
        for cc in [(8, 0), (9, 0)] {
            let ptx = compile_kernels(Some(cc)).unwrap_or_else(|e| panic!("compute {cc:?}: {e}"));
            // For `ptxas -arch=sm_80 -v` / `sm_90` (registers, spills, shared memory) by hand.
            if let Some(dir) = std::env::var_os("CANDOR_PTX_OUT") {
                let file = format!("kernels_sm{}{}.ptx", cc.0, cc.1);
                std::fs::write(std::path::Path::new(&dir).join(file), ptx.to_src())
                    .expect("writing the PTX");
            }
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
            "attn_partial_gqa",
            "attn_combine",
            "kv_write",
            "mmq1_q4_k",
            "mmq8_q6_k",
            "mmq8_q5_0",
            "mmq1_bf16",
            "mmt_q8_0",
            "mmt_q4_0",
            "mmt_q4_1",
            "mmt_q5_0",
            "mmt_q5_1",
            "mmt_q4_k",
            "mmt_q5_k",
            "mmt_q6_k",
            "matmul_mxfp4",
            "mmq1_mxfp4",
            "mmq8_mxfp4",
            "mmt_mxfp4",
            "mmqe_q4_k",
            "mmqe_q6_k",
            "mmqe_q4_1",
            "mmqe_mxfp4",
            "mmte_q4_k",
            "mmte_q6_k",
            "mmte_q8_0",
            "mmte_mxfp4",
            "moe_tiles",
            "quantize_q8",
            "quantize_q8k",
            "moe_route",
            "moe_group",
            "moe_combine",
            "add_bias_experts",
            "scale_experts",
            "gated_act_cpu",
            "delta_conv",
            "delta_prep",
            "delta_rule",
            "gated_norm",
            "out_gate",
            "shared_gate",
            "scale_rows",
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
        for dtype in types() {
            let w = quantized(dtype, n, k, 2);
            let f = w.format();
            let dw = upload_weight(&gpu, "w", &w, MatmulPath::Legacy).expect("upload");
            // Every type is held as stored (none is widened).
            assert_eq!(dw.buf.len(), device_bytes(&w, MatmulPath::Legacy), "{f:?}");
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
                    assert_eq!(a.to_bits(), b.to_bits(), "{f:?} row {r} output {o}");
                    w.row_f32(o, &mut row);
                    let want: f64 = row
                        .iter()
                        .zip(&x[r * k..(r + 1) * k])
                        .map(|(&w, &x)| w as f64 * x as f64)
                        .sum();
                    let tol = 1e-3;
                    assert!(
                        (a as f64 - want).abs() < tol,
                        "{f:?} [{r}][{o}]: {a} vs {want}"
                    );
                }
            }
        }
    }

    /// The integer and float kernels of `mmq.cu` and `mmt.cu` on the GPU give the CPU's
    /// `QWeight::matmul` bits for every weight type and batch size (1 row: the 1-row tile; 5
    /// and 17: tiles of 8; 64 and 130: the tensor-core kernel on a device that has it), with a
    /// partial output tile, k past one chunk, and the residual epilogue (`y + x · Wᵀ`, the
    /// CPU's `x += out`).
    #[test]
    fn mmq_equals_the_cpu_matmul() {
        let Some(gpu) = gpu_or_skip("mmq_equals_the_cpu_matmul") else {
            return;
        };
        let s = &gpu.stream;
        let n = 37;
        let act = gpu.act_bufs(130 * 4608).expect("scratch");
        for dtype in types() {
            // Float types with a k % 32 tail.
            let k = if dtype.is_some_and(|d| d.block_size() == 1) {
                4608 - 19
            } else {
                4608
            };
            let w = quantized(dtype, n, k, 31);
            let f = w.format();
            let dw = upload_weight(&gpu, "w", &w, MatmulPath::Integer).expect("upload");
            assert_eq!(dw.buf.len(), device_bytes(&w, MatmulPath::Integer), "{f:?}");
            for m in [1usize, 5, 17, 64, 130] {
                let mut x: Vec<f32> = noise(40 + m as u64, m * k)
                    .iter()
                    .map(|v| v * 3.0)
                    .collect();
                if m > 2 {
                    x[2 * k..3 * k].fill(0.0);
                    x[k + 3] = -9.0;
                    x[k + 100] = 9.0;
                }
                let mut want = vec![0f32; m * n];
                w.matmul(&x, m, &mut want);
                let dx = gpu.upload("x", &x).expect("x");
                let resid = noise(50 + m as u64, m * n);
                for add in [false, true] {
                    let y: CudaSlice<f32> = if add {
                        gpu.upload("y", &resid).expect("y")
                    } else {
                        gpu.upload("y", &vec![f32::NAN; m * n]).expect("y")
                    };
                    gpu.matmul_into(&dw, ptr(&dx, s), m, ptr(&y, s), &act, None, add)
                        .expect("matmul");
                    let got = s.clone_dtoh(&y).expect("download");
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        let w = if add { resid[i] + w } else { *w };
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "{f:?} m={m} add={add} row {} output {}: {g} vs {w}",
                            i / n,
                            i % n
                        );
                    }
                }
            }
        }
    }

    /// The tensor-core kernels (`mmt.cu`) and the `dp4a` kernels (`mmq.cu`) on the same
    /// shapes, each against the CPU's bits: every quantized type, rows that fill a tile, leave
    /// a partial one (70, 130) or fall below the dispatch threshold (17: the tensor-core
    /// kernel called directly), 67 outputs (a partial output tile), k with a partial last stage
    /// for the blocks of 32, with and without the residual. Checks that `matmul_into`
    /// dispatches the tensor cores where `mma_pays` on a device that has them.
    #[test]
    fn mmt_equals_the_cpu_matmul() {
        let Some(gpu) = gpu_or_skip("mmt_equals_the_cpu_matmul") else {
            return;
        };
        if !gpu.k.mma {
            crate::skip::absent(
                crate::skip::Need::Gpu,
                "mmt_equals_the_cpu_matmul: the device has no int8 MMA (compute < 8.0)",
            );
            return;
        }
        let s = &gpu.stream;
        let n = 67;
        let act = gpu.act_bufs(130 * 4704).expect("scratch");
        for dtype in QUANTIZED {
            let k = if dtype.is_some_and(|d| d.block_size() == 256) {
                4608
            } else {
                4704
            };
            let w = quantized(dtype, n, k, 33);
            let f = w.format();
            let dw = upload_weight(&gpu, "w", &w, MatmulPath::Integer).expect("upload");
            for m in [17usize, 64, 70, 130] {
                if std::env::var("CANDOR_CUDA_MATMUL").is_err() {
                    let want = if mma_pays(m, n, gpu.sms) {
                        IntKernel::Mma
                    } else {
                        IntKernel::Dp4a
                    };
                    assert_eq!(gpu.int_kernel(&dw, m), want, "{f:?} m={m}");
                }
                let mut x: Vec<f32> = noise(60 + m as u64, m * k)
                    .iter()
                    .map(|v| v * 3.0)
                    .collect();
                x[2 * k..3 * k].fill(0.0);
                x[k + 3] = -9.0;
                x[k + 100] = 9.0;
                let mut want = vec![0f32; m * n];
                w.matmul(&x, m, &mut want);
                let dx = gpu.upload("x", &x).expect("x");
                let resid = noise(70 + m as u64, m * n);
                for kernel in [IntKernel::Mma, IntKernel::Dp4a] {
                    for add in [false, true] {
                        let y: CudaSlice<f32> = if add {
                            gpu.upload("y", &resid).expect("y")
                        } else {
                            gpu.upload("y", &vec![f32::NAN; m * n]).expect("y")
                        };
                        gpu.matmul_with(&dw, ptr(&dx, s), m, ptr(&y, s), &act, None, add, kernel)
                            .expect("matmul");
                        let got = s.clone_dtoh(&y).expect("download");
                        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                            let w = if add { resid[i] + w } else { *w };
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "{f:?} {kernel:?} m={m} add={add} row {} output {}: {g} vs {w}",
                                i / n,
                                i % n
                            );
                        }
                    }
                }
            }
        }
    }
}
