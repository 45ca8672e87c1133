//! The generation cache: replies stored by content, shared by runs, so that a protocol run
//! again with another judge reuses its candidates' replies instead of generating them again.
//!
//! A reply is stored under the sha256 of what determines it: the model file's sha256, the
//! prompt as token ids (or, where the caller has no tokenizer, the messages), the sampling
//! parameters, the weight dtype and [`NUMERICS_VERSION`], the version of the engine's
//! numerics (bumped whenever a kernel change may change a token). The store is a directory of
//! files `ab/abcdef….json`; a file is written to a temporary name in the same directory and
//! renamed into place, so two processes filling one cache at once never see half a file (the
//! last rename wins, with the same bytes), and a file that cannot be read as a reply is a
//! miss. Deleting the directory, or any file in it, at any time only costs recomputation.
//!
//! [`CachedModels`] wraps any [`Models`]: it is a layer around the model calls, not part of
//! the runner's schedule, which sees a generator like any other.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::model_pool::Models;
use super::run_dir::sha256_bytes;
use super::BoxError;
use crate::bench::plan::Actor;
use crate::engine::{ChatReply, ChatRequest, Generate, PrefillStats, SamplingParams};

/// The version of the engine's numerics that cached replies were made with. Bump it when a
/// change to the forward pass, kernels or sampling may change any generated token.
pub const NUMERICS_VERSION: &str = "candor-numerics-2";

/// Where the cache lives by default: `$CANDOR_HOME/cache/generations`, else the platform
/// cache directory (`$XDG_CACHE_HOME` or `~/.cache`, `~/Library/Caches` on macOS,
/// `%LOCALAPPDATA%` on Windows) under `candor/generations`.
pub fn default_dir() -> Option<PathBuf> {
    crate::weights::panel_file::cache_dir("generations")
}

/// What a cache key is made of.
#[derive(Debug, Serialize)]
pub struct KeyParts<'a> {
    pub model_sha256: &'a str,
    /// Loading options that change outputs (e.g. the weight dtype).
    pub options: &'a str,
    /// The prompt's token ids; or, where there is no tokenizer, the messages as JSON.
    pub prompt: PromptKey<'a>,
    pub params: &'a SamplingParams,
}

/// The prompt part of a key.
#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptKey<'a> {
    TokenIds(&'a [u32]),
    Messages(String),
}

impl KeyParts<'_> {
    /// The key: sha256 hex of the parts and [`NUMERICS_VERSION`].
    pub fn key(&self) -> String {
        let doc = serde_json::json!({ "numerics": NUMERICS_VERSION, "parts": self });
        sha256_bytes(doc.to_string().as_bytes())
    }
}

/// A directory of cached replies.
#[derive(Debug, Clone)]
pub struct GenCache {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    key: String,
    reply: ChatReply,
}

impl GenCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        GenCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        let shard = key.get(..2).unwrap_or("xx");
        self.dir.join(shard).join(format!("{key}.json"))
    }

    /// The stored reply, or None (absent, unreadable or for another key).
    pub fn get(&self, key: &str) -> Option<ChatReply> {
        let bytes = std::fs::read(self.path(key)).ok()?;
        let e: Entry = serde_json::from_slice(&bytes).ok()?;
        (e.key == key).then_some(e.reply)
    }

    /// Stores a reply: a temporary file beside the target, renamed over it.
    pub fn put(&self, key: &str, reply: &ChatReply) -> std::io::Result<()> {
        let path = self.path(key);
        let dir = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir)?;
        let bytes = serde_json::to_vec(&Entry {
            key: key.to_string(),
            reply: reply.clone(),
        })
        .map_err(std::io::Error::other)?;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, &bytes)?;
        tmp.persist(&path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// Cache counters of one run.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicUsize,
    pub stored: AtomicUsize,
    /// Writes that failed (the run goes on; the reply is simply not cached).
    pub write_errors: AtomicUsize,
}

/// Makes the key of a request for an actor; None: do not cache this request.
pub type Keyer = Arc<dyn Fn(Actor, &ChatRequest) -> Option<String> + Send + Sync>;

/// A [`Models`] whose generators answer from the cache first.
pub struct CachedModels<M> {
    pub inner: M,
    pub cache: GenCache,
    pub keyer: Keyer,
    pub stats: Arc<CacheStats>,
}

impl<M> CachedModels<M> {
    pub fn new(inner: M, cache: GenCache, keyer: Keyer) -> Self {
        CachedModels {
            inner,
            cache,
            keyer,
            stats: Arc::default(),
        }
    }
}

/// A generator behind the cache.
pub struct CachedGen<G> {
    inner: G,
    actor: Actor,
    cache: GenCache,
    keyer: Keyer,
    stats: Arc<CacheStats>,
    /// The keys of streamed requests being generated, by id.
    streamed: HashMap<u64, String>,
}

