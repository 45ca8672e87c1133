//! Judge reliability on data nobody here wrote, against values computed independently by
//! `tests/reference/agreement_reference.py` (scikit-learn and statsmodels; its output is
//! `tests/reference/agreement_reference.txt`), matched to the four decimals it prints:
//! ReaLMistake's seven published open detectors against the expert labels and with each
//! other, Auto-J's own verdicts in both orders against the Auto-J labels (with its position
//! consistency), and PandaLM's three annotators with each other (the human ceiling).

use std::process::Command;

use candor::bench::fennec::{data as fennec_data, score as fennec_score};
use candor::bench::realmistake::{data, reliability, score};
use candor::bench::table::{Cell, Table};

use crate::util::shared_file;

/// Half a unit in the fourth decimal: a value printed with four decimals.
const PRINTED: f64 = 5e-5;

fn table<'a>(tables: &'a [Table], id: &str) -> &'a Table {
    tables
        .iter()
        .find(|t| t.id == id)
        .unwrap_or_else(|| panic!("no table {id}"))
}

/// The row whose first cell is `name`.
fn row<'a>(t: &'a Table, name: &str) -> &'a [Cell] {
    t.rows
        .iter()
        .find(|r| r[0] == Cell::from(name))
        .unwrap_or_else(|| panic!("{}: no row {name:?}", t.id))
}

/// Checks a κ row against the reference's (κ, low, high) and its n.
fn kappa(t: &Table, name: &str, want: [f64; 3], n: i64) {
    let r = row(t, name);
    let Cell::Interval {
        value, low, high, ..
    } = r[1]
    else {
        panic!("{name}: {:?}", r[1]);
    };
    for (got, want) in [value, low, high].into_iter().zip(want) {
        assert!(
            (got - want).abs() <= PRINTED,
            "{name}: {got} vs the reference's {want}"
        );
    }
    assert_eq!(r[5], Cell::Int(n), "{name}: n");
}

/// Checks a Fleiss row's κ (its interval is a bootstrap, not in the reference) and n.
fn fleiss(t: &Table, name: &str, want: f64, n: i64) {
    let r = row(t, name);
    let Some((got, Some((low, high)))) = r[1].value() else {
        panic!("{name}: {:?}", r[1]);
    };
    assert!((got - want).abs() <= PRINTED, "{name}: {got} vs {want}");
    assert!(low < got && got < high, "{name}: [{low}, {high}]");
    assert_eq!(r[5], Cell::Int(n), "{name}: n");
}

