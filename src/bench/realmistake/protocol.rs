//! ReaLMistake as a [`Protocol`]: every `--model` as an error detector, with the paper's
//! prompts (1-A, 1-B, 2-A, 2-B, and `steps`, 1-A with the authors' evaluation steps;
//! `--prompt` to choose), up to 4,096 new tokens per reply as the paper, `--samples k` for
//! self-consistency,
//! and the authors' majority vote when several `--model`s are given.
//!
//! The benchmark's text stays encrypted at rest: `data.zip` is decrypted into memory only
//! ([`super::data`]). `--subset` names a task (`math_word_problem_generation`,
//! `finegrained_fact_verification`, `answerability_classification`) or a response model
//! (`gpt-4-0613`, `Llama-2-70b-chat-hf`) or an item id, parts joined by `/` all matching;
//! `--limit N` keeps the first N items in (task, response model, file) order. The judge plays
//! no part.

use std::collections::BTreeMap;

use serde_json::json;

use super::data::{load_benchmark, load_own_items, Item};
use super::plan::DetectionPlan;
use super::score;
use crate::bench::item_scores::{self, CandidateScores, ItemScores};
use crate::bench::plan::Transcript;
use crate::bench::protocol::{
    notes_table, require_file, select, smoke_test_note, take, template_version, Candidates,
    OutputFile, Prepared, Protocol, ProtocolError, ProtocolOptions, RunContext, Scored,
};
use crate::engine::{Constraint, LLGUIDANCE_VERSION};
use crate::judge::error_detection::{
    detection_grammar, detection_prompt, Detection, DetectionPrompt,
};

/// ReaLMistake.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReaLMistake;

