//! Engine tests: the llama forward pass and decode loop on the real default model and on tiny
//! synthetic GGUF files, determinism across batch sizes and thread counts, forks, and
//! agreement with the committed reference fixture.

use std::sync::Arc;

use candor::engine::{Decoder, NoText, SamplingParams, SchedulerConfig, StopReason, TokenRequest};
use candor::model::llama::{Llama, WeightDType};

use crate::util;

fn decoder(dtype: WeightDType, batch_size: usize) -> Option<Decoder> {
    let path = util::default_model()?;
    let model = Llama::from_gguf_path(&path, dtype).expect("load default model");
    let cfg = SchedulerConfig {
        batch_size,
        ..SchedulerConfig::default()
    };
    Some(Decoder::new(Arc::new(model), cfg, vec![2]))
}

/// `<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n`
const FRANCE: [u32; 16] = [
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
];

#[test]
fn greedy_answers_capital_of_france() {
    // Independently computed with a float64 numpy forward pass over the dequantized weights.
    let expected = [504, 3575, 282, 4649, 314, 7042, 30, 2];
    for dtype in [WeightDType::F32, WeightDType::Native] {
        let Some(mut dec) = decoder(dtype, 1) else {
            return;
        };
        let params = SamplingParams {
            max_new_tokens: 16,
            ..SamplingParams::default()
        };
        let req = TokenRequest::new(FRANCE.to_vec(), params);
        let reply = dec.generate(&[req], &NoText).expect("generate");
        assert_eq!(reply[0].output_ids, expected, "{dtype:?}");
        assert_eq!(reply[0].stop_reason, StopReason::Eos);
    }
}

/// Twelve-plus prompts of mixed lengths: the chat prompt above and seeded pseudo-random ids.
fn mixed_prompts(n: usize) -> Vec<Vec<u32>> {
    let mut rng = candor::engine::sampling::SplitMix64::new(2024);
    let mut prompts = vec![FRANCE.to_vec()];
    for i in 1..n {
        let len = 2 + (i * 37) % 90;
        let mut p = vec![1u32];
        p.extend((0..len).map(|_| (rng.next_u64() % 49_000) as u32 + 100));
        p.extend([2, 198, 1, 520, 9531, 198]);
        prompts.push(p);
    }
    prompts
}

fn requests(prompts: &[Vec<u32>], max_new_tokens: usize) -> Vec<TokenRequest> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            // Every third request samples (seeded); the rest are greedy.
            let (temperature, top_p) = if i % 3 == 2 { (0.8, 0.95) } else { (0.0, 1.0) };
            let params = SamplingParams {
                temperature,
                top_p,
                seed: 1000 + i as u64,
                max_new_tokens,
                ..SamplingParams::default()
            };
            TokenRequest::new(p.clone(), params)
        })
        .collect()
}

#[test]
fn tokens_do_not_depend_on_batch_size_neighbours_or_threads() {
    let Some(mut dec) = decoder(WeightDType::Native, 1) else {
        return;
    };
    let prompts = mixed_prompts(13);
    let reqs = requests(&prompts, 24);
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .expect("thread pool")
    };
    let run = |dec: &mut Decoder, reqs: &[TokenRequest], bs: usize, threads: usize| {
        dec.set_batch_size(bs);
        pool(threads)
            .install(|| dec.generate(reqs, &NoText))
            .expect("generate")
            .into_iter()
            .map(|r| r.output_ids)
            .collect::<Vec<_>>()
    };
    let baseline = run(&mut dec, &reqs, 1, 1);
    assert!(baseline.iter().all(|o| !o.is_empty()));
    for (bs, threads) in [(3, 1), (16, 1), (1, 2), (3, 2), (16, 2)] {
        let got = run(&mut dec, &reqs, bs, threads);
        for (i, (g, b)) in got.iter().zip(&baseline).enumerate() {
            assert_eq!(
                g, b,
                "request {i} differs at batch size {bs}, {threads} threads"
            );
        }
    }
    // Other neighbours: the same requests in reverse order, and each beside a different one.
    let mut rev = reqs.clone();
    rev.reverse();
    let got = run(&mut dec, &rev, 3, 2);
    for (i, g) in got.iter().rev().enumerate() {
        assert_eq!(g, &baseline[i], "request {i} differs in reversed order");
    }
    // Run after run.
    assert_eq!(run(&mut dec, &reqs, 16, 2), baseline);
}
