//! Replays one item's dialogue from its finished steps: which queries were asked, which
//! refuting feedback each `[MAYBE FEEDBACK]` became (it depends on the model's previous reply),
//! and what each later reply must satisfy for the response rate.
//!
//! This follows the authors' drivers (`src/test_{qa,qa_multi,mt,email,email_multi}.py`):
//! - QA: the feedback is always `feedback_prompt + fact`.
//! - MT: every not-yet-used source word found in the previous source sentence gets one mapping,
//!   chosen among its candidate translations that are not a token of the previous reply (jieba
//!   tokens for Chinese, hebrew_tokenizer tokens for Hebrew, as the authors; [`super::segment`])
//!   (with `random` mode, the item's random word, unconditionally). No word found: no feedback
//!   turn. A word whose every candidate is already present is a conflict: the authors append
//!   `<CONFLICT>` and end the dialogue; so does this replay ([`End::Conflict`]).
//! - Email: a choice the previous reply does not already satisfy; none left: no feedback turn.
//!
//! The authors' unseeded `random.choice` is [`seeded_pick`] on (seed, item id, turn, slot); the
//! pick and its candidates are part of each [`Given`]. Checks (the paper's V(f, q) = 1 pairs):
//! single-feedback items check only the verification query (QA questions whose published answer
//! list is empty are not checked); multi QA checks every question after
//! the last feedback against its answer list; multi MT checks a later sentence for a feedback
//! word when the data's `existence` lists that sentence; multi email checks every later query
//! against every feedback given so far (all turns share one domain). The plan builds prompts
//! from a replay; scoring reads the checks from it. Neither tokens nor models are known here.

use super::checkers::{self, EmailCheck};
use super::data::{Content, Item, Query, Setting};
use super::prompts::{self, seeded_pick};
use super::segment;
use crate::bench::plan::{StepOutput, Transcript};

/// Which translation an MT feedback asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MtTarget {
    /// One of the dictionary translations (the paper's main setting).
    #[default]
    Dictionary,
    /// The item's random target-language word (the paper's harder variant).
    Random,
}

/// What changes the feedback chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayOptions {
    pub seed: u64,
    pub mt_target: MtTarget,
}

/// What a reply must satisfy.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// QA: one of these answers (aliases) appears.
    Answer(Vec<String>),
    /// MT: this target word appears.
    Word(String),
    /// Email: this rule holds.
    Email(EmailCheck),
}

impl Check {
    /// R(f, r) for one reply.
    pub fn passes(&self, reply: &str) -> bool {
        match self {
            Check::Answer(aliases) => checkers::qa_answer_matches(aliases, reply),
            Check::Word(w) => checkers::mt_word_present(w, reply),
            Check::Email(c) => c.check(reply),
        }
    }
}

/// One piece of feedback given at a feedback turn.
#[derive(Debug, Clone, PartialEq)]
pub struct Given {
    /// The source word (MT), the rule name (email) or the fact (QA).
    pub label: String,
    /// The chosen target word / choice / fact.
    pub chosen: String,
    /// How many candidates there were, and which one the seeded rule picked.
    pub candidates: usize,
    pub pick: usize,
    pub check: Check,
}

/// What one turn is.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnKind {
    /// A benchmark query; `checks` are the feedback requirements its reply is scored on.
    Query { chit_chat: bool, checks: Vec<Check> },
    /// A refuting instruction; `refutes` is the position of the query turn it answers (none
    /// when that query was empty and never asked).
    Feedback {
        given: Vec<Given>,
        refutes: Option<usize>,
    },
}

/// One user turn and, when finished, its reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn<'a> {
    /// Position in the item's `queries` (the step key is `turn/<index>`).
    pub index: usize,
    /// The user message as the data and feedback rules give it (before any recall wrapping).
    pub user: String,
    pub kind: TurnKind,
    pub reply: Option<&'a StepOutput>,
}

impl Turn<'_> {
    pub fn is_feedback(&self) -> bool {
        matches!(self.kind, TurnKind::Feedback { .. })
    }
}

