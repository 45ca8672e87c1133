//! `candor compare` on data nobody here wrote: the authors' published FB-Bench v3 judgements
//! (GPT-4o judging 13 models; four of them compared here) and ReaLMistake's published open
//! detectors (every pair of the seven). The expected lines are what
//! `tests/reference/compare_reference.py` prints (numpy, scipy, statsmodels, from the raw
//! files; its output is `tests/reference/compare_reference.txt`), matched at the printed
//! precision, test included: macro-averaged metrics are tested with their own weights. Also: runs that cannot be compared are refused,
//! the same inputs give byte-identical files, and `candor report` carries the section.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::util::shared_file;

/// What `python3 tests/reference/compare_reference.py ../shared/data` prints
/// (`tests/reference/compare_reference.txt`): block 0 the FB-Bench part (models
/// Qwen2.5-72B-Instruct, claude-3-5-sonnet-20241022, gpt-4o-2024-05-13, phi-4), block 1 the
/// ReaLMistake part (accuracy per (item, prompt), Holm over 21); one comparison a line.
fn reference(block: usize) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/compare_reference.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lines: Vec<String> = text
        .split("\n\n")
        .nth(block)
        .unwrap_or_else(|| panic!("{}: no block {block}", path.display()))
        .lines()
        .map(String::from)
        .collect();
    assert!(
        !lines.is_empty(),
        "{}: block {block} is empty",
        path.display()
    );
    lines
}

const MODELS: [&str; 4] = [
    "Qwen2.5-72B-Instruct",
    "claude-3-5-sonnet-20241022",
    "gpt-4o-2024-05-13",
    "phi-4",
];

fn candor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(args)
        .output()
        .expect("run candor")
}

