//! Fennec's evaluation sets and metrics against the published data: Auto-J's own verdicts give
//! the Auto-J row of Fennec's Table 2 (Agreement 54.96, Consistency 83.41).

use std::path::PathBuf;
use std::process::Command;

use candor::bench::fennec::{data, score};
use candor::bench::table::texts;

use crate::util::shared_file;

fn candor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_candor"))
}

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data/fennec")
        .join(name)
}

#[test]
fn auto_j_outputs_give_published_agreement_and_consistency() {
    let (Some(items), Some(normal), Some(exchanged)) = (
        shared_file("fennec/auto-j/testdata_pairwise.jsonl"),
        shared_file("fennec/auto-j/pairwise_example_output.jsonl"),
        shared_file("fennec/auto-j/pairwise_exchange_example_output.jsonl"),
    ) else {
        return;
    };
    let items = data::load_autoj(&items).expect("loads");
    assert_eq!(items.len(), 1392);
    let n = data::load_verdicts(&normal).expect("loads");
    let e = data::load_verdicts(&exchanged).expect("loads");
    let outcomes =
        score::pair_outcomes(&items, (&normal, n.clone()), (&exchanged, e)).expect("counts");
    let r = score::pairwise_results(&outcomes, 0);
    let agreement = score::percent(r.metrics[0].interval.value).to_string();
    let consistency = score::percent(r.metrics[1].interval.value).to_string();
    eprintln!("fennec: Auto-J agreement {agreement}, consistency {consistency}");
    assert_eq!(
        (agreement.as_str(), consistency.as_str()),
        ("54.96", "83.41")
    );
    let iv = r.metrics[0].interval;
    assert!(iv.low < iv.value && iv.value < iv.high, "{iv:?}");
    // Auto-J's README, per group (agreement, consistency).
    let expected = [
        ("Summarization", "45.83", "73.61"),
        ("Exam Questions", "38.89", "69.44"),
        ("Code", "47.50", "75.83"),
        ("Rewriting", "49.17", "74.17"),
        ("Creative Writing", "59.72", "87.04"),
        ("Functional Writing", "61.67", "81.67"),
        ("General Communication", "55.21", "92.36"),
        ("NLP Tasks", "57.58", "86.36"),
        ("Overall", "54.96", "83.41"),
    ];
    let rows: Vec<Vec<String>> = r.tables[0].rows.iter().map(|row| texts(row)).collect();
    let rows: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|row| (row[0].as_str(), row[1].as_str(), row[2].as_str()))
        .collect();
    assert_eq!(rows, expected);
    // Auto-J's README, type "single": 59.99.
    let single = score::single_outcomes(&items, (&normal, n)).expect("counts");
    let s = score::single_results(&single, 0);
    assert_eq!(
        score::percent(s.metrics[0].interval.value).to_string(),
        "59.99"
    );
}

#[test]
fn pandalm_and_mt_bench_load() {
    let (Some(panda), Some(mt)) = (
        shared_file("fennec/pandalm/testset-v1.json"),
        shared_file("fennec/mt_bench/question.jsonl"),
    ) else {
        return;
    };
    let items = data::load_pandalm(&panda, data::PandaLabel::Annotator1).expect("loads");
    assert_eq!(items.len(), 999);
    // Fennec's code reads annotator1; 38 of its labels differ from the majority of three.
    let majority = data::load_pandalm(&panda, data::PandaLabel::Majority).expect("loads");
    let differ = items
        .iter()
        .zip(&majority)
        .filter(|(a, m)| a.label != m.label)
        .count();
    assert_eq!(differ, 38);
    let ties = items
        .iter()
        .filter(|i| i.label == Some(data::Preference::Tie))
        .count();
    assert!(ties > 0 && ties < 999);
    let qs = data::load_mt_bench(&mt).expect("loads");
    assert_eq!(qs.len(), 80);
    assert!(qs.iter().all(|q| q.turns.len() == 2));
}

#[test]
fn score_cli_prints_and_writes_agreement() {
    let (Some(items), Some(normal), Some(exchanged)) = (
        shared_file("fennec/auto-j/testdata_pairwise.jsonl"),
        shared_file("fennec/auto-j/pairwise_example_output.jsonl"),
        shared_file("fennec/auto-j/pairwise_exchange_example_output.jsonl"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("fennec.json");
    let o = candor()
        .args(["score", "fennec", "--format", "auto-j", "--data"])
        .arg(&items)
        .arg("--normal")
        .arg(&normal)
        .arg("--exchanged")
        .arg(&exchanged)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("agreement: 54.96"), "{stdout}");
    assert!(stdout.contains("consistency: 83.41"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("written")).expect("json");
    assert_eq!(v["metrics"][0]["name"], "agreement");
}

#[test]
fn score_cli_on_our_own_sample() {
    let o = candor()
        .args(["score", "fennec", "--format", "auto-j", "--data"])
        .arg(sample("pairwise_sample.jsonl"))
        .arg("--normal")
        .arg(sample("verdicts_normal_sample.jsonl"))
        .arg("--exchanged")
        .arg(sample("verdicts_exchanged_sample.jsonl"))
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Items 1 and 2 agree in both orders; item 3 flips; item 4 has no normal verdict.
    assert!(stdout.contains("agreement: 66.67"), "{stdout}");
    assert!(stdout.contains("(n = 3, unscored = 1)"), "{stdout}");

    let panda = data::load_pandalm(&sample("pandalm_sample.json"), data::PandaLabel::Majority)
        .expect("loads");
    assert_eq!(
        panda.iter().map(|i| i.label).collect::<Vec<_>>(),
        [Some(data::Preference::A), Some(data::Preference::Tie)]
    );
}

#[test]
fn score_cli_names_bad_verdict_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"output\": 0}\n{\"output\": \"A\"}\n").expect("write");
    let o = candor()
        .args(["score", "fennec", "--format", "auto-j", "--data"])
        .arg(sample("pairwise_sample.jsonl"))
        .arg("--normal")
        .arg(&bad)
        .output()
        .expect("runs");
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("bad.jsonl:2: "), "{stderr}");
}
