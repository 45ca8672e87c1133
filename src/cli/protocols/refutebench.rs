//! `candor run refutebench`: RefuteBench dialogues (each turn the candidate's, each feedback
//! turn judged for acceptance by the judge) over the authors' files, scored into feedback
//! acceptance (FA) and response rate (RR).
//!
//! `--subset` selects data files by task (`qa`, `mt`, `email`), group or language pair
//! (`mt_en_zh`, `en-zh`, …), scenario (`single`, `multi`), verification (`memory`, `generalization`) or setting
//! (`memory_nc0` … `generalization_nc3`, the paper's Context=k); parts joined by `/` must all
//! match (`qa/memory_nc1`), several `--subset`s add up. `--limit N` keeps the first N items in
//! file order (files sorted by path), and only the files those come from are read and hashed.
//! `--recall` / `--recall-repeat` choose the paper's recall strategies. When the candidate is a
//! real model, conversations are kept within its context, by the authors' policy (default:
//! oldest messages first, budget the model's maximum length − 261, that length 2,048 for
//! LLaMA-2-class models) or Candor's (`--truncation candor`), the dropped turns recorded and
//! counted (see [`crate::bench::refutebench::plan`]). A chat template that rejects a system
//! message runs without it, as the authors did for Mistral. The FA judge must be named
//! (`--judge`).

use std::path::Path;

use serde_json::json;

use super::{judge_note, notes_table, require_judge, select, template_version, ProtocolArgs};
use crate::bench::refutebench::data::{list_files, load_file};
use crate::bench::refutebench::plan::{ContextLimit, Truncation, AUTHORS_TOKENS_PER_TURN};
use crate::bench::refutebench::prompts::{RECALL_HEADER, RECALL_ITEM, REPEAT_SUFFIX};
use crate::bench::refutebench::source::{Setting, Source, Verification};
use crate::bench::refutebench::{Item, RefutePlan, Strategy};
use crate::cli::models::ModelInfo;
use crate::cli::run::{execute, ModelSpec, ProtocolSetup, RunConfig};
use crate::judge::feedback_acceptance;
use crate::model::chat::Message;

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
fn comparable_with(opts: &ProtocolArgs) -> &'static str {
    if opts.recall || opts.recall_repeat {
        "RefuteBench paper Table 4 / Table 8 (recall and recall-and-repeat), with Candor's open recall rule instead of the authors' unreleased classifier"
    } else {
        "RefuteBench paper Table 2 (FA judged by the named local judge, not GPT-4)"
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
) -> anyhow::Result<(Vec<Item>, Vec<String>)> {
    if !root.is_dir() {
        anyhow::bail!(
            "{}: the RefuteBench data folder was not found",
            root.display()
        );
    }
    let files = list_files(root)?;
    let sourced = files
        .iter()
        .map(|rel| {
            Source::from_rel_path(rel)
                .map(|s| (rel.clone(), s))
                .map_err(|m| anyhow::anyhow!("{}: {m}", root.join(rel).display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
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

pub fn run(cfg: &RunConfig, opts: &ProtocolArgs) -> anyhow::Result<()> {
    opts.check_unused(
        "refutebench",
        &["--recall", "--recall-repeat", "--truncation"],
    )?;
    let truncation = match opts.truncation.as_deref() {
        None | Some("authors") => Truncation::Authors,
        Some("candor") => Truncation::Candor,
        Some(other) => {
            anyhow::bail!(
                "--truncation {other:?}: refutebench has `authors` (default) and `candor`"
            )
        }
    };
    // The CLI always asks the FA judge.
    let self_judging = require_judge(cfg, "refutebench", "GPT-4")?;
    let root = cfg.data.join("refutebench");
    let (items, files) = load_items(&root, &cfg.subsets, cfg.limit)?;
    let mut plan = RefutePlan::new(cfg.seed);
    plan.strategy = match (opts.recall, opts.recall_repeat) {
        (_, true) => Strategy::RecallRepeat,
        (true, false) => Strategy::Recall,
        (false, false) => Strategy::Vanilla,
    };
    plan.candidate.max_new_tokens = opts.cap(plan.candidate.max_new_tokens);
    plan.judge.max_new_tokens = opts.cap(plan.judge.max_new_tokens);
    plan.truncation = truncation;
    if let ModelSpec::Engine(name) = &cfg.candidates[0] {
        let info = ModelInfo::inspect(name)?;
        let max_prompt_tokens = match truncation {
            Truncation::Candor => info
                .context_len
                .saturating_sub(plan.candidate.max_new_tokens),
            Truncation::Authors => authors_max_length(name, info.context_len)
                .saturating_sub(AUTHORS_TOKENS_PER_TURN + plan.candidate.max_new_tokens),
        };
        let tokenizer = std::sync::Arc::clone(&info.tokenizer);
        plan.context = Some(ContextLimit {
            max_prompt_tokens,
            count: info.token_counter(),
            count_text: std::sync::Arc::new(move |text: &str| {
                tokenizer.encode(text).map_or(usize::MAX, |ids| ids.len())
            }),
        });
        let (s, u) = (Message::system("s"), Message::user("u"));
        plan.system_prompt = info.template.render(&[s, u.clone()], true).is_ok()
            || info.template.render(&[u], true).is_err();
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
    let setup = ProtocolSetup {
        data_files: files.iter().map(|rel| root.join(rel)).collect(),
        prompt_templates: templates
            .iter()
            .map(|(name, text)| (name.to_string(), template_version(text)))
            .collect(),
        settings: json!({
            "subsets": cfg.subsets,
            "limit": cfg.limit,
            "files": files,
            "plan": record,
            "max_new_tokens": opts.max_new_tokens,
            "comparable_with": comparable_with(opts),
            "self_judging": self_judging,
        }),
        decoding: json!({ "candidate": record.candidate, "judge": record.judge }),
    };
    execute(cfg, setup, &plan, &items, |runs| {
        let mut r = plan.score(runs, cfg.seed);
        r.tables.push(notes_table(&[
            ("comparable with", comparable_with(opts).to_string()),
            judge_note(cfg, self_judging),
            ("truncation", format!("{truncation:?}").to_lowercase()),
            (
                "system prompt",
                if plan.system_prompt {
                    "sent"
                } else {
                    "not sent: the chat template rejects it"
                }
                .to_string(),
            ),
        ]));
        r
    })
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
