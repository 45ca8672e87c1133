//! Fennec's judge: the prompts of its branching chain (criteria, a scoring guideline per
//! criterion, pairwise or single scoring, correction) and the parsers of the judge's replies.
//!
//! Fennec is Liang et al. (2024), "Fennec: Fine-grained Language Model Evaluation and
//! Correction Extended through Branching and Bridging"; the prompts are the `en.fennec` entry
//! of the authors' `conf/prompt_template/fennec_template.json` (dropreg/Fennec @ e3995f6), with
//! the system message each action of `src/actions/fennec.py` picks. The score parsers follow
//! that file's `rating_format`: the first `Response A Score: ` and the last
//! `Response B Score: ` (asterisks removed first), each followed by one digit; anything else is
//! [`Verdict::Unscored`] where the authors used 0. Merging branch scores into a preference and
//! computing agreement live in `bench::fennec`; this module knows no data set.

use serde::{Deserialize, Serialize};

use super::Verdict;

/// The pairwise [Judge Result] the prompt asks for, as a Lark grammar (llguidance syntax)
/// for constrained decoding: the two score lines (one digit 1–5 each) with one-line
/// explanations and the comparison, in the prompt's order. Each explanation ends at a newline
/// or after 128 tokens, so the whole result fits in 512 new tokens whatever the judge writes.
pub const PAIR_RESULT_GRAMMAR: &str = r#"start: "Response A Score: " SCORE "\nExplanation: " line "\nResponse B Score: " SCORE "\nExplanation: " line "\nComparison: " line
SCORE: /[1-5]/
line[max_tokens=128]: /[^\n]+/
"#;

/// The single-response [Judge Result] the prompt asks for, as a Lark grammar.
pub const SINGLE_RESULT_GRAMMAR: &str = r#"start: "Response Score: " SCORE "\nExplanation: " line
SCORE: /[1-5]/
line[max_tokens=128]: /[^\n]+/
"#;

/// System message of the criteria (branching) step.
pub const BRANCH_SYSTEM: &str = "You are a fair, faithful, and helpful content evaluation assistant. Kindly assist me in accomplishing the assigned task by creating Evaluation Criteria for the provided dialogue.";

/// System message of the scoring-guideline and pairwise steps (the authors' `system`).
pub const PAIRWISE_SYSTEM: &str = "You are a fair, faithful, and helpful content evaluation assistant. Kindly assist me in finishing the assigned task by providing Pairwise Evaluations for the given dialogue. (Tips: This entails evaluating responses through the comparison of two distinct replies.)";

/// System message of the single-response scoring step.
pub const SINGLE_SYSTEM: &str = "You are a fair, faithful, and helpful content evaluation assistant. Please assist me in completing the assigned task by providing Single-Score Evaluations for the given dialogue. (Tips: This involves assessing individual responses independently.)";

/// System message of the correction step.
pub const CORRECTION_SYSTEM: &str = "You are an assistant capable of assisting in content modification. It is necessary to correct and refine the dialogue based on User Queries, Responses, and corresponding Evaluations results.";

/// Criteria generation: asks for five evaluation criteria for `query`.
pub fn criteria_prompt(query: &str) -> String {
    criteria_prompt_for(query, 5)
}

/// Criteria generation asking for `n` criteria when `n` is above five (the paper's ablation on
/// the number of branches), else for five (the authors' prompt; fewer branches keep the first
/// `n` of the five). The number is written as a word up to twelve, as the authors' "five".
pub fn criteria_prompt_for(query: &str, n: usize) -> String {
    const WORDS: [&str; 13] = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve",
    ];
    let n = n.max(5);
    let count = WORDS
        .get(n)
        .map_or_else(|| n.to_string(), |w| w.to_string());
    format!(
        "For evaluating human satisfaction with responses from an AI assistant based on a [User Query], we need to brainstorm and establish {count} [Evaluation Criteria] directly linked to the user's query. These criteria play a crucial role in objectively assessing response content, with higher priority and greater evaluation weight.\n***\nAs an illustration:\n1. Relevance: Evaluate whether the response is directly related to the user's query.\n2. Criterion: Assess the correctness of the information provided in the response. etc.\n***\n[User Query]:\n{query}\n***\nPlease return {count} [Evaluation Criteria]:\n"
    )
}

