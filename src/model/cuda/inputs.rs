//! A step's inputs from the host in one pinned buffer (issue #44): the small ones (positions,
//! block tables, each row's block and slot, the wanted rows, the RoPE tables, the attention
//! temperatures, a hybrid model's sequences and recurrent states, Gemma 4's per-layer token
//! embeddings) packed side by side, then the rows' embeddings. Two asynchronous copies per
//! step take them to the device (the packed regions into one device buffer, the embeddings
//! into the step's `x`), where there were nine copies from pageable memory, each of which the
//! driver staged and waited for.
//!
//! Each region's place is set by its capacity, not by this step's length ([`Layout`]), so
//! its device address stays the same from step to step until a region outgrows its
//! capacity: a CUDA graph's key (every address a launch takes) then still matches.

use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice};

use super::kernels::{dev_err, ptr, Gpu, Result};

/// The packed regions, in their order in the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Region {
    Positions,
    TableOffsets,
    Tables,
    RowBlocks,
    RowSlots,
    Wanted,
    Rope,
    RopeSwa,
    Temp,
    /// A hybrid model's sequences: (first row, rows) of each.
    Spans,
    /// A hybrid model's sequences' recurrent states: a device address (two values) each.
    States,
    /// Gemma 4 E2B/E4B: each row's token's per-layer embeddings.
    LayerTokens,
}

/// How many regions there are.
pub(super) const REGIONS: usize = 12;

/// Every region holds 4-byte values (`i32` or `f32`; an address is two).
const VALUE: usize = 4;

/// Each region starts this many bytes after the buffer's start (a multiple of), so that every
/// region is aligned for any load a kernel makes of it.
const ALIGN: usize = 256;

/// The smallest capacity of a region, in values.
const MIN_CAP: usize = 64;

/// Where the regions lie: each region's capacity in values, and from the capacities its byte
/// offset. The embeddings follow the last region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    caps: [usize; REGIONS],
    /// The embeddings' capacity, in floats.
    x_cap: usize,
}

impl Layout {
    /// A layout that holds regions of `lens` values and `x` floats of embeddings, each
    /// capacity the next power of two (at least [`MIN_CAP`]) and never below `self`'s, so that
    /// the layout changes only when a step needs more room than every earlier one.
    fn grown(old: Option<&Layout>, lens: &[usize; REGIONS], x: usize) -> Layout {
        let cap = |len: usize, was: usize| len.max(MIN_CAP).next_power_of_two().max(was);
        let mut caps = [0; REGIONS];
        for (i, c) in caps.iter_mut().enumerate() {
            *c = cap(lens[i], old.map_or(0, |o| o.caps[i]));
        }
        Layout {
            caps,
            x_cap: cap(x, old.map_or(0, |o| o.x_cap)),
        }
    }

    /// Whether regions of `lens` values and `x` floats fit.
    fn fits(&self, lens: &[usize; REGIONS], x: usize) -> bool {
        lens.iter().zip(&self.caps).all(|(l, c)| l <= c) && x <= self.x_cap
    }

    /// Region `r`'s byte offset.
    fn offset(&self, r: usize) -> usize {
        self.caps[..r]
            .iter()
            .map(|c| (c * VALUE).next_multiple_of(ALIGN))
            .sum()
    }

    /// The packed regions' bytes (the device buffer's size); the embeddings start here in the
    /// host buffer.
    fn packed_bytes(&self) -> usize {
        self.offset(REGIONS)
    }

    /// The host buffer's bytes: the packed regions, then the embeddings.
    fn host_bytes(&self) -> usize {
        self.packed_bytes() + self.x_cap * VALUE
    }
}

/// A slice of 4-byte values as its bytes.
pub(super) trait Values {
    fn bytes(&self) -> &[u8];
}

impl Values for [i32] {
    fn bytes(&self) -> &[u8] {
        // SAFETY: i32 has no padding and every byte pattern is a valid u8; the length is the
        // slice's size in bytes.
        unsafe { std::slice::from_raw_parts(self.as_ptr().cast(), std::mem::size_of_val(self)) }
    }
}

impl Values for [f32] {
    fn bytes(&self) -> &[u8] {
        // SAFETY: as for i32.
        unsafe { std::slice::from_raw_parts(self.as_ptr().cast(), std::mem::size_of_val(self)) }
    }
}

impl Values for [u64] {
    fn bytes(&self) -> &[u8] {
        // SAFETY: as for i32 (each region's offset is a multiple of 256, so a u64 the kernels
        // read there is aligned).
        unsafe { std::slice::from_raw_parts(self.as_ptr().cast(), std::mem::size_of_val(self)) }
    }
}

