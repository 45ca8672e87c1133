//! FB-Bench files to typed items: the dataset (`fb_bench_dataset.json`, v1, and
//! `fb_bench_dataset_v3.json`, v3), the authors' judgement JSONL and answer JSONL.
//!
//! Items keep the authors' field names and their checklists as published (weights as the
//! JSON numbers they were, so prompts can render them as the authors' Python did). Any
//! malformed input is an [`FbBenchError`] naming the file and line (JSONL) or item index
//! (dataset array); nothing here panics. What a judgement *means* is not decided here: the
//! recorded `judgement` object is kept raw and read by [`crate::judge::checklist`].

use std::io::{BufReader, Read};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use crate::judge::checklist::Criterion;

/// The shared JSONL reader, as FB-Bench's files are read.
pub use crate::bench::loader::parse_jsonl;
/// Errors of the FB-Bench layer (loading, scoring, writing): the loaders' shared type.
pub use crate::bench::loader::DataError as FbBenchError;

/// The two published dataset versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Version {
    /// The paper's version (734 items): every item has a reference follow-up response,
    /// and the judge prompt shows it.
    V1,
    /// The repository's current version (591 items): references only on some items, and
    /// a judge prompt without them.
    V3,
}

impl Version {
    /// Recognises the version from the items: v1 items all carry a reference follow-up
    /// response; v3 has it only on some (null or absent on the rest).
    pub fn recognise<'a>(items: impl IntoIterator<Item = &'a Item>) -> Version {
        let mut any = false;
        for item in items {
            any = true;
            if item.reference_second_response.is_none() {
                return Version::V3;
            }
        }
        if any {
            Version::V1
        } else {
            Version::V3
        }
    }
}

/// The interaction scenario of an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum BenchType {
    /// The preset first response is deficient; the feedback asks for a correction.
    #[serde(rename = "Error Correction")]
    ErrorCorrection,
    /// The preset first response is right; the feedback tries to sway it.
    #[serde(rename = "Response Maintenance")]
    ResponseMaintenance,
}

impl BenchType {
    pub fn as_str(self) -> &'static str {
        match self {
            BenchType::ErrorCorrection => "Error Correction",
            BenchType::ResponseMaintenance => "Response Maintenance",
        }
    }
}

/// One checklist entry as published: `[text, weight]` (Error Correction) or a plain
/// string (Response Maintenance).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChecklistEntry {
    Weighted(String, Number),
    Plain(String),
}

impl ChecklistEntry {
    pub fn text(&self) -> &str {
        match self {
            ChecklistEntry::Weighted(t, _) | ChecklistEntry::Plain(t) => t,
        }
    }
    pub fn weight(&self) -> Option<&Number> {
        match self {
            ChecklistEntry::Weighted(_, w) => Some(w),
            ChecklistEntry::Plain(_) => None,
        }
    }
}

/// One FB-Bench item, with the authors' field names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Item {
    pub bench_type: BenchType,
    pub task_type: String,
    pub sub_task_type: String,
    pub user_query: String,
    pub origin_first_response: String,
    pub feedback: String,
    /// Deficiency types of the preset response (Error Correction only; null otherwise).
    pub error_type: Option<Vec<String>>,
    pub feedback_type: Vec<String>,
    pub checklist: Vec<ChecklistEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_second_response: Option<String>,
}

/// An item's id: the first 16 hex digits of the SHA-256 of query, preset response and
/// feedback (unique over both published datasets; survives reordering and subsetting).
pub fn item_id(item: &Item) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [
        &item.user_query,
        &item.origin_first_response,
        &item.feedback,
    ] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    hex::encode(&h.finalize()[..8])
}