/// The shared opening of [`guideline_prompt`] for `query`: every criterion's prompt starts
/// with it, so an engine can share its KV prefix.
pub fn guideline_prefix(query: &str) -> String {
    format!(
        "Consider a [User Query] and [Evaluation Criteria] for evaluating response satisfaction. Reflect on these criteria and offer a comprehensive [Scoring Guideline] on a scale of 1-5 (1 represents 'Not at all satisfactory' and 5 represents 'Extremely satisfactory'). Ensure that these guidelines are closely tied to both the user query and the assessment criteria, allowing for a precise evaluation of possible responses to the user query. Conduct a detailed comparison of the [Scoring Guideline] to ease adherence and assist individuals in assigning reasonable scores.\n***\n[User Query]:\n{query}\n***\n[Evaluation Criteria]:\n"
    )
}

/// Scoring-guideline generation for one criterion.
pub fn guideline_prompt(query: &str, criterion: &str) -> String {
    format!(
        "{}{criterion}\n***\nPlease return detailed [Scoring Guideline]:\n",
        guideline_prefix(query)
    )
}

/// Which response is shown first in a pairwise prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// Response A, then response B (the authors' `sovling`).
    Normal,
    /// Response B, then response A, labels kept (the authors' `ex_sovling`).
    Exchanged,
}

const PAIRWISE_HEAD: &str = "Given a [User Query], please score the responses (A and B) from two AI assistants according to the [Evaluation Criteria] and [Scoring Guideline]. Ensure a comparative and objective assessment based on the evaluation criteria and scoring guideline, aiming to identify deficiencies in the response content. Provide a final score of 1-5 along with relevant explanations.\n***\n[User Query]:\n";

const PAIRWISE_TAIL: &str = "***\nPlease return [Judge Result] as follows:\nResponse A Score: 3\nExplanation: Explanation of the score for the Response A.\nResponse B Score: 3\nExplanation: Explanation of the score for the Response B.\nComparison: The comparison of the Response A and Response B.\n[Judge Result]:\n";

/// The shared opening of [`pairwise_prompt`] (both orders) for `query`.
pub fn pairwise_prefix(query: &str) -> String {
    format!("{PAIRWISE_HEAD}{query}\n***\n[Evaluation Criteria]:\n")
}

/// Pairwise scoring of responses A and B under one criterion and its guideline. The criterion
/// and guideline are trimmed, as the authors do.
pub fn pairwise_prompt(
    query: &str,
    criterion: &str,
    guideline: &str,
    response_a: &str,
    response_b: &str,
    order: Order,
) -> String {
    let block_a = format!("[The Start of Response A]:\n{response_a}\n[The End of Response A]\n");
    let block_b = format!("[The Start of Response B]:\n{response_b}\n[The End of Response B]\n");
    let (first, second) = match order {
        Order::Normal => (block_a, block_b),
        Order::Exchanged => (block_b, block_a),
    };
    format!(
        "{}{}\n***\n[Scoring Guideline]:\n{}\n***\n{first}***\n{second}{PAIRWISE_TAIL}",
        pairwise_prefix(query),
        criterion.trim(),
        guideline.trim()
    )
}

