//! Thinking models: how a chat template's family marks the reasoning a model writes before
//! its answer, the per-role switch that turns it on or off ([`Thinking`]), and the split of a
//! generated reply into reasoning and answer ([`ReasoningFormat::split`]).
//!
//! Three families are known: `<think>…</think>` (Qwen3, DeepSeek-R1 and -V3.1, GLM-4.7 and the
//! templates that open `<think>` themselves at the end of the generation prompt, or close it
//! there when thinking is off), Mistral's `[THINK]…[/THINK]`
//! (Magistral, Ministral 3 Reasoning: control tokens the model writes itself) and OpenAI's
//! Harmony format (gpt-oss: an `analysis` channel, then the `final` channel). The family is read from the
//! template's source, never guessed from a reply. This module neither generates nor scores:
//! the engine splits its replies here, and callers only ever parse the answer.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const MISTRAL_OPEN: &str = "[THINK]";
const MISTRAL_CLOSE: &str = "[/THINK]";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const START: &str = "<|start|>";
/// Harmony's message ends: `<|end|>` closes a message the model continues after, `<|return|>`
/// and `<|call|>` end its turn.
const HARMONY_ENDS: [&str; 3] = ["<|end|>", "<|return|>", "<|call|>"];

/// What a reasoning block looks like in a model's replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningFormat {
    /// No reasoning block: the whole reply is the answer.
    Plain,
    /// `<think>reasoning</think>answer`; the generation prompt may open `<think>` itself.
    Think,
    /// `[THINK]reasoning[/THINK]answer` (Mistral's reasoning models), nothing between the
    /// close and the answer.
    Mistral,
    /// Harmony channels: `<|channel|>analysis<|message|>…<|end|>` messages, then
    /// `<|start|>assistant<|channel|>final<|message|>answer`.
    Harmony,
}

/// A reply split into its reasoning and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The reasoning, trimmed; `None` when the reply has no reasoning block.
    pub reasoning: Option<String>,
    /// The answer; `None` when the reasoning was never closed (the reply ended inside it).
    pub answer: Option<String>,
}

impl ReasoningFormat {
    /// The family a chat template's source belongs to.
    pub fn from_template(source: &str) -> ReasoningFormat {
        if source.contains(CHANNEL) && source.contains(MESSAGE) {
            ReasoningFormat::Harmony
        } else if source.contains(THINK_OPEN) || source.contains(THINK_CLOSE) {
            ReasoningFormat::Think
        } else if source.contains(MISTRAL_OPEN) && source.contains(MISTRAL_CLOSE) {
            ReasoningFormat::Mistral
        } else {
            ReasoningFormat::Plain
        }
    }

    /// Whether a reply to a prompt that ends with `prompt_tail` starts inside its reasoning:
    /// a `<think>` template that opened the block in the generation prompt, or Harmony, whose
    /// replies begin with a channel (the analysis one unless the model skips it).
    pub fn starts_open(self, prompt: &str) -> bool {
        match self {
            ReasoningFormat::Plain => false,
            ReasoningFormat::Think => prompt.trim_end().ends_with(THINK_OPEN),
            ReasoningFormat::Mistral => prompt.trim_end().ends_with(MISTRAL_OPEN),
            ReasoningFormat::Harmony => true,
        }
    }

