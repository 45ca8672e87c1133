//! ReaLMistake scoring: predictions against expert labels, as the authors'
//! `src/error_detection_analysis/calculate_performance.py` computes them.
//!
//! Error is the positive class. A missing verdict counts as `no_error` for precision, recall
//! and F1 and as wrong for accuracy (it equals neither label), exactly as published; the number
//! of missing verdicts is reported beside every metric. Per (task, response model, detector)
//! the four prompts are averaged (mean and population standard deviation), and the task
//! averages are averaged again per (response model, detector) (written in the authors' JSON
//! structure by `performance.rs`); [`headline`] adds seeded bootstrap intervals.
//! The random baseline is the authors' `easy_baseline.py`: predict error with the gold error
//! rate. This module reads no files.

use std::collections::BTreeMap;

use crate::bench::item_scores::{ItemValue, MetricItems};
use crate::bench::stats::Metric;
use crate::bench::stats::{bootstrap, RESAMPLES};
use crate::bench::table::{self, table_id, Table};
use crate::bench::BenchResults;
use crate::judge::error_detection::Detection;

use super::data::{Benchmark, DetectorFile};
use super::Error;

/// Counts over one set of (gold, prediction) pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Confusion {
    pub tp: usize,
    pub fp: usize,
    pub tn: usize,
    /// False negatives, missing verdicts of error items included.
    pub fn_: usize,
    /// Predictions without a verdict on error items (inside `fn_`).
    pub missing_on_error: usize,
    /// Predictions without a verdict on no-error items (inside `tn`).
    pub missing_on_no_error: usize,
}

impl Confusion {
    pub fn add(&mut self, gold: Detection, pred: Option<Detection>) {
        match (gold, pred) {
            (Detection::Error, Some(Detection::Error)) => self.tp += 1,
            (Detection::NoError, Some(Detection::Error)) => self.fp += 1,
            (Detection::Error, _) => self.fn_ += 1,
            (Detection::NoError, _) => self.tn += 1,
        }
        match (gold, pred) {
            (Detection::Error, None) => self.missing_on_error += 1,
            (Detection::NoError, None) => self.missing_on_no_error += 1,
            _ => {}
        }
    }

    pub fn from_pairs(pairs: impl IntoIterator<Item = (Detection, Option<Detection>)>) -> Self {
        let mut c = Confusion::default();
        for (g, p) in pairs {
            c.add(g, p);
        }
        c
    }

    pub fn total(&self) -> usize {
        self.tp + self.fp + self.tn + self.fn_
    }

    pub fn metrics(&self) -> Metrics {
        let total = self.total() as f64;
        let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let precision = ratio(self.tp, self.tp + self.fp);
        let recall = ratio(self.tp, self.tp + self.fn_);
        let f1 = if precision + recall == 0.0 {
            0.0
        } else {
            2.0 * precision * recall / (precision + recall)
        };
        // A missing verdict matches neither label, so it is never correct.
        let correct = self.tp + self.tn - self.missing_on_no_error;
        Metrics {
            accuracy: correct as f64 / total,
            precision,
            recall,
            f1,
            true_negative_rate: self.tn as f64 / total,
            false_positive_rate: self.fp as f64 / total,
            false_negative_rate: self.fn_ as f64 / total,
            true_positive_rate: self.tp as f64 / total,
        }
    }

    /// Predictions without a verdict.
    pub fn no_verdict(&self) -> usize {
        self.missing_on_error + self.missing_on_no_error
    }

    /// Gold error items.
    pub fn gold_errors(&self) -> usize {
        self.tp + self.fn_
    }

    /// Predicted errors.
    pub fn predicted_errors(&self) -> usize {
        self.tp + self.fp
    }
}

/// The authors' eight numbers for one set of predictions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    pub accuracy: f64,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub true_negative_rate: f64,
    pub false_positive_rate: f64,
    pub false_negative_rate: f64,
    pub true_positive_rate: f64,
}

