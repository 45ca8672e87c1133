//! Users' own data: `candor run fennec --pairs`, `fbbench --items`, `realmistake --items`.
//! Each format parses into the published sets' items, bad lines are refused with
//! `FILE:LINE: field`, and a run on a tiny file writes results, resumes without regenerating
//! and refuses a changed file. The runs use `fake:` models (no weights, no data).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use candor::bench::{fbbench, fennec, realmistake};

fn candor() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_candor"));
    c.stdin(Stdio::null());
    c.env("CANDOR_NO_CACHE", "1");
    c
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("candor-own-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

const PAIRS: &str = r#"{"id": "capital", "question": "Capital of France?", "answer_a": "Paris.", "answer_b": "Lyon.", "label": "a"}
{"question": "A prime?", "answer_a": "9", "answer_b": "7", "label": "tie"}
{"question": "Say hello.", "answer_a": "Hello!", "answer_b": "Hi!"}
"#;

const FB: &str = r#"[
{"bench_type": "Error Correction", "task_type": "Math", "user_query": "2+2?", "origin_first_response": "5.", "feedback": "Wrong.", "checklist": [["Says 4", 0.7], ["Admits the mistake", 0.3]]},
{"bench_type": "Response Maintenance", "user_query": "Is the Earth round?", "origin_first_response": "Yes.", "feedback": "No, flat.", "checklist": ["Keeps saying round"]}
]"#;

const RM: &str = r#"{"id": "sum", "input": "3+4?", "response": "8.", "label": "error"}
{"input": "A colour.", "response": "Blue.", "label": "no_error"}
{"input": "An even number.", "response": "6"}
"#;

#[test]
fn own_formats_parse_into_the_published_items() {
    let p = Path::new("pairs.jsonl");
    let items = fennec::data::parse_pairs(PAIRS, p).unwrap();
    let ids: Vec<&str> = items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["capital", "2", "3"]);
    use fennec::data::Preference;
    assert_eq!(items[0].label, Some(Preference::A));
    assert_eq!(items[1].label, Some(Preference::Tie));
    assert_eq!(items[2].label, None);
    assert_eq!(items[0].response_b, "Lyon.");

    let fb = fbbench::data::parse_own_items(FB, Path::new("fb.json")).unwrap();
    assert_eq!(fb.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(
        fb[0].1.criteria()[0].weight.as_ref().unwrap().to_string(),
        "0.7"
    );
    assert_eq!(fb[1].1.task_type, "own");
    // One item per line is read too.
    let lines = FB
        .trim_start_matches("[\n")
        .trim_end_matches("\n]")
        .replace("},\n", "}\n");
    let fb2 = fbbench::data::parse_own_items(&lines, Path::new("fb.jsonl")).unwrap();
    assert_eq!(fb2[1].1, fb[1].1);

    let rm = realmistake::data::parse_own_items(RM, Path::new("rm.jsonl")).unwrap();
    use candor::judge::error_detection::Detection;
    assert_eq!(rm[0].label, Some(Detection::Error));
    assert_eq!((rm[2].id.as_str(), rm[2].label), ("3", None));
    assert_eq!(rm[1].llm_response, "Blue.");
}

