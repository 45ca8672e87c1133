//! FB-Bench against the authors' published outputs: the judgement files rescored by Candor
//! must reproduce the published score tables (every cell within 0.01), through the library
//! and through `candor score fbbench`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candor::bench::fbbench::data::{load_answers, load_dataset, load_judgements, Version};
use candor::bench::fbbench::prompts::judge_messages;
use candor::bench::fbbench::published;
use candor::bench::fbbench::score::{
    published_tables, tables_for_version, units_from_records, ModelUnits, Rule,
};
use candor::bench::table::{texts, Table};

use crate::util::{reference_file, shared_file};

/// Reads a published CSV into (header, rows).
fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(path).expect("published csv");
    let header = r
        .headers()
        .expect("header")
        .iter()
        .map(String::from)
        .collect();
    let rows = r
        .records()
        .map(|rec| rec.expect("row").iter().map(String::from).collect())
        .collect();
    (header, rows)
}

fn load_models(dir: &Path) -> Vec<ModelUnits> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("judgments dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let records = load_judgements(p).expect("judgements load");
            ModelUnits {
                model: p.file_stem().unwrap().to_string_lossy().into_owned(),
                units: units_from_records(&records, Rule::Published, false).expect("units"),
            }
        })
        .collect()
}

fn close(a: &str, b: &str) -> bool {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => true,
        (false, false) => match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(x), Ok(y)) => (x - y).abs() <= 0.01 + 1e-9,
            _ => false,
        },
        _ => false,
    }
}

/// Compares our table to a published CSV, keyed by the row's label columns (model, and
/// the category for per-category tables), over the published value columns our table also
/// has (by name, or by position after the labels when `columns` maps them). Returns
/// (rows, value columns, matching cells, total cells, cells identical as text).
fn compare(
    ours: &Table,
    published: &Path,
    label_cols: usize,
    rename: &[(&str, &str)],
) -> (usize, usize, usize, usize, usize) {
    let (header, rows) = read_csv(published);
    let value_cols: Vec<(usize, usize)> = header
        .iter()
        .enumerate()
        .skip(label_cols)
        .map(|(i, name)| {
            let ours_name = rename
                .iter()
                .find(|(p, _)| p == name)
                .map_or(name.as_str(), |(_, o)| *o);
            let j = ours
                .columns
                .iter()
                .position(|c| c == ours_name)
                .unwrap_or_else(|| panic!("{}: no column {ours_name}", ours.title));
            (i, j)
        })
        .collect();
    // Our cells as the CSV writes them.
    let ours_rows: Vec<Vec<String>> = ours.rows.iter().map(|r| texts(r)).collect();
    let index: BTreeMap<Vec<String>, &Vec<String>> = ours_rows
        .iter()
        .map(|r| (r[..label_cols].to_vec(), r))
        .collect();
    let models: std::collections::BTreeSet<&str> =
        ours_rows.iter().map(|r| r[0].as_str()).collect();
    let mut n_rows = 0;
    let (mut good, mut total, mut same) = (0, 0, 0);
    for row in rows.iter().filter(|r| models.contains(r[0].as_str())) {
        n_rows += 1;
        let key = row[..label_cols].to_vec();
        let Some(mine) = index.get(&key) else {
            total += value_cols.len();
            eprintln!("{}: missing row {key:?}", ours.title);
            continue;
        };
        for &(i, j) in &value_cols {
            total += 1;
            same += usize::from(row[i] == mine[j]);
            if close(&row[i], &mine[j]) {
                good += 1;
            } else {
                eprintln!(
                    "{}: {key:?} {}: published {} ours {}",
                    ours.title, header[i], row[i], mine[j]
                );
            }
        }
    }
    (n_rows, value_cols.len(), good, total, same)
}