fn counts(t: &Table, name: &str) -> Vec<i64> {
    row(t, name)[1..]
        .iter()
        .map(|c| match c {
            Cell::Int(n) => *n,
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn realmistake_open_detectors_against_expert_labels_match_the_reference() {
    let (Some(outputs), Some(bench)) = (
        shared_file("realmistake/detector_outputs_open.zip"),
        shared_file("realmistake/data.zip"),
    ) else {
        return;
    };
    let files = data::load_detector_outputs(&outputs).expect("outputs load");
    let bench = data::load_benchmark(&bench).expect("benchmark loads");
    let cells: Vec<score::Cell> = files
        .iter()
        .map(|f| score::cell(f, Some(&bench), score::Predictions::Published).expect("ids"))
        .collect();
    let tables = reliability::reliability_tables(&cells, 0);
    let t = table(&tables, "judge_kappa");
    // (detector, all prompts: κ, low, high, n), from agreement_reference.txt.
    let pooled: [(&str, [f64; 3], i64); 7] = [
        ("Llama-2-13b-chat-hf", [0.0159, -0.0178, 0.0495], 3438),
        ("Llama-2-70b-chat-hf", [0.0449, 0.0116, 0.0782], 3592),
        ("Mistral-7B-Instruct-v0.1", [-0.0226, -0.0491, 0.0040], 3472),
        ("Mixtral-8x7B-Instruct-v0.1", [0.0492, 0.0255, 0.0729], 3409),
        ("Qwen1.5-14B-Chat", [0.0777, 0.0484, 0.1070], 3579),
        ("Qwen1.5-72B-Chat", [0.0513, 0.0373, 0.0653], 3599),
        ("gemma-7b-it", [-0.0034, -0.0346, 0.0279], 3386),
    ];
    for (det, want, n) in pooled {
        kappa(t, &format!("{det} vs expert labels, all prompts"), want, n);
    }
    // Per prompt, a few of the 28 (the two best and worst, and a no-verdict-heavy one).
    kappa(
        t,
        "Qwen1.5-14B-Chat vs expert labels, prompt_2",
        [0.2286, 0.1591, 0.2981],
        886,
    );
    kappa(
        t,
        "Mixtral-8x7B-Instruct-v0.1 vs expert labels, prompt_2",
        [0.1272, 0.0726, 0.1818],
        858,
    );
    kappa(
        t,
        "Mistral-7B-Instruct-v0.1 vs expert labels, prompt_2",
        [-0.0608, -0.1069, -0.0147],
        884,
    );
    kappa(
        t,
        "gemma-7b-it vs expert labels, prompt_1",
        [-0.0486, -0.1207, 0.0235],
        710,
    );
    kappa(
        t,
        "Qwen1.5-72B-Chat vs expert labels, prompt_4",
        [0.0232, 0.0127, 0.0337],
        900,
    );
    // The confusion matrix behind one: detector rows, expert columns (no_error, error).
    let c = table(&tables, "confusion_Qwen1_5_14B_Chat");
    assert_eq!(counts(c, "no_error"), [564, 1217, 1781]);
    assert_eq!(counts(c, "error"), [430, 1368, 1798]);
    // The detectors with each other: Fleiss' κ over the 2,967 of 3,600 (item, prompt) units
    // every detector gave a verdict on.
    let between = table(&tables, "detector_kappa");
    fleiss(between, "all 7 detectors (Fleiss)", 0.1801, 2967);
    assert_eq!(between.rows.len(), 21 + 1, "every pair, then Fleiss");
}

#[test]
fn auto_j_verdicts_in_both_orders_match_the_reference() {
    let (Some(items), Some(normal), Some(exchanged)) = (
        shared_file("fennec/auto-j/testdata_pairwise.jsonl"),
        shared_file("fennec/auto-j/pairwise_example_output.jsonl"),
        shared_file("fennec/auto-j/pairwise_exchange_example_output.jsonl"),
    ) else {
        return;
    };
    let items = fennec_data::load_autoj(&items).unwrap();
    let n = fennec_data::load_verdicts(&normal).unwrap();
    let e = fennec_data::load_verdicts(&exchanged).unwrap();
    let outcomes = fennec_score::pair_outcomes(&items, (&normal, n), (&exchanged, e)).unwrap();
    let results = fennec_score::pairwise_results(&outcomes, 0);
    let t = table(&results.tables, "judge_kappa");
    kappa(
        t,
        "judge (order shown) vs human label",
        [0.3733, 0.3386, 0.4080],
        1392,
    );
    kappa(
        t,
        "judge (swapped order, put back) vs human label",
        [0.3827, 0.3480, 0.4175],
        1392,
    );
    kappa(
        t,
        "judge: order shown vs swapped order",
        [0.6927, 0.6573, 0.7281],
        1392,
    );
    // Observed agreement of the first (the reference: 0.5999).
    assert_eq!(
        row(t, "judge (order shown) vs human label")[3].to_string(),
        "59.99"
    );
    let c = table(&results.tables, "confusion_normal");
    assert_eq!(counts(c, "A"), [393, 75, 154, 622]);
    assert_eq!(counts(c, "B"), [114, 411, 188, 713]);
    assert_eq!(counts(c, "tie"), [13, 13, 31, 57]);
    // Position: consistency 83.41, first shown preferred in both orders 3.95, second 8.69.
    let p = table(&results.tables, "position_bias");
    let share = |name: &str| row(p, name)[1].value().expect("a share").0;
    for (name, want) in [
        ("same verdict in both orders (consistency)", 83.41),
        ("first shown preferred in both orders", 3.95),
        ("second shown preferred in both orders", 8.69),
    ] {
        assert!(
            (share(name) - want).abs() <= 0.005,
            "{name}: {}",
            share(name)
        );
    }
}

#[test]
fn pandalm_annotators_give_the_human_ceiling_of_the_reference() {
    let Some(path) = shared_file("fennec/pandalm/testset-v1.json") else {
        return;
    };
    let items =
        fennec_data::load_pandalm(&path, fennec_data::PandaLabel::Annotator1).expect("loads");
    let refs: Vec<&fennec_data::PairItem> = items.iter().collect();
    let t = fennec_score::annotator_table(&refs, 0).expect("three annotators");
    kappa(
        &t,
        "annotator1 vs annotator2",
        [0.8520, 0.8225, 0.8816],
        999,
    );
    kappa(
        &t,
        "annotator1 vs annotator3",
        [0.8789, 0.8520, 0.9059],
        999,
    );
    kappa(
        &t,
        "annotator2 vs annotator3",
        [0.8617, 0.8331, 0.8902],
        999,
    );
    fleiss(&t, "annotators 1–3 (Fleiss)", 0.8642, 999);
}

fn candor() -> Command {
    Command::new(env!("CARGO_BIN_EXE_candor"))
}

#[test]
fn score_commands_print_the_reliability_tables() {
    let Some(pandalm) = shared_file("fennec/pandalm/testset-v1.json") else {
        return;
    };
    // PandaLM without verdicts: the annotators' agreement alone.
    let out = candor()
        .args(["score", "fennec", "--format", "pandalm", "--data"])
        .arg(&pandalm)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Human-to-human agreement"), "{stdout}");
    assert!(
        stdout.contains("annotator1 vs annotator2\t0.852 [0.822, 0.882]"),
        "{stdout}"
    );
    // Auto-J's labels without verdicts: nothing to compute, said so.
    let Some(autoj) = shared_file("fennec/auto-j/testdata_pairwise.jsonl") else {
        return;
    };
    let out = candor()
        .args(["score", "fennec", "--format", "auto-j", "--data"])
        .arg(&autoj)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--normal is needed"), "{err}");
}
