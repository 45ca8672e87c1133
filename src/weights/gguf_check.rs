//! Validation of a GGUF file before anything is computed from it, like llama.cpp's loader or
//! stricter.
//!
//! candle's reader parses the header but accepts tensors whose data overlaps, sits outside
//! the file or is misaligned, and panics on `general.alignment = 0`. [`scan`] walks the header
//! itself (bounded by the file size, never allocating more than the file could hold) to get
//! the tensor infos in file order, and checks the layout: data offsets aligned to
//! `general.alignment`, each exactly where the previous tensor's padded data ends (so in order,
//! non-overlapping, no gaps), the data inside the file, at most 4 dimensions, element counts
//! that are whole blocks of the tensor's type. [`check_metadata`] then checks the parsed
//! header: the known keys have their expected types, the vocabulary arrays have equal
//! lengths, special token ids are inside the vocabulary and the embedding has one row per
//! token. Every failure is one line naming the file and the tensor or key.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value, ValueType};

use super::error::{Result, WeightsError};

/// GGUF's default data alignment.
const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Deepest nesting of metadata arrays.
const MAX_DEPTH: usize = 8;

/// A tensor info as written in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    pub name: String,
    /// Dimensions as stored (innermost first).
    pub dims: Vec<u64>,
    pub type_id: u32,
    /// Header byte offset of `type_id` (where a reader that does not know the type is
    /// shown another, see `gguf::read_header`).
    pub type_at: u64,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
}

/// What [`scan`] learns from a header.
#[derive(Debug, Clone)]
pub struct Layout {
    pub alignment: u64,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorEntry>,
    /// Where the data section starts.
    pub data_start: u64,
    pub file_size: u64,
}

/// Elements per block and bytes per block of a ggml type id (ggml's type traits), or `None`
/// for an id ggml does not define.
pub fn type_block(type_id: u32) -> Option<(u64, u64)> {
    Some(match type_id {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        16 => (256, 66),  // IQ2_XXS
        17 => (256, 74),  // IQ2_XS
        18 => (256, 98),  // IQ3_XXS
        19 => (256, 50),  // IQ1_S
        20 => (32, 18),   // IQ4_NL
        21 => (256, 110), // IQ3_S
        22 => (256, 82),  // IQ2_S
        23 => (256, 136), // IQ4_XS
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        29 => (256, 56),  // IQ1_M
        30 => (1, 2),     // BF16
        34 => (256, 54),  // TQ1_0
        35 => (256, 66),  // TQ2_0
        39 => (32, 17),   // MXFP4
        _ => return None,
    })
}

/// The header reader: little-endian fields, every length checked against what is left.
struct Cursor<'a, R> {
    r: &'a mut R,
    pos: u64,
    size: u64,
    path: &'a Path,
    wide: bool,
}

impl<R: Read + Seek> Cursor<'_, R> {
    fn err(&self, msg: impl std::fmt::Display) -> WeightsError {
        WeightsError::gguf(self.path, format!("{msg} (header byte {})", self.pos))
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>> {
        if n > self.size.saturating_sub(self.pos) {
            return Err(self.err(format!(
                "{what}: {n} bytes needed, the file ends {} bytes later",
                self.size.saturating_sub(self.pos)
            )));
        }
        let mut buf = vec![0u8; n as usize];
        self.r
            .read_exact(&mut buf)
            .map_err(|e| WeightsError::io(self.path, e))?;
        self.pos += n;
        Ok(buf)
    }

    fn skip(&mut self, n: u64, what: &str) -> Result<()> {
        if n > self.size.saturating_sub(self.pos) {
            return Err(self.err(format!("{what}: {n} bytes needed past the end of the file")));
        }
        self.pos += n;
        self.r
            .seek(SeekFrom::Start(self.pos))
            .map_err(|e| WeightsError::io(self.path, e))?;
        Ok(())
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        let b = self.bytes(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn len(&mut self, what: &str) -> Result<u64> {
        if self.wide {
            self.u64(what)
        } else {
            self.u32(what).map(u64::from)
        }
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.len(what)?;
        let b = self.bytes(n, what)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    /// Skips a value of type `ty`, returning it when it is a u32 (for `general.alignment`)
    /// and its type.
    fn skip_value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Option<u64>> {
        let fixed = |ty: u32| -> Option<u64> {
            match ty {
                0 | 1 | 7 => Some(1),
                2 | 3 => Some(2),
                4..=6 => Some(4),
                10..=12 => Some(8),
                _ => None,
            }
        };
        match ty {
            4 => Ok(Some(u64::from(self.u32(key)?))),
            8 => {
                let n = self.len(key)?;
                self.skip(n, key)?;
                Ok(None)
            }
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.err(format!("key `{key}`: arrays nested too deep")));
                }
                let item = self.u32(key)?;
                let n = self.len(key)?;
                match fixed(item) {
                    Some(w) => self.skip(n.saturating_mul(w), key)?,
                    None => {
                        // Each element takes at least one byte: a count past the end of the
                        // file is refused before looping over it.
                        if n > self.size.saturating_sub(self.pos) {
                            return Err(self.err(format!(
                                "key `{key}`: array of {n} elements longer than the file"
                            )));
                        }
                        for _ in 0..n {
                            self.skip_value(item, key, depth + 1)?;
                        }
                    }
                }
                Ok(None)
            }
            t => match fixed(t) {
                Some(w) => self.skip(w, key).map(|_| None),
                None => Err(self.err(format!("key `{key}`: unknown value type {t}"))),
            },
        }
    }
}