/// The prompts named by `--prompt` (paper names, `steps` for the evaluation-steps prompt),
/// or the four simple ones.
fn prompts(names: &[String]) -> Result<Vec<DetectionPrompt>, ProtocolError> {
    if names.is_empty() {
        return Ok(DetectionPrompt::SIMPLE.to_vec());
    }
    let mut out = Vec::new();
    for n in names {
        let p = DetectionPrompt::SIMPLE
            .into_iter()
            .chain([DetectionPrompt::EvaluationSteps])
            .find(|p| p.paper_name().eq_ignore_ascii_case(n))
            .ok_or_else(|| {
                ProtocolError::bad_value(
                    "--prompt",
                    n,
                    "realmistake has 1-A, 1-B, 2-A, 2-B and steps",
                )
            })?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Which table of the paper a run is comparable with.
fn comparable_with(plan: &DetectionPlan) -> String {
    let steps = plan.prompts.contains(&DetectionPrompt::EvaluationSteps);
    let mut out = Vec::new();
    if plan.samples > 1 {
        out.push("the paper's Table 5 (self-consistency: prompt 1-A, k=5, temperature 0.5)");
    } else if steps {
        out.push("the paper's Table 7 (1-A with human-written evaluation steps)");
    } else {
        out.push("the paper's Table 4 (average of the four prompts, temperature 0)");
    }
    if plan.detectors > 1 {
        out.push("Table 6 (majority vote over detectors and prompts)");
    }
    let constrained = if plan.constrain {
        "; replies constrained to an explanation line and a concluding sentence (--constrain \
         on; the paper's detectors wrote freely)"
    } else {
        ""
    };
    format!(
        "ReaLMistake {} ; up to {} new tokens per reply (the paper: 4,096){constrained}",
        out.join(" and "),
        plan.max_new_tokens
    )
}

impl Protocol for ReaLMistake {
    type Plan = DetectionPlan;

    fn name(&self) -> &'static str {
        "realmistake"
    }

    fn own_data<'a>(&self, opts: &'a ProtocolOptions) -> Option<&'a std::path::Path> {
        opts.items.as_deref()
    }

    fn options(&self) -> &'static [&'static str] {
        &["--items", "--prompt", "--samples", "--constrain"]
    }

    fn candidates(&self) -> Candidates {
        Candidates::Many
    }

    fn uses_judge(&self) -> bool {
        false
    }

    fn prepare(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
    ) -> Result<Prepared<DetectionPlan>, ProtocolError> {
        if opts.samples == 0 {
            return Err(ProtocolError::bad_value(
                "--samples",
                0,
                "must be at least 1",
            ));
        }
        let prompts = prompts(&opts.prompts)?;
        let (path, all): (_, Vec<Item>) = match &opts.items {
            Some(own) => (own.clone(), load_own_items(own)?),
            None => {
                let path = ctx.data.join("realmistake/data.zip");
                require_file(&path, "ReaLMistake archive")?;
                let benchmark = load_benchmark(&path)?;
                (path, benchmark.into_values().flatten().collect())
            }
        };
        let items = take(
            select(all, &ctx.subsets, |i| {
                vec![i.task.clone(), i.response_model.clone(), i.id.clone()]
            })?,
            ctx.limit,
        );
        let defaults = DetectionPlan::default();
        let plan = DetectionPlan {
            detectors: ctx.candidates.len(),
            prompts,
            samples: opts.samples,
            max_new_tokens: opts.judge_cap(defaults.max_new_tokens),
            seed: ctx.seed,
            constrain: opts.constrain(false)?,
            ..defaults
        };
        Ok(Prepared {
            data_files: vec![path],
            prompt_templates: plan
                .prompts
                .iter()
                .map(|&p| {
                    (
                        format!("realmistake/{}", p.paper_name()),
                        template_version(&detection_prompt(p, "{input}", "{response}")),
                    )
                })
                .collect(),
            settings: json!({
                "own_items": opts.items.is_some(),
                "subsets": ctx.subsets,
                "limit": ctx.limit,
                "detectors": plan.detectors,
                "prompts": plan.prompts.iter().map(|p| p.paper_name()).collect::<Vec<_>>(),
                "samples": plan.samples,
                "max_new_tokens": opts.max_new_tokens,
                "judge_max_new_tokens": opts.judge_max_new_tokens,
                "comparable_with": comparable_with(&plan),
            }),
            decoding: json!({
                "temperature": if plan.samples > 1 { plan.sample_temperature } else { 0.0 },
                "top_p": 1.0,
                "max_new_tokens": plan.max_new_tokens,
                "constraint": plan.constrain.then(|| {
                    let c = Constraint::Lark(detection_grammar(DetectionPrompt::P1));
                    json!({ "sha256(1-A)": c.sha256(), "llguidance": LLGUIDANCE_VERSION })
                }),
            }),
            plan,
            items,
        })
    }

    /// One step per detector, prompt and sample.
    fn planned_steps(&self, prepared: &Prepared<DetectionPlan>, _item: &Item) -> Option<usize> {
        let p = &prepared.plan;
        Some(p.detectors * p.prompts.len() * p.samples.max(1))
    }

    fn score(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
        prepared: &Prepared<DetectionPlan>,
        runs: &[(&Item, &Transcript)],
    ) -> Scored {
        let owned: Vec<_> = runs
            .iter()
            .map(|(item, done)| ((*item).clone(), (*done).clone()))
            .collect();
        let mut results = prepared.plan.score(&owned, ctx.seed);
        let comparable = if opts.items.is_some() {
            let labelled = runs.iter().filter(|(i, _)| i.label.is_some()).count();
            format!(
                "nothing published: the user's own items (--items), {labelled} of {} labelled \
                 (the metrics are over the labelled ones; n/a without labels); per-item \
                 predictions in predictions.jsonl",
                runs.len()
            )
        } else {
            comparable_with(&prepared.plan)
        };
        let mut notes = vec![("comparable with", comparable)];
        let detectors: Vec<&str> = ctx.candidates.iter().map(String::as_str).collect();
        notes.extend(smoke_test_note(ctx, &detectors));
        results.tables.push(notes_table(&notes));
        let mut scored: Scored = results.into();
        if opts.items.is_some() {
            scored.outputs.push(predictions(ctx, &prepared.plan, runs));
        }
        scored.outputs.push(item_scores(ctx, prepared, runs));
        scored
    }
}

