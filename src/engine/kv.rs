//! Per-sequence KV state in fixed-size blocks shared copy-on-write, so a sequence can be forked
//! from a shared prompt prefix without copying it.
//!
//! A [`SeqKv`] is a list of reference-counted blocks of [`BLOCK_TOKENS`] positions each, every
//! block holding all layers' keys and values for its positions. Forking clones the list (the
//! blocks are shared); the first write into a shared block copies that block only. A
//! [`KvStore`] keys sequences by [`SeqId`] for callers that keep prefixes between requests.
//!
//! A hybrid model's sequence also holds a fixed-size recurrent state (its linear-attention
//! layers' conv inputs and delta-rule matrices) at its current length: small next to the KV of
//! a long context, so a fork copies it whole. It cannot be rolled back: a sequence with a state
//! is only ever truncated to nothing. It lives where the blocks do: in host memory, or in the
//! device's memory beside its KV pool ([`DeviceState`]), copied to the host only for a
//! snapshot ([`SeqKv::state_snapshot`]) and back for a resume.
//! This module stores numbers; it does not know what a token or a request is.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::device::{DeviceBlock, DeviceState, KvPool};
use crate::model::kv::KvSeq;

/// Positions per block (the models' block size on every device).
pub const BLOCK_TOKENS: usize = crate::model::runner::KV_BLOCK_TOKENS;

/// The shape of one position's KV entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layer: usize,
    /// Key (and value) width per layer: KV heads times head dimension.
    pub kv_dim: usize,
}

impl KvLayout {
    /// The layout of `model`'s KV: its layers that store KV, each reserving the widest
    /// layer's width (Gemma 4's sliding and full layers differ; its KV-sharing layers store
    /// none).
    pub fn of(model: &crate::model::transformer::Transformer) -> KvLayout {
        KvLayout {
            n_layer: model.kv_layers(),
            kv_dim: model.kv_width(),
        }
    }

    fn block_len(&self) -> usize {
        self.n_layer * 2 * BLOCK_TOKENS * self.kv_dim
    }

    /// Offset of (layer, key or value, slot) inside a block.
    #[inline]
    fn offset(&self, layer: usize, is_value: bool, slot: usize) -> usize {
        ((layer * 2 + is_value as usize) * BLOCK_TOKENS + slot) * self.kv_dim
    }
}

/// Where a sequence's blocks live: host memory (the CPU forward pass), or a device's KV pool
/// (the forward pass on that device writes and reads them there).
#[derive(Debug, Clone, Default)]
pub enum KvStorage {
    #[default]
    Host,
    Device(KvPool),
}

impl KvStorage {
    /// Where `model`'s forward pass wants its KV: its device's pool, or host memory.
    pub fn for_model(model: &crate::model::runner::Model) -> KvStorage {
        model.kv_pool().map_or(KvStorage::Host, KvStorage::Device)
    }

    /// Blocks this storage can still hand out: `None` for host memory (unbounded).
    pub fn free_blocks(&self) -> Option<usize> {
        match self {
            KvStorage::Host => None,
            KvStorage::Device(pool) => Some(pool.free_blocks()),
        }
    }

    /// Bytes of one block of `layout` kept here.
    pub fn block_bytes(&self, layout: KvLayout) -> usize {
        match self {
            KvStorage::Host => Block::bytes(layout),
            KvStorage::Device(pool) => pool.block_bytes(),
        }
    }
}

/// One block of [`BLOCK_TOKENS`] positions, all layers' keys and values (opaque outside this
/// module; shared by reference counting). Cloning a device block copies it on the device.
#[derive(Debug, Clone)]
pub enum Block {
    Host(Vec<f32>),
    Device(DeviceBlock),
}

impl Block {
    /// Bytes of numbers held by one host block of `layout`.
    pub fn bytes(layout: KvLayout) -> usize {
        layout.block_len() * std::mem::size_of::<f32>()
    }

    fn host(&self) -> &[f32] {
        match self {
            Block::Host(data) => data,
            Block::Device(_) => unreachable!("host access to a device KV block"),
        }
    }
}

/// A sequence's recurrent state, where its blocks are (cloning a device state copies it on
/// the device).
#[derive(Debug, Clone)]
enum State {
    Host(Vec<f32>),
    Device(DeviceState),
}

