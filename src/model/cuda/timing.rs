//! Kernel timings for the GPU check (`benches/kernels.rs` with `KERNELS_GPU=1`, run by
//! `benches/gpu/run.sh`): the device-to-device copy rate, then every matmul of the Llama-3-8B
//! shape in Q4_K, Q6_K and Q8_0 at several batch sizes, on the legacy f32 kernels and on the
//! integer kernels (activation quantization included), each against its two numbers: the bytes
//! it must move (weights, activations and outputs once) and its multiply-adds. On the integer
//! path the line `"path":"integer"` is the kernel `matmul_into` dispatches (`"kernel"`: `dp4a`
//! or `mma`); from 16 rows the other kernel is timed on the same shape too (`"path":
//! "integer-dp4a"` or `"integer-mma"`), so one call compares `dp4a` and the tensor cores.
//! Each timing cycles through copies of the weight totalling at least [`L2_CYCLE_BYTES`], so
//! that the weights are read from DRAM as in a forward pass, not from the ~50 MB L2.
//!
//! Then attention at the same shape (`"attention"` lines): one layer's two launches
//! (`attn_partial`, `attn_combine`) for 1 and 16 decode rows at 512 positions and 1 row at
//! 4,096, each row its own sequence; the calls walk the 32 layers of the KV pool in turn, as
//! a decode step does, against the bytes of keys and values they must read.

use std::time::Instant;

use cudarc::driver::CudaSlice;

use crate::model::quant::{QWeight, WeightFormat};

use super::devices::open_gpu;
use super::kernels::{
    attn_chunks, dev_err, ptr, AttnArgs, DevWeight, Gpu, IntKernel, MatmulPath, Result,
};
use super::weights::{device_bytes, upload_weight};

/// Llama-3-8B's matrices: (name, n, k).
const SHAPES: [(&str, usize, usize); 5] = [
    ("attn_q/o", 4096, 4096),
    ("attn_k/v", 1024, 4096),
    ("ffn_gate/up", 14336, 4096),
    ("ffn_down", 4096, 14336),
    ("output", 128256, 4096),
];

/// The weight copies one timing cycles through total at least this many bytes: four times an
/// H100/H200's 50 MB L2, so that no copy is still in L2 when its turn comes again.
pub(super) const L2_CYCLE_BYTES: usize = 256 << 20;

/// How many copies of a weight of `bytes` the timing cycles through.
pub(super) fn l2_copies(bytes: usize) -> usize {
    L2_CYCLE_BYTES.div_ceil(bytes.max(1)).max(1)
}

/// `count` device copies of `w` (the first is `w`'s own buffer copied too): same layout.
fn weight_copies(g: &Gpu, w: &DevWeight, count: usize) -> Result<Vec<DevWeight>> {
    (0..count)
        .map(|_| {
            Ok(DevWeight {
                kind: w.kind,
                n: w.n,
                k: w.k,
                buf: g
                    .stream
                    .clone_dtod(&w.buf)
                    .map_err(|e| dev_err("copying a weight", e))?,
                b_off: w.b_off,
                c_off: w.c_off,
            })
        })
        .collect()
}

/// Deterministic bytes (xorshift64*).
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A random `n × k` weight of `dtype` whose f16 scales are finite (exponent bits cleared of
/// the all-ones pattern), so that no NaN runs through the timed arithmetic.
fn random_weight(dtype: candle_core::quantized::GgmlDType, n: usize, k: usize) -> QWeight {
    let block = dtype.block_size();
    let bytes = n * k / block * dtype.type_size();
    let mut raw = random_bytes((n * 31 + k) as u64, bytes);
    // Every second byte's top bits cleared: any f16 read from the block is finite and small.
    for b in raw.iter_mut().skip(1).step_by(2) {
        *b &= 0x3B;
    }
    QWeight::from_bytes(dtype, n, k, &raw).expect("random weight")
}

/// Seconds per call of `f`: a warm-up, then as many calls as fit in about 30 ms (2 to 50),
/// between two events on the stream.
fn time(g: &Gpu, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let s = &g.stream;
    let ev = |what| {
        g.ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| dev_err(what, e))
    };
    let (a, b) = (ev("event")?, ev("event")?);
    f()?;
    s.synchronize().map_err(|e| dev_err("warm-up", e))?;
    let t0 = Instant::now();
    f()?;
    s.synchronize().map_err(|e| dev_err("probe", e))?;
    let once = t0.elapsed().as_secs_f64();
    let reps = ((0.03 / once.max(1e-6)) as usize).clamp(2, 50);
    a.record(s).map_err(|e| dev_err("event", e))?;
    for _ in 0..reps {
        f()?;
    }
    b.record(s).map_err(|e| dev_err("event", e))?;
    let ms = a.elapsed_ms(&b).map_err(|e| dev_err("event", e))?;
    Ok(ms as f64 / 1e3 / reps as f64)
}

