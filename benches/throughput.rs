//! Throughput of the decode loop on the default model: prefill and decode tokens per second at
//! batch sizes 1, 4 and 16 on a two-thread pool (`cargo bench --bench throughput`; another
//! GGUF file with `cargo bench --bench throughput -- --model PATH` or `CANDOR_MODEL=PATH`).
//!
//! Prompts are fixed pseudo-random token ids, and no token stops generation, so every request
//! decodes exactly the same number of tokens. Prefill speed is measured by generating one token
//! per request; decode speed is the extra time of generating `DECODE` more.

/// Chat templates run under a memory budget, which counts through this allocator.
#[global_allocator]
static ALLOCATOR: candor::budget::alloc_budget::BudgetAllocator =
    candor::budget::alloc_budget::BudgetAllocator;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use candor::engine::{Decoder, NoText, SamplingParams, SchedulerConfig, TokenRequest};
use candor::model::runner::Model;
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

const PROMPT: usize = 128;
const DECODE: usize = 64;
const THREADS: usize = 2;

fn requests(n: usize, max_new_tokens: usize) -> Vec<TokenRequest> {
    let mut rng = SplitMix64::new(7);
    (0..n)
        .map(|_| {
            let ids = (0..PROMPT)
                .map(|_| (rng.next_u64() % 49_000) as u32 + 100)
                .collect();
            let params = SamplingParams {
                max_new_tokens,
                ..SamplingParams::default()
            };
            TokenRequest::new(ids, params)
        })
        .collect()
}

fn timed(dec: &mut Decoder, reqs: &[TokenRequest]) -> f64 {
    let t = Instant::now();
    let replies = dec.generate(reqs, &NoText).expect("generate");
    assert!(replies
        .iter()
        .all(|r| r.output_ids.len() == reqs[0].params.max_new_tokens));
    t.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = args
        .iter()
        .position(|a| a == "--model")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let path = flag
        .or_else(|| std::env::var_os("CANDOR_MODEL").map(PathBuf::from))
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    if !path.is_file() {
        eprintln!(
            "throughput: model not found at {} (run `candor setup`)",
            path.display()
        );
        return;
    }
    let dtype = match std::env::var("CANDOR_DTYPE").as_deref() {
        Ok("f32") => WeightDType::F32,
        _ => WeightDType::Native,
    };
    let model = Arc::new(Model::from(
        Transformer::from_gguf_path(&path, dtype).expect("load model"),
    ));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(THREADS)
        .build()
        .expect("thread pool");
    println!(
        "model {} ({dtype:?}), {THREADS} threads, prompt {PROMPT} tokens, decode {DECODE} tokens",
        path.display()
    );
    for batch in [1usize, 4, 16] {
        let cfg = SchedulerConfig {
            batch_size: batch,
            // The requests repeat one prompt: measure prefill, not the prefix cache.
            prefix_cache_bytes: 0,
            ..SchedulerConfig::default()
        };
        // No stop tokens: every request runs to its token limit.
        let mut dec = Decoder::new(Arc::clone(&model), cfg, Vec::new());
        pool.install(|| {
            timed(&mut dec, &requests(batch, 2)); // warm-up
            let t_prefill = timed(&mut dec, &requests(batch, 1));
            let t_total = timed(&mut dec, &requests(batch, 1 + DECODE));
            let prefill = (batch * PROMPT) as f64 / t_prefill;
            let decode = (batch * DECODE) as f64 / (t_total - t_prefill);
            println!(
                "batch {batch:>2}: prefill {prefill:>8.1} tok/s   decode {decode:>8.1} tok/s (aggregate), {:>6.1} tok/s per sequence",
                decode / batch as f64
            );
        });
    }
}
