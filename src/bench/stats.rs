//! Statistics shared by every benchmark: a seeded bootstrap for 95% intervals.
//!
//! The generator is the engine's SplitMix64 (written in [`crate::engine::sampling`] rather than
//! taken from a crate, so that the intervals stay bit-identical whatever versions of other
//! crates are resolved).

use serde::{Deserialize, Serialize};

pub use crate::engine::sampling::SplitMix64;

/// A point estimate with its bootstrap interval. A value that does not exist (an empty
/// metric, no finite resample) is NaN, written `null` in JSON and read back as NaN.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    #[serde(deserialize_with = "nan_from_null")]
    pub value: f64,
    #[serde(deserialize_with = "nan_from_null")]
    pub low: f64,
    #[serde(deserialize_with = "nan_from_null")]
    pub high: f64,
}

/// One headline number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// snake_case, e.g. `error_correction`, `feedback_acceptance`, `f1`.
    pub name: String,
    /// The value with its seeded bootstrap 95% interval.
    pub interval: Interval,
    /// Units that entered the metric.
    pub n: usize,
    /// Units left out because a judge's output could not be parsed.
    pub unscored: usize,
}

/// `null` (how `serde_json` writes a NaN) as NaN; a number as itself.
fn nan_from_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Default number of bootstrap resamples.
pub const RESAMPLES: usize = 1000;

/// Percentile bootstrap 95% interval of `statistic` over `units` (resampled with replacement,
/// `resamples` times, from `seed`). `statistic` receives the resampled units.
pub fn bootstrap<T: Clone>(
    units: &[T],
    statistic: impl Fn(&[T]) -> f64,
    seed: u64,
    resamples: usize,
) -> Interval {
    let value = statistic(units);
    if units.is_empty() || resamples == 0 {
        return Interval {
            value,
            low: value,
            high: value,
        };
    }
    let mut rng = SplitMix64::new(seed);
    let mut stats = Vec::with_capacity(resamples);
    let mut sample = Vec::with_capacity(units.len());
    for _ in 0..resamples {
        sample.clear();
        for _ in 0..units.len() {
            sample.push(units[rng.below(units.len())].clone());
        }
        let s = statistic(&sample);
        if s.is_finite() {
            stats.push(s);
        }
    }
    if stats.is_empty() {
        return Interval {
            value,
            low: f64::NAN,
            high: f64::NAN,
        };
    }
    stats.sort_by(f64::total_cmp);
    Interval {
        value,
        low: percentile(&stats, 2.5),
        high: percentile(&stats, 97.5),
    }
}

/// Bootstrap interval of a plain mean.
pub fn bootstrap_mean(values: &[f64], seed: u64) -> Interval {
    bootstrap(values, mean, seed, RESAMPLES)
}

/// Arithmetic mean; NaN for an empty slice.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        f64::NAN
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Linear-interpolated percentile (`p` in 0..=100) of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_sequence() {
        // First outputs of SplitMix64 seeded with 1234567 (from the reference C code).
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn bootstrap_is_seeded_and_brackets_the_mean() {
        let v: Vec<f64> = (0..200).map(|i| (i % 7) as f64).collect();
        let a = bootstrap_mean(&v, 7);
        let b = bootstrap_mean(&v, 7);
        assert_eq!(a, b);
        assert!(a.low < a.value && a.value < a.high, "{a:?}");
        let c = bootstrap_mean(&v, 8);
        assert_ne!(a.low, c.low);
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = SplitMix64::new(0);
        assert!((0..10_000).all(|_| r.below(3) < 3));
    }
}
