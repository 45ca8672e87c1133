//! What every data loader shares: one error type ([`DataError`], whose messages name the file
//! and line, archive member or item index) and one JSONL line reader ([`read_lines`] for
//! readers, [`jsonl_lines`] for text already in memory). Blank lines are skipped everywhere;
//! line numbers are 1-based and count the blank lines, as an editor does.

use std::io::BufRead;
use std::path::{Path, PathBuf};

/// Errors reading the authors' files (data sets, published outputs, recorded transcripts).
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A malformed line: the file, its 1-based line number and what is wrong.
    #[error("{}:{line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A malformed line of an archive member.
    #[error("{}:{member}:{line}: {message}", path.display())]
    MemberLine {
        path: PathBuf,
        member: String,
        line: usize,
        message: String,
    },
    #[error("{}:{member}: {message}", path.display())]
    Member {
        path: PathBuf,
        member: String,
        message: String,
    },
    #[error("{}:{member}: {source}", path.display())]
    Zip {
        path: PathBuf,
        member: String,
        source: zip::result::ZipError,
    },
    /// A malformed item of a JSON array (0-based index).
    #[error("{}: item {index}: {message}", path.display())]
    Item {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("{}: not a json array of items: {source}", path.display())]
    NotArray {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{}: {message}", path.display())]
    Json { path: PathBuf, message: String },
    /// A file whose name does not follow the published layout.
    #[error("{}: {message}", path.display())]
    Layout { path: PathBuf, message: String },
    #[error("{}: no {what}", path.display())]
    Empty { path: PathBuf, what: &'static str },
    #[error("{}: {found} verdicts for {expected} items", path.display())]
    Count {
        path: PathBuf,
        found: usize,
        expected: usize,
    },
    #[error("{task}/{response_model}: {message}")]
    Mismatch {
        task: String,
        response_model: String,
        message: String,
    },
    #[error("{0}")]
    Other(String),
}

impl DataError {
    /// A malformed line of `path`.
    pub fn line(path: impl Into<PathBuf>, line: usize, message: impl Into<String>) -> Self {
        DataError::Line {
            path: path.into(),
            line,
            message: message.into(),
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}

/// The non-blank lines of `reader` with their 1-based numbers; a read error names
/// `path:line`.
pub fn read_lines<'a, R: BufRead + 'a>(
    reader: R,
    path: &'a Path,
) -> impl Iterator<Item = Result<(usize, String), DataError>> + 'a {
    reader
        .lines()
        .enumerate()
        .map(move |(i, line)| {
            line.map(|l| (i + 1, l))
                .map_err(|e| DataError::line(path, i + 1, e.to_string()))
        })
        .filter(|r| !matches!(r, Ok((_, l)) if l.trim().is_empty()))
}

/// The non-blank lines of `text` with their 1-based numbers.
pub fn jsonl_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty())
}

/// Parses JSON lines (blank lines skipped) into records, each checked by `validate`; errors
/// name `path:line`. An input without records is [`DataError::Empty`].
pub fn parse_jsonl<T: serde::de::DeserializeOwned>(
    reader: impl BufRead,
    path: &Path,
    validate: impl Fn(&T) -> Result<(), String>,
) -> Result<Vec<T>, DataError> {
    let mut out = Vec::new();
    for line in read_lines(reader, path) {
        let (n, line) = line?;
        let err = |message: String| DataError::line(path, n, message);
        let record: T = serde_json::from_str(&line).map_err(|e| err(e.to_string()))?;
        validate(&record).map_err(err)?;
        out.push(record);
    }
    if out.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            what: "items",
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_skip_blanks_and_keep_numbers() {
        let text = "a\n\n  \nb\n";
        assert_eq!(jsonl_lines(text).collect::<Vec<_>>(), [(1, "a"), (4, "b")]);
        let got: Vec<_> = read_lines(text.as_bytes(), Path::new("f"))
            .map(Result::unwrap)
            .collect();
        assert_eq!(got, [(1, "a".to_string()), (4, "b".to_string())]);
    }

    #[test]
    fn parse_errors_name_file_and_line() {
        let text = "{\"x\": 1}\n\n{\"x\": \"no\"}\n";
        #[derive(serde::Deserialize)]
        struct R {
            #[allow(dead_code)]
            x: u32,
        }
        let err = parse_jsonl::<R>(text.as_bytes(), Path::new("d/f.jsonl"), |_| Ok(()))
            .err()
            .unwrap()
            .to_string();
        assert!(err.starts_with("d/f.jsonl:3: invalid type"), "{err}");
        let err = parse_jsonl::<R>("\n".as_bytes(), Path::new("e.jsonl"), |_| Ok(()))
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "e.jsonl: no items");
    }
}
