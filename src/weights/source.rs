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
    /// A Hub repository, and which GGUF model in it when said.
    Hub { repo: String, pick: Option<HubPick> },
}

/// Which GGUF model of a Hub repository a `--model` value names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubPick {
    /// A file by its path in the repository (`org/repo:file.gguf`).
    File(String),
    /// A quantization by its name, as llama.cpp's `-hf org/repo:Q4_K_M` takes it
    /// (`org/repo:Q4_K_M`, case-insensitive): the one model whose file path holds it followed
    /// by `.` or `-`.
    Quant(String),
}

impl HubPick {
    fn parse(s: &str) -> Option<HubPick> {
        if s.ends_with(".gguf") {
            return Some(HubPick::File(s.to_string()));
        }
        let quant = !s.is_empty()
            && (s.chars()).all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
        quant.then(|| HubPick::Quant(s.to_string()))
    }
}

impl ModelSpec {
    /// Parses a `--model` value: `default`, an existing path, or `org/repo[:file.gguf|:QUANT]`.
    pub fn parse(value: &str) -> Result<Self> {
        if value == "default" {
            return Ok(ModelSpec::Default);
        }
        let path = Path::new(value);
        if path.exists() {
            return Ok(ModelSpec::Path(path.to_path_buf()));
        }
        let (repo, pick) = match value.split_once(':') {
            Some((r, p)) => (r, HubPick::parse(p).map(Some)),
            None => (value, Some(None)),
        };
        if let (true, Some(pick)) = (looks_like_hub_id(repo), pick) {
            return Ok(ModelSpec::Hub {
                repo: repo.to_string(),
                pick,
            });
        }
        Err(source_err(
            value,
            "no such file or directory, and not a Hub id (`org/repo`, `org/repo:file.gguf` or \
             `org/repo:QUANT`)",
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
    /// transformers' `chat_template.jinja` beside it, when present: the model's chat template,
    /// which replaces `tokenizer_config.json`'s (transformers 5 writes the template there
    /// alone).
    pub chat_template_jinja: Option<PathBuf>,
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
            chat_template_jinja: None,
            generation_config: None,
            chat_template: None,
        }
    }
}

/// transformers' chat template file (see [`ModelFiles::chat_template_jinja`]).
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

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
        chat_template_jinja: opt(CHAT_TEMPLATE_FILE),
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
        return files_sha256(&file.paths().map(Path::to_path_buf).collect::<Vec<_>>());
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
    files_sha256(&names.iter().map(|n| path.join(n)).collect::<Vec<_>>())
}

/// The sha256 of the lines `<sha256>  <file name>` of `files`, in their order.
fn files_sha256(files: &[PathBuf]) -> Result<String> {
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
    resolve_checked(value, &|_| Ok(()))
}

/// Checks a Hub checkpoint's `config.json` (its path) before its weights are downloaded:
/// the caller's refusal (an architecture it does not load) then costs one small file, not the
/// shards.
pub type ConfigCheck<'a> = &'a dyn Fn(&Path) -> std::result::Result<(), String>;

