//! Statistics on plain numbers, below every other module: agreement between raters
//! ([`agreement`]: confusion matrices, Cohen's and Fleiss' κ with intervals) and paired
//! comparisons of two candidates scored on the same items ([`paired`]: differences,
//! bootstrap intervals, sign-flip and McNemar tests, Holm, detectable differences), the
//! crate's one random generator ([`rng`]) and plain summaries ([`summary`]). Nothing
//! here knows a benchmark, a model or a file, and nothing imports from the rest of the crate;
//! whatever is random is seeded, so the same numbers give the same output.

pub mod agreement;
pub mod paired;
pub mod rng;
pub mod summary;
