//! ReaLMistake as a Candor run: each candidate model is an error detector, asked with the
//! paper's prompts (and optionally sampled k times for self-consistency); finished transcripts
//! are scored into the authors' metrics, with a majority vote when there are several
//! detectors.
//!
//! Steps of one item, all independent of each other (so all are ready at once):
//! `prompt/<p>` for prompt number `p` (1..4 for 1-A, 1-B, 2-A, 2-B; 5 for the evaluation-steps
//! variant), `prompt/<p>/sample/<s>` when self-consistency draws `k > 1` samples, each prefixed
//! with `detector/<i>/` when there is more than one detector model (`Actor::Candidate(i)`).
//! Greedy steps use temperature 0 (as the paper); self-consistency uses the paper's
//! temperature 0.5 with a seed derived from the run seed, the item and the step key. A missing
//! step or an unparseable reply is a missing verdict, which the authors' rules count as
//! `no_error` for P/R/F1 and as wrong for accuracy.

use std::collections::BTreeMap;

use crate::bench::plan::{step_seed, Actor, Plan, Step, Transcript};
use crate::bench::BenchResults;
use crate::engine::{Constraint, SamplingParams};
use crate::judge::error_detection::{
    detection_grammar, detection_prompt, parse_detection, Detection, DetectionPrompt,
};
use crate::text::message::Message;

use super::data::Item;
use super::score::{self, Cell};

/// How Candor runs ReaLMistake.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectionPlan {
    /// Number of detector models (`Actor::Candidate(0..detectors)`); more than one adds the
    /// authors' majority vote over all detectors and prompts.
    pub detectors: usize,
    pub prompts: Vec<DetectionPrompt>,
    /// Samples per prompt: 1 is greedy; k > 1 is self-consistency.
    pub samples: usize,
    /// Temperature of self-consistency samples (the paper: 0.5).
    pub sample_temperature: f32,
    /// New tokens per detector reply (the paper: 4,096; a reply cut before its verdict reads
    /// as a missing verdict).
    pub max_new_tokens: usize,
    /// Run seed, from which every sampled step's seed is derived.
    pub seed: u64,
    /// Constrain each reply to an explanation line and one of its prompt's two concluding
    /// sentences (`--constrain on`; off by default, as the authors' detectors wrote freely).
    pub constrain: bool,
}

impl Default for DetectionPlan {
    fn default() -> Self {
        DetectionPlan {
            detectors: 1,
            prompts: DetectionPrompt::SIMPLE.to_vec(),
            samples: 1,
            sample_temperature: 0.5,
            max_new_tokens: 4096,
            seed: 0,
            constrain: false,
        }
    }
}

/// The number of a prompt in step keys (1..4, and 5 for the evaluation-steps variant).
pub fn prompt_number(p: DetectionPrompt) -> usize {
    p.number().unwrap_or(5)
}

impl DetectionPlan {
    /// The key of one step.
    pub fn step_key(&self, detector: usize, prompt: DetectionPrompt, sample: usize) -> String {
        let mut key = format!("prompt/{}", prompt_number(prompt));
        if self.samples > 1 {
            key.push_str(&format!("/sample/{sample}"));
        }
        if self.detectors > 1 {
            key = format!("detector/{detector}/{key}");
        }
        key
    }

    fn params(&self, item_id: &str, key: &str, prompt: DetectionPrompt) -> SamplingParams {
        SamplingParams {
            temperature: if self.samples > 1 {
                self.sample_temperature
            } else {
                0.0
            },
            top_p: 1.0,
            seed: step_seed(self.seed, item_id, key),
            max_new_tokens: self.max_new_tokens,
            stop_strings: Vec::new(),
            constraint: self
                .constrain
                .then(|| Constraint::Lark(detection_grammar(prompt))),
        }
    }

    /// One detector's verdict for one prompt: the parsed reply, or the self-consistency vote
    /// over its samples. `None` when missing or unparseable.
    pub fn prediction(
        &self,
        done: &Transcript,
        detector: usize,
        prompt: DetectionPrompt,
    ) -> Option<Detection> {
        let verdicts: Vec<Option<Detection>> = (0..self.samples.max(1))
            .map(|s| {
                let out = done.get(&self.step_key(detector, prompt, s))?;
                out.verdict(parse_detection).scored().copied()
            })
            .collect();
        if self.samples > 1 {
            score::self_consistency_vote(&verdicts)
        } else {
            verdicts.first().copied().flatten()
        }
    }

