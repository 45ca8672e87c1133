//! Paired comparison of two candidates scored on the same items: the difference of a metric,
//! its paired bootstrap 95% interval, a paired test (sign-flip permutation; exact McNemar for
//! binary outcomes), Holm's adjustment across a family of comparisons, and how large a
//! difference the items can detect (80% power, two-sided α = 0.05) or how many items an
//! observed difference would need.
//!
//! A metric here is the mean over groups of each group's mean (FB-Bench's mean of per-task
//! means; a plain mean is one group), so the difference of two candidates' metrics over the
//! same items is the same statistic of the per-item differences: `Σ w_i d_i` with
//! `w_i = 1 / (G n_g)` for item `i` of group `g` (G non-empty groups, `n_g` items in `g`).
//!
//! Definitions, so that an independent script reproduces every number (see
//! `tests/reference/compare_reference.py`):
//! - Bootstrap: `resamples` times, `n` indices drawn with [`SplitMix64::below`] from one
//!   stream seeded with `seed`, the statistic recomputed on the resample (groups empty in it
//!   are skipped); the interval is the 2.5th and 97.5th linear-interpolated percentiles.
//! - Sign flip: over the non-zero terms `a_i = w_i d_i` only (zeros flip to themselves), the
//!   two-sided p is the share of sign patterns whose `|Σ ±a_i|` reaches `|Σ a_i|` (within
//!   1e-9 of `Σ |a_i|`, so that equal sums tie whatever the summation order). Every pattern
//!   when there are at most [`EXACT_MAX`] terms. Beyond, by default the pattern distribution's
//!   normal approximation (its mean 0 and variance `Σ a_i²` are exact):
//!   `p = erfc(|Σ a_i| / sqrt(2 Σ a_i²))` — precise in the tails, where a sampled p stops at
//!   `1 / (1 + permutations)` and Holm multiplies that floor; or, when asked, `permutations`
//!   random patterns, each `ceil(k / 64)` words from one stream seeded with `seed` (term `j`
//!   is `+` when bit `j % 64` of word `j / 64` is set), `p = (1 + hits) / (1 + permutations)`.
//! - McNemar: the exact two-sided binomial test of the discordant counts `b` and `c`
//!   (`min(1, 2 P[X ≤ min(b, c)])`, `X ~ Binomial(b + c, 1/2)`). It tests the plain mean, so
//!   it tests the metric only where every item weighs the same ([`Paired::equal_weights`]);
//!   with unequal groups the sign flip above is the stratified test of the metric itself
//!   (Cochran–Mantel–Haenszel would weigh each item equally as well, testing the pooled mean).
//! - Standard error: `sqrt(Σ_g s_g² / (G² n_g))`, `s_g²` the sample variance (n − 1) of the
//!   differences in group `g` (0 for a group of one); the smallest detectable difference is
//!   `(z_0.975 + z_0.8) · se`, and the items an observed difference `D` needs are
//!   `ceil(n · (mdd / |D|)²)` (the same mix of groups, the same variance).

use super::rng::SplitMix64;
use super::summary::percentile;

/// `z` with `P[Z > z] = 0.025`: two-sided α = 0.05.
pub const Z_ALPHA: f64 = 1.959_963_984_540_054;
/// `z` with `P[Z > z] = 0.2`: 80% power.
pub const Z_POWER: f64 = 0.841_621_233_572_914_3;
/// Default bootstrap resamples.
pub const RESAMPLES: usize = 1000;
/// Default random sign patterns of the sign-flip test beyond [`EXACT_MAX`] terms: none, the
/// normal approximation of the pattern distribution.
pub const PERMUTATIONS: usize = 0;
/// Up to this many non-zero differences, the sign-flip test enumerates every pattern.
pub const EXACT_MAX: usize = 20;

/// A seed for one named comparison: FNV-1a of `name`, xor `seed`. The same comparison keeps
/// its seed whatever else a report compares.
pub fn seed_for(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ seed
}

/// Per-item differences (A − B) and the group of each item.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    diffs: Vec<f64>,
    groups: Vec<usize>,
    /// Groups are `0..count`.
    count: usize,
}

/// A paired test's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Test {
    /// Two-sided p-value.
    pub p: f64,
    pub method: Method,
}

/// How a p-value was computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Every sign pattern enumerated, or McNemar's exact binomial test.
    Exact,
    /// The sign-flip distribution's normal approximation.
    Normal,
    /// This many random sign patterns.
    MonteCarlo(usize),
}

