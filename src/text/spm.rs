//! SentencePiece-style tokenization as llama.cpp does it for GGUF `tokenizer.ggml.model =
//! "llama"` vocabularies (Llama 2, Mistral, Gemma, Phi-3): spaces become `▁`, a space is
//! prefixed at the start and after each special token, the text is split into UTF-8
//! characters, adjacent symbols are merged highest vocabulary score first (ties: leftmost),
//! and symbols that are not tokens are re-split along their merge history down to bytes,
//! which become `<0xXX>` byte tokens (byte fallback).
//!
//! This follows llama.cpp's `llm_tokenizer_spm_session` and `tokenizer_st_partition` step by
//! step (including which merge a text maps back to), so ids are identical. This module knows
//! only a vocabulary; the GGUF reading and BOS/EOS handling live in [`super::tokenizer`].

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A SentencePiece vocabulary with llama.cpp's tokenization.
#[derive(Debug, Clone)]
pub struct Spm {
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// Special tokens (control, user-defined, unknown) matched in text before tokenizing,
    /// longest first; with whether whitespace after them is stripped.
    specials: Vec<(String, u32, bool)>,
    byte_ids: [Option<u32>; 256],
    unk: Option<u32>,
    add_space_prefix: bool,
}

/// One entry of the vocabulary: text, score, whether it is special (matched in raw text)
/// and whether whitespace after it is stripped when it is.
pub struct SpmToken<'a> {
    pub text: &'a str,
    pub score: f32,
    pub special: bool,
    pub rstrip: bool,
}

struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(PartialEq)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// Highest score first; equal scores: lowest left index first (llama.cpp's comparator).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Spm {
    /// Builds the tokenizer from the vocabulary in id order.
    pub fn new<'a>(
        tokens: impl IntoIterator<Item = SpmToken<'a>>,
        unk: Option<u32>,
        add_space_prefix: bool,
    ) -> Spm {
        let mut ids = HashMap::new();
        let mut scores = Vec::new();
        let mut specials = Vec::new();
        for (i, t) in tokens.into_iter().enumerate() {
            let id = i as u32;
            // Duplicate strings keep their first id.
            ids.entry(t.text.to_string()).or_insert(id);
            scores.push(t.score);
            if t.special && !t.text.is_empty() {
                specials.push((t.text.to_string(), id, t.rstrip));
            }
        }
        // Longest first (llama.cpp sorts its special-token cache by length).
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids.get(&format!("<0x{b:02X}>")).copied().or_else(|| {
                (b < 128)
                    .then(|| ids.get(&(b as u8 as char).to_string()).copied())
                    .flatten()
            });
        }
        Spm {
            ids,
            scores,
            specials,
            byte_ids,
            unk,
            add_space_prefix,
        }
    }

    /// The id of a vocabulary string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Tokenizes `text`; special tokens in it are recognised when `parse_special`.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let specials: &[(String, u32, bool)] = if parse_special { &self.specials } else { &[] };
        let frags = partition(text, specials);
        let mut output = Vec::new();
        let mut prev_special = true;
        for f in frags {
            match f {
                Frag::Text(s, e) => {
                    let mut t = String::with_capacity(e - s + 3);
                    if self.add_space_prefix && prev_special {
                        t.push(' ');
                    }
                    t.push_str(&text[s..e]);
                    let escaped = t.replace(' ', "\u{2581}");
                    self.encode_piece(&escaped, &mut output);
                    prev_special = false;
                }
                Frag::Token(id) => {
                    output.push(id);
                    prev_special = true;
                }
            }
        }
        output
    }

    /// llama.cpp's `llm_tokenizer_spm_session::tokenize` on already escaped text.
    fn encode_piece(&self, text: &str, output: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (start, ch)) in text.char_indices().enumerate() {
            let len = ch.len_utf8();
            symbols.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next: (start + len < text.len()).then_some(i + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        let mut rev_merge: HashMap<&str, (usize, usize)> = HashMap::new();
        for i in 1..symbols.len() {
            self.try_add(
                text,
                &symbols,
                &mut queue,
                &mut rev_merge,
                Some(i - 1),
                Some(i),
            );
        }
        while let Some(b) = queue.pop() {
            let (ln, rn) = (symbols[b.left].len, symbols[b.right].len);
            if ln == 0 || rn == 0 || ln + rn != b.size {
                continue;
            }
            symbols[b.left].len += rn;
            symbols[b.right].len = 0;
            let next = symbols[b.right].next;
            symbols[b.left].next = next;
            if let Some(n) = next {
                symbols[n].prev = Some(b.left);
            }
            let prev = symbols[b.left].prev;
            self.try_add(
                text,
                &symbols,
                &mut queue,
                &mut rev_merge,
                prev,
                Some(b.left),
            );
            self.try_add(
                text,
                &symbols,
                &mut queue,
                &mut rev_merge,
                Some(b.left),
                next,
            );
        }
        let mut i = if symbols.is_empty() { None } else { Some(0) };
        while let Some(s) = i {
            let piece = &text[symbols[s].start..symbols[s].start + symbols[s].len];
            self.resegment(text, &symbols, &rev_merge, piece, output);
            i = symbols[s].next;
        }
    }

    /// Queues the merge of `left` and `right` when their concatenation is a token.
    fn try_add<'t>(
        &self,
        text: &'t str,
        symbols: &[Symbol],
        queue: &mut BinaryHeap<Bigram>,
        rev: &mut HashMap<&'t str, (usize, usize)>,
        left: Option<usize>,
        right: Option<usize>,
    ) {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let s = symbols[l].start;
        let piece = &text[s..s + symbols[l].len + symbols[r].len];
        let Some(&id) = self.ids.get(piece) else {
            return;
        };
        queue.push(Bigram {
            left: l,
            right: r,
            score: self.scores[id as usize],
            size: piece.len(),
        });
        rev.insert(piece, (l, r));
    }

    fn resegment(
        &self,
        text: &str,
        symbols: &[Symbol],
        rev_merge: &HashMap<&str, (usize, usize)>,
        piece: &str,
        output: &mut Vec<u32>,
    ) {
        if let Some(&id) = self.ids.get(piece) {
            output.push(id);
            return;
        }
        match rev_merge.get(piece) {
            None => {
                for b in piece.bytes() {
                    if let Some(id) = self.byte_ids[b as usize].or(self.unk) {
                        output.push(id);
                    }
                }
            }
            Some(&(l, r)) => {
                // The halves as they were when merged: left's start up to right's start, and
                // right's start for the rest of the piece.
                let ls = symbols[l].start;
                let rs = symbols[r].start;
                let left = &text[ls..rs];
                let right = &text[rs..ls + piece.len()];
                self.resegment(text, symbols, rev_merge, left, output);
                self.resegment(text, symbols, rev_merge, right, output);
            }
        }
    }
}

