//! The FB-Bench conversations: the follow-up a candidate answers, and the judge prompt for
//! its reply, both built from an [`Item`] exactly as the authors' code builds them.
//!
//! The follow-up is `gen_answer.py`'s: user query, the preset first response as the
//! assistant's turn, then the feedback; the candidate generates the second response. (The
//! authors add "You are a helpful assistant." only for a few API models; open-weight models
//! get no system prompt, so Candor adds none.) The judge prompt text lives in
//! [`crate::judge::checklist`]; this file only picks the template for the dataset version.

use super::data::{Item, Version};
use crate::judge::checklist::{self, ChecklistError, JudgeInput, Template};
use crate::text::message::Message;

/// The authors' per-task sampling temperatures (`utils.py` `temperature_config`; paper
/// appendix A.2.1); tasks not listed use the configured default, 0.
pub fn task_temperature(task_type: &str) -> f32 {
    match task_type {
        "Text Creation" | "Text Translation" => 0.7,
        "Knowledge Q&A" => 0.1,
        _ => 0.0,
    }
}

/// The conversation the candidate continues: query, preset response, feedback.
pub fn followup_messages(item: &Item) -> Vec<Message> {
    vec![
        Message::user(item.user_query.as_str()),
        Message::assistant(item.origin_first_response.as_str()),
        Message::user(item.feedback.as_str()),
    ]
}

/// The judge template of a dataset version.
pub fn judge_template(version: Version) -> Template {
    match version {
        Version::V1 => Template::V1,
        Version::V3 => Template::V3,
    }
}

/// The judge's conversation for a candidate's second response: one user message, no system
/// prompt (the authors' `system_prompt: null`).
pub fn judge_messages(
    version: Version,
    item: &Item,
    second_response: &str,
) -> Result<Vec<Message>, ChecklistError> {
    let criteria = item.criteria();
    let input = JudgeInput {
        user_query: &item.user_query,
        origin_first_response: &item.origin_first_response,
        feedback: &item.feedback,
        second_response,
        reference_second_response: item.reference_second_response.as_deref(),
        criteria: &criteria,
    };
    let prompt = checklist::render_prompt(judge_template(version), &input)?;
    Ok(vec![Message::user(prompt)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fbbench::data::parse_dataset;
    use crate::text::message::Role;
    use std::path::{Path, PathBuf};

    fn sample(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data/fbbench")
            .join(name)
    }

    fn load(name: &str) -> crate::bench::fbbench::data::Dataset {
        let path = sample(name);
        let text = std::fs::read(&path).expect("sample file");
        parse_dataset(text.as_slice(), &path).expect("sample parses")
    }

    /// The expected files were rendered by the authors' own code path
    /// (`data/fbbench/make_expected.py`: their YAML template, `str.format`, `json.dumps`).
    #[test]
    fn judge_prompts_match_the_authors_rendering() {
        for (file, version) in [
            ("sample_v3.json", Version::V3),
            ("sample_v1.json", Version::V1),
        ] {
            let data = load(file);
            assert_eq!(data.version, version, "{file}");
            let tag = if version == Version::V1 { "v1" } else { "v3" };
            for (i, item) in data.items.iter().enumerate() {
                let msgs = judge_messages(version, item, &format!("第二轮回答 {i}")).unwrap();
                assert_eq!(msgs.len(), 1);
                assert_eq!(msgs[0].role, Role::User);
                let expected_path = sample(&format!("expected/judge_prompt_{tag}_{i}.txt"));
                let expected = std::fs::read_to_string(&expected_path).unwrap();
                assert_eq!(msgs[0].content, expected, "{}", expected_path.display());
            }
        }
    }

    #[test]
    fn v1_prompt_needs_a_reference() {
        let data = load("sample_v3.json");
        let item = &data.items[0];
        assert_eq!(
            judge_messages(Version::V1, item, "x"),
            Err(ChecklistError::MissingReference)
        );
    }

    #[test]
    fn followup_is_query_preset_feedback() {
        let data = load("sample_v3.json");
        let m = followup_messages(&data.items[2]);
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
        assert_eq!(m[1].content, "返回 3。");
        assert_eq!(m[2].content, data.items[2].feedback);
        assert_eq!(task_temperature("Text Creation"), 0.7);
        assert_eq!(task_temperature("Knowledge Q&A"), 0.1);
        assert_eq!(task_temperature("Coding"), 0.0);
    }
}
