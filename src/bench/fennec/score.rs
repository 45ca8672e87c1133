//! Fennec's metrics: Auto-J's Agreement and Consistency for pairwise judges, Accuracy for
//! single-response judges, and the merging of Fennec's branch scores into a preference.
//!
//! Definitions as in Auto-J's `codes/leaderboard/pairwise_eval.py` (GAIR-NLP/auto-j @ 2ae17a3),
//! which Fennec's Table 2 uses: a pairwise judge is asked twice, the second time with the
//! responses swapped; both verdicts are put in the item's own order. **Agreement** is the share
//! of items where *both* verdicts equal the human label (ties included); **Consistency** is the
//! share where the two verdicts are equal. For a single-response judge (or one order only)
//! **Accuracy** is the share of items whose verdict equals the label. An item whose verdict is
//! missing or unparseable is left out of these shares and counted as unscored (the authors'
//! scripts assume every verdict is present). Results carry seeded bootstrap 95% intervals and
//! a table per Auto-J scenario group. This module reads no files.

use std::collections::BTreeMap;

use crate::bench::item_scores::{ItemValue, LeftOut, MetricItems};
use crate::bench::reliability::{self, KappaRow};
use crate::bench::stats::bootstrap_mean;
use crate::bench::stats::Metric;
use crate::bench::table::{table_id, Cell, Table};
use crate::bench::BenchResults;
use crate::judge::fennec::PairScores;
use crate::judge::Verdict;

use super::data::{PairItem, Preference};
use super::Error;

/// Auto-J's scenario groups (`utils_constants.py`), in its order.
pub const SCENARIO_GROUPS: [(&str, &[&str]); 8] = [
    (
        "Summarization",
        &[
            "post_summarization",
            "text_summarization",
            "note_summarization",
        ],
    ),
    (
        "Exam Questions",
        &[
            "math_reasoning",
            "solving_exam_question_with_math",
            "solving_exam_question_without_math",
        ],
    ),
    (
        "Code",
        &[
            "code_simplification",
            "code_generation",
            "explaining_code",
            "code_correction_rewriting",
            "code_to_code_translation",
        ],
    ),
    (
        "Rewriting",
        &[
            "text_simplification",
            "language_polishing",
            "instructional_rewriting",
            "text_correction",
            "paraphrasing",
        ],
    ),
    (
        "Creative Writing",
        &[
            "writing_song_lyrics",
            "writing_social_media_post",
            "writing_blog_post",
            "writing_personal_essay",
            "creative_writing",
            "writing_advertisement",
            "writing_marketing_materials",
            "writing_presentation_script",
            "counterfactual",
        ],
    ),
    (
        "Functional Writing",
        &[
            "writing_product_description",
            "writing_job_application",
            "writing_news_article",
            "writing_biography",
            "writing_email",
            "writing_legal_document",
            "writing_technical_document",
            "writing_scientific_paper",
            "functional_writing",
            "writing_cooking_recipe",
        ],
    ),
    (
        "General Communication",
        &[
            "asking_how_to_question",
            "open_question",
            "analyzing_general",
            "explaining_general",
            "seeking_advice",
            "recommendation",
            "value_judgement",
            "verifying_fact",
            "chitchat",
            "roleplay",
            "planning",
            "brainstorming",
        ],
    ),
    (
        "NLP Tasks",
        &[
            "ranking",
            "text_to_text_translation",
            "data_analysis",
            "classification_identification",
            "title_generation",
            "question_generation",
            "reading_comprehension",
            "keywords_extraction",
            "information_extraction",
            "topic_modeling",
            "others",
        ],
    ),
];

/// Auto-J's group of a scenario (`None` for categories outside its list, e.g. PandaLM's).
pub fn scenario_group(scenario: &str) -> Option<&'static str> {
    SCENARIO_GROUPS
        .iter()
        .find(|(_, members)| members.contains(&scenario))
        .map(|(g, _)| *g)
}

/// A pairwise judge's two verdicts on one item, both in the item's own order.
#[derive(Debug, Clone, PartialEq)]
pub struct PairOutcome {
    /// The human label; `None` (a user's unlabelled pair) leaves the item out of Agreement.
    pub label: Option<Preference>,
    pub category: String,
    pub normal: Verdict<Preference>,
    pub exchanged: Verdict<Preference>,
}