fn ok(out: Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("candor-compare-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Checks `candor compare DIR --out OUT`'s output against the reference lines
/// (`metric: claim  (power; p unadjusted P; test T; left out N)`): the claims and power notes
/// in the printed text, the unadjusted p, the test and the left-out count in compare.json, and
/// that the printed line names a sign flip weighted over the metric's strata where it has
/// several.
fn check_against(dir: &Path, expected: &[String]) {
    let out = dir.join("out");
    let text = ok(
        candor(&[
            "compare",
            dir.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]),
        "candor compare",
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("compare.json")).unwrap()).unwrap();
    let rows = json["comparisons"].as_array().unwrap();
    assert_eq!(rows.len(), expected.len(), "{text}");
    for (line, row) in expected.iter().zip(rows) {
        let (metric, rest) = line.split_once(": ").unwrap();
        let (claim, rest) = rest.split_once("  (").unwrap();
        let (power, rest) = rest.split_once("; p unadjusted ").unwrap();
        let (p, rest) = rest.split_once("; test ").unwrap();
        let (test, left) = rest.split_once("; left out ").unwrap();
        let left = left.trim_end_matches(')');
        assert_eq!(row["metric"], metric);
        let printed = text
            .lines()
            .find(|l| l.starts_with(&format!("  {claim}  ({power}; ")))
            .unwrap_or_else(|| panic!("expected {claim:?} with {power:?} in\n{text}"));
        assert_eq!(format!("{:.4}", row["p"].as_f64().unwrap()), p, "{line}");
        assert_eq!(row["test"], test, "{line}");
        let strata = row["strata"].as_u64().unwrap();
        if test.starts_with("sign_flip") && strata > 1 {
            assert!(
                printed.contains(&format!("sign flip weighted over {strata} strata")),
                "{printed}"
            );
        } else if test == "mcnemar_exact" {
            assert!(printed.contains("McNemar exact ("), "{printed}");
        }
        assert_eq!(row["left_out"].to_string(), left, "{line}");
    }
}

#[test]
fn published_fbbench_models_compare_as_the_reference_computes() {
    let Some(judgments) = shared_file("fbbench/v3/judgments") else {
        return;
    };
    let judgments = judgments.canonicalize().unwrap();
    let dir = temp("fbbench");
    let input = dir.join("judgments");
    std::fs::create_dir_all(&input).unwrap();
    for m in MODELS {
        let name = format!("{m}.jsonl");
        std::os::unix::fs::symlink(judgments.join(&name), input.join(&name)).unwrap();
    }
    let scored = dir.join("scored");
    ok(
        candor(&[
            "score",
            "fbbench",
            "--judgments",
            input.to_str().unwrap(),
            "--out",
            scored.to_str().unwrap(),
        ]),
        "candor score fbbench",
    );
    assert!(scored.join("item_scores.json").is_file());
    check_against(&scored, &reference(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Accuracy is a mean over (task, response model, prompt) groups of unequal size, so its
/// binary items are compared with the weighted sign flip, not McNemar.
#[test]
fn published_realmistake_detectors_compare_as_the_reference_computes() {
    let Some(outputs) = shared_file("realmistake/detector_outputs_open.zip") else {
        return;
    };
    let dir = temp("realmistake");
    // Neither folder exists: `--item-scores` and `--out` create theirs.
    let scored = dir.join("scored");
    ok(
        candor(&[
            "score",
            "realmistake",
            "--outputs",
            outputs.to_str().unwrap(),
            "--out",
            dir.join("perf/performance.json").to_str().unwrap(),
            "--item-scores",
            scored.join("item_scores.json").to_str().unwrap(),
        ]),
        "candor score realmistake",
    );
    check_against(&scored, &reference(1));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A small `item_scores.json` of one candidate: `values` per item (`i0`, `i1`, …).
fn doc(name: &str, scoring: &str, values: &[f64]) -> String {
    let items: Vec<String> = (0..values.len()).map(|i| format!("i{i}")).collect();
    let vals: Vec<serde_json::Value> = items
        .iter()
        .zip(values)
        .map(|(id, v)| serde_json::json!({"id": id, "group": "g", "value": v}))
        .collect();
    serde_json::json!({
        "protocol": "toy", "data": "toy v1", "scoring": scoring, "items": items,
        "candidates": [{"name": name, "metrics": [
            {"metric": "score", "binary": false, "values": vals}
        ]}]
    })
    .to_string()
}

fn run_dir(root: &Path, name: &str, doc: &str) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("item_scores.json"), doc).unwrap();
    let results = r#"{"protocol": "toy", "models": [], "items": 48, "completed": 48,
        "samples": 48, "failed": [], "metrics": [], "tables": []}"#;
    std::fs::write(d.join("results.json"), results).unwrap();
    d
}

#[test]
fn compare_is_byte_identical_refuses_other_scoring_and_reaches_the_report() {
    let root = temp("toy");
    let a: Vec<f64> = (0..48).map(|i| 50.0 + (i % 5) as f64 * 10.0).collect();
    let b: Vec<f64> = a
        .iter()
        .enumerate()
        .map(|(i, v)| v - (i % 3) as f64 * 5.0)
        .collect();
    let da = run_dir(&root, "a", &doc("model-a", "rule=x", &a));
    let db = run_dir(&root, "b", &doc("model-b", "rule=x", &b));
    let (o1, o2) = (root.join("o1"), root.join("o2"));
    for o in [&o1, &o2] {
        let text = ok(
            candor(&[
                "compare",
                da.to_str().unwrap(),
                db.to_str().unwrap(),
                "--out",
                o.to_str().unwrap(),
            ]),
            "candor compare",
        );
        assert!(text.contains("model-a − model-b = +5.0 ["), "{text}");
    }
    for f in ["compare.md", "compare.html", "compare.json"] {
        assert_eq!(
            std::fs::read(o1.join(f)).unwrap(),
            std::fs::read(o2.join(f)).unwrap(),
            "{f}"
        );
    }
    let md = std::fs::read_to_string(o1.join("compare.md")).unwrap();
    assert!(md.starts_with("## Paired comparisons\n"), "{md}");
    assert!(md.contains("sign flip, normal approximation"), "{md}");
    // The report page of the two runs has the same section.
    let page = root.join("page");
    ok(
        candor(&[
            "report",
            da.to_str().unwrap(),
            db.to_str().unwrap(),
            "--out",
            page.to_str().unwrap(),
        ]),
        "candor report",
    );
    let html = std::fs::read_to_string(page.join("index.html")).unwrap();
    assert!(html.contains("<h2>Paired comparisons</h2>"), "{html}");
    assert!(html.contains("model-a − model-b = +5.0 ["), "{html}");
    // Scored by another rule: refused, with the reason, and nothing written.
    let dc = run_dir(&root, "c", &doc("model-c", "rule=y", &b));
    let o3 = root.join("o3");
    let out = candor(&[
        "compare",
        da.to_str().unwrap(),
        dc.to_str().unwrap(),
        "--out",
        o3.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot be compared: scored otherwise (\"rule=x\" vs \"rule=y\")"),
        "{err}"
    );
    assert!(!o3.exists());
    // One candidate: nothing to compare.
    let out = candor(&["compare", da.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing to compare: one candidate of toy"),
        "{err}"
    );
    // One candidate each of two protocols: said so, with the protocols and their runs.
    let other =
        doc("model-x", "rule=x", &a).replace("\"protocol\":\"toy\"", "\"protocol\":\"other\"");
    let dx = run_dir(&root, "x", &other);
    let out = candor(&["compare", da.to_str().unwrap(), dx.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "nothing to compare: the runs are of different protocols (other: {}; toy: {})",
            dx.display(),
            da.display()
        )),
        "{err}"
    );
    // A run without per-item scores says so.
    std::fs::remove_file(dc.join("item_scores.json")).unwrap();
    let out = candor(&["compare", dc.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the run has no per-item scores"));
    std::fs::remove_dir_all(&root).unwrap();
}

/// `item_scores.json` of a run directory, and the metric `name`'s values and left-out items.
fn item_values(dir: &Path, name: &str) -> (Vec<f64>, usize) {
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("item_scores.json")).unwrap()).unwrap();
    let m = doc["candidates"][0]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == name)
        .unwrap_or_else(|| panic!("no {name} in {doc}"));
    let values = m["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["value"].as_f64().unwrap())
        .collect();
    (values, m["left_out"].as_array().unwrap().len())
}

/// A metric's value and n in a run's results.json.
fn result_metric(dir: &Path, name: &str) -> (f64, u64) {
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("results.json")).unwrap()).unwrap();
    let m = r["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {r}"));
    (
        m["interval"]["value"].as_f64().unwrap_or(f64::NAN),
        m["n"].as_u64().unwrap(),
    )
}

