//! The prefix cache: KV blocks of token sequences already computed, keyed by their token ids,
//! so that a prompt extending them (the previous turn's prompt and reply, a shared prompt
//! prefix, a system prompt common to many requests) forks those blocks and prefills only the
//! rest.
//!
//! Entries are whole [`BLOCK_TOKENS`]-position blocks arranged as a trie: an entry is keyed by
//! its parent entry and its own 16 token ids, so a match is exact (no hashing of prefixes) and
//! always a block-aligned prefix. The cache holds at most a byte budget of blocks and evicts
//! the least recently used entry without children first. Because a position's keys and values
//! depend only on the tokens up to it (rows are computed independently, whatever the chunking
//! or the batch), a reused block holds exactly the numbers a fresh prefill would write: reuse
//! changes the work, never a result.
//!
//! A hybrid model's sequence also needs its recurrent state at the position it resumes from,
//! and a state cannot be rebuilt from KV blocks. So for such models an entry may carry a
//! snapshot of the state after its block (taken when a stored sequence ends exactly there),
//! and a lookup resumes only from the deepest matching entry that has one: never from a
//! prefix whose state it does not hold. Each snapshot counts against the byte budget. The
//! scheduler pauses such a sequence's prefill where a snapshot pays ([`snapshot_points`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::kv::{Block, KvLayout, KvStorage, SeqKv, BLOCK_TOKENS};

type Key = (u64, [u32; BLOCK_TOKENS]);

#[derive(Debug)]
struct Entry {
    block: Arc<Block>,
    key: Key,
    stamp: u64,
    children: usize,
    /// The recurrent state after this block's last position (hybrid models).
    state: Option<Arc<Vec<f32>>>,
}

/// Prompt tokens prefilled and taken from the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrefillStats {
    /// Prompt positions computed by forward passes.
    pub computed: u64,
    /// Prompt positions whose KV came from the prefix cache.
    pub reused: u64,
}

impl PrefillStats {
    pub fn add(&mut self, other: PrefillStats) {
        self.computed += other.computed;
        self.reused += other.reused;
    }
}

/// KV blocks of computed token prefixes, bounded by a byte budget (0 disables the cache).
#[derive(Debug)]
pub struct PrefixCache {
    layout: KvLayout,
    storage: KvStorage,
    max_blocks: usize,
    /// Entry ids start at 1; 0 is the root (the empty prefix).
    entries: HashMap<u64, Entry>,
    index: HashMap<Key, u64>,
    /// (last use, id), oldest first.
    lru: BTreeSet<(u64, u64)>,
    clock: u64,
    next_id: u64,
    /// Floats of a sequence's recurrent state (0: none, every cached prefix resumes).
    state_len: usize,
    /// Entries holding a state snapshot, and the blocks' worth of budget each one costs.
    snapshots: usize,
    snapshot_blocks: usize,
}

impl PrefixCache {
    /// A cache of blocks kept in `storage`, holding at most `budget_bytes` of them.
    pub fn new(layout: KvLayout, storage: KvStorage, budget_bytes: usize) -> PrefixCache {
        PrefixCache {
            layout,
            max_blocks: budget_bytes / storage.block_bytes(layout).max(1),
            storage,
            entries: HashMap::new(),
            index: HashMap::new(),
            lru: BTreeSet::new(),
            clock: 0,
            next_id: 1,
            state_len: 0,
            snapshots: 0,
            snapshot_blocks: 0,
        }
    }

    /// The same cache for sequences with a recurrent state of `len` floats: prefixes resume
    /// only where a snapshot of that state is held.
    pub fn with_state(mut self, len: usize) -> PrefixCache {
        self.state_len = len;
        let block = self.storage.block_bytes(self.layout).max(1);
        self.snapshot_blocks = (len * std::mem::size_of::<f32>()).div_ceil(block);
        self
    }

    /// Blocks' worth of budget in use: the blocks and the state snapshots.
    fn held(&self) -> usize {
        self.entries.len() + self.snapshots * self.snapshot_blocks
    }

    pub fn enabled(&self) -> bool {
        self.max_blocks > 0
    }

    /// Blocks held now.
    pub fn blocks(&self) -> usize {
        self.entries.len()
    }

