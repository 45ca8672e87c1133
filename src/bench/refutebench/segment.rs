//! The word lists the authors' MT driver (`src/test_mt.py`, `get_word_list`) builds from the
//! previous reply to decide which candidate translations the model "already used": a candidate
//! counts as used when it equals one of the reply's tokens (`tgt not in get_word_list(...)`).
//!
//! - Chinese: `jieba.cut(s)`, i.e. Python jieba 0.42.1 with its default dictionary in accurate
//!   mode with the HMM on. Here: the jieba-rs crate's `cut(s, true)` with its embedded copy of
//!   that dictionary. The crate's `dict.txt` lacks one of Python jieba's 349,046 entries
//!   (`B超 3 n`); it is added back, so the dictionaries (and their frequency total) are equal.
//!   The crate keeps alphanumeric runs joined by `.`/`_`/`-` whole where Python splits them;
//!   [`chinese_tokens`] splits them back with Python's rule.
//! - Hebrew: `[t[1] for t in hebrew_tokenizer.tokenize(s)]`, PyPI `hebrew_tokenizer` 2.3.0
//!   under Python 3.8 or later. [`hebrew_tokens`] reimplements it: the same ordered lexicon of
//!   regular expressions (whitespace, line-break runs, repeated characters, BOM, dates, hours,
//!   numbers, URLs, Latin abbreviations, punctuation, Latin words, Hebrew words, "other",
//!   non-English alphanumerics), matched as one alternation where the first rule that matches at
//!   a position wins (fancy-regex: the repeated-character rule needs a back-reference), and
//!   the package's scanning loop, including what it does after the last match: it emits the
//!   next character as an `UNKNOWN` token and then, because it re-slices its string while
//!   indexing with offsets into the old one, further single characters (or empty strings) from
//!   shifted positions. Whitespace, line-break runs, BOMs and repeated-character words are
//!   matched but not emitted, as in the package.
//!
//! Both are checked against the Python tools' own output on a fixed sample
//! (`tests/fixtures/refutebench/`, test `refutebench_lang`).

use std::sync::LazyLock;

use fancy_regex::Regex;
use jieba_rs::Jieba;

static JIEBA: LazyLock<Jieba> = LazyLock::new(|| {
    let mut jieba = Jieba::new();
    // The one entry of Python jieba 0.42.1's dict.txt that the crate's copy lacks.
    jieba.add_word("B超", Some(3), Some("n"));
    jieba
});

/// Python jieba's `finalseg` skip rule: `[a-zA-Z0-9]+(?:\.\d+)?%?`.
static JIEBA_SKIP: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"[a-zA-Z0-9]+(?:\.[0-9]+)?%?").expect("valid jieba skip pattern")
});

/// `list(jieba.cut(text))`: Python jieba's accurate mode with the HMM, default dictionary.
///
/// jieba-rs 0.11 keeps an alphanumeric run joined by `.`, `_` or `-` whole (`name_ai`,
/// `2023-2024`, `Next.js`); Python jieba sends such a non-dictionary run through `finalseg`,
/// which splits it by its skip rule into `name`, `_`, `ai`. Such tokens are split here the same
/// way (dictionary words are left whole, as Python's route keeps them).
pub fn chinese_tokens(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for token in JIEBA.cut(text, true) {
        let w = token.word;
        let joined = w.contains(['.', '_', '-'])
            && w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'%'));
        if !joined || JIEBA.has_word(w) {
            out.push(w);
            continue;
        }
        let mut at = 0;
        for m in JIEBA_SKIP.find_iter(w) {
            if m.start() > at {
                out.push(&w[at..m.start()]);
            }
            out.push(m.as_str());
            at = m.end();
        }
        if at < w.len() {
            out.push(&w[at..]);
        }
    }
    out
}

// Python's `\s` on str matches what str.isspace() accepts: Unicode White_Space plus the
// information separators U+001C..U+001F.
const WS: &str = r"[\s\x{1C}-\x{1F}]";
const NON_WS: &str = r"[^\s\x{1C}-\x{1F}]";
const HEB: &str = r"[\x{05D0}-\x{05EA}|\x{0591}-\x{05BD}\x{05BF}-\x{05C4}]";
const LATIN: &str = r"[a-zA-Z\x{C0}-\x{FF}]";
const LATIN_NUM: &str = r"[a-zA-Z0-9\x{C0}-\x{FF}]";
const NON_ENG: &str = r"[\x{80}-\x{AD}|\x{B5}-\x{B8}\x{BD}-\x{BE}\x{C6}-\x{C7}\x{D0}-\x{D8}\x{DD}-\x{DE}\x{E0}-\x{EE}\x{F1}-\x{FC}\x{C0}-\x{4FF}]";

/// Which rule of the lexicon matched, in the package's order (the order decides ties).
const RULES: &[(&str, bool)] = &[
    // (group name, emitted)
    ("WHITESPACE", false),
    ("LINEBREAK", false),
    ("REPEATED", false),
    ("BOM", false),
    ("DATE_1", true),
    ("DATE_2", true),
    ("HOUR", true),
    ("NUMBER", true),
    ("URL", true),
    ("ENGLISH_1", true),
    ("PUNCTUATION", true),
    ("ENGLISH_2", true),
    ("HEBREW_2", true),
    ("OTHER", true),
    ("ALPHANUMERIC_NON_ENG", true),
];