fn check_version(tag: &str, version: Version, expected_models: usize) {
    let Some(dir) = shared_file(&format!("fbbench/{tag}/judgments")) else {
        return;
    };
    let Some(tables_dir) = shared_file("fbbench/tables") else {
        return;
    };
    let models = load_models(&dir);
    assert_eq!(models.len(), expected_models);
    let ours = tables_for_version(published_tables(&models, Rule::Published), version);
    let names = [
        ("overall_score", "overall", 1),
        ("per_task_score", "per-task", 2),
        ("per_error_score", "per-error", 2),
        (
            "per_feedback_score_correct",
            "per-feedback (error correction)",
            2,
        ),
        (
            "per_feedback_score_antisyco",
            "per-feedback (response maintenance)",
            2,
        ),
    ];
    let mut failures = Vec::new();
    for (title, label, label_cols) in names {
        let table = ours.iter().find(|t| t.id == title).expect("table");
        let published = tables_dir.join(format!("{tag}_{title}.csv"));
        // The authors' column names, exactly and in their order.
        assert_eq!(
            table.columns,
            read_csv(&published).0,
            "{tag} {title} columns"
        );
        let (rows, cols, good, total, same) = compare(table, &published, label_cols, &[]);
        println!(
            "{tag} {label}: {rows} rows × {cols} cols = {good}/{total} cells within 0.01 \
             ({same} identical as text)"
        );
        // The published numbers are reproduced exactly: every cell identical as text (the
        // 0.01 tolerance only names the cells that differ, for the message).
        if same != total || good != total || total == 0 {
            failures.push(format!(
                "{tag} {label}: {same}/{total} identical ({good} within 0.01)"
            ));
        }
    }
    assert!(failures.is_empty(), "cells off: {failures:?}");
    // The same through the library's comparison, against the authors' .xlsx files where the
    // data folder has them (else the CSVs).
    let theirs = published::load(&tables_dir, version)
        .unwrap()
        .expect("published tables");
    for (path, t) in &theirs {
        let mine = ours.iter().find(|o| o.id == t.id).expect("table");
        let c = published::compare(mine, t);
        assert!(c.cells > 0, "{}", path.display());
        assert_eq!(
            (c.models, c.identical, c.unpublished.len()),
            (expected_models, c.cells, 0),
            "{}: {:?}",
            path.display(),
            c.differing
        );
    }
}

/// The authors' `.xlsx` tables hold the local copy's CSVs cell for cell: each CSV is its
/// workbook's rows for the models whose judgements are pinned, in the workbook's order (which
/// proves the reader on the real files; the workbooks list more models). The workplace's data
/// copy has only the CSV exports: ignored unless asked for (`-- --ignored`), and then a
/// failure without the workbooks (`candor data fetch fbbench --into DIR` fetches them; copy
/// the data folder with them added and set `CANDOR_DATA` to it).
#[test]
#[ignore = "needs the published .xlsx workbooks in $CANDOR_DATA/fbbench/tables (the workplace copy has only CSV exports); run with --ignored"]
fn fbbench_published_xlsx_hold_the_local_csv_cells() {
    for version in [Version::V1, Version::V3] {
        for id in published::TABLES {
            let rel = |ext| {
                published::table_path(Path::new("fbbench/tables"), version, id, ext)
                    .display()
                    .to_string()
            };
            let how = "a data folder holding both the local copy's CSV exports and the \
                       authors' .xlsx workbooks (`candor data fetch fbbench` fetches these)";
            let xlsx = reference_file(&rel("xlsx"), how);
            let csv = reference_file(&rel("csv"), how);
            let x = published::read_xlsx(&xlsx, id).unwrap();
            let c = published::read_csv(&csv, id).unwrap();
            assert_eq!(x.columns, c.columns, "{}", xlsx.display());
            let models: std::collections::BTreeSet<String> =
                c.rows.iter().map(|r| r[0].to_string()).collect();
            let kept: Vec<_> = x
                .rows
                .iter()
                .filter(|r| models.contains(&r[0].to_string()))
                .cloned()
                .collect();
            assert_eq!(kept, c.rows, "{}", xlsx.display());
            println!(
                "{}: {} of its {} rows are the CSV's {}",
                xlsx.display(),
                kept.len(),
                x.rows.len(),
                c.rows.len()
            );
        }
    }
}

#[test]
fn fbbench_v3_published_tables_reproduced() {
    check_version("v3", Version::V3, 13);
}

#[test]
fn fbbench_v1_published_tables_reproduced() {
    // The v1 overall table names its columns `Error_correct`, `Response_maintenance` and
    // has no EC-RM.
    check_version("v1", Version::V1, 2);
}

