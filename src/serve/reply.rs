//! The pieces of an OpenAI-style reply that the whole-body answer ([`super::routes`]) and the
//! streamed one ([`super::stream`]) share: the request's running choices, finish reasons,
//! logprobs and usage in OpenAI's JSON.

use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::OwnedSemaphorePermit;

use super::worker::{Event, LogprobInfo, TokenInfo};
use crate::engine::StopReason;

/// `system_fingerprint`: the build that answered.
pub const FINGERPRINT: &str = concat!("candor-", env!("CARGO_PKG_VERSION"));

/// Which endpoint a reply is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// A request's choices, started on its model's engine.
pub struct Running {
    pub rx: UnboundedReceiver<(usize, Event)>,
    /// The queue places its choices hold (given back when the reply is sent).
    pub permit: OwnedSemaphorePermit,
    /// Prompt tokens, each prompt counted once.
    pub prompt_tokens: usize,
    pub choices: usize,
    /// Events that came before every choice had started.
    pub early: Vec<(usize, Event)>,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    pub include_usage: bool,
}

/// `finish_reason` for a stop reason.
pub fn finish_reason(r: StopReason) -> &'static str {
    match r {
        StopReason::Eos | StopReason::StopString => "stop",
        StopReason::MaxTokens | StopReason::ContextFull => "length",
    }
}

fn token_json(t: &TokenInfo) -> Value {
    json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes})
}

/// Chat `logprobs.content` entries.
pub fn chat_logprobs(lps: &[LogprobInfo]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let mut v = token_json(&lp.chosen);
            v["top_logprobs"] = lp.top.iter().map(token_json).collect();
            v
        })
        .collect();
    json!({ "content": content })
}

/// Legacy completions `logprobs`; `offset` is where this part's text starts in the choice.
pub fn completion_logprobs(lps: &[LogprobInfo], offset: usize) -> Value {
    let mut at = offset;
    let mut text_offset = Vec::with_capacity(lps.len());
    for lp in lps {
        text_offset.push(at);
        at += lp.chosen.token.len();
    }
    let top: Vec<Value> = lps
        .iter()
        .map(|lp| {
            let m: Map<String, Value> = lp
                .top
                .iter()
                .map(|t| (t.token.clone(), json!(t.logprob)))
                .collect();
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": lps.iter().map(|lp| lp.chosen.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": lps.iter().map(|lp| lp.chosen.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}