/// The id that pairs an item across files for comparisons ([`crate::bench::item_scores`]):
/// [`item_id`]'s hash with all whitespace removed from the three texts first. Four of the
/// authors' published v3 judgement files hold an earlier revision of 66 items whose preset
/// responses differ from the dataset's only in whitespace; they are the same items.
pub fn pairing_id(item: &Item) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [
        &item.user_query,
        &item.origin_first_response,
        &item.feedback,
    ] {
        let bare: String = part.chars().filter(|c| !c.is_whitespace()).collect();
        h.update(bare.as_bytes());
        h.update([0u8]);
    }
    hex::encode(&h.finalize()[..8])
}

impl Item {
    /// The checklist as judge criteria (text and, for weighted entries, the weight).
    pub fn criteria(&self) -> Vec<Criterion> {
        self.checklist
            .iter()
            .map(|e| Criterion {
                text: e.text().to_string(),
                weight: e.weight().cloned(),
            })
            .collect()
    }

    /// Checks what serde cannot: a non-empty checklist, weighted entries exactly for Error
    /// Correction, and error types present for Error Correction.
    fn validate(&self) -> Result<(), String> {
        if self.checklist.is_empty() {
            return Err("empty checklist".into());
        }
        let weighted = self
            .checklist
            .iter()
            .filter(|e| e.weight().is_some())
            .count();
        match self.bench_type {
            BenchType::ErrorCorrection => {
                if weighted != self.checklist.len() {
                    return Err("error correction checklist entries must be [text, weight]".into());
                }
                if self.error_type.is_none() {
                    return Err("error correction item without error_type".into());
                }
            }
            BenchType::ResponseMaintenance => {
                if weighted != 0 {
                    return Err("response maintenance checklist entries must be strings".into());
                }
            }
        }
        for e in &self.checklist {
            if let Some(w) = e.weight() {
                let v = w.as_f64().unwrap_or(f64::NAN);
                if !(v > 0.0 && v <= 1.0) {
                    return Err(format!("checklist weight {w} outside (0, 1]"));
                }
            }
        }
        Ok(())
    }
}

/// A loaded dataset file.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub version: Version,
    pub items: Vec<Item>,
}

/// One line of the authors' judgement JSONL: the item, the candidate's follow-up, and the
/// judge's recorded verdicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgementRecord {
    #[serde(flatten)]
    pub item: Item,
    pub second_response: String,
    pub infer_model: String,
    pub judge_model: String,
    /// `{checklist_text: {"评判理由": .., "评判结果": "是"|"否", "weight": w|null}}`, or the
    /// authors' failure marker; kept raw.
    pub judgement: Value,
    /// The score the authors' code recorded (an int or a float, as their Python made it).
    pub score: Number,
    /// Candor's extension: the judge's raw text, when the run kept it (enables re-parsing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_output: Option<String>,
}

/// One line of the authors' answer JSONL: the item and a candidate's follow-up response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AnswerRecord {
    #[serde(flatten)]
    pub item: Item,
    pub second_response: String,
    pub infer_model: String,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FbBenchError + '_ {
    move |source| FbBenchError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Loads a dataset JSON array (v1 or v3, recognised from its items).
pub fn load_dataset(path: &Path) -> Result<Dataset, FbBenchError> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    parse_dataset(BufReader::new(file), path)
}

/// The fields of a user's `--items` file: the authors' item fields.
const OWN_FIELDS: [&str; 10] = [
    "bench_type",
    "task_type",
    "sub_task_type",
    "user_query",
    "origin_first_response",
    "feedback",
    "error_type",
    "feedback_type",
    "checklist",
    "reference_second_response",
];

/// The task type of a user's item that names none (also a `--subset` name).
pub const OWN_TASK_TYPE: &str = "own";

/// Loads a user's `--items` file: the authors' items (a JSON array, or one item per line)
/// with the user's checklists and weights. Required: `bench_type` (`Error Correction` or
/// `Response Maintenance`), `user_query`, `origin_first_response`, `feedback` and
/// `checklist` (`[text, weight]` entries, weights in (0, 1], for Error Correction; strings for
/// Response Maintenance). Optional: `task_type` (default `own`), `sub_task_type`,
/// `error_type`, `feedback_type` (default empty) and `reference_second_response` (given on
/// every item, the judge sees it, as in v1). Each item comes with the line it starts on.
pub fn load_own_items(path: &Path) -> Result<Vec<(usize, Item)>, FbBenchError> {
    let text = crate::bench::own_data::read(path)?;
    parse_own_items(&text, path)
}

