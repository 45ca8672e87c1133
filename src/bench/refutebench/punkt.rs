//! Sentence counting as the authors' email checker does it: `instruction_util.count_sentences`
//! is `len(nltk.data.load("nltk:tokenizers/punkt/english.pickle").tokenize(text))`, NLTK's
//! Punkt sentence tokenizer (Kiss & Strunk 2006) with its pretrained English parameters.
//!
//! This is a port of the tokenizing half of NLTK 3.8.1's `nltk/tokenize/punkt.py`
//! (`PunktSentenceTokenizer.span_tokenize` with boundary realignment, the default
//! `PunktLanguageVars`, `PunktToken`, both annotation passes and the orthographic heuristic);
//! training is not ported. The parameters are NLTK's English ones, kept in NLTK's `punkt_tab`
//! layout in `data/punkt/english/` (156 abbreviations, 37 collocations, 39 sentence starters,
//! 20,366 orthographic contexts) and compiled in. Where they come from, and the check against
//! NLTK's own output, are in `tests/fixtures/refutebench/make_labels.py`.
//!
//! Character classes follow Python's `re` on `str` where it matters for English text: `\s` is
//! Unicode white space plus U+001C..U+001F, `[^\W\d]` is a word character that is not a
//! decimal digit.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use fancy_regex::Regex;

const ORTHO_BEG_UC: u32 = 1 << 1;
const ORTHO_MID_UC: u32 = 1 << 2;
const ORTHO_UNK_UC: u32 = 1 << 3;
const ORTHO_BEG_LC: u32 = 1 << 4;
const ORTHO_MID_LC: u32 = 1 << 5;
const ORTHO_UNK_LC: u32 = 1 << 6;
const ORTHO_UC: u32 = ORTHO_BEG_UC | ORTHO_MID_UC | ORTHO_UNK_UC;
const ORTHO_LC: u32 = ORTHO_BEG_LC | ORTHO_MID_LC | ORTHO_UNK_LC;

/// NLTK's `PunktParameters` for English.
struct Params {
    abbrev_types: HashSet<&'static str>,
    collocations: HashSet<(&'static str, &'static str)>,
    sent_starters: HashSet<&'static str>,
    ortho_context: HashMap<&'static str, u32>,
}

fn lines(text: &'static str) -> impl Iterator<Item = &'static str> {
    // Entries may end in a space (the abbreviation ". . "): only the newline is removed.
    text.split('\n').filter(|l| !l.is_empty())
}

static ENGLISH: LazyLock<Params> = LazyLock::new(|| {
    let dir_abbrev = include_str!("../../../data/punkt/english/abbrev_types.txt");
    let dir_colloc = include_str!("../../../data/punkt/english/collocations.tab");
    let dir_starters = include_str!("../../../data/punkt/english/sent_starters.txt");
    let dir_ortho = include_str!("../../../data/punkt/english/ortho_context.tab");
    Params {
        abbrev_types: lines(dir_abbrev).collect(),
        collocations: lines(dir_colloc)
            .map(|l| l.split_once('\t').expect("collocations.tab: two columns"))
            .collect(),
        sent_starters: lines(dir_starters).collect(),
        ortho_context: lines(dir_ortho)
            .map(|l| {
                let (w, n) = l.rsplit_once('\t').expect("ortho_context.tab: two columns");
                (w, n.parse().expect("ortho_context.tab: integer flags"))
            })
            .collect(),
    }
});

const S: &str = r"[\s\x{1C}-\x{1F}]";
const NS: &str = r"[^\s\x{1C}-\x{1F}]";
const NON_WORD: &str = r#"(?:[)";}\]*:@'({\[!?])"#;
const MULTI_CHAR: &str = r"(?:-{2,}|\.{2,}|(?:\.[\s\x{1C}-\x{1F}]){2,}\.)";
const WORD_START: &str = r#"[^("`{\[:;&#*@)}\]\-,]"#;

static WORD_TOKENIZER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"{MULTI_CHAR}|(?={WORD_START}){NS}+?(?={S}|$|{NON_WORD}|{MULTI_CHAR}|,(?=$|{S}|{NON_WORD}|{MULTI_CHAR}))|{NS}"
    ))
    .expect("valid punkt word pattern")
});

