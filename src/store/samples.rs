//! `samples.jsonl`: one JSON line per finished step, appended in the run's deterministic order
//! and fsynced per batch.
//!
//! A line holds the item id, the step key, the actor, the full messages sent (full rather
//! than hashed: the log is then a complete, rescorable transcript), the sampling parameters,
//! and either the `output` ([`StepOutput`]) or, for a step that failed on its own, an `error`.
//! A process killed while appending can leave a torn last line (no final newline); opening
//! the log cuts it off, since that step will be computed again. Any other malformed line is
//! an error naming `samples.jsonl:LINE`. This module does not decide what to run: see
//! [`super::resume`] and [`super::runner`].

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::bench::plan::{Actor, Step, StepOutput};
use crate::engine::SamplingParams;
use crate::text::message::Message;

/// One line of `samples.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub item: String,
    pub key: String,
    pub actor: Actor,
    pub messages: Vec<Message>,
    pub params: SamplingParams,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<StepOutput>,
    /// Why this step failed (the engine rejected the request); the item stops here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq)]
pub enum SampleOutcome {
    Output(StepOutput),
    Error(String),
}

impl Sample {
    pub fn new(item: &str, step: &Step, outcome: SampleOutcome) -> Self {
        let (output, error) = match outcome {
            SampleOutcome::Output(o) => (Some(o), None),
            SampleOutcome::Error(e) => (None, Some(e)),
        };
        Sample {
            item: item.to_string(),
            key: step.key.clone(),
            actor: step.actor,
            messages: step.messages.clone(),
            params: step.params.clone(),
            output,
            error,
        }
    }

    /// The outcome, or why the line is not a valid sample (both or neither of output/error).
    pub fn outcome(&self) -> Result<SampleOutcome, String> {
        match (&self.output, &self.error) {
            (Some(o), None) => Ok(SampleOutcome::Output(o.clone())),
            (None, Some(e)) => Ok(SampleOutcome::Error(e.clone())),
            (Some(_), Some(_)) => Err("a sample has both \"output\" and \"error\"".into()),
            (None, None) => Err("a sample needs \"output\" or \"error\"".into()),
        }
    }