/// Each item's values are the metric's: as many as its n, their mean its value.
fn values_make_the_metric(dir: &Path, name: &str) {
    let (values, _) = item_values(dir, name);
    let (value, n) = result_metric(dir, name);
    assert_eq!(values.len() as u64, n, "{name} in {}", dir.display());
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    assert!(
        (mean - value).abs() < 1e-9 || (n == 0 && value.is_nan()),
        "{name}: mean of the item values {mean} vs the metric {value}"
    );
}

#[test]
fn fennec_and_refutebench_runs_write_item_scores_that_compare() {
    let root = temp("protocols");
    // Fennec on a user's pairs (no data needed): two judges, the candidates compared.
    let pairs = root.join("pairs.jsonl");
    std::fs::write(
        &pairs,
        "{\"question\": \"Capital of France?\", \"answer_a\": \"Paris.\", \"answer_b\": \"Lyon.\", \"label\": \"a\"}\n\
         {\"question\": \"A prime?\", \"answer_a\": \"9\", \"answer_b\": \"7\", \"label\": \"b\"}\n\
         {\"question\": \"Say hello.\", \"answer_a\": \"Hello!\", \"answer_b\": \"Hi!\", \"label\": \"tie\"}\n\
         {\"question\": \"Two plus two?\", \"answer_a\": \"4\", \"answer_b\": \"5\"}\n",
    )
    .unwrap();
    let fennec = root.join("fennec");
    for judge in ["fake:j", "fake:k"] {
        let dir = fennec.join(judge.trim_start_matches("fake:"));
        ok(
            candor(&[
                "run",
                "fennec",
                "--model",
                judge,
                "--pairs",
                pairs.to_str().unwrap(),
                "--branches",
                "1",
                "--threads",
                "1",
                "--no-cache",
                "--out",
                dir.to_str().unwrap(),
            ]),
            "candor run fennec",
        );
        for m in ["agreement", "consistency", "first_position_preference"] {
            values_make_the_metric(&dir, m);
        }
        // The unlabelled pair is no item of Agreement; every pair is one of Consistency.
        let (a, a_out) = item_values(&dir, "agreement");
        let (c, c_out) = item_values(&dir, "consistency");
        assert_eq!(a.len() + a_out, 3);
        assert_eq!(c.len() + c_out, 4);
    }
    let text = ok(
        candor(&["compare", fennec.to_str().unwrap()]),
        "candor compare (fennec)",
    );
    // The fakes' replies are no verdicts: every pair is left out, counted (the values
    // themselves are checked against the metrics in the lib's tests).
    for m in ["agreement", "consistency", "first_position_preference"] {
        assert!(text.contains(&format!("fennec {m}:")), "{text}");
    }
    assert!(text.contains("fake:j − fake:k"), "{text}");
    assert!(text.contains("left out 4)"), "{text}");

    // RefuteBench on the published QA dialogues: two candidates, one FA judge.
    let Some(data) = shared_file("refutebench") else {
        return;
    };
    let refute = root.join("refutebench");
    for cand in ["fake:c1", "fake:c2"] {
        let dir = refute.join(cand.trim_start_matches("fake:"));
        ok(
            candor(&[
                "run",
                "refutebench",
                "--subset",
                "qa/memory_nc1",
                "--limit",
                "4",
                "--model",
                cand,
                "--judge",
                "fake:yes-j",
                "--threads",
                "1",
                "--no-cache",
                "--data",
                data.parent().unwrap().to_str().unwrap(),
                "--out",
                dir.to_str().unwrap(),
            ]),
            "candor run refutebench",
        );
        for m in ["qa_memory_nc1_rr", "qa_memory_nc1_fa"] {
            values_make_the_metric(&dir, m);
        }
    }
    let out = root.join("refute-out");
    let text = ok(
        candor(&[
            "compare",
            refute.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]),
        "candor compare (refutebench)",
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("compare.json")).unwrap()).unwrap();
    let rows = json["comparisons"].as_array().unwrap();
    let fa = rows
        .iter()
        .find(|r| r["metric"] == "qa_memory_nc1_fa")
        .unwrap_or_else(|| panic!("no FA comparison: {text}"));
    // FA is binary per judged feedback turn (McNemar); RR graded per dialogue (sign flip).
    assert_eq!(fa["test"], "mcnemar_exact", "{fa}");
    let (fa_values, _) = item_values(&refute.join("c1"), "qa_memory_nc1_fa");
    assert_eq!(fa["n"].as_u64().unwrap(), fa_values.len() as u64, "{fa}");
    let rr = rows
        .iter()
        .find(|r| r["metric"] == "qa_memory_nc1_rr")
        .unwrap_or_else(|| panic!("no RR comparison: {text}"));
    assert_ne!(rr["test"], "mcnemar_exact", "{rr}");
}
