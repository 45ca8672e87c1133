//! `candor run <protocol>`: parse the arguments into a [`RunConfig`], check them against the
//! protocol, resolve the models, and hand the protocol ([`crate::bench::Protocol`]) to the
//! library's runner ([`crate::store::ProtocolRun`]). What a protocol is (its items, plan,
//! scoring, manifest entries, extra files) lives in `crate::bench::<name>`; running it in
//! `crate::store`. Under the `testkit` feature (tests only), models named `fake:<label>` are a
//! scripted stand-in (hash of the prompt), with the hidden `toy` protocol.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::bench::fbbench::FbBench;
use crate::bench::fennec::Fennec;
use crate::bench::protocol::{CandidateContext, Candidates, Protocol as BenchProtocol, RunContext};
use crate::bench::realmistake::ReaLMistake;
use crate::bench::refutebench::RefuteBench;
use crate::bench::table::{table_id, Cell};
use crate::bench::ProtocolOptions;
use crate::model::device::DeviceSpec;
use crate::model::transformer::WeightDType;
use crate::report::{BarProgress, Progress};
use crate::store::chat_settings::ChatSettings;
use crate::store::gen_cache::{CachedModels, GenCache, Keyer};
use crate::store::manifest::{Environment, Manifest, ModelIdentity};
use crate::store::protocol_run::{ProtocolOutcome, ProtocolRun};
use crate::store::shard::{strip_run_args, ReplayModels, ReplayPool};
use crate::store::shard_spec::Shard;
use crate::store::Models;
use crate::text::message::Message;
use crate::text::reasoning::Thinking;
use crate::text::template_date::TemplateDate;