/// Llama-3-8B's attention: layers, query heads, KV heads, head size.
const ATTN_SHAPE: (usize, usize, usize, usize) = (32, 32, 8, 128);

/// The attention timings: (decode rows, positions each row attends).
const ATTN_CASES: [(usize, usize); 3] = [(1, 512), (16, 512), (1, 4096)];

/// Runs the timings on CUDA device `ordinal` and gives `emit` one JSON line per measurement as
/// it is made (a run stopped by a time limit keeps what it measured): first the copy rate
/// (`{"copy_gbps": ...}`), then per matmul `{"path", "kernel", "type", "shape", "n", "k",
/// "m", "us", "gbps", "bw_frac", "tops"}` (`batches` are the row counts timed), then per
/// attention case `{"attention", "rows", "positions", "chunks", "us", "per_token_ms", "gbps",
/// "bw_frac"}`.
pub fn time_kernels(ordinal: usize, batches: &[usize], emit: &mut dyn FnMut(&str)) -> Result<()> {
    let g = open_gpu(ordinal)?;
    let s = &g.stream;
    // The copy ceiling: 1 GiB device to device, bytes read plus written.
    let len = 1usize << 28;
    let src: CudaSlice<f32> = g.upload("copy source", &vec![1.5f32; len])?;
    let mut dst: CudaSlice<f32> = g.zeros("copy destination", len)?;
    let secs = time(&g, || {
        s.memcpy_dtod(&src, &mut dst)
            .map_err(|e| dev_err("copy", e))
    })?;
    let copy = 2.0 * (len * 4) as f64 / secs / 1e9;
    emit(&format!("{{\"copy_gbps\":{copy:.1}}}"));
    drop((src, dst));
    time_matmuls(&g, copy, batches, emit)?;
    for (rows, positions) in ATTN_CASES {
        emit(&time_attention(&g, copy, rows, positions)?);
    }
    Ok(())
}

