//! One interface for the published protocols: [`Protocol`].
//!
//! A protocol turns the authors' data and its options ([`ProtocolOptions`]) into items and a
//! [`Plan`] ([`Protocol::prepare`], with `--subset` and `--limit` applied and everything the
//! manifest records: data files, prompt-template versions, settings, decoding), and finished
//! transcripts into metrics plus any extra files in the authors' formats
//! ([`Protocol::score`], e.g. FB-Bench's `judgments/<model>.jsonl`). It knows no models, no
//! run directory and no command line: the runner ([`crate::store`]) drives the plan, and the
//! command line only parses options into a [`ProtocolOptions`] and a [`RunContext`].
//!
//! Shared here: the options, the errors of option handling, subset selection ([`select`]),
//! the item limit ([`take`]), template versions and file-name labels.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::plan::{Plan, Transcript};
use super::DataError;
use crate::bench::table::{Cell, Table};
use crate::bench::BenchResults;
use crate::text::message::Message;

/// Counts a conversation's prompt tokens as the engine will (template, then tokenizer).
pub type TokenCounter = std::sync::Arc<dyn Fn(&[Message]) -> usize + Send + Sync>;

/// Counts the tokens of a text alone (no template), as the authors' truncation does.
pub type TextCounter = std::sync::Arc<dyn Fn(&str) -> usize + Send + Sync>;

/// Options of the individual protocols; each protocol reads the ones it names in
/// [`Protocol::options`] and refuses the others (see [`ProtocolOptions::check_unused`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ProtocolOptions {
    /// fbbench: `v3` / `v1`; fennec: `auto-j` / `pandalm`.
    pub dataset: Option<String>,
    /// fbbench: `published` / `paper`.
    pub rule: String,
    /// refutebench: recall earlier instructions.
    pub recall: bool,
    /// refutebench: recall and repeat.
    pub recall_repeat: bool,
    /// refutebench: `authors` (default) / `candor` history truncation.
    pub truncation: Option<String>,
    /// realmistake: detection prompts by paper name.
    pub prompts: Vec<String>,
    /// realmistake: samples per prompt.
    pub samples: usize,
    /// fennec: criteria kept per item.
    pub branches: usize,
    /// fennec: `pairwise` / `single`.
    pub mode: String,
    /// fennec: skip the correction step (single mode).
    pub no_correction: bool,
    /// fennec: run the correction step in pairwise runs too.
    pub correction: bool,
    /// fennec with pandalm: `annotator1` (default) / `majority` gold labels.
    pub label: Option<String>,
    /// All protocols: the new-token limit of every generation, replacing each protocol's own.
    pub max_new_tokens: Option<usize>,
    /// All protocols: the new-token limit of the steps whose replies are read as verdicts
    /// (FB-Bench's judge, RefuteBench's FA judge, Fennec's judgements, ReaLMistake's
    /// detections), replacing `max_new_tokens` and the protocol's own there.
    pub judge_max_new_tokens: Option<usize>,
    /// fbbench, fennec, refutebench: `on` / `off` constrained judge output (each protocol
    /// has its own default).
    pub constrain: Option<String>,
    /// fennec: a user's pairs file (`--pairs`) instead of the published set.
    pub pairs: Option<PathBuf>,
    /// fbbench, realmistake: a user's items file (`--items`) instead of the published set.
    pub items: Option<PathBuf>,
    /// fbbench, refutebench: `majority` / `mean`, how a panel of judges decides
    /// ([`crate::bench::panel::PanelRule`]).
    pub panel: Option<String>,
    /// Set by `candor run all`: each protocol reads its own options and ignores the others'.
    pub all: bool,
}

impl Default for ProtocolOptions {
    /// The command line's defaults.
    fn default() -> Self {
        ProtocolOptions {
            dataset: None,
            rule: "published".to_string(),
            recall: false,
            recall_repeat: false,
            truncation: None,
            prompts: Vec::new(),
            samples: 1,
            branches: 5,
            mode: "pairwise".to_string(),
            no_correction: false,
            correction: false,
            label: None,
            max_new_tokens: None,
            judge_max_new_tokens: None,
            constrain: None,
            pairs: None,
            items: None,
            panel: None,
            all: false,
        }
    }
}