impl Paired {
    /// Differences with their groups (`groups[i]` is item `i`'s group, any small index).
    /// Panics when the two lengths differ.
    pub fn new(diffs: Vec<f64>, groups: Vec<usize>) -> Paired {
        assert_eq!(diffs.len(), groups.len(), "one group per difference");
        let count = groups.iter().max().map_or(0, |g| g + 1);
        Paired {
            diffs,
            groups,
            count,
        }
    }

    /// Differences of a plain mean (one group).
    pub fn ungrouped(diffs: Vec<f64>) -> Paired {
        let groups = vec![0; diffs.len()];
        Paired::new(diffs, groups)
    }

    pub fn n(&self) -> usize {
        self.diffs.len()
    }

    pub fn diffs(&self) -> &[f64] {
        &self.diffs
    }

    /// Items per group.
    fn sizes(&self) -> Vec<usize> {
        let mut ns = vec![0usize; self.count];
        for &g in &self.groups {
            ns[g] += 1;
        }
        ns
    }

    /// The statistic over the items `idx` (with repeats): mean over the groups present of
    /// each group's mean; NaN without items.
    fn stat_of(&self, idx: impl Iterator<Item = usize>, sums: &mut [f64], ns: &mut [usize]) -> f64 {
        sums.fill(0.0);
        ns.fill(0);
        for i in idx {
            sums[self.groups[i]] += self.diffs[i];
            ns[self.groups[i]] += 1;
        }
        let (mut total, mut present) = (0.0, 0usize);
        for (s, &n) in sums.iter().zip(ns.iter()) {
            if n > 0 {
                total += s / n as f64;
                present += 1;
            }
        }
        if present == 0 {
            f64::NAN
        } else {
            total / present as f64
        }
    }

    /// The difference of the two metrics: the grouped mean of the differences.
    pub fn mean(&self) -> f64 {
        let (mut sums, mut ns) = (vec![0.0; self.count], vec![0; self.count]);
        self.stat_of(0..self.n(), &mut sums, &mut ns)
    }

    /// Each item's weight in [`Paired::mean`]: `1 / (G n_g)`.
    pub fn weights(&self) -> Vec<f64> {
        let ns = self.sizes();
        let present = ns.iter().filter(|&&n| n > 0).count() as f64;
        self.groups
            .iter()
            .map(|&g| 1.0 / (present * ns[g] as f64))
            .collect()
    }

    /// Whether every item has the same weight in [`Paired::mean`] (one group, or groups of
    /// equal size), so that it is the plain mean of the differences.
    pub fn equal_weights(&self) -> bool {
        let ns = self.sizes();
        let mut present = ns.iter().filter(|&&n| n > 0);
        let first = present.next();
        present.all(|n| Some(n) == first)
    }

    /// The groups with items.
    pub fn strata(&self) -> usize {
        self.sizes().iter().filter(|&&n| n > 0).count()
    }

    /// The standard error of [`Paired::mean`] (see the module doc); NaN without items.
    pub fn standard_error(&self) -> f64 {
        let ns = self.sizes();
        let present = ns.iter().filter(|&&n| n > 0).count();
        if present == 0 {
            return f64::NAN;
        }
        let mut sums = vec![0.0; self.count];
        for (d, &g) in self.diffs.iter().zip(&self.groups) {
            sums[g] += d;
        }
        let means: Vec<f64> = sums
            .iter()
            .zip(&ns)
            .map(|(s, &n)| if n > 0 { s / n as f64 } else { 0.0 })
            .collect();
        let mut ss = vec![0.0; self.count];
        for (d, &g) in self.diffs.iter().zip(&self.groups) {
            ss[g] += (d - means[g]) * (d - means[g]);
        }
        let g2 = (present * present) as f64;
        let var: f64 = ss
            .iter()
            .zip(&ns)
            .filter(|(_, &n)| n > 1)
            .map(|(s, &n)| s / (n - 1) as f64 / (g2 * n as f64))
            .sum();
        var.sqrt()
    }

