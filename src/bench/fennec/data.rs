//! Fennec's evaluation sets to typed pairwise items, and judges' verdict files.
//!
//! Three public sets: Auto-J's pairwise test set (`testdata_pairwise.jsonl`, 1392 items, label
//! 0 = response 1 better, 1 = response 2 better, 2 = tie), PandaLM's `testset-v1.json` (999
//! items, three annotators with 0 = tie, 1 = response 1, 2 = response 2; the label is
//! annotator1's, as in Fennec's code, or their majority, [`PandaLabel`]) and MT-Bench's `question.jsonl` (80 questions, no labels). Verdict files are
//! Auto-J's leaderboard format, one `{"output": 0|1|2}` per line in the order shown to the
//! judge (`null` = no verdict). Every bad line is an error naming the file and line (or item).
//! This module computes nothing.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::Error;
use crate::bench::own_data;

/// Which response a judge or a human prefers, in the item's own order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preference {
    /// Response 1 (A) is better.
    A,
    /// Response 2 (B) is better.
    B,
    Tie,
}

impl Preference {
    /// Auto-J's coding: 0 = first better, 1 = second better, 2 = tie.
    pub fn from_autoj(code: i64) -> Option<Self> {
        match code {
            0 => Some(Preference::A),
            1 => Some(Preference::B),
            2 => Some(Preference::Tie),
            _ => None,
        }
    }

    /// PandaLM's coding: 0 = tie, 1 = response 1 better, 2 = response 2 better.
    pub fn from_pandalm(code: i64) -> Option<Self> {
        match code {
            0 => Some(Preference::Tie),
            1 => Some(Preference::A),
            2 => Some(Preference::B),
            _ => None,
        }
    }

    /// The same preference with the two responses swapped (Auto-J's `exchange_to_ori_label`).
    pub fn swapped(self) -> Self {
        match self {
            Preference::A => Preference::B,
            Preference::B => Preference::A,
            Preference::Tie => Preference::Tie,
        }
    }

    /// The preference implied by two scores (higher is better, equal is a tie).
    pub fn from_scores<T: PartialOrd>(a: T, b: T) -> Self {
        if a > b {
            Preference::A
        } else if a < b {
            Preference::B
        } else {
            Preference::Tie
        }
    }
}

/// The data sets Fennec is evaluated on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataSet {
    AutoJ,
    PandaLm,
    MtBench,
}

/// One pairwise comparison, with a human label (always in the published sets; optional in a
/// user's `--pairs` file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairItem {
    /// Stable id: `auto_j/<line>`, `pandalm/<idx>`, or a `--pairs` file's `id` (default: the
    /// line number).
    pub id: String,
    pub query: String,
    pub response_a: String,
    pub response_b: String,
    pub label: Option<Preference>,
    /// Auto-J's scenario, or PandaLM's `motivation_app`.
    pub category: String,
    /// Every annotator's label where the set has several (PandaLM's three, in order; they
    /// give the human-to-human agreement a judge is held to); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotators: Vec<Preference>,
}