impl ProtocolOptions {
    /// The new-token limit of a step whose protocol default is `limit`: `--max-new-tokens`
    /// when given (higher or lower), else `limit`.
    pub fn cap(&self, limit: usize) -> usize {
        self.max_new_tokens.unwrap_or(limit)
    }

    /// The new-token limit of a verdict step whose protocol default is `limit`:
    /// `--judge-max-new-tokens`, else `--max-new-tokens`, else `limit`.
    pub fn judge_cap(&self, limit: usize) -> usize {
        self.judge_max_new_tokens.unwrap_or(self.cap(limit))
    }

    /// Whether the judge's output is constrained (`--constrain on|off`), else `default`.
    pub fn constrain(&self, default: bool) -> Result<bool, ProtocolError> {
        match self.constrain.as_deref() {
            None => Ok(default),
            Some("on") => Ok(true),
            Some("off") => Ok(false),
            Some(other) => Err(ProtocolError::bad_value(
                "--constrain",
                other,
                "the values are `on` and `off`",
            )),
        }
    }

    /// Fails when an option that `protocol` does not read (not in `used`) was changed from
    /// its default.
    pub fn check_unused(&self, protocol: &'static str, used: &[&str]) -> Result<(), ProtocolError> {
        if self.all {
            return Ok(());
        }
        let d = ProtocolOptions::default();
        let given: [(&'static str, bool); 16] = [
            ("--dataset", self.dataset.is_some()),
            ("--rule", self.rule != d.rule),
            ("--recall", self.recall),
            ("--recall-repeat", self.recall_repeat),
            ("--truncation", self.truncation.is_some()),
            ("--prompt", !self.prompts.is_empty()),
            ("--samples", self.samples != d.samples),
            ("--branches", self.branches != d.branches),
            ("--mode", self.mode != d.mode),
            ("--no-correction", self.no_correction),
            ("--correction", self.correction),
            ("--label", self.label.is_some()),
            ("--constrain", self.constrain.is_some()),
            ("--pairs", self.pairs.is_some()),
            ("--items", self.items.is_some()),
            ("--panel", self.panel.is_some()),
        ];
        for (option, set) in given {
            if set && !used.contains(&option) {
                return Err(ProtocolError::Unused { option, protocol });
            }
        }
        Ok(())
    }
}

/// Errors of preparing a protocol: its options, its subsets and its data.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("{option} does not apply to {protocol}")]
    Unused {
        option: &'static str,
        protocol: &'static str,
    },
    #[error(
        "{protocol} needs --judge (the paper's judge is {paper_judge}; name a local judge model, \
         or the candidate's own model to let it judge itself, recorded as self-judging)"
    )]
    NeedsJudge {
        protocol: &'static str,
        paper_judge: &'static str,
    },
    #[error("{option} {value:?}: {message}")]
    BadValue {
        option: &'static str,
        value: String,
        message: String,
    },
    #[error("--subset {subset:?} matches no item; known names: {known}")]
    Subset { subset: String, known: String },
    #[error("{}: the {what} was not found (set --data or ${})", path.display(), super::DATA_ENV)]
    MissingData { path: PathBuf, what: &'static str },
    #[error(transparent)]
    Data(#[from] DataError),
}

impl ProtocolError {
    /// An option given a value the protocol does not know.
    pub fn bad_value(
        option: &'static str,
        value: impl ToString,
        message: impl Into<String>,
    ) -> Self {
        ProtocolError::BadValue {
            option,
            value: value.to_string(),
            message: message.into(),
        }
    }
}

/// How many `--model`s a protocol evaluates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidates {
    /// Exactly one (FB-Bench, RefuteBench).
    One,
    /// Any number (ReaLMistake's detectors, majority vote).
    Many,
    /// None: only the judge works (Fennec; its judge defaults to the first `--model`).
    JudgeOnly,
}

/// The first candidate's context, when it is a real model: protocols that keep
/// conversations within the context (RefuteBench) need it at planning time.
#[derive(Clone)]
pub struct CandidateContext {
    /// Positions the model attends over.
    pub context_len: usize,
    pub count: TokenCounter,
    /// Tokens of a bare text.
    pub count_text: TextCounter,
    /// Whether the model's chat template accepts a system message (Mistral-style templates
    /// reject it; RefuteBench then runs without its system prompt, as the authors did).
    pub accepts_system: bool,
}

