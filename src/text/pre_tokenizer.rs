//! Byte-level BPE pre-tokenization as llama.cpp does it: the pre-tokenizer profiles named by
//! GGUF `tokenizer.ggml.pre`, and GPT-2's byte alphabet (each byte written as a printable
//! character in vocabulary strings).
//!
//! A profile is an ordered list of regexes; each splits every piece the previous one left,
//! keeping both the matches and the text between them, and BPE then merges within each piece.
//! We express that with the `tokenizers` crate (`Split` in `Isolated` mode, then `ByteLevel`
//! without its own regex). This module knows nothing of vocabularies or special tokens
//! ([`super::tokenizer`] does).

use std::collections::HashMap;

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::error::{Result, TextError};

/// GPT-2's byte-level regex as llama.cpp applies it (its hand-written splitter also takes a
/// trailing whitespace run, hence the final `\s+`).
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's pre-tokenizer regex (llama.cpp `llama-bpe`).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pre-tokenizer regex (llama.cpp `qwen2`): Llama 3's with single digits.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// o200k's pre-tokenizer regex (llama.cpp `gpt-4o`: gpt-oss, Llama 4) as llama.cpp writes it:
/// the upper/lower-case letter classes of the original (`[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`,
/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`) become "a letter that is not a-z" / "not A-Z", which is
/// what llama.cpp's splitter matches, and `[\r\n/]*` follows punctuation.
const GPT4O_REGEX: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Tekken's pre-tokenizer regex (llama.cpp `tekken`: Mistral Nemo, Mistral Small 3.x,
/// Ministral 3, Magistral, Devstral) as llama.cpp writes it: the letter classes rewritten as
/// o200k's are (so a letter outside ASCII is both upper and lower case, and a combining mark is
/// not a letter but joins the punctuation runs), every digit alone, no contraction rule.
const TEKKEN_REGEX: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The Unicode version of llama.cpp's category tables (`unicode-data.cpp`): its letters and
/// numbers are those of Unicode 15.1, while the `regex` crate's are Unicode 16's.
const LLAMA_CPP_UNICODE: &str = "15.1";

/// Qwen3.5's pre-tokenizer regex (llama.cpp `qwen35`): Qwen2's, with the combining marks
/// (`\p{M}`) joining the letter runs and left out of the punctuation runs.
const QWEN35_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer profile: the regexes llama.cpp applies, in order, before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `smollm`: every digit alone, then the GPT-2 regex.
    Smollm,
    /// `gpt2`: the GPT-2 regex.
    Gpt2,
    /// `default` (or no `tokenizer.ggml.pre`): llama.cpp's default BPE profile.
    Default,
    /// `llama-bpe` (Llama 3): its own regex, and whole words found in the vocab skip merging.
    Llama3,
    /// `qwen2` (Qwen2/2.5, and the distills llama.cpp maps to it).
    Qwen2,
    /// `gpt-4o` (o200k: gpt-oss, and Llama 4 which llama.cpp maps to it).
    Gpt4o,
    /// `qwen35` (Qwen3.5/3.6).
    Qwen35,
    /// `tekken` (Mistral Nemo, Mistral Small 3.x, Ministral 3, Magistral, Devstral).
    Tekken,
    /// `smaug-bpe` (SmolLM3) and `dbrx` (Phi-4): Llama 3's regex, but a piece found whole in
    /// the vocabulary is still merged, and BOS is not added unless the file says so.
    Smaug,
}

impl PreTokenizer {
    /// The profile llama.cpp picks for a `tokenizer.ggml.pre` value.
    pub fn from_name(name: Option<&str>) -> Result<Self> {
        match name {
            None | Some("default") => Ok(PreTokenizer::Default),
            Some("smollm") => Ok(PreTokenizer::Smollm),
            // llama.cpp's names for GPT-2's regex are `gpt-2` and `phi-2`.
            Some("gpt2") | Some("gpt-2") | Some("phi-2") => Ok(PreTokenizer::Gpt2),
            // Pixtral's vocabulary (Mistral Small 3.1 files converted from it): Llama 3's profile
            // in llama.cpp.
            Some("llama-bpe") | Some("llama3") | Some("llama-v3") | Some("pixtral") => {
                Ok(PreTokenizer::Llama3)
            }
            Some("qwen2") | Some("deepseek-r1-qwen") => Ok(PreTokenizer::Qwen2),
            Some("gpt-4o") | Some("llama4") => Ok(PreTokenizer::Gpt4o),
            Some("qwen35") => Ok(PreTokenizer::Qwen35),
            Some("tekken") => Ok(PreTokenizer::Tekken),
            // llama.cpp's `dbrx` (cl100k: DBRX, and Phi-4 as its converter names it) is
            // `smaug-bpe`'s profile under another name.
            Some("smaug-bpe") | Some("dbrx") => Ok(PreTokenizer::Smaug),
            Some(other) => Err(TextError::UnsupportedPreTokenizer(other.to_string())),
        }
    }

    fn regexes(self) -> &'static [&'static str] {
        match self {
            PreTokenizer::Smollm => &[r"\p{N}", GPT2_REGEX],
            PreTokenizer::Gpt2 => &[GPT2_REGEX],
            PreTokenizer::Default => &[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_REGEX,
                r"\p{N}+",
                r"[0-9][0-9][0-9]",
            ],
            PreTokenizer::Llama3 | PreTokenizer::Smaug => &[LLAMA3_REGEX],
            PreTokenizer::Qwen2 => &[QWEN2_REGEX],
            PreTokenizer::Gpt4o => &[GPT4O_REGEX],
            PreTokenizer::Qwen35 => &[QWEN35_REGEX],
            PreTokenizer::Tekken => &[TEKKEN_REGEX],
        }
    }

    /// Whether a piece found whole in the vocabulary is taken as one token without merging.
    pub(crate) fn ignore_merges(self) -> bool {
        matches!(self, PreTokenizer::Llama3 | PreTokenizer::Tekken)
    }

    /// Whether BOS is added when the file does not say (`tokenizer.ggml.add_bos_token`, which
    /// llama.cpp honours when present): llama.cpp's `add_bos = true` for its Llama 3 and tekken
    /// profiles.
    pub(crate) fn adds_bos_by_default(self) -> bool {
        matches!(self, PreTokenizer::Tekken | PreTokenizer::Llama3)
    }

    /// The regex as the `regex` crate must read it to split as llama.cpp does. llama.cpp's
    /// splitters (its hand-written ones for the GPT-2 and Llama 3 regexes, and `std::regex`
    /// over the text with each code point above ASCII replaced by its category, e.g. for
    /// tekken's) read the categories from its own tables, which are Unicode 15.1's; their
    /// whitespace is Unicode's `White_Space`, as the `regex` crate's `\s`. So only a code point
    /// assigned in Unicode 16 (Cyrillic tje U+1C89, the Garay digits) tells them apart: to
    /// llama.cpp it has no category. Limiting every `\p{..}` class to what Unicode 15.1
    /// assigned makes it so here too.
    fn pattern(self, re: &str) -> String {
        static CLASS: std::sync::LazyLock<regex::Regex> =
            std::sync::LazyLock::new(|| regex::Regex::new(r"\\p\{([A-Za-z]+)\}").expect("valid"));
        CLASS
            .replace_all(re, |c: &regex::Captures| {
                format!(r"[\p{{{}}}&&\p{{Age={LLAMA_CPP_UNICODE}}}]", &c[1])
            })
            .into_owned()
    }

    pub(crate) fn build(self) -> Result<PreTokenizerWrapper> {
        let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
        for re in self.regexes() {
            let split = Split::new(
                SplitPattern::Regex(self.pattern(re)),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TextError::Tokenizer(format!("bad pre-tokenizer regex {re:?}: {e}")))?;
            steps.push(split.into());
        }
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps).into())
    }
}

/// GPT-2's reversible map from bytes to printable characters, inverted: char → byte.
pub(crate) fn char_to_byte() -> &'static HashMap<char, u8> {
    static MAP: std::sync::OnceLock<HashMap<char, u8>> = std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = HashMap::with_capacity(256);
        let mut extra = 0u32;
        for b in 0u32..=255 {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            let c = if printable {
                b
            } else {
                extra += 1;
                255 + extra
            };
            if let Some(c) = char::from_u32(c) {
                map.insert(c, b as u8);
            }
        }
        map
    })
}

/// The bytes a byte-level token string stands for; a character outside the byte alphabet
/// stands for its own UTF-8.
pub(crate) fn byte_level_bytes(token: &str) -> Vec<u8> {
    let map = char_to_byte();
    let mut out = Vec::with_capacity(token.len());
    for c in token.chars() {
        match map.get(&c) {
            Some(b) => out.push(*b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let map = char_to_byte();
        assert_eq!(map.len(), 256);
        let bytes: std::collections::HashSet<u8> = map.values().copied().collect();
        assert_eq!(bytes.len(), 256);
        assert_eq!(byte_level_bytes("Ġhello"), b" hello");
        assert_eq!(byte_level_bytes("ĊĊ"), b"\n\n");
        assert_eq!(
            byte_level_bytes("é"),
            [0xE9],
            "é is the character of byte 0xE9"
        );
        assert_eq!(
            byte_level_bytes("中"),
            "中".as_bytes(),
            "outside the alphabet"
        );
    }

    #[test]
    fn profiles_by_name() {
        assert_eq!(
            PreTokenizer::from_name(Some("smollm")).unwrap(),
            PreTokenizer::Smollm
        );
        assert_eq!(
            PreTokenizer::from_name(None).unwrap(),
            PreTokenizer::Default
        );
        assert_eq!(
            PreTokenizer::from_name(Some("llama-bpe")).unwrap(),
            PreTokenizer::Llama3
        );
        let err = PreTokenizer::from_name(Some("qwen9")).unwrap_err();
        assert!(err.to_string().contains("`qwen9`"), "{err}");
        assert_eq!(
            PreTokenizer::from_name(Some("tekken")).unwrap(),
            PreTokenizer::Tekken
        );
        for p in [
            PreTokenizer::Smollm,
            PreTokenizer::Gpt2,
            PreTokenizer::Default,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
            PreTokenizer::Gpt4o,
            PreTokenizer::Qwen35,
            PreTokenizer::Tekken,
            PreTokenizer::Smaug,
        ] {
            p.build().unwrap();
        }
    }

    /// The pieces `p` cuts `text` into, as text.
    fn pieces(p: PreTokenizer, text: &str) -> Vec<String> {
        use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer as _};
        let mut s = PreTokenizedString::from(text);
        p.build().unwrap().pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(_, (a, b), _)| text[a..b].to_string())
            .collect()
    }

    /// Tekken's splits as llama-tokenize makes them (`tests/fixtures/tekken`): a letter outside
    /// ASCII is both cases, a combining mark joins punctuation, digits go one by one, and a
    /// letter Unicode 16 added (U+1C89) is no letter, as in llama.cpp's Unicode 15.1 tables.
    #[test]
    fn tekken_splits_as_llama_cpp() {
        let t = PreTokenizer::Tekken;
        assert_eq!(
            pieces(t, "HelloWorld don't"),
            ["Hello", "World", " don", "'t"]
        );
        assert_eq!(
            pieces(t, "ÉA aÉb 123"),
            ["É", "A", " aÉb", " ", "1", "2", "3"]
        );
        assert_eq!(pieces(t, "cafe\u{301}!/\n"), ["cafe", "\u{301}!/\n"]);
        assert_eq!(pieces(t, "a\u{1c89}b"), ["a", "\u{1c89}b"]);
        assert_eq!(
            pieces(t, "\u{10d40}\u{10d41} \u{663}"),
            ["\u{10d40}\u{10d41}", " ", "\u{663}"]
        );
        // The `regex` crate alone (Unicode 16) calls them a letter and a digit.
        assert!(regex::Regex::new(r"^\p{L}\p{N}$")
            .unwrap()
            .is_match("\u{1c89}\u{10d40}"));
    }
}