/// A single verdict on one item (single-response judge, or one order only).
#[derive(Debug, Clone, PartialEq)]
pub struct SingleOutcome {
    /// The human label; `None` leaves the item out of Accuracy.
    pub label: Option<Preference>,
    pub category: String,
    pub verdict: Verdict<Preference>,
}

fn as_verdict(v: Option<Preference>) -> Verdict<Preference> {
    match v {
        Some(p) => Verdict::Scored(p),
        None => Verdict::unscored("no verdict in the file"),
    }
}

fn check_count(path: &std::path::Path, found: usize, expected: usize) -> Result<(), Error> {
    if found == expected {
        Ok(())
    } else {
        Err(Error::Count {
            path: path.to_path_buf(),
            found,
            expected,
        })
    }
}

/// Pairs items with verdict files: `normal` in the items' order, `exchanged` given on the
/// swapped items in Auto-J's format (so its verdicts are swapped back here).
pub fn pair_outcomes(
    items: &[PairItem],
    normal: (&std::path::Path, Vec<Option<Preference>>),
    exchanged: (&std::path::Path, Vec<Option<Preference>>),
) -> Result<Vec<PairOutcome>, Error> {
    check_count(normal.0, normal.1.len(), items.len())?;
    check_count(exchanged.0, exchanged.1.len(), items.len())?;
    Ok(items
        .iter()
        .zip(normal.1)
        .zip(exchanged.1)
        .map(|((item, n), e)| PairOutcome {
            label: item.label,
            category: item.category.clone(),
            normal: as_verdict(n),
            exchanged: as_verdict(e.map(Preference::swapped)),
        })
        .collect())
}

/// Pairs items with one verdict file in the items' order.
pub fn single_outcomes(
    items: &[PairItem],
    verdicts: (&std::path::Path, Vec<Option<Preference>>),
) -> Result<Vec<SingleOutcome>, Error> {
    check_count(verdicts.0, verdicts.1.len(), items.len())?;
    Ok(items
        .iter()
        .zip(verdicts.1)
        .map(|(item, v)| SingleOutcome {
            label: item.label,
            category: item.category.clone(),
            verdict: as_verdict(v),
        })
        .collect())
}

/// (agreement indicator, consistency indicator) of a fully scored outcome; the agreement
/// indicator is NaN when the item has no label (it counts for Consistency only).
fn pair_indicators(o: &PairOutcome) -> Option<(f64, f64)> {
    let (n, e) = (o.normal.scored()?, o.exchanged.scored()?);
    let agree = match o.label {
        Some(label) => f64::from(u8::from(*n == label && *e == label)),
        None => f64::NAN,
    };
    Some((agree, f64::from(u8::from(n == e))))
}

/// Position bias: per scored pair, 1 when the judge preferred whichever response it was
/// shown first in both orders (A in the normal order, B — shown first — when exchanged), else 0.
/// An unbiased judge is near 0; a judge that always picks the first response is at 1 on every
/// pair whose responses differ.
fn first_position(outcomes: &[PairOutcome]) -> Vec<f64> {
    outcomes.iter().filter_map(first_shown).collect()
}

/// One pair's first-position indicator (see [`first_position`]); `None` unless both verdicts
/// were read.
fn first_shown(o: &PairOutcome) -> Option<f64> {
    let (n, e) = (o.normal.scored()?, o.exchanged.scored()?);
    Some(f64::from(u8::from(
        *n == Preference::A && *e == Preference::B,
    )))
}

fn single_indicator(o: &SingleOutcome) -> Option<f64> {
    let label = o.label?;
    o.verdict.scored().map(|v| f64::from(u8::from(*v == label)))
}

fn metric(name: &str, values: &[f64], unscored: usize, seed: u64) -> Metric {
    Metric {
        name: name.to_string(),
        interval: bootstrap_mean(values, seed),
        n: values.len(),
        unscored,
    }
}

