//! Agreement between raters who put the same units into the same nominal categories: the
//! confusion matrix of two raters, their percent agreement and Cohen's κ (1960), and Fleiss' κ
//! (1971) for any number of raters per unit.
//!
//! Intervals: Cohen's κ has the analytic large-sample standard error of Fleiss, Cohen and
//! Everitt (1969, "Large sample standard errors of kappa and weighted kappa", the non-null
//! variance; statsmodels' `cohens_kappa(..).std_kappa`) and a Wald 95% interval κ ± 1.96·SE,
//! clipped to κ's range [−1, 1] (on few units the Wald interval passes it: 0.750 ± 0.444).
//! Fleiss' κ has no such standard error for a non-zero κ (Fleiss, Nee and Landis 1979 give
//! one under κ = 0 only, for testing), so its 95% interval is a percentile bootstrap over
//! units; the caller supplies the random index source, so the interval is as seeded as the
//! caller's generator. Categories are indices `0..k`; what they mean (a preference, a
//! detection) is the caller's. A κ that does not exist (chance agreement of 1: every rating
//! in one category, or no units) is NaN. This module knows no benchmark and reads no files.

use super::summary::percentile;

/// The two-sided 95% normal quantile, `Φ⁻¹(0.975)`.
pub const Z95: f64 = 1.959_963_984_540_054;

/// How an interval was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntervalMethod {
    /// κ ± 1.96·SE with the large-sample standard error (Fleiss, Cohen and Everitt 1969).
    Analytic,
    /// Percentile bootstrap over units (2.5th and 97.5th of the resampled κ).
    Bootstrap { resamples: usize },
}

/// A κ with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kappa {
    pub value: f64,
    pub low: f64,
    pub high: f64,
    /// Units rated.
    pub n: usize,
    /// Observed agreement (the share of agreeing pairs of ratings).
    pub observed: f64,
    /// Agreement expected by chance from the marginal distributions.
    pub expected: f64,
    /// The large-sample standard error (Cohen's κ only; NaN for a bootstrap interval).
    pub se: f64,
    pub method: IntervalMethod,
}

/// Two raters' ratings of the same units: `counts[a][b]` units rated `a` by the first and
/// `b` by the second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confusion {
    pub counts: Vec<Vec<u64>>,
}

impl Confusion {
    /// The `k × k` matrix of `pairs` (first rater's category, second's); a category outside
    /// `0..k` is a caller's bug and panics.
    pub fn from_pairs(k: usize, pairs: impl IntoIterator<Item = (usize, usize)>) -> Confusion {
        let mut counts = vec![vec![0u64; k]; k];
        for (a, b) in pairs {
            counts[a][b] += 1;
        }
        Confusion { counts }
    }

    /// Categories.
    pub fn k(&self) -> usize {
        self.counts.len()
    }

    /// Units.
    pub fn n(&self) -> u64 {
        self.counts.iter().flatten().sum()
    }

    /// Units on the diagonal.
    pub fn agreeing(&self) -> u64 {
        (0..self.k()).map(|i| self.counts[i][i]).sum()
    }

    /// Share of units both raters put in the same category (NaN for no units).
    pub fn percent_agreement(&self) -> f64 {
        self.agreeing() as f64 / self.n() as f64
    }

