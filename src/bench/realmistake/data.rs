//! ReaLMistake's files to typed items: the benchmark (`data.zip`) and detector outputs
//! (`detector_outputs_open.zip`, or a folder laid out the same way).
//!
//! The authors publish both archives encrypted (ZipCrypto, password `open-realmistake`) and ask
//! that the examples never appear in plain text online, so archives are decrypted into memory
//! only; nothing here writes extracted text anywhere. Each JSONL line is checked, and a bad one
//! is an error naming the archive, the member and the line. This module does not compute
//! metrics (`score.rs`) or build prompts (`judge::error_detection`).

use std::collections::BTreeMap;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::judge::error_detection::{Detection, DetectionPrompt};

use super::Error;
use crate::bench::own_data;

/// The authors' password for both archives (stated in their README).
pub const PASSWORD: &[u8] = b"open-realmistake";

/// The three tasks, in the authors' order.
pub const TASKS: [&str; 3] = [
    "math_word_problem_generation",
    "finegrained_fact_verification",
    "answerability_classification",
];

/// The two models whose responses were annotated (file stems), in the authors' order.
pub const RESPONSE_MODELS: [&str; 2] = ["gpt-4-0613", "Llama-2-70b-chat-hf"];

/// One annotated response.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Task folder name, e.g. `math_word_problem_generation`.
    pub task: String,
    /// Response model file stem, e.g. `gpt-4-0613`.
    pub response_model: String,
    /// `metadata.id`, unique across the benchmark.
    pub id: String,
    pub input: String,
    pub llm_response: String,
    /// The expert label (always in the benchmark; optional in a user's `--items` file).
    pub label: Option<Detection>,
    pub error_categories: Vec<String>,
    pub human_explanation: String,
    pub metadata: serde_json::Value,
}

#[derive(Deserialize)]
struct RawItem {
    input: String,
    llm_response: String,
    error_label: String,
    #[serde(default)]
    error_categories: Vec<String>,
    #[serde(default)]
    human_explanation: String,
    metadata: serde_json::Value,
}

/// One line of a detector output file.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorRecord {
    /// `metadata.id` of the item judged.
    pub id: String,
    /// The detector's raw reply.
    pub response: String,
    /// The published prediction (`null` → `None`).
    pub prediction: Option<Detection>,
    /// The gold label as copied into the file.
    pub label: Detection,
}

#[derive(Deserialize)]
struct RawRecord {
    response: String,
    prediction: Option<String>,
    label: String,
    metadata: serde_json::Value,
}

/// The outputs of one detector with one prompt on one (task, response model) file.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorFile {
    pub task: String,
    pub response_model: String,
    /// Detector folder name, e.g. `Qwen1.5-72B-Chat`.
    pub detector: String,
    pub prompt: DetectionPrompt,
    pub records: Vec<DetectorRecord>,
}

/// Most bytes one archive member may unpack to (the largest real one is a few MB).
pub const MAX_MEMBER_BYTES: u64 = 256 << 20;
/// Most bytes all members of one archive may unpack to.
pub const MAX_ARCHIVE_BYTES: u64 = 1 << 30;

/// The text members of an archive or folder: (name relative to its root, contents).
type Members = Vec<(String, String)>;

/// Reads every `.jsonl` member of a zip archive into memory, decrypting with [`PASSWORD`]
/// where encrypted.
pub fn read_zip_members(path: &Path) -> Result<Members, Error> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    zip_members(
        std::io::BufReader::new(file),
        path,
        MAX_MEMBER_BYTES,
        MAX_ARCHIVE_BYTES,
    )
}

