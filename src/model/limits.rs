//! The machine's limits for the CPU forward pass, measured where it runs: sustained memory
//! read bandwidth (all threads, a buffer far larger than the caches) and the peak rate of the
//! quantized kernels' integer dot-product instruction (`vpdpbusd` on 256-bit registers with
//! AVX-512 VNNI, else `vpmaddubsw` + `vpmaddwd` + `vpaddd`), per thread and over the pool.
//!
//! Decode reads every weight once per step, so its ceiling is bandwidth; prefill multiplies
//! every weight with many rows, so its ceiling is the integer multiply-add rate. `candor bench
//! --limits` divides what it measured by these (see [`crate::engine::throughput`]).

use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;

/// What [`measure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Limits {
    /// Threads that ran the measurements (the current rayon pool).
    pub threads: usize,
    /// Sustained read bandwidth over all threads, GB/s (10⁹ bytes).
    pub read_gb_s: f64,
    /// Size of the buffer read, bytes.
    pub read_buffer_bytes: usize,
    /// The instruction measured: `dpbusd-ymm`, `maddubs-ymm` or `scalar`.
    pub dot_instruction: &'static str,
    /// 8-bit integer multiply-adds per second of one thread, 10⁹.
    pub int8_gmac_s_per_thread: f64,
    /// The same over all threads running at once, 10⁹.
    pub int8_gmac_s: f64,
}

/// Measures the limits on the current rayon pool (about two seconds, and `buffer_mb` MiB of
/// memory while it runs).
pub fn measure(buffer_mb: usize) -> Limits {
    let threads = rayon::current_num_threads();
    let (read_gb_s, read_buffer_bytes) = read_bandwidth(buffer_mb << 20, threads);
    let (dot_instruction, per) = dot_peak_one_thread();
    let all = dot_peak_all_threads(threads);
    Limits {
        threads,
        read_gb_s,
        read_buffer_bytes,
        dot_instruction,
        int8_gmac_s_per_thread: per,
        int8_gmac_s: all,
    }
}

/// Best of five passes of every thread summing its own contiguous share of a `bytes` buffer
/// (written first, so every page is resident).
fn read_bandwidth(bytes: usize, threads: usize) -> (f64, usize) {
    let words = bytes / 8;
    let mut buf = vec![0u64; words];
    buf.par_iter_mut()
        .enumerate()
        .for_each(|(i, w)| *w = i as u64);
    let share = words.div_ceil(threads.max(1) * 4);
    let mut best = 0f64;
    for _ in 0..5 {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(share)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, u64::wrapping_add);
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(s);
        best = best.max((words * 8) as f64 / secs / 1e9);
    }
    (best, words * 8)
}

/// Multiply-adds per call of [`dot_burst`].
const BURST_MACS: f64 = (DOT_ITERS * DOT_CHAINS * 32) as f64;
const DOT_ITERS: usize = 1 << 16;
const DOT_CHAINS: usize = 12;

fn dot_peak_one_thread() -> (&'static str, f64) {
    let (name, f) = dot_burst_fn();
    let mut best = 0f64;
    for _ in 0..20 {
        let t = Instant::now();
        std::hint::black_box(f(std::hint::black_box(3)));
        best = best.max(BURST_MACS / t.elapsed().as_secs_f64() / 1e9);
    }
    (name, best)
}

