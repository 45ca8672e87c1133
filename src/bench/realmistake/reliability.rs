//! How far ReaLMistake's detectors can be trusted beyond P/R/F1: Cohen's κ of each detector's
//! verdicts against the expert labels (all its prompts pooled, and per prompt), with the
//! confusion matrix of the pooled verdicts, and the detectors' agreement with each other
//! (Cohen's κ per pair, Fleiss' κ when there are three or more). A missing verdict is left
//! out of κ and counted (unlike P/R/F1, where the authors count it as `no_error`: κ compares
//! ratings, and a missing one is no rating). The numbers come from
//! [`crate::bench::reliability`]; this module only picks the raters from scored [`Cell`]s.

use std::collections::BTreeMap;

use crate::bench::reliability::{self, KappaRow};
use crate::bench::table::{table_id, Table};
use crate::judge::error_detection::Detection;

use super::score::Cell;

/// The categories of a detection in κ tables and confusion matrices, in index order.
pub const DETECTION_NAMES: [&str; 2] = ["no_error", "error"];

/// A detection's index in [`DETECTION_NAMES`].
pub fn detection_index(d: Detection) -> usize {
    match d {
        Detection::NoError => 0,
        Detection::Error => 1,
    }
}

/// The cell's prompt as a short name: `prompt_1` for the authors'
/// `baseline_errordetection_prompt_1`.
fn short_prompt(stem: &str) -> &str {
    stem.strip_prefix("baseline_errordetection_")
        .unwrap_or(stem)
}

/// The reliability tables of scored cells: κ against the expert labels per detector (pooled
/// and per prompt; the `majority_vote` cells too), a confusion matrix per detector, and κ
/// between detectors when there are several (`majority_vote` left out). Fleiss' κ is
/// bootstrapped from `seed`.
pub fn reliability_tables(cells: &[Cell], seed: u64) -> Vec<Table> {
    let mut by_detector: BTreeMap<&str, Vec<&Cell>> = BTreeMap::new();
    for c in cells {
        by_detector.entry(&c.detector).or_default().push(c);
    }
    let mut rows: Vec<KappaRow> = Vec::new();
    let mut confusions = Vec::new();
    for (det, cells) in &by_detector {
        let split = |cells: &[&Cell]| -> (Vec<Option<usize>>, Vec<Option<usize>>) {
            cells
                .iter()
                .flat_map(|c| &c.pairs)
                .map(|(gold, pred)| (pred.map(detection_index), Some(detection_index(*gold))))
                .unzip()
        };
        let (pred, gold) = split(cells);
        let (row, confusion) = reliability::cohen(
            &format!("{det} vs expert labels, all prompts"),
            &pred,
            &gold,
            2,
        );
        rows.push(row);
        confusions.push(reliability::confusion_table(
            &format!("confusion_{}", id_part(det)),
            &format!("Confusion matrix: {det} (all prompts) × expert label"),
            ("detector", "expert"),
            &DETECTION_NAMES,
            &confusion,
        ));
        let mut by_prompt: BTreeMap<&str, Vec<&Cell>> = BTreeMap::new();
        for c in cells {
            by_prompt.entry(&c.prompt).or_default().push(c);
        }
        if by_prompt.len() > 1 {
            for (prompt, cells) in by_prompt {
                let (pred, gold) = split(&cells);
                let name = format!("{det} vs expert labels, {}", short_prompt(prompt));
                rows.push(reliability::cohen(&name, &pred, &gold, 2).0);
            }
        }
    }
    let mut tables = vec![reliability::kappa_table(
        table_id::JUDGE_KAPPA,
        "Detector reliability: Cohen's κ against the expert labels",
        &rows,
    )];
    tables.extend(between_detectors(cells, seed));
    tables.extend(confusions);
    tables
}