/// What a protocol is prepared against: where the data is, what to select, and who plays.
#[derive(Clone)]
pub struct RunContext {
    /// The data root (a folder per protocol below it).
    pub data: PathBuf,
    pub subsets: Vec<String>,
    pub limit: Option<usize>,
    pub seed: u64,
    /// The candidates' names, as given.
    pub candidates: Vec<String>,
    /// The judge's name (judge 0 of a panel).
    pub judge: String,
    /// The other judges of a panel (`--judge` given several times), judges 1.. in order.
    pub panel: Vec<String>,
    /// Whether the judge was named explicitly (`--judge`); FB-Bench and RefuteBench require it.
    pub judge_given: bool,
    pub candidate_context: Option<CandidateContext>,
    /// Parameter counts of the models that are known, by name as given.
    pub parameters: BTreeMap<String, u64>,
}

impl RunContext {
    /// Every judge's name: judge 0, then the panel's others.
    pub fn judges(&self) -> Vec<&str> {
        std::iter::once(self.judge.as_str())
            .chain(self.panel.iter().map(String::as_str))
            .collect()
    }
}

/// A prepared protocol: its plan and items, and what the manifest records about them.
pub struct Prepared<P: Plan> {
    pub plan: P,
    pub items: Vec<P::Item>,
    /// Every data file read (hashed into the manifest).
    pub data_files: Vec<PathBuf>,
    /// Template name → version.
    pub prompt_templates: BTreeMap<String, String>,
    /// Protocol settings that change results (subset, limit, options).
    pub settings: serde_json::Value,
    /// Decoding parameters the protocol applies.
    pub decoding: serde_json::Value,
}

/// A file written beside the results, in a format of the authors'.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputFile {
    /// Relative to the run directory.
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    /// One line for the user (what the file is).
    pub note: String,
}

/// What scoring produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scored {
    pub results: BenchResults,
    pub outputs: Vec<OutputFile>,
}

impl From<BenchResults> for Scored {
    fn from(results: BenchResults) -> Self {
        Scored {
            results,
            outputs: Vec::new(),
        }
    }
}

/// One published protocol.
pub trait Protocol {
    type Plan: Plan;

    /// snake_case name, as on the command line and in manifests.
    fn name(&self) -> &'static str;

    /// The user's own data file the options name (`--pairs`, `--items`), when the protocol
    /// reads one instead of the published set: the published data is then neither needed
    /// nor fetched.
    fn own_data<'a>(&self, _opts: &'a ProtocolOptions) -> Option<&'a Path> {
        None
    }

    /// The protocol options it reads (`--dataset`, …); any other one given is refused.
    fn options(&self) -> &'static [&'static str];

    /// How many `--model`s it evaluates.
    fn candidates(&self) -> Candidates {
        Candidates::One
    }

    /// Whether a judge model takes part.
    fn uses_judge(&self) -> bool {
        true
    }

    /// Whether several judges can grade as a panel (`--judge` given more than once; see
    /// [`crate::bench::panel`]).
    fn panels(&self) -> bool {
        false
    }

    /// Loads the selected items and builds the plan.
    fn prepare(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
    ) -> Result<Prepared<Self::Plan>, ProtocolError>;

    /// How many steps `item` is expected to take, for the progress display's total: exact
    /// where the plan is fixed, an upper estimate where it depends on replies (the runner
    /// corrects the total as items finish). `None` when unknown.
    fn planned_steps(
        &self,
        _prepared: &Prepared<Self::Plan>,
        _item: &<Self::Plan as Plan>::Item,
    ) -> Option<usize> {
        None
    }

    /// Scores the completed items (`runs`) and renders any extra files.
    fn score(
        &self,
        ctx: &RunContext,
        opts: &ProtocolOptions,
        prepared: &Prepared<Self::Plan>,
        runs: &[(&<Self::Plan as Plan>::Item, &Transcript)],
    ) -> Scored;
}

