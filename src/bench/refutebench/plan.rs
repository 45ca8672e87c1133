//! RefuteBench as a [`Plan`]: each item's turns in order, every turn a step `turn/<i>` (its
//! position in the item's `queries`) answered by `Actor::Candidate(0)` with the whole
//! conversation so far, the model's own earlier replies included, and one feedback-acceptance
//! judgement `fa/<i>` by `Actor::Judge` per feedback turn (with a panel of judges, judge
//! `j ≥ 1`'s is `fa/<i>/judge/<j>`, see [`crate::bench::panel`]).
//!
//! What the turns say (which feedback, seeded) comes from [`super::dialogue`]; this module only
//! turns a replay into messages. Two options change the messages:
//!
//! - [`Strategy::Recall`] / [`Strategy::RecallRepeat`], the paper's recall-and-repeat (section
//!   6.3). The authors select earlier instructions with a fine-tuned multilingual BERT
//!   classifier that is not released; Candor uses an open rule instead ([`recall`]): before a
//!   benchmark query (never a chit-chat turn), MT recalls every earlier feedback that maps a
//!   word of the query's source sentence, email every earlier feedback (one domain per item, so
//!   all are viable), QA the single earlier fact sharing the most content words with the
//!   question (at least one; ties go to the later fact), the paper's top-1. Recalled
//!   instructions are wrapped with the authors' templates ([`super::prompts::recall_query`]);
//!   the conversation history keeps the query and the repeat request, as their wrapper does.
//! - [`ContextLimit`]: when the conversation would exceed the model's prompt budget, earlier
//!   exchanges are dropped by one of two policies ([`Truncation`]):
//!   - [`Truncation::Authors`] (default), the authors' `VLLMOENAIModel.truncate_messages`
//!     (`src/model_utils.py`, ElliottYan/RefuteBench @ 24c2135): walking back from the
//!     current message, each message costs its content's tokens plus 5; at the first message
//!     that goes over the budget, it and everything older is cut (a whole exchange, and the
//!     system prompt with it). The budget is the model's maximum length minus 261 (5 + the 256
//!     new tokens), the maximum length being 2,048 for LLaMA-2-class models (set by the caller).
//!   - [`Truncation::Candor`]: whole exchanges (user message and reply) are dropped until the
//!     rendered prompt fits, chit-chat exchanges oldest first, then benchmark queries oldest
//!     first, then feedback exchanges oldest first; the system prompt and the current message
//!     are always kept.
//!
//!   The dropped turns are recorded in the step key: `turn/<i>+dropped=<j>,<k>` (`system`
//!   first in the list when the system prompt was cut), and every run counts the steps that
//!   lost turns (the authors' driver cut them silently).
//! - [`RefutePlan::system_prompt`]: off for a chat template that rejects a system message (the
//!   authors drop it for Mistral); the step key then carries `+no_system`.

use std::sync::Arc;

use serde::Serialize;

use super::checkers::english_words;
use super::data::{Content, Item};
use super::dialogue::{self, source_sentence, End, Replay, ReplayOptions, Turn, TurnKind};
use super::prompts::{self, recall_query};
use super::score::{self, ScoreOptions};
use crate::bench::panel::{judge_actor, Panel};
use crate::bench::plan::{Actor, Plan, Step, Transcript};
use crate::bench::BenchResults;
use crate::engine::SamplingParams;
use crate::text::message::Message;

/// How queries after feedback are asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// As the data gives them (the paper's main results).
    #[default]
    Vanilla,
    /// Recalled instructions before the query.
    Recall,
    /// Recalled instructions, then the query, then the request to repeat them first.
    RecallRepeat,
}

/// Measures a conversation in prompt tokens (the model's chat template and tokenizer,
/// supplied by the caller; it must be deterministic).
pub type TokenCounter = Arc<dyn Fn(&[Message]) -> usize + Send + Sync>;

/// Measures one message's text in tokens (the authors' per-message count).
pub type TextCounter = Arc<dyn Fn(&str) -> usize + Send + Sync>;