impl<G> CachedGen<G> {
    fn store(&self, key: &str, reply: &ChatReply) {
        match self.cache.put(key, reply) {
            Ok(()) => self.stats.stored.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.write_errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}

impl<G: Generate> Generate for CachedGen<G> {
    type Error = G::Error;

    fn generate_chat(&mut self, requests: &[ChatRequest]) -> Result<Vec<ChatReply>, G::Error> {
        let keys: Vec<Option<String>> = requests
            .iter()
            .map(|r| (self.keyer)(self.actor, r))
            .collect();
        let mut replies: Vec<Option<ChatReply>> = keys
            .iter()
            .map(|k| k.as_deref().and_then(|k| self.cache.get(k)))
            .collect();
        // Counted once the call succeeds (a failed call is asked again request by request).
        let hits = replies.iter().filter(|r| r.is_some()).count();
        let missing: Vec<usize> = (0..requests.len())
            .filter(|&i| replies[i].is_none())
            .collect();
        if !missing.is_empty() {
            let batch: Vec<ChatRequest> = missing.iter().map(|&i| requests[i].clone()).collect();
            let fresh = self.inner.generate_chat(&batch)?;
            for (&i, reply) in missing.iter().zip(fresh) {
                if let Some(k) = &keys[i] {
                    self.store(k, &reply);
                }
                replies[i] = Some(reply);
            }
        }
        self.stats.hits.fetch_add(hits, Ordering::Relaxed);
        // A generator that returned fewer replies than asked leaves holes: return what there
        // is, and the runner reports the broken contract.
        Ok(replies.into_iter().flatten().collect())
    }

    /// A hit is answered at once; a miss is started on the model and stored as soon as it is
    /// finished (so a reply outlives the process that generated it, even one killed before
    /// logging it).
    fn start(&mut self, id: u64, request: &ChatRequest) -> Result<Option<ChatReply>, G::Error> {
        let key = (self.keyer)(self.actor, request);
        if let Some(reply) = key.as_deref().and_then(|k| self.cache.get(k)) {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(reply));
        }
        let reply = self.inner.start(id, request)?;
        match (key, &reply) {
            (Some(k), Some(r)) => self.store(&k, r),
            (Some(k), None) => {
                self.streamed.insert(id, k);
            }
            (None, _) => {}
        }
        Ok(reply)
    }

    fn poll(&mut self) -> Result<Vec<(u64, ChatReply)>, G::Error> {
        let finished = self.inner.poll()?;
        for (id, reply) in &finished {
            if let Some(k) = self.streamed.remove(id) {
                self.store(&k, reply);
            }
        }
        Ok(finished)
    }

    fn prefill_stats(&self) -> PrefillStats {
        self.inner.prefill_stats()
    }
}

impl<M: Models> Models for CachedModels<M> {
    type Gen = CachedGen<M::Gen>;

    fn load(&mut self, actor: Actor) -> Result<Self::Gen, BoxError> {
        Ok(CachedGen {
            inner: self.inner.load(actor)?,
            actor,
            cache: self.cache.clone(),
            keyer: Arc::clone(&self.keyer),
            stats: Arc::clone(&self.stats),
            streamed: HashMap::new(),
        })
    }

    fn same_model(&self, a: Actor, b: Actor) -> bool {
        self.inner.same_model(a, b)
    }

