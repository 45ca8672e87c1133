//! FB-Bench as a [`Protocol`]: the follow-up and checklist-judge steps over the authors'
//! dataset (v3 by default, v1 with `--dataset v1`), scored by the published or the paper's
//! rule; the judgements are also written in the authors' format (`judgments/<model>.jsonl`),
//! which their notebook and `candor score fbbench` read. The judge must be named (`--judge`;
//! the paper's is GPT-4o): the candidate's own model is allowed and recorded as self-judging.
//! Several `--judge` make a panel ([`super::panel`]): the panel's metrics, each judge's beside
//! them, their agreement, and one judgement file per judge.
//!
//! `--subset` names an interaction scenario (`error_correction`, `response_maintenance`), a
//! task type as the data spells it, or an item id (as in the samples); `--limit N` keeps the
//! first N items in file order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

use super::data::{load_dataset, load_own_items, pairing_id, Dataset};
use super::panel::{panel_results, panel_unit};
use super::plan::{
    judge_records, judge_verdicts, score_transcripts, units_from_transcripts, write_judgements,
};
use super::prompts::judge_template;
use super::score::{metric_items, scoring_label, tables_for_version};
use super::{FbBenchPlan, Item, Rule, Version};
use crate::bench::item_scores::{self, CandidateScores, ItemScores};
use crate::bench::own_data::field_error;
use crate::bench::panel::{Panel, PanelRule};
use crate::bench::plan::{Plan, Transcript};
use crate::bench::protocol::{
    file_label, judge_note, notes_table, require_judge, select, smoke_test_note, take,
    template_version, OutputFile, Prepared, Protocol, ProtocolError, ProtocolOptions, RunContext,
    Scored,
};
use crate::engine::LLGUIDANCE_VERSION;

/// FB-Bench.
#[derive(Debug, Clone, Copy, Default)]
pub struct FbBench;

/// The dataset file of a version, under the data root.
pub fn dataset_path(data: &Path, version: Version) -> PathBuf {
    match version {
        Version::V1 => data.join("fbbench/v1/fb_bench_dataset.json"),
        Version::V3 => data.join("fbbench/v3/fb_bench_dataset_v3.json"),
    }
}

fn version(opts: &ProtocolOptions) -> Result<Version, ProtocolError> {
    match opts.dataset.as_deref() {
        None | Some("v3") => Ok(Version::V3),
        Some("v1") => Ok(Version::V1),
        Some(other) => Err(ProtocolError::bad_value(
            "--dataset",
            other,
            "fbbench has `v3` (default) and `v1`",
        )),
    }
}

fn rule(opts: &ProtocolOptions) -> Result<Rule, ProtocolError> {
    match opts.rule.as_str() {
        "published" => Ok(Rule::Published),
        "paper" => Ok(Rule::Paper),
        other => Err(ProtocolError::bad_value(
            "--rule",
            other,
            "fbbench has `published` (default) and `paper`",
        )),
    }
}

/// Which published figures a run of `version` is comparable with.
pub fn comparable_with(version: Version) -> &'static str {
    match version {
        Version::V3 => "FB-Bench v3 (591 items), the authors' current configuration (their repository's v3 config and judge prompt); not a paper table",
        Version::V1 => "FB-Bench v1 (734 items), the paper's Table 3 (judge prompt with the reference answer)",
    }
}

/// [`comparable_with`], or nothing published for a user's `--items`.
fn comparable(opts: &ProtocolOptions, version: Version) -> String {
    match opts.items {
        Some(_) => format!(
            "nothing published: the user's own items (--items), judged with the {} judge prompt",
            match version {
                Version::V1 => "v1 (reference answers)",
                Version::V3 => "v3",
            }
        ),
        None => comparable_with(version).to_string(),
    }
}

/// What the manifest records of the judge's constraint: off, or the schema kind, the
/// llguidance version and one hash over every item's schema (each built from the item's
/// checklist), in item order.
fn constraint_record(plan: &FbBenchPlan, items: &[Item]) -> serde_json::Value {
    if !plan.constrain {
        return json!("off");
    }
    let mut h = Sha256::new();
    for item in items {
        if let Some(c) = plan.judge_constraint(item) {
            h.update(c.sha256().as_bytes());
            h.update([0u8]);
        }
    }
    json!({
        "kind": "json_schema (judge::checklist::judgement_schema of each item's checklist)",
        "schemas_sha256": hex::encode(h.finalize()),
        "llguidance": LLGUIDANCE_VERSION,
    })
}