    fn chunk(ids: &[u32], k: usize) -> [u32; BLOCK_TOKENS] {
        let mut c = [0u32; BLOCK_TOKENS];
        c.copy_from_slice(&ids[k * BLOCK_TOKENS..(k + 1) * BLOCK_TOKENS]);
        c
    }

    fn touch(&mut self, id: u64) {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(&id) {
            self.lru.remove(&(e.stamp, id));
            e.stamp = self.clock;
            self.lru.insert((e.stamp, id));
        }
    }

    /// The longest cached block-aligned prefix of `ids` that leaves at least one token of
    /// `ids` to feed (its logits are needed), as a sequence sharing the cached blocks.
    pub fn lookup(&mut self, ids: &[u32]) -> SeqKv {
        self.lookup_matched(ids).0
    }

    /// [`PrefixCache::lookup`], and the positions of `ids` whose blocks the cache holds (for a
    /// model with a recurrent state, possibly more than the sequence resumes from: those
    /// past the deepest snapshot, a prefix shared with an earlier prompt).
    pub fn lookup_matched(&mut self, ids: &[u32]) -> (SeqKv, usize) {
        let mut blocks = Vec::new();
        // With a recurrent state: the blocks up to the deepest snapshot, and that snapshot.
        let mut resume = (0, None);
        if self.enabled() {
            let usable = ids.len().saturating_sub(1) / BLOCK_TOKENS;
            let mut parent = 0;
            for k in 0..usable {
                let Some(&id) = self.index.get(&(parent, Self::chunk(ids, k))) else {
                    break;
                };
                self.touch(id);
                let e = &self.entries[&id];
                blocks.push(Arc::clone(&e.block));
                if let Some(st) = &e.state {
                    resume = (blocks.len(), Some(Arc::clone(st)));
                }
                parent = id;
            }
        }
        let matched = blocks.len() * BLOCK_TOKENS;
        if self.state_len == 0 {
            return (
                SeqKv::from_blocks(self.layout, self.storage.clone(), blocks),
                matched,
            );
        }
        let kv = match resume {
            (n, Some(state)) => {
                blocks.truncate(n);
                SeqKv::from_blocks_with_state(
                    self.layout,
                    self.storage.clone(),
                    blocks,
                    state.as_ref().clone(),
                )
            }
            (_, None) => {
                SeqKv::new_in(self.layout, self.storage.clone()).with_state(self.state_len)
            }
        };
        (kv, matched)
    }

    /// Records the full blocks of `kv`, whose positions hold `ids` (at least `kv.len()` of
    /// them), evicting the least recently used entries beyond the budget; with a recurrent
    /// state, a snapshot of `kv`'s state when it ends on a block boundary.
    pub fn insert(&mut self, ids: &[u32], kv: &SeqKv) {
        let len = crate::model::kv::KvSeq::len(kv);
        // The state is copied (read back from a device) only where a snapshot can be taken.
        let snapshot = self.enabled() && self.state_len > 0 && len.is_multiple_of(BLOCK_TOKENS);
        let state = if snapshot {
            kv.state_snapshot()
        } else {
            Vec::new()
        };
        self.insert_with_state(ids, kv, len, &state);
    }

    /// [`PrefixCache::insert`] with `state`, the sequence's recurrent state after its first
    /// `at` positions (a block boundary), as the snapshot.
    pub fn insert_with_state(&mut self, ids: &[u32], kv: &SeqKv, at: usize, state: &[f32]) {
        if !self.enabled() {
            return;
        }
        let n = ids.len().min(crate::model::kv::KvSeq::len(kv)) / BLOCK_TOKENS;
        let mut parent = 0;
        let mut path = Vec::with_capacity(n);
        for k in 0..n {
            let key = (parent, Self::chunk(ids, k));
            let id = match self.index.get(&key) {
                Some(&id) => id,
                None => {
                    let Some(block) = kv.full_block(k) else { break };
                    let id = self.next_id;
                    self.next_id += 1;
                    if let Some(p) = self.entries.get_mut(&parent) {
                        p.children += 1;
                    }
                    self.index.insert(key, id);
                    self.entries.insert(
                        id,
                        Entry {
                            block,
                            key,
                            stamp: 0,
                            children: 0,
                            state: None,
                        },
                    );
                    self.lru.insert((0, id));
                    id
                }
            };
            self.touch(id);
            path.push(id);
            parent = id;
            // The snapshot for the entry ending exactly where it was taken.
            if self.state_len > 0 && (k + 1) * BLOCK_TOKENS == at && state.len() == self.state_len {
                let e = self.entries.get_mut(&id).expect("entry just found");
                if e.state.is_none() {
                    e.state = Some(Arc::new(state.to_vec()));
                    self.snapshots += 1;
                }
            }
        }
        self.evict(&path);
    }

