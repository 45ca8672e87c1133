//! `candor verify RUN [--sample N]`: recomputes a run's recorded steps on this machine and
//! compares them with the log.
//!
//! The models are the manifest's (resolved by name, and refused when a file's sha256 is not
//! the one recorded); each chosen step's messages and sampling parameters, as logged, are sent
//! again, grouped by actor and batched (batch size never changes a reply). A step is
//! identical when its text, stop reason and output token count are; for a step that differs,
//! the first differing token is named (its position, id and text, against what the log has
//! there). A step logged as failed is identical when it fails again with the same error.
//! Exits non-zero when any step differs. `--sample N` checks N steps picked with `--seed`
//! (in log order). What may legitimately differ on another machine is in the README.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};

use crate::bench::panel::judge_actor;
use crate::bench::plan::Actor;
use crate::engine::{ChatReply, ChatRequest, Generate};
use crate::model::device::DeviceSpec;
use crate::model::transformer::WeightDType;
use crate::stats::rng::SplitMix64;
use crate::store::chat_settings::ChatSettings;
use crate::store::manifest::Manifest;
use crate::store::samples::{parse_log, Sample, SampleOutcome};
#[cfg(feature = "testkit")]
use crate::store::testkit::FakeModels;
use crate::store::{error_chain, Models};
use crate::text::tokenizer::Tokenizer;

use super::models::{engine_models, engine_options, ModelInfo};

#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The run directory (manifest.json and samples.jsonl).
    #[arg(value_name = "RUN")]
    pub run: PathBuf,
    /// Recompute only N steps, picked with --seed (default: every step).
    #[arg(long, value_name = "N")]
    pub sample: Option<usize>,
    /// Seed of the --sample choice.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Most requests sent to a model at once (never changes a reply).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub batch_size: usize,
    /// CPU threads (default: every core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

/// How one recomputed step compares with the log.
#[derive(Debug, Clone, PartialEq)]
pub struct StepCheck {
    pub item: String,
    pub key: String,
    pub actor: Actor,
    /// None: identical. Some: what differs.
    pub difference: Option<String>,
}

