//! GGUF files: open one, read the llama-family hyperparameters from its metadata and hand out
//! its tensors by name.
//!
//! The architecture's GGUF keys are read by [`super::arch`] (re-exported here as
//! [`LlamaConfig`]); this module does not build layers or run anything (that is
//! [`super::llama`]). Absent tensors are reported as such, never guessed: "is there an
//! `output.weight`?" is answered by looking the name up, not by catching a read error.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use sha2::{Digest, Sha256};

use super::error::{ModelError, Result};

pub use super::arch::{LlamaConfig, SUPPORTED_ARCHITECTURES};

fn md<'a>(content: &'a Content, key: &str) -> Result<&'a Value> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| ModelError::Metadata {
            key: key.into(),
            msg: "missing".into(),
        })
}

fn md_err(key: &str, e: candle_core::Error) -> ModelError {
    ModelError::Metadata {
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
            u64::try_from(x).map_err(|_| ModelError::Metadata {
                key: key.into(),
                msg: format!("negative value {x}"),
            })?
        }
        other => {
            return Err(ModelError::Metadata {
                key: key.into(),
                msg: format!("expected an integer, found {:?}", other.value_type()),
            })
        }
    };
    usize::try_from(n).map_err(|_| ModelError::Metadata {
        key: key.into(),
        msg: format!("value {n} too large"),
    })
}

/// A float metadata value (f32 or f64).
pub fn md_f32(content: &Content, key: &str) -> Result<f32> {
    match md(content, key)? {
        Value::F32(x) => Ok(*x),
        Value::F64(x) => Ok(*x as f32),
        other => Err(ModelError::Metadata {
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
    let content = Content::read(reader).map_err(|e| ModelError::gguf(path, e.to_string()))?;
    super::gguf_check::check_metadata(path, &content)?;
    Ok(content)
}

/// An open GGUF file: its parsed header and a reader for its tensors.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

impl GgufFile {
    /// Opens and parses the header of a GGUF file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        let mut reader = BufReader::new(file);
        let content = read_checked(path, &mut reader)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            content,
            reader,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn content(&self) -> &Content {
        &self.content
    }

    /// Whether the file holds a tensor of this name.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// The stored type of a tensor, or `MissingTensor`.
    pub fn dtype(&self, name: &str) -> Result<GgmlDType> {
        match self.content.tensor_infos.get(name) {
            Some(info) => Ok(info.ggml_dtype),
            None => Err(ModelError::MissingTensor(name.into())),
        }
    }

    /// Reads a tensor and checks its shape (outermost dimension first, as candle orders it).
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(ModelError::MissingTensor(name.into()));
        }
        let t = self
            .content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| ModelError::gguf(&self.path, format!("tensor `{name}`: {e}")))?;
        if t.shape().dims() != shape {
            return Err(ModelError::TensorShape {
                name: name.into(),
                expected: format!("{shape:?}"),
                found: format!("{:?}", t.shape().dims()),
            });
        }
        Ok(t)
    }
}

/// The lower-case hex sha256 of a file (recorded in run manifests).
pub fn file_sha256(path: &Path) -> Result<String> {
    let mut file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| ModelError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}