/// How the replay ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Every turn has its reply.
    Complete,
    /// The turn at this position (the last in `turns`) has no reply yet.
    Waiting(usize),
    /// A feedback word had no candidate left at this position; the dialogue stops there.
    Conflict { at: usize, word: String },
}

/// An item's dialogue so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Replay<'a> {
    pub turns: Vec<Turn<'a>>,
    pub end: End,
    /// Positions without a turn: `[MAYBE FEEDBACK]` where no feedback applied, and empty
    /// queries.
    pub skipped: Vec<usize>,
}

/// The step key of the user turn at `index` (a context-dropping plan may append
/// `+dropped=…`; see [`find_step`]).
pub fn turn_key(index: usize) -> String {
    format!("turn/{index}")
}

/// The step key of the FA judgement of the feedback turn at `index`.
pub fn fa_key(index: usize) -> String {
    format!("fa/{index}")
}

/// The finished step whose key is `key`, or `key` followed by `+` and annotations.
pub fn find_step<'a>(done: &'a Transcript, key: &str) -> Option<(&'a str, &'a StepOutput)> {
    done.range(key.to_string()..)
        .take_while(|(k, _)| k.starts_with(key))
        .find(|(k, _)| k.len() == key.len() || k[key.len()..].starts_with('+'))
        .map(|(k, v)| (k.as_str(), v))
}

/// Replays `item` as far as its finished steps allow.
pub fn replay<'a>(item: &Item, done: &'a Transcript, opts: &ReplayOptions) -> Replay<'a> {
    let mut turns: Vec<Turn<'a>> = Vec::new();
    let mut skipped = Vec::new();
    let mut used_words = vec![
        false;
        match &item.content {
            Content::Mt(c) => c.words.len(),
            _ => 0,
        }
    ];
    let last_marker = item
        .queries
        .iter()
        .rposition(|q| *q == Query::Feedback)
        .unwrap_or(0);
    let mut feedback_slot = 0usize;
    let mut sentence = 0usize;
    for (index, query) in item.queries.iter().enumerate() {
        let turn = match query {
            // The authors' drivers skip empty queries (`if len(query) > 0`); one published QA
            // item has an empty initial question.
            Query::Text(text) if text.is_empty() => {
                sentence += 1;
                skipped.push(index);
                continue;
            }
            Query::Text(text) => {
                let checks = query_checks(item, &turns, index, last_marker, sentence);
                sentence += 1;
                let chit_chat = matches!(item.source.setting, Setting::Single { .. })
                    && index > 1
                    && index + 1 < item.queries.len();
                Turn {
                    index,
                    user: text.clone(),
                    kind: TurnKind::Query { chit_chat, checks },
                    reply: None,
                }
            }
            Query::Feedback => {
                let slot = feedback_slot;
                feedback_slot += 1;
                // The previous position is a query (the shape check guarantees it); an empty
                // one was never asked, so, as in the authors' loop, it leaves "" behind.
                let prev = turns
                    .last()
                    .filter(|t| t.index + 1 == index && !t.is_feedback());
                let prev_query = prev.map(|t| t.user.as_str()).unwrap_or("");
                let prev_reply = prev
                    .and_then(|t| t.reply)
                    .map(|r| r.text.as_str())
                    .unwrap_or("");
                let refutes = prev.map(|t| t.index);
                match resolve_feedback(
                    item,
                    index,
                    slot,
                    prev_query,
                    prev_reply,
                    &mut used_words,
                    opts,
                ) {
                    Resolved::None => {
                        skipped.push(index);
                        continue;
                    }
                    Resolved::Conflict(word) => {
                        return Replay {
                            turns,
                            end: End::Conflict { at: index, word },
                            skipped,
                        };
                    }
                    Resolved::Given(user, given) => Turn {
                        index,
                        user,
                        kind: TurnKind::Feedback { given, refutes },
                        reply: None,
                    },
                }
            }
        };
        let reply = find_step(done, &turn_key(index)).map(|(_, s)| s);
        let waiting = reply.is_none();
        turns.push(Turn { reply, ..turn });
        if waiting {
            return Replay {
                turns,
                end: End::Waiting(index),
                skipped,
            };
        }
    }
    Replay {
        turns,
        end: End::Complete,
        skipped,
    }
}

