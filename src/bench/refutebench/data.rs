//! RefuteBench's data files as typed items: `{qa,mt,email}/single/<stem>.<memory|generalization>.NC-<k>.jsonl`
//! and `{qa,mt,email}/multi/<stem>.jsonl`, exactly as the authors publish them.
//!
//! Every line is checked when it is read (placeholders present, one `[MAYBE FEEDBACK]` per
//! feedback, answers aligned with the questions they score, email rules parseable), so later
//! stages never meet a malformed item; a bad line is an [`Error::Line`] naming `file:line`.
//! This module does not decide which feedback is given: that depends on the model's replies
//! and lives in [`super::dialogue`].

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::checkers::{EmailCheck, EmailRule};
use super::prompts::FEEDBACK_MARKER;
pub use super::source::{Setting, Source, Task, Verification};
use super::Error;

/// One entry of an item's `queries`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    Text(String),
    /// `[MAYBE FEEDBACK]`: the refuting instruction goes here, if one applies.
    Feedback,
}

/// One dialogue.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// `<task>/<single|multi>/<file stem>/<0-based line index>`, unique across the benchmark.
    pub id: String,
    pub source: Source,
    pub system_prompt: String,
    pub queries: Vec<Query>,
    pub content: Content,
}

/// The task-specific part of an item.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Qa(QaContent),
    Mt(MtContent),
    Email(EmailContent),
}

