//! Report tables, for every benchmark alike: an identifier, a title, columns and rows (among
//! them the replies that stopped at their length limit, per step kind, which every run
//! reports).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::plan::Transcript;
use crate::engine::StopReason;

/// A table for reports: an identifier, a title, column names and rows of cells already
/// formatted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// What the table is, for code that looks for it (the HTML report's charts): one of
    /// [`table_id`]'s, or another snake_case name unique within a protocol's tables. Titles
    /// are for people and may change.
    #[serde(default)]
    pub id: String,
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// The identifiers of the tables that reports look for.
pub mod table_id {
    /// [`super::length_limit_table`].
    pub const LENGTH_LIMIT: &str = "length_limit";
    /// Notes of the run (`smoke test`, …), every protocol.
    pub const RUN_NOTES: &str = "run_notes";
    /// FB-Bench: the published leaderboard and its per-category tables.
    pub const FBBENCH_OVERALL: &str = "overall_score";
    pub const FBBENCH_PER_TASK: &str = "per_task_score";
    pub const FBBENCH_PER_ERROR: &str = "per_error_score";
    pub const FBBENCH_PER_FEEDBACK_CORRECT: &str = "per_feedback_score_correct";
    pub const FBBENCH_PER_FEEDBACK_ANTISYCO: &str = "per_feedback_score_antisyco";
    /// RefuteBench: RR and FA by context depth and setting.
    pub const REFUTEBENCH_GROUPS: &str = "refutebench_groups";
    /// ReaLMistake.
    pub const REALMISTAKE_PER_DETECTOR: &str = "realmistake_per_detector";
    pub const REALMISTAKE_PER_TASK_PROMPT: &str = "realmistake_per_task_prompt";
    pub const REALMISTAKE_RANDOM_BASELINE: &str = "realmistake_random_baseline";
    /// Fennec: pairwise agreement and consistency, single-verdict accuracy, judge replies.
    pub const FENNEC_PAIRWISE: &str = "fennec_pairwise";
    pub const FENNEC_SINGLE: &str = "fennec_single";
    pub const FENNEC_REPLIES: &str = "fennec_replies";
}

/// The kind of a step, for counts: its key without what follows a `+` (RefuteBench's
/// `+dropped=` record), with every numeric part written `*` (`turn/3` → `turn/*`,
/// `pairwise/0/normal` → `pairwise/*/normal`).
pub fn step_kind(key: &str) -> String {
    let key = key.split('+').next().unwrap_or(key);
    key.split('/')
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Per step kind: finished replies, those that stopped at their new-token limit (cut short:
/// a verdict or score after the cut is lost), those that stopped because the context was full,
/// and steps whose conversation lost earlier turns to fit the context.
pub fn length_limit_table<'a>(transcripts: impl IntoIterator<Item = &'a Transcript>) -> Table {
    let mut counts: BTreeMap<String, [usize; 4]> = BTreeMap::new();
    for done in transcripts {
        for (key, out) in done {
            let c = counts.entry(step_kind(key)).or_default();
            c[0] += 1;
            c[1] += usize::from(out.stop_reason == StopReason::MaxTokens);
            c[2] += usize::from(out.stop_reason == StopReason::ContextFull);
            c[3] += usize::from(key.contains("+dropped=") || out.truncated.is_some());
        }
    }
    Table {
        id: table_id::LENGTH_LIMIT.to_string(),
        title: "Replies stopped at the length limit".to_string(),
        columns: [
            "step kind",
            "replies",
            "stopped at max_new_tokens",
            "context full",
            "lost earlier turns",
        ]
        .map(String::from)
        .to_vec(),
        rows: counts
            .into_iter()
            .map(|(k, c)| {
                let mut row = vec![k];
                row.extend(c.iter().map(usize::to_string));
                row
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::plan::StepOutput;

    #[test]
    fn kinds_and_length_limit_counts() {
        assert_eq!(step_kind("turn/3+dropped=0,1"), "turn/*");
        assert_eq!(step_kind("pairwise/0/normal"), "pairwise/*/normal");
        assert_eq!(step_kind("detector/1/prompt/5"), "detector/*/prompt/*");
        assert_eq!(step_kind("judge"), "judge");
        let cut = StepOutput {
            stop_reason: StopReason::MaxTokens,
            ..StepOutput::scripted("Response A Score: 4")
        };
        let a: Transcript = [
            ("turn/0".to_string(), StepOutput::scripted("x")),
            ("turn/2+dropped=0".to_string(), cut.clone()),
            ("fa/1".to_string(), cut),
        ]
        .into_iter()
        .collect();
        let b: Transcript = [("turn/0".to_string(), StepOutput::scripted("y"))]
            .into_iter()
            .collect();
        let t = length_limit_table([&a, &b]);
        assert_eq!(
            t.rows,
            [["fa/*", "1", "1", "0", "0"], ["turn/*", "3", "1", "0", "1"],]
        );
    }
}