use super::cache::{self, CacheArgs};
use super::models::{dtype_name, engine_models, engine_options, ModelInfo};
use super::options::ProtocolArgs;

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

    /// A model under evaluation: `default` (SmolLM2-135M-Instruct Q4_1 in models/), a GGUF
    /// path (a split model by its first file) or folder, or a Hugging Face Hub id
    /// (`org/repo[:file.gguf]`, `org/repo:Q4_K_M`). Repeat for several candidates
    /// (ReaLMistake's detectors, majority vote).
    #[arg(long = "model", value_name = "M", default_value = "default")]
    pub models: Vec<String>,

    /// A Jinja chat template file for the --model candidates: replaces their own, or gives one
    /// to a base model that has none (every protocol sends chat conversations). Its sha256 is
    /// recorded in the manifest like a model's own template.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,

    /// The judge model (FB-Bench checklist, RefuteBench acceptance, Fennec), in the same forms
    /// as --model. Required by fbbench and refutebench (the papers' judges are GPT-4o and
    /// GPT-4; naming the candidate's model is allowed and recorded as self-judging); for
    /// fennec the default is the first --model. Given several times (fbbench, refutebench), a
    /// panel of judges: every judge grades every unit, the panel decides (--panel), and each
    /// judge's verdicts and metrics are kept beside the panel's.
    #[arg(long, value_name = "J")]
    pub judge: Vec<String>,

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

    /// Memory for the prefix cache, in MiB: prompts that extend tokens already computed (the
    /// previous turn, a shared prefix) reuse their KV instead of prefilling them again. 0
    /// turns it off. On a GPU it counts blocks of the card's KV pool, given back whenever
    /// running requests need them. Changes speed and memory, never results.
    #[arg(long, value_name = "MB", default_value_t = crate::engine::DEFAULT_PREFIX_CACHE_MB)]
    pub kv_cache_mb: usize,

    /// CPU threads for inference (default: every core). Changes speed, never results.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Where the models run: `cpu`, or `cuda` / `cuda:N` (a build with `--features cuda`).
    /// A GPU's tokens are deterministic but need not equal the CPU's; the manifest records it.
    /// A list (`cuda:0,cuda:1`, `cuda:all`, `cpu,cpu`) runs one replica per device on a
    /// fixed share of the items and merges them into the bytes of a one-device run; the
    /// devices' throughput goes to `devices.json`.
    #[arg(long, value_name = "DEVICE", default_value = "cpu", value_parser = parse_devices)]
    pub device: super::replicas::Devices,

    /// Base seed: per-item seeds of sampled steps and of the bootstrap intervals derive from it.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,

    /// The authors' public data (default: $CANDOR_DATA, else ../shared/data, else the cache,
    /// fetched on first use; see `candor data`).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,

    /// Run only shard I of N (0-based): the items at positions I, I+N, I+2N… after --subset
    /// and --limit. Recorded in the manifest; `candor merge` joins the N shard directories.
    #[arg(long, value_name = "I/N", value_parser = parse_shard)]
    pub shard: Option<Shard>,

    /// The candidates' thinking switch, passed to their chat templates: `off` or `on`
    /// (`enable_thinking`, Qwen3), or a reasoning effort `low`, `medium`, `high`
    /// (`reasoning_effort`, gpt-oss; also sets `enable_thinking`). Default: the template's
    /// own. Recorded in the manifest.
    #[arg(long, value_name = "MODE")]
    pub thinking: Option<Thinking>,

    /// The judges' thinking switch, as --thinking. A judge's verdict is read from its answer
    /// only, never from its reasoning.
    #[arg(long, value_name = "MODE")]
    pub judge_thinking: Option<Thinking>,

    /// Close a thinking model's reasoning after N tokens: its closing tokens (`</think>`,
    /// Harmony's final channel) are forced, and the answer follows. A reply cut by
    /// --max-new-tokens inside its reasoning is unscored ("reasoning truncated").
    #[arg(long, value_name = "N")]
    pub max_thinking_tokens: Option<usize>,

    /// The date chat templates render (`strftime_now`, e.g. gpt-oss's "Current date"), as
    /// YYYY-MM-DD. Default: the day the run started, recorded in the manifest, so a resume or
    /// `candor verify` on another day renders the same prompts.
    #[arg(long, value_name = "YYYY-MM-DD")]
    pub template_date: Option<TemplateDate>,

    /// Sleep per batch of the `fake:` models, in milliseconds (tests kill runs mid-way).
    #[arg(long, hide = true, default_value_t = 0)]
    pub fake_delay_ms: u64,

    // The per-protocol options (src/cli/options.rs).
    #[command(flatten)]
    pub options: ProtocolArgs,

    #[command(flatten)]
    pub cache: CacheArgs,

    /// Speculative decoding for the candidates (--draft; the tokens do not change).
    #[command(flatten)]
    pub draft: super::draft::DraftArgs,

    /// Speculative decoding for the judges: `lookup` or a draft model, with --draft-tokens,
    /// --draft-max-batch and --draft-fixed. Judges quote what they judge, which lookup drafts
    /// well. The tokens do not change, so neither the manifest's identity nor the cache key
    /// records it; the run prints it and writes it, with the acceptance, to `drafts.json`.
    #[arg(long, value_name = "lookup|MODEL")]
    pub judge_draft: Option<String>,
}

/// `--device`: `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    s.parse()
}

/// `run --device`: one device or a list of them (`cuda:all`).
fn parse_devices(s: &str) -> Result<super::replicas::Devices, String> {
    s.parse()
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
    /// Judges 1.. of a panel (the second and later `--judge`).
    pub panel: Vec<ModelSpec>,
    pub subsets: Vec<String>,
    pub limit: Option<usize>,
    pub out: PathBuf,
    pub batch_size: usize,
    /// The prefix cache's budget in MiB (0: off).
    pub kv_cache_mb: usize,
    pub threads: usize,
    pub device: DeviceSpec,
    pub seed: u64,
    pub data: PathBuf,
    /// `--chat-template`: replaces the candidates' own templates.
    pub chat_template: Option<PathBuf>,
    /// `--thinking`, `--judge-thinking`, `--max-thinking-tokens`, `--template-date`.
    pub thinking: Option<Thinking>,
    pub judge_thinking: Option<Thinking>,
    pub max_thinking_tokens: Option<usize>,
    pub template_date: Option<TemplateDate>,
    /// Sleep per batch of the `fake:` models (feature `testkit`).
    #[cfg_attr(not(feature = "testkit"), allow(dead_code))]
    pub fake_delay: Duration,
    pub options: ProtocolOptions,
    /// Whether `--judge` was given (a protocol without a judge refuses it; fbbench and
    /// refutebench require it).
    pub judge_given: bool,
    /// This process's share of the items (`--shard`).
    pub shard: Option<Shard>,
    /// Set by `candor merge`: every step is answered from the shards' logs.
    pub replay: Option<Arc<ReplayPool>>,
    pub cache: CacheArgs,
    /// `--draft` and `--judge-draft` (speed only; no part of identities or cache keys).
    pub draft: Option<super::draft::DraftSpec>,
    pub judge_draft: Option<super::draft::DraftSpec>,
}