#[derive(Deserialize)]
struct RawAutoJ {
    scenario: String,
    label: i64,
    prompt: String,
    #[serde(rename = "response 1")]
    response_1: String,
    #[serde(rename = "response 2")]
    response_2: String,
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn line_err(path: &Path, line: usize, message: impl Into<String>) -> Error {
    Error::Line {
        path: path.to_path_buf(),
        line,
        message: message.into(),
    }
}

use crate::bench::loader::jsonl_lines as lines;

/// Loads Auto-J's `testdata_pairwise.jsonl`.
pub fn load_autoj(path: &Path) -> Result<Vec<PairItem>, Error> {
    parse_autoj(&read(path)?, path)
}

/// Parses Auto-J pairwise JSONL text (`path` only names errors).
pub fn parse_autoj(text: &str, path: &Path) -> Result<Vec<PairItem>, Error> {
    let mut out = Vec::new();
    for (n, line) in lines(text) {
        let raw: RawAutoJ =
            serde_json::from_str(line).map_err(|e| line_err(path, n, e.to_string()))?;
        let label = Preference::from_autoj(raw.label)
            .ok_or_else(|| line_err(path, n, format!("label {} is not 0, 1 or 2", raw.label)))?;
        out.push(PairItem {
            id: format!("auto_j/{n}"),
            query: raw.prompt,
            response_a: raw.response_1,
            response_b: raw.response_2,
            label: Some(label),
            category: raw.scenario,
            annotators: Vec::new(),
        });
    }
    Ok(out)
}

#[derive(Deserialize)]
struct RawPandaLm {
    idx: i64,
    motivation_app: String,
    instruction: serde_json::Value,
    input: serde_json::Value,
    response1: serde_json::Value,
    response2: serde_json::Value,
    annotator1: i64,
    annotator2: i64,
    annotator3: i64,
}

/// Which of PandaLM's three annotations is an item's gold label.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PandaLabel {
    /// `annotator1` alone: what Fennec's evaluation reads (`meta_info["judge"][0]` in
    /// `src/criterion/fennec.py`, dropreg/Fennec @ e3995f6). 38 of the 999 labels differ from
    /// the majority.
    #[default]
    Annotator1,
    /// The label at least two of the three annotators give (PandaLM's own reading); an item
    /// where all three differ is an error.
    Majority,
}

impl PandaLabel {
    pub fn as_str(self) -> &'static str {
        match self {
            PandaLabel::Annotator1 => "annotator1",
            PandaLabel::Majority => "majority",
        }
    }

    /// Parses `annotator1` / `majority`.
    pub fn parse(s: &str) -> Option<Self> {
        [PandaLabel::Annotator1, PandaLabel::Majority]
            .into_iter()
            .find(|l| l.as_str() == s)
    }
}

/// Loads PandaLM's `testset-v1.json`.
pub fn load_pandalm(path: &Path, label: PandaLabel) -> Result<Vec<PairItem>, Error> {
    parse_pandalm(&read(path)?, path, label)
}

/// Parses PandaLM test-set JSON text. The query is `instruction + input` (concatenated as in
/// Fennec's `pandalm_bench.py`); the label is `label`'s (every annotation must be 0, 1 or 2).
pub fn parse_pandalm(text: &str, path: &Path, label: PandaLabel) -> Result<Vec<PairItem>, Error> {
    let values: Vec<serde_json::Value> = serde_json::from_str(text).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let item_err = |i: usize, message: String| Error::Item {
        path: path.to_path_buf(),
        index: i,
        message,
    };
    let mut out = Vec::new();
    for (i, v) in values.into_iter().enumerate() {
        let raw: RawPandaLm = serde_json::from_value(v).map_err(|e| item_err(i, e.to_string()))?;
        let mut votes = Vec::new();
        for code in [raw.annotator1, raw.annotator2, raw.annotator3] {
            votes.push(
                Preference::from_pandalm(code).ok_or_else(|| {
                    item_err(i, format!("annotator label {code} is not 0, 1 or 2"))
                })?,
            );
        }
        let label = match label {
            PandaLabel::Annotator1 => votes[0],
            PandaLabel::Majority => majority(&votes)
                .ok_or_else(|| item_err(i, format!("annotators disagree three ways: {votes:?}")))?,
        };
        let text = |field: &str, v: &serde_json::Value| {
            python_str(v).ok_or_else(|| item_err(i, format!("field \"{field}\" is not text: {v}")))
        };
        out.push(PairItem {
            id: format!("pandalm/{}", raw.idx),
            query: format!(
                "{}{}",
                text("instruction", &raw.instruction)?,
                text("input", &raw.input)?
            ),
            response_a: text("response1", &raw.response1)?,
            response_b: text("response2", &raw.response2)?,
            label: Some(label),
            category: raw.motivation_app,
            annotators: votes,
        });
    }
    Ok(out)
}

/// The category of the items of a user's `--pairs` file (also a `--subset` name).
pub const OWN_CATEGORY: &str = "own";