fn dot_peak_all_threads(threads: usize) -> f64 {
    let (_, f) = dot_burst_fn();
    let mut best = 0f64;
    for _ in 0..10 {
        let t = Instant::now();
        (0..threads * 4).into_par_iter().for_each(|i| {
            std::hint::black_box(f(std::hint::black_box(i as i32)));
        });
        best = best.max(BURST_MACS * (threads * 4) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// The widest dot-product burst this CPU runs, and its instruction's name.
fn dot_burst_fn() -> (&'static str, fn(i32) -> i32) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
            // SAFETY (both closures): the features were detected above.
            return ("dpbusd-ymm", |s| unsafe { x86::burst_vnni(s) });
        }
        if is_x86_feature_detected!("avx2") {
            return ("maddubs-ymm", |s| unsafe { x86::burst_avx2(s) });
        }
    }
    ("scalar", burst_scalar)
}

/// `DOT_CHAINS` independent chains of 32 multiply-adds each per iteration, in plain code.
fn burst_scalar(seed: i32) -> i32 {
    let mut acc = [seed; DOT_CHAINS];
    let (a, b) = (std::hint::black_box(3u8), std::hint::black_box(-2i8));
    for _ in 0..DOT_ITERS {
        for acc in acc.iter_mut() {
            for _ in 0..32 {
                *acc = acc.wrapping_add(a as i32 * b as i32);
            }
        }
    }
    acc.iter().fold(0, |x, &y| x.wrapping_add(y))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{DOT_CHAINS, DOT_ITERS};

    fn fold(acc: [__m256i; DOT_CHAINS]) -> i32 {
        let mut out = [0i32; 8];
        let mut s = 0i32;
        for a in acc {
            // SAFETY: an unaligned store of 32 bytes into an 8-element i32 array.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, a) };
            s = out.iter().fold(s, |x, &y| x.wrapping_add(y));
        }
        s
    }

    /// # Safety
    /// The CPU must have AVX-512 VNNI and VL.
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub(super) unsafe fn burst_vnni(seed: i32) -> i32 {
        let a = _mm256_set1_epi8(3);
        let b = _mm256_set1_epi32(seed);
        let mut acc = [_mm256_set1_epi32(seed); DOT_CHAINS];
        for _ in 0..DOT_ITERS {
            for acc in acc.iter_mut() {
                *acc = _mm256_dpbusd_epi32(*acc, a, b);
            }
        }
        fold(acc)
    }

    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn burst_avx2(seed: i32) -> i32 {
        let a = _mm256_set1_epi8(3);
        let b = _mm256_set1_epi32(seed);
        let ones = _mm256_set1_epi16(1);
        // An all-zero mask the compiler cannot see through: `b | (acc & zero)` is `b`, but it
        // depends on the chain, so the products are not hoisted out of the loop as constants
        // (they were: the burst timed only its `vpaddd`s, 5–7 times the real peak).
        let zero = std::hint::black_box(_mm256_setzero_si256());
        let mut acc = [_mm256_set1_epi32(seed); DOT_CHAINS];
        for _ in 0..DOT_ITERS {
            for acc in acc.iter_mut() {
                let bb = _mm256_or_si256(b, _mm256_and_si256(*acc, zero));
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(a, bb), ones);
                *acc = _mm256_add_epi32(*acc, p);
            }
        }
        fold(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bursts_compute_what_they_claim() {
        // Each chain adds 32 products of 3 and the seed's bytes per iteration: for seed 1 the
        // bytes are (1, 0, 0, 0), so each i32 lane gains 3 per iteration.
        let (_, f) = dot_burst_fn();
        let per_lane = 1 + 3 * DOT_ITERS as i64;
        let lanes = if cfg!(target_arch = "x86_64") && is_x86_feature_detected!("avx2") {
            8
        } else {
            1
        };
        if lanes == 8 {
            let want = (per_lane * 8 * DOT_CHAINS as i64) as i32;
            assert_eq!(f(1), want);
        }
        let s = burst_scalar(0);
        assert_eq!(
            s,
            (-6i64 * 32 * DOT_ITERS as i64 * DOT_CHAINS as i64) as i32
        );
    }

    #[test]
    fn limits_are_positive_and_finite() {
        let l = measure(16);
        assert!(l.read_gb_s.is_finite() && l.read_gb_s > 0.0, "{l:?}");
        assert!(
            l.int8_gmac_s_per_thread > 0.0 && l.int8_gmac_s > 0.0,
            "{l:?}"
        );
        assert_eq!(l.read_buffer_bytes, 16 << 20);
    }
}