    /// Paired percentile bootstrap 95% interval of [`Paired::mean`]; NaN ends without items.
    pub fn bootstrap(&self, seed: u64, resamples: usize) -> (f64, f64) {
        let n = self.n();
        if n == 0 || resamples == 0 {
            let m = self.mean();
            return (m, m);
        }
        let mut rng = SplitMix64::new(seed);
        let (mut sums, mut ns) = (vec![0.0; self.count], vec![0; self.count]);
        let mut idx = vec![0usize; n];
        let mut stats = Vec::with_capacity(resamples);
        for _ in 0..resamples {
            for slot in idx.iter_mut() {
                *slot = rng.below(n);
            }
            let s = self.stat_of(idx.iter().copied(), &mut sums, &mut ns);
            if s.is_finite() {
                stats.push(s);
            }
        }
        if stats.is_empty() {
            return (f64::NAN, f64::NAN);
        }
        stats.sort_by(f64::total_cmp);
        (percentile(&stats, 2.5), percentile(&stats, 97.5))
    }

    /// The sign-flip permutation test of [`Paired::mean`] = 0 (see the module doc).
    pub fn sign_flip(&self, seed: u64, permutations: usize) -> Test {
        let terms: Vec<f64> = self
            .weights()
            .iter()
            .zip(&self.diffs)
            .map(|(w, d)| w * d)
            .filter(|a| *a != 0.0)
            .collect();
        let k = terms.len();
        let exact = |p| Test {
            p,
            method: Method::Exact,
        };
        if k == 0 {
            return exact(1.0);
        }
        let observed: f64 = terms.iter().sum::<f64>().abs();
        let bar = observed - 1e-9 * terms.iter().map(|a| a.abs()).sum::<f64>();
        let signed = |bit: &dyn Fn(usize) -> bool| -> f64 {
            let mut t = 0.0;
            for (j, a) in terms.iter().enumerate() {
                t += if bit(j) { *a } else { -*a };
            }
            t
        };
        if k <= EXACT_MAX {
            let total = 1u64 << k;
            let hits = (0..total)
                .filter(|&mask| signed(&|j| mask >> j & 1 == 1).abs() >= bar)
                .count();
            return exact(hits as f64 / total as f64);
        }
        if permutations == 0 {
            let var: f64 = terms.iter().map(|a| a * a).sum();
            return Test {
                p: erfc(observed / (2.0 * var).sqrt()).min(1.0),
                method: Method::Normal,
            };
        }
        let mut rng = SplitMix64::new(seed);
        let mut words = vec![0u64; k.div_ceil(64)];
        let mut hits = 0usize;
        for _ in 0..permutations {
            for w in words.iter_mut() {
                *w = rng.next_u64();
            }
            if signed(&|j| words[j / 64] >> (j % 64) & 1 == 1).abs() >= bar {
                hits += 1;
            }
        }
        Test {
            p: (1 + hits) as f64 / (1 + permutations) as f64,
            method: Method::MonteCarlo(permutations),
        }
    }
}

/// McNemar's exact test: `b` items where only A succeeds, `c` where only B does.
pub fn mcnemar_exact(b: u64, c: u64) -> Test {
    let n = b + c;
    let p = if n == 0 || b == c {
        1.0
    } else {
        let k = b.min(c);
        let ln_total = n as f64 * std::f64::consts::LN_2;
        // ln C(n, i) - n ln 2 for i = 0..=k, increasing (k < n / 2).
        let mut terms = Vec::with_capacity(k as usize + 1);
        let mut ln_c = 0.0;
        for i in 0..=k {
            terms.push(ln_c - ln_total);
            ln_c += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
        }
        let top = terms[terms.len() - 1];
        let tail = top.exp() * terms.iter().map(|t| (t - top).exp()).sum::<f64>();
        (2.0 * tail).min(1.0)
    };
    Test {
        p,
        method: Method::Exact,
    }
}

/// The complementary error function, to about 1e-15 relative: its Maclaurin series below 1.5,
/// else its continued fraction (modified Lentz).
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        return 2.0 - erfc(-x);
    }
    if x < 1.5 {
        // erf(x) = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, x2) = (x, x, x * x);
        for n in 1..200 {
            term *= -x2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        return 1.0 - sum * std::f64::consts::FRAC_2_SQRT_PI;
    }
    // erfc(x) = e^{-x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …))))
    let tiny = 1e-300;
    let mut f = x;
    let (mut c, mut d) = (x, 0.0);
    for k in 1..500 {
        let a = k as f64 / 2.0;
        d = x + a * d;
        d = if d.abs() < tiny { tiny } else { d };
        c = x + a / c;
        c = if c.abs() < tiny { tiny } else { c };
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x * x).exp() / (f * std::f64::consts::PI.sqrt())
}

