//! `pending.jsonl`: steps that finished but are not yet in `samples.jsonl`.
//!
//! The runner generates steps as soon as they are ready, but logs them in the run's
//! deterministic order (see [`super::runner`]), so a finished step can wait for earlier ones.
//! Each finished step is appended here as soon as it is known, in the format of
//! `samples.jsonl`, so that a process killed while steps wait loses none of them: a resumed
//! run takes a step from here, instead of generating it again, when its item, key, actor,
//! messages and parameters all match the step the plan asks for. A line is written with one
//! `write` and not fsynced: a killed process loses nothing, and a crash of the machine at worst
//! costs recomputation. Lines that cannot be read (a torn last line) are skipped. The file is
//! rewritten at the start of each attempt with only the steps the log still lacks, and removed
//! when the run is complete.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::run_dir::write_atomic;
use super::samples::{Sample, SampleOutcome};
use super::StoreError;
use crate::bench::plan::Step;

/// The finished steps read back from a previous attempt, by (item id, step key).
#[derive(Debug, Default)]
pub struct Recovered {
    samples: HashMap<(String, String), Sample>,
}

impl Recovered {
    /// Reads `path` (absent: nothing recovered); unreadable lines are skipped.
    pub fn load(path: &Path) -> Result<Self, StoreError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(StoreError::io(path, e)),
        };
        let samples = bytes
            .split(|&b| b == b'\n')
            .filter_map(|line| serde_json::from_slice::<Sample>(line).ok())
            .filter(|s| s.outcome().is_ok())
            .map(|s| ((s.item.clone(), s.key.clone()), s))
            .collect();
        Ok(Recovered { samples })
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Keeps only the samples `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&Sample) -> bool) {
        self.samples.retain(|_, s| keep(s));
    }

    /// The outcome of `step` of `item`, when a sample of exactly that step was recovered.
    pub fn take(&mut self, item: &str, step: &Step) -> Option<SampleOutcome> {
        let k = (item.to_string(), step.key.clone());
        let s = self.samples.get(&k)?;
        if s.actor != step.actor || s.messages != step.messages || s.params != step.params {
            return None;
        }
        let outcome = s.outcome().ok()?;
        self.samples.remove(&k);
        Some(outcome)
    }

    fn lines(&self) -> Vec<u8> {
        let mut all: Vec<&Sample> = self.samples.values().collect();
        all.sort_by(|a, b| (&a.item, &a.key).cmp(&(&b.item, &b.key)));
        all.into_iter().flat_map(Sample::to_line).collect()
    }
}

/// The append side of `pending.jsonl`.
#[derive(Debug)]
pub struct PendingWriter {
    path: PathBuf,
    file: File,
}

impl PendingWriter {
    /// Replaces the file (atomically) with the `recovered` samples, and opens it to append.
    pub fn create(path: &Path, recovered: &Recovered) -> Result<Self, StoreError> {
        write_atomic(path, &recovered.lines())?;
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| StoreError::io(path, e))?;
        Ok(PendingWriter {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Appends samples with one write.
    pub fn append(&mut self, samples: &[Sample]) -> Result<(), StoreError> {
        if samples.is_empty() {
            return Ok(());
        }
        let buf: Vec<u8> = samples.iter().flat_map(Sample::to_line).collect();
        self.file
            .write_all(&buf)
            .map_err(|e| StoreError::io(&self.path, e))
    }
}

/// Removes the file (the run is complete: everything is in `samples.jsonl`).
pub fn remove(path: &Path) -> Result<(), StoreError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::plan::StepOutput;

    use crate::store::testkit::judge_step as step;

    #[test]
    fn round_trips_skips_torn_lines_and_matches_whole_steps() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("pending.jsonl");
        assert!(Recovered::load(&path).unwrap().is_empty());
        let mut w = PendingWriter::create(&path, &Recovered::default()).unwrap();
        let out = SampleOutcome::Output(StepOutput::scripted("yes"));
        w.append(&[
            Sample::new("i", &step("a", "x"), out.clone()),
            Sample::new("i", &step("b", "y"), SampleOutcome::Error("no".into())),
        ])
        .unwrap();
        drop(w);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(b"{\"item\":\"i\",\"ke");
        std::fs::write(&path, &bytes).unwrap();
        let mut r = Recovered::load(&path).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r.take("i", &step("a", "other")), None);
        assert_eq!(r.take("j", &step("a", "x")), None);
        assert_eq!(r.take("i", &step("a", "x")), Some(out));
        assert_eq!(r.take("i", &step("a", "x")), None);
        // A new attempt keeps what was not taken.
        PendingWriter::create(&path, &r).unwrap();
        let mut again = Recovered::load(&path).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(
            again.take("i", &step("b", "y")),
            Some(SampleOutcome::Error("no".into()))
        );
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert!(!path.exists());
    }
}