    /// Drops least recently used childless entries until at most `blocks` are held (when a
    /// device's KV pool runs short, the scheduler gives cached prefixes back before it makes
    /// requests wait). A block still shared with a running sequence stays in use there.
    pub fn shrink_to(&mut self, blocks: usize) {
        let max = self.max_blocks;
        self.max_blocks = blocks.min(max);
        self.evict(&[]);
        self.max_blocks = max;
    }

    /// Drops least recently used childless entries until the budget holds, sparing `keep`
    /// (the path just inserted) unless nothing else is left.
    fn evict(&mut self, keep: &[u64]) {
        while self.held() > self.max_blocks {
            let victim = self
                .lru
                .iter()
                .map(|&(_, id)| id)
                .find(|id| self.entries[id].children == 0 && !keep.contains(id))
                .or_else(|| {
                    self.lru
                        .iter()
                        .map(|&(_, id)| id)
                        .find(|id| self.entries[id].children == 0)
                });
            let Some(id) = victim else { break };
            let e = self.entries.remove(&id).expect("listed entry");
            if e.state.is_some() {
                self.snapshots -= 1;
            }
            self.lru.remove(&(e.stamp, id));
            self.index.remove(&e.key);
            if let Some(p) = self.entries.get_mut(&e.key.0) {
                p.children -= 1;
            }
        }
    }
}

/// A model with a recurrent state snapshots it every this many absolute positions of a cached
/// prompt (a multiple of [`BLOCK_TOKENS`]), so a long prompt shared in part resumes at most
/// this many positions before the difference.
pub const SNAPSHOT_EVERY: usize = 256;

/// Where a prompt `later` resumes once `prompt` is in the cache (a model without a recurrent
/// state, or one holding a snapshot there): the block-aligned end of the two prompts' common
/// prefix, leaving `later` at least one token to feed ([`PrefixCache::lookup`]'s rule).
pub fn resume_point(prompt: &[u32], later: &[u32]) -> usize {
    let common = prompt
        .chunks(BLOCK_TOKENS)
        .zip(later.chunks(BLOCK_TOKENS))
        .take_while(|(a, b)| a == b)
        .count();
    (common * BLOCK_TOKENS).min(later.len().saturating_sub(1)) / BLOCK_TOKENS * BLOCK_TOKENS
}