    /// Scores finished items: per (task, response model), one cell per detector and prompt
    /// (detector `candidate/<i>`), plus `majority_vote` when there are several detectors.
    /// Headline metrics are over the detectors' cells (and `majority_vote/<metric>` over the
    /// vote's); tables come from all cells.
    pub fn score(&self, runs: &[(Item, Transcript)], seed: u64) -> BenchResults {
        type Key = (String, String, String, String);
        let mut pairs: BTreeMap<Key, Vec<(Detection, Option<Detection>)>> = BTreeMap::new();
        for (item, done) in runs {
            let mut all = Vec::new();
            for d in 0..self.detectors {
                for &p in &self.prompts {
                    let pred = self.prediction(done, d, p);
                    all.push(pred);
                    let key = (
                        item.task.clone(),
                        item.response_model.clone(),
                        format!("candidate/{d}"),
                        p.file_stem(),
                    );
                    // An unlabelled item (a user's file) has a prediction but no pair.
                    if let Some(label) = item.label {
                        pairs.entry(key).or_default().push((label, pred));
                    }
                }
            }
            if self.detectors > 1 {
                let key = (
                    item.task.clone(),
                    item.response_model.clone(),
                    "majority_vote".to_string(),
                    "majority_vote".to_string(),
                );
                let vote = score::majority_vote(&all);
                if let Some(label) = item.label {
                    pairs.entry(key).or_default().push((label, Some(vote)));
                }
            }
        }
        let cells: Vec<Cell> = pairs
            .into_iter()
            .map(|((task, response_model, detector, prompt), pairs)| Cell {
                task,
                response_model,
                detector,
                prompt,
                pairs,
            })
            .collect();
        let (vote, single): (Vec<Cell>, Vec<Cell>) = cells
            .iter()
            .cloned()
            .partition(|c| c.detector == "majority_vote");
        let mut results = score::headline(&single, seed);
        if !vote.is_empty() {
            for mut m in score::headline(&vote, seed).metrics {
                m.name = format!("majority_vote/{}", m.name);
                results.metrics.push(m);
            }
        }
        results.tables = score::headline(&cells, seed).tables;
        results
            .tables
            .extend(super::reliability::reliability_tables(&cells, seed));
        results
    }
}

impl Plan for DetectionPlan {
    type Item = Item;

    fn item_id(&self, item: &Item) -> String {
        item.id.clone()
    }

    fn next_steps(&self, item: &Item, done: &Transcript) -> Vec<Step> {
        let mut steps = Vec::new();
        for d in 0..self.detectors {
            for &p in &self.prompts {
                let text = detection_prompt(p, &item.input, &item.llm_response);
                for s in 0..self.samples.max(1) {
                    let key = self.step_key(d, p, s);
                    if done.contains_key(&key) {
                        continue;
                    }
                    steps.push(Step {
                        params: self.params(&item.id, &key, p),
                        key,
                        actor: Actor::Candidate(d),
                        messages: vec![Message::user(text.clone())],
                    });
                }
            }
        }
        steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::plan::StepOutput;
    use crate::engine::StopReason;

    fn item(id: &str, label: Detection) -> Item {
        Item {
            task: "math_word_problem_generation".into(),
            response_model: "gpt-4-0613".into(),
            id: id.into(),
            input: "Write a problem.".into(),
            llm_response: "A problem.".into(),
            label: Some(label),
            error_categories: vec![],
            human_explanation: String::new(),
            metadata: serde_json::Value::Null,
        }
    }

    fn out(text: &str) -> StepOutput {
        StepOutput {
            text: text.into(),
            stop_reason: StopReason::Eos,
            prompt_tokens: 10,
            output_tokens: 5,
            truncated: None,
            reasoning: None,
        }
    }

    const ERR: &str = "Therefore, the model response contains an error.";
    const OK: &str = "Therefore, the model response is valid.";

    #[test]
    fn single_detector_steps_and_keys() {
        let plan = DetectionPlan::default();
        let it = item("a", Detection::Error);
        let steps = plan.next_steps(&it, &Transcript::new());
        let keys: Vec<&str> = steps.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["prompt/1", "prompt/2", "prompt/3", "prompt/4"]);
        assert!(steps.iter().all(|s| s.actor == Actor::Candidate(0)));
        assert!(steps.iter().all(|s| s.params.temperature == 0.0));
        assert_eq!(
            steps[2].messages,
            vec![Message::user(detection_prompt(
                DetectionPrompt::P3,
                &it.input,
                &it.llm_response
            ))]
        );
        let mut done = Transcript::new();
        done.insert("prompt/2".into(), out(ERR));
        let rest: Vec<String> = plan
            .next_steps(&it, &done)
            .into_iter()
            .map(|s| s.key)
            .collect();
        assert_eq!(rest, ["prompt/1", "prompt/3", "prompt/4"]);
        for k in ["prompt/1", "prompt/3", "prompt/4"] {
            done.insert(k.into(), out(OK));
        }
        assert!(plan.next_steps(&it, &done).is_empty());
    }