pub fn run(args: VerifyArgs) -> anyhow::Result<()> {
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    let threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .context("setting up the thread pool")?;
    let manifest = Manifest::load(&args.run.join("manifest.json"))?;
    let samples_path = args.run.join("samples.jsonl");
    let bytes = std::fs::read(&samples_path)
        .with_context(|| format!("reading {}", samples_path.display()))?;
    let (logged, _) = parse_log(&samples_path, &bytes)?;
    let samples: Vec<Sample> = logged.into_iter().map(|l| l.sample).collect();
    let chosen = choose(samples.len(), args.sample, args.seed);
    let picked: Vec<&Sample> = chosen.iter().map(|&i| &samples[i]).collect();

    let mut candidates: BTreeMap<usize, String> = BTreeMap::new();
    let mut judge = None;
    // Judges 1.. of a panel, by number (roles `judge/<j>`).
    let mut panel: BTreeMap<usize, String> = BTreeMap::new();
    let mut hashes = BTreeMap::new();
    let mut dtype = WeightDType::Native;
    let mut device = DeviceSpec::Cpu;
    for m in &manifest.identity.models {
        if m.role == "judge" {
            judge = Some(m.name.clone());
        } else if let Some(j) = m.role.strip_prefix("judge/").and_then(|j| j.parse().ok()) {
            panel.insert(j, m.name.clone());
        } else if let Some(i) = m
            .role
            .strip_prefix("candidate/")
            .and_then(|i| i.parse().ok())
        {
            candidates.insert(i, m.name.clone());
        }
        hashes.insert(m.name.clone(), m.sha256.clone());
        if m.options.get("dtype").map(String::as_str) == Some("f32") {
            dtype = WeightDType::F32;
        }
        // The run's device, for the same numerics (CPU and GPU tokens may differ).
        if let Some(d) = m.options.get("device") {
            device = d
                .parse()
                .map_err(|e| anyhow::anyhow!("manifest: model {:?}: {e}", m.name))?;
        }
    }
    let candidates: Vec<String> = candidates.into_values().collect();
    let judge = judge.context("the manifest names no judge")?;
    if panel.keys().copied().ne(1..=panel.len()) {
        bail!(
            "the manifest's panel judges are not numbered 1..{}",
            panel.len()
        );
    }
    let panel: Vec<String> = panel.into_values().collect();
    let judges: Vec<String> = std::iter::once(judge.clone()).chain(panel).collect();
    let all_fake = candidates
        .iter()
        .chain(&judges)
        .all(|n| n.starts_with("fake:"));
    let checks = if all_fake {
        #[cfg(feature = "testkit")]
        {
            let labels: Vec<&str> = candidates
                .iter()
                .map(|n| n.trim_start_matches("fake:"))
                .collect();
            let mut models = FakeModels::new(&labels, judge.trim_start_matches("fake:"));
            models.panel = judges[1..]
                .iter()
                .map(|n| n.trim_start_matches("fake:").to_string())
                .collect();
            verify_steps(
                &mut models,
                &picked,
                manifest.identity.chat.as_ref(),
                args.batch_size,
                &|_| None,
            )?
        }
        #[cfg(not(feature = "testkit"))]
        bail!("`fake:` models exist only in test builds (feature `testkit`)")
    } else {
        let mut infos: BTreeMap<String, ModelInfo> = BTreeMap::new();
        for name in candidates.iter().chain(&judges) {
            if infos.contains_key(name) {
                continue;
            }
            let info = ModelInfo::inspect(name)?;
            let want = hashes.get(name).cloned().unwrap_or_default();
            if info.sha256 != want {
                bail!(
                    "model {name:?}: {} has sha256 {}, the run used {want}; cannot verify \
                     with another model",
                    info.files.weights.display(),
                    info.sha256
                );
            }
            infos.insert(name.clone(), info);
        }
        let cands: Vec<ModelInfo> = candidates.iter().map(|n| infos[n].clone()).collect();
        let js: Vec<ModelInfo> = judges.iter().map(|n| infos[n].clone()).collect();
        let tokenizers: BTreeMap<Actor, Arc<Tokenizer>> = cands
            .iter()
            .enumerate()
            .map(|(i, m)| (Actor::Candidate(i), Arc::clone(&m.tokenizer)))
            .chain(
                js.iter()
                    .enumerate()
                    .map(|(j, m)| (judge_actor(j), Arc::clone(&m.tokenizer))),
            )
            .collect();
        let mut models = engine_models(
            &cands,
            &js,
            engine_options(args.batch_size, dtype, device),
            Default::default(),
        );
        verify_steps(
            &mut models,
            &picked,
            manifest.identity.chat.as_ref(),
            args.batch_size,
            &|a| tokenizers.get(&a).cloned(),
        )?
    };
    let differing: Vec<&StepCheck> = checks.iter().filter(|c| c.difference.is_some()).collect();
    for c in &differing {
        println!(
            "DIFFERS {} {} ({}): {}",
            c.item,
            c.key,
            crate::store::ActorName(c.actor),
            c.difference.as_deref().unwrap_or_default()
        );
    }
    println!(
        "verified {} of {} steps of {} on this machine: {} identical, {} differing",
        checks.len(),
        samples.len(),
        args.run.display(),
        checks.len() - differing.len(),
        differing.len()
    );
    if !differing.is_empty() {
        bail!(
            "{} of {} recomputed steps differ from the log",
            differing.len(),
            checks.len()
        );
    }
    Ok(())
}

/// The log positions to check: all, or `n` of them picked by a seeded partial shuffle, in log
/// order.
pub fn choose(len: usize, n: Option<usize>, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..len).collect();
    let Some(n) = n.filter(|&n| n < len) else {
        return idx;
    };
    let mut rng = SplitMix64::new(seed);
    for i in 0..n {
        let j = i + rng.below(len - i);
        idx.swap(i, j);
    }
    idx.truncate(n);
    idx.sort_unstable();
    idx
}

/// Recomputes `samples` actor by actor (candidates, then the judge) and compares.
pub fn verify_steps<M: Models>(
    models: &mut M,
    samples: &[&Sample],
    chat: Option<&ChatSettings>,
    batch_size: usize,
    tokenizer: &dyn Fn(Actor) -> Option<Arc<Tokenizer>>,
) -> anyhow::Result<Vec<StepCheck>> {
    let mut actors: Vec<Actor> = samples.iter().map(|s| s.actor).collect();
    actors.sort();
    actors.dedup();
    let mut checks = Vec::new();
    for actor in actors {
        let mine: Vec<&Sample> = samples
            .iter()
            .copied()
            .filter(|s| s.actor == actor)
            .collect();
        let mut gen = models
            .load(actor)
            .map_err(|e| anyhow::anyhow!("loading the model for {actor:?}: {e}"))?;
        let tok = tokenizer(actor);
        for chunk in mine.chunks(batch_size.max(1)) {
            let requests: Vec<ChatRequest> = chunk
                .iter()
                .map(|s| {
                    // As the run asked: its thinking switches, budget and template date.
                    let mut r = ChatRequest::new(s.messages.clone(), s.params.clone());
                    if let Some(chat) = chat {
                        chat.apply(actor, &mut r);
                    }
                    r
                })
                .collect();
            let replies: Vec<Result<ChatReply, String>> = match gen.generate_chat(&requests) {
                Ok(r) if r.len() == requests.len() => r.into_iter().map(Ok).collect(),
                Ok(r) => bail!(
                    "the engine gave {} replies to {} requests",
                    r.len(),
                    requests.len()
                ),
                Err(e) if models.is_request_error(&e) => requests
                    .iter()
                    .map(|req| match gen.generate_chat(std::slice::from_ref(req)) {
                        Ok(mut r) if r.len() == 1 => Ok(r.remove(0)),
                        Ok(_) => Err("the engine broke its contract".to_string()),
                        Err(e) => Err(error_chain(&e)),
                    })
                    .collect(),
                Err(e) => bail!("the engine failed for {actor:?}: {}", error_chain(&e)),
            };
            for (s, reply) in chunk.iter().zip(replies) {
                checks.push(StepCheck {
                    item: s.item.clone(),
                    key: s.key.clone(),
                    actor,
                    difference: compare(s, reply, tok.as_deref()),
                });
            }
        }
    }
    // Report in log order.
    let order: BTreeMap<(&str, &str), usize> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.item.as_str(), s.key.as_str()), i))
        .collect();
    checks.sort_by_key(|c| order.get(&(c.item.as_str(), c.key.as_str())).copied());
    Ok(checks)
}