static PERIOD_CONTEXT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"[.?!](?=(?P<after_tok>{NON_WORD}|{S}+(?P<next_tok>{NS}+)))"
    ))
    .expect("valid punkt period-context pattern")
});

static BOUNDARY_REALIGNMENT: LazyLock<Regex> = LazyLock::new(|| {
    // Used as Python's `re.match`: only a match starting at 0 counts (see `sentence_spans`).
    Regex::new(&format!(r#"(?m)["')\]}}]+?(?:{S}+|(?=--)|$)"#))
        .expect("valid punkt realignment pattern")
});

static NUMERIC: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^-?[.,]?\d[\d,.\-]*\.?$").expect("valid punkt numeric pattern"));

fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1C}'..='\u{1F}').contains(&c)
}

/// Python's `[^\W\d]`: a word character that is not a decimal digit.
fn is_alpha_like(c: char) -> bool {
    (c.is_alphanumeric() || c == '_') && !c.is_numeric()
}

/// NLTK's `PunktToken`, with the properties the tokenizer reads.
struct Token<'a> {
    tok: &'a str,
    ty: String,
    period_final: bool,
    sentbreak: bool,
    abbr: bool,
    ellipsis: bool,
}

impl<'a> Token<'a> {
    fn new(tok: &'a str) -> Self {
        let lower = tok.to_lowercase();
        let ty = if NUMERIC.is_match(&lower).unwrap_or(false) {
            "##number##".to_string()
        } else {
            lower
        };
        Token {
            tok,
            ty,
            period_final: tok.ends_with('.'),
            sentbreak: false,
            abbr: false,
            ellipsis: false,
        }
    }
    fn type_no_period(&self) -> &str {
        if self.ty.chars().count() > 1 && self.ty.ends_with('.') {
            &self.ty[..self.ty.len() - 1]
        } else {
            &self.ty
        }
    }
    fn type_no_sentperiod(&self) -> &str {
        if self.sentbreak {
            self.type_no_period()
        } else {
            &self.ty
        }
    }
    fn first_upper(&self) -> bool {
        self.tok.chars().next().is_some_and(char::is_uppercase)
    }
    fn first_lower(&self) -> bool {
        self.tok.chars().next().is_some_and(char::is_lowercase)
    }
    /// `\.\.+$` from the start.
    fn is_ellipsis(&self) -> bool {
        self.tok.len() >= 2 && self.tok.chars().all(|c| c == '.')
    }
    /// `[^\W\d]\.$` from the start.
    fn is_initial(&self) -> bool {
        let mut cs = self.tok.chars();
        matches!((cs.next(), cs.next(), cs.next()), (Some(c), Some('.'), None) if is_alpha_like(c))
    }
}

/// `PunktBaseClass._tokenize_words`: word tokens line by line (the paragraph and line-start
/// flags it also sets are read by training only).
fn tokenize_words(text: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    for line in text.split('\n') {
        if line.chars().all(is_python_space) {
            continue;
        }
        for m in WORD_TOKENIZER.find_iter(line) {
            out.push(Token::new(m.expect("punkt word pattern runs").as_str()));
        }
    }
    out
}

fn first_pass(tok: &mut Token<'_>, params: &Params) {
    let t = tok.tok;
    if t == "." || t == "?" || t == "!" {
        tok.sentbreak = true;
    } else if tok.is_ellipsis() {
        tok.ellipsis = true;
    } else if tok.period_final && !t.ends_with("..") {
        let stem = t[..t.len() - 1].to_lowercase();
        let last = stem.rsplit('-').next().unwrap_or("");
        if params.abbrev_types.contains(stem.as_str()) || params.abbrev_types.contains(last) {
            tok.abbr = true;
        } else {
            tok.sentbreak = true;
        }
    }
}