    /// The text that opens a reasoning block when the reply must open it itself (`<think>`,
    /// `[THINK]`); `None` when there is none to wait for.
    pub fn open_marker(self) -> Option<&'static str> {
        match self {
            ReasoningFormat::Think => Some(THINK_OPEN),
            ReasoningFormat::Mistral => Some(MISTRAL_OPEN),
            _ => None,
        }
    }

    /// The text after which the answer begins.
    pub fn close_marker(self) -> Option<&'static str> {
        match self {
            ReasoningFormat::Plain => None,
            ReasoningFormat::Think => Some(THINK_CLOSE),
            ReasoningFormat::Mistral => Some(MISTRAL_CLOSE),
            ReasoningFormat::Harmony => Some("<|channel|>final<|message|>"),
        }
    }

    /// What is forced into a reply whose reasoning reached its budget: the block's close and
    /// whatever the family writes between it and the answer.
    pub fn forced_close(self) -> Option<&'static str> {
        match self {
            ReasoningFormat::Plain => None,
            ReasoningFormat::Think => Some("</think>\n\n"),
            ReasoningFormat::Mistral => Some(MISTRAL_CLOSE),
            ReasoningFormat::Harmony => {
                Some("<|end|><|start|>assistant<|channel|>final<|message|>")
            }
        }
    }

    /// Whether the start of a reply, `head`, could still become the opening of its reasoning
    /// block (a streamed reply cannot yet say which part its text belongs to).
    pub fn undecided(self, head: &str, starts_open: bool) -> bool {
        match self {
            ReasoningFormat::Think if !starts_open => THINK_OPEN.starts_with(head.trim_start()),
            ReasoningFormat::Mistral if !starts_open => MISTRAL_OPEN.starts_with(head.trim_start()),
            ReasoningFormat::Harmony => !head.is_empty() && CHANNEL.starts_with(head),
            _ => head.is_empty(),
        }
    }

    /// Splits a generated reply (decoded with its control tokens, without the stop token);
    /// `starts_open` is [`ReasoningFormat::starts_open`] of its prompt.
    pub fn split(self, reply: &str, starts_open: bool) -> Split {
        match self {
            ReasoningFormat::Plain => Split {
                reasoning: None,
                answer: Some(reply.to_string()),
            },
            ReasoningFormat::Think => split_block(reply, starts_open, THINK_OPEN, THINK_CLOSE),
            ReasoningFormat::Mistral => {
                split_block(reply, starts_open, MISTRAL_OPEN, MISTRAL_CLOSE)
            }
            ReasoningFormat::Harmony => split_harmony(reply),
        }
    }
}

/// A reply of a block family: `open` reasoning `close` answer.
fn split_block(reply: &str, starts_open: bool, open: &str, close: &str) -> Split {
    let body = if starts_open {
        reply
    } else {
        match reply.trim_start().strip_prefix(open) {
            Some(rest) => rest,
            None => {
                return Split {
                    reasoning: None,
                    answer: Some(reply.to_string()),
                }
            }
        }
    };
    match body.find(close) {
        Some(at) => Split {
            reasoning: Some(body[..at].trim().to_string()),
            answer: Some(body[at + close.len()..].trim_start().to_string()),
        },
        None => Split {
            reasoning: Some(body.trim().to_string()),
            answer: None,
        },
    }
}

/// Harmony: every message that is not on the `final` channel is reasoning (`analysis`, and
/// `commentary` preambles); the `final` message is the answer. Text outside any channel (a
/// model that ignores the format) is the answer.
fn split_harmony(reply: &str) -> Split {
    if !reply.contains(CHANNEL) {
        return Split {
            reasoning: None,
            answer: Some(reply.to_string()),
        };
    }
    let mut reasoning: Vec<&str> = Vec::new();
    let mut answer: Option<String> = None;
    for segment in reply.split(START) {
        let segment = segment.strip_prefix("assistant").unwrap_or(segment);
        let (Some(c), Some(m)) = (segment.find(CHANNEL), segment.find(MESSAGE)) else {
            let text = strip_harmony_end(segment).trim();
            if !text.is_empty() {
                answer.get_or_insert_with(String::new).push_str(text);
            }
            continue;
        };
        if m < c {
            continue;
        }
        let header = &segment[c + CHANNEL.len()..m];
        let body = strip_harmony_end(&segment[m + MESSAGE.len()..]);
        if header.split_whitespace().next() == Some("final") {
            answer.get_or_insert_with(String::new).push_str(body);
        } else {
            reasoning.push(body.trim());
        }
    }
    Split {
        reasoning: (!reasoning.is_empty()).then(|| reasoning.join("\n\n")),
        answer,
    }
}

/// A message body up to its end marker.
fn strip_harmony_end(body: &str) -> &str {
    let end = HARMONY_ENDS
        .iter()
        .filter_map(|m| body.find(m))
        .min()
        .unwrap_or(body.len());
    &body[..end]
}

/// The per-role switch `--thinking` / `--judge-thinking`, passed to the chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Thinking {
    Off,
    On,
    Low,
    Medium,
    High,
}

impl Thinking {
    /// The template variables this setting passes: `enable_thinking` (Qwen3, GLM-4.7 and
    /// other `<think>` templates), `thinking` (DeepSeek-V3.1's published template reads only
    /// this one; llama.cpp's copy falls back to `enable_thinking`; Kimi and Granite read it
    /// too) and, for a level, `reasoning_effort` (gpt-oss).
    pub fn template_kwargs(self) -> Vec<(&'static str, serde_json::Value)> {
        let switch = |on: bool| {
            vec![
                ("enable_thinking", serde_json::Value::Bool(on)),
                ("thinking", serde_json::Value::Bool(on)),
            ]
        };
        let effort = |e: &str| {
            let mut kwargs = switch(true);
            kwargs.push(("reasoning_effort", serde_json::Value::from(e)));
            kwargs
        };
        match self {
            Thinking::Off => switch(false),
            Thinking::On => switch(true),
            Thinking::Low => effort("low"),
            Thinking::Medium => effort("medium"),
            Thinking::High => effort("high"),
        }
    }
}

