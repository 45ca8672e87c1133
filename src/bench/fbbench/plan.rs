//! FB-Bench as a [`Plan`]: each item is two steps, then scoring of the finished transcripts.
//!
//! Step `followup` (the candidate, `Actor::Candidate(0)`) continues the conversation user
//! query → preset first response → feedback, at the authors' per-task temperature, seeded
//! per item. Step `judge` (`Actor::Judge`) renders the checklist judge prompt with the
//! candidate's reply, at temperature 0 (the authors' judge settings); with a panel, judge
//! `j ≥ 1` grades the same prompt in step `judge/judge/<j>` ([`crate::bench::panel`]).
//! Finished transcripts
//! are scored with [`super::score`] and can be written as the authors' judgement JSONL, so
//! their notebook and `candor score fbbench` read Candor's runs. Scheduling, batching and
//! storing steps are the runner's business, not this file's.

use std::io::Write;

use super::data::{item_id, FbBenchError, Item, JudgementRecord, Version};
use super::prompts::{followup_messages, judge_messages, task_temperature};
use super::pynum::PyNum;
use super::score::{item_score, results, ModelUnits, Rule, Unit};
use crate::bench::panel::{judge_actor, Panel};
use crate::bench::plan::{step_seed, Actor, Plan, Step, Transcript, REASONING_TRUNCATED};
use crate::bench::BenchResults;
use crate::engine::{Constraint, SamplingParams};
use crate::judge::checklist::{self, CheckVerdict};
use crate::judge::Verdict;

/// Key of the candidate's follow-up step.
pub const FOLLOWUP: &str = "followup";
/// Key of the judge's step.
pub const JUDGE: &str = "judge";

/// The FB-Bench plan for one dataset version.
#[derive(Debug, Clone, PartialEq)]
pub struct FbBenchPlan {
    pub version: Version,
    /// Base seed; each item's steps get their own seed derived from it and the item id.
    pub seed: u64,
    /// Follow-up length limit (the authors: 4096, less when the context is short; Candor's
    /// engine stops at a full context and records it).
    pub followup_max_new_tokens: usize,
    /// Judge output limit (the authors: 4096).
    pub judge_max_new_tokens: usize,
    /// Constrain the judge's output to the prompt's JSON object
    /// ([`checklist::judgement_schema`]); the authors' judge ran in JSON mode.
    pub constrain: bool,
    /// The judges (one, or a panel) and how a panel decides.
    pub panel: Panel,
}

impl FbBenchPlan {
    /// A plan for `version` with the authors' limits. Fails when an item cannot be judged
    /// with that version's prompt (the v1 prompt needs every item's reference answer), so
    /// that [`Plan::next_steps`] never meets an item it cannot render.
    pub fn new(version: Version, seed: u64, items: &[Item]) -> Result<Self, FbBenchError> {
        for (index, item) in items.iter().enumerate() {
            judge_messages(version, item, "").map_err(|e| {
                FbBenchError::Other(format!("item {index}: cannot render the judge prompt: {e}"))
            })?;
        }
        Ok(FbBenchPlan {
            version,
            seed,
            followup_max_new_tokens: 4096,
            judge_max_new_tokens: 4096,
            constrain: true,
            panel: Panel::default(),
        })
    }

    /// The judge step's constraint for an item, when constrained.
    pub fn judge_constraint(&self, item: &Item) -> Option<Constraint> {
        self.constrain
            .then(|| Constraint::JsonSchema(checklist::judgement_schema(&item.criteria())))
    }

    /// The seed of one step (see [`step_seed`]).
    fn step_seed(&self, item: &Item, key: &str) -> u64 {
        step_seed(self.seed, &self.item_id(item), key)
    }
}

impl Plan for FbBenchPlan {
    type Item = Item;

    /// [`item_id`]: a content id.
    fn item_id(&self, item: &Item) -> String {
        item_id(item)
    }

