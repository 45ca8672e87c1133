//! The manifest: what a run is, written to `manifest.json` before its first sample.
//!
//! It has two parts. [`RunIdentity`] holds everything that can change a result (Candor's
//! version, the protocol and its settings, models with their weight / tokenizer / chat
//! template hashes, data file hashes, prompt template versions, decoding parameters, seed,
//! the items); a second run in the same directory must match it field for field, or it is
//! refused with the differing fields named. [`Environment`] records where and how the run
//! was made (git commit, Cargo.lock hash, CPU features, threads, batch size, start time): by
//! the engine's contract none of it changes a result, so it is kept for provenance and never
//! compared. Each start of the run (the first and every resume) also appends its own
//! environment to `attempts.jsonl` ([`Attempt`]), so a run finished on several machines says
//! so. The git commit is `CANDOR_GIT_COMMIT` when set at build time, else asked of
//! `git` at run time in the crate's checkout (absent outside a checkout).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::run_dir::{sha256_bytes, sha256_file, write_atomic};
use super::StoreError;

/// Bumped when the run directory's formats change incompatibly.
pub const FORMAT: u32 = 1;

/// The whole manifest file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// Compared on resume.
    pub identity: RunIdentity,
    /// Recorded, never compared.
    pub environment: Environment,
}

/// Everything that affects results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunIdentity {
    pub candor_version: String,
    /// The protocol's snake_case name (`fbbench`, `refutebench`, ...).
    pub protocol: String,
    /// Protocol settings (subset, limit, options), as the protocol reports them.
    pub settings: Value,
    pub seed: u64,
    pub models: Vec<ModelIdentity>,
    pub data_files: Vec<DataFile>,
    /// Template name → version, for every prompt template the protocol uses.
    pub prompt_templates: BTreeMap<String, String>,
    /// Decoding parameters the protocol applies (per-step params are also in each sample).
    pub decoding: Value,
    pub items: ItemSet,
    /// The share of the items this run takes (`candor run --shard I/N`); absent when whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<super::shard_spec::Shard>,
    /// What the chat templates are given beside the messages (thinking switches, reasoning
    /// budget, the date); absent in runs from before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<super::chat_settings::ChatSettings>,
}

/// One loaded model and the hashes that identify it; filled by the engine side.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// Which actor it plays: `candidate/0`, `judge`.
    pub role: String,
    /// As the user named it (a path, `default`, a hub id).
    pub name: String,
    pub sha256: String,
    pub tokenizer_sha256: String,
    pub chat_template_sha256: String,
    /// Loading options that change outputs (e.g. `dtype`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// A data file the run read, by path and content hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataFile {
    /// As given (relative paths stay relative: the hash is what is compared).
    pub path: String,
    pub sha256: String,
}

impl DataFile {
    /// Hashes `path`.
    pub fn from_path(path: &Path) -> Result<Self, StoreError> {
        Ok(DataFile {
            path: path.display().to_string(),
            sha256: sha256_file(path)?,
        })
    }
}

/// The items a run covers: their number and the hash of their ids in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ItemSet {
    pub count: usize,
    pub ids_sha256: String,
}

impl ItemSet {
    pub fn from_ids(ids: &[String]) -> Self {
        let mut joined = String::new();
        for id in ids {
            joined.push_str(id);
            joined.push('\n');
        }
        ItemSet {
            count: ids.len(),
            ids_sha256: sha256_bytes(joined.as_bytes()),
        }
    }
}

/// Where and how a run was started; recorded only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub git_commit: Option<String>,
    /// Whether tracked files differed from the commit (None when unknown).
    pub git_dirty: Option<bool>,
    pub cargo_lock_sha256: String,
    pub os: String,
    pub arch: String,
    pub cpu_features: Vec<String>,
    pub threads: usize,
    pub batch_size: usize,
    /// The engine's prefix-cache budget in MiB (0: off; absent for runs without an engine or
    /// from before the cache). Changes how much prompt is recomputed, never a result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_mb: Option<usize>,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
}

impl Environment {
    /// The environment of this process.
    pub fn detect(threads: usize, batch_size: usize) -> Self {
        let (git_commit, git_dirty) = git_state();
        Environment {
            git_commit,
            git_dirty,
            cargo_lock_sha256: cargo_lock_sha256(),
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            cpu_features: cpu_features(),
            threads,
            batch_size,
            kv_cache_mb: None,
            started_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }
}

/// One start of a run, appended to `attempts.jsonl` (provenance only, never compared).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub resumed: bool,
    /// Samples already in the log when this attempt started.
    pub logged_samples: usize,
    pub environment: Environment,
}

impl Attempt {
    /// Appends this attempt as one line to `path` and fsyncs.
    pub fn append_to(&self, path: &Path) -> Result<(), StoreError> {
        use std::io::Write;
        let mut line = serde_json::to_vec(self).map_err(|source| StoreError::Encode {
            path: path.to_path_buf(),
            source,
        })?;
        line.push(b'\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| StoreError::io(path, e))?;
        f.write_all(&line).map_err(|e| StoreError::io(path, e))?;
        f.sync_data().map_err(|e| StoreError::io(path, e))
    }
}

/// sha256 of the Cargo.lock this binary was built with (embedded at compile time).
pub fn cargo_lock_sha256() -> String {
    sha256_bytes(include_bytes!("../../Cargo.lock"))
}

fn git_state() -> (Option<String>, Option<bool>) {
    if let Some(c) = option_env!("CANDOR_GIT_COMMIT") {
        return (Some(c.to_string()), None);
    }
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = commit
        .as_ref()
        .and_then(|_| git(&["status", "--porcelain", "--untracked-files=no"]))
        .map(|s| !s.is_empty());
    (commit, dirty)
}

/// The SIMD features this CPU offers that kernels may use.
pub fn cpu_features() -> Vec<String> {
    #[allow(unused_mut)]
    let mut out: Vec<String> = Vec::new();
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    {
        macro_rules! probe {
            ($($f:tt),*) => {$(
                if std::is_x86_feature_detected!($f) {
                    out.push($f.to_string());
                }
            )*};
        }
        probe!(
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "f16c",
            "avx512f",
            "avx512bw",
            "avx512vnni"
        );
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            out.push("neon".to_string());
        }
    }
    out
}

