//! The four published protocols as `candor run` arms: one file each builds its items (with
//! `--subset` and `--limit`), its plan with the protocol's options, its scorer and its
//! manifest entries (data-file hashes, prompt template versions, settings), then hands them to
//! [`super::run::execute`].
//!
//! This module holds the protocol options every arm reads ([`ProtocolArgs`], shown under
//! "Protocol options" in `candor run --help`) and the small helpers they share: subset
//! selection, the item limit, template versions. What a protocol *is* (data, plans, scores)
//! lives in [`crate::bench`]; running it lives in [`crate::store`].

pub mod fbbench;
pub mod fennec;
pub mod realmistake;
pub mod refutebench;

use anyhow::{bail, Context};

use super::run::{Protocol, RunConfig};

use crate::store::run_dir::sha256_bytes;

/// Options of the individual protocols; each names the protocols it applies to.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Protocol options")]
pub struct ProtocolArgs {
    /// fbbench: the dataset version, `v3` (default, 591 items) or `v1` (the paper's, 734
    /// items; its judge prompt shows the reference answer). fennec: the evaluation set,
    /// `auto-j` (default, 1392 pairwise items) or `pandalm` (999 items; see `--label`).
    #[arg(long, value_name = "NAME")]
    pub dataset: Option<String>,

    /// fbbench: how checklist verdicts become item scores: `published` (the authors' code,
    /// default) or `paper` (Response Maintenance needs every criterion).
    #[arg(long, value_name = "RULE", default_value = "published")]
    pub rule: String,

    /// refutebench: recall earlier instructions before each benchmark query (the paper's
    /// section 6.3, without the repeat request).
    #[arg(long, conflicts_with = "recall_repeat")]
    pub recall: bool,

    /// refutebench: recall earlier instructions before each benchmark query and ask the model
    /// to repeat them first (the paper's recall-and-repeat).
    #[arg(long)]
    pub recall_repeat: bool,

    /// refutebench: how a conversation longer than the context is shortened, `authors`
    /// (default: oldest messages first, system prompt included, budget the model's maximum
    /// length − 261, that length 2,048 for LLaMA-2-class models) or `candor` (chit-chat, then
    /// queries, then feedback; the system prompt kept).
    #[arg(long, value_name = "POLICY")]
    pub truncation: Option<String>,

    /// realmistake: a detection prompt, `1-A`, `1-B`, `2-A`, `2-B` or `steps` (1-A with the
    /// authors' evaluation steps, `cot_instruction_prompt`; the paper's advanced prompt)
    /// (repeatable; default the four simple ones).
    #[arg(long = "prompt", value_name = "P")]
    pub prompts: Vec<String>,

    /// realmistake: samples per prompt; k > 1 is self-consistency (temperature 0.5, seeded,
    /// majority of the k verdicts).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub samples: usize,

    /// fennec: evaluation criteria (branches) kept per item.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub branches: usize,

    /// fennec: `pairwise` (both orders; Agreement and Consistency, default) or `single` (one
    /// score per response; Accuracy).
    #[arg(long, value_name = "MODE", default_value = "pairwise")]
    pub mode: String,

    /// fennec: skip the correction of low-scored responses (single mode; pairwise runs skip
    /// it unless `--correction`).
    #[arg(long)]
    pub no_correction: bool,

    /// fennec: correct low-scored responses in pairwise runs too (the authors' pairwise
    /// evaluation does not; no metric reads the corrections).
    #[arg(long)]
    pub correction: bool,

    /// fennec with `--dataset pandalm`: the gold label, `annotator1` (default, what Fennec's
    /// code reads) or `majority` (of the three annotators).
    #[arg(long, value_name = "L")]
    pub label: Option<String>,

    /// All protocols: the new-token limit of every generation, replacing each protocol's own
    /// (the papers': FB-Bench 4096, RefuteBench 256 and 16 for the judge, ReaLMistake 4096,
    /// Fennec 1024 per step and 2048 for corrections), higher or lower. Recorded in the
    /// manifest; replies that stopped at the limit are marked `max_tokens` in the samples and
    /// counted per step kind in the results.
    #[arg(long, value_name = "N")]
    pub max_new_tokens: Option<usize>,

    /// Set by `candor run all`: each protocol reads its own options and ignores the others'.
    #[arg(skip)]
    pub all: bool,
}

impl Default for ProtocolArgs {
    /// The command line's defaults.
    fn default() -> Self {
        ProtocolArgs {
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
            all: false,
        }
    }
}

impl ProtocolArgs {
    /// The new-token limit of a step whose protocol default is `limit`: `--max-new-tokens`
    /// when given (higher or lower), else `limit`.
    pub fn cap(&self, limit: usize) -> usize {
        self.max_new_tokens.unwrap_or(limit)
    }

    /// Fails when an option that only `protocol` does not read was changed from its default.
    pub fn check_unused(&self, protocol: &str, used: &[&str]) -> anyhow::Result<()> {
        if self.all {
            return Ok(());
        }
        let given: [(&str, bool); 11] = [
            ("--dataset", self.dataset.is_some()),
            ("--rule", self.rule != "published"),
            ("--recall", self.recall),
            ("--recall-repeat", self.recall_repeat),
            ("--truncation", self.truncation.is_some()),
            ("--prompt", !self.prompts.is_empty()),
            ("--samples", self.samples != 1),
            ("--branches", self.branches != 5),
            ("--mode", self.mode != "pairwise" || self.no_correction),
            ("--correction", self.correction),
            ("--label", self.label.is_some()),
        ];
        for (flag, set) in given {
            if set && !used.contains(&flag) {
                bail!("{flag} does not apply to {protocol}");
            }
        }
        Ok(())
    }
}