impl RunConfig {
    pub fn from_args(args: RunArgs) -> anyhow::Result<Self> {
        if args.batch_size == 0 {
            bail!("--batch-size must be at least 1");
        }
        if args.limit == Some(0) {
            bail!("--limit must be at least 1");
        }
        let device = args.device.first();
        device.check_built()?;
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
        let mut judges = args
            .judge
            .iter()
            .map(|j| ModelSpec::parse(j).with_context(|| format!("--judge {j:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let judge = match judges.is_empty() {
            true => candidates[0].clone(),
            false => judges.remove(0),
        };
        let draft = args.draft.spec()?;
        let judge_draft = super::draft::DraftSpec::parse(
            args.judge_draft.as_deref(),
            args.draft.draft_tokens,
            args.draft.draft_max_batch,
            args.draft.draft_fixed,
        )?;
        Ok(RunConfig {
            protocol: args.protocol,
            candidates,
            judge,
            panel: judges,
            subsets: args.subsets,
            limit: args.limit,
            out: args.out,
            batch_size: args.batch_size,
            kv_cache_mb: args.kv_cache_mb,
            threads,
            device,
            seed: args.seed,
            data: args.data.unwrap_or_else(crate::store::data::default_root),
            chat_template: args.chat_template,
            thinking: args.thinking,
            judge_thinking: args.judge_thinking,
            max_thinking_tokens: args.max_thinking_tokens,
            template_date: args.template_date,
            fake_delay: Duration::from_millis(args.fake_delay_ms),
            options: args.options.to_options(),
            judge_given: !args.judge.is_empty(),
            shard: args.shard,
            replay: None,
            cache: args.cache,
            draft,
            judge_draft,
        })
    }
}

pub fn run(mut args: RunArgs) -> anyhow::Result<()> {
    if !args.device.is_one() {
        let devices = args.device.expand()?;
        if devices.len() > 1 {
            return super::replicas::run(&args, &devices);
        }
        args.device = super::replicas::Devices::one(devices[0]);
    }
    let mut cfg = RunConfig::from_args(args)?;
    if let Some(shard) = &mut cfg.shard {
        let argv: Vec<String> = std::env::args().skip(2).collect();
        shard.args = strip_run_args(&argv);
    }
    run_config(cfg)
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    Shard::parse(s).map_err(|e| e.to_string())
}

/// Runs a resolved configuration (also what `candor merge` calls).
pub fn run_config(cfg: RunConfig) -> anyhow::Result<()> {
    if cfg.shard.is_some() && cfg.protocol == Protocol::All {
        bail!("--shard applies to one protocol at a time; shard each protocol's run on its own");
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .build_global()
        .context("setting up the thread pool")?;
    // One display for the whole run: every round, model and protocol.
    let mut progress = BarProgress::new();
    match cfg.protocol {
        Protocol::All => run_all(&cfg, &mut progress),
        _ => run_one(&cfg, &mut progress),
    }
}

/// Runs one protocol (`cfg.protocol`, not `all`).
pub fn run_one(cfg: &RunConfig, progress: &mut dyn Progress) -> anyhow::Result<()> {
    let p = cfg.protocol;
    match p {
        Protocol::Fbbench => execute(cfg, &FbBench, progress),
        Protocol::Refutebench => execute(cfg, &RefuteBench, progress),
        Protocol::Realmistake => execute(cfg, &ReaLMistake, progress),
        Protocol::Fennec => execute(cfg, &Fennec, progress),
        #[cfg(feature = "testkit")]
        Protocol::Toy => execute(cfg, &crate::store::testkit::Toy, progress),
        #[cfg(not(feature = "testkit"))]
        Protocol::Toy => bail!("the toy protocol exists only in test builds (feature `testkit`)"),
        Protocol::All => bail!("`all` is not one protocol"),
    }
}

/// `candor run all`: the four protocols in turn, each into `<out>/<protocol>/`. Each reads
/// its own protocol options and ignores the others'; `--limit` and `--max-new-tokens` apply
/// to each. Subsets and data sets are named per protocol, so `--subset` and `--dataset` are
/// refused.
pub fn run_all(cfg: &RunConfig, progress: &mut dyn Progress) -> anyhow::Result<()> {
    if !cfg.subsets.is_empty() {
        bail!("--subset names differ per protocol; run the protocols one by one to use it");
    }
    if cfg.options.dataset.is_some() {
        bail!("--dataset names differ per protocol; run the protocols one by one to use it");
    }
    if cfg.options.pairs.is_some() || cfg.options.items.is_some() {
        bail!("--pairs and --items name one protocol's file; run that protocol on its own");
    }
    if !cfg.panel.is_empty() {
        bail!("a panel of judges (several --judge) applies to fbbench and refutebench; run each on its own");
    }
    if cfg.candidates.len() > 1 {
        bail!(
            "candor run all takes one --model (got {}): fbbench and refutebench evaluate one",
            cfg.candidates.len()
        );
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
        run_one(&one, progress).with_context(|| format!("candor run all: {}", p.name()))?;
    }
    Ok(())
}

/// The run's chat-template settings. The date is `--template-date`, else the one the run in
/// `cfg.out` recorded (a resume renders what the first attempt rendered), else today. A run
/// from before the settings were recorded resumes without them unless a flag is given.
fn chat_settings(cfg: &RunConfig) -> anyhow::Result<Option<ChatSettings>> {
    let path = cfg.out.join(crate::store::run_dir::MANIFEST);
    let recorded = match path.exists() {
        true => Some(Manifest::load(&path)?.identity.chat),
        false => None,
    };
    let flags = cfg.thinking.is_some()
        || cfg.judge_thinking.is_some()
        || cfg.max_thinking_tokens.is_some()
        || cfg.template_date.is_some();
    let template_date = match (cfg.template_date, &recorded) {
        (Some(d), _) => d,
        (None, Some(Some(chat))) => chat.template_date,
        (None, Some(None)) if !flags => return Ok(None),
        _ => TemplateDate::today(),
    };
    Ok(Some(ChatSettings {
        template_date,
        thinking: cfg.thinking,
        judge_thinking: cfg.judge_thinking,
        max_thinking_tokens: cfg.max_thinking_tokens,
    }))
}

/// Refuses model options the protocol does not use: a second `--model` where it evaluates
/// one, `--judge` where no judge takes part.
fn check_roles<Pr: BenchProtocol>(cfg: &RunConfig, protocol: &Pr) -> anyhow::Result<()> {
    let name = protocol.name();
    let n = cfg.candidates.len();
    match protocol.candidates() {
        Candidates::One if n > 1 => {
            bail!("{name} evaluates one --model, but {n} were given; run it once per model")
        }
        Candidates::JudgeOnly if n > 1 => bail!(
            "{name} runs only the judge (--judge, default the first --model), but {n} --model \
             were given"
        ),
        _ => {}
    }
    if !protocol.uses_judge() && cfg.judge_given && !cfg.options.all {
        bail!("--judge does not apply to {name}: no judge takes part (every --model is evaluated)");
    }
    if !cfg.panel.is_empty() && !protocol.panels() {
        bail!(
            "{name} takes one --judge, but {} were given (panels: fbbench and refutebench)",
            cfg.panel.len() + 1
        );
    }
    Ok(())
}

/// Checks the options, resolves the models, prepares the protocol and runs (or resumes) it to
/// the end, then prints the headline metrics.
pub fn execute<Pr: BenchProtocol>(
    cfg: &RunConfig,
    protocol: &Pr,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    check_roles(cfg, protocol)?;
    cfg.options
        .check_unused(protocol.name(), protocol.options())?;
    // A user's own file replaces the published set, which is then not needed.
    if cfg.protocol != Protocol::Toy && protocol.own_data(&cfg.options).is_none() {
        crate::store::data::ensure_protocol(&cfg.data, protocol.name())?;
    }
    let mut roles: Vec<(String, &ModelSpec)> = cfg
        .candidates
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("candidate/{i}"), m))
        .collect();
    roles.push(("judge".to_string(), &cfg.judge));
    roles.extend(
        cfg.panel
            .iter()
            .enumerate()
            .map(|(j, m)| (format!("judge/{}", j + 1), m)),
    );
    // Real models are resolved and hashed once per name.
    let mut infos: BTreeMap<String, ModelInfo> = BTreeMap::new();
    for (_, m) in &roles {
        if let ModelSpec::Engine(name) = m {
            if !infos.contains_key(name) {
                // `--chat-template` applies to the candidates (a judge named alike shares it).
                let is_candidate = cfg.candidates.contains(*m);
                let template = cfg.chat_template.as_deref().filter(|_| is_candidate);
                infos.insert(name.clone(), ModelInfo::inspect_with(name, template)?);
            }
        }
    }
    let candidate_context = match &cfg.candidates[0] {
        ModelSpec::Engine(name) => infos.get(name).map(|info| {
            let tokenizer = Arc::clone(&info.tokenizer);
            // A template that renders [system, user] (or rejects even a lone user message,
            // so that the system message is not the cause) accepts a system prompt.
            let (s, u) = (Message::system("s"), Message::user("u"));
            let accepts_system = info.template.render(&[s, u.clone()], true).is_ok()
                || info.template.render(&[u], true).is_err();
            CandidateContext {
                context_len: info.context_len,
                count: info.token_counter(),
                count_text: Arc::new(move |text: &str| {
                    tokenizer.encode(text).map_or(usize::MAX, |ids| ids.len())
                }),
                accepts_system,
            }
        }),
        ModelSpec::Fake(_) => None,
    };
    let ctx = RunContext {
        data: cfg.data.clone(),
        subsets: cfg.subsets.clone(),
        limit: cfg.limit,
        seed: cfg.seed,
        candidates: cfg.candidates.iter().map(ModelSpec::name).collect(),
        judge: cfg.judge.name(),
        panel: cfg.panel.iter().map(ModelSpec::name).collect(),
        judge_given: cfg.judge_given,
        candidate_context,
        parameters: infos
            .iter()
            .filter_map(|(name, info)| Some((name.clone(), info.parameters?)))
            .collect(),
    };
    let mut prepared = protocol.prepare(&ctx, &cfg.options)?;
    // A shard runs its share of the items (store/shard.rs).
    if let Some(shard) = &cfg.shard {
        let keep: std::collections::BTreeSet<usize> =
            shard.positions(prepared.items.len()).into_iter().collect();
        prepared.items = std::mem::take(&mut prepared.items)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| keep.contains(i))
            .map(|(_, item)| item)
            .collect();
    }
    let models = roles
        .iter()
        .map(|(role, m)| model_identity(role, m, &infos, cfg.device))
        .collect::<anyhow::Result<_>>()?;
    let engine_run = roles.iter().any(|(_, m)| matches!(m, ModelSpec::Engine(_)));
    let run = ProtocolRun {
        protocol,
        ctx: &ctx,
        options: &cfg.options,
        prepared: &prepared,
        dir: &cfg.out,
        models,
        environment: Environment {
            kv_cache_mb: engine_run.then_some(cfg.kv_cache_mb),
            ..Environment::detect(cfg.threads, cfg.batch_size)
        },
        batch_size: cfg.batch_size,
        shard: cfg.shard.clone(),
        chat: chat_settings(cfg)?,
    };
    if let Some(pool) = &cfg.replay {
        let models = ReplayModels {
            pool: Arc::clone(pool),
        };
        return finish(run, models, None, progress);
    }
    let fakes: Option<Vec<String>> = roles
        .iter()
        .map(|(_, m)| match m {
            ModelSpec::Fake(l) => Some(l.clone()),
            ModelSpec::Engine(_) => None,
        })
        .collect();
    match fakes {
        #[cfg(feature = "testkit")]
        Some(mut labels) => {
            // Roles: the candidates, the judge, then the panel's other judges.
            let panel = labels.split_off(cfg.candidates.len() + 1);
            let judge = labels.pop().unwrap_or_default();
            let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
            let mut models = crate::store::testkit::FakeModels::new(&refs, &judge);
            models.delay = cfg.fake_delay;
            models.panel = panel.clone();
            let judges: Vec<&str> = std::iter::once(judge.as_str())
                .chain(panel.iter().map(String::as_str))
                .collect();
            let cache = (cfg.cache.for_fakes()).map(|c| (c, cache::fake_keyer(&refs, &judges)));
            finish(run, models, cache, progress)
        }
        #[cfg(not(feature = "testkit"))]
        Some(labels) => bail!(
            "fake:{}: `fake:` models exist only in test builds (feature `testkit`)",
            labels.first().map_or("", String::as_str)
        ),
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
            let judges = std::iter::once(&cfg.judge)
                .chain(&cfg.panel)
                .map(info)
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut options = engine_options(cfg.batch_size, WeightDType::default(), cfg.device);
            options.scheduler.prefix_cache_bytes = cfg.kv_cache_mb << 20;
            let drafts = super::models::RunDrafts {
                candidate: cfg.draft.clone(),
                judge: cfg.judge_draft.clone(),
                ..Default::default()
            };
            let stats = Arc::clone(&drafts.stats);
            let models = engine_models(&candidates, &judges, options, drafts);
            let dtype = match cfg.device {
                DeviceSpec::Cpu => dtype_name(WeightDType::default()).to_string(),
                d => format!(
                    "{};device={d};{}",
                    dtype_name(WeightDType::default()),
                    device_identity(d)?
                ),
            };
            let cache = (cfg.cache.for_engine())
                .map(|c| (c, cache::engine_keyer(&candidates, &judges, &dtype)));
            let done = finish(run, models, cache, progress);
            write_draft_notes(&cfg.out, &stats)?;
            done
        }
    }
}

