//! What a run passes to the models' chat templates beside the messages, per role: the
//! thinking switch (`--thinking` for candidates, `--judge-thinking` for judges), the reasoning
//! budget (`--max-thinking-tokens`) and the date `strftime_now` renders (`--template-date`,
//! by default the day the run started). Recorded in the manifest's identity, so a resume,
//! `candor verify` or a rerun on another day renders the same prompts. The runner applies it to
//! every request ([`ChatSettings::apply`]); what the template does with it is the engine's.

use serde::{Deserialize, Serialize};

use crate::bench::plan::Actor;
use crate::engine::ChatRequest;
use crate::text::reasoning::Thinking;
use crate::text::template_date::TemplateDate;

/// The chat-template settings of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatSettings {
    /// The date templates render (`strftime_now`).
    pub template_date: TemplateDate,
    /// The candidates' thinking switch; absent: the template's own default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Thinking>,
    /// The judges' thinking switch; absent: the template's own default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_thinking: Option<Thinking>,
    /// Reasoning tokens allowed before the block is closed (every role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_thinking_tokens: Option<usize>,
}

impl ChatSettings {
    /// The thinking switch of `actor`'s role.
    pub fn thinking_of(&self, actor: Actor) -> Option<Thinking> {
        match actor {
            Actor::Candidate(_) => self.thinking,
            Actor::Judge | Actor::Panel(_) => self.judge_thinking,
        }
    }

    /// Sets `request`'s template variables, date and reasoning budget for `actor`'s role.
    pub fn apply(&self, actor: Actor, request: &mut ChatRequest) {
        request.template.date = Some(self.template_date);
        if let Some(t) = self.thinking_of(actor) {
            for (k, v) in t.template_kwargs() {
                request.template.kwargs.insert(k.to_string(), v);
            }
        }
        request.max_thinking_tokens = self.max_thinking_tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_get_their_own_switch_and_everyone_the_date() {
        let s = ChatSettings {
            template_date: "2026-11-26".parse().unwrap(),
            thinking: Some(Thinking::Off),
            judge_thinking: Some(Thinking::High),
            max_thinking_tokens: Some(64),
        };
        let mut cand = ChatRequest::default();
        s.apply(Actor::Candidate(0), &mut cand);
        assert_eq!(cand.template.kwargs["enable_thinking"], false);
        assert!(!cand.template.kwargs.contains_key("reasoning_effort"));
        assert_eq!(cand.template.date.unwrap().to_string(), "2026-11-26");
        assert_eq!(cand.max_thinking_tokens, Some(64));
        for judge in [Actor::Judge, Actor::Panel(2)] {
            let mut r = ChatRequest::default();
            s.apply(judge, &mut r);
            assert_eq!(r.template.kwargs["reasoning_effort"], "high");
        }
        // The template's default: no variable at all.
        let mut r = ChatRequest::default();
        ChatSettings::default().apply(Actor::Judge, &mut r);
        assert!(r.template.kwargs.is_empty());
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"template_date": "2026-11-26", "thinking": "off",
                "judge_thinking": "high", "max_thinking_tokens": 64})
        );
    }
}
