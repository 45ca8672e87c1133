//! Plans are data: a protocol turns one item, plus the steps already finished for it, into
//! the generation steps that can run next.
//!
//! The runner (in `cli`/`store`) owns scheduling: it asks every item for its next steps,
//! runs all pending steps of one [`Actor`] together in large batches (one model loaded at a
//! time), appends each finished step to the run's samples, and asks again until no item has
//! a step left. Because a step's output depends only on its own prompt and seed, the order in
//! which steps are scheduled never changes a result. A protocol knows nothing of batches,
//! models or files.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::engine::{Reasoning, SamplingParams, StopReason};
use crate::judge::Verdict;
use crate::stats::rng::SplitMix64;
use crate::text::message::Message;

/// Which loaded model answers a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Actor {
    /// A model under evaluation: index into the run's `--model` list (usually only 0; several
    /// for ReaLMistake's majority vote over detectors).
    Candidate(usize),
    /// The model that grades (FB-Bench checklist, RefuteBench FA, Fennec); with a panel of
    /// judges, judge 0.
    Judge,
    /// Judge `j ≥ 1` of a panel (`--judge` given several times; see [`crate::bench::panel`]).
    Panel(usize),
}

/// One generation a protocol asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Unique within its item, stable across runs (e.g. `"turn/2"`, `"judge"`,
    /// `"criteria/3"`).
    pub key: String,
    pub actor: Actor,
    pub messages: Vec<Message>,
    pub params: SamplingParams,
}

/// What a finished step produced, as recorded in the run's samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepOutput {
    pub text: String,
    pub stop_reason: StopReason,
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Set when the conversation had to be shortened to fit the context (what was dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<String>,
    /// A thinking model's reasoning, kept apart from `text` (the answer): never parsed for a
    /// verdict, never scored, never sent back in a later turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
}

impl StepOutput {
    /// A reply that ended on EOS, with no token counts: how scripted transcripts are written.
    pub fn scripted(text: impl Into<String>) -> Self {
        StepOutput {
            text: text.into(),
            stop_reason: StopReason::Eos,
            prompt_tokens: 0,
            output_tokens: 0,
            truncated: None,
            reasoning: None,
        }
    }

    /// Whether the reply ended inside its reasoning, so that it has no answer: such a reply
    /// is unscored with [`REASONING_TRUNCATED`], never graded.
    pub fn reasoning_truncated(&self) -> bool {
        self.reasoning.as_ref().is_some_and(|r| r.truncated)
    }

    /// A judge's verdict read from this reply: `parse` sees the answer only (never the
    /// reasoning), and a reply cut inside its reasoning is unscored ([`REASONING_TRUNCATED`]).
    pub fn verdict<T>(&self, parse: impl FnOnce(&str) -> Verdict<T>) -> Verdict<T> {
        if self.reasoning_truncated() {
            return Verdict::unscored(REASONING_TRUNCATED);
        }
        parse(&self.text)
    }
}

/// The reason a reply cut inside its reasoning is unscored.
pub const REASONING_TRUNCATED: &str = "reasoning truncated";

/// The finished steps of one item, by key.
pub type Transcript = BTreeMap<String, StepOutput>;

/// A protocol's per-item logic. Implementations are pure functions of the item and its
/// finished steps, so a resumed run asks exactly the same questions as an uninterrupted one.
pub trait Plan {
    type Item;

    /// Stable, unique id of an item (the samples' key together with the step key).
    fn item_id(&self, item: &Self::Item) -> String;

    /// The steps that can run now for `item`, given its finished steps. Never returns a step
    /// whose key is already in `done`; returns nothing once the item is complete.
    fn next_steps(&self, item: &Self::Item, done: &Transcript) -> Vec<Step>;

    /// How many steps `item` is expected to take (exact, or an upper estimate where the plan
    /// depends on replies); `None` when unknown. Only progress and the count of steps a
    /// failed item skipped use it.
    fn planned_steps(&self, _item: &Self::Item) -> Option<usize> {
        None
    }
}

/// A stable 64-bit seed for one step: FNV-1a of the item id and step key, mixed with the run
/// seed by SplitMix64. Every protocol derives its sampling seeds this way, so a step's seed
/// depends only on the run seed, its item and its key — never on scheduling.
pub fn step_seed(run_seed: u64, item_id: &str, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in item_id.bytes().chain([0u8]).chain(key.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    SplitMix64::new(h ^ run_seed).next_u64()
}
