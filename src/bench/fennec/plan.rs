//! Fennec as a Candor run: the judge model's branching chain on one pairwise item, and the
//! scoring of finished chains into Agreement and Consistency (or single Accuracy).
//!
//! The chain follows the authors' `pairwise_eval_func` (`src/actions/fennec.py`), every step
//! by `Actor::Judge`:
//! 1. `criteria`: one generation listing evaluation criteria; its first `branches` parsed
//!    criteria (default 5, the number the prompt asks for; a `branches` above five asks for
//!    that many, the paper's ablation) are the branches `b = 0..`;
//! 2. `guideline/<b>`: a scoring guideline for each criterion;
//! 3. pairwise mode: `pairwise/<b>/normal` and `pairwise/<b>/exchanged` (responses shown B
//!    first, labels kept, so both replies score A and B); single mode: `single/<b>/a` and
//!    `single/<b>/b`;
//! 4. the branch scores are summed per response and order (`score::merge_pair_scores`), and
//!    the sums compared;
//! 5. `correction/a`, `correction/b`: rewriting a response whose branch scores are low (at
//!    most 3), given those branches' findings; only when some branch qualifies, and only when
//!    [`FennecPlan::correction`] is set (off by default: the authors' pairwise evaluation does
//!    not run it and no metric reads it).
//!
//! Every branch's prompts start with the same system message and text up to the criterion,
//! so an engine that shares KV prefixes computes that part once per item. Steps are greedy, as
//! the paper says (the authors' code samples the scoring steps at temperature 0.1, top-p 0.99;
//! Candor keeps greedy decoding so that a run is reproducible), with seeds derived from the run
//! seed, item and key. Each kind of step has its own new-token limit ([`FennecLimits`]).

use serde::Serialize;

use crate::bench::item_scores::MetricItems;
use crate::bench::plan::{step_seed, Actor, Plan, Step, Transcript};
use crate::bench::table::{Cell, Table};
use crate::bench::BenchResults;
use crate::engine::{Constraint, SamplingParams};
use crate::judge::fennec;
use crate::judge::fennec::{
    clean_guideline, correction_findings, correction_prompt, criteria_prompt_for, guideline_prompt,
    pairwise_prompt, parse_criteria, parse_pair_scores, parse_single_score,
    single_correction_findings, single_prompt, Order, Side, BRANCH_SYSTEM, CORRECTION_SYSTEM,
    PAIRWISE_SYSTEM, SINGLE_SYSTEM,
};
use crate::judge::Verdict;
use crate::text::message::Message;

use super::data::PairItem;
use super::score::{self, PairOutcome, SingleOutcome};

/// Pairwise judgement (both orders) or one score per response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pairwise,
    Single,
}

/// New-token limits per kind of step. The paper gives none; its example scoring guidelines
/// run 300-450 tokens and a judgement must reach `Response B Score:`, so 1,024 each leaves
/// room; a correction rewrites a whole response (2,048).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FennecLimits {
    pub criteria: usize,
    pub guideline: usize,
    pub judgement: usize,
    pub correction: usize,
}

impl Default for FennecLimits {
    fn default() -> Self {
        FennecLimits {
            criteria: 1024,
            guideline: 1024,
            judgement: 1024,
            correction: 2048,
        }
    }
}

impl FennecLimits {
    /// The same limit for every step (`--max-new-tokens`).
    pub fn all(n: usize) -> Self {
        FennecLimits {
            criteria: n,
            guideline: n,
            judgement: n,
            correction: n,
        }
    }

    /// The limit of the step with `key`.
    pub fn of(&self, key: &str) -> usize {
        match key.split('/').next().unwrap_or("") {
            "criteria" => self.criteria,
            "guideline" => self.guideline,
            "correction" => self.correction,
            _ => self.judgement,
        }
    }
}