/// Rows per Auto-J group (when categories map to groups), then `Overall`.
fn group_rows<T>(
    outcomes: &[T],
    category: impl Fn(&T) -> &str,
    cells: impl Fn(&[&T]) -> Vec<Cell>,
) -> Vec<Vec<Cell>> {
    let mut groups: BTreeMap<usize, Vec<&T>> = BTreeMap::new();
    for o in outcomes {
        if let Some(g) = SCENARIO_GROUPS
            .iter()
            .position(|(_, members)| members.contains(&category(o)))
        {
            groups.entry(g).or_default().push(o);
        }
    }
    let mut rows: Vec<Vec<Cell>> = groups
        .iter()
        .map(|(g, members)| {
            let mut row = vec![Cell::from(SCENARIO_GROUPS[*g].0)];
            row.extend(cells(members));
            row
        })
        .collect();
    let all: Vec<&T> = outcomes.iter().collect();
    let mut overall = vec![Cell::from("Overall")];
    overall.extend(cells(&all));
    rows.push(overall);
    rows
}

/// The number of decimals of a percentage, as Auto-J prints them.
pub const PERCENT_DECIMALS: u8 = 2;

/// A share as a percentage cell, with Auto-J's two decimals.
pub fn percent(v: f64) -> Cell {
    Cell::num(100.0 * v, PERCENT_DECIMALS)
}

/// Agreement and Consistency of a pairwise judge, with bootstrap intervals (`seed`), and a
/// table per Auto-J group.
pub fn pairwise_results(outcomes: &[PairOutcome], seed: u64) -> BenchResults {
    let scored: Vec<(f64, f64)> = outcomes.iter().filter_map(pair_indicators).collect();
    let unscored = outcomes.len() - scored.len();
    // Unlabelled items (NaN) count for Consistency only; with no label at all Agreement is
    // n/a (null).
    let agreement: Vec<f64> = scored.iter().map(|s| s.0).filter(|a| !a.is_nan()).collect();
    let consistency: Vec<f64> = scored.iter().map(|s| s.1).collect();
    let cells = |members: &[&PairOutcome]| {
        let s: Vec<(f64, f64)> = members.iter().filter_map(|o| pair_indicators(o)).collect();
        let mean = |f: fn(&(f64, f64)) -> f64| {
            crate::stats::summary::mean(
                &s.iter().map(f).filter(|x| !x.is_nan()).collect::<Vec<_>>(),
            )
        };
        vec![
            percent(mean(|x| x.0)),
            percent(mean(|x| x.1)),
            Cell::from(s.len()),
            Cell::from(members.len() - s.len()),
        ]
    };
    BenchResults {
        metrics: vec![
            metric("agreement", &agreement, unscored, seed),
            metric("consistency", &consistency, unscored, seed),
            metric(
                "first_position_preference",
                &first_position(outcomes),
                unscored,
                seed,
            ),
        ],
        tables: [Table {
            id: table_id::FENNEC_PAIRWISE.to_string(),
            title: "Pairwise agreement with human labels (both orders) and consistency (%)"
                .to_string(),
            columns: ["group", "agreement", "consistency", "n", "unscored"]
                .map(String::from)
                .to_vec(),
            rows: group_rows(outcomes, |o| o.category.as_str(), cells),
        }]
        .into_iter()
        .chain(reliability_tables(outcomes, seed))
        .collect(),
    }
}

/// The categories of a preference in κ tables and confusion matrices, in index order.
pub const PREFERENCE_NAMES: [&str; 3] = ["A", "B", "tie"];

/// A preference's index in [`PREFERENCE_NAMES`].
pub fn preference_index(p: Preference) -> usize {
    match p {
        Preference::A => 0,
        Preference::B => 1,
        Preference::Tie => 2,
    }
}

