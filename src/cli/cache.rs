//! The generation cache of `candor run` (see [`crate::store::gen_cache`]): where it is, whether
//! it is on, and how a request's key is made for real models (model file hash, prompt token
//! ids as the engine will see them, tokenizer and template hashes, dtype, sampling
//! parameters) and for the `fake:` stand-ins (label, messages, parameters).
//!
//! On by default for real models (`--no-cache` or `CANDOR_NO_CACHE=1` turn it off); the
//! `fake:` models of tests use it only with an explicit `--cache-dir`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::bench::panel::judge_actor;
use crate::bench::plan::Actor;
use crate::store::gen_cache::{self, CacheStats, GenCache, KeyParts, Keyer, PromptKey};
use crate::store::run_dir::sha256_bytes;

use super::models::ModelInfo;

/// Options of the cache on `candor run`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Generation cache")]
pub struct CacheArgs {
    /// Directory of the generation cache shared by runs (default: $CANDOR_HOME/cache/generations,
    /// else the platform cache directory, e.g. ~/.cache/candor/generations).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Neither read nor write the generation cache (also: CANDOR_NO_CACHE=1).
    #[arg(long, conflicts_with = "cache_dir")]
    pub no_cache: bool,
}

impl CacheArgs {
    /// The cache to use for real models, if any.
    pub fn for_engine(&self) -> Option<GenCache> {
        if self.no_cache || std::env::var("CANDOR_NO_CACHE").is_ok_and(|v| v == "1") {
            return None;
        }
        self.cache_dir
            .clone()
            .or_else(gen_cache::default_dir)
            .map(GenCache::new)
    }

    /// The cache to use for `fake:` models: only one named with --cache-dir.
    pub fn for_fakes(&self) -> Option<GenCache> {
        self.cache_dir.clone().map(GenCache::new)
    }
}

/// Keys of real models: the prompt rendered with the model's template and tokenized.
pub fn engine_keyer(candidates: &[ModelInfo], judges: &[ModelInfo], dtype: &str) -> Keyer {
    let mut by_actor: BTreeMap<Actor, (ModelInfo, String)> = BTreeMap::new();
    let options = |m: &ModelInfo| {
        format!(
            "dtype={dtype};tokenizer={};template={}",
            m.tokenizer.sha256(),
            sha256_bytes(m.template.source().as_bytes())
        )
    };
    for (i, m) in candidates.iter().enumerate() {
        by_actor.insert(Actor::Candidate(i), (m.clone(), options(m)));
    }
    for (j, m) in judges.iter().enumerate() {
        by_actor.insert(judge_actor(j), (m.clone(), options(m)));
    }
    Arc::new(move |actor, req| {
        let (m, opts) = by_actor.get(&actor)?;
        let text = m.template.render(&req.messages, true).ok()?;
        let ids = m.tokenizer.encode(&text).ok()?;
        Some(
            KeyParts {
                model_sha256: &m.sha256,
                options: opts,
                prompt: PromptKey::TokenIds(&ids),
                params: &req.params,
            }
            .key(),
        )
    })
}

/// Keys of the `fake:` models: label, messages and parameters.
#[cfg(feature = "testkit")]
pub fn fake_keyer(candidates: &[&str], judges: &[&str]) -> Keyer {
    let label = |l: &str| sha256_bytes(format!("fake:{l}").as_bytes());
    let mut by_actor: BTreeMap<Actor, String> = candidates
        .iter()
        .enumerate()
        .map(|(i, l)| (Actor::Candidate(i), label(l)))
        .collect();
    for (j, l) in judges.iter().enumerate() {
        by_actor.insert(judge_actor(j), label(l));
    }
    Arc::new(move |actor, req| {
        let model = by_actor.get(&actor)?;
        Some(
            KeyParts {
                model_sha256: model,
                options: "fake",
                prompt: PromptKey::Messages(serde_json::to_string(&req.messages).ok()?),
                params: &req.params,
            }
            .key(),
        )
    })
}

/// One line about what the cache did.
pub fn summary(cache: &GenCache, stats: &CacheStats) -> String {
    let errors = stats.write_errors.load(Ordering::Relaxed);
    format!(
        "generation cache {}: {} replies reused, {} stored{}",
        cache.dir().display(),
        stats.hits.load(Ordering::Relaxed),
        stats.stored.load(Ordering::Relaxed),
        if errors > 0 {
            format!(", {errors} could not be written")
        } else {
            String::new()
        }
    )
}