/// Walks the header of a GGUF file and checks its tensor layout (module docs). Leaves the
/// reader at the start of the file.
pub fn scan<R: Read + Seek>(path: &Path, reader: &mut R) -> Result<Layout> {
    let size = reader
        .seek(SeekFrom::End(0))
        .map_err(|e| WeightsError::io(path, e))?;
    reader
        .seek(SeekFrom::Start(0))
        .map_err(|e| WeightsError::io(path, e))?;
    let mut c = Cursor {
        r: reader,
        pos: 0,
        size,
        path,
        wide: true,
    };
    let magic = c.bytes(4, "magic")?;
    if magic != b"GGUF" {
        return Err(c.err("not a GGUF file (bad magic)"));
    }
    let version = c.u32("version")?;
    match version {
        1 => c.wide = false,
        2 | 3 => {}
        v => return Err(c.err(format!("unsupported GGUF version {v}"))),
    }
    let n_tensors = c.len("tensor count")?;
    let n_kv = c.len("metadata count")?;
    let mut alignment = DEFAULT_ALIGNMENT;
    let mut keys = HashSet::new();
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        let ty = c.u32(&key)?;
        let v = c.skip_value(ty, &key, 0)?;
        if key == "general.alignment" {
            alignment = match (ty, v) {
                (4, Some(a)) if a > 0 && a.is_power_of_two() => a,
                (4, Some(a)) => {
                    return Err(c.err(format!(
                        "key `general.alignment`: {a} is not a positive power of two"
                    )))
                }
                _ => {
                    return Err(c.err(format!(
                        "key `general.alignment`: expected a u32, found value type {ty}"
                    )))
                }
            };
        }
        if !keys.insert(key.clone()) {
            return Err(c.err(format!("key `{key}` appears twice")));
        }
    }
    let mut tensors = Vec::new();
    let mut names = HashSet::new();
    for _ in 0..n_tensors {
        let name = c.string("tensor name")?;
        let n_dims = c.u32(&name)?;
        if n_dims > MAX_DIMS {
            return Err(c.err(format!(
                "tensor `{name}`: {n_dims} dimensions, at most {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(if c.wide {
                c.u64(&name)?
            } else {
                u64::from(c.u32(&name)?)
            });
        }
        let type_at = c.pos;
        let type_id = c.u32(&name)?;
        let offset = c.u64(&name)?;
        if !names.insert(name.clone()) {
            return Err(c.err(format!("tensor `{name}` appears twice")));
        }
        tensors.push(TensorEntry {
            name,
            dims,
            type_id,
            type_at,
            offset,
        });
    }
    let data_start = c.pos.div_ceil(alignment).saturating_mul(alignment);
    let layout = Layout {
        alignment,
        tensors,
        data_start,
        file_size: size,
    };
    check_layout(path, &layout)?;
    reader
        .seek(SeekFrom::Start(0))
        .map_err(|e| WeightsError::io(path, e))?;
    Ok(layout)
}

