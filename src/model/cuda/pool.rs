//! The KV cache on a device: one pool of blocks in device memory, and the handles through which
//! the engine's bookkeeping owns them.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::hybrid::DeviceState;
use super::kernels::{dev_err, ew, ptr, Gpu, Result};
use crate::model::error::ModelError;

/// One pool of KV blocks in device memory, in half precision: a block holds, for each layer,
/// `block_tokens` keys then as many values, `kv_dim` wide.
pub(super) struct PoolInner {
    pub(super) gpu: Arc<Gpu>,
    pub(super) buf: CudaSlice<u16>,
    /// Halves per block.
    pub(super) block_len: usize,
    pub(super) capacity: usize,
    pub(super) free: Mutex<Vec<u32>>,
}

/// A handle to a device's KV pool (cheap to clone).
#[derive(Clone)]
pub struct KvPool(pub(super) Arc<PoolInner>);

impl std::fmt::Debug for KvPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KvPool({} blocks of {} bytes)",
            self.0.capacity,
            self.block_bytes()
        )
    }
}

impl KvPool {
    /// Blocks not in use now (the engine's scheduler reserves a step's blocks against this
    /// before it grows any sequence: it gives back cached prefixes, makes requests wait, or
    /// fails with an error, so that [`KvPool::alloc`] never finds the pool empty).
    pub fn free_blocks(&self) -> usize {
        self.0.free.lock().map_or(0, |f| f.len())
    }

    /// Blocks in the pool.
    pub fn capacity(&self) -> usize {
        self.0.capacity
    }

    /// A free block.
    ///
    /// # Panics
    /// When every block is in use, which the scheduler rules out by reserving each step's
    /// blocks first ([`KvPool::free_blocks`]); only a caller growing device KV by hand, past
    /// the pool, gets here.
    pub fn alloc(&self) -> DeviceBlock {
        let slot = self.0.free.lock().expect("KV pool lock").pop();
        let slot = slot.unwrap_or_else(|| {
            panic!(
                "CUDA KV pool exhausted: all {} blocks in use (lower --batch-size or --kv-cache-mb)",
                self.0.capacity
            )
        });
        DeviceBlock {
            pool: self.clone(),
            slot,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.0.block_len * 2
    }

    /// A zero recurrent state of `len` floats on the pool's device (a hybrid model's
    /// sequence; allocated beside the pool, which leaves room for them).
    pub fn new_state(&self, len: usize) -> DeviceState {
        DeviceState::zeros(&self.0.gpu, len)
    }

    /// The recurrent state `v`, uploaded to the pool's device (a prefix cache snapshot
    /// resumed).
    pub fn state_from(&self, v: &[f32]) -> DeviceState {
        DeviceState::from_host(&self.0.gpu, v)
    }

    pub(super) fn base(&self) -> u64 {
        ptr(&self.0.buf, &self.0.gpu.stream)
    }
}

/// A block of KV positions in a device's pool; returned to the pool when dropped. Cloning
/// copies the block into a fresh one on the device (the engine's copy-on-write).
pub struct DeviceBlock {
    pool: KvPool,
    slot: u32,
}

impl std::fmt::Debug for DeviceBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBlock({})", self.slot)
    }
}

impl DeviceBlock {
    /// The block's slot in its pool.
    pub fn slot(&self) -> u32 {
        self.slot
    }
}

impl Clone for DeviceBlock {
    fn clone(&self) -> DeviceBlock {
        let copy = self.pool.alloc();
        let p = &self.pool.0;
        let (base, src, dst, len) = (
            self.pool.base(),
            self.slot as i32,
            copy.slot as i32,
            p.block_len as i64,
        );
        let stream = &p.gpu.stream;
        let mut b = stream.launch_builder(&p.gpu.k.copy_block);
        b.arg(&base).arg(&src).arg(&dst).arg(&len);
        // SAFETY: both slots lie inside the pool (slots < capacity) and differ; the kernel
        // reads block_len halves of one and writes the other's.
        (p.gpu
            .launched("copy_block", unsafe { b.launch(ew(p.block_len)) }))
        .unwrap_or_else(|e| panic!("CUDA: copying a KV block failed: {e}"));
        copy
    }
}

impl Drop for DeviceBlock {
    fn drop(&mut self) {
        if let Ok(mut free) = self.pool.0.free.lock() {
            free.push(self.slot);
        }
    }
}

/// A KV pool of blocks of `block_len` halves: 90% of the memory left on the device after the
/// weights, less 1 GiB for step buffers and `reserve` bytes (a hybrid model's recurrent
/// states, allocated beside the pool).
pub(super) fn new_pool(
    gpu: &Arc<Gpu>,
    block_len: usize,
    limit: Option<usize>,
    reserve: usize,
) -> Result<KvPool> {
    let (free, _total) = gpu
        .ctx
        .mem_get_info()
        .map_err(|e| dev_err("reading free memory", e))?;
    // The reserve at most a quarter of what is free (a state larger than that is refused
    // when it is allocated).
    let budget = (free
        .saturating_sub(1 << 30)
        .saturating_sub(reserve.min(free / 4)))
        / 10
        * 9;
    let budget = limit.map_or(budget, |l| l.min(budget));
    let capacity = (budget / (block_len * 2)).min(u32::MAX as usize);
    if capacity == 0 {
        return Err(ModelError::Device(format!(
            "cuda: no memory left for the KV cache ({free} bytes free after the weights)"
        )));
    }
    let buf = gpu.zeros::<u16>("KV pool", capacity * block_len)?;
    Ok(KvPool(Arc::new(PoolInner {
        gpu: Arc::clone(gpu),
        buf,
        block_len,
        capacity,
        free: Mutex::new((0..capacity as u32).rev().collect()),
    })))
}
