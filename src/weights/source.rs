//! Where a model's files are: resolving a `--model` value (`default`, a local path, or a
//! Hugging Face Hub id) to a GGUF file, or to a Hugging Face checkpoint folder (`config.json`
//! and `*.safetensors`), plus, optionally, a `tokenizer.json`, a `tokenizer_config.json` and
//! a `generation_config.json` beside it.
//!
//! `default` is the SmolLM2-135M-Instruct Q4_1 GGUF that `candor setup` puts in `models/`
//! (under the crate root or the current directory). A Hub id is `org/repo` (the repo must
//! hold exactly one `.gguf` model, or be a safetensors checkpoint with no `.gguf`) or
//! `org/repo:file.gguf`. A GGUF split set ([`super::split`]) counts as one model, named by its
//! first file, and all its files are fetched. Files come through hf-hub, which keeps its cache (`HF_HOME`) and,
//! with `HF_HUB_OFFLINE=1`, never touches the network. This module only finds files; it does
//! not read them ([`crate::text::tokenizer`], the weights loaders do).

use std::path::{Path, PathBuf};

use super::error::{Result, WeightsError};

/// File name of the default model.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// sha256 of the default model file.
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// A parsed `--model` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// The default model in `models/`.
    Default,
    /// A `.gguf` file, or a directory holding one.
    Path(PathBuf),
    /// A Hub repository, and the GGUF file in it when named.
    Hub { repo: String, file: Option<String> },
}

impl ModelSpec {
    /// Parses a `--model` value: `default`, an existing path, or `org/repo[:file.gguf]`.
    pub fn parse(value: &str) -> Result<Self> {
        if value == "default" {
            return Ok(ModelSpec::Default);
        }
        let path = Path::new(value);
        if path.exists() {
            return Ok(ModelSpec::Path(path.to_path_buf()));
        }
        let (repo, file) = match value.split_once(':') {
            Some((r, f)) => (r, Some(f)),
            None => (value, None),
        };
        if looks_like_hub_id(repo) && file.is_none_or(|f| f.ends_with(".gguf")) {
            return Ok(ModelSpec::Hub {
                repo: repo.to_string(),
                file: file.map(str::to_string),
            });
        }
        Err(source_err(
            value,
            "no such file or directory, and not a Hub id (`org/repo` or `org/repo:file.gguf`)",
        ))
    }
}

fn looks_like_hub_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let ok = |p: Option<&str>| {
        p.is_some_and(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        })
    };
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

/// The files a model was resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// The weights: a `.gguf` file (which also holds the tokenizer unless `tokenizer_json` is
    /// given), or a checkpoint folder when `checkpoint` is set.
    pub weights: PathBuf,
    /// `weights` is a Hugging Face checkpoint folder (`config.json`, `*.safetensors`).
    pub checkpoint: bool,
    /// A Hugging Face tokenizer beside the weights, which then takes precedence.
    pub tokenizer_json: Option<PathBuf>,
    /// Its `tokenizer_config.json` (BOS/EOS, chat template), when present.
    pub tokenizer_config: Option<PathBuf>,
    /// `generation_config.json` (its `eos_token_id`s also stop generation), when present.
    pub generation_config: Option<PathBuf>,
    /// A Jinja chat template file given on the command line (`--chat-template`): replaces the
    /// model's own (or gives a base model one).
    pub chat_template: Option<PathBuf>,
}

impl ModelFiles {
    fn gguf(gguf: PathBuf) -> ModelFiles {
        ModelFiles {
            weights: gguf,
            checkpoint: false,
            tokenizer_json: None,
            tokenizer_config: None,
            generation_config: None,
            chat_template: None,
        }
    }
}

/// Whether a folder looks like a Hugging Face checkpoint (`config.json` and safetensors).
pub fn is_checkpoint_dir(dir: &Path) -> bool {
    dir.join("config.json").is_file()
        && std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .filter_map(|e| e.ok())
                .any(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        })
}

/// A checkpoint folder with whichever tokenizer and generation files it has.
fn checkpoint_files(dir: &Path) -> ModelFiles {
    let opt = |n: &str| Some(dir.join(n)).filter(|p| p.is_file());
    ModelFiles {
        weights: dir.to_path_buf(),
        checkpoint: true,
        tokenizer_json: opt("tokenizer.json"),
        tokenizer_config: opt("tokenizer_config.json"),
        generation_config: opt("generation_config.json"),
        chat_template: None,
    }
}