fn zip_members<R: Read + Seek>(
    reader: R,
    path: &Path,
    max_member: u64,
    max_archive: u64,
) -> Result<Members, Error> {
    let zip_err = |member: &str, source| Error::Zip {
        path: path.to_path_buf(),
        member: member.to_string(),
        source,
    };
    let mut archive = zip::ZipArchive::new(reader).map_err(|e| zip_err("", e))?;
    let mut out = Vec::new();
    let mut total: u64 = 0;
    for i in 0..archive.len() {
        let (name, encrypted) = {
            let raw = archive.by_index_raw(i).map_err(|e| zip_err("", e))?;
            let name = raw.name().map_err(|e| zip_err("", e))?.to_string();
            if raw.is_dir() || !name.ends_with(".jsonl") {
                continue;
            }
            // Members are read into memory by name, never unpacked to disk; names that would
            // escape a folder are refused all the same.
            let escapes = name.starts_with(['/', '\\'])
                || name.split(['/', '\\']).any(|c| c == "..")
                || raw.enclosed_name().is_none();
            if escapes {
                return Err(Error::Member {
                    path: path.to_path_buf(),
                    member: name,
                    message: "unsafe member name (absolute or `..`)".into(),
                });
            }
            (name, raw.encrypted())
        };
        let mut member = if encrypted {
            archive.by_index_decrypt(i, PASSWORD)
        } else {
            archive.by_index(i)
        }
        .map_err(|e| zip_err(&name, e))?;
        // Zip bombs: at most MAX_MEMBER_BYTES per member and MAX_ARCHIVE_BYTES in all,
        // whatever the archive's headers claim.
        let mut text = String::new();
        let cap = max_member.min(max_archive.saturating_sub(total));
        let n = (&mut member)
            .take(cap + 1)
            .read_to_string(&mut text)
            .map_err(|e| Error::Member {
                path: path.to_path_buf(),
                member: name.clone(),
                message: e.to_string(),
            })? as u64;
        if n > cap {
            return Err(Error::Member {
                path: path.to_path_buf(),
                member: name,
                message: format!(
                    "unpacks to more than {cap} bytes (limits: {max_member} per member, \
                     {max_archive} per archive)"
                ),
            });
        }
        total += n;
        out.push((name, text));
    }
    Ok(out)
}

/// Reads every `.jsonl` file under `root` (names relative to `root`, `/`-separated).
pub fn read_dir_members(root: &Path) -> Result<Members, Error> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let io = |source, path: &Path| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        for entry in std::fs::read_dir(&dir).map_err(|e| io(e, &dir))? {
            let path = entry.map_err(|e| io(e, &dir))?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                let text = std::fs::read_to_string(&path).map_err(|e| io(e, &path))?;
                let rel = path.strip_prefix(root).unwrap_or(&path);
                let name = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                out.push((name, text));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Members of `path`: a zip archive, or a folder of the same layout.
pub fn read_members(path: &Path) -> Result<Members, Error> {
    if path.is_dir() {
        read_dir_members(path)
    } else {
        read_zip_members(path)
    }
}

/// Where a line came from, for error messages.
struct Origin<'a> {
    path: &'a Path,
    member: &'a str,
}

impl Origin<'_> {
    fn err(&self, line: usize, message: impl Into<String>) -> Error {
        Error::MemberLine {
            path: self.path.to_path_buf(),
            member: self.member.to_string(),
            line,
            message: message.into(),
        }
    }
}

fn label(origin: &Origin, line: usize, field: &str, value: &str) -> Result<Detection, Error> {
    Detection::from_label(value).ok_or_else(|| {
        origin.err(
            line,
            format!("field \"{field}\": expected \"error\" or \"no_error\", got {value:?}"),
        )
    })
}

fn metadata_id(
    origin: &Origin,
    line: usize,
    metadata: &serde_json::Value,
) -> Result<String, Error> {
    metadata
        .get("id")
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .ok_or_else(|| origin.err(line, "missing string field \"metadata.id\""))
}

use crate::bench::loader::jsonl_lines as lines;

/// Parses one benchmark file's text (`data/<task>/<model>.jsonl`).
fn parse_items(text: &str, origin: &Origin, task: &str, model: &str) -> Result<Vec<Item>, Error> {
    let mut out = Vec::new();
    for (n, line) in lines(text) {
        let raw: RawItem = serde_json::from_str(line).map_err(|e| origin.err(n, e.to_string()))?;
        out.push(Item {
            task: task.to_string(),
            response_model: model.to_string(),
            id: metadata_id(origin, n, &raw.metadata)?,
            input: raw.input,
            llm_response: raw.llm_response,
            label: Some(label(origin, n, "error_label", &raw.error_label)?),
            error_categories: raw.error_categories,
            human_explanation: raw.human_explanation,
            metadata: raw.metadata,
        });
    }
    Ok(out)
}

/// The task and response-model names of the items of a user's `--items` file (also
/// `--subset` names).
pub const OWN: &str = "own";

/// Loads a user's `--items` file: one `{"id"?, "input", "response", "label"?:
/// "error"|"no_error"}` per line. Ids default to the line number and must be unique.
pub fn load_own_items(path: &Path) -> Result<Vec<Item>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_own_items(&text, path)
}

