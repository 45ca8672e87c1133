//! GGUF files: open one, read typed metadata values and hand out its tensors by name.
//!
//! The architectures' GGUF keys are read above, by `model::arch`; this module knows no
//! architecture and builds no layer. Absent tensors are reported as such, never guessed: "is there an
//! `output.weight`?" is answered by looking the name up, not by catching a read error.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use memmap2::Mmap;

use super::error::{Result, WeightsError};
use super::gguf_check::TensorEntry;
use super::stored::{StoredType, MXFP4_TYPE_ID};
use crate::weights::mapped::MappedBytes;

fn md<'a>(content: &'a Content, key: &str) -> Result<&'a Value> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| WeightsError::Metadata {
            key: key.into(),
            msg: "missing".into(),
        })
}

fn md_err(key: &str, e: candle_core::Error) -> WeightsError {
    WeightsError::Metadata {
        key: key.into(),
        msg: e.to_string(),
    }
}

/// An unsigned integer metadata value of any width.
pub fn md_usize(content: &Content, key: &str) -> Result<usize> {
    let v = md(content, key)?;
    let n = match v {
        Value::U8(x) => *x as u64,
        Value::U16(x) => *x as u64,
        Value::U32(x) => *x as u64,
        Value::U64(x) => *x,
        Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => {
            let x = v.to_i64().or_else(|_| v.to_i32().map(i64::from));
            let x = x.map_err(|e| md_err(key, e))?;
            u64::try_from(x).map_err(|_| WeightsError::Metadata {
                key: key.into(),
                msg: format!("negative value {x}"),
            })?
        }
        other => {
            return Err(WeightsError::Metadata {
                key: key.into(),
                msg: format!("expected an integer, found {:?}", other.value_type()),
            })
        }
    };
    usize::try_from(n).map_err(|_| WeightsError::Metadata {
        key: key.into(),
        msg: format!("value {n} too large"),
    })
}

/// A float metadata value (f32 or f64).
pub fn md_f32(content: &Content, key: &str) -> Result<f32> {
    match md(content, key)? {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        other => Err(WeightsError::Metadata {
            key: key.into(),
            msg: format!("expected a float, found {:?}", other.value_type()),
        }),
    }
}

/// A string metadata value.
pub fn md_string(content: &Content, key: &str) -> Result<String> {
    md(content, key)?
        .to_string()
        .cloned()
        .map_err(|e| md_err(key, e))
}

/// Reads and validates a GGUF header ([`super::gguf_check`]): the tensor layout first (candle's
/// reader trusts offsets and panics on `general.alignment = 0`), then the metadata. `path`
/// names the file in errors. Tensors of types candle does not know (MXFP4) are not in the
/// returned `tensor_infos`; [`GgufFile`] hands them out ([`GgufFile::mapped_stored`]).
pub fn read_checked<R: Read + std::io::Seek>(path: &Path, reader: &mut R) -> Result<Content> {
    Ok(read_header(path, reader)?.0)
}

/// A tensor candle's reader does not know, found by [`super::gguf_check::scan`].
#[derive(Debug, Clone)]
struct OtherTensor {
    stored: StoredType,
    /// Outermost dimension first, as candle orders it.
    shape: Vec<usize>,
    /// Relative to the data section.
    offset: u64,
}