/// How a conversation that outgrows the prompt budget is shortened (see the module doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Truncation {
    /// The authors': oldest messages first, system prompt included, counted per message.
    #[default]
    Authors,
    /// Candor's: chit-chat, then queries, then feedback; the system prompt is kept.
    Candor,
}

/// The authors' cost of a message beyond its text (`token_per_turn`).
pub const AUTHORS_TOKENS_PER_TURN: usize = 5;

/// A prompt budget and how to measure against it.
#[derive(Clone)]
pub struct ContextLimit {
    pub max_prompt_tokens: usize,
    /// The rendered conversation's tokens ([`Truncation::Candor`]).
    pub count: TokenCounter,
    /// One message's text's tokens ([`Truncation::Authors`]).
    pub count_text: TextCounter,
}

impl std::fmt::Debug for ContextLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextLimit")
            .field("max_prompt_tokens", &self.max_prompt_tokens)
            .finish_non_exhaustive()
    }
}

/// The RefuteBench plan and its settings.
#[derive(Debug, Clone)]
pub struct RefutePlan {
    pub replay: ReplayOptions,
    pub strategy: Strategy,
    /// Candidate decoding (the authors: temperature 0, top-p 1, at most 256 new tokens).
    pub candidate: SamplingParams,
    /// FA judge decoding (greedy; a Yes/No needs few tokens).
    pub judge: SamplingParams,
    /// Whether to ask the FA judge at all.
    pub judge_feedback: bool,
    /// The FA judges (one, or a panel) and how a panel decides.
    pub panel: Panel,
    pub context: Option<ContextLimit>,
    pub truncation: Truncation,
    /// Whether the item's system prompt is sent (off for templates that reject one).
    pub system_prompt: bool,
}

/// The settings that change a run's results, for the run's manifest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanRecord {
    pub seed: u64,
    pub mt_target: &'static str,
    pub strategy: Strategy,
    pub judge_feedback: bool,
    pub max_prompt_tokens: Option<usize>,
    pub truncation: Truncation,
    pub system_prompt: bool,
    pub candidate: SamplingParams,
    pub judge: SamplingParams,
}

impl RefutePlan {
    /// The paper's decoding, with `seed` for the feedback choices and the requests.
    pub fn new(seed: u64) -> RefutePlan {
        RefutePlan {
            replay: ReplayOptions {
                seed,
                ..ReplayOptions::default()
            },
            strategy: Strategy::Vanilla,
            candidate: SamplingParams {
                temperature: 0.0,
                top_p: 1.0,
                seed,
                max_new_tokens: 256,
                stop_strings: Vec::new(),
                constraint: None,
            },
            judge: SamplingParams {
                temperature: 0.0,
                top_p: 1.0,
                seed,
                max_new_tokens: 16,
                stop_strings: Vec::new(),
                constraint: None,
            },
            judge_feedback: true,
            panel: Panel::default(),
            context: None,
            truncation: Truncation::Authors,
            system_prompt: true,
        }
    }

    pub fn record(&self) -> PlanRecord {
        PlanRecord {
            seed: self.replay.seed,
            mt_target: match self.replay.mt_target {
                dialogue::MtTarget::Dictionary => "dictionary",
                dialogue::MtTarget::Random => "random",
            },
            strategy: self.strategy,
            judge_feedback: self.judge_feedback,
            max_prompt_tokens: self.context.as_ref().map(|c| c.max_prompt_tokens),
            truncation: self.truncation,
            system_prompt: self.system_prompt,
            candidate: self.candidate.clone(),
            judge: self.judge.clone(),
        }
    }

    /// Scores finished dialogues with this plan's feedback choices.
    pub fn score(&self, pairs: &[(&Item, &Transcript)], bootstrap_seed: u64) -> BenchResults {
        let opts = ScoreOptions {
            replay: self.replay,
            bootstrap_seed,
            panel: self.panel,
        };
        score::score(pairs, &opts).results
    }

