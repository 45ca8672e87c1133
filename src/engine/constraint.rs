//! Constrained decoding: a request may carry a grammar (a JSON schema or a Lark grammar) that
//! its output must follow. The grammar is compiled with llguidance (the library vLLM, SGLang
//! and llama.cpp use) against a token environment built from Candor's own tokenizer: each id's
//! exact bytes, control tokens marked special so that no grammar can produce them.
//!
//! At each step the request's [`ConstraintState`] gives the set of allowed tokens; the
//! scheduler picks the next token among them only (greedy: the allowed token with the largest
//! logit, ties to the lowest id). When the grammar can end, the model's stop tokens are
//! allowed too; when it must end, only they are. The mask depends only on the request's own
//! grammar and tokens so far, never on its batch neighbours, so the determinism contract holds.
//! A token the mask forces (the only one allowed) is still fed through the model one step at
//! a time: output tokens are the same as with fast-forwarding, and the scheduler stays one
//! loop. This module knows nothing of benchmarks: callers build the schema.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::text::tokenizer::{TokenKind, Tokenizer};

/// The llguidance version compiled in (pinned exactly in Cargo.toml), for run manifests.
pub const LLGUIDANCE_VERSION: &str = "1.9.1";

/// A grammar a request's output must follow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// A JSON schema (with llguidance's `x-guidance` options, if any).
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark syntax.
    Lark(String),
}

impl Constraint {
    /// Hex sha256 of the grammar's canonical text (kind and source), for run manifests.
    pub fn sha256(&self) -> String {
        let mut h = Sha256::new();
        match self {
            Constraint::JsonSchema(v) => {
                h.update(b"json_schema\0");
                h.update(v.to_string().as_bytes());
            }
            Constraint::Lark(s) => {
                h.update(b"lark\0");
                h.update(s.as_bytes());
            }
        }
        hex::encode(h.finalize())
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Constraint::JsonSchema(v) => TopLevelGrammar::from_json_schema(v.clone()),
            Constraint::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
        }
    }
}

/// A token environment for llguidance from a tokenizer's vocabulary.
struct CandorTokEnv {
    trie: TokTrie,
}

impl TokenizerEnv for CandorTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only used by llguidance for forced text; greedy over the trie is enough because Candor
    /// never fast-forwards (see the module doc) and says so with `tokenize_is_canonical`.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The bytes llguidance sees for each id: the exact bytes the token stands for, or the
/// special-token marker (0xFF) before its text for control and unknown tokens. Unused and
/// empty entries become special too, so no grammar produces them.
pub fn vocab_words(tokenizer: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tokenizer.vocab_size() as u32)
        .map(|id| {
            let bytes = tokenizer.token_bytes(id).unwrap_or_default();
            let special = matches!(
                tokenizer.token_kind(id),
                Some(TokenKind::Control | TokenKind::Unknown | TokenKind::Unused) | None
            ) || bytes.is_empty();
            if special {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                let name = tokenizer.id_to_token(id).unwrap_or_default();
                if name.is_empty() {
                    w.extend_from_slice(format!("<[{id}]>").as_bytes());
                } else {
                    w.extend_from_slice(name.as_bytes());
                }
                w
            } else {
                bytes.to_vec()
            }
        })
        .collect()
}

/// Compiles constraints for one vocabulary (built once per engine, on first use).
pub struct ConstraintCompiler {
    words: Vec<Vec<u8>>,
    eos: u32,
    /// Rows of logits may be wider than the vocabulary (padded embeddings): those ids are
    /// never allowed.
    factory: OnceLock<Result<ParserFactory, String>>,
}

impl ConstraintCompiler {
    pub fn new(tokenizer: &Tokenizer) -> ConstraintCompiler {
        ConstraintCompiler::from_words(vocab_words(tokenizer), tokenizer.eos_token_id())
    }

