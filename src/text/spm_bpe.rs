//! SentencePiece-style BPE as llama.cpp does it for GGUF `tokenizer.ggml.model = "gemma4"`
//! vocabularies (Gemma 4; llama.cpp's pre-tokenizer type `GEMMA4`): spaces become `▁` (no
//! space is prefixed), the text is cut into runs of newlines and runs of other characters,
//! a run made only of newlines that is itself a token is that token, and every other run is
//! split into UTF-8 characters merged by rank (`tokenizer.ggml.merges`, lowest rank first,
//! ties to the leftmost pair) on raw UTF-8, not GPT-2's byte alphabet; a merged symbol that is
//! not a token becomes the `<0xXX>` byte tokens of its bytes (a byte without one is dropped,
//! as llama.cpp drops it).
//!
//! This follows llama.cpp's `llm_tokenizer_bpe_session::tokenize` with the `GEMMA4`
//! pre-tokenizer step by step, so ids are identical. Special tokens are split off first
//! ([`super::spm::partition`]). This module knows only a vocabulary; the GGUF reading and
//! BOS/EOS handling live in [`super::tokenizer`].

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::spm::{partition, Frag};

/// A Gemma 4 vocabulary with llama.cpp's tokenization.
#[derive(Debug, Clone)]
pub struct SpmBpe {
    ids: HashMap<String, u32>,
    /// Each merge's rank by its pair (left, right).
    ranks: HashMap<(String, String), usize>,
    /// Special tokens (control, user-defined, unknown) matched in text before tokenizing,
    /// longest first.
    specials: Vec<(String, u32, bool)>,
    byte_ids: [Option<u32>; 256],
}

struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(PartialEq, Eq)]
struct Bigram {
    left: usize,
    right: usize,
    rank: usize,
    /// The pair's text when queued; a stale entry no longer matches.
    size: usize,
}

