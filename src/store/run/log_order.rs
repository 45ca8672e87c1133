//! The order of `samples.jsonl`: rounds of one actor's pending steps in (item order, step key)
//! order, and the reorder buffer that holds finished steps until that order reaches them (see
//! the parent module's docs).

use std::collections::HashMap;

use super::{Ledger, Run};
use crate::bench::plan::{Plan, Step};
use crate::store::progress::Progress;
use crate::store::resume::Replay;
use crate::store::samples::{Sample, SampleOutcome, SampleWriter};
use crate::store::{ActorName, StoreError};

impl<P: Plan> Run<'_, P> {
    /// Logs what can be logged in the round order: while the next step of the round under way
    /// is in the log being replayed or among the `held` finished steps, it is recorded (and,
    /// if not replayed, appended); a finished round gives way to the next (the lowest actor's
    /// pending steps over all items). The new lines are appended with one write and fsync.
    pub(super) fn log_in_order(
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
}

/// Where the log stands in the round order.
#[derive(Default)]
pub(super) struct LogOrder {
    /// The round being logged: one actor's pending steps, in (item order, step key) order.
    pub(super) round: Vec<(usize, Step)>,
    /// How many of them are logged.
    pub(super) next: usize,
    /// Rounds begun.
    pub(super) rounds: usize,
    /// No item has a step left.
    pub(super) finished: bool,
}

/// Finished steps waiting for their place in the log, by (item, step key), with the step
/// they answer.
pub(super) type Held = HashMap<(usize, String), (Step, SampleOutcome)>;