/// A user's `--items` file as a dataset: its version is recognised as the published
/// files' is (v1's judge prompt, with the reference answer, when every item has one). Two
/// items with the same id (the same query, first response and feedback) are refused.
fn own_dataset(path: &Path) -> Result<Dataset, ProtocolError> {
    let lines = load_own_items(path)?;
    let ids = FbBenchPlan {
        version: Version::V3,
        seed: 0,
        followup_max_new_tokens: 0,
        judge_max_new_tokens: 0,
        constrain: false,
        panel: Panel::default(),
    };
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (line, item) in &lines {
        if let Some(first) = seen.insert(ids.item_id(item), *line) {
            return Err(field_error(
                path,
                *line,
                "user_query",
                format!(
                    "duplicate item (the same user_query, origin_first_response and feedback \
                     as line {first})"
                ),
            )
            .into());
        }
    }
    let items: Vec<Item> = lines.into_iter().map(|(_, item)| item).collect();
    Ok(Dataset {
        version: Version::recognise(&items),
        items,
    })
}

/// The names `--subset` matches against: scenario, task type and item id.
fn labels(plan: &FbBenchPlan, item: &Item) -> Vec<String> {
    vec![
        item.bench_type.as_str().to_lowercase().replace(' ', "_"),
        item.task_type.clone(),
        plan.item_id(item),
    ]
}

impl Protocol for FbBench {
    type Plan = FbBenchPlan;

    fn name(&self) -> &'static str {
        "fbbench"
    }

    fn own_data<'a>(&self, opts: &'a ProtocolOptions) -> Option<&'a Path> {
        opts.items.as_deref()
    }

    fn options(&self) -> &'static [&'static str] {
        &["--items", "--dataset", "--rule", "--constrain", "--panel"]
    }

    fn panels(&self) -> bool {
        true
    }

    fn prepare(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
    ) -> Result<Prepared<FbBenchPlan>, ProtocolError> {
        rule(opts)?;
        let self_judging = require_judge(ctx, "fbbench", "GPT-4o")?;
        let (path, dataset) = match &opts.items {
            Some(_) if opts.dataset.is_some() => {
                return Err(ProtocolError::bad_value(
                    "--dataset",
                    opts.dataset.as_deref().unwrap_or_default(),
                    "names a published set; --items gives your own",
                ))
            }
            Some(own) => (own.clone(), own_dataset(own)?),
            None => {
                let path = dataset_path(&ctx.data, version(opts)?);
                let dataset = load_dataset(&path)?;
                (path, dataset)
            }
        };
        let version = dataset.version;
        // Item ids depend on the item's text only, not on the plan's settings.
        let ids = FbBenchPlan {
            version,
            seed: ctx.seed,
            followup_max_new_tokens: 0,
            judge_max_new_tokens: 0,
            constrain: false,
            panel: Panel::default(),
        };
        let items = take(
            select(dataset.items, &ctx.subsets, |i| labels(&ids, i))?,
            ctx.limit,
        );
        let mut plan = FbBenchPlan::new(version, ctx.seed, &items)?;
        plan.followup_max_new_tokens = opts.cap(plan.followup_max_new_tokens);
        plan.judge_max_new_tokens = opts.judge_cap(plan.judge_max_new_tokens);
        plan.constrain = opts.constrain(true)?;
        plan.panel = Panel::from_run(ctx, opts)?;
        let constraint = constraint_record(&plan, &items);
        let template = judge_template(version);
        Ok(Prepared {
            data_files: vec![path],
            prompt_templates: [(
                format!("fbbench/judge/{version:?}").to_lowercase(),
                template_version(template.text()),
            )]
            .into_iter()
            .collect(),
            settings: crate::bench::panel::settings(
                ctx,
                plan.panel,
                json!({
                    "dataset": format!("{version:?}").to_lowercase(),
                    "own_items": opts.items.is_some(),
                    "rule": opts.rule,
                    "subsets": ctx.subsets,
                    "limit": ctx.limit,
                    "max_new_tokens": opts.max_new_tokens,
                    "judge_max_new_tokens": opts.judge_max_new_tokens,
                    "comparable_with": comparable(opts, version),
                    "self_judging": self_judging,
                }),
            ),
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
                    "constraint": constraint,
                },
            }),
            plan,
            items,
        })
    }

    /// The follow-up, then the judge (or each judge of the panel).
    fn planned_steps(&self, prepared: &Prepared<FbBenchPlan>, _item: &Item) -> Option<usize> {
        Some(1 + prepared.plan.panel.judges)
    }

    fn score(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
        prepared: &Prepared<FbBenchPlan>,
        runs: &[(&Item, &Transcript)],
    ) -> Scored {
        let candidate = ctx.candidates.first().map_or("", String::as_str);
        // `prepare` checked the rule.
        let rule = rule(opts).unwrap_or(Rule::Published);
        let panel = prepared.plan.panel;
        let judges = ctx.judges();
        let mut results = if panel.is_panel() {
            let who = (judges.as_slice(), ctx.candidates.as_slice());
            panel_results(candidate, runs, rule, ctx.seed, panel, who)
        } else {
            score_transcripts(candidate, runs, rule, ctx.seed)
        };
        results.tables = tables_for_version(results.tables, prepared.plan.version);
        // `prepare` checked that the judge was named.
        let self_judging = judges.iter().any(|j| ctx.candidates.iter().any(|c| c == j));
        let mut notes = vec![
            ("comparable with", comparable(opts, prepared.plan.version)),
            judge_note(ctx, self_judging),
        ];
        if panel.is_panel() {
            notes.push((
                "panel",
                format!(
                    "{} judges, {}: {}",
                    panel.judges,
                    panel.rule.as_str(),
                    match panel.rule {
                        PanelRule::Majority =>
                            "per checklist entry, the verdict most judges gave (a tie is 否)",
                        PanelRule::Mean => "the mean of the judges' item scores",
                    }
                ),
            ));
        }
        notes.extend(smoke_test_note(ctx, &judges));
        results.tables.push(notes_table(&notes));
        // One judgement file per judge: judge 0's as for one judge, the others' beside it.
        let outputs = (0..panel.judges)
            .map(|j| {
                let judge = judges.get(j).copied().unwrap_or_default();
                let (records, left_out) = judge_records(&prepared.plan, runs, candidate, judge, j);
                let mut bytes = Vec::new();
                // Writing into memory cannot fail.
                let _ = write_judgements(&mut bytes, &records);
                let name = match j {
                    0 => format!("{}.jsonl", file_label(candidate)),
                    j => format!("{}.judge{j}.jsonl", file_label(candidate)),
                };
                let note =
                    format!(
                    "judgements (the authors' format){}: {} records; {} unscored items left out",
                    if panel.is_panel() { format!(", judge {j} ({judge})") } else { String::new() },
                    records.len(),
                    left_out.len()
                );
                OutputFile {
                    path: Path::new("judgments").join(name),
                    bytes,
                    note,
                }
            })
            .collect::<Vec<_>>();
        let mut outputs = outputs;
        outputs.push(item_scores_file(ctx, opts, prepared, runs, rule));
        Scored { results, outputs }
    }
}