/// [`read_checked`], and the tensors it leaves out of `tensor_infos` by name.
fn read_header<R: Read + std::io::Seek>(
    path: &Path,
    reader: &mut R,
) -> Result<(Content, HashMap<String, OtherTensor>)> {
    let layout = super::gguf_check::scan(path, reader)?;
    let others: Vec<&TensorEntry> = (layout.tensors.iter())
        .filter(|t| t.type_id == MXFP4_TYPE_ID)
        .collect();
    let candle_err = |e: candle_core::Error| WeightsError::gguf(path, e.to_string());
    let mut content = if others.is_empty() {
        Content::read(reader).map_err(candle_err)?
    } else {
        // candle 0.11 refuses the whole file on a type it does not know: show it the header
        // with those tensors typed F32 (it only records types, it reads no data), then drop
        // them from its table. The scan checked their sizes against their real type.
        let mut header = vec![0u8; layout.data_start.min(layout.file_size) as usize];
        reader
            .read_exact(&mut header)
            .map_err(|e| WeightsError::io(path, e))?;
        for t in &others {
            let at = t.type_at as usize;
            header[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
        }
        Content::read(&mut std::io::Cursor::new(header)).map_err(candle_err)?
    };
    let mut other = HashMap::new();
    for t in others {
        content.tensor_infos.remove(&t.name);
        let shape = t.dims.iter().rev().map(|&d| d as usize).collect();
        let entry = OtherTensor {
            stored: StoredType::Mxfp4,
            shape,
            offset: t.offset,
        };
        other.insert(t.name.clone(), entry);
    }
    super::gguf_check::check_metadata(path, &content)?;
    Ok((content, other))
}

/// One file of a model: its memory map and where its data section starts.
struct Split {
    path: PathBuf,
    map: Arc<Mmap>,
    data_offset: u64,
}

/// A file opened and checked: its split, its parsed header and the tensors candle's reader
/// leaves out.
fn open_split(path: &Path) -> Result<(Split, Content, HashMap<String, OtherTensor>)> {
    let file = File::open(path).map_err(|e| WeightsError::io(path, e))?;
    let (content, other) = read_header(path, &mut BufReader::new(&file))?;
    // SAFETY: mapped read-only; like every mmap reader (llama.cpp's, candle's) we rely on
    // the file not being truncated or rewritten while the model is in use.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| WeightsError::io(path, e))?;
    // Float weights are read in place from this map (quantized ones once, to repack them).
    super::mapped::advise_huge_pages(&map);
    let split = Split {
        path: path.to_path_buf(),
        map: Arc::new(map),
        data_offset: content.tensor_data_offset,
    };
    Ok((split, content, other))
}

/// A split's `split.no` and `split.count` (0 and 1 for a file that is not a split).
fn split_keys(path: &Path, content: &Content) -> Result<(usize, usize)> {
    let key = |k: &str| match content.metadata.get(k) {
        None => Ok(None),
        Some(_) => md_usize(content, k)
            .map(Some)
            .map_err(|e| WeightsError::gguf(path, e.to_string())),
    };
    Ok((
        key(super::split::KEY_NO)?.unwrap_or(0),
        key(super::split::KEY_COUNT)?.unwrap_or(1).max(1),
    ))
}

/// An open GGUF model: its parsed header and a read-only memory map of each of its files, from
/// which tensors are read in place ([`GgufFile::mapped`]) or copied ([`GgufFile::tensor`]). A
/// model written as a split set ([`super::split`]) is opened from its first file, whose
/// metadata is the model's; its tensors may lie in any of the files, each read from its own.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    /// Tensors of types candle does not know (MXFP4), absent from `content.tensor_infos`.
    other: HashMap<String, OtherTensor>,
    /// The model's files, the first (`path`) first.
    splits: Vec<Split>,
    /// The split each tensor not in the first lies in.
    split_of: HashMap<String, usize>,
    /// The tensors read so far ([`GgufFile::mapped`], [`GgufFile::tensor`]): after loading,
    /// every tensor of the file must be among them ([`GgufFile::unread_tensors`]).
    read: Mutex<BTreeSet<String>>,
}

