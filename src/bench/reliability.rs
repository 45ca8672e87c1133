//! How far a judge can be trusted, as report tables: Cohen's κ between two raters (a judge
//! and the human labels, two judges, a judge in its two orders, two annotators), Fleiss' κ
//! among several, and the confusion matrix behind a κ. The statistics are
//! [`crate::stats::agreement`]'s; this module pairs up ratings, leaves out the units a rater
//! did not rate (an unscored verdict), counts them, and lays the numbers out as [`Table`]s.
//! Which raters to compare is each protocol's business.
//!
//! Intervals: Cohen's κ with the analytic large-sample standard error (Wald 95%); Fleiss' κ
//! with a seeded percentile bootstrap over units ([`crate::bench::stats::RESAMPLES`]
//! resamples).

use crate::bench::stats::RESAMPLES;
use crate::bench::table::{Cell, Table};
use crate::stats::agreement::{self, Confusion, IntervalMethod, Kappa};
use crate::stats::rng::SplitMix64;

/// The columns of a [`kappa_table`] naming the raters of a row and holding its κ.
pub const RATERS_COLUMN: &str = "raters";
pub const KAPPA_COLUMN: &str = "kappa";

/// Decimals of a κ in tables.
pub const KAPPA_DECIMALS: u8 = 3;

/// One rater's category (`0..k`) per unit; `None` where it gave no usable rating.
pub type Ratings = [Option<usize>];

/// A κ between named raters, with the units left out because a rating was missing.
#[derive(Debug, Clone, PartialEq)]
pub struct KappaRow {
    pub raters: String,
    pub kappa: Kappa,
    /// Units some rater did not rate (left out of κ, counted).
    pub unscored: usize,
}

/// Cohen's κ of two raters over the units both rated, and their confusion matrix (rows
/// `a`'s categories, columns `b`'s). Panics when the two slices differ in length or a
/// category is outside `0..k` (a caller's bug).
pub fn cohen(raters: &str, a: &Ratings, b: &Ratings, k: usize) -> (KappaRow, Confusion) {
    assert_eq!(a.len(), b.len(), "ratings of different units");
    let pairs: Vec<(usize, usize)> = a
        .iter()
        .zip(b)
        .filter_map(|(x, y)| Some(((*x)?, (*y)?)))
        .collect();
    let unscored = a.len() - pairs.len();
    let confusion = Confusion::from_pairs(k, pairs);
    let row = KappaRow {
        raters: raters.to_string(),
        kappa: confusion.cohen(),
        unscored,
    };
    (row, confusion)
}

/// Fleiss' κ of several raters (`raters[r][unit]`) over the units every rater rated, with a
/// bootstrap interval seeded by `seed`.
pub fn fleiss(name: &str, raters: &[&Ratings], k: usize, seed: u64) -> KappaRow {
    let units = raters.first().map_or(0, |r| r.len());
    assert!(
        raters.iter().all(|r| r.len() == units),
        "ratings of different units"
    );
    let complete: Vec<Vec<usize>> = (0..units)
        .filter_map(|u| raters.iter().map(|r| r[u]).collect::<Option<Vec<_>>>())
        .collect();
    let counts = agreement::category_counts(k, &complete);
    let mut rng = SplitMix64::new(seed);
    KappaRow {
        raters: name.to_string(),
        kappa: agreement::fleiss_with_interval(&counts, |n| rng.below(n), RESAMPLES),
        unscored: units - complete.len(),
    }
}

/// A κ table: per row the raters, κ with its 95% interval, how the interval was made,
/// observed agreement (%), Landis and Koch's word, the units rated and those left out.
pub fn kappa_table(id: &str, title: &str, rows: &[KappaRow]) -> Table {
    Table {
        id: id.to_string(),
        title: title.to_string(),
        columns: [
            RATERS_COLUMN,
            KAPPA_COLUMN,
            "interval",
            "agreement (%)",
            "strength",
            "n",
            "unscored",
        ]
        .map(String::from)
        .to_vec(),
        rows: rows
            .iter()
            .map(|r| {
                let k = r.kappa;
                vec![
                    Cell::from(r.raters.as_str()),
                    Cell::Interval {
                        value: k.value,
                        low: k.low,
                        high: k.high,
                        decimals: KAPPA_DECIMALS,
                    },
                    Cell::Text(method(&k)),
                    Cell::num(100.0 * k.observed, 2),
                    Cell::from(agreement::landis_koch(k.value)),
                    Cell::from(k.n),
                    Cell::from(r.unscored),
                ]
            })
            .collect(),
    }
}