impl State {
    /// A zero state of `len` floats in `storage` (`len` 0: none).
    // Without the `cuda` feature device states are uninhabited: that arm is dead code there.
    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code))]
    fn zeros(storage: &KvStorage, len: usize) -> State {
        match storage {
            KvStorage::Device(pool) if len > 0 => State::Device(pool.new_state(len)),
            _ => State::Host(vec![0.0; len]),
        }
    }

    /// The state `v` in `storage`.
    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code))]
    fn from_host(storage: &KvStorage, v: Vec<f32>) -> State {
        match storage {
            KvStorage::Device(pool) if !v.is_empty() => State::Device(pool.state_from(&v)),
            _ => State::Host(v),
        }
    }

    fn len(&self) -> usize {
        match self {
            State::Host(v) => v.len(),
            State::Device(d) => d.len(),
        }
    }
}

/// The KV state of one sequence.
#[derive(Debug, Clone)]
pub struct SeqKv {
    layout: KvLayout,
    storage: KvStorage,
    blocks: Vec<Arc<Block>>,
    len: usize,
    /// The recurrent state after `len` positions (empty for models without one).
    state: State,
}

impl SeqKv {
    /// An empty sequence in host memory.
    pub fn new(layout: KvLayout) -> SeqKv {
        SeqKv::new_in(layout, KvStorage::Host)
    }

    /// An empty sequence whose blocks will live in `storage`.
    pub fn new_in(layout: KvLayout, storage: KvStorage) -> SeqKv {
        SeqKv {
            layout,
            storage,
            blocks: Vec::new(),
            len: 0,
            state: State::Host(Vec::new()),
        }
    }

    /// The same empty sequence with a zero recurrent state of `len` floats (a hybrid
    /// model's `state_len`), kept where its blocks are.
    pub fn with_state(mut self, len: usize) -> SeqKv {
        self.state = State::zeros(&self.storage, len);
        self
    }

    /// Bytes of recurrent state this sequence holds.
    pub fn state_bytes(&self) -> usize {
        self.state.len() * std::mem::size_of::<f32>()
    }

    /// A host copy of the recurrent state after `len` positions (read back from the device
    /// when it is kept there): the prefix cache's snapshot. Empty without one.
    pub fn state_snapshot(&self) -> Vec<f32> {
        let mut out = Vec::new();
        self.state_snapshot_into(&mut out);
        out
    }

    /// [`SeqKv::state_snapshot`] into `out`, reusing its allocation where the state is the
    /// host's (the scheduler keeps one per sequence and refreshes it every block of a reply).
    pub fn state_snapshot_into(&self, out: &mut Vec<f32>) {
        match &self.state {
            State::Host(v) => {
                out.clear();
                out.extend_from_slice(v);
            }
            State::Device(d) => *out = d.to_host(),
        }
    }

    /// A sequence made of whole, already written blocks (`blocks.len() * BLOCK_TOKENS`
    /// positions) kept in `storage`, shared with whoever else holds them.
    pub fn from_blocks(layout: KvLayout, storage: KvStorage, blocks: Vec<Arc<Block>>) -> SeqKv {
        SeqKv {
            layout,
            storage,
            len: blocks.len() * BLOCK_TOKENS,
            blocks,
            state: State::Host(Vec::new()),
        }
    }

    /// [`SeqKv::from_blocks`] with the recurrent state at exactly the blocks' last position
    /// (uploaded when the blocks are a device's).
    pub fn from_blocks_with_state(
        layout: KvLayout,
        storage: KvStorage,
        blocks: Vec<Arc<Block>>,
        state: Vec<f32>,
    ) -> SeqKv {
        SeqKv {
            state: State::from_host(&storage, state),
            ..SeqKv::from_blocks(layout, storage, blocks)
        }
    }

    /// The `i`-th block, shared, if all its positions are written.
    pub fn full_block(&self, i: usize) -> Option<Arc<Block>> {
        if (i + 1) * BLOCK_TOKENS <= self.len {
            self.blocks.get(i).cloned()
        } else {
            None
        }
    }

    /// A new sequence sharing this one's positions; both may grow independently afterwards.
    pub fn fork(&self) -> SeqKv {
        self.clone()
    }

    /// Forgets positions from `len` on (keeps the blocks that still hold earlier positions).
    ///
    /// # Panics
    /// When a sequence with a recurrent state is cut to a length other than 0: the state
    /// of an earlier position is gone (callers refuse what would need it, such as drafts).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len && self.state.len() > 0 {
            assert_eq!(
                len, 0,
                "a recurrent state cannot be rolled back to position {len}"
            );
            match &mut self.state {
                State::Host(v) => v.fill(0.0),
                State::Device(d) => d.zero(),
            }
        }
        if len < self.len {
            self.len = len;
            self.blocks.truncate(len.div_ceil(BLOCK_TOKENS));
        }
    }

    /// Number of blocks this sequence shares with another sequence.
    pub fn shared_blocks(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| Arc::strong_count(b) > 1)
            .count()
    }

    /// Blocks that growing by `n` positions takes from the storage: new blocks, and on a
    /// device the copies of shared blocks it will write (copy-on-write), as [`KvSeq::grow`]
    /// allocates them.
    pub fn blocks_to_grow(&self, n: usize) -> usize {
        let needed = (self.len + n).div_ceil(BLOCK_TOKENS);
        let new = needed.saturating_sub(self.blocks.len());
        let copies = match self.storage {
            KvStorage::Host => 0,
            KvStorage::Device(_) => self.blocks[(self.len / BLOCK_TOKENS).min(self.blocks.len())..]
                .iter()
                .take(needed)
                .filter(|b| Arc::strong_count(b) > 1)
                .count(),
        };
        new + copies
    }

    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    pub fn storage(&self) -> &KvStorage {
        &self.storage
    }
}

