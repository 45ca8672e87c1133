//! Which share of a run's items one process takes (`--shard I/N`), as the manifest records it;
//! splitting and merging runs is [`crate::store::shard`]'s.

use serde::{Deserialize, Serialize};

/// One shard of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// 0-based, below `count`.
    pub index: usize,
    pub count: usize,
    /// The `candor run` arguments without `--out` and `--shard` (what `candor merge` runs).
    #[serde(default)]
    pub args: Vec<String>,
}

/// A `--shard` value that is not `I/N` with `0 <= I < N`.
#[derive(Debug, thiserror::Error)]
#[error("--shard {0:?}: expected I/N with 0 <= I < N, e.g. 0/4")]
pub struct BadShard(pub String);

impl Shard {
    /// Parses `I/N`.
    pub fn parse(s: &str) -> Result<Shard, BadShard> {
        let bad = || BadShard(s.to_string());
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard {
            index,
            count,
            args: Vec::new(),
        })
    }

    /// Whether the item at `position` of the run's item list is this shard's.
    pub fn owns(&self, position: usize) -> bool {
        position % self.count == self.index
    }

    /// The positions of `len` items this shard takes.
    pub fn positions(&self, len: usize) -> Vec<usize> {
        (0..len).filter(|&p| self.owns(p)).collect()
    }
}