impl Metrics {
    /// (name, value) in the authors' key order.
    pub fn named(&self) -> [(&'static str, f64); 8] {
        [
            ("accuracy", self.accuracy),
            ("precision", self.precision),
            ("recall", self.recall),
            ("f1", self.f1),
            ("true_negative_rate", self.true_negative_rate),
            ("false_positive_rate", self.false_positive_rate),
            ("false_negative_rate", self.false_negative_rate),
            ("true_positive_rate", self.true_positive_rate),
        ]
    }
}

/// The authors' self-consistency vote over k sampled verdicts: the most frequent value,
/// missing verdicts included as a value of their own, ties going to `no_error`, then `error`,
/// then no verdict (this reproduces all 450 published self-consistency predictions).
pub fn self_consistency_vote(samples: &[Option<Detection>]) -> Option<Detection> {
    let order = [Some(Detection::NoError), Some(Detection::Error), None];
    let count = |v: &Option<Detection>| samples.iter().filter(|s| *s == v).count();
    let best = order.iter().map(count).max().unwrap_or(0);
    order.into_iter().find(|v| count(v) == best).flatten()
}

/// The authors' majority vote over several outputs (detectors x prompts): `error` when more
/// than half of all outputs, missing verdicts included, say error; else `no_error` (this
/// reproduces all 900 published majority-vote predictions).
pub fn majority_vote(outputs: &[Option<Detection>]) -> Detection {
    let errors = outputs
        .iter()
        .filter(|o| **o == Some(Detection::Error))
        .count();
    if errors * 2 > outputs.len() {
        Detection::Error
    } else {
        Detection::NoError
    }
}

/// The authors' random baseline for a gold error rate `p`: predict error with probability `p`.
pub fn random_baseline(p: f64) -> Metrics {
    let tp = p * p;
    let fp = (1.0 - p) * p;
    let tn = (1.0 - p) * (1.0 - p);
    let fn_ = p * (1.0 - p);
    let precision = if tp + fp != 0.0 { tp / (tp + fp) } else { 0.0 };
    let recall = if tp + fn_ != 0.0 {
        tp / (tp + fn_)
    } else {
        0.0
    };
    let f1 = if precision + recall != 0.0 {
        2.0 * (precision * recall) / (precision + recall)
    } else {
        0.0
    };
    Metrics {
        accuracy: (tp + tn) / (tp + fp + tn + fn_),
        precision,
        recall,
        f1,
        true_negative_rate: tn,
        false_positive_rate: fp,
        false_negative_rate: fn_,
        true_positive_rate: tp,
    }
}

/// Population mean and standard deviation (numpy's `mean` and `std`).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Where a cell's predictions come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predictions {
    /// The `prediction` field as published.
    Published,
    /// Candor's parser ([`crate::judge::error_detection::parse_detection`]) on `response`.
    Reparsed,
}

/// One detector's predictions with one prompt on one (task, response model) file, paired with
/// the gold labels in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    pub task: String,
    pub response_model: String,
    pub detector: String,
    /// The authors' file stem of the prompt (`baseline_errordetection_prompt_1`), or
    /// `majority_vote` for a vote over prompts and detectors.
    pub prompt: String,
    pub pairs: Vec<(Detection, Option<Detection>)>,
}

impl Cell {
    pub fn confusion(&self) -> Confusion {
        Confusion::from_pairs(self.pairs.iter().copied())
    }
}

/// Pairs a detector file with gold labels: from `benchmark` when given (ids must match the
/// benchmark's first items in order, as the authors assert), else the files' own `label`.
pub fn cell(
    file: &DetectorFile,
    benchmark: Option<&Benchmark>,
    source: Predictions,
) -> Result<Cell, Error> {
    let mismatch = |message: String| Error::Mismatch {
        task: file.task.clone(),
        response_model: file.response_model.clone(),
        message,
    };
    let gold: Vec<Detection> = match benchmark {
        None => file.records.iter().map(|r| r.label).collect(),
        Some(b) => {
            let key = (file.task.clone(), file.response_model.clone());
            let items = b
                .get(&key)
                .ok_or_else(|| mismatch("not in the benchmark".to_string()))?;
            if items.len() < file.records.len() {
                return Err(mismatch(format!(
                    "{}: {} predictions for {} items",
                    file.detector,
                    file.records.len(),
                    items.len()
                )));
            }
            for (i, (item, rec)) in items.iter().zip(&file.records).enumerate() {
                if item.id != rec.id {
                    return Err(mismatch(format!(
                        "{} {}: line {} is item {:?}, expected {:?}",
                        file.detector,
                        file.prompt.file_stem(),
                        i + 1,
                        rec.id,
                        item.id
                    )));
                }
            }
            items
                .iter()
                .take(file.records.len())
                .map(|i| {
                    i.label
                        .ok_or_else(|| mismatch(format!("item {:?} has no label", i.id)))
                })
                .collect::<Result<_, _>>()?
        }
    };
    let pairs = gold
        .into_iter()
        .zip(&file.records)
        .map(|(g, r)| {
            let p = match source {
                Predictions::Published => r.prediction,
                Predictions::Reparsed => {
                    crate::judge::error_detection::parse_detection(&r.response)
                        .scored()
                        .copied()
                }
            };
            (g, p)
        })
        .collect();
    Ok(Cell {
        task: file.task.clone(),
        response_model: file.response_model.clone(),
        detector: file.detector.clone(),
        prompt: file.prompt.file_stem(),
        pairs,
    })
}