impl KvSeq for SeqKv {
    fn len(&self) -> usize {
        self.len
    }

    // Without the `cuda` feature device blocks are uninhabited: that arm is dead code there.
    #[cfg_attr(not(feature = "cuda"), allow(unreachable_code))]
    fn grow(&mut self, n: usize) {
        let from = self.len;
        self.len += n;
        let needed = self.len.div_ceil(BLOCK_TOKENS);
        let block_len = self.layout.block_len();
        while self.blocks.len() < needed {
            self.blocks.push(Arc::new(match &self.storage {
                KvStorage::Host => Block::Host(vec![0.0; block_len]),
                KvStorage::Device(pool) => Block::Device(pool.alloc()),
            }));
        }
        // A device writes the new positions itself: blocks it will write that are shared with
        // a fork are copied now (host blocks are copied in `write`).
        if let KvStorage::Device(_) = self.storage {
            for b in &mut self.blocks[from / BLOCK_TOKENS..needed] {
                Arc::make_mut(b);
            }
        }
    }

    fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        let l = self.layout;
        // Copy-on-write: a block shared with a fork is copied before its first change.
        let Block::Host(data) = Arc::make_mut(&mut self.blocks[pos / BLOCK_TOKENS]) else {
            unreachable!("host write to a device KV block")
        };
        let slot = pos % BLOCK_TOKENS;
        // A layer narrower than the layout's width fills the start of its entry.
        debug_assert!(key.len() <= l.kv_dim && value.len() <= l.kv_dim);
        let k = l.offset(layer, false, slot);
        data[k..k + key.len()].copy_from_slice(key);
        let v = l.offset(layer, true, slot);
        data[v..v + value.len()].copy_from_slice(value);
    }

    #[inline]
    fn key(&self, layer: usize, pos: usize) -> &[f32] {
        let l = &self.layout;
        let o = l.offset(layer, false, pos % BLOCK_TOKENS);
        &self.blocks[pos / BLOCK_TOKENS].host()[o..o + l.kv_dim]
    }

    #[inline]
    fn value(&self, layer: usize, pos: usize) -> &[f32] {
        let l = &self.layout;
        let o = l.offset(layer, true, pos % BLOCK_TOKENS);
        &self.blocks[pos / BLOCK_TOKENS].host()[o..o + l.kv_dim]
    }

    fn device_blocks(&self, out: &mut Vec<u32>) {
        out.extend(self.blocks.iter().filter_map(|b| match &**b {
            Block::Device(d) => Some(d.slot()),
            Block::Host(_) => None,
        }));
    }

    // A device state is read and written by the device's forward pass (`device_state`).
    fn state(&self) -> &[f32] {
        match &self.state {
            State::Host(v) => v,
            State::Device(_) => &[],
        }
    }

    fn state_mut(&mut self) -> &mut [f32] {
        match &mut self.state {
            State::Host(v) => v,
            State::Device(_) => &mut [],
        }
    }

    fn device_state(&self) -> Option<u64> {
        match &self.state {
            State::Host(_) => None,
            State::Device(d) => Some(d.addr()),
        }
    }
}

/// A handle to a sequence kept in a [`KvStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Sequences kept between requests (shared prompt prefixes), keyed by id.
#[derive(Debug, Default)]
pub struct KvStore {
    seqs: HashMap<SeqId, SeqKv>,
    next: u64,
}

impl KvStore {
    /// Stores a sequence and returns its id.
    pub fn insert(&mut self, kv: SeqKv) -> SeqId {
        let id = SeqId(self.next);
        self.next += 1;
        self.seqs.insert(id, kv);
        id
    }

    pub fn get(&self, id: SeqId) -> Option<&SeqKv> {
        self.seqs.get(&id)
    }