/// Single-response scoring under one criterion and its guideline.
pub fn single_prompt(query: &str, criterion: &str, guideline: &str, response: &str) -> String {
    format!(
        "Given a [User Query], please score the responses from AI assistants according to the [Evaluation Criteria] and [Scoring Guideline]. Ensure a comparative and objective assessment based on the evaluation criteria and scoring guideline, aiming to identify deficiencies in the response content. \n***\n[User Query]:\n{query}\n***\n[Evaluation Criteria]:\n{}\n***\n[Scoring Guideline]:\n{}\n***\n[The Start of Response]:\n{response}\n[The End of Response]\n***\nAssign a score as an integer between 1 and 5. Provide a detailed [Judge Result] strictly based on the given Scoring Guideline, refraining from a general evaluation. Please return [Judge Result] as follows:\nResponse Score: 3\nExplanation: Explanation of the score for the Response.\nPlease return [Judge Result]:\n",
        criterion.trim(),
        guideline.trim()
    )
}

/// Correction of `response` given the judge's findings on it.
pub fn correction_prompt(query: &str, response: &str, judge: &str) -> String {
    format!(
        "Provided with a [User Query], the AI assistant's [Original Response], and a comprehensive objective evaluation of the response, please attend to the identified shortcomings in the original response according to the [Judge Result]. Make certain that the modified response remains objective, non-harmful, and constructive in addressing the user's query intent, while also aligning with human behavioral norms. \n***\n[User Query]:\n{query}\n***\n[The Start of Original Response]:\n{response}\n[The End of Original Response]\n***\n[The Start of Judge Result]:\n{judge}\n[The End of Judge Result]. Kindly return one final [Modified Response] for user query directly without additional information.\nPlease return [Modified Response]:\n"
    )
}

/// The criteria in a criteria-generation reply: the lines that start with `N. `, or, when
/// there are none, every non-empty line; at most `max` (the authors keep 10). The leading
/// `N.` is removed and the line trimmed. (The authors delete every `1.` … `10.` anywhere in
/// the line, which also mangles numbers such as `2.5`; Candor removes only the enumerator.)
pub fn parse_criteria(reply: &str, max: usize) -> Vec<String> {
    let numbered: Vec<&str> = reply.lines().filter(|l| enumerator_len(l) > 0).collect();
    let lines: Vec<&str> = if numbered.is_empty() {
        reply.lines().filter(|l| !l.trim().is_empty()).collect()
    } else {
        numbered
    };
    lines
        .into_iter()
        .map(|l| l[enumerator_len(l)..].trim().to_string())
        .filter(|l| !l.is_empty())
        .take(max)
        .collect()
}

/// Length of a leading `digits '.' whitespace` enumerator (0 when the line has none).
fn enumerator_len(line: &str) -> usize {
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || line.as_bytes().get(digits) != Some(&b'.') {
        return 0;
    }
    match line[digits + 1..].chars().next() {
        Some(c) if c.is_whitespace() => digits + 1 + c.len_utf8(),
        _ => 0,
    }
}

/// A guideline reply as the authors keep it: the `[Scoring Guideline]:` label removed.
pub fn clean_guideline(reply: &str) -> String {
    reply.replace("[Scoring Guideline]:", "")
}

/// The two scores of one pairwise reply (labels as in the prompt, whatever the order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairScores {
    pub a: u8,
    pub b: u8,
}

/// The digit right after the first (or last) occurrence of `tag`.
fn digit_after(text: &str, tag: &str, last: bool) -> Option<u8> {
    let pos = if last {
        text.rfind(tag)
    } else {
        text.find(tag)
    }?;
    let c = text[pos + tag.len()..].chars().next()?;
    c.to_digit(10).map(|d| d as u8)
}

/// Reads `Response A Score: d` (first) and `Response B Score: d` (last) from a pairwise reply,
/// after removing asterisks; the authors' alternative tags `Assistant 1's Response Score: ` /
/// `Assistant 2's Response Score: ` are accepted too.
pub fn parse_pair_scores(reply: &str) -> Verdict<PairScores> {
    let text = reply.replace('*', "");
    let tags = [
        ("Response A Score: ", "Response B Score: "),
        (
            "Assistant 1's Response Score: ",
            "Assistant 2's Response Score: ",
        ),
    ];
    let Some((tag_a, tag_b)) = tags.into_iter().find(|(a, _)| text.contains(a)) else {
        return Verdict::unscored("no \"Response A Score: \" in the reply");
    };
    match (
        digit_after(&text, tag_a, false),
        digit_after(&text, tag_b, true),
    ) {
        (Some(a), Some(b)) => Verdict::Scored(PairScores { a, b }),
        (None, _) => Verdict::unscored(format!("no digit after \"{}\"", tag_a.trim_end())),
        (_, None) => Verdict::unscored(format!("no digit after \"{}\"", tag_b.trim_end())),
    }
}