/// A fragment of a text split at its special tokens: raw text (a byte range) or a special
/// token's id.
pub(super) enum Frag {
    Text(usize, usize),
    Token(u32),
}

/// `text` split at every occurrence of the special tokens `specials` (text, id, whether
/// whitespace after it is stripped), longest first, as llama.cpp's `tokenizer_st_partition`:
/// each special token in turn splits every text fragment the previous ones left.
pub(super) fn partition(text: &str, specials: &[(String, u32, bool)]) -> Vec<Frag> {
    let mut frags = vec![Frag::Text(0, text.len())];
    for (sp, id, rstrip) in specials {
        let mut out = Vec::with_capacity(frags.len());
        for f in frags {
            let Frag::Text(mut start, end) = f else {
                out.push(f);
                continue;
            };
            while let Some(pos) = text[start..end].find(sp.as_str()) {
                let m = start + pos;
                if m > start {
                    out.push(Frag::Text(start, m));
                }
                out.push(Frag::Token(*id));
                start = m + sp.len();
                if *rstrip {
                    while start < end && text.as_bytes()[start].is_ascii_whitespace() {
                        start += 1;
                    }
                }
            }
            if start < end {
                out.push(Frag::Text(start, end));
            }
        }
        frags = out;
    }
    frags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(entries: &[(&str, f32)]) -> Spm {
        Spm::new(
            entries.iter().map(|&(text, score)| SpmToken {
                text,
                score,
                special: text.starts_with('<') && text.ends_with('>') && !text.starts_with("<0x"),
                rstrip: false,
            }),
            Some(0),
            true,
        )
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let mut entries: Vec<(String, f32)> = vec![
            ("<unk>".into(), 0.0),
            ("<s>".into(), 0.0),
            ("</s>".into(), 0.0),
        ];
        for b in 0..256 {
            entries.push((format!("<0x{b:02X}>"), 0.0));
        }
        for (t, s) in [
            ("\u{2581}", -1.0),
            ("h", -2.0),
            ("e", -2.0),
            ("l", -2.0),
            ("o", -2.0),
            ("he", -3.0),
            ("ll", -1.5),
            ("hell", -4.0),
            ("\u{2581}hell", -5.0),
            ("\u{2581}hello", -6.0),
        ] {
            entries.push((t.into(), s));
        }
        let refs: Vec<(&str, f32)> = entries.iter().map(|(t, s)| (t.as_str(), *s)).collect();
        let spm = vocab(&refs);
        let id = |t: &str| spm.token_id(t).unwrap();
        assert_eq!(spm.encode("hello", false), [id("\u{2581}hello")]);
        // "é" is not in the vocabulary: its two UTF-8 bytes become byte tokens.
        assert_eq!(
            spm.encode("hé", false),
            [id("\u{2581}"), id("h"), id("<0xC3>"), id("<0xA9>")]
        );
        // A special token splits the text, and a space is prefixed after it.
        assert_eq!(
            spm.encode("hello</s>hello", true),
            [id("\u{2581}hello"), id("</s>"), id("\u{2581}hello")]
        );
        assert_eq!(
            spm.encode("</s>", false),
            [
                id("\u{2581}"),
                id("<0x3C>"),
                id("<0x2F>"),
                id("<0x73>"),
                id("<0x3E>")
            ]
        );
    }
}
