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
//! model format.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use super::manifest::{Attempt, ItemSet, Manifest};
use super::models::Models;
use super::pending::{self, PendingWriter, Recovered};
use super::resume::Replay;
use super::run_dir::{write_atomic, RunDir};
use super::samples::{Sample, SampleOutcome, SampleWriter};
use super::{error_chain, ActorName, StoreError};
use crate::bench::plan::{Actor, Plan, Step, StepOutput, Transcript};
use crate::bench::results::BenchResults;
use crate::engine::{ChatReply, ChatRequest, Generate, PrefillStats, StopReason};
use crate::report::html::{self, ReportRun};
use crate::report::markdown;
use crate::report::progress::Progress;
use crate::report::results::{FailedStep, RunModel, RunResults};

/// The file, beside `results.json`, with this attempt's engine counters (prefill tokens
/// computed and reused).
pub const ENGINE_STATS: &str = "engine.json";

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
    /// `results.json` and `report.md`, and returns what happened.
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
        write_atomic(&dir.report_path(), markdown::render(&results).as_bytes())?;
        let page = ReportRun::new(results.clone(), Some(self.manifest.identity.clone()));
        write_atomic(&dir.report_html_path(), html::render(&[page]).as_bytes())?;
        // How this attempt's engines worked: not part of the results (it depends on batch
        // size, the prefix cache's budget and where a resume started), so kept apart.
        let engine = serde_json::json!({
            "prefill_tokens_computed": prefill.computed,
            "prefill_tokens_reused": prefill.reused,
            "steps_computed": computed,
            "steps_recovered": recovered,
        });
        let engine = serde_json::to_string_pretty(&engine).unwrap_or_default() + "\n";
        write_atomic(&dir.root().join(ENGINE_STATS), engine.as_bytes())?;
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
            resumed,
            replayed,
            computed,
            recovered,
            warnings,
            prefill,
        })
    }

    /// The scheduling loop (see the module docs): replays the log while it lasts, then runs
    /// the queue until no item has a step left. Returns the steps computed and recovered.
    #[allow(clippy::too_many_arguments)]
    fn schedule<M: Models>(
        &self,
        models: &mut M,
        progress: &mut dyn Progress,
        replay: &mut Replay,
        writer: &mut SampleWriter,
        ledger: &mut Ledger,
        prefill: &mut PrefillStats,
        spill: (&Path, Recovered),
    ) -> Result<(usize, usize), StoreError> {
        let mut order = LogOrder::default();
        let mut q = Queue::default();
        self.log_in_order(&mut order, ledger, progress, replay, &mut q.held, writer)?;
        if order.finished {
            return Ok((0, 0));
        }
        let (spill_path, mut recovered) = spill;
        // Only what the log lacks is kept.
        let index: HashMap<&str, usize> = (ledger.ids.iter().enumerate())
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        let failed: BTreeSet<(&str, &str)> = (ledger.failed.iter())
            .map(|f| (f.item.as_str(), f.key.as_str()))
            .collect();
        recovered.retain(|s| {
            index.get(s.item.as_str()).is_some_and(|&i| {
                !ledger.transcripts[i].contains_key(&s.key)
                    && !failed.contains(&(s.item.as_str(), s.key.as_str()))
            })
        });
        let mut spill = PendingWriter::create(spill_path, &recovered)?;
        q.recovered = recovered;

        // Every item starts where the log ends; the rest of the round under way is asked for.
        let n = self.items.len();
        q.ahead = (0..n)
            .map(|i| Ahead {
                transcript: ledger.transcripts[i].clone(),
                stopped: ledger.stopped[i],
                outstanding: 0,
                done: false,
            })
            .collect();
        for (i, _) in &order.round[order.next..] {
            q.ahead[*i].outstanding += 1;
        }
        for (i, step) in order.round[order.next..].iter().cloned() {
            q.queue(&ledger.ids, i, step);
        }
        q.idle = (0..n)
            .rev()
            .filter(|&i| q.ahead[i].outstanding == 0)
            .collect();

        let mut loaded: Option<(Actor, M::Gen)> = None;
        loop {
            // Items whose steps all finished ask for their next ones: those of their lowest
            // actor, the ones the round loop would take next for the item.
            while let Some(i) = q.idle.pop() {
                let a = &mut q.ahead[i];
                if a.stopped || a.done {
                    continue;
                }
                let steps = self.checked_steps(i, &ledger.ids[i], &a.transcript)?;
                let Some(actor) = steps.iter().map(|s| s.actor).min() else {
                    a.done = true;
                    continue;
                };
                let group: Vec<Step> = steps.into_iter().filter(|s| s.actor == actor).collect();
                a.outstanding = group.len();
                for step in group {
                    q.queue(&ledger.ids, i, step);
                }
            }
            spill.append(&std::mem::take(&mut q.spilled))?;
            progress.tokens(std::mem::take(&mut q.tokens));
            self.log_in_order(&mut order, ledger, progress, replay, &mut q.held, writer)?;
            if q.flying.is_empty() && q.ready.is_empty() {
                break;
            }

            // The loaded model keeps working while it has steps in flight or ready; then the
            // lowest actor with ready steps gets its model.
            let busy = loaded.as_ref().is_some_and(|(l, _)| {
                !q.flying.is_empty() || q.ready.keys().any(|a| shares(&*models, *l, *a))
            });
            if !busy {
                let Some(&actor) = q.ready.keys().next() else {
                    return Err(StoreError::Internal(
                        "nothing to run and nothing in flight".into(),
                    ));
                };
                if let Some((_, g)) = &loaded {
                    prefill.add(g.prefill_stats());
                }
                // One model in memory at a time: drop the previous one before loading.
                drop(loaded.take());
                progress.stage(&format!("loading the model for {}", ActorName(actor)));
                let gen = models.load(actor).map_err(|source| StoreError::Load {
                    actor: ActorName(actor),
                    source,
                })?;
                loaded = Some((actor, gen));
            }
            let Some((actor, gen)) = loaded.as_mut() else {
                return Err(StoreError::Internal("no model loaded".into()));
            };
            let actor = *actor;
            let engine_failed = |e: <M::Gen as Generate>::Error| StoreError::Engine {
                actor: ActorName(actor),
                source: Box::new(e),
            };

            // Fill the free slots, earliest steps first.
            let mut answered = false;
            while q.flying.len() < self.batch_size {
                let Some((i, step)) = q.take_ready(|a| shares(&*models, actor, a)) else {
                    break;
                };
                let request = ChatRequest {
                    messages: step.messages.clone(),
                    params: step.params.clone(),
                };
                if let Err(reason) = models.preflight(gen, &request) {
                    q.computed(&ledger.ids, i, step, SampleOutcome::Error(reason));
                    answered = true;
                    continue;
                }
                let id = q.next_id;
                q.next_id += 1;
                match gen.start(id, &request) {
                    Ok(None) => {
                        q.flying.insert(id, (i, step));
                    }
                    Ok(Some(reply)) => {
                        q.computed(&ledger.ids, i, step, reply_outcome(reply));
                        answered = true;
                    }
                    Err(e) if models.is_request_error(&e) => {
                        q.computed(&ledger.ids, i, step, SampleOutcome::Error(error_chain(&e)));
                        answered = true;
                    }
                    Err(e) => return Err(engine_failed(e)),
                }
            }
            if answered || q.flying.is_empty() {
                continue;
            }

            let finished = gen.poll().map_err(engine_failed)?;
            if finished.is_empty() {
                return Err(StoreError::EngineContract {
                    actor: ActorName(actor),
                    message: format!("no reply while {} requests are in flight", q.flying.len()),
                });
            }
            for (id, reply) in finished {
                let Some((i, step)) = q.flying.remove(&id) else {
                    return Err(StoreError::EngineContract {
                        actor: ActorName(actor),
                        message: format!("a reply to request {id}, which is not in flight"),
                    });
                };
                q.computed(&ledger.ids, i, step, reply_outcome(reply));
            }
        }
        if let Some((_, g)) = &loaded {
            prefill.add(g.prefill_stats());
        }
        if !order.finished || !q.held.is_empty() {
            return Err(StoreError::Internal(format!(
                "the queue ran dry with {} finished steps not logged",
                q.held.len()
            )));
        }
        Ok((q.computed, q.recovered_n))
    }

    /// Logs what can be logged in the round order: while the next step of the round under way
    /// is in the log being replayed or among the `held` finished steps, it is recorded (and,
    /// if not replayed, appended); a finished round gives way to the next (the lowest actor's
    /// pending steps over all items). The new lines are appended with one write and fsync.
    fn log_in_order(
        &self,
        order: &mut LogOrder,
        ledger: &mut Ledger,
        progress: &mut dyn Progress,
        replay: &mut Replay,
        held: &mut Held,
        writer: &mut SampleWriter,
    ) -> Result<(), StoreError> {
        let mut lines = Vec::new();
        while !order.finished {
            if order.next == order.round.len() {
                let pending = self.pending_steps(ledger, progress)?;
                let Some(actor) = pending.iter().map(|(_, s)| s.actor).min() else {
                    order.finished = true;
                    break;
                };
                order.round = pending
                    .into_iter()
                    .filter(|(_, s)| s.actor == actor)
                    .collect();
                order.next = 0;
                order.rounds += 1;
                progress.round(
                    &format!("round {} · {}", order.rounds, ActorName(actor)),
                    order.round.len(),
                );
                continue;
            }
            let (i, step) = &order.round[order.next];
            let i = *i;
            let outcome = if replay.has_next() {
                let o = replay.take(&ledger.ids[i], step)?;
                progress.advance(1, true);
                o
            } else if let Some((ran, o)) = held.remove(&(i, step.key.clone())) {
                if ran != *step {
                    return Err(StoreError::Plan {
                        item: ledger.ids[i].clone(),
                        message: format!(
                            "step {:?} changed between running it and logging it (the plan \
                             must be a pure function of the item and its finished steps)",
                            step.key
                        ),
                    });
                }
                lines.push(Sample::new(&ledger.ids[i], step, o.clone()));
                o
            } else {
                break;
            };
            ledger.record(i, step, outcome);
            order.next += 1;
        }
        writer.append(&lines)?;
        if !lines.is_empty() {
            progress.advance(lines.len(), false);
        }
        progress.in_flight(held.len());
        Ok(())
    }

    /// Every unfinished item's next steps, in (item order, step key) order, checked. Items
    /// that finished or failed since the last call correct the progress total by the steps
    /// they took beyond (or short of) their plan.
    fn pending_steps(
        &self,
        ledger: &mut Ledger,
        progress: &mut dyn Progress,
    ) -> Result<Vec<(usize, Step)>, StoreError> {
        let mut out = Vec::new();
        for i in 0..self.items.len() {
            let close = |ledger: &mut Ledger, progress: &mut dyn Progress, took: usize| {
                if let (false, Some(p)) = (ledger.closed[i], ledger.planned[i]) {
                    progress.replan(took as i64 - p as i64);
                }
                ledger.closed[i] = true;
            };
            if ledger.stopped[i] {
                let took = ledger.transcripts[i].len() + 1;
                close(ledger, progress, took);
                continue;
            }
            let steps = self.checked_steps(i, &ledger.ids[i], &ledger.transcripts[i])?;
            if steps.is_empty() {
                let took = ledger.transcripts[i].len();
                close(ledger, progress, took);
            }
            out.extend(steps.into_iter().map(|s| (i, s)));
        }
        Ok(out)
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

/// Whether the model loaded for `loaded` answers `actor`'s steps.
fn shares<M: Models>(models: &M, loaded: Actor, actor: Actor) -> bool {
    loaded == actor || models.same_model(loaded, actor)
}

/// Where the log stands in the round order.
#[derive(Default)]
struct LogOrder {
    /// The round being logged: one actor's pending steps, in (item order, step key) order.
    round: Vec<(usize, Step)>,
    /// How many of them are logged.
    next: usize,
    /// Rounds begun.
    rounds: usize,
    /// No item has a step left.
    finished: bool,
}

/// Finished steps waiting for their place in the log, by (item, step key), with the step
/// they answer.
type Held = HashMap<(usize, String), (Step, SampleOutcome)>;

/// An item's progress ahead of the log.
struct Ahead {
    /// Its finished steps, logged or not.
    transcript: Transcript,
    /// A step failed: it asks for nothing more.
    stopped: bool,
    /// Steps of its latest group (those of one actor) not finished yet.
    outstanding: usize,
    /// The plan has no step left for it.
    done: bool,
}

/// The queue's state.
#[derive(Default)]
struct Queue {
    ahead: Vec<Ahead>,
    /// Items whose steps all finished, to ask for their next ones.
    idle: Vec<usize>,
    /// Steps asked for and not started, by actor (only actors with some), then by (finished
    /// steps of the item, item, key): items behind the others go first, then item order.
    ready: BTreeMap<Actor, BTreeMap<(usize, usize, String), Step>>,
    /// Steps started on the loaded model, by request id.
    flying: HashMap<u64, (usize, Step)>,
    next_id: u64,
    held: Held,
    /// Finished steps of a previous attempt that were not logged.
    recovered: Recovered,
    /// Computed steps not yet written to `pending.jsonl`.
    spilled: Vec<Sample>,
    /// Tokens generated and not yet reported.
    tokens: usize,
    computed: usize,
    recovered_n: usize,
}

impl Queue {
    /// Step `step` of item `i` is asked for: taken from a previous attempt's finished steps
    /// when it is there, else ready to run.
    fn queue(&mut self, ids: &[String], i: usize, step: Step) {
        if let Some(outcome) = self.recovered.take(&ids[i], &step) {
            self.recovered_n += 1;
            self.finish(i, step, outcome);
        } else {
            let k = (self.ahead[i].transcript.len(), i, step.key.clone());
            self.ready.entry(step.actor).or_default().insert(k, step);
        }
    }

    /// Takes the earliest ready step of the actors `fits` accepts: its item and the step.
    fn take_ready(&mut self, fits: impl Fn(Actor) -> bool) -> Option<(usize, Step)> {
        let (actor, key) = self
            .ready
            .iter()
            .filter(|(a, _)| fits(**a))
            .filter_map(|(a, r)| r.keys().next().map(|k| (*a, k.clone())))
            .min_by(|x, y| x.1.cmp(&y.1))?;
        let of_actor = self.ready.get_mut(&actor)?;
        let step = of_actor.remove(&key)?;
        if of_actor.is_empty() {
            self.ready.remove(&actor);
        }
        Some((key.1, step))
    }

    /// Step `step` of item `i` was computed.
    fn computed(&mut self, ids: &[String], i: usize, step: Step, outcome: SampleOutcome) {
        if let SampleOutcome::Output(o) = &outcome {
            self.tokens += o.output_tokens;
        }
        self.computed += 1;
        self.spilled
            .push(Sample::new(&ids[i], &step, outcome.clone()));
        self.finish(i, step, outcome);
    }

    fn finish(&mut self, i: usize, step: Step, outcome: SampleOutcome) {
        let a = &mut self.ahead[i];
        match &outcome {
            SampleOutcome::Output(o) => {
                a.transcript.insert(step.key.clone(), o.clone());
            }
            SampleOutcome::Error(_) => a.stopped = true,
        }
        a.outstanding = a.outstanding.saturating_sub(1);
        if a.outstanding == 0 {
            self.idle.push(i);
        }
        self.held.insert((i, step.key.clone()), (step, outcome));
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
            warnings.push(format!(
                "the run was started at commit {:?}, this is {:?}",
                a.git_commit, b.git_commit
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::report::NoProgress;
    use crate::store::manifest::{Environment, ModelIdentity, RunIdentity};
    use crate::store::testkit::{toy_items, toy_score, FakeModels, ToyItem, ToyPlan};

    fn manifest(seed: u64) -> Manifest {
        Manifest::new(
            RunIdentity {
                candor_version: "test".into(),
                protocol: "toy".into(),
                settings: serde_json::json!({"candidates": 1}),
                seed,
                models: vec![ModelIdentity {
                    role: "candidate/0".into(),
                    name: "fake:cand".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            // Not compared, and detecting it runs git: leave it empty here.
            Environment::default(),
        )
    }

    fn run_toy(
        dir: &Path,
        items: &[ToyItem],
        plan: &ToyPlan,
        models: &mut FakeModels,
        batch_size: usize,
    ) -> Result<RunOutcome, StoreError> {
        Run {
            dir,
            manifest: manifest(plan.seed),
            plan,
            items,
            batch_size,
        }
        .execute(models, &mut NoProgress, |done| toy_score(plan, done, 7))
    }

    struct Files {
        samples: Vec<u8>,
        results: Vec<u8>,
        report: Vec<u8>,
    }

    fn files(dir: &Path) -> Files {
        let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
        Files {
            samples: read("samples.jsonl"),
            results: read("results.json"),
            report: read("report.md"),
        }
    }

    fn plan(candidates: usize) -> ToyPlan {
        ToyPlan {
            candidates,
            seed: 11,
        }
    }

    #[test]
    fn same_run_twice_and_any_batch_size_writes_identical_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(9);
        let plan = plan(2);
        let mut outs = Vec::new();
        for (k, batch) in [1, 4, 4, 64].into_iter().enumerate() {
            let dir = tmp.path().join(format!("run{k}"));
            let mut models = FakeModels::new(&["a", "b"], "judge");
            let out = run_toy(&dir, &items, &plan, &mut models, batch).unwrap();
            assert!(!out.resumed);
            assert_eq!(out.replayed, 0);
            assert!(models.stats.max_batch.load(Ordering::SeqCst) <= batch);
            outs.push(files(&dir));
        }
        for f in &outs[1..] {
            assert_eq!(f.samples, outs[0].samples);
            assert_eq!(f.results, outs[0].results);
            assert_eq!(f.report, outs[0].report);
        }
        // 9 items: item 5 refuses its first step and stops; the others take 6 steps each.
        let lines = outs[0].samples.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(lines, 8 * 6 + 1);
    }

    #[test]
    fn log_order_is_actor_rounds_then_items_then_keys() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(3);
        let mut models = FakeModels::new(&["a", "b"], "j");
        run_toy(tmp.path(), &items, &plan(2), &mut models, 2).unwrap();
        let text = std::fs::read_to_string(tmp.path().join("samples.jsonl")).unwrap();
        let order: Vec<(String, String)> = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["item"].as_str().unwrap().into(),
                    v["key"].as_str().unwrap().into(),
                )
            })
            .collect();
        let mut want = Vec::new();
        for key in ["c0/turn/1", "c0/turn/2", "c1/turn/1", "c1/turn/2"] {
            for i in 0..3 {
                want.push((format!("toy-{i:03}"), key.to_string()));
            }
        }
        for i in 0..3 {
            for key in ["judge/c0", "judge/c1"] {
                want.push((format!("toy-{i:03}"), key.to_string()));
            }
        }
        assert_eq!(order, want);
        // Candidate 0, candidate 1, judge: three loads, never two models at once.
        let loads = models.stats.loads.lock().unwrap().clone();
        assert_eq!(
            loads,
            [Actor::Candidate(0), Actor::Candidate(1), Actor::Judge]
        );
        assert_eq!(models.stats.max_alive.load(Ordering::SeqCst), 1);
        assert_eq!(models.stats.alive.load(Ordering::SeqCst), 0);
    }

    /// The log the round loop writes, computed here step by step without the runner: each
    /// round is the lowest actor's pending steps in (item, key) order, answered one by one
    /// with the fake model's own rules.
    fn round_loop_log(items: &[ToyItem], plan: &ToyPlan, models: &FakeModels) -> Vec<u8> {
        use crate::store::testkit::{fake_reply, FAIL_MARKER};
        let mut done = vec![Transcript::new(); items.len()];
        let mut stopped = vec![false; items.len()];
        let mut log = Vec::new();
        loop {
            let pending: Vec<(usize, Step)> = (0..items.len())
                .filter(|&i| !stopped[i])
                .flat_map(|i| {
                    let mut steps = plan.next_steps(&items[i], &done[i]);
                    steps.sort_by(|a, b| a.key.cmp(&b.key));
                    steps.into_iter().map(move |s| (i, s))
                })
                .collect();
            let Some(actor) = pending.iter().map(|(_, s)| s.actor).min() else {
                return log;
            };
            for (i, step) in pending.into_iter().filter(|(_, s)| s.actor == actor) {
                let label = match actor {
                    Actor::Candidate(c) => models.candidates[c].clone(),
                    Actor::Judge => models.judge.clone(),
                };
                let request = ChatRequest {
                    messages: step.messages.clone(),
                    params: step.params.clone(),
                };
                let refused = step
                    .messages
                    .iter()
                    .any(|m| m.content.contains(FAIL_MARKER));
                let outcome = match models.preflight_reason(&request) {
                    Some(reason) => SampleOutcome::Error(reason),
                    None if refused => SampleOutcome::Error(error_chain(
                        &crate::store::testkit::FakeError::Refused,
                    )),
                    None => reply_outcome(fake_reply(&label, &request)),
                };
                match &outcome {
                    SampleOutcome::Output(o) => {
                        done[i].insert(step.key.clone(), o.clone());
                    }
                    SampleOutcome::Error(_) => stopped[i] = true,
                }
                log.extend(Sample::new(&items[i].id, &step, outcome).to_line());
            }
        }
    }

    #[test]
    fn the_queue_logs_exactly_what_the_round_loop_logged() {
        let tmp = tempfile::tempdir().unwrap();
        // 24 items: refused, template and overflow failures among them.
        let items = toy_items(24);
        for (k, (cands, judge, batch)) in [
            (&["a", "b"][..], "j", 1),
            (&["a", "b"][..], "j", 5),
            (&["a", "a"][..], "a", 7),
            (&["a"][..], "j", 64),
        ]
        .into_iter()
        .enumerate()
        {
            let plan = plan(cands.len());
            let mut models = FakeModels::new(cands, judge);
            let want = round_loop_log(&items, &plan, &models);
            let dir = tmp.path().join(format!("run{k}"));
            run_toy(&dir, &items, &plan, &mut models, batch).unwrap();
            let got = std::fs::read(dir.join("samples.jsonl")).unwrap();
            assert!(
                got == want,
                "case {k}: the log differs from the round loop's"
            );
            assert!(!dir.join("pending.jsonl").exists());
        }
    }

    /// Turn 2 of an item starts as soon as its turn 1 is answered, not when the slowest
    /// turn 1 of the round is; the judge (same model) starts before the last candidate turn
    /// is answered; and the batch is kept full.
    #[test]
    fn later_steps_start_before_the_slowest_step_of_the_round_finishes() {
        use crate::store::testkit::FakeEvent;
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(9);
        let mut models = FakeModels::new(&["m"], "m");
        run_toy(tmp.path(), &items, &plan(1), &mut models, 4).unwrap();
        let events = models.stats.events.lock().unwrap().clone();
        let turn2 = |t: &str| t.starts_with("Are you sure");
        let judge = |t: &str| t.starts_with("Question:");
        let first_turn2_start = events
            .iter()
            .position(|e| matches!(e, FakeEvent::Start { text, .. } if turn2(text)))
            .unwrap();
        let last_turn1_finish = events
            .iter()
            .rposition(
                |e| matches!(e, FakeEvent::Finish { text, .. } if !turn2(text) && !judge(text)),
            )
            .unwrap();
        assert!(
            first_turn2_start < last_turn1_finish,
            "turn 2 waited for every turn 1: {events:?}"
        );
        let first_judge_start = events
            .iter()
            .position(|e| matches!(e, FakeEvent::Start { text, .. } if judge(text)))
            .unwrap();
        let last_turn2_finish = events
            .iter()
            .rposition(|e| matches!(e, FakeEvent::Finish { text, .. } if turn2(text)))
            .unwrap();
        assert!(first_judge_start < last_turn2_finish, "{events:?}");
        assert_eq!(models.stats.max_batch.load(Ordering::SeqCst), 4);
        assert_eq!(models.stats.loads.lock().unwrap().len(), 1);
        // And the bytes are those of a run one step at a time.
        let one = tmp.path().join("one");
        run_toy(&one, &items, &plan(1), &mut FakeModels::new(&["m"], "m"), 1).unwrap();
        assert_eq!(
            std::fs::read(one.join("samples.jsonl")).unwrap(),
            std::fs::read(tmp.path().join("samples.jsonl")).unwrap()
        );
    }

    /// Steps that finished but were not logged when the engine failed are kept in
    /// `pending.jsonl` and taken from there on resume, not generated again.
    #[test]
    fn finished_unlogged_steps_survive_a_failure_and_are_not_recomputed() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(10);
        let full_dir = tmp.path().join("full");
        run_toy(
            &full_dir,
            &items,
            &plan(2),
            &mut FakeModels::new(&["a", "b"], "j"),
            6,
        )
        .unwrap();
        let full = files(&full_dir);
        let total = full.samples.iter().filter(|&&b| b == b'\n').count();
        let mut recovered_any = false;
        for break_after in [1, 2, 3, 5, 8, 13] {
            let dir = tmp.path().join(format!("broken{break_after}"));
            let mut broken = FakeModels::new(&["a", "b"], "j");
            broken.break_after = Some(break_after);
            run_toy(&dir, &items, &plan(2), &mut broken, 6).unwrap_err();
            let logged = std::fs::read(dir.join("samples.jsonl")).unwrap();
            let logged = logged.iter().filter(|&&b| b == b'\n').count();
            let mut again = FakeModels::new(&["a", "b"], "j");
            let out = run_toy(&dir, &items, &plan(2), &mut again, 3).unwrap();
            assert_eq!(out.replayed, logged);
            assert_eq!(out.replayed + out.recovered + out.computed, total);
            recovered_any |= out.recovered > 0;
            // Only the computed steps reached the model (refused ones never do).
            let asked = again.stats.requests.load(Ordering::SeqCst);
            assert!(asked <= out.computed, "{asked} > {}", out.computed);
            let got = files(&dir);
            assert!(got.samples == full.samples && got.results == full.results);
            assert!(!dir.join("pending.jsonl").exists());
        }
        assert!(recovered_any, "no failure left finished steps unlogged");
    }

    #[test]
    fn same_model_for_two_actors_is_loaded_once() {
        let tmp = tempfile::tempdir().unwrap();
        let mut models = FakeModels::new(&["m"], "m");
        run_toy(tmp.path(), &toy_items(2), &plan(1), &mut models, 8).unwrap();
        assert_eq!(models.stats.loads.lock().unwrap().len(), 1);
    }

    /// A scratch directory on tmpfs when there is one: the every-byte resume test makes
    /// thousands of fsyncs, which are free there and slow on a disk.
    fn fast_tempdir() -> (tempfile::TempDir, bool) {
        let shm = Path::new("/dev/shm");
        match tempfile::tempdir_in(shm) {
            Ok(d) if shm.is_dir() => (d, true),
            _ => (tempfile::tempdir().unwrap(), false),
        }
    }

    /// Truncates a finished run's log at every byte and resumes: always the same bytes, and
    /// only the steps missing from the log are computed. (Without tmpfs, to bound the time:
    /// every byte of the first, second and last lines, and every 13th byte elsewhere.)
    #[test]
    fn resume_after_truncation_at_every_byte_is_byte_identical() {
        let (tmp, fast) = fast_tempdir();
        let items = toy_items(6);
        let plan = plan(1);
        let full_dir = tmp.path().join("full");
        let mut models = FakeModels::new(&["a"], "j");
        run_toy(&full_dir, &items, &plan, &mut models, 3).unwrap();
        let full = files(&full_dir);
        let total_lines = full.samples.iter().filter(|&&b| b == b'\n').count();
        let dir = tmp.path().join("cut");
        let newlines: Vec<usize> = (0..full.samples.len())
            .filter(|&i| full.samples[i] == b'\n')
            .collect();
        let (second_end, last_start) = (newlines[1], newlines[newlines.len() - 2]);
        let cuts = (0..=full.samples.len())
            .filter(|&c| fast || c <= second_end + 1 || c > last_start || c % 13 == 0);
        let mut tried = 0;
        for cut in cuts {
            tried += 1;
            if dir.exists() {
                std::fs::remove_dir_all(&dir).unwrap();
            }
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(full_dir.join("manifest.json"), dir.join("manifest.json")).unwrap();
            std::fs::write(dir.join("samples.jsonl"), &full.samples[..cut]).unwrap();
            let kept = full.samples[..cut].iter().filter(|&&b| b == b'\n').count();
            let mut models = FakeModels::new(&["a"], "j");
            let out = run_toy(&dir, &items, &plan, &mut models, 1 + cut % 4).unwrap();
            assert!(out.resumed);
            assert_eq!(
                (out.replayed, out.computed),
                (kept, total_lines - kept),
                "cut {cut}"
            );
            let got = files(&dir);
            assert!(
                got.samples == full.samples,
                "samples differ after cut at {cut}"
            );
            assert!(
                got.results == full.results,
                "results differ after cut at {cut}"
            );
            assert!(
                got.report == full.report,
                "report differs after cut at {cut}"
            );
        }
        eprintln!(
            "resumed from {tried} cuts of a {}-byte log",
            full.samples.len()
        );
    }

    #[test]
    fn finished_run_rerun_computes_nothing_and_loads_no_model() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(4);
        let mut models = FakeModels::new(&["a"], "j");
        run_toy(tmp.path(), &items, &plan(1), &mut models, 2).unwrap();
        let before = files(tmp.path());
        let mut again = FakeModels::new(&["a"], "j");
        let out = run_toy(tmp.path(), &items, &plan(1), &mut again, 2).unwrap();
        assert_eq!(out.computed, 0);
        assert!(again.stats.loads.lock().unwrap().is_empty());
        let after = files(tmp.path());
        assert_eq!(before.samples, after.samples);
        assert_eq!(before.results, after.results);
        let attempts = std::fs::read_to_string(tmp.path().join("attempts.jsonl")).unwrap();
        let attempts: Vec<serde_json::Value> = attempts
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0]["resumed"], false);
        assert_eq!(attempts[1]["resumed"], true);
        assert_eq!(attempts[1]["logged_samples"], 12);
    }

    #[test]
    fn manifest_mismatch_is_refused_naming_the_fields() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(3);
        let mut models = FakeModels::new(&["a"], "j");
        run_toy(tmp.path(), &items, &plan(1), &mut models, 2).unwrap();
        let before = std::fs::read(tmp.path().join("samples.jsonl")).unwrap();
        let other_seed = ToyPlan {
            candidates: 1,
            seed: 12,
        };
        let err = run_toy(tmp.path(), &items, &other_seed, &mut models, 2).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::ManifestMismatch { .. }), "{msg}");
        assert!(msg.contains("seed (on disk 11, now 12)"), "{msg}");
        let err = run_toy(tmp.path(), &toy_items(4), &plan(1), &mut models, 2).unwrap_err();
        assert!(
            err.to_string().contains("items.count (on disk 3, now 4)"),
            "{err}"
        );
        // Nothing was touched.
        assert_eq!(
            std::fs::read(tmp.path().join("samples.jsonl")).unwrap(),
            before
        );
        assert!(tmp.path().join("results.json").exists());
    }

    #[test]
    fn refused_requests_are_logged_and_their_items_left_out_of_scoring() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(7);
        let mut models = FakeModels::new(&["a"], "j");
        let out = run_toy(tmp.path(), &items, &plan(1), &mut models, 4).unwrap();
        assert_eq!(out.results.items, 7);
        assert_eq!(out.results.completed, 6);
        assert_eq!(out.results.failed.len(), 1);
        let f = &out.results.failed[0];
        assert_eq!((f.item.as_str(), f.key.as_str()), ("toy-005", "c0/turn/1"));
        assert!(f.error.contains("refuses"), "{}", f.error);
        let text = std::fs::read_to_string(tmp.path().join("samples.jsonl")).unwrap();
        let errors: Vec<&str> = text.lines().filter(|l| l.contains("\"error\"")).collect();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("\"item\":\"toy-005\""));
        let scored: usize = out
            .results
            .results
            .metrics
            .iter()
            .map(|m| m.n + m.unscored)
            .sum();
        assert_eq!(scored, 6);
    }

    #[test]
    fn template_tokenizer_and_context_failures_are_failed_steps_and_the_run_goes_on() {
        use crate::store::testkit::{OVERFLOW_MARKER, TEMPLATE_MARKER, TOKENIZER_MARKER};
        let tmp = tempfile::tempdir().unwrap();
        let mut items = toy_items(5);
        items[1].question.push_str(TEMPLATE_MARKER);
        items[2].question.push_str(TOKENIZER_MARKER);
        items[3].question.push_str(OVERFLOW_MARKER);
        let plan = plan(1);
        let mut models = FakeModels::new(&["a"], "j");
        let out = run_toy(tmp.path(), &items, &plan, &mut models, 4).unwrap();
        let r = &out.results;
        assert_eq!((r.items, r.completed, r.failed.len()), (5, 2, 3));
        let failed: Vec<(&str, &str, Option<usize>)> = r
            .failed
            .iter()
            .map(|f| (f.item.as_str(), f.key.as_str(), f.skipped))
            .collect();
        // Each failed on its first step; the second turn and the judgement were skipped.
        assert_eq!(
            failed,
            [
                ("toy-001", "c0/turn/1", Some(2)),
                ("toy-002", "c0/turn/1", Some(2)),
                ("toy-003", "c0/turn/1", Some(2)),
            ]
        );
        assert_eq!(r.skipped_steps, 6);
        assert!(
            r.failed[0].error.contains("chat template raised"),
            "{:?}",
            r.failed[0]
        );
        assert!(
            r.failed[1].error.starts_with("tokenizer:"),
            "{:?}",
            r.failed[1]
        );
        assert_eq!(
            r.failed[2].error,
            "the prompt (9000 tokens) fills the model's context: nothing could be generated"
        );
        // The reasons are in the samples, and the failed items asked for nothing more.
        let text = std::fs::read_to_string(tmp.path().join("samples.jsonl")).unwrap();
        let errors: Vec<&str> = text.lines().filter(|l| l.contains("\"error\"")).collect();
        assert_eq!(errors.len(), 3);
        assert!(
            errors[2].contains("fills the model's context"),
            "{}",
            errors[2]
        );
        assert_eq!(text.lines().count(), 2 * 3 + 3);
        // Counts beside every metric, in both files.
        let json = std::fs::read_to_string(tmp.path().join("results.json")).unwrap();
        assert!(
            json.contains("\"unscored\": 0,\n      \"failed\": 3"),
            "{json}"
        );
        let md = std::fs::read_to_string(tmp.path().join("report.md")).unwrap();
        assert!(md.contains("| n | unscored | failed |"), "{md}");
        assert!(md.contains("5 items, 2 completed, 3 failed (their 6 later steps skipped)"));
        let m = &r.results.metrics[0];
        assert_eq!(m.n + m.unscored, 2);
    }

    #[test]
    fn engine_failure_stops_the_run_and_resume_finishes_it_identically() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(8);
        let full_dir = tmp.path().join("full");
        run_toy(
            &full_dir,
            &items,
            &plan(1),
            &mut FakeModels::new(&["a"], "j"),
            2,
        )
        .unwrap();
        let full = files(&full_dir);
        for break_after in [0, 1, 3, 6, 9] {
            let dir = tmp.path().join(format!("broken{break_after}"));
            let mut broken = FakeModels::new(&["a"], "j");
            broken.break_after = Some(break_after);
            let err = run_toy(&dir, &items, &plan(1), &mut broken, 2).unwrap_err();
            assert!(matches!(err, StoreError::Engine { .. }), "{err}");
            assert!(
                error_chain(&err).contains("broke down"),
                "{}",
                error_chain(&err)
            );
            assert!(!dir.join("results.json").exists());
            let partial = std::fs::read(dir.join("samples.jsonl")).unwrap();
            assert!(full.samples.starts_with(&partial));
            run_toy(&dir, &items, &plan(1), &mut FakeModels::new(&["a"], "j"), 3).unwrap();
            let got = files(&dir);
            assert!(got.samples == full.samples && got.results == full.results);
        }
    }

    #[test]
    fn a_log_from_another_run_is_reported_with_its_line() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(3);
        let mut models = FakeModels::new(&["a"], "j");
        run_toy(tmp.path(), &items, &plan(1), &mut models, 2).unwrap();
        let p = tmp.path().join("samples.jsonl");
        let text = std::fs::read_to_string(&p).unwrap();
        let edited: String = text
            .lines()
            .enumerate()
            .map(|(i, l)| {
                let l = if i == 1 {
                    l.replace("What is", "Who is")
                } else {
                    l.to_string()
                };
                l + "\n"
            })
            .collect();
        std::fs::write(&p, edited).unwrap();
        let err = run_toy(tmp.path(), &items, &plan(1), &mut models, 2).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("samples.jsonl:2:"), "{msg}");
        assert!(msg.contains("other messages"), "{msg}");
    }

    #[test]
    fn samples_without_manifest_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("samples.jsonl"), b"{}\n").unwrap();
        let mut models = FakeModels::new(&["a"], "j");
        let err = run_toy(tmp.path(), &toy_items(1), &plan(1), &mut models, 1).unwrap_err();
        assert!(matches!(err, StoreError::NotARunDir { .. }), "{err}");
    }

    struct BadPlan;
    impl Plan for BadPlan {
        type Item = ToyItem;
        fn item_id(&self, item: &ToyItem) -> String {
            item.id.clone()
        }
        fn next_steps(&self, item: &ToyItem, _done: &Transcript) -> Vec<Step> {
            // Never notices that its step finished.
            ToyPlan {
                candidates: 1,
                seed: 0,
            }
            .next_steps(item, &Transcript::new())
        }
    }

    struct NanPlan;
    impl Plan for NanPlan {
        type Item = ToyItem;
        fn item_id(&self, item: &ToyItem) -> String {
            item.id.clone()
        }
        fn next_steps(&self, item: &ToyItem, done: &Transcript) -> Vec<Step> {
            let mut steps = plan(1).next_steps(item, done);
            for s in &mut steps {
                s.params.temperature = f32::NAN;
            }
            steps
        }
    }

    #[test]
    fn plan_bugs_and_duplicate_items_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let items = toy_items(2);
        let run = |dir: PathBuf, items: &[ToyItem]| {
            Run {
                dir: &dir,
                manifest: manifest(0),
                plan: &BadPlan,
                items,
                batch_size: 2,
            }
            .execute(&mut FakeModels::new(&["a"], "j"), &mut NoProgress, |_| {
                BenchResults::default()
            })
        };
        let err = run(tmp.path().join("a"), &items).unwrap_err();
        assert!(err.to_string().contains("already finished"), "{err}");
        let nan = Run {
            dir: &tmp.path().join("c"),
            manifest: manifest(0),
            plan: &NanPlan,
            items: &items,
            batch_size: 2,
        }
        .execute(&mut FakeModels::new(&["a"], "j"), &mut NoProgress, |_| {
            BenchResults::default()
        });
        let err = nan.unwrap_err().to_string();
        assert!(err.contains("non-finite temperature"), "{err}");
        let dup = vec![items[0].clone(), items[0].clone()];
        let err = run(tmp.path().join("b"), &dup).unwrap_err();
        assert!(matches!(err, StoreError::DuplicateItem { .. }), "{err}");
    }
}