/// `_ortho_heuristic`: `Some(true)` / `Some(false)` / `None` for "unknown".
fn ortho_heuristic(tok: &Token<'_>, params: &Params) -> Option<bool> {
    if matches!(tok.tok, ";" | ":" | "," | "." | "!" | "?") {
        return Some(false);
    }
    let ctx = params
        .ortho_context
        .get(tok.type_no_sentperiod())
        .copied()
        .unwrap_or(0);
    if tok.first_upper() && ctx & ORTHO_LC != 0 && ctx & ORTHO_MID_UC == 0 {
        return Some(true);
    }
    if tok.first_lower() && (ctx & ORTHO_UC != 0 || ctx & ORTHO_BEG_LC == 0) {
        return Some(false);
    }
    None
}

/// `_second_pass_annotation` of `tok1` given the next token.
fn second_pass(tok1: &mut Token<'_>, tok2: &Token<'_>, params: &Params) {
    if !tok1.period_final {
        return;
    }
    let typ = tok1.type_no_period().to_string();
    let next_typ = tok2.type_no_sentperiod();
    let is_initial = tok1.is_initial();
    if params.collocations.contains(&(typ.as_str(), next_typ)) {
        tok1.sentbreak = false;
        tok1.abbr = true;
        return;
    }
    if (tok1.abbr || tok1.ellipsis) && !is_initial {
        if ortho_heuristic(tok2, params) == Some(true) {
            tok1.sentbreak = true;
            return;
        }
        if tok2.first_upper() && params.sent_starters.contains(next_typ) {
            tok1.sentbreak = true;
            return;
        }
    }
    if is_initial || typ == "##number##" {
        let starter = ortho_heuristic(tok2, params);
        if starter == Some(false) {
            tok1.sentbreak = false;
            tok1.abbr = true;
            return;
        }
        if starter.is_none()
            && is_initial
            && tok2.first_upper()
            && params.ortho_context.get(next_typ).copied().unwrap_or(0) & ORTHO_LC == 0
        {
            tok1.sentbreak = false;
            tok1.abbr = true;
        }
    }
}

/// `text_contains_sentbreak`: some token other than the last is a sentence break after both
/// annotation passes.
fn text_contains_sentbreak(text: &str, params: &Params) -> bool {
    let mut toks = tokenize_words(text);
    for t in toks.iter_mut() {
        first_pass(t, params);
    }
    for i in 0..toks.len() {
        if i + 1 < toks.len() {
            let (a, b) = toks.split_at_mut(i + 1);
            second_pass(&mut a[i], &b[0], params);
            if a[i].sentbreak {
                return true;
            }
        }
    }
    false
}

/// `_get_last_whitespace_index` (ASCII `string.whitespace`; 0 when none, or at 0).
fn last_whitespace_index(text: &str) -> usize {
    text.char_indices()
        .rev()
        .find(|(_, c)| " \t\n\r\x0b\x0c".contains(*c))
        .map_or(0, |(i, _)| i)
}

struct EndContext {
    end: usize,
    next_tok_start: Option<usize>,
    context: String,
}

/// `_match_potential_end_contexts`.
fn potential_end_contexts(text: &str) -> Vec<EndContext> {
    let mut out = Vec::new();
    let mut previous: Option<(usize, usize, Option<usize>, String)> = None; // (start,end,next,matched+after)
    let (mut prev_slice_start, mut prev_slice_stop) = (0usize, 0usize);
    for caps in PERIOD_CONTEXT.captures_iter(text) {
        let caps = caps.expect("punkt period pattern runs");
        let m = caps.get(0).expect("group 0");
        let before = &text[prev_slice_stop.min(m.start())..m.start()];
        let mut after_space = last_whitespace_index(before);
        if after_space != 0 {
            after_space += prev_slice_stop + 1;
        } else {
            after_space = prev_slice_start;
        }
        let (word_start, word_stop) = (after_space, m.start());
        if let Some((_, end, next, tail)) = previous.take() {
            if prev_slice_stop <= word_start {
                out.push(EndContext {
                    end,
                    next_tok_start: next,
                    context: format!(
                        "{}{}",
                        py_slice(text, prev_slice_start, prev_slice_stop),
                        tail
                    ),
                });
            }
        }
        let after = caps.name("after_tok").map_or("", |g| g.as_str());
        previous = Some((
            m.start(),
            m.end(),
            caps.name("next_tok").map(|g| g.start()),
            format!("{}{}", m.as_str(), after),
        ));
        prev_slice_start = word_start;
        prev_slice_stop = word_stop;
    }
    if let Some((_, end, next, tail)) = previous {
        out.push(EndContext {
            end,
            next_tok_start: next,
            context: format!(
                "{}{}",
                py_slice(text, prev_slice_start, prev_slice_stop),
                tail
            ),
        });
    }
    out
}

