//! Fakes at the runner's seams: a scripted model whose replies are a hash of the prompt, and a
//! toy protocol (a two-turn dialogue per candidate, then one judge step per candidate).
//!
//! They let the runner, resume and the `candor run` command be tested without weights: the
//! fake's reply to a request depends only on the model's label and the request, exactly the
//! property the real engine guarantees, so batch size and resume must not change a byte. The
//! toy protocol ([`Toy`]) is reachable from the command line as the hidden `toy` protocol with
//! models named `fake:<label>`. None of this is used by the real protocols, and none of it is
//! built without the `testkit` feature (which only the tests enable).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::model_pool::Models;
use super::BoxError;
use crate::bench::plan::{Actor, Plan, Step, Transcript};
use crate::bench::protocol::{
    Candidates, Prepared, Protocol, ProtocolError, ProtocolOptions, RunContext, Scored,
};
use crate::bench::stats::bootstrap_mean;
use crate::bench::stats::Metric;
use crate::bench::table::{Cell, Table};
use crate::bench::BenchResults;
use crate::engine::{ChatReply, ChatRequest, Generate, SamplingParams, StopReason};
use crate::judge::Verdict;
use crate::text::message::Message;

/// A request whose messages contain this is refused by the fake model (a request error).
pub const FAIL_MARKER: &str = "<refuse>";
/// A request whose messages contain this fails the fake model's preflight, as a chat template
/// that raises does (e.g. a Mistral-style template given a system message).
pub const TEMPLATE_MARKER: &str = "<template-raises>";
/// A request whose messages contain this fails the fake model's preflight, as a tokenizer
/// error does.
pub const TOKENIZER_MARKER: &str = "<tokenizer-fails>";
/// A request whose messages contain this gets what the engine returns for a prompt longer
/// than the context: an empty `context_full` reply.
pub const OVERFLOW_MARKER: &str = "<too-long>";

/// Counters shared by a fake model family, for tests to inspect.
#[derive(Debug, Default)]
pub struct FakeStats {
    /// `generate_chat` and `poll` calls.
    pub calls: AtomicUsize,
    /// Requests answered.
    pub requests: AtomicUsize,
    /// Largest batch seen: requests of one `generate_chat` call, or streamed requests in
    /// flight at once.
    pub max_batch: AtomicUsize,
    /// What the streamed requests did, in order: [`FakeEvent::Start`] when a request is
    /// started, [`FakeEvent::Finish`] when `poll` returns its reply.
    pub events: Mutex<Vec<FakeEvent>>,
    /// Generators alive now, and the most ever alive at once.
    pub alive: AtomicUsize,
    pub max_alive: AtomicUsize,
    /// The actors loaded, in order.
    pub loads: Mutex<Vec<Actor>>,
}

/// A streamed request started or finished; `text` is its last message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeEvent {
    Start { label: String, text: String },
    Finish { label: String, text: String },
}

/// Why the fake model refused.
#[derive(Debug, thiserror::Error)]
pub enum FakeError {
    #[error("the fake model refuses requests containing {FAIL_MARKER:?}")]
    Refused,
    #[error("the fake model broke down after {0} calls")]
    Broken(usize),
}

/// A scripted model: the reply is derived from a hash of (label, messages, params).
#[derive(Debug)]
pub struct HashGenerate {
    label: String,
    delay: Duration,
    stats: Arc<FakeStats>,
    /// Fail with [`FakeError::Broken`] once this many calls were made (engine failure).
    break_after: Option<usize>,
    /// Streamed requests in flight: id, reply, polls still needed, last message.
    flight: Vec<(u64, ChatReply, usize, String)>,
}

impl HashGenerate {
    /// Counts a call, sleeps the delay, and fails once `break_after` calls were made.
    fn call(&self) -> Result<(), FakeError> {
        let calls = self.stats.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.break_after.is_some_and(|n| calls > n) {
            return Err(FakeError::Broken(calls - 1));
        }
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        Ok(())
    }

    fn event(&self, e: FakeEvent) {
        if let Ok(mut events) = self.stats.events.lock() {
            events.push(e);
        }
    }
}

/// How many `poll` calls the fake takes to answer a request streamed to it: 1 to 5, a hash
/// of the request like the reply (so replies finish out of order, as the engine's do).
pub fn fake_polls(label: &str, req: &ChatRequest) -> usize {
    let mut h = Sha256::new();
    h.update(b"polls");
    h.update(label.as_bytes());
    h.update(serde_json::to_vec(&req.messages).unwrap_or_default());
    h.update(serde_json::to_vec(&req.params).unwrap_or_default());
    1 + (h.finalize()[0] % 5) as usize
}