/// `item_scores.json`: each detector's accuracy per labelled item and prompt
/// ([`score::accuracy_items`]), for the paired tests between the detectors of a run or of runs
/// on the same items. Verdicts are read by Candor's parser, as `candor score realmistake
/// --reparse` reads the published ones; with `--samples` above 1 they are votes.
fn item_scores(
    ctx: &RunContext,
    prepared: &Prepared<DetectionPlan>,
    runs: &[(&Item, &Transcript)],
) -> OutputFile {
    let plan = &prepared.plan;
    let (mut cells, mut ids) = (Vec::new(), Vec::new());
    for (d, model) in ctx.candidates.iter().enumerate().take(plan.detectors) {
        for &p in &plan.prompts {
            type Pairs = (Vec<(Detection, Option<Detection>)>, Vec<String>);
            let mut by: BTreeMap<(String, String), Pairs> = BTreeMap::new();
            for (item, done) in runs {
                if let Some(label) = item.label {
                    let e = by
                        .entry((item.task.clone(), item.response_model.clone()))
                        .or_default();
                    e.0.push((label, plan.prediction(done, d, p)));
                    e.1.push(item.id.clone());
                }
            }
            for ((task, response_model), (pairs, item_ids)) in by {
                // The same model twice is two detectors.
                let twice = ctx.candidates.iter().filter(|c| *c == model).count() > 1;
                cells.push(score::Cell {
                    task,
                    response_model,
                    detector: match twice {
                        true => format!("{model} (candidate/{d})"),
                        false => model.clone(),
                    },
                    prompt: p.file_stem(),
                    pairs,
                });
                ids.push(item_ids);
            }
        }
    }
    let mut items = Vec::new();
    for item in &prepared.items {
        for &p in &plan.prompts {
            let stem = p.file_stem();
            let prompt = stem.trim_start_matches("baseline_errordetection_");
            items.push(format!("{}/{prompt}", item.id));
        }
    }
    let data = prepared
        .data_files
        .first()
        .and_then(|f| f.file_name())
        .map_or(String::new(), |f| f.to_string_lossy().into_owned());
    let doc = ItemScores {
        protocol: "realmistake".to_string(),
        data: format!("realmistake {data}"),
        scoring: match plan.samples {
            0 | 1 => "verdicts=reparsed".to_string(),
            n => format!("verdicts=reparsed; self-consistency vote of {n} samples"),
        },
        items,
        candidates: score::accuracy_items(&cells, &ids)
            .into_iter()
            .map(|(name, m)| CandidateScores {
                name,
                metrics: vec![m],
            })
            .collect(),
    };
    OutputFile {
        path: item_scores::FILE.into(),
        bytes: doc.to_json(),
        note: "per-item accuracy of each detector (for `candor compare`)".to_string(),
    }
}

/// `predictions.jsonl` of a run on a user's items: one line per item, detector and prompt,
/// `{"id", "detector", "model", "prompt", "prediction": "error"|"no_error"|null, "label"}`,
/// items in run order.
fn predictions(
    ctx: &RunContext,
    plan: &DetectionPlan,
    runs: &[(&Item, &Transcript)],
) -> OutputFile {
    let mut bytes = Vec::new();
    for (item, done) in runs {
        for (d, model) in ctx.candidates.iter().enumerate().take(plan.detectors) {
            for &p in &plan.prompts {
                let line = json!({
                    "id": item.id,
                    "detector": format!("candidate/{d}"),
                    "model": model,
                    "prompt": p.paper_name(),
                    "prediction": plan.prediction(done, d, p).map(|v| v.as_str()),
                    "label": item.label.map(|v| v.as_str()),
                });
                bytes.extend_from_slice(line.to_string().as_bytes());
                bytes.push(b'\n');
            }
        }
    }
    OutputFile {
        path: "predictions.jsonl".into(),
        bytes,
        note: "per-item predictions".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_by_paper_name() {
        assert_eq!(prompts(&[]).unwrap(), DetectionPrompt::SIMPLE);
        let got = prompts(&["2-b".into(), "1-A".into(), "2-B".into()]).unwrap();
        assert_eq!(got, [DetectionPrompt::P4, DetectionPrompt::P1]);
        let got = prompts(&["steps".into()]).unwrap();
        assert_eq!(got, [DetectionPrompt::EvaluationSteps]);
        let err = prompts(&["3-A".into()]).unwrap_err().to_string();
        assert_eq!(
            err,
            "--prompt \"3-A\": realmistake has 1-A, 1-B, 2-A, 2-B and steps"
        );
    }
}