/// Reads `Response Score: d` (or, failing that, `Response A Score: d`) from a single-response
/// reply; 0 is unscored, as the authors drop ratings `<= 0`.
pub fn parse_single_score(reply: &str) -> Verdict<u8> {
    let tag = ["Response Score: ", "Response A Score: "]
        .into_iter()
        .find(|t| reply.contains(t));
    let Some(tag) = tag else {
        return Verdict::unscored("no \"Response Score: \" in the reply");
    };
    match digit_after(reply, tag, false) {
        Some(d) if d > 0 => Verdict::Scored(d),
        Some(_) => Verdict::unscored("score 0 is outside the 1-5 scale"),
        None => Verdict::unscored(format!("no digit after \"{}\"", tag.trim_end())),
    }
}

/// Which response a correction is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    A,
    B,
}

/// Score at or below which a response's branch findings go to the correction step.
pub const CORRECTION_THRESHOLD: u8 = 3;

/// The judge findings that the correction of one side is given, built as the authors'
/// `FennecCorrectionAction`: for every branch whose normal-order reply has `Response A
/// Score:`, `Response B Score:` and `Comparison:` in that order and scores that side at most
/// [`CORRECTION_THRESHOLD`] (an unscored reply counts as 0, as there), the criterion followed
/// by that side's section with `Response A`/`Response B` renamed `Response`, concatenated.
/// `None` when no branch qualifies (no correction is asked for).
pub fn correction_findings(branches: &[(&str, &str)], side: Side) -> Option<String> {
    let mut out = String::new();
    for (criterion, reply) in branches {
        let (Some(a_pos), Some(b_pos), Some(e_pos)) = (
            reply.find("Response A Score:"),
            reply.find("Response B Score:"),
            reply.find("Comparison:"),
        ) else {
            continue;
        };
        if !(a_pos < b_pos && b_pos < e_pos) {
            continue;
        }
        let scores = parse_pair_scores(reply);
        let score = scores.scored().map_or(0, |s| match side {
            Side::A => s.a,
            Side::B => s.b,
        });
        if score > CORRECTION_THRESHOLD {
            continue;
        }
        let section = match side {
            Side::A => reply[a_pos..b_pos].replace("Response A", "Response"),
            Side::B => reply[b_pos..e_pos].replace("Response B", "Response"),
        };
        out.push_str(criterion);
        out.push_str(&section);
    }
    (!out.is_empty()).then_some(out)
}

