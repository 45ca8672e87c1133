//! The runner: drives a protocol's [`Plan`] over its items with one loaded model at a time,
//! logs every finished step, then scores and writes the results.
//!
//! **The log order** is that of a loop of rounds, repeated until no item has a step left: ask
//! every unfinished item (in item order) for its next steps; pick the lowest [`Actor`] that
//! has pending steps (candidates before the judge); the round is all of that actor's pending
//! steps in (item order, step key) order. The order of `samples.jsonl` therefore depends only
//! on the plan and the step outputs, never on batch size, timing or where a previous attempt
//! was killed: resuming replays the same loop and takes steps from the log while it lasts
//! (see [`super::resume`]).
//!
//! **The computation** does not wait for rounds. An item's steps come in groups: its pending
//! steps of its lowest actor, which is exactly what the next round that touches the item takes
//! from it (a round's actor is the lowest over all items, so no earlier round can touch it).
//! An item's groups therefore depend on the item alone, and as soon as a group is finished the
//! item's next group is ready. One queue holds the ready steps of every item; the loaded model
//! takes them (earliest items first) whenever it has a free slot, up to `batch_size` in flight
//! ([`Generate::start`] and [`Generate::poll`]: the engine refills its batch every forward
//! step), across items, turns and every actor it answers ([`Models::same_model`]). Only when
//! the loaded model has nothing in flight and nothing ready is it dropped and the model of the
//! lowest actor with ready steps loaded (one model in memory at a time).
//!
//! **A reorder buffer** holds the finished steps until the round order reaches them; each time
//! a prefix of the round under way is complete it is appended to `samples.jsonl` with one write
//! and fsync. Every finished step is also appended at once to `pending.jsonl`
//! ([`super::pending`]), from which a resumed attempt takes the steps a killed one had finished
//! but not logged. A step the engine rejects on its own ([`Models::preflight`],
//! [`Models::is_request_error`]) is logged with its error and its item stops; any other engine
//! error stops the run, leaving the log valid for a resume. The runner knows no protocol and no
//!
//! The parts: this file runs a plan end to end ([`Run::execute`]); [`queue`] is the
//! scheduling loop and its ready queue; [`log_order`] is the round order of the log and the
//! reorder buffer; `tests` holds the tests of the whole.

mod log_order;
mod queue;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::path::Path;

use super::manifest::{Attempt, ItemSet, Manifest, RunIdentity};
use super::model_pool::Models;
use super::pending::{self, Recovered};
use super::progress::Progress;
use super::resume::Replay;
use super::run_dir::{write_atomic, RunDir};
use super::run_results::{FailedStep, RunModel, RunResults};
use super::samples::{SampleOutcome, SampleWriter};
use super::StoreError;
use crate::bench::plan::{Plan, Step, StepOutput, Transcript};
use crate::bench::BenchResults;
use crate::engine::{ChatReply, PrefillStats, StopReason};

/// One run to execute or resume.
pub struct Run<'a, P: Plan> {
    /// The run directory (created if absent).
    pub dir: &'a Path,
    /// What the run is. `identity.items` is filled by the runner from the items.
    pub manifest: Manifest,
    pub plan: &'a P,
    pub items: &'a [P::Item],
    /// Most requests sent to a model at once.
    pub batch_size: usize,
}

/// What an execution did.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub results: RunResults,
    /// What the run is (the manifest's identity, items included), for the reports.
    pub identity: RunIdentity,
    /// True when a manifest was already there (the run was resumed or re-finished).
    pub resumed: bool,
    /// Steps taken from the log.
    pub replayed: usize,
    /// Steps computed by this process.
    pub computed: usize,
    /// Steps a killed attempt had finished but not logged, taken from `pending.jsonl`.
    pub recovered: usize,
    /// Environment differences from the original attempt (never results-affecting).
    pub warnings: Vec<String>,
    /// Prompt positions this process computed and took from the engines' prefix caches.
    pub prefill: PrefillStats,
}

/// The runner's state for the items.
struct Ledger {
    ids: Vec<String>,
    transcripts: Vec<Transcript>,
    stopped: Vec<bool>,
    failed: Vec<FailedStep>,
    /// Steps each item was expected to take (see [`Plan::planned_steps`]).
    planned: Vec<Option<usize>>,
    /// Items whose planned count was already corrected in the progress total.
    closed: Vec<bool>,
}