/// The judge of a protocol whose paper used a strong remote judge (`paper_judge`): refuses a
/// run without an explicit `--judge`, and says whether a judge (any of a panel's) is also a
/// candidate (self-judging), which the results and the report record.
pub fn require_judge(
    ctx: &RunContext,
    protocol: &'static str,
    paper_judge: &'static str,
) -> Result<bool, ProtocolError> {
    if !ctx.judge_given {
        return Err(ProtocolError::NeedsJudge {
            protocol,
            paper_judge,
        });
    }
    Ok(ctx
        .judges()
        .iter()
        .any(|j| ctx.candidates.iter().any(|c| c == j)))
}

/// The report's notes on what a run is comparable with and who judged: a table of
/// (note, value) rows appended to the protocol's results.
pub fn notes_table(rows: &[(&str, String)]) -> Table {
    Table {
        id: crate::bench::table::table_id::RUN_NOTES.to_string(),
        title: "Run notes".to_string(),
        columns: vec!["note".to_string(), "value".to_string()],
        rows: rows
            .iter()
            .map(|(k, v)| vec![Cell::from(*k), Cell::from(v.as_str())])
            .collect(),
    }
}

/// The name of judge `j` in tables: `judge <j> (<model>)`, with `self-judging` when the
/// model is also a candidate.
pub fn judge_label(j: usize, model: &str, candidates: &[String]) -> String {
    if candidates.iter().any(|c| c == model) {
        format!("judge {j} ({model}; self-judging: also the candidate)")
    } else {
        format!("judge {j} ({model})")
    }
}

/// The `judge` note: the judge's name, and whether it judges its own replies; with a panel
/// (`judges`), every judge's name, the self-judging ones marked (self-preference: their
/// metrics beside the others' show it).
pub fn judge_note(ctx: &RunContext, self_judging: bool) -> (&'static str, String) {
    if !ctx.panel.is_empty() {
        let names: Vec<String> = ctx
            .judges()
            .iter()
            .enumerate()
            .map(|(j, name)| judge_label(j, name, &ctx.candidates))
            .collect();
        return ("judges (panel)", names.join("; "));
    }
    let v = if self_judging {
        format!(
            "{} (self-judging: the judge is also the candidate)",
            ctx.judge
        )
    } else {
        ctx.judge.clone()
    };
    ("judge", v)
}

/// Below this many parameters a model's verdicts are a smoke test of the pipeline, not a
/// measurement (the papers' judges are GPT-4-class; the smallest judge the README names is a
/// 7B instruct model).
pub const SMOKE_TEST_PARAMETERS: u64 = 1_000_000_000;

/// The `smoke test` note, when a model whose replies are read as verdicts (`verdict_models`:
/// the judge, or Fennec's judge and ReaLMistake's detectors, which are the models evaluated)
/// has fewer than [`SMOKE_TEST_PARAMETERS`] parameters: the run then checks that the pipeline
/// works end to end, and its numbers measure nothing.
pub fn smoke_test_note(
    ctx: &RunContext,
    verdict_models: &[&str],
) -> Option<(&'static str, String)> {
    let small: Vec<String> = verdict_models
        .iter()
        .filter_map(|m| {
            let n = *ctx.parameters.get(*m)?;
            (n < SMOKE_TEST_PARAMETERS)
                .then(|| format!("{m} ({}M parameters)", (n + 500_000) / 1_000_000))
        })
        .collect();
    (!small.is_empty()).then(|| {
        (
            "smoke test",
            format!(
                "verdicts by {}: a smoke test that the protocol runs end to end, not a \
                 measurement; name a real judge with --judge (e.g. a 7B instruct GGUF by Hub id)",
                small.join(", ")
            ),
        )
    })
}

/// The version recorded for a prompt template: the first 16 hex digits of its text's sha256.
pub fn template_version(text: &str) -> String {
    use sha2::{Digest, Sha256};
    let h = hex::encode(Sha256::digest(text.as_bytes()));
    format!("sha256:{}", &h[..16])
}