/// How Candor runs Fennec.
#[derive(Debug, Clone, PartialEq)]
pub struct FennecPlan {
    /// Criteria kept from the criteria reply (the branches).
    pub branches: usize,
    pub mode: Mode,
    /// Whether low-scored responses are corrected.
    pub correction: bool,
    pub temperature: f32,
    pub limits: FennecLimits,
    pub seed: u64,
    /// Constrain the judgement steps to the prompt's score lines
    /// ([`fennec::PAIR_RESULT_GRAMMAR`], [`fennec::SINGLE_RESULT_GRAMMAR`]).
    pub constrain: bool,
}

impl Default for FennecPlan {
    fn default() -> Self {
        FennecPlan {
            branches: 5,
            mode: Mode::Pairwise,
            correction: false,
            temperature: 0.0,
            limits: FennecLimits::default(),
            seed: 0,
            constrain: false,
        }
    }
}

/// A step's system message and user text.
type Prompt = (&'static str, String);

impl FennecPlan {
    /// The criteria step's prompt.
    pub fn criteria_prompt(&self, query: &str) -> Prompt {
        (BRANCH_SYSTEM, criteria_prompt_for(query, self.branches))
    }

    /// A guideline step's prompt (the authors send the pairwise system message).
    pub fn guideline_prompt(&self, query: &str, criterion: &str) -> Prompt {
        (PAIRWISE_SYSTEM, guideline_prompt(query, criterion))
    }

    /// A branch's two judgement prompts, in [`Self::judgement_keys`] order.
    pub fn judgement_prompts(
        &self,
        item: &PairItem,
        criterion: &str,
        guideline: &str,
    ) -> [Prompt; 2] {
        let (q, a, b) = (&item.query, &item.response_a, &item.response_b);
        match self.mode {
            Mode::Pairwise => [
                (
                    PAIRWISE_SYSTEM,
                    pairwise_prompt(q, criterion, guideline, a, b, Order::Normal),
                ),
                (
                    PAIRWISE_SYSTEM,
                    pairwise_prompt(q, criterion, guideline, a, b, Order::Exchanged),
                ),
            ],
            Mode::Single => [
                (SINGLE_SYSTEM, single_prompt(q, criterion, guideline, a)),
                (SINGLE_SYSTEM, single_prompt(q, criterion, guideline, b)),
            ],
        }
    }

    /// A correction step's prompt.
    pub fn correction_prompt(&self, query: &str, response: &str, findings: &str) -> Prompt {
        (
            CORRECTION_SYSTEM,
            correction_prompt(query, response, findings),
        )
    }

    /// The prompt templates this plan sends, rendered with `{placeholders}` by the same
    /// functions as the steps (system message, a newline, user text), by name: what the
    /// manifest hashes.
    pub fn templates(&self) -> Vec<(&'static str, String)> {
        let item = PairItem {
            id: String::new(),
            query: "{query}".into(),
            response_a: "{response_a}".into(),
            response_b: "{response_b}".into(),
            label: None,
            category: String::new(),
            annotators: Vec::new(),
        };
        let join = |(system, user): Prompt| format!("{system}\n{user}");
        let mut out = vec![
            ("fennec/criteria", join(self.criteria_prompt("{query}"))),
            (
                "fennec/guideline",
                join(self.guideline_prompt("{query}", "{criterion}")),
            ),
        ];
        let [first, _] = self.judgement_prompts(&item, "{criterion}", "{guideline}");
        out.push(match self.mode {
            Mode::Pairwise => ("fennec/pairwise", join(first)),
            Mode::Single => ("fennec/single", join(first)),
        });
        if self.correction {
            out.push((
                "fennec/correction",
                join(self.correction_prompt("{query}", "{response_a}", "{judge}")),
            ));
        }
        out
    }

    /// The branches' criteria, once the criteria step is done (from its answer only).
    pub fn criteria(&self, done: &Transcript) -> Option<Vec<String>> {
        done.get("criteria")
            .map(|o| parse_criteria(&o.text, self.branches))
    }

    /// The judgement step keys of branch `b` (two per branch).
    pub fn judgement_keys(&self, b: usize) -> [String; 2] {
        match self.mode {
            Mode::Pairwise => [
                format!("pairwise/{b}/normal"),
                format!("pairwise/{b}/exchanged"),
            ],
            Mode::Single => [format!("single/{b}/a"), format!("single/{b}/b")],
        }
    }

    /// The constraint of a step, when constrained: judgement steps only.
    pub fn constraint(&self, key: &str) -> Option<Constraint> {
        let grammar = if key.starts_with("pairwise/") {
            fennec::PAIR_RESULT_GRAMMAR
        } else if key.starts_with("single/") {
            fennec::SINGLE_RESULT_GRAMMAR
        } else {
            return None;
        };
        self.constrain
            .then(|| Constraint::Lark(grammar.to_string()))
    }

    fn step(&self, item: &PairItem, key: String, (system, user): Prompt) -> Step {
        Step {
            params: SamplingParams {
                temperature: self.temperature,
                top_p: 1.0,
                seed: step_seed(self.seed, &item.id, &key),
                max_new_tokens: self.limits.of(&key),
                stop_strings: Vec::new(),
                constraint: self.constraint(&key),
            },
            key,
            actor: Actor::Judge,
            messages: vec![Message::system(system), Message::user(user)],
        }
    }

    /// The findings a correction of `side` is given, once every judgement step is done.
    pub fn findings(&self, criteria: &[String], done: &Transcript, side: Side) -> Option<String> {
        let branch_texts: Vec<(&str, &str)> = criteria
            .iter()
            .enumerate()
            .filter_map(|(b, c)| {
                let keys = self.judgement_keys(b);
                let key = match (self.mode, side) {
                    (Mode::Pairwise, _) | (Mode::Single, Side::A) => &keys[0],
                    (Mode::Single, Side::B) => &keys[1],
                };
                Some((c.as_str(), done.get(key)?.text.as_str()))
            })
            .collect();
        match self.mode {
            Mode::Pairwise => correction_findings(&branch_texts, side),
            Mode::Single => single_correction_findings(&branch_texts),
        }
    }

    /// The item's verdicts from a finished chain: (normal, exchanged) merged preferences in
    /// pairwise mode; in single mode both are the single-score preference.
    fn verdicts(
        &self,
        done: &Transcript,
    ) -> (
        Verdict<super::data::Preference>,
        Verdict<super::data::Preference>,
    ) {
        let Some(criteria) = self.criteria(done).filter(|c| !c.is_empty()) else {
            let v = Verdict::unscored("no criteria parsed from the criteria reply");
            return (v.clone(), v);
        };
        // A judgement's verdict from its answer (a missing step parses as an empty reply).
        let read = |key: &str, parse: fn(&str) -> Verdict<_>| match done.get(key) {
            Some(o) => o.verdict(parse),
            None => parse(""),
        };
        match self.mode {
            Mode::Pairwise => {
                let mut normal = Vec::new();
                let mut exchanged = Vec::new();
                for b in 0..criteria.len() {
                    let [n, e] = self.judgement_keys(b);
                    normal.push(read(&n, parse_pair_scores));
                    exchanged.push(read(&e, parse_pair_scores));
                }
                (
                    score::preference(&score::merge_pair_scores(&normal)),
                    score::preference(&score::merge_pair_scores(&exchanged)),
                )
            }
            Mode::Single => {
                let pairs: Vec<_> = (0..criteria.len())
                    .map(|b| {
                        let [a, bb] = self.judgement_keys(b);
                        (read_single(done, &a), read_single(done, &bb))
                    })
                    .collect();
                let v = score::preference(&score::merge_single_scores(&pairs));
                (v.clone(), v)
            }
        }
    }

    /// Scores finished chains against the items' labels: Agreement and Consistency (pairwise)
    /// or Accuracy (single), plus a table of the judge's replies.
    pub fn score(&self, runs: &[(PairItem, Transcript)], seed: u64) -> BenchResults {
        let mut results = match self.mode {
            Mode::Pairwise => score::pairwise_results(&self.pair_outcomes(runs), seed),
            Mode::Single => score::single_results(&self.single_outcomes(runs), seed),
        };
        results.tables.push(self.reply_table(runs));
        let items: Vec<&PairItem> = runs.iter().map(|(item, _)| item).collect();
        results.tables.extend(score::annotator_table(&items, seed));
        results
    }

    /// The per-item values of the headline metrics (item ids as the run's), for `candor
    /// compare`.
    pub fn item_values(&self, runs: &[(PairItem, Transcript)]) -> Vec<MetricItems> {
        let ids: Vec<String> = runs.iter().map(|(item, _)| item.id.clone()).collect();
        match self.mode {
            Mode::Pairwise => score::pairwise_item_values(&ids, &self.pair_outcomes(runs)),
            Mode::Single => score::single_item_values(&ids, &self.single_outcomes(runs)),
        }
    }

    fn pair_outcomes(&self, runs: &[(PairItem, Transcript)]) -> Vec<PairOutcome> {
        runs.iter()
            .map(|(item, done)| {
                let (normal, exchanged) = self.verdicts(done);
                PairOutcome {
                    label: item.label,
                    category: item.category.clone(),
                    normal,
                    exchanged,
                }
            })
            .collect()
    }

    fn single_outcomes(&self, runs: &[(PairItem, Transcript)]) -> Vec<SingleOutcome> {
        runs.iter()
            .map(|(item, done)| SingleOutcome {
                label: item.label,
                category: item.category.clone(),
                verdict: self.verdicts(done).0,
            })
            .collect()
    }

    /// Counts of the judge's replies: criteria parsed, branch replies parsed or not,
    /// corrections produced.
    fn reply_table(&self, runs: &[(PairItem, Transcript)]) -> Table {
        let (mut branches, mut parsed, mut unparsed, mut corrections) = (0, 0, 0, 0);
        for (_, done) in runs {
            let criteria = self.criteria(done).unwrap_or_default();
            branches += criteria.len();
            for b in 0..criteria.len() {
                for key in self.judgement_keys(b) {
                    let Some(o) = done.get(&key) else { continue };
                    let ok = match self.mode {
                        Mode::Pairwise => o.verdict(parse_pair_scores).scored().is_some(),
                        Mode::Single => o.verdict(parse_single_score).scored().is_some(),
                    };
                    if ok {
                        parsed += 1;
                    } else {
                        unparsed += 1;
                    }
                }
            }
            corrections += ["correction/a", "correction/b"]
                .iter()
                .filter(|k| done.contains_key(**k))
                .count();
        }
        Table {
            id: crate::bench::table::table_id::FENNEC_REPLIES.to_string(),
            title: "Fennec judge replies".to_string(),
            columns: [
                "items",
                "branches",
                "judgements_parsed",
                "judgements_unscored",
                "corrections",
            ]
            .map(String::from)
            .to_vec(),
            rows: vec![[runs.len(), branches, parsed, unparsed, corrections]
                .map(Cell::from)
                .to_vec()],
        }
    }
}

impl Plan for FennecPlan {
    type Item = PairItem;

    fn item_id(&self, item: &PairItem) -> String {
        item.id.clone()
    }

    fn next_steps(&self, item: &PairItem, done: &Transcript) -> Vec<Step> {
        let q = &item.query;
        let Some(criteria) = self.criteria(done) else {
            return vec![self.step(item, "criteria".into(), self.criteria_prompt(q))];
        };
        let mut steps = Vec::new();
        let mut judged = true;
        for (b, criterion) in criteria.iter().enumerate() {
            let gkey = format!("guideline/{b}");
            let Some(guideline) = done.get(&gkey) else {
                let prompt = self.guideline_prompt(q, criterion);
                steps.push(self.step(item, gkey, prompt));
                judged = false;
                continue;
            };
            let g = clean_guideline(&guideline.text);
            let prompts = self.judgement_prompts(item, criterion, &g);
            for (key, prompt) in self.judgement_keys(b).into_iter().zip(prompts) {
                if !done.contains_key(&key) {
                    steps.push(self.step(item, key, prompt));
                    judged = false;
                }
            }
        }
        if judged && self.correction && !criteria.is_empty() {
            for (side, key, response) in [
                (Side::A, "correction/a", &item.response_a),
                (Side::B, "correction/b", &item.response_b),
            ] {
                if done.contains_key(key) {
                    continue;
                }
                if let Some(findings) = self.findings(&criteria, done, side) {
                    let prompt = self.correction_prompt(q, response, &findings);
                    steps.push(self.step(item, key.into(), prompt));
                }
            }
        }
        steps
    }
}

/// A single-score judgement's verdict from its answer (a missing step parses as an empty
/// reply).
fn read_single(done: &Transcript, key: &str) -> Verdict<u8> {
    match done.get(key) {
        Some(o) => o.verdict(parse_single_score),
        None => parse_single_score(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::fennec::data::Preference;
    use crate::bench::plan::StepOutput;
    use crate::engine::StopReason;
    use crate::judge::fennec::{guideline_prefix, pairwise_prefix};

    fn item(id: &str, label: Preference) -> PairItem {
        PairItem {
            id: id.into(),
            query: "Name a prime number.".into(),
            response_a: "7".into(),
            response_b: "8".into(),
            label: Some(label),
            category: "open_question".into(),
            annotators: Vec::new(),
        }
    }

    fn out(text: &str) -> StepOutput {
        StepOutput {
            text: text.into(),
            stop_reason: StopReason::Eos,
            prompt_tokens: 1,
            output_tokens: 1,
            truncated: None,
            reasoning: None,
        }
    }

    fn keys(steps: &[Step]) -> Vec<&str> {
        steps.iter().map(|s| s.key.as_str()).collect()
    }

    const CRITERIA: &str =
        "1. Correctness: is it prime?\n2. Brevity: is it short?\n3. Style: nice?";

    fn pair(a: u8, b: u8) -> String {
        format!("Response A Score: {a}\nExplanation: a.\nResponse B Score: {b}\nExplanation: b.\nComparison: c.")
    }

    /// (A, B) scores in the normal order, then in the exchanged order, for one branch.
    type Branch = ((u8, u8), (u8, u8));

    /// A pairwise chain with the given scores for its first branches.
    fn chain(scores: &[Branch]) -> Transcript {
        let mut done = Transcript::new();
        done.insert("criteria".into(), out(CRITERIA));
        for (b, (n, e)) in scores.iter().enumerate() {
            done.insert(
                format!("guideline/{b}"),
                out("[Scoring Guideline]: 5 is best."),
            );
            done.insert(format!("pairwise/{b}/normal"), out(&pair(n.0, n.1)));
            done.insert(format!("pairwise/{b}/exchanged"), out(&pair(e.0, e.1)));
        }
        done
    }

    #[test]
    fn pairwise_chain_unfolds_step_by_step() {
        let plan = FennecPlan {
            branches: 2,
            correction: true,
            ..FennecPlan::default()
        };
        let it = item("x", Preference::A);
        let mut done = Transcript::new();
        let s = plan.next_steps(&it, &done);
        assert_eq!(keys(&s), ["criteria"]);
        assert_eq!(s[0].actor, Actor::Judge);
        assert_eq!(s[0].messages[0], Message::system(BRANCH_SYSTEM));
        done.insert("criteria".into(), out(CRITERIA));

        let s = plan.next_steps(&it, &done);
        assert_eq!(keys(&s), ["guideline/0", "guideline/1"]);
        // The branches share their prefix.
        assert_eq!(s[0].messages[0], s[1].messages[0]);
        for step in &s {
            assert!(step.messages[1]
                .content
                .starts_with(&guideline_prefix(&it.query)));
        }
        assert!(s[1].messages[1].content.contains("Brevity: is it short?"));
        done.insert("guideline/0".into(), out("[Scoring Guideline]: 5 = prime."));

        let s = plan.next_steps(&it, &done);
        assert_eq!(
            keys(&s),
            ["pairwise/0/normal", "pairwise/0/exchanged", "guideline/1"]
        );
        let normal = &s[0].messages[1].content;
        let exchanged = &s[1].messages[1].content;
        assert!(normal.starts_with(&pairwise_prefix(&it.query)));
        assert!(normal.contains("[Scoring Guideline]:\n5 = prime.\n***"));
        let a_first =
            |t: &str| t.find("[The Start of Response A]") < t.find("[The Start of Response B]");
        assert!(a_first(normal) && !a_first(exchanged));
        done.insert("guideline/1".into(), out("g"));
        done.insert("pairwise/0/normal".into(), out(&pair(2, 5)));
        done.insert("pairwise/0/exchanged".into(), out(&pair(3, 5)));

        let s = plan.next_steps(&it, &done);
        assert_eq!(keys(&s), ["pairwise/1/normal", "pairwise/1/exchanged"]);
        done.insert("pairwise/1/normal".into(), out(&pair(4, 5)));
        done.insert("pairwise/1/exchanged".into(), out("no scores"));

        // A scored 2 on branch 0: only A is corrected, given branch 0's findings on A.
        let s = plan.next_steps(&it, &done);
        assert_eq!(keys(&s), ["correction/a"]);
        assert_eq!(s[0].messages[0], Message::system(CORRECTION_SYSTEM));
        let prompt = &s[0].messages[1].content;
        assert!(prompt.contains("[The Start of Judge Result]:\nCorrectness: is it prime?Response Score: 2\nExplanation: a.\n\n[The End of Judge Result]"), "{prompt}");
        assert!(prompt.contains("[The Start of Original Response]:\n7\n"));
        done.insert("correction/a".into(), out("11"));
        assert!(plan.next_steps(&it, &done).is_empty());

        let no_correction = FennecPlan {
            correction: false,
            ..plan.clone()
        };
        done.remove("correction/a");
        assert!(no_correction.next_steps(&it, &done).is_empty());
    }

    #[test]
    fn scoring_pairwise_chains() {
        let plan = FennecPlan::default();
        let runs = vec![
            // A wins in both orders: agrees with A, consistent.
            (
                item("1", Preference::A),
                chain(&[((5, 3), (4, 3)), ((4, 4), (4, 4))]),
            ),
            // Normal ties (8-8), exchanged prefers B: inconsistent.
            (
                item("2", Preference::Tie),
                chain(&[((5, 3), (3, 5)), ((3, 5), (4, 4))]),
            ),
            // B wins in both: consistent but the label is A.
            (item("3", Preference::A), chain(&[((1, 5), (2, 5))])),
            // Criteria reply with nothing in it: unscored.
            (item("4", Preference::B), {
                let mut t = Transcript::new();
                t.insert("criteria".into(), out("   "));
                t
            }),
        ];
        let r = plan.score(&runs, 0);
        assert_eq!(r.metrics[0].name, "agreement");
        assert!((r.metrics[0].interval.value - 1.0 / 3.0).abs() < 1e-12);
        assert!((r.metrics[1].interval.value - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!((r.metrics[0].n, r.metrics[0].unscored), (3, 1));
        let replies = r.tables.last().expect("reply table");
        // 3 criteria for each of items 1-3 (judgements of missing branches are not counted).
        assert_eq!(replies.rows[0], [4, 9, 10, 0, 0].map(Cell::Int));
        assert!(plan.next_steps(&runs[3].0, &runs[3].1).is_empty());
    }

    #[test]
    fn single_mode_steps_and_scoring() {
        let plan = FennecPlan {
            branches: 1,
            mode: Mode::Single,
            correction: true,
            ..FennecPlan::default()
        };
        let it = item("s", Preference::B);
        let mut done = Transcript::new();
        done.insert("criteria".into(), out(CRITERIA));
        done.insert("guideline/0".into(), out("g"));
        let s = plan.next_steps(&it, &done);
        assert_eq!(keys(&s), ["single/0/a", "single/0/b"]);
        assert_eq!(s[0].messages[0], Message::system(SINGLE_SYSTEM));
        assert!(s[1].messages[1]
            .content
            .contains("[The Start of Response]:\n8\n"));
        done.insert(
            "single/0/a".into(),
            out("Response Score: 2\nExplanation: not prime? It is."),
        );
        done.insert("single/0/b".into(), out("Response Score: 4"));
        let s = plan.next_steps(&it, &done);
        assert_eq!(keys(&s), ["correction/a"]);
        let r = plan.score(&[(it, done)], 0);
        assert_eq!(r.metrics[0].name, "accuracy");
        assert_eq!(r.metrics[0].interval.value, 1.0);
    }

    #[test]
    fn seeds_are_stable_per_step() {
        let plan = FennecPlan::default();
        let a = plan.next_steps(&item("x", Preference::A), &Transcript::new());
        let b = plan.next_steps(&item("x", Preference::A), &Transcript::new());
        let c = plan.next_steps(&item("y", Preference::A), &Transcript::new());
        assert_eq!(a[0].params.seed, b[0].params.seed);
        assert_ne!(a[0].params.seed, c[0].params.seed);
        assert_eq!(a[0].params.temperature, 0.0);
        assert_eq!(a[0].params.max_new_tokens, 1024);
    }

    #[test]
    fn limits_per_step_kind_and_correction_off_by_default() {
        let plan = FennecPlan::default();
        assert!(!plan.correction);
        let l = FennecLimits::default();
        assert_eq!(
            [
                l.of("criteria"),
                l.of("guideline/3"),
                l.of("pairwise/0/normal"),
                l.of("single/1/b"),
                l.of("correction/a")
            ],
            [1024, 1024, 1024, 1024, 2048]
        );
        assert_eq!(FennecLimits::all(7).of("correction/b"), 7);
        // Pairwise, no correction: after the judgements nothing is left.
        let it = item("x", Preference::A);
        let mut done = Transcript::new();
        done.insert("criteria".into(), out("1. Correctness: is it prime?"));
        done.insert("guideline/0".into(), out("g"));
        done.insert(
            "pairwise/0/normal".into(),
            out("Response A Score: 1\nResponse B Score: 1"),
        );
        done.insert(
            "pairwise/0/exchanged".into(),
            out("Response A Score: 1\nResponse B Score: 1"),
        );
        assert!(plan.next_steps(&it, &done).is_empty());
    }

    #[test]
    fn templates_are_the_prompts_sent() {
        // Every step's system message and user text equal its template with the
        // placeholders filled, so the manifest hashes what is sent.
        for (mode, correction) in [(Mode::Pairwise, true), (Mode::Single, false)] {
            let plan = FennecPlan {
                branches: 7,
                mode,
                correction,
                ..FennecPlan::default()
            };
            let t: std::collections::BTreeMap<_, _> = plan.templates().into_iter().collect();
            assert_eq!(t.contains_key("fennec/correction"), correction);
            let it = item("x", Preference::A);
            let fill = |s: &str| {
                s.replace("{query}", &it.query)
                    .replace("{response_a}", &it.response_a)
                    .replace("{response_b}", &it.response_b)
                    .replace("{criterion}", "C")
                    .replace("{guideline}", "G")
            };
            let sent =
                |st: &Step| format!("{}\n{}", st.messages[0].content, st.messages[1].content);
            let mut done = Transcript::new();
            let s = plan.next_steps(&it, &done);
            assert_eq!(sent(&s[0]), fill(&t["fennec/criteria"]));
            assert!(sent(&s[0]).contains("seven [Evaluation Criteria]"));
            done.insert("criteria".into(), out("1. C"));
            let s = plan.next_steps(&it, &done);
            assert_eq!(sent(&s[0]), fill(&t["fennec/guideline"]));
            assert!(sent(&s[0]).starts_with(PAIRWISE_SYSTEM));
            done.insert("guideline/0".into(), out("G"));
            let s = plan.next_steps(&it, &done);
            let name = match mode {
                Mode::Pairwise => "fennec/pairwise",
                Mode::Single => "fennec/single",
            };
            assert_eq!(sent(&s[0]), fill(&t[name]));
        }
    }
}