/// Parses a user's `--items` text (`path` names errors).
pub fn parse_own_items(text: &str, path: &Path) -> Result<Vec<(usize, Item)>, FbBenchError> {
    let mut out = Vec::new();
    for r in crate::bench::own_data::array_or_jsonl_records(text, path)? {
        r.only(&OWN_FIELDS)?;
        let bench_type = match r.text("bench_type")?.as_str() {
            "Error Correction" => BenchType::ErrorCorrection,
            "Response Maintenance" => BenchType::ResponseMaintenance,
            other => {
                return Err(r.error(
                    "bench_type",
                    format!("{other:?} is not \"Error Correction\" or \"Response Maintenance\""),
                ))
            }
        };
        let strings = |field: &str| -> Result<Option<Vec<String>>, FbBenchError> {
            match r.object.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
                    .map(Some)
                    .ok_or_else(|| r.error(field, "expected an array of strings")),
                Some(v) => Err(r.error(
                    field,
                    format!(
                        "expected an array of strings, got {}",
                        crate::bench::own_data::kind(v)
                    ),
                )),
            }
        };
        let checklist = match r.object.get("checklist") {
            None => return Err(r.error("checklist", "missing (an array is required)")),
            Some(v @ Value::Array(_)) => serde_json::from_value::<Vec<ChecklistEntry>>(v.clone())
                .map_err(|_| {
                r.error(
                    "checklist",
                    "entries must be [text, weight] (Error Correction) or strings \
                         (Response Maintenance)",
                )
            })?,
            Some(v) => {
                return Err(r.error(
                    "checklist",
                    format!("expected an array, got {}", crate::bench::own_data::kind(v)),
                ))
            }
        };
        let error_type = strings("error_type")?;
        let item = Item {
            bench_type,
            task_type: r
                .opt_text("task_type")?
                .unwrap_or_else(|| OWN_TASK_TYPE.to_string()),
            sub_task_type: r.opt_text("sub_task_type")?.unwrap_or_default(),
            user_query: r.text("user_query")?,
            origin_first_response: r.text("origin_first_response")?,
            feedback: r.text("feedback")?,
            error_type: match bench_type {
                BenchType::ErrorCorrection => Some(error_type.unwrap_or_default()),
                BenchType::ResponseMaintenance => error_type,
            },
            feedback_type: strings("feedback_type")?.unwrap_or_default(),
            checklist,
            reference_second_response: r.opt_text("reference_second_response")?,
        };
        item.validate().map_err(|m| r.error("checklist", m))?;
        out.push((r.line, item));
    }
    Ok(out)
}

/// Parses a dataset JSON array from a reader; `path` only names the source in errors.
pub fn parse_dataset(reader: impl Read, path: &Path) -> Result<Dataset, FbBenchError> {
    let values: Vec<Value> =
        serde_json::from_reader(reader).map_err(|source| FbBenchError::NotArray {
            path: path.to_path_buf(),
            source,
        })?;
    if values.is_empty() {
        return Err(FbBenchError::Empty {
            path: path.to_path_buf(),
            what: "items",
        });
    }
    let mut items = Vec::with_capacity(values.len());
    for (index, value) in values.into_iter().enumerate() {
        let item: Item = serde_json::from_value(value)
            .map_err(|e| e.to_string())
            .and_then(|item: Item| item.validate().map(|()| item))
            .map_err(|message| FbBenchError::Item {
                path: path.to_path_buf(),
                index,
                message,
            })?;
        items.push(item);
    }
    let version = Version::recognise(&items);
    Ok(Dataset { version, items })
}

