//! RefuteBench's text tools against the labels of the authors' Python tools
//! (`tests/fixtures/refutebench/make_labels.py` wrote them once: jieba 0.42.1,
//! hebrew_tokenizer 2.3.0, NLTK 3.8.1 punkt with the English parameters, langdetect 1.0.9 with
//! seed 0). Each test asserts the exact agreement count on the committed sample, so any change
//! of tool or version shows, and a floor below which the tool is not an acceptable counterpart.

use std::path::Path;

use candor::bench::refutebench::{lang_id, punkt, segment};
use serde_json::Value;

fn fixture(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/refutebench")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("fixture exists");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("fixture line is JSON"))
        .collect()
}

fn text_of(row: &Value) -> &str {
    row["text"].as_str().expect("text")
}

/// Prints and checks one tool's agreement.
fn assert_agreement(tool: &str, agreed: usize, total: usize, expected: usize, floor: f64) {
    let rate = agreed as f64 / total as f64;
    println!("{tool}: {agreed}/{total} agree ({:.1}%)", 100.0 * rate);
    assert!(rate >= floor, "{tool}: agreement {rate:.3} below {floor}");
    assert_eq!(
        agreed, expected,
        "{tool}: agreement changed; update the README and this count if intended"
    );
}

#[test]
fn jieba_tokens_agree_with_python_jieba() {
    let rows = fixture("jieba.jsonl");
    let mut agreed = 0;
    for row in &rows {
        let text = text_of(row);
        let want: Vec<usize> = row["lens"]
            .as_array()
            .expect("lens")
            .iter()
            .map(|n| n.as_u64().expect("length") as usize)
            .collect();
        let got: Vec<usize> = segment::chinese_tokens(text)
            .iter()
            .map(|t| t.chars().count())
            .collect();
        if got == want {
            agreed += 1;
        } else {
            println!("jieba differs on {text:?}: {got:?} vs {want:?}");
        }
    }
    assert_agreement("jieba-rs vs jieba", agreed, rows.len(), 220, 0.99);
}

#[test]
fn hebrew_tokens_agree_with_hebrew_tokenizer() {
    let rows = fixture("hebrew.jsonl");
    let mut agreed = 0;
    for row in &rows {
        let text = text_of(row);
        let want: Vec<&str> = row["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_str().expect("token"))
            .collect();
        let got = segment::hebrew_tokens(text);
        if got == want {
            agreed += 1;
        } else {
            println!("hebrew differs on {text:?}: {got:?} vs {want:?}");
        }
    }
    assert_agreement(
        "hebrew_tokens vs hebrew_tokenizer",
        agreed,
        rows.len(),
        250,
        0.99,
    );
}

#[test]
fn punkt_sentence_counts_agree_with_nltk() {
    let rows = fixture("punkt.jsonl");
    let mut agreed = 0;
    for row in &rows {
        let text = text_of(row);
        let want = row["sentences"].as_u64().expect("sentences") as usize;
        let got = punkt::count_sentences(text);
        if got == want {
            agreed += 1;
        } else {
            println!("punkt differs on {text:?}: {got} vs {want}");
        }
    }
    assert_agreement("punkt vs NLTK punkt", agreed, rows.len(), 300, 0.99);
}

/// langdetect's answer as the email checker reads it: one of the checked languages, another
/// language, or no answer.
fn checker_view(code: &str) -> &str {
    match code {
        "en" | "de" | "fr" | "zh-cn" | "he" | "error" => code,
        _ => "other",
    }
}

#[test]
fn language_ids_agree_with_langdetect() {
    let rows = fixture("langdetect.jsonl");
    let (mut agreed, mut stable, mut agreed_stable) = (0, 0, 0);
    for row in &rows {
        let text = text_of(row);
        let want = checker_view(row["lang"].as_str().expect("lang"));
        let got = match lang_id::identify(text) {
            None => "error",
            Some(l) => l.langdetect_code().unwrap_or("other"),
        };
        let is_stable = row["stable"].as_bool().expect("stable");
        stable += usize::from(is_stable);
        if got == want {
            agreed += 1;
            agreed_stable += usize::from(is_stable);
        } else {
            println!("language differs on {text:?}: {got} vs {want}");
        }
    }
    println!("where langdetect is stable over seeds 0..9: {agreed_stable}/{stable} agree");
    assert_agreement("whatlang vs langdetect", agreed, rows.len(), 244, 0.75);
}