/// The byte size of a tensor's data, checked: whole blocks, no overflow.
pub fn tensor_bytes(path: &Path, t: &TensorEntry) -> Result<u64> {
    let bad = |msg: String| WeightsError::gguf(path, format!("tensor `{}`: {msg}", t.name));
    let (block, bytes) =
        type_block(t.type_id).ok_or_else(|| bad(format!("unknown tensor type {}", t.type_id)))?;
    let mut elems: u64 = 1;
    for &d in &t.dims {
        if d == 0 || d > i64::MAX as u64 {
            return Err(bad(format!("dimension {d} in shape {:?}", t.dims)));
        }
        elems = elems
            .checked_mul(d)
            .ok_or_else(|| bad(format!("shape {:?} overflows", t.dims)))?;
    }
    if t.dims.first().is_some_and(|d| d % block != 0) {
        return Err(bad(format!(
            "row of {} elements is not a whole number of {block}-element blocks of type {}",
            t.dims[0], t.type_id
        )));
    }
    (elems / block)
        .checked_mul(bytes)
        .ok_or_else(|| bad(format!("shape {:?} overflows", t.dims)))
}

fn check_layout(path: &Path, layout: &Layout) -> Result<()> {
    let a = layout.alignment;
    let mut expected: u64 = 0;
    for t in &layout.tensors {
        let bad = |msg: String| WeightsError::gguf(path, format!("tensor `{}`: {msg}", t.name));
        let size = tensor_bytes(path, t)?;
        if t.offset % a != 0 {
            return Err(bad(format!(
                "data offset {} is not a multiple of the alignment {a}",
                t.offset
            )));
        }
        if t.offset != expected {
            return Err(bad(format!(
                "data offset {}, expected {expected} (tensors must follow each other in order)",
                t.offset
            )));
        }
        let end = layout
            .data_start
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(size))
            .filter(|&e| e <= layout.file_size)
            .ok_or_else(|| {
                bad(format!(
                    "{size} bytes at offset {} run past the end of the file ({} bytes)",
                    layout.data_start.saturating_add(t.offset),
                    layout.file_size
                ))
            })?;
        let _ = end;
        expected = t.offset.saturating_add(size.div_ceil(a).saturating_mul(a));
    }
    Ok(())
}

/// Keys whose type is known, with the types accepted.
fn expected_type(key: &str, arch: &str) -> Option<&'static [ValueType]> {
    use ValueType as T;
    const UINT: &[ValueType] = &[T::U8, T::U16, T::U32, T::U64];
    const FLOAT: &[ValueType] = &[T::F32, T::F64];
    const STRING: &[ValueType] = &[T::String];
    const BOOL: &[ValueType] = &[T::Bool];
    const ARRAY: &[ValueType] = &[T::Array];
    Some(match key {
        "general.architecture"
        | "general.name"
        | "tokenizer.ggml.model"
        | "tokenizer.ggml.pre"
        | "tokenizer.chat_template" => STRING,
        "general.alignment" => &[T::U32],
        "general.file_type" | "general.quantization_version" => UINT,
        "tokenizer.ggml.tokens"
        | "tokenizer.ggml.scores"
        | "tokenizer.ggml.token_type"
        | "tokenizer.ggml.merges" => ARRAY,
        "tokenizer.ggml.add_bos_token" | "tokenizer.ggml.add_eos_token" => BOOL,
        k if k.starts_with("tokenizer.ggml.") && k.ends_with("_token_id") => UINT,
        k => {
            let rest = k.strip_prefix(arch)?.strip_prefix('.')?;
            // One value per layer, or one for all (llama.cpp's `get_key_or_arr`), where the
            // architecture reads per-layer geometry (Gemma 4).
            let per_layer = crate::model::arch::Arch::from_gguf_name(arch)
                .is_ok_and(|a| crate::model::arch::ArchSpec::of(a).per_layer);
            match rest {
                "feed_forward_length" | "attention.head_count_kv" if per_layer => {
                    &[T::U8, T::U16, T::U32, T::U64, T::Array]
                }
                "context_length"
                | "embedding_length"
                | "block_count"
                | "feed_forward_length"
                | "attention.head_count"
                | "attention.head_count_kv"
                | "rope.dimension_count"
                | "vocab_size" => UINT,
                "attention.layer_norm_rms_epsilon" | "rope.freq_base" | "rope.scaling.factor" => {
                    FLOAT
                }
                _ => return None,
            }
        }
    })
}

