//! The authors' public data: where it lives, and fetching it at pinned commits into a cache.
//!
//! Every file is listed in [`FILES`] (`data_files.rs`) with its size and sha256 (computed from
//! the authors' files), what reads it ([`Need`]: a protocol run, or only the comparison with
//! the authors' published numbers) and, where the authors publish it as a file, the
//! repository, full commit id and path it comes from. The first `candor run` of a protocol
//! downloads the files a run reads into the cache ([`cache_root`]: `$CANDOR_HOME/data`, else
//! the platform cache folder); `candor data fetch` also the comparison material the authors
//! publish. Downloads come from raw GitHub URLs at the pinned commits (`$CANDOR_GITHUB_RAW`
//! replaces `https://raw.githubusercontent.com`, for a proxy or a test), or from
//! `$CANDOR_MIRROR/<file>` when a mirror is set (a mirror is a copy of the data folder served
//! over HTTP). A run never needs a file the authors do not publish.
//!
//! A download goes to `<file>.part`, resumes with an HTTP `Range` request when a `.part` is
//! there, never takes more bytes than the table says, and is renamed into place only after its
//! sha256 matches: a mismatch deletes the `.part` and is refused, so a partial or altered
//! download is never read. With `$CANDOR_OFFLINE=1` (or `HF_HUB_OFFLINE=1`) nothing touches the
//! network; a missing file is then an error naming it. Comparison material the source cannot
//! give (a 404, a network failure) is not an error for `candor data fetch`: it warns, names
//! the file and URL as not available, and goes on; a run never asks for it. `--data` /
//! `$CANDOR_DATA` name a local copy, which is used as it is. ReaLMistake's archive is stored as
//! the authors encrypted it.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Names the cache's parent folder (`$CANDOR_HOME/data`).
pub const HOME_ENV: &str = crate::weights::panel_file::HOME_ENV;
/// Replaces the download base URL: files are fetched from `$CANDOR_MIRROR/<file>`.
pub const MIRROR_ENV: &str = "CANDOR_MIRROR";
/// Set to `1` (or `true`/`yes`/`on`), the network is never used.
pub const OFFLINE_ENV: &str = "CANDOR_OFFLINE";
/// Honoured like [`OFFLINE_ENV`], for machines already set up for Hugging Face offline use.
pub const HF_OFFLINE_ENV: &str = "HF_HUB_OFFLINE";
/// Where files with a pinned upstream come from without a mirror.
pub const GITHUB_RAW: &str = "https://raw.githubusercontent.com";
/// Replaces [`GITHUB_RAW`] (a site's proxy of raw GitHub, or a test's loopback server with the
/// same `/<owner>/<repo>/<commit>/<path>` layout).
pub const GITHUB_RAW_ENV: &str = "CANDOR_GITHUB_RAW";

/// The protocols whose data can be fetched (folder names under the data root).
pub const PROTOCOLS: &[&str] = &["fbbench", "refutebench", "realmistake", "fennec"];

/// Errors of the data store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown protocol `{0}` (known: fbbench, refutebench, realmistake, fennec)")]
    UnknownProtocol(String),
    #[error("{rel}: not in the cache and offline mode is on (${OFFLINE_ENV}); fetch it with `candor data fetch` on a connected machine, or point --data / $CANDOR_DATA at a local copy")]
    Offline { rel: String },
    #[error("{rel}: the authors do not publish this file on its own (comparison material only; no run needs it); set ${MIRROR_ENV} to a mirror of the data folder, or point --data / $CANDOR_DATA at a local copy")]
    NoSource { rel: String },
    #[error("{url}: {msg}")]
    Http { url: String, msg: String },
    #[error("{url}: sha256 {found}, expected {expected}; the download was deleted")]
    Sha256 {
        url: String,
        found: String,
        expected: String,
    },
    #[error(
        "{url}: the server sent more than the {expected} bytes of {rel}; the download was deleted"
    )]
    TooLong {
        url: String,
        rel: String,
        expected: u64,
    },
    #[error("{}: the {protocol} data folder was not found (set --data or $CANDOR_DATA, or unset them to fetch into the cache)", path.display())]
    Missing { path: PathBuf, protocol: String },
}

impl DataError {
    /// Whether the source could not give the file (an HTTP error status such as 404, or a
    /// network failure), as opposed to a refused download (sha256, size), offline mode or a
    /// local problem.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DataError::Http { .. })
    }
}