impl GgufFile {
    /// Opens and parses the header of a GGUF file, and maps the file; for the first file of a
    /// split set, every file of the set, checked as llama.cpp's loader checks them (each
    /// split's number and count, no tensor twice, the first's tensor count).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let (first, content, other) = open_split(path)?;
        let (no, count) = split_keys(path, &content)?;
        let mut file = GgufFile {
            path: path.to_path_buf(),
            content,
            other,
            splits: vec![first],
            split_of: HashMap::new(),
            read: Mutex::new(BTreeSet::new()),
        };
        if count == 1 {
            return Ok(file);
        }
        let bad = |msg: String| WeightsError::gguf(path, msg);
        if no != 0 {
            let first = super::split::of_path(path)
                .map(|s| format!(", `{}`", s.sibling(1)))
                .unwrap_or_default();
            return Err(bad(format!(
                "split {} of {count}: load a split model from its first file{first}",
                no + 1
            )));
        }
        let named =
            super::split::of_path(path).is_some_and(|s| s.no == 1 && s.count as usize == count);
        if !named {
            return Err(bad(format!(
                "the first of {count} splits, but not named `<prefix>-00001-of-{count:05}.gguf`, \
                 so the others cannot be found"
            )));
        }
        for (i, p) in super::split::set_paths(path)
            .into_iter()
            .enumerate()
            .skip(1)
        {
            if !p.is_file() {
                return Err(WeightsError::gguf(
                    &p,
                    format!(
                        "split {} of {count} of `{}` is missing",
                        i + 1,
                        path.display()
                    ),
                ));
            }
            let (split, c, o) = open_split(&p)?;
            let (n, m) = split_keys(&p, &c)?;
            if (n, m) != (i, count) {
                return Err(WeightsError::gguf(
                    &p,
                    format!(
                        "`{}` = {n} and `{}` = {m}, expected {i} and {count} (split {} of {count})",
                        super::split::KEY_NO,
                        super::split::KEY_COUNT,
                        i + 1,
                    ),
                ));
            }
            let names = (c.tensor_infos.keys()).chain(o.keys());
            if let Some(t) = names.clone().find(|t| file.has_tensor(t)) {
                return Err(WeightsError::gguf(
                    &p,
                    format!("tensor `{t}` is also in an earlier split"),
                ));
            }
            file.split_of.extend(names.map(|t| (t.clone(), i)));
            file.content.tensor_infos.extend(c.tensor_infos);
            file.other.extend(o);
            file.splits.push(split);
        }
        let found = file.content.tensor_infos.len() + file.other.len();
        let expected =
            md_usize(&file.content, super::split::KEY_TENSORS).map_err(|e| bad(e.to_string()))?;
        if found != expected {
            return Err(bad(format!(
                "`{}` is {expected}, but the {count} splits hold {found} tensors",
                super::split::KEY_TENSORS
            )));
        }
        // The vocabulary against the embedding, wherever it lies.
        super::gguf_check::check_metadata(path, &file.content)?;
        Ok(file)
    }

    /// The files of the model: the one opened, then the rest of its split set.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.splits.iter().map(|s| s.path.as_path())
    }

    /// The file a tensor lies in (the first for an unknown name).
    pub fn tensor_path(&self, name: &str) -> &Path {
        &self.splits[self.split_index(name)].path
    }

    fn split_index(&self, name: &str) -> usize {
        self.split_of.get(name).copied().unwrap_or(0)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header (of a split set: the first file's metadata, and every file's
    /// tensors, each offset within its own file's data section). Its `tensor_infos` lacks the
    /// tensors of types candle does not know (MXFP4): ask [`GgufFile::has_tensor`],
    /// [`GgufFile::stored_type`] and [`GgufFile::tensor_shapes`] about tensors.
    pub fn content(&self) -> &Content {
        &self.content
    }

    /// Every tensor's name and shape (outermost dimension first), in no particular order.
    pub fn tensor_shapes(&self) -> impl Iterator<Item = (&str, &[usize])> {
        let candle = (self.content.tensor_infos.iter()).map(|(n, i)| (n.as_str(), i.shape.dims()));
        candle.chain(self.other.iter().map(|(n, t)| (n.as_str(), &t.shape[..])))
    }

    /// The file's tensors that were never read, sorted: after a model is loaded, tensors its
    /// architecture does not use (a feature Candor does not implement, such as Phi-3's
    /// long-context RoPE factors).
    pub fn unread_tensors(&self) -> Vec<String> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = (self.content.tensor_infos.keys())
            .chain(self.other.keys())
            .filter(|n| !read.contains(n.as_str()))
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Whether the file holds a tensor of this name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name) || self.other.contains_key(name)
    }

    /// The stored type of a tensor, or `MissingTensor`.
    pub fn stored_type(&self, name: &str) -> Result<StoredType> {
        match (self.content.tensor_infos.get(name), self.other.get(name)) {
            (Some(info), _) => Ok(StoredType::Ggml(info.ggml_dtype)),
            (None, Some(t)) => Ok(t.stored),
            (None, None) => Err(WeightsError::MissingTensor(name.into())),
        }
    }

    /// The stored type of a tensor as candle's type, or `MissingTensor`; an error naming the
    /// tensor for a type candle does not know (use [`GgufFile::stored_type`]).
    pub fn dtype(&self, name: &str) -> Result<GgmlDType> {
        let stored = self.stored_type(name)?;
        stored
            .ggml()
            .ok_or_else(|| self.no_candle_type(name, stored))
    }

    fn no_candle_type(&self, name: &str, stored: StoredType) -> WeightsError {
        WeightsError::gguf(
            &self.path,
            format!("tensor `{name}`: type {stored} is read only as a weight matrix"),
        )
    }

    /// A tensor's stored type and its bytes in the file's memory map, after checking its shape
    /// (outermost dimension first, as candle orders it). A tensor of a type candle does not
    /// know (MXFP4) is an error naming it: read those with [`GgufFile::mapped_stored`].
    pub fn mapped(&self, name: &str, shape: &[usize]) -> Result<(GgmlDType, MappedBytes)> {
        let (stored, bytes) = self.mapped_stored(name, shape)?;
        match stored.ggml() {
            Some(d) => Ok((d, bytes)),
            None => Err(self.no_candle_type(name, stored)),
        }
    }

    /// A tensor's stored type (any type Candor knows, MXFP4 included) and its bytes in the
    /// file's memory map, after checking its shape (outermost dimension first) and that its
    /// whole blocks lie inside the file.
    pub fn mapped_stored(&self, name: &str, shape: &[usize]) -> Result<(StoredType, MappedBytes)> {
        let (stored, dims, offset) = self.entry(name)?;
        (self.read.lock().unwrap_or_else(|e| e.into_inner())).insert(name.to_string());
        if dims != shape {
            return Err(WeightsError::TensorShape {
                name: name.into(),
                expected: format!("{shape:?}"),
                found: format!("{dims:?}"),
            });
        }
        let elems: usize = dims.iter().product();
        let err = |msg: String| WeightsError::gguf(&self.path, format!("tensor `{name}`: {msg}"));
        if !elems.is_multiple_of(stored.block_size()) {
            return Err(err(format!(
                "{elems} elements is not a multiple of the {stored} block size {}",
                stored.block_size()
            )));
        }
        let len = elems / stored.block_size() * stored.type_size();
        let split = &self.splits[self.split_index(name)];
        let start = (split.data_offset.checked_add(offset)).and_then(|s| usize::try_from(s).ok());
        let bytes = start
            .and_then(|s| MappedBytes::new(split.map.clone(), s, len))
            .ok_or_else(|| {
                WeightsError::gguf(
                    &split.path,
                    format!(
                        "tensor `{name}`: {len} bytes at offset {} run past the end of the file \
                         ({} bytes)",
                        split.data_offset.saturating_add(offset),
                        split.map.len()
                    ),
                )
            })?;
        Ok((stored, bytes))
    }

    /// A tensor's stored type, shape (outermost dimension first) and data offset within its
    /// file's data section.
    fn entry(&self, name: &str) -> Result<(StoredType, &[usize], u64)> {
        match (self.content.tensor_infos.get(name), self.other.get(name)) {
            (Some(info), _) => Ok((
                StoredType::Ggml(info.ggml_dtype),
                info.shape.dims(),
                info.offset,
            )),
            (None, Some(t)) => Ok((t.stored, &t.shape[..], t.offset)),
            (None, None) => Err(WeightsError::MissingTensor(name.into())),
        }
    }

    /// A tensor's stored type and the bytes its data takes, without reading it: a look that
    /// does not count as the model using the tensor ([`GgufFile::unread_tensors`]).
    pub fn stored_size(&self, name: &str) -> Result<(StoredType, usize)> {
        let (stored, dims, _) = self.entry(name)?;
        let elems: usize = dims.iter().product();
        Ok((stored, elems / stored.block_size() * stored.type_size()))
    }

    /// Reads a tensor (a copy of its bytes) and checks its shape (outermost dimension first,
    /// as candle orders it).
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        let (dtype, bytes) = self.mapped(name, shape)?;
        // candle reinterprets the bytes as its block structs (alignment up to 4): hand it an
        // 8-byte-aligned copy when the file's alignment does not give one.
        let raw = bytes.bytes();
        let copy: Vec<u64>;
        let raw = if (raw.as_ptr() as usize).is_multiple_of(8) {
            raw
        } else {
            let mut words = vec![0u64; raw.len().div_ceil(8)];
            for (w, c) in words.iter_mut().zip(raw.chunks(8)) {
                let mut b = [0u8; 8];
                b[..c.len()].copy_from_slice(c);
                *w = u64::from_ne_bytes(b);
            }
            copy = words;
            // SAFETY: u64s viewed as their bytes (alignment 1), no longer than the buffer.
            unsafe { std::slice::from_raw_parts(copy.as_ptr() as *const u8, raw.len()) }
        };
        candle_core::quantized::ggml_file::qtensor_from_ggml(
            dtype,
            raw,
            shape.to_vec(),
            &Device::Cpu,
        )
        .map_err(|e| WeightsError::gguf(&self.path, format!("tensor `{name}`: {e}")))
    }
}

