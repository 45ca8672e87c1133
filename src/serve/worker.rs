//! One engine per served model, on a thread of its own: it takes jobs from the HTTP handlers,
//! renders and encodes their prompts, checks them against the context, and runs the engine's
//! streaming scheduler ([`crate::engine::Decoder::submit`] and
//! [`crate::engine::Decoder::step`]): continuous batching over whatever is in flight, with the
//! prefix cache and constrained decoding. Every job's events go back on its request's channel.
//!
//! A job whose channel is closed (its client went away) is cancelled before the next step, so
//! its slot and KV blocks go to the next request. Cancelling, like batching, never changes
//! another request's tokens. When every handle is dropped the thread finishes what is in
//! flight and ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use crate::engine::{
    Engine, EngineError, SamplingParams, StopReason, TokenLogprob, TokenReply, TokenRequest,
};
use crate::text::chat_template::TemplateArgs;
use crate::text::message::Message;
use crate::text::reasoning::ReasoningFormat;
use crate::text::tokenizer::Tokenizer;

/// What to continue: a chat (rendered with the model's template and the request's template
/// variables) or raw text.
#[derive(Debug, Clone)]
pub enum Prompt {
    Chat(Vec<Message>, TemplateArgs),
    Text(String),
}

/// One choice of one request.
pub struct Job {
    pub prompt: Prompt,
    pub params: SamplingParams,
    /// `None`: as many tokens as the context leaves after the prompt.
    pub max_tokens: Option<usize>,
    /// Alternatives per token, when log-probabilities are reported.
    pub logprobs: Option<usize>,
    /// Send [`Event::Delta`]s while decoding.
    pub stream: bool,
    /// The choice's index in its request (events carry it back).
    pub choice: usize,
    /// Most tokens drafted per verify step (`speculative.n_max`), in place of the server's.
    pub draft_tokens: Option<usize>,
    pub events: UnboundedSender<(usize, Event)>,
}

/// A token as a client sees it: its text, exact bytes and log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenInfo {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A generated token's log-probability with the most likely alternatives at its step.
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobInfo {
    pub chosen: TokenInfo,
    pub top: Vec<TokenInfo>,
}

fn token_info(tokenizer: &Tokenizer, id: u32, logprob: f32) -> TokenInfo {
    let bytes = match tokenizer.token_bytes(id) {
        Some(b) if !b.is_empty() => b.to_vec(),
        _ => tokenizer
            .id_to_token(id)
            .unwrap_or_default()
            .as_bytes()
            .to_vec(),
    };
    TokenInfo {
        token: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
        logprob,
    }
}

fn describe(tokenizer: &Tokenizer, lps: &[TokenLogprob]) -> Vec<LogprobInfo> {
    lps.iter()
        .map(|lp| LogprobInfo {
            chosen: token_info(tokenizer, lp.id, lp.logprob),
            top: lp
                .top
                .iter()
                .map(|&(id, l)| token_info(tokenizer, id, l))
                .collect(),
        })
        .collect()
}

/// A finished choice.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The answer (a thinking model's reasoning is in `reasoning`); when streamed, what the
    /// deltas did not carry.
    pub text: String,
    /// A thinking model's reasoning (streamed: what the deltas did not carry).
    pub reasoning: Option<String>,
    pub output_ids: Vec<u32>,
    pub stop_reason: StopReason,
    /// Per generated token, the stop token excluded (when asked for).
    pub logprobs: Option<Vec<LogprobInfo>>,
}

/// What a job's request hears.
#[derive(Debug, Clone)]
pub enum Event {
    /// The prompt is checked and queued: its length in tokens.
    Started {
        prompt_tokens: usize,
    },
    /// Streaming: text and tokens generated since the last delta.
    Delta {
        text: String,
        /// A thinking model's reasoning generated since the last delta.
        reasoning: String,
        logprobs: Vec<LogprobInfo>,
    },
    Done(Finished),
    /// The job was refused (before [`Event::Started`]) or the engine failed.
    Failed(ApiError),
}

/// Where a served model's thread takes its jobs, and what it reports.
pub struct Worker {
    pub jobs: mpsc::Sender<Job>,
    pub context_len: usize,
    /// Jobs started and not finished (queued or decoding).
    pub live: Arc<AtomicUsize>,
    /// The engine's speculative drafts so far (`None`: drafting is off), as of its last step.
    pub drafts: Arc<std::sync::Mutex<Option<crate::engine::DraftStats>>>,
    pub thread: std::thread::JoinHandle<()>,
}

