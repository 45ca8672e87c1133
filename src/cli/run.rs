//! `candor run <protocol>`: run a protocol end to end with local models into a resumable run
//! directory.
//!
//! The arguments ([`RunArgs`]) become a [`RunConfig`] in one function; then one function per
//! protocol builds its items, plan, scorer and manifest entries (data files, prompt template
//! versions, settings) and hands them to [`execute`], which picks the models and calls the
//! library's runner ([`crate::store::Run`]). Adding a protocol means one [`Protocol`] variant
//! and one such function. Models named `fake:<label>` are a scripted stand-in (hash of the
//! prompt) used by tests, with the hidden `toy` protocol; real models come from the engine.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::json;

use crate::bench::plan::{Plan, Transcript};
use crate::bench::results::BenchResults;
use crate::model::llama::WeightDType;
use crate::report::BarProgress;
use crate::store::manifest::{DataFile, Environment, Manifest, ModelIdentity, RunIdentity};
use crate::store::run_dir::sha256_bytes;
use crate::store::testkit::{toy_items, toy_score, FakeModels, ToyPlan};
use crate::store::{Models, Run};

use super::models::{engine_models, engine_options, ModelInfo};
use super::protocols::{self, ProtocolArgs};

/// The protocols `candor run` knows; one snake_case name each, as everywhere in Candor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// FB-Bench: follow-up responses to user feedback, graded by a checklist judge.
    Fbbench,
    /// RefuteBench: whether models accept refuting feedback over a dialogue.
    Refutebench,
    /// ReaLMistake: the candidate models as error detectors.
    Realmistake,
    /// Fennec: pairwise and single judgements with criteria and guidelines.
    Fennec,
    /// All four in turn, each into its own subdirectory of --out (fbbench/, refutebench/,
    /// realmistake/, fennec/); each reads its own protocol options.
    All,
    /// A tiny built-in dialogue + judge protocol for tests of the runner.
    #[value(hide = true)]
    Toy,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Fbbench => "fbbench",
            Protocol::Refutebench => "refutebench",
            Protocol::Realmistake => "realmistake",
            Protocol::Fennec => "fennec",
            Protocol::All => "all",
            Protocol::Toy => "toy",
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(after_help = "\
An existing run directory with the same settings is resumed: steps already in its samples.jsonl \
are reused, the rest computed, and the final files are byte-identical to an uninterrupted run. \
A directory holding a run with other settings (models, data, seed, subset, limit) is refused.")]
pub struct RunArgs {
    /// The protocol to run.
    #[arg(value_enum)]
    pub protocol: Protocol,

    /// A model under evaluation: `default` (SmolLM2-135M-Instruct Q4_1 in models/) or a GGUF
    /// path. Repeat for several candidates (ReaLMistake's detectors, majority vote).
    #[arg(long = "model", value_name = "M", default_value = "default")]
    pub models: Vec<String>,

    /// The judge model (FB-Bench checklist, RefuteBench acceptance, Fennec), in the same forms
    /// as --model. Required by fbbench and refutebench (the papers' judges are GPT-4o and
    /// GPT-4; naming the candidate's model is allowed and recorded as self-judging); for
    /// fennec the default is the first --model.
    #[arg(long, value_name = "J")]
    pub judge: Option<String>,

    /// Run only part of the benchmark; names are per protocol (e.g. a task or setting).
    /// Repeatable. fbbench: `error_correction`, `response_maintenance`, a task type or an item
    /// id; refutebench: `qa`, `mt`, `email`, `mt_en_zh`, `single`, `multi`, `memory_nc0` …
    /// `generalization_nc3` (parts joined by `/` all match: `qa/memory_nc1`); realmistake: a
    /// task, a response model or an item id; fennec: a scenario or an item id (`auto_j/12`).
    #[arg(long = "subset", value_name = "S")]
    pub subsets: Vec<String>,

    /// Run only the first N items (after --subset): for quick runs.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,

    /// The run directory: manifest.json, samples.jsonl, results.json, report.md.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,

    /// Most requests sent to a model at once. Changes speed and memory, never results.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub batch_size: usize,

    /// CPU threads for inference (default: every core). Changes speed, never results.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Base seed: per-item seeds of sampled steps and of the bootstrap intervals derive from it.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,