/// The matmul lines of [`time_kernels`].
fn time_matmuls(g: &Gpu, copy: f64, batches: &[usize], emit: &mut dyn FnMut(&str)) -> Result<()> {
    use candle_core::quantized::GgmlDType;
    let s = &g.stream;
    let max_m = batches.iter().copied().max().unwrap_or(1);
    let act = g.act_bufs(max_m * 14336)?;
    for (dtype, name) in [
        (GgmlDType::Q4K, "Q4_K"),
        (GgmlDType::Q6K, "Q6_K"),
        (GgmlDType::Q8_0, "Q8_0"),
    ] {
        for (shape, n, k) in SHAPES {
            let w = random_weight(dtype, n, k);
            debug_assert!(matches!(
                w.format(),
                WeightFormat::Q4K | WeightFormat::Q6K | WeightFormat::Q8_0
            ));
            let x: Vec<f32> = random_bytes(7, max_m * k * 4)
                .chunks_exact(4)
                .map(|b| (b[0] as f32 - 127.5) / 64.0)
                .collect();
            let dx = g.upload("x", &x)?;
            let y: CudaSlice<f32> = g.zeros("y", max_m * n)?;
            for path in [MatmulPath::Legacy, MatmulPath::Integer] {
                let dw = upload_weight(g, shape, &w, path)?;
                let wbytes = device_bytes(&w, path);
                // Weights read from DRAM: each call takes the next of copies totalling at
                // least L2_CYCLE_BYTES (the output matrix, ~300 MB, is its own cycle).
                let ws = weight_copies(g, &dw, l2_copies(dw.buf.len()))?;
                drop(dw);
                for &m in batches {
                    let (px, py) = (ptr(&dx, s), ptr(&y, s));
                    let chosen = g.int_kernel(&ws[0], m);
                    // (path name, kernel): the dispatched one, and from 16 rows the other.
                    let mut runs = vec![(
                        match path {
                            MatmulPath::Legacy => "legacy",
                            MatmulPath::Integer => "integer",
                        },
                        chosen,
                    )];
                    if path == MatmulPath::Integer && m >= 16 && g.k.mma {
                        runs.push(match chosen {
                            IntKernel::Mma => ("integer-dp4a", IntKernel::Dp4a),
                            IntKernel::Dp4a => ("integer-mma", IntKernel::Mma),
                        });
                    }
                    for (p, kernel) in runs {
                        let mut next = 0;
                        let secs = time(g, || {
                            let dw = &ws[next % ws.len()];
                            next += 1;
                            match path {
                                MatmulPath::Legacy => g.matmul(dw, px, m, py),
                                MatmulPath::Integer => g
                                    .matmul_with(dw, px, m, py, &act, None, false, kernel)
                                    .map(|_| ()),
                            }
                        })?;
                        let bytes = (wbytes + m * k * 4 + m * n * 4) as f64;
                        let gbps = bytes / secs / 1e9;
                        let tops = 2.0 * (m * n * k) as f64 / secs / 1e12;
                        let kn = match (path, kernel) {
                            (MatmulPath::Legacy, _) => "f32",
                            (_, IntKernel::Dp4a) => "dp4a",
                            (_, IntKernel::Mma) => "mma",
                        };
                        emit(&format!(
                            "{{\"path\":\"{p}\",\"kernel\":\"{kn}\",\"type\":\"{name}\",\
                             \"shape\":\"{shape}\",\"n\":{n},\"k\":{k},\"m\":{m},\"us\":{:.1},\
                             \"gbps\":{gbps:.1},\"bw_frac\":{:.3},\"tops\":{tops:.2}}}",
                            secs * 1e6,
                            gbps / copy
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// One attention line of [`time_kernels`]: `rows` decode rows, each its own sequence at
/// position `positions - 1`, over a KV pool of the 8B shape's 32 layers (random finite
/// halves); each call times one layer's `attn_partial` and `attn_combine`, the next call the
/// next layer, as a decode step walks them.
fn time_attention(g: &Gpu, copy: f64, rows: usize, positions: usize) -> Result<String> {
    let (layers, heads, kv_heads, hd) = ATTN_SHAPE;
    let s = &g.stream;
    let kv_dim = kv_heads * hd;
    let bt = crate::model::runner::KV_BLOCK_TOKENS;
    let block_len = layers * 2 * bt * kv_dim;
    let per_row = positions.div_ceil(bt);
    // Halves whose exponent is below the all-ones pattern: finite, at most ~2 in size.
    let halves: Vec<u16> = random_bytes(11, rows * per_row * block_len * 2)
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1] & 0x3B]))
        .collect();
    let pool: CudaSlice<u16> = g.upload("KV pool", &halves)?;
    drop(halves);
    let tables: Vec<i32> = (0..(rows * per_row) as i32).collect();
    let offsets: Vec<i32> = (0..rows).map(|r| (r * per_row) as i32).collect();
    let pos = vec![(positions - 1) as i32; rows];
    let chunks = attn_chunks(positions - 1);
    let q: Vec<f32> = random_bytes(13, rows * heads * hd * 4)
        .chunks_exact(4)
        .map(|b| (b[0] as f32 - 127.5) / 128.0)
        .collect();
    let dq = g.upload("queries", &q)?;
    let (dt, doff, dpos) = (
        g.upload("block tables", &tables)?,
        g.upload("table offsets", &offsets)?,
        g.upload("positions", &pos)?,
    );
    let part: CudaSlice<f32> = g.zeros("partials", rows * heads * chunks * (hd + 2))?;
    let out: CudaSlice<f32> = g.zeros("attention output", rows * heads * hd)?;
    let mut args = AttnArgs {
        q: ptr(&dq, s),
        pool: ptr(&pool, s),
        tables: ptr(&dt, s),
        table_offsets: ptr(&doff, s),
        positions: ptr(&dpos, s),
        part: ptr(&part, s),
        out: ptr(&out, s),
        sinks: 0,
        rows,
        heads,
        kv_heads,
        head_dim: hd,
        kv_stride: kv_dim,
        layer: 0,
        bt,
        block_len: block_len as i64,
        scale: 1.0 / (hd as f32).sqrt(),
        cap: 0.0,
        window: 0,
        chunks,
        gqa: true,
        wide: false,
    };
    let secs = time(g, || {
        args.layer = (args.layer + 1) % layers;
        g.attn_partial(&args)?;
        g.attn_combine(&args)
    })?;
    // Keys and values of every position, once per call.
    let bytes = (rows * positions * 2 * kv_dim * 2) as f64;
    let gbps = bytes / secs / 1e9;
    Ok(format!(
        "{{\"attention\":\"gqa\",\"rows\":{rows},\"positions\":{positions},\"chunks\":{chunks},\
         \"us\":{:.1},\"per_token_ms\":{:.3},\"gbps\":{gbps:.1},\"bw_frac\":{:.3}}}",
        secs * 1e6,
        secs * 1e3 * layers as f64,
        gbps / copy
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every timed shape cycles through more than 200 MB of weights (4× the L2), and the
    /// largest matrix is timed without copies.
    #[test]
    fn timed_weights_cycle_past_the_l2() {
        use candle_core::quantized::GgmlDType;
        for dtype in [GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::Q8_0] {
            for (shape, n, k) in SHAPES {
                let bytes = n * k / dtype.block_size() * dtype.type_size();
                let copies = l2_copies(bytes);
                assert!(
                    copies * bytes > 200 << 20,
                    "{shape} {dtype:?}: {copies} copies"
                );
                assert!(
                    (copies - 1) * bytes < L2_CYCLE_BYTES,
                    "{shape}: one copy too many"
                );
            }
        }
        assert_eq!(l2_copies(128256 * 4096 / 256 * 144), 1);
        assert_eq!(l2_copies(1024 * 4096 / 256 * 144), 114);
    }
}
