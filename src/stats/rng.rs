//! SplitMix64 (Steele, Lea and Flood, 2014), the crate's one random generator: the engine's
//! sampler, the bootstrap intervals, the sign-flip tests and the protocols' seeded choices all
//! draw from it. Written here rather than taken from a crate, so that every seeded number stays
//! bit-identical whatever versions of other crates are resolved.

/// SplitMix64: a tiny, well-mixed 64-bit generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The stream for one request's `step`-th token: a function of `(seed, step)` only.
    pub fn for_step(seed: u64, step: u64) -> SplitMix64 {
        let mut s = SplitMix64::new(step.wrapping_mul(GOLDEN) ^ 0xD1B5_4A32_D192_ED03);
        let mixed = s.next_u64();
        SplitMix64::new(seed ^ mixed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision (a multiple of 2^-53: the product is
    /// exact, the same bits as dividing by 2^53).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias.
    pub fn below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                return (x % n) as usize;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_sequence() {
        // First outputs of SplitMix64 seeded with 1234567 (from the reference C code).
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = SplitMix64::new(0);
        assert!((0..10_000).all(|_| r.below(3) < 3));
    }
}