/// Keeps the items that match any of `subsets` (all items when none is given); each subset
/// must match at least one item. `labels` gives the names an item answers to.
pub fn select<T>(
    items: Vec<T>,
    subsets: &[String],
    labels: impl Fn(&T) -> Vec<String>,
) -> Result<Vec<T>, ProtocolError> {
    if subsets.is_empty() {
        return Ok(items);
    }
    let mut known: Vec<String> = Vec::new();
    let mut hits = vec![0usize; subsets.len()];
    let mut kept = Vec::new();
    for item in items {
        let names = labels(&item);
        let mut keep = false;
        for (i, s) in subsets.iter().enumerate() {
            if subset_matches(s, &names) {
                hits[i] += 1;
                keep = true;
            }
        }
        for n in names {
            if !known.contains(&n) {
                known.push(n);
            }
        }
        if keep {
            kept.push(item);
        }
    }
    if let Some(i) = hits.iter().position(|&h| h == 0) {
        known.sort();
        return Err(ProtocolError::Subset {
            subset: subsets[i].clone(),
            known: known.join(", "),
        });
    }
    Ok(kept)
}

/// A subset matches when it is one of the item's names, or when every `/`-separated part of it
/// is (`qa/multi`).
fn subset_matches(subset: &str, names: &[String]) -> bool {
    let is_name = |part: &str| names.iter().any(|n| n.eq_ignore_ascii_case(part));
    is_name(subset) || subset.split('/').all(is_name)
}

/// The first `limit` items (all when `None`).
pub fn take<T>(mut items: Vec<T>, limit: Option<usize>) -> Vec<T> {
    if let Some(n) = limit {
        items.truncate(n);
    }
    items
}