fn method(k: &Kappa) -> String {
    match k.method {
        IntervalMethod::Analytic => format!("analytic, SE {:.3}", k.se),
        IntervalMethod::Bootstrap { resamples } => format!("bootstrap, {resamples} resamples"),
    }
}

/// A confusion matrix as a table: one row per category of the row rater (`rows`), one
/// column per category of the column rater (`columns`), counts in the cells, and totals.
pub fn confusion_table(
    id: &str,
    title: &str,
    (rows, columns): (&str, &str),
    categories: &[&str],
    confusion: &Confusion,
) -> Table {
    let k = categories.len();
    assert_eq!(confusion.k(), k, "one name per category");
    let mut header = vec![format!("{rows} \\ {columns}")];
    header.extend(categories.iter().map(|c| c.to_string()));
    header.push("total".to_string());
    let count = |c: u64| Cell::Int(i64::try_from(c).unwrap_or(i64::MAX));
    let mut body: Vec<Vec<Cell>> = (0..k)
        .map(|i| {
            let mut row = vec![Cell::from(categories[i])];
            row.extend(confusion.counts[i].iter().map(|&c| count(c)));
            row.push(count(confusion.counts[i].iter().sum()));
            row
        })
        .collect();
    let mut total = vec![Cell::from("total")];
    total.extend((0..k).map(|j| count(confusion.counts.iter().map(|r| r[j]).sum())));
    total.push(count(confusion.n()));
    body.push(total);
    Table {
        id: id.to_string(),
        title: title.to_string(),
        columns: header,
        rows: body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::table::texts;

    #[test]
    fn unrated_units_are_left_out_and_counted() {
        let a = [Some(0), Some(1), None, Some(1), Some(0)];
        let b = [Some(0), Some(1), Some(1), Some(0), None];
        let (row, c) = cohen("a vs b", &a, &b, 2);
        assert_eq!((row.kappa.n, row.unscored), (3, 2));
        assert_eq!(c.counts, vec![vec![1, 0], vec![1, 1]]);
        let t = kappa_table("k", "K", &[row]);
        let cells = texts(&t.rows[0]);
        assert_eq!(cells[0], "a vs b");
        assert!(cells[2].starts_with("analytic, SE "), "{cells:?}");
        // κ = (2/3 − 4/9) / (1 − 4/9) = 0.4.
        assert!(cells[1].starts_with("0.400 ["), "{cells:?}");
        assert_eq!(&cells[3..], ["66.67", "fair", "3", "2"]);
        let t = confusion_table("c", "C", ("judge", "label"), &["A", "B"], &c);
        assert_eq!(t.columns, ["judge \\ label", "A", "B", "total"]);
        assert_eq!(texts(&t.rows[1]), ["B", "1", "1", "2"]);
        assert_eq!(texts(&t.rows[2]), ["total", "2", "1", "3"]);
    }

    #[test]
    fn fleiss_uses_units_every_rater_rated_and_is_seeded() {
        let r1 = [Some(0), Some(1), Some(1), None, Some(0), Some(1)];
        let r2 = [Some(0), Some(1), Some(0), Some(1), Some(0), Some(1)];
        let r3 = [Some(0), Some(1), Some(1), Some(1), Some(1), Some(1)];
        let row = fleiss("three", &[&r1, &r2, &r3], 2, 3);
        assert_eq!((row.kappa.n, row.unscored), (5, 1));
        let again = fleiss("three", &[&r1, &r2, &r3], 2, 3);
        assert_eq!(
            (row.kappa.low, row.kappa.high),
            (again.kappa.low, again.kappa.high)
        );
        let t = kappa_table("k", "K", &[row]);
        assert_eq!(texts(&t.rows[0])[2], "bootstrap, 1000 resamples");
    }
}
