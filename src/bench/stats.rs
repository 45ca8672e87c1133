//! Statistics shared by every benchmark: a seeded bootstrap for 95% intervals, drawn from the
//! crate's one generator ([`crate::stats::rng::SplitMix64`]).

use serde::{Deserialize, Serialize};

use crate::stats::rng::SplitMix64;
use crate::stats::summary::mean;
use crate::stats::summary::percentile;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