/// The positions after which a cached prompt of `prompt_len` tokens, resuming from position
/// `resume` with `matched` positions of it found in the cache, pauses its prefill for a
/// snapshot of its recurrent state (a model with one; ascending, each block-aligned, in
/// `resume + 1 .. prompt_len`):
/// - every [`SNAPSHOT_EVERY`] absolute positions;
/// - the end of the part shared with an earlier prompt (`matched`), where the next prompt
///   sharing it branches off too (the judge chains' branches, a dataset's common instructions);
/// - `known`: where each other prompt the engine already holds (queued or running) resumes
///   from this one ([`resume_point`]), so that one finds a snapshot exactly where a model
///   without a state would resume it;
/// - the prompt's last block boundary, where its next turn (prompt, reply, new message)
///   resumes (a block-aligned prompt is snapshotted at its end when it is computed).
///
/// Where a sequence's prefill pauses changes no bit: a row's numbers do not depend on how the
/// prompt is split (`tests/it/hybrid.rs`).
pub fn snapshot_points(
    resume: usize,
    matched: usize,
    prompt_len: usize,
    known: impl IntoIterator<Item = usize>,
) -> Vec<usize> {
    let last_block = prompt_len / BLOCK_TOKENS * BLOCK_TOKENS;
    let mut at: Vec<usize> = (resume / SNAPSHOT_EVERY + 1..)
        .map(|k| k * SNAPSHOT_EVERY)
        .take_while(|&p| p < prompt_len)
        .chain([matched, last_block])
        .chain(known)
        .filter(|&p| p > resume && p < prompt_len)
        .collect();
    at.sort_unstable();
    at.dedup();
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv::KvSeq;

    #[test]
    fn snapshot_points_are_every_256_positions_the_shared_end_and_the_last_block() {
        // A 600-token prompt from scratch, nothing shared: 256, 512, and 592 (its last block).
        assert_eq!(snapshot_points(0, 0, 600, []), [256, 512, 592]);
        // Resuming at 256 with 320 positions shared: 320 (the shared end), 512, 592.
        assert_eq!(snapshot_points(256, 320, 600, []), [320, 512, 592]);
        // Where other known prompts resume from it, once each, within the prompt.
        assert_eq!(
            snapshot_points(256, 320, 600, [48, 400, 512, 400, 600]),
            [320, 400, 512, 592]
        );
        // A block-aligned prompt needs no last-block pause (it is snapshotted at its end), and
        // no point is at or before the resume point or at the prompt's end.
        assert_eq!(snapshot_points(0, 0, 512, []), [256]);
        assert_eq!(snapshot_points(496, 496, 512, []), Vec::<usize>::new());
        assert_eq!(snapshot_points(0, 16, 17, []), [16]);
        assert_eq!(snapshot_points(0, 0, 16, []), Vec::<usize>::new());
    }

    #[test]
    fn a_later_prompt_resumes_at_the_last_whole_block_it_shares() {
        let a = ids(100, 1);
        // 40 tokens shared: two whole blocks.
        let mut b = a[..40].to_vec();
        b.extend(ids(30, 2));
        assert_eq!(resume_point(&a, &b), 32);
        // A prefix of `a` keeps a token to feed: 48 tokens resume at 32, 49 at 48.
        assert_eq!(resume_point(&a, &a[..48]), 32);
        assert_eq!(resume_point(&a, &a[..49]), 48);
        // An extension of a 40-token prompt: its two whole blocks (the third is partial).
        let mut c = a[..40].to_vec();
        c.push(7);
        assert_eq!(resume_point(&a[..40], &c), 32);
        assert_eq!(resume_point(&a, &ids(100, 2)), 0);
        // The same positions a dense model's cache lookup gives.
        let mut dense = PrefixCache::new(L, KvStorage::Host, 1 << 20);
        dense.insert(&a, &seq(&a));
        for later in [&b[..], &a[..48], &a[..49], &c[..]] {
            assert_eq!(dense.lookup(later).len(), resume_point(&a, later));
        }
    }

    const L: KvLayout = KvLayout {
        n_layer: 1,
        kv_dim: 2,
    };

    /// A sequence holding `ids` with a value derived from each (token, position).
    fn seq(ids: &[u32]) -> SeqKv {
        let mut kv = SeqKv::new(L);
        kv.grow(ids.len());
        for (p, &t) in ids.iter().enumerate() {
            kv.write(0, p, &[t as f32, p as f32], &[-(t as f32), p as f32]);
        }
        kv
    }

    impl SeqKv {
        /// This sequence with a recurrent state of 3 floats, each `tag`.
        fn with_state_of(self, tag: f32) -> SeqKv {
            let len = self.len();
            let blocks = (0..len / BLOCK_TOKENS)
                .map(|i| self.full_block(i).expect("full"))
                .collect();
            let mut kv = SeqKv::from_blocks_with_state(L, KvStorage::Host, blocks, vec![tag; 3]);
            kv.grow(len % BLOCK_TOKENS);
            for p in len / BLOCK_TOKENS * BLOCK_TOKENS..len {
                kv.write(0, p, self.key(0, p), self.value(0, p));
            }
            kv
        }
    }

    fn ids(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn reuses_whole_blocks_of_a_matching_prefix_and_leaves_a_token_to_feed() {
        let mut c = PrefixCache::new(L, KvStorage::Host, 1 << 20);
        let a = ids(40, 1);
        c.insert(&a, &seq(&a));
        assert_eq!(c.blocks(), 2);
        // An extension of `a` gets its two full blocks.
        let mut b = a.clone();
        b.extend([5, 6, 7]);
        let kv = c.lookup(&b);
        assert_eq!(kv.len(), 32);
        assert_eq!(kv.key(0, 31), &[a[31] as f32, 31.0]);
        // Exactly 32 tokens: the last one must be fed, so only one block is reused.
        assert_eq!(c.lookup(&a[..32]).len(), 16);
        // A difference inside the second block stops the match after the first.
        let mut d = a.clone();
        d[20] = 999;
        assert_eq!(c.lookup(&d).len(), 16);
        // A different first block matches nothing.
        assert_eq!(c.lookup(&ids(40, 2)).len(), 0);
    }

    /// With a recurrent state, a prefix resumes only where the cache holds the state at
    /// exactly that position: a stored sequence ending inside a block gives nothing to resume
    /// from; one ending on a block boundary gives its blocks and its state, and a longer
    /// match stops at that snapshot.
    #[test]
    fn a_recurrent_model_resumes_only_at_a_snapshot_of_its_state() {
        let mut c = PrefixCache::new(L, KvStorage::Host, 1 << 20).with_state(3);
        let stored = |ids: &[u32], tag: f32| {
            let mut kv = seq(ids).with_state_of(tag);
            kv.grow(0);
            kv
        };
        let a = ids(40, 1);
        c.insert(&a, &stored(&a, 1.0));
        assert_eq!(c.blocks(), 2);
        let mut longer = a.clone();
        longer.push(3);
        let kv = c.lookup(&longer);
        assert_eq!(
            (kv.len(), kv.state()),
            (0, &[0.0; 3][..]),
            "no snapshot: fresh"
        );
        c.insert(&a[..32], &stored(&a[..32], 2.0));
        let kv = c.lookup(&longer);
        assert_eq!((kv.len(), kv.state()), (32, &[2.0; 3][..]));
        // A prompt sharing only the first block has no state there: fresh again.
        let mut d = a.clone();
        d[20] = 999;
        assert_eq!(c.lookup(&d).len(), 0);
        // Without a state every matching block is reused.
        let mut plain = PrefixCache::new(L, KvStorage::Host, 1 << 20);
        plain.insert(&a, &seq(&a));
        assert_eq!(plain.lookup(&d).len(), 16);
    }

    #[test]
    fn a_budget_of_zero_disables_it() {
        let mut c = PrefixCache::new(L, KvStorage::Host, 0);
        let a = ids(40, 1);
        c.insert(&a, &seq(&a));
        assert!(!c.enabled());
        assert_eq!(c.blocks(), 0);
        assert_eq!(c.lookup(&a).len(), 0);
    }

    #[test]
    fn evicts_least_recently_used_leaves_within_the_budget() {
        let three = 3 * Block::bytes(L);
        let mut c = PrefixCache::new(L, KvStorage::Host, three);
        let (a, b) = (ids(32, 1), ids(32, 2));
        c.insert(&a, &seq(&a));
        c.insert(&b, &seq(&b));
        // Four blocks asked, three allowed: a's leaf (oldest childless) went first.
        assert_eq!(c.blocks(), 3);
        assert_eq!(c.lookup(&ids(33, 1)).len(), 16);
        assert_eq!(c.lookup(&ids(33, 2)).len(), 32);
        // Using a's root block again makes b's leaf the oldest leaf.
        c.lookup(&ids(33, 1));
        let e = ids(17, 3);
        c.insert(&e, &seq(&e));
        assert_eq!(c.blocks(), 3);
        assert_eq!(c.lookup(&ids(33, 2)).len(), 16);
        assert_eq!(c.lookup(&ids(33, 1)).len(), 16);
        assert_eq!(c.lookup(&ids(18, 3)).len(), 16);
    }

    #[test]
    fn shared_blocks_are_copied_on_write_by_the_borrower() {
        let mut c = PrefixCache::new(L, KvStorage::Host, 1 << 20);
        let a = ids(16, 1);
        c.insert(&a, &seq(&a));
        let mut kv = c.lookup(&ids(20, 1));
        assert_eq!(kv.shared_blocks(), 1);
        kv.truncate(8);
        kv.grow(1);
        kv.write(0, 8, &[0.5, 0.5], &[0.5, 0.5]);
        // The cached block is untouched.
        assert_eq!(c.lookup(&ids(20, 1)).key(0, 8), &[(8 * 7 + 1) as f32, 8.0]);
    }
}
