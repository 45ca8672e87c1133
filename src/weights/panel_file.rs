//! Repacked weights kept in a file of their own and memory-mapped, so that weights far larger
//! than memory (a Mixture-of-Experts model's experts) are read in place, page by page on
//! demand, instead of copied into this process's memory.
//!
//! The quantized kernels read weights in their own layout (panels of rows, see
//! `model/quant/layout.rs`), not in the GGUF's, so a model file's bytes cannot be used as they
//! are. A [`PanelFile`] holds one tensor's repacked bytes: written once (into a temporary file
//! renamed into place, so a crash or a concurrent load never leaves a partial file under the
//! final name), then mapped read-only by every later load. Its name is a digest of what
//! determines its bytes: the model file (canonical path, length, modification time), the
//! tensor, its type and shape, and the layout's version. A model file replaced by another of
//! the same length in the same nanosecond would be missed; nothing else is. This module moves
//! bytes; the repacking itself is the caller's.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use memmap2::{Mmap, MmapMut};
use sha2::{Digest, Sha256};

/// The environment variable that names the folder of Candor's caches (`$CANDOR_HOME/cache`).
pub const HOME_ENV: &str = "CANDOR_HOME";

/// The folder of one of Candor's caches, `sub` (`generations`, `panels`):
/// `$CANDOR_HOME/cache/<sub>`, else the platform cache directory (`$XDG_CACHE_HOME` or
/// `~/.cache`, `~/Library/Caches` on macOS, `%LOCALAPPDATA%` on Windows) under `candor/<sub>`.
pub fn cache_dir(sub: &str) -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(home) = env(HOME_ENV) {
        return Some(home.join("cache").join(sub));
    }
    let base = if cfg!(target_os = "windows") {
        env("LOCALAPPDATA")
    } else if cfg!(target_os = "macos") {
        env("HOME").map(|h| h.join("Library").join("Caches"))
    } else {
        env("XDG_CACHE_HOME").or_else(|| env("HOME").map(|h| h.join(".cache")))
    };
    base.map(|b| b.join("candor").join(sub))
}

/// What a panel file's bytes are a function of.
#[derive(Debug, Clone)]
pub struct PanelKey<'a> {
    /// The model file the tensor is read from.
    pub model: &'a Path,
    /// The tensor's name in it.
    pub tensor: &'a str,
    /// The stored type, shape and anything else that changes the repacked bytes (the
    /// caller's layout version included).
    pub layout: &'a str,
}

/// A tensor's repacked bytes in a read-only memory map of their own file.
#[derive(Debug, Clone)]
pub struct PanelFile {
    pub map: Arc<Mmap>,
    pub path: PathBuf,
    /// Whether this load wrote the file (the first load of the model), or found it.
    pub written: bool,
}

