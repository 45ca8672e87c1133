//! Safetensors files: their headers validated, and the shards of a checkpoint folder
//! (`*.safetensors`, one file or shards listed by `model.safetensors.index.json`) checked
//! against their index. `model::checkpoint` reads a checkpoint's tensors for an architecture.
//!
//! Every safetensors header is validated before any tensor is used, as strictly as llama.cpp
//! validates GGUF: the header length fits the file, the header is a JSON object, each tensor's
//! dtype is known, its `data_offsets` lie inside the data section, its byte size equals the
//! product of its shape times the dtype size, and no two tensors overlap. A sharded checkpoint
//! must agree with its index: every shard the index names exists and holds exactly the tensors
//! the index assigns to it. Each failure is a one-line error naming the file and the tensor or
//! key. Tensor data is then read through candle's memory-mapped safetensors reader.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::error::{Result, WeightsError};

/// Largest header accepted (the format's own reader caps it at 100 MB too).
const MAX_HEADER: u64 = 100_000_000;

/// Name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor's entry in a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Byte range inside the data section.
    pub begin: usize,
    pub end: usize,
}

/// A validated safetensors header.
#[derive(Debug, Clone)]
pub struct Header {
    pub tensors: Vec<TensorEntry>,
    /// Bytes of tensor data after the header.
    pub data_len: usize,
}

fn st_err(path: &Path, msg: impl Into<String>) -> WeightsError {
    WeightsError::Safetensors {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Bytes per element of a safetensors dtype, `None` when unknown.
fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "I16" | "U16" | "F16" | "BF16" => 2,
        "I32" | "U32" | "F32" => 4,
        "I64" | "U64" | "F64" => 8,
        _ => return None,
    })
}

/// Reads and validates the header of a safetensors file.
pub fn read_header(path: &Path) -> Result<Header> {
    let mut file = File::open(path).map_err(|e| WeightsError::io(path, e))?;
    let file_len = file
        .metadata()
        .map_err(|e| WeightsError::io(path, e))?
        .len();
    let mut len8 = [0u8; 8];
    if file_len < 8 {
        return Err(st_err(
            path,
            format!("file is {file_len} bytes, shorter than the 8-byte header length"),
        ));
    }
    file.read_exact(&mut len8)
        .map_err(|e| WeightsError::io(path, e))?;
    let n = u64::from_le_bytes(len8);
    if n > MAX_HEADER || n > file_len - 8 {
        return Err(st_err(
            path,
            format!("header length {n} exceeds the file ({file_len} bytes) or the 100 MB cap"),
        ));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header)
        .map_err(|e| WeightsError::io(path, e))?;
    parse_header(path, &header, (file_len - 8 - n) as usize)
}

/// Validates a header's JSON bytes against a data section of `data_len` bytes.
pub fn parse_header(path: &Path, header: &[u8], data_len: usize) -> Result<Header> {
    let text = std::str::from_utf8(header)
        .map_err(|e| st_err(path, format!("header is not UTF-8: {e}")))?;
    let json: Json = serde_json::from_str(text)
        .map_err(|e| st_err(path, format!("header is not valid JSON: {e}")))?;
    let obj = json
        .as_object()
        .ok_or_else(|| st_err(path, "header is not a JSON object"))?;
    let mut tensors = Vec::with_capacity(obj.len());
    for (name, v) in obj {
        if name == "__metadata__" {
            let ok = v
                .as_object()
                .is_some_and(|m| m.values().all(Json::is_string));
            if !ok {
                return Err(st_err(path, "key `__metadata__`: not an object of strings"));
            }
            continue;
        }
        let bad = |msg: String| st_err(path, format!("tensor `{name}`: {msg}"));
        let dtype = v
            .get("dtype")
            .and_then(Json::as_str)
            .ok_or_else(|| bad("missing or non-string `dtype`".into()))?;
        let size = dtype_size(dtype).ok_or_else(|| bad(format!("unknown dtype `{dtype}`")))?;
        let shape: Vec<usize> = v
            .get("shape")
            .and_then(Json::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| {
                bad("missing `shape` or a dimension that is not an unsigned integer".into())
            })?;
        let offsets: Vec<usize> = v
            .get("data_offsets")
            .and_then(Json::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                    .collect::<Option<Vec<_>>>()
            })
            .filter(|o| o.len() == 2)
            .ok_or_else(|| bad("`data_offsets` is not two unsigned integers".into()))?;
        let (begin, end) = (offsets[0], offsets[1]);
        if begin > end || end > data_len {
            return Err(bad(format!(
                "data_offsets [{begin}, {end}] outside the data section ({data_len} bytes)"
            )));
        }
        let want = shape
            .iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
        if end - begin != want {
            return Err(bad(format!(
                "{} bytes at data_offsets [{begin}, {end}], but shape {shape:?} of {dtype} needs {want}",
                end - begin
            )));
        }
        tensors.push(TensorEntry {
            name: name.clone(),
            dtype: dtype.to_string(),
            shape,
            begin,
            end,
        });
    }
    let mut order: Vec<&TensorEntry> = tensors.iter().filter(|t| t.end > t.begin).collect();
    order.sort_by_key(|t| (t.begin, t.end));
    for w in order.windows(2) {
        if w[1].begin < w[0].end {
            return Err(st_err(
                path,
                format!(
                    "tensor `{}`: data_offsets [{}, {}] overlap tensor `{}` [{}, {}]",
                    w[1].name, w[1].begin, w[1].end, w[0].name, w[0].begin, w[0].end
                ),
            ));
        }
    }
    Ok(Header { tensors, data_len })
}

