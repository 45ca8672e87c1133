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
    let layout = KvLayout::of(model.transformer());
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
        let logits = step_all(model, &mut kvs, &toks, Logits::Last, &mut scratch)?;
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

/// One forward step of every sequence together, `toks[i]` on `kvs[i]`, each wanting `logits`.
fn step_all<'s, T: AsRef<[u32]>>(
    model: &Model,
    kvs: &mut [SeqKv],
    toks: &[T],
    logits: Logits,
    scratch: &'s mut Scratch,
) -> Result<&'s [f32], EngineError> {
    let mut steps: Vec<SeqStep<'_, SeqKv>> = kvs
        .iter_mut()
        .zip(toks)
        .map(|(kv, t)| SeqStep {
            tokens: t.as_ref(),
            kv,
            logits,
        })
        .collect();
    Ok(model.forward(&mut steps, scratch)?)
}

/// What verifying drafts costs against plain decoding, measured on one configuration: the
/// time of a decode step of one token per sequence, and of a verify step of `rows` tokens per
/// sequence (the drafted tokens and the one before them, every row's logits wanted), after
/// which each sequence keeps one token, as a verify that accepts no draft does (so the context
/// grows as in plain decoding). Drafting's cost model ([`break_even_acceptance`]) is built on
/// these.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VerifyCost {
    /// Rows per sequence in a verify step (drafted tokens + 1).
    pub rows: usize,
    /// Seconds of one plain decode step (all sequences, one token each).
    pub decode_step_s: f64,
    /// Seconds of one verify step (all sequences, `rows` tokens each).
    pub verify_step_s: f64,
}

/// Measures [`VerifyCost`] for `rows` rows per sequence on `cfg` (`new_tokens` steps of each
/// kind, alternating, after prefilling the batch's prompts).
pub fn verify_cost(
    model: &Model,
    cfg: ThroughputConfig,
    rows: usize,
) -> Result<VerifyCost, EngineError> {
    let c = model.config();
    let (p, n, b) = (cfg.prompt_tokens, cfg.new_tokens.max(1), cfg.batch_size);
    if p == 0 || b == 0 || rows == 0 {
        return Err(EngineError::Internal(
            "bench: prompt tokens, batch size and verify rows must be at least 1".into(),
        ));
    }
    if p + 2 * n + rows > c.context_len {
        return Err(EngineError::PrefixTooLong {
            len: p + 2 * n + rows,
            context: c.context_len,
        });
    }
    let layout = KvLayout::of(model.transformer());
    let storage = KvStorage::for_model(model);
    let vocab = c.vocab_size;
    let mut scratch = Scratch::default();
    let mut kvs: Vec<SeqKv> = (0..b)
        .map(|_| SeqKv::new_in(layout, storage.clone()))
        .collect();
    // Prefill each prompt in one step of its own (not timed).
    for (i, kv) in kvs.iter_mut().enumerate() {
        let ids = prompt(i, p, vocab);
        let mut steps = [SeqStep {
            tokens: &ids,
            kv,
            logits: Logits::None,
        }];
        model.forward(&mut steps, &mut scratch)?;
    }
    let mut step = |kvs: &mut [SeqKv], width: usize, keep: usize| -> Result<f64, EngineError> {
        let toks: Vec<Vec<u32>> = (0..kvs.len())
            .map(|i| prompt(kvs[i].len() + i, width, vocab))
            .collect();
        let t = Instant::now();
        let wanted = if width == 1 {
            Logits::Last
        } else {
            Logits::All
        };
        step_all(model, kvs, &toks, wanted, &mut scratch)?;
        let secs = t.elapsed().as_secs_f64();
        for kv in kvs.iter_mut() {
            let len = kv.len() - (width - keep);
            kv.truncate(len);
        }
        Ok(secs)
    };
    let (mut decode, mut verify) = (0.0, 0.0);
    for _ in 0..n {
        decode += step(&mut kvs, 1, 1)?;
        verify += step(&mut kvs, rows, 1)?;
    }
    Ok(VerifyCost {
        rows,
        decode_step_s: decode / n as f64,
        verify_step_s: verify / n as f64,
    })
}

/// Expected tokens a verify step of `k` drafted tokens yields when each draft is accepted with
/// probability `alpha` independently, until the first rejection (the target's own token is
/// always kept): `(1 - alpha^(k+1)) / (1 - alpha)`.
pub fn expected_tokens(alpha: f64, k: usize) -> f64 {
    if alpha >= 1.0 {
        return (k + 1) as f64;
    }
    (1.0 - alpha.powi(k as i32 + 1)) / (1.0 - alpha)
}

/// The acceptance rate at which drafting `k` tokens per verify step (each draft costing
/// `draft_step_s`, zero for prompt lookup) is as fast as plain decoding: where
/// `expected_tokens(alpha, k) · decode_step_s = k · draft_step_s + verify_step_s`. `Some(0.0)`
/// when it pays even if no draft is accepted; `None` when it cannot pay even if every draft is.
pub fn break_even_acceptance(cost: &VerifyCost, draft_step_s: f64) -> Option<f64> {
    let k = cost.rows.saturating_sub(1);
    let spent = k as f64 * draft_step_s + cost.verify_step_s;
    let gain = |alpha: f64| expected_tokens(alpha, k) * cost.decode_step_s - spent;
    if gain(0.0) >= 0.0 {
        return Some(0.0);
    }
    if gain(1.0) < 0.0 {
        return None;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if gain(mid) < 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_break_even_acceptance_solves_the_cost_model() {
        assert_eq!(expected_tokens(0.0, 8), 1.0);
        assert_eq!(expected_tokens(1.0, 8), 9.0);
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
        // A verify of 5 rows costing twice a decode step, drafts free: 2 tokens per verify
        // needed, (1 - a^5) / (1 - a) = 2 at a ≈ 0.5188.
        let cost = VerifyCost {
            rows: 5,
            decode_step_s: 0.01,
            verify_step_s: 0.02,
        };
        let a = break_even_acceptance(&cost, 0.0).unwrap();
        assert!((expected_tokens(a, 4) - 2.0).abs() < 1e-9, "{a}");
        assert!((a - 0.5188).abs() < 1e-3, "{a}");
        // Drafts as dear as the target: 4 drafts + a verify can never pay back in 5 tokens.
        assert_eq!(break_even_acceptance(&cost, 0.01), None);
        // A verify as cheap as a decode step pays at any acceptance.
        let free = VerifyCost {
            verify_step_s: 0.01,
            ..cost
        };
        assert_eq!(break_even_acceptance(&free, 0.0), Some(0.0));
    }

    #[test]
    fn prompts_are_fixed_and_in_range() {
        let a = prompt(3, 50, 1000);
        assert_eq!(a, prompt(3, 50, 1000));
        assert_ne!(a, prompt(4, 50, 1000));
        assert!(a.iter().all(|&t| t < 1000));
    }
}
