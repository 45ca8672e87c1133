//! ReaLMistake against the authors' published outputs: their predictions reproduce their
//! `performance.json`, and Candor's verdict parser reproduces their predictions.

use std::path::{Path, PathBuf};
use std::process::Command;

use candor::bench::realmistake::{data, performance, score};

use crate::util::shared_file;

struct Shared {
    outputs: PathBuf,
    benchmark: PathBuf,
    published: PathBuf,
}

fn shared() -> Option<Shared> {
    Some(Shared {
        outputs: shared_file("realmistake/detector_outputs_open.zip")?,
        benchmark: shared_file("realmistake/data.zip")?,
        published: shared_file("realmistake/published_performance.json")?,
    })
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("readable");
    serde_json::from_str(&text).expect("json")
}

fn cells(s: &Shared, source: score::Predictions) -> Vec<score::Cell> {
    let files = data::load_detector_outputs(&s.outputs).expect("outputs load");
    let bench = data::load_benchmark(&s.benchmark).expect("benchmark loads");
    files
        .iter()
        .map(|f| score::cell(f, Some(&bench), source).expect("ids match"))
        .collect()
}

#[test]
fn benchmark_loads_900_items() {
    let Some(s) = shared() else { return };
    let bench = data::load_benchmark(&s.benchmark).expect("loads");
    assert_eq!(bench.len(), 6);
    assert_eq!(bench.values().map(Vec::len).sum::<usize>(), 900);
}

#[test]
fn published_predictions_reproduce_published_performance() {
    let Some(s) = shared() else { return };
    let cells = cells(&s, score::Predictions::Published);
    // 7 open detectors x 4 prompts x 3 tasks x 2 response models.
    assert_eq!(cells.len(), 168);
    let ours = performance::performance_json(&cells);
    let published = read_json(&s.published);
    let (ok, n, notes) = performance::compare_cells(&ours, &published, 1e-12);
    eprintln!("realmistake: {ok}/{n} published cells reproduced");
    assert_eq!((ok, n), (168, 168), "differing: {notes:?}");

    // The averages over prompts (per task) and over tasks, mean and stdev.
    let mut averages = 0;
    let close = |a: &serde_json::Value, b: &serde_json::Value| {
        let m = a["metrics"].as_object().expect("metrics");
        assert!(!m.is_empty());
        for (k, v) in m {
            for stat in ["average", "stdev"] {
                let (x, y) = (v[stat].as_f64(), b["metrics"][k][stat].as_f64());
                assert!(
                    matches!((x, y), (Some(x), Some(y)) if (x - y).abs() < 1e-12),
                    "{k} {stat}: {x:?} vs {y:?}"
                );
            }
        }
        assert_eq!(a["total_num"], b["total_num"]);
        assert_eq!(a["gold_error_num"], b["gold_error_num"]);
    };
    for (task, models) in ours.as_object().expect("object") {
        for (model, dets) in models.as_object().expect("object") {
            for (det, entry) in dets.as_object().expect("object") {
                let theirs = &published[task][model][det]["average"];
                close(&entry["average"], theirs);
                averages += 1;
            }
        }
    }
    // 3 tasks x 2 models x 7 detectors per-task averages + 2 x 7 overall averages.
    assert_eq!(averages, 42 + 14);
}

#[test]
fn candor_parser_agrees_with_published_predictions() {
    let Some(s) = shared() else { return };
    let files = data::load_detector_outputs(&s.outputs).expect("outputs load");
    let records: Vec<_> = files.iter().flat_map(|f| &f.records).collect();
    let agree = records
        .iter()
        .filter(|r| {
            candor::judge::error_detection::parse_detection(&r.response)
                .scored()
                .copied()
                == r.prediction
        })
        .count();
    eprintln!(
        "realmistake: Candor's parser agrees with {agree}/{} published predictions",
        records.len()
    );
    assert_eq!(records.len(), 25200);
    let differing: Vec<_> = records
        .iter()
        .filter(|r| {
            candor::judge::error_detection::parse_detection(&r.response)
                .scored()
                .copied()
                != r.prediction
        })
        .take(3)
        .map(|r| {
            (
                r.prediction,
                r.response.chars().take(200).collect::<String>(),
            )
        })
        .collect();
    assert_eq!(agree, records.len(), "first differing: {differing:?}");
}

fn candor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_candor"))
}

#[test]
fn score_cli_writes_and_compares_the_published_structure() {
    let Some(s) = shared() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("perf.json");
    let output = candor()
        .args(["score", "realmistake", "--outputs"])
        .arg(&s.outputs)
        .arg("--data")
        .arg(&s.benchmark)
        .arg("--out")
        .arg(&out)
        .arg("--compare")
        .arg(&s.published)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("168/168 cells match"), "{stdout}");
    let written = read_json(&out);
    assert!(
        written["average"]["initial_model=gpt-4-0613"]["baseline_model=Qwen/Qwen1.5-72B-Chat"]
            .is_object()
    );

    let reparsed = candor()
        .args(["score", "realmistake", "--reparse", "--outputs"])
        .arg(&s.outputs)
        .arg("--out")
        .arg(dir.path().join("reparsed.json"))
        .arg("--compare")
        .arg(&s.published)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&reparsed.stdout);
    assert!(reparsed.status.success(), "{stdout}");
    assert!(
        stdout.contains("parser agrees with the published predictions on 25200/25200"),
        "{stdout}"
    );
    assert!(stdout.contains("168/168 cells match"), "{stdout}");
    eprintln!(
        "{}",
        stdout
            .lines()
            .filter(|l| l.contains("agrees") || l.contains("cells match"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn sample() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/realmistake/sample")
}

#[test]
fn score_cli_on_our_own_sample() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("perf.json");
    let output = candor()
        .args(["score", "realmistake", "--outputs"])
        .arg(sample().join("outputs"))
        .arg("--data")
        .arg(sample())
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let v = read_json(&out);
    let det = &v["math_word_problem_generation"]["initial_model=gpt-4-0613"]
        ["baseline_model=toy-detector"];
    let p1 = &det["prompt=baseline_errordetection_prompt_1"];
    // One true negative, one true positive, one missing verdict on an error item.
    assert_eq!(p1["metrics"]["precision"], serde_json::json!(1.0));
    assert_eq!(p1["metrics"]["recall"], serde_json::json!(0.5));
    assert_eq!(p1["metrics"]["accuracy"].as_f64(), Some(2.0 / 3.0));
    let p3 = &det["prompt=baseline_errordetection_prompt_3"];
    assert_eq!(p3["prediction_error_num"], serde_json::json!(3));
    assert_eq!(
        det["average"]["metrics"]["recall"]["average"],
        serde_json::json!(0.75)
    );
}

#[test]
fn malformed_output_line_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().join("t/m/d");
    std::fs::create_dir_all(&d).expect("mkdir");
    let good =
        r#"{"response": "r", "prediction": "error", "label": "error", "metadata": {"id": "a"}}"#;
    std::fs::write(
        d.join("baseline_errordetection_prompt_2.jsonl"),
        format!("{good}\n{{\"response\": 3}}\n"),
    )
    .expect("write");
    let err = data::load_detector_outputs(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("t/m/d/baseline_errordetection_prompt_2.jsonl:2: "),
        "{err}"
    );
}

#[test]
fn wrong_item_order_is_an_error() {
    let bench = data::load_benchmark(&sample()).expect("sample loads");
    let mut files = data::load_detector_outputs(&sample().join("outputs")).expect("loads");
    files[0].records.swap(0, 1);
    let err = score::cell(&files[0], Some(&bench), score::Predictions::Published)
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 1"), "{err}");
}
