//! `candor run fennec`: the judge model's Fennec chain (criteria → a guideline per branch →
//! pairwise judgements in both orders, or single scores → merge → correction, which pairwise
//! runs skip unless `--correction`) on Auto-J's
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

use super::{notes_table, select, take, template_version, ProtocolArgs};
use crate::bench::fennec::data::{load_autoj, load_pandalm, PandaLabel};
use crate::bench::fennec::plan::{FennecLimits, FennecPlan, Mode};
use crate::cli::run::{execute, ProtocolSetup, RunConfig};

/// Which table of the paper a run is comparable with.
fn comparable_with(dataset: &str, mode: Mode, label: PandaLabel, branches: usize) -> String {
    let table = match mode {
        Mode::Pairwise => "Table 2 (pairwise-eval)",
        Mode::Single => "Table 3 (single-eval)",
    };
    let column = match (dataset, label) {
        ("pandalm", PandaLabel::Annotator1) => {
            "PandaLM-test column (annotator1's labels, as the authors' code)"
        }
        ("pandalm", PandaLabel::Majority) => {
            "PandaLM-test column, but with majority labels (not the authors' configuration)"
        }
        _ => "Auto-P column",
    };
    let ablation = if branches == 5 {
        String::new()
    } else {
        format!("; {branches} branches (the paper's branch-number ablation; its main tables use 5)")
    };
    format!("Fennec paper {table}, {column}; greedy decoding (the authors' code samples at temperature 0.1){ablation}")
}

pub fn run(cfg: &RunConfig, opts: &ProtocolArgs) -> anyhow::Result<()> {
    opts.check_unused(
        "fennec",
        &[
            "--dataset",
            "--branches",
            "--mode",
            "--correction",
            "--label",
        ],
    )?;
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
    let label = match opts.label.as_deref() {
        None => PandaLabel::default(),
        Some(l) => match PandaLabel::parse(l) {
            Some(l) if dataset == "pandalm" => l,
            Some(_) => bail!("--label applies to --dataset pandalm only"),
            None => bail!("--label {l:?}: pandalm has `annotator1` (default) and `majority`"),
        },
    };
    if opts.correction && opts.no_correction {
        bail!("--correction and --no-correction contradict each other");
    }
    let all = match dataset {
        "pandalm" => load_pandalm(&path, label)?,
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
        // Off by default in pairwise runs (the authors' evaluation does not correct), on in
        // single runs; `--correction` / `--no-correction` choose.
        correction: opts.correction || (mode == Mode::Single && !opts.no_correction),
        limits: opts
            .max_new_tokens
            .map_or(defaults.limits, FennecLimits::all),
        seed: cfg.seed,
        ..defaults
    };
    let setup = ProtocolSetup {
        data_files: vec![path],
        prompt_templates: plan
            .templates()
            .into_iter()
            .map(|(name, text)| (name.to_string(), template_version(&text)))
            .collect(),
        settings: json!({
            "dataset": dataset,
            "pandalm_label": (dataset == "pandalm").then_some(label.as_str()),
            "subsets": cfg.subsets,
            "limit": cfg.limit,
            "branches": plan.branches,
            "mode": opts.mode,
            "correction": plan.correction,
            "comparable_with": comparable_with(dataset, mode, label, plan.branches),
            "max_new_tokens": opts.max_new_tokens,
        }),
        decoding: json!({
            "temperature": plan.temperature,
            "top_p": 1.0,
            "max_new_tokens": plan.limits,
        }),
    };
    execute(cfg, setup, &plan, &items, |runs| {
        let owned: Vec<_> = runs
            .iter()
            .map(|(item, done)| ((*item).clone(), (*done).clone()))
            .collect();
        let mut r = plan.score(&owned, cfg.seed);
        r.tables.push(notes_table(&[
            (
                "comparable with",
                comparable_with(dataset, mode, label, plan.branches),
            ),
            ("judge (the model evaluated)", cfg.judge.name()),
        ]));
        r
    })
}
