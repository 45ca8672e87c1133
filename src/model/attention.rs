//! Attention over each sequence's own KV state: the split of a step's rows and heads into
//! tasks for rayon's threads, and one task's scores, softmax and weighted values, portable and
//! with AVX2. Both paths do the same operations in the same order (no FMA), so the bits do not
//! depend on the instruction set, the split or the thread count.

use super::expf::{exp_f32, exp_shifted_in_place};
use super::kv::KvSeq;

/// Rows per attention task when a sequence brings many (prefill).
const ATTN_ROW_BLOCK: usize = 32;

/// One attention task: rows `rows.0 .. rows.0 + rows.1` of sequence `seq` (relative to its
/// span) for query heads `heads.0 .. heads.0 + heads.1` of KV head `g`'s group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AttnTask {
    pub(super) seq: usize,
    pub(super) g: usize,
    pub(super) heads: (usize, usize),
    pub(super) rows: (usize, usize),
}

/// The attention tasks for `spans`: blocks of [`ATTN_ROW_BLOCK`] rows per (sequence, KV head),
/// each for a run of the query heads sharing that KV head (its keys and values read once for
/// the run). The run is the longest divisor of the group among those whose rounds of tasks
/// over the threads take the least head-work (`ceil(tasks / threads) · run`): whole groups
/// when there are blocks enough (prefill), shorter runs when decoding a few sequences would
/// otherwise leave threads idle.
pub(super) fn attention_tasks(
    spans: &[(usize, usize, usize)],
    n_kv: usize,
    group: usize,
    threads: usize,
) -> Vec<AttnTask> {
    let blocks: usize = spans.iter().map(|s| s.1.div_ceil(ATTN_ROW_BLOCK)).sum();
    let threads = threads.max(1);
    let cost = |run: usize| (blocks * n_kv * (group / run)).div_ceil(threads) * run;
    let run = (1..=group)
        .filter(|&r| group.is_multiple_of(r))
        .min_by_key(|&r| (cost(r), std::cmp::Reverse(r)))
        .unwrap_or(1);
    let heads: Vec<(usize, usize)> = (0..group).step_by(run).map(|h| (h, run)).collect();
    let mut tasks = Vec::new();
    for (seq, &(_, n, _)) in spans.iter().enumerate() {
        for g in 0..n_kv {
            for &h in &heads {
                for b in (0..n).step_by(ATTN_ROW_BLOCK) {
                    tasks.push(AttnTask {
                        seq,
                        g,
                        heads: h,
                        rows: (b, ATTN_ROW_BLOCK.min(n - b)),
                    });
                }
            }
        }
    }
    tasks
}

/// Head geometry for attention.
#[derive(Debug, Clone, Copy)]
pub(super) struct Geometry<'a> {
    pub(super) dim: usize,
    pub(super) hd: usize,
    /// Query heads per KV head.
    pub(super) group: usize,
    pub(super) scale: f32,
    /// Attention-score soft-cap (Gemma 2).
    pub(super) softcap: Option<f32>,
    /// Sliding window: keys at positions `p - window + 1 ..= p` only.
    pub(super) window: Option<usize>,
    /// Per query head, a sink logit that joins the softmax's maximum and sum but weighs no
    /// value (gpt-oss; ggml's `soft_max_ext` with sinks: `e^(sink - max)` added after the
    /// positions).
    pub(super) sinks: Option<&'a [f32]>,
}

/// One attention task's output, `[row][head][head_dim]`. Uses AVX2 when available: the same
/// operations in the same order (no FMA), so the bits do not depend on the instruction set.
pub(super) fn attend<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    span: (usize, usize, usize),
    task: &AttnTask,
    geo: Geometry<'_>,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { attend_avx2(kv, layer, q, span, task, geo, SCORE_FLOATS) };
        }
    }
    attend_body(kv, layer, q, span, task, geo, dot)
}

