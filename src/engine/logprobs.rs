//! Log-probabilities of generated tokens, for callers that report them (`candor serve`'s
//! `logprobs` / `top_logprobs`).
//!
//! They are the model's own distribution at a step (a log-softmax of the logits row, before
//! temperature, top-p or a constraint's mask), computed from the request's row alone, so like
//! its tokens they never depend on batch neighbours.

/// One generated token's log-probability and the most likely alternatives at its step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// The `top` most likely tokens, most likely first (ties to the lowest id).
    pub top: Vec<(u32, f32)>,
}

/// The log-probability of `chosen` in the softmax of `logits`, with the `top` most likely ids.
pub fn token_logprob(logits: &[f32], chosen: u32, top: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&l| (l as f64 - max).exp())
        .sum();
    let log_z = max + sum.ln();
    let lp = |i: u32| match logits.get(i as usize) {
        Some(&l) if !l.is_nan() => (l as f64 - log_z) as f32,
        _ => f32::NEG_INFINITY,
    };
    let mut best: Vec<u32> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() {
                continue;
            }
            // Keep `best` sorted by descending logit, ties by ascending id.
            let pos = best.partition_point(|&b| logits[b as usize] >= l);
            if pos < top {
                best.insert(pos, i as u32);
                best.truncate(top);
            }
        }
    }
    TokenLogprob {
        id: chosen,
        logprob: lp(chosen),
        top: best.into_iter().map(|i| (i, lp(i))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_top_alternatives() {
        let logits = [0.0f32, 2.0, 1.0, 2.0];
        let t = token_logprob(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!((t.logprob as f64 - (1.0 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = t.top.iter().map(|&(i, _)| i).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        let total: f64 = (0..4)
            .map(|i| (token_logprob(&logits, i, 0).logprob as f64).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(token_logprob(&logits, 9, 0).logprob.is_infinite());
    }
}