/// Checks a parsed header's metadata and vocabulary (module docs).
pub fn check_metadata(path: &Path, content: &Content) -> Result<()> {
    let bad = |key: &str, msg: String| WeightsError::gguf(path, format!("key `{key}`: {msg}"));
    let arch = match content.metadata.get("general.architecture") {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    };
    let mut keys: Vec<&String> = content.metadata.keys().collect();
    keys.sort();
    for key in keys {
        let v = &content.metadata[key];
        if let Some(types) = expected_type(key, &arch) {
            if !types.contains(&v.value_type()) {
                return Err(bad(
                    key,
                    format!("expected {types:?}, found {:?}", v.value_type()),
                ));
            }
        }
    }
    let array = |key: &str, item: ValueType| -> Result<Option<usize>> {
        match content.metadata.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => {
                if let Some(i) = items.iter().position(|v| v.value_type() != item) {
                    return Err(bad(
                        key,
                        format!(
                            "element {i} is {:?}, expected {item:?}",
                            items[i].value_type()
                        ),
                    ));
                }
                Ok(Some(items.len()))
            }
            Some(_) => Err(bad(key, "expected an array".into())),
        }
    };
    let n_vocab = array("tokenizer.ggml.tokens", ValueType::String)?;
    array("tokenizer.ggml.merges", ValueType::String)?;
    for (key, item) in [
        ("tokenizer.ggml.scores", ValueType::F32),
        ("tokenizer.ggml.token_type", ValueType::I32),
    ] {
        if let Some(n) = array(key, item)? {
            match n_vocab {
                Some(v) if v != n => {
                    return Err(bad(
                        key,
                        format!("{n} entries for {v} tokens in `tokenizer.ggml.tokens`"),
                    ))
                }
                None => return Err(bad(key, "present without `tokenizer.ggml.tokens`".into())),
                _ => {}
            }
        }
    }
    let Some(n_vocab) = n_vocab else {
        return Ok(());
    };
    let mut keys: Vec<&String> = content
        .metadata
        .keys()
        .filter(|k| k.starts_with("tokenizer.ggml.") && k.ends_with("_token_id"))
        .collect();
    keys.sort();
    for key in keys {
        let id = match content.metadata[key] {
            Value::U8(x) => u64::from(x),
            Value::U16(x) => u64::from(x),
            Value::U32(x) => u64::from(x),
            Value::U64(x) => x,
            _ => continue,
        };
        // llama.cpp writes -1 (as u32) for "none".
        if id >= n_vocab as u64 && id != u64::from(u32::MAX) {
            return Err(bad(
                key,
                format!("token id {id} is outside the vocabulary of {n_vocab} tokens"),
            ));
        }
    }
    for name in ["token_embd.weight", "output.weight"] {
        if let Some(info) = content.tensor_infos.get(name) {
            let rows = info.shape.dims().first().copied().unwrap_or(0);
            if rows != n_vocab {
                return Err(WeightsError::gguf(
                    path,
                    format!("tensor `{name}`: {rows} rows for a vocabulary of {n_vocab} tokens"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(out: &mut Vec<u8>, x: &str) {
        out.extend((x.len() as u64).to_le_bytes());
        out.extend(x.as_bytes());
    }

    /// A GGUF with one u32 `general.alignment` and F32 tensors of the given lengths/offsets.
    fn file(alignment: u32, tensors: &[(&str, u64, u64)], data: usize) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend(1u64.to_le_bytes());
        s(&mut out, "general.alignment");
        out.extend(4u32.to_le_bytes());
        out.extend(alignment.to_le_bytes());
        for (name, n, offset) in tensors {
            s(&mut out, name);
            out.extend(1u32.to_le_bytes());
            out.extend(n.to_le_bytes());
            out.extend(0u32.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        let a = alignment.max(1) as usize;
        while !out.len().is_multiple_of(a) {
            out.push(0);
        }
        out.resize(out.len() + data, 0);
        out
    }

    fn scan_bytes(b: &[u8]) -> Result<Layout> {
        scan(Path::new("m.gguf"), &mut std::io::Cursor::new(b))
    }

    #[test]
    fn packed_tensors_pass() {
        let l = scan_bytes(&file(32, &[("a", 8, 0), ("b", 3, 32), ("c", 1, 64)], 68)).unwrap();
        assert_eq!(l.tensors.len(), 3);
        assert_eq!(l.tensors[1].name, "b");
    }

    #[test]
    fn layout_errors_are_one_line_and_name_the_tensor() {
        let cases: &[(Vec<u8>, &str)] = &[
            (
                file(32, &[("a", 8, 0), ("b", 8, 30)], 96),
                "tensor `b`: data offset 30 is not a multiple",
            ),
            (
                file(32, &[("a", 16, 0), ("b", 8, 32)], 96),
                "tensor `b`: data offset 32, expected 64",
            ),
            (
                file(32, &[("a", 8, 32), ("b", 8, 0)], 96),
                "tensor `a`: data offset 32, expected 0",
            ),
            (
                file(32, &[("a", 8, 0), ("b", 8, 32)], 40),
                "tensor `b`: 32 bytes at offset",
            ),
            (file(0, &[("a", 8, 0)], 32), "`general.alignment`: 0 is not"),
            (
                file(24, &[("a", 8, 0)], 48),
                "`general.alignment`: 24 is not",
            ),
            (
                file(32, &[("a", 8, 0), ("a", 8, 32)], 64),
                "tensor `a` appears twice",
            ),
            (file(32, &[("a", 0, 0)], 64), "tensor `a`: dimension 0"),
        ];
        for (bytes, want) in cases {
            let err = scan_bytes(bytes).unwrap_err().to_string();
            assert!(err.starts_with("m.gguf: gguf: "), "{err}");
            assert!(err.contains(want), "{err} lacks {want}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn truncated_headers_are_errors() {
        let full = file(32, &[("a", 8, 0), ("b", 3, 32)], 44);
        for cut in 0..full.len() - 44 {
            assert!(scan_bytes(&full[..cut]).is_err(), "cut at {cut}");
        }
    }

    fn content(n_tokens: usize, embd_rows: usize) -> Content {
        use candle_core::quantized::gguf_file::{TensorInfo, VersionedMagic};
        use candle_core::quantized::GgmlDType;
        let mut metadata = std::collections::HashMap::new();
        let tokens = (0..n_tokens)
            .map(|i| Value::String(format!("t{i}")))
            .collect();
        metadata.insert("general.architecture".into(), Value::String("llama".into()));
        metadata.insert("tokenizer.ggml.tokens".into(), Value::Array(tokens));
        metadata.insert(
            "tokenizer.ggml.scores".into(),
            Value::Array(vec![Value::F32(0.0); n_tokens]),
        );
        metadata.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(1));
        let mut tensor_infos = std::collections::HashMap::new();
        tensor_infos.insert(
            "token_embd.weight".to_string(),
            TensorInfo {
                ggml_dtype: GgmlDType::F32,
                shape: candle_core::Shape::from((embd_rows, 4)),
                offset: 0,
            },
        );
        Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos,
            tensor_data_offset: 0,
        }
    }

    #[test]
    fn metadata_and_vocabulary_checks() {
        let p = Path::new("m.gguf");
        check_metadata(p, &content(4, 4)).unwrap();
        let err = |c: &Content| check_metadata(p, c).unwrap_err().to_string();
        let e = err(&content(4, 5));
        assert!(
            e.contains("tensor `token_embd.weight`: 5 rows for a vocabulary of 4"),
            "{e}"
        );
        let mut c = content(4, 4);
        c.metadata
            .insert("tokenizer.ggml.eos_token_id".into(), Value::U32(4));
        let e = err(&c);
        assert!(
            e.contains("`tokenizer.ggml.eos_token_id`: token id 4 is outside"),
            "{e}"
        );
        let mut c = content(4, 4);
        c.metadata.insert(
            "tokenizer.ggml.scores".into(),
            Value::Array(vec![Value::F32(0.0); 3]),
        );
        let e = err(&c);
        assert!(
            e.contains("`tokenizer.ggml.scores`: 3 entries for 4 tokens"),
            "{e}"
        );
        let mut c = content(4, 4);
        c.metadata
            .insert("llama.block_count".into(), Value::String("30".into()));
        let e = err(&c);
        assert!(e.contains("`llama.block_count`: expected"), "{e}");
        let mut c = content(4, 4);
        c.metadata.insert(
            "tokenizer.ggml.tokens".into(),
            Value::Array(vec![Value::U32(0); 4]),
        );
        let e = err(&c);
        assert!(e.contains("element 0 is U32"), "{e}");
        assert!(e.starts_with("m.gguf: gguf: ") && !e.contains('\n'), "{e}");
    }
}