/// Python's `text[a:b]` on byte offsets that fall on character boundaries.
fn py_slice(text: &str, a: usize, b: usize) -> &str {
    let b = b.min(text.len());
    if a >= b {
        ""
    } else {
        &text[a..b]
    }
}

/// `PunktSentenceTokenizer.span_tokenize(text)` (boundaries realigned), as byte ranges.
pub fn sentence_spans(text: &str) -> Vec<(usize, usize)> {
    let params = &*ENGLISH;
    // _slices_from_text
    let mut slices = Vec::new();
    let mut last_break = 0;
    for ctx in potential_end_contexts(text) {
        if text_contains_sentbreak(&ctx.context, params) {
            slices.push((last_break, ctx.end));
            last_break = ctx.next_tok_start.unwrap_or(ctx.end);
        }
    }
    slices.push((last_break, text.trim_end_matches(is_python_space).len()));
    // _realign_boundaries
    let mut out = Vec::new();
    let mut realign = 0;
    for (i, &(s1_start, s1_stop)) in slices.iter().enumerate() {
        let s1_start = s1_start + realign;
        let Some(&(s2_start, s2_stop)) = slices.get(i + 1) else {
            if !py_slice(text, s1_start, s1_stop).is_empty() {
                out.push((s1_start, s1_stop));
            }
            continue;
        };
        let s2 = py_slice(text, s2_start, s2_stop);
        let at_start = BOUNDARY_REALIGNMENT
            .find(s2)
            .expect("punkt realignment pattern runs")
            .filter(|m| m.start() == 0);
        match at_start {
            Some(m) => {
                let kept = m.as_str().trim_end_matches(is_python_space).len();
                out.push((s1_start, s2_start + kept));
                realign = m.end();
            }
            None => {
                realign = 0;
                if !py_slice(text, s1_start, s1_stop).is_empty() {
                    out.push((s1_start, s1_stop));
                }
            }
        }
    }
    out
}

/// `instruction_util.count_sentences`: the number of Punkt sentences.
pub fn count_sentences(text: &str) -> usize {
    sentence_spans(text).len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_load() {
        let p = &*ENGLISH;
        assert_eq!(p.abbrev_types.len(), 156);
        assert!(p.abbrev_types.contains(". . "));
        assert_eq!(p.collocations.len(), 37);
        assert_eq!(p.sent_starters.len(), 39);
        assert_eq!(p.ortho_context.len(), 20366);
    }

    #[test]
    fn counts_like_nltk() {
        let cases: &[(&str, usize)] = &[
            ("Hello world. How are you? Fine!", 3),
            ("Mr. Smith went to Washington. He arrived.", 2),
            ("Very bad acting!!! I promise.", 2),
            ("(Sent1.) Sent2.", 2),
            (
                "The U.S. economy grew 3.5 percent in Jan. It slowed later.",
                2,
            ),
            ("No punctuation at all", 1),
            ("", 0),
            ("   ", 0),
        ];
        for (text, n) in cases {
            assert_eq!(
                count_sentences(text),
                *n,
                "{text:?} -> {:?}",
                sentence_spans(text)
            );
        }
    }
}