    fn is_request_error(&self, err: &<Self::Gen as Generate>::Error) -> bool {
        self.inner.is_request_error(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StopReason;
    use crate::store::testkit::FakeModels;
    use crate::text::message::{Message, Role};

    fn reply(text: &str) -> ChatReply {
        ChatReply {
            prompt_ids: vec![1, 2, 3],
            output_ids: vec![4, 5],
            text: text.into(),
            stop_reason: StopReason::Eos,
            reasoning: None,
        }
    }

    fn request(q: &str) -> ChatRequest {
        ChatRequest {
            messages: vec![Message::new(Role::User, q)],
            params: SamplingParams::default(),
            ..Default::default()
        }
    }

    #[test]
    fn keys_change_with_every_part() {
        let p = SamplingParams::default();
        let base = KeyParts {
            model_sha256: "m",
            options: "dtype=native",
            prompt: PromptKey::TokenIds(&[1, 2]),
            params: &p,
        };
        let k = base.key();
        assert_eq!(k.len(), 64);
        let other_ids = KeyParts {
            prompt: PromptKey::TokenIds(&[1, 3]),
            ..base
        };
        assert_ne!(other_ids.key(), k);
        let q = SamplingParams {
            seed: 1,
            ..SamplingParams::default()
        };
        let base = KeyParts {
            model_sha256: "m",
            options: "dtype=native",
            prompt: PromptKey::TokenIds(&[1, 2]),
            params: &q,
        };
        assert_ne!(base.key(), k);
    }

    #[test]
    fn corrupt_or_deleted_entries_are_misses_and_puts_recreate_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = GenCache::new(tmp.path().join("c"));
        let key = "ab".repeat(32);
        assert!(cache.get(&key).is_none());
        cache.put(&key, &reply("x")).unwrap();
        assert_eq!(cache.get(&key).unwrap().text, "x");
        std::fs::write(cache.path(&key), b"{\"key\": tr").unwrap();
        assert!(cache.get(&key).is_none());
        std::fs::remove_dir_all(tmp.path().join("c")).unwrap();
        assert!(cache.get(&key).is_none());
        cache.put(&key, &reply("y")).unwrap();
        assert_eq!(cache.get(&key).unwrap().text, "y");
    }

    #[test]
    fn concurrent_writers_of_one_cache_leave_only_whole_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = GenCache::new(tmp.path());
        let keys: Vec<String> = (0..20).map(|i| sha256_bytes(&[i as u8])).collect();
        std::thread::scope(|s| {
            for t in 0..4 {
                let (cache, keys) = (cache.clone(), &keys);
                s.spawn(move || {
                    for round in 0..10 {
                        for k in keys {
                            cache
                                .put(k, &reply(&format!("{k}:{}", "z".repeat(2000))))
                                .unwrap();
                            if let Some(r) = cache.get(k) {
                                assert!(r.text.starts_with(k.as_str()), "{t} {round}");
                            }
                        }
                    }
                });
            }
        });
        for k in &keys {
            assert!(cache.get(k).unwrap().text.starts_with(k.as_str()));
        }
        // No temporary files left behind.
        let mut files = 0;
        for d in std::fs::read_dir(tmp.path()).unwrap() {
            for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
                let name = f.unwrap().file_name().to_string_lossy().into_owned();
                assert!(name.ends_with(".json"), "{name}");
                files += 1;
            }
        }
        assert_eq!(files, keys.len());
    }

    #[test]
    fn streamed_misses_are_stored_as_they_finish_and_hits_answer_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = GenCache::new(tmp.path());
        let keyer: Keyer = Arc::new(|_, r| {
            let prompt = PromptKey::Messages(serde_json::to_string(&r.messages).ok()?);
            Some(
                KeyParts {
                    model_sha256: "m",
                    options: "",
                    prompt,
                    params: &r.params,
                }
                .key(),
            )
        });
        let fake = FakeModels::new(&["a"], "j");
        let mut m = CachedModels::new(fake, cache.clone(), Arc::clone(&keyer));
        let mut g = m.load(Actor::Candidate(0)).unwrap();
        let reqs: Vec<ChatRequest> = (0..6).map(|i| request(&i.to_string())).collect();
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!(g.start(i as u64, r).unwrap(), None);
        }
        let mut got = vec![None; reqs.len()];
        let mut left = reqs.len();
        while left > 0 {
            for (id, reply) in g.poll().unwrap() {
                // Stored the moment it is returned, before the others finish.
                let key = keyer(Actor::Candidate(0), &reqs[id as usize]).unwrap();
                assert_eq!(cache.get(&key).as_ref(), Some(&reply));
                got[id as usize] = Some(reply);
                left -= 1;
            }
        }
        assert!(g.poll().unwrap().is_empty());
        assert_eq!(m.stats.stored.load(Ordering::SeqCst), reqs.len());
        // Again: every request is answered by `start`, without the model.
        let mut again = m.load(Actor::Candidate(0)).unwrap();
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!(again.start(10 + i as u64, r).unwrap(), got[i]);
        }
        assert_eq!(m.stats.hits.load(Ordering::SeqCst), reqs.len());
    }

    #[test]
    fn cached_models_answer_hits_without_the_model_and_store_misses() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = GenCache::new(tmp.path());
        let keyer: Keyer = Arc::new(|a, r| {
            let prompt = PromptKey::Messages(serde_json::to_string(&r.messages).ok()?);
            let model = format!("{a:?}");
            Some(
                KeyParts {
                    model_sha256: &model,
                    options: "",
                    prompt,
                    params: &r.params,
                }
                .key(),
            )
        });
        let fake = FakeModels::new(&["a"], "j");
        let stats = Arc::clone(&fake.stats);
        let mut m = CachedModels::new(fake, cache.clone(), Arc::clone(&keyer));
        let mut g = m.load(Actor::Candidate(0)).unwrap();
        let first = g.generate_chat(&[request("1"), request("2")]).unwrap();
        let again = g
            .generate_chat(&[request("2"), request("3"), request("1")])
            .unwrap();
        assert_eq!(again[0], first[1]);
        assert_eq!(again[2], first[0]);
        // Three distinct prompts reached the model, once each.
        assert_eq!(stats.requests.load(Ordering::SeqCst), 3);
        assert_eq!(m.stats.hits.load(Ordering::SeqCst), 2);
        assert_eq!(m.stats.stored.load(Ordering::SeqCst), 3);
    }
}
