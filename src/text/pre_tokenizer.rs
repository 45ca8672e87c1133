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

/// DeepSeek-V3's pre-tokenizer (llama.cpp `deepseek-v3`), first regex: runs of up to three
/// digits.
const DEEPSEEK3_DIGITS: &str = r"\p{N}{1,3}";

/// DeepSeek-V3's second regex: runs of CJK ideographs (U+4E00-U+9FA5 only), hiragana and
/// katakana (with `・` and `ー`). llama.cpp matches it with `std::wregex` on the code points.
const DEEPSEEK3_CJK: &str = r"[一-龥぀-ゟ゠-ヿ]+";

/// DeepSeek-V3's third regex: an ASCII punctuation mark joins the ASCII letters after it; a
/// letter run (combining marks included) takes one character before it that is no letter,
/// punctuation or symbol; runs of punctuation and symbols (`\p{P}`, `\p{S}`: unlike Llama 3's
/// `[^\s\p{L}\p{N}]`, no combining mark, control or unassigned character joins them) take a
/// space before them and newlines after.
/// llama.cpp runs it through `std::regex` over its category-collapsed text, so `\p{P}`,
/// `\p{S}`, `\p{M}` are its Unicode 15.1 categories, as [`PreTokenizer::pattern`] makes them.
const DEEPSEEK3_REGEX: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// DeepSeek-LLM's pre-tokenizer (llama.cpp `deepseek-llm`: DeepSeek-V2, V2-Lite, the 7B/67B
/// LLMs), six regexes with literal character classes, which llama.cpp matches with
/// `std::wregex` after replacing every whitespace character above ASCII by a vertical tab: so
/// `\s` is Unicode's `White_Space` (as here), and a class never matches such a character even
/// where its range spans one (`　` U+3000 in the punctuation class, U+1680, U+2000-U+200A,
/// U+2028, U+2029, U+202F, U+205F and U+3000 in `ࠀ-一`): `&&\S` says so here. First, every
/// newline alone.
const DEEPSEEK_LLM_NEWLINE: &str = r"[\r\n]";

/// DeepSeek-LLM's letters: Latin, Greek, Cyrillic, Armenian, Georgian, Cherokee, Glagolitic,
/// Coptic, fullwidth Latin, Deseret, Osage, Old Hungarian, Warang Citi and Adlam letters (not
/// all of `\p{L}`: no `ƻ`, `ʔ`, modifier letters, Hebrew, Arabic, Indic, CJK), with one
/// whitespace character before them.
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";

/// DeepSeek-LLM's punctuation: ASCII, fullwidth, quotation marks (U+2018-U+201F) and `、。`.
const DEEPSEEK_LLM_PUNCT: &str = r"\s?[[!-/:-~！-／：-～‘-‟\x{3000}-。]&&\S]+";

/// DeepSeek-LLM's whitespace at the end of a piece (`$` is the end of the piece here as in
/// `std::regex`).
const DEEPSEEK_LLM_TRAILING_SPACE: &str = r"\s+$";

/// DeepSeek-LLM's CJK ideographs (U+4E00-U+9FA5), everything from U+0800 to U+4E00 (kana,
/// Indic scripts and their digits, Thai, general punctuation, arrows, BMP emoji…) and Hangul
/// (U+AC00-U+D7FF), in one run.
const DEEPSEEK_LLM_CJK: &str = r"[[一-龥ࠀ-一가-\x{D7FF}]&&\S]+";

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
    /// `deepseek-v3` (llama.cpp's `DEEPSEEK3_LLM`: DeepSeek-V3, V3.1, R1): digits in
    /// threes, then CJK and kana runs, then letter, punctuation and whitespace runs; merges
    /// always applied, BOS only where the file says so.
    DeepseekV3,
    /// `deepseek-llm` (llama.cpp's `DEEPSEEK_LLM`: DeepSeek-V2, V2-Lite, DeepSeek LLM 7B/67B):
    /// newlines alone, then letter runs of a fixed list of scripts, punctuation runs, trailing
    /// whitespace, CJK and everything else from U+0800 to U+4E00, digit runs of any length;
    /// merges always applied, BOS only where the file says so.
    DeepseekLlm,
    /// `glm4` and `glm5` (llama.cpp's `CHATGLM4` with `ignore_merges`: GLM-4.5, 4.6, 4.7,
    /// 4.7-Flash and their successors): Llama 3's regex, a piece found whole in the vocabulary is one token,
    /// and no BOS unless the file says so (llama.cpp drops the `gpt2` default BOS id 11 for
    /// them; GLM files name `[gMASK]` as BOS, which their templates write themselves).
    Glm4,
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
            Some("deepseek-v3") => Ok(PreTokenizer::DeepseekV3),
            Some("deepseek-llm") => Ok(PreTokenizer::DeepseekLlm),
            Some("glm4") | Some("glm5") => Ok(PreTokenizer::Glm4),
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
            PreTokenizer::Llama3 | PreTokenizer::Smaug | PreTokenizer::Glm4 => &[LLAMA3_REGEX],
            PreTokenizer::Qwen2 => &[QWEN2_REGEX],
            PreTokenizer::Gpt4o => &[GPT4O_REGEX],
            PreTokenizer::Qwen35 => &[QWEN35_REGEX],
            PreTokenizer::Tekken => &[TEKKEN_REGEX],
            PreTokenizer::DeepseekV3 => &[DEEPSEEK3_DIGITS, DEEPSEEK3_CJK, DEEPSEEK3_REGEX],
            PreTokenizer::DeepseekLlm => &[
                DEEPSEEK_LLM_NEWLINE,
                DEEPSEEK_LLM_LETTERS,
                DEEPSEEK_LLM_PUNCT,
                DEEPSEEK_LLM_TRAILING_SPACE,
                DEEPSEEK_LLM_CJK,
                r"\p{N}+",
            ],
        }
    }

    /// Whether a piece found whole in the vocabulary is taken as one token without merging.
    pub(crate) fn ignore_merges(self) -> bool {
        matches!(
            self,
            PreTokenizer::Llama3 | PreTokenizer::Tekken | PreTokenizer::Glm4
        )
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
        for (name, p) in [
            ("deepseek-v3", PreTokenizer::DeepseekV3),
            ("deepseek-llm", PreTokenizer::DeepseekLlm),
            ("glm4", PreTokenizer::Glm4),
            ("glm5", PreTokenizer::Glm4),
        ] {
            assert_eq!(PreTokenizer::from_name(Some(name)).unwrap(), p, "{name}");
        }
        // Only Llama 3's profile and tekken add BOS when the file is silent; GLM's is Llama 3's
        // split without it.
        assert!(!PreTokenizer::Glm4.adds_bos_by_default());
        assert!(PreTokenizer::Glm4.ignore_merges());
        assert!(!PreTokenizer::DeepseekV3.ignore_merges());
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
            PreTokenizer::DeepseekV3,
            PreTokenizer::DeepseekLlm,
            PreTokenizer::Glm4,
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
