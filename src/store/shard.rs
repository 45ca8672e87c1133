//! Sharding: a run split over several processes or machines, and the merge of the shards
//! into the run an unsharded process would have written.
//!
//! Shard `I/N` (0-based `I`) takes the items whose position in the run's item list (after
//! `--subset` and `--limit`) is `I` modulo `N`: a deterministic, balanced share. The shard is
//! recorded in the manifest's identity ([`Shard`], `store::shard_spec`, with the `candor run` arguments it was
//! given), so a shard directory resumes like any run and refuses another shard's settings.
//!
//! Merging checks that the shards' manifests agree in everything but the shard and the items,
//! that they are `0..N` of the same `N` with each run to its end, and that no item is in two
//! of them; then it replays the unsharded run with [`ReplayModels`], a model stand-in that
//! answers every request from the shards' logged samples. The runner's log order and scoring
//! depend only on the plan and the step outputs, so the merged `samples.jsonl`,
//! `results.json` and reports are byte-identical to an unsharded run's. A request no shard
//! logged, or a logged sample left unused, makes the merge fail: a shard was incomplete or
//! from another run.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::manifest::{ItemSet, Manifest};
use super::model_pool::Models;
use super::samples::{parse_log, Sample, SampleOutcome};
use super::shard_spec::Shard;
use super::{BoxError, StoreError};
use crate::bench::plan::Actor;
use crate::engine::{ChatReply, ChatRequest, Generate, SamplingParams};
use crate::text::message::Message;

/// Errors of sharding and merging.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{}: {message}", path.display())]
    Bad { path: PathBuf, message: String },
    #[error("the shards do not belong to one run: {0}")]
    Disagree(String),
    #[error("{0}")]
    Incomplete(String),
}

/// `candor run` arguments (after `run`) without `--out`/`--shard` and their values.
pub fn strip_run_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
            continue;
        }
        if a == "--out" || a == "--shard" {
            skip = true;
            continue;
        }
        if a.starts_with("--out=") || a.starts_with("--shard=") {
            continue;
        }
        out.push(a.clone());
    }
    out
}

/// A shard directory read for merging.
#[derive(Debug)]
pub struct ShardDir {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub shard: Shard,
    pub samples: Vec<Sample>,
}

impl ShardDir {
    /// Reads a finished shard: its manifest (which must name a shard) and its log.
    pub fn open(dir: &Path) -> Result<ShardDir, ShardError> {
        let bad = |message: &str| ShardError::Bad {
            path: dir.to_path_buf(),
            message: message.to_string(),
        };
        let manifest = Manifest::load(&dir.join("manifest.json"))?;
        let shard = manifest
            .identity
            .shard
            .clone()
            .ok_or_else(|| bad("not a shard (its manifest names no --shard)"))?;
        if !dir.join("results.json").is_file() {
            return Err(bad(&format!(
                "shard {}/{} has not finished (no results.json); resume it with the same \
                 `candor run … --shard {}/{}` first",
                shard.index, shard.count, shard.index, shard.count
            )));
        }
        let path = dir.join("samples.jsonl");
        let bytes = std::fs::read(&path).map_err(|e| StoreError::io(&path, e))?;
        let (logged, complete) = parse_log(&path, &bytes)?;
        if complete != bytes.len() {
            return Err(bad("samples.jsonl ends in a torn line"));
        }
        Ok(ShardDir {
            dir: dir.to_path_buf(),
            manifest,
            shard,
            samples: logged.into_iter().map(|l| l.sample).collect(),
        })
    }
}