/// Parses an `--items` JSONL text (`path` names errors).
pub fn parse_own_items(text: &str, path: &Path) -> Result<Vec<Item>, Error> {
    let mut out = Vec::new();
    let mut lines = Vec::new();
    for r in own_data::jsonl_records(text, path)? {
        r.only(&["id", "input", "response", "label"])?;
        let label = match r.opt_text("label")? {
            None => None,
            Some(l) => Some(Detection::from_label(&l).ok_or_else(|| {
                r.error("label", format!("{l:?} is not \"error\" or \"no_error\""))
            })?),
        };
        lines.push(r.line);
        out.push(Item {
            task: OWN.to_string(),
            response_model: OWN.to_string(),
            id: r.id()?,
            input: r.text("input")?,
            llm_response: r.text("response")?,
            label,
            error_categories: Vec::new(),
            human_explanation: String::new(),
            metadata: serde_json::Value::Null,
        });
    }
    own_data::unique_ids(
        path,
        lines.iter().zip(&out).map(|(l, i)| (*l, i.id.as_str())),
    )?;
    Ok(out)
}

/// The benchmark, keyed by (task, response model), items in file order.
pub type Benchmark = BTreeMap<(String, String), Vec<Item>>;

/// Loads the benchmark from `data.zip` (or a folder holding `data/<task>/<model>.jsonl`).
pub fn load_benchmark(path: &Path) -> Result<Benchmark, Error> {
    benchmark_from_members(&read_members(path)?, path)
}

fn benchmark_from_members(members: &Members, path: &Path) -> Result<Benchmark, Error> {
    let mut out = Benchmark::new();
    for (name, text) in members {
        let parts: Vec<&str> = name.split('/').collect();
        let [.., "data", task, file] = parts.as_slice() else {
            continue;
        };
        let Some(model) = file.strip_suffix(".jsonl") else {
            continue;
        };
        let origin = Origin { path, member: name };
        let items = parse_items(text, &origin, task, model)?;
        out.insert((task.to_string(), model.to_string()), items);
    }
    if out.is_empty() {
        return Err(Error::Empty {
            path: path.to_path_buf(),
            what: "files named data/<task>/<model>.jsonl",
        });
    }
    Ok(out)
}

/// Parses one detector output file's text.
fn parse_records(text: &str, origin: &Origin) -> Result<Vec<DetectorRecord>, Error> {
    let mut out = Vec::new();
    for (n, line) in lines(text) {
        let raw: RawRecord =
            serde_json::from_str(line).map_err(|e| origin.err(n, e.to_string()))?;
        let prediction = match raw.prediction.as_deref() {
            None => None,
            Some(p) => Some(label(origin, n, "prediction", p)?),
        };
        out.push(DetectorRecord {
            id: metadata_id(origin, n, &raw.metadata)?,
            response: raw.response,
            prediction,
            label: label(origin, n, "label", &raw.label)?,
        });
    }
    Ok(out)
}

/// Loads detector outputs from a zip archive or folder: every member named
/// `…/<task>/<response model>/<detector>/baseline_errordetection_prompt_<n>.jsonl`.
pub fn load_detector_outputs(path: &Path) -> Result<Vec<DetectorFile>, Error> {
    detector_files_from_members(&read_members(path)?, path)
}

fn detector_files_from_members(members: &Members, path: &Path) -> Result<Vec<DetectorFile>, Error> {
    let mut out = Vec::new();
    for (name, text) in members {
        let parts: Vec<&str> = name.split('/').collect();
        let [.., task, model, detector, file] = parts.as_slice() else {
            continue;
        };
        let prompt = file
            .strip_prefix("baseline_errordetection_prompt_")
            .and_then(|s| s.strip_suffix(".jsonl"))
            .and_then(|n| n.parse().ok())
            .and_then(DetectionPrompt::from_number);
        let Some(prompt) = prompt else {
            continue;
        };
        let origin = Origin { path, member: name };
        out.push(DetectorFile {
            task: task.to_string(),
            response_model: model.to_string(),
            detector: detector.to_string(),
            prompt,
            records: parse_records(text, &origin)?,
        });
    }
    if out.is_empty() {
        return Err(Error::Empty {
            path: path.to_path_buf(),
            what: "files named <task>/<response model>/<detector>/baseline_errordetection_prompt_<n>.jsonl",
        });
    }
    out.sort_by(|a, b| {
        (&a.task, &a.response_model, &a.detector, a.prompt).cmp(&(
            &b.task,
            &b.response_model,
            &b.detector,
            b.prompt,
        ))
    });
    Ok(out)
}