/// [`resolve`], a Hub checkpoint's `config.json` passed to `check` before its weights are
/// fetched.
pub fn resolve_checked(value: &str, check: ConfigCheck<'_>) -> Result<ModelFiles> {
    match ModelSpec::parse(value)? {
        ModelSpec::Default => resolve_default(&default_search_dirs()),
        ModelSpec::Path(p) => resolve_path(&p),
        ModelSpec::Hub { repo, pick } => resolve_hub(&repo, pick.as_ref(), check),
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
    // A split set is one model, named by its first file; projectors and the like are not
    // models.
    let mut ggufs: Vec<PathBuf> = (model_ggufs(&names).iter()).map(|n| path.join(n)).collect();
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
        chat_template_jinja: opt(CHAT_TEMPLATE_FILE),
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
pub fn resolve_hub(
    repo: &str,
    pick: Option<&HubPick>,
    check: ConfigCheck<'_>,
) -> Result<ModelFiles> {
    let name = match pick {
        Some(HubPick::File(f) | HubPick::Quant(f)) => format!("{repo}:{f}"),
        None => repo.to_string(),
    };
    if hub_offline() {
        let cache = hf_hub::Cache::from_env();
        let cached = cache.model(repo.to_string());
        let file = match pick {
            Some(HubPick::File(f)) => f.to_string(),
            _ => match cached_gguf(&cache, repo, pick) {
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
        // hf-hub's progress bars on a terminal (a split model can take an hour to fetch);
        // none in logs.
        .with_progress(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .build()
        .map_err(|e| source_err(&name, format!("hub client: {e}")))?;
    let api_repo = api.model(repo.to_string());
    let file = match pick {
        Some(HubPick::File(f)) => f.to_string(),
        _ => {
            let info = api_repo
                .info()
                .map_err(|e| source_err(&name, format!("listing the repository: {e}")))?;
            let all: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
            let checkpoint = all.iter().any(|f| f == "config.json")
                && all.iter().any(|f| f.ends_with(".safetensors"));
            if pick.is_none() && !all.iter().any(|f| f.ends_with(".gguf")) && checkpoint {
                return download_checkpoint(&api_repo, &all, check)
                    .map_err(|m| source_err(&name, m));
            }
            pick_model(&all, pick).map_err(|m| source_err(&name, m))?
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
/// generation files) into the Hub cache; they share one snapshot folder. The config is
/// `check`ed before anything else is fetched.
fn download_checkpoint(
    repo: &hf_hub::api::sync::ApiRepo,
    listing: &[String],
    check: ConfigCheck<'_>,
) -> std::result::Result<ModelFiles, String> {
    let get = |f: &str| repo.get(f).map_err(|e| format!("downloading `{f}`: {e}"));
    let config = get("config.json")?;
    check(&config).map_err(|e| {
        format!("{e} (checked before downloading the weights; a GGUF of the model may load)")
    })?;
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
        CHAT_TEMPLATE_FILE,
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

/// The model [`pick_model`] chooses among the `.gguf` files (in any folder) of the cached
/// snapshot of the repo's `main`.
fn cached_gguf(
    cache: &hf_hub::Cache,
    repo: &str,
    pick: Option<&HubPick>,
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
    let mut files = Vec::new();
    relative_files(&snapshot, "", &mut files)
        .map_err(|e| CachedGguf::Error(format!("reading {}: {e}", snapshot.display())))?;
    if pick.is_none() && !files.iter().any(|f| f.ends_with(".gguf")) && is_checkpoint_dir(&snapshot)
    {
        return Err(CachedGguf::Checkpoint(snapshot));
    }
    pick_model(&files, pick).map_err(CachedGguf::Error)
}

/// The paths of the files under `dir`, relative to it with `/` between folders (as the Hub
/// names them), appended to `out`.
fn relative_files(dir: &Path, prefix: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        // The snapshot's files are links into the cache's blobs: follow them.
        let path = entry.path();
        if path.is_dir() {
            relative_files(&path, &format!("{name}/"), out)?;
        } else {
            out.push(name);
        }
    }
    Ok(())
}

/// Whether a `.gguf` file is a model, not one of the files published beside models that
/// llama.cpp also tells apart by name: a vision projector (`mmproj`), an importance matrix
/// (`imatrix`), or a draft head (`mtp-`, `eagle3-`, `dflash-`, `dspark-`).
fn is_model_gguf(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.ends_with(".gguf")
        && !["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"]
            .iter()
            .any(|s| name.contains(s))
}

/// The models among a listing's files: its model `.gguf` files, a split set once by its first
/// file, sorted.
fn model_ggufs(files: &[String]) -> Vec<String> {
    let ggufs: Vec<String> = (files.iter())
        .filter(|f| is_model_gguf(f))
        .cloned()
        .collect();
    super::split::models(&ggufs)
}

/// The model of a repository's files that `pick` names: with no pick, its only model; with a
/// quantization, the only model whose path holds it (case-insensitive) followed by `.` or `-`,
/// as llama.cpp's `-hf org/repo:QUANT` matches it, and (unlike llama.cpp, where `F16` matches
/// `BF16-`) not inside a longer word. More than one is an error listing them (llama.cpp would
/// take the first listed: a run names its model exactly).
fn pick_model(files: &[String], pick: Option<&HubPick>) -> std::result::Result<String, String> {
    let models = model_ggufs(files);
    let (mut chosen, what) = match pick {
        Some(HubPick::Quant(q)) => {
            let q = q.to_ascii_uppercase();
            let holds = |f: &String| {
                let f = f.to_ascii_uppercase();
                (f.match_indices(&q)).any(|(i, _)| {
                    let before = f[..i].chars().next_back();
                    let after = f[i + q.len()..].chars().next();
                    before.is_none_or(|c| matches!(c, '-' | '_' | '.' | '/'))
                        && matches!(after, Some('.' | '-'))
                })
            };
            let chosen: Vec<String> = models.iter().filter(|f| holds(f)).cloned().collect();
            (chosen, format!(" of quantization {q}"))
        }
        Some(HubPick::File(f)) => (vec![f.clone()], String::new()),
        None => (models.clone(), String::new()),
    };
    match chosen.len() {
        1 => Ok(chosen.remove(0)),
        0 if models.is_empty() => Err("the repository holds no .gguf model".to_string()),
        0 => Err(format!(
            "the repository holds no .gguf model{what} (it holds {})",
            models.join(", ")
        )),
        n => Err(format!(
            "the repository holds {n} .gguf models{what} ({}); name one as org/repo:file.gguf \
             (or its quantization, org/repo:Q4_K_M)",
            chosen.join(", ")
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
                pick: None
            }
        );
        assert_eq!(
            ModelSpec::parse("org/repo:model.Q4_1.gguf").unwrap(),
            ModelSpec::Hub {
                repo: "org/repo".into(),
                pick: Some(HubPick::File("model.Q4_1.gguf".into()))
            }
        );
        assert_eq!(
            ModelSpec::parse("unsloth/Qwen3-235B-A22B-GGUF:UD-Q4_K_XL").unwrap(),
            ModelSpec::Hub {
                repo: "unsloth/Qwen3-235B-A22B-GGUF".into(),
                pick: Some(HubPick::Quant("UD-Q4_K_XL".into()))
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
            "org/repo:Q4 K",
            "org/repo:",
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

    /// What `org/repo`, `org/repo:QUANT` and `org/repo:file.gguf` choose from a repository's
    /// files: projectors, importance matrices and draft heads are not models, a split set is
    /// one by its first file, a quantization matches as llama.cpp's `-hf` matches it, and
    /// more than one match is an error listing them.
    #[test]
    fn a_quantization_or_the_only_model_is_picked() {
        let files: Vec<String> = [
            "README.md",
            "config.json",
            "mmproj-F16.gguf",
            "imatrix_unsloth.gguf",
            "Qwen3-30B-A3B-Q8_0.gguf",
            "Qwen3-30B-A3B-Q4_K_M.gguf",
            "Qwen3-30B-A3B-UD-Q4_K_XL.gguf",
            "BF16/Qwen3-30B-A3B-BF16-00001-of-00002.gguf",
            "BF16/Qwen3-30B-A3B-BF16-00002-of-00002.gguf",
        ]
        .map(String::from)
        .to_vec();
        let quant = |q: &str| pick_model(&files, Some(&HubPick::Quant(q.into())));
        assert_eq!(quant("q4_k_m").unwrap(), "Qwen3-30B-A3B-Q4_K_M.gguf");
        assert_eq!(
            quant("UD-Q4_K_XL").unwrap(),
            "Qwen3-30B-A3B-UD-Q4_K_XL.gguf"
        );
        assert_eq!(
            quant("BF16").unwrap(),
            "BF16/Qwen3-30B-A3B-BF16-00001-of-00002.gguf"
        );
        let e = quant("Q4_K").unwrap_err();
        assert!(e.contains("no .gguf model of quantization Q4_K"), "{e}");
        let e = quant("F16").unwrap_err();
        assert!(e.contains("no .gguf model of quantization F16"), "{e}");
        let e = pick_model(&files, None).unwrap_err();
        assert!(
            e.contains("holds 4 .gguf models") && !e.contains("mmproj"),
            "{e}"
        );
        let one: Vec<String> = ["mmproj-F16.gguf", "gemma-3-4b-it-Q4_K_M.gguf"]
            .map(String::from)
            .to_vec();
        assert_eq!(pick_model(&one, None).unwrap(), "gemma-3-4b-it-Q4_K_M.gguf");
        let two: Vec<String> = ["a-Q4_K_M.gguf", "a-UD-Q4_K_M.gguf"]
            .map(String::from)
            .to_vec();
        let e = pick_model(&two, Some(&HubPick::Quant("Q4_K_M".into()))).unwrap_err();
        assert!(e.contains("2 .gguf models of quantization Q4_K_M"), "{e}");
        let e = pick_model(&files[..2], None).unwrap_err();
        assert!(e.contains("no .gguf model"), "{e}");
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
        // A vision projector beside the model is not a second model.
        std::fs::write(dir.path().join("mmproj-model-f16.gguf"), b"x").unwrap();
        assert_eq!(
            resolve_path(dir.path()).unwrap().weights,
            dir.path().join("a.gguf")
        );
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
