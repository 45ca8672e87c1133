//! Fennec as a [`Protocol`]: the judge model's chain (criteria → a guideline per branch →
//! pairwise judgements in both orders, or single scores → merge → correction, which pairwise
//! runs skip unless `--correction`) on Auto-J's
//! pairwise test set (default) or PandaLM's, scored against the human labels: Agreement and
//! Consistency (pairwise) or Accuracy (single).
//!
//! Every step is the judge's (`--judge`, default the first `--model`); the candidates play no
//! part. `--subset` names an Auto-J scenario, a PandaLM `motivation_app` or an item id
//! (`auto_j/<line>`, `pandalm/<idx>`); `--limit N` keeps the first N items in file order.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::engine::LLGUIDANCE_VERSION;

use super::data::{load_autoj, load_pairs, load_pandalm, PairItem, PandaLabel};
use super::plan::{FennecLimits, FennecPlan, Mode};
use crate::bench::item_scores::{self, CandidateScores, ItemScores};
use crate::bench::plan::Transcript;
use crate::bench::protocol::{
    notes_table, select, smoke_test_note, take, template_version, Candidates, OutputFile, Prepared,
    Protocol, ProtocolError, ProtocolOptions, RunContext, Scored,
};

/// Fennec.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fennec;

/// Which table of the paper a run is comparable with.
fn comparable_with(dataset: &str, mode: Mode, label: PandaLabel, branches: usize) -> String {
    let table = match mode {
        Mode::Pairwise => "Table 2 (pairwise-eval)",
        Mode::Single => "Table 3 (single-eval)",
    };
    if dataset == "own" {
        return "nothing published: the user's own pairs (--pairs); Agreement against their \
                labels where given, Consistency always"
            .to_string();
    }
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

/// The gold label `--label` names (PandaLM only).
fn label(opts: &ProtocolOptions, dataset: &str) -> Result<PandaLabel, ProtocolError> {
    match opts.label.as_deref() {
        None => Ok(PandaLabel::default()),
        Some(l) => match PandaLabel::parse(l) {
            Some(l) if dataset == "pandalm" => Ok(l),
            Some(_) => Err(ProtocolError::bad_value(
                "--label",
                l,
                "applies to --dataset pandalm only",
            )),
            None => Err(ProtocolError::bad_value(
                "--label",
                l,
                "pandalm has `annotator1` (default) and `majority`",
            )),
        },
    }
}

impl Protocol for Fennec {
    type Plan = FennecPlan;

    fn name(&self) -> &'static str {
        "fennec"
    }

    fn own_data<'a>(&self, opts: &'a ProtocolOptions) -> Option<&'a Path> {
        opts.pairs.as_deref()
    }

    fn options(&self) -> &'static [&'static str] {
        &[
            "--pairs",
            "--dataset",
            "--branches",
            "--mode",
            "--no-correction",
            "--correction",
            "--label",
            "--constrain",
        ]
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
            _ if opts.pairs.is_some() && opts.dataset.is_some() => {
                return Err(ProtocolError::bad_value(
                    "--dataset",
                    opts.dataset.as_deref().unwrap_or_default(),
                    "names a published set; --pairs gives your own",
                ))
            }
            None if opts.pairs.is_some() => ("own", opts.pairs.clone().unwrap_or_default()),
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
        let label = label(opts, dataset)?;
        if opts.correction && opts.no_correction {
            return Err(ProtocolError::bad_value(
                "--correction",
                "",
                "contradicts --no-correction",
            ));
        }
        let all = match dataset {
            "own" => load_pairs(&path)?,
            "pandalm" => load_pandalm(&path, label)?,
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
            // Off by default in pairwise runs (the authors' evaluation does not correct), on in
            // single runs; `--correction` / `--no-correction` choose.
            correction: opts.correction || (mode == Mode::Single && !opts.no_correction),
            limits: FennecLimits {
                judgement: opts.judge_cap(defaults.limits.judgement),
                ..opts
                    .max_new_tokens
                    .map_or(defaults.limits, FennecLimits::all)
            },
            seed: ctx.seed,
            // Off by default: the authors' judge wrote free text, read by `rating_format`.
            constrain: opts.constrain(false)?,
            ..defaults
        };
        let constraint = plan.constrain.then(|| {
            let key = match mode {
                Mode::Pairwise => "pairwise/0/normal",
                Mode::Single => "single/0/a",
            };
            plan.constraint(key)
                .map(|c| json!({ "sha256": c.sha256(), "llguidance": LLGUIDANCE_VERSION }))
        });
        Ok(Prepared {
            data_files: vec![path],
            prompt_templates: plan
                .templates()
                .into_iter()
                .map(|(name, text)| (name.to_string(), template_version(&text)))
                .collect(),
            settings: json!({
                "dataset": dataset,
                "pandalm_label": (dataset == "pandalm").then_some(label.as_str()),
                "subsets": ctx.subsets,
                "limit": ctx.limit,
                "branches": plan.branches,
                "mode": opts.mode,
                "correction": plan.correction,
                "comparable_with": comparable_with(dataset, mode, label, plan.branches),
                "max_new_tokens": opts.max_new_tokens,
                "judge_max_new_tokens": opts.judge_max_new_tokens,
            }),
            decoding: json!({
                "temperature": plan.temperature,
                "top_p": 1.0,
                "max_new_tokens": plan.limits,
                "judgement_constraint": constraint,
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
        opts: &ProtocolOptions,
        prepared: &Prepared<FennecPlan>,
        runs: &[(&PairItem, &Transcript)],
    ) -> Scored {
        let owned: Vec<_> = runs
            .iter()
            .map(|(item, done)| ((*item).clone(), (*done).clone()))
            .collect();
        let mut results = prepared.plan.score(&owned, ctx.seed);
        let p = &prepared.plan;
        let dataset = if opts.pairs.is_some() {
            "own"
        } else if opts.dataset.as_deref() == Some("pandalm") {
            "pandalm"
        } else {
            "auto-j"
        };
        // `prepare` checked the label.
        let label = label(opts, dataset).unwrap_or_default();
        results.tables.push(notes_table(&[
            (
                "comparable with",
                comparable_with(dataset, p.mode, label, p.branches),
            ),
            ("judge (the model evaluated)", ctx.judge.clone()),
        ]));
        let table = results.tables.last_mut().expect("just pushed");
        if let Some((k, v)) = smoke_test_note(ctx, &[&ctx.judge]) {
            table.rows.push(vec![k.into(), v.into()]);
        }
        // The candidate compared is the judge: two runs on the same pairs compare two judges
        // (or one judge's settings, e.g. branches).
        let doc = ItemScores {
            protocol: "fennec".to_string(),
            data: match &opts.pairs {
                Some(own) => format!("own pairs {}; label={}", own.display(), label.as_str()),
                None => format!("fennec {dataset}; label={}", label.as_str()),
            },
            scoring: format!("{:?}", p.mode).to_lowercase(),
            items: prepared.items.iter().map(|i| i.id.clone()).collect(),
            candidates: vec![CandidateScores {
                name: ctx.judge.clone(),
                metrics: p.item_values(&owned),
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