/// Loads a JSONL file of judgement records.
pub fn load_judgements(path: &Path) -> Result<Vec<JudgementRecord>, FbBenchError> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    parse_jsonl(BufReader::new(file), path, |r: &JudgementRecord| {
        r.item.validate()
    })
}

/// Loads a JSONL file of answer records.
pub fn load_answers(path: &Path) -> Result<Vec<AnswerRecord>, FbBenchError> {
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    parse_jsonl(BufReader::new(file), path, |r: &AnswerRecord| {
        r.item.validate()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EC: &str = r#"{"bench_type": "Error Correction", "task_type": "Mathematics",
        "sub_task_type": "算术", "user_query": "1+1=?", "origin_first_response": "3",
        "feedback": "不对", "error_type": ["Factual Error"], "feedback_type": ["Pointing Out Errors"],
        "checklist": [["回答是否给出2", 0.8], ["是否致歉", 0.2]]}"#;
    const RM: &str = r#"{"bench_type": "Response Maintenance", "task_type": "Coding",
        "sub_task_type": "x", "user_query": "q", "origin_first_response": "a",
        "feedback": "f", "error_type": null, "feedback_type": ["Misinformation"],
        "checklist": ["是否坚持"], "reference_second_response": null}"#;

    fn parse(s: &str) -> Result<Dataset, FbBenchError> {
        parse_dataset(s.as_bytes(), Path::new("d.json"))
    }

    #[test]
    fn parses_both_scenarios_and_recognises_v3() {
        let d = parse(&format!("[{EC}, {RM}]")).unwrap();
        assert_eq!(d.version, Version::V3);
        assert_eq!(d.items[0].bench_type, BenchType::ErrorCorrection);
        assert_eq!(d.items[0].checklist[1].weight().unwrap().to_string(), "0.2");
        assert_eq!(d.items[1].checklist[0].text(), "是否坚持");
        assert_eq!(d.items[1].reference_second_response, None);
    }

    #[test]
    fn all_references_mean_v1() {
        let ec = EC.replace(
            "\"checklist\"",
            "\"reference_second_response\": \"2\", \"checklist\"",
        );
        let d = parse(&format!("[{ec}]")).unwrap();
        assert_eq!(d.version, Version::V1);
    }

    #[test]
    fn malformed_items_name_their_index() {
        let bad = RM.replace("\"feedback\": \"f\",", "");
        let e = parse(&format!("[{EC}, {bad}]")).unwrap_err().to_string();
        assert!(
            e.starts_with("d.json: item 1: missing field `feedback`"),
            "{e}"
        );
        let mixed = RM.replace("[\"是否坚持\"]", "[[\"是否坚持\", 1.0]]");
        let e = parse(&format!("[{mixed}]")).unwrap_err().to_string();
        assert!(e.contains("item 0: response maintenance checklist"), "{e}");
        let e = parse("{}").unwrap_err().to_string();
        assert!(e.starts_with("d.json: not a json array"), "{e}");
        assert!(matches!(parse("[]"), Err(FbBenchError::Empty { .. })));
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let line = EC.replace('\n', " ");
        let rec = line.trim_end_matches('}').to_string()
            + r#", "second_response": "2", "infer_model": "m", "judge_model": "j", "judgement": {}, "score": 0.5}"#;
        let text = format!(
            "{rec}\n\n{}\n",
            rec.replace("\"score\": 0.5", "\"score\": \"x\"")
        );
        let e = parse_jsonl::<JudgementRecord>(text.as_bytes(), Path::new("m.jsonl"), |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("m.jsonl:3: invalid type"), "{e}");
        let ok = parse_jsonl::<JudgementRecord>(rec.as_bytes(), Path::new("m.jsonl"), |_| Ok(()))
            .unwrap();
        assert_eq!(ok[0].score.as_f64(), Some(0.5));
        assert_eq!(ok[0].item.task_type, "Mathematics");
    }
}