impl PanelFile {
    /// The panel file of `key` in folder `dir`, `len` bytes: mapped as found when one of that
    /// length exists, else created, filled by `fill` (given the file's writable map, all
    /// zeros) and renamed into place first. `populate`: map every page at once (for files
    /// that fit in memory: no page faults in the first forward passes).
    pub fn open_or_write(
        dir: &Path,
        key: &PanelKey<'_>,
        len: usize,
        populate: bool,
        fill: impl FnOnce(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<PanelFile> {
        let path = dir.join(file_name(key)?);
        if let Some(map) = map_existing(&path, len, populate)? {
            return Ok(PanelFile {
                map,
                path,
                written: false,
            });
        }
        fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(
            ".{}.tmp-{}",
            path.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("panels"),
            std::process::id()
        ));
        let result = (|| -> io::Result<()> {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            f.set_len(len as u64)?;
            if len > 0 {
                // SAFETY: the file was just created by this process under a name no other
                // process uses (its pid), and nothing else maps it while it is filled.
                let mut w = unsafe { MmapMut::map_mut(&f)? };
                fill(&mut w)?;
                w.flush()?;
            }
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            Ok(())
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        let map = map_existing(&path, len, populate)?.ok_or_else(|| {
            io::Error::other(format!(
                "{}: written but not of length {len}",
                path.display()
            ))
        })?;
        Ok(PanelFile {
            map,
            path,
            written: true,
        })
    }
}

/// The file's read-only map when it exists with length `len`; `None` when absent or of
/// another length (an older layout or an interrupted copy by other means: rewritten). With
/// `populate`, every page is mapped now (read from the disk if it is not in the page cache)
/// rather than on first touch.
fn map_existing(path: &Path, len: usize, populate: bool) -> io::Result<Option<Arc<Mmap>>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if f.metadata()?.len() != len as u64 {
        return Ok(None);
    }
    if len == 0 {
        // A zero-length file cannot be mapped; an empty anonymous map stands for it.
        return Ok(Some(Arc::new(MmapMut::map_anon(0)?.make_read_only()?)));
    }
    // SAFETY: panel files are only ever created under a temporary name and renamed into place
    // complete; none is written after it has its final name, so the map's bytes do not change
    // under it (a user editing the cache by hand is outside this contract, as for model files).
    let map = unsafe { memmap2::MmapOptions::new().map(&f)? };
    // The advice before any page is read, `populate`'s included: from a cold page cache all
    // 5.31 GB of Qwen3-30B-A3B-16l's experts were then mapped with 2 MiB pages, against 3.35 GB
    // with the advice given after `MAP_POPULATE`.
    crate::weights::mapped::advise_huge_pages(&map);
    if populate {
        populate_read(&map);
    }
    Ok(Some(Arc::new(map)))
}

/// Maps every page of `map` now (reading from the disk what the page cache lacks), after
/// [`map_existing`]'s advice: `MADV_POPULATE_READ` where the kernel has it (Linux 5.14), else
/// a read of one byte per page.
fn populate_read(map: &Mmap) {
    #[cfg(target_os = "linux")]
    if map.advise(memmap2::Advice::PopulateRead).is_ok() {
        return;
    }
    let mut sum = 0u8;
    for i in (0..map.len()).step_by(4096) {
        sum = sum.wrapping_add(map[i]);
    }
    std::hint::black_box(sum);
}

/// `<digest>.panels`: the SHA-256 of the key's parts and the model file's identity.
fn file_name(key: &PanelKey<'_>) -> io::Result<String> {
    let model = fs::canonicalize(key.model)?;
    let meta = fs::metadata(&model)?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    for part in [
        model.to_string_lossy().as_bytes(),
        &meta.len().to_le_bytes(),
        &mtime.to_le_bytes(),
        key.tensor.as_bytes(),
        key.layout.as_bytes(),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{hex}.panels"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(model: &'a Path, tensor: &'a str) -> PanelKey<'a> {
        PanelKey {
            model,
            tensor,
            layout: "test-v1",
        }
    }

    #[test]
    fn written_once_then_found_with_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        fs::write(&model, b"model bytes").unwrap();
        let panels = dir.path().join("panels");
        let fill = |w: &mut [u8]| -> io::Result<()> {
            for (i, b) in w.iter_mut().enumerate() {
                *b = (i * 7) as u8;
            }
            Ok(())
        };
        let a = PanelFile::open_or_write(&panels, &key(&model, "t"), 1000, true, fill).unwrap();
        assert!(a.written);
        let b = PanelFile::open_or_write(
            &panels,
            &key(&model, "t"),
            1000,
            true,
            |_| -> io::Result<()> { panic!("found, not rewritten") },
        )
        .unwrap();
        assert!(!b.written);
        assert_eq!(a.path, b.path);
        assert_eq!(
            &b.map[..],
            &(0..1000).map(|i| (i * 7) as u8).collect::<Vec<_>>()[..]
        );
        // No temporary file left beside it.
        assert_eq!(fs::read_dir(&panels).unwrap().count(), 1);
    }

    #[test]
    fn another_tensor_or_a_changed_model_is_another_file() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        fs::write(&model, b"model bytes").unwrap();
        let ok = |_: &mut [u8]| -> io::Result<()> { Ok(()) };
        let p = dir.path().join("panels");
        let a = PanelFile::open_or_write(&p, &key(&model, "t"), 8, true, ok).unwrap();
        let b = PanelFile::open_or_write(&p, &key(&model, "u"), 8, false, ok).unwrap();
        assert_ne!(a.path, b.path);
        fs::write(&model, b"other model bytes").unwrap();
        let c = PanelFile::open_or_write(&p, &key(&model, "t"), 8, true, ok).unwrap();
        assert_ne!(a.path, c.path);
        assert!(c.written);
    }

    #[test]
    fn a_failed_fill_leaves_nothing_under_any_name() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        fs::write(&model, b"model bytes").unwrap();
        let p = dir.path().join("panels");
        let err = PanelFile::open_or_write(&p, &key(&model, "t"), 64, true, |_| {
            Err(io::Error::other("repack failed"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "repack failed");
        assert_eq!(fs::read_dir(&p).unwrap().count(), 0);
    }

    #[test]
    fn a_file_of_another_length_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        fs::write(&model, b"model bytes").unwrap();
        let p = dir.path().join("panels");
        let ones = |w: &mut [u8]| -> io::Result<()> {
            w.fill(1);
            Ok(())
        };
        let a = PanelFile::open_or_write(&p, &key(&model, "t"), 16, true, ones).unwrap();
        fs::write(&a.path, [9u8; 3]).unwrap();
        let b = PanelFile::open_or_write(&p, &key(&model, "t"), 16, true, ones).unwrap();
        assert!(b.written);
        assert_eq!(&b.map[..], &[1u8; 16]);
    }
}