impl Ord for Bigram {
    /// Lowest rank first; equal ranks: lowest left index first (llama.cpp's comparator).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl SpmBpe {
    /// Builds the tokenizer from the vocabulary in id order (with whether each token is
    /// special: matched in raw text) and the merges (`"left right"`, split at the first space
    /// after the first byte, as llama.cpp splits them; a merge without one is an error).
    pub fn new<'a>(
        tokens: impl IntoIterator<Item = (&'a str, bool)>,
        merges: &[String],
    ) -> Result<SpmBpe, String> {
        let mut ids = HashMap::new();
        let mut specials = Vec::new();
        for (i, (text, special)) in tokens.into_iter().enumerate() {
            let id = i as u32;
            // Duplicate strings keep their first id.
            ids.entry(text.to_string()).or_insert(id);
            if special && !text.is_empty() {
                specials.push((text.to_string(), id, false));
            }
        }
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut ranks = HashMap::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            let cut = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(at, _)| at)
                .ok_or_else(|| format!("merge {i} `{m}` has no space"))?;
            ranks
                .entry((m[..cut].to_string(), m[cut + 1..].to_string()))
                .or_insert(i);
        }
        let mut byte_ids = [None; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = ids.get(&format!("<0x{b:02X}>")).copied();
        }
        Ok(SpmBpe {
            ids,
            ranks,
            specials,
            byte_ids,
        })
    }

    /// The id of a vocabulary string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// Tokenizes `text`, recognising its special tokens.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut output = Vec::new();
        for f in partition(text, &self.specials) {
            match f {
                Frag::Text(s, e) => {
                    let escaped = text[s..e].replace(' ', "\u{2581}");
                    for run in newline_runs(&escaped) {
                        self.encode_run(run, &mut output);
                    }
                }
                Frag::Token(id) => output.push(id),
            }
        }
        output
    }

    /// One run of newlines or of other characters: llama.cpp's BPE merges, then each symbol
    /// as its token or its bytes' tokens.
    fn encode_run(&self, run: &str, output: &mut Vec<u32>) {
        if run.bytes().all(|b| b == b'\n') {
            if let Some(&id) = self.ids.get(run) {
                output.push(id);
                return;
            }
        }
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (start, ch)) in run.char_indices().enumerate() {
            let len = ch.len_utf8();
            symbols.push(Symbol {
                start,
                len,
                prev: i.checked_sub(1),
                next: (start + len < run.len()).then_some(i + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        for i in 1..symbols.len() {
            self.try_add(run, &symbols, &mut queue, Some(i - 1), Some(i));
        }
        while let Some(b) = queue.pop() {
            let (ln, rn) = (symbols[b.left].len, symbols[b.right].len);
            // Stale: a side was merged away, or the pair's text changed since it was queued.
            if ln == 0 || rn == 0 || ln + rn != b.size || symbols[b.left].next != Some(b.right) {
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
            self.try_add(run, &symbols, &mut queue, prev, Some(b.left));
            self.try_add(run, &symbols, &mut queue, Some(b.left), next);
        }
        let mut i = (!symbols.is_empty()).then_some(0);
        while let Some(s) = i {
            let piece = &run[symbols[s].start..symbols[s].start + symbols[s].len];
            match self.ids.get(piece) {
                Some(&id) => output.push(id),
                None => output.extend(piece.bytes().filter_map(|b| self.byte_ids[b as usize])),
            }
            i = symbols[s].next;
        }
    }

    /// Queues the merge of `left` and `right` when their pair has a rank.
    fn try_add(
        &self,
        run: &str,
        symbols: &[Symbol],
        queue: &mut BinaryHeap<Bigram>,
        left: Option<usize>,
        right: Option<usize>,
    ) {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (ls, rs) = (symbols[l].start, symbols[r].start);
        let pair = (
            run[ls..ls + symbols[l].len].to_string(),
            run[rs..rs + symbols[r].len].to_string(),
        );
        if let Some(&rank) = self.ranks.get(&pair) {
            queue.push(Bigram {
                left: l,
                right: r,
                rank,
                size: symbols[l].len + symbols[r].len,
            });
        }
    }
}

/// `text` cut into maximal runs of `\n` and of everything else (llama.cpp's `GEMMA4` regex
/// `[^\n]+|[\n]+`).
fn newline_runs(text: &str) -> impl Iterator<Item = &str> {
    let b = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= b.len() {
            return None;
        }
        let nl = b[start] == b'\n';
        let len = b[start..]
            .iter()
            .position(|&c| (c == b'\n') != nl)
            .unwrap_or(b.len() - start);
        let run = &text[start..start + len];
        start += len;
        Some(run)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_at_newlines_only() {
        let runs: Vec<&str> = newline_runs("a b\n\nc\n").collect();
        assert_eq!(runs, ["a b", "\n\n", "c", "\n"]);
        assert_eq!(newline_runs("").count(), 0);
    }

    /// Merges apply lowest rank first, a symbol that is not a token falls back to its bytes'
    /// tokens, spaces are `▁` without a prefix, and a run of newlines that is a token is that
    /// token even without a merge making it.
    #[test]
    fn merges_by_rank_with_byte_fallback() {
        let mut vocab: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        vocab.extend((0..256).map(|b| format!("<0x{b:02X}>")));
        for t in [
            "\u{2581}", "h", "e", "l", "o", "he", "ll", "hell", "hello", "\n", "\n\n\n", "x",
        ] {
            vocab.push(t.into());
        }
        let merges: Vec<String> = ["l l", "h e", "he ll", "hell o", "o \u{2581}"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let t = SpmBpe::new(
            vocab.iter().enumerate().map(|(i, s)| (s.as_str(), i < 4)),
            &merges,
        )
        .unwrap();
        let id = |s: &str| t.token_id(s).unwrap();
        assert_eq!(t.encode("hello"), [id("hello")]);
        // "o▁" merges (rank 4) but is no token: its bytes' tokens.
        assert_eq!(
            t.encode("hello x"),
            [id("hello"), id("\u{2581}"), id("x")],
            "hell+o (rank 3) before o+▁ (rank 4)"
        );
        assert_eq!(
            t.encode("lo x"),
            [
                id("l"),
                id("<0x6F>"),
                id("<0xE2>"),
                id("<0x96>"),
                id("<0x81>"),
                id("x")
            ]
        );
        assert_eq!(t.encode("\n\n\n"), [id("\n\n\n")]);
        assert_eq!(t.encode("\n\n"), [id("\n"), id("\n")]);
        assert_eq!(t.encode("x<eos>x"), [id("x"), id("<eos>"), id("x")]);
        assert!(SpmBpe::new([("a", false)], &["ab".to_string()]).is_err());
    }
}