/// Holm's step-down adjustment of `p` (a NaN p stays NaN and is not counted).
pub fn holm(p: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p.len()).filter(|&i| !p[i].is_nan()).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]).then(a.cmp(&b)));
    let m = order.len();
    let mut out = vec![f64::NAN; p.len()];
    let mut running = 0.0f64;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * p[i]).min(1.0));
        out[i] = running;
    }
    out
}

/// The smallest difference detectable with 80% power at two-sided α = 0.05, given the
/// standard error of the difference.
pub fn min_detectable(se: f64) -> f64 {
    (Z_ALPHA + Z_POWER) * se
}

/// Roughly how many items would detect `diff` with 80% power at two-sided α = 0.05, given
/// the standard error `se` observed on `n` items; None for a zero or unknown difference.
pub fn items_needed(n: usize, se: f64, diff: f64) -> Option<u64> {
    let need = n as f64 * (min_detectable(se) / diff).powi(2);
    (diff != 0.0 && need.is_finite()).then(|| need.ceil().max(1.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcnemar_exact_on_known_tables() {
        // b = 1, c = 9: 2 (C(10,0) + C(10,1)) / 2^10 = 22 / 1024.
        assert!((mcnemar_exact(1, 9).p - 22.0 / 1024.0).abs() < 1e-15);
        assert_eq!(mcnemar_exact(9, 1).p, mcnemar_exact(1, 9).p);
        // b = 0, c = 5: 2 / 32.
        assert!((mcnemar_exact(0, 5).p - 0.0625).abs() < 1e-15);
        assert_eq!(mcnemar_exact(4, 4).p, 1.0);
        assert_eq!(mcnemar_exact(0, 0).p, 1.0);
        // b = 3, c = 4: 2 P[X <= 3], X ~ Bin(7, 1/2) = 2 * 64 / 128 = 1.
        assert!((mcnemar_exact(3, 4).p - 1.0).abs() < 1e-12);
        // A large table, against scipy.stats.binomtest(40, 100).pvalue = 0.056887...
        assert!((mcnemar_exact(40, 60).p - 0.056_887_933_640_980_3).abs() < 1e-12);
    }

    #[test]
    fn sign_flip_enumerates_a_tiny_set_by_hand() {
        // ±1 ±2 ±0.5: the sums 3.5, 2.5, -0.5, -1.5, 1.5, 0.5, -2.5, -3.5; |sum| ≥ 2.5 in 4/8.
        let t = Paired::ungrouped(vec![1.0, 2.0, -0.5]).sign_flip(0, 10);
        assert_eq!(
            t,
            Test {
                p: 0.5,
                method: Method::Exact
            }
        );
        // Zeros do not count: 1, 1, 0 → patterns ±1±1: |2| in 2 of 4.
        assert_eq!(
            Paired::ungrouped(vec![1.0, 1.0, 0.0]).sign_flip(0, 10).p,
            0.5
        );
        // All equal and positive: only the two extreme patterns reach it.
        let t = Paired::ungrouped(vec![1.0; 10]).sign_flip(0, 10);
        assert_eq!(t.p, 2.0 / 1024.0);
        assert_eq!(Paired::ungrouped(vec![0.0; 3]).sign_flip(0, 10).p, 1.0);
    }

    #[test]
    fn sign_flip_draws_patterns_beyond_the_exact_limit() {
        let d: Vec<f64> = (0..40)
            .map(|i| if i % 4 == 0 { -1.0 } else { 1.0 })
            .collect();
        let a = Paired::ungrouped(d.clone()).sign_flip(3, 2000);
        assert_eq!(a.method, Method::MonteCarlo(2000));
        assert_eq!(a, Paired::ungrouped(d.clone()).sign_flip(3, 2000), "seeded");
        // 30 of 40 positive: binomial two-sided p = 0.00222; the draw lands near it.
        assert!(a.p > 0.0005 && a.p < 0.006, "{a:?}");
        // A balanced set is far from significant.
        let b: Vec<f64> = (0..40)
            .map(|i| if i % 2 == 0 { -1.0 } else { 1.0 })
            .collect();
        assert!(Paired::ungrouped(b).sign_flip(3, 2000).p > 0.9);
        // Without draws: the normal approximation, z = 20 / √40 (scipy: 2 norm.sf(z)).
        let n = Paired::ungrouped(d).sign_flip(3, 0);
        assert_eq!(n.method, Method::Normal);
        assert!((n.p - 0.001_565_402_258_002_548).abs() < 1e-15, "{n:?}");
    }

    #[test]
    fn erfc_matches_scipy() {
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122_186_953_5),
            (1.5, 0.033_894_853_524_689_27),
            (2.0, 0.004_677_734_981_047_266),
            (5.0, 1.537_459_794_428_034_7e-12),
        ] {
            let got = erfc(x);
            assert!(
                (got - want).abs() <= 1e-14 * want,
                "erfc({x}) = {got}, not {want}"
            );
        }
        assert!((erfc(-0.5) - (2.0 - 0.479_500_122_186_953_5)).abs() < 1e-15);
    }

    #[test]
    fn holm_on_a_textbook_example() {
        // Sorted 0.005, 0.01, 0.03, 0.04 → 4·0.005, 3·0.01, 2·0.03, max(1·0.04, 0.06).
        let adj = holm(&[0.01, 0.04, 0.03, 0.005]);
        let want = [0.03, 0.06, 0.06, 0.02];
        for (a, w) in adj.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{adj:?}");
        }
        assert_eq!(holm(&[0.5, 0.9]), [1.0, 1.0]);
        let with_nan = holm(&[f64::NAN, 0.02]);
        assert!(with_nan[0].is_nan() && with_nan[1] == 0.02);
    }

    #[test]
    fn grouped_mean_is_the_difference_of_means_of_group_means() {
        // Group 0: 1, 3 (mean 2); group 1: 10 (mean 10) → (2 + 10) / 2 = 6, not 14 / 3.
        let p = Paired::new(vec![1.0, 10.0, 3.0], vec![0, 1, 0]);
        assert_eq!(p.mean(), 6.0);
        assert_eq!(p.weights(), [0.25, 0.5, 0.25]);
        assert!(!p.equal_weights());
        assert_eq!(p.strata(), 2);
        assert!(Paired::new(vec![1.0, 2.0, 3.0, 4.0], vec![1, 0, 0, 1]).equal_weights());
        assert!(Paired::ungrouped(vec![]).equal_weights());
        // se² = (s0² / n0 + s1² / n1) / 4 with s0² = 2, group 1 of one item → 0.
        assert!((p.standard_error() - (2.0f64 / 2.0 / 4.0).sqrt()).abs() < 1e-15);
        let plain = Paired::ungrouped(vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(plain.mean(), 2.5);
        // s = sqrt(5/3), se = s / 2.
        assert!((plain.standard_error() - (5.0f64 / 3.0).sqrt() / 2.0).abs() < 1e-15);
    }

    #[test]
    fn bootstrap_is_seeded_and_brackets_the_difference() {
        let d: Vec<f64> = (0..200).map(|i| (i % 7) as f64 - 2.0).collect();
        let g: Vec<usize> = (0..200).map(|i| i % 3).collect();
        let p = Paired::new(d, g);
        let a = p.bootstrap(11, 500);
        assert_eq!(a, p.bootstrap(11, 500));
        assert_ne!(a, p.bootstrap(12, 500));
        assert!(a.0 < p.mean() && p.mean() < a.1, "{a:?}");
        // Roughly ± 1.96 se.
        let half = (a.1 - a.0) / 2.0;
        let se = p.standard_error();
        assert!(half > 1.5 * se && half < 2.5 * se, "{half} {se}");
        let empty = Paired::ungrouped(vec![]);
        assert!(empty.bootstrap(1, 10).0.is_nan());
        assert!(empty.standard_error().is_nan());
    }

    #[test]
    fn detectable_differences_and_items_needed() {
        let se = 1.0;
        assert!((min_detectable(se) - 2.801_585_218_112_968).abs() < 1e-12);
        // Half the detectable difference needs four times the items.
        assert_eq!(items_needed(100, se, min_detectable(se) / 2.0), Some(400));
        assert_eq!(items_needed(100, se, 0.0), None);
        assert_eq!(items_needed(100, f64::NAN, 1.0), None);
    }

    #[test]
    fn seeds_per_comparison() {
        // FNV-1a of "a" is 0xaf63dc4c8601ec8c.
        assert_eq!(seed_for(0, "a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(seed_for(1, "a"), 0xaf63_dc4c_8601_ec8d);
    }
}