/// A model's step inputs: the layout, the pinned host buffer, the device buffer of the packed
/// regions, and an event after the last step's copies (the host buffer is not written again
/// before they are done).
#[derive(Default)]
pub(super) struct StepInputs {
    layout: Option<Layout>,
    host: Option<PinnedHostSlice<u8>>,
    dev: Option<CudaSlice<u8>>,
    copied: Option<CudaEvent>,
}

impl StepInputs {
    /// Packs `regions` (in [`Region`] order) and the embeddings `x` into the pinned buffer
    /// (grown first when a step needs more room), copies the regions to the device buffer and
    /// `x` into `x_dev`, both on the model's stream, and returns each region's device address.
    pub(super) fn upload(
        &mut self,
        g: &Gpu,
        regions: [&[u8]; REGIONS],
        x: &[f32],
        x_dev: &mut CudaSlice<f32>,
    ) -> Result<[u64; REGIONS]> {
        let lens = regions.map(|r| r.len() / VALUE);
        if x.len() > x_dev.len() {
            return Err(dev_err(
                "uploading rows",
                format!("{} floats for a buffer of {}", x.len(), x_dev.len()),
            ));
        }
        // The last step's copies read the host buffer: wait for them before writing it.
        if let Some(e) = &self.copied {
            e.synchronize()
                .map_err(|e| dev_err("waiting for the last step's inputs", e))?;
        }
        if !self.layout.as_ref().is_some_and(|l| l.fits(&lens, x.len())) {
            let layout = Layout::grown(self.layout.as_ref(), &lens, x.len());
            // Dropped first: the device memory comes back before the larger buffers are taken.
            self.host = None;
            self.dev = None;
            // SAFETY: the buffer is written below before any byte of it is copied; flags 0:
            // ordinary (cached) page-locked memory.
            let host = unsafe { g.ctx.alloc_pinned_with_flags::<u8>(layout.host_bytes(), 0) }
                .map_err(|e| dev_err("allocating the step inputs' pinned buffer", e))?;
            self.host = Some(host);
            self.dev = Some(g.zeros("step inputs", layout.packed_bytes())?);
            self.layout = Some(layout);
        }
        let layout = self.layout.as_ref().expect("laid out");
        let host = self.host.as_mut().expect("allocated");
        let dev = self.dev.as_ref().expect("allocated");
        let buf = host
            .as_mut_slice()
            .map_err(|e| dev_err("the step inputs' pinned buffer", e))?;
        // The packed part is copied up to the end of its last region's values.
        let mut end = 0;
        for (i, r) in regions.iter().enumerate() {
            let at = layout.offset(i);
            buf[at..at + r.len()].copy_from_slice(r);
            if !r.is_empty() {
                end = at + r.len();
            }
        }
        let xs = layout.packed_bytes();
        buf[xs..xs + x.len() * VALUE].copy_from_slice(x.bytes());
        let s = &g.stream;
        let base = ptr(dev, s);
        g.ctx
            .bind_to_thread()
            .map_err(|e| dev_err("uploading the step inputs", e))?;
        // SAFETY: the device buffer holds `packed_bytes` >= `end` bytes and `x_dev` at least
        // `x.len()` floats (checked above); the host bytes are page-locked and stay untouched
        // until the event recorded after both copies has passed (waited for above).
        unsafe {
            cudarc::driver::result::memcpy_htod_async(base, &buf[..end], s.cu_stream())
                .map_err(|e| dev_err("uploading the step inputs", e))?;
            cudarc::driver::result::memcpy_htod_async(
                ptr(x_dev, s),
                &buf[xs..xs + x.len() * VALUE],
                s.cu_stream(),
            )
            .map_err(|e| dev_err("uploading rows", e))?;
        }
        let event = match self.copied.take() {
            Some(e) => e,
            None => g
                .ctx
                .new_event(None)
                .map_err(|e| dev_err("an event for the step inputs", e))?,
        };
        event
            .record(s)
            .map_err(|e| dev_err("an event for the step inputs", e))?;
        self.copied = Some(event);
        Ok(std::array::from_fn(|i| base + layout.offset(i) as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(v: usize) -> [usize; REGIONS] {
        [v; REGIONS]
    }

    /// Regions are aligned, apart, and in order; the embeddings follow them.
    #[test]
    fn regions_are_aligned_and_apart() {
        let mut l = [1, 3, 70, 1, 1, 0, 128 * 16, 0, 5, 2, 2, 3 * 8960];
        l[Region::Wanted as usize] = 2;
        let layout = Layout::grown(None, &l, 4096);
        assert!(layout.fits(&l, 4096));
        for (i, (&len, &cap)) in l.iter().zip(&layout.caps).enumerate() {
            let (at, next) = (layout.offset(i), layout.offset(i + 1));
            assert_eq!(at % ALIGN, 0, "region {i}");
            assert!(at + cap * VALUE <= next, "region {i} overlaps the next");
            assert!(
                cap >= len.max(MIN_CAP) && cap.is_power_of_two(),
                "region {i}"
            );
        }
        assert_eq!(layout.packed_bytes(), layout.offset(REGIONS));
        assert_eq!(layout.host_bytes(), layout.packed_bytes() + 4096 * VALUE);
    }

    /// A decode step's inputs grow a little (a block-table entry every 16 positions): the
    /// layout, and so every device address, stays until a region outgrows its capacity; it
    /// never shrinks.
    #[test]
    fn the_layout_moves_only_when_a_region_outgrows_it() {
        let mut l = lens(1);
        l[Region::Tables as usize] = 33;
        let first = Layout::grown(None, &l, 576);
        let mut step = l;
        for tables in 33..=64 {
            step[Region::Tables as usize] = tables;
            assert!(first.fits(&step, 576), "{tables} table entries");
        }
        step[Region::Tables as usize] = 65;
        assert!(!first.fits(&step, 576));
        let second = Layout::grown(Some(&first), &step, 576);
        assert_eq!(second.caps[Region::Tables as usize], 128);
        // Every other region keeps its capacity; a later smaller step changes nothing.
        for i in (0..REGIONS).filter(|&i| i != Region::Tables as usize) {
            assert_eq!(second.caps[i], first.caps[i]);
        }
        assert_eq!(Layout::grown(Some(&second), &lens(1), 1), second);
        assert!(second.fits(&lens(1), 1));
        assert!(!second.fits(&lens(1), second.x_cap + 1));
    }

    /// On a GPU: each region's bytes at its address and the rows in `x`, over steps that fit
    /// the layout, shrink, and outgrow it.
    #[test]
    fn uploaded_inputs_read_back_at_their_addresses() {
        let Some(g) = crate::model::cuda::tests::gpu_or_skip("uploaded inputs") else {
            return;
        };
        let s = &g.stream;
        let mut inputs = StepInputs::default();
        let mut x_dev: CudaSlice<f32> = g.zeros("x", 4096).expect("x");
        for (step, n) in [(0usize, 3usize), (1, 1), (2, 700)] {
            let ints: Vec<Vec<i32>> = (0..REGIONS)
                .map(|r| {
                    (0..n * (r + 1))
                        .map(|i| (step * 1000 + r * 100 + i) as i32)
                        .collect()
                })
                .collect();
            let mut regions: [&[u8]; REGIONS] = [&[]; REGIONS];
            for (r, v) in ints.iter().enumerate() {
                regions[r] = v.bytes();
            }
            let x: Vec<f32> = (0..n.min(4096))
                .map(|i| i as f32 * 0.5 - step as f32)
                .collect();
            let at = inputs.upload(&g, regions, &x, &mut x_dev).expect("upload");
            let dev = inputs.dev.as_ref().expect("device buffer");
            let base = ptr(dev, s);
            let back = s.clone_dtoh(dev).expect("read back");
            for (r, v) in ints.iter().enumerate() {
                let off = (at[r] - base) as usize;
                assert_eq!(
                    &back[off..off + v.len() * VALUE],
                    v.bytes(),
                    "step {step}, region {r}"
                );
            }
            let xb = s.clone_dtoh(&x_dev).expect("read back x");
            assert_eq!(&xb[..x.len()], &x[..], "step {step}: rows");
        }
    }

    #[test]
    fn values_are_their_bytes() {
        let v = [1i32, -2, 0x0102_0304];
        let b = v.bytes();
        assert_eq!(b.len(), 12);
        assert_eq!(&b[8..], &0x0102_0304i32.to_ne_bytes());
        let f = [1.5f32, -0.0];
        assert_eq!(f.bytes()[..4], 1.5f32.to_ne_bytes());
        assert_eq!(f.bytes()[4..], (-0.0f32).to_ne_bytes());
        let a = [0x7f00_1234_5678_9abcu64, 1];
        assert_eq!(a.bytes().len(), 4 * VALUE);
        assert_eq!(a.bytes()[..8], 0x7f00_1234_5678_9abcu64.to_ne_bytes());
    }

    /// The last region holds every value, however many precede it (its offset is the sum of
    /// the others' aligned capacities), and the regions' order is [`Region`]'s.
    #[test]
    fn the_regions_keep_their_order() {
        let order = [
            Region::Positions,
            Region::TableOffsets,
            Region::Tables,
            Region::RowBlocks,
            Region::RowSlots,
            Region::Wanted,
            Region::Rope,
            Region::RopeSwa,
            Region::Temp,
            Region::Spans,
            Region::States,
            Region::LayerTokens,
        ];
        assert_eq!(order.len(), REGIONS);
        for (i, r) in order.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?}");
        }
        let layout = Layout::grown(None, &lens(100), 0);
        assert_eq!(
            layout.offset(Region::LayerTokens as usize),
            (REGIONS - 1) * (128 * VALUE).next_multiple_of(ALIGN)
        );
    }
}