/// The judge's reliability: Cohen's κ of each order's verdicts against the human labels
/// (when there are labels) and of the two orders against each other, the confusion matrices
/// against the labels, and the position table ([`position_table`]).
pub fn reliability_tables(outcomes: &[PairOutcome], seed: u64) -> Vec<Table> {
    let index = |v: &Verdict<Preference>| v.scored().map(|p| preference_index(*p));
    let label: Vec<Option<usize>> = outcomes
        .iter()
        .map(|o| o.label.map(preference_index))
        .collect();
    let normal: Vec<Option<usize>> = outcomes.iter().map(|o| index(&o.normal)).collect();
    let exchanged: Vec<Option<usize>> = outcomes.iter().map(|o| index(&o.exchanged)).collect();
    let mut rows = Vec::new();
    let mut confusions = Vec::new();
    if label.iter().any(Option::is_some) {
        for (name, verdicts, id) in [
            ("order shown", &normal, "confusion_normal"),
            ("swapped order, put back", &exchanged, "confusion_exchanged"),
        ] {
            let (row, c) = reliability::cohen(
                &format!("judge ({name}) vs human label"),
                verdicts,
                &label,
                3,
            );
            rows.push(row);
            confusions.push(reliability::confusion_table(
                id,
                &format!("Confusion matrix: judge ({name}) × human label"),
                ("judge", "label"),
                &PREFERENCE_NAMES,
                &c,
            ));
        }
    }
    let (row, _) = reliability::cohen(
        "judge: order shown vs swapped order",
        &normal,
        &exchanged,
        3,
    );
    rows.push(row);
    let mut tables = vec![reliability::kappa_table(
        table_id::JUDGE_KAPPA,
        "Judge reliability: Cohen's κ against the human labels and between the two orders",
        &rows,
    )];
    tables.extend(confusions);
    tables.push(position_table(outcomes, seed));
    tables
}

/// Position bias and consistency over the pairs with both verdicts, each share with a
/// seeded bootstrap 95% interval: the same verdict in both orders; the response shown first
/// preferred in both (A, then B put back: first-position bias); the one shown second
/// preferred in both; and the other inconsistent pairs (a tie in one order only).
pub fn position_table(outcomes: &[PairOutcome], seed: u64) -> Table {
    use Preference::{A, B};
    let both: Vec<(Preference, Preference)> = outcomes
        .iter()
        .filter_map(|o| Some((*o.normal.scored()?, *o.exchanged.scored()?)))
        .collect();
    let unscored = outcomes.len() - both.len();
    type Kind = (&'static str, fn(Preference, Preference) -> bool);
    let kinds: [Kind; 4] = [
        ("same verdict in both orders (consistency)", |n, e| n == e),
        ("first shown preferred in both orders", |n, e| {
            n == A && e == B
        }),
        ("second shown preferred in both orders", |n, e| {
            n == B && e == A
        }),
        ("other inconsistent (a tie in one order)", |n, e| {
            n != e && !(n == A && e == B) && !(n == B && e == A)
        }),
    ];
    let rows = kinds
        .iter()
        .map(|(name, test)| {
            let v: Vec<f64> = both
                .iter()
                .map(|&(n, e)| f64::from(u8::from(test(n, e))))
                .collect();
            let i = bootstrap_mean(&v, seed);
            vec![
                Cell::from(*name),
                Cell::Interval {
                    value: 100.0 * i.value,
                    low: 100.0 * i.low,
                    high: 100.0 * i.high,
                    decimals: PERCENT_DECIMALS,
                },
                Cell::from(both.len()),
                Cell::from(unscored),
            ]
        })
        .collect();
    Table {
        id: table_id::POSITION_BIAS.to_string(),
        title: "Position bias and consistency across the two orders (% of pairs)".to_string(),
        columns: ["outcome", "share (%)", "n", "unscored"]
            .map(String::from)
            .to_vec(),
        rows,
    }
}

/// The human ceiling where the items carry several annotators' labels (PandaLM's three):
/// Cohen's κ of every pair of annotators and Fleiss' κ of all of them. `None` when the
/// items have no such labels.
pub fn annotator_table(items: &[&PairItem], seed: u64) -> Option<Table> {
    let m = items.first()?.annotators.len();
    if m < 2 || items.iter().any(|i| i.annotators.len() != m) {
        return None;
    }
    let ratings: Vec<Vec<Option<usize>>> = (0..m)
        .map(|a| {
            items
                .iter()
                .map(|i| Some(preference_index(i.annotators[a])))
                .collect()
        })
        .collect();
    let mut rows: Vec<KappaRow> = Vec::new();
    for a in 0..m {
        for b in a + 1..m {
            let name = format!("annotator{} vs annotator{}", a + 1, b + 1);
            rows.push(reliability::cohen(&name, &ratings[a], &ratings[b], 3).0);
        }
    }
    let all: Vec<&[Option<usize>]> = ratings.iter().map(Vec::as_slice).collect();
    rows.push(reliability::fleiss(
        &format!("annotators 1–{m} (Fleiss)"),
        &all,
        3,
        seed,
    ));
    Some(reliability::kappa_table(
        table_id::HUMAN_KAPPA,
        "Human-to-human agreement (the annotators): the ceiling a judge can be held to",
        &rows,
    ))
}

/// Accuracy of single verdicts (ties included), with a bootstrap interval and a group table.
pub fn single_results(outcomes: &[SingleOutcome], seed: u64) -> BenchResults {
    let scored: Vec<f64> = outcomes.iter().filter_map(single_indicator).collect();
    let labelled = outcomes.iter().filter(|o| o.label.is_some()).count();
    let unscored = labelled - scored.len();
    let cells = |members: &[&SingleOutcome]| {
        let s: Vec<f64> = members.iter().filter_map(|o| single_indicator(o)).collect();
        vec![
            percent(crate::stats::summary::mean(&s)),
            Cell::from(s.len()),
            Cell::from(members.iter().filter(|o| o.label.is_some()).count() - s.len()),
        ]
    };
    BenchResults {
        metrics: vec![metric("accuracy", &scored, unscored, seed)],
        tables: vec![Table {
            id: crate::bench::table::table_id::FENNEC_SINGLE.to_string(),
            title: "Single-verdict accuracy against human labels (%)".to_string(),
            columns: ["group", "accuracy", "n", "unscored"]
                .map(String::from)
                .to_vec(),
            rows: group_rows(outcomes, |o| o.category.as_str(), cells),
        }],
    }
}

/// Why an outcome's verdict has no value: the reason of the first unscored verdict.
fn unscored_reason<'a>(verdicts: impl IntoIterator<Item = &'a Verdict<Preference>>) -> String {
    verdicts
        .into_iter()
        .find_map(|v| match v {
            Verdict::Unscored { reason } => Some(format!("unscored: {reason}")),
            Verdict::Scored(_) => None,
        })
        .unwrap_or_else(|| "unscored".to_string())
}