/// The lower-case hex sha256 of a file (recorded in run manifests).
pub fn file_sha256(path: &Path) -> Result<String> {
    super::digest::sha256_file(path).map_err(|e| WeightsError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file (alignment 32) with these tensors: name, dims (innermost first), type
    /// id, data. `next_offset` places each tensor after the previous one's `stride(len)` bytes.
    fn gguf(tensors: &[(&str, &[u64], u32, Vec<u8>)], stride: impl Fn(usize) -> usize) -> Vec<u8> {
        let s = |out: &mut Vec<u8>, x: &str| {
            out.extend((x.len() as u64).to_le_bytes());
            out.extend(x.as_bytes());
        };
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend(1u64.to_le_bytes());
        s(&mut out, "general.alignment");
        out.extend(4u32.to_le_bytes());
        out.extend(32u32.to_le_bytes());
        let mut offset = 0u64;
        for (name, dims, ty, data) in tensors {
            s(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += stride(data.len()).next_multiple_of(32) as u64;
        }
        for (_, _, _, data) in tensors {
            out.resize(out.len().next_multiple_of(32), 0);
            out.extend(data);
        }
        out.resize(out.len().next_multiple_of(32), 0);
        out
    }

    fn open(bytes: &[u8]) -> (tempfile::TempDir, Result<GgufFile>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, bytes).expect("write");
        let f = GgufFile::open(&path);
        (dir, f)
    }

    /// A 3 × 64 MXFP4 matrix (6 blocks of 17 bytes) between two F32 vectors.
    fn mxfp4_file(stride: impl Fn(usize) -> usize) -> (Vec<u8>, Vec<u8>) {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let blocks: Vec<u8> = (0..6 * 17).map(|i| (i * 37 % 251) as u8).collect();
        let file = gguf(
            &[
                ("a.weight", &[4], 0, f32s(&[1.0, 2.0, 3.0, 4.0])),
                (
                    "blk.0.ffn_up_exps.weight",
                    &[64, 3],
                    MXFP4_TYPE_ID,
                    blocks.clone(),
                ),
                ("b.weight", &[2], 0, f32s(&[-1.5, 0.25])),
            ],
            stride,
        );
        (file, blocks)
    }

    #[test]
    fn a_file_with_an_mxfp4_tensor_opens_and_maps_it_in_place() {
        let (bytes, blocks) = mxfp4_file(|len| len);
        let (_dir, f) = open(&bytes);
        let mut f = f.expect("opens");
        let name = "blk.0.ffn_up_exps.weight";
        assert!(f.has_tensor(name));
        assert_eq!(f.stored_type(name).expect("type"), StoredType::Mxfp4);
        assert_eq!(
            f.stored_type("a.weight").expect("type"),
            StoredType::Ggml(GgmlDType::F32)
        );
        assert!(!f.content().tensor_infos.contains_key(name));
        let mut shapes: Vec<(String, Vec<usize>)> = f
            .tensor_shapes()
            .map(|(n, s)| (n.to_string(), s.to_vec()))
            .collect();
        shapes.sort();
        assert_eq!(
            shapes,
            [
                ("a.weight".to_string(), vec![4]),
                ("b.weight".to_string(), vec![2]),
                (name.to_string(), vec![3, 64]),
            ]
        );
        // The tensors around it read as before: candle's table kept their offsets.
        let b = f.tensor("b.weight", &[2]).expect("b");
        let v = b
            .dequantize(&Device::Cpu)
            .and_then(|t| t.to_vec1::<f32>())
            .expect("f32");
        assert_eq!(v, [-1.5, 0.25]);
        assert_eq!(f.unread_tensors(), ["a.weight", name]);
        let (stored, m) = f.mapped_stored(name, &[3, 64]).expect("mapped");
        assert_eq!(stored, StoredType::Mxfp4);
        assert_eq!(m.bytes(), &blocks[..]);
        assert_eq!(f.unread_tensors(), ["a.weight"]);
        // Candle's type APIs refuse it, naming the file and the tensor, in one line.
        for e in [
            f.mapped(name, &[3, 64])
                .map(|_| ())
                .expect_err("no candle type"),
            f.dtype(name).map(|_| ()).expect_err("no candle type"),
            f.tensor(name, &[3, 64])
                .map(|_| ())
                .expect_err("no candle type"),
        ] {
            let e = e.to_string();
            assert!(
                e.contains("m.gguf: gguf: tensor `blk.0.ffn_up_exps.weight`: type MXFP4"),
                "{e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
        let e = f
            .mapped_stored(name, &[64, 3])
            .expect_err("shape")
            .to_string();
        assert!(
            e.contains("tensor `blk.0.ffn_up_exps.weight`: expected shape [64, 3]"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_mxfp4_tensor_is_refused_naming_it() {
        let name = "tensor `blk.0.ffn_up_exps.weight`";
        // Laid out as if its blocks were 34 bytes (Q8_0's): the next offset disagrees.
        let (bytes, _) = mxfp4_file(|len| if len == 102 { 204 } else { len });
        let e = open(&bytes)
            .1
            .map(|_| ())
            .expect_err("bad offsets")
            .to_string();
        assert!(
            e.contains("tensor `b.weight`: data offset 256, expected 160"),
            "{e}"
        );
        // Truncated inside its data.
        let (bytes, _) = mxfp4_file(|len| len);
        let cut = bytes.len() - 64 - 20;
        let e = open(&bytes[..cut])
            .1
            .map(|_| ())
            .expect_err("truncated")
            .to_string();
        assert!(e.contains(&format!("{name}: 102 bytes at offset")), "{e}");
        // A row that is not whole 32-element blocks.
        let file = gguf(
            &[(
                "blk.0.ffn_up_exps.weight",
                &[48, 2],
                MXFP4_TYPE_ID,
                vec![0; 51],
            )],
            |l| l,
        );
        let e = open(&file).1.map(|_| ()).expect_err("ragged").to_string();
        assert!(
            e.contains(&format!(
                "{name}: row of 48 elements is not a whole number of 32-element blocks"
            )),
            "{e}"
        );
        assert!(e.contains("m.gguf: gguf: ") && !e.contains('\n'), "{e}");
    }
}
