//! Helpers shared by the integration tests: where the authors' data and the default model
//! are, and the rule for when they are absent.
//!
//! Absent data or model: the test says loudly that it was skipped and passes, except under
//! CI (`CI=true`), where absence is a failure.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

fn under_ci() -> bool {
    std::env::var("CI").map(|v| v == "true").unwrap_or(false)
}

fn missing(what: &str, path: &Path, hint: &str) {
    let msg = format!("{what} not found at {} ({hint})", path.display());
    if under_ci() {
        panic!("{msg}; under CI=true this is a failure");
    }
    eprintln!("\n*** SKIPPED: {msg} ***\n");
}

/// The authors' public data (`$CANDOR_DATA`, default `../shared/data`), or `None` (skip).
pub fn shared_data() -> Option<PathBuf> {
    let root = candor::bench::data_root();
    if root.is_dir() {
        Some(root)
    } else {
        missing("the authors' public data", &root, "set CANDOR_DATA");
        None
    }
}

/// A file under the public data folder, or `None` (skip).
pub fn shared_file(rel: &str) -> Option<PathBuf> {
    let p = shared_data()?.join(rel);
    if p.exists() {
        Some(p)
    } else {
        missing("a public data file", &p, "set CANDOR_DATA");
        None
    }
}

/// The default model's GGUF file, or `None` (skip).
pub fn default_model() -> Option<PathBuf> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.is_file() {
        Some(p)
    } else {
        missing("the default model", &p, "run `cargo run -- setup`");
        None
    }
}