/// A binary metric's per-item values (`ids` in the outcomes' order), for `candor compare`:
/// `value` gives an item's 0/1 indicator, `None` when it has none (unscored, with the reason
/// of `why`); items `counts` rejects are not items of the metric at all (unlabelled ones).
fn binary_items<T>(
    metric: &str,
    ids: &[String],
    outcomes: &[T],
    counts: impl Fn(&T) -> bool,
    value: impl Fn(&T) -> Option<f64>,
    why: impl Fn(&T) -> String,
) -> MetricItems {
    let mut m = MetricItems {
        metric: metric.to_string(),
        binary: true,
        values: Vec::new(),
        left_out: Vec::new(),
    };
    for (id, o) in ids.iter().zip(outcomes).filter(|(_, o)| counts(o)) {
        match value(o) {
            Some(v) => m.values.push(ItemValue {
                id: id.clone(),
                group: String::new(),
                value: v,
            }),
            None => m.left_out.push(LeftOut {
                id: id.clone(),
                reason: why(o),
            }),
        }
    }
    m
}

/// The per-item values of [`pairwise_results`]' metrics (agreement over labelled items,
/// consistency and first-position preference over all), each a 0/1 indicator whose plain mean
/// is the metric.
pub fn pairwise_item_values(ids: &[String], outcomes: &[PairOutcome]) -> Vec<MetricItems> {
    let why = |o: &PairOutcome| unscored_reason([&o.normal, &o.exchanged]);
    vec![
        binary_items(
            "agreement",
            ids,
            outcomes,
            |o| o.label.is_some(),
            |o| pair_indicators(o).map(|p| p.0),
            why,
        ),
        binary_items(
            "consistency",
            ids,
            outcomes,
            |_| true,
            |o| pair_indicators(o).map(|p| p.1),
            why,
        ),
        binary_items(
            "first_position_preference",
            ids,
            outcomes,
            |_| true,
            first_shown,
            why,
        ),
    ]
}

/// The per-item values of [`single_results`]' accuracy (labelled items, 0/1).
pub fn single_item_values(ids: &[String], outcomes: &[SingleOutcome]) -> Vec<MetricItems> {
    vec![binary_items(
        "accuracy",
        ids,
        outcomes,
        |o| o.label.is_some(),
        single_indicator,
        |o| unscored_reason([&o.verdict]),
    )]
}