    #[test]
    fn self_consistency_and_several_detectors() {
        let plan = DetectionPlan {
            detectors: 2,
            prompts: vec![DetectionPrompt::P1],
            samples: 3,
            ..DetectionPlan::default()
        };
        let it = item("a", Detection::Error);
        let steps = plan.next_steps(&it, &Transcript::new());
        let keys: Vec<&str> = steps.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "detector/0/prompt/1/sample/0",
                "detector/0/prompt/1/sample/1",
                "detector/0/prompt/1/sample/2",
                "detector/1/prompt/1/sample/0",
                "detector/1/prompt/1/sample/1",
                "detector/1/prompt/1/sample/2",
            ]
        );
        assert_eq!(steps[3].actor, Actor::Candidate(1));
        assert!(steps.iter().all(|s| s.params.temperature == 0.5));
        let seeds: std::collections::BTreeSet<u64> = steps.iter().map(|s| s.params.seed).collect();
        assert_eq!(seeds.len(), 6, "every sample has its own seed");
        // Seeds are stable across calls and depend on the run seed.
        assert_eq!(
            plan.next_steps(&it, &Transcript::new())[0].params.seed,
            steps[0].params.seed
        );
        let other = DetectionPlan {
            seed: 1,
            ..plan.clone()
        };
        assert_ne!(
            other.next_steps(&it, &Transcript::new())[0].params.seed,
            steps[0].params.seed
        );

        let mut done = Transcript::new();
        for (k, t) in [
            ("detector/0/prompt/1/sample/0", ERR),
            ("detector/0/prompt/1/sample/1", "unsure"),
            ("detector/0/prompt/1/sample/2", ERR),
            ("detector/1/prompt/1/sample/0", OK),
            ("detector/1/prompt/1/sample/1", OK),
            ("detector/1/prompt/1/sample/2", ERR),
        ] {
            done.insert(k.into(), out(t));
        }
        assert_eq!(
            plan.prediction(&done, 0, DetectionPrompt::P1),
            Some(Detection::Error)
        );
        assert_eq!(
            plan.prediction(&done, 1, DetectionPrompt::P1),
            Some(Detection::NoError)
        );
        // Two outputs, one says error: not more than half, so the vote is no_error.
        let r = plan.score(&[(it, done)], 0);
        let names: Vec<&str> = r.metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "f1",
                "precision",
                "recall",
                "accuracy",
                "majority_vote/f1",
                "majority_vote/precision",
                "majority_vote/recall",
                "majority_vote/accuracy"
            ]
        );
        assert_eq!(r.metrics[7].interval.value, 0.0);
        // Per detector: candidate/0 right (accuracy 1), candidate/1 wrong (0): mean 0.5.
        assert_eq!(r.metrics[3].interval.value, 0.5);
    }

    #[test]
    fn scoring_counts_missing_verdicts_as_published() {
        let plan = DetectionPlan {
            prompts: vec![DetectionPrompt::P1, DetectionPrompt::P4],
            ..DetectionPlan::default()
        };
        let mut a = Transcript::new();
        a.insert("prompt/1".into(), out(ERR));
        a.insert("prompt/4".into(), out("no idea"));
        let mut b = Transcript::new();
        b.insert("prompt/1".into(), out(ERR));
        b.insert("prompt/4".into(), out(OK));
        let runs = vec![
            (item("a", Detection::Error), a),
            (item("b", Detection::NoError), b),
        ];
        let r = plan.score(&runs, 0);
        let acc = &r.metrics[3];
        // prompt 1: 1/2 right; prompt 4: item a has no verdict (wrong), item b right: 1/2.
        assert_eq!(acc.interval.value, 0.5);
        assert_eq!((acc.n, acc.unscored), (4, 1));
        // recall: prompt 1 finds the error (1), prompt 4 does not (0).
        assert_eq!(r.metrics[2].interval.value, 0.5);
    }
}
