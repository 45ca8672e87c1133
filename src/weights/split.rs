//! GGUF split sets: one model written as several files, `<prefix>-00001-of-0000N.gguf` to
//! `<prefix>-0000N-of-0000N.gguf`, as `llama-gguf-split` writes them and as the Hub
//! distributes large models (gpt-oss-120b, Qwen3-235B-A22B, Qwen3.5-122B-A10B).
//!
//! The names are llama.cpp's (`llama_split_path`: a five-digit, one-based split number and
//! count); which file is which split, and how many there are, is said by each file's metadata
//! (`split.no`, zero-based, `split.count`, and `split.tensors.count` in the first), read by
//! [`super::gguf::GgufFile::open`]. This module only names files: from a first split's name to
//! its siblings', and from a list of names to one name per model.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Metadata keys of a split set, as llama.cpp names them.
pub const KEY_NO: &str = "split.no";
pub const KEY_COUNT: &str = "split.count";
pub const KEY_TENSORS: &str = "split.tensors.count";

/// A file name of the form `<prefix>-NNNNN-of-MMMMM.gguf`, split `no` (one-based) of `count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitName {
    /// Everything before `-NNNNN-of-MMMMM.gguf`, folders included.
    pub prefix: String,
    pub no: u32,
    pub count: u32,
}

impl SplitName {
    /// The split name of `name` (a file name or a path), when it has that form with
    /// `1 ≤ no ≤ count`.
    pub fn parse(name: &str) -> Option<SplitName> {
        let stem = name.strip_suffix(".gguf")?;
        let (rest, count) = stem.rsplit_once("-of-")?;
        let (prefix, no) = rest.rsplit_once('-')?;
        let number = |s: &str| {
            (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u32>().ok())
                .flatten()
        };
        let (no, count) = (number(no)?, number(count)?);
        (!prefix.is_empty() && (1..=count).contains(&no)).then(|| SplitName {
            prefix: prefix.to_string(),
            no,
            count,
        })
    }

    /// The name of split `no` (one-based) of this set.
    pub fn sibling(&self, no: u32) -> String {
        format!("{}-{no:05}-of-{:05}.gguf", self.prefix, self.count)
    }

    /// Every split's name, first to last.
    pub fn all(&self) -> Vec<String> {
        (1..=self.count).map(|no| self.sibling(no)).collect()
    }
}

/// The split name of a path, when its file name has that form.
pub fn of_path(path: &Path) -> Option<SplitName> {
    SplitName::parse(path.to_str()?)
}

/// The paths of every split of the set whose first split is `first`, first to last: `first`
/// alone when its name is not a split name of a set of more than one file.
pub fn set_paths(first: &Path) -> Vec<PathBuf> {
    match of_path(first) {
        Some(s) if s.count > 1 => s.all().into_iter().map(PathBuf::from).collect(),
        _ => vec![first.to_path_buf()],
    }
}

/// `names` with each split set (of more than one file) given once, by its first split's name,
/// sorted: the models a folder or a Hub repository holds. A set with some splits missing is
/// still one model; loading it names the missing file.
pub fn models(names: &[String]) -> Vec<String> {
    let out: BTreeSet<String> = (names.iter())
        .map(|n| match SplitName::parse(n) {
            Some(s) if s.count > 1 => s.sibling(1),
            _ => n.clone(),
        })
        .collect();
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names_are_llama_cpps() {
        let s =
            SplitName::parse("Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00002-of-00003.gguf").expect("split");
        assert_eq!(s.prefix, "Q4_K_M/Qwen3-235B-A22B-Q4_K_M");
        assert_eq!((s.no, s.count), (2, 3));
        assert_eq!(
            s.all(),
            [
                "Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00001-of-00003.gguf",
                "Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00002-of-00003.gguf",
                "Q4_K_M/Qwen3-235B-A22B-Q4_K_M-00003-of-00003.gguf",
            ]
        );
        for not in [
            "model.gguf",
            "m-1-of-3.gguf",
            "m-00004-of-00003.gguf",
            "m-00000-of-00003.gguf",
            "-00001-of-00003.gguf",
            "m-00001-of-00003.bin",
            "m-0000a-of-00003.gguf",
        ] {
            assert_eq!(SplitName::parse(not), None, "{not}");
        }
    }

    #[test]
    fn a_split_set_is_one_model() {
        let names: Vec<String> = [
            "b-00002-of-00002.gguf",
            "a.Q8_0.gguf",
            "b-00001-of-00002.gguf",
            "c-00003-of-00003.gguf",
            "d-00001-of-00001.gguf",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            models(&names),
            [
                "a.Q8_0.gguf",
                "b-00001-of-00002.gguf",
                "c-00001-of-00003.gguf",
                "d-00001-of-00001.gguf"
            ]
        );
        assert_eq!(
            set_paths(Path::new("/m/x-00001-of-00002.gguf")),
            [
                PathBuf::from("/m/x-00001-of-00002.gguf"),
                PathBuf::from("/m/x-00002-of-00002.gguf")
            ]
        );
        assert_eq!(
            set_paths(Path::new("/m/x.gguf")),
            [PathBuf::from("/m/x.gguf")]
        );
    }
}