/// Fennec's merge of branch scores (`fennec_pairwise_merge`): the sums of A's and B's scores
/// over the parsed branches (the authors add 0 for an unparsed one, which changes neither
/// sum). Unscored when no branch parsed.
pub fn merge_pair_scores(branches: &[Verdict<PairScores>]) -> Verdict<(u32, u32)> {
    let parsed: Vec<&PairScores> = branches.iter().filter_map(Verdict::scored).collect();
    if parsed.is_empty() {
        return Verdict::unscored(format!("none of {} branch replies parsed", branches.len()));
    }
    Verdict::Scored((
        parsed.iter().map(|s| u32::from(s.a)).sum(),
        parsed.iter().map(|s| u32::from(s.b)).sum(),
    ))
}

/// Fennec's merge of single-response branch scores: per response, the sum over branches
/// where both responses parsed (the authors skip a branch where either rating is missing).
pub fn merge_single_scores(branches: &[(Verdict<u8>, Verdict<u8>)]) -> Verdict<(u32, u32)> {
    let parsed: Vec<(u8, u8)> = branches
        .iter()
        .filter_map(|(a, b)| Some((*a.scored()?, *b.scored()?)))
        .collect();
    if parsed.is_empty() {
        return Verdict::unscored(format!("none of {} branch pairs parsed", branches.len()));
    }
    Verdict::Scored((
        parsed.iter().map(|s| u32::from(s.0)).sum(),
        parsed.iter().map(|s| u32::from(s.1)).sum(),
    ))
}