    /// From llguidance words (see [`vocab_words`]) and the end-of-sequence id.
    pub fn from_words(words: Vec<Vec<u8>>, eos: u32) -> ConstraintCompiler {
        ConstraintCompiler {
            words,
            eos,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, String> {
        self.factory
            .get_or_init(|| {
                let info = TokRxInfo::new(self.words.len() as u32, self.eos);
                let trie = TokTrie::from(&info, &self.words);
                let env: TokEnv = Arc::new(CandorTokEnv { trie });
                let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
                f.quiet();
                Ok(f)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// A fresh matcher for one request.
    pub fn start(&self, constraint: &Constraint) -> Result<ConstraintState, String> {
        let factory = self.factory()?;
        let parser = factory
            .create_parser(constraint.grammar())
            .map_err(|e| format!("grammar does not compile: {e}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(format!("grammar does not compile: {e}"));
        }
        Ok(ConstraintState {
            matcher,
            vocab: self.words.len(),
        })
    }
}

/// One request's position in its grammar.
pub struct ConstraintState {
    matcher: Matcher,
    vocab: usize,
}

/// What may come next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// These ids (ascending); includes the stop ids when the grammar may end here.
    Tokens(Vec<u32>),
    /// The grammar is complete or broken: only a stop token may come.
    StopOnly,
}

impl ConstraintState {
    /// The allowed next tokens, the stop ids included when the grammar may end.
    pub fn allowed(&mut self, stop_ids: &[u32]) -> Allowed {
        if self.matcher.is_stopped() {
            return Allowed::StopOnly;
        }
        let accepting = self.matcher.is_accepting().unwrap_or(false);
        let Ok(mask) = self.matcher.compute_mask() else {
            return Allowed::StopOnly;
        };
        let mut ids: Vec<u32> = (0..self.vocab as u32)
            .filter(|&t| mask.is_allowed(t) && !stop_ids.contains(&t))
            .collect();
        if accepting {
            ids.extend(
                stop_ids
                    .iter()
                    .copied()
                    .filter(|&t| (t as usize) < self.vocab),
            );
            ids.sort_unstable();
            ids.dedup();
        }
        if ids.is_empty() {
            return Allowed::StopOnly;
        }
        Allowed::Tokens(ids)
    }

    /// Advances past a generated token (not a stop token). A token the grammar rejects puts
    /// the state in error; the next [`ConstraintState::allowed`] is then `StopOnly`.
    pub fn consume(&mut self, token: u32) {
        let _ = self.matcher.consume_token(token);
    }

    /// Why the grammar failed, if it did.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }
}

/// The index of the largest logit among `allowed` (ascending ids); a tie goes to the lowest
/// id and NaNs never win over a number. `allowed` must not be empty.
pub fn masked_argmax(logits: &[f32], allowed: &[u32]) -> u32 {
    let mut best = allowed[0];
    let mut best_v = f32::NEG_INFINITY;
    let mut seen_number = false;
    for &t in allowed {
        let v = logits.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY);
        if v.is_nan() {
            continue;
        }
        if !seen_number || v > best_v {
            best = t;
            best_v = v;
            seen_number = true;
        }
    }
    best
}

/// `logits` with every id outside `allowed` set to minus infinity (for sampling).
pub fn masked_logits(logits: &[f32], allowed: &[u32]) -> Vec<f32> {
    let mut out = vec![f32::NEG_INFINITY; logits.len()];
    for &t in allowed {
        if let Some(v) = logits.get(t as usize) {
            out[t as usize] = *v;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Single bytes plus `ab`, `{"`, and two special tokens (10 = eos-like).
    fn words() -> Vec<Vec<u8>> {
        let mut w: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        w.push(b"ab".to_vec());
        w.push(b"{\"".to_vec());
        w.push(b"\xFF<|im_end|>".to_vec());
        w.push(b"\xFF<|endoftext|>".to_vec());
        w
    }

    #[test]
    fn masks_follow_the_grammar_and_stop_at_its_end() {
        let c = ConstraintCompiler::from_words(words(), 259);
        let mut s = c
            .start(&Constraint::Lark(r#"start: "ab" "c""#.into()))
            .unwrap();
        let stops = [258u32, 259];
        let Allowed::Tokens(first) = s.allowed(&stops) else {
            panic!("stopped at the start")
        };
        assert_eq!(first, vec![b'a' as u32, 256]);
        s.consume(256);
        assert_eq!(s.allowed(&stops), Allowed::Tokens(vec![b'c' as u32]));
        s.consume(b'c' as u32);
        match s.allowed(&stops) {
            Allowed::StopOnly => {}
            Allowed::Tokens(t) => assert_eq!(t, stops.to_vec()),
        }
    }

    #[test]
    fn a_bad_grammar_is_an_error() {
        let c = ConstraintCompiler::from_words(words(), 259);
        assert!(c
            .start(&Constraint::Lark("start: nothing_defined".into()))
            .is_err());
    }

    #[test]
    fn masked_argmax_picks_only_allowed_ids() {
        let logits = [5.0, 1.0, 3.0, 3.0, f32::NAN];
        assert_eq!(masked_argmax(&logits, &[1, 2, 3]), 2);
        assert_eq!(masked_argmax(&logits, &[4, 1]), 1);
        assert_eq!(masked_argmax(&[f32::NEG_INFINITY; 3], &[2]), 2);
        let m = masked_logits(&logits, &[1]);
        assert_eq!(m[1], 1.0);
        assert!(m[0].is_infinite());
    }

    /// Drives `constraint` to produce `target`, always taking the longest allowed token whose
    /// bytes continue it, and checks that the grammar may then stop.
    fn drive(c: &ConstraintCompiler, tok: &Tokenizer, constraint: &Constraint, target: &[u8]) {
        let mut s = c.start(constraint).unwrap();
        let stops = [tok.eos_token_id()];
        let mut out: Vec<u8> = Vec::new();
        while out.len() < target.len() {
            let Allowed::Tokens(ids) = s.allowed(&stops) else {
                panic!("stopped early after {:?}", String::from_utf8_lossy(&out))
            };
            let rest = &target[out.len()..];
            let best = ids
                .iter()
                .copied()
                .filter(|&t| !stops.contains(&t))
                .filter(|&t| {
                    let b = tok.token_bytes(t).unwrap();
                    !b.is_empty() && rest.starts_with(b)
                })
                .max_by_key(|&t| tok.token_bytes(t).unwrap().len())
                .unwrap_or_else(|| panic!("no allowed token continues {rest:?}"));
            out.extend_from_slice(tok.token_bytes(best).unwrap());
            s.consume(best);
            assert!(s.error().is_none(), "{:?}", s.error());
        }
        match s.allowed(&stops) {
            Allowed::StopOnly => {}
            Allowed::Tokens(t) => assert!(t.contains(&stops[0]), "cannot stop: {t:?}"),
        }
    }

    fn schema() -> Constraint {
        Constraint::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {"hello": {"enum": ["是", "否"]}},
            "required": ["hello"],
            "additionalProperties": false,
            "x-guidance": {"whitespace_flexible": false},
        }))
    }

    #[test]
    fn byte_level_bpe_vocabulary() {
        use crate::text::tokenizer::testutil::{byte, content};
        let tok = Tokenizer::from_gguf(&content(None, false)).unwrap();
        let words = vocab_words(&tok);
        // Control tokens are special: no grammar can produce them.
        assert_eq!(words[2], b"\xFF<|im_end|>".to_vec());
        assert_eq!(words[byte(b'{') as usize], b"{".to_vec());
        let c = ConstraintCompiler::new(&tok);
        // "是" is three bytes, each its own byte-level token here.
        drive(&c, &tok, &schema(), "{\"hello\":\"是\"}".as_bytes());
    }

    /// A SentencePiece vocabulary with byte fallback: `<0xXX>` tokens stand for their byte.
    fn spm_tokenizer() -> Tokenizer {
        use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2i32, 3, 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        for t in ["\u{2581}", "{", "\"", "hello", ":", "}", "\u{2581}{"] {
            tokens.push(t.into());
            types.push(1);
        }
        let n = tokens.len();
        let mut md = std::collections::HashMap::new();
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        md.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        md.insert("tokenizer.ggml.tokens".into(), strings(tokens));
        md.insert(
            "tokenizer.ggml.scores".into(),
            Value::Array((0..n).map(|i| Value::F32(-(i as f32))).collect()),
        );
        md.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        );
        md.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1));
        md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(2));
        md.insert("tokenizer.ggml.unknown_token_id".into(), Value::U32(0));
        let content = Content {
            magic: VersionedMagic::GgufV3,
            metadata: md,
            tensor_infos: std::collections::HashMap::new(),
            tensor_data_offset: 0,
        };
        Tokenizer::from_gguf(&content).unwrap()
    }

    #[test]
    fn byte_fallback_vocabulary() {
        let tok = spm_tokenizer();
        let words = vocab_words(&tok);
        assert_eq!(words[0], b"\xFF<unk>".to_vec());
        assert_eq!(words[3 + 0xE6], vec![0xE6u8]);
        assert_eq!(words[3 + 256], b" ".to_vec());
        assert_eq!(words[3 + 256 + 6], b" {".to_vec());
        let c = ConstraintCompiler::new(&tok);
        // "是" only through its three byte-fallback tokens.
        drive(&c, &tok, &schema(), "{\"hello\":\"是\"}".as_bytes());
        // `▁` pieces stand for a space: both ways of writing " {" are allowed, nothing else.
        let mut s = c.start(&Constraint::Lark(r#"start: " {""#.into())).unwrap();
        let Allowed::Tokens(first) = s.allowed(&[2]) else {
            panic!("stopped")
        };
        assert_eq!(first, vec![3 + 0x20, 3 + 256, 3 + 256 + 6]);
    }

    #[test]
    fn hash_names_kind_and_source() {
        let a = Constraint::Lark("start: \"a\"".into());
        let b = Constraint::JsonSchema(serde_json::json!({"const": "a"}));
        assert_ne!(a.sha256(), b.sha256());
        assert_eq!(a.sha256(), a.clone().sha256());
    }
}