/// The default location of the authors' files under the public data root.
pub fn default_dir() -> PathBuf {
    crate::bench::data_root().join("realmistake")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin<'static> {
        Origin {
            path: Path::new("x.zip"),
            member: "data/t/m.jsonl",
        }
    }

    const ITEM: &str = r#"{"input": "Write a question.", "llm_response": "Q?", "error_label": "error", "error_categories": ["Reasoning Correctness"], "human_explanation": "wrong", "metadata": {"id": "t_1_m"}}"#;

    #[test]
    fn parses_items() {
        let text = format!("{ITEM}\n\n{}", ITEM.replace("\"error\"", "\"no_error\""));
        let items = parse_items(&text, &origin(), "t", "m").expect("parses");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].label, Some(Detection::Error));
        assert_eq!(items[1].label, Some(Detection::NoError));
        assert_eq!(items[0].id, "t_1_m");
    }

    #[test]
    fn bad_lines_name_member_and_line() {
        let bad_label = format!("{ITEM}\n{}", ITEM.replace("\"error\",", "\"maybe\","));
        let e = parse_items(&bad_label, &origin(), "t", "m")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.zip:data/t/m.jsonl:2: "), "{e}");
        assert!(e.contains("maybe"), "{e}");
        let e = parse_items("{not json", &origin(), "t", "m")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("x.zip:data/t/m.jsonl:1: "), "{e}");
        let no_id = ITEM.replace("\"id\"", "\"key\"");
        let e = parse_items(&no_id, &origin(), "t", "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("metadata.id"), "{e}");
    }

    #[test]
    fn parses_records_with_null_prediction() {
        let text = r#"{"response": "r", "prediction": null, "label": "error", "correct": false, "metadata": {"id": "a"}}
{"response": "r", "prediction": "no_error", "label": "error", "metadata": {"id": "b"}}"#;
        let recs = parse_records(text, &origin()).expect("parses");
        assert_eq!(recs[0].prediction, None);
        assert_eq!(recs[1].prediction, Some(Detection::NoError));
        let e = parse_records(
            r#"{"response": "r", "prediction": "yes", "label": "error", "metadata": {"id": "a"}}"#,
            &origin(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains(":1: ") && e.contains("prediction"), "{e}");
    }

    #[test]
    fn detector_paths_are_recognised() {
        let rec = r#"{"response": "r", "prediction": "error", "label": "error", "metadata": {"id": "a"}}"#;
        let members: Members = vec![
            (
                "o/s/t/m/d/baseline_errordetection_prompt_3.jsonl".into(),
                rec.into(),
            ),
            ("o/s/t/m/d/cot_instruction_prompt.jsonl".into(), rec.into()),
        ];
        let files = detector_files_from_members(&members, Path::new("dir")).expect("parses");
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].prompt, DetectionPrompt::P3);
        assert_eq!(
            (files[0].task.as_str(), files[0].detector.as_str()),
            ("t", "d")
        );
        let none: Members = vec![("readme.jsonl".into(), rec.into())];
        assert!(detector_files_from_members(&none, Path::new("dir")).is_err());
    }

    fn zip(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut buf = std::io::Cursor::new(Vec::new());
        let mut zw = zip::ZipWriter::new(&mut buf);
        for (name, data) in members {
            zw.start_file(*name, zip::write::SimpleFileOptions::default())
                .unwrap();
            std::io::Write::write_all(&mut zw, data).unwrap();
        }
        zw.finish().unwrap();
        buf.into_inner()
    }

    #[test]
    fn zip_bombs_and_path_escapes_are_refused() {
        let p = Path::new("a.zip");
        let zeros = vec![b'0'; 5000];
        let ok = zip(&[("d/a.jsonl", b"{}"), ("d/b.jsonl", b"{}")]);
        let read = |bytes: &[u8], member, archive| {
            zip_members(std::io::Cursor::new(bytes.to_vec()), p, member, archive)
        };
        assert_eq!(read(&ok, 10, 10).unwrap().len(), 2);
        // One member over the per-member cap (it compresses to a few bytes: a small bomb).
        let bomb = zip(&[("d/a.jsonl", &zeros)]);
        assert!(bomb.len() < 1000);
        let e = read(&bomb, 4096, 1 << 20).unwrap_err().to_string();
        assert!(e.contains("unpacks to more than 4096 bytes"), "{e}");
        // Members within their cap but over the archive's.
        let two = zip(&[("d/a.jsonl", &zeros), ("d/b.jsonl", &zeros)]);
        let e = read(&two, 6000, 8000).unwrap_err().to_string();
        assert!(
            e.contains("d/b.jsonl") && e.contains("more than 3000"),
            "{e}"
        );
        for name in ["../evil.jsonl", "/etc/evil.jsonl"] {
            let e = read(&zip(&[(name, b"{}")]), 10, 10)
                .unwrap_err()
                .to_string();
            assert!(e.contains("unsafe member name"), "{e}");
        }
    }
}
