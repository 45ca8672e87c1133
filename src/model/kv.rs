//! The contract between the forward pass and its caller (the engine): a sequence's KV state
//! and, for hybrid models, its fixed-size recurrent state as the pass sees them ([`KvSeq`]), and one sequence's share of a step ([`SeqStep`]) with the
//! logits it wants back ([`Logits`]). The KV memory itself belongs to the engine.

/// The KV state of one sequence as the forward pass sees it: `len` positions already stored,
/// room made for more with [`KvSeq::grow`]. Keys and values are `kv_dim` wide per layer and
/// position.
pub trait KvSeq: Sync {
    /// Positions stored so far.
    fn len(&self) -> usize;
    /// Whether nothing is stored yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Extends the sequence by `n` positions, to be filled by [`KvSeq::write`].
    fn grow(&mut self, n: usize);
    /// Stores one position's key and value for one layer.
    fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]);
    /// The key stored at `pos` for `layer` (`kv_dim` values).
    fn key(&self, layer: usize, pos: usize) -> &[f32];
    /// The value stored at `pos` for `layer` (`kv_dim` values).
    fn value(&self, layer: usize, pos: usize) -> &[f32];
    /// For KV kept in a device's memory: appends the pool slots of the blocks holding this
    /// sequence's positions, in order. Host KV has no slots and appends nothing (a device
    /// forward pass refuses a sequence whose slots do not cover its positions).
    fn device_blocks(&self, _out: &mut Vec<u32>) {}
    /// The sequence's recurrent state after its `len` positions (hybrid models' conv inputs and
    /// delta-rule matrices, `Transformer::state_len` floats, zero before the first position);
    /// empty for models without one. A step updates it in place as it stores positions.
    fn state(&self) -> &[f32] {
        &[]
    }
    /// The recurrent state, to update.
    fn state_mut(&mut self) -> &mut [f32] {
        &mut []
    }
    /// For a recurrent state kept in a device's memory: its device address (the state the
    /// device's forward pass updates in place; [`KvSeq::state`] is then empty). Host state
    /// has none (a device forward pass refuses a hybrid model's sequence without one).
    fn device_state(&self) -> Option<u64> {
        None
    }
}

/// Which logits a sequence wants back from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    None,
    /// Only for its last new token (sampling the next one).
    Last,
    /// For every new token (teacher forcing, scoring).
    All,
}

/// One sequence's share of a forward step.
pub struct SeqStep<'a, K: KvSeq> {
    pub tokens: &'a [u32],
    pub kv: &'a mut K,
    pub logits: Logits,
}