type Result<T, E = DataError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub use super::data_files::{DataFile, Need, Upstream, FILES};

/// The files of one protocol.
pub fn files_for(protocol: &str) -> Result<Vec<&'static DataFile>> {
    if !PROTOCOLS.contains(&protocol) {
        return Err(DataError::UnknownProtocol(protocol.to_string()));
    }
    Ok(FILES.iter().filter(|f| f.protocol() == protocol).collect())
}

/// The cache: `$CANDOR_HOME/data`, else `<platform cache dir>/candor/data`, else
/// `.candor/data`.
pub fn cache_root() -> PathBuf {
    match std::env::var_os(HOME_ENV) {
        Some(home) if !home.is_empty() => PathBuf::from(home).join("data"),
        _ => dirs::cache_dir()
            .map(|d| d.join("candor"))
            .unwrap_or_else(|| PathBuf::from(".candor"))
            .join("data"),
    }
}

/// The data root a run uses when `--data` is not given: `$CANDOR_DATA`, else `../shared/data`
/// when that folder exists (a checkout beside the shared data), else the cache.
pub fn default_root() -> PathBuf {
    if let Some(d) = std::env::var_os(crate::bench::DATA_ENV) {
        return PathBuf::from(d);
    }
    let beside = PathBuf::from("../shared/data");
    if beside.is_dir() {
        return beside;
    }
    cache_root()
}

/// Whether offline mode is on.
pub fn offline() -> bool {
    [OFFLINE_ENV, HF_OFFLINE_ENV].iter().any(|k| {
        std::env::var(k).is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "on"
            )
        })
    })
}

/// Where downloads come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// `$CANDOR_MIRROR`, without a trailing `/`.
    pub mirror: Option<String>,
    /// `$CANDOR_GITHUB_RAW`, else [`GITHUB_RAW`]; without a trailing `/`.
    pub github_raw: String,
    pub offline: bool,
}

fn env_url(key: &str) -> Option<String> {
    std::env::var(key)
        .ok()
        .filter(|m| !m.trim().is_empty())
        .map(|m| m.trim().trim_end_matches('/').to_string())
}

impl Source {
    /// From the environment.
    pub fn from_env() -> Source {
        Source {
            mirror: env_url(MIRROR_ENV),
            github_raw: env_url(GITHUB_RAW_ENV).unwrap_or_else(|| GITHUB_RAW.to_string()),
            offline: offline(),
        }
    }

    /// Raw GitHub at the pinned commits, no mirror, online.
    pub fn github() -> Source {
        Source {
            mirror: None,
            github_raw: GITHUB_RAW.to_string(),
            offline: false,
        }
    }

    /// Whether this source can give `file` at all.
    pub fn has(&self, file: &DataFile) -> bool {
        self.mirror.is_some() || file.upstream.is_some()
    }

    /// The URL a file is fetched from.
    pub fn url(&self, file: &DataFile) -> Result<String> {
        match (&self.mirror, file.upstream) {
            (Some(m), _) => Ok(format!("{m}/{}", file.rel)),
            (None, Some(u)) => Ok(format!(
                "{}/{}/{}/{}",
                self.github_raw, u.repo, u.commit, u.path
            )),
            (None, None) => Err(DataError::NoSource {
                rel: file.rel.to_string(),
            }),
        }
    }
}

/// What [`fetch_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// The file was already in place (right size).
    Present,
    /// Downloaded; `resumed_from` bytes came from an earlier `.part`.
    Downloaded { bytes: u64, resumed_from: u64 },
}

/// State of one file in a data root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Present,
    /// A `.part` of this many bytes waits to be resumed.
    Partial(u64),
    /// A file is there with another size than the table's.
    WrongSize(u64),
    Missing,
}

/// The state of a file under `root` (sizes only; hashes are checked when fetching).
pub fn status(root: &Path, file: &DataFile) -> Status {
    let dest = root.join(file.rel);
    match std::fs::metadata(&dest) {
        Ok(m) if m.len() == file.size => Status::Present,
        Ok(m) => Status::WrongSize(m.len()),
        Err(_) => match std::fs::metadata(part_path(&dest)) {
            Ok(m) => Status::Partial(m.len()),
            Err(_) => Status::Missing,
        },
    }
}

fn part_path(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".part");
    dest.with_file_name(name)
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(30))
        .timeout_read(Duration::from_secs(60))
        .build()
}

