//! Every RefuteBench prompt template, each in one place, quoted from the authors' code
//! (`src/test_{qa,mt,email}*.py` and `WithClsModelWrapper` in `src/model_utils.py` at commit
//! 24c2135), plus the seeded rule that replaces their unseeded `random.choice`.
//!
//! The per-item templates themselves (the QA `feedback_prompt`, the MT `feedback_mapping_prompt`,
//! the email `feedback_prompt(s)` with `{choice}`) come from the data files; this module only
//! fills them the way the authors' code does. The feedback-acceptance judge prompt lives with its
//! parser in [`crate::judge::feedback_acceptance`]. Which feedback applies is decided in
//! [`super::dialogue`].

use super::source::Task;
use crate::judge::feedback_acceptance;
use crate::stats::rng::SplitMix64;

/// Where a refuting instruction may go in `queries`.
pub const FEEDBACK_MARKER: &str = "[MAYBE FEEDBACK]";

/// Recall-and-repeat: header before the recalled instructions
/// (`p = "Given my previous instructions:\n"`).
pub const RECALL_HEADER: &str = "Given my previous instructions:\n";

/// Recall-and-repeat: one recalled instruction (`"{idx}. {instruct}\n"`, idx from 0).
pub const RECALL_ITEM: &str = "{idx}. {instruct}\n";

/// Recall-and-repeat: the repeat request appended after the query (`post_prompt`).
pub const REPEAT_SUFFIX: &str =
    "If you understand my requirements, please first repeat the requirement and fulfill the following task.\n";

/// QA feedback: `feedback_prompt + feedbacks` (e.g. "For all the questions, you should adopt
/// the knowledge: The name of … is Syria.").
pub fn qa_feedback(feedback_prompt: &str, fact: &str) -> String {
    format!("{feedback_prompt}{fact}")
}

/// MT feedback: `feedback_prompt` followed by `feedback_mapping_prompt.format(src=…, tgt=…)`
/// for each chosen mapping, in the order of the item's `feedbacks`. Single-feedback files have
/// an empty prefix and the mapping "In the following translations, you should translate {src}
/// to {tgt}."; multi-feedback files "For all translations, you should follow the following
/// mappings:\n" and "{src} -> {tgt}\n".
pub fn mt_feedback(
    feedback_prompt: &str,
    mapping_prompt: &str,
    mappings: &[(&str, &str)],
) -> String {
    let mut out = feedback_prompt.to_string();
    for (src, tgt) in mappings {
        out.push_str(&fill(mapping_prompt, &[("src", src), ("tgt", tgt)]));
    }
    out
}

/// Email feedback: `feedback_prompt.format(choice=fb_choice)`.
pub fn email_feedback(feedback_prompt: &str, choice: &str) -> String {
    fill(feedback_prompt, &[("choice", choice)])
}

/// The two forms of a recalled query: what is sent, and what stays in the conversation history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecalledQuery {
    /// `RECALL_HEADER + items + query (+ REPEAT_SUFFIX)`.
    pub sent: String,
    /// The authors' wrapper strips the recalled prefix from the history afterwards but keeps
    /// the repeat suffix: `query (+ REPEAT_SUFFIX)`.
    pub kept: String,
}

/// Wraps `query` with recalled instructions. With nothing recalled the query goes unchanged,
/// as in the authors' wrapper.
pub fn recall_query(recalled: &[&str], query: &str, repeat: bool) -> RecalledQuery {
    if recalled.is_empty() {
        return RecalledQuery {
            sent: query.to_string(),
            kept: query.to_string(),
        };
    }
    let mut prefix = RECALL_HEADER.to_string();
    for (idx, instruct) in recalled.iter().enumerate() {
        prefix.push_str(&fill(
            RECALL_ITEM,
            &[("idx", &idx.to_string()), ("instruct", instruct)],
        ));
    }
    let kept = if repeat {
        format!("{query}{REPEAT_SUFFIX}")
    } else {
        query.to_string()
    };
    RecalledQuery {
        sent: format!("{prefix}{kept}"),
        kept,
    }
}

