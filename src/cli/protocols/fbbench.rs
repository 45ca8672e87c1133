//! `candor run fbbench`: FB-Bench's follow-up and checklist-judge steps over the authors'
//! dataset (v3 by default, v1 with `--dataset v1`), scored by the published or the paper's
//! rule; the judgements are also written in the authors' format
//! (`judgments/<model>.jsonl`), which their notebook and `candor score fbbench` read.
//!
//! `--subset` names an interaction scenario (`error_correction`, `response_maintenance`), a
//! task type as the data spells it, or an item id (as in the samples); `--limit N` keeps the first N items in file order. The
//! prompts, the plan and the scoring are [`crate::bench::fbbench`]'s.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::json;

use super::{
    file_label, judge_note, notes_table, require_judge, select, take, template_version,
    ProtocolArgs,
};
use crate::bench::fbbench::data::load_dataset;
use crate::bench::fbbench::plan::{judgement_records, score_transcripts, write_judgements};
use crate::bench::fbbench::prompts::judge_template;
use crate::bench::fbbench::{FbBenchPlan, Item, Rule, Version};
use crate::bench::plan::Plan;
use crate::cli::run::{execute, ProtocolSetup, RunConfig};
use crate::store::run_dir::write_atomic;

/// The dataset file of a version, under the data root.
pub fn dataset_path(data: &Path, version: Version) -> PathBuf {
    match version {
        Version::V1 => data.join("fbbench/v1/fb_bench_dataset.json"),
        Version::V3 => data.join("fbbench/v3/fb_bench_dataset_v3.json"),
    }
}

fn version(opts: &ProtocolArgs) -> anyhow::Result<Version> {
    match opts.dataset.as_deref() {
        None | Some("v3") => Ok(Version::V3),
        Some("v1") => Ok(Version::V1),
        Some(other) => bail!("--dataset {other:?}: fbbench has `v3` (default) and `v1`"),
    }
}

fn rule(opts: &ProtocolArgs) -> anyhow::Result<Rule> {
    match opts.rule.as_str() {
        "published" => Ok(Rule::Published),
        "paper" => Ok(Rule::Paper),
        other => bail!("--rule {other:?}: fbbench has `published` (default) and `paper`"),
    }
}

/// Which published figures a run of `version` is comparable with.
pub fn comparable_with(version: Version) -> &'static str {
    match version {
        Version::V3 => "FB-Bench v3 (591 items), the authors' current configuration (their repository's v3 config and judge prompt); not a paper table",
        Version::V1 => "FB-Bench v1 (734 items), the paper's Table 3 (judge prompt with the reference answer)",
    }
}

/// The names `--subset` matches against: scenario, task type and item id.
fn labels(plan: &FbBenchPlan, item: &Item) -> Vec<String> {
    vec![
        item.bench_type.as_str().to_lowercase().replace(' ', "_"),
        item.task_type.clone(),
        plan.item_id(item),
    ]
}

pub fn run(cfg: &RunConfig, opts: &ProtocolArgs) -> anyhow::Result<()> {
    opts.check_unused("fbbench", &["--dataset", "--rule"])?;
    let version = version(opts)?;
    let rule = rule(opts)?;
    let self_judging = require_judge(cfg, "fbbench", "GPT-4o")?;
    let comparable = comparable_with(version);
    let path = dataset_path(&cfg.data, version);
    let dataset = load_dataset(&path).with_context(|| "loading FB-Bench".to_string())?;
    // Item ids depend on the item's text only, not on the plan's settings.
    let ids = FbBenchPlan {
        version,
        seed: cfg.seed,
        followup_max_new_tokens: 0,
        judge_max_new_tokens: 0,
    };
    let items = take(
        select(dataset.items, &cfg.subsets, |i| labels(&ids, i))?,
        cfg.limit,
    );
    let mut plan = FbBenchPlan::new(version, cfg.seed, &items)?;
    plan.followup_max_new_tokens = opts.cap(plan.followup_max_new_tokens);
    plan.judge_max_new_tokens = opts.cap(plan.judge_max_new_tokens);
    let template = judge_template(version);
    let setup = ProtocolSetup {
        data_files: vec![path],
        prompt_templates: [(
            format!("fbbench/judge/{version:?}").to_lowercase(),
            template_version(template.text()),
        )]
        .into_iter()
        .collect(),
        settings: json!({
            "dataset": format!("{version:?}").to_lowercase(),
            "rule": opts.rule,
            "subsets": cfg.subsets,
            "limit": cfg.limit,
            "max_new_tokens": opts.max_new_tokens,
            "comparable_with": comparable,
            "self_judging": self_judging,
        }),
        decoding: json!({
            "followup": {
                "temperature": "the authors' per-task temperature",
                "top_p": 1.0,
                "max_new_tokens": plan.followup_max_new_tokens,
            },
            "judge": {
                "temperature": 0.0,
                "top_p": 1.0,
                "max_new_tokens": plan.judge_max_new_tokens,
            },
        }),
    };
    let candidate = cfg.candidates[0].name();
    let judge = cfg.judge.name();
    let mut judgements = None;
    execute(cfg, setup, &plan, &items, |runs| {
        judgements = Some(judgement_records(&plan, runs, &candidate, &judge));
        let mut r = score_transcripts(&candidate, runs, rule, cfg.seed);
        r.tables.push(notes_table(&[
            ("comparable with", comparable.to_string()),
            judge_note(cfg, self_judging),
        ]));
        r
    })?;
    let Some((records, left_out)) = judgements else {
        return Ok(());
    };
    let dir = cfg.out.join("judgments");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{}.jsonl", file_label(&candidate)));
    let mut bytes = Vec::new();
    write_judgements(&mut bytes, &records).context("encoding the judgements")?;
    write_atomic(&path, &bytes)?;
    println!(
        "judgements (the authors' format): {} ({} records; {} unscored items left out)",
        path.display(),
        records.len(),
        left_out.len()
    );
    Ok(())
}