    fn next_steps(&self, item: &Item, done: &Transcript) -> Vec<Step> {
        let Some(followup) = done.get(FOLLOWUP) else {
            return vec![Step {
                key: FOLLOWUP.into(),
                actor: Actor::Candidate(0),
                messages: followup_messages(item),
                params: SamplingParams {
                    temperature: task_temperature(&item.task_type),
                    top_p: 1.0,
                    seed: self.step_seed(item, FOLLOWUP),
                    max_new_tokens: self.followup_max_new_tokens,
                    stop_strings: Vec::new(),
                    constraint: None,
                },
            }];
        };
        let waiting: Vec<usize> = (0..self.panel.judges)
            .filter(|&j| !done.contains_key(&Panel::key(JUDGE, j)))
            .collect();
        if waiting.is_empty() {
            return Vec::new();
        }
        // `new` checked that every item renders; an item from elsewhere that does not gets
        // no judge step and is reported unscored ("not judged") by the scorer.
        let Ok(messages) = judge_messages(self.version, item, &followup.text) else {
            return Vec::new();
        };
        waiting
            .into_iter()
            .map(|j| {
                // Judge 0 keeps a one-judge run's key and seed; the others get their own.
                let key = Panel::key(JUDGE, j);
                Step {
                    actor: judge_actor(j),
                    messages: messages.clone(),
                    params: SamplingParams {
                        temperature: 0.0,
                        top_p: 1.0,
                        seed: self.step_seed(item, &key),
                        max_new_tokens: self.judge_max_new_tokens,
                        stop_strings: Vec::new(),
                        constraint: self.judge_constraint(item),
                    },
                    key,
                }
            })
            .collect()
    }
}

/// The judge's verdicts for one finished item (Unscored when not judged or unparseable).
/// Under [`Rule::Published`] a partial set of entries is scored as the authors' code scored
/// it ([`checklist::parse_output_partial`]); under [`Rule::Paper`] it is unscored.
pub fn verdicts(item: &Item, done: &Transcript, rule: Rule) -> Verdict<Vec<CheckVerdict>> {
    judge_verdicts(item, done, rule, 0)
}

/// Judge `j`'s verdicts for one finished item, as [`verdicts`] reads judge 0's.
pub fn judge_verdicts(
    item: &Item,
    done: &Transcript,
    rule: Rule,
    j: usize,
) -> Verdict<Vec<CheckVerdict>> {
    match (done.get(FOLLOWUP), done.get(&Panel::key(JUDGE, j))) {
        // The candidate's follow-up has no answer to grade.
        (Some(f), _) if f.reasoning_truncated() => {
            Verdict::unscored(format!("candidate: {REASONING_TRUNCATED}"))
        }
        (Some(_), Some(judge)) if rule == Rule::Published => {
            judge.verdict(|answer| checklist::parse_output_partial(answer, &item.criteria()))
        }
        (Some(_), Some(judge)) => {
            judge.verdict(|answer| checklist::parse_output(answer, &item.criteria()))
        }
        (None, _) => Verdict::unscored("not run: no follow-up step"),
        (Some(_), None) => Verdict::unscored("not judged: no judge step"),
    }
}

/// Units for scoring (judge 0's verdicts): unparseable or missing judgements are left out
/// and flagged.
pub fn units_from_transcripts(runs: &[(&Item, &Transcript)], rule: Rule) -> Vec<Unit> {
    runs.iter()
        .map(|(item, done)| unit(item, verdicts(item, done, rule), rule))
        .collect()
}

/// An item's unit from its (judge's or panel's) verdicts.
pub fn unit(item: &Item, verdicts: Verdict<Vec<CheckVerdict>>, rule: Rule) -> Unit {
    let (score, unscored) = match verdicts {
        Verdict::Scored(v) => (Some(item_score(rule, item.bench_type, &v)), None),
        Verdict::Unscored { reason } => (None, Some(reason)),
    };
    unit_with_score(item, score, unscored)
}

/// An item's unit with a given score (`None`: left out, with the reason).
pub fn unit_with_score(item: &Item, score: Option<PyNum>, unscored: Option<String>) -> Unit {
    Unit {
        bench_type: item.bench_type,
        task_type: item.task_type.clone(),
        error_types: item.error_type.clone().unwrap_or_default(),
        feedback_types: item.feedback_type.clone(),
        score,
        unscored,
    }
}

