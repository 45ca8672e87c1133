//! FB-Bench graded by a panel of judges: the panel's verdict per item, the panel's metrics
//! and every judge's beside them, and how far the judges agree.
//!
//! Tie rule and rules (`--panel`): under `majority` the panel votes per checklist entry —
//! an entry is met (是) when more judges said 是 than 否 among those whose reply gave that
//! entry; a tie is 否 (the panel was not convinced) — and the item is scored from the voted
//! entries with the run's `--rule`. Under `mean` the item's score is the mean of the scores
//! each judge's own verdicts give. A judge whose reply cannot be read is left out of that
//! item's panel verdict and counted unscored in its own metrics; an item no judge could read
//! is unscored for the panel. Judges' agreement is over checklist entries (是/否): Cohen's κ
//! per pair of judges, Fleiss' κ for three or more ([`crate::bench::reliability`]).

use super::data::Item;
use super::plan::{judge_verdicts, unit, unit_with_score};
use super::pynum::PyNum;
use super::score::{item_score, results, ModelUnits, Rule, Unit};
use crate::bench::panel::{self, Panel, PanelRule};
use crate::bench::plan::Transcript;
use crate::bench::reliability::{self, KappaRow};
use crate::bench::table::{table_id, Cell, Table};
use crate::bench::BenchResults;
use crate::judge::checklist::CheckVerdict;
use crate::judge::Verdict;

/// One judge's verdicts on one item's checklist.
type Judged = Verdict<Vec<CheckVerdict>>;

/// The panel's verdicts on one item from its judges' (`Unscored` when no judge's could be
/// read), by per-entry majority (see the module doc).
pub fn majority_verdict(
    item: &Item,
    verdicts: &[Verdict<Vec<CheckVerdict>>],
) -> Verdict<Vec<CheckVerdict>> {
    let read: Vec<&Vec<CheckVerdict>> = verdicts.iter().filter_map(Verdict::scored).collect();
    if read.is_empty() {
        return Verdict::unscored(no_judge(verdicts));
    }
    let entries = item
        .criteria()
        .into_iter()
        .filter_map(|c| {
            let votes: Vec<&CheckVerdict> = read
                .iter()
                .filter_map(|v| v.iter().find(|e| e.text == c.text))
                .collect();
            let met: Vec<bool> = votes.iter().map(|e| e.met).collect();
            let yes = met.iter().filter(|m| **m).count();
            Some(CheckVerdict {
                reason: format!("panel: {yes} of {} judges said 是", met.len()),
                met: panel::majority(&met)?,
                weight: c.weight.clone(),
                text: c.text,
            })
        })
        .collect();
    Verdict::Scored(entries)
}

fn no_judge(verdicts: &[Verdict<Vec<CheckVerdict>>]) -> String {
    let reasons: Vec<String> = verdicts
        .iter()
        .enumerate()
        .filter_map(|(j, v)| match v {
            Verdict::Unscored { reason } => Some(format!("judge {j}: {reason}")),
            Verdict::Scored(_) => None,
        })
        .collect();
    format!(
        "no judge of the panel could be read ({})",
        reasons.join("; ")
    )
}

/// The panel's unit of one item under `panel`'s rule.
pub fn panel_unit(
    item: &Item,
    verdicts: &[Verdict<Vec<CheckVerdict>>],
    rule: Rule,
    panel_rule: PanelRule,
) -> Unit {
    match panel_rule {
        PanelRule::Majority => unit(item, majority_verdict(item, verdicts), rule),
        PanelRule::Mean => {
            let scores: Vec<f64> = verdicts
                .iter()
                .filter_map(Verdict::scored)
                .map(|v| item_score(rule, item.bench_type, v).value)
                .collect();
            if scores.is_empty() {
                unit_with_score(item, None, Some(no_judge(verdicts)))
            } else {
                let mean = scores.iter().sum::<f64>() / scores.len() as f64;
                unit_with_score(item, Some(PyNum::float(mean)), None)
            }
        }
    }
}