#[derive(Debug, Clone, PartialEq)]
pub struct QaContent {
    /// `For all the questions, you should adopt the knowledge: `
    pub feedback_prompt: String,
    /// The counterfactual statements, one per `[MAYBE FEEDBACK]`.
    pub facts: Vec<String>,
    /// Accepted answers (aliases) of each scored question: the verification query (single),
    /// or every question after the last feedback (multi), in order. A few published questions
    /// have only `""`: they cannot be checked and are not scored.
    pub answers: Vec<Vec<String>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MtContent {
    /// `zh` or `he`.
    pub tgt_lang: String,
    /// Prefix of the feedback (empty in single-feedback files).
    pub feedback_prompt: String,
    /// One mapping, with `{src}` and `{tgt}` placeholders.
    pub mapping_prompt: String,
    /// The source words that may receive feedback, in file order.
    pub words: Vec<WordFeedback>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct WordFeedback {
    pub src: String,
    /// Dictionary translations (the candidate feedback).
    pub translations: Vec<String>,
    /// A random target-language word (the paper's harder variant).
    pub random: String,
    /// Indices of the source sentences (text queries, in order) where the word occurs as a noun.
    pub existence: Vec<usize>,
}

/// The four email domains of the paper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Domain {
    Friend,
    Family,
    Work,
    School,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EmailContent {
    pub domain: Domain,
    /// One per `[MAYBE FEEDBACK]`, in order.
    pub feedbacks: Vec<EmailFeedback>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EmailFeedback {
    pub rule: EmailRule,
    /// The choices as written in the data.
    pub choices: Vec<String>,
    /// The same choices, parsed into checks.
    pub checks: Vec<EmailCheck>,
    /// The refuting instruction with a `{choice}` placeholder.
    pub prompt: String,
}

/// The RefuteBench folder of the authors' data: `$CANDOR_DATA/refutebench`.
pub fn default_root() -> PathBuf {
    crate::bench::data_root().join("refutebench")
}

/// Every data file under `root`, as paths relative to it, sorted.
pub fn list_files(root: &Path) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for task in ["email", "mt", "qa"] {
        for scenario in ["multi", "single"] {
            let dir = root.join(task).join(scenario);
            if !dir.is_dir() {
                continue;
            }
            let entries = std::fs::read_dir(&dir).map_err(|source| Error::Io {
                path: dir.clone(),
                source,
            })?;
            for entry in entries {
                let entry = entry.map_err(|source| Error::Io {
                    path: dir.clone(),
                    source,
                })?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".jsonl") {
                    out.push(format!("{task}/{scenario}/{name}"));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Loads one file, given its path relative to the data root.
pub fn load_file(root: &Path, rel: &str) -> Result<Vec<Item>, Error> {
    let path = root.join(rel);
    let source = Source::from_rel_path(rel).map_err(|message| Error::Layout {
        path: path.clone(),
        message,
    })?;
    let file = std::fs::File::open(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    parse_reader(std::io::BufReader::new(file), &source, &path)
}

/// Loads every file under `root`, in [`list_files`] order.
pub fn load_all(root: &Path) -> Result<Vec<Item>, Error> {
    let mut items = Vec::new();
    for rel in list_files(root)? {
        items.extend(load_file(root, &rel)?);
    }
    Ok(items)
}

/// Parses the lines of one file; `path` only labels errors.
pub fn parse_reader(
    reader: impl BufRead,
    source: &Source,
    path: &Path,
) -> Result<Vec<Item>, Error> {
    let stem = source
        .file
        .rsplit('/')
        .next()
        .unwrap_or(&source.file)
        .trim_end_matches(".jsonl");
    let scenario = match source.setting {
        Setting::Multi => "multi",
        Setting::Single { .. } => "single",
    };
    let mut items = Vec::new();
    for line in crate::bench::loader::read_lines(reader, path) {
        let (lineno, line) = line?;
        let id = format!("{}/{scenario}/{stem}/{}", source.task.as_str(), items.len());
        let item = parse_line(&line, source, id).map_err(|m| Error::line(path, lineno, m))?;
        items.push(item);
    }
    Ok(items)
}

fn parse_line(line: &str, source: &Source, id: String) -> Result<Item, String> {
    let raw: Raw = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let queries: Vec<Query> = raw
        .queries
        .iter()
        .map(|q| {
            if q == FEEDBACK_MARKER {
                Query::Feedback
            } else {
                Query::Text(q.clone())
            }
        })
        .collect();
    let markers = queries.iter().filter(|q| **q == Query::Feedback).count();
    check_shape(&queries, source.setting)?;
    let content = match source.task {
        Task::Qa => Content::Qa(qa_content(&raw, &queries, source.setting)?),
        Task::Mt => Content::Mt(mt_content(&raw, source)?),
        Task::Email => Content::Email(email_content(&raw)?),
    };
    let expected = match &content {
        Content::Qa(c) => Some(c.facts.len()),
        Content::Email(c) => Some(c.feedbacks.len()),
        Content::Mt(_) => None,
    };
    if let Some(n) = expected {
        if n != markers {
            return Err(format!(
                "{n} feedbacks but {markers} `{FEEDBACK_MARKER}` entries in \"queries\""
            ));
        }
    }
    Ok(Item {
        id,
        source: source.clone(),
        system_prompt: raw.system_prompt,
        queries,
        content,
    })
}

/// Single: `[query, MARKER, chit-chat × k, verification]`; multi: starts with a query and
/// never has two markers in a row.
fn check_shape(queries: &[Query], setting: Setting) -> Result<(), String> {
    if queries.first().is_none_or(|q| *q == Query::Feedback) {
        return Err("\"queries\" must start with a query, not a feedback marker".into());
    }
    if queries
        .windows(2)
        .any(|w| w[0] == Query::Feedback && w[1] == Query::Feedback)
    {
        return Err("two feedback markers in a row in \"queries\"".into());
    }
    match setting {
        Setting::Single { context, .. } => {
            if queries.len() != context + 3 || queries[1] != Query::Feedback {
                return Err(format!(
                    "NC-{context} expects [query, {FEEDBACK_MARKER}, {context} chat turn(s), verification] ({} entries), found {} entries",
                    context + 3,
                    queries.len()
                ));
            }
            if queries[2..].contains(&Query::Feedback) {
                return Err("single-feedback item with a second feedback marker".into());
            }
        }
        Setting::Multi => {
            if !queries.contains(&Query::Feedback) {
                return Err("multi-feedback item without a feedback marker".into());
            }
        }
    }
    Ok(())
}

fn qa_content(raw: &Raw, queries: &[Query], setting: Setting) -> Result<QaContent, String> {
    let prompt = need_str(&raw.feedback_prompt, "feedback_prompt")?;
    let facts = match (&raw.feedbacks, setting) {
        (Value::String(s), Setting::Single { .. }) => vec![s.clone()],
        (Value::Array(_), Setting::Multi) => strings(&raw.feedbacks, "feedbacks")?,
        _ => {
            return Err(
                "\"feedbacks\" must be a string (single) or a list of strings (multi)".into(),
            )
        }
    };
    let answers = match (&raw.answers, setting) {
        (
            Some(Value::String(s)),
            Setting::Single {
                verification: Verification::Memory,
                ..
            },
        ) => {
            vec![vec![s.clone()]]
        }
        (Some(v @ Value::Array(_)), Setting::Single { .. }) => vec![strings(v, "answers")?],
        (Some(Value::Array(lists)), Setting::Multi) => {
            let last = queries
                .iter()
                .rposition(|q| *q == Query::Feedback)
                .unwrap_or(0);
            let scored = queries.len() - last - 1;
            if lists.len() != scored {
                return Err(format!(
                    "{} answer lists for {scored} questions after the last feedback",
                    lists.len()
                ));
            }
            lists
                .iter()
                .map(|l| strings(l, "answers"))
                .collect::<Result<_, _>>()?
        }
        (None, _) => return Err("missing field `answers`".into()),
        _ => return Err("\"answers\" has the wrong shape for this setting".into()),
    };
    Ok(QaContent {
        feedback_prompt: prompt.to_string(),
        facts,
        answers,
    })
}

fn mt_content(raw: &Raw, source: &Source) -> Result<MtContent, String> {
    let mapping_prompt = need_str(&raw.feedback_mapping_prompt, "feedback_mapping_prompt")?;
    if !mapping_prompt.contains("{src}") || !mapping_prompt.contains("{tgt}") {
        return Err("\"feedback_mapping_prompt\" must contain {src} and {tgt}".into());
    }
    let Value::Object(map) = &raw.feedbacks else {
        return Err("\"feedbacks\" must be an object from source word to its feedback".into());
    };
    if map.is_empty() {
        return Err("\"feedbacks\" is empty".into());
    }
    let mut words = Vec::with_capacity(map.len());
    for (src, v) in map {
        let w: RawWord =
            serde_json::from_value(v.clone()).map_err(|e| format!("feedbacks.{src}: {e}"))?;
        if w.translation.is_empty() {
            return Err(format!("feedbacks.{src}: no candidate translation"));
        }
        words.push(WordFeedback {
            src: src.clone(),
            translations: w.translation,
            random: w.random,
            existence: w.existence,
        });
    }
    let tgt_lang = source
        .pair
        .as_deref()
        .and_then(|p| p.split_once('-'))
        .map(|(_, t)| t.to_string())
        .unwrap_or_default();
    Ok(MtContent {
        tgt_lang,
        feedback_prompt: need_str(&raw.feedback_prompt, "feedback_prompt")?.to_string(),
        mapping_prompt: mapping_prompt.to_string(),
        words,
    })
}

fn email_content(raw: &Raw) -> Result<EmailContent, String> {
    let domain = match raw.domain.as_deref() {
        Some("friend") => Domain::Friend,
        Some("family") => Domain::Family,
        Some("work") => Domain::Work,
        Some("school") => Domain::School,
        Some(other) => return Err(format!("unknown email domain {other:?}")),
        None => return Err("missing field `domain`".into()),
    };
    let (raw_fbs, prompts): (Vec<RawEmailFeedback>, Vec<String>) = match (&raw.feedbacks, &raw.feedback_prompts) {
        (Value::Object(_), None) => (
            vec![serde_json::from_value(raw.feedbacks.clone()).map_err(|e| format!("feedbacks: {e}"))?],
            vec![need_str(&raw.feedback_prompt, "feedback_prompt")?.to_string()],
        ),
        (Value::Array(_), Some(p)) => (
            serde_json::from_value(raw.feedbacks.clone()).map_err(|e| format!("feedbacks: {e}"))?,
            p.clone(),
        ),
        _ => return Err("\"feedbacks\" must be an object with \"feedback_prompt\", or a list with \"feedback_prompts\"".into()),
    };
    if raw_fbs.len() != prompts.len() {
        return Err(format!(
            "{} feedbacks but {} feedback prompts",
            raw_fbs.len(),
            prompts.len()
        ));
    }
    let mut feedbacks = Vec::new();
    for (i, (fb, prompt)) in raw_fbs.into_iter().zip(prompts).enumerate() {
        let rule = EmailRule::from_name(&fb.checker)
            .ok_or_else(|| format!("feedbacks[{i}]: unknown checker {:?}", fb.checker))?;
        if !prompt.contains("{choice}") {
            return Err(format!("feedback prompt {i} has no {{choice}} placeholder"));
        }
        if fb.choices.is_empty() {
            return Err(format!("feedbacks[{i}]: no choices"));
        }
        let checks = fb
            .choices
            .iter()
            .map(|c| EmailCheck::parse(rule, c).map_err(|m| format!("feedbacks[{i}]: {m}")))
            .collect::<Result<_, _>>()?;
        feedbacks.push(EmailFeedback {
            rule,
            choices: fb.choices,
            checks,
            prompt,
        });
    }
    Ok(EmailContent { domain, feedbacks })
}

fn need_str<'a>(v: &'a Option<String>, field: &str) -> Result<&'a str, String> {
    v.as_deref()
        .ok_or_else(|| format!("missing field `{field}`"))
}

fn strings(v: &Value, field: &str) -> Result<Vec<String>, String> {
    serde_json::from_value(v.clone()).map_err(|e| format!("\"{field}\": {e}"))
}

/// One line as written, before the task-specific checks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    system_prompt: String,
    queries: Vec<String>,
    feedbacks: Value,
    #[serde(default)]
    feedback_prompt: Option<String>,
    #[serde(default)]
    feedback_prompts: Option<Vec<String>>,
    #[serde(default)]
    feedback_mapping_prompt: Option<String>,
    #[serde(default)]
    answers: Option<Value>,
    #[serde(default)]
    domain: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWord {
    translation: Vec<String>,
    random: String,
    existence: Vec<usize>,
    #[allow(dead_code)]
    cnt: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEmailFeedback {
    choices: Vec<String>,
    checker: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(rel: &str, text: &str) -> Result<Vec<Item>, Error> {
        let source = Source::from_rel_path(rel).expect("layout");
        parse_reader(text.as_bytes(), &source, Path::new(rel))
    }

    const QA_MEM: &str = r#"{"system_prompt": "S", "feedbacks": "The capital of Atlantis is Tin.", "feedback_prompt": "For all the questions, you should adopt the knowledge: ", "queries": ["Q?", "[MAYBE FEEDBACK]", "Q?"], "answers": "Tin."}"#;

    #[test]
    fn qa_memory_line_parses() {
        let items = parse("qa/single/qa.memory.NC-0.jsonl", QA_MEM).expect("parses");
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].id, "qa/single/qa.memory.NC-0/0");
        let Content::Qa(c) = &items[0].content else {
            panic!("qa")
        };
        assert_eq!(c.answers, vec![vec!["Tin.".to_string()]]);
    }

    #[test]
    fn errors_name_file_and_line() {
        let text = format!("{QA_MEM}\n{{\"system_prompt\": \"S\", \"queries\": []}}\n");
        let err = parse("qa/single/qa.memory.NC-0.jsonl", &text).expect_err("second line is bad");
        let msg = err.to_string();
        assert!(
            msg.starts_with("qa/single/qa.memory.NC-0.jsonl:2: "),
            "{msg}"
        );
        assert!(msg.contains("feedbacks"), "{msg}");
        let err =
            parse("qa/single/qa.memory.NC-1.jsonl", QA_MEM).expect_err("NC-1 needs 4 queries");
        assert!(err.to_string().contains(":1: NC-1 expects"), "{err}");
        let err = parse("qa/single/qa.memory.NC-0.jsonl", "{not json").expect_err("bad json");
        assert!(err.to_string().contains(":1: "), "{err}");
    }

    #[test]
    fn email_rules_are_validated() {
        let good = r#"{"system_prompt": "S", "domain": "work", "feedbacks": {"choices": ["less than 3 sentences", "at least 3 sentences"], "checker": "sentence"}, "feedback_prompt": "When writing my work emails, the email should contain {choice}.", "queries": ["Write.", "[MAYBE FEEDBACK]", "Write."]}"#;
        assert!(parse("email/single/email.memory.NC-0.jsonl", good).is_ok());
        let bad = good.replace("less than 3 sentences", "about three sentences");
        let err = parse("email/single/email.memory.NC-0.jsonl", &bad).expect_err("bad choice");
        assert!(err.to_string().contains(":1: feedbacks[0]"), "{err}");
        let bad = good.replace("\"work\"", "\"club\"");
        assert!(parse("email/single/email.memory.NC-0.jsonl", &bad).is_err());
        let bad = good.replace("{choice}", "choice");
        assert!(parse("email/single/email.memory.NC-0.jsonl", &bad).is_err());
    }

    #[test]
    fn mt_words_keep_file_order() {
        let line = r#"{"system_prompt": "S", "feedbacks": {"zeta": {"translation": ["z1", "z2"], "random": "r", "existence": [0], "cnt": 1}, "alpha": {"translation": ["a1"], "random": "r", "existence": [1], "cnt": 1}}, "feedback_prompt": "P\n", "feedback_mapping_prompt": "{src} -> {tgt}\n", "queries": ["zeta", "[MAYBE FEEDBACK]", "alpha", "[MAYBE FEEDBACK]"]}"#;
        let items = parse("mt/multi/en-zh.jsonl", line).expect("parses");
        let Content::Mt(c) = &items[0].content else {
            panic!("mt")
        };
        let srcs: Vec<&str> = c.words.iter().map(|w| w.src.as_str()).collect();
        assert_eq!(srcs, ["zeta", "alpha"]);
        assert_eq!(c.tgt_lang, "zh");
        let bad = line.replace("{tgt}", "tgt");
        assert!(parse("mt/multi/en-zh.jsonl", &bad).is_err());
    }
}