fn sha256_of(path: &Path) -> Result<String> {
    crate::weights::digest::sha256_file(path).map_err(io(path))
}

/// Makes `root/<file>` present: nothing to do when it is there with the right size; else
/// downloads it (resuming a `.part`), checks its sha256 and renames it into place.
pub fn fetch_file(root: &Path, file: &DataFile, source: &Source) -> Result<Fetched> {
    let dest = root.join(file.rel);
    if std::fs::metadata(&dest).is_ok_and(|m| m.len() == file.size) {
        return Ok(Fetched::Present);
    }
    if source.offline {
        return Err(DataError::Offline {
            rel: file.rel.to_string(),
        });
    }
    let url = source.url(file)?;
    let dir = dest.parent().unwrap_or(root);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let part = part_path(&dest);
    let mut have = std::fs::metadata(&part).map_or(0, |m| m.len());
    if have > file.size {
        std::fs::remove_file(&part).map_err(io(&part))?;
        have = 0;
    }
    let resumed_from;
    if have < file.size {
        let mut req = agent().get(&url);
        if have > 0 {
            req = req.set("Range", &format!("bytes={have}-"));
        }
        let http = |msg: String| DataError::Http {
            url: url.clone(),
            msg,
        };
        let resp = match req.call() {
            Ok(r) => r,
            Err(ureq::Error::Status(416, _)) if have > 0 => {
                // The server cannot resume from here: start again.
                std::fs::remove_file(&part).map_err(io(&part))?;
                return fetch_file(root, file, source);
            }
            Err(ureq::Error::Status(code, r)) => {
                return Err(http(format!("HTTP {code} {}", r.status_text())))
            }
            Err(ureq::Error::Transport(t)) => {
                return Err(http(match t.message() {
                    Some(m) => format!("{}: {m}", t.kind()),
                    None => t.kind().to_string(),
                }))
            }
        };
        let append = have > 0 && resp.status() == 206;
        resumed_from = if append { have } else { 0 };
        let mut out = OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&part)
            .map_err(io(&part))?;
        // Never more than the file's size: one byte more is refused below.
        let room = file.size - resumed_from;
        let mut body = resp.into_reader().take(room + 1);
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0u64;
        loop {
            let n = body
                .read(&mut buf)
                .map_err(|e| http(format!("reading the body: {e}")))?;
            if n == 0 {
                break;
            }
            got += n as u64;
            if got > room {
                drop(out);
                let _ = std::fs::remove_file(&part);
                return Err(DataError::TooLong {
                    url,
                    rel: file.rel.to_string(),
                    expected: file.size,
                });
            }
            out.write_all(&buf[..n]).map_err(io(&part))?;
        }
        out.sync_all().map_err(io(&part))?;
        if resumed_from + got < file.size {
            return Err(http(format!(
                "the download stopped at {} of {} bytes; run again to resume",
                resumed_from + got,
                file.size
            )));
        }
    } else {
        resumed_from = have;
    }
    let found = sha256_of(&part)?;
    if found != file.sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(DataError::Sha256 {
            url,
            found,
            expected: file.sha256.to_string(),
        });
    }
    std::fs::rename(&part, &dest).map_err(io(&dest))?;
    Ok(Fetched::Downloaded {
        bytes: file.size - resumed_from,
        resumed_from,
    })
}