/// `item_scores.json`: the per-item values of the headline metrics (the panel's, for a panel
/// run), for `candor compare`.
fn item_scores_file(
    ctx: &RunContext,
    opts: &ProtocolOptions,
    prepared: &Prepared<FbBenchPlan>,
    runs: &[(&Item, &Transcript)],
    rule: Rule,
) -> OutputFile {
    let panel = prepared.plan.panel;
    let units = if panel.is_panel() {
        runs.iter()
            .map(|(item, done)| {
                let v: Vec<_> = (0..panel.judges)
                    .map(|j| judge_verdicts(item, done, rule, j))
                    .collect();
                panel_unit(item, &v, rule, panel.rule)
            })
            .collect()
    } else {
        units_from_transcripts(runs, rule)
    };
    let ids: Vec<String> = runs.iter().map(|(item, _)| pairing_id(item)).collect();
    let mut scoring = scoring_label(rule, &ctx.judges().join(","));
    if panel.is_panel() {
        scoring = format!("{scoring}; panel={}", panel.rule.as_str());
    }
    let scores = ItemScores {
        protocol: "fbbench".to_string(),
        data: match &opts.items {
            Some(own) => format!("own items {}", own.display()),
            None => format!(
                "fbbench {}",
                format!("{:?}", prepared.plan.version).to_lowercase()
            ),
        },
        scoring,
        items: prepared.items.iter().map(pairing_id).collect(),
        candidates: vec![CandidateScores {
            name: ctx.candidates.first().cloned().unwrap_or_default(),
            metrics: metric_items(&units, &ids),
        }],
    };
    OutputFile {
        path: item_scores::FILE.into(),
        bytes: scores.to_json(),
        note: "per-item values of the headline metrics (for `candor compare`)".into(),
    }
}