    /// Cohen's κ with its analytic 95% interval (see the module doc).
    pub fn cohen(&self) -> Kappa {
        let k = self.k();
        let n = self.n() as f64;
        let p: Vec<Vec<f64>> = self
            .counts
            .iter()
            .map(|row| row.iter().map(|&c| c as f64 / n).collect())
            .collect();
        let row: Vec<f64> = p.iter().map(|r| r.iter().sum()).collect();
        let col: Vec<f64> = (0..k).map(|j| p.iter().map(|r| r[j]).sum()).collect();
        let po: f64 = (0..k).map(|i| p[i][i]).sum();
        let pe: f64 = (0..k).map(|i| row[i] * col[i]).sum();
        let kappa = (po - pe) / (1.0 - pe);
        // Fleiss, Cohen and Everitt (1969), eq. (13): the variance of κ̂ when κ ≠ 0.
        let a: f64 = (0..k)
            .map(|i| p[i][i] * (1.0 - (row[i] + col[i]) * (1.0 - kappa)).powi(2))
            .sum();
        let b: f64 = (0..k)
            .flat_map(|i| (0..k).map(move |j| (i, j)))
            .filter(|(i, j)| i != j)
            .map(|(i, j)| p[i][j] * (col[i] + row[j]).powi(2))
            .sum::<f64>()
            * (1.0 - kappa).powi(2);
        let c = (kappa - pe * (1.0 - kappa)).powi(2);
        let var = (a + b - c) / (1.0 - pe).powi(2) / n;
        let se = if kappa.is_finite() {
            var.max(0.0).sqrt()
        } else {
            f64::NAN
        };
        Kappa {
            value: kappa,
            // `clamp` keeps a NaN (a κ that does not exist) NaN.
            low: (kappa - Z95 * se).clamp(-1.0, 1.0),
            high: (kappa + Z95 * se).clamp(-1.0, 1.0),
            n: self.n() as usize,
            observed: po,
            expected: pe,
            se,
            method: IntervalMethod::Analytic,
        }
    }
}

/// Per unit, how many raters put it in each of `k` categories (the table Fleiss' κ reads),
/// from each unit's ratings.
pub fn category_counts(k: usize, units: &[Vec<usize>]) -> Vec<Vec<u64>> {
    units
        .iter()
        .map(|ratings| {
            let mut row = vec![0u64; k];
            for &r in ratings {
                row[r] += 1;
            }
            row
        })
        .collect()
}

/// Fleiss' κ of a table of category counts per unit, each unit rated by the same number of
/// raters (at least two): (κ, observed agreement P̄, chance agreement P̄e). NaN when there
/// are no units or P̄e = 1. Panics when the units' rater counts differ (a caller's bug).
pub fn fleiss(counts: &[Vec<u64>]) -> (f64, f64, f64) {
    let Some(first) = counts.first() else {
        return (f64::NAN, f64::NAN, f64::NAN);
    };
    let m: u64 = first.iter().sum();
    assert!(m >= 2, "Fleiss' kappa needs at least two raters per unit");
    assert!(
        counts.iter().all(|r| r.iter().sum::<u64>() == m),
        "every unit needs the same number of raters"
    );
    let units = counts.len() as f64;
    let m = m as f64;
    let k = first.len();
    let p_cat: Vec<f64> = (0..k)
        .map(|j| counts.iter().map(|r| r[j] as f64).sum::<f64>() / (units * m))
        .collect();
    let p_bar = counts
        .iter()
        .map(|r| (r.iter().map(|&c| (c * c) as f64).sum::<f64>() - m) / (m * (m - 1.0)))
        .sum::<f64>()
        / units;
    let pe: f64 = p_cat.iter().map(|p| p * p).sum();
    ((p_bar - pe) / (1.0 - pe), p_bar, pe)
}

/// Fleiss' κ with a percentile bootstrap 95% interval over units: `resamples` resamples of
/// the units with replacement, each index drawn by `below(n)` (uniform in `0..n`, from the
/// caller's seeded generator). Resamples whose κ does not exist are left out; none left
/// gives a NaN interval.
pub fn fleiss_with_interval(
    counts: &[Vec<u64>],
    mut below: impl FnMut(usize) -> usize,
    resamples: usize,
) -> Kappa {
    let (value, observed, expected) = fleiss(counts);
    let mut stats = Vec::with_capacity(resamples);
    if !counts.is_empty() {
        let mut sample: Vec<Vec<u64>> = Vec::with_capacity(counts.len());
        for _ in 0..resamples {
            sample.clear();
            for _ in 0..counts.len() {
                sample.push(counts[below(counts.len())].clone());
            }
            let (s, _, _) = fleiss(&sample);
            if s.is_finite() {
                stats.push(s);
            }
        }
    }
    stats.sort_by(f64::total_cmp);
    let (low, high) = if stats.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        (percentile(&stats, 2.5), percentile(&stats, 97.5))
    };
    Kappa {
        value,
        low,
        high,
        n: counts.len(),
        observed,
        expected,
        se: f64::NAN,
        method: IntervalMethod::Bootstrap { resamples },
    }
}

