//! Throughput of the packed forward pass on synthetic prompts, with the same definitions as
//! llama.cpp's `llama-batched-bench -npp P -ntg N -npl B`: `B` sequences of `P` prompt tokens
//! are prefilled (`prefill_tok_s = B·P / t_pp`, the first sampled token's logits included), then
//! decoded together for `N` steps of one token each (`decode_tok_s = B·N / t_tg`, aggregate
//! over the batch).
//!
//! Prompts are fixed pseudo-random token ids; decoding is greedy and never stops early, so
//! every run of a configuration does exactly the same work. Prefill is packed the way the
//! scheduler packs it (at most `prefill_chunk` tokens per sequence and `max_step_tokens` rows
//! per step).

use std::time::Instant;

use serde::Serialize;

use super::kv::{KvLayout, KvStorage, SeqKv};
use super::sampling::argmax;
use super::scheduler::SchedulerConfig;
use super::EngineError;
use crate::model::kv::{KvSeq, Logits, SeqStep};
use crate::model::runner::Model;
use crate::model::transformer::Scratch;
use crate::stats::rng::SplitMix64;

/// One throughput configuration (named apart from the evaluation protocols, which are benchmarks too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThroughputConfig {
    /// Prompt tokens per sequence (`-npp`).
    pub prompt_tokens: usize,
    /// Decoded tokens per sequence after the prompt (`-ntg`).
    pub new_tokens: usize,
    /// Sequences prefilled and decoded together (`-npl`).
    pub batch_size: usize,
    /// Prefill packing (batch size is taken from `batch_size`).
    pub scheduler: SchedulerConfig,
}

/// Measured times and rates of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThroughputResult {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub batch_size: usize,
    /// Prefill wall time in seconds (`T_PP`).
    pub prefill_s: f64,
    /// Prompt tokens per second over the batch (`S_PP`).
    pub prefill_tok_s: f64,
    /// Decode wall time in seconds (`T_TG`).
    pub decode_s: f64,
    /// Decoded tokens per second over the batch (`S_TG`).
    pub decode_tok_s: f64,
    /// Decoded tokens per second of one sequence.
    pub decode_tok_s_per_seq: f64,
    /// All tokens over all time (`S`).
    pub total_tok_s: f64,
}

/// The synthetic prompt of sequence `i`: ids in `[0, vocab)`, fixed for a given `i`.
fn prompt(i: usize, len: usize, vocab: usize) -> Vec<u32> {
    let mut rng = SplitMix64::new(0x5eed_0000 + i as u64);
    (0..len)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// Runs one configuration on `model` (in the current rayon pool).
pub fn run(model: &Model, cfg: ThroughputConfig) -> Result<ThroughputResult, EngineError> {
    let c = model.config();
    let (p, n, b) = (cfg.prompt_tokens, cfg.new_tokens, cfg.batch_size);
    if p == 0 || b == 0 {
        return Err(EngineError::Internal(
            "bench: prompt tokens and batch size must be at least 1".into(),
        ));
    }
    if p + n > c.context_len {
        return Err(EngineError::PrefixTooLong {
            len: p + n,
            context: c.context_len,
        });
    }
    let layout = KvLayout {
        n_layer: c.n_layer,
        kv_dim: c.kv_dim(),
    };
    let storage = KvStorage::for_model(model);
    let new_kv = || SeqKv::new_in(layout, storage.clone()).with_state(model.state_len());
    let vocab = c.vocab_size;
    let mut scratch = Scratch::default();

    // Warm-up: one short step on a throwaway sequence (threads started, buffers grown).
    {
        let mut kv = new_kv();
        let ids = prompt(usize::MAX >> 1, p.min(16), vocab);
        let mut steps = [SeqStep {
            tokens: &ids,
            kv: &mut kv,
            logits: Logits::Last,
        }];
        model.forward(&mut steps, &mut scratch)?;
    }

    let prompts: Vec<Vec<u32>> = (0..b).map(|i| prompt(i, p, vocab)).collect();
    let mut kvs: Vec<SeqKv> = (0..b).map(|_| new_kv()).collect();
    let mut next = vec![0u32; b];
    let chunk = cfg.scheduler.prefill_chunk.max(1);
    let step_rows = cfg.scheduler.max_step_tokens.max(1);

    let t0 = Instant::now();
    let mut fed = vec![0usize; b];
    while fed.iter().any(|&f| f < p) {
        let mut budget = step_rows;
        let mut plan: Vec<(usize, usize)> = Vec::new();
        for (i, &f) in fed.iter().enumerate() {
            let take = (p - f).min(chunk).min(budget);
            if take > 0 {
                budget -= take;
                plan.push((i, take));
            }
        }
        let mut steps: Vec<SeqStep<'_, SeqKv>> = Vec::with_capacity(plan.len());
        let mut planned = plan.iter().peekable();
        for (i, kv) in kvs.iter_mut().enumerate() {
            let Some(&&(pi, take)) = planned.peek() else {
                break;
            };
            if pi != i {
                continue;
            }
            planned.next();
            steps.push(SeqStep {
                tokens: &prompts[i][fed[i]..fed[i] + take],
                kv,
                logits: if fed[i] + take == p {
                    Logits::Last
                } else {
                    Logits::None
                },
            });
        }
        let logits = model.forward(&mut steps, &mut scratch)?;
        let mut row = 0;
        for &(i, take) in &plan {
            fed[i] += take;
            if fed[i] == p {
                next[i] = argmax(&logits[row * vocab..(row + 1) * vocab]);
                row += 1;
            }
        }
    }
    let t_pp = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    for _ in 0..n {
        let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let mut steps: Vec<SeqStep<'_, SeqKv>> = kvs
            .iter_mut()
            .zip(&toks)
            .map(|(kv, t)| SeqStep {
                tokens: t,
                kv,
                logits: Logits::Last,
            })
            .collect();
        let logits = model.forward(&mut steps, &mut scratch)?;
        for (i, t) in next.iter_mut().enumerate() {
            *t = argmax(&logits[i * vocab..(i + 1) * vocab]);
        }
    }
    let t_tg = t1.elapsed().as_secs_f64();
    debug_assert!(kvs.iter().all(|kv| kv.len() == p + n));

    let rate = |tokens: usize, secs: f64| {
        if secs > 0.0 {
            tokens as f64 / secs
        } else {
            0.0
        }
    };
    let decode_tok_s = rate(b * n, t_tg);
    Ok(ThroughputResult {
        prompt_tokens: p,
        new_tokens: n,
        batch_size: b,
        prefill_s: t_pp,
        prefill_tok_s: rate(b * p, t_pp),
        decode_s: t_tg,
        decode_tok_s,
        decode_tok_s_per_seq: decode_tok_s / b as f64,
        total_tok_s: rate(b * (p + n), t_pp + t_tg),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_fixed_and_in_range() {
        let a = prompt(3, 50, 1000);
        assert_eq!(a, prompt(3, 50, 1000));
        assert_ne!(a, prompt(4, 50, 1000));
        assert!(a.iter().all(|&t| t < 1000));
    }
}