    /// A new sequence sharing `id`'s positions, or `None` for an unknown id.
    pub fn fork(&mut self, id: SeqId) -> Option<SeqId> {
        let kv = self.seqs.get(&id)?.fork();
        Some(self.insert(kv))
    }

    /// Drops a sequence; its blocks are freed once no fork uses them.
    pub fn remove(&mut self, id: SeqId) -> Option<SeqKv> {
        self.seqs.remove(&id)
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: KvLayout = KvLayout {
        n_layer: 2,
        kv_dim: 3,
    };

    fn fill(kv: &mut SeqKv, from: usize, to: usize, tag: f32) {
        kv.grow(to - from);
        for p in from..to {
            for layer in 0..L.n_layer {
                let k = [p as f32, layer as f32, tag];
                let v = [-(p as f32), layer as f32, tag];
                kv.write(layer, p, &k, &v);
            }
        }
    }

    #[test]
    fn stores_and_reads_back_across_blocks() {
        let mut kv = SeqKv::new(L);
        fill(&mut kv, 0, 40, 1.0);
        assert_eq!(kv.len(), 40);
        assert_eq!(kv.key(1, 33), &[33.0, 1.0, 1.0]);
        assert_eq!(kv.value(0, 17), &[-17.0, 0.0, 1.0]);
    }

    #[test]
    fn fork_shares_blocks_and_copies_on_write() {
        let mut a = SeqKv::new(L);
        fill(&mut a, 0, 20, 1.0);
        let mut b = a.fork();
        assert_eq!(b.shared_blocks(), 2);
        // b writes into the partly filled second block: that block alone is copied.
        fill(&mut b, 20, 22, 2.0);
        assert_eq!(b.shared_blocks(), 1);
        assert_eq!(a.len(), 20);
        assert_eq!(b.key(0, 21), &[21.0, 0.0, 2.0]);
        // a's own continuation does not see b's positions.
        fill(&mut a, 20, 22, 3.0);
        assert_eq!(a.key(0, 21), &[21.0, 0.0, 3.0]);
        assert_eq!(b.key(0, 21), &[21.0, 0.0, 2.0]);
        assert_eq!(a.key(1, 5), b.key(1, 5));
    }

    #[test]
    fn truncate_then_regrow() {
        let mut a = SeqKv::new(L);
        fill(&mut a, 0, 35, 1.0);
        a.truncate(16);
        assert_eq!(a.len(), 16);
        fill(&mut a, 16, 18, 4.0);
        assert_eq!(a.key(0, 17), &[17.0, 0.0, 4.0]);
    }

    #[test]
    fn blocks_to_grow_counts_new_blocks() {
        let mut a = SeqKv::new(L);
        assert_eq!(a.blocks_to_grow(0), 0);
        assert_eq!(a.blocks_to_grow(1), 1);
        assert_eq!(a.blocks_to_grow(BLOCK_TOKENS + 1), 2);
        fill(&mut a, 0, 20, 1.0);
        assert_eq!(a.blocks_to_grow(12), 0);
        assert_eq!(a.blocks_to_grow(13), 1);
        // Host blocks are copied on write, not on growth: a fork takes no block to grow.
        let b = a.fork();
        assert_eq!(b.blocks_to_grow(1), 0);
        assert_eq!(KvStorage::Host.free_blocks(), None);
    }

    /// A fork copies the recurrent state: each side updates its own.
    #[test]
    fn fork_copies_the_recurrent_state() {
        let mut a = SeqKv::new(L).with_state(4);
        fill(&mut a, 0, 3, 1.0);
        a.state_mut().copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let mut b = a.fork();
        b.state_mut()[0] = 9.0;
        assert_eq!(a.state(), [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(b.state(), [9.0, 2.0, 3.0, 4.0]);
        assert_eq!(b.state_bytes(), 16);
        assert!(SeqKv::new(L).state().is_empty());
        b.truncate(0);
        assert_eq!(b.state(), [0.0; 4]);
    }

    #[test]
    #[should_panic(expected = "cannot be rolled back")]
    fn a_recurrent_state_is_not_rolled_back() {
        let mut a = SeqKv::new(L).with_state(4);
        fill(&mut a, 0, 3, 1.0);
        a.truncate(2);
    }

    #[test]
    fn store_forks_by_id() {
        let mut s = KvStore::default();
        let mut kv = SeqKv::new(L);
        fill(&mut kv, 0, 3, 1.0);
        let a = s.insert(kv);
        let b = s.fork(a).expect("known id");
        assert_ne!(a, b);
        assert_eq!(s.get(b).map(|k| k.len()), Some(3));
        assert!(s.remove(a).is_some());
        assert!(s.fork(a).is_none());
        assert_eq!(s.len(), 1);
    }
}