/// Landis and Koch's (1977) words for a κ: `poor` below 0, `slight` to 0.20, `fair` to 0.40,
/// `moderate` to 0.60, `substantial` to 0.80, `almost perfect` above.
pub fn landis_koch(kappa: f64) -> &'static str {
    match kappa {
        k if k.is_nan() => "n/a",
        k if k < 0.0 => "poor",
        k if k <= 0.2 => "slight",
        k if k <= 0.4 => "fair",
        k if k <= 0.6 => "moderate",
        k if k <= 0.8 => "substantial",
        _ => "almost perfect",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// A small deterministic index source for the bootstrap tests (an LCG).
    fn lcg(seed: u64) -> impl FnMut(usize) -> usize {
        let mut s = seed;
        move |n| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % n as u64) as usize
        }
    }

    #[test]
    fn cohen_textbook_tables() {
        // Wikipedia's "Cohen's kappa" examples: 50 grant proposals read by two readers.
        // Yes/yes 20, yes/no 5, no/yes 10, no/no 15: p_o = 0.7, p_e = 0.5, κ = 0.4.
        let t = Confusion {
            counts: vec![vec![20, 5], vec![10, 15]],
        };
        let k = t.cohen();
        assert!(close(k.observed, 0.7, 1e-12) && close(k.expected, 0.5, 1e-12));
        assert!(close(k.value, 0.4, 1e-12), "{k:?}");
        // The same paper's two tables with equal agreement (60%) and different κ.
        let a = Confusion {
            counts: vec![vec![45, 15], vec![25, 15]],
        };
        let b = Confusion {
            counts: vec![vec![25, 35], vec![5, 35]],
        };
        assert!(close(a.cohen().value, 0.1304, 5e-5), "{:?}", a.cohen());
        assert!(close(b.cohen().value, 0.2593, 5e-5), "{:?}", b.cohen());
        assert_eq!(a.percent_agreement(), b.percent_agreement());
        // Standard errors and intervals as statsmodels' `cohens_kappa` prints them
        // (tests/reference/agreement_reference.py), including a 3 × 3 table.
        for (counts, want) in [
            (
                vec![vec![20, 5], vec![10, 15]],
                [0.4000, 0.1270, 0.1511, 0.6489],
            ),
            (
                vec![vec![45, 15], vec![25, 15]],
                [0.1304, 0.0987, -0.0629, 0.3238],
            ),
            (
                vec![vec![25, 35], vec![5, 35]],
                [0.2593, 0.0772, 0.1080, 0.4105],
            ),
            (
                vec![vec![106, 10, 4], vec![22, 28, 10], vec![2, 12, 6]],
                [0.4286, 0.0537, 0.3233, 0.5338],
            ),
        ] {
            let k = Confusion { counts }.cohen();
            let got = [k.value, k.se, k.low, k.high];
            for (g, w) in got.iter().zip(want) {
                assert!(close(*g, w, 5e-5), "{got:?} vs {want:?}");
            }
        }
    }

    /// Eight units, κ = 0.75 with SE 0.2264: the Wald interval [0.306, 1.194] (statsmodels'
    /// `cohens_kappa` gives it unclipped) ends at κ's largest value, 1.
    #[test]
    fn cohen_interval_stays_within_minus_one_and_one() {
        let k = Confusion {
            counts: vec![vec![3, 0], vec![1, 4]],
        }
        .cohen();
        assert!(close(k.value, 0.75, 1e-12), "{k:?}");
        assert!(close(k.low, 0.306_209_742, 1e-8), "{k:?}");
        assert!(k.value + Z95 * k.se > 1.19, "{k:?}");
        assert_eq!(k.high, 1.0);
        let low = Confusion {
            counts: vec![vec![0, 4], vec![3, 1]],
        }
        .cohen();
        assert!(
            low.low >= -1.0 && low.value - Z95 * low.se < -1.0,
            "{low:?}"
        );
        assert_eq!(low.low, -1.0);
    }

    #[test]
    fn perfect_and_chance_agreement() {
        let perfect = Confusion::from_pairs(3, [(0, 0), (1, 1), (2, 2), (1, 1)]);
        let k = perfect.cohen();
        assert_eq!((k.value, k.se, k.n), (1.0, 0.0, 4));
        // Every rating in one category: chance agreement 1, κ does not exist.
        let one = Confusion::from_pairs(2, [(0, 0), (0, 0)]);
        assert!(one.cohen().value.is_nan());
        assert!(Confusion::from_pairs(2, []).cohen().value.is_nan());
        // Independent marginals: κ = 0.
        let ind = Confusion {
            counts: vec![vec![25, 25], vec![25, 25]],
        };
        assert!(close(ind.cohen().value, 0.0, 1e-12));
        assert_eq!(landis_koch(0.4), "fair");
        assert_eq!(landis_koch(-0.1), "poor");
        assert_eq!(landis_koch(0.81), "almost perfect");
    }

    #[test]
    fn fleiss_1971_example() {
        // Wikipedia's "Fleiss' kappa" worked example: 10 subjects, 14 raters, 5 categories;
        // P̄ = 0.378, P̄e = 0.213, κ = 0.210.
        let t: Vec<Vec<u64>> = vec![
            vec![0, 0, 0, 0, 14],
            vec![0, 2, 6, 4, 2],
            vec![0, 0, 3, 5, 6],
            vec![0, 3, 9, 2, 0],
            vec![2, 2, 8, 1, 1],
            vec![7, 7, 0, 0, 0],
            vec![3, 2, 6, 3, 0],
            vec![2, 5, 3, 2, 2],
            vec![6, 5, 2, 1, 0],
            vec![0, 2, 2, 3, 7],
        ];
        let (k, p, pe) = fleiss(&t);
        assert!(close(p, 0.378, 5e-4) && close(pe, 0.213, 5e-4), "{p} {pe}");
        assert!(close(k, 0.210, 5e-4), "{k}");
        // statsmodels' fleiss_kappa on the same table: 0.2099.
        assert!(close(k, 0.2099, 5e-5), "{k}");
        let a = fleiss_with_interval(&t, lcg(1), 500);
        let b = fleiss_with_interval(&t, lcg(1), 500);
        assert_eq!((a.low, a.high), (b.low, b.high), "seeded");
        assert!(a.se.is_nan(), "no analytic SE for Fleiss' kappa");
        assert!(a.low < a.value && a.value < a.high, "{a:?}");
        assert_ne!(a.low, fleiss_with_interval(&t, lcg(2), 500).low);
        assert_eq!(a.method, IntervalMethod::Bootstrap { resamples: 500 });
    }

    #[test]
    fn fleiss_of_two_raters_is_scotts_pi() {
        // With two raters Fleiss' κ is Scott's π: chance agreement from the pooled marginals.
        let pairs = [(0, 0), (0, 1), (1, 1), (1, 1), (0, 0), (1, 0), (0, 0)];
        let units: Vec<Vec<usize>> = pairs.iter().map(|&(a, b)| vec![a, b]).collect();
        let (k, _, pe) = fleiss(&category_counts(2, &units));
        let c = Confusion::from_pairs(2, pairs);
        let po = c.percent_agreement();
        // Category 0: four of the first rater's seven ratings and four of the second's.
        let pooled0 = 8.0 / 14.0;
        let pe_scott = pooled0 * pooled0 + (1.0 - pooled0) * (1.0 - pooled0);
        assert!(close(pe, pe_scott, 1e-12), "{pe} {pe_scott}");
        assert!(close(k, (po - pe_scott) / (1.0 - pe_scott), 1e-12));
        assert!(fleiss(&[]).0.is_nan());
        assert!(fleiss(&[vec![3, 0], vec![3, 0]]).0.is_nan());
    }
}
