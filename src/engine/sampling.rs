//! Picking the next token from a row of logits: greedy (ties to the lowest id) or temperature
//! and top-p sampling driven by a per-request, per-step random stream.
//!
//! A request's random draw at step `i` depends only on its seed and `i`
//! ([`SplitMix64::for_step`]), never on which requests share its batch, so seeded sampling is
//! as reproducible as greedy decoding. This module sees one logits row at a time and knows
//! nothing of batches, stop conditions or text.

use super::SamplingParams;
use crate::stats::rng::SplitMix64;

/// The index of the largest logit; a tie goes to the lowest index. NaNs never win.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// Reusable buffers for [`Sampler::sample`].
#[derive(Debug, Default)]
pub struct Sampler {
    probs: Vec<f64>,
    order: Vec<u32>,
}

impl Sampler {
    /// Picks the token for a request's `step`-th generated position.
    pub fn sample(&mut self, logits: &[f32], params: &SamplingParams, step: u64) -> u32 {
        if params.temperature <= 0.0 || !params.temperature.is_finite() {
            return argmax(logits);
        }
        let t = params.temperature as f64;
        let max = logits[argmax(logits) as usize] as f64;
        self.probs.clear();
        self.probs
            .extend(logits.iter().map(|&l| ((l as f64 - max) / t).exp()));
        self.order.clear();
        self.order.extend(0..logits.len() as u32);
        let probs = &self.probs;
        // Descending probability, ties by ascending id: a total, reproducible order.
        self.order.sort_unstable_by(|&a, &b| {
            probs[b as usize]
                .total_cmp(&probs[a as usize])
                .then(a.cmp(&b))
        });
        let total: f64 = self.order.iter().map(|&i| probs[i as usize]).sum();
        let top_p = if params.top_p > 0.0 && params.top_p < 1.0 {
            params.top_p as f64
        } else {
            1.0
        };
        let mut kept = 0usize;
        let mut mass = 0.0;
        for &i in &self.order {
            mass += probs[i as usize];
            kept += 1;
            if mass >= top_p * total {
                break;
            }
        }
        let u = SplitMix64::for_step(params.seed, step).next_f64() * mass;
        let mut acc = 0.0;
        for &i in &self.order[..kept] {
            acc += probs[i as usize];
            if u < acc {
                return i;
            }
        }
        self.order[kept - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_p,
            seed,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn argmax_ties_go_to_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
        assert_eq!(argmax(&[-1.0]), 0);
    }

    #[test]
    fn temperature_zero_is_greedy() {
        let mut s = Sampler::default();
        assert_eq!(s.sample(&[0.1, 0.9, 0.3], &params(0.0, 1.0, 7), 0), 1);
    }

    #[test]
    fn stream_depends_on_seed_and_step_only() {
        let a = SplitMix64::for_step(42, 3).next_u64();
        assert_eq!(a, SplitMix64::for_step(42, 3).next_u64());
        assert_ne!(a, SplitMix64::for_step(42, 4).next_u64());
        assert_ne!(a, SplitMix64::for_step(43, 3).next_u64());
    }

    #[test]
    fn sampling_is_reproducible_and_follows_the_distribution() {
        let logits = [0.0f32, 1.0, 2.0, 0.5];
        let mut s = Sampler::default();
        let p = params(1.0, 1.0, 9);
        let draws: Vec<u32> = (0..2000).map(|i| s.sample(&logits, &p, i)).collect();
        let again: Vec<u32> = (0..2000).map(|i| s.sample(&logits, &p, i)).collect();
        assert_eq!(draws, again);
        let count = |t: u32| draws.iter().filter(|&&d| d == t).count();
        // softmax([0,1,2,0.5]) ~ [0.08, 0.22, 0.60, 0.13]
        assert!(count(2) > 1000 && count(2) < 1400, "{}", count(2));
        assert!(count(0) > 80 && count(0) < 260, "{}", count(0));
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        let logits = [0.0f32, 5.0, 4.0, -3.0];
        let mut s = Sampler::default();
        let p = params(1.0, 0.5, 1);
        for step in 0..200 {
            assert_eq!(s.sample(&logits, &p, step), 1);
        }
        let p = params(1.0, 0.9, 1);
        let seen: std::collections::BTreeSet<u32> =
            (0..400).map(|step| s.sample(&logits, &p, step)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![1, 2]);
    }
}