    /// The user message of a turn as sent, and as kept in later turns' history.
    fn user_forms(&self, item: &Item, earlier: &[Turn], turn: &Turn) -> (String, String) {
        let repeat = match self.strategy {
            Strategy::Vanilla => return (turn.user.clone(), turn.user.clone()),
            Strategy::Recall => false,
            Strategy::RecallRepeat => true,
        };
        let TurnKind::Query {
            chit_chat: false, ..
        } = turn.kind
        else {
            return (turn.user.clone(), turn.user.clone());
        };
        let recalled = recall(item, earlier, &turn.user);
        let texts: Vec<&str> = recalled.iter().map(|t| t.user.as_str()).collect();
        let r = recall_query(&texts, &turn.user, repeat);
        (r.sent, r.kept)
    }

    fn turn_step(&self, item: &Item, replay: &Replay, at: usize) -> Step {
        let (earlier, current) = replay.turns.split_at(at);
        let current = &current[0];
        let mut exchanges: Vec<(usize, Priority, Message, Message)> = Vec::new();
        for (k, t) in earlier.iter().enumerate() {
            let (_, kept) = self.user_forms(item, &earlier[..k], t);
            let reply = t.reply.map(|r| r.text.clone()).unwrap_or_default();
            let priority = match t.kind {
                TurnKind::Query {
                    chit_chat: true, ..
                } => Priority::ChitChat,
                TurnKind::Query { .. } => Priority::Query,
                TurnKind::Feedback { .. } => Priority::Feedback,
            };
            exchanges.push((
                t.index,
                priority,
                Message::user(kept),
                Message::assistant(reply),
            ));
        }
        let (sent, _) = self.user_forms(item, earlier, current);
        let system = Message::system(item.system_prompt.clone());
        let build = |dropped: &[usize], with_system: bool| {
            let mut m = Vec::new();
            if with_system {
                m.push(system.clone());
            }
            for (index, _, u, a) in &exchanges {
                if !dropped.contains(index) {
                    m.push(u.clone());
                    m.push(a.clone());
                }
            }
            m.push(Message::user(sent.clone()));
            m
        };
        let mut dropped: Vec<usize> = Vec::new();
        let mut with_system = self.system_prompt;
        let mut messages = build(&dropped, with_system);
        match (&self.context, self.truncation) {
            (None, _) => {}
            (Some(limit), Truncation::Candor) => {
                let mut order: Vec<(Priority, usize)> =
                    exchanges.iter().map(|(i, p, _, _)| (*p, *i)).collect();
                order.sort();
                for (_, index) in order {
                    if (limit.count)(&messages) <= limit.max_prompt_tokens {
                        break;
                    }
                    dropped.push(index);
                    messages = build(&dropped, with_system);
                }
            }
            (Some(limit), Truncation::Authors) => {
                let cost = |text: &str| (limit.count_text)(text) + AUTHORS_TOKENS_PER_TURN;
                let max = limit.max_prompt_tokens;
                let mut total = cost(&sent);
                // The oldest exchange kept, walking back; everything before it is cut.
                let mut cut = (total > max).then_some(exchanges.len());
                if cut.is_none() {
                    for (pos, (_, _, u, a)) in exchanges.iter().enumerate().rev() {
                        total += cost(&a.content);
                        if total > max {
                            cut = Some(pos + 1);
                            break;
                        }
                        total += cost(&u.content);
                        if total > max {
                            cut = Some(pos + 1);
                            break;
                        }
                    }
                }
                match cut {
                    Some(keep_from) => {
                        dropped = exchanges[..keep_from].iter().map(|e| e.0).collect();
                        with_system = false;
                    }
                    None => {
                        if with_system && total + cost(&system.content) > max {
                            with_system = false;
                        }
                    }
                }
                messages = build(&dropped, with_system);
            }
        }
        let mut key = dialogue::turn_key(current.index);
        if !self.system_prompt {
            key.push_str("+no_system");
        }
        let system_cut = self.system_prompt && !with_system;
        if !dropped.is_empty() || system_cut {
            dropped.sort_unstable();
            let mut list: Vec<String> = dropped.iter().map(usize::to_string).collect();
            if system_cut {
                list.insert(0, "system".to_string());
            }
            key = format!("{key}+dropped={}", list.join(","));
        }
        Step {
            key,
            actor: Actor::Candidate(0),
            messages,
            params: self.candidate.clone(),
        }
    }

