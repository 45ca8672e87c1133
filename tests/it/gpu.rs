//! The engine on a CUDA device (feature `cuda`): the CPU contract's tests run on the GPU —
//! replies independent of batch size, neighbours and runs; forks and the prefix cache change
//! no token — and the GPU's teacher-forced agreement with the CPU is measured. Every test says
//! loudly that it was skipped when this machine has no GPU (`CANDOR_TEST_DEVICE` picks one;
//! default `cuda:0`). `benches/gpu/run.sh` runs them on a lent GPU machine.

use std::sync::Arc;

use candor::engine::{
    ChatRequest, Decoder, Engine, EngineOptions, Generate, NoText, SamplingParams, SchedulerConfig,
    TokenRequest,
};
use candor::model::chat::Message;
use candor::model::device::DeviceSpec;
use candor::model::llama::{Llama, WeightDType};
use candor::model::runner::Model;

use crate::util;

fn device() -> DeviceSpec {
    std::env::var("CANDOR_TEST_DEVICE")
        .ok()
        .map(|d| d.parse().expect("CANDOR_TEST_DEVICE"))
        .unwrap_or(DeviceSpec::Cuda(0))
}

/// Says loudly that a test was skipped for want of a GPU; a failure where the GPU is required
/// (`CANDOR_REQUIRE_GPU=1`, as `benches/gpu/run.sh` sets it on the GPU machine).
fn skip(why: &dyn std::fmt::Display) {
    assert!(
        std::env::var("CANDOR_REQUIRE_GPU").as_deref() != Ok("1"),
        "CANDOR_REQUIRE_GPU=1 but the GPU cannot be used: {why}"
    );
    eprintln!("\n*** SKIPPED (no GPU): {why} ***\n");
}

/// The default model on the GPU, or `None` (skipped, said loudly) without one.
fn gpu_model() -> Option<(Arc<Model>, Llama)> {
    let path = util::default_model()?;
    let load = || Llama::from_gguf_path(&path, WeightDType::Native).expect("load default model");
    match Model::new(load(), device()) {
        Ok(m) => Some((Arc::new(m), load())),
        Err(e) => {
            skip(&e);
            None
        }
    }
}

fn conversations() -> Vec<Vec<Message>> {
    #[derive(serde::Deserialize)]
    struct Conv {
        messages: Vec<Message>,
    }
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reference/conversations.jsonl");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Conv>(l)
                .expect("conversation")
                .messages
        })
        .collect()
}

#[test]
fn gpu_replies_do_not_depend_on_batch_size_neighbours_or_runs() {
    let Some(path) = util::default_model() else {
        return;
    };
    let options = EngineOptions {
        dtype: WeightDType::Native,
        device: device(),
        scheduler: SchedulerConfig {
            batch_size: 16,
            ..SchedulerConfig::default()
        },
    };
    let mut eng = match Engine::load(&path, options) {
        Ok(e) => e,
        Err(e) => {
            skip(&e);
            return;
        }
    };
    // The fixture's conversations, repeated to fill a batch of 64 (each copy its own seed).
    let convs = conversations();
    let reqs: Vec<ChatRequest> = (0..72)
        .map(|i| {
            let (temperature, top_p) = if i % 3 == 2 { (0.9, 0.9) } else { (0.0, 1.0) };
            ChatRequest {
                messages: convs[i % convs.len()].clone(),
                params: SamplingParams {
                    temperature,
                    top_p,
                    seed: 77 + i as u64,
                    max_new_tokens: 32,
                    ..SamplingParams::default()
                },
            }
        })
        .collect();
    let mut run = |reqs: &[ChatRequest], bs: usize| {
        eng.set_batch_size(bs);
        eng.generate_chat(reqs).expect("generate")
    };
    let baseline = run(&reqs, 16);
    assert!(baseline.iter().all(|r| !r.output_ids.is_empty()));
    for bs in [1, 3, 64] {
        let got = run(&reqs, bs);
        for (i, (g, b)) in got.iter().zip(&baseline).enumerate() {
            assert_eq!(g, b, "request {i} differs at batch size {bs}");
        }
    }
    let rev: Vec<ChatRequest> = reqs.iter().rev().cloned().collect();
    let got = run(&rev, 3);
    for (i, g) in got.iter().rev().enumerate() {
        assert_eq!(g, &baseline[i], "request {i} differs in reversed order");
    }
    assert_eq!(run(&reqs, 16), baseline, "a second run differs");
    println!(
        "{} GPU replies identical at batch 1, 3, 16, 64, reversed, rerun",
        reqs.len()
    );
}

