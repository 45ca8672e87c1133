//! `report.md`: a run's results as Markdown tables (models, metrics with intervals and
//! unscored counts, the protocol's own tables, failed steps).
//!
//! It is written from [`RunResults`] alone, so it is as deterministic as `results.json`.
//! Numbers are shown with four decimals; cells are escaped so that a `|` or a newline in a
//! model name or an error cannot break a table.

use std::fmt::Write;

use super::RunResults;
use crate::bench::plan::Actor;

/// Renders the whole report.
pub fn render(r: &RunResults) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Candor run: {}\n", r.protocol);
    let _ = writeln!(
        out,
        "{} items, {} completed, {} failed (their {} later steps skipped), {} samples.\n",
        r.items,
        r.completed,
        r.failed.len(),
        r.skipped_steps,
        r.samples
    );
    if !r.models.is_empty() {
        let rows: Vec<Vec<String>> = r
            .models
            .iter()
            .map(|m| vec![m.role.clone(), m.name.clone(), m.sha256.clone()])
            .collect();
        table(&mut out, "Models", &["role", "model", "sha256"], &rows);
    }
    let rows: Vec<Vec<String>> = r
        .results
        .metrics
        .iter()
        .map(|m| {
            vec![
                m.name.clone(),
                num(m.interval.value),
                format!("[{}, {}]", num(m.interval.low), num(m.interval.high)),
                m.n.to_string(),
                m.unscored.to_string(),
                r.failed.len().to_string(),
            ]
        })
        .collect();
    table(
        &mut out,
        "Metrics",
        &["metric", "value", "95% interval", "n", "unscored", "failed"],
        &rows,
    );
    for t in &r.results.tables {
        let cols: Vec<&str> = t.columns.iter().map(String::as_str).collect();
        table(&mut out, &t.title, &cols, &t.rows);
    }
    if !r.failed.is_empty() {
        let rows: Vec<Vec<String>> = r
            .failed
            .iter()
            .map(|f| {
                let actor = match f.actor {
                    Actor::Candidate(i) => format!("candidate {i}"),
                    Actor::Judge => "judge".to_string(),
                };
                let skipped = f.skipped.map_or("?".to_string(), |n| n.to_string());
                vec![
                    f.item.clone(),
                    f.key.clone(),
                    actor,
                    f.error.clone(),
                    skipped,
                ]
            })
            .collect();
        table(
            &mut out,
            "Failed steps",
            &["item", "step", "actor", "error", "later steps skipped"],
            &rows,
        );
    }
    out
}

/// A number with four decimals, `n/a` when not finite.
fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "n/a".to_string()
    }
}

fn cell(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace("\r\n", " ")
        .replace(['\n', '\r'], " ")
}

fn table(out: &mut String, title: &str, columns: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(out, "## {}\n", cell(title));
    let head: Vec<String> = columns.iter().map(|c| cell(c)).collect();
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(columns.len().max(1)));
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::Interval;
    use crate::bench::stats::Metric;
    use crate::bench::table::Table;
    use crate::bench::BenchResults;
    use crate::store::run_results::{FailedStep, RunModel};

    #[test]
    fn renders_metrics_tables_and_failures() {
        let r = RunResults {
            protocol: "toy".into(),
            models: vec![RunModel {
                role: "judge".into(),
                name: "fake|x".into(),
                sha256: "ab".into(),
            }],
            items: 3,
            completed: 2,
            samples: 7,
            skipped_steps: 3,
            failed: vec![FailedStep {
                item: "c".into(),
                key: "turn/1".into(),
                actor: Actor::Candidate(0),
                error: "line one\nline two".into(),
                skipped: Some(3),
            }],
            results: BenchResults {
                metrics: vec![Metric {
                    name: "score".into(),
                    interval: Interval {
                        value: 0.5,
                        low: 0.25,
                        high: f64::NAN,
                    },
                    n: 2,
                    unscored: 1,
                }],
                tables: vec![Table {
                    id: "per_item".into(),
                    title: "Per item".into(),
                    columns: vec!["item".into(), "score".into()],
                    rows: vec![vec!["a".into(), "1".into()]],
                }],
            },
        };
        let md = render(&r);
        let want = "\
# Candor run: toy

3 items, 2 completed, 1 failed (their 3 later steps skipped), 7 samples.

## Models

| role | model | sha256 |
|---|---|---|
| judge | fake\\|x | ab |

## Metrics

| metric | value | 95% interval | n | unscored | failed |
|---|---|---|---|---|---|
| score | 0.5000 | [0.2500, n/a] | 2 | 1 | 1 |

## Per item

| item | score |
|---|---|
| a | 1 |

## Failed steps

| item | step | actor | error | later steps skipped |
|---|---|---|---|---|
| c | turn/1 | candidate 0 | line one line two | 3 |

";
        assert_eq!(md, want);
    }
}
