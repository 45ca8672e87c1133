//! Fennec as a [`Protocol`]: the judge model's chain (criteria → a guideline per branch →
//! pairwise judgements in both orders, or single scores → merge → correction) on Auto-J's
//! pairwise test set (default) or PandaLM's, scored against the human labels: Agreement and
//! Consistency (pairwise) or Accuracy (single).
//!
//! Every step is the judge's (`--judge`, default the first `--model`); the candidates play no
//! part. `--subset` names an Auto-J scenario, a PandaLM `motivation_app` or an item id
//! (`auto_j/<line>`, `pandalm/<idx>`); `--limit N` keeps the first N items in file order.

use std::path::PathBuf;

use serde_json::json;

use super::data::{load_autoj, load_pandalm, PairItem};
use super::plan::{FennecPlan, Mode};
use crate::bench::plan::Transcript;
use crate::bench::protocol::{
    select, take, template_version, Candidates, Prepared, Protocol, ProtocolError, ProtocolOptions,
    RunContext, Scored,
};
use crate::judge::fennec::{
    correction_prompt, criteria_prompt, guideline_prompt, pairwise_prompt, single_prompt, Order,
    BRANCH_SYSTEM, CORRECTION_SYSTEM, PAIRWISE_SYSTEM, SINGLE_SYSTEM,
};

/// Fennec.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fennec;

/// The prompt templates of the chain, rendered with placeholders, by name.
fn templates(mode: Mode) -> Vec<(&'static str, String)> {
    let (q, c, g, a, b) = (
        "{query}",
        "{criterion}",
        "{guideline}",
        "{response_a}",
        "{response_b}",
    );
    let mut out = vec![
        (
            "fennec/criteria",
            format!("{BRANCH_SYSTEM}\n{}", criteria_prompt(q)),
        ),
        (
            "fennec/guideline",
            format!("{BRANCH_SYSTEM}\n{}", guideline_prompt(q, c)),
        ),
        (
            "fennec/correction",
            format!(
                "{CORRECTION_SYSTEM}\n{}",
                correction_prompt(q, a, "{judge}")
            ),
        ),
    ];
    out.push(match mode {
        Mode::Pairwise => (
            "fennec/pairwise",
            format!(
                "{PAIRWISE_SYSTEM}\n{}",
                pairwise_prompt(q, c, g, a, b, Order::Normal)
            ),
        ),
        Mode::Single => (
            "fennec/single",
            format!("{SINGLE_SYSTEM}\n{}", single_prompt(q, c, g, a)),
        ),
    });
    out
}

impl Protocol for Fennec {
    type Plan = FennecPlan;

    fn name(&self) -> &'static str {
        "fennec"
    }

    fn options(&self) -> &'static [&'static str] {
        &["--dataset", "--branches", "--mode", "--no-correction"]
    }

    fn candidates(&self) -> Candidates {
        Candidates::JudgeOnly
    }

    fn prepare(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
    ) -> Result<Prepared<FennecPlan>, ProtocolError> {
        let (dataset, path): (&str, PathBuf) = match opts.dataset.as_deref() {
            None | Some("auto-j") => (
                "auto-j",
                ctx.data.join("fennec/auto-j/testdata_pairwise.jsonl"),
            ),
            Some("pandalm") => ("pandalm", ctx.data.join("fennec/pandalm/testset-v1.json")),
            Some(other) => {
                return Err(ProtocolError::bad_value(
                    "--dataset",
                    other,
                    "fennec has `auto-j` (default) and `pandalm`",
                ))
            }
        };
        let mode = match opts.mode.as_str() {
            "pairwise" => Mode::Pairwise,
            "single" => Mode::Single,
            other => {
                return Err(ProtocolError::bad_value(
                    "--mode",
                    other,
                    "fennec has `pairwise` (default) and `single`",
                ))
            }
        };
        if opts.branches == 0 {
            return Err(ProtocolError::bad_value(
                "--branches",
                0,
                "must be at least 1",
            ));
        }
        let all = match dataset {
            "pandalm" => load_pandalm(&path)?,
            _ => load_autoj(&path)?,
        };
        let items = take(
            select(all, &ctx.subsets, |i| {
                vec![i.category.clone(), i.id.clone()]
            })?,
            ctx.limit,
        );
        let defaults = FennecPlan::default();
        let plan = FennecPlan {
            branches: opts.branches,
            mode,
            correction: !opts.no_correction,
            max_new_tokens: opts.cap(defaults.max_new_tokens),
            seed: ctx.seed,
            ..defaults
        };
        Ok(Prepared {
            data_files: vec![path],
            prompt_templates: templates(mode)
                .into_iter()
                .map(|(name, text)| (name.to_string(), template_version(&text)))
                .collect(),
            settings: json!({
                "dataset": dataset,
                "subsets": ctx.subsets,
                "limit": ctx.limit,
                "branches": plan.branches,
                "mode": opts.mode,
                "correction": plan.correction,
                "max_new_tokens": opts.max_new_tokens,
            }),
            decoding: json!({
                "temperature": plan.temperature,
                "top_p": 1.0,
                "max_new_tokens": plan.max_new_tokens,
            }),
            plan,
            items,
        })
    }

    /// Criteria, a guideline and two judgements per branch, two corrections: an upper
    /// estimate (fewer criteria may be parsed, and only low-scored responses are corrected).
    fn planned_steps(&self, prepared: &Prepared<FennecPlan>, _item: &PairItem) -> Option<usize> {
        let p = &prepared.plan;
        Some(1 + 3 * p.branches + if p.correction { 2 } else { 0 })
    }

    fn score(
        &self,
        ctx: &RunContext,
        _opts: &ProtocolOptions,
        prepared: &Prepared<FennecPlan>,
        runs: &[(&PairItem, &Transcript)],
    ) -> Scored {
        let owned: Vec<_> = runs
            .iter()
            .map(|(item, done)| ((*item).clone(), (*done).clone()))
            .collect();
        prepared.plan.score(&owned, ctx.seed).into()
    }
}
