//! The decoding engine: packed batched forward passes, per-sequence KV state and sampling.
//!
//! The engine takes token ids (or chat messages, rendered with the model's own template) and
//! sampling parameters, and returns tokens, text and a stop reason. It knows nothing of
//! benchmarks: protocols talk to it through [`Generate`].

pub mod chat;
pub mod constraint;
pub mod kv;
pub mod logprobs;
pub mod prefix;
pub mod sampling;
pub mod scheduler;
pub mod throughput;

use serde::{Deserialize, Serialize};

use crate::model::ModelError;
use crate::text::error::TextError;
use crate::text::message::Message;
use crate::weights::error::WeightsError;

pub use chat::{Engine, EngineOptions};
pub use constraint::{Constraint, LLGUIDANCE_VERSION};
pub use kv::{KvStore, SeqId, SeqKv};
pub use logprobs::TokenLogprob;
pub use prefix::{PrefillStats, PrefixCache};
pub use scheduler::{
    Decoder, NoText, SchedulerConfig, TextDecoder, TokenReply, TokenRequest,
    DEFAULT_PREFIX_CACHE_MB,
};

/// Errors of the engine layer.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("request {index}: empty prompt")]
    EmptyPrompt { index: usize },
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("prefix of {len} tokens does not fit the context of {context}")]
    PrefixTooLong { len: usize, context: usize },
    #[error("unknown sequence {0:?}")]
    UnknownSequence(SeqId),
    #[error("request {index}: constraint: {msg}")]
    Constraint { index: usize, msg: String },
    /// A device's KV pool cannot hold the positions of a step even after the prefix cache gave
    /// its blocks back (the scheduler first makes requests wait for running ones to finish).
    #[error(
        "the device's KV cache is full: {want} more blocks needed, {free} free (lower \
         --batch-size or --kv-cache-mb, or shorten the prompts)"
    )]
    KvFull { want: usize, free: usize },
    #[error("internal engine error: {0}")]
    Internal(String),
}

impl From<TextError> for EngineError {
    fn from(e: TextError) -> Self {
        EngineError::Model(e.into())
    }
}

impl From<WeightsError> for EngineError {
    fn from(e: WeightsError) -> Self {
        EngineError::Model(e.into())
    }
}

/// How to pick tokens and when to stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (a tie goes to the lowest token id).
    pub temperature: f32,
    /// Nucleus mass; 1.0 disables top-p.
    pub top_p: f32,
    /// Per-request seed: a request's tokens never depend on its batch neighbours.
    pub seed: u64,
    pub max_new_tokens: usize,
    /// Generation stops after the first occurrence of any of these strings.
    pub stop_strings: Vec<String>,
    /// A grammar the output must follow (absent from serialized params when unset, so cache
    /// keys of unconstrained requests are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<Constraint>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
            max_new_tokens: 256,
            stop_strings: Vec::new(),
            constraint: None,
        }
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-sequence or end-of-turn token was produced.
    Eos,
    /// One of the request's stop strings appeared.
    StopString,
    /// `max_new_tokens` were produced.
    MaxTokens,
    /// The model's context window is full.
    ContextFull,
}

/// A chat conversation to continue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub params: SamplingParams,
}

/// The reply to a [`ChatRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatReply {
    pub prompt_ids: Vec<u32>,
    /// As generated, the stop token included when generation stopped on one.
    pub output_ids: Vec<u32>,
    /// Decoded reply, without the stop token or stop string.
    pub text: String,
    pub stop_reason: StopReason,
}

impl ChatReply {
    /// The chat reply to `prompt_ids` that the token-level reply `t` gives.
    pub fn from_tokens(prompt_ids: Vec<u32>, t: &scheduler::TokenReply) -> ChatReply {
        ChatReply {
            prompt_ids,
            output_ids: t.output_ids.clone(),
            text: t.text.clone(),
            stop_reason: t.stop_reason,
        }
    }
}

/// Something that answers chat requests in batches: the engine with a loaded model, or a
/// scripted fake in tests. The i-th reply answers the i-th request.
///
/// Besides whole batches it answers a stream ([`Generate::start`], [`Generate::poll`]): the
/// caller adds requests while others are being generated, and gets each reply as soon as it is
/// finished. Either way a request's reply depends only on the request, never on what else is
/// in flight or on the order requests were started in.
pub trait Generate {
    type Error: std::error::Error + Send + Sync + 'static;
    fn generate_chat(&mut self, requests: &[ChatRequest]) -> Result<Vec<ChatReply>, Self::Error>;

    /// [`Generate::generate_chat`], calling `done(i)` as soon as request `i` is answered
    /// (by default, for every request once all are answered).
    fn generate_chat_with_progress(
        &mut self,
        requests: &[ChatRequest],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<ChatReply>, Self::Error> {
        let replies = self.generate_chat(requests)?;
        (0..replies.len()).for_each(&mut *done);
        Ok(replies)
    }

    /// Streaming: starts answering `request`, which the caller names `id` (unique among the
    /// requests in flight). Returns the reply at once when it needs no generating (a cached
    /// one), else `None` and the reply comes from a later [`Generate::poll`]. An error here
    /// concerns this request only (nothing was started) when the generator's
    /// [`crate::store::model_pool::Models::is_request_error`] says so. By default the request is answered
    /// at once, alone, by [`Generate::generate_chat`].
    fn start(&mut self, id: u64, request: &ChatRequest) -> Result<Option<ChatReply>, Self::Error> {
        let _ = id;
        let mut replies = self.generate_chat(std::slice::from_ref(request))?;
        Ok(if replies.len() == 1 {
            replies.pop()
        } else {
            None
        })
    }

    /// Streaming: advances the requests in flight (for the engine: forward passes, whose free
    /// batch slots are refilled from the started requests) until at least one is finished,
    /// and returns the finished ones by id. Returns nothing only when nothing is in flight. An
    /// error is the engine's, not a request's.
    fn poll(&mut self) -> Result<Vec<(u64, ChatReply)>, Self::Error> {
        Ok(Vec::new())
    }

    /// Prompt positions computed and reused (prefix cache) by this generator so far.
    fn prefill_stats(&self) -> PrefillStats {
        PrefillStats::default()
    }
}