    fn fa_step(&self, item: &Item, replay: &Replay, turn: &Turn, judge: usize) -> Option<Step> {
        let TurnKind::Feedback { refutes, .. } = turn.kind else {
            return None;
        };
        let reply = turn.reply?;
        // An empty (never asked) refuted query stays empty in the judge prompt.
        let query = refutes
            .and_then(|i| replay.turns.iter().find(|t| t.index == i))
            .map_or("", |t| t.user.as_str());
        let prompt = prompts::fa_judge_prompt(item.source.task, query, &turn.user, &reply.text);
        Some(Step {
            key: Panel::key(&dialogue::fa_key(turn.index), judge),
            actor: judge_actor(judge),
            messages: vec![Message::user(prompt)],
            params: self.judge.clone(),
        })
    }
}

/// What is dropped first when a conversation outgrows the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Priority {
    ChitChat,
    Query,
    Feedback,
}

impl Plan for RefutePlan {
    type Item = Item;

    fn item_id(&self, item: &Item) -> String {
        item.id.clone()
    }

    fn next_steps(&self, item: &Item, done: &Transcript) -> Vec<Step> {
        let replay = dialogue::replay(item, done, &self.replay);
        let mut steps = Vec::new();
        if self.judge_feedback {
            for turn in replay
                .turns
                .iter()
                .filter(|t| t.is_feedback() && t.reply.is_some())
            {
                for j in 0..self.panel.judges {
                    let key = Panel::key(&dialogue::fa_key(turn.index), j);
                    if dialogue::find_step(done, &key).is_none() {
                        steps.extend(self.fa_step(item, &replay, turn, j));
                    }
                }
            }
        }
        if let End::Waiting(index) = replay.end {
            if let Some(at) = replay.turns.iter().position(|t| t.index == index) {
                steps.push(self.turn_step(item, &replay, at));
            }
        }
        steps
    }
}

/// The open recall rule (see the module doc): the earlier feedback turns to recall before
/// `query`, in dialogue order.
pub fn recall<'t, 'a>(item: &Item, earlier: &'t [Turn<'a>], query: &str) -> Vec<&'t Turn<'a>> {
    let feedback = earlier.iter().filter(|t| t.is_feedback());
    let given = |t: &Turn| match &t.kind {
        TurnKind::Feedback { given, .. } => given.clone(),
        TurnKind::Query { .. } => Vec::new(),
    };
    match &item.content {
        Content::Email(_) => feedback.collect(),
        Content::Mt(_) => {
            let words = english_words(source_sentence(query));
            feedback
                .filter(|t| given(t).iter().any(|g| words.contains(&g.label.as_str())))
                .collect()
        }
        Content::Qa(_) => {
            let q = content_words(query);
            let mut best: Option<(usize, &Turn)> = None;
            for t in feedback {
                let overlap = given(t)
                    .iter()
                    .map(|g| {
                        content_words(&g.label)
                            .iter()
                            .filter(|w| q.contains(w))
                            .count()
                    })
                    .max()
                    .unwrap_or(0);
                if overlap > 0 && best.is_none_or(|(b, _)| overlap >= b) {
                    best = Some((overlap, t));
                }
            }
            best.map(|(_, t)| vec![t]).unwrap_or_default()
        }
    }
}