fn query_checks(
    item: &Item,
    turns: &[Turn],
    index: usize,
    last_marker: usize,
    sentence: usize,
) -> Vec<Check> {
    let given = || {
        turns.iter().filter_map(|t| match &t.kind {
            TurnKind::Feedback { given, .. } => Some(given.iter()),
            _ => None,
        })
    };
    let is_last = index + 1 == item.queries.len();
    match (&item.content, item.source.setting) {
        (Content::Qa(c), Setting::Single { .. })
            if is_last && turns.iter().any(Turn::is_feedback) =>
        {
            answer_check(&c.answers[0])
        }
        (Content::Qa(c), Setting::Multi) if index > last_marker => c
            .answers
            .get(index - last_marker - 1)
            .map(|a| answer_check(a))
            .unwrap_or_default(),
        (Content::Mt(_), Setting::Single { .. }) | (Content::Email(_), Setting::Single { .. })
            if is_last =>
        {
            given().flatten().map(|g| g.check.clone()).collect()
        }
        (Content::Mt(c), Setting::Multi) => given()
            .flatten()
            .filter(|g| {
                c.words
                    .iter()
                    .find(|w| w.src == g.label)
                    .is_some_and(|w| w.existence.contains(&sentence))
            })
            .map(|g| g.check.clone())
            .collect(),
        (Content::Email(_), Setting::Multi) => given().flatten().map(|g| g.check.clone()).collect(),
        _ => Vec::new(),
    }
}

/// A QA check, unless the data gives no non-empty answer (then the question is not viable).
fn answer_check(aliases: &[String]) -> Vec<Check> {
    if aliases.iter().all(|a| a.trim().is_empty()) {
        Vec::new()
    } else {
        vec![Check::Answer(aliases.to_vec())]
    }
}

enum Resolved {
    None,
    Conflict(String),
    Given(String, Vec<Given>),
}

fn resolve_feedback(
    item: &Item,
    index: usize,
    slot: usize,
    prev_query: &str,
    prev_reply: &str,
    used_words: &mut [bool],
    opts: &ReplayOptions,
) -> Resolved {
    match &item.content {
        Content::Qa(c) => {
            let Some(fact) = c.facts.get(slot) else {
                return Resolved::None;
            };
            let answers = match item.source.setting {
                // The verification answer; multi questions carry their own lists.
                Setting::Single { .. } => c.answers[0].clone(),
                Setting::Multi => Vec::new(),
            };
            Resolved::Given(
                prompts::qa_feedback(&c.feedback_prompt, fact),
                vec![Given {
                    label: fact.clone(),
                    chosen: fact.clone(),
                    candidates: 1,
                    pick: 0,
                    check: Check::Answer(answers),
                }],
            )
        }
        Content::Mt(c) => {
            let words = checkers::english_words(source_sentence(prev_query));
            // The authors' "already used": a candidate equal to a token of the previous reply
            // (jieba for Chinese, hebrew_tokenizer for Hebrew; see `segment`).
            let reply_tokens = segment::target_words(prev_reply, &c.tgt_lang);
            let used_in_reply = |t: &str| match &reply_tokens {
                Some(tokens) => tokens.iter().any(|tok| tok == t),
                None => checkers::mt_word_present(t, prev_reply),
            };
            let mut given = Vec::new();
            for (w, used) in c.words.iter().zip(used_words.iter_mut()) {
                if *used || !words.contains(&w.src.as_str()) {
                    continue;
                }
                let candidates: Vec<&String> = match opts.mt_target {
                    MtTarget::Random => vec![&w.random],
                    MtTarget::Dictionary => w
                        .translations
                        .iter()
                        .filter(|t| !used_in_reply(t))
                        .collect(),
                };
                if candidates.is_empty() {
                    return Resolved::Conflict(w.src.clone());
                }
                let pick = seeded_pick(opts.seed, &item.id, index, &w.src, candidates.len());
                let chosen = candidates[pick].clone();
                *used = true;
                given.push(Given {
                    label: w.src.clone(),
                    check: Check::Word(chosen.clone()),
                    chosen,
                    candidates: candidates.len(),
                    pick,
                });
            }
            if given.is_empty() {
                return Resolved::None;
            }
            let pairs: Vec<(&str, &str)> = given
                .iter()
                .map(|g| (g.label.as_str(), g.chosen.as_str()))
                .collect();
            Resolved::Given(
                prompts::mt_feedback(&c.feedback_prompt, &c.mapping_prompt, &pairs),
                given,
            )
        }
        Content::Email(c) => {
            let Some(fb) = c.feedbacks.get(slot) else {
                return Resolved::None;
            };
            let open: Vec<usize> = (0..fb.choices.len())
                .filter(|&k| !fb.checks[k].check(prev_reply))
                .collect();
            if open.is_empty() {
                return Resolved::None;
            }
            let pick = seeded_pick(opts.seed, &item.id, index, fb.rule.as_str(), open.len());
            let k = open[pick];
            Resolved::Given(
                prompts::email_feedback(&fb.prompt, &fb.choices[k]),
                vec![Given {
                    label: fb.rule.as_str().to_string(),
                    chosen: fb.choices[k].clone(),
                    candidates: open.len(),
                    pick,
                    check: Check::Email(fb.checks[k].clone()),
                }],
            )
        }
    }
}