/// The headline metric names, in report order.
pub const HEADLINE: [&str; 4] = ["f1", "precision", "recall", "accuracy"];

fn pick(m: &Metrics, name: &str) -> f64 {
    match name {
        "f1" => m.f1,
        "precision" => m.precision,
        "recall" => m.recall,
        _ => m.accuracy,
    }
}

/// Mean of `name` over cells, each cell's pairs restricted to the sampled item indices of its
/// (task, response model) group.
fn resampled_mean(
    cells: &[(usize, &Cell)],
    groups: usize,
    sample: &[(usize, usize)],
    name: &str,
) -> f64 {
    let mut by_group: Vec<Vec<usize>> = vec![Vec::new(); groups];
    for &(g, i) in sample {
        by_group[g].push(i);
    }
    let values: Vec<f64> = cells
        .iter()
        .map(|(g, c)| {
            let conf =
                Confusion::from_pairs(by_group[*g].iter().filter_map(|&i| c.pairs.get(i).copied()));
            if conf.total() == 0 {
                f64::NAN
            } else {
                pick(&conf.metrics(), name)
            }
        })
        .collect();
    crate::stats::summary::mean(&values)
}

/// The per-item values of `accuracy` for each detector of `cells`, for paired comparisons
/// between detectors (`ids[k][i]` is the item id of `cells[k].pairs[i]`): one value per item
/// and prompt (`<item id>/<prompt>`), 1 when the verdict is the gold label and 0 otherwise (no
/// verdict counts as wrong, as accuracy counts it), grouped by task, response model and
/// prompt, as the headline's mean over cells is. Detectors in order of first appearance.
pub fn accuracy_items(cells: &[Cell], ids: &[Vec<String>]) -> Vec<(String, MetricItems)> {
    let mut out: Vec<(String, MetricItems)> = Vec::new();
    for (c, ids) in cells.iter().zip(ids) {
        if !out.iter().any(|(d, _)| *d == c.detector) {
            out.push((
                c.detector.clone(),
                MetricItems {
                    metric: "accuracy".to_string(),
                    binary: true,
                    values: Vec::new(),
                    left_out: Vec::new(),
                },
            ));
        }
        let Some((_, m)) = out.iter_mut().find(|(d, _)| *d == c.detector) else {
            continue;
        };
        let prompt = c.prompt.trim_start_matches("baseline_errordetection_");
        let group = format!("{}/{}/{prompt}", c.task, c.response_model);
        for ((gold, pred), id) in c.pairs.iter().zip(ids) {
            m.values.push(ItemValue {
                id: format!("{id}/{prompt}"),
                group: group.clone(),
                value: f64::from(u8::from(*pred == Some(*gold))),
            });
        }
    }
    out
}

/// Headline metrics (F1, precision, recall, accuracy as the mean over all cells, i.e. over
/// prompts, tasks, response models and detectors given) with seeded bootstrap 95% intervals:
/// items are resampled within the benchmark, every cell sees the same resampled items.
/// `unscored` counts predictions without a verdict (they enter the metric as published).
/// Tables: per detector and response model, the averages; and the random baseline.
pub fn headline(cells: &[Cell], seed: u64) -> BenchResults {
    let mut group_ids: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut sizes: Vec<usize> = Vec::new();
    let mut indexed = Vec::new();
    for c in cells {
        let key = (c.task.clone(), c.response_model.clone());
        let next = group_ids.len();
        let g = *group_ids.entry(key).or_insert(next);
        if g == sizes.len() {
            sizes.push(0);
        }
        sizes[g] = sizes[g].max(c.pairs.len());
        indexed.push((g, c));
    }
    let units: Vec<(usize, usize)> = sizes
        .iter()
        .enumerate()
        .flat_map(|(g, &n)| (0..n).map(move |i| (g, i)))
        .collect();
    let n: usize = cells.iter().map(|c| c.pairs.len()).sum();
    let unscored: usize = cells.iter().map(|c| c.confusion().no_verdict()).sum();
    let groups = sizes.len();
    let metrics = HEADLINE
        .iter()
        .map(|name| Metric {
            name: name.to_string(),
            interval: bootstrap(
                &units,
                |s| resampled_mean(&indexed, groups, s, name),
                seed,
                RESAMPLES,
            ),
            n,
            unscored,
        })
        .collect();
    BenchResults {
        metrics,
        tables: vec![
            detector_table(cells),
            random_table(cells),
            task_prompt_table(cells),
        ],
    }
}

