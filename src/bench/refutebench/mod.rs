//! RefuteBench (Yan, Luo and Zhang, 2024): does a model accept a user's refuting feedback and
//! keep applying it later in the conversation? Reference data and code:
//! <https://github.com/ElliottYan/RefuteBench> (the data at commit 24c2135).
//!
//! This module only wires the parts together: [`data`] turns the authors' JSONL files into
//! typed items (their origin, from the file name, in [`source`]), [`prompts`] holds every template, [`dialogue`] replays one item's turns from its
//! finished steps (which feedback is given, and what each reply must satisfy), [`checkers`] are the
//! rule-based response-rate checks (with the authors' tools' counterparts: [`punkt`] sentence
//! counting, [`lang_id`] language identification, [`segment`] Chinese and Hebrew word lists), [`plan`] asks for the next generations
//! and [`score`](mod@score) turns finished transcripts into feedback acceptance (FA) and response rate (RR);
//! [`panel`](mod@panel) adds each judge's FA and their agreement when several judges form a panel.
//!
//! A run: [`data::load_all`] on `$CANDOR_DATA/refutebench`, keep the items whose
//! [`Source::matches`] a requested subset, drive [`RefutePlan`] (its [`plan::PlanRecord`] goes in
//! the manifest), then [`RefutePlan::score`] the finished transcripts. `candor score refutebench`
//! rescores a run's samples with [`score::read_transcripts`].

pub mod checkers;
pub mod data;
pub mod dialogue;
pub mod figures;
pub mod lang_id;
pub mod panel;
pub mod plan;
pub mod prompts;
pub mod protocol;
pub mod punkt;
pub mod score;
pub mod segment;
pub mod source;

pub use protocol::RefuteBench;

/// Everything that can go wrong reading RefuteBench data or recorded transcripts: the
/// loaders' shared type.
pub use crate::bench::loader::DataError as Error;

pub use data::{Item, Setting, Source, Task};
pub use plan::{RefutePlan, Strategy};
pub use score::{score, ItemTranscript};