/// The sha256 a run manifest records for the weights: the file's own for a GGUF; for the
/// first file of a GGUF split set, the sha256 of the lines `<sha256>  <name>` of its files in
/// split order; for a checkpoint folder, of those lines for its `config.json`,
/// `*.safetensors` and index, sorted by name.
pub fn weights_sha256(path: &Path) -> Result<String> {
    if !path.is_dir() {
        if super::split::set_paths(path).len() == 1 {
            return super::gguf::file_sha256(path);
        }
        // The files the model is read from, as its metadata says.
        let file = super::gguf::GgufFile::open(path)?;
        return files_sha256(file.paths());
    }
    let mut names: Vec<String> = std::fs::read_dir(path)
        .map_err(|e| WeightsError::io(path, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n == "config.json"
                || n.ends_with(".safetensors")
                || n.ends_with(".safetensors.index.json")
        })
        .collect();
    names.sort();
    files_sha256(
        names
            .iter()
            .map(|n| path.join(n))
            .collect::<Vec<_>>()
            .iter()
            .map(|p| p.as_path()),
    )
}

/// The sha256 of the lines `<sha256>  <file name>` of `files`, in their order.
fn files_sha256<'a>(files: impl Iterator<Item = &'a Path>) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for p in files {
        let h = super::gguf::file_sha256(p)?;
        let n = p.file_name().unwrap_or_default().to_string_lossy();
        hasher.update(format!("{h}  {n}\n"));
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Resolves a `--model` value to files on disk, downloading from the Hub if needed.
pub fn resolve(value: &str) -> Result<ModelFiles> {
    match ModelSpec::parse(value)? {
        ModelSpec::Default => resolve_default(&default_search_dirs()),
        ModelSpec::Path(p) => resolve_path(&p),
        ModelSpec::Hub { repo, file } => resolve_hub(&repo, file.as_deref()),
    }
}

/// Where `default` is looked for: `models/` under the crate root, then under the current
/// directory.
pub fn default_search_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("models")];
    if let Ok(cwd) = std::env::current_dir() {
        let d = cwd.join("models");
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// The default model in the first of `dirs` that has it.
pub fn resolve_default(dirs: &[PathBuf]) -> Result<ModelFiles> {
    for d in dirs {
        let p = d.join(DEFAULT_MODEL_FILE);
        if p.is_file() {
            return Ok(ModelFiles::gguf(p));
        }
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(source_err(
        "default",
        format!(
            "{DEFAULT_MODEL_FILE} not found in {}; run `candor setup`",
            looked.join(" or ")
        ),
    ))
}

/// A local `.gguf` file, a directory with exactly one `.gguf` (and optionally
/// `tokenizer.json` / `tokenizer_config.json`), or a checkpoint folder with no `.gguf`.
pub fn resolve_path(path: &Path) -> Result<ModelFiles> {
    let name = path.display().to_string();
    if path.is_file() {
        if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
            return Err(source_err(&name, "not a .gguf file"));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        return Ok(with_tokenizer_files(path.to_path_buf(), dir));
    }
    if !path.is_dir() {
        return Err(source_err(&name, "no such file or directory"));
    }
    let entries = std::fs::read_dir(path).map_err(|e| WeightsError::io(path, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| WeightsError::io(path, e))?;
        let p = entry.path();
        if p.is_file() && p.extension().and_then(|e| e.to_str()) == Some("gguf") {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    // A split set is one model, named by its first file.
    let mut ggufs: Vec<PathBuf> = (super::split::models(&names).iter())
        .map(|n| path.join(n))
        .collect();
    match ggufs.len() {
        0 if is_checkpoint_dir(path) => Ok(checkpoint_files(path)),
        0 => Err(source_err(
            &name,
            "directory holds no .gguf file and is not a checkpoint (config.json and *.safetensors)",
        )),
        1 => Ok(with_tokenizer_files(ggufs.remove(0), path)),
        _ => Err(source_err(
            &name,
            format!(
                "directory holds {} .gguf models ({}); name one",
                ggufs.len(),
                file_names(&ggufs)
            ),
        )),
    }
}

fn with_tokenizer_files(gguf: PathBuf, dir: &Path) -> ModelFiles {
    let opt = |n: &str| Some(dir.join(n)).filter(|p| p.is_file());
    ModelFiles {
        tokenizer_json: opt("tokenizer.json"),
        tokenizer_config: opt("tokenizer_config.json"),
        ..ModelFiles::gguf(gguf)
    }
}

fn file_names(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn hub_offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .map(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
        .unwrap_or(false)
}

/// A GGUF from a Hub repository (cached by hf-hub; offline reads only the cache).
pub fn resolve_hub(repo: &str, file: Option<&str>) -> Result<ModelFiles> {
    let name = match file {
        Some(f) => format!("{repo}:{f}"),
        None => repo.to_string(),
    };
    if hub_offline() {
        let cache = hf_hub::Cache::from_env();
        let cached = cache.model(repo.to_string());
        let file = match file {
            Some(f) => f.to_string(),
            None => match single_cached_gguf(&cache, repo) {
                Ok(f) => f,
                Err(CachedGguf::Checkpoint(dir)) => return Ok(checkpoint_files(&dir)),
                Err(CachedGguf::Error(m)) => return Err(source_err(&name, m)),
            },
        };
        let mut paths = Vec::new();
        for f in split_set(&file) {
            paths.push(cached.get(&f).ok_or_else(|| {
                source_err(
                    &name,
                    format!(
                        "HF_HUB_OFFLINE is set and `{f}` is not in the Hub cache at {}",
                        cache.path().display()
                    ),
                )
            })?);
        }
        return Ok(ModelFiles::gguf(paths.swap_remove(0)));
    }
    let api = hf_hub::api::sync::ApiBuilder::from_env()
        .with_progress(false)
        .build()
        .map_err(|e| source_err(&name, format!("hub client: {e}")))?;
    let api_repo = api.model(repo.to_string());
    let file = match file {
        Some(f) => f.to_string(),
        None => {
            let info = api_repo
                .info()
                .map_err(|e| source_err(&name, format!("listing the repository: {e}")))?;
            let all: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
            let ggufs: Vec<String> = all
                .iter()
                .filter(|f| f.ends_with(".gguf"))
                .cloned()
                .collect();
            let checkpoint = all.iter().any(|f| f == "config.json")
                && all.iter().any(|f| f.ends_with(".safetensors"));
            if ggufs.is_empty() && checkpoint {
                return download_checkpoint(&api_repo, &all).map_err(|m| source_err(&name, m));
            }
            pick_one(ggufs).map_err(|m| source_err(&name, m))?
        }
    };
    let mut paths = Vec::new();
    for f in split_set(&file) {
        paths.push(
            api_repo
                .get(&f)
                .map_err(|e| source_err(&name, format!("downloading `{f}`: {e}")))?,
        );
    }
    // The files of a split set share the snapshot's folder, where loading the first finds
    // the others.
    Ok(ModelFiles::gguf(paths.swap_remove(0)))
}

/// The files to fetch for a GGUF named in a repository: its whole split set when it is the
/// first file of one, else itself.
fn split_set(file: &str) -> Vec<String> {
    match super::split::SplitName::parse(file) {
        Some(s) if s.no == 1 && s.count > 1 => s.all(),
        _ => vec![file.to_string()],
    }
}

/// Downloads a checkpoint's files (config, index, the shards it needs, tokenizer and
/// generation files) into the Hub cache; they share one snapshot folder.
fn download_checkpoint(
    repo: &hf_hub::api::sync::ApiRepo,
    listing: &[String],
) -> std::result::Result<ModelFiles, String> {
    let get = |f: &str| repo.get(f).map_err(|e| format!("downloading `{f}`: {e}"));
    let config = get("config.json")?;
    let index = super::safetensors::INDEX_FILE;
    let shards: Vec<String> = if listing.iter().any(|f| f == index) {
        let path = get(index)?;
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{index}: {e}"))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{index}: {e}"))?;
        let mut v: Vec<String> = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| format!("{index}: no `weight_map`"))?
            .values()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect();
        v.sort();
        v.dedup();
        v
    } else if listing.iter().any(|f| f == "model.safetensors") {
        vec!["model.safetensors".to_string()]
    } else {
        return Err(format!(
            "no model.safetensors and no {index} in the repository"
        ));
    };
    for s in &shards {
        get(s)?;
    }
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        if listing.iter().any(|l| l == f) {
            get(f)?;
        }
    }
    let dir = config.parent().unwrap_or(Path::new("."));
    Ok(checkpoint_files(dir))
}

/// Why no single cached `.gguf` was found.
enum CachedGguf {
    /// The cached snapshot is a checkpoint folder instead.
    Checkpoint(PathBuf),
    Error(String),
}

/// The only `.gguf` in the cached snapshot of the repo's `main`.
fn single_cached_gguf(
    cache: &hf_hub::Cache,
    repo: &str,
) -> std::result::Result<String, CachedGguf> {
    let folder = cache
        .path()
        .join(format!("models--{}", repo.replace('/', "--")));
    let main = std::fs::read_to_string(folder.join("refs").join("main")).map_err(|_| {
        CachedGguf::Error(format!(
            "HF_HUB_OFFLINE is set and the repository is not in the Hub cache at {}",
            cache.path().display()
        ))
    })?;
    let snapshot = folder.join("snapshots").join(main.trim());
    let entries = std::fs::read_dir(&snapshot)
        .map_err(|e| CachedGguf::Error(format!("reading {}: {e}", snapshot.display())))?;
    let ggufs: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".gguf"))
        .collect();
    if ggufs.is_empty() && is_checkpoint_dir(&snapshot) {
        return Err(CachedGguf::Checkpoint(snapshot));
    }
    pick_one(ggufs).map_err(CachedGguf::Error)
}