/// Loads a user's `--pairs` file: one `{"id"?, "question", "answer_a", "answer_b",
/// "label"?: "a"|"b"|"tie"}` per line. Ids default to the line number and must be unique.
pub fn load_pairs(path: &Path) -> Result<Vec<PairItem>, Error> {
    parse_pairs(&read(path)?, path)
}

/// Parses a `--pairs` JSONL text (`path` names errors).
pub fn parse_pairs(text: &str, path: &Path) -> Result<Vec<PairItem>, Error> {
    let mut out = Vec::new();
    let mut lines = Vec::new();
    for r in own_data::jsonl_records(text, path)? {
        r.only(&["id", "question", "answer_a", "answer_b", "label"])?;
        let label = match r.opt_text("label")?.as_deref() {
            None => None,
            Some("a") => Some(Preference::A),
            Some("b") => Some(Preference::B),
            Some("tie") => Some(Preference::Tie),
            Some(other) => {
                return Err(r.error("label", format!("{other:?} is not \"a\", \"b\" or \"tie\"")))
            }
        };
        lines.push(r.line);
        out.push(PairItem {
            id: r.id()?,
            query: r.text("question")?,
            response_a: r.text("answer_a")?,
            response_b: r.text("answer_b")?,
            label,
            category: OWN_CATEGORY.to_string(),
            annotators: Vec::new(),
        });
    }
    own_data::unique_ids(
        path,
        lines.iter().zip(&out).map(|(l, i)| (*l, i.id.as_str())),
    )?;
    Ok(out)
}