/// The English sentence of an MT query (between `[English]: ` and the next `\n[`), so that the
/// instruction's own words ("translate", "sentence") never trigger feedback; the whole text
/// when the query has another layout.
pub fn source_sentence(query: &str) -> &str {
    match query.split_once("[English]:") {
        Some((_, rest)) => rest.split("\n[").next().unwrap_or(rest),
        None => query,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::refutebench::data::{parse_reader, Source};

    fn item(rel: &str, line: &str) -> Item {
        let source = Source::from_rel_path(rel).expect("layout");
        parse_reader(line.as_bytes(), &source, std::path::Path::new(rel))
            .expect("parses")
            .remove(0)
    }

    fn out(text: &str) -> StepOutput {
        StepOutput::scripted(text)
    }

    const MT: &str = r#"{"system_prompt": "S", "feedbacks": {"garden": {"translation": ["花园", "园子", "庭园"], "random": "铅笔", "existence": [0, 1], "cnt": 2}}, "feedback_prompt": "", "feedback_mapping_prompt": "In the following translations, you should translate {src} to {tgt}.", "queries": ["Please translate the following sentence from English into Chinese.\n[English]: The garden is green. \n[Chinese]: ", "[MAYBE FEEDBACK]", "Please translate the following sentence from English into Chinese.\n[English]: The garden is green. \n[Chinese]: "]}"#;

    #[test]
    fn mt_feedback_avoids_words_already_used_and_is_seeded() {
        let it = item("mt/single/en-zh.memory.NC-0.jsonl", MT);
        let mut done = Transcript::new();
        done.insert("turn/0".into(), out("花园是绿色的。"));
        let r = replay(&it, &done, &ReplayOptions::default());
        assert_eq!(r.end, End::Waiting(1));
        let TurnKind::Feedback { given, refutes } = &r.turns[1].kind else {
            panic!("feedback")
        };
        assert_eq!(*refutes, Some(0));
        assert_eq!(given[0].candidates, 2);
        assert_ne!(given[0].chosen, "花园");
        assert_eq!(
            r.turns[1].user,
            format!(
                "In the following translations, you should translate garden to {}.",
                given[0].chosen
            )
        );
        // Over seeds, both remaining candidates occur; the same seed always gives the same one.
        let chosen = |seed| {
            let r = replay(
                &it,
                &done,
                &ReplayOptions {
                    seed,
                    ..Default::default()
                },
            );
            let TurnKind::Feedback { given, .. } = &r.turns[1].kind else {
                panic!("feedback")
            };
            given[0].chosen.clone()
        };
        let seen: std::collections::BTreeSet<String> = (0..32).map(chosen).collect();
        assert_eq!(seen.len(), 2);
        assert_eq!(chosen(5), chosen(5));
        // Random mode asks for the item's random word.
        let r = replay(
            &it,
            &done,
            &ReplayOptions {
                seed: 0,
                mt_target: MtTarget::Random,
            },
        );
        assert!(r.turns[1].user.ends_with("garden to 铅笔."));
    }

    #[test]
    fn mt_conflict_ends_the_dialogue() {
        let it = item("mt/single/en-zh.memory.NC-0.jsonl", MT);
        let mut done = Transcript::new();
        done.insert("turn/0".into(), out("花园，园子，庭园"));
        let r = replay(&it, &done, &ReplayOptions::default());
        assert_eq!(
            r.end,
            End::Conflict {
                at: 1,
                word: "garden".into()
            }
        );
        assert_eq!(r.turns.len(), 1);
    }

    #[test]
    fn verification_reply_is_checked_and_keys_with_annotations_are_found() {
        let it = item("mt/single/en-zh.memory.NC-0.jsonl", MT);
        let mut done = Transcript::new();
        done.insert("turn/0".into(), out("花园是绿色的。"));
        done.insert("turn/1".into(), out("好的。"));
        done.insert("turn/2+dropped=0".into(), out("园子是绿色的。"));
        let r = replay(&it, &done, &ReplayOptions::default());
        assert_eq!(r.end, End::Complete);
        let TurnKind::Query { checks, chit_chat } = &r.turns[2].kind else {
            panic!("query")
        };
        assert!(!chit_chat);
        assert_eq!(checks.len(), 1);
        let TurnKind::Feedback { given, .. } = &r.turns[1].kind else {
            panic!("feedback")
        };
        assert_eq!(
            checks[0].passes("园子是绿色的。"),
            given[0].chosen == "园子"
        );
        assert!(find_step(&done, "turn/2").is_some());
        assert!(find_step(&done, "turn/").is_none());
        let mut ten = Transcript::new();
        ten.insert("turn/10".into(), out("x"));
        assert!(find_step(&ten, "turn/1").is_none());
    }

    #[test]
    fn empty_queries_are_never_asked_and_feedback_still_follows() {
        // As published in qa.generalization.NC-0.jsonl line 23.
        let line = r#"{"system_prompt": "S", "feedbacks": "F is G.", "feedback_prompt": "Adopt: ", "queries": ["", "[MAYBE FEEDBACK]", "Q?"], "answers": ["G"]}"#;
        let it = item("qa/single/qa.generalization.NC-0.jsonl", line);
        let done = Transcript::new();
        let r = replay(&it, &done, &ReplayOptions::default());
        assert_eq!(r.end, End::Waiting(1));
        assert_eq!(r.skipped, vec![0]);
        assert_eq!(r.turns[0].user, "Adopt: F is G.");
        assert!(matches!(
            r.turns[0].kind,
            TurnKind::Feedback { refutes: None, .. }
        ));
    }

    #[test]
    fn email_feedback_is_skipped_when_every_choice_is_already_met() {
        let line = r#"{"system_prompt": "S", "domain": "work", "feedbacks": {"choices": ["Greetings"], "checker": "greetings"}, "feedback_prompt": "When writing my work emails, please start the email with the greetings: \n\"{choice}\"", "queries": ["Write.", "[MAYBE FEEDBACK]", "Write."]}"#;
        let it = item("email/single/email.memory.NC-0.jsonl", line);
        let mut done = Transcript::new();
        done.insert("turn/0".into(), out("Greetings, team."));
        let r = replay(&it, &done, &ReplayOptions::default());
        assert_eq!(r.skipped, vec![1]);
        assert_eq!(r.end, End::Waiting(2));
        let TurnKind::Query { checks, .. } = &r.turns[1].kind else {
            panic!("query")
        };
        assert!(checks.is_empty());
    }
}