/// One model's finished run to headline metrics (with bootstrap intervals and unscored
/// counts) and the five published tables.
pub fn score_transcripts(
    model: &str,
    runs: &[(&Item, &Transcript)],
    rule: Rule,
    seed: u64,
) -> BenchResults {
    let units = ModelUnits {
        model: model.to_string(),
        units: units_from_transcripts(runs, rule),
    };
    results(&units, rule, seed)
}

/// Finished runs as the authors' judgement records (`score` as their `get_score` computes
/// it, plus Candor's `judge_output` with the judge's raw text). Items whose judgement is
/// unscored get no record — the authors' pipeline also wrote none for a judgement it could
/// not parse — and are returned with their ids and reasons, to be reported.
pub fn judgement_records(
    plan: &FbBenchPlan,
    runs: &[(&Item, &Transcript)],
    infer_model: &str,
    judge_model: &str,
) -> (Vec<JudgementRecord>, Vec<(String, String)>) {
    judge_records(plan, runs, infer_model, judge_model, 0)
}

/// [`judgement_records`] of judge `j` of a panel.
pub fn judge_records(
    plan: &FbBenchPlan,
    runs: &[(&Item, &Transcript)],
    infer_model: &str,
    judge_model: &str,
    j: usize,
) -> (Vec<JudgementRecord>, Vec<(String, String)>) {
    let mut records = Vec::new();
    let mut left_out = Vec::new();
    for (item, done) in runs {
        match judge_verdicts(item, done, Rule::Published, j) {
            Verdict::Scored(v) => {
                let score = item_score(Rule::Published, item.bench_type, &v);
                records.push(JudgementRecord {
                    item: (*item).clone(),
                    second_response: done
                        .get(FOLLOWUP)
                        .map(|s| s.text.clone())
                        .unwrap_or_default(),
                    infer_model: infer_model.to_string(),
                    judge_model: judge_model.to_string(),
                    judgement: checklist::to_recorded(&v),
                    score: py_json_number(score),
                    judge_output: done.get(&Panel::key(JUDGE, j)).map(|s| s.text.clone()),
                });
            }
            Verdict::Unscored { reason } => left_out.push((plan.item_id(item), reason)),
        }
    }
    (records, left_out)
}