#[test]
fn fbbench_score_cli_writes_v1_tables_with_the_v1_column_names() {
    let Some(dir) = shared_file("fbbench/v1/judgments") else {
        return;
    };
    let Some(tables) = shared_file("fbbench/tables") else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(["score", "fbbench", "--judgments"])
        .arg(&dir)
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run candor");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for name in [
        "overall_score",
        "per_task_score",
        "per_error_score",
        "per_feedback_score_correct",
        "per_feedback_score_antisyco",
    ] {
        let first_line = |p: &Path| {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines().next().unwrap_or("").trim_end().to_string()
        };
        let ours = first_line(&out.path().join(format!("{name}.csv")));
        let theirs = first_line(&tables.join(format!("v1_{name}.csv")));
        assert_eq!(ours, theirs, "{name}.csv header");
    }
    let overall = std::fs::read_to_string(out.path().join("overall_score.csv")).unwrap();
    assert!(
        overall.starts_with("model,Error_correct,Response_maintenance,Overall\r\n"),
        "{overall}"
    );
}

#[test]
fn fbbench_paper_rule_differs_only_on_response_maintenance() {
    let Some(dir) = shared_file("fbbench/v3/judgments") else {
        return;
    };
    let models = load_models(&dir);
    let records = load_judgements(&dir.join("gpt-4o-2024-05-13.jsonl")).unwrap();
    let paper = units_from_records(&records, Rule::Paper, false).unwrap();
    let published = &models
        .iter()
        .find(|m| m.model == "gpt-4o-2024-05-13")
        .unwrap()
        .units;
    let pub_t = published_tables(
        &[ModelUnits {
            model: "m".into(),
            units: published.clone(),
        }],
        Rule::Published,
    );
    let paper_t = published_tables(
        &[ModelUnits {
            model: "m".into(),
            units: paper,
        }],
        Rule::Paper,
    );
    // Error Correction equal, Response Maintenance lower (all criteria vs any).
    assert_eq!(pub_t[0].rows[0][1], paper_t[0].rows[0][1]);
    let rm = |t: &[Table]| t[0].rows[0][2].value().unwrap().0;
    assert!(
        rm(&paper_t) < rm(&pub_t),
        "{} vs {}",
        rm(&paper_t),
        rm(&pub_t)
    );
}

#[test]
fn fbbench_internlm_judge_failure_is_flagged_and_scored_as_published() {
    let Some(path) = shared_file("fbbench/v3/judgments/internlm2_5-7b-chat.jsonl") else {
        return;
    };
    let records = load_judgements(&path).unwrap();
    for (rule, entered) in [(Rule::Published, 591), (Rule::Paper, 590)] {
        let units = units_from_records(&records, rule, false).unwrap();
        let flagged: Vec<_> = units.iter().filter(|u| u.unscored.is_some()).collect();
        assert_eq!(flagged.len(), 1);
        assert!(flagged[0]
            .unscored
            .as_deref()
            .unwrap()
            .contains("REPETITIVE PATTERNS"));
        assert_eq!(
            units.iter().filter(|u| u.score.is_some()).count(),
            entered,
            "{rule:?}"
        );
    }
}

#[test]
fn fbbench_loaders_read_every_published_file() {
    let Some(v1) = shared_file("fbbench/v1/fb_bench_dataset.json") else {
        return;
    };
    let Some(v3) = shared_file("fbbench/v3/fb_bench_dataset_v3.json") else {
        return;
    };
    let d1 = load_dataset(&v1).unwrap();
    let d3 = load_dataset(&v3).unwrap();
    assert_eq!((d1.version, d1.items.len()), (Version::V1, 734));
    assert_eq!((d3.version, d3.items.len()), (Version::V3, 591));
    // Every item renders a judge prompt for its version.
    for (d, v) in [(&d1, Version::V1), (&d3, Version::V3)] {
        for item in &d.items {
            let m = judge_messages(v, item, "回答").unwrap();
            assert!(m[0].content.contains(&item.feedback));
        }
    }
    let Some(answers) = shared_file("fbbench/v1/answers") else {
        return;
    };
    let mut n = 0;
    for e in std::fs::read_dir(answers).unwrap() {
        let a = load_answers(&e.unwrap().path()).unwrap();
        assert_eq!(a.len(), 734);
        n += 1;
    }
    assert_eq!(n, 3);
}

