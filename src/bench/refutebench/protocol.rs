//! RefuteBench as a [`Protocol`]: dialogues (each turn the candidate's, each feedback turn
//! judged for acceptance by the judge) over the authors' files, scored into feedback
//! acceptance (FA) and response rate (RR).
//!
//! `--subset` selects data files by task (`qa`, `mt`, `email`), group or language pair
//! (`mt_en_zh`, `en-zh`, …), scenario (`single`, `multi`), verification (`memory`,
//! `generalization`) or setting (`memory_nc0` … `generalization_nc3`, the paper's Context=k);
//! parts joined by `/` must all match (`qa/memory_nc1`), several `--subset`s add up.
//! `--limit N` keeps the first N items in file order (files sorted by path), and only the
//! files those come from are read and hashed. `--recall` / `--recall-repeat` choose the
//! paper's recall strategies. When the candidate is a real model, conversations are kept
//! within its context, by the authors' policy (default: oldest messages first, budget the
//! model's maximum length − 261, that length 2,048 for LLaMA-2-class models) or Candor's
//! (`--truncation candor`), the dropped turns recorded and counted (see [`super::plan`]). A
//! chat template that rejects a system message runs without it, as the authors did for
//! Mistral. The FA judge must be named (`--judge`; the paper's is GPT-4).

use std::path::Path;

use serde_json::json;

use super::data::{list_files, load_file, Query};
use super::plan::{ContextLimit, Truncation, AUTHORS_TOKENS_PER_TURN};
use super::prompts::{RECALL_HEADER, RECALL_ITEM, REPEAT_SUFFIX};
use super::score::{self, ScoreOptions};
use super::source::{Setting, Source, Verification};
use super::{Item, RefutePlan, Strategy};
use crate::bench::item_scores::{self, CandidateScores, ItemScores};
use crate::bench::panel::{Panel, PanelRule};
use crate::bench::plan::Transcript;
use crate::bench::protocol::{
    judge_note, notes_table, require_dir, require_judge, select, smoke_test_note, template_version,
    OutputFile, Prepared, Protocol, ProtocolError, ProtocolOptions, RunContext, Scored,
};
use crate::bench::DataError;
use crate::engine::{Constraint, LLGUIDANCE_VERSION};
use crate::judge::feedback_acceptance;

/// RefuteBench.
#[derive(Debug, Clone, Copy, Default)]
pub struct RefuteBench;

/// The authors' maximum length for a model: its own, except 2,048 for LLaMA-2-class models
/// (whose tokenizers declare none, so the authors' code forces 2,048) and Alpaca.
fn authors_max_length(name: &str, context_len: usize) -> usize {
    let n = name.to_ascii_lowercase();
    if n.contains("llama-2") || n.contains("llama2") || n.contains("alpaca") {
        2048
    } else {
        context_len
    }
}

/// Which results a RefuteBench run is comparable with.
fn comparable_with(opts: &ProtocolOptions) -> &'static str {
    if opts.recall || opts.recall_repeat {
        "RefuteBench paper Table 4 / Table 8 (recall and recall-and-repeat), with Candor's open recall rule instead of the authors' unreleased classifier"
    } else {
        "RefuteBench paper Table 2 (FA judged by the named local judge, not GPT-4)"
    }
}

fn truncation(opts: &ProtocolOptions) -> Result<Truncation, ProtocolError> {
    match opts.truncation.as_deref() {
        None | Some("authors") => Ok(Truncation::Authors),
        Some("candor") => Ok(Truncation::Candor),
        Some(other) => Err(ProtocolError::bad_value(
            "--truncation",
            other,
            "refutebench has `authors` (default) and `candor`",
        )),
    }
}

/// The names `--subset` matches a data file against.
fn labels(source: &Source) -> Vec<String> {
    let mut out = vec![source.task.as_str().to_string()];
    if source.pair.is_some() {
        out.push(source.group());
    }
    out.extend(source.pair.clone());
    match source.setting {
        Setting::Multi => out.push("multi".into()),
        Setting::Single {
            verification,
            context,
        } => {
            out.push("single".into());
            out.push(
                match verification {
                    Verification::Memory => "memory",
                    Verification::Generalization => "generalization",
                }
                .into(),
            );
            out.push(format!("nc{context}"));
            out.push(source.setting.label());
        }
    }
    out
}

