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
/// [`llama_metadata`] of `shape` with the integer keys `extra` (`<arch>.<key>`) after it.
pub fn tiny_metadata(
    shape: &TinyShape,
    extra: &[(&str, u32)],
) -> Vec<(String, candle_core::quantized::gguf_file::Value)> {
    let mut md = llama_metadata(shape);
    md.extend(extra.iter().map(|&(k, v)| {
        (
            format!("{}.{k}", shape.arch),
            candle_core::quantized::gguf_file::Value::U32(v),
        )
    }));
    md
}

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

/// A tensor as stored in a GGUF file, for [`write_gguf_raw`]: its ggml type id, dimensions
/// (outermost first) and bytes. It carries types candle's writer cannot (MXFP4, id 39).
pub struct RawTensor {
    pub name: String,
    pub dims: Vec<usize>,
    pub ggml_type: u32,
    pub bytes: Vec<u8>,
}

impl RawTensor {
    /// A candle tensor's stored bytes.
    pub fn from_q(name: &str, t: &candle_core::quantized::QTensor) -> RawTensor {
        use candle_core::quantized::GgmlDType as T;
        let ggml_type = match t.dtype() {
            T::F32 => 0,
            T::F16 => 1,
            T::Q4_0 => 2,
            T::Q4_1 => 3,
            T::Q5_0 => 6,
            T::Q5_1 => 7,
            T::Q8_0 => 8,
            T::Q8_1 => 9,
            T::Q2K => 10,
            T::Q3K => 11,
            T::Q4K => 12,
            T::Q5K => 13,
            T::Q6K => 14,
            T::Q8K => 15,
            T::BF16 => 30,
        };
        RawTensor {
            name: name.to_string(),
            dims: t.shape().dims().to_vec(),
            ggml_type,
            bytes: t.data().expect("tensor bytes").into_owned(),
        }
    }
}

/// Writes a GGUF (version 3, 32-byte alignment) of `metadata` and `tensors` at `path`, each
/// tensor's bytes as given. The metadata is serialised by candle's writer (a file with one
/// marker tensor, whose name starts right after the key-value pairs).
pub fn write_gguf_raw(
    path: &Path,
    metadata: &[(String, candle_core::quantized::gguf_file::Value)],
    tensors: &[RawTensor],
) {
    use std::io::Write;
    const MARKER: &str = "candor.write_gguf_raw.marker";
    let marker = candle_core::quantized::QTensor::quantize(
        &candle_core::Tensor::zeros(32, candle_core::DType::F32, &candle_core::Device::Cpu)
            .expect("zeros"),
        candle_core::quantized::GgmlDType::F32,
    )
    .expect("marker tensor");
    let mut head = std::io::Cursor::new(Vec::new());
    let md: Vec<_> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    candle_core::quantized::gguf_file::write(&mut head, &md, &[(MARKER, &marker)])
        .expect("metadata");
    let head = head.into_inner();
    let mut needle = (MARKER.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(MARKER.as_bytes());
    let kv_end = head
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("marker after the metadata");
    let pad = |n: usize| (32 - n % 32) % 32;
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    out.extend_from_slice(&head[24..kv_end]);
    let mut offset = 0usize;
    for t in tensors {
        out.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
        out.extend_from_slice(t.name.as_bytes());
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for &d in t.dims.iter().rev() {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&t.ggml_type.to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offset += t.bytes.len() + pad(t.bytes.len());
    }
    out.resize(out.len() + pad(out.len()), 0);
    for t in tensors {
        out.extend_from_slice(&t.bytes);
        out.resize(out.len() + pad(t.bytes.len()), 0);
    }
    let mut f = std::fs::File::create(path).expect("create gguf");
    f.write_all(&out).expect("write gguf");
}

/// Writes `metadata` and `tensors` as a GGUF split set of `parts` files in `dir`,
/// `<prefix>-0000i-of-0000n.gguf`, the way `llama-gguf-split --split` does: the tensors in
/// order, as evenly as they go, over the files (over all but the first with `first_empty`, as
/// `--no-tensor-first-split`); the first file holds the metadata with `split.tensors.count`,
/// every file `split.no` (zero-based) and `split.count` (u16s; the count an i32). `edit` may
/// change a file's metadata after (for malformed sets). Returns the files, first to last.
pub fn write_gguf_split(
    dir: &Path,
    prefix: &str,
    metadata: &[(String, candle_core::quantized::gguf_file::Value)],
    tensors: &[RawTensor],
    parts: usize,
    first_empty: bool,
    mut edit: impl FnMut(usize, &mut Vec<(String, candle_core::quantized::gguf_file::Value)>),
) -> Vec<PathBuf> {
    use candle_core::quantized::gguf_file::Value;
    let holders = if first_empty { parts - 1 } else { parts };
    let per = tensors.len().div_ceil(holders);
    let mut chunks: Vec<&[RawTensor]> = tensors.chunks(per).collect();
    if first_empty {
        chunks.insert(0, &[]);
    }
    assert_eq!(
        chunks.len(),
        parts,
        "{} tensors over {parts} splits",
        tensors.len()
    );
    let mut files = Vec::new();
    for (i, chunk) in chunks.into_iter().enumerate() {
        let mut md = if i == 0 {
            metadata.to_vec()
        } else {
            Vec::new()
        };
        md.push(("split.no".into(), Value::U16(i as u16)));
        md.push(("split.count".into(), Value::U16(parts as u16)));
        if i == 0 {
            md.push((
                "split.tensors.count".into(),
                Value::I32(tensors.len() as i32),
            ));
        }
        edit(i, &mut md);
        let path = dir.join(format!("{prefix}-{:05}-of-{parts:05}.gguf", i + 1));
        write_gguf_raw(&path, &md, chunk);
        files.push(path);
    }
    files
}

/// A greedy request for `n` new tokens after `ids`.
pub fn greedy_request(ids: Vec<u32>, n: usize) -> candor::engine::TokenRequest {
    candor::engine::TokenRequest::new(
        ids,
        candor::engine::SamplingParams {
            max_new_tokens: n,
            ..candor::engine::SamplingParams::default()
        },
    )
}