impl Manifest {
    pub fn new(identity: RunIdentity, environment: Environment) -> Self {
        Manifest {
            format: FORMAT,
            identity,
            environment,
        }
    }

    /// Reads a manifest file.
    pub fn load(path: &Path) -> Result<Self, StoreError> {
        let bytes = std::fs::read(path).map_err(|e| StoreError::io(path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| StoreError::Parse {
            path: path.to_path_buf(),
            line: e.line(),
            message: e.to_string(),
        })
    }

    /// Writes the manifest atomically.
    pub fn save(&self, path: &Path) -> Result<(), StoreError> {
        let mut bytes = serde_json::to_vec_pretty(self).map_err(|source| StoreError::Encode {
            path: path.to_path_buf(),
            source,
        })?;
        bytes.push(b'\n');
        write_atomic(path, &bytes)
    }

    /// The fields (as dotted paths, with both values) in which `self`, the run on disk,
    /// differs from `wanted` in anything that affects results. Empty: the runs are the same.
    pub fn differences(&self, wanted: &Manifest) -> Vec<String> {
        let mut out = Vec::new();
        if self.format != wanted.format {
            out.push(format!(
                "format (on disk {}, now {})",
                self.format, wanted.format
            ));
        }
        let a = serde_json::to_value(&self.identity).unwrap_or(Value::Null);
        let b = serde_json::to_value(&wanted.identity).unwrap_or(Value::Null);
        diff_values("", &a, &b, &mut out);
        out
    }
}

fn diff_values(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff_values(
                    &p,
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                diff_values(&format!("{path}[{i}]"), u, v, out);
            }
        }
        (Value::Array(x), Value::Array(y)) => out.push(format!(
            "{path} (on disk {} entries, now {})",
            x.len(),
            y.len()
        )),
        _ if a == b => {}
        _ => out.push(format!("{path} (on disk {}, now {})", short(a), short(b))),
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        let head: String = s.chars().take(37).collect();
        format!("{head}...")
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest::new(
            RunIdentity {
                candor_version: "0.1.0".into(),
                protocol: "toy".into(),
                settings: serde_json::json!({"limit": 10, "subset": ["a"]}),
                seed: 7,
                models: vec![ModelIdentity {
                    role: "candidate/0".into(),
                    name: "default".into(),
                    sha256: "aa".into(),
                    ..Default::default()
                }],
                data_files: vec![DataFile {
                    path: "x.jsonl".into(),
                    sha256: "bb".into(),
                }],
                prompt_templates: [("judge".to_string(), "v1".to_string())].into(),
                decoding: serde_json::json!({"temperature": 0.0}),
                items: ItemSet::from_ids(&["a".into(), "b".into()]),
                shard: None,
                chat: None,
            },
            Environment::detect(2, 8),
        )
    }

    #[test]
    fn identical_identity_has_no_differences_whatever_the_environment() {
        let a = sample();
        let mut b = sample();
        b.environment.threads = 16;
        b.environment.started_at += 100;
        b.environment.git_commit = Some("other".into());
        assert!(a.differences(&b).is_empty());
    }

    #[test]
    fn differences_name_each_field() {
        type Change = fn(&mut Manifest);
        let a = sample();
        let cases: Vec<(Change, &str)> = vec![
            (|m| m.identity.seed = 8, "seed (on disk 7, now 8)"),
            (
                |m| m.identity.models[0].sha256 = "cc".into(),
                "models[0].sha256",
            ),
            (
                |m| m.identity.data_files[0].sha256 = "cc".into(),
                "data_files[0].sha256",
            ),
            (
                |m| m.identity.settings["limit"] = 11.into(),
                "settings.limit",
            ),
            (
                |m| m.identity.items = ItemSet::from_ids(&["a".into()]),
                "items.count",
            ),
            (
                |m| m.identity.data_files.clear(),
                "data_files (on disk 1 entries, now 0)",
            ),
            (
                |m| m.identity.prompt_templates.clear(),
                "prompt_templates.judge",
            ),
        ];
        for (change, want) in cases {
            let mut b = sample();
            change(&mut b);
            let d = a.differences(&b);
            assert!(d.iter().any(|f| f.starts_with(want)), "{want}: {d:?}");
        }
    }

    #[test]
    fn save_then_load_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("manifest.json");
        let m = sample();
        m.save(&p).unwrap();
        assert_eq!(Manifest::load(&p).unwrap(), m);
    }

    #[test]
    fn malformed_manifest_names_file_and_line() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("manifest.json");
        std::fs::write(&p, "{\n  \"format\": 1,\n  oops\n}").unwrap();
        let err = Manifest::load(&p).unwrap_err().to_string();
        assert!(err.contains("manifest.json:3:"), "{err}");
    }

    #[test]
    fn cargo_lock_hash_is_hex() {
        let h = cargo_lock_sha256();
        assert_eq!(h.len(), 64);
        assert!(h.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