#[test]
fn fbbench_malformed_judgement_line_is_an_error_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let sample =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/fbbench/judgments/sample-model.jsonl");
    let text = std::fs::read_to_string(sample).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[2] = "{\"bench_type\": \"Error Correction\"}";
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let e = load_judgements(&bad).unwrap_err().to_string();
    assert!(e.contains("bad.jsonl:3: missing field"), "{e}");
}

#[test]
fn fbbench_score_cli_writes_the_five_tables() {
    let sample_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/fbbench/judgments");
    let out = tempfile::tempdir().unwrap();
    let nothing = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(["score", "fbbench", "--judgments"])
        .arg(&sample_dir)
        .arg("--out")
        .arg(out.path())
        .arg("--published")
        .arg(nothing.path())
        .output()
        .expect("run candor");
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(stdout.contains("sample-model"), "{stdout}");
    assert!(stdout.contains("REPETITIVE PATTERNS"), "{stdout}");
    // No published tables at hand: said, and the scoring completes.
    assert!(
        stdout.contains("published v3 tables: not available in"),
        "{stdout}"
    );
    let overall = std::fs::read_to_string(out.path().join("overall_score.csv")).unwrap();
    // Sample: EC Mathematics 0.75, EC Translation 1 → 87.5; RM Coding 1, Reasoning 0 and
    // the recorded failure 0 → (1 + 0) / 2 = 50; Overall (0.75 + 1 + 1 + 0) / 4 = 68.75.
    assert_eq!(
        overall,
        "model,Error Correction,Response Maintenance,Overall,EC-RM\r\nsample-model,87.5,50,68.75,37.5\r\n"
    );
    for name in [
        "per_task_score",
        "per_error_score",
        "per_feedback_score_correct",
        "per_feedback_score_antisyco",
    ] {
        assert!(out.path().join(format!("{name}.csv")).is_file(), "{name}");
    }
    let paper = std::process::Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(["score", "fbbench", "--rule", "paper", "--judgments"])
        .arg(&sample_dir)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    assert!(paper.status.success());
    let overall = std::fs::read_to_string(out.path().join("overall_score.csv")).unwrap();
    // Paper rule: the RM Coding item met only one of its two criteria → 0; the failure is
    // left out; RM = 0, shown as 0 (not empty) under the paper rule.
    assert!(overall.contains("sample-model,87.5,0,"), "{overall}");
}

#[test]
fn fbbench_plan_ids_are_unique_and_every_item_plans_two_steps() {
    use candor::bench::fbbench::plan::{FbBenchPlan, FOLLOWUP, JUDGE};
    use candor::bench::plan::{Plan, StepOutput, Transcript};
    for (rel, version) in [
        ("fbbench/v1/fb_bench_dataset.json", Version::V1),
        ("fbbench/v3/fb_bench_dataset_v3.json", Version::V3),
    ] {
        let Some(path) = shared_file(rel) else {
            return;
        };
        let data = load_dataset(&path).unwrap();
        let plan = FbBenchPlan::new(version, 0, &data.items).unwrap();
        let ids: std::collections::BTreeSet<String> =
            data.items.iter().map(|i| plan.item_id(i)).collect();
        assert_eq!(ids.len(), data.items.len(), "{rel}");
        for item in &data.items {
            let mut done = Transcript::new();
            let first = plan.next_steps(item, &done);
            assert_eq!(first.len(), 1);
            assert_eq!(first[0].key, FOLLOWUP);
            done.insert(
                FOLLOWUP.into(),
                StepOutput {
                    text: "回答".into(),
                    stop_reason: candor::engine::StopReason::Eos,
                    prompt_tokens: 0,
                    output_tokens: 0,
                    truncated: None,
                    reasoning: None,
                },
            );
            let second = plan.next_steps(item, &done);
            assert_eq!(second.len(), 1);
            assert_eq!(second[0].key, JUDGE);
        }
    }
}