/// The selected items and the files they came from.
fn load_items(
    root: &Path,
    subsets: &[String],
    limit: Option<usize>,
) -> Result<(Vec<Item>, Vec<String>), ProtocolError> {
    require_dir(root, "RefuteBench data folder")?;
    let files = list_files(root)?;
    let sourced = files
        .iter()
        .map(|rel| {
            Source::from_rel_path(rel)
                .map(|s| (rel.clone(), s))
                .map_err(|message| DataError::Layout {
                    path: root.join(rel),
                    message,
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let chosen = select(sourced, subsets, |(_, s)| labels(s))?;
    let mut items = Vec::new();
    let mut read = Vec::new();
    for (rel, _) in chosen {
        if limit.is_some_and(|n| items.len() >= n) {
            break;
        }
        items.extend(load_file(root, &rel)?);
        read.push(rel);
    }
    if let Some(n) = limit {
        items.truncate(n);
    }
    Ok((items, read))
}

impl Protocol for RefuteBench {
    type Plan = RefutePlan;

    fn name(&self) -> &'static str {
        "refutebench"
    }

    fn options(&self) -> &'static [&'static str] {
        &[
            "--recall",
            "--recall-repeat",
            "--truncation",
            "--constrain",
            "--panel",
        ]
    }

    fn panels(&self) -> bool {
        true
    }

    fn prepare(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
    ) -> Result<Prepared<RefutePlan>, ProtocolError> {
        let truncation = truncation(opts)?;
        // The command line always asks the FA judge.
        let self_judging = require_judge(ctx, "refutebench", "GPT-4")?;
        let root = ctx.data.join("refutebench");
        let (items, files) = load_items(&root, &ctx.subsets, ctx.limit)?;
        let mut plan = RefutePlan::new(ctx.seed);
        plan.strategy = match (opts.recall, opts.recall_repeat) {
            (_, true) => Strategy::RecallRepeat,
            (true, false) => Strategy::Recall,
            (false, false) => Strategy::Vanilla,
        };
        plan.candidate.max_new_tokens = opts.cap(plan.candidate.max_new_tokens);
        plan.judge.max_new_tokens = opts.judge_cap(plan.judge.max_new_tokens);
        // Off by default: the authors' GPT-4 answered in free text, which the FA parser reads
        // (first word Yes/No); on, the answer is exactly Yes or No (recorded in the plan).
        if opts.constrain(false)? {
            plan.judge.constraint = Some(Constraint::Lark(
                feedback_acceptance::ANSWER_GRAMMAR.to_string(),
            ));
        }
        plan.truncation = truncation;
        plan.panel = Panel::from_run(ctx, opts)?;
        if let Some(c) = &ctx.candidate_context {
            let name = ctx.candidates.first().map_or("", String::as_str);
            let max_prompt_tokens = match truncation {
                Truncation::Candor => c.context_len.saturating_sub(plan.candidate.max_new_tokens),
                Truncation::Authors => authors_max_length(name, c.context_len)
                    .saturating_sub(AUTHORS_TOKENS_PER_TURN + plan.candidate.max_new_tokens),
            };
            plan.context = Some(ContextLimit {
                max_prompt_tokens,
                count: c.count.clone(),
                count_text: c.count_text.clone(),
            });
            plan.system_prompt = c.accepts_system;
        }
        let record = plan.record();
        let templates = [
            (
                "refutebench/fa_judge",
                feedback_acceptance::TEMPLATE.to_string(),
            ),
            (
                "refutebench/recall",
                format!("{RECALL_HEADER}{RECALL_ITEM}{REPEAT_SUFFIX}"),
            ),
        ];
        Ok(Prepared {
            data_files: files.iter().map(|rel| root.join(rel)).collect(),
            prompt_templates: templates
                .iter()
                .map(|(name, text)| (name.to_string(), template_version(text)))
                .collect(),
            settings: crate::bench::panel::settings(
                ctx,
                plan.panel,
                json!({
                    "subsets": ctx.subsets,
                    "limit": ctx.limit,
                    "files": files,
                    "plan": record,
                    "judge_constraint": plan.judge.constraint.as_ref().map(|c| json!({
                        "sha256": c.sha256(),
                        "llguidance": LLGUIDANCE_VERSION,
                    })),
                    "max_new_tokens": opts.max_new_tokens,
                    "judge_max_new_tokens": opts.judge_max_new_tokens,
                    "comparable_with": comparable_with(opts),
                    "self_judging": self_judging,
                }),
            ),
            decoding: json!({ "candidate": record.candidate, "judge": record.judge }),
            plan,
            items,
        })
    }

    /// A candidate turn per non-empty query and feedback slot, and an acceptance judgement
    /// per feedback slot: an estimate (a slot gets feedback only when one applies).
    fn planned_steps(&self, prepared: &Prepared<RefutePlan>, item: &Item) -> Option<usize> {
        let turns = item
            .queries
            .iter()
            .filter(|q| !matches!(q, Query::Text(t) if t.is_empty()))
            .count();
        let feedback = item
            .queries
            .iter()
            .filter(|q| matches!(q, Query::Feedback))
            .count();
        Some(
            turns
                + if prepared.plan.judge_feedback {
                    feedback * prepared.plan.panel.judges
                } else {
                    0
                },
        )
    }

    fn score(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
        prepared: &Prepared<RefutePlan>,
        runs: &[(&Item, &Transcript)],
    ) -> Scored {
        let plan = &prepared.plan;
        let score_opts = ScoreOptions {
            replay: plan.replay,
            bootstrap_seed: ctx.seed,
            panel: plan.panel,
        };
        let scored = score::score(runs, &score_opts);
        let mut results = scored.results;
        let judges = ctx.judges();
        if plan.panel.is_panel() {
            let who = (judges.as_slice(), ctx.candidates.as_slice());
            super::panel::add_judges(&mut results, runs, &score_opts, who);
        }
        // `prepare` checked that the judge was named.
        let self_judging = judges.iter().any(|j| ctx.candidates.iter().any(|c| c == j));
        let mut notes = vec![
            ("comparable with", comparable_with(opts).to_string()),
            judge_note(ctx, self_judging),
            (
                "truncation",
                format!("{:?}", plan.truncation).to_lowercase(),
            ),
            (
                "system prompt",
                if plan.system_prompt {
                    "sent"
                } else {
                    "not sent: the chat template rejects it"
                }
                .to_string(),
            ),
        ];
        if plan.panel.is_panel() {
            notes.push((
                "panel",
                format!(
                    "{} FA judges, {}: {}",
                    plan.panel.judges,
                    plan.panel.rule.as_str(),
                    match plan.panel.rule {
                        PanelRule::Majority =>
                            "a feedback turn is accepted when more judges said Yes than No (a tie is No)",
                        PanelRule::Mean => "a feedback turn counts the share of judges who said Yes",
                    }
                ),
            ));
        }
        notes.extend(smoke_test_note(ctx, &judges));
        results.tables.push(notes_table(&notes));
        let doc = ItemScores {
            protocol: "refutebench".to_string(),
            data: "refutebench".to_string(),
            scoring: match plan.panel.is_panel() {
                true => format!(
                    "RR rule-checked; FA judged by {}; panel={}",
                    judges.join(","),
                    plan.panel.rule.as_str()
                ),
                false => format!("RR rule-checked; FA judged by {}", judges.join(",")),
            },
            // Dialogues (RR's items) and their feedback turns (FA's), from the data alone.
            items: prepared
                .items
                .iter()
                .flat_map(|i| {
                    let turns = i.queries.iter().enumerate();
                    std::iter::once(i.id.clone()).chain(
                        turns
                            .filter(|(_, q)| **q == Query::Feedback)
                            .map(|(t, _)| format!("{}#{t}", i.id)),
                    )
                })
                .collect(),
            candidates: vec![CandidateScores {
                name: ctx.candidates.first().cloned().unwrap_or_default(),
                metrics: score::item_values(&scored.items),
            }],
        };
        Scored {
            results,
            outputs: vec![OutputFile {
                path: item_scores::FILE.into(),
                bytes: doc.to_json(),
                note: "per-item values of the headline metrics (for `candor compare`)".into(),
            }],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_labels_cover_task_pair_and_setting() {
        let s = Source::from_rel_path("mt/single/en-he.generalization.NC-3.jsonl").unwrap();
        assert_eq!(
            labels(&s),
            [
                "mt",
                "mt_en_he",
                "en-he",
                "single",
                "generalization",
                "nc3",
                "generalization_nc3"
            ]
        );
        let m = Source::from_rel_path("qa/multi/qa.jsonl").unwrap();
        assert_eq!(labels(&m), ["qa", "multi"]);
    }
}