/// Loads a model on a new thread and starts serving jobs from it; returns once it is loaded.
pub fn spawn(
    name: &str,
    load: Box<dyn FnOnce() -> Result<Engine, EngineError> + Send>,
) -> Result<Worker, String> {
    let (jobs, rx) = mpsc::channel::<Job>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<usize, String>>();
    let live = Arc::new(AtomicUsize::new(0));
    let live_w = Arc::clone(&live);
    let drafts = Arc::new(std::sync::Mutex::new(None));
    let drafts_w = Arc::clone(&drafts);
    let thread = std::thread::Builder::new()
        .name(format!("serve:{name}"))
        .spawn(move || match load() {
            Ok(engine) => {
                let _ = ready_tx.send(Ok(engine.config().context_len));
                Serving::new(engine, live_w, drafts_w).run(rx);
            }
            Err(e) => {
                let _ = ready_tx.send(Err(crate_error_chain(&e)));
            }
        })
        .map_err(|e| format!("starting a thread: {e}"))?;
    match ready_rx.recv() {
        Ok(Ok(context_len)) => Ok(Worker {
            jobs,
            context_len,
            live,
            drafts,
            thread,
        }),
        Ok(Err(msg)) => Err(msg),
        Err(_) => Err("the model's thread ended while loading".into()),
    }
}

fn crate_error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A streamed job's progress.
struct Live {
    choice: usize,
    events: UnboundedSender<(usize, Event)>,
    stream: bool,
    /// Text sent in deltas so far (always a prefix of the final text).
    sent: String,
    /// Tokens and log-probabilities seen / sent so far.
    seen_tokens: usize,
    sent_logprobs: usize,
    /// Bytes held back from deltas: the longest stop string but one (it may still complete),
    /// or a thinking model's block close but one.
    hold: usize,
    /// A thinking model's reply: its template's family and whether it starts inside its
    /// reasoning; its deltas are split into reasoning and answer.
    thinking: Option<(ReasoningFormat, bool)>,
    /// Reasoning and answer sent in deltas so far (thinking replies).
    sent_reasoning: String,
    sent_answer: String,
}

struct Serving {
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    live: HashMap<u64, Live>,
    count: Arc<AtomicUsize>,
    drafts: Arc<std::sync::Mutex<Option<crate::engine::DraftStats>>>,
    next_id: u64,
}