/// A panel run's results: the panel's metrics and tables (as one judge's would be), then
/// every judge's headline metrics as `judge/<j>/<metric>`, a table of them, and the judges'
/// agreement. `judges` names them (judge 0 first); `candidates` marks self-judging ones.
pub fn panel_results(
    model: &str,
    runs: &[(&Item, &Transcript)],
    rule: Rule,
    seed: u64,
    panel: Panel,
    (judges, candidates): (&[&str], &[String]),
) -> BenchResults {
    let per_judge: Vec<Vec<Verdict<Vec<CheckVerdict>>>> = runs
        .iter()
        .map(|(item, done)| {
            (0..panel.judges)
                .map(|j| judge_verdicts(item, done, rule, j))
                .collect()
        })
        .collect();
    let units = |f: &dyn Fn(&Item, &[Judged]) -> Unit| ModelUnits {
        model: model.to_string(),
        units: runs
            .iter()
            .zip(&per_judge)
            .map(|((item, _), v)| f(item, v))
            .collect(),
    };
    let mut out = results(
        &units(&|item, v| panel_unit(item, v, rule, panel.rule)),
        rule,
        seed,
    );
    let mut rows = Vec::new();
    for j in 0..panel.judges {
        let r = results(
            &units(&|item, v| unit(item, v[j].clone(), rule)),
            rule,
            seed,
        );
        let name = judges.get(j).copied().unwrap_or("?");
        let mut row = vec![Cell::from(crate::bench::protocol::judge_label(
            j, name, candidates,
        ))];
        for m in &r.metrics {
            let i = m.interval;
            row.push(Cell::Interval {
                value: i.value,
                low: i.low,
                high: i.high,
                decimals: 2,
            });
        }
        row.push(Cell::from(r.metrics.last().map_or(0, |m| m.n)));
        row.push(Cell::from(r.metrics.last().map_or(0, |m| m.unscored)));
        rows.push(row);
        out.metrics.extend(r.metrics.into_iter().map(|mut m| {
            m.name = format!("judge/{j}/{}", m.name);
            m
        }));
    }
    let mut row = vec![Cell::from(format!("panel ({})", panel.rule.as_str()))];
    for m in out.metrics.iter().take(3) {
        let i = m.interval;
        row.push(Cell::Interval {
            value: i.value,
            low: i.low,
            high: i.high,
            decimals: 2,
        });
    }
    row.push(Cell::from(out.metrics.get(2).map_or(0, |m| m.n)));
    row.push(Cell::from(out.metrics.get(2).map_or(0, |m| m.unscored)));
    rows.insert(0, row);
    out.tables.push(Table {
        id: table_id::PANEL_JUDGES.to_string(),
        title: "The panel and each judge: Error Correction, Response Maintenance, Overall (×100, \
                bootstrap 95% interval)"
            .to_string(),
        columns: [
            "judge",
            "error_correction",
            "response_maintenance",
            "overall",
            "n",
            "unscored",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    });
    out.tables
        .push(agreement_table(runs, &per_judge, judges, seed));
    out
}

/// κ between the judges over checklist entries (是 = 1, 否 = 0; an entry a judge did not
/// give, or an unreadable reply, is no rating).
fn agreement_table(
    runs: &[(&Item, &Transcript)],
    per_judge: &[Vec<Verdict<Vec<CheckVerdict>>>],
    judges: &[&str],
    seed: u64,
) -> Table {
    let m = per_judge.first().map_or(0, Vec::len);
    let mut ratings: Vec<Vec<Option<usize>>> = vec![Vec::new(); m];
    for ((item, _), verdicts) in runs.iter().zip(per_judge) {
        for c in item.criteria() {
            for (j, v) in verdicts.iter().enumerate() {
                let met = v
                    .scored()
                    .and_then(|v| v.iter().find(|e| e.text == c.text))
                    .map(|e| usize::from(e.met));
                ratings[j].push(met);
            }
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
        rows.push(reliability::fleiss(
            &format!("all {m} judges (Fleiss)"),
            &all,
            2,
            seed,
        ));
    }
    reliability::kappa_table(
        table_id::JUDGE_KAPPA,
        "Agreement between the judges on checklist entries (是/否)",
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fbbench::data::parse_dataset;
    use crate::bench::plan::StepOutput;
    use crate::bench::table::texts;
    use std::path::Path;

    fn items() -> Vec<Item> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/fbbench/sample_v3.json");
        let text = std::fs::read(&path).unwrap();
        parse_dataset(text.as_slice(), &path).unwrap().items
    }

    /// A judge's reply meeting the entries in `met`.
    fn reply(item: &Item, met: &[usize]) -> String {
        let mut obj = serde_json::Map::new();
        for (i, c) in item.checklist.iter().enumerate() {
            let r = if met.contains(&i) { "是" } else { "否" };
            obj.insert(
                c.text().into(),
                serde_json::json!({"评判理由": "r", "评判结果": r, "weight": c.weight()}),
            );
        }
        serde_json::Value::Object(obj).to_string()
    }

    fn transcript(replies: &[&str]) -> Transcript {
        let mut t = Transcript::new();
        t.insert("followup".into(), StepOutput::scripted("回答"));
        for (j, r) in replies.iter().enumerate() {
            t.insert(Panel::key("judge", j), StepOutput::scripted(*r));
        }
        t
    }

    #[test]
    fn majority_votes_per_entry_and_a_tie_is_not_met() {
        let items = items();
        let item = &items[0]; // Mathematics, Error Correction, weighted entries
        assert!(item.checklist.len() >= 2);
        let r = [reply(item, &[0, 1]), reply(item, &[0]), reply(item, &[1])];
        let t = transcript(&[&r[0], &r[1], &r[2]]);
        let v: Vec<_> = (0..3)
            .map(|j| judge_verdicts(item, &t, Rule::Published, j))
            .collect();
        let Verdict::Scored(panel) = majority_verdict(item, &v) else {
            panic!("scored")
        };
        // Entry 0: 2 of 3; entry 1: 2 of 3; the others: 0 of 3.
        assert!(panel[0].met && panel[1].met);
        assert!(panel[2..].iter().all(|e| !e.met));
        assert_eq!(panel[0].reason, "panel: 2 of 3 judges said 是");
        // Two judges split on entry 1: a tie is not met.
        let two = [v[1].clone(), v[2].clone()];
        let Verdict::Scored(tie) = majority_verdict(item, &two) else {
            panic!("scored")
        };
        assert!(!tie[0].met && !tie[1].met, "1 of 2 is a tie");
        // An unreadable judge is left out; none readable is unscored.
        let bad = Verdict::unscored("no json");
        let one = [bad.clone(), v[0].clone()];
        let met = |v: &Verdict<Vec<CheckVerdict>>| -> Vec<bool> {
            v.scored().unwrap().iter().map(|e| e.met).collect()
        };
        assert_eq!(met(&majority_verdict(item, &one)), met(&v[0]));
        let none = majority_verdict(item, &[bad.clone(), bad]);
        assert!(matches!(none, Verdict::Unscored { reason } if reason.starts_with("no judge")));
    }

    #[test]
    fn mean_averages_the_judges_item_scores() {
        let items = items();
        let item = &items[0];
        let t = transcript(&[&reply(item, &[0, 1]), &reply(item, &[]), "prose"]);
        let v: Vec<_> = (0..3)
            .map(|j| judge_verdicts(item, &t, Rule::Published, j))
            .collect();
        let full = item_score(Rule::Published, item.bench_type, v[0].scored().unwrap()).value;
        let u = panel_unit(item, &v, Rule::Published, PanelRule::Mean);
        assert_eq!(u.score.map(|s| s.value), Some(full / 2.0), "judge 2 unread");
    }

    #[test]
    fn results_give_the_panel_and_every_judge() {
        let items = items();
        let replies: Vec<[String; 3]> = items
            .iter()
            .map(|i| [reply(i, &[0]), reply(i, &[0]), reply(i, &[])])
            .collect();
        let ts: Vec<Transcript> = replies
            .iter()
            .map(|r| transcript(&[&r[0], &r[1], &r[2]]))
            .collect();
        let runs: Vec<(&Item, &Transcript)> = items.iter().zip(&ts).collect();
        let panel = Panel {
            judges: 3,
            rule: PanelRule::Majority,
        };
        let cands = ["m".to_string()];
        let r = panel_results(
            "m",
            &runs,
            Rule::Published,
            1,
            panel,
            (&["a", "b", "m"], &cands),
        );
        let names: Vec<&str> = r.metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names[..3],
            ["error_correction", "response_maintenance", "overall"]
        );
        assert_eq!(names[3], "judge/0/error_correction");
        assert_eq!(names.len(), 12);
        // Judges 0 and 1 agree, so the panel is judge 0.
        assert_eq!(r.metrics[2].interval, r.metrics[5].interval);
        let t = r.tables.iter().find(|t| t.id == "panel_judges").unwrap();
        assert_eq!(texts(&t.rows[0])[0], "panel (majority)");
        assert!(texts(&t.rows[3])[0].contains("self-judging"));
        let k = r.tables.iter().find(|t| t.id == "judge_kappa").unwrap();
        assert_eq!(k.rows.len(), 4, "three pairs and Fleiss");
        assert!(texts(&k.rows[0])[1].starts_with("1.000"), "a and b agree");
    }
}
