//! ReaLMistake's error-detection judge: the prompts that ask a model whether another model's
//! response contains an error, and the rule that reads its verdict.
//!
//! The prompts are those of Kamoi et al. (2024), "Evaluating LLMs at Detecting Errors in LLM
//! Responses", as written in the authors' `src/baseline/prompt.py` (psunlpgroup/ReaLMistake
//! @ f94a8b9): four wordings 1-A, 1-B, 2-A, 2-B (files `baseline_errordetection_prompt_1..4`)
//! and the evaluation-steps variant (`cot_instruction_prompt`). The verdict rule is the
//! authors': a reply that contains "response is correct", "contains no error" or "response is
//! valid" predicts no error, else one that contains "contains an error" or "response is not
//! valid" predicts an error; a reply with none of these is [`Verdict::Unscored`]. The no-error
//! phrases are checked first, so a reply with both kinds says no error ("The reasoning in the
//! model response is correct ... Therefore, the model response contains an error." is read as
//! no error, as in the published predictions). This rule reproduces all 25,200 published
//! open-detector predictions from their raw replies (`tests/it/realmistake.rs`). This module
//! knows nothing of the data files or of metrics.

use serde::{Deserialize, Serialize};

use super::Verdict;

/// What a detector says about a response (the positive class is `Error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Detection {
    Error,
    NoError,
}

impl Detection {
    /// The label as the authors' files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Detection::Error => "error",
            Detection::NoError => "no_error",
        }
    }

    /// Parses `"error"` / `"no_error"`.
    pub fn from_label(label: &str) -> Option<Self> {
        match label {
            "error" => Some(Detection::Error),
            "no_error" => Some(Detection::NoError),
            _ => None,
        }
    }
}

/// One of the detection prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DetectionPrompt {
    /// 1-A: "contains an error" / "contains no error", error option first.
    P1,
    /// 1-B: the same, no-error option first.
    P2,
    /// 2-A: "not valid" / "valid", not-valid option first.
    P3,
    /// 2-B: the same, valid option first.
    P4,
    /// 1-A followed by the numbered evaluation steps (the authors' `cot_instruction_prompt`).
    EvaluationSteps,
}

impl DetectionPrompt {
    /// The four prompts of the paper's main results, in the authors' order.
    pub const SIMPLE: [DetectionPrompt; 4] = [
        DetectionPrompt::P1,
        DetectionPrompt::P2,
        DetectionPrompt::P3,
        DetectionPrompt::P4,
    ];

    /// 1-based number of a simple prompt (`None` for the evaluation-steps variant).
    pub fn number(self) -> Option<usize> {
        match self {
            DetectionPrompt::P1 => Some(1),
            DetectionPrompt::P2 => Some(2),
            DetectionPrompt::P3 => Some(3),
            DetectionPrompt::P4 => Some(4),
            DetectionPrompt::EvaluationSteps => None,
        }
    }

    /// The simple prompt with 1-based number `n`.
    pub fn from_number(n: usize) -> Option<Self> {
        Self::SIMPLE.get(n.checked_sub(1)?).copied()
    }

    /// The authors' file stem (`baseline_errordetection_prompt_1`, `cot_instruction_prompt`).
    pub fn file_stem(self) -> String {
        match self.number() {
            Some(n) => format!("baseline_errordetection_prompt_{n}"),
            None => "cot_instruction_prompt".to_string(),
        }
    }

    /// The paper's name (1-A, 1-B, 2-A, 2-B, steps).
    pub fn paper_name(self) -> &'static str {
        match self {
            DetectionPrompt::P1 => "1-A",
            DetectionPrompt::P2 => "1-B",
            DetectionPrompt::P3 => "2-A",
            DetectionPrompt::P4 => "2-B",
            DetectionPrompt::EvaluationSteps => "steps",
        }
    }
}

const FIRST_SENTENCE: &str = "We provide an input to a language model (model input) and a response from the model (model response).";
const INSTRUCTION_FOLLOWING: &str = "You need to check whether the model response follows all instructions and requirements in the model input.";

const ERROR_OPTION: &str = "\"Therefore, the model response contains an error.\"";
const NO_ERROR_OPTION: &str = "\"Therefore, the model response contains no error.\"";
const NOT_VALID_OPTION: &str = "\"Therefore, the model response is not valid.\"";
const VALID_OPTION: &str = "\"Therefore, the model response is valid.\"";

const EVALUATION_STEPS: &str = "\n\nFollow the instructions below to check whether the model response contains an error:\n1. Read the model input carefully.\n2. Read the model response carefully.\n3. Check whether the model response follows all instructions and requirements in the model input. Provide your explanation on each criterion.\n4. Select your answer from \"Therefore, the model response contains an error.\" or \"Therefore, the model response contains no error.\"";