impl Serving {
    fn new(
        engine: Engine,
        count: Arc<AtomicUsize>,
        drafts: Arc<std::sync::Mutex<Option<crate::engine::DraftStats>>>,
    ) -> Serving {
        Serving {
            drafts,
            tokenizer: engine.shared_tokenizer(),
            engine,
            live: HashMap::new(),
            count,
            next_id: 0,
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Job>) {
        loop {
            if self.live.is_empty() {
                // Idle: wait for work; every handle gone (the server stopped) ends the thread.
                match rx.recv() {
                    Ok(job) => self.accept(job),
                    Err(_) => return,
                }
            }
            while let Ok(job) = rx.try_recv() {
                self.accept(job);
            }
            let gone: Vec<u64> = self
                .live
                .iter()
                .filter(|(_, l)| l.events.is_closed())
                .map(|(&id, _)| id)
                .collect();
            for id in gone {
                self.engine.decoder().cancel(id);
                self.live.remove(&id);
            }
            if self.engine.decoder().in_flight() > 0 {
                self.step();
            }
            self.count.store(self.live.len(), Ordering::Relaxed);
            let dec = self.engine.decoder();
            if dec.draft_config().is_some() {
                if let Ok(mut d) = self.drafts.lock() {
                    *d = Some(dec.draft_stats());
                }
            }
        }
    }

    /// Checks and queues a job, or answers why not.
    fn accept(&mut self, job: Job) {
        let ctx = self.engine.config().context_len;
        let format = self.engine.reasoning_format();
        let (param, prepared) = match &job.prompt {
            Prompt::Chat(messages, args) => (
                "messages",
                self.engine.prepare(&crate::engine::ChatRequest {
                    messages: messages.clone(),
                    params: job.params.clone(),
                    template: args.clone(),
                    max_thinking_tokens: None,
                }),
            ),
            Prompt::Text(text) => (
                "prompt",
                self.engine
                    .raw_prompt_ids(text)
                    .map(|prompt_ids| crate::engine::chat::Prepared {
                        prompt_ids,
                        reasoning: None,
                        starts_open: false,
                    }),
            ),
        };
        let (ids, gate, starts_open) = match prepared {
            Ok(p) => (Ok(p.prompt_ids), p.reasoning, p.starts_open),
            Err(e) => (Err(e), None, false),
        };
        let thinking = gate.as_ref().map(|_| (format, starts_open));
        let fail = |e: ApiError| {
            let _ = job.events.send((job.choice, Event::Failed(e)));
        };
        let ids = match ids {
            Ok(ids) => ids,
            Err(e) => {
                return fail(ApiError::invalid_param(
                    param,
                    format!("the prompt cannot be encoded: {}", crate_error_chain(&e)),
                ))
            }
        };
        if ids.len() >= ctx {
            return fail(ApiError::invalid_param(
                param,
                format!(
                    "the prompt has {} tokens and this model's context is {ctx} tokens: \
                     nothing can be generated",
                    ids.len()
                ),
            ));
        }
        let room = ctx - ids.len();
        let max_tokens = match job.max_tokens {
            Some(m) if m > room => {
                return fail(ApiError::invalid_param(
                    "max_tokens",
                    format!(
                        "max_tokens is {m}, but this model's context of {ctx} tokens leaves \
                         {room} after the prompt's {} tokens",
                        ids.len()
                    ),
                ))
            }
            Some(m) => m,
            None => room,
        };
        let prompt_tokens = ids.len();
        let params = SamplingParams {
            max_new_tokens: max_tokens,
            ..job.params
        };
        let hold = params
            .stop_strings
            .iter()
            .chain(
                thinking
                    .and_then(|(f, _)| f.close_marker())
                    .map(|m| m.to_string())
                    .as_ref(),
            )
            .map(|s| s.len().saturating_sub(1))
            .max()
            .unwrap_or(0);
        let id = self.next_id;
        self.next_id += 1;
        let request = TokenRequest {
            reasoning: gate,
            draft_tokens: job.draft_tokens,
            ..TokenRequest::new(ids, params)
        };
        let submitted = match job.logprobs {
            Some(top) => self.engine.decoder().submit_with_logprobs(id, request, top),
            None => self.engine.decoder().submit(id, request),
        };
        if let Err(e) = submitted {
            let err = match e {
                EngineError::Constraint { msg, .. } => ApiError::invalid_param(
                    "response_format",
                    format!("the schema cannot be used: {msg}"),
                ),
                EngineError::DraftsRefused(msg) => ApiError::invalid_param(
                    "speculative.n_max",
                    format!("`speculative.n_max` cannot be used here: {msg}"),
                ),
                other => ApiError::bad_request(crate_error_chain(&other)),
            };
            return fail(err);
        }
        let _ = job
            .events
            .send((job.choice, Event::Started { prompt_tokens }));
        self.live.insert(
            id,
            Live {
                choice: job.choice,
                events: job.events,
                stream: job.stream,
                sent: String::new(),
                seen_tokens: 0,
                sent_logprobs: 0,
                hold,
                thinking,
                sent_reasoning: String::new(),
                sent_answer: String::new(),
            },
        );
    }

    /// One scheduler step: deltas for the streamed jobs, replies for the finished ones.
    fn step(&mut self) {
        let tokenizer = Arc::clone(&self.tokenizer);
        let finished = match self.engine.decoder().step(tokenizer.as_ref()) {
            Ok(f) => f,
            Err(e) => {
                let msg = format!("the engine failed: {}", crate_error_chain(&e));
                for (id, l) in self.live.drain() {
                    self.engine.decoder().cancel(id);
                    let _ = l
                        .events
                        .send((l.choice, Event::Failed(ApiError::internal(msg.clone()))));
                }
                return;
            }
        };
        for (id, reply) in finished {
            let logprobs = self.engine.decoder().take_logprobs(id);
            if let Some(l) = self.live.remove(&id) {
                self.finish(l, reply, logprobs);
            }
        }
        let decoder = self.engine.decoder();
        for (&id, l) in self.live.iter_mut().filter(|(_, l)| l.stream) {
            let Some(out) = decoder.partial_output(id) else {
                continue;
            };
            if out.len() == l.seen_tokens {
                continue;
            }
            l.seen_tokens = out.len();
            let text = tokenizer.decode(out);
            let mut safe = text.trim_end_matches('\u{FFFD}').len();
            safe = safe.saturating_sub(l.hold);
            while !text.is_char_boundary(safe) {
                safe -= 1;
            }
            let delta = match text.get(..safe) {
                Some(head) if safe > l.sent.len() && head.starts_with(&l.sent) => {
                    head[l.sent.len()..].to_string()
                }
                _ => String::new(),
            };
            // A thinking reply's deltas: the new part of its reasoning and of its answer.
            let (delta, reasoning) = match (l.thinking, text.get(..safe)) {
                (Some((format, open)), Some(head)) if !format.undecided(head, open) => {
                    let split = format.split(head, open);
                    let r = extend(&mut l.sent_reasoning, &split.reasoning.unwrap_or_default());
                    let a = extend(&mut l.sent_answer, &split.answer.unwrap_or_default());
                    (a, r)
                }
                (Some(_), _) => (String::new(), String::new()),
                (None, _) => (delta, String::new()),
            };
            let new_logprobs = decoder
                .logprobs(id)
                .map(|v| v[l.sent_logprobs.min(v.len())..].to_vec())
                .unwrap_or_default();
            if delta.is_empty() && reasoning.is_empty() && new_logprobs.is_empty() {
                continue;
            }
            l.sent.push_str(&delta);
            l.sent_logprobs += new_logprobs.len();
            let _ = l.events.send((
                l.choice,
                Event::Delta {
                    text: delta,
                    reasoning,
                    logprobs: describe(&tokenizer, &new_logprobs),
                },
            ));
        }
    }

    fn finish(&self, l: Live, reply: TokenReply, logprobs: Option<Vec<TokenLogprob>>) {
        let stop_ids = self.engine.stop_ids();
        let ends_on_stop = reply
            .output_ids
            .last()
            .is_some_and(|t| stop_ids.contains(t));
        let logprobs = logprobs.map(|mut v| {
            if ends_on_stop && v.len() == reply.output_ids.len() {
                v.pop();
            }
            v
        });
        // A thinking model's answer, split from its reasoning.
        let (answer, reasoning) = match l.thinking {
            Some((format, open)) => {
                let split = format.split(&reply.text, open);
                (split.answer.unwrap_or_default(), split.reasoning)
            }
            None => (reply.text.clone(), None),
        };
        let (text, reasoning) = match (l.stream, l.thinking) {
            (true, Some(_)) => (
                rest(&answer, &l.sent_answer),
                reasoning.map(|r| rest(&r, &l.sent_reasoning)),
            ),
            _ => (answer, reasoning),
        };
        let reply = TokenReply { text, ..reply };
        let (text, logprobs) = if l.stream && l.thinking.is_some() {
            let rest_lp = logprobs.map(|v| v[l.sent_logprobs.min(v.len())..].to_vec());
            (reply.text, rest_lp)
        } else if l.stream {
            // The rest of the text after what the deltas carried (they are a prefix of it).
            let rest = reply
                .text
                .strip_prefix(l.sent.as_str())
                .unwrap_or(&reply.text)
                .to_string();
            let rest_lp = logprobs.map(|v| v[l.sent_logprobs.min(v.len())..].to_vec());
            (rest, rest_lp)
        } else {
            (reply.text, logprobs)
        };
        let _ = l.events.send((
            l.choice,
            Event::Done(Finished {
                text,
                reasoning,
                output_ids: reply.output_ids,
                stop_reason: reply.stop_reason,
                logprobs: logprobs.map(|v| describe(&self.tokenizer, &v)),
            }),
        ));
    }
}

/// The part of `now` after what was `sent`, appended to `sent`; nothing when `now` no longer
/// extends it (the final message then carries the rest).
fn extend(sent: &mut String, now: &str) -> String {
    match now.strip_prefix(sent.as_str()) {
        Some(new) if !new.is_empty() => {
            let new = new.to_string();
            sent.push_str(&new);
            new
        }
        _ => String::new(),
    }
}

/// What of `full` the deltas did not carry (all of it when they are not its prefix).
fn rest(full: &str, sent: &str) -> String {
    full.strip_prefix(sent).unwrap_or(full).to_string()
}