/// [`attend_body`] with AVX2, eight positions (scores) or eight head-dimension lanes (values)
/// at a time. Each score is the eight lane sums of [`dot`] reduced by the same tree, and each
/// output element adds its weighted values in position order, one multiply and one add each
/// (no FMA), so the bits are [`attend_body`]'s; only the maximum (exact in any order) is taken
/// over vectors.
///
/// The task's rows go through in passes whose scores fit [`SCORE_FLOATS`]. A pass reads the
/// keys in blocks of [`KEY_BLOCK`] positions and scores every row of the pass against a block
/// before the next, then the values in blocks of [`VALUE_BLOCK`] positions, each block added
/// into every row: a block is read from memory once per pass and reused from the L1 cache by
/// every row and head (copied side by side first, [`stage`]: in place, the rows of a block
/// evicted each other), where a row at a time streamed the whole context once per row. Each
/// output element still adds its positions in order (across blocks through its f32 slot),
/// so the blocking changes no bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn attend_avx2<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    span: (usize, usize, usize),
    task: &AttnTask,
    geo: Geometry<'_>,
    score_floats: usize,
) -> Vec<f32> {
    use std::arch::x86_64::*;
    let (r0, _, p0) = span;
    let Geometry {
        dim,
        hd,
        group,
        scale,
        softcap,
        window,
        sinks,
    } = geo;
    if hd % 8 != 0 {
        // SAFETY: this function only runs where AVX2 is available.
        return attend_body(kv, layer, q, span, task, geo, |a, b| unsafe {
            dot_avx2(a, b)
        });
    }
    let (h0, nh) = task.heads;
    let (i0, ni) = task.rows;
    let kvo = task.g * hd;
    // The task's first query head, in the model's numbering (its sinks).
    let head0 = task.g * group + h0;
    // Row `i` of the task sees positions `lo(i) .. ctx(i)`.
    let ctx = |i: usize| p0 + i0 + i + 1;
    let lo = |i: usize| window.map_or(0, |w| ctx(i).saturating_sub(w));
    let cap = ctx(ni - 1);
    let pass = (score_floats / (nh * cap)).clamp(1, ni);
    // The thread's score buffer, kept between tasks (zeroing half a megabyte per task cost
    // more than some of the arithmetic). Every score a row reads is written first.
    let mut buffer = SCORES.take();
    if buffer.len() < pass * nh * cap {
        buffer = vec![0f32; pass * nh * cap];
    }
    let scores = &mut buffer[..pass * nh * cap];
    let mut out = vec![0f32; ni * nh * hd];
    let mut max = vec![f32::NEG_INFINITY; pass * nh];
    let mut vmax = vec![_mm256_set1_ps(f32::NEG_INFINITY); pass * nh];
    let mut sum = vec![0f32; nh];
    let mut inv = vec![0f32; pass * nh];
    let vscale = _mm256_set1_ps(scale);
    // The thread's staging buffer: a block's keys, later its values, of this KV head side by
    // side (the two phases never hold a block at once).
    let mut staged = STAGE.take();
    for a0 in (0..ni).step_by(pass) {
        let a1 = (a0 + pass).min(ni);
        let (first, last) = (lo(a0), ctx(a1 - 1));
        max.fill(f32::NEG_INFINITY);
        vmax.fill(_mm256_set1_ps(f32::NEG_INFINITY));
        // Scores, a block of keys against every row of the pass.
        for kb in (first..last).step_by(KEY_BLOCK) {
            let ke = (kb + KEY_BLOCK).min(last);
            let keys: [_; KEY_BLOCK] = stage(&mut staged, hd, kb..ke, last, |p| {
                &kv.key(layer, p)[kvo..kvo + hd]
            });
            for i in a0..a1 {
                let (s, e) = (kb.max(lo(i)), ke.min(ctx(i)));
                if s >= e {
                    continue;
                }
                let r = r0 + i0 + i;
                let qrow = &q[r * dim + (task.g * group + h0) * hd..][..nh * hd];
                let base = (i - a0) * nh;
                let mut p = s;
                while p + 8 <= e {
                    let k8: &[&[f32]; 8] = keys[p - kb..p - kb + 8].try_into().unwrap();
                    for hh in 0..nh {
                        // SAFETY: AVX2 is available here; the query head is `hd` floats, a
                        // multiple of eight (checked above), and every key holds `hd`.
                        let qh = &qrow[hh * hd..(hh + 1) * hd];
                        let sv = _mm256_mul_ps(unsafe { dot8(qh, k8) }, vscale);
                        let dst = &mut scores[(base + hh) * cap + p..][..8];
                        // SAFETY: `dst` holds eight floats.
                        unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), sv) };
                        match softcap {
                            None => vmax[base + hh] = _mm256_max_ps(sv, vmax[base + hh]),
                            Some(c) => {
                                for sc in dst.iter_mut() {
                                    *sc = (*sc / c).tanh() * c;
                                    max[base + hh] = max[base + hh].max(*sc);
                                }
                            }
                        }
                    }
                    p += 8;
                }
                for p in p..e {
                    for hh in 0..nh {
                        // SAFETY: this function only runs where AVX2 is available.
                        let mut sc =
                            unsafe { dot_avx2(&qrow[hh * hd..(hh + 1) * hd], keys[p - kb]) }
                                * scale;
                        if let Some(c) = softcap {
                            sc = (sc / c).tanh() * c;
                        }
                        max[base + hh] = max[base + hh].max(sc);
                        scores[(base + hh) * cap + p] = sc;
                    }
                }
            }
        }
        // Each row's weights: the exponentials, then each head's sum in position order.
        for i in a0..a1 {
            let base = (i - a0) * nh;
            let (l, c) = (lo(i), ctx(i));
            for hh in 0..nh {
                let mut lanes = [0f32; 8];
                // SAFETY: `lanes` holds eight floats.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), vmax[base + hh]) };
                let mut m = lanes.iter().fold(max[base + hh], |m, &v| m.max(v));
                if let Some(sk) = sinks {
                    m = m.max(sk[head0 + hh]);
                }
                max[base + hh] = m;
                exp_shifted_in_place(&mut scores[(base + hh) * cap + l..][..c - l], m);
            }
            let heads = &scores[base * cap..(base + nh) * cap];
            sum_in_order(heads, cap, l..c, &mut sum);
            for (hh, s) in sum.iter_mut().enumerate() {
                if let Some(sk) = sinks {
                    *s += exp_f32(sk[head0 + hh] - max[base + hh]);
                }
                inv[base + hh] = 1.0 / *s;
            }
        }
        // Values, a block of positions added into every row of the pass.
        for pb in (first..last).step_by(VALUE_BLOCK) {
            let pe = (pb + VALUE_BLOCK).min(last);
            let rows: [_; VALUE_BLOCK] = stage(&mut staged, hd, pb..pe, last, |p| {
                &kv.value(layer, p)[kvo..kvo + hd]
            });
            for i in a0..a1 {
                let (s, e) = (pb.max(lo(i)), pe.min(ctx(i)));
                if s >= e {
                    continue;
                }
                let base = (i - a0) * nh;
                let o = &mut out[i * nh * hd..(i + 1) * nh * hd];
                for hh in 0..nh {
                    let w = &scores[(base + hh) * cap + s..(base + hh) * cap + e];
                    let oh = &mut o[hh * hd..(hh + 1) * hd];
                    for d0 in (0..hd).step_by(64) {
                        // SAFETY: AVX2 is available here; `hd` is a multiple of eight, so the
                        // slice of `oh` is a multiple of eight and at most 64 floats; `w` and
                        // the rows both cover positions `s..e`; each row is `hd` values.
                        unsafe {
                            weighted_sum8(
                                &mut oh[d0..hd.min(d0 + 64)],
                                w,
                                &rows[s - pb..e - pb],
                                d0,
                            )
                        };
                    }
                }
            }
        }
        for i in a0..a1 {
            let base = (i - a0) * nh;
            let o = &mut out[i * nh * hd..(i + 1) * nh * hd];
            for hh in 0..nh {
                let iv = _mm256_set1_ps(inv[base + hh]);
                for a in o[hh * hd..(hh + 1) * hd].chunks_exact_mut(8) {
                    // SAFETY: `a` holds eight floats.
                    unsafe {
                        _mm256_storeu_ps(
                            a.as_mut_ptr(),
                            _mm256_mul_ps(_mm256_loadu_ps(a.as_ptr()), iv),
                        )
                    };
                }
            }
        }
    }
    SCORES.set(buffer);
    STAGE.set(staged);
    out
}