/// The FA judge prompt for a reply to feedback: the paper's template
/// ([`feedback_acceptance::TEMPLATE`]) with the refuted query, the feedback and the reply; MT
/// prompts start with four demonstrations, as in the paper (Candor's own, the authors' being
/// unpublished: [`feedback_acceptance::MT_DEMOS`]).
pub fn fa_judge_prompt(task: Task, query: &str, feedback: &str, reply: &str) -> String {
    let demos: &[feedback_acceptance::Demo] = match task {
        Task::Mt => &feedback_acceptance::MT_DEMOS,
        Task::Qa | Task::Email => &[],
    };
    feedback_acceptance::prompt(query, feedback, reply, demos)
}

/// Python's `str.format` restricted to the named fields given (the templates contain no other
/// braces).
fn fill(template: &str, fields: &[(&str, &str)]) -> String {
    let mut out = template.to_string();
    for (name, value) in fields {
        out = out.replace(&format!("{{{name}}}"), value);
    }
    out
}

/// The deterministic replacement for the authors' `random.choice(candidates)`: an index in
/// `0..n` drawn by SplitMix64 from a 64-bit FNV-1a hash of `(seed, item id, turn, slot)`.
/// The same seed and item always give the same feedback, whatever the order items run in.
/// `slot` names what is chosen (the MT source word, the email rule), so two choices in one
/// turn are independent. `n` must be positive.
pub fn seeded_pick(seed: u64, item_id: &str, turn: usize, slot: &str, n: usize) -> usize {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = FNV_OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(FNV_PRIME);
        }
    };
    eat(&seed.to_le_bytes());
    eat(item_id.as_bytes());
    eat(&[0xff]);
    eat(&(turn as u64).to_le_bytes());
    eat(slot.as_bytes());
    SplitMix64::new(h).below(n.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_templates_fill_like_python_format() {
        assert_eq!(
            mt_feedback(
                "",
                "In the following translations, you should translate {src} to {tgt}.",
                &[("function", "函数")]
            ),
            "In the following translations, you should translate function to 函数."
        );
        assert_eq!(
            mt_feedback(
                "For all translations, you should follow the following mappings:\n",
                "{src} -> {tgt}\n",
                &[("a", "甲"), ("b", "乙")]
            ),
            "For all translations, you should follow the following mappings:\na -> 甲\nb -> 乙\n"
        );
        assert_eq!(
            email_feedback(
                "When writing my work emails, the email should contain {choice}.",
                "at least 5 sentences"
            ),
            "When writing my work emails, the email should contain at least 5 sentences."
        );
        assert_eq!(qa_feedback("Adopt: ", "X is Y."), "Adopt: X is Y.");
    }

    #[test]
    fn recall_matches_the_authors_wrapper() {
        let r = recall_query(&["Translate a to b.", "Use c."], "Q: ", true);
        assert_eq!(
            r.sent,
            "Given my previous instructions:\n0. Translate a to b.\n1. Use c.\nQ: If you understand my requirements, please first repeat the requirement and fulfill the following task.\n"
        );
        assert_eq!(r.kept, format!("Q: {REPEAT_SUFFIX}"));
        let plain = recall_query(&["X"], "Q", false);
        assert_eq!(plain.sent, "Given my previous instructions:\n0. X\nQ");
        assert_eq!(plain.kept, "Q");
        assert_eq!(recall_query(&[], "Q", true).sent, "Q");
    }

    #[test]
    fn seeded_pick_is_stable_and_spreads() {
        let a = seeded_pick(0, "mt/single/en-zh.memory.NC-0/3", 1, "function", 7);
        assert_eq!(
            a,
            seeded_pick(0, "mt/single/en-zh.memory.NC-0/3", 1, "function", 7)
        );
        assert!(a < 7);
        let picks: std::collections::BTreeSet<usize> =
            (0..64).map(|s| seeded_pick(s, "x", 1, "w", 4)).collect();
        assert_eq!(picks.len(), 4, "all four choices reachable over seeds");
        // Golden value: a change to the rule changes every recorded run, so it must be deliberate.
        assert_eq!(
            seeded_pick(42, "qa/single/qa.memory.NC-0/0", 1, "", 1000),
            GOLDEN
        );
    }

    const GOLDEN: usize = 271; // cross-checked with an independent Python implementation
}
