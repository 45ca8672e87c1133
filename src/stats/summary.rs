//! Summaries of plain numbers: the mean and the percentile the intervals are read from.

/// Arithmetic mean; NaN for an empty slice.
pub fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        f64::NAN
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// Linear-interpolated percentile (`p` in 0..=100) of sorted values (numpy's default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_interpolates_as_numpy() {
        // numpy.percentile([1, 2, 3, 4], [0, 25, 50, 97.5, 100]) = 1, 1.75, 2.5, 3.925, 4.
        let v = [1.0, 2.0, 3.0, 4.0];
        let got: Vec<f64> = [0.0, 25.0, 50.0, 97.5, 100.0]
            .iter()
            .map(|&p| percentile(&v, p))
            .collect();
        let want = [1.0, 1.75, 2.5, 3.925, 4.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?}");
        }
        assert!(mean(&[]).is_nan());
        assert_eq!(mean(&v), 2.5);
    }
}
