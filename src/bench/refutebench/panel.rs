//! RefuteBench's FA judged by a panel: beside the panel's metrics (from
//! [`super::score`], whose [`Judges::Panel`] states the tie rule), every judge's own FA
//! metrics as `judge/<j>/<metric>` (RR is rule-checked, the same for every judge, and not
//! repeated), a table of the panel's and each judge's FA per group and setting, and the
//! judges' agreement over the feedback turns they judged (Yes/No: Cohen's κ per pair,
//! Fleiss' κ for three or more).

use super::data::Item;
use super::score::{score_with, FaRecord, Judges, ScoreOptions};
use crate::bench::panel::Panel;
use crate::bench::plan::Transcript;
use crate::bench::reliability::{self, KappaRow};
use crate::bench::table::{table_id, Cell, Table};
use crate::bench::BenchResults;
use crate::judge::feedback_acceptance::Acceptance;
use crate::judge::Verdict;

/// Adds every judge's FA metrics, the judges table and the judges' κ to a panel run's
/// `results` (the panel's). `judges` names them (judge 0 first); `candidates` marks the
/// self-judging ones.
pub fn add_judges(
    results: &mut BenchResults,
    pairs: &[(&Item, &Transcript)],
    opts: &ScoreOptions,
    (judges, candidates): (&[&str], &[String]),
) {
    let panel = opts.panel;
    let fa = |name: &str| name.ends_with("_fa");
    let mut rows: Vec<Vec<Cell>> = results
        .metrics
        .iter()
        .filter(|m| fa(&m.name))
        .map(|m| row(&format!("panel ({})", panel.rule.as_str()), m))
        .collect();
    for j in 0..panel.judges {
        let own = score_with(pairs, opts, Judges::One(j)).results;
        let label = crate::bench::protocol::judge_label(
            j,
            judges.get(j).copied().unwrap_or("?"),
            candidates,
        );
        for m in own.metrics.into_iter().filter(|m| fa(&m.name)) {
            rows.push(row(&label, &m));
            results.metrics.push(crate::bench::stats::Metric {
                name: format!("judge/{j}/{}", m.name),
                ..m
            });
        }
    }
    results.tables.push(Table {
        id: table_id::PANEL_JUDGES.to_string(),
        title: "Feedback acceptance (FA, %) of the panel and of each judge".to_string(),
        columns: ["judge", "metric", "FA", "n", "unscored"]
            .map(String::from)
            .to_vec(),
        rows,
    });
    results
        .tables
        .push(agreement_table(pairs, opts, panel, judges));
}

fn row(judge: &str, m: &crate::bench::stats::Metric) -> Vec<Cell> {
    let i = m.interval;
    vec![
        Cell::from(judge),
        Cell::from(m.name.as_str()),
        Cell::Interval {
            value: if m.n == 0 { f64::NAN } else { i.value },
            low: i.low,
            high: i.high,
            decimals: 2,
        },
        Cell::from(m.n),
        Cell::from(m.unscored),
    ]
}

/// κ between the judges over every feedback turn of the scored dialogues (accepted = 1).
fn agreement_table(
    pairs: &[(&Item, &Transcript)],
    opts: &ScoreOptions,
    panel: Panel,
    judges: &[&str],
) -> Table {
    let items = score_with(pairs, opts, Judges::Panel(panel)).items;
    let m = panel.judges;
    let mut ratings: Vec<Vec<Option<usize>>> = vec![Vec::new(); m];
    for r in items.iter().flat_map(|s| &s.fa) {
        for (j, out) in ratings.iter_mut().enumerate() {
            out.push(rating(r, j));
        }
    }
    let name = |j: usize| format!("judge {j} ({})", judges.get(j).copied().unwrap_or("?"));
    let mut rows: Vec<KappaRow> = Vec::new();
    for a in 0..m {
        for b in a + 1..m {
            let raters = format!("{} vs {}", name(a), name(b));
            rows.push(reliability::cohen(&raters, &ratings[a], &ratings[b], 2).0);
        }
    }
    if m > 2 {
        let all: Vec<&[Option<usize>]> = ratings.iter().map(Vec::as_slice).collect();
        let seed = opts.bootstrap_seed;
        rows.push(reliability::fleiss(
            &format!("all {m} judges (Fleiss)"),
            &all,
            2,
            seed,
        ));
    }
    reliability::kappa_table(
        table_id::JUDGE_KAPPA,
        "Agreement between the FA judges on the feedback turns (Yes/No)",
        &rows,
    )
}

/// Judge `j`'s reading of a feedback turn: 1 accepted, 0 rejected, `None` when it did not
/// run or could not be read.
fn rating(r: &FaRecord, j: usize) -> Option<usize> {
    match r.judges.get(j)? {
        Some(Verdict::Scored(a)) => Some(usize::from(*a == Acceptance::Accepted)),
        _ => None,
    }
}
