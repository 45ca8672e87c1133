//! The run directory on disk: where each file lives, the lock that keeps two processes from
//! writing one run, atomic whole-file writes and file hashes.
//!
//! The lock is an advisory `flock`-style lock on `.lock` (held for the life of [`RunDir`]); the
//! operating system drops it when the process dies, so a run killed with SIGKILL can be
//! resumed at once. What goes into the files is decided elsewhere ([`super::manifest`],
//! [`super::samples`], [`super::run_results`] and, for the reports, the caller).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::StoreError;

/// File names inside a run directory.
pub const MANIFEST: &str = "manifest.json";
pub const SAMPLES: &str = "samples.jsonl";
pub const RESULTS: &str = "results.json";
pub const REPORT: &str = "report.md";
pub const REPORT_HTML: &str = "report.html";
pub const ATTEMPTS: &str = "attempts.jsonl";
/// This attempt's engine counters (prefill tokens computed and reused), beside `results.json`;
/// not part of the results (they depend on batch size and where a resume started).
pub const ENGINE_STATS: &str = "engine.json";
/// Finished steps not yet in the samples (see [`super::pending`]).
pub const PENDING: &str = "pending.jsonl";
const LOCK: &str = ".lock";

/// An open, locked run directory.
#[derive(Debug)]
pub struct RunDir {
    root: PathBuf,
    _lock: File,
}

/// How many times a held lock is tried, 50 ms apart, before the run is refused.
const LOCK_ATTEMPTS: usize = 20;

impl RunDir {
    /// Creates `root` if needed and takes its lock; fails with [`StoreError::Locked`] when
    /// another live process holds it.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|e| StoreError::io(&root, e))?;
        let lock_path = root.join(LOCK);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StoreError::io(&lock_path, e))?;
        // A lock can outlive its holder for a moment: a child process forked by another thread
        // of this process holds a copy of the descriptor until its exec closes it. So a held
        // lock is retried for about a second before it counts as another live run.
        for attempt in 0..LOCK_ATTEMPTS {
            match lock.try_lock() {
                Ok(()) => return Ok(RunDir { root, _lock: lock }),
                Err(fs::TryLockError::WouldBlock) if attempt + 1 < LOCK_ATTEMPTS => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(fs::TryLockError::WouldBlock) => break,
                Err(fs::TryLockError::Error(e)) => return Err(StoreError::io(&lock_path, e)),
            }
        }
        Err(StoreError::Locked { path: root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.root.join(MANIFEST)
    }

    pub fn samples_path(&self) -> PathBuf {
        self.root.join(SAMPLES)
    }

    pub fn results_path(&self) -> PathBuf {
        self.root.join(RESULTS)
    }

    pub fn report_path(&self) -> PathBuf {
        self.root.join(REPORT)
    }

    pub fn report_html_path(&self) -> PathBuf {
        self.root.join(REPORT_HTML)
    }

    pub fn engine_stats_path(&self) -> PathBuf {
        self.root.join(ENGINE_STATS)
    }

    pub fn pending_path(&self) -> PathBuf {
        self.root.join(PENDING)
    }

    pub fn attempts_path(&self) -> PathBuf {
        self.root.join(ATTEMPTS)
    }

    /// Removes `results.json`, `report.md` and `report.html` left by an earlier attempt, so
    /// that their presence always means "this run finished and these match its samples".
    pub fn clear_outputs(&self) -> Result<(), StoreError> {
        for path in [
            self.results_path(),
            self.report_path(),
            self.report_html_path(),
            self.engine_stats_path(),
        ] {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(&path, e)),
            }
        }
        Ok(())
    }
}

/// Writes `bytes` to `path` all at once: a temporary file in the same directory, fsynced, then
/// renamed over `path`. A reader sees the old file or the whole new one, never half of it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
    f.write_all(bytes).map_err(|e| StoreError::io(&tmp, e))?;
    f.sync_all().map_err(|e| StoreError::io(&tmp, e))?;
    drop(f);
    fs::rename(&tmp, path).map_err(|e| StoreError::io(path, e))?;
    sync_dir(dir)
}

/// Makes a rename or a new file in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    let d = File::open(dir).map_err(|e| StoreError::io(dir, e))?;
    d.sync_all().map_err(|e| StoreError::io(dir, e))
}

/// Lower-case hex sha256 of a file's bytes, read in blocks.
pub fn sha256_file(path: &Path) -> Result<String, StoreError> {
    crate::weights::digest::sha256_file(path).map_err(|e| StoreError::io(path, e))
}

/// Lower-case hex sha256 of bytes.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_open_of_a_locked_dir_is_refused_and_released_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let a = RunDir::open(tmp.path().join("run")).unwrap();
        let err = RunDir::open(tmp.path().join("run")).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        drop(a);
        RunDir::open(tmp.path().join("run")).unwrap();
    }

    #[test]
    fn atomic_write_replaces_whole_file() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.json");
        write_atomic(&p, b"first, longer content").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"second");
        assert!(!tmp.path().join(".x.json.tmp").exists());
    }

    #[test]
    fn sha256_of_file_matches_bytes() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        fs::write(&p, b"abc").unwrap();
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_file(&p).unwrap(), want);
        assert_eq!(sha256_bytes(b"abc"), want);
    }

    #[test]
    fn clear_outputs_tolerates_absent_files() {
        let tmp = tempfile::tempdir().unwrap();
        let d = RunDir::open(tmp.path()).unwrap();
        d.clear_outputs().unwrap();
        fs::write(d.results_path(), b"{}").unwrap();
        d.clear_outputs().unwrap();
        assert!(!d.results_path().exists());
    }
}