/// The safetensors files of a checkpoint folder, each with its validated header, checked
/// against the shard index when there is one.
pub fn checkpoint_shards(dir: &Path) -> Result<Vec<(PathBuf, Header)>> {
    let index_path = dir.join(INDEX_FILE);
    if index_path.is_file() {
        return shards_from_index(&index_path);
    }
    let single = dir.join("model.safetensors");
    let files = if single.is_file() {
        vec![single]
    } else {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| WeightsError::io(dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        v.sort();
        if v.len() != 1 {
            return Err(st_err(
                dir,
                format!(
                    "{} .safetensors files and no {INDEX_FILE} to say which belong together",
                    v.len()
                ),
            ));
        }
        v
    };
    files
        .into_iter()
        .map(|p| read_header(&p).map(|h| (p, h)))
        .collect()
}

/// Reads an index, validates every shard it names and checks that they agree.
pub fn shards_from_index(index_path: &Path) -> Result<Vec<(PathBuf, Header)>> {
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let text = std::fs::read_to_string(index_path).map_err(|e| WeightsError::io(index_path, e))?;
    let json: Json = serde_json::from_str(&text)
        .map_err(|e| st_err(index_path, format!("not valid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(Json::as_object)
        .ok_or_else(|| st_err(index_path, "key `weight_map`: missing or not an object"))?;
    // tensor -> shard, and shard -> its tensors.
    let mut by_shard: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (tensor, shard) in map {
        let shard = shard.as_str().ok_or_else(|| {
            st_err(
                index_path,
                format!("key `weight_map.{tensor}`: not a file name"),
            )
        })?;
        let plain = !shard.is_empty()
            && !shard.contains(['/', '\\'])
            && shard != "."
            && shard != ".."
            && shard.ends_with(".safetensors");
        if !plain {
            return Err(st_err(
                index_path,
                format!("key `weight_map.{tensor}`: `{shard}` is not a .safetensors file name in this folder"),
            ));
        }
        by_shard
            .entry(shard.to_string())
            .or_default()
            .push(tensor.clone());
    }
    if by_shard.is_empty() {
        return Err(st_err(index_path, "key `weight_map`: empty"));
    }
    let mut out = Vec::with_capacity(by_shard.len());
    for (shard, listed) in by_shard {
        let path = dir.join(&shard);
        if !path.is_file() {
            return Err(st_err(
                index_path,
                format!("shard `{shard}` (for tensor `{}`) is missing", listed[0]),
            ));
        }
        let header = read_header(&path)?;
        let held: HashMap<&str, ()> = header
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), ()))
            .collect();
        if let Some(t) = listed.iter().find(|t| !held.contains_key(t.as_str())) {
            return Err(st_err(
                &path,
                format!("tensor `{t}`: listed in {INDEX_FILE} for this shard but not in it"),
            ));
        }
        if let Some(t) = header
            .tensors
            .iter()
            .find(|t| map.get(&t.name).and_then(Json::as_str) != Some(shard.as_str()))
        {
            return Err(st_err(
                &path,
                format!(
                    "tensor `{}`: in this shard but {INDEX_FILE} does not assign it here",
                    t.name
                ),
            ));
        }
        out.push((path, header));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file from a header object and `data_len` zero bytes of data.
    fn write(dir: &Path, name: &str, header: &Json, data_len: usize) -> PathBuf {
        let h = serde_json::to_vec(header).unwrap();
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&h);
        bytes.extend(std::iter::repeat_n(0u8, data_len));
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn good() -> Json {
        serde_json::json!({
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
        })
    }

    fn err_of(dir: &Path, header: &Json, data_len: usize) -> String {
        let p = write(dir, "x.safetensors", header, data_len);
        let e = read_header(&p).unwrap_err().to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        assert!(e.contains("x.safetensors"), "names the file: {e}");
        e
    }

    #[test]
    fn a_valid_header_passes() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "x.safetensors", &good(), 32);
        let h = read_header(&p).unwrap();
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.data_len, 32);
    }

    #[test]
    fn broken_headers_are_one_line_errors_naming_file_and_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut h = good();
        h["b"]["data_offsets"] = serde_json::json!([24, 40]);
        let e = err_of(d, &h, 32);
        assert!(e.contains("`b`") && e.contains("outside"), "{e}");

        let mut h = good();
        h["b"]["data_offsets"] = serde_json::json!([20, 28]);
        let e = err_of(d, &h, 32);
        assert!(e.contains("overlap") && e.contains("`a`"), "{e}");

        let mut h = good();
        h["a"]["shape"] = serde_json::json!([2, 4]);
        let e = err_of(d, &h, 32);
        assert!(e.contains("`a`") && e.contains("needs 32"), "{e}");

        let mut h = good();
        h["a"]["dtype"] = serde_json::json!("F42");
        let e = err_of(d, &h, 32);
        assert!(e.contains("unknown dtype `F42`"), "{e}");

        let mut h = good();
        h["a"]["data_offsets"] = serde_json::json!([8, 4]);
        let e = err_of(d, &h, 32);
        assert!(e.contains("`a`"), "{e}");

        let mut h = good();
        h["a"]["shape"] = serde_json::json!([u64::MAX, 4]);
        let e = err_of(d, &h, 32);
        assert!(e.contains("overflows"), "{e}");

        let mut h = good();
        h["__metadata__"] = serde_json::json!({"x": 1});
        let e = err_of(d, &h, 32);
        assert!(e.contains("__metadata__"), "{e}");

        // Header length beyond the file; a truncated file; not JSON.
        let p = d.join("len.safetensors");
        let mut bytes = 1_000u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&p, bytes).unwrap();
        assert!(read_header(&p)
            .unwrap_err()
            .to_string()
            .contains("header length 1000"));
        std::fs::write(&p, b"abc").unwrap();
        assert!(read_header(&p).unwrap_err().to_string().contains("shorter"));
        let mut bytes = 3u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{x}");
        std::fs::write(&p, bytes).unwrap();
        assert!(read_header(&p)
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
    }

    #[test]
    fn shards_must_agree_with_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            d,
            "s1.safetensors",
            &serde_json::json!({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}),
            4,
        );
        write(
            d,
            "s2.safetensors",
            &serde_json::json!({
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}),
            4,
        );
        let index = d.join(INDEX_FILE);
        let put = |map: Json| {
            std::fs::write(
                &index,
                serde_json::to_vec(&serde_json::json!({"weight_map": map})).unwrap(),
            )
            .unwrap()
        };
        put(serde_json::json!({"a": "s1.safetensors", "b": "s2.safetensors"}));
        assert_eq!(checkpoint_shards(d).unwrap().len(), 2);

        put(serde_json::json!({"a": "s1.safetensors", "b": "s1.safetensors"}));
        let e = checkpoint_shards(d).unwrap_err().to_string();
        assert!(
            e.contains("s1.safetensors") && e.contains("`b`") && e.contains("not in it"),
            "{e}"
        );

        write(
            d,
            "s1.safetensors",
            &serde_json::json!({
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "c": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}),
            8,
        );
        put(serde_json::json!({"a": "s1.safetensors", "b": "s2.safetensors"}));
        let e = checkpoint_shards(d).unwrap_err().to_string();
        assert!(
            e.contains("s1.safetensors") && e.contains("`c`") && e.contains("does not assign"),
            "{e}"
        );
        std::fs::remove_file(d.join("s1.safetensors")).unwrap();
        put(serde_json::json!({"a": "s1.safetensors", "b": "s2.safetensors"}));
        let e = checkpoint_shards(d).unwrap_err().to_string();
        assert!(e.contains("s1.safetensors") && e.contains("missing"), "{e}");
        put(serde_json::json!({"b": "s2.safetensors", "c": "s3.safetensors"}));
        let e = checkpoint_shards(d).unwrap_err().to_string();
        assert!(e.contains("s3.safetensors") && e.contains("missing"), "{e}");

        put(serde_json::json!({"a": "../s2.safetensors", "b": "s2.safetensors"}));
        // (`a` sorts first, so its entry is the one reported)
        let e = checkpoint_shards(d).unwrap_err().to_string();
        assert!(e.contains("weight_map.a"), "{e}");
    }
}