/// Copies the rows `row(p)` for `p` in `block` (each `hd` floats) side by side into `buf`,
/// from a 64-byte boundary, and returns them. In the KV store a position's row holds every KV
/// head, so one head's rows lie a whole row apart (2 KiB for 4 heads of 128): with a stride
/// that is a multiple of 1 KiB, a block's rows fall into a few of the L1 cache's sets and
/// evict each other while every query row and head of the pass reads them again. Side by
/// side they stay. A copy changes no value. Each copy also prefetches the row
/// [`PREFETCH`] positions on (up to `end`), so the next block streams in while this one is
/// read.
#[cfg(target_arch = "x86_64")]
#[inline]
fn stage<'b, 'k, const N: usize>(
    buf: &'b mut Vec<f32>,
    hd: usize,
    block: std::ops::Range<usize>,
    end: usize,
    row: impl Fn(usize) -> &'k [f32],
) -> [&'b [f32]; N] {
    const ALIGN: usize = 16;
    debug_assert!(block.len() <= N);
    let need = block.len() * hd + ALIGN;
    if buf.len() < need {
        buf.resize(need, 0.0);
    }
    let skip = buf.as_ptr().align_offset(64).min(ALIGN - 1);
    let dst = &mut buf[skip..skip + block.len() * hd];
    for (p, d) in block.clone().zip(dst.chunks_exact_mut(hd)) {
        if p + PREFETCH < end {
            prefetch_row(row(p + PREFETCH));
        }
        d.copy_from_slice(row(p));
    }
    let mut rows: [&[f32]; N] = [&[]; N];
    for (slot, r) in rows.iter_mut().zip(dst.chunks_exact(hd)) {
        *slot = r;
    }
    rows
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// [`attend_avx2`]'s score buffer on this thread.
    static SCORES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// [`attend_avx2`]'s staged keys or values on this thread ([`stage`]).
    static STAGE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Scores (floats) one pass of [`attend_avx2`] may hold: 512 KiB, within a core's L2 cache.
#[cfg(target_arch = "x86_64")]
const SCORE_FLOATS: usize = 1 << 17;

/// Positions whose keys [`attend_avx2`] scores every row of a pass against before the next
/// block (16 KiB at 64 dimensions).
#[cfg(target_arch = "x86_64")]
const KEY_BLOCK: usize = 64;

/// `sum[h] = Σ heads[h * stride + p]` over `range`, positions in order from `0.0`, for every
/// head `h`: [`attend_body`]'s sums. Up to four heads' chains run side by side in registers
/// (a chain through memory waits on a store for every add).
fn sum_in_order(heads: &[f32], stride: usize, range: std::ops::Range<usize>, sum: &mut [f32]) {
    fn chains<const N: usize>(rows: [&[f32]; N]) -> [f32; N] {
        let mut s = [0f32; N];
        let n = rows[0].len();
        assert!(rows.iter().all(|r| r.len() == n));
        for p in 0..n {
            for (s, r) in s.iter_mut().zip(&rows) {
                *s += r[p];
            }
        }
        s
    }
    let row = |h: usize| &heads[h * stride + range.start..h * stride + range.end];
    let mut h = 0;
    while h < sum.len() {
        let n = (sum.len() - h).min(4);
        match n {
            4 => {
                sum[h..h + 4].copy_from_slice(&chains([row(h), row(h + 1), row(h + 2), row(h + 3)]))
            }
            3 => sum[h..h + 3].copy_from_slice(&chains([row(h), row(h + 1), row(h + 2)])),
            2 => sum[h..h + 2].copy_from_slice(&chains([row(h), row(h + 1)])),
            _ => sum[h] = chains([row(h)])[0],
        }
        h += n;
    }
}

/// Positions whose value rows [`attend_avx2`] reads as one block (8 KiB at 64 dimensions).
const VALUE_BLOCK: usize = 32;

/// Eight dot products of `q` with eight keys, each [`dot`]'s: lane `l` of key `j` sums
/// `q[c + l] * k_j[c + l]` over chunks `c` in order, then `((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7))`
/// (pairwise horizontal adds give exactly that tree), plus `dot`'s empty tail, `+0.0`.
///
/// # Safety
///
/// The CPU has AVX2, `q.len()` is a multiple of eight and every key is at least as long as `q`
/// (the loads are unchecked).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot8(q: &[f32], keys: &[&[f32]; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let n = q.len();
    debug_assert!(n.is_multiple_of(8) && keys.iter().all(|k| k.len() >= n));
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut c = 0;
    while c < n {
        // SAFETY: c + 8 <= n, inside `q` and every key (the caller's contract).
        unsafe {
            let x = _mm256_loadu_ps(q.as_ptr().add(c));
            for (a, k) in acc.iter_mut().zip(keys) {
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, _mm256_loadu_ps(k.as_ptr().add(c))));
            }
        }
        c += 8;
    }
    _mm256_set_m128(reduce4(&acc[4..]), reduce4(&acc[..4]))
}

