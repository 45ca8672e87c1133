//! `candor run realmistake`: every `--model` as an error detector on ReaLMistake, with the
//! paper's prompts (1-A, 1-B, 2-A, 2-B, and `steps`, 1-A with the authors' evaluation steps;
//! `--prompt` to choose), up to 4,096 new tokens per reply as the paper, `--samples k` for
//! self-consistency, and the authors' majority vote when several `--model`s are given.
//!
//! The benchmark's text stays encrypted at rest: `data.zip` is decrypted into memory only
//! ([`crate::bench::realmistake::data`]). `--subset` names a task
//! (`math_word_problem_generation`, `finegrained_fact_verification`,
//! `answerability_classification`) or a response model (`gpt-4-0613`,
//! `Llama-2-70b-chat-hf`) or an item id, parts joined by `/` all matching; `--limit N` keeps the first N
//! items in (task, response model, file) order. The judge plays no part.

use anyhow::{bail, Context};
use serde_json::json;

use super::{notes_table, select, take, template_version, ProtocolArgs};
use crate::bench::realmistake::data::{load_benchmark, Item};
use crate::bench::realmistake::plan::DetectionPlan;
use crate::cli::run::{execute, ProtocolSetup, RunConfig};
use crate::judge::error_detection::{detection_prompt, DetectionPrompt};

/// The prompts named by `--prompt` (paper names, `steps` for the evaluation-steps prompt),
/// or the four simple ones.
fn prompts(names: &[String]) -> anyhow::Result<Vec<DetectionPrompt>> {
    if names.is_empty() {
        return Ok(DetectionPrompt::SIMPLE.to_vec());
    }
    let mut out = Vec::new();
    for n in names {
        let p = DetectionPrompt::SIMPLE
            .into_iter()
            .chain([DetectionPrompt::EvaluationSteps])
            .find(|p| p.paper_name().eq_ignore_ascii_case(n))
            .with_context(|| {
                format!("--prompt {n:?}: realmistake has 1-A, 1-B, 2-A, 2-B and steps")
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
    format!(
        "ReaLMistake {} ; up to {} new tokens per reply (the paper: 4,096)",
        out.join(" and "),
        plan.max_new_tokens
    )
}

pub fn run(cfg: &RunConfig, opts: &ProtocolArgs) -> anyhow::Result<()> {
    opts.check_unused("realmistake", &["--prompt", "--samples"])?;
    if opts.samples == 0 {
        bail!("--samples must be at least 1");
    }
    let path = cfg.data.join("realmistake/data.zip");
    if !path.is_file() {
        bail!("{}: the ReaLMistake archive was not found", path.display());
    }
    let benchmark = load_benchmark(&path)?;
    let all: Vec<Item> = benchmark.into_values().flatten().collect();
    let items = take(
        select(all, &cfg.subsets, |i| {
            vec![i.task.clone(), i.response_model.clone(), i.id.clone()]
        })?,
        cfg.limit,
    );
    let defaults = DetectionPlan::default();
    let plan = DetectionPlan {
        detectors: cfg.candidates.len(),
        prompts: prompts(&opts.prompts)?,
        samples: opts.samples,
        max_new_tokens: opts.cap(defaults.max_new_tokens),
        seed: cfg.seed,
        ..defaults
    };
    let setup = ProtocolSetup {
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
            "subsets": cfg.subsets,
            "limit": cfg.limit,
            "detectors": plan.detectors,
            "prompts": plan.prompts.iter().map(|p| p.paper_name()).collect::<Vec<_>>(),
            "samples": plan.samples,
            "max_new_tokens": opts.max_new_tokens,
            "comparable_with": comparable_with(&plan),
        }),
        decoding: json!({
            "temperature": if plan.samples > 1 { plan.sample_temperature } else { 0.0 },
            "top_p": 1.0,
            "max_new_tokens": plan.max_new_tokens,
        }),
    };
    execute(cfg, setup, &plan, &items, |runs| {
        let owned: Vec<_> = runs
            .iter()
            .map(|(item, done)| ((*item).clone(), (*done).clone()))
            .collect();
        let mut r = plan.score(&owned, cfg.seed);
        r.tables
            .push(notes_table(&[("comparable with", comparable_with(&plan))]));
        r
    })
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
        assert!(err.contains("has 1-A, 1-B, 2-A, 2-B and steps"), "{err}");
    }
}