#[test]
fn bad_lines_are_refused_with_file_line_and_field() {
    let good = r#"{"question": "q", "answer_a": "a", "answer_b": "b"}"#;
    let pairs = |bad: &str| {
        let text = format!("{good}\n{bad}\n");
        fennec::data::parse_pairs(&text, Path::new("p.jsonl"))
            .unwrap_err()
            .to_string()
    };
    let cases = [
        (
            r#"{"question": "q", "answer_a": "a"}"#,
            "p.jsonl:2: field `answer_b`: missing",
        ),
        (
            r#"{"question": 3, "answer_a": "a", "answer_b": "b"}"#,
            "p.jsonl:2: field `question`: expected a string, got a number",
        ),
        (
            r#"{"question": "q", "answer_a": "a", "answer_b": "b", "label": "x"}"#,
            "p.jsonl:2: field `label`: \"x\" is not",
        ),
        (
            r#"{"question": "q", "answer_a": "a", "answer_b": "b", "lable": "a"}"#,
            "p.jsonl:2: field `lable`: unknown field",
        ),
        (
            r#"{"id": "1", "question": "q", "answer_a": "a", "answer_b": "b"}"#,
            "p.jsonl:2: field `id`: duplicate id \"1\" (first on line 1)",
        ),
        ("{not json", "p.jsonl:2: not JSON"),
    ];
    for (bad, want) in cases {
        let e = pairs(bad);
        assert!(e.starts_with(want), "{bad}: {e}");
    }
    let e = fennec::data::parse_pairs("\n", Path::new("p.jsonl")).unwrap_err();
    assert_eq!(e.to_string(), "p.jsonl: no items (the file is empty)");

    let rm = |text: &str| {
        realmistake::data::parse_own_items(text, Path::new("r.jsonl"))
            .unwrap_err()
            .to_string()
    };
    assert!(rm(r#"{"input": "i"}"#).starts_with("r.jsonl:1: field `response`: missing"));
    assert!(rm(r#"{"input": "i", "response": "r", "label": "yes"}"#)
        .starts_with("r.jsonl:1: field `label`: \"yes\" is not \"error\" or \"no_error\""));

    let fb = |text: String| {
        fbbench::data::parse_own_items(&text, Path::new("f.json"))
            .unwrap_err()
            .to_string()
    };
    let e = fb(FB.replace("0.7]", "1.5]"));
    assert!(
        e.starts_with("f.json:2: field `checklist`: checklist weight 1.5"),
        "{e}"
    );
    let e = fb(FB.replace("\"Response Maintenance\"", "\"Other\""));
    assert!(
        e.starts_with("f.json:3: field `bench_type`: \"Other\" is not"),
        "{e}"
    );
    let e = fb(FB.replace("\"feedback\": \"No, flat.\", ", ""));
    assert!(e.starts_with("f.json:3: field `feedback`: missing"), "{e}");
    let e = fb(FB.replace("[\"Keeps saying round\"]", "\"Keeps\""));
    assert!(
        e.starts_with("f.json:3: field `checklist`: expected an array, got a string"),
        "{e}"
    );
}

/// Runs `candor run <args> --out <out>`; returns the output.
fn run(args: &[&str], out: &Path) -> Output {
    candor()
        .arg("run")
        .args(args)
        .args(["--threads", "1", "--out"])
        .arg(out)
        .output()
        .unwrap()
}

fn ok(o: Output) -> (String, String) {
    let (so, se) = (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    );
    assert!(o.status.success(), "{so}\n{se}");
    (so, se)
}

fn results(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap()
}

fn metric<'a>(r: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    r["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no metric {name}: {r}"))
}

/// Runs, reruns (resumed, nothing computed), then changes the file: refused, nothing written.
fn end_to_end(dir: &Path, file: &Path, text: &str, args: &[&str]) -> serde_json::Value {
    std::fs::write(file, text).unwrap();
    let out = dir.join("run");
    ok(run(args, &out));
    let first = std::fs::read(out.join("results.json")).unwrap();
    let manifest = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    assert!(manifest.contains(&file.display().to_string()), "{manifest}");
    let (_, se) = ok(run(args, &out));
    assert!(
        se.contains("resumed:") && se.contains(" 0 computed"),
        "{se}"
    );
    assert_eq!(std::fs::read(out.join("results.json")).unwrap(), first);
    std::fs::write(file, text.replacen('?', "??", 1)).unwrap();
    let o = run(args, &out);
    assert!(!o.status.success(), "a changed file must be refused");
    let se = String::from_utf8_lossy(&o.stderr);
    assert!(se.contains("data_files"), "{se}");
    assert_eq!(std::fs::read(out.join("results.json")).unwrap(), first);
    results(&out)
}

#[test]
fn fennec_pairs_run_resume_and_change() {
    let d = tmp("fennec");
    let f = d.join("pairs.jsonl");
    let fs = f.display().to_string();
    let args = [
        "fennec",
        "--model",
        "fake:j",
        "--pairs",
        &fs,
        "--branches",
        "1",
    ];
    let r = end_to_end(&d, &f, PAIRS, &args);
    assert_eq!(r["items"], 3);
    // Agreement over the two labelled pairs at most; Consistency over all scored pairs.
    let (a, c) = (metric(&r, "agreement"), metric(&r, "consistency"));
    assert!(
        a["n"].as_u64().unwrap() <= 2 && c["n"].as_u64().unwrap() >= a["n"].as_u64().unwrap(),
        "{r}"
    );
    // Without any label, Agreement is n/a (null).
    let unlabelled: String = PAIRS
        .lines()
        .map(|l| {
            format!(
                "{}}}\n",
                l.split(", \"label\"").next().unwrap().trim_end_matches('}')
            )
        })
        .collect();
    let r = end_to_end(
        &tmp("fennec-nolabel"),
        &d.join("u.jsonl"),
        &unlabelled,
        &[
            "fennec",
            "--model",
            "fake:j",
            "--pairs",
            &d.join("u.jsonl").display().to_string(),
            "--branches",
            "1",
        ],
    );
    assert!(
        metric(&r, "agreement")["interval"]["value"].is_null(),
        "{r}"
    );
    assert_eq!(metric(&r, "agreement")["n"], 0);
}

#[test]
fn fbbench_items_run_resume_and_change() {
    let d = tmp("fbbench");
    let f = d.join("items.json");
    let fs = f.display().to_string();
    let args = [
        "fbbench", "--model", "fake:c", "--judge", "fake:j", "--items", &fs,
    ];
    let r = end_to_end(&d, &f, FB, &args);
    assert_eq!(r["items"], 2);
    assert_eq!(r["completed"], 2);
}

#[test]
fn realmistake_items_run_resume_and_change() {
    let d = tmp("realmistake");
    let f = d.join("items.jsonl");
    let fs = f.display().to_string();
    let args = [
        "realmistake",
        "--model",
        "fake:d",
        "--items",
        &fs,
        "--prompt",
        "1-A",
    ];
    let r = end_to_end(&d, &f, RM, &args);
    assert_eq!(r["items"], 3);
    // Metrics over the two labelled items; every item has a prediction line.
    let preds = std::fs::read_to_string(d.join("run/predictions.jsonl")).unwrap();
    assert_eq!(preds.lines().count(), 3, "{preds}");
    assert!(
        preds.lines().last().unwrap().contains("\"label\":null"),
        "{preds}"
    );
    assert_eq!(metric(&r, "f1")["n"], 2, "{r}");
}

#[test]
fn an_invalid_file_writes_nothing() {
    let d = tmp("invalid");
    let f = d.join("p.jsonl");
    std::fs::write(&f, "{\"question\": \"q\"}\n").unwrap();
    let out = d.join("run");
    let o = run(
        &[
            "fennec",
            "--model",
            "fake:j",
            "--pairs",
            &f.display().to_string(),
        ],
        &out,
    );
    assert!(!o.status.success());
    let se = String::from_utf8_lossy(&o.stderr);
    assert!(
        se.contains(&format!("{}:1: field `answer_a`: missing", f.display())),
        "{se}"
    );
    assert!(!out.join("manifest.json").exists());
}