/// [`dot`]'s reduction of four accumulators at once: `a0+a4 .. a3+a7` per accumulator, then
/// the horizontal adds `(v0+v1, v2+v3)` and `((v0+v1)+(v2+v3))`, then `+0.0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn reduce4(acc: &[std::arch::x86_64::__m256]) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    let mut half = [_mm_setzero_ps(); 4];
    for (h, &a) in half.iter_mut().zip(acc) {
        *h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    }
    let x = _mm_hadd_ps(half[0], half[1]);
    let y = _mm_hadd_ps(half[2], half[3]);
    _mm_add_ps(_mm_hadd_ps(x, y), _mm_setzero_ps())
}

/// `o[d] += w[p] * rows[p][d0 + d]` for every `d` of `o` (at most 64), positions in order:
/// the accumulators stay in registers across the block.
///
/// # Safety
///
/// The CPU has AVX2, `o.len()` is a multiple of eight and at most 64, `w` and `rows` have the
/// same length, and every row holds at least `d0 + o.len()` values (the loads are unchecked).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn weighted_sum8(o: &mut [f32], w: &[f32], rows: &[&[f32]], d0: usize) {
    use std::arch::x86_64::*;
    let nv = o.len() / 8;
    debug_assert!(o.len().is_multiple_of(8) && nv <= 8 && w.len() == rows.len());
    let mut acc = [_mm256_setzero_ps(); 8];
    // SAFETY: every load and store below is inside `o` (nv * 8 floats) or inside a row
    // (d0 + nv * 8 <= the row's length, a head of `hd` values).
    unsafe {
        if nv == 8 {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(o.as_ptr().add(8 * j));
            }
            for (&wp, row) in w.iter().zip(rows) {
                let wv = _mm256_set1_ps(wp);
                let v = row.as_ptr().add(d0);
                for (j, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(wv, _mm256_loadu_ps(v.add(8 * j))));
                }
            }
            for (j, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * j), *a);
            }
        } else {
            for (j, a) in acc[..nv].iter_mut().enumerate() {
                *a = _mm256_loadu_ps(o.as_ptr().add(8 * j));
            }
            for (&wp, row) in w.iter().zip(rows) {
                let wv = _mm256_set1_ps(wp);
                let v = row.as_ptr().add(d0);
                for (j, a) in acc[..nv].iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(wv, _mm256_loadu_ps(v.add(8 * j))));
                }
            }
            for (j, a) in acc[..nv].iter().enumerate() {
                _mm256_storeu_ps(o.as_mut_ptr().add(8 * j), *a);
            }
        }
    }
}

