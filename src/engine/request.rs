//! What the engine is asked and answers: a chat request with its sampling parameters, the
//! reply and why it stopped, and [`Generate`], the interface a caller drives a model through.

use serde::{Deserialize, Serialize};

use super::constraint::Constraint;
use super::prefix::PrefillStats;
use crate::text::chat_template::TemplateArgs;
use crate::text::message::Message;

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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    pub params: SamplingParams,
    /// Extra chat-template variables (the thinking switch, a reasoning effort) and the date
    /// the template renders; absent from serialized requests when default.
    #[serde(default, skip_serializing_if = "TemplateArgs::is_default")]
    pub template: TemplateArgs,
    /// A thinking model's reasoning budget: after this many reasoning tokens the block's
    /// closing tokens are forced (`--max-thinking-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_thinking_tokens: Option<usize>,
}

impl ChatRequest {
    /// A request with the template's defaults and no reasoning budget.
    pub fn new(messages: Vec<Message>, params: SamplingParams) -> ChatRequest {
        ChatRequest {
            messages,
            params,
            ..ChatRequest::default()
        }
    }
}

/// The reply to a [`ChatRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatReply {
    pub prompt_ids: Vec<u32>,
    /// As generated, the stop token included when generation stopped on one.
    pub output_ids: Vec<u32>,
    /// Decoded reply, without the stop token or stop string; for a thinking model, the
    /// answer only (its reasoning is in `reasoning`).
    pub text: String,
    pub stop_reason: StopReason,
    /// What a thinking model wrote before its answer (never parsed, never scored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<Reasoning>,
}

/// The reasoning block of a thinking model's reply.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reasoning {
    pub text: String,
    /// Tokens generated inside the block (a forced close excluded).
    pub tokens: usize,
    /// The reply ended inside its reasoning (token limit or context): it has no answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
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
