//! What a model's weights cost in memory: where a Mixture-of-Experts model's experts are kept
//! ([`ExpertPanels`]) and the check at load against the memory the machine has left
//! ([`check_fits`]).
//!
//! The quantized kernels read weights repacked into panels (`model/quant/layout.rs`). Dense
//! weights are repacked into this process's memory. Experts are most of a MoE file (Qwen3-30B-A3B:
//! 96%; gpt-oss-120b: 97%) and a token reads a few of them, so they are repacked once into
//! panel files ([`crate::weights::panel_file`], under the `panels` cache) and read in place
//! from their memory maps: their pages are read on demand and are the kernel's to drop, so a
//! file larger than the free memory still runs. The bits are the same either way (the same
//! panels, in a file or in memory). Float weights are read in place from the model file's own
//! map already.
//!
//! The check at load counts what the process must hold: the repacked weights in its memory
//! (and every matrix's f32 values under `--dtype f32`), not the file size; mapped weights are
//! not counted.

use std::path::{Path, PathBuf};

use super::error::{ModelError, Result};
use super::transformer::WeightDType;
use crate::weights::gguf::GgufFile;
use crate::weights::panel_file::cache_dir;

/// The environment variable that overrides where experts are kept: `memory`, `mapped` (panel
/// files in the cache), or a folder for the panel files.
pub const EXPERTS_ENV: &str = "CANDOR_EXPERTS";

/// An expert tensor at least this large is kept in a panel file (by default): every real MoE
/// model's are (Qwen3-30B-A3B: 113 MB per tensor, gpt-oss-20b: 140 MB), tiny test models'
/// are not.
pub const FILE_MIN_BYTES: usize = 32 << 20;

/// Where the experts' repacked panels are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpertPanels {
    /// In this process's memory.
    Memory,
    /// In panel files in this folder, read in place from their memory maps.
    Files(PathBuf),
    /// Panel files in the `panels` cache for expert tensors of [`FILE_MIN_BYTES`] or more,
    /// memory for smaller ones (and when there is no cache folder).
    Auto,
}

impl ExpertPanels {
    /// The placement `$CANDOR_EXPERTS` asks for (`memory`, `mapped`, or a folder), else
    /// [`ExpertPanels::Auto`].
    pub fn from_env() -> ExpertPanels {
        match std::env::var_os(EXPERTS_ENV) {
            Some(v) if v == "memory" => ExpertPanels::Memory,
            Some(v) if v == "mapped" => {
                cache_dir("panels").map_or(ExpertPanels::Memory, ExpertPanels::Files)
            }
            Some(v) if !v.is_empty() => ExpertPanels::Files(PathBuf::from(v)),
            _ => ExpertPanels::Auto,
        }
    }

    /// The folder of the panel file for an expert tensor of `bytes`, or `None` to repack it
    /// into memory.
    pub fn folder(&self, bytes: usize) -> Option<PathBuf> {
        match self {
            ExpertPanels::Memory => None,
            ExpertPanels::Files(dir) => Some(dir.clone()),
            ExpertPanels::Auto if bytes >= FILE_MIN_BYTES => cache_dir("panels"),
            ExpertPanels::Auto => None,
        }
    }
}

/// Whether a tensor of a GGUF file is an expert tensor (`blk.N.ffn_{gate,up,down}_exps.weight`).
pub fn is_expert_tensor(name: &str) -> bool {
    name.ends_with("_exps.weight")
}

/// What a GGUF file's weights take once loaded with `dtype` and `experts` ([`residency`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Residency {
    /// Bytes in this process's memory: quantized tensors repacked into memory (all but the
    /// experts kept in panel files), every matrix's f32 values under `--dtype f32`, small
    /// vectors (norms, biases) at their f32 size; nothing for float tensors read in place.
    pub resident: u64,
    /// Bytes of the experts kept in panel files (the page cache's, not counted above).
    pub mapped: u64,
}

impl Residency {
    /// Whether the mapped experts are mapped at once ([`PanelFile::open_or_write`]'s
    /// `populate`): when they fit, with the resident weights, in three quarters of the
    /// available memory (or that is not known); else page by page as the kernels touch them.
    ///
    /// [`PanelFile::open_or_write`]: crate::weights::panel_file::PanelFile::open_or_write
    pub fn populate(&self, available: Option<u64>) -> bool {
        available.is_none_or(|a| self.resident + self.mapped <= a / 4 * 3)
    }
}