static SCANNER: LazyLock<Regex> = LazyLock::new(|| {
    let rules = [
        format!("{WS}+"),
        // Runs of three or more of * _ . \ ! + > < # ^ ~ =, or "-" then a newline.
        r"\*{3,}|_{3,}|\.{3,}|\\{3,}|!{3,}|\+{3,}|>{3,}|<{3,}|#{3,}|\^{3,}|~{3,}|={3,}|-\n"
            .to_string(),
        // A non-space run holding one character four times in a row (the package's `\4` is this
        // inner group; fancy-regex wants it named).
        format!(r"{NON_WS}*(?P<rep>{NON_WS})\k<rep>{{3,}}{NON_WS}*"),
        r"\x{EF}\x{BB}\x{BF}|\x{FEFF}|\x{200E}".to_string(),
        r"[0-9]{1,3}-[0-9]{1,3}-(?:[1-2][0-9])?[0-9][0-9]".to_string(),
        r"(?:[0-9]{1,3}-)?[0-9]{1,3}[./][0-9]{1,3}[./](?:[1-2][0-9])?[0-9][0-9]".to_string(),
        r"[0-2]?[0-9]:[0-5][0-9]".to_string(),
        r"[+\-]?(?:[0-9]+[0-9/\-]*\.?[0-9]+|[0-9]+)%?".to_string(),
        format!(r"[a-z]+://{NON_WS}+"),
        r"[a-zA-Z]\.[a-zA-Z](?:\.[a-zA-Z])?".to_string(),
        r##"[,;:\-&!?.\]/)'`"*+=_~}\[({\\<>#%\x{05BE} \x{05BF}]"##.to_string(),
        format!(r#"{LATIN}+'?"*{LATIN_NUM}+|{LATIN}{LATIN_NUM}*"#),
        format!(r#"{HEB}+'?"*{HEB}+|{HEB}"#),
        r"\x{A0}|\x{E2}?\x{80}\x{A2}?[\[\^\x{05F3}\x{D7}a-zA-Z0-9!?.,:;\-()\[\]{}]+".to_string(),
        format!(r#"{NON_ENG}+'?"*{NON_ENG}[0-9]*|{NON_ENG}[0-9]{NON_ENG}+[0-9]*"#),
    ];
    assert_eq!(rules.len(), RULES.len());
    let pattern = RULES
        .iter()
        .zip(&rules)
        .map(|((name, _), re)| format!("(?P<{name}>{re})"))
        .collect::<Vec<_>>()
        .join("|");
    Regex::new(&pattern).expect("valid Hebrew tokenizer pattern")
});

/// Python's `s[a:b]` on a string of characters (bounds clamped, empty when `a >= b`).
fn py_slice(s: &[char], a: usize, b: usize) -> String {
    let b = b.min(s.len());
    if a >= b {
        String::new()
    } else {
        s[a..b].iter().collect()
    }
}

/// `[t[1] for t in hebrew_tokenizer.tokenize(text)]` (hebrew_tokenizer 2.3.0, Python ≥ 3.8),
/// reimplemented as described in the module doc.
pub fn hebrew_tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut string: Vec<char> = text.chars().collect();
    let string_len = string.len();
    let (mut global_idx, mut start_idx, mut end_idx) = (0usize, 0usize, 0usize);
    while start_idx < string_len {
        let mut add_global = false;
        string = string
            .get(start_idx..)
            .map(<[char]>::to_vec)
            .unwrap_or_default();
        let current: String = string.iter().collect();
        // Byte offset -> character offset in `current`.
        let char_at = |byte: usize| current[..byte].chars().count();
        for caps in SCANNER.captures_iter(&current) {
            let caps = caps.expect("Hebrew tokenizer pattern does not exhaust its backtracking");
            let whole = caps.get(0).expect("group 0 is the match");
            start_idx = char_at(whole.start());
            end_idx = char_at(whole.end());
            let emitted = RULES
                .iter()
                .find(|(name, _)| caps.name(name).is_some())
                .is_some_and(|(_, emitted)| *emitted);
            if emitted {
                let from = if add_global {
                    start_idx + global_idx
                } else {
                    start_idx
                };
                out.push(py_slice(&string, from, end_idx + global_idx));
            }
            start_idx = end_idx;
            add_global = true;
        }
        if end_idx < global_idx {
            start_idx += global_idx;
        }
        if start_idx >= string_len {
            break;
        }
        end_idx = start_idx + 1;
        out.push(py_slice(&string, start_idx, end_idx));
        start_idx = end_idx;
        global_idx = start_idx;
    }
    out
}

/// The authors' `get_word_list(reply, tgt_lang)` for the MT target languages; `None` for a
/// language they have no tokenizer for.
pub fn target_words(text: &str, lang: &str) -> Option<Vec<String>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    match lang {
        "zh" => Some(
            chinese_tokens(text)
                .into_iter()
                .map(str::to_string)
                .collect(),
        ),
        "he" => Some(hebrew_tokens(text)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jieba_cuts_as_python_jieba() {
        assert_eq!(
            chinese_tokens("我来到北京清华大学"),
            ["我", "来到", "北京", "清华大学"]
        );
        assert_eq!(chinese_tokens("做B超 检查"), ["做", "B超", " ", "检查"]);
    }

    #[test]
    fn hebrew_tokens_follow_the_package() {
        assert_eq!(hebrew_tokens("מָתֵמָטִיקָה זה קשה"), ["מָתֵמָטִיקָה", "זה", "קשה"]);
        assert_eq!(hebrew_tokens("שלום, עולם!"), ["שלום", ",", "עולם", "!"]);
        // Repeated characters and line-break runs are matched but dropped.
        assert_eq!(hebrew_tokens("כןןןן ok ... ***"), ["ok"]);
        // After the last match: the next character, then shifted single characters.
        assert_eq!(hebrew_tokens("שלום 中文"), ["שלום", "中", ""]);
        assert_eq!(
            hebrew_tokens("שלום 中文字 ab 中文字符串结束"),
            ["שלום", "ab", "中", "", "", "", "", "", ""]
        );
        assert!(hebrew_tokens("").is_empty());
    }
}