/// Writes records as JSON lines (UTF-8, unescaped, like the authors' `ensure_ascii=False`).
pub fn write_judgements(mut w: impl Write, records: &[JudgementRecord]) -> std::io::Result<()> {
    for r in records {
        serde_json::to_writer(&mut w, r)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

fn py_json_number(n: PyNum) -> serde_json::Number {
    if n.int {
        serde_json::Number::from(n.value as i64)
    } else {
        serde_json::Number::from_f64(n.value).unwrap_or_else(|| serde_json::Number::from(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fbbench::data::{parse_dataset, parse_jsonl};
    use crate::bench::fbbench::score::units_from_records;
    use crate::bench::plan::StepOutput;
    use crate::engine::StopReason;
    use crate::text::message::Role;
    use std::path::Path;

    fn items() -> Vec<Item> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/fbbench/sample_v3.json");
        let text = std::fs::read(&path).unwrap();
        parse_dataset(text.as_slice(), &path).unwrap().items
    }

    fn out(text: &str) -> StepOutput {
        StepOutput::scripted(text)
    }

    /// A canned judge: "是" for the entries whose index is in `met`, as GPT-4o formats it.
    fn judge_reply(item: &Item, met: &[usize]) -> String {
        let mut obj = serde_json::Map::new();
        for (i, c) in item.checklist.iter().enumerate() {
            let r = if met.contains(&i) { "是" } else { "否" };
            obj.insert(
                c.text().into(),
                serde_json::json!({"评判理由": format!("理由{i}"), "评判结果": r, "weight": c.weight()}),
            );
        }
        format!(
            "```json\n{}\n```",
            serde_json::to_string_pretty(&obj).unwrap()
        )
    }

    /// Drives the plan to completion with scripted replies, as the runner would.
    fn run(plan: &FbBenchPlan, item: &Item, judge: &str) -> Transcript {
        let mut done = Transcript::new();
        loop {
            let steps = plan.next_steps(item, &done);
            if steps.is_empty() {
                return done;
            }
            for s in steps {
                assert!(!done.contains_key(&s.key));
                let reply = match s.actor {
                    Actor::Candidate(0) => format!("修正后的回答：{}", item.task_type),
                    Actor::Judge => judge.to_string(),
                    Actor::Candidate(_) | Actor::Panel(_) => {
                        unreachable!("one candidate, one judge")
                    }
                };
                done.insert(s.key, out(&reply));
            }
        }
    }

    #[test]
    fn steps_are_followup_then_judge() {
        let items = items();
        let plan = FbBenchPlan::new(Version::V3, 7, &items).unwrap();
        let item = &items[1]; // Text Translation: temperature 0.7
        let first = plan.next_steps(item, &Transcript::new());
        assert_eq!(first.len(), 1);
        assert_eq!(
            (first[0].key.as_str(), first[0].actor),
            (FOLLOWUP, Actor::Candidate(0))
        );
        assert_eq!(first[0].messages, followup_messages(item));
        assert_eq!(first[0].params.temperature, 0.7);
        assert_eq!(
            first,
            plan.next_steps(item, &Transcript::new()),
            "pure function"
        );
        let other_seed = plan.next_steps(&items[0], &Transcript::new());
        assert_ne!(first[0].params.seed, other_seed[0].params.seed);

        let mut done = Transcript::new();
        done.insert(FOLLOWUP.into(), out("天上下着倾盆大雨。"));
        let second = plan.next_steps(item, &done);
        assert_eq!(
            (second[0].key.as_str(), second[0].actor),
            (JUDGE, Actor::Judge)
        );
        assert_eq!(second[0].params.temperature, 0.0);
        assert_eq!(second[0].messages.len(), 1);
        assert_eq!(second[0].messages[0].role, Role::User);
        assert!(second[0].messages[0]
            .content
            .contains("<content>\n天上下着倾盆大雨。\n</content>"));
        // The judge is constrained to the item's JSON object by default, and only the judge.
        assert_eq!(first[0].params.constraint, None);
        assert_eq!(
            second[0].params.constraint,
            Some(Constraint::JsonSchema(checklist::judgement_schema(
                &item.criteria()
            )))
        );
        let free = FbBenchPlan {
            constrain: false,
            ..plan.clone()
        };
        assert_eq!(free.next_steps(item, &done)[0].params.constraint, None);
        done.insert(JUDGE.into(), out("{}"));
        assert!(plan.next_steps(item, &done).is_empty());
    }

    /// A thinking judge's reply as the engine records it: split with the real Qwen3 template's
    /// family ([`ReasoningFormat::split`]), cut at the token limit when `cut`.
    fn thinking_out(raw: &str, cut: bool) -> StepOutput {
        use crate::engine::Reasoning;
        use crate::text::reasoning::ReasoningFormat;
        let qwen3 = include_str!("../../../tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja");
        let format = ReasoningFormat::from_template(qwen3);
        let split = format.split(raw, false);
        StepOutput {
            text: split.answer.clone().unwrap_or_default(),
            stop_reason: if cut {
                StopReason::MaxTokens
            } else {
                StopReason::Eos
            },
            reasoning: split.reasoning.map(|text| Reasoning {
                text,
                tokens: 0,
                truncated: cut && split.answer.is_none(),
            }),
            ..StepOutput::scripted("")
        }
    }

    /// A thinking judge whose reasoning holds a different verdict than its answer is scored
    /// from the answer only; one cut inside its reasoning is unscored, never graded from the
    /// reasoning; a candidate cut inside its reasoning has no answer to grade.
    #[test]
    fn thinking_judges_are_scored_from_their_answer_only() {
        let items = items();
        let item = &items[0]; // Mathematics, EC: weights 0.6 / 0.15 / 0.25
        let mut done = Transcript::new();
        done.insert(FOLLOWUP.into(), out("修正后的回答"));
        let all_met = judge_reply(item, &[0, 1, 2]);
        let first_met = judge_reply(item, &[0]);
        done.insert(
            JUDGE.into(),
            thinking_out(
                &format!("<think>\nDraft:\n{all_met}\nNo, only the first holds.\n</think>\n\n{first_met}"),
                false,
            ),
        );
        assert!(done[JUDGE]
            .reasoning
            .as_ref()
            .unwrap()
            .text
            .contains("Draft"));
        let from_answer = checklist::parse_output(&first_met, &item.criteria());
        assert!(from_answer.scored().is_some());
        assert_eq!(verdicts(item, &done, Rule::Paper), from_answer);
        assert_ne!(
            verdicts(item, &done, Rule::Paper),
            checklist::parse_output(&all_met, &item.criteria())
        );

        // Cut inside the reasoning (which holds a parseable verdict): unscored, with reason.
        done.insert(
            JUDGE.into(),
            thinking_out(&format!("<think>\nDraft:\n{all_met}"), true),
        );
        for rule in [Rule::Paper, Rule::Published] {
            assert_eq!(
                verdicts(item, &done, rule),
                Verdict::unscored(REASONING_TRUNCATED)
            );
        }
        let u = unit(item, verdicts(item, &done, Rule::Paper), Rule::Paper);
        assert!(u.score.is_none());
        assert_eq!(u.unscored.as_deref(), Some(REASONING_TRUNCATED));

        // The candidate's follow-up was cut inside its reasoning.
        done.insert(FOLLOWUP.into(), thinking_out("<think>\nLet me redo", true));
        done.insert(JUDGE.into(), out(&first_met));
        assert_eq!(
            verdicts(item, &done, Rule::Paper),
            Verdict::unscored("candidate: reasoning truncated")
        );
    }

    #[test]
    fn v1_plan_refuses_items_without_references() {
        let items = items();
        let e = FbBenchPlan::new(Version::V1, 0, &items)
            .unwrap_err()
            .to_string();
        assert!(e.contains("item 0") && e.contains("reference"), "{e}");
    }

    #[test]
    fn canned_runs_score_and_round_trip_through_the_published_format() {
        let items = items();
        let plan = FbBenchPlan::new(Version::V3, 0, &items).unwrap();
        let met: [&[usize]; 4] = [&[0, 2], &[0], &[1], &[]];
        let mut transcripts: Vec<Transcript> = items
            .iter()
            .zip(met)
            .map(|(item, m)| run(&plan, item, &judge_reply(item, m)))
            .collect();
        // A fifth run whose judge answered prose only: unscored, left out, counted.
        transcripts.push(run(&plan, &items[3], "I think the answer is fine."));
        let runs: Vec<(&Item, &Transcript)> = items
            .iter()
            .chain(std::iter::once(&items[3]))
            .zip(&transcripts)
            .collect();

        let r = score_transcripts("m", &runs, Rule::Published, 1);
        let [ec, rm, all] = [&r.metrics[0], &r.metrics[1], &r.metrics[2]];
        // EC: Mathematics 0.6 + 0.15, Translation 1 → mean 0.875; RM: Coding 1, Reasoning 0.
        assert!((ec.interval.value - 87.5).abs() < 1e-9, "{ec:?}");
        assert!((rm.interval.value - 50.0).abs() < 1e-9, "{rm:?}");
        assert!((all.interval.value - 68.75).abs() < 1e-9, "{all:?}");
        assert_eq!((all.n, all.unscored), (4, 1));
        let paper = score_transcripts("m", &runs, Rule::Paper, 1);
        assert_eq!(
            paper.metrics[1].interval.value, 0.0,
            "Coding met 1 of 2 criteria"
        );

        let (records, left_out) = judgement_records(&plan, &runs, "m", "j");
        assert_eq!(records.len(), 4);
        assert_eq!(
            left_out,
            [(
                plan.item_id(&items[3]),
                "no json object of checklist verdicts in the judge output".to_string()
            )]
        );
        assert_eq!(records[0].score.as_f64(), Some(0.75));
        assert!(records[2].score.is_i64(), "RM scores are Python ints");
        let mut buf = Vec::new();
        write_judgements(&mut buf, &records).unwrap();
        let back: Vec<JudgementRecord> =
            parse_jsonl(buf.as_slice(), Path::new("m.jsonl"), |_| Ok(())).unwrap();
        assert_eq!(back, records);
        let recorded = units_from_records(&back, Rule::Published, false).unwrap();
        let reparsed = units_from_records(&back, Rule::Published, true).unwrap();
        let direct = units_from_transcripts(&runs[..4], Rule::Published);
        assert_eq!(recorded, direct);
        assert_eq!(reparsed, direct);
    }
}