#[test]
fn gpu_forks_and_prefix_cache_change_no_token() {
    let Some((model, _)) = gpu_model() else {
        return;
    };
    let cfg = |bytes: usize, batch_size: usize| SchedulerConfig {
        batch_size,
        prefix_cache_bytes: bytes,
        ..SchedulerConfig::default()
    };
    let greedy = SamplingParams {
        max_new_tokens: 16,
        ..SamplingParams::default()
    };
    // A 37-token prefix: it ends inside a KV block, so forks copy that block on the device.
    let prefix: Vec<u32> = (0..37).map(|i| (i * 37 % 5000) as u32 + 100).collect();
    let tails: Vec<Vec<u32>> = vec![vec![4, 9], vec![17], (50..58).collect()];
    let mut dec = Decoder::new(Arc::clone(&model), cfg(0, 4), vec![2]);
    let base = dec.prefill(&prefix).expect("prefill");
    let forked: Vec<TokenRequest> = tails
        .iter()
        .map(|t| TokenRequest {
            prompt_ids: t.clone(),
            params: greedy.clone(),
            prefix: Some(dec.fork(base).expect("fork")),
        })
        .collect();
    let from_forks = dec.generate(&forked, &NoText).expect("forked");
    let fresh: Vec<TokenRequest> = tails
        .iter()
        .map(|t| TokenRequest::new([prefix.clone(), t.clone()].concat(), greedy.clone()))
        .collect();
    let from_scratch = dec.generate(&fresh, &NoText).expect("fresh");
    for (a, b) in from_forks.iter().zip(&from_scratch) {
        assert_eq!(a.output_ids, b.output_ids, "fork vs fresh prompt");
    }
    // The same prompts twice with the prefix cache on: the second time reuses the first's
    // blocks and gives the same tokens.
    let mut cached = Decoder::new(Arc::clone(&model), cfg(64 << 20, 2), vec![2]);
    let first = cached.generate(&fresh, &NoText).expect("first");
    let second = cached.generate(&fresh, &NoText).expect("second");
    assert!(
        cached.prefill_stats().reused > 0,
        "the cache reused nothing"
    );
    for ((a, b), c) in first.iter().zip(&second).zip(&from_scratch) {
        assert_eq!(a.output_ids, c.output_ids, "cache on vs off");
        assert_eq!(b.output_ids, c.output_ids, "cache hit vs off");
    }
}

#[test]
fn gpu_teacher_forced_agreement_with_the_cpu() {
    let Some((gpu, cpu)) = gpu_model() else {
        return;
    };
    let path = util::default_model().expect("model");
    let tokenizer = {
        let f = candor::model::gguf::GgufFile::open(&path).expect("open");
        candor::model::tokenizer::Tokenizer::from_gguf(f.content()).expect("tokenizer")
    };
    let mut on_gpu = Decoder::new(gpu, SchedulerConfig::default(), vec![2]);
    let mut on_cpu = Decoder::new(
        Arc::new(Model::from(cpu)),
        SchedulerConfig::default(),
        vec![2],
    );
    let (mut total, mut agree) = (0, 0);
    for conv in conversations() {
        let text: String = conv
            .iter()
            .map(|m| m.content.clone())
            .collect::<Vec<_>>()
            .join("\n");
        let ids = tokenizer.encode(&text).expect("encode");
        let a = on_gpu.next_token_argmax(&ids, 1).expect("gpu");
        let b = on_cpu.next_token_argmax(&ids, 1).expect("cpu");
        total += a.len();
        agree += a.iter().zip(&b).filter(|(x, y)| x == y).count();
    }
    let share = agree as f64 / total.max(1) as f64;
    println!(
        "GPU vs CPU teacher-forced next-token agreement: {agree}/{total} ({:.1}%)",
        100.0 * share
    );
    // Not equal by design (other summation order, f16 KV), but a wrong kernel shows far below.
    assert!(
        share >= 0.9,
        "GPU agrees with the CPU on only {agree}/{total} positions"
    );
}