/// A share as a percentage cell with one decimal.
fn fmt(v: f64) -> table::Cell {
    table::Cell::num(100.0 * v, 1)
}

/// Per detector and response model: mean over tasks and prompts of the four metrics.
fn detector_table(cells: &[Cell]) -> Table {
    let mut groups: BTreeMap<(String, String), Vec<Metrics>> = BTreeMap::new();
    for c in cells {
        groups
            .entry((c.detector.clone(), c.response_model.clone()))
            .or_default()
            .push(c.confusion().metrics());
    }
    let rows = groups
        .iter()
        .map(|((det, model), ms)| {
            let mut row = vec![
                table::Cell::from(det.as_str()),
                table::Cell::from(model.as_str()),
                table::Cell::from(ms.len()),
            ];
            for name in HEADLINE {
                let values: Vec<f64> = ms.iter().map(|m| pick(m, name)).collect();
                row.push(fmt(mean_std(&values).0));
            }
            row
        })
        .collect();
    Table {
        id: table_id::REALMISTAKE_PER_DETECTOR.to_string(),
        title: "ReaLMistake: mean over tasks and prompts (%)".to_string(),
        columns: [
            "detector",
            "response_model",
            "cells",
            "f1",
            "precision",
            "recall",
            "accuracy",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    }
}

/// Per task and prompt: mean over response models and detectors of the four metrics, with
/// the pairs that entered and the predictions without a verdict (for reports).
fn task_prompt_table(cells: &[Cell]) -> Table {
    let mut groups: BTreeMap<(String, String), Vec<&Cell>> = BTreeMap::new();
    for c in cells {
        groups
            .entry((c.task.clone(), c.prompt.clone()))
            .or_default()
            .push(c);
    }
    let rows = groups
        .iter()
        .map(|((task, prompt), cs)| {
            let ms: Vec<Metrics> = cs.iter().map(|c| c.confusion().metrics()).collect();
            let mut row = vec![
                table::Cell::from(task.as_str()),
                table::Cell::from(prompt.as_str()),
            ];
            for name in HEADLINE {
                let values: Vec<f64> = ms.iter().map(|m| pick(m, name)).collect();
                row.push(fmt(mean_std(&values).0));
            }
            let n: usize = cs.iter().map(|c| c.pairs.len()).sum();
            let unscored: usize = cs.iter().map(|c| c.confusion().no_verdict()).sum();
            row.push(table::Cell::from(n));
            row.push(table::Cell::from(unscored));
            row
        })
        .collect();
    Table {
        id: table_id::REALMISTAKE_PER_TASK_PROMPT.to_string(),
        title: "ReaLMistake: per task and prompt (%)".to_string(),
        columns: [
            "task",
            "prompt",
            "f1",
            "precision",
            "recall",
            "accuracy",
            "n",
            "unscored",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    }
}

/// The random baseline per response model (mean over the tasks present).
fn random_table(cells: &[Cell]) -> Table {
    let mut rates: BTreeMap<(String, String), f64> = BTreeMap::new();
    for c in cells {
        let conf = c.confusion();
        rates
            .entry((c.response_model.clone(), c.task.clone()))
            .or_insert(conf.gold_errors() as f64 / conf.total().max(1) as f64);
    }
    let mut by_model: BTreeMap<String, Vec<Metrics>> = BTreeMap::new();
    for ((model, _), p) in rates {
        by_model.entry(model).or_default().push(random_baseline(p));
    }
    let rows = by_model
        .iter()
        .map(|(model, ms)| {
            let mut row = vec![
                table::Cell::from("random"),
                table::Cell::from(model.as_str()),
                table::Cell::from(ms.len()),
            ];
            for name in HEADLINE {
                let values: Vec<f64> = ms.iter().map(|m| pick(m, name)).collect();
                row.push(fmt(mean_std(&values).0));
            }
            row
        })
        .collect();
    Table {
        id: table_id::REALMISTAKE_RANDOM_BASELINE.to_string(),
        title: "ReaLMistake: random baseline, mean over tasks (%)".to_string(),
        columns: [
            "detector",
            "response_model",
            "tasks",
            "f1",
            "precision",
            "recall",
            "accuracy",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::realmistake::data::TASKS;
    use crate::judge::error_detection::DetectionPrompt;
    use Detection::{Error as E, NoError as N};

    #[test]
    fn metrics_follow_the_authors_rules() {
        // gold, prediction
        let pairs = [
            (E, Some(E)),
            (E, Some(N)),
            (E, None),
            (N, Some(N)),
            (N, Some(E)),
            (N, None),
        ];
        let c = Confusion::from_pairs(pairs);
        assert_eq!((c.tp, c.fp, c.tn, c.fn_), (1, 1, 2, 2));
        assert_eq!(c.no_verdict(), 2);
        let m = c.metrics();
        assert_eq!(m.precision, 0.5);
        assert_eq!(m.recall, 1.0 / 3.0);
        assert!((m.f1 - 0.4).abs() < 1e-12);
        // Correct: (E,E) and (N,N) only; the missing verdict on N is wrong.
        assert_eq!(m.accuracy, 2.0 / 6.0);
        assert_eq!(m.true_negative_rate, 2.0 / 6.0);
    }

    #[test]
    fn votes_follow_the_published_outputs() {
        // Patterns seen in the authors' self_consistency and majority_vote files.
        assert_eq!(
            self_consistency_vote(&[None, Some(N), None, Some(E), Some(E)]),
            Some(E)
        );
        assert_eq!(
            self_consistency_vote(&[Some(E), None, Some(E), None, None]),
            None
        );
        assert_eq!(
            self_consistency_vote(&[Some(E), None, Some(N), Some(N), Some(E)]),
            Some(N)
        );
        assert_eq!(self_consistency_vote(&[None; 5]), None);
        let mut votes = vec![Some(E); 5];
        votes.extend([Some(N); 4]);
        votes.extend([None; 3]);
        assert_eq!(majority_vote(&votes), N);
        votes[5] = Some(E);
        votes[6] = Some(E);
        assert_eq!(majority_vote(&votes), E);
        assert_eq!(majority_vote(&[Some(E), Some(N)]), N);
    }

    #[test]
    fn zero_division_is_zero() {
        let m = Confusion::from_pairs([(N, Some(N))]).metrics();
        assert_eq!(
            (m.precision, m.recall, m.f1, m.accuracy),
            (0.0, 0.0, 0.0, 1.0)
        );
    }

    #[test]
    fn random_baseline_matches_published_value() {
        // easy_baseline/performance.json, math_word_problem_generation, gpt-4-0613.
        let m = random_baseline(87.0 / 140.0);
        assert!((m.accuracy - 0.5294897959183673).abs() < 1e-12);
        assert!((m.f1 - 0.6214285714285714).abs() < 1e-12);
    }

    #[test]
    fn mean_std_is_population() {
        assert_eq!(mean_std(&[1.0, 3.0]), (2.0, 1.0));
    }

    fn cell(
        task: &str,
        det: &str,
        prompt: DetectionPrompt,
        pairs: Vec<(Detection, Option<Detection>)>,
    ) -> Cell {
        Cell {
            task: task.into(),
            response_model: "Llama-2-70b-chat-hf".into(),
            detector: det.into(),
            prompt: prompt.file_stem(),
            pairs,
        }
    }

    #[test]
    fn headline_is_seeded_and_brackets() {
        let pairs: Vec<_> = (0..40)
            .map(|i| {
                let gold = if i % 3 == 0 { N } else { E };
                let pred = if i % 4 == 0 {
                    Some(N)
                } else if i % 7 == 0 {
                    None
                } else {
                    Some(E)
                };
                (gold, pred)
            })
            .collect();
        let cells = vec![cell(TASKS[0], "d", DetectionPrompt::P1, pairs)];
        let a = headline(&cells, 3);
        assert_eq!(a, headline(&cells, 3));
        let f1 = &a.metrics[0];
        assert_eq!(f1.name, "f1");
        assert!(f1.interval.low <= f1.interval.value && f1.interval.value <= f1.interval.high);
        assert!(f1.interval.low < f1.interval.high);
        assert_eq!(f1.n, 40);
        assert_eq!(f1.unscored, cells[0].confusion().no_verdict());
    }
}
