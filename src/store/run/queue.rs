//! The scheduling loop and its ready queue: every item's next group of steps is queued as soon
//! as its previous group finished, and the loaded model takes the earliest ready steps
//! whenever it has a free slot (see the parent module's docs).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use super::log_order::{Held, LogOrder};
use super::{reply_outcome, Ledger, Run};
use crate::bench::plan::{Actor, Plan, Step, Transcript};
use crate::engine::{ChatRequest, Generate, PrefillStats};
use crate::store::model_pool::Models;
use crate::store::pending::{PendingWriter, Recovered};
use crate::store::progress::Progress;
use crate::store::resume::Replay;
use crate::store::samples::{Sample, SampleOutcome, SampleWriter};
use crate::store::{error_chain, ActorName, StoreError};

impl<P: Plan> Run<'_, P> {
    /// The scheduling loop (see the module docs): replays the log while it lasts, then runs
    /// the queue until no item has a step left. Returns the steps computed and recovered.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn schedule<M: Models>(
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
                let mut request = ChatRequest::new(step.messages.clone(), step.params.clone());
                if let Some(chat) = &self.manifest.identity.chat {
                    chat.apply(step.actor, &mut request);
                }
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
}

/// Whether the model loaded for `loaded` answers `actor`'s steps.
fn shares<M: Models>(models: &M, loaded: Actor, actor: Actor) -> bool {
    loaded == actor || models.same_model(loaded, actor)
}

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
pub(super) struct Queue {
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