impl Ledger {
    fn record(&mut self, i: usize, step: &Step, outcome: SampleOutcome) {
        match outcome {
            SampleOutcome::Output(o) => {
                self.transcripts[i].insert(step.key.clone(), o);
            }
            SampleOutcome::Error(error) => {
                self.stopped[i] = true;
                // The failed step and the ones before it ran; the rest of the plan is skipped.
                let skipped =
                    self.planned[i].map(|p| p.saturating_sub(self.transcripts[i].len() + 1));
                self.failed.push(FailedStep {
                    item: self.ids[i].clone(),
                    key: step.key.clone(),
                    actor: step.actor,
                    error,
                    skipped,
                });
            }
        }
    }
}

impl<P: Plan> Run<'_, P> {
    /// Runs (or resumes) to the end, scores the completed items with `score`, writes
    /// `results.json` (and the engine counters) and returns what happened; the caller renders
    /// the reports from [`RunOutcome::results`] and [`RunOutcome::identity`].
    pub fn execute<M: Models>(
        mut self,
        models: &mut M,
        progress: &mut dyn Progress,
        score: impl FnOnce(&[(&P::Item, &Transcript)]) -> BenchResults,
    ) -> Result<RunOutcome, StoreError> {
        if self.batch_size == 0 {
            return Err(StoreError::BatchSize);
        }
        let ids: Vec<String> = self.items.iter().map(|i| self.plan.item_id(i)).collect();
        let mut seen = BTreeSet::new();
        if let Some(dup) = ids.iter().find(|id| !seen.insert(id.as_str())) {
            return Err(StoreError::DuplicateItem { id: dup.clone() });
        }
        self.manifest.identity.items = ItemSet::from_ids(&ids);

        let dir = RunDir::open(self.dir)?;
        let (resumed, warnings) = open_manifest(&dir, &self.manifest)?;
        dir.clear_outputs()?;
        let samples_path = dir.samples_path();
        let (mut writer, logged) = SampleWriter::open(&samples_path)?;
        Attempt {
            resumed,
            logged_samples: logged.len(),
            environment: self.manifest.environment.clone(),
        }
        .append_to(&dir.attempts_path())?;
        let mut replay = Replay::new(&samples_path, logged);

        let n = self.items.len();
        let planned: Vec<Option<usize>> = self
            .items
            .iter()
            .map(|i| self.plan.planned_steps(i))
            .collect();
        progress.plan(planned.iter().map(|p| p.unwrap_or(0)).sum());
        let mut ledger = Ledger {
            ids,
            transcripts: vec![Transcript::new(); n],
            stopped: vec![false; n],
            failed: Vec::new(),
            planned,
            closed: vec![false; n],
        };
        let mut prefill = PrefillStats::default();
        let pending_path = dir.pending_path();
        let recovered = Recovered::load(&pending_path)?;
        let (computed, recovered) = self.schedule(
            models,
            progress,
            &mut replay,
            &mut writer,
            &mut ledger,
            &mut prefill,
            (&pending_path, recovered),
        )?;
        let replayed = replay.finish()?;
        // Everything is in the log now.
        pending::remove(&pending_path)?;

        progress.stage("scoring");
        let complete: Vec<(&P::Item, &Transcript)> = self
            .items
            .iter()
            .zip(&ledger.transcripts)
            .zip(&ledger.stopped)
            .filter(|(_, stopped)| !**stopped)
            .map(|(pair, _)| pair)
            .collect();
        let completed = complete.len();
        let bench = score(&complete);
        let results = RunResults {
            protocol: self.manifest.identity.protocol.clone(),
            models: self
                .manifest
                .identity
                .models
                .iter()
                .map(|m| RunModel {
                    role: m.role.clone(),
                    name: m.name.clone(),
                    sha256: m.sha256.clone(),
                })
                .collect(),
            items: n,
            completed,
            samples: writer.lines(),
            skipped_steps: ledger.failed.iter().filter_map(|f| f.skipped).sum(),
            failed: ledger.failed,
            results: bench,
        };
        write_atomic(&dir.results_path(), &results.to_json())?;
        // How this attempt's engines worked: not part of the results (it depends on batch
        // size, the prefix cache's budget and where a resume started), so kept apart.
        let engine = serde_json::json!({
            "prefill_tokens_computed": prefill.computed,
            "prefill_tokens_reused": prefill.reused,
            "steps_computed": computed,
            "steps_recovered": recovered,
        });
        let engine = serde_json::to_string_pretty(&engine).unwrap_or_default() + "\n";
        write_atomic(&dir.engine_stats_path(), engine.as_bytes())?;
        progress.finish(&format!(
            "finished: {} of {} items completed, results in {} (prefill: {} prompt tokens \
             computed, {} reused)",
            completed,
            n,
            dir.results_path().display(),
            prefill.computed,
            prefill.reused,
        ));
        Ok(RunOutcome {
            results,
            identity: self.manifest.identity,
            resumed,
            replayed,
            computed,
            recovered,
            warnings,
            prefill,
        })
    }

    /// Item `i`'s next steps given its finished ones, sorted by key and checked.
    fn checked_steps(
        &self,
        i: usize,
        id: &str,
        done: &Transcript,
    ) -> Result<Vec<Step>, StoreError> {
        let mut steps = self.plan.next_steps(&self.items[i], done);
        steps.sort_by(|a, b| a.key.cmp(&b.key));
        let invalid = |message: String| StoreError::Plan {
            item: id.to_string(),
            message,
        };
        for (k, s) in steps.iter().enumerate() {
            if done.contains_key(&s.key) {
                return Err(invalid(format!("step {:?} is already finished", s.key)));
            }
            if k > 0 && steps[k - 1].key == s.key {
                return Err(invalid(format!("step {:?} is asked for twice", s.key)));
            }
            if s.messages.is_empty() {
                return Err(invalid(format!("step {:?} has no messages", s.key)));
            }
            if !(s.params.temperature.is_finite() && s.params.top_p.is_finite()) {
                // JSON has no NaN: such a step could not be logged and read back.
                return Err(invalid(format!(
                    "step {:?} has a non-finite temperature or top_p",
                    s.key
                )));
            }
        }
        Ok(steps)
    }
}

