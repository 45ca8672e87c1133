//! Statistics on plain numbers, below every other module: agreement between raters
//! ([`agreement`]: confusion matrices, Cohen's and Fleiss' κ with intervals). Nothing here
//! knows a benchmark, a model or a file, and nothing imports from the rest of the crate;
//! whatever is random takes its seeded index source from the caller.

pub mod agreement;