/// A scalar as Python's `str()` writes it: a few PandaLM responses are JSON `true`, which
/// the authors' Python code turns into `True`.
fn python_str(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Bool(true) => Some("True".to_string()),
        serde_json::Value::Bool(false) => Some("False".to_string()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The preference held by at least two of three votes.
pub fn majority(votes: &[Preference]) -> Option<Preference> {
    votes
        .iter()
        .copied()
        .find(|v| votes.iter().filter(|w| *w == v).count() * 2 > votes.len())
}

/// One MT-Bench question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MtQuestion {
    pub question_id: i64,
    pub category: String,
    pub turns: Vec<String>,
}

/// Loads MT-Bench's `question.jsonl`.
pub fn load_mt_bench(path: &Path) -> Result<Vec<MtQuestion>, Error> {
    let text = read(path)?;
    lines(&text)
        .map(|(n, line)| serde_json::from_str(line).map_err(|e| line_err(path, n, e.to_string())))
        .collect()
}

#[derive(Deserialize)]
struct RawVerdict {
    output: Option<i64>,
}

/// Loads a verdict file: one `{"output": 0|1|2}` per item (Auto-J's coding, in the order the
/// responses were shown); `null` is a missing verdict.
pub fn load_verdicts(path: &Path) -> Result<Vec<Option<Preference>>, Error> {
    parse_verdicts(&read(path)?, path)
}

/// Parses verdict JSONL text.
pub fn parse_verdicts(text: &str, path: &Path) -> Result<Vec<Option<Preference>>, Error> {
    let mut out = Vec::new();
    for (n, line) in lines(text) {
        let raw: RawVerdict =
            serde_json::from_str(line).map_err(|e| line_err(path, n, e.to_string()))?;
        out.push(match raw.output {
            None => None,
            Some(code) => Some(
                Preference::from_autoj(code)
                    .ok_or_else(|| line_err(path, n, format!("output {code} is not 0, 1 or 2")))?,
            ),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_codings() {
        assert_eq!(Preference::from_autoj(0), Some(Preference::A));
        assert_eq!(Preference::from_autoj(2), Some(Preference::Tie));
        assert_eq!(Preference::from_pandalm(0), Some(Preference::Tie));
        assert_eq!(Preference::from_pandalm(2), Some(Preference::B));
        assert_eq!(Preference::from_pandalm(3), None);
        assert_eq!(Preference::A.swapped(), Preference::B);
        assert_eq!(Preference::Tie.swapped(), Preference::Tie);
        assert_eq!(Preference::from_scores(7, 3), Preference::A);
        assert_eq!(Preference::from_scores(2, 2), Preference::Tie);
    }

    #[test]
    fn majority_of_three() {
        use Preference::*;
        assert_eq!(majority(&[A, B, A]), Some(A));
        assert_eq!(majority(&[Tie, Tie, Tie]), Some(Tie));
        assert_eq!(majority(&[A, B, Tie]), None);
    }

    #[test]
    fn autoj_lines_and_errors() {
        let p = Path::new("pairs.jsonl");
        let good = r#"{"scenario": "chitchat", "label": 2, "prompt": "hi", "response 1": "a", "response 2": "b"}"#;
        let items = parse_autoj(&format!("{good}\n\n{good}"), p).expect("parses");
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].id, "auto_j/3");
        assert_eq!(items[0].label, Some(Preference::Tie));
        let bad = good.replace("\"label\": 2", "\"label\": 5");
        let e = parse_autoj(&format!("{good}\n{bad}"), p)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("pairs.jsonl:2: "), "{e}");
        let e = parse_autoj("{\"scenario\": 1}", p).unwrap_err().to_string();
        assert!(e.starts_with("pairs.jsonl:1: "), "{e}");
    }

    #[test]
    fn pandalm_items_and_errors() {
        let p = Path::new("testset.json");
        let item = |a: i64, b: i64, c: i64| {
            format!(
                r#"{{"idx": 4, "motivation_app": "Grammarly", "cmp_key": "x_y", "instruction": "Fix: ", "input": "teh cat", "response1": "the cat", "response2": "teh cat", "annotator1": {a}, "annotator2": {b}, "annotator3": {c}}}"#
            )
        };
        let maj = PandaLabel::Majority;
        let items = parse_pandalm(&format!("[{}]", item(1, 1, 0)), p, maj).expect("parses");
        assert_eq!(items[0].label, Some(Preference::A));
        assert_eq!(items[0].query, "Fix: teh cat");
        // annotator1 alone (the default) against the majority.
        let text = format!("[{}]", item(0, 2, 2));
        let first = parse_pandalm(&text, p, PandaLabel::default()).expect("parses");
        assert_eq!(first[0].label, Some(Preference::Tie));
        assert_eq!(
            parse_pandalm(&text, p, maj).expect("parses")[0].label,
            Some(Preference::B)
        );
        let three = format!("[{}]", item(0, 1, 2));
        assert_eq!(
            parse_pandalm(&three, p, PandaLabel::Annotator1).expect("parses")[0].label,
            Some(Preference::Tie)
        );
        assert_eq!(PandaLabel::parse("majority"), Some(maj));
        assert_eq!(PandaLabel::parse("x"), None);
        let boolean = item(2, 2, 1).replace("\"the cat\"", "true");
        let items = parse_pandalm(&format!("[{boolean}]"), p, maj).expect("parses");
        assert_eq!(
            (items[0].response_a.as_str(), items[0].label),
            ("True", Some(Preference::B))
        );
        let list = item(2, 2, 1).replace("\"the cat\"", "[1]");
        let e = parse_pandalm(&format!("[{list}]"), p, maj)
            .unwrap_err()
            .to_string();
        assert!(e.contains("item 0") && e.contains("response1"), "{e}");
        let e = parse_pandalm(&format!("[{}, {}]", item(1, 1, 0), item(0, 1, 2)), p, maj)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("testset.json: item 1: "), "{e}");
    }

    #[test]
    fn verdict_lines() {
        let p = Path::new("out.jsonl");
        let v = parse_verdicts("{\"output\": 1}\n{\"output\": null}\n", p).expect("parses");
        assert_eq!(v, vec![Some(Preference::B), None]);
        let e = parse_verdicts("{\"output\": 1}\n{\"output\": 9}\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("out.jsonl:2: "), "{e}");
    }
}
