//! The decoding engine: packed batched forward passes, per-sequence KV state and sampling.
//!
//! The engine takes token ids (or chat messages, rendered with the model's own template) and
//! sampling parameters, and returns tokens, text and a stop reason. It knows nothing of
//! benchmarks: protocols talk to it through [`Generate`].

pub mod chat;
pub mod constraint;
pub mod draft;
pub mod error;
pub mod kv;
pub mod logprobs;
pub mod prefix;
pub mod reasoning;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod throughput;

pub use chat::{model_template, Engine, EngineOptions};
pub use constraint::{Constraint, LLGUIDANCE_VERSION};
pub use draft::{DraftConfig, DraftSource, DraftStats};
pub use error::EngineError;
pub use kv::{KvStore, SeqId, SeqKv};
pub use logprobs::TokenLogprob;
pub use prefix::{PrefillStats, PrefixCache};
pub use reasoning::ReasoningGate;
pub use request::{ChatReply, ChatRequest, Generate, Reasoning, SamplingParams, StopReason};
pub use scheduler::{
    Decoder, NoText, SchedulerConfig, TextDecoder, TokenReply, TokenRequest,
    DEFAULT_PREFIX_CACHE_MB,
};