/// Reads and checks the manifest of a resumed run, or writes it for a new one. Returns whether
/// the run is resumed, and warnings about environment differences.
fn open_manifest(dir: &RunDir, wanted: &Manifest) -> Result<(bool, Vec<String>), StoreError> {
    let path = dir.manifest_path();
    if path.exists() {
        let on_disk = Manifest::load(&path)?;
        let fields = on_disk.differences(wanted);
        if !fields.is_empty() {
            return Err(StoreError::ManifestMismatch { path, fields });
        }
        let (a, b) = (&on_disk.environment, &wanted.environment);
        let mut warnings = Vec::new();
        if a.git_commit != b.git_commit {
            let commit = |c: &Option<String>| c.clone().unwrap_or_else(|| "unknown".into());
            warnings.push(format!(
                "the run was started at commit {}, this is {}",
                commit(&a.git_commit),
                commit(&b.git_commit)
            ));
        }
        if a.cargo_lock_sha256 != b.cargo_lock_sha256 {
            warnings.push("the run was started with another Cargo.lock".to_string());
        }
        return Ok((true, warnings));
    }
    let samples = dir.samples_path();
    if std::fs::metadata(&samples).is_ok_and(|m| m.len() > 0) {
        return Err(StoreError::NotARunDir {
            path: dir.root().to_path_buf(),
        });
    }
    wanted.save(&path)?;
    Ok((false, Vec::new()))
}

fn step_output(reply: ChatReply) -> StepOutput {
    StepOutput {
        text: reply.text,
        stop_reason: reply.stop_reason,
        prompt_tokens: reply.prompt_ids.len(),
        output_tokens: reply.output_ids.len(),
        truncated: None,
        reasoning: reply.reasoning,
    }
}

/// A reply as logged: a prompt that filled the context, so that nothing was generated, is a
/// failed step (never an empty answer to grade).
fn reply_outcome(reply: ChatReply) -> SampleOutcome {
    if reply.stop_reason == StopReason::ContextFull && reply.output_ids.is_empty() {
        return SampleOutcome::Error(format!(
            "the prompt ({} tokens) fills the model's context: nothing could be generated",
            reply.prompt_ids.len()
        ));
    }
    SampleOutcome::Output(step_output(reply))
}
