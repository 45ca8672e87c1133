//! `candor run fennec`: the judge model's Fennec chain (criteria → a guideline per branch →
//! pairwise judgements in both orders, or single scores → merge → correction) on Auto-J's
//! pairwise test set (default) or PandaLM's, scored against the human labels: Agreement and
//! Consistency (pairwise) or Accuracy (single).
//!
//! Every step is the judge's (`--judge`, default the first `--model`); the candidates play no
//! part. `--subset` names an Auto-J scenario, a PandaLM `motivation_app` or an item id
//! (`auto_j/<line>`, `pandalm/<idx>`); `--limit N` keeps the
//! first N items in file order. The chain and its scoring are [`crate::bench::fennec`]'s.

use std::path::PathBuf;

use anyhow::bail;
use serde_json::json;

use super::{select, take, template_version, ProtocolArgs};
use crate::bench::fennec::data::{load_autoj, load_pandalm};
use crate::bench::fennec::plan::{FennecPlan, Mode};
use crate::cli::run::{execute, ProtocolSetup, RunConfig};
use crate::judge::fennec::{
    correction_prompt, criteria_prompt, guideline_prompt, pairwise_prompt, single_prompt, Order,
    BRANCH_SYSTEM, CORRECTION_SYSTEM, PAIRWISE_SYSTEM, SINGLE_SYSTEM,
};

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

pub fn run(cfg: &RunConfig, opts: &ProtocolArgs) -> anyhow::Result<()> {
    opts.check_unused("fennec", &["--dataset", "--branches", "--mode"])?;
    let (dataset, path): (&str, PathBuf) = match opts.dataset.as_deref() {
        None | Some("auto-j") => (
            "auto-j",
            cfg.data.join("fennec/auto-j/testdata_pairwise.jsonl"),
        ),
        Some("pandalm") => ("pandalm", cfg.data.join("fennec/pandalm/testset-v1.json")),
        Some(other) => bail!("--dataset {other:?}: fennec has `auto-j` (default) and `pandalm`"),
    };
    let mode = match opts.mode.as_str() {
        "pairwise" => Mode::Pairwise,
        "single" => Mode::Single,
        other => bail!("--mode {other:?}: fennec has `pairwise` (default) and `single`"),
    };
    if opts.branches == 0 {
        bail!("--branches must be at least 1");
    }
    let all = match dataset {
        "pandalm" => load_pandalm(&path)?,
        _ => load_autoj(&path)?,
    };
    let items = take(
        select(all, &cfg.subsets, |i| {
            vec![i.category.clone(), i.id.clone()]
        })?,
        cfg.limit,
    );
    let defaults = FennecPlan::default();
    let plan = FennecPlan {
        branches: opts.branches,
        mode,
        correction: !opts.no_correction,
        max_new_tokens: opts.cap(defaults.max_new_tokens),
        seed: cfg.seed,
        ..defaults
    };
    let setup = ProtocolSetup {
        data_files: vec![path],
        prompt_templates: templates(mode)
            .into_iter()
            .map(|(name, text)| (name.to_string(), template_version(&text)))
            .collect(),
        settings: json!({
            "dataset": dataset,
            "subsets": cfg.subsets,
            "limit": cfg.limit,
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
    };
    execute(cfg, setup, &plan, &items, |runs| {
        let owned: Vec<_> = runs
            .iter()
            .map(|(item, done)| ((*item).clone(), (*done).clone()))
            .collect();
        plan.score(&owned, cfg.seed)
    })
}