#[inline(always)]
fn attend_body<K: KvSeq>(
    kv: &K,
    layer: usize,
    q: &[f32],
    (r0, _, p0): (usize, usize, usize),
    task: &AttnTask,
    geo: Geometry<'_>,
    dot: impl Fn(&[f32], &[f32]) -> f32,
) -> Vec<f32> {
    let Geometry {
        dim,
        hd,
        group,
        scale,
        softcap,
        window,
        sinks,
    } = geo;
    let (h0, nh) = task.heads;
    let (i0, ni) = task.rows;
    let kvo = task.g * hd;
    let cap = p0 + i0 + ni;
    let mut scores = vec![0f32; nh * cap];
    let mut out = vec![0f32; ni * nh * hd];
    let mut max = vec![f32::NEG_INFINITY; nh];
    let mut sum = vec![0f32; nh];
    // Decoding (a row or two per task) streams each key and value once: prefetch them. Rows of
    // a prefill chunk reread the same keys from the cache, where hints would only cost.
    let decode = ni <= 2;
    for i in 0..ni {
        let r = r0 + i0 + i;
        let ctx = p0 + i0 + i + 1;
        let lo = window.map_or(0, |w| ctx.saturating_sub(w));
        let qrow = &q[r * dim + (task.g * group + h0) * hd..][..nh * hd];
        max.fill(f32::NEG_INFINITY);
        for p in lo..ctx {
            if decode && p + PREFETCH < ctx {
                prefetch_row(&kv.key(layer, p + PREFETCH)[kvo..kvo + hd]);
            }
            let k = &kv.key(layer, p)[kvo..kvo + hd];
            for hh in 0..nh {
                let mut sc = dot(&qrow[hh * hd..(hh + 1) * hd], k) * scale;
                if let Some(c) = softcap {
                    sc = (sc / c).tanh() * c;
                }
                max[hh] = max[hh].max(sc);
                scores[hh * cap + p] = sc;
            }
        }
        for hh in 0..nh {
            if let Some(sk) = sinks {
                max[hh] = max[hh].max(sk[task.g * group + h0 + hh]);
            }
            let scores = &mut scores[hh * cap + lo..hh * cap + ctx];
            exp_shifted_in_place(scores, max[hh]);
            sum[hh] = scores.iter().fold(0f32, |s, &v| s + v);
            if let Some(sk) = sinks {
                sum[hh] += exp_f32(sk[task.g * group + h0 + hh] - max[hh]);
            }
        }
        let o = &mut out[i * nh * hd..(i + 1) * nh * hd];
        for p in lo..ctx {
            if decode && p + PREFETCH < ctx {
                prefetch_row(&kv.value(layer, p + PREFETCH)[kvo..kvo + hd]);
            }
            let v = &kv.value(layer, p)[kvo..kvo + hd];
            for hh in 0..nh {
                let w = scores[hh * cap + p];
                for (a, b) in o[hh * hd..(hh + 1) * hd].iter_mut().zip(v) {
                    *a += w * b;
                }
            }
        }
        for hh in 0..nh {
            let inv = 1.0 / sum[hh];
            for a in o[hh * hd..(hh + 1) * hd].iter_mut() {
                *a *= inv;
            }
        }
    }
    out
}