/// The full user message asking for a verdict on `response` to `input`.
pub fn detection_prompt(prompt: DetectionPrompt, input: &str, response: &str) -> String {
    let head = match prompt {
        DetectionPrompt::P1 | DetectionPrompt::P2 | DetectionPrompt::EvaluationSteps => format!(
            "{FIRST_SENTENCE} Your task is to detect errors in the model response. \
             {INSTRUCTION_FOLLOWING} You need to classify the model response as an error if \
             the model response does not follow any of the instructions or requirements in the \
             model input.\n"
        ),
        DetectionPrompt::P3 | DetectionPrompt::P4 => format!(
            "{FIRST_SENTENCE} Your task is to evaluate the quality of the model response and \
             classify whether it is valid or not. {INSTRUCTION_FOLLOWING} You need to classify \
             the model response as valid only if the model response follows all instructions \
             and requirements in the model input.\n"
        ),
    };
    let (first, second) = options(prompt);
    let mut text = format!(
        "{head}\n===== Model Input Begins =====\n\n{input}\n\n===== Model Input Ends =====\n\n\
         ===== Model Response Begins =====\n\n{response}\n\n===== Model Response Ends =====\n\n\
         In your response, provide your explanation first and conclude your response with \
         {first} or {second}"
    );
    if prompt == DetectionPrompt::EvaluationSteps {
        text.push_str(EVALUATION_STEPS);
    }
    text
}

/// The reply a detection prompt asks for, as a Lark grammar (llguidance syntax) for
/// constrained decoding: a one-line explanation (ending at a newline or after 384 tokens, so a
/// reply fits in 512 new tokens), then one of the prompt's two concluding sentences on its own
/// line. Off by default (the authors' detectors wrote free text); it lets a small model that
/// never reaches a verdict phrase give one.
pub fn detection_grammar(prompt: DetectionPrompt) -> String {
    let (first, second) = options(prompt);
    format!(
        "start: explanation \"\\n\" conclusion\nconclusion: {first} | {second}\nexplanation[max_tokens=384]: /[^\\n]+/\n"
    )
}

/// The two concluding sentences a prompt offers, in its order.
fn options(prompt: DetectionPrompt) -> (&'static str, &'static str) {
    match prompt {
        DetectionPrompt::P1 | DetectionPrompt::EvaluationSteps => (ERROR_OPTION, NO_ERROR_OPTION),
        DetectionPrompt::P2 => (NO_ERROR_OPTION, ERROR_OPTION),
        DetectionPrompt::P3 => (NOT_VALID_OPTION, VALID_OPTION),
        DetectionPrompt::P4 => (VALID_OPTION, NOT_VALID_OPTION),
    }
}

/// Phrases that make a reply predict no error (checked first), in the authors' order.
const NO_ERROR_PHRASES: [&str; 3] = [
    "response is correct",
    "contains no error",
    "response is valid",
];
/// Phrases that make a reply predict an error.
const ERROR_PHRASES: [&str; 2] = ["contains an error", "response is not valid"];