/// Runs one published protocol (`cfg.protocol`) with `cfg.options`.
pub fn run_one(cfg: &RunConfig) -> anyhow::Result<()> {
    let p = cfg.protocol;
    let data = cfg.data.join(p.name());
    if !data.is_dir() {
        bail!(
            "{}: the {} data folder was not found (set --data or ${})",
            data.display(),
            p.name(),
            crate::bench::DATA_ENV
        );
    }
    let opts = &cfg.options;
    match p {
        Protocol::Fbbench => fbbench::run(cfg, opts),
        Protocol::Refutebench => refutebench::run(cfg, opts),
        Protocol::Realmistake => realmistake::run(cfg, opts),
        Protocol::Fennec => fennec::run(cfg, opts),
        Protocol::All | Protocol::Toy => bail!("{} is not a published protocol", p.name()),
    }
}

/// `candor run all`: the four protocols in turn, each into `<out>/<protocol>/`. Each reads
/// its own protocol options and ignores the others'; `--limit` and `--max-new-tokens` apply
/// to each. Subsets and data sets are named per protocol, so `--subset` and `--dataset` are
/// refused.
pub fn run_all(cfg: &RunConfig) -> anyhow::Result<()> {
    if !cfg.subsets.is_empty() {
        bail!("--subset names differ per protocol; run the protocols one by one to use it");
    }
    if cfg.options.dataset.is_some() {
        bail!("--dataset names differ per protocol; run the protocols one by one to use it");
    }
    for p in [
        Protocol::Fbbench,
        Protocol::Refutebench,
        Protocol::Realmistake,
        Protocol::Fennec,
    ] {
        let mut one = RunConfig {
            protocol: p,
            out: cfg.out.join(p.name()),
            ..cfg.clone()
        };
        one.options.all = true;
        println!("== {}", p.name());
        run_one(&one).with_context(|| format!("candor run all: {}", p.name()))?;
    }
    Ok(())
}

/// The judge of a protocol whose paper used a strong remote judge (`paper_judge`): refuses a
/// run without an explicit `--judge`, and says whether the judge is also the candidate
/// (self-judging), which the results and the report record.
pub fn require_judge(cfg: &RunConfig, protocol: &str, paper_judge: &str) -> anyhow::Result<bool> {
    if !cfg.judge_given {
        bail!(
            "{protocol} needs --judge (the paper's judge is {paper_judge}; name a local judge \
             model, or the candidate's own model to let it judge itself, recorded as \
             self-judging)"
        );
    }
    Ok(cfg.candidates.contains(&cfg.judge))
}

/// The report's notes on what a run is comparable with and who judged: a table of
/// (note, value) rows appended to the protocol's results.
pub fn notes_table(rows: &[(&str, String)]) -> crate::bench::results::Table {
    crate::bench::results::Table {
        title: "Run notes".to_string(),
        columns: vec!["note".to_string(), "value".to_string()],
        rows: rows
            .iter()
            .map(|(k, v)| vec![k.to_string(), v.clone()])
            .collect(),
    }
}

/// The `judge` note: the judge's name, and whether it judges its own replies.
pub fn judge_note(cfg: &RunConfig, self_judging: bool) -> (&'static str, String) {
    let name = cfg.judge.name();
    let v = if self_judging {
        format!("{name} (self-judging: the judge is also the candidate)")
    } else {
        name
    };
    ("judge", v)
}

/// The version recorded for a prompt template: the first 16 hex digits of its text's sha256.
pub fn template_version(text: &str) -> String {
    let h = sha256_bytes(text.as_bytes());
    format!("sha256:{}", &h[..16])
}

/// Keeps the items that match any of `subsets` (all items when none is given); each subset
/// must match at least one item. `labels` gives the names an item answers to.
pub fn select<T>(
    items: Vec<T>,
    subsets: &[String],
    labels: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<Vec<T>> {
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
        bail!(
            "--subset {:?} matches no item; known names: {}",
            subsets[i],
            known.join(", ")
        );
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
        crate::model::source::DEFAULT_MODEL_FILE
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
        let err = err.to_string();
        assert!(err.contains("\"nope\" matches no item"), "{err}");
        assert!(err.contains("en-zh, memory_nc0, mt, multi, qa"), "{err}");
        assert_eq!(take(items.clone(), Some(2)).len(), 2);
        assert_eq!(take(items, None).len(), 3);
    }

    #[test]
    fn caps_and_labels() {
        let mut a = ProtocolArgs::default();
        assert_eq!(a.cap(256), 256);
        a.max_new_tokens = Some(32);
        // Either direction: the option replaces the protocol's limit.
        assert_eq!((a.cap(256), a.cap(16)), (32, 32));
        assert_eq!(file_label("default"), "SmolLM2-135M-Instruct.Q4_1");
        assert_eq!(file_label("models/x y.gguf"), "x_y");
        assert_eq!(file_label("fake:a"), "fake_a");
        assert!(template_version("x").starts_with("sha256:2d711642b726b044"));
    }

    #[test]
    fn options_of_other_protocols_are_refused() {
        let a = ProtocolArgs::default();
        assert!(a.check_unused("fbbench", &[]).is_ok());
        let b = ProtocolArgs {
            samples: 3,
            ..a.clone()
        };
        let err = b.check_unused("fbbench", &["--rule"]).unwrap_err();
        assert_eq!(err.to_string(), "--samples does not apply to fbbench");
        assert!(b.check_unused("realmistake", &["--samples"]).is_ok());
    }
}