fn refuses(req: &ChatRequest) -> bool {
    req.messages.iter().any(|m| m.content.contains(FAIL_MARKER))
}

impl Drop for HashGenerate {
    fn drop(&mut self) {
        self.stats.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

const WORDS: [&str; 16] = [
    "alpha", "bravo", "cedar", "delta", "ember", "fjord", "gamma", "harbor", "ivory", "jade",
    "kelp", "lumen", "maple", "nadir", "opal", "prism",
];

/// The fake's reply to one request.
pub fn fake_reply(label: &str, req: &ChatRequest) -> ChatReply {
    let mut h = Sha256::new();
    h.update(label.as_bytes());
    h.update(serde_json::to_vec(&req.messages).unwrap_or_default());
    h.update(serde_json::to_vec(&req.params).unwrap_or_default());
    let d = h.finalize();
    let words: Vec<&str> = d[2..6].iter().map(|b| WORDS[(b % 16) as usize]).collect();
    let mut text = format!("{label}: {}", words.join(" "));
    if d[1] % 5 != 0 {
        text.push_str(&format!(". score: {}", d[0] % 11));
    }
    let prompt_len: usize = req.messages.iter().map(|m| m.content.len() / 4 + 4).sum();
    if req
        .messages
        .iter()
        .any(|m| m.content.contains(OVERFLOW_MARKER))
    {
        return ChatReply {
            prompt_ids: vec![0; 9000],
            output_ids: Vec::new(),
            text: String::new(),
            stop_reason: StopReason::ContextFull,
            reasoning: None,
        };
    }
    let reply = ChatReply {
        prompt_ids: (0..prompt_len).map(|k| d[k % 32] as u32).collect(),
        output_ids: (0..words.len() + 3)
            .map(|k| d[(k + 7) % 32] as u32)
            .collect(),
        text,
        stop_reason: StopReason::Eos,
        reasoning: None,
    };
    match label.strip_prefix(THINKER) {
        Some(rest) => think(reply, req, rest.contains("cut")),
        None => reply,
    }
}

/// Labels starting with this are thinking models: each reply opens with a `<think>` block
/// that holds a decoy verdict (`score: 0`) before the answer, unless the request turns
/// thinking off (`enable_thinking: false`, as `--thinking off` passes). A label that also
/// contains `cut` is cut inside its reasoning (every reply reaches its token limit there).
pub const THINKER: &str = "thinker";

/// The reasoning the thinking fakes write: a verdict a parser must never read.
pub const DECOY_REASONING: &str = "Draft verdict: score: 0. Let me check again.";

/// A thinking fake's reply: the hash reply as the answer after a reasoning block, split as the
/// engine splits a `<think>` template's replies.
fn think(reply: ChatReply, req: &ChatRequest, cut: bool) -> ChatReply {
    use crate::engine::Reasoning;
    use crate::text::reasoning::ReasoningFormat;
    if req.template.kwargs.get("enable_thinking") == Some(&serde_json::Value::Bool(false)) {
        return reply;
    }
    let raw = match cut {
        true => format!("<think>\n{DECOY_REASONING}"),
        false => format!("<think>\n{DECOY_REASONING}\n</think>\n\n{}", reply.text),
    };
    let split = ReasoningFormat::Think.split(&raw, false);
    let tokens = DECOY_REASONING.split_whitespace().count();
    ChatReply {
        text: split.answer.clone().unwrap_or_default(),
        stop_reason: if cut {
            StopReason::MaxTokens
        } else {
            reply.stop_reason
        },
        reasoning: split.reasoning.map(|text| Reasoning {
            text,
            tokens,
            truncated: split.answer.is_none(),
        }),
        ..reply
    }
}

impl Generate for HashGenerate {
    type Error = FakeError;

    fn generate_chat(&mut self, requests: &[ChatRequest]) -> Result<Vec<ChatReply>, FakeError> {
        self.call()?;
        if requests.iter().any(refuses) {
            return Err(FakeError::Refused);
        }
        self.stats
            .requests
            .fetch_add(requests.len(), Ordering::SeqCst);
        self.stats
            .max_batch
            .fetch_max(requests.len(), Ordering::SeqCst);
        Ok(requests
            .iter()
            .map(|r| fake_reply(&self.label, r))
            .collect())
    }

    /// Refuses at once as [`Generate::generate_chat`] does; else the reply comes after
    /// [`fake_polls`] polls.
    fn start(&mut self, id: u64, request: &ChatRequest) -> Result<Option<ChatReply>, FakeError> {
        if refuses(request) {
            return Err(FakeError::Refused);
        }
        let text = request
            .messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        self.event(FakeEvent::Start {
            label: self.label.clone(),
            text: text.clone(),
        });
        let reply = fake_reply(&self.label, request);
        self.flight
            .push((id, reply, fake_polls(&self.label, request), text));
        self.stats
            .max_batch
            .fetch_max(self.flight.len(), Ordering::SeqCst);
        Ok(None)
    }

    fn poll(&mut self) -> Result<Vec<(u64, ChatReply)>, FakeError> {
        if self.flight.is_empty() {
            return Ok(Vec::new());
        }
        self.call()?;
        // The fewest polls any request still needs: at least one request finishes.
        let step = self.flight.iter().map(|f| f.2).min().unwrap_or(1);
        let mut done = Vec::new();
        let mut k = 0;
        while k < self.flight.len() {
            self.flight[k].2 -= step;
            if self.flight[k].2 == 0 {
                let (id, reply, _, text) = self.flight.remove(k);
                self.event(FakeEvent::Finish {
                    label: self.label.clone(),
                    text,
                });
                done.push((id, reply));
            } else {
                k += 1;
            }
        }
        self.stats.requests.fetch_add(done.len(), Ordering::SeqCst);
        Ok(done)
    }
}

/// Fake models for a run: one label per candidate and one for the judge.
#[derive(Debug, Clone)]
pub struct FakeModels {
    pub candidates: Vec<String>,
    pub judge: String,
    /// Judges 1.. of a panel: `panel[j - 1]` answers `Actor::Panel(j)`.
    pub panel: Vec<String>,
    /// Sleep per `generate_chat` call (lets a test kill a run mid-way).
    pub delay: Duration,
    pub stats: Arc<FakeStats>,
    pub break_after: Option<usize>,
}

impl FakeModels {
    pub fn new(candidates: &[&str], judge: &str) -> Self {
        FakeModels {
            candidates: candidates.iter().map(|s| s.to_string()).collect(),
            judge: judge.to_string(),
            panel: Vec::new(),
            delay: Duration::ZERO,
            stats: Arc::default(),
            break_after: None,
        }
    }

    /// Why the fake's preflight refuses `request`, if it does.
    pub fn preflight_reason(&self, request: &ChatRequest) -> Option<String> {
        let has = |marker: &str| request.messages.iter().any(|m| m.content.contains(marker));
        if has(TEMPLATE_MARKER) {
            Some("chat template raised an exception: Conversation roles must alternate".into())
        } else if has(TOKENIZER_MARKER) {
            Some("tokenizer: the fake tokenizer cannot encode this text".into())
        } else {
            None
        }
    }

    fn label(&self, actor: Actor) -> Option<&str> {
        match actor {
            Actor::Candidate(i) => self.candidates.get(i).map(String::as_str),
            Actor::Judge => Some(&self.judge),
            Actor::Panel(j) => j
                .checked_sub(1)
                .and_then(|i| self.panel.get(i))
                .map(String::as_str),
        }
    }
}

impl Models for FakeModels {
    type Gen = HashGenerate;

    fn load(&mut self, actor: Actor) -> Result<HashGenerate, BoxError> {
        let label = self
            .label(actor)
            .ok_or_else(|| format!("no fake model for {actor:?}"))?
            .to_string();
        if let Ok(mut loads) = self.stats.loads.lock() {
            loads.push(actor);
        }
        let alive = self.stats.alive.fetch_add(1, Ordering::SeqCst) + 1;
        self.stats.max_alive.fetch_max(alive, Ordering::SeqCst);
        Ok(HashGenerate {
            label,
            delay: self.delay,
            stats: self.stats.clone(),
            break_after: self.break_after,
            flight: Vec::new(),
        })
    }

    fn same_model(&self, a: Actor, b: Actor) -> bool {
        self.label(a).is_some() && self.label(a) == self.label(b)
    }

    fn is_request_error(&self, err: &FakeError) -> bool {
        matches!(err, FakeError::Refused)
    }

    fn preflight(&self, _gen: &HashGenerate, request: &ChatRequest) -> Result<(), String> {
        self.preflight_reason(request).map_or(Ok(()), Err)
    }
}

/// One toy question.
#[derive(Debug, Clone, PartialEq)]
pub struct ToyItem {
    pub id: String,
    pub question: String,
}

/// `n` toy items; every seventh (index 5, 12, ...) carries [`FAIL_MARKER`], every eleventh
/// (index 9, 20, ...) [`TEMPLATE_MARKER`] and every thirteenth (index 10, 23, ...)
/// [`OVERFLOW_MARKER`]: a run of 12 items has three failed ones.
pub fn toy_items(n: usize) -> Vec<ToyItem> {
    (0..n)
        .map(|i| {
            let marker = if i % 7 == 5 {
                FAIL_MARKER
            } else if i % 11 == 9 {
                TEMPLATE_MARKER
            } else if i % 13 == 10 {
                OVERFLOW_MARKER
            } else {
                ""
            };
            ToyItem {
                id: format!("toy-{i:03}"),
                question: format!("What is {} plus {}?{marker}", i * 3 % 17, i * 5 % 13),
            }
        })
        .collect()
}

/// Per candidate: `c<k>/turn/1`, then `c<k>/turn/2` (an "are you sure?" follow-up); when
/// every candidate is done, `judge/c<k>` for each.
#[derive(Debug, Clone)]
pub struct ToyPlan {
    pub candidates: usize,
    pub seed: u64,
}

impl ToyPlan {
    fn params(&self, salt: u64) -> SamplingParams {
        SamplingParams {
            seed: self.seed.wrapping_add(salt),
            max_new_tokens: 16,
            ..Default::default()
        }
    }
}

impl Plan for ToyPlan {
    type Item = ToyItem;

    fn item_id(&self, item: &ToyItem) -> String {
        item.id.clone()
    }

    /// Two turns per candidate, then a judgement per candidate.
    fn planned_steps(&self, _item: &ToyItem) -> Option<usize> {
        Some(3 * self.candidates)
    }

    fn next_steps(&self, item: &ToyItem, done: &Transcript) -> Vec<Step> {
        let mut steps = Vec::new();
        let mut all_answered = true;
        for c in 0..self.candidates {
            let t1 = format!("c{c}/turn/1");
            let t2 = format!("c{c}/turn/2");
            let mut messages = vec![
                Message::system("Answer in one short sentence."),
                Message::user(item.question.clone()),
            ];
            match (done.get(&t1), done.get(&t2)) {
                (None, _) => {
                    all_answered = false;
                    steps.push(Step {
                        key: t1,
                        actor: Actor::Candidate(c),
                        messages,
                        params: self.params(1),
                    });
                }
                (Some(first), None) => {
                    all_answered = false;
                    messages.push(Message::assistant(first.text.clone()));
                    messages.push(Message::user("Are you sure? Answer again."));
                    steps.push(Step {
                        key: t2,
                        actor: Actor::Candidate(c),
                        messages,
                        params: self.params(2),
                    });
                }
                (Some(_), Some(_)) => {}
            }
        }
        if !all_answered {
            return steps;
        }
        for c in 0..self.candidates {
            let key = format!("judge/c{c}");
            if done.contains_key(&key) {
                continue;
            }
            let answer = done
                .get(&format!("c{c}/turn/2"))
                .map(|o| o.text.clone())
                .unwrap_or_default();
            steps.push(Step {
                key,
                actor: Actor::Judge,
                messages: vec![Message::user(format!(
                    "Question: {}\nAnswer: {answer}\nRate the answer from 0 to 10 as `score: N`.",
                    item.question
                ))],
                params: self.params(3),
            });
        }
        steps
    }
}

/// The judge's score in 0..=1, or None when its text has no `score: N`.
fn parse_score(text: &str) -> Option<f64> {
    let rest = text.split("score: ").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse::<f64>().ok().map(|x| x / 10.0)
}

/// Scores toy transcripts: per candidate, the mean judge score (unparseable → unscored).
pub fn toy_score(plan: &ToyPlan, finished: &[(&ToyItem, &Transcript)], seed: u64) -> BenchResults {
    let mut metrics = Vec::new();
    let mut rows = Vec::new();
    for c in 0..plan.candidates {
        let mut values = Vec::new();
        let mut unscored = 0;
        for (item, t) in finished {
            let judged = t.get(&format!("judge/c{c}")).and_then(|o| {
                let read = |answer: &str| {
                    parse_score(answer)
                        .map_or_else(|| Verdict::unscored("no score"), Verdict::Scored)
                };
                o.verdict(read).scored().copied()
            });
            match judged {
                Some(v) => values.push(v),
                None => unscored += 1,
            }
            let cell = judged.map_or(Cell::from("unscored"), |v| Cell::num(v, 1));
            rows.push(vec![
                Cell::from(item.id.as_str()),
                format!("c{c}").into(),
                cell,
            ]);
        }
        metrics.push(Metric {
            name: format!("c{c}_score"),
            interval: bootstrap_mean(&values, seed),
            n: values.len(),
            unscored,
        });
    }
    BenchResults {
        metrics,
        tables: vec![Table {
            id: "per_item".into(),
            title: "Per item".into(),
            columns: vec!["item".into(), "candidate".into(), "score".into()],
            rows,
        }],
    }
}

/// The hidden `toy` protocol: a dialogue per candidate and a judge, on built-in items.
#[derive(Debug, Clone, Copy, Default)]
pub struct Toy;

impl Protocol for Toy {
    type Plan = ToyPlan;

    fn name(&self) -> &'static str {
        "toy"
    }

    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    fn candidates(&self) -> Candidates {
        Candidates::Many
    }

    fn prepare(
        &self,
        ctx: &RunContext,
        _opts: &ProtocolOptions,
    ) -> Result<Prepared<ToyPlan>, ProtocolError> {
        if let Some(s) = ctx.subsets.first() {
            return Err(ProtocolError::bad_value(
                "--subset",
                s,
                "the toy protocol has no subsets",
            ));
        }
        Ok(Prepared {
            items: toy_items(ctx.limit.unwrap_or(12)),
            plan: ToyPlan {
                candidates: ctx.candidates.len(),
                seed: ctx.seed,
            },
            data_files: Vec::new(),
            prompt_templates: [("toy/turn", "1"), ("toy/judge", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            settings: serde_json::json!({ "limit": ctx.limit, "candidates": ctx.candidates.len() }),
            decoding: serde_json::json!({ "temperature": 0.0, "max_new_tokens": 16 }),
        })
    }

    fn score(
        &self,
        ctx: &RunContext,
        _opts: &ProtocolOptions,
        prepared: &Prepared<ToyPlan>,
        runs: &[(&ToyItem, &Transcript)],
    ) -> Scored {
        toy_score(&prepared.plan, runs, ctx.seed).into()
    }
}

/// A judge step with one user message and default sampling, for log and resume tests.
pub fn judge_step(key: &str, text: &str) -> Step {
    Step {
        key: key.into(),
        actor: Actor::Judge,
        messages: vec![crate::text::message::Message::user(text)],
        params: crate::engine::SamplingParams::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_reply_depends_on_label_and_request_only() {
        let req = ChatRequest {
            messages: vec![Message::user("hi")],
            params: SamplingParams::default(),
            ..Default::default()
        };
        assert_eq!(fake_reply("a", &req), fake_reply("a", &req));
        assert_ne!(fake_reply("a", &req).text, fake_reply("b", &req).text);
        let seeded = ChatRequest {
            params: SamplingParams {
                seed: 1,
                ..Default::default()
            },
            ..req.clone()
        };
        assert_ne!(fake_reply("a", &req).text, fake_reply("a", &seeded).text);
    }

    #[test]
    fn toy_plan_walks_turns_then_judge() {
        let plan = ToyPlan {
            candidates: 2,
            seed: 0,
        };
        let item = &toy_items(1)[0];
        let mut t = Transcript::new();
        let keys = |s: Vec<Step>| s.into_iter().map(|s| s.key).collect::<Vec<_>>();
        let out = |text: &str| fake_out(text);
        assert_eq!(keys(plan.next_steps(item, &t)), ["c0/turn/1", "c1/turn/1"]);
        t.insert("c0/turn/1".into(), out("x"));
        assert_eq!(keys(plan.next_steps(item, &t)), ["c0/turn/2", "c1/turn/1"]);
        for k in ["c0/turn/2", "c1/turn/1", "c1/turn/2"] {
            t.insert(k.into(), out("y"));
        }
        assert_eq!(keys(plan.next_steps(item, &t)), ["judge/c0", "judge/c1"]);
        t.insert("judge/c0".into(), out("score: 7"));
        t.insert("judge/c1".into(), out("no idea"));
        assert!(plan.next_steps(item, &t).is_empty());
        let r = toy_score(&plan, &[(item, &t)], 1);
        assert_eq!(r.metrics[0].interval.value, 0.7);
        assert_eq!((r.metrics[1].n, r.metrics[1].unscored), (0, 1));
    }

    fn fake_out(text: &str) -> crate::bench::plan::StepOutput {
        crate::bench::plan::StepOutput {
            text: text.into(),
            stop_reason: StopReason::Eos,
            prompt_tokens: 1,
            output_tokens: 1,
            truncated: None,
            reasoning: None,
        }
    }
}