/// A file-name-safe form of a model name (`default`, a path or a hub id).
pub fn file_label(name: &str) -> String {
    let base = if name == "default" {
        crate::weights::source::DEFAULT_MODEL_FILE
    } else {
        name.rsplit('/').next().unwrap_or(name)
    };
    let base = base.strip_suffix(".gguf").unwrap_or(base);
    base.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Fails with [`ProtocolError::MissingData`] when `path` is not a folder.
pub fn require_dir(path: &Path, what: &'static str) -> Result<(), ProtocolError> {
    if path.is_dir() {
        Ok(())
    } else {
        Err(ProtocolError::MissingData {
            path: path.to_path_buf(),
            what,
        })
    }
}

/// Fails with [`ProtocolError::MissingData`] when `path` is not a file.
pub fn require_file(path: &Path, what: &'static str) -> Result<(), ProtocolError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(ProtocolError::MissingData {
            path: path.to_path_buf(),
            what,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &str) -> Vec<String> {
        s.split(',').map(String::from).collect()
    }

    #[test]
    fn subsets_select_by_every_part_and_unknown_ones_fail() {
        let items = vec!["qa,memory_nc0", "qa,multi", "mt,en-zh,multi"];
        let got = select(items.clone(), &["qa/multi".into()], |s| names(s)).unwrap();
        assert_eq!(got, ["qa,multi"]);
        let ids = vec!["auto_j/1,x", "auto_j/2,x"];
        let got = select(ids, &["auto_j/2".into()], |s| names(s)).unwrap();
        assert_eq!(got, ["auto_j/2,x"]);
        let got = select(items.clone(), &["multi".into(), "QA".into()], |s| names(s)).unwrap();
        assert_eq!(got, items);
        let err = select(items.clone(), &["nope".into()], |s| names(s)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--subset \"nope\" matches no item; known names: en-zh, memory_nc0, mt, multi, qa"
        );
        assert_eq!(take(items.clone(), Some(2)).len(), 2);
        assert_eq!(take(items, None).len(), 3);
    }

    #[test]
    fn caps_and_labels() {
        let mut a = ProtocolOptions::default();
        assert_eq!(a.cap(256), 256);
        a.max_new_tokens = Some(32);
        // Either direction: the option replaces the protocol's limit.
        assert_eq!((a.cap(256), a.cap(16)), (32, 32));
        // A verdict step's limit: the judge's option, else the general one.
        assert_eq!(a.judge_cap(16), 32);
        a.judge_max_new_tokens = Some(512);
        assert_eq!((a.judge_cap(16), a.cap(16)), (512, 32));
        assert_eq!(file_label("default"), "SmolLM2-135M-Instruct.Q4_1");
        assert_eq!(file_label("models/x y.gguf"), "x_y");
        assert_eq!(file_label("fake:a"), "fake_a");
        assert_eq!(template_version("x"), "sha256:2d711642b726b044");
    }

    #[test]
    fn constrain_switch() {
        let mut a = ProtocolOptions::default();
        assert!(a.constrain(true).unwrap());
        assert!(!a.constrain(false).unwrap());
        a.constrain = Some("off".into());
        assert!(!a.constrain(true).unwrap());
        a.constrain = Some("on".into());
        assert!(a.constrain(false).unwrap());
        assert!(a.check_unused("realmistake", &[]).is_err());
        assert!(a.check_unused("fbbench", &["--constrain"]).is_ok());
        a.constrain = Some("yes".into());
        let err = a.constrain(true).unwrap_err().to_string();
        assert!(err.contains("--constrain") && err.contains("yes"), "{err}");
    }

    #[test]
    fn options_of_other_protocols_are_refused() {
        let a = ProtocolOptions::default();
        assert!(a.check_unused("fbbench", &[]).is_ok());
        let b = ProtocolOptions {
            samples: 3,
            ..a.clone()
        };
        let err = b.check_unused("fbbench", &["--rule"]).unwrap_err();
        assert_eq!(err.to_string(), "--samples does not apply to fbbench");
        assert!(b.check_unused("realmistake", &["--samples"]).is_ok());
        let c = ProtocolOptions {
            no_correction: true,
            ..a.clone()
        };
        let err = c.check_unused("fbbench", &["--rule"]).unwrap_err();
        assert_eq!(err.to_string(), "--no-correction does not apply to fbbench");
        let all = ProtocolOptions { all: true, ..c };
        assert!(all.check_unused("fbbench", &[]).is_ok());
        for (o, flag) in [
            (
                ProtocolOptions {
                    truncation: Some("candor".into()),
                    ..a.clone()
                },
                "--truncation",
            ),
            (
                ProtocolOptions {
                    correction: true,
                    ..a.clone()
                },
                "--correction",
            ),
            (
                ProtocolOptions {
                    label: Some("majority".into()),
                    ..a.clone()
                },
                "--label",
            ),
        ] {
            let err = o.check_unused("realmistake", &["--prompt"]).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("{flag} does not apply to realmistake")
            );
            assert!(o.check_unused("x", &[flag]).is_ok());
        }
    }

    fn ctx(candidates: &[&str], judge: &str, judge_given: bool) -> RunContext {
        RunContext {
            data: PathBuf::new(),
            subsets: Vec::new(),
            limit: None,
            seed: 0,
            candidates: candidates.iter().map(|c| c.to_string()).collect(),
            judge: judge.to_string(),
            panel: Vec::new(),
            judge_given,
            candidate_context: None,
            parameters: BTreeMap::new(),
        }
    }

    #[test]
    fn small_verdict_models_make_a_smoke_test() {
        let mut c = ctx(&["default"], "big", true);
        assert_eq!(smoke_test_note(&c, &["big"]), None);
        c.parameters.insert("default".into(), 134_515_008);
        c.parameters.insert("big".into(), 8_030_261_248);
        assert_eq!(smoke_test_note(&c, &["big"]), None);
        let (k, v) = smoke_test_note(&c, &["default", "big"]).unwrap();
        assert_eq!(k, "smoke test");
        assert!(
            v.starts_with("verdicts by default (135M parameters): a smoke test"),
            "{v}"
        );
    }

    #[test]
    fn judged_protocols_need_an_explicit_judge() {
        let err = require_judge(&ctx(&["default"], "default", false), "fbbench", "GPT-4o")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("fbbench needs --judge (the paper's judge is GPT-4o"),
            "{err}"
        );
        let c = ctx(&["default"], "default", true);
        assert!(
            require_judge(&c, "refutebench", "GPT-4").unwrap(),
            "self-judging"
        );
        assert!(judge_note(&c, true).1.contains("self-judging"));
        let c = ctx(&["default"], "j.gguf", true);
        assert!(!require_judge(&c, "fbbench", "GPT-4o").unwrap());
        assert_eq!(judge_note(&c, false).1, "j.gguf");
        let cands = ["m".to_string()];
        assert_eq!(judge_label(1, "j", &cands), "judge 1 (j)");
        assert!(judge_label(0, "m", &cands).contains("self-judging"));
        let t = notes_table(&[("comparable with", "x".into())]);
        assert_eq!(t.rows, [[Cell::from("comparable with"), Cell::from("x")]]);
    }
}