/// The one model among a repository's `.gguf` files (a split set counts once, by its first
/// file).
fn pick_one(ggufs: Vec<String>) -> std::result::Result<String, String> {
    let mut ggufs = super::split::models(&ggufs);
    match ggufs.len() {
        0 => Err("the repository holds no .gguf file".to_string()),
        1 => Ok(ggufs.remove(0)),
        n => Err(format!(
            "the repository holds {n} .gguf models ({}); name one as org/repo:file.gguf",
            ggufs.join(", ")
        )),
    }
}

fn source_err(name: &str, msg: impl Into<String>) -> WeightsError {
    WeightsError::Source {
        source_name: name.to_string(),
        msg: msg.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_model_values() {
        assert_eq!(ModelSpec::parse("default").unwrap(), ModelSpec::Default);
        assert_eq!(
            ModelSpec::parse("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF").unwrap(),
            ModelSpec::Hub {
                repo: "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF".into(),
                file: None
            }
        );
        assert_eq!(
            ModelSpec::parse("org/repo:model.Q4_1.gguf").unwrap(),
            ModelSpec::Hub {
                repo: "org/repo".into(),
                file: Some("model.Q4_1.gguf".into())
            }
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().to_str().unwrap();
        assert_eq!(
            ModelSpec::parse(p).unwrap(),
            ModelSpec::Path(dir.path().into())
        );
        for bad in [
            "no/such/thing.gguf",
            "nothing-here.gguf",
            "org/repo:notes.txt",
            "../x/y",
        ] {
            let err = ModelSpec::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }

    #[test]
    fn default_missing_says_run_setup() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_default(&[dir.path().to_path_buf()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("run `candor setup`"), "{err}");
        std::fs::write(dir.path().join(DEFAULT_MODEL_FILE), b"x").unwrap();
        let files = resolve_default(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(files.weights, dir.path().join(DEFAULT_MODEL_FILE));
    }

    #[test]
    fn directory_needs_exactly_one_gguf() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_path(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no .gguf"), "{err}");
        // A checkpoint folder (config.json and safetensors, no .gguf) is accepted as such.
        let ck = tempfile::tempdir().unwrap();
        std::fs::write(ck.path().join("config.json"), b"{}").unwrap();
        std::fs::write(ck.path().join("model.safetensors"), b"x").unwrap();
        std::fs::write(ck.path().join("generation_config.json"), b"{}").unwrap();
        let files = resolve_path(ck.path()).unwrap();
        assert!(files.checkpoint);
        assert_eq!(files.weights, ck.path());
        assert!(files.generation_config.is_some() && files.tokenizer_json.is_none());
        std::fs::write(dir.path().join("a.gguf"), b"x").unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), b"{}").unwrap();
        let files = resolve_path(dir.path()).unwrap();
        assert_eq!(files.weights, dir.path().join("a.gguf"));
        assert_eq!(
            files.tokenizer_json,
            Some(dir.path().join("tokenizer.json"))
        );
        assert_eq!(files.tokenizer_config, None);
        std::fs::write(dir.path().join("b.gguf"), b"x").unwrap();
        let err = resolve_path(dir.path()).unwrap_err().to_string();
        assert!(err.contains("a.gguf, b.gguf"), "{err}");
        let txt = dir.path().join("notes.txt");
        std::fs::write(&txt, b"x").unwrap();
        assert!(resolve_path(&txt)
            .unwrap_err()
            .to_string()
            .contains("not a .gguf"));
    }
}