    /// The line as written (compact JSON and a newline).
    pub fn to_line(&self) -> Vec<u8> {
        // Plain data with string keys: serialising cannot fail. (Non-finite floats would
        // become `null`; the runner refuses steps with such parameters before logging.)
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// A sample read back, with its 1-based line number.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedSample {
    pub line: usize,
    pub sample: Sample,
}

/// Parses log bytes. Returns the samples of the complete lines and the length of the prefix
/// they occupy: anything after the last newline is a torn line and is not returned.
pub fn parse_log(path: &Path, bytes: &[u8]) -> Result<(Vec<LoggedSample>, usize), StoreError> {
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut out = Vec::new();
    if complete == 0 {
        return Ok((out, 0));
    }
    for (i, line) in bytes[..complete - 1].split(|&b| b == b'\n').enumerate() {
        let lineno = i + 1;
        let parse_err = |message: String| StoreError::Parse {
            path: path.to_path_buf(),
            line: lineno,
            message,
        };
        let sample: Sample =
            serde_json::from_slice(line).map_err(|e| parse_err(format!("bad sample: {e}")))?;
        sample.outcome().map_err(parse_err)?;
        out.push(LoggedSample {
            line: lineno,
            sample,
        });
    }
    Ok((out, complete))
}

/// The append side of the log.
#[derive(Debug)]
pub struct SampleWriter {
    path: PathBuf,
    file: File,
    lines: usize,
}

impl SampleWriter {
    /// Opens (creating if absent) the log at `path`, cuts a torn last line, and returns the
    /// samples already there with a writer positioned after them.
    pub fn open(path: &Path) -> Result<(Self, Vec<LoggedSample>), StoreError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(StoreError::io(path, e)),
        };
        let (samples, complete) = parse_log(path, &bytes)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| StoreError::io(path, e))?;
        if complete < bytes.len() {
            file.set_len(complete as u64)
                .map_err(|e| StoreError::io(path, e))?;
            file.sync_all().map_err(|e| StoreError::io(path, e))?;
        }
        let lines = samples.len();
        Ok((
            SampleWriter {
                path: path.to_path_buf(),
                file,
                lines,
            },
            samples,
        ))
    }

    /// Appends samples as one write, then fsyncs: after this returns they survive a crash.
    pub fn append(&mut self, samples: &[Sample]) -> Result<(), StoreError> {
        if samples.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for s in samples {
            buf.extend_from_slice(&s.to_line());
        }
        self.file
            .write_all(&buf)
            .map_err(|e| StoreError::io(&self.path, e))?;
        self.file
            .sync_data()
            .map_err(|e| StoreError::io(&self.path, e))?;
        self.lines += samples.len();
        Ok(())
    }

    /// Lines in the log (read back plus appended).
    pub fn lines(&self) -> usize {
        self.lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StopReason;

    fn sample(key: &str, ok: bool) -> Sample {
        let step = Step {
            key: key.into(),
            actor: Actor::Candidate(0),
            messages: vec![Message::user("hi\nthere \"quoted\" 你好")],
            params: SamplingParams::default(),
        };
        let outcome = if ok {
            SampleOutcome::Output(StepOutput {
                text: "reply".into(),
                stop_reason: StopReason::Eos,
                prompt_tokens: 5,
                output_tokens: 2,
                truncated: None,
                reasoning: None,
            })
        } else {
            SampleOutcome::Error("prompt too long".into())
        };
        Sample::new("item-1", &step, outcome)
    }

    #[test]
    fn lines_round_trip_and_torn_tail_is_cut() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("samples.jsonl");
        let (mut w, old) = SampleWriter::open(&p).unwrap();
        assert!(old.is_empty());
        w.append(&[sample("a", true), sample("b", false)]).unwrap();
        drop(w);
        let full = std::fs::read(&p).unwrap();
        assert_eq!(full.iter().filter(|&&b| b == b'\n').count(), 2);
        // Tear the second line.
        let first_len = full.iter().position(|&b| b == b'\n').unwrap() + 1;
        std::fs::write(&p, &full[..first_len + 7]).unwrap();
        let (w, old) = SampleWriter::open(&p).unwrap();
        assert_eq!(old.len(), 1);
        assert_eq!(old[0].sample, sample("a", true));
        assert_eq!(w.lines(), 1);
        assert_eq!(std::fs::read(&p).unwrap(), &full[..first_len]);
    }

    #[test]
    fn a_complete_line_without_newline_is_treated_as_torn() {
        let line = sample("a", true).to_line();
        let (s, n) = parse_log(Path::new("s"), &line[..line.len() - 1]).unwrap();
        assert!(s.is_empty());
        assert_eq!(n, 0);
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let mut bytes = sample("a", true).to_line();
        bytes.extend_from_slice(b"{\"item\": 3}\n");
        let err = parse_log(Path::new("run/samples.jsonl"), &bytes).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("run/samples.jsonl:2: bad sample"),
            "{err}"
        );
        let mut both = sample("a", true);
        both.error = Some("x".into());
        let err = parse_log(Path::new("s.jsonl"), &both.to_line()).unwrap_err();
        assert!(
            err.to_string().contains("s.jsonl:1: a sample has both"),
            "{err}"
        );
        let mut bytes = sample("a", true).to_line();
        bytes.extend_from_slice(b"\n");
        let err = parse_log(Path::new("s.jsonl"), &bytes).unwrap_err();
        assert!(err.to_string().starts_with("s.jsonl:2:"), "{err}");
    }

    #[test]
    fn error_samples_omit_output() {
        let line = String::from_utf8(sample("b", false).to_line()).unwrap();
        assert!(line.contains("\"error\":\"prompt too long\""), "{line}");
        assert!(!line.contains("\"output\""), "{line}");
    }
}