    /// The authors' public data (default: $CANDOR_DATA, else ../shared/data).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,

    /// Sleep per batch of the `fake:` models, in milliseconds (tests kill runs mid-way).
    #[arg(long, hide = true, default_value_t = 0)]
    pub fake_delay_ms: u64,

    // integrate: the per-protocol options (src/cli/protocols/mod.rs).
    #[command(flatten)]
    pub options: ProtocolArgs,
}

/// A model as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// The scripted stand-in, `fake:<label>`.
    Fake(String),
    /// `default`, a GGUF path or a hub id: loaded by the engine.
    Engine(String),
}

impl ModelSpec {
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        match s.strip_prefix("fake:") {
            Some("") => bail!("`fake:` needs a label, e.g. `fake:a`"),
            Some(label) => Ok(ModelSpec::Fake(label.to_string())),
            None if s.is_empty() => bail!("an empty model name"),
            None => Ok(ModelSpec::Engine(s.to_string())),
        }
    }

    pub fn name(&self) -> String {
        match self {
            ModelSpec::Fake(l) => format!("fake:{l}"),
            ModelSpec::Engine(s) => s.clone(),
        }
    }
}

/// Resolved settings of a run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub protocol: Protocol,
    pub candidates: Vec<ModelSpec>,
    pub judge: ModelSpec,
    /// Whether `--judge` was given (fbbench and refutebench require it).
    pub judge_given: bool,
    pub subsets: Vec<String>,
    pub limit: Option<usize>,
    pub out: PathBuf,
    pub batch_size: usize,
    pub threads: usize,
    pub seed: u64,
    pub data: PathBuf,
    pub fake_delay: Duration,
    pub options: ProtocolArgs,
}