/// The preference of merged scores.
pub fn preference(merged: &Verdict<(u32, u32)>) -> Verdict<Preference> {
    match merged {
        Verdict::Scored((a, b)) => Verdict::Scored(Preference::from_scores(a, b)),
        Verdict::Unscored { reason } => Verdict::unscored(reason.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Preference::{Tie, A, B};

    fn pair(label: Preference, n: Option<Preference>, e: Option<Preference>) -> PairOutcome {
        PairOutcome {
            label: Some(label),
            category: "chitchat".into(),
            normal: as_verdict(n),
            exchanged: as_verdict(e),
        }
    }

    #[test]
    fn agreement_needs_both_orders_and_consistency_needs_equality() {
        let outcomes = [
            pair(A, Some(A), Some(A)),       // agree, consistent
            pair(A, Some(A), Some(B)),       // disagree, inconsistent
            pair(Tie, Some(B), Some(B)),     // disagree, consistent
            pair(Tie, Some(Tie), Some(Tie)), // agree, consistent
            pair(B, None, Some(B)),          // unscored
        ];
        let r = pairwise_results(&outcomes, 1);
        assert_eq!(r.metrics[0].name, "agreement");
        assert_eq!(r.metrics[0].interval.value, 0.5);
        assert_eq!(r.metrics[1].interval.value, 0.75);
        assert_eq!((r.metrics[0].n, r.metrics[0].unscored), (4, 1));
        let rows = &r.tables[0].rows;
        assert_eq!(
            crate::bench::table::texts(&rows[0]),
            ["General Communication", "50.00", "75.00", "4", "1"]
        );
        assert_eq!(rows[1][0], Cell::from("Overall"));
        assert_eq!(r, pairwise_results(&outcomes, 1));
        // Unlabelled pairs (a user's file) count for Consistency only.
        let unlabelled = |n, e| PairOutcome {
            label: None,
            ..pair(A, n, e)
        };
        let mut more = outcomes.to_vec();
        more.push(unlabelled(Some(B), Some(A)));
        let r = pairwise_results(&more, 1);
        assert_eq!(r.metrics[0].interval.value, 0.5);
        assert_eq!((r.metrics[0].n, r.metrics[1].n), (4, 5));
        assert_eq!(r.metrics[1].interval.value, 0.6);
        let none = [unlabelled(Some(A), Some(A)), unlabelled(Some(A), Some(B))];
        let r = pairwise_results(&none, 1);
        assert!(r.metrics[0].interval.value.is_nan(), "agreement is n/a");
        assert_eq!((r.metrics[0].n, r.metrics[1].interval.value), (0, 0.5));
    }

    #[test]
    fn exchanged_verdicts_are_swapped_back() {
        let items = vec![PairItem {
            id: "x".into(),
            query: "q".into(),
            response_a: "a".into(),
            response_b: "b".into(),
            label: Some(A),
            category: "others".into(),
            annotators: Vec::new(),
        }];
        let p = std::path::Path::new("f");
        // The judge saw (b, a) and preferred the second shown, i.e. a.
        let o = pair_outcomes(&items, (p, vec![Some(A)]), (p, vec![Some(B)])).expect("counts");
        assert_eq!(o[0].exchanged, Verdict::Scored(A));
        let e = pair_outcomes(&items, (p, vec![]), (p, vec![Some(B)])).unwrap_err();
        assert_eq!(e.to_string(), "f: 0 verdicts for 1 items");
    }

    #[test]
    fn single_accuracy_counts_ties() {
        let o = |label, v| SingleOutcome {
            label: Some(label),
            category: "pandalm-app".into(),
            verdict: as_verdict(v),
        };
        let r = single_results(&[o(Tie, Some(Tie)), o(A, Some(B)), o(B, None)], 0);
        assert_eq!(r.metrics[0].interval.value, 0.5);
        assert_eq!(r.metrics[0].unscored, 1);
        // Categories outside Auto-J's groups only appear in Overall.
        assert_eq!(r.tables[0].rows.len(), 1);
    }

    #[test]
    fn merging_branch_scores() {
        let s = |a, b| Verdict::Scored(PairScores { a, b });
        let merged = merge_pair_scores(&[s(4, 2), Verdict::unscored("x"), s(1, 3)]);
        assert_eq!(merged, Verdict::Scored((5, 5)));
        assert_eq!(preference(&merged), Verdict::Scored(Tie));
        assert!(preference(&merge_pair_scores(&[Verdict::unscored("x")]))
            .scored()
            .is_none());
        let single = merge_single_scores(&[
            (Verdict::Scored(5), Verdict::Scored(2)),
            (Verdict::Scored(4), Verdict::unscored("x")),
        ]);
        assert_eq!(single, Verdict::Scored((5, 2)));
    }

    #[test]
    fn groups_cover_auto_j_scenarios() {
        assert_eq!(scenario_group("post_summarization"), Some("Summarization"));
        assert_eq!(scenario_group("others"), Some("NLP Tasks"));
        assert_eq!(scenario_group("Grammarly"), None);
        assert_eq!(percent(0.549568965).to_string(), "54.96");
    }

    #[test]
    fn item_values_are_the_metrics_items() {
        use Preference::{Tie, A, B};
        let mut unlabelled = pair(A, Some(A), Some(A));
        unlabelled.label = None;
        let outcomes = [
            pair(A, Some(A), Some(A)),
            pair(A, Some(A), Some(B)),
            pair(B, Some(A), None),
            pair(Tie, Some(Tie), Some(Tie)),
            unlabelled,
        ];
        let ids: Vec<String> = (0..outcomes.len()).map(|k| format!("p{k}")).collect();
        let results = pairwise_results(&outcomes, 0);
        let items = pairwise_item_values(&ids, &outcomes);
        for (m, metric) in items.iter().zip(&results.metrics) {
            assert_eq!(m.metric, metric.name);
            assert!(m.binary);
            assert_eq!(m.values.len(), metric.n, "{}", m.metric);
            let mean = m.values.iter().map(|v| v.value).sum::<f64>() / m.values.len() as f64;
            assert_eq!(mean, metric.interval.value, "{}", m.metric);
            // The pair without its exchanged verdict is left out, with the reason.
            let out: Vec<&str> = m.left_out.iter().map(|l| l.id.as_str()).collect();
            assert_eq!(out, ["p2"], "{}", m.metric);
            assert_eq!(m.left_out[0].reason, "unscored: no verdict in the file");
        }
        // The unlabelled pair is no item of agreement, one of consistency.
        assert!(!items[0].values.iter().any(|v| v.id == "p4"));
        assert!(items[1].values.iter().any(|v| v.id == "p4"));
        let single: Vec<SingleOutcome> = outcomes
            .iter()
            .map(|o| SingleOutcome {
                label: o.label,
                category: o.category.clone(),
                verdict: o.exchanged.clone(),
            })
            .collect();
        let acc = &single_item_values(&ids, &single)[0];
        let metric = &single_results(&single, 0).metrics[0];
        assert_eq!(acc.values.len(), metric.n);
        let mean = acc.values.iter().map(|v| v.value).sum::<f64>() / acc.values.len() as f64;
        assert_eq!(mean, metric.interval.value);
    }
}