/// Makes a protocol's data usable under `root` and returns `root`. The cache is filled from
/// the network with the files a run reads ([`Need::Run`]; or fails naming the first file it
/// cannot get); any other root is a local copy and must already hold the protocol's folder.
pub fn ensure_protocol(root: &Path, protocol: &str) -> Result<PathBuf> {
    if root == cache_root() {
        let source = Source::from_env();
        for file in files_for(protocol)?
            .into_iter()
            .filter(|f| f.need == Need::Run)
        {
            if let Fetched::Downloaded { bytes, .. } = fetch_file(root, file, &source)? {
                eprintln!("fetched {} ({bytes} bytes)", file.rel);
            }
        }
    } else if !root.join(protocol).is_dir() {
        return Err(DataError::Missing {
            path: root.join(protocol),
            protocol: protocol.to_string(),
        });
    }
    Ok(root.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for f in FILES {
            assert!(seen.insert(f.rel), "{} twice", f.rel);
            assert!(PROTOCOLS.contains(&f.protocol()), "{}", f.rel);
            assert_eq!(f.sha256.len(), 64, "{}", f.rel);
            assert!(!f.rel.contains(".."), "{}", f.rel);
        }
        for p in PROTOCOLS {
            assert!(!files_for(p).unwrap().is_empty(), "{p}");
        }
        assert!(files_for("toy").is_err());
    }

    #[test]
    fn urls_use_the_mirror_or_the_pinned_commit() {
        let f = FILES
            .iter()
            .find(|f| f.rel == "realmistake/data.zip")
            .unwrap();
        let gh = Source::github();
        assert_eq!(
            gh.url(f).unwrap(),
            "https://raw.githubusercontent.com/psunlpgroup/ReaLMistake/f94a8b978926414deb1dcf6b50076fd06c892192/data.zip"
        );
        let m = Source {
            mirror: Some("http://127.0.0.1:9/data".into()),
            ..Source::github()
        };
        assert_eq!(
            m.url(f).unwrap(),
            "http://127.0.0.1:9/data/realmistake/data.zip"
        );
        let table = FILES.iter().find(|f| f.upstream.is_none()).unwrap();
        assert!(matches!(gh.url(table), Err(DataError::NoSource { .. })));
        let proxy = Source {
            github_raw: "http://127.0.0.1:9/raw".into(),
            ..Source::github()
        };
        assert_eq!(
            proxy.url(f).unwrap(),
            "http://127.0.0.1:9/raw/psunlpgroup/ReaLMistake/f94a8b978926414deb1dcf6b50076fd06c892192/data.zip"
        );
    }

    /// Every pinned file's URL is `https://raw.githubusercontent.com/<owner>/<repo>/<40 hex
    /// digits>/<path>`: raw URLs are only guaranteed to resolve a full commit id.
    #[test]
    fn pinned_urls_use_full_commit_ids() {
        let gh = Source::github();
        let mut bad = std::collections::BTreeSet::new();
        for f in FILES.iter().filter(|f| f.upstream.is_some()) {
            let url = gh.url(f).unwrap();
            let rest = url
                .strip_prefix("https://raw.githubusercontent.com/")
                .unwrap();
            let parts: Vec<&str> = rest.splitn(4, '/').collect();
            assert_eq!(parts.len(), 4, "{url}");
            assert!(parts[..2].iter().all(|p| !p.is_empty()), "{url}");
            assert!(!parts[3].is_empty() && !parts[3].starts_with('/'), "{url}");
            let commit = parts[2];
            if !(commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit())) {
                bad.insert(format!("{}@{commit}", f.upstream.unwrap().repo));
            }
        }
        assert!(bad.is_empty(), "pinned by a short commit id: {bad:?}");
    }

    /// A run reads only files the authors publish; what they do not publish is comparison
    /// material.
    #[test]
    fn a_run_needs_only_published_files() {
        for f in FILES.iter().filter(|f| f.need == Need::Run) {
            assert!(
                f.upstream.is_some(),
                "{}: a run needs it, but it is not published",
                f.rel
            );
        }
        for p in PROTOCOLS {
            assert!(
                files_for(p).unwrap().iter().any(|f| f.need == Need::Run),
                "{p}"
            );
        }
    }

    /// A network failure is "unavailable" (`candor data fetch` warns and goes on past a
    /// comparison file it cannot get); offline mode is not.
    #[test]
    fn a_network_failure_is_unavailable_offline_mode_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let f = &FILES[0];
        let src = Source {
            mirror: Some("http://127.0.0.1:1".into()),
            ..Source::github()
        };
        let err = fetch_file(dir.path(), f, &src).unwrap_err();
        assert!(err.is_unavailable(), "{err}");
        let offline = Source {
            offline: true,
            ..src
        };
        let err = fetch_file(dir.path(), f, &offline).unwrap_err();
        assert!(!err.is_unavailable(), "{err}");
    }

    #[test]
    fn offline_never_downloads() {
        let dir = tempfile::tempdir().unwrap();
        let f = &FILES[0];
        let src = Source {
            mirror: Some("http://127.0.0.1:1".into()),
            offline: true,
            ..Source::github()
        };
        let err = fetch_file(dir.path(), f, &src).unwrap_err();
        assert!(matches!(err, DataError::Offline { .. }), "{err}");
        assert_eq!(status(dir.path(), f), Status::Missing);
    }
}