impl RunConfig {
    pub fn from_args(args: RunArgs) -> anyhow::Result<Self> {
        if args.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        if args.limit == Some(0) {
            bail!("--limit must be at least 1");
        }
        let threads = match args.threads {
            Some(0) => bail!("--threads must be at least 1"),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let candidates = args
            .models
            .iter()
            .map(|m| ModelSpec::parse(m).with_context(|| format!("--model {m:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let judge = match &args.judge {
            Some(j) => ModelSpec::parse(j).with_context(|| format!("--judge {j:?}"))?,
            None => candidates[0].clone(),
        };
        Ok(RunConfig {
            protocol: args.protocol,
            candidates,
            judge,
            judge_given: args.judge.is_some(),
            subsets: args.subsets,
            limit: args.limit,
            out: args.out,
            batch_size: args.batch_size,
            threads,
            seed: args.seed,
            data: args.data.unwrap_or_else(crate::bench::data_root),
            fake_delay: Duration::from_millis(args.fake_delay_ms),
            options: args.options,
        })
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let cfg = RunConfig::from_args(args)?;
    rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .build_global()
        .context("setting up the thread pool")?;
    match cfg.protocol {
        Protocol::Toy => toy(&cfg),
        Protocol::All => protocols::run_all(&cfg),
        // integrate: the published protocols (src/cli/protocols/).
        Protocol::Fbbench | Protocol::Refutebench | Protocol::Realmistake | Protocol::Fennec => {
            protocols::run_one(&cfg)
        }
    }
}

/// What a protocol contributes to a run besides its plan and items.
pub struct ProtocolSetup {
    /// Every data file read (hashed into the manifest).
    pub data_files: Vec<PathBuf>,
    /// Template name → version.
    pub prompt_templates: BTreeMap<String, String>,
    /// Protocol settings that change results (subset, limit, options).
    pub settings: serde_json::Value,
    /// Decoding parameters the protocol applies.
    pub decoding: serde_json::Value,
}

/// The hidden `toy` protocol: a dialogue per candidate and a judge, on built-in items.
fn toy(cfg: &RunConfig) -> anyhow::Result<()> {
    if !cfg.subsets.is_empty() {
        bail!("the toy protocol has no subsets");
    }
    let items = toy_items(cfg.limit.unwrap_or(12));
    let plan = ToyPlan {
        candidates: cfg.candidates.len(),
        seed: cfg.seed,
    };
    let setup = ProtocolSetup {
        data_files: Vec::new(),
        prompt_templates: [("toy/turn", "1"), ("toy/judge", "1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        settings: json!({ "limit": cfg.limit, "candidates": cfg.candidates.len() }),
        decoding: json!({ "temperature": 0.0, "max_new_tokens": 16 }),
    };
    let seed = cfg.seed;
    execute(cfg, setup, &plan, &items, |done| {
        toy_score(&plan, done, seed)
    })
}

/// Builds the manifest, picks the models and runs (or resumes) to the end, then prints the
/// headline metrics.
pub fn execute<P: Plan>(
    cfg: &RunConfig,
    setup: ProtocolSetup,
    plan: &P,
    items: &[P::Item],
    score: impl FnOnce(&[(&P::Item, &Transcript)]) -> BenchResults,
) -> anyhow::Result<()> {
    let data_files = setup
        .data_files
        .iter()
        .map(|p| DataFile::from_path(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut roles: Vec<(String, &ModelSpec)> = cfg
        .candidates
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("candidate/{i}"), m))
        .collect();
    roles.push(("judge".to_string(), &cfg.judge));
    // integrate: real models are resolved and hashed once per name.
    let mut infos: BTreeMap<String, ModelInfo> = BTreeMap::new();
    for (_, m) in &roles {
        if let ModelSpec::Engine(name) = m {
            if !infos.contains_key(name) {
                infos.insert(name.clone(), ModelInfo::inspect(name)?);
            }
        }
    }
    let identity = RunIdentity {
        candor_version: env!("CARGO_PKG_VERSION").to_string(),
        protocol: cfg.protocol.name().to_string(),
        settings: setup.settings,
        seed: cfg.seed,
        models: roles
            .iter()
            .map(|(role, m)| model_identity(role, m, &infos))
            .collect::<anyhow::Result<_>>()?,
        data_files,
        prompt_templates: setup.prompt_templates,
        decoding: setup.decoding,
        items: Default::default(),
    };
    let manifest = Manifest::new(identity, Environment::detect(cfg.threads, cfg.batch_size));
    let run = Run {
        dir: &cfg.out,
        manifest,
        plan,
        items,
        batch_size: cfg.batch_size,
    };
    // Every protocol reports the replies that stopped at their length limit, per step kind.
    let score = |runs: &[(&P::Item, &Transcript)]| {
        let mut r = score(runs);
        r.tables.push(crate::bench::results::length_limit_table(
            runs.iter().map(|(_, t)| *t),
        ));
        r
    };
    let fakes: Option<Vec<String>> = roles
        .iter()
        .map(|(_, m)| match m {
            ModelSpec::Fake(l) => Some(l.clone()),
            ModelSpec::Engine(_) => None,
        })
        .collect();
    match fakes {
        Some(mut labels) => {
            let judge = labels.pop().unwrap_or_default();
            let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
            let mut models = FakeModels::new(&refs, &judge);
            models.delay = cfg.fake_delay;
            finish(run, &mut models, score)
        }
        // integrate: real models, loaded by the engine one at a time.
        None => {
            let info = |m: &ModelSpec| match m {
                ModelSpec::Engine(name) => infos.get(name).cloned().context("unresolved model"),
                ModelSpec::Fake(l) => {
                    bail!("fake:{l}: fake and real models cannot be mixed in one run")
                }
            };
            let candidates = cfg
                .candidates
                .iter()
                .map(info)
                .collect::<anyhow::Result<Vec<_>>>()?;
            let judge = info(&cfg.judge)?;
            let options = engine_options(cfg.batch_size, WeightDType::default());
            let mut models = engine_models(&candidates, &judge, options);
            finish(run, &mut models, score)
        }
    }
}

fn model_identity(
    role: &str,
    m: &ModelSpec,
    infos: &BTreeMap<String, ModelInfo>,
) -> anyhow::Result<ModelIdentity> {
    match m {
        ModelSpec::Fake(label) => {
            let h = sha256_bytes(format!("fake:{label}").as_bytes());
            Ok(ModelIdentity {
                role: role.to_string(),
                name: m.name(),
                sha256: h.clone(),
                tokenizer_sha256: h.clone(),
                chat_template_sha256: h,
                options: BTreeMap::new(),
            })
        }
        ModelSpec::Engine(name) => Ok(infos
            .get(name)
            .context("unresolved model")?
            .identity(role, WeightDType::default())),
    }
}

fn finish<P: Plan, M: Models>(
    run: Run<'_, P>,
    models: &mut M,
    score: impl FnOnce(&[(&P::Item, &Transcript)]) -> BenchResults,
) -> anyhow::Result<()> {
    let dir = run.dir.to_path_buf();
    let mut progress = BarProgress::new();
    let outcome = run
        .execute(models, &mut progress, score)
        .with_context(|| format!("run in {}", dir.display()))?;
    for w in &outcome.warnings {
        eprintln!("candor: warning: {w}");
    }
    if outcome.resumed {
        eprintln!(
            "candor: resumed: {} steps from the log, {} computed",
            outcome.replayed, outcome.computed
        );
    }
    let r = &outcome.results;
    println!(
        "{}: {} items, {} completed, {} failed steps",
        r.protocol,
        r.items,
        r.completed,
        r.failed.len()
    );
    let num = |x: f64| {
        if x.is_finite() {
            format!("{x:.4}")
        } else {
            "n/a".to_string()
        }
    };
    for m in &r.results.metrics {
        println!(
            "{:<28} {:>8}  [{}, {}]  n={} unscored={}",
            m.name,
            num(m.interval.value),
            num(m.interval.low),
            num(m.interval.high),
            m.n,
            m.unscored
        );
    }
    println!("report: {}", dir.join("report.md").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> anyhow::Result<RunConfig> {
        let mut all = vec!["candor", "run"];
        all.extend_from_slice(args);
        let a = crate::cli::Args::try_parse_from(all)?;
        match a.command {
            crate::cli::Command::Run(r) => RunConfig::from_args(r),
            _ => bail!("not a run"),
        }
    }

    #[test]
    fn defaults_and_judge_fallback() {
        let c = parse(&["fbbench", "--out", "x"]).unwrap();
        assert_eq!(c.candidates, [ModelSpec::Engine("default".into())]);
        assert_eq!(c.judge, c.candidates[0]);
        assert_eq!((c.batch_size, c.seed, c.limit), (16, 0, None));
        let c = parse(&[
            "realmistake",
            "--model",
            "fake:a",
            "--model",
            "b.gguf",
            "--judge",
            "fake:j",
            "--out",
            "x",
            "--limit",
            "3",
            "--subset",
            "math",
            "--seed",
            "9",
        ])
        .unwrap();
        assert_eq!(
            c.candidates,
            [
                ModelSpec::Fake("a".into()),
                ModelSpec::Engine("b.gguf".into())
            ]
        );
        assert_eq!(c.judge, ModelSpec::Fake("j".into()));
        assert_eq!((c.limit, c.seed), (Some(3), 9));
        assert_eq!(c.subsets, ["math"]);
    }

    #[test]
    fn judged_protocols_need_an_explicit_judge() {
        use crate::cli::protocols::require_judge;
        let c = parse(&["fbbench", "--out", "x"]).unwrap();
        assert!(!c.judge_given);
        let err = require_judge(&c, "fbbench", "GPT-4o")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("fbbench needs --judge"), "{err}");
        let c = parse(&["refutebench", "--judge", "default", "--out", "x"]).unwrap();
        assert!(
            require_judge(&c, "refutebench", "GPT-4").unwrap(),
            "self-judging"
        );
        let c = parse(&["fbbench", "--judge", "j.gguf", "--out", "x"]).unwrap();
        assert!(!require_judge(&c, "fbbench", "GPT-4o").unwrap());
    }

    #[test]
    fn bad_arguments_are_clear_errors() {
        let cases: [(&[&str], &str); 5] = [
            (
                &["toy", "--out", "x", "--batch-size", "0"],
                "--batch-size must be at least 1",
            ),
            (
                &["toy", "--out", "x", "--limit", "0"],
                "--limit must be at least 1",
            ),
            (
                &["toy", "--out", "x", "--threads", "0"],
                "--threads must be at least 1",
            ),
            (&["toy", "--out", "x", "--model", "fake:"], "needs a label"),
            (&["nope", "--out", "x"], "invalid value 'nope'"),
        ];
        for (args, want) in cases {
            let err = format!("{:#}", parse(args).unwrap_err());
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }
}