/// Checks that `shards` are all `N` shards of one run, each item in one of them; returns the
/// run's `candor run` arguments.
pub fn check_shards(shards: &[ShardDir]) -> Result<Vec<String>, ShardError> {
    let Some(first) = shards.first() else {
        return Err(ShardError::Incomplete("no shard directories given".into()));
    };
    let n = first.shard.count;
    let normal = |m: &Manifest| {
        let mut m = m.clone();
        m.identity.shard = None;
        m.identity.items = ItemSet::default();
        m
    };
    let base = normal(&first.manifest);
    for s in &shards[1..] {
        let fields = normal(&s.manifest).differences(&base);
        if !fields.is_empty() {
            return Err(ShardError::Disagree(format!(
                "{} and {} differ in {}",
                s.dir.display(),
                first.dir.display(),
                fields.join(", ")
            )));
        }
        if s.shard.count != n || s.shard.args != first.shard.args {
            return Err(ShardError::Disagree(format!(
                "{} is shard {}/{} of `{}`, {} is shard {}/{} of `{}`",
                s.dir.display(),
                s.shard.index,
                s.shard.count,
                s.shard.args.join(" "),
                first.dir.display(),
                first.shard.index,
                first.shard.count,
                first.shard.args.join(" ")
            )));
        }
    }
    let mut seen: BTreeMap<usize, &Path> = BTreeMap::new();
    for s in shards {
        if let Some(other) = seen.insert(s.shard.index, &s.dir) {
            return Err(ShardError::Disagree(format!(
                "{} and {} are both shard {}/{n}",
                other.display(),
                s.dir.display(),
                s.shard.index
            )));
        }
    }
    let missing: Vec<String> = (0..n)
        .filter(|i| !seen.contains_key(i))
        .map(|i| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        return Err(ShardError::Incomplete(format!(
            "shards missing: {}",
            missing.join(", ")
        )));
    }
    let mut owner: BTreeMap<&str, &Path> = BTreeMap::new();
    for s in shards {
        let items: BTreeSet<&str> = s.samples.iter().map(|x| x.item.as_str()).collect();
        for item in items {
            if let Some(other) = owner.insert(item, &s.dir) {
                return Err(ShardError::Disagree(format!(
                    "item {item:?} is in both {} and {}: the shards overlap",
                    other.display(),
                    s.dir.display()
                )));
            }
        }
    }
    Ok(first.shard.args.clone())
}

/// The logged outcomes of every shard, by request (messages and parameters).
#[derive(Debug, Default)]
pub struct ReplayPool {
    outcomes: Mutex<BTreeMap<String, VecDeque<(Actor, SampleOutcome)>>>,
}

/// Why the replay could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The logged step failed with this error (a request error: the runner logs it again).
    #[error("{0}")]
    Logged(String),
    #[error(
        "no shard logged a step for this request ({0}); a shard is incomplete or from another run"
    )]
    Missing(String),
}

fn request_key(messages: &[Message], params: &SamplingParams) -> String {
    serde_json::to_string(&(messages, params)).unwrap_or_default()
}

impl ReplayPool {
    pub fn new(shards: &[ShardDir]) -> ReplayPool {
        let mut map: BTreeMap<String, VecDeque<(Actor, SampleOutcome)>> = BTreeMap::new();
        for s in shards {
            for x in &s.samples {
                if let Ok(o) = x.outcome() {
                    map.entry(request_key(&x.messages, &x.params))
                        .or_default()
                        .push_back((x.actor, o));
                }
            }
        }
        ReplayPool {
            outcomes: Mutex::new(map),
        }
    }