/// None when the recomputed reply is the logged one; else what differs.
fn compare(
    s: &Sample,
    reply: Result<ChatReply, String>,
    tok: Option<&Tokenizer>,
) -> Option<String> {
    let logged = match s.outcome() {
        Ok(o) => o,
        Err(e) => return Some(format!("unreadable log line: {e}")),
    };
    match (logged, reply) {
        (SampleOutcome::Error(a), Err(b)) if a == b => None,
        (SampleOutcome::Error(a), Err(b)) => Some(format!("logged error {a:?}, now {b:?}")),
        (SampleOutcome::Error(a), Ok(r)) => Some(format!(
            "logged error {a:?}, now a reply {:?}",
            clip(&r.text, 60)
        )),
        (SampleOutcome::Output(_), Err(b)) => Some(format!("logged a reply, now error {b:?}")),
        (SampleOutcome::Output(o), Ok(r)) => {
            if o.text == r.text
                && o.stop_reason == r.stop_reason
                && o.output_tokens == r.output_ids.len()
            {
                return None;
            }
            Some(first_difference(&o.text, &r, tok))
        }
    }
}

fn clip(s: &str, n: usize) -> String {
    let t: String = s.chars().take(n).collect();
    if t.len() < s.len() {
        format!("{t}…")
    } else {
        t
    }
}

/// Where the recomputed reply first departs from the logged text: the token (with a
/// tokenizer) or the character offset.
fn first_difference(logged: &str, r: &ChatReply, tok: Option<&Tokenizer>) -> String {
    if let Some(tok) = tok {
        for k in 0..r.output_ids.len() {
            let prefix = tok.decode(&r.output_ids[..=k]);
            let prefix = prefix.trim_end_matches('\u{FFFD}');
            if !logged.starts_with(prefix) {
                let at = common_prefix(logged, prefix);
                return format!(
                    "first differing token #{k} (id {}, {:?}); the log has {:?} there \
                     ({} vs {} output tokens)",
                    r.output_ids[k],
                    tok.decode(&r.output_ids[k..=k]),
                    clip(&logged[at..], 24),
                    r.output_ids.len(),
                    logged_tokens(logged, tok)
                );
            }
        }
    }
    let at = common_prefix(logged, &r.text);
    if at == logged.len() && at == r.text.len() {
        return format!(
            "same text, but stop reason {:?} / {} output tokens",
            r.stop_reason,
            r.output_ids.len()
        );
    }
    format!(
        "first difference at character {}: now {:?}, the log has {:?}",
        logged[..at].chars().count(),
        clip(&r.text[at..], 24),
        clip(&logged[at..], 24)
    )
}

fn logged_tokens(text: &str, tok: &Tokenizer) -> String {
    tok.encode_plain(text)
        .map_or_else(|_| "?".to_string(), |ids| format!("~{}", ids.len()))
}

/// Byte length of the common prefix of `a` and `b`, on a character boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or(a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_seeded_sorted_and_bounded() {
        assert_eq!(choose(5, None, 1), [0, 1, 2, 3, 4]);
        assert_eq!(choose(3, Some(10), 1), [0, 1, 2]);
        let a = choose(100, Some(7), 42);
        assert_eq!(a.len(), 7);
        assert!(a.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(a, choose(100, Some(7), 42));
        assert_ne!(a, choose(100, Some(7), 43));
    }

    #[test]
    fn common_prefix_respects_characters() {
        assert_eq!(common_prefix("héllo", "hélp"), 4);
        assert_eq!(common_prefix("ab", "abc"), 2);
    }
}