/// Lower-cased words of a QA text without function words and the question template's words.
fn content_words(text: &str) -> Vec<String> {
    const SKIP: &[&str] = &[
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "is",
        "are",
        "was",
        "were",
        "be",
        "by",
        "for",
        "and",
        "or",
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "where",
        "when",
        "how",
        "name",
        "names",
        "answer",
        "my",
        "questions",
        "question",
        "directly",
        "output",
        "s",
        "that",
        "this",
        "with",
        "as",
        "from",
        "it",
        "its",
    ];
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && !SKIP.contains(w))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::plan::StepOutput;
    use crate::bench::refutebench::data::{parse_reader, Source};
    use crate::text::message::Role;

    fn item(rel: &str, line: &str) -> Item {
        let source = Source::from_rel_path(rel).expect("layout");
        parse_reader(line.as_bytes(), &source, std::path::Path::new(rel))
            .expect("parses")
            .remove(0)
    }

    fn out(text: &str) -> StepOutput {
        StepOutput::scripted(text)
    }

    /// Runs the plan to the end with replies from `reply(key)`; returns the transcript and
    /// every step asked, in order.
    fn drive(
        plan: &RefutePlan,
        item: &Item,
        reply: impl Fn(&str) -> String,
    ) -> (Transcript, Vec<Step>) {
        let mut done = Transcript::new();
        let mut asked = Vec::new();
        for _ in 0..100 {
            let steps = plan.next_steps(item, &done);
            if steps.is_empty() {
                return (done, asked);
            }
            for s in steps {
                assert!(!done.contains_key(&s.key), "{} asked twice", s.key);
                done.insert(s.key.clone(), out(&reply(&s.key)));
                asked.push(s);
            }
        }
        panic!("plan did not finish");
    }

    const QA: &str = r#"{"system_prompt": "You are a helpful assistant.", "feedbacks": "The name of the capital of Freedonia is Port Lumen.", "feedback_prompt": "For all the questions, you should adopt the knowledge: ", "queries": ["Q: What is the capital of Freedonia?", "[MAYBE FEEDBACK]", "Tell me a joke.", "Q: What is the capital of Freedonia?"], "answers": "Port Lumen."}"#;

    #[test]
    fn single_feedback_turns_carry_the_earlier_replies() {
        let it = item("qa/single/qa.memory.NC-1.jsonl", QA);
        let plan = RefutePlan::new(0);
        let (done, asked) = drive(&plan, &it, |k| match k {
            "fa/1" => "Yes".into(),
            "turn/3" => "Port Lumen".into(),
            k => format!("reply {k}"),
        });
        let keys: Vec<&str> = asked.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["turn/0", "turn/1", "fa/1", "turn/2", "turn/3"]);
        let last = &asked[4];
        assert_eq!(last.actor, Actor::Candidate(0));
        let roles: Vec<Role> = last.messages.iter().map(|m| m.role).collect();
        use Role::*;
        assert_eq!(
            roles,
            [System, User, Assistant, User, Assistant, User, Assistant, User]
        );
        assert_eq!(last.messages[2].content, "reply turn/0");
        assert_eq!(
            last.messages[3].content,
            "For all the questions, you should adopt the knowledge: The name of the capital of Freedonia is Port Lumen."
        );
        assert_eq!(last.messages[6].content, "reply turn/2");
        assert_eq!(last.params.max_new_tokens, 256);
        let fa = &asked[2];
        assert_eq!(fa.actor, Actor::Judge);
        assert_eq!(fa.messages.len(), 1);
        assert!(fa.messages[0]
            .content
            .contains("Query: Q: What is the capital of Freedonia?. Request: For all"));
        assert!(fa.messages[0]
            .content
            .ends_with("Response: reply turn/1. Answer:"));
        let results = plan.score(&[(&it, &done)], 0);
        let rr = results
            .metrics
            .iter()
            .find(|m| m.name == "qa_memory_nc1_rr")
            .expect("rr");
        assert_eq!((rr.interval.value, rr.n), (100.0, 1));
        let fa = results
            .metrics
            .iter()
            .find(|m| m.name == "qa_memory_nc1_fa")
            .expect("fa");
        assert_eq!((fa.interval.value, fa.n, fa.unscored), (100.0, 1, 0));
    }

    #[test]
    fn without_judge_only_candidate_turns_are_asked() {
        let it = item("qa/single/qa.memory.NC-1.jsonl", QA);
        let plan = RefutePlan {
            judge_feedback: false,
            ..RefutePlan::new(0)
        };
        let (_, asked) = drive(&plan, &it, |k| k.to_string());
        assert!(asked.iter().all(|s| s.actor == Actor::Candidate(0)));
        assert_eq!(asked.len(), 4);
    }

    const MT_MULTI: &str = r#"{"system_prompt": "S", "feedbacks": {"river": {"translation": ["河", "河流"], "random": "伞", "existence": [0, 2], "cnt": 2}, "bridge": {"translation": ["桥", "桥梁"], "random": "信", "existence": [1, 2], "cnt": 2}}, "feedback_prompt": "For all translations, you should follow the following mappings:\n", "feedback_mapping_prompt": "{src} -> {tgt}\n", "queries": ["[English]: The river rose. \n[Chinese]: ", "[MAYBE FEEDBACK]", "[English]: The bridge fell. \n[Chinese]: ", "[MAYBE FEEDBACK]", "[English]: The river hit the bridge. \n[Chinese]: ", "[MAYBE FEEDBACK]"]}"#;

    #[test]
    fn recall_repeat_wraps_queries_with_viable_feedback_and_history_keeps_the_repeat() {
        let it = item("mt/multi/en-zh.jsonl", MT_MULTI);
        let plan = RefutePlan {
            strategy: Strategy::RecallRepeat,
            ..RefutePlan::new(1)
        };
        let (done, asked) = drive(&plan, &it, |k| format!("reply {k}"));
        let step = |k: &str| {
            asked
                .iter()
                .find(|s| s.key == k)
                .unwrap_or_else(|| panic!("{k}"))
        };
        // turn/2 mentions only "bridge", which has no feedback yet: unchanged.
        assert_eq!(
            step("turn/2").messages.last().expect("msg").content,
            "[English]: The bridge fell. \n[Chinese]: "
        );
        let t4 = &step("turn/4").messages;
        let sent = &t4.last().expect("msg").content;
        assert!(
            sent.starts_with("Given my previous instructions:\n0. For all translations, you should follow the following mappings:\nriver -> "),
            "{sent}"
        );
        assert!(
            sent.contains(
                "\n1. For all translations, you should follow the following mappings:\nbridge -> "
            ),
            "{sent}"
        );
        assert!(sent.ends_with(&format!(
            "[English]: The river hit the bridge. \n[Chinese]: {}",
            prompts::REPEAT_SUFFIX
        )));
        // The last marker has no word left: the dialogue ends after turn/4.
        assert!(!asked.iter().any(|s| s.key == "turn/5"));
        let r = dialogue::replay(&it, &done, &plan.replay);
        assert_eq!((r.end, r.skipped), (End::Complete, vec![5]));

        // A later turn's history keeps the query and the repeat request, not the recalled text.
        let more = r#"{"system_prompt": "S", "feedbacks": {"river": {"translation": ["河", "河流"], "random": "伞", "existence": [0, 1, 2], "cnt": 3}}, "feedback_prompt": "", "feedback_mapping_prompt": "{src} -> {tgt}\n", "queries": ["[English]: river one \n[Chinese]: ", "[MAYBE FEEDBACK]", "[English]: river two \n[Chinese]: ", "[English]: river three \n[Chinese]: "]}"#;
        let it = item("mt/multi/en-zh.jsonl", more);
        let (_, asked) = drive(&plan, &it, |k| format!("reply {k}"));
        let t3 = &asked
            .iter()
            .find(|s| s.key == "turn/3")
            .expect("turn/3")
            .messages;
        assert_eq!(
            t3[5].content,
            format!(
                "[English]: river two \n[Chinese]: {}",
                prompts::REPEAT_SUFFIX
            )
        );
        assert!(t3[7]
            .content
            .starts_with("Given my previous instructions:\n0. river -> "));
    }

    #[test]
    fn qa_recall_picks_the_fact_sharing_most_words() {
        let line = r#"{"system_prompt": "S", "feedbacks": ["The name of the capital of Freedonia is Port Lumen.", "The name of the author of The Glass Orchard is Mira Talbot."], "feedback_prompt": "Adopt: ", "queries": ["Q1", "[MAYBE FEEDBACK]", "Q2", "[MAYBE FEEDBACK]", "Who is the author of The Glass Orchard?", "What is the currency of Freedonia?", "Tell me a joke."], "answers": [["Mira Talbot"], ["Lumen crown"], ["x"]]}"#;
        let it = item("qa/multi/qa.jsonl", line);
        let plan = RefutePlan {
            strategy: Strategy::Recall,
            ..RefutePlan::new(0)
        };
        let (_, asked) = drive(&plan, &it, |k| format!("reply {k}"));
        let last = |k: &str| {
            asked
                .iter()
                .find(|s| s.key == k)
                .expect(k)
                .messages
                .last()
                .expect("msg")
                .content
                .clone()
        };
        assert_eq!(
            last("turn/4"),
            "Given my previous instructions:\n0. Adopt: The name of the author of The Glass Orchard is Mira Talbot.\nWho is the author of The Glass Orchard?"
        );
        assert!(last("turn/5")
            .contains("0. Adopt: The name of the capital of Freedonia is Port Lumen.\n"));
        assert_eq!(
            last("turn/6"),
            "Tell me a joke.",
            "nothing shared: nothing recalled"
        );
    }

    #[test]
    fn email_recall_skips_chit_chat() {
        let line = r#"{"system_prompt": "S", "domain": "friend", "feedbacks": {"choices": ["Happy New Year"], "checker": "greetings"}, "feedback_prompt": "When writing my emails to my friends, please start the email with the greetings: \n\"{choice}\"", "queries": ["Write to Ana.", "[MAYBE FEEDBACK]", "What is 2+2?", "Write to Ana."]}"#;
        let it = item("email/single/email.memory.NC-1.jsonl", line);
        let plan = RefutePlan {
            strategy: Strategy::RecallRepeat,
            ..RefutePlan::new(0)
        };
        let (_, asked) = drive(&plan, &it, |k| format!("reply {k}"));
        let last = |k: &str| {
            asked
                .iter()
                .find(|s| s.key == k)
                .expect(k)
                .messages
                .last()
                .expect("msg")
                .content
                .clone()
        };
        assert_eq!(last("turn/2"), "What is 2+2?");
        assert!(last("turn/3").starts_with(
            "Given my previous instructions:\n0. When writing my emails to my friends"
        ));
    }

    #[test]
    fn long_histories_drop_chit_chat_first_and_record_it_in_the_key() {
        let line = r#"{"system_prompt": "S", "feedbacks": "F is G.", "feedback_prompt": "Adopt: ", "queries": ["Q?", "[MAYBE FEEDBACK]", "chat one", "chat two", "chat three", "Q?"], "answers": "G."}"#;
        let it = item("qa/single/qa.memory.NC-3.jsonl", line);
        let chars = |m: &[Message]| m.iter().map(|x| x.content.len()).sum::<usize>();
        let reply = |k: &str| format!("a long reply to {k} {}", "x".repeat(40));
        let (_, unlimited) = drive(&RefutePlan::new(0), &it, reply);
        let full = chars(
            &unlimited
                .iter()
                .find(|s| s.key == "turn/5")
                .expect("turn/5")
                .messages,
        );
        // Room for all but about two chit-chat exchanges.
        let plan = RefutePlan {
            context: Some(ContextLimit {
                max_prompt_tokens: full - 100,
                count: Arc::new(move |m: &[Message]| chars(m)),
                count_text: Arc::new(str::len),
            }),
            truncation: Truncation::Candor,
            ..RefutePlan::new(0)
        };
        let (done, asked) = drive(&plan, &it, reply);
        let last = asked.last().expect("steps");
        assert_eq!(last.key, "turn/5+dropped=2,3");
        assert!(chars(&last.messages) <= full - 100);
        assert!(
            last.messages.iter().any(|m| m.content == "Adopt: F is G."),
            "feedback kept"
        );
        assert!(last.messages.iter().any(|m| m.content == "chat three"));
        // The annotated key still completes the dialogue for scoring and for the plan.
        assert!(plan.next_steps(&it, &done).is_empty());
        assert_eq!(
            dialogue::replay(&it, &done, &plan.replay).end,
            End::Complete
        );
        // With no room at all, the feedback goes last.
        let tiny = RefutePlan {
            context: Some(ContextLimit {
                max_prompt_tokens: 0,
                count: Arc::new(move |m: &[Message]| chars(m)),
                count_text: Arc::new(str::len),
            }),
            truncation: Truncation::Candor,
            ..RefutePlan::new(0)
        };
        let (_, asked) = drive(&tiny, &it, reply);
        assert_eq!(asked.last().expect("steps").key, "turn/5+dropped=0,1,2,3,4");
        assert_eq!(asked.last().expect("steps").messages.len(), 2);
    }

    #[test]
    fn authors_truncation_cuts_the_oldest_messages_and_the_system_prompt() {
        let line = r#"{"system_prompt": "S", "feedbacks": "F is G.", "feedback_prompt": "Adopt: ", "queries": ["Q?", "[MAYBE FEEDBACK]", "chat one", "chat two", "chat three", "Q?"], "answers": "G."}"#;
        let it = item("qa/single/qa.memory.NC-3.jsonl", line);
        // Every reply costs 10 + 5; user texts their length + 5.
        let reply = |_: &str| "r".repeat(10);
        let limit = |max: usize| RefutePlan {
            context: Some(ContextLimit {
                max_prompt_tokens: max,
                count: Arc::new(|_: &[Message]| usize::MAX),
                count_text: Arc::new(str::len),
            }),
            ..RefutePlan::new(0)
        };
        assert_eq!(RefutePlan::new(0).truncation, Truncation::Authors);
        let (_, unlimited) = drive(&RefutePlan::new(0), &it, reply);
        let last = unlimited.last().expect("steps");
        let cost: usize = last.messages.iter().map(|m| m.content.len() + 5).sum();
        // Everything fits: nothing is cut.
        let (_, asked) = drive(&limit(cost), &it, reply);
        assert_eq!(asked.last().expect("steps").key, "turn/5");
        // One token short: only the system prompt ("S", the oldest message) goes.
        let (_, asked) = drive(&limit(cost - 1), &it, reply);
        let last = asked.last().expect("steps");
        assert_eq!(last.key, "turn/5+dropped=system");
        assert_ne!(last.messages[0].role, Role::System);
        // Short of the first reply too: the first exchange goes, with the system prompt.
        let first_user = last.messages[0].content.len() + 5;
        let (_, asked) = drive(&limit(cost - 1 - first_user), &it, reply);
        let last = asked.last().expect("steps");
        assert_eq!(last.key, "turn/5+dropped=system,0");
        assert_eq!(
            last.messages.len(),
            unlimited.last().expect("steps").messages.len() - 3
        );
        // The feedback is not protected: with room for the last exchange only, it is cut.
        let msgs = &unlimited.last().expect("steps").messages;
        let tail: usize = msgs[msgs.len() - 3..]
            .iter()
            .map(|m| m.content.len() + 5)
            .sum();
        let (_, asked) = drive(&limit(tail), &it, reply);
        assert_eq!(
            asked.last().expect("steps").key,
            "turn/5+dropped=system,0,1,2,3"
        );
    }

    #[test]
    fn a_template_without_system_prompt_runs_without_it() {
        let it = item("qa/single/qa.memory.NC-1.jsonl", QA);
        let plan = RefutePlan {
            system_prompt: false,
            ..RefutePlan::new(0)
        };
        let (done, asked) = drive(&plan, &it, |_| "ok".to_string());
        for s in asked.iter().filter(|s| s.key.starts_with("turn/")) {
            assert!(s.key.ends_with("+no_system"), "{}", s.key);
            assert!(s.messages.iter().all(|m| m.role != Role::System));
        }
        assert!(plan.next_steps(&it, &done).is_empty());
        assert!(!plan.record().system_prompt);
    }

    #[test]
    fn record_names_the_settings() {
        let r = RefutePlan::new(9).record();
        assert_eq!(
            (r.seed, r.mt_target, r.strategy),
            (9, "dictionary", Strategy::Vanilla)
        );
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["strategy"], "vanilla");
    }
}
