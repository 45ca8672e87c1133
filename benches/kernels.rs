//! Throughput of the deterministic matmul kernels (`candor::model::quant`) on SmolLM2-135M's
//! shapes, on a 2-thread rayon pool: per shape (GFLOP/s, counting a multiply-add as 2 flops)
//! and for one whole decode step's matmuls (30 layers × 7 projections + the tied output head),
//! at m = 1, 4 and 16 rows. Uses the real weights from
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf` when present, else random weights of the same
//! types. Candle's own `QMatMul` is timed on the same tensors for comparison.
//!
//! Run with `cargo bench --bench kernels` (env `KERNELS_THREADS` overrides the pool size;
//! `KERNELS_NO_CANDLE=1` skips the candle timings).
//!
//! With the `cuda` feature and `KERNELS_GPU=1` it times the GPU's kernels instead
//! (`candor::model::cuda::time_kernels`: the copy rate, then the Llama-3-8B shapes in Q4_K,
//! Q6_K and Q8_0 on the legacy and the integer kernels, then its attention at 1 and 16 decode
//! rows, one JSON line each; `KERNELS_BATCHES` lists the matmuls' row counts, default
//! `1,16,64,512`); `benches/gpu/run.sh` runs it.

/// Chat templates run under a memory budget, which counts through this allocator.
#[global_allocator]
static ALLOCATOR: candor::budget::alloc_budget::BudgetAllocator =
    candor::budget::alloc_budget::BudgetAllocator;

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use candor::model::quant::QWeight;

const LAYERS: usize = 30;
const PROJ: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// Shapes (n, k) and types of SmolLM2-135M when the model file is absent.
fn random_shape(name: &str) -> ((usize, usize), GgmlDType) {
    match name {
        "attn_q" | "attn_output" => ((576, 576), GgmlDType::Q4_1),
        "attn_k" | "attn_v" => ((192, 576), GgmlDType::Q4_1),
        "ffn_gate" | "ffn_up" => ((1536, 576), GgmlDType::Q4_1),
        "ffn_down" => ((576, 1536), GgmlDType::Q4_1),
        _ => ((49152, 576), GgmlDType::Q8_0),
    }
}

fn noise(seed: u64, len: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Loads the named tensors: from the GGUF file when present, else random.
fn load(names: &[String]) -> (Vec<QTensor>, &'static str) {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if let Ok(mut f) = std::fs::File::open(&path) {
        let content = gguf_file::Content::read(&mut f).expect("gguf header");
        let ts = names
            .iter()
            .map(|n| content.tensor(&mut f, n, &Device::Cpu).expect("tensor"))
            .collect();
        return (ts, "real SmolLM2-135M-Instruct Q4_1 weights");
    }
    let ts = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let kind = n.split('.').nth(2).unwrap_or("head");
            let ((rows, cols), dtype) = random_shape(kind);
            let w = Tensor::from_vec(noise(i as u64, rows * cols), (rows, cols), &Device::Cpu)
                .expect("tensor");
            QTensor::quantize(&w, dtype).expect("quantize")
        })
        .collect();
    (ts, "random weights (model file absent)")
}

/// Median time of `f` over enough repetitions to fill about `budget`.
fn time(budget: Duration, mut f: impl FnMut()) -> Duration {
    f();
    let t0 = Instant::now();
    f();
    let once = t0.elapsed().max(Duration::from_micros(1));
    let reps = (budget.as_secs_f64() / once.as_secs_f64()).clamp(5.0, 2000.0) as usize;
    let mut samples: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort();
    samples[reps / 2]
}

/// [`time`], or a NaN-producing zero when `KERNELS_NO_CANDLE` is set.
fn time_candle(budget: Duration, f: impl FnMut()) -> Duration {
    if std::env::var_os("KERNELS_NO_CANDLE").is_some() {
        Duration::ZERO
    } else {
        time(budget, f)
    }
}

fn main() {
    #[cfg(feature = "cuda")]
    if std::env::var("KERNELS_GPU").is_ok() {
        let batches: Vec<usize> = std::env::var("KERNELS_BATCHES")
            .unwrap_or_else(|_| "1,16,64,512".into())
            .split(',')
            .map(|b| b.trim().parse().expect("KERNELS_BATCHES: row counts"))
            .collect();
        // Each line as it is measured: a stage's time limit keeps what was printed.
        if let Err(e) = candor::model::cuda::time_kernels(0, &batches, &mut |l| println!("{l}")) {
            eprintln!("GPU kernel timings: {e}");
            std::process::exit(1);
        }
        return;
    }
    let threads: usize = std::env::var("KERNELS_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let mut names: Vec<String> = (0..LAYERS)
        .flat_map(|l| PROJ.iter().map(move |p| format!("blk.{l}.{p}.weight")))
        .collect();
    names.push("token_embd.weight".to_string());
    let (tensors, source) = load(&names);
    let ours: Vec<QWeight> = tensors
        .iter()
        .map(|t| QWeight::from_qtensor(t).expect("QWeight"))
        .collect();
    let theirs: Vec<QMatMul> = load(&names)
        .0
        .into_iter()
        .map(|t| QMatMul::from_qtensor(t).expect("QMatMul"))
        .collect();
    println!("kernels bench: {source}, {threads} threads");
    let macs_per_row: usize = ours.iter().map(|w| w.rows() * w.cols()).sum();
    println!(
        "one token = {:.1} M multiply-adds",
        macs_per_row as f64 / 1e6
    );

    pool.install(|| {
        println!("\nper shape (layer 0 and the head):");
        println!(
            "{:<12} {:>6} {:>6} {:>3} {:>10} {:>8} {:>10} {:>8}",
            "tensor", "n", "k", "m", "ours", "GFLOP/s", "candle", "GFLOP/s"
        );
        let picks = (0..PROJ.len()).chain([ours.len() - 1]);
        for idx in picks {
            let w = &ours[idx];
            let (n, k) = (w.rows(), w.cols());
            let label = names[idx].split('.').nth(2).unwrap_or("head");
            for m in [1usize, 4, 16] {
                let x = noise(99, m * k);
                let mut out = vec![0f32; m * n];
                let t = time(Duration::from_millis(150), || {
                    w.matmul(black_box(&x), m, &mut out);
                    black_box(&out);
                });
                let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).expect("x");
                let tc = time_candle(Duration::from_millis(150), || {
                    black_box(theirs[idx].forward(&xt).expect("candle"));
                });
                let flops = 2.0 * (m * n * k) as f64;
                println!(
                    "{:<12} {:>6} {:>6} {:>3} {:>8.1}µs {:>8.1} {:>8.1}µs {:>8.1}",
                    label,
                    n,
                    k,
                    m,
                    t.as_secs_f64() * 1e6,
                    flops / t.as_secs_f64() / 1e9,
                    tc.as_secs_f64() * 1e6,
                    flops / tc.as_secs_f64() / 1e9,
                );
            }
        }

        println!("\nwhole decode step (all {} matmuls in model order):", ours.len());
        for m in [1usize, 4, 16] {
            let xs: Vec<Vec<f32>> = [576usize, 1536].iter().map(|&k| noise(7, m * k)).collect();
            let mut out = vec![0f32; m * 49152];
            let t = time(Duration::from_millis(1500), || {
                for w in &ours {
                    let x = if w.cols() == 576 { &xs[0] } else { &xs[1] };
                    w.matmul(black_box(x), m, &mut out[..m * w.rows()]);
                }
                black_box(&out);
            });
            let xts: Vec<Tensor> = [576usize, 1536]
                .iter()
                .zip(&xs)
                .map(|(&k, x)| Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).expect("x"))
                .collect();
            let tc = time_candle(Duration::from_millis(1500), || {
                for (w, q) in ours.iter().zip(&theirs) {
                    let x = if w.cols() == 576 { &xts[0] } else { &xts[1] };
                    black_box(q.forward(x).expect("candle"));
                }
            });
            let flops = 2.0 * (m * macs_per_row) as f64;
            println!(
                "m={:<2}  ours {:>7.2} ms ({:>6.1} GFLOP/s, {:>7.1} rows/s)   candle {:>7.2} ms ({:>6.1} GFLOP/s)",
                m,
                t.as_secs_f64() * 1e3,
                flops / t.as_secs_f64() / 1e9,
                m as f64 / t.as_secs_f64(),
                tc.as_secs_f64() * 1e3,
                flops / tc.as_secs_f64() / 1e9,
            );
        }
    });
}
