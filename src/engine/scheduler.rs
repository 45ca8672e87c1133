//! The one decode loop: admits token-level requests into a packed batch of at most
//! `batch_size` sequences, prefills them in chunks, samples, checks stop conditions and retires
//! finished sequences, until every request has its reply.
//!
//! It runs either over a fixed set of requests ([`Decoder::generate`]) or as a stream
//! ([`Decoder::submit`] and [`Decoder::step`]): requests are added while others decode, and
//! each step first refills the free slots, so a caller can feed a request's follow-up as soon
//! as the request is answered.
//!
//! A step packs each active sequence's next rows (a prefill chunk or its one new token) back
//! to back and runs one forward pass. Because the model's rows are computed independently and
//! sampling depends only on a request's own seed and step, the order and grouping chosen here
//! never change any request's tokens. The scheduler knows tokens, not chat messages; text is
//! only produced (through [`TextDecoder`]) to check stop strings.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::constraint::{
    masked_argmax, masked_logits, Allowed, ConstraintCompiler, ConstraintState,
};
use super::draft::{
    lookup, DraftAsk, DraftConfig, DraftModel, DraftSource, DraftStats, SeqDraft, StepCosts,
};
use super::kv::{KvLayout, KvStorage, KvStore, SeqId, SeqKv, BLOCK_TOKENS};
use super::logprobs::{token_logprob, TokenLogprob};
use super::prefix::{resume_point, snapshot_points, PrefillStats, PrefixCache};
use super::reasoning::{GateState, ReasoningGate};
use super::sampling::{argmax, Sampler};
use super::{ChatReply, EngineError, SamplingParams, StopReason};
use crate::model::kv::{KvSeq, Logits, SeqStep};
use crate::model::runner::Model;
use crate::model::transformer::Scratch;

/// Turns generated ids into text (to find stop strings); the engine passes its tokenizer.
pub trait TextDecoder {
    fn decode(&self, ids: &[u32]) -> String;
}

/// A decoder for models without a tokenizer (tests): every text is empty.
pub struct NoText;

impl TextDecoder for NoText {
    fn decode(&self, _ids: &[u32]) -> String {
        String::new()
    }
}

/// A token-level generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRequest {
    /// Tokens to feed (after the prefix, if any); must not be empty.
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    /// A stored sequence whose positions come before `prompt_ids` (a shared prompt prefix).
    pub prefix: Option<SeqId>,
    /// The reply's reasoning block (thinking models): its budget, and where the grammar
    /// starts to apply.
    pub reasoning: Option<ReasoningGate>,
    /// Most tokens drafted per verify step for this request, in place of the decoder's
    /// [`DraftConfig::tokens`] (`Some(0)`: no drafts for it). Only the speed changes: the
    /// tokens are those without drafts. A positive value needs drafting on
    /// ([`Decoder::set_drafting`]).
    pub draft_tokens: Option<usize>,
}

impl TokenRequest {
    pub fn new(prompt_ids: Vec<u32>, params: SamplingParams) -> TokenRequest {
        TokenRequest {
            prompt_ids,
            params,
            prefix: None,
            reasoning: None,
            draft_tokens: None,
        }
    }
}

/// The outcome of a [`TokenRequest`].
#[derive(Debug, Clone, PartialEq)]
pub struct TokenReply {
    /// As generated, the stop token included when generation stopped on one.
    pub output_ids: Vec<u32>,
    /// Decoded output without the stop token, cut before a stop string.
    pub text: String,
    pub stop_reason: StopReason,
    /// Tokens generated inside the reply's reasoning block (forced ones excluded); `None`
    /// for a request without a [`ReasoningGate`].
    pub reasoning_tokens: Option<usize>,
    /// From admission to the first sampled token.
    pub prefill_ms: f64,
    /// From the first sampled token to the end.
    pub decode_ms: f64,
}

/// Scheduling limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences decoding at once.
    pub batch_size: usize,
    /// Most prompt tokens one sequence feeds in one step.
    pub prefill_chunk: usize,
    /// Most rows in one step.
    pub max_step_tokens: usize,
    /// Bytes of KV blocks the prefix cache may hold (0 turns reuse off). Never changes a
    /// result, only how many prompt positions are computed.
    pub prefix_cache_bytes: usize,
}

/// The prefix cache's default budget.
pub const DEFAULT_PREFIX_CACHE_MB: usize = 1024;

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            batch_size: 8,
            prefill_chunk: 256,
            max_step_tokens: 512,
            prefix_cache_bytes: DEFAULT_PREFIX_CACHE_MB << 20,
        }
    }
}

struct Active {
    /// The caller's name for the request.
    id: u64,
    params: SamplingParams,
    kv: SeqKv,
    /// Tokens still to feed: the prompt (remainder), then each sampled token.
    feed: Vec<u32>,
    fed: usize,
    out: Vec<u32>,
    /// The request's prompt, when its positions go into the prefix cache.
    cached_prompt: Option<Vec<u32>>,
    admitted: Instant,
    first_token: Option<Instant>,
    /// The request's grammar state, when it is constrained.
    grammar: Option<ConstraintState>,
    /// The reply's reasoning phase, for a thinking model's request.
    gate: Option<GateState>,
    /// The known tokens of the sequence (stored prefix when known, prompt, output so far):
    /// what drafts are looked up in and drafted from.
    history: Vec<u32>,
    /// Drafted tokens at the end of `feed`, verified by this step.
    drafted: usize,
    draft: SeqDraft,
    /// Most tokens drafted per step for this sequence (its request's, else the decoder's).
    draft_max: usize,
    /// Positions after which the prefill pauses for the prefix cache to snapshot the
    /// recurrent state (a hybrid model's cached prompt; ascending, `prefix::snapshot_points`).
    pauses: Vec<usize>,
    /// The recurrent state at the reply's latest block boundary (a hybrid model's cached
    /// prompt), for the prefix cache when the reply ends: its next turn resumes there.
    reply_state: Option<(usize, Vec<f32>)>,
}

