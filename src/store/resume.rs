//! Resume: replaying a log against the steps the plan asks for again.
//!
//! The runner's schedule is a pure function of the plan, the items and the outputs of earlier
//! steps, and a killed run's log is a prefix of the log an uninterrupted run writes. So a
//! resumed run replays the same scheduling loop and, for each step it would run, takes the
//! next logged sample instead, as long as the log lasts; from there on it computes and
//! appends. Every replayed sample is checked against the step the plan asks for now (item,
//! key, actor, messages, parameters): a difference means the log belongs to another run, and
//! is reported with its line rather than silently mixed in. This module only matches; the
//! loop is [`super::runner`].

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use super::samples::{LoggedSample, SampleOutcome};
use super::StoreError;
use crate::bench::plan::Step;

/// Logged samples not yet replayed, in log order.
#[derive(Debug)]
pub struct Replay {
    path: PathBuf,
    pending: VecDeque<LoggedSample>,
    replayed: usize,
}

impl Replay {
    pub fn new(path: &Path, logged: Vec<LoggedSample>) -> Self {
        Replay {
            path: path.to_path_buf(),
            pending: logged.into(),
            replayed: 0,
        }
    }

    /// Whether logged samples remain.
    pub fn has_next(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Samples replayed so far.
    pub fn replayed(&self) -> usize {
        self.replayed
    }

    /// Takes the next logged sample, which must record `step` of `item`.
    pub fn take(&mut self, item: &str, step: &Step) -> Result<SampleOutcome, StoreError> {
        let Some(next) = self.pending.front() else {
            return Err(StoreError::LogMismatch {
                path: self.path.clone(),
                line: self.replayed + 1,
                message: "the log ended while a replay was asked for".into(),
            });
        };
        let s = &next.sample;
        let mismatch = |message: String| StoreError::LogMismatch {
            path: self.path.clone(),
            line: next.line,
            message,
        };
        if s.item != item || s.key != step.key {
            return Err(mismatch(format!(
                "expected step {:?} of item {:?} next, found step {:?} of item {:?}",
                step.key, item, s.key, s.item
            )));
        }
        let what = if s.actor != step.actor {
            Some("actor")
        } else if s.messages != step.messages {
            Some("messages")
        } else if s.params != step.params {
            Some("sampling parameters")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(mismatch(format!(
                "step {:?} of item {:?} was logged with other {what} than the run asks for now",
                step.key, item
            )));
        }
        let outcome = s.outcome().map_err(mismatch)?;
        self.pending.pop_front();
        self.replayed += 1;
        Ok(outcome)
    }

    /// Checks that the whole log was replayed: samples left over mean the log is not a prefix
    /// of this run's schedule.
    pub fn finish(self) -> Result<usize, StoreError> {
        match self.pending.front() {
            None => Ok(self.replayed),
            Some(extra) => Err(StoreError::LogMismatch {
                path: self.path,
                line: extra.line,
                message: format!(
                    "step {:?} of item {:?} is logged but the run never asks for it",
                    extra.sample.key, extra.sample.item
                ),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::plan::Actor;
    use crate::engine::SamplingParams;
    use crate::store::samples::Sample;

    use crate::store::testkit::judge_step as step;

    fn logged(line: usize, item: &str, st: &Step) -> LoggedSample {
        LoggedSample {
            line,
            sample: Sample::new(item, st, SampleOutcome::Error("e".into())),
        }
    }

    #[test]
    fn replays_matching_steps_in_order() {
        let a = step("a", "x");
        let b = step("b", "y");
        let mut r = Replay::new(
            Path::new("s.jsonl"),
            vec![logged(1, "i", &a), logged(2, "i", &b)],
        );
        assert_eq!(r.take("i", &a).unwrap(), SampleOutcome::Error("e".into()));
        assert!(r.has_next());
        r.take("i", &b).unwrap();
        assert!(!r.has_next());
        assert_eq!(r.finish().unwrap(), 2);
    }

    #[test]
    fn mismatches_name_the_line_and_the_field() {
        let a = step("a", "x");
        let cases = [
            ("j", step("a", "x"), "expected step \"a\" of item \"j\""),
            ("i", step("b", "x"), "expected step \"b\""),
            ("i", step("a", "changed"), "other messages"),
            (
                "i",
                Step {
                    actor: Actor::Candidate(0),
                    ..step("a", "x")
                },
                "other actor",
            ),
            (
                "i",
                Step {
                    params: SamplingParams {
                        seed: 9,
                        ..Default::default()
                    },
                    ..step("a", "x")
                },
                "other sampling parameters",
            ),
        ];
        for (item, want, msg) in cases {
            let mut r = Replay::new(Path::new("s.jsonl"), vec![logged(4, "i", &a)]);
            let err = r.take(item, &want).unwrap_err().to_string();
            assert!(err.starts_with("s.jsonl:4:"), "{err}");
            assert!(err.contains(msg), "{msg}: {err}");
        }
    }

    #[test]
    fn leftover_samples_are_an_error() {
        let a = step("a", "x");
        let r = Replay::new(Path::new("s.jsonl"), vec![logged(3, "i", &a)]);
        let err = r.finish().unwrap_err().to_string();
        assert!(err.starts_with("s.jsonl:3:"), "{err}");
        assert!(err.contains("never asks for it"), "{err}");
    }
}