/// Positions ahead of the one being read whose key (or value) is prefetched.
const PREFETCH: usize = 8;

/// Asks the cache for `row` (a key or value read a few positions later). A hint only: it
/// neither faults nor changes any value, so results are the same with or without it. KV
/// blocks are separate allocations of 16 positions, so the hardware prefetcher loses the
/// stream at every block boundary; at 1k positions attention is most of a decode step.
#[inline(always)]
fn prefetch_row(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in row.chunks(16) {
        // SAFETY: a prefetch is a hint that never faults; SSE is part of every x86_64 CPU.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr() as *const i8
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// Dot product with a fixed order: eight lanes, then a fixed pairwise reduction.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// [`dot`] with AVX2 intrinsics: the same eight lane sums and the same reduction, so the
/// same bits (the compiler's own vectorisation of [`dot`] shuffles lanes one by one).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let full = n / 8 * 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < full {
        // SAFETY: i + 8 <= n, inside both slices.
        let x = unsafe { _mm256_loadu_ps(a.as_ptr().add(i)) };
        let y = unsafe { _mm256_loadu_ps(b.as_ptr().add(i)) };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, y));
        i += 8;
    }
    let mut tail = 0f32;
    for j in full..n {
        tail += a[j] * b[j];
    }
    // (acc0+acc4, acc1+acc5, acc2+acc6, acc3+acc7), then ((v0+v1) + (v2+v3)) + tail.
    let v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let w = _mm_add_ps(v, _mm_movehdup_ps(v));
    let r = _mm_add_ss(w, _mm_movehl_ps(w, w));
    _mm_cvtss_f32(r) + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(seed: u64, n: usize) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Whether this CPU has AVX2; else the skip is recorded and counted.
    #[track_caller]
    fn avx2_or_skip() -> bool {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            return true;
        }
        crate::skip::absent(
            crate::skip::Need::CpuFeature,
            "no AVX2 here: the AVX2 attention kernel was not compared with the portable one",
        );
        false
    }

    #[test]
    fn avx2_dot_has_the_portable_bits() {
        if !avx2_or_skip() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            for n in [0, 1, 7, 8, 9, 63, 64, 80, 128, 131] {
                let (a, b) = (noise(n as u64, n), noise(1000 + n as u64, n));
                let scaled: Vec<f32> = a.iter().map(|v| v * 1e3).collect();
                for x in [&a, &scaled] {
                    // SAFETY: AVX2 checked above.
                    let fast = unsafe { dot_avx2(x, &b) };
                    assert_eq!(fast.to_bits(), dot(x, &b).to_bits(), "length {n}");
                }
            }
        }
    }

    /// Keys and values of one layer, `kv_dim` wide.
    struct Kv {
        kv_dim: usize,
        keys: Vec<f32>,
        values: Vec<f32>,
    }

    impl KvSeq for Kv {
        fn len(&self) -> usize {
            self.keys.len() / self.kv_dim
        }
        fn grow(&mut self, _: usize) {}
        fn write(&mut self, _: usize, _: usize, _: &[f32], _: &[f32]) {}
        fn key(&self, _: usize, pos: usize) -> &[f32] {
            &self.keys[pos * self.kv_dim..][..self.kv_dim]
        }
        fn value(&self, _: usize, pos: usize) -> &[f32] {
            &self.values[pos * self.kv_dim..][..self.kv_dim]
        }
    }

    #[test]
    fn attention_split_never_changes_a_bit() {
        let (n_kv, group, hd) = (3, 3, 64);
        let geo = Geometry {
            dim: n_kv * group * hd,
            hd,
            group,
            scale: 0.125,
            softcap: None,
            window: None,
            sinks: None,
        };
        let ctx = 300;
        let kv = Kv {
            kv_dim: n_kv * hd,
            keys: noise(1, ctx * n_kv * hd),
            values: noise(2, ctx * n_kv * hd),
        };
        // Rows 200..300 of one sequence: a prefill of 100 rows after 200 positions.
        let (n, p0) = (100, 200);
        let q = noise(3, n * geo.dim);
        let span = (0, n, p0);
        let run = |threads: usize| {
            let mut out = vec![0f32; n * geo.dim];
            for t in attention_tasks(&[span], n_kv, group, threads) {
                let res = attend(&kv, 0, &q, span, &t, geo);
                let w = t.heads.1 * hd;
                let col = (t.g * group + t.heads.0) * hd;
                for (i, c) in res.chunks_exact(w).enumerate() {
                    out[(t.rows.0 + i) * geo.dim + col..][..w].copy_from_slice(c);
                }
            }
            out
        };
        // 1 thread: whole groups in row blocks; 64 threads: single heads.
        let (a, b) = (run(1), run(64));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        // A decode step (one row) is the same row of the prefill.
        let last = (n - 1, 1, p0 + n - 1);
        let q_last = &q[(n - 1) * geo.dim..];
        for threads in [1, 2, 64] {
            let mut row = vec![0f32; geo.dim];
            for t in attention_tasks(&[(0, 1, last.2)], n_kv, group, threads) {
                let res = attend(&kv, 0, q_last, (0, 1, last.2), &t, geo);
                let col = (t.g * group + t.heads.0) * hd;
                row[col..col + res.len()].copy_from_slice(&res);
            }
            let want = &a[(n - 1) * geo.dim..];
            assert!(row
                .iter()
                .zip(want)
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    /// The AVX2 kernel (eight positions per score pass, key and value blocks, row passes of
    /// one row, a few rows and the whole task) against the portable body, bit for bit: head
    /// sizes with and without whole 64- and 8-lane chunks, groups, soft-capping, windows,
    /// sinks, prefill row blocks and decode rows at every context length around the 8-position and
    /// block edges.
    #[test]
    fn avx2_attention_has_the_portable_bits() {
        if !avx2_or_skip() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let n_kv = 2;
            let mut cases = 0;
            // Tasks whose output the sinks changed.
            let mut sunk = 0;
            for (hd, group, softcap, window, sink) in [
                (64, 3, None, None, false),
                (64, 4, None, Some(37), true),
                (128, 4, None, Some(37), false),
                (96, 1, Some(20.0), None, false),
                (80, 2, None, None, true),
                (72, 3, Some(5.0), Some(9), false),
                (20, 2, None, None, false),
            ] {
                // Sink logits around the scores' size (some above every score).
                let sinks: Vec<f32> = noise(7, n_kv * group).iter().map(|x| x * 6.0).collect();
                let geo = Geometry {
                    dim: n_kv * group * hd,
                    hd,
                    group,
                    scale: 1.0 / (hd as f32).sqrt(),
                    softcap,
                    window,
                    sinks: sink.then_some(&sinks[..]),
                };
                let ctx = 90;
                let spread = |v: Vec<f32>| v.into_iter().map(|x| x * 4.0).collect::<Vec<_>>();
                let kv = Kv {
                    kv_dim: n_kv * hd,
                    keys: spread(noise(hd as u64, ctx * n_kv * hd)),
                    values: noise(hd as u64 + 1, ctx * n_kv * hd),
                };
                let q = spread(noise(hd as u64 + 2, ctx * geo.dim));
                // A prefill of 40 rows after 50 positions, and decode rows at every length.
                let mut spans = vec![(0, 40, 50)];
                spans.extend((0..ctx).map(|p| (p, 1, p)));
                for span in spans {
                    for threads in [1, 64] {
                        for t in attention_tasks(&[span], n_kv, group, threads) {
                            let slow = attend_body(&kv, 0, &q, span, &t, geo, dot);
                            if sink {
                                let plain = Geometry { sinks: None, ..geo };
                                let without = attend_body(&kv, 0, &q, span, &t, plain, dot);
                                sunk += usize::from(slow != without);
                            }
                            // The default passes, and passes of one row and of a few rows.
                            for score_floats in [SCORE_FLOATS, 1, 700] {
                                // SAFETY: AVX2 was checked above.
                                let fast =
                                    unsafe { attend_avx2(&kv, 0, &q, span, &t, geo, score_floats) };
                                let same = fast
                                    .iter()
                                    .zip(&slow)
                                    .all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(
                                    same && fast.len() == slow.len(),
                                    "hd {hd}, span {span:?}, {t:?}, {score_floats}"
                                );
                                cases += 1;
                            }
                        }
                    }
                }
            }
            assert!(cases > 1000);
            assert!(sunk > 100, "the sinks changed {sunk} tasks' outputs");
        }
    }

    #[test]
    fn attention_tasks_keep_query_groups_together_when_the_threads_are_busy() {
        let heads = |spans: &[(usize, usize, usize)], n_kv, group, threads| {
            attention_tasks(spans, n_kv, group, threads)
                .iter()
                .map(|t| t.heads.1)
                .collect::<Vec<_>>()
        };
        // Decoding one sequence of a 12/2-head model on 2 threads: one task per KV head,
        // each reading its keys and values once for all six query heads.
        assert_eq!(heads(&[(0, 1, 900)], 2, 6, 2), vec![6, 6]);
        // On 8 threads the group is cut into runs: 2 × 3 runs of 2 heads take one round.
        assert_eq!(heads(&[(0, 1, 900)], 2, 6, 8), vec![2; 6]);
        // 9/3 heads on 2 threads: 3 tasks of 3 heads take two rounds (6 heads' work), 9
        // single heads five.
        assert_eq!(heads(&[(0, 1, 900)], 3, 3, 2), vec![1; 9]);
        // Prefill: enough row blocks for whole groups.
        assert!(heads(&[(0, 256, 0)], 2, 6, 2).iter().all(|&h| h == 6));
    }

    #[test]
    fn attention_tasks_cover_every_row_and_head_once() {
        let spans = [(0, 1, 5), (1, 70, 0), (71, 32, 9)];
        for threads in [1, 2, 8, 1000] {
            let mut seen = std::collections::HashSet::new();
            for t in attention_tasks(&spans, 2, 4, threads) {
                for r in t.rows.0..t.rows.0 + t.rows.1 {
                    for h in t.heads.0..t.heads.0 + t.heads.1 {
                        assert!(seen.insert((t.seq, r, t.g, h)));
                    }
                }
            }
            assert_eq!(seen.len(), (1 + 70 + 32) * 2 * 4);
        }
    }
}