/// What a GGUF file's weights take in memory once loaded with `dtype` and `experts`.
pub fn residency(file: &GgufFile, dtype: WeightDType, experts: &ExpertPanels) -> Result<Residency> {
    let mut r = Residency {
        resident: 0,
        mapped: 0,
    };
    let names: Vec<(String, Vec<usize>)> = file
        .tensor_shapes()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect();
    for (name, shape) in names {
        let elems: u64 = shape.iter().map(|&d| d as u64).product();
        if dtype == WeightDType::F32 || shape.len() < 2 {
            r.resident += elems * 4;
            continue;
        }
        // Its size only: looking is not using (the loader refuses tensors it never reads).
        let (stored, len) = file.stored_size(&name)?;
        let len = len as u64;
        let quantized = !matches!(
            stored,
            crate::weights::stored::StoredType::Ggml(
                candle_core::quantized::GgmlDType::F32
                    | candle_core::quantized::GgmlDType::F16
                    | candle_core::quantized::GgmlDType::BF16
            )
        );
        // Float weights are read in place, except those split by rows into new matrices
        // (Qwen3-Next's fused `ssm_in` and `ssm_ba`: copied).
        if !quantized && !split_by_rows(&name) {
            continue;
        }
        if is_expert_tensor(&name) && experts.folder(len as usize).is_some() {
            r.mapped += len;
        } else {
            r.resident += len;
        }
    }
    Ok(r)
}

/// Whether the loader copies a tensor's rows into matrices of their own
/// (`model::deltanet::DeltaNet::load`), so that even a float one is held in memory.
fn split_by_rows(name: &str) -> bool {
    name.ends_with(".ssm_in.weight") || name.ends_with(".ssm_ba.weight")
}

/// Where the experts go ([`ExpertPanels`]) and whether their panel files are mapped at once
/// ([`Residency::populate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub experts: ExpertPanels,
    pub populate: bool,
}

/// Memory the machine can still give a process without swapping (`MemAvailable` of
/// `/proc/meminfo`), in bytes; `None` where that is not known.
pub fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_available(&info)
}

fn parse_meminfo_available(info: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Refuses, before anything is repacked, a model whose resident weights
/// ([`Residency::resident`]) exceed the memory available, naming the file and both sizes; a model
/// whose experts are mapped is judged without them.
pub fn check_fits(path: &Path, need: u64, available: Option<u64>) -> Result<()> {
    let Some(available) = available else {
        return Ok(());
    };
    if need <= available {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Err(ModelError::Memory {
        path: path.to_path_buf(),
        msg: format!(
            "the weights need {:.2} GiB of memory once loaded and {:.2} GiB is available; \
             free memory, or keep the experts in panel files ({EXPERTS_ENV}=mapped)",
            gib(need),
            gib(available)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_available_is_read_in_bytes() {
        let info =
            "MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:    2048 kB\n";
        assert_eq!(parse_meminfo_available(info), Some(2048 * 1024));
        assert_eq!(parse_meminfo_available("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn a_model_larger_than_the_memory_left_is_refused_naming_the_file() {
        let p = Path::new("/models/big.gguf");
        assert!(check_fits(p, 10, Some(10)).is_ok());
        assert!(check_fits(p, 10, None).is_ok());
        let e = check_fits(p, 3 << 30, Some(1 << 30))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/models/big.gguf: "), "{e}");
        assert!(e.contains("3.00 GiB") && e.contains("1.00 GiB"), "{e}");
    }

    #[test]
    fn experts_are_mapped_at_once_only_when_they_fit() {
        let r = Residency {
            resident: 1 << 30,
            mapped: 2 << 30,
        };
        assert!(r.populate(None));
        assert!(r.populate(Some(4 << 30)));
        assert!(!r.populate(Some(3 << 30)));
    }

    #[test]
    fn auto_maps_only_large_expert_tensors() {
        assert_eq!(ExpertPanels::Memory.folder(1 << 40), None);
        let d = PathBuf::from("/tmp/p");
        assert_eq!(ExpertPanels::Files(d.clone()).folder(1), Some(d));
        assert_eq!(ExpertPanels::Auto.folder(FILE_MIN_BYTES - 1), None);
        assert!(is_expert_tensor("blk.3.ffn_up_exps.weight"));
        assert!(!is_expert_tensor("blk.3.ffn_up_exps.bias"));
        assert!(!is_expert_tensor("blk.3.ffn_up.weight"));
    }
}
