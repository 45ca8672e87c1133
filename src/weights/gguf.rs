//! GGUF files: open one, read typed metadata values and hand out its tensors by name.
//!
//! The architectures' GGUF keys are read above, by `model::arch`; this module knows no
//! architecture and builds no layer. Absent tensors are reported as such, never guessed: "is there an
//! `output.weight`?" is answered by looking the name up, not by catching a read error.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use memmap2::Mmap;

use super::error::{Result, WeightsError};
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
/// names the file in errors.
pub fn read_checked<R: Read + std::io::Seek>(path: &Path, reader: &mut R) -> Result<Content> {
    super::gguf_check::scan(path, reader)?;
    let content = Content::read(reader).map_err(|e| WeightsError::gguf(path, e.to_string()))?;
    super::gguf_check::check_metadata(path, &content)?;
    Ok(content)
}

/// An open GGUF file: its parsed header and a read-only memory map of the whole file, from
/// which tensors are read in place ([`GgufFile::mapped`]) or copied ([`GgufFile::tensor`]).
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    map: Arc<Mmap>,
    /// The tensors read so far ([`GgufFile::mapped`], [`GgufFile::tensor`]): after loading,
    /// every tensor of the file must be among them ([`GgufFile::unread_tensors`]).
    read: Mutex<BTreeSet<String>>,
}

impl GgufFile {
    /// Opens and parses the header of a GGUF file, and maps the file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(|e| WeightsError::io(path, e))?;
        let content = read_checked(path, &mut BufReader::new(&file))?;
        // SAFETY: mapped read-only; like every mmap reader (llama.cpp's, candle's) we rely on
        // the file not being truncated or rewritten while the model is in use.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| WeightsError::io(path, e))?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            content,
            map: Arc::new(map),
            read: Mutex::new(BTreeSet::new()),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn content(&self) -> &Content {
        &self.content
    }

    /// The file's tensors that were never read, sorted: after a model is loaded, tensors its
    /// architecture does not use (a feature Candor does not implement, such as Phi-3's
    /// long-context RoPE factors).
    pub fn unread_tensors(&self) -> Vec<String> {
        let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<String> = (self.content.tensor_infos.keys())
            .filter(|n| !read.contains(n.as_str()))
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Whether the file holds a tensor of this name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// The stored type of a tensor, or `MissingTensor`.
    pub fn dtype(&self, name: &str) -> Result<GgmlDType> {
        match self.content.tensor_infos.get(name) {
            Some(info) => Ok(info.ggml_dtype),
            None => Err(WeightsError::MissingTensor(name.into())),
        }
    }

    /// A tensor's stored type and its bytes in the file's memory map, after checking its shape
    /// (outermost dimension first, as candle orders it).
    pub fn mapped(&self, name: &str, shape: &[usize]) -> Result<(GgmlDType, MappedBytes)> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            return Err(WeightsError::MissingTensor(name.into()));
        };
        (self.read.lock().unwrap_or_else(|e| e.into_inner())).insert(name.to_string());
        if info.shape.dims() != shape {
            return Err(WeightsError::TensorShape {
                name: name.into(),
                expected: format!("{shape:?}"),
                found: format!("{:?}", info.shape.dims()),
            });
        }
        let dtype = info.ggml_dtype;
        let elems = info.shape.elem_count();
        let err = |msg: String| WeightsError::gguf(&self.path, format!("tensor `{name}`: {msg}"));
        if !elems.is_multiple_of(dtype.block_size()) {
            return Err(err(format!(
                "{elems} elements is not a multiple of the {dtype:?} block size {}",
                dtype.block_size()
            )));
        }
        let len = elems / dtype.block_size() * dtype.type_size();
        let start = self
            .content
            .tensor_data_offset
            .checked_add(info.offset)
            .and_then(|s| usize::try_from(s).ok());
        let bytes = start
            .and_then(|s| MappedBytes::new(self.map.clone(), s, len))
            .ok_or_else(|| {
                err(format!(
                    "{len} bytes at offset {} run past the end of the file ({} bytes)",
                    self.content.tensor_data_offset.saturating_add(info.offset),
                    self.map.len()
                ))
            })?;
        Ok((dtype, bytes))
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