/// The findings for correcting a response judged alone (single mode, which the authors'
/// correction action does not cover): for every branch reply that has `Response Score:` and
/// scores at most [`CORRECTION_THRESHOLD`] (unparsed counts as 0), the criterion followed by
/// the reply from that tag on. `None` when no branch qualifies.
pub fn single_correction_findings(branches: &[(&str, &str)]) -> Option<String> {
    let mut out = String::new();
    for (criterion, reply) in branches {
        let Some(pos) = reply.find("Response Score:") else {
            continue;
        };
        let score = parse_single_score(reply).scored().copied().unwrap_or(0);
        if score > CORRECTION_THRESHOLD {
            continue;
        }
        out.push_str(criterion);
        out.push_str(&reply[pos..]);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criteria_prompt_asks_for_the_branches_above_five() {
        let five = criteria_prompt("Q");
        assert_eq!(five.matches("five [Evaluation Criteria]").count(), 2);
        assert_eq!(criteria_prompt_for("Q", 3), five);
        let eight = criteria_prompt_for("Q", 8);
        assert_eq!(eight, five.replace("five [", "eight ["));
        assert!(criteria_prompt_for("Q", 20).contains("return 20 [Evaluation Criteria]"));
    }

    #[test]
    fn prompts_share_their_prefixes() {
        assert!(guideline_prompt("Q", "c1").starts_with(&guideline_prefix("Q")));
        for order in [Order::Normal, Order::Exchanged] {
            assert!(
                pairwise_prompt("Q", "c", "g", "a", "b", order).starts_with(&pairwise_prefix("Q"))
            );
        }
    }

    #[test]
    fn pair_score_parser() {
        let cases: &[(&str, Option<(u8, u8)>)] = &[
            ("Response A Score: 4\nExplanation: x\nResponse B Score: 2\n", Some((4, 2))),
            ("**Response A Score:** 5\n**Response B Score:** 3", Some((5, 3))),
            // First A, last B.
            ("Response A Score: 1 Response B Score: 2 ... Response A Score: 5 Response B Score: 4", Some((1, 4))),
            ("Assistant 1's Response Score: 2\nAssistant 2's Response Score: 5", Some((2, 5))),
            ("Response A Score: four\nResponse B Score: 2", None),
            ("Response A Score: 4\n(no B)", None),
            ("Response A: 4, Response B: 2", None),
            ("", None),
        ];
        for (reply, want) in cases {
            let got = parse_pair_scores(reply).scored().map(|s| (s.a, s.b));
            assert_eq!(got, *want, "{reply:?}");
        }
    }

    #[test]
    fn single_score_parser() {
        let cases: &[(&str, Option<u8>)] = &[
            ("Response Score: 4\nExplanation", Some(4)),
            ("Response A Score: 2", Some(2)),
            ("Response Score: 0", None),
            ("Response Score: ?", None),
            ("Score: 5", None),
        ];
        for (reply, want) in cases {
            assert_eq!(
                parse_single_score(reply).scored().copied(),
                *want,
                "{reply:?}"
            );
        }
    }

    #[test]
    fn criteria_parser() {
        let reply = "Here are five:\n1. Relevance: on topic.\n2. Accuracy: uses 2.5 correctly.\n\n10. Depth: detail\nnot numbered";
        assert_eq!(
            parse_criteria(reply, 10),
            vec![
                "Relevance: on topic.",
                "Accuracy: uses 2.5 correctly.",
                "Depth: detail"
            ]
        );
        assert_eq!(parse_criteria(reply, 1).len(), 1);
        assert_eq!(parse_criteria("A\n\n B \n", 10), vec!["A", "B"]);
        assert!(parse_criteria("  \n", 10).is_empty());
        assert_eq!(
            parse_criteria("1.5 is not an enumerator", 10),
            vec!["1.5 is not an enumerator"]
        );
    }

    #[test]
    fn correction_findings_pick_low_scores() {
        let r1 = "Response A Score: 2\nExplanation: thin.\nResponse B Score: 5\nExplanation: good.\nComparison: B.";
        let r2 = "Response A Score: 4\nExplanation: ok.\nResponse B Score: 3\nExplanation: meh.\nComparison: A.";
        let r3 = "garbled";
        let branches = [("Relevance", r1), ("Depth", r2), ("Style", r3)];
        assert_eq!(
            correction_findings(&branches, Side::A).as_deref(),
            Some("RelevanceResponse Score: 2\nExplanation: thin.\n")
        );
        assert_eq!(
            correction_findings(&branches, Side::B).as_deref(),
            Some("DepthResponse Score: 3\nExplanation: meh.\n")
        );
        assert_eq!(correction_findings(&[("x", r3)], Side::A), None);
        let single = [
            ("Depth", "Response Score: 2\nExplanation: thin."),
            ("Style", "Response Score: 5"),
        ];
        assert_eq!(
            single_correction_findings(&single).as_deref(),
            Some("DepthResponse Score: 2\nExplanation: thin.")
        );
        assert_eq!(single_correction_findings(&single[1..]), None);
    }
}