impl Active {
    /// The rows this sequence feeds in the next step given `chunk` (prefill chunk) and
    /// `budget` rows: its pending feed, up to its next pause.
    fn rows(&self, chunk: usize, budget: usize) -> usize {
        let left = self.feed.len() - self.fed;
        let n = left.min(chunk).min(budget);
        match self.pauses.first() {
            Some(&p) => n.min(p - self.kv.len()),
            None => n,
        }
    }

    /// Blocks this sequence may still take before it finishes: its pending feed and every
    /// token it may still generate, within the context.
    fn blocks_to_finish(&self, ctx: usize) -> usize {
        let pending = self.feed.len() - self.fed
            + self
                .params
                .max_new_tokens
                .saturating_sub(self.out.len() + 1);
        self.kv
            .blocks_to_grow(pending.min(ctx.saturating_sub(self.kv.len())))
    }
}

/// A checked request waiting for a slot in the batch.
struct Queued {
    id: u64,
    req: TokenRequest,
    grammar: Option<ConstraintState>,
}

/// Requests in flight: waiting for a slot, or decoding.
#[derive(Default)]
struct Flight {
    queue: VecDeque<Queued>,
    active: Vec<Active>,
}

impl Flight {
    fn len(&self) -> usize {
        self.queue.len() + self.active.len()
    }
}

/// Token-level decoding with one model, its KV store and its reusable buffers.
pub struct Decoder {
    model: Arc<Model>,
    config: SchedulerConfig,
    /// End-of-sequence and end-of-turn ids.
    stop_ids: Vec<u32>,
    store: KvStore,
    scratch: Scratch,
    sampler: Sampler,
    /// Compiles requests' constraints (set by the engine from its tokenizer).
    constraints: Option<Arc<ConstraintCompiler>>,
    cache: PrefixCache,
    stats: PrefillStats,
    /// The requests of the streaming interface ([`Decoder::submit`], [`Decoder::step`]).
    flight: Flight,
    /// Streamed requests that record log-probabilities ([`Decoder::submit_with_logprobs`]):
    /// by id, how many alternatives and the tokens' entries so far.
    logprobs: std::collections::HashMap<u64, (usize, Vec<TokenLogprob>)>,
    /// Speculative drafting, when on.
    drafting: Option<Drafting>,
    draft_stats: DraftStats,
    /// Decode steps' time against their rows (drafting's length follows it).
    step_costs: StepCosts,
    /// Where the draft statistics are copied after each step, for a caller that no longer
    /// holds the decoder (a run's notes).
    draft_sink: Option<Arc<std::sync::Mutex<DraftStats>>>,
    /// The token ids of stored sequences made by [`Decoder::prefill`] (and their forks), so
    /// that requests extending them can draft from their whole history.
    stored_ids: std::collections::HashMap<SeqId, Arc<Vec<u32>>>,
}

/// A decoder's drafting: where drafts come from and how many.
struct Drafting {
    config: DraftConfig,
    model: Option<DraftModel>,
}

impl Decoder {
    pub fn new(model: Arc<Model>, config: SchedulerConfig, stop_ids: Vec<u32>) -> Decoder {
        let layout = KvLayout::of(model.transformer());
        let storage = KvStorage::for_model(&model);
        let state_len = model.state_len();
        Decoder {
            model,
            config: SchedulerConfig {
                batch_size: config.batch_size.max(1),
                prefill_chunk: config.prefill_chunk.max(1),
                max_step_tokens: config.max_step_tokens.max(1),
                prefix_cache_bytes: config.prefix_cache_bytes,
            },
            stop_ids,
            store: KvStore::default(),
            scratch: Scratch::default(),
            sampler: Sampler::default(),
            constraints: None,
            cache: PrefixCache::new(layout, storage, config.prefix_cache_bytes)
                .with_state(state_len),
            stats: PrefillStats::default(),
            flight: Flight::default(),
            logprobs: Default::default(),
            drafting: None,
            draft_stats: DraftStats::default(),
            step_costs: StepCosts::default(),
            draft_sink: None,
            stored_ids: Default::default(),
        }
    }

    /// Turns speculative decoding on (or off with `None`). Drafting never changes a token:
    /// every output token is still sampled from the target's own logits at its position; a
    /// draft only lets one forward pass verify several positions. A draft model must have this
    /// model's vocabulary size (the engine also checks the tokens themselves).
    pub fn set_drafting(
        &mut self,
        drafting: Option<(DraftSource, DraftConfig)>,
    ) -> Result<(), EngineError> {
        self.drafting = match drafting {
            None => None,
            // Verifying drafts rolls rejected positions back; a recurrent state cannot be.
            Some(_) if self.model.state_len() > 0 => {
                return Err(EngineError::DraftsRefused(
                    "drafts need positions rolled back, which a model with linear-attention \
                     layers (a recurrent state) cannot do; run it without drafts"
                        .into(),
                ))
            }
            Some((source, config)) => {
                let model = match source {
                    DraftSource::Lookup => None,
                    DraftSource::Model(m) if m.state_len() > 0 => {
                        return Err(EngineError::DraftsRefused(
                            "a draft model's rejected drafts are rolled back, which a model \
                             with linear-attention layers (a recurrent state) cannot do"
                                .into(),
                        ))
                    }
                    DraftSource::Model(m) => {
                        let (ours, theirs) =
                            (self.model.config().vocab_size, m.config().vocab_size);
                        if ours != theirs {
                            return Err(EngineError::DraftVocabulary(format!(
                                "the draft model has {theirs} tokens, the model {ours}"
                            )));
                        }
                        Some(DraftModel::new(m, self.config.prefill_chunk))
                    }
                };
                Some(Drafting { config, model })
            }
        };
        Ok(())
    }

