//! `"stream": true`: the reply as server-sent events, one `data: {chunk}` per delta, each
//! choice's last chunk with its `finish_reason`, a usage chunk when
//! `stream_options.include_usage` asks for it, then `data: [DONE]`.
//!
//! The deltas of a choice join into exactly the text the same request gets unstreamed: the
//! engine's thread holds back text a stop string may still claim (see [`super::worker`]). A
//! client that goes away drops the stream, which closes the request's channel; the engine's
//! thread then cancels its choices.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::reply::{
    chat_logprobs, completion_logprobs, finish_reason, usage, Endpoint, Running, FINGERPRINT,
};
use super::worker::{Event, LogprobInfo};

/// Where a stream is.
struct State {
    run: Running,
    early: std::vec::IntoIter<(usize, Event)>,
    /// Per choice: whether its first chunk (with the role) went out, bytes of text sent.
    opened: Vec<bool>,
    text_len: Vec<usize>,
    left: usize,
    completion_tokens: usize,
    ended: bool,
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl State {
    fn chunk(&self, choice: Value) -> Value {
        let (object, fingerprint) = match self.run.endpoint {
            Endpoint::Chat => ("chat.completion.chunk", Some(FINGERPRINT)),
            Endpoint::Completions => ("text_completion", None),
        };
        let mut v = json!({
            "id": self.run.id,
            "object": object,
            "created": self.run.created,
            "model": self.run.model,
            "choices": [choice],
        });
        if let Some(f) = fingerprint {
            v["system_fingerprint"] = json!(f);
        }
        v
    }

    /// A choice's chunk carrying `text`, its tokens' log-probabilities and, at its end, why.
    fn choice(
        &mut self,
        i: usize,
        text: &str,
        reasoning: &str,
        lps: Option<&[LogprobInfo]>,
        finish: Option<&str>,
    ) -> Value {
        let offset = self.text_len[i];
        self.text_len[i] += text.len();
        match self.run.endpoint {
            Endpoint::Chat => {
                let mut delta = json!({});
                if !self.opened[i] {
                    delta["role"] = json!("assistant");
                    self.opened[i] = true;
                }
                if !reasoning.is_empty() {
                    delta["reasoning_content"] = json!(reasoning);
                }
                if !text.is_empty() || (finish.is_none() && reasoning.is_empty()) {
                    delta["content"] = json!(text);
                }
                json!({
                    "index": i,
                    "delta": delta,
                    "logprobs": lps.map(chat_logprobs),
                    "finish_reason": finish,
                })
            }
            Endpoint::Completions => json!({
                "index": i,
                "text": text,
                "logprobs": lps.map(|l| completion_logprobs(l, offset)),
                "finish_reason": finish,
            }),
        }
    }

    /// The next piece of the body; `None` once `[DONE]` went out.
    async fn next(&mut self) -> Option<String> {
        if self.ended {
            return None;
        }
        if self.left == 0 {
            self.ended = true;
            let mut out = String::new();
            if self.run.include_usage {
                let mut v = self.chunk(Value::Null);
                v["choices"] = json!([]);
                v["usage"] = usage(self.run.prompt_tokens, self.completion_tokens);
                out.push_str(&sse(&v));
            }
            out.push_str("data: [DONE]\n\n");
            return Some(out);
        }
        let event = match self.early.next() {
            Some(e) => Some(e),
            None => self.run.rx.recv().await,
        };
        let out = match event {
            Some((
                i,
                Event::Delta {
                    text,
                    reasoning,
                    logprobs,
                },
            )) => {
                let lps = (!logprobs.is_empty()).then_some(logprobs.as_slice());
                let c = self.choice(i, &text, &reasoning, lps, None);
                sse(&self.chunk(c))
            }
            Some((i, Event::Done(f))) => {
                self.left -= 1;
                self.completion_tokens += f.output_ids.len();
                let c = self.choice(
                    i,
                    &f.text,
                    f.reasoning.as_deref().unwrap_or(""),
                    f.logprobs.as_deref(),
                    Some(finish_reason(f.stop_reason)),
                );
                sse(&self.chunk(c))
            }
            Some((_, Event::Failed(e))) => {
                self.ended = true;
                sse(&e.body())
            }
            Some((_, Event::Started { .. })) => String::new(),
            None => {
                self.ended = true;
                sse(&super::error::ApiError::internal("the engine dropped the request").body())
            }
        };
        Some(out)
    }
}

/// The streamed response to a started request.
pub fn response(mut run: Running) -> Response {
    let early = std::mem::take(&mut run.early).into_iter();
    let choices = run.choices;
    let state = State {
        run,
        early,
        opened: vec![false; choices],
        text_len: vec![0; choices],
        left: choices,
        completion_tokens: 0,
        ended: false,
    };
    let body = futures_util::stream::unfold(state, |mut s| async move {
        let piece = s.next().await?;
        Some((Ok::<Bytes, Infallible>(Bytes::from(piece)), s))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
