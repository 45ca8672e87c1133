//! `report.md`: a run's results as Markdown tables (models, metrics with intervals and
//! unscored counts, the protocol's own tables, failed steps).
//!
//! It is written from [`RunResults`] alone, so it is as deterministic as `results.json`.
//! Numbers are written by [`super::format`], as in `report.html`; cells are escaped so that a
//! `|` or a newline in a model name or an error cannot break a table.

use std::fmt::Write;

use super::format::{self, metric_interval};
use super::RunResults;
use crate::bench::plan::Actor;
use crate::bench::table::Cell;

/// Renders the whole report; `notes` (how a replicated run's devices shared it) last, under
/// "Run notes".
pub fn render(r: &RunResults, notes: &[String]) -> String {
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
        let rows: Vec<Vec<Cell>> = r
            .models
            .iter()
            .map(|m| {
                vec![
                    m.role.clone().into(),
                    m.name.clone().into(),
                    m.sha256.clone().into(),
                ]
            })
            .collect();
        table(&mut out, "Models", &["role", "model", "sha256"], &rows);
    }
    let rows: Vec<Vec<Cell>> = r
        .results
        .metrics
        .iter()
        .map(|m| {
            let decimals = format::metric_decimals(&m.interval);
            vec![
                m.name.clone().into(),
                Cell::num(m.interval.value, decimals),
                metric_interval(&m.interval).into(),
                m.n.into(),
                m.unscored.into(),
                r.failed.len().into(),
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
        let rows: Vec<Vec<Cell>> = r
            .failed
            .iter()
            .map(|f| {
                let actor = match f.actor {
                    Actor::Candidate(i) => format!("candidate {i}"),
                    Actor::Judge => "judge".to_string(),
                    Actor::Panel(j) => format!("judge {j}"),
                };
                let skipped = f.skipped.map_or(Cell::from("?"), Cell::from);
                vec![
                    f.item.clone().into(),
                    f.key.clone().into(),
                    actor.into(),
                    f.error.clone().into(),
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
    if !notes.is_empty() {
        let _ = writeln!(out, "## Run notes\n");
        for n in notes {
            let _ = writeln!(out, "- {}", format::markdown(n));
        }
        out.push('\n');
    }
    out
}

fn table(out: &mut String, title: &str, columns: &[&str], rows: &[Vec<Cell>]) {
    let _ = writeln!(out, "## {}\n", format::markdown(title));
    let head: Vec<String> = columns.iter().map(|c| format::markdown(c)).collect();
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(columns.len().max(1)));
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .map(|c| format::markdown(&c.to_string()))
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::Interval;
    use crate::bench::stats::Metric;
    use crate::bench::table::{Cell, Table};
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
                    rows: vec![vec!["a".into(), Cell::Int(1)]],
                }],
            },
        };
        let md = render(&r, &[]);
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
        // Run notes (a replicated run's devices) come last, escaped as cells are.
        let notes = ["replica 0 on cpu: 2 items | x".to_string()];
        let with = render(&r, &notes);
        assert_eq!(
            with,
            format!("{want}## Run notes\n\n- replica 0 on cpu: 2 items \\| x\n\n")
        );
    }
}
