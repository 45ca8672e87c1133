//! Helpers shared by the integration tests: where the authors' data and the default model
//! are, and the rule for when they are absent.
//!
//! Absent data or model: the test says loudly that it was skipped, is counted in the summary
//! printed when the test binary exits, and passes, except under CI (`CI=true`), where absence
//! is a failure (the rule: [`candor::skip`]).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub use candor::skip::{absent, Need};

#[track_caller]
fn missing(need: Need, what: &str, path: &Path, hint: &str) {
    absent(
        need,
        format!("{what} not found at {} ({hint})", path.display()),
    );
}

/// The folder named by `var` for a reference test that is `#[ignore]`d unless asked for
/// (`cargo test -- --ignored`): asked for without it, the test fails with `how`.
pub fn reference_dir(var: &str, how: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(dir) => PathBuf::from(dir),
        None => panic!("this reference test needs {var}: {how}"),
    }
}

/// A file under the public data folder (`$CANDOR_DATA`, default `../shared/data`) for a
/// reference test that is `#[ignore]`d unless asked for: asked for without it, the test fails
/// with `how`.
pub fn reference_file(rel: &str, how: &str) -> PathBuf {
    let p = candor::bench::data_root().join(rel);
    if !p.is_file() {
        panic!("this reference test needs {}: {how}", p.display());
    }
    p
}

/// The authors' public data (`$CANDOR_DATA`, default `../shared/data`), or `None` (skip).
#[track_caller]
pub fn shared_data() -> Option<PathBuf> {
    let root = candor::bench::data_root();
    if root.is_dir() {
        Some(root)
    } else {
        missing(
            Need::Data,
            "the authors' public data",
            &root,
            "set CANDOR_DATA",
        );
        None
    }
}

/// A file under the public data folder, or `None` (skip).
#[track_caller]
pub fn shared_file(rel: &str) -> Option<PathBuf> {
    let p = shared_data()?.join(rel);
    if p.exists() {
        Some(p)
    } else {
        missing(Need::Data, "a public data file", &p, "set CANDOR_DATA");
        None
    }
}

/// The default model's GGUF file, or `None` (skip).
#[track_caller]
pub fn default_model() -> Option<PathBuf> {
    // CANDOR_TEST_MODEL: the file elsewhere (a test binary run on another machine, e.g. a GPU).
    let p = std::env::var_os("CANDOR_TEST_MODEL").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        PathBuf::from,
    );
    if p.is_file() {
        Some(p)
    } else {
        missing(
            Need::Model,
            "the default model",
            &p,
            "run `cargo run -- setup`",
        );
        None
    }
}

/// The shape of a random llama-family GGUF written by a test.
pub struct TinyShape {
    pub arch: &'static str,
    pub layers: usize,
    pub dim: usize,
    pub ffn: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub context: u32,
}

/// The metadata a llama-family GGUF of `shape` needs (rope base 10000, RMS epsilon 1e-5).
pub fn llama_metadata(
    shape: &TinyShape,
) -> Vec<(String, candle_core::quantized::gguf_file::Value)> {
    use candle_core::quantized::gguf_file::Value;
    let a = shape.arch;
    vec![
        ("general.architecture".into(), Value::String(a.into())),
        (format!("{a}.block_count"), Value::U32(shape.layers as u32)),
        (format!("{a}.context_length"), Value::U32(shape.context)),
        (
            format!("{a}.embedding_length"),
            Value::U32(shape.dim as u32),
        ),
        (
            format!("{a}.feed_forward_length"),
            Value::U32(shape.ffn as u32),
        ),
        (
            format!("{a}.attention.head_count"),
            Value::U32(shape.heads as u32),
        ),
        (
            format!("{a}.attention.head_count_kv"),
            Value::U32(shape.kv_heads as u32),
        ),
        (format!("{a}.rope.freq_base"), Value::F32(10000.0)),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-5),
        ),
    ]
}

/// Every tensor of an open GGUF file (`content` read from `f`), copied, in name order: what a
/// test writes back with other metadata.
pub fn gguf_tensors(
    content: &candle_core::quantized::gguf_file::Content,
    f: &mut std::fs::File,
) -> Vec<(String, candle_core::quantized::QTensor)> {
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let t = content
                .tensor(f, n, &candle_core::Device::Cpu)
                .expect("tensor");
            (n.clone(), t)
        })
        .collect()
}

/// Writes a GGUF file of `metadata` and `tensors` at `path`.
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, candle_core::quantized::gguf_file::Value)],
    tensors: &[(String, candle_core::quantized::QTensor)],
) {
    let mut f = std::fs::File::create(path).expect("create gguf");
    let md: Vec<_> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let ts: Vec<_> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    candle_core::quantized::gguf_file::write(&mut f, &md, &ts).expect("write gguf");
}