    /// Forgets one logged outcome per sample the merged directory already holds (a merge
    /// being finished, or done again): the run does not ask for those steps again, so they
    /// must not count as unused.
    pub fn already_merged<'a>(&self, samples: impl IntoIterator<Item = &'a Sample>) {
        if let Ok(mut map) = self.outcomes.lock() {
            for s in samples {
                take(&mut map, &request_key(&s.messages, &s.params), s.actor);
            }
        }
    }

    /// Logged samples no request asked for (0 after a complete merge).
    pub fn unused(&self) -> usize {
        self.outcomes
            .lock()
            .map(|m| m.values().map(VecDeque::len).sum())
            .unwrap_or(0)
    }

    fn answer(
        &self,
        actor: Actor,
        requests: &[ChatRequest],
    ) -> Result<Vec<ChatReply>, ReplayError> {
        let mut map = self
            .outcomes
            .lock()
            .map_err(|_| ReplayError::Missing("poisoned".into()))?;
        let keys: Vec<String> = requests
            .iter()
            .map(|r| request_key(&r.messages, &r.params))
            .collect();
        // Look first, take after: a logged error fails the whole call and takes nothing (the
        // runner then asks again request by request).
        for (k, r) in keys.iter().zip(requests) {
            let front = map.get(k).and_then(|q| q.iter().find(|(a, _)| *a == actor));
            match front {
                None => {
                    let what = r
                        .messages
                        .last()
                        .map(|m| m.content.chars().take(60).collect::<String>())
                        .unwrap_or_default();
                    return Err(ReplayError::Missing(format!(
                        "actor {actor:?}, last message {what:?}"
                    )));
                }
                Some((_, SampleOutcome::Error(e))) if requests.len() == 1 => {
                    let e = e.clone();
                    take(&mut map, k, actor);
                    return Err(ReplayError::Logged(e));
                }
                Some((_, SampleOutcome::Error(e))) => return Err(ReplayError::Logged(e.clone())),
                Some(_) => {}
            }
        }
        Ok(keys
            .iter()
            .map(|k| match take(&mut map, k, actor) {
                Some(SampleOutcome::Output(o)) => ChatReply {
                    prompt_ids: vec![0; o.prompt_tokens],
                    output_ids: vec![0; o.output_tokens],
                    text: o.text,
                    stop_reason: o.stop_reason,
                    reasoning: o.reasoning,
                },
                // Checked above.
                _ => ChatReply {
                    prompt_ids: Vec::new(),
                    output_ids: Vec::new(),
                    text: String::new(),
                    stop_reason: crate::engine::StopReason::Eos,
                    reasoning: None,
                },
            })
            .collect())
    }
}

fn take(
    map: &mut BTreeMap<String, VecDeque<(Actor, SampleOutcome)>>,
    key: &str,
    actor: Actor,
) -> Option<SampleOutcome> {
    let q = map.get_mut(key)?;
    let i = q.iter().position(|(a, _)| *a == actor)?;
    let out = q.remove(i).map(|(_, o)| o);
    if q.is_empty() {
        map.remove(key);
    }
    out
}

/// Models that answer from a [`ReplayPool`] (no model is loaded).
pub struct ReplayModels {
    pub pool: Arc<ReplayPool>,
}

/// One actor's view of the pool.
pub struct ReplayGen {
    pool: Arc<ReplayPool>,
    actor: Actor,
}

impl Generate for ReplayGen {
    type Error = ReplayError;
    fn generate_chat(&mut self, requests: &[ChatRequest]) -> Result<Vec<ChatReply>, ReplayError> {
        self.pool.answer(self.actor, requests)
    }
}

impl Models for ReplayModels {
    type Gen = ReplayGen;

    fn load(&mut self, actor: Actor) -> Result<ReplayGen, BoxError> {
        Ok(ReplayGen {
            pool: Arc::clone(&self.pool),
            actor,
        })
    }

    fn is_request_error(&self, err: &ReplayError) -> bool {
        matches!(err, ReplayError::Logged(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_shares_are_disjoint_and_complete() {
        assert_eq!(Shard::parse("1/3").unwrap().index, 1);
        for bad in ["3/3", "1", "a/2", "0/0", "-1/2"] {
            let err = Shard::parse(bad).unwrap_err().to_string();
            assert!(err.contains("expected I/N"), "{bad}: {err}");
        }
        let mut all: Vec<usize> = (0..4)
            .flat_map(|i| Shard::parse(&format!("{i}/4")).unwrap().positions(10))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn run_args_lose_out_and_shard() {
        let args: Vec<String> = [
            "toy",
            "--out",
            "x",
            "--shard=1/2",
            "--limit",
            "3",
            "--shard",
            "0/2",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(strip_run_args(&args), ["toy", "--limit", "3"]);
    }
}