impl fmt::Display for Thinking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Thinking::Off => "off",
            Thinking::On => "on",
            Thinking::Low => "low",
            Thinking::Medium => "medium",
            Thinking::High => "high",
        })
    }
}

impl FromStr for Thinking {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "off" => Thinking::Off,
            "on" => Thinking::On,
            "low" => Thinking::Low,
            "medium" => Thinking::Medium,
            "high" => Thinking::High,
            other => {
                return Err(format!(
                    "{other:?} is not one of off, on, low, medium, high"
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = include_str!("../../tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja");
    const GPT_OSS: &str = include_str!("../../tests/fixtures/templates/openai-gpt-oss-120b.jinja");
    const QWEN25: &str =
        include_str!("../../tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    const MINISTRAL3: &str = include_str!(
        "../../tests/fixtures/templates/mistralai-Ministral-3-14B-Reasoning-2512.jinja"
    );
    const MISTRAL_SMALL: &str =
        include_str!("../../tests/fixtures/templates/Mistral-Small-3.2-24B-Instruct-2506.jinja");

    fn split(f: ReasoningFormat, reply: &str, open: bool) -> (Option<String>, Option<String>) {
        let s = f.split(reply, open);
        (s.reasoning, s.answer)
    }

    fn want(reasoning: Option<&str>, answer: Option<&str>) -> (Option<String>, Option<String>) {
        (reasoning.map(String::from), answer.map(String::from))
    }

    #[test]
    fn family_comes_from_the_template() {
        assert_eq!(
            ReasoningFormat::from_template(QWEN3),
            ReasoningFormat::Think
        );
        assert_eq!(
            ReasoningFormat::from_template(GPT_OSS),
            ReasoningFormat::Harmony
        );
        assert_eq!(
            ReasoningFormat::from_template(QWEN25),
            ReasoningFormat::Plain
        );
        assert_eq!(
            ReasoningFormat::from_template(MINISTRAL3),
            ReasoningFormat::Mistral
        );
        assert_eq!(
            ReasoningFormat::from_template(MISTRAL_SMALL),
            ReasoningFormat::Plain
        );
    }

    #[test]
    fn mistral_think_blocks_split_from_the_answer() {
        let m = ReasoningFormat::Mistral;
        // Ministral 3 Reasoning writes `[THINK]` itself: its prompt never opens the block.
        assert!(!m.starts_open("[INST]Hi[/INST]"));
        assert_eq!(
            split(m, "[THINK]score: 1? No.[/THINK]score: 9", false),
            want(Some("score: 1? No."), Some("score: 9"))
        );
        assert_eq!(split(m, "Yes.", false), want(None, Some("Yes.")));
        // Cut inside the reasoning: no answer, never a verdict read from the reasoning.
        assert_eq!(
            split(m, "[THINK]score: 3, or", false),
            want(Some("score: 3, or"), None)
        );
        // The other families' markers are answer text here, and the reverse.
        assert_eq!(
            split(m, "<think>a</think>b", false),
            want(None, Some("<think>a</think>b"))
        );
        assert_eq!(
            split(ReasoningFormat::Think, "[THINK]a[/THINK]b", false),
            want(None, Some("[THINK]a[/THINK]b"))
        );
        // The budget closes the block with the close marker alone, and a streamed reply is
        // undecided while its head could still become `[THINK]`.
        assert_eq!(m.forced_close(), Some("[/THINK]"));
        assert_eq!(m.open_marker(), Some("[THINK]"));
        assert!(m.undecided("[TH", false));
        assert!(!m.undecided("The", false));
    }

    #[test]
    fn think_blocks_split_from_the_answer() {
        let t = ReasoningFormat::Think;
        // The reply opens the block itself.
        assert_eq!(
            split(
                t,
                "<think>\nscore: 1 looks wrong\n</think>\n\nscore: 9",
                false
            ),
            want(Some("score: 1 looks wrong"), Some("score: 9"))
        );
        // The prompt opened it (the reply starts inside the reasoning).
        assert_eq!(
            split(t, "hmm\n</think>\n\nYes.", true),
            want(Some("hmm"), Some("Yes."))
        );
        // No block at all (thinking off: the template wrote an empty one in the prompt).
        assert_eq!(split(t, "Yes.", false), want(None, Some("Yes.")));
        // Cut inside the reasoning: no answer.
        assert_eq!(
            split(t, "<think>\nlet me see, score: 3", false),
            want(Some("let me see, score: 3"), None)
        );
        assert_eq!(
            split(t, "still thinking", true),
            want(Some("still thinking"), None)
        );
        // A `</think>` in the answer of a reply without a block is answer text.
        assert_eq!(
            split(t, "a </think> b", false),
            want(None, Some("a </think> b"))
        );
    }

    #[test]
    fn harmony_channels_split_from_the_answer() {
        let h = ReasoningFormat::Harmony;
        let reply = "<|channel|>analysis<|message|>The user says 2+2. Verdict: wrong?<|end|><|start|>assistant<|channel|>final<|message|>Verdict: correct";
        assert_eq!(
            split(h, reply, true),
            want(
                Some("The user says 2+2. Verdict: wrong?"),
                Some("Verdict: correct")
            )
        );
        // Cut inside the analysis channel.
        assert_eq!(
            split(h, "<|channel|>analysis<|message|>Thinking about", true),
            want(Some("Thinking about"), None)
        );
        // Commentary preambles are reasoning too; a constrained final message.
        let reply = "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>b<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>{\"x\":1}<|return|>";
        assert_eq!(
            split(h, reply, true),
            want(Some("a\n\nb"), Some("{\"x\":1}"))
        );
        // A model that ignores the format answers in plain text.
        assert_eq!(split(h, "4", true), want(None, Some("4")));
    }

    #[test]
    fn prompts_that_open_the_block() {
        let t = ReasoningFormat::Think;
        assert!(t.starts_open("<|im_start|>assistant\n<think>\n"));
        assert!(!t.starts_open("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert!(!t.starts_open("<|im_start|>assistant\n"));
        assert!(ReasoningFormat::Harmony.starts_open("<|start|>assistant"));
        assert!(!ReasoningFormat::Plain.starts_open("<think>"));
    }

    /// The prompt of a case in `tests/fixtures/templates/rendered/{name}.json` (as llama-server
    /// renders it).
    fn rendered_prompt(name: &str, case: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/templates/rendered/{name}.json"));
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == case)
            .unwrap_or_else(|| panic!("{name}: no case {case:?}"))["prompt"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// DeepSeek-V3.1, GLM-4.7-Flash and DeepSeek-R1 (the distills' template and llama.cpp's)
    /// are `<think>` templates that open the block in the generation prompt when thinking is
    /// on and close it there when it is off; GLM-4.5/4.6/4.7's template leaves `<think>` to
    /// the model and closes an empty block when thinking is off: read from their prompts as
    /// llama-server renders them, a reply starts inside its reasoning exactly when the prompt
    /// opened it, and its answer is what follows `</think>`, never a verdict from the
    /// reasoning.
    #[test]
    fn deepseek_and_glm_prompts_open_or_close_the_block() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        for (name, case, open, tail) in [
            // DeepSeek-V3.1: `<think>` with `thinking` (or, in llama.cpp's copy,
            // `enable_thinking`), `<think></think>` without.
            (
                "deepseek-ai-DeepSeek-V3.1",
                "user, thinking on",
                true,
                "<｜Assistant｜><think>",
            ),
            (
                "deepseek-ai-DeepSeek-V3.1",
                "user, template default",
                true,
                "<｜Assistant｜><think>",
            ),
            (
                "deepseek-ai-DeepSeek-V3.1",
                "user, thinking off",
                false,
                "<｜Assistant｜><think></think>",
            ),
            (
                "deepseek-ai-DeepSeek-V3.1",
                "user, enable_thinking off",
                false,
                "<think></think>",
            ),
            (
                "deepseek-ai-DeepSeek-V3.1",
                "history, template default",
                true,
                "<｜Assistant｜><think>",
            ),
            (
                "deepseek-ai-DeepSeek-V3.1",
                "history, thinking off",
                false,
                "<think></think>",
            ),
            // GLM-4.7-Flash: `<think>` opened, `</think>` alone with `enable_thinking` false.
            (
                "GLM-4.7-Flash",
                "user, thinking on",
                true,
                "<|assistant|><think>",
            ),
            (
                "GLM-4.7-Flash",
                "user, thinking off",
                false,
                "<|assistant|></think>",
            ),
            (
                "GLM-4.7-Flash",
                "history, template default",
                true,
                "<|assistant|><think>",
            ),
            (
                "GLM-4.7-Flash",
                "history, thinking off",
                false,
                "<|assistant|></think>",
            ),
            // GLM-4.5/4.6/4.7: the model opens `<think>` itself after `<|assistant|>`; with
            // `enable_thinking` false the prompt closes an empty block (and each user message
            // ends with `/nothink`).
            ("GLM-4.6", "user, thinking on", false, "<|assistant|>"),
            ("GLM-4.6", "user, template default", false, "<|assistant|>"),
            (
                "GLM-4.6",
                "user, thinking off",
                false,
                "/nothink<|assistant|>\n<think></think>",
            ),
            (
                "GLM-4.6",
                "user /nothink, thinking off",
                false,
                "Hi /nothink<|assistant|>\n<think></think>",
            ),
            (
                "GLM-4.6",
                "history, template default",
                false,
                "<|assistant|>",
            ),
            (
                "GLM-4.6",
                "history, thinking off",
                false,
                "/nothink<|assistant|>\n<think></think>",
            ),
            // DeepSeek-R1: `<think>\n` opened; the distills' template (llama.cpp's copy)
            // closes it at once with `enable_thinking` false.
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                "user, template default",
                true,
                "<｜Assistant｜><think>\n",
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                "user, thinking off",
                false,
                "<think>\n</think>",
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                "history, thinking off",
                false,
                "<think>\n</think>",
            ),
            (
                "llama-cpp-deepseek-r1",
                "user, template default",
                true,
                "<｜Assistant｜><think>\n",
            ),
            (
                "llama-cpp-deepseek-r1",
                "history, template default",
                true,
                "<｜Assistant｜><think>\n",
            ),
        ] {
            let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
            let format = ReasoningFormat::from_template(&src);
            assert_eq!(format, ReasoningFormat::Think, "{name}");
            let prompt = rendered_prompt(name, case);
            assert!(prompt.ends_with(tail), "{name}: {case}: {prompt:?}");
            assert_eq!(format.starts_open(&prompt), open, "{name}: {case}");
            // Each reply splits into the reasoning and the answer; the one cut inside its
            // reasoning has no answer.
            let assert_splits = |replies: [&str; 2], cut: &str| {
                for reply in replies {
                    assert_eq!(
                        split(format, reply, open),
                        want(
                            Some("The user asks 2+2. Verdict: wrong?"),
                            Some("Verdict: correct")
                        ),
                        "{name}: {case}"
                    );
                }
                assert_eq!(
                    split(format, cut, open),
                    want(Some("Verdict: wrong? Let me"), None),
                    "{name}: {case}"
                );
            };
            if open {
                // DeepSeek-V3.1 and GLM close with a bare `</think>`, R1 with `\n</think>\n\n`.
                assert_splits(
                    [
                        "The user asks 2+2. Verdict: wrong?</think>Verdict: correct",
                        "\nThe user asks 2+2. Verdict: wrong?\n</think>\n\nVerdict: correct",
                    ],
                    "Verdict: wrong? Let me",
                );
            } else {
                // The prompt closed the block, or the model did not open it: the whole reply
                // is the answer.
                assert_eq!(
                    split(format, "Verdict: correct", open),
                    want(None, Some("Verdict: correct")),
                    "{name}: {case}"
                );
                if !prompt.ends_with("</think>") {
                    // Left to the model (GLM-4.6 thinking): its reply opens the block.
                    assert_splits(
                        [
                            "<think>The user asks 2+2. Verdict: wrong?</think>\nVerdict: correct",
                            "\n<think>\nThe user asks 2+2. Verdict: wrong?\n</think>\n\nVerdict: correct",
                        ],
                        "<think>Verdict: wrong? Let me",
                    );
                }
            }
        }
    }

    #[test]
    fn thinking_switch_parses_and_names_its_kwargs() {
        for s in ["off", "on", "low", "medium", "high"] {
            assert_eq!(s.parse::<Thinking>().unwrap().to_string(), s);
        }
        assert!("max".parse::<Thinking>().unwrap_err().contains("off, on"));
        assert_eq!(
            Thinking::High.template_kwargs(),
            vec![
                ("enable_thinking", serde_json::Value::Bool(true)),
                ("thinking", serde_json::Value::Bool(true)),
                ("reasoning_effort", serde_json::Value::from("high"))
            ]
        );
        assert_eq!(
            Thinking::Off.template_kwargs(),
            vec![
                ("enable_thinking", serde_json::Value::Bool(false)),
                ("thinking", serde_json::Value::Bool(false)),
            ]
        );
    }
}