/// Reads a detector's reply with the authors' rule (case-sensitive substring match).
pub fn parse_detection(reply: &str) -> Verdict<Detection> {
    if NO_ERROR_PHRASES.iter().any(|p| reply.contains(p)) {
        Verdict::Scored(Detection::NoError)
    } else if ERROR_PHRASES.iter().any(|p| reply.contains(p)) {
        Verdict::Scored(Detection::Error)
    } else {
        Verdict::unscored("no verdict phrase (\"contains an error\", \"contains no error\", \"response is correct\", \"response is valid\", \"response is not valid\")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::constraint::{Allowed, ConstraintCompiler};
    use crate::engine::Constraint;

    /// Feeds `text` one byte-token at a time (ids 0..=255 are the bytes; 256 stops), checking
    /// each is allowed; returns the state.
    fn feed(
        c: &ConstraintCompiler,
        grammar: &str,
        text: &[u8],
    ) -> crate::engine::constraint::ConstraintState {
        let mut s = c.start(&Constraint::Lark(grammar.to_string())).unwrap();
        for &b in text {
            let Allowed::Tokens(ids) = s.allowed(&[256]) else {
                panic!("stopped before {:?}", b as char)
            };
            assert!(ids.contains(&u32::from(b)), "{:?} not allowed", b as char);
            s.consume(u32::from(b));
        }
        s
    }

    /// The constrained reply always ends in a verdict the authors' rule reads, within 512
    /// tokens: the explanation is cut at 384 tokens, then only the newline may follow.
    #[test]
    fn constrained_replies_reach_a_verdict() {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"\xFF<|im_end|>".to_vec());
        let c = ConstraintCompiler::from_words(words, 256);
        for p in DetectionPrompt::SIMPLE {
            let g = detection_grammar(p);
            let (first, second) = options(p);
            for option in [first, second] {
                let sentence = option.trim_matches('"');
                let text = format!("It adds up.\n{sentence}");
                let mut s = feed(&c, &g, text.as_bytes());
                assert!(
                    matches!(s.allowed(&[256]), Allowed::Tokens(t) if t == [256])
                        || matches!(s.allowed(&[256]), Allowed::StopOnly)
                );
                assert!(
                    matches!(parse_detection(&text), Verdict::Scored(_)),
                    "{text}"
                );
            }
            let mut s = feed(&c, &g, &[b'x'; 384]);
            assert_eq!(
                s.allowed(&[256]),
                Allowed::Tokens(vec![u32::from(b'\n')]),
                "{p:?}"
            );
        }
        // Fennec's explanation lines are cut alike.
        let mut s = feed(
            &c,
            crate::judge::fennec::SINGLE_RESULT_GRAMMAR,
            format!("Response Score: 4\nExplanation: {}", "y".repeat(128)).as_bytes(),
        );
        assert!(
            matches!(s.allowed(&[256]), Allowed::Tokens(t) if t == [256])
                || matches!(s.allowed(&[256]), Allowed::StopOnly)
        );
    }

    #[test]
    fn prompt_1a_matches_the_authors_text() {
        let p = detection_prompt(DetectionPrompt::P1, "IN", "OUT");
        let expected = "We provide an input to a language model (model input) and a response from the model (model response). Your task is to detect errors in the model response. You need to check whether the model response follows all instructions and requirements in the model input. You need to classify the model response as an error if the model response does not follow any of the instructions or requirements in the model input.\n\n===== Model Input Begins =====\n\nIN\n\n===== Model Input Ends =====\n\n===== Model Response Begins =====\n\nOUT\n\n===== Model Response Ends =====\n\nIn your response, provide your explanation first and conclude your response with \"Therefore, the model response contains an error.\" or \"Therefore, the model response contains no error.\"";
        assert_eq!(p, expected);
    }

    #[test]
    fn all_prompts_match_the_authors_rendering() {
        // Rendered by the authors' prompt.py with input=IN, response=OUT.
        let text = include_str!("../../data/realmistake/rendered_prompts.json");
        let v: serde_json::Value = serde_json::from_str(text).expect("fixture parses");
        let cases = [
            ("prompt_1", DetectionPrompt::P1),
            ("prompt_2", DetectionPrompt::P2),
            ("prompt_3", DetectionPrompt::P3),
            ("prompt_4", DetectionPrompt::P4),
            ("evaluation_steps", DetectionPrompt::EvaluationSteps),
        ];
        for (key, prompt) in cases {
            assert_eq!(
                v["prompts"][key].as_str(),
                Some(detection_prompt(prompt, "IN", "OUT").as_str()),
                "{key}"
            );
        }
    }

    #[test]
    fn prompt_option_orders() {
        let tail = |p| {
            let s = detection_prompt(p, "i", "r");
            s[s.rfind("conclude your response with").unwrap_or(0)..].to_string()
        };
        assert!(tail(DetectionPrompt::P2).ends_with(
            "\"Therefore, the model response contains no error.\" or \"Therefore, the model response contains an error.\""
        ));
        assert!(tail(DetectionPrompt::P3).ends_with(
            "\"Therefore, the model response is not valid.\" or \"Therefore, the model response is valid.\""
        ));
        assert!(tail(DetectionPrompt::P4).ends_with(
            "\"Therefore, the model response is valid.\" or \"Therefore, the model response is not valid.\""
        ));
        let p3 = detection_prompt(DetectionPrompt::P3, "i", "r");
        assert!(p3.contains("classify the model response as valid only if"));
        let steps = detection_prompt(DetectionPrompt::EvaluationSteps, "i", "r");
        assert!(steps.starts_with(&detection_prompt(DetectionPrompt::P1, "i", "r")));
        assert!(steps.ends_with("4. Select your answer from \"Therefore, the model response contains an error.\" or \"Therefore, the model response contains no error.\""));
    }

    #[test]
    fn verdict_rule() {
        let cases: &[(&str, Option<Detection>)] = &[
            (
                "... Therefore, the model response contains an error.",
                Some(Detection::Error),
            ),
            (
                "Therefore, the model response contains no error.",
                Some(Detection::NoError),
            ),
            (
                "Therefore, the model response is not valid.",
                Some(Detection::Error),
            ),
            (
                "Therefore, the model response is valid.",
                Some(Detection::NoError),
            ),
            // Both kinds: the published predictions say no error.
            (
                "It contains an error? No: the response contains no error.",
                Some(Detection::NoError),
            ),
            // The authors' third no-error phrase, checked before the error phrases.
            (
                "The reasoning in the model response is correct, but it does not follow the \
                 instruction. Therefore, the model response contains an error.",
                Some(Detection::NoError),
            ),
            ("The model response is correct.", Some(Detection::NoError)),
            // Case-sensitive, as the authors' substring test.
            ("THE RESPONSE CONTAINS AN ERROR", None),
            ("The model response contains a minor error.", None),
            ("", None),
        ];
        for (reply, want) in cases {
            assert_eq!(parse_detection(reply).scored().copied(), *want, "{reply:?}");
        }
    }

    #[test]
    fn prompt_numbers_round_trip() {
        for p in DetectionPrompt::SIMPLE {
            assert_eq!(
                DetectionPrompt::from_number(p.number().unwrap_or(0)),
                Some(p)
            );
        }
        assert_eq!(DetectionPrompt::from_number(0), None);
        assert_eq!(DetectionPrompt::from_number(5), None);
        assert_eq!(
            DetectionPrompt::P4.file_stem(),
            "baseline_errordetection_prompt_4"
        );
    }
}