    /// Whether drafting is on, and its settings.
    pub fn draft_config(&self) -> Option<DraftConfig> {
        self.drafting.as_ref().map(|d| d.config)
    }

    /// Drafted and accepted tokens so far.
    pub fn draft_stats(&self) -> DraftStats {
        self.draft_stats
    }

    /// Keeps `sink` equal to [`Decoder::draft_stats`] after every step.
    pub fn share_draft_stats(&mut self, sink: Arc<std::sync::Mutex<DraftStats>>) {
        self.draft_sink = Some(sink);
    }

    /// Lets requests carry a [`super::Constraint`], compiled against this vocabulary.
    pub fn set_constraints(&mut self, compiler: Arc<ConstraintCompiler>) {
        self.constraints = Some(compiler);
    }

    /// Prompt positions computed and taken from the prefix cache so far.
    pub fn prefill_stats(&self) -> PrefillStats {
        self.stats
    }

    /// Blocks held by the prefix cache now.
    pub fn cached_blocks(&self) -> usize {
        self.cache.blocks()
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn config(&self) -> SchedulerConfig {
        self.config
    }

    pub fn set_batch_size(&mut self, batch_size: usize) {
        self.config.batch_size = batch_size.max(1);
    }

    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// An empty sequence on the model's device.
    fn new_kv(&self) -> SeqKv {
        let layout = KvLayout::of(self.model.transformer());
        SeqKv::new_in(layout, KvStorage::for_model(&self.model)).with_state(self.model.state_len())
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), EngineError> {
        let vocab = self.model.config().vocab_size;
        match ids.iter().find(|&&t| t as usize >= vocab) {
            Some(&id) => Err(EngineError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    /// Blocks free in a device's KV pool, after giving back cached prefixes to cover `want`;
    /// `None` for host memory (unbounded: CPU decoding never waits or fails here).
    fn free_blocks(&mut self, want: usize) -> Option<usize> {
        let free = self.cache_storage_free()?;
        if want > free {
            let keep = self.cache.blocks().saturating_sub(want - free);
            self.cache.shrink_to(keep);
        }
        self.cache_storage_free()
    }

    fn cache_storage_free(&self) -> Option<usize> {
        KvStorage::for_model(&self.model).free_blocks()
    }

    /// Makes room for growing `kv` by `n` positions, or says that the device's KV is full.
    fn reserve(&mut self, kv: &SeqKv, n: usize) -> Result<(), EngineError> {
        let want = kv.blocks_to_grow(n);
        match self.free_blocks(want) {
            Some(free) if free < want => Err(EngineError::KvFull { want, free }),
            _ => Ok(()),
        }
    }

    /// Feeds `ids` into a new stored sequence (a prompt prefix to fork from later).
    pub fn prefill(&mut self, ids: &[u32]) -> Result<SeqId, EngineError> {
        self.check_ids(ids)?;
        let ctx = self.model.config().context_len;
        if ids.len() > ctx {
            return Err(EngineError::PrefixTooLong {
                len: ids.len(),
                context: ctx,
            });
        }
        let mut kv = self.new_kv();
        for chunk in ids.chunks(self.config.prefill_chunk) {
            self.reserve(&kv, chunk.len())?;
            let mut steps = [SeqStep {
                tokens: chunk,
                kv: &mut kv,
                logits: Logits::None,
            }];
            self.model.forward(&mut steps, &mut self.scratch)?;
        }
        let id = self.store.insert(kv);
        self.stored_ids.insert(id, Arc::new(ids.to_vec()));
        Ok(id)
    }

    /// A new stored sequence sharing `id`'s positions.
    pub fn fork(&mut self, id: SeqId) -> Result<SeqId, EngineError> {
        let new = self
            .store
            .fork(id)
            .ok_or(EngineError::UnknownSequence(id))?;
        if let Some(ids) = self.stored_ids.get(&id).cloned() {
            self.stored_ids.insert(new, ids);
        }
        Ok(new)
    }

    /// Drops a stored sequence.
    pub fn release(&mut self, id: SeqId) -> Result<(), EngineError> {
        self.stored_ids.remove(&id);
        self.store
            .remove(id)
            .map(|_| ())
            .ok_or(EngineError::UnknownSequence(id))
    }

    /// Positions held by a stored sequence.
    pub fn seq_len(&self, id: SeqId) -> Option<usize> {
        self.store.get(id).map(|kv| kv.len())
    }

    /// The greedy prediction after each position of `ids` from `from` on (teacher forcing):
    /// element `i` is the argmax of the logits after `ids[..=from + i]`.
    pub fn next_token_argmax(&mut self, ids: &[u32], from: usize) -> Result<Vec<u32>, EngineError> {
        self.check_ids(ids)?;
        let vocab = self.model.config().vocab_size;
        let from = from.min(ids.len());
        let mut kv = self.new_kv();
        let mut out = Vec::with_capacity(ids.len() - from);
        let chunk = self.config.prefill_chunk.min(64);
        for (part, logits) in [(&ids[..from], Logits::None), (&ids[from..], Logits::All)] {
            for c in part.chunks(chunk) {
                self.reserve(&kv, c.len())?;
                let mut steps = [SeqStep {
                    tokens: c,
                    kv: &mut kv,
                    logits,
                }];
                let rows = self.model.forward(&mut steps, &mut self.scratch)?;
                out.extend(rows.chunks_exact(vocab).map(argmax));
            }
        }
        Ok(out)
    }

    /// Generates a reply for every request; the i-th reply answers the i-th request.
    pub fn generate(
        &mut self,
        requests: &[TokenRequest],
        text: &dyn TextDecoder,
    ) -> Result<Vec<TokenReply>, EngineError> {
        self.generate_with_progress(requests, text, &mut |_| {})
    }

    /// [`Decoder::generate`], calling `done(i)` as soon as request `i` has its reply.
    pub fn generate_with_progress(
        &mut self,
        requests: &[TokenRequest],
        text: &dyn TextDecoder,
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<TokenReply>, EngineError> {
        // Streamed requests' log-probabilities are keyed by their ids, not these indices.
        let streamed_logprobs = std::mem::take(&mut self.logprobs);
        let result = self.generate_flight(requests, text, done);
        self.logprobs = streamed_logprobs;
        result
    }

    fn generate_flight(
        &mut self,
        requests: &[TokenRequest],
        text: &dyn TextDecoder,
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<TokenReply>, EngineError> {
        // Every request is checked before any is generated.
        let mut flight = Flight::default();
        for (i, r) in requests.iter().enumerate() {
            let grammar = self.check_request(i, r)?;
            flight.queue.push_back(Queued {
                id: i as u64,
                req: r.clone(),
                grammar,
            });
        }
        let mut replies: Vec<Option<TokenReply>> = vec![None; requests.len()];
        let mut finished = Vec::new();
        while flight.len() > 0 {
            self.step_flight(&mut flight, text, &mut finished)?;
            self.publish_draft_stats();
            for (id, reply) in finished.drain(..) {
                let i = id as usize;
                replies[i] = Some(reply);
                done(i);
            }
        }
        replies
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.ok_or(EngineError::Internal(format!("request {i} got no reply"))))
            .collect()
    }

    /// Streaming: checks `request` and queues it under the caller's `id` (unique among the
    /// requests in flight). [`Decoder::step`] admits it into the batch when a slot is free; it
    /// decodes beside whatever else is in flight, and its tokens are the ones
    /// [`Decoder::generate`] would give it alone. A request that cannot be generated (empty
    /// prompt, unknown token or prefix, a constraint that does not compile) is refused here,
    /// reported as request 0, and nothing is queued.
    pub fn submit(&mut self, id: u64, request: TokenRequest) -> Result<(), EngineError> {
        let grammar = self.check_request(0, &request)?;
        self.flight.queue.push_back(Queued {
            id,
            req: request,
            grammar,
        });
        Ok(())
    }

    /// Streaming: fills free batch slots from the submitted requests, runs one forward pass
    /// and returns the requests that finished, by id (possibly none).
    pub fn step(&mut self, text: &dyn TextDecoder) -> Result<Vec<(u64, TokenReply)>, EngineError> {
        let mut flight = std::mem::take(&mut self.flight);
        let mut finished = Vec::new();
        let result = self.step_flight(&mut flight, text, &mut finished);
        self.publish_draft_stats();
        self.flight = flight;
        result.map(|()| finished)
    }

    /// Streamed requests submitted and not yet returned by [`Decoder::step`].
    pub fn in_flight(&self) -> usize {
        self.flight.len()
    }

    /// [`Decoder::submit`], recording each generated token's log-probability and its `top`
    /// most likely alternatives ([`Decoder::logprobs`], [`Decoder::take_logprobs`]).
    pub fn submit_with_logprobs(
        &mut self,
        id: u64,
        request: TokenRequest,
        top: usize,
    ) -> Result<(), EngineError> {
        self.submit(id, request)?;
        self.logprobs.insert(id, (top, Vec::new()));
        Ok(())
    }

    /// The log-probabilities recorded so far for a streamed request (see
    /// [`Decoder::submit_with_logprobs`]), one per generated token.
    pub fn logprobs(&self, id: u64) -> Option<&[TokenLogprob]> {
        self.logprobs.get(&id).map(|(_, v)| v.as_slice())
    }

    /// Hands over (and forgets) a streamed request's log-probabilities, once it is finished.
    pub fn take_logprobs(&mut self, id: u64) -> Option<Vec<TokenLogprob>> {
        self.logprobs.remove(&id).map(|(_, v)| v)
    }

    /// The tokens a streamed request has generated so far; `None` when it is not decoding
    /// (still queued, finished, or unknown).
    pub fn partial_output(&self, id: u64) -> Option<&[u32]> {
        self.flight
            .active
            .iter()
            .find(|a| a.id == id)
            .map(|a| a.out.as_slice())
    }

    /// Drops a streamed request, queued or decoding (its caller went away): its slot and KV
    /// blocks are free for the next step. Returns whether it was in flight. The other
    /// requests' tokens do not change (rows are computed independently).
    pub fn cancel(&mut self, id: u64) -> bool {
        self.logprobs.remove(&id);
        let before = self.flight.len();
        self.flight.queue.retain(|q| q.id != id);
        self.flight.active.retain(|a| a.id != id);
        self.flight.len() != before
    }

    /// Checks a request before it is queued; returns its grammar state when it is constrained.
    fn check_request(
        &self,
        index: usize,
        r: &TokenRequest,
    ) -> Result<Option<ConstraintState>, EngineError> {
        if r.prompt_ids.is_empty() {
            return Err(EngineError::EmptyPrompt { index });
        }
        self.check_ids(&r.prompt_ids)?;
        if let Some(k) = r.draft_tokens.filter(|&k| k > 0) {
            if self.drafting.is_none() {
                return Err(EngineError::DraftsRefused(format!(
                    "request {index} asks for up to {k} drafted tokens per step, but this \
                     decoder drafts nothing (start it with --draft lookup or --draft MODEL)"
                )));
            }
        }
        if let Some(p) = r.prefix {
            if self.store.get(p).is_none() {
                return Err(EngineError::UnknownSequence(p));
            }
        }
        match &r.params.constraint {
            None => Ok(None),
            Some(c) => {
                let compiler =
                    self.constraints
                        .as_ref()
                        .ok_or_else(|| EngineError::Constraint {
                            index,
                            msg: "this engine has no tokenizer to constrain with".into(),
                        })?;
                Ok(Some(
                    compiler
                        .start(c)
                        .map_err(|msg| EngineError::Constraint { index, msg })?,
                ))
            }
        }
    }

    /// One scheduling step over `flight`: admit queued requests while the batch has room
    /// (answering at once those with nothing to generate), run one forward pass over the
    /// active sequences, sample, and move the finished ones to `finished`.
    fn step_flight(
        &mut self,
        flight: &mut Flight,
        text: &dyn TextDecoder,
        finished: &mut Vec<(u64, TokenReply)>,
    ) -> Result<(), EngineError> {
        let ctx = self.model.config().context_len;
        let vocab = self.model.config().vocab_size;
        let active = &mut flight.active;
        while active.len() < self.config.batch_size {
            // On a device, a request waits until the blocks it may need (prompt and every new
            // token, within the context) are free beside those the running sequences may still
            // need: running ones then always finish, and free theirs. Alone, a request is
            // admitted whatever its need (it may stop early; if not, the step below fails).
            if let (false, Some(q), true) = (
                active.is_empty(),
                flight.queue.front(),
                self.cache_storage_free().is_some(),
            ) {
                let running: usize = active.iter().map(|a| a.blocks_to_finish(ctx)).sum();
                let own = (q.req.prompt_ids.len() + q.req.params.max_new_tokens)
                    .min(ctx)
                    .div_ceil(BLOCK_TOKENS)
                    + 1;
                let want = running + own;
                if self.free_blocks(want).is_some_and(|free| free < want) {
                    break;
                }
            }
            let Some(Queued {
                id,
                req: r,
                grammar,
            }) = flight.queue.pop_front()
            else {
                break;
            };
            let kv = match r.prefix {
                Some(p) => self.store.get(p).map(SeqKv::fork),
                None => Some(self.new_kv()),
            };
            let mut kv = kv.ok_or(EngineError::UnknownSequence(r.prefix.unwrap_or(SeqId(0))))?;
            let now = Instant::now();
            let early = if r.params.max_new_tokens == 0 {
                Some(StopReason::MaxTokens)
            } else if kv.len() + r.prompt_ids.len() > ctx {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            if let Some(stop_reason) = early {
                finished.push((
                    id,
                    TokenReply {
                        output_ids: Vec::new(),
                        text: String::new(),
                        stop_reason,
                        reasoning_tokens: r.reasoning.as_ref().map(|_| 0),
                        prefill_ms: 0.0,
                        decode_ms: 0.0,
                    },
                ));
                continue;
            }
            // A prompt of its own (no stored prefix) may start from cached blocks.
            let cacheable = r.prefix.is_none() && self.cache.enabled();
            let mut feed = r.prompt_ids.clone();
            let mut pauses = Vec::new();
            if cacheable {
                let matched;
                (kv, matched) = self.cache.lookup_matched(&r.prompt_ids);
                feed.drain(..kv.len());
                if self.model.state_len() > 0 {
                    // Where the other prompts held now (queued, or running with a prompt
                    // of their own) resume from this one: each finds a snapshot there.
                    let known = flight
                        .queue
                        .iter()
                        .filter(|q| q.req.prefix.is_none())
                        .map(|q| &q.req.prompt_ids)
                        .chain(active.iter().filter_map(|a| a.cached_prompt.as_ref()))
                        .map(|other| resume_point(&r.prompt_ids, other));
                    pauses = snapshot_points(kv.len(), matched, r.prompt_ids.len(), known);
                }
            }
            self.stats.add(PrefillStats {
                computed: feed.len() as u64,
                reused: (r.prompt_ids.len() - feed.len()) as u64,
            });
            let mut history = match r.prefix.and_then(|p| self.stored_ids.get(&p)) {
                Some(ids) => ids.as_ref().clone(),
                None => Vec::new(),
            };
            history.extend_from_slice(&r.prompt_ids);
            let k0 = self
                .drafting
                .as_ref()
                .map_or(0, |d| r.draft_tokens.unwrap_or(d.config.tokens));
            active.push(Active {
                id,
                kv,
                feed,
                fed: 0,
                out: Vec::new(),
                cached_prompt: cacheable.then(|| r.prompt_ids.clone()),
                admitted: now,
                first_token: None,
                grammar,
                gate: r.reasoning.map(GateState::new),
                params: r.params,
                history,
                drafted: 0,
                draft: SeqDraft::new(k0),
                draft_max: k0,
                pauses,
                reply_state: None,
            });
        }
        if active.is_empty() {
            return Ok(());
        }
        self.add_drafts(active, ctx)?;

        // Plan the step: each sequence's next rows, within the step budget.
        let mut budget = self.config.max_step_tokens;
        let mut plan: Vec<(usize, usize, bool)> = Vec::with_capacity(active.len());
        for (a_idx, a) in active.iter().enumerate() {
            let left = a.feed.len() - a.fed;
            let n = a.rows(self.config.prefill_chunk, budget);
            if n == 0 {
                continue;
            }
            budget -= n;
            plan.push((a_idx, n, n == left));
        }
        // On a device, the step takes only the sequences whose new blocks are free (in order;
        // the rest wait a step: rows are computed independently, so waiting changes no token).
        let want: usize = plan
            .iter()
            .map(|&(i, n, _)| active[i].kv.blocks_to_grow(n))
            .sum();
        if let Some(mut free) = self.free_blocks(want).filter(|&free| free < want) {
            let first = plan
                .first()
                .map_or(0, |&(i, n, _)| active[i].kv.blocks_to_grow(n));
            plan.retain(|&(i, n, _)| {
                let w = active[i].kv.blocks_to_grow(n);
                let fits = w <= free;
                if fits {
                    free -= w;
                }
                fits
            });
            if plan.is_empty() {
                return Err(EngineError::KvFull { want: first, free });
            }
        }
        let decode = self.drafting.is_some()
            && plan
                .iter()
                .all(|&(i, n, last)| last && n == active[i].drafted + 1);
        let mut steps: Vec<SeqStep<'_, SeqKv>> = Vec::with_capacity(plan.len());
        let mut planned = plan.iter().peekable();
        for (a_idx, a) in active.iter_mut().enumerate() {
            let Some(&&(p_idx, n, last)) = planned.peek() else {
                break;
            };
            if p_idx != a_idx {
                continue;
            }
            planned.next();
            steps.push(SeqStep {
                tokens: &a.feed[a.fed..a.fed + n],
                kv: &mut a.kv,
                logits: match (last, a.drafted) {
                    (false, _) => Logits::None,
                    (true, 0) => Logits::Last,
                    (true, _) => Logits::All,
                },
            });
        }
        // Decode steps (every sequence's last rows: its token and any drafts) are timed for
        // drafting's cost model.
        let (seqs, rows) = (steps.len(), plan.iter().map(|&(_, n, _)| n).sum::<usize>());
        let t0 = decode.then(Instant::now);
        let logits = self.model.forward(&mut steps, &mut self.scratch)?;
        drop(steps);
        if let Some(t0) = t0 {
            self.step_costs
                .observe(seqs, rows, t0.elapsed().as_secs_f64());
        }

        // Sample for every sequence that fed its last pending token: one token per row
        // returned, in order, while the drafted tokens fed equal the tokens picked.
        let mut row = 0;
        let mut retired: Vec<usize> = Vec::new();
        for &(a_idx, n, last) in &plan {
            let a = &mut active[a_idx];
            if !last {
                a.fed += n;
                if a.pauses.first() == Some(&a.kv.len()) {
                    a.pauses.remove(0);
                    if let Some(prompt) = &a.cached_prompt {
                        // Its blocks so far, and a snapshot of the state at their end.
                        self.cache.insert(prompt, &a.kv);
                    }
                }
                continue;
            }
            if a.cached_prompt.is_some()
                && !a.out.is_empty()
                && self.model.state_len() > 0
                && a.kv.len().is_multiple_of(BLOCK_TOKENS)
            {
                // One state copy per block of reply (drafts are off for these models, so
                // the sequence moved one position; a device's state is read back).
                let at = a.kv.len();
                match &mut a.reply_state {
                    Some((pos, state)) => {
                        *pos = at;
                        a.kv.state_snapshot_into(state);
                    }
                    None => a.reply_state = Some((at, a.kv.state_snapshot())),
                }
            }
            // Positions before this step's rows; the sequence's own rows returned.
            let base = a.kv.len() - n;
            let drafted = a.drafted;
            let rows = if drafted > 0 { n } else { 1 };
            let fed_drafts: Vec<u32> = a.feed[a.feed.len() - drafted..].to_vec();
            a.fed += n;
            a.drafted = 0;
            let mut finished_here = None;
            let mut next = None;
            let mut accepted = 0;
            for i in 0..rows {
                let lrow = &logits[(row + i) * vocab..(row + i + 1) * vocab];
                let step = a.out.len() as u64;
                if let (0, Some(prompt)) = (step, &a.cached_prompt) {
                    // The prompt is computed: later requests may start from it.
                    self.cache.insert(prompt, &a.kv);
                }
                let tok = pick(
                    &mut self.sampler,
                    &self.stop_ids,
                    self.logprobs.get_mut(&a.id),
                    a,
                    lrow,
                );
                a.first_token.get_or_insert_with(Instant::now);
                // The positions plain decoding would hold now: those before this token.
                let kv_len = base + n - drafted + i;
                if let Some(reply) = stop_check(a, &self.stop_ids, ctx, text, tok.is_none(), kv_len)
                {
                    finished_here = Some((kv_len, reply));
                    break;
                }
                // `tok` is set: without a token the grammar ended and the check stopped.
                next = tok;
                if i < drafted && tok == Some(fed_drafts[i]) {
                    accepted += 1;
                    continue;
                }
                break;
            }
            row += rows;
            if drafted > 0 {
                self.draft_stats.add(DraftStats {
                    verify_steps: 1,
                    drafted: drafted as u64,
                    accepted: accepted as u64,
                    tokens: (accepted + 1) as u64,
                    ..DraftStats::default()
                });
                if let Some(d) = &self.drafting {
                    if d.config.adaptive {
                        let row_cost = self.step_costs.row_cost(seqs).filter(|_| draft_cost_on());
                        a.draft.adapt(drafted, accepted, a.draft_max, row_cost);
                    }
                }
            }
            match finished_here {
                Some((kv_len, reply)) => {
                    // Rejected drafts' positions are forgotten, not copied.
                    a.kv.truncate(kv_len);
                    if let Some(prompt) = a.cached_prompt.take() {
                        // Prompt and reply: the next turn of a dialogue extends them (a
                        // hybrid model's from the reply's last block boundary).
                        let mut ids = prompt;
                        ids.extend_from_slice(&a.out);
                        match a.reply_state.take() {
                            Some((at, state)) if !a.kv.len().is_multiple_of(BLOCK_TOKENS) => {
                                self.cache.insert_with_state(&ids, &a.kv, at, &state)
                            }
                            _ => self.cache.insert(&ids, &a.kv),
                        }
                    }
                    finished.push((a.id, reply));
                    retired.push(a_idx);
                }
                None => {
                    // Keep the positions of the fed token and the accepted drafts only.
                    a.kv.truncate(base + n - drafted + accepted);
                    let known = a.history.len() - 1;
                    a.draft.rollback(known);
                    a.feed.clear();
                    a.feed.extend(next);
                    a.fed = 0;
                }
            }
        }
        for &a_idx in retired.iter().rev() {
            active.remove(a_idx);
        }
        Ok(())
    }

    fn publish_draft_stats(&self) {
        if let Some(sink) = &self.draft_sink {
            if let Ok(mut s) = sink.lock() {
                *s = self.draft_stats;
            }
        }
    }

    /// Appends drafted tokens to the feed of sequences about to decode one token, within the
    /// step's row budget, unless more sequences decode than drafting pays for.
    fn add_drafts(&mut self, active: &mut [Active], ctx: usize) -> Result<(), EngineError> {
        let Some(drafting) = self.drafting.as_mut() else {
            return Ok(());
        };
        let decoding = |a: &Active| a.fed == 0 && a.feed.len() == 1 && !a.out.is_empty();
        let n_decoding = active.iter().filter(|a| decoding(a)).count();
        if n_decoding == 0 {
            return Ok(());
        }
        if n_decoding > drafting.config.max_batch {
            self.draft_stats.skipped_steps += 1;
            return Ok(());
        }
        // The plan's budget, as `step_flight` will spend it: each sequence's pending rows in
        // order, and its draft after its token.
        let mut budget = self.config.max_step_tokens;
        let mut grant = vec![0usize; active.len()];
        for (i, a) in active.iter().enumerate() {
            let n = a.rows(self.config.prefill_chunk, budget);
            budget -= n;
            if decoding(a) && a.drafted == 0 && n == 1 {
                // At most the tokens still to generate after this one, within the context.
                let room = ctx.saturating_sub(a.kv.len() + 1);
                let to_go = a.params.max_new_tokens.saturating_sub(a.out.len() + 1);
                let k = a
                    .draft
                    .k
                    .min(room)
                    .min(to_go)
                    .min(budget)
                    .min(self.config.prefill_chunk - 1);
                grant[i] = k;
                budget -= k;
            }
        }
        let started = Instant::now();
        let drafts: Vec<Vec<u32>> = match &mut drafting.model {
            None => active
                .iter()
                .zip(&grant)
                .map(|(a, &k)| lookup(&a.history, k))
                .collect(),
            Some(model) => {
                let mut asks: Vec<DraftAsk<'_>> = Vec::new();
                let mut owners = Vec::new();
                for (i, (a, &k)) in active.iter_mut().zip(&grant).enumerate() {
                    if k == 0 {
                        continue;
                    }
                    owners.push(i);
                    asks.push(DraftAsk {
                        history: &a.history,
                        state: &mut a.draft,
                        k,
                        params: &a.params,
                        step: a.out.len() as u64,
                    });
                }
                let proposed = model.propose(&mut asks)?;
                let mut all = vec![Vec::new(); active.len()];
                for (i, p) in owners.into_iter().zip(proposed) {
                    all[i] = p;
                }
                all
            }
        };
        self.draft_stats.draft_us += started.elapsed().as_micros() as u64;
        for (a, d) in active.iter_mut().zip(drafts) {
            if d.is_empty() {
                continue;
            }
            a.drafted = d.len();
            a.feed.extend(d);
        }
        Ok(())
    }
}

/// Picks a sequence's next token from its logits row `lrow` (the reasoning gate's forced
/// tokens, the grammar's mask, then sampling at the sequence's own output position), records
/// its log-probability when asked, and appends it to the output and the history. `None` when
/// the grammar is complete and the model has no stop token to end it with.
fn pick(
    sampler: &mut Sampler,
    stop_ids: &[u32],
    logprobs: Option<&mut (usize, Vec<TokenLogprob>)>,
    a: &mut Active,
    lrow: &[f32],
) -> Option<u32> {
    let params = &a.params;
    let step = a.out.len() as u64;
    // A reasoning budget that is reached forces the block's closing tokens.
    let forced = a.gate.as_ref().and_then(GateState::forced);
    // Inside a reasoning block the grammar waits; on a reply's first token the block's
    // open is allowed beside the grammar's tokens.
    let grammar_applies = a.gate.as_ref().is_none_or(GateState::grammar_applies);
    let open_choice = a.gate.as_ref().and_then(GateState::open_choice);
    let allowed = match (forced, grammar_applies) {
        (Some(_), _) | (None, false) => None,
        (None, true) => a.grammar.as_mut().map(|g| g.allowed(stop_ids)),
    };
    let allowed = match (allowed, open_choice) {
        (Some(Allowed::Tokens(mut ids)), Some(open)) => {
            ids.push(open);
            ids.sort_unstable();
            ids.dedup();
            Some(Allowed::Tokens(ids))
        }
        (Some(Allowed::StopOnly), Some(open)) => {
            let mut ids = stop_ids.to_vec();
            ids.push(open);
            ids.sort_unstable();
            ids.dedup();
            Some(Allowed::Tokens(ids))
        }
        (allowed, _) => allowed,
    };
    // The only place a constraint acts: the request's own mask, whatever the batch.
    let tok = match allowed {
        _ if forced.is_some() => forced,
        None => Some(sampler.sample(lrow, params, step)),
        Some(Allowed::Tokens(ids)) if ids.len() == 1 => Some(ids[0]),
        Some(Allowed::Tokens(ids)) if params.temperature > 0.0 => {
            Some(sampler.sample(&masked_logits(lrow, &ids), params, step))
        }
        Some(Allowed::Tokens(ids)) => Some(masked_argmax(lrow, &ids)),
        Some(Allowed::StopOnly) if stop_ids.is_empty() => None,
        Some(Allowed::StopOnly) => Some(masked_argmax(lrow, stop_ids)),
    };
    if let (Some(tok), Some((top, entries))) = (tok, logprobs) {
        entries.push(token_logprob(lrow, tok, *top));
    }
    if let Some(tok) = tok {
        a.out.push(tok);
        a.history.push(tok);
        let answer = a.gate.as_mut().is_none_or(|g| g.consume(tok));
        if answer && !stop_ids.contains(&tok) {
            if let Some(g) = a.grammar.as_mut() {
                g.consume(tok);
            }
        }
    }
    tok
}

/// Whether a sequence is done after its latest token; if so, its reply.
fn stop_check(
    a: &Active,
    stop_ids: &[u32],
    ctx: usize,
    text: &dyn TextDecoder,
    grammar_done: bool,
    kv_len: usize,
) -> Option<TokenReply> {
    let mut reason = None;
    let mut body = &a.out[..];
    if grammar_done {
        // The grammar is complete and the model has no stop token to end it with.
        reason = Some(StopReason::Eos);
    } else if stop_ids.contains(a.out.last()?) {
        reason = Some(StopReason::Eos);
        body = &a.out[..a.out.len() - 1];
    }
    let mut decoded = None;
    if reason.is_none() && !a.params.stop_strings.is_empty() {
        let t = text.decode(body);
        if let Some(cut) = first_stop(&t, &a.params.stop_strings) {
            reason = Some(StopReason::StopString);
            decoded = Some(t[..cut].to_string());
        } else {
            decoded = Some(t);
        }
    }
    if reason.is_none() && a.out.len() >= a.params.max_new_tokens {
        reason = Some(StopReason::MaxTokens);
    }
    // The next token would need position `kv.len()`, which must be inside the context.
    if reason.is_none() && kv_len >= ctx {
        reason = Some(StopReason::ContextFull);
    }
    let stop_reason = reason?;
    let text = decoded.unwrap_or_else(|| text.decode(body));
    let end = Instant::now();
    let first = a.first_token.unwrap_or(end);
    Some(TokenReply {
        output_ids: a.out.clone(),
        text,
        stop_reason,
        reasoning_tokens: a.gate.as_ref().map(GateState::reasoning_tokens),
        prefill_ms: first.duration_since(a.admitted).as_secs_f64() * 1e3,
        decode_ms: end.duration_since(first).as_secs_f64() * 1e3,
    })
}

/// Byte offset of the earliest occurrence of any stop string.
pub fn first_stop(text: &str, stops: &[String]) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
}

impl ChatReply {
    /// The chat reply to `prompt_ids` that the token-level reply `t` gives.
    pub fn from_tokens(prompt_ids: Vec<u32>, t: &TokenReply) -> ChatReply {
        ChatReply {
            prompt_ids,
            output_ids: t.output_ids.clone(),
            text: t.text.clone(),
            stop_reason: t.stop_reason,
            reasoning: None,
        }
    }
}

/// Whether a draft's length is capped by the measured cost of a verified row (the default);
/// `CANDOR_DRAFT_COST=0` keeps the length rule alone, for measuring the two side by side.
/// Tokens do not depend on it.
fn draft_cost_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("CANDOR_DRAFT_COST").as_deref() != Ok("0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_stop_picks_the_earliest() {
        let stops = vec!["\n\n".to_string(), "END".to_string(), String::new()];
        assert_eq!(first_stop("abc END x\n\n", &stops), Some(4));
        assert_eq!(first_stop("a\n\nEND", &stops), Some(1));
        assert_eq!(first_stop("nothing", &stops), None);
    }
}