/// κ between detectors over the units (task, response model, prompt, item) they all rated:
/// Cohen's per pair, Fleiss' for three or more. `None` with fewer than two detectors.
fn between_detectors(cells: &[Cell], seed: u64) -> Option<Table> {
    let detectors: Vec<&str> = {
        let mut d: Vec<&str> = cells
            .iter()
            .map(|c| c.detector.as_str())
            .filter(|d| *d != "majority_vote")
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    };
    if detectors.len() < 2 {
        return None;
    }
    // (task, response model, prompt) → detector → its verdicts in item order.
    type Key<'a> = (&'a str, &'a str, &'a str);
    let mut files: BTreeMap<Key, BTreeMap<&str, &Cell>> = BTreeMap::new();
    for c in cells.iter().filter(|c| c.detector != "majority_vote") {
        files
            .entry((&c.task, &c.response_model, &c.prompt))
            .or_default()
            .insert(&c.detector, c);
    }
    let mut ratings: Vec<Vec<Option<usize>>> = vec![Vec::new(); detectors.len()];
    for by_det in files.values() {
        if by_det.len() != detectors.len() {
            continue;
        }
        let n = by_det.values().map(|c| c.pairs.len()).min().unwrap_or(0);
        for (r, det) in detectors.iter().enumerate() {
            let cell = by_det[det];
            ratings[r].extend(cell.pairs[..n].iter().map(|(_, p)| p.map(detection_index)));
        }
    }
    let mut rows = Vec::new();
    for a in 0..detectors.len() {
        for b in a + 1..detectors.len() {
            let name = format!("{} vs {}", detectors[a], detectors[b]);
            rows.push(reliability::cohen(&name, &ratings[a], &ratings[b], 2).0);
        }
    }
    if detectors.len() > 2 {
        let all: Vec<&[Option<usize>]> = ratings.iter().map(Vec::as_slice).collect();
        let name = format!("all {} detectors (Fleiss)", detectors.len());
        rows.push(reliability::fleiss(&name, &all, 2, seed));
    }
    Some(reliability::kappa_table(
        table_id::DETECTOR_KAPPA,
        "Agreement between detectors on the same items and prompts (κ)",
        &rows,
    ))
}

/// A detector name as part of a table id (`candidate/0` → `candidate_0`).
fn id_part(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::table::texts;
    use Detection::{Error as E, NoError as N};

    fn cell(det: &str, prompt: &str, pairs: Vec<(Detection, Option<Detection>)>) -> Cell {
        Cell {
            task: "t".into(),
            response_model: "m".into(),
            detector: det.into(),
            prompt: prompt.into(),
            pairs,
        }
    }

    #[test]
    fn detectors_against_labels_and_each_other() {
        let gold = [E, E, N, N, E, N];
        let preds = |p: [Option<Detection>; 6]| gold.iter().copied().zip(p).collect::<Vec<_>>();
        let cells = vec![
            cell(
                "a",
                "p1",
                preds([Some(E), Some(E), Some(N), Some(N), Some(E), Some(N)]),
            ),
            cell(
                "a",
                "p2",
                preds([Some(E), None, Some(N), Some(E), Some(E), Some(N)]),
            ),
            cell(
                "b",
                "p1",
                preds([Some(E), Some(N), Some(N), Some(N), Some(E), Some(E)]),
            ),
            cell(
                "b",
                "p2",
                preds([Some(N), Some(E), Some(N), Some(N), None, Some(N)]),
            ),
            cell(
                "c",
                "p1",
                preds([Some(E), Some(E), Some(E), Some(N), Some(E), Some(N)]),
            ),
            cell(
                "c",
                "p2",
                preds([Some(E), Some(E), Some(N), Some(N), Some(E), Some(N)]),
            ),
        ];
        let tables = reliability_tables(&cells, 0);
        let ids: Vec<&str> = tables.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "judge_kappa",
                "detector_kappa",
                "confusion_a",
                "confusion_b",
                "confusion_c"
            ]
        );
        // Detector a, pooled: 11 rated (one missing), 10 agree with the labels.
        let a = texts(&tables[0].rows[0]);
        assert_eq!(a[0], "a vs expert labels, all prompts");
        assert_eq!(&a[5..], ["11", "1"]);
        // Its prompt p1 agrees on every item: κ = 1.
        assert!(texts(&tables[0].rows[1])[1].starts_with("1.000"));
        let between = &tables[1];
        assert_eq!(between.rows.len(), 4, "three pairs and Fleiss");
        assert_eq!(texts(&between.rows[3])[0], "all 3 detectors (Fleiss)");
        // a and b are both rated on 10 of the 12 units.
        assert_eq!(&texts(&between.rows[0])[5..], ["10", "2"]);
        // Its confusion matrix: expert no_error 6 and error 5 among the 11 rated.
        assert_eq!(texts(&tables[2].rows[2]), ["total", "6", "5", "11"]);
    }
}