/// The run's speculative decoding, when on: per drafting model its setting and acceptance,
/// printed and written to `drafts.json` in the run directory (a note: the tokens are those
/// of plain decoding, so nothing else records it).
#[allow(clippy::type_complexity)]
fn write_draft_notes(
    out: &Path,
    stats: &Mutex<Vec<(String, String, Arc<Mutex<crate::engine::DraftStats>>)>>,
) -> anyhow::Result<()> {
    let Ok(all) = stats.lock() else {
        return Ok(());
    };
    if all.is_empty() {
        return Ok(());
    }
    let mut notes = Vec::new();
    for (model, note, s) in all.iter() {
        let s = s.lock().map(|s| *s).unwrap_or_default();
        eprintln!("candor: {model}: {note}; {}", s.summary());
        notes.push(serde_json::json!({
            "model": model,
            "note": note,
            "verify_steps": s.verify_steps,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": s.acceptance_rate(),
            "tokens_per_verify_step": s.tokens_per_step(),
            "steps_without_drafts_for_batch_size": s.skipped_steps,
        }));
    }
    if out.is_dir() {
        let path = out.join("drafts.json");
        std::fs::write(&path, serde_json::to_string_pretty(&notes)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// A GPU's part of the generation cache's key: the card's model, the driver's and NVRTC's
/// CUDA versions and the GPU kernels' numerics version, so that a reply cached on one card or
/// driver is never served for another (`cuda:0` alone names a slot, not a card).
fn device_identity(device: DeviceSpec) -> anyhow::Result<String> {
    match device {
        DeviceSpec::Cpu => Ok(String::new()),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(n) => crate::model::cuda::cache_identity(n)
            .map_err(|e| anyhow::anyhow!("--device {device}: {e}")),
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => Ok(device.check_built().map(|()| String::new())?),
    }
}

fn model_identity(
    role: &str,
    m: &ModelSpec,
    infos: &BTreeMap<String, ModelInfo>,
    device: DeviceSpec,
) -> anyhow::Result<ModelIdentity> {
    match m {
        ModelSpec::Fake(label) => {
            let h = crate::store::run_dir::sha256_bytes(format!("fake:{label}").as_bytes());
            Ok(ModelIdentity {
                role: role.to_string(),
                name: m.name(),
                sha256: h.clone(),
                tokenizer_sha256: h.clone(),
                chat_template_sha256: h,
                options: BTreeMap::new(),
            })
        }
        ModelSpec::Engine(name) => Ok(infos.get(name).context("unresolved model")?.identity(
            role,
            WeightDType::default(),
            device,
        )),
    }
}

/// [`finish_with`] behind the generation cache when there is one.
fn finish<Pr: BenchProtocol, M: Models>(
    run: ProtocolRun<'_, Pr>,
    mut models: M,
    cache: Option<(GenCache, Keyer)>,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    match cache {
        None => finish_with(run, &mut models, progress),
        Some((dir, keyer)) => {
            let mut cached = CachedModels::new(models, dir, keyer);
            let done = finish_with(run, &mut cached, progress);
            eprintln!("candor: {}", cache::summary(&cached.cache, &cached.stats));
            done
        }
    }
}

fn finish_with<Pr: BenchProtocol, M: Models>(
    run: ProtocolRun<'_, Pr>,
    models: &mut M,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    let dir = run.dir.to_path_buf();
    let ProtocolOutcome {
        run: outcome,
        outputs,
    } = run
        .execute(models, progress)
        .with_context(|| format!("run in {}", dir.display()))?;
    crate::report::write_reports(&dir, &outcome.results, &outcome.identity)
        .with_context(|| format!("the reports of the run in {}", dir.display()))?;
    for w in &outcome.warnings {
        eprintln!("candor: warning: {w}");
    }
    if outcome.resumed {
        eprintln!(
            "candor: resumed: {} steps from the log, {} finished but unlogged steps recovered, \
             {} computed",
            outcome.replayed, outcome.recovered, outcome.computed
        );
    }
    let r = &outcome.results;
    println!(
        "{}: {} items, {} completed, {} failed ({} later steps skipped)",
        r.protocol,
        r.items,
        r.completed,
        r.failed.len(),
        r.skipped_steps
    );
    for f in &r.failed {
        eprintln!(
            "candor: failed: item {} step {}: {}",
            f.item, f.key, f.error
        );
    }
    let num = |x: f64| {
        if x.is_finite() {
            format!("{x:.4}")
        } else {
            "n/a".to_string()
        }
    };
    for m in &r.results.metrics {
        println!(
            "{:<28} {:>8}  [{}, {}]  n={} unscored={} failed={}",
            m.name,
            num(m.interval.value),
            num(m.interval.low),
            num(m.interval.high),
            m.n,
            m.unscored,
            r.failed.len()
        );
    }
    for (path, note) in &outputs {
        println!("{note}: {}", path.display());
    }
    let notes = r
        .results
        .tables
        .iter()
        .filter(|t| t.id == table_id::RUN_NOTES);
    for row in notes.flat_map(|t| &t.rows) {
        if let [Cell::Text(note), value] = &row[..] {
            if note == "smoke test" {
                println!("{note}: {value}");
            }
        }
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
    fn model_options_a_protocol_does_not_use_are_refused() {
        let roles = |args: &[&str], p: &dyn Fn(&RunConfig) -> anyhow::Result<()>| {
            p(&parse(args).unwrap()).err().map(|e| e.to_string())
        };
        let fb = |c: &RunConfig| check_roles(c, &FbBench);
        let rm = |c: &RunConfig| check_roles(c, &ReaLMistake);
        let fe = |c: &RunConfig| check_roles(c, &Fennec);
        let two = ["fbbench", "--out", "x", "--model", "a", "--model", "b"];
        assert_eq!(
            roles(&two, &fb).unwrap(),
            "fbbench evaluates one --model, but 2 were given; run it once per model"
        );
        assert_eq!(roles(&two, &rm), None);
        assert!(roles(&two, &fe)
            .unwrap()
            .contains("fennec runs only the judge"));
        let judged = ["realmistake", "--out", "x", "--judge", "j"];
        assert_eq!(
            roles(&judged, &rm).unwrap(),
            "--judge does not apply to realmistake: no judge takes part (every --model is \
             evaluated)"
        );
        assert_eq!(roles(&judged, &fb), None);
        // Protocol options of another protocol: named with the protocol.
        let c = parse(&["fbbench", "--out", "x", "--branches", "3"]).unwrap();
        let err = c.options.check_unused("fbbench", FbBench.options());
        assert_eq!(
            err.unwrap_err().to_string(),
            "--branches does not apply to fbbench"
        );
    }

    #[test]
    fn whether_the_judge_was_named_is_kept() {
        // fbbench and refutebench refuse a run without --judge (bench::protocol::require_judge).
        let c = parse(&["fbbench", "--out", "x"]).unwrap();
        assert!(!c.judge_given);
        let c = parse(&["refutebench", "--judge", "default", "--out", "x"]).unwrap();
        assert!(c.judge_given);
        assert_eq!(c.judge, c.candidates[0]);
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
