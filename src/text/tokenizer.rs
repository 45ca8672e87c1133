//! The tokenizer: text to token ids and back, built from a GGUF file's `tokenizer.ggml.*`
//! metadata (byte-level BPE, `gpt2` model; SentencePiece-style with byte fallback, `llama`
//! model, see [`super::spm`]; or Gemma 4's SentencePiece-style BPE, `gemma4` model, see
//! [`super::spm_bpe`]) or from a Hugging Face `tokenizer.json`.
//!
//! llama.cpp is the reference. Its byte-level BPE pre-tokenizes with a profile named by
//! `tokenizer.ggml.pre`: an ordered list of regexes, each splitting every piece left by the
//! previous one (matches and the text between them both become pieces), then BPE merges each
//! piece. We build the same pipeline with the `tokenizers` crate (`Split` pre-tokenizers in
//! `Isolated` mode, then `ByteLevel` without its own regex). Control tokens (`<|im_start|>`)
//! are recognised in text before pre-tokenizing, as llama.cpp does with `parse_special`.
//! Decoding maps byte-level characters back to raw bytes ourselves, so that a piece that ends
//! inside a UTF-8 character is still exact bytes ([`Tokenizer::token_bytes`]).
//! The BPE's word cache is off: `tokenizers` 0.23 keeps it in a thread-local map that is never
//! pruned when a tokenizer is dropped, so every model loaded on a thread would leave its cache
//! behind (found by the GGUF fuzz target, whose resident memory grew by ~300 bytes per input).
//! This module does not render chat templates ([`super::chat_template`]) and does not know
//! which tokens stop generation beyond EOS (the template decides that).

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use sha2::{Digest, Sha256};
use tokenizers::models::bpe::BPE;
use tokenizers::models::ModelWrapper;
use tokenizers::AddedToken;

use super::error::{Result, TextError};
use super::pre_tokenizer::{byte_level_bytes, PreTokenizer};
use super::spm::{Spm, SpmToken};
use super::spm_bpe::SpmBpe;

/// The kind of a vocabulary entry (GGUF `tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    Normal,
    Unknown,
    /// A control token such as `<|im_start|>`: recognised in text, skippable when decoding.
    Control,
    /// A user-defined token: always recognised in text, decoded as its literal text.
    UserDefined,
    Unused,
    Byte,
}

impl TokenKind {
    fn from_gguf(code: i64) -> Result<Self> {
        Ok(match code {
            1 => TokenKind::Normal,
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            other => {
                return Err(TextError::Tokenizer(format!(
                    "unknown token type {other} in tokenizer.ggml.token_type"
                )))
            }
        })
    }
}

/// A tokenizer with the model's special-token conventions (BOS/EOS and whether to add them).
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Vocabulary strings as stored (byte-level characters for normal tokens), by id.
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    /// The raw bytes each token stands for, by id.
    pieces: Vec<Vec<u8>>,
    /// False when a tokenizer.json's decoder is not byte-level: decode through `inner`.
    byte_level: bool,
    bos: Option<u32>,
    eos: u32,
    add_bos: bool,
    add_eos: bool,
    sha256: String,
    /// Set for SentencePiece-style (`llama`) vocabularies, which encode through it.
    spm: Option<Spm>,
    /// Set for SentencePiece-style BPE (`gemma4`) vocabularies, which encode through it.
    spm_bpe: Option<Box<SpmBpe>>,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes (`tokenizer.ggml.model` must be `gpt2`).
    pub fn from_gguf(content: &Content) -> Result<Self> {
        let meta = &content.metadata;
        let model = meta_str(meta, "tokenizer.ggml.model")?;
        if model == "llama" {
            return Self::from_gguf_spm(content);
        }
        if model == "gemma4" {
            return Self::from_gguf_gemma4(content);
        }
        if model != "gpt2" {
            return Err(TextError::Tokenizer(format!(
                "unsupported tokenizer model `{model}` (supported: gpt2 byte-level BPE, llama SentencePiece, gemma4 SentencePiece-style BPE)"
            )));
        }
        let pre_name = match meta.get("tokenizer.ggml.pre") {
            Some(v) => Some(
                v.to_string()
                    .map_err(|e| bad_key("tokenizer.ggml.pre", e))?,
            ),
            None => None,
        };
        let pre = PreTokenizer::from_name(pre_name.map(String::as_str))?;
        let tokens = meta_strings(meta, "tokenizer.ggml.tokens")?;
        let merges = meta_strings(meta, "tokenizer.ggml.merges")?;
        let kinds = match meta.get("tokenizer.ggml.token_type") {
            Some(Value::Array(vs)) => vs
                .iter()
                .map(|v| value_i64(v).and_then(TokenKind::from_gguf))
                .collect::<Result<Vec<_>>>()?,
            Some(_) => return Err(bad_key("tokenizer.ggml.token_type", "not an array")),
            None => vec![TokenKind::Normal; tokens.len()],
        };
        if kinds.len() != tokens.len() {
            return Err(TextError::Tokenizer(format!(
                "{} token types for {} tokens",
                kinds.len(),
                tokens.len()
            )));
        }
        let eos = meta_u32(meta, "tokenizer.ggml.eos_token_id")?
            .ok_or_else(|| bad_key("tokenizer.ggml.eos_token_id", "missing"))?;
        let bos = meta_u32(meta, "tokenizer.ggml.bos_token_id")?;
        let add_bos =
            meta_bool(meta, "tokenizer.ggml.add_bos_token")?.unwrap_or(pre.adds_bos_by_default());
        let add_eos = meta_bool(meta, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);

        let pre_key = pre_name.map(String::as_str).unwrap_or("default");
        let sha256 = vocab_sha256(
            &[b"candor-gguf-tokenizer-v1\0gpt2\0", pre_key.as_bytes()],
            &tokens,
            &kinds,
            &merges,
            &format!("\0bos={bos:?} eos={eos} add_bos={add_bos} add_eos={add_eos}"),
        );

        Self::from_vocab(
            VocabSpec {
                tokens,
                kinds,
                merges,
                pre,
                bos,
                eos,
                add_bos,
                add_eos,
            },
            sha256,
        )
    }

    /// A SentencePiece-style vocabulary (`tokenizer.ggml.model = "llama"`): tokens, scores and
    /// types; byte fallback through `<0xXX>` tokens.
    fn from_gguf_spm(content: &Content) -> Result<Self> {
        let meta = &content.metadata;
        let tokens = meta_strings(meta, "tokenizer.ggml.tokens")?;
        let n = tokens.len();
        let scores: Vec<f32> = match meta.get("tokenizer.ggml.scores") {
            Some(Value::Array(vs)) => vs
                .iter()
                .map(|v| match v {
                    Value::F32(x) => Ok(*x),
                    Value::F64(x) => Ok(*x as f32),
                    _ => Err(bad_key("tokenizer.ggml.scores", "not an array of floats")),
                })
                .collect::<Result<_>>()?,
            Some(_) => return Err(bad_key("tokenizer.ggml.scores", "not an array")),
            None => vec![0.0; n],
        };
        let kinds = token_kinds(meta, n)?;
        if kinds.len() != n || scores.len() != n {
            return Err(TextError::Tokenizer(format!(
                "{} token types and {} scores for {n} tokens",
                kinds.len(),
                scores.len()
            )));
        }
        let in_vocab = |what: &str, id: Option<u32>| in_vocab(what, id, n);
        let eos = in_vocab("eos", meta_u32(meta, "tokenizer.ggml.eos_token_id")?)?
            .ok_or_else(|| bad_key("tokenizer.ggml.eos_token_id", "missing"))?;
        let bos = in_vocab("bos", meta_u32(meta, "tokenizer.ggml.bos_token_id")?)?;
        let unk = in_vocab(
            "unknown",
            meta_u32(meta, "tokenizer.ggml.unknown_token_id")?,
        )?;
        let add_bos = meta_bool(meta, "tokenizer.ggml.add_bos_token")?.unwrap_or(true);
        let add_eos = meta_bool(meta, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let add_space_prefix = meta_bool(meta, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
        // llama.cpp strips whitespace after Phi-3's special tokens (but not these three).
        let name = meta
            .get("general.name")
            .and_then(|v| v.to_string().ok())
            .map(|s| s.to_lowercase())
            .unwrap_or_default();
        let phi3 = name.contains("phi-3") || name.contains("phi3");
        let special = |k: &TokenKind| {
            matches!(
                k,
                TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
            )
        };
        let spm = Spm::new(
            tokens
                .iter()
                .zip(&scores)
                .zip(&kinds)
                .map(|((t, &score), k)| SpmToken {
                    text: t,
                    score,
                    special: special(k),
                    rstrip: phi3
                        && special(k)
                        && !matches!(t.as_str(), "<unk>" | "<s>" | "<|endoftext|>"),
                }),
            unk,
            add_space_prefix,
        );
        let pieces: Vec<Vec<u8>> = tokens
            .iter()
            .zip(&kinds)
            .map(|(t, k)| match k {
                TokenKind::Byte => t
                    .strip_prefix("<0x")
                    .and_then(|h| h.strip_suffix('>'))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .map_or_else(|| t.as_bytes().to_vec(), |b| vec![b]),
                TokenKind::Normal | TokenKind::UserDefined | TokenKind::Unused => {
                    t.replace('\u{2581}', " ").into_bytes()
                }
                TokenKind::Control | TokenKind::Unknown => t.as_bytes().to_vec(),
            })
            .collect();
        let mut hasher = Sha256::new();
        hasher.update(b"candor-gguf-tokenizer-v1\0llama\0");
        for ((t, k), sc) in tokens.iter().zip(&kinds).zip(&scores) {
            hasher.update([0u8, *k as u8]);
            hasher.update(sc.to_le_bytes());
            hasher.update(t.as_bytes());
        }
        hasher.update(format!(
            "\0bos={bos:?} eos={eos} unk={unk:?} add_bos={add_bos} add_eos={add_eos} space={add_space_prefix} phi3={phi3}"
        ));
        let sha256 = hex::encode(hasher.finalize());
        // `inner` serves id lookups only: a merge-free vocabulary.
        let mut vocab: tokenizers::models::bpe::Vocab = Default::default();
        for (i, t) in tokens.iter().enumerate() {
            vocab.entry(t.clone()).or_insert(i as u32);
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, Vec::new())
            .cache_capacity(0)
            .build()
            .map_err(|e| TextError::Tokenizer(format!("building the vocabulary: {e}")))?;
        Ok(Tokenizer {
            inner: tokenizers::Tokenizer::new(bpe),
            tokens,
            kinds,
            pieces,
            byte_level: true,
            bos,
            eos,
            add_bos,
            add_eos,
            sha256,
            spm: Some(spm),
            spm_bpe: None,
        })
    }

    /// A Gemma 4 vocabulary (`tokenizer.ggml.model = "gemma4"`): tokens, types and merges,
    /// BPE on raw UTF-8 with `▁` for spaces and `<0xXX>` byte fallback ([`SpmBpe`]). As
    /// llama.cpp, any `tokenizer.ggml.pre` is ignored (the model implies its pre-tokenizer)
    /// and BOS is always added (llama.cpp overrides a false `add_bos_token` for Gemma 4).
    fn from_gguf_gemma4(content: &Content) -> Result<Self> {
        let meta = &content.metadata;
        let tokens = meta_strings(meta, "tokenizer.ggml.tokens")?;
        let merges = meta_strings(meta, "tokenizer.ggml.merges")?;
        let n = tokens.len();
        let kinds = token_kinds(meta, n)?;
        if kinds.len() != n {
            return Err(TextError::Tokenizer(format!(
                "{} token types for {n} tokens",
                kinds.len()
            )));
        }
        let in_vocab = |what: &str, id: Option<u32>| in_vocab(what, id, n);
        let eos = in_vocab("eos", meta_u32(meta, "tokenizer.ggml.eos_token_id")?)?
            .ok_or_else(|| bad_key("tokenizer.ggml.eos_token_id", "missing"))?;
        let bos = in_vocab("bos", meta_u32(meta, "tokenizer.ggml.bos_token_id")?)?;
        let add_bos = true;
        let add_eos = meta_bool(meta, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let special = |k: &TokenKind| {
            matches!(
                k,
                TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
            )
        };
        let bpe = SpmBpe::new(
            tokens
                .iter()
                .zip(&kinds)
                .map(|(t, k)| (t.as_str(), special(k))),
            &merges,
        )
        .map_err(TextError::Tokenizer)?;
        // llama.cpp's `token_to_piece` for this vocabulary: `▁` is a space in normal tokens,
        // byte tokens are their byte, special ones their text, unused ones nothing.
        let pieces: Vec<Vec<u8>> = tokens
            .iter()
            .zip(&kinds)
            .map(|(t, k)| match k {
                TokenKind::Byte => t
                    .strip_prefix("<0x")
                    .and_then(|h| h.strip_suffix('>'))
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .map_or_else(|| t.as_bytes().to_vec(), |b| vec![b]),
                TokenKind::Normal => t.replace('\u{2581}', " ").into_bytes(),
                TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown => {
                    t.as_bytes().to_vec()
                }
                TokenKind::Unused => Vec::new(),
            })
            .collect();
        let sha256 = vocab_sha256(
            &[b"candor-gguf-tokenizer-v1\0gemma4\0"],
            &tokens,
            &kinds,
            &merges,
            &format!("\0bos={bos:?} eos={eos} add_bos={add_bos} add_eos={add_eos}"),
        );
        // `inner` serves nothing here (ids come from `spm_bpe`): an empty vocabulary.
        let empty = BPE::builder()
            .cache_capacity(0)
            .build()
            .map_err(|e| TextError::Tokenizer(format!("building the vocabulary: {e}")))?;
        Ok(Tokenizer {
            inner: tokenizers::Tokenizer::new(empty),
            tokens,
            kinds,
            pieces,
            byte_level: true,
            bos,
            eos,
            add_bos,
            add_eos,
            sha256,
            spm: None,
            spm_bpe: Some(Box::new(bpe)),
        })
    }

    /// Reads a GGUF file's metadata and builds its tokenizer.
    pub fn from_gguf_file(path: &Path) -> Result<Self> {
        let mut f = std::fs::File::open(path).map_err(|e| TextError::io(path, e))?;
        let content = Content::read(&mut f).map_err(|e| TextError::gguf(path, e.to_string()))?;
        Self::from_gguf(&content)
    }

    fn from_vocab(spec: VocabSpec, sha256: String) -> Result<Self> {
        let n = spec.tokens.len();
        let id_of = |what: &str, id: u32| -> Result<u32> {
            if (id as usize) < n {
                Ok(id)
            } else {
                Err(TextError::Tokenizer(format!(
                    "{what} token id {id} is outside the vocabulary of {n}"
                )))
            }
        };
        let eos = id_of("eos", spec.eos)?;
        let bos = spec.bos.map(|b| id_of("bos", b)).transpose()?;
        let mut vocab: tokenizers::models::bpe::Vocab = Default::default();
        for (i, t) in spec.tokens.iter().enumerate() {
            // Duplicate strings keep their first id, as llama.cpp's token-to-id map does.
            vocab.entry(t.clone()).or_insert(i as u32);
        }
        let mut merge_pairs = Vec::with_capacity(spec.merges.len());
        for (i, m) in spec.merges.iter().enumerate() {
            let (a, b) = m
                .split_once(' ')
                .ok_or_else(|| TextError::Tokenizer(format!("merge {i} `{m}` has no space")))?;
            merge_pairs.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merge_pairs)
            .ignore_merges(spec.pre.ignore_merges())
            .cache_capacity(0)
            .build()
            .map_err(|e| TextError::Tokenizer(format!("building bpe: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(spec.pre.build()?));
        inner.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
        let mut control = Vec::new();
        let mut user = Vec::new();
        for (t, k) in spec.tokens.iter().zip(&spec.kinds) {
            match k {
                TokenKind::Control => control.push(AddedToken::from(t.clone(), true)),
                TokenKind::UserDefined => {
                    user.push(AddedToken::from(t.clone(), false).normalized(false))
                }
                _ => {}
            }
        }
        let add_err = |e| TextError::Tokenizer(format!("adding special tokens: {e}"));
        inner.add_special_tokens(control).map_err(add_err)?;
        inner.add_tokens(user).map_err(add_err)?;
        let pieces = spec
            .tokens
            .iter()
            .zip(&spec.kinds)
            .map(|(t, k)| match k {
                TokenKind::Normal | TokenKind::Unused | TokenKind::Byte | TokenKind::Unknown => {
                    byte_level_bytes(t)
                }
                TokenKind::Control | TokenKind::UserDefined => t.as_bytes().to_vec(),
            })
            .collect();
        Ok(Tokenizer {
            inner,
            tokens: spec.tokens,
            kinds: spec.kinds,
            pieces,
            byte_level: true,
            bos,
            eos,
            add_bos: spec.add_bos,
            add_eos: spec.add_eos,
            sha256,
            spm: None,
            spm_bpe: None,
        })
    }

    /// Loads a Hugging Face `tokenizer.json`; BOS/EOS and whether to add them come from a
    /// `tokenizer_config.json` beside it when there is one.
    pub fn from_tokenizer_json(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| TextError::io(path, e))?;
        let json: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| TextError::Tokenizer(format!("{}: {e}", path.display())))?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| TextError::Tokenizer(format!("{}: {e}", path.display())))?;
        if let ModelWrapper::BPE(bpe) = inner.get_model() {
            let mut bpe = bpe.clone();
            bpe.resize_cache(0);
            inner.with_model(bpe);
        }
        let config_path = path.with_file_name("tokenizer_config.json");
        let (config, config_bytes) = if config_path.is_file() {
            let cb = std::fs::read(&config_path).map_err(|e| TextError::io(&config_path, e))?;
            let cv: serde_json::Value = serde_json::from_slice(&cb)
                .map_err(|e| TextError::Tokenizer(format!("{}: {e}", config_path.display())))?;
            (Some(cv), cb)
        } else {
            (None, Vec::new())
        };
        let mut hasher = Sha256::new();
        hasher.update(b"candor-tokenizer-json-v1\0");
        hasher.update(&bytes);
        hasher.update(b"\0");
        hasher.update(&config_bytes);
        let sha256 = hex::encode(hasher.finalize());

        let vocab = inner.get_vocab(true);
        let n = vocab.values().max().map_or(0, |m| *m as usize + 1);
        let mut tokens = vec![String::new(); n];
        for (t, id) in vocab {
            tokens[id as usize] = t;
        }
        let added = inner.get_added_tokens_decoder();
        let kinds: Vec<TokenKind> = (0..n as u32)
            .map(|id| match added.get(&id) {
                Some(t) if t.special => TokenKind::Control,
                Some(_) => TokenKind::UserDefined,
                None => TokenKind::Normal,
            })
            .collect();
        let byte_level = decoder_is_byte_level(json.get("decoder"));
        let pieces = tokens
            .iter()
            .zip(&kinds)
            .map(|(t, k)| match (k, byte_level) {
                (TokenKind::Normal, true) => byte_level_bytes(t),
                _ => t.as_bytes().to_vec(),
            })
            .collect();
        let lookup = |name: &str| -> Result<Option<u32>> {
            match config.as_ref().and_then(|c| config_token(c, name)) {
                Some(s) => inner.token_to_id(&s).map(Some).ok_or_else(|| {
                    TextError::Tokenizer(format!("{name} `{s}` is not in the vocabulary"))
                }),
                None => Ok(None),
            }
        };
        let bos = lookup("bos_token")?;
        let eos = match lookup("eos_token")? {
            Some(e) => e,
            None => ["</s>", "<|endoftext|>", "<|end_of_text|>", "<|im_end|>"]
                .iter()
                .find_map(|s| inner.token_to_id(s))
                .ok_or_else(|| {
                    TextError::Tokenizer(format!(
                        "{}: cannot tell the end-of-sequence token (no tokenizer_config.json eos_token)",
                        path.display()
                    ))
                })?,
        };
        let flag = |name: &str| config.as_ref().and_then(|c| c.get(name)?.as_bool());
        // Without an explicit flag, ask the post-processor whether it adds BOS/EOS.
        let probe = inner
            .encode_fast("a", true)
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        let probe_ids = probe.get_ids();
        let add_bos = flag("add_bos_token")
            .unwrap_or_else(|| bos.is_some() && probe_ids.first().copied() == bos);
        let add_eos = flag("add_eos_token").unwrap_or(probe_ids.last() == Some(&eos));
        Ok(Tokenizer {
            inner,
            tokens,
            kinds,
            pieces,
            byte_level,
            bos,
            eos,
            add_bos,
            add_eos,
            sha256,
            spm: None,
            spm_bpe: None,
        })
    }

    /// Encodes text, parsing special tokens and adding BOS/EOS as the model asks; a text that
    /// already starts with BOS (a rendered template) gets no second one.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode_plain(text)?;
        if self.add_bos {
            if let Some(bos) = self.bos {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        if self.add_eos && ids.last() != Some(&self.eos) {
            ids.push(self.eos);
        }
        Ok(ids)
    }

    /// Encodes text, parsing special tokens, adding nothing.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        if let Some(spm) = &self.spm {
            return Ok(spm.encode(text, true));
        }
        if let Some(bpe) = &self.spm_bpe {
            return Ok(bpe.encode(text));
        }
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| TextError::Tokenizer(format!("encoding: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text, special tokens included; invalid UTF-8 becomes U+FFFD.
    /// Ids outside the vocabulary are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_filtered(ids, false)
    }

    /// Decodes ids to text without control tokens (`<|im_end|>` and the like).
    pub fn decode_skip_special(&self, ids: &[u32]) -> String {
        self.decode_filtered(ids, true)
    }

    fn decode_filtered(&self, ids: &[u32], skip_special: bool) -> String {
        let keep = |id: &u32| -> bool {
            match self.kinds.get(*id as usize) {
                Some(TokenKind::Control) => !skip_special,
                Some(_) => true,
                None => false,
            }
        };
        if !self.byte_level {
            let kept: Vec<u32> = ids.iter().copied().filter(keep).collect();
            // Ids are all in the vocabulary, so the decoder has nothing to reject.
            return self.inner.decode(&kept, false).unwrap_or_default();
        }
        let mut bytes = Vec::new();
        for id in ids.iter().filter(|id| keep(id)) {
            bytes.extend_from_slice(&self.pieces[*id as usize]);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes a token stands for (possibly part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(Vec::as_slice)
    }

    /// A token's text (lossy when the token is part of a UTF-8 character); empty when the id is
    /// outside the vocabulary.
    pub fn token_to_piece(&self, id: u32) -> String {
        self.token_bytes(id)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    }

    /// The vocabulary string of a token as stored (byte-level characters, not text).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary string (`<|im_end|>`), if present.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        if let Some(spm) = &self.spm {
            return spm.token_id(token);
        }
        if let Some(bpe) = &self.spm_bpe {
            return bpe.token_id(token);
        }
        self.inner.token_to_id(token)
    }

    /// The kind of a token, if the id is in the vocabulary.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    pub fn eos_token_id(&self) -> u32 {
        self.eos
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS token's text, for chat templates.
    pub fn eos_token(&self) -> &str {
        self.tokens
            .get(self.eos as usize)
            .map_or("", String::as_str)
    }

    /// The BOS token's text, for chat templates (empty when the model has none).
    pub fn bos_token(&self) -> &str {
        self.bos
            .and_then(|b| self.tokens.get(b as usize))
            .map(String::as_str)
            .unwrap_or("")
    }

    /// Whether [`Tokenizer::encode`] prepends BOS.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// Whether [`Tokenizer::encode`] appends EOS.
    pub fn add_eos_token(&self) -> bool {
        self.add_eos
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Hex sha256 of the tokenizer's definition (vocabulary, types, merges, pre-tokenizer,
    /// special-token settings), for run manifests.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
}

/// What a byte-level BPE vocabulary needs, gathered from GGUF metadata (or a test).
struct VocabSpec {
    tokens: Vec<String>,
    kinds: Vec<TokenKind>,
    merges: Vec<String>,
    pre: PreTokenizer,
    bos: Option<u32>,
    eos: u32,
    add_bos: bool,
    add_eos: bool,
}

fn decoder_is_byte_level(decoder: Option<&serde_json::Value>) -> bool {
    let Some(d) = decoder else { return false };
    match d.get("type").and_then(|t| t.as_str()) {
        Some("ByteLevel") => true,
        Some("Sequence") => d
            .get("decoders")
            .and_then(|ds| ds.as_array())
            .is_some_and(|ds| ds.iter().any(|x| decoder_is_byte_level(Some(x)))),
        _ => false,
    }
}

/// A special token named in tokenizer_config.json: a string or `{"content": ...}`.
fn config_token(config: &serde_json::Value, name: &str) -> Option<String> {
    match config.get(name)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The sha256 of a merges vocabulary as the manifest records it: `header`, each token's type
/// and text, each merge, then `tail` (its special tokens and flags).
fn vocab_sha256(
    header: &[&[u8]],
    tokens: &[String],
    kinds: &[TokenKind],
    merges: &[String],
    tail: &str,
) -> String {
    let mut hasher = Sha256::new();
    for h in header {
        hasher.update(h);
    }
    for (t, k) in tokens.iter().zip(kinds) {
        hasher.update([0u8, *k as u8]);
        hasher.update(t.as_bytes());
    }
    for m in merges {
        hasher.update([1u8]);
        hasher.update(m.as_bytes());
    }
    hasher.update(tail);
    hex::encode(hasher.finalize())
}

/// `tokenizer.ggml.token_type` of an `n`-token vocabulary (all normal when absent).
fn token_kinds(meta: &HashMap<String, Value>, n: usize) -> Result<Vec<TokenKind>> {
    match meta.get("tokenizer.ggml.token_type") {
        Some(Value::Array(vs)) => vs
            .iter()
            .map(|v| value_i64(v).and_then(TokenKind::from_gguf))
            .collect(),
        Some(_) => Err(bad_key("tokenizer.ggml.token_type", "not an array")),
        None => Ok(vec![TokenKind::Normal; n]),
    }
}

/// A special token's id (`what`: eos, bos, …), refused outside an `n`-token vocabulary.
fn in_vocab(what: &str, id: Option<u32>, n: usize) -> Result<Option<u32>> {
    match id {
        Some(i) if i as usize >= n => Err(TextError::Tokenizer(format!(
            "{what} token id {i} is outside the vocabulary of {n}"
        ))),
        other => Ok(other),
    }
}

fn bad_key(key: &str, msg: impl std::fmt::Display) -> TextError {
    TextError::Metadata {
        key: key.to_string(),
        msg: msg.to_string(),
    }
}

fn meta_str<'a>(meta: &'a HashMap<String, Value>, key: &str) -> Result<&'a str> {
    meta.get(key)
        .ok_or_else(|| bad_key(key, "missing"))?
        .to_string()
        .map(String::as_str)
        .map_err(|e| bad_key(key, e))
}

fn meta_strings(meta: &HashMap<String, Value>, key: &str) -> Result<Vec<String>> {
    match meta.get(key) {
        Some(Value::Array(vs)) => vs
            .iter()
            .map(|v| v.to_string().cloned().map_err(|e| bad_key(key, e)))
            .collect(),
        Some(_) => Err(bad_key(key, "not an array of strings")),
        None => Err(bad_key(key, "missing")),
    }
}

fn value_i64(v: &Value) -> Result<i64> {
    Ok(match v {
        Value::U8(x) => i64::from(*x),
        Value::I8(x) => i64::from(*x),
        Value::U16(x) => i64::from(*x),
        Value::I16(x) => i64::from(*x),
        Value::U32(x) => i64::from(*x),
        Value::I32(x) => i64::from(*x),
        Value::U64(x) => i64::try_from(*x).unwrap_or(i64::MAX),
        Value::I64(x) => *x,
        other => {
            return Err(TextError::Tokenizer(format!(
                "expected an integer, found {:?}",
                other.value_type()
            )))
        }
    })
}

fn meta_u32(meta: &HashMap<String, Value>, key: &str) -> Result<Option<u32>> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => {
            let x = value_i64(v).map_err(|e| bad_key(key, e))?;
            u32::try_from(x)
                .map(Some)
                .map_err(|_| bad_key(key, format!("{x} is not a token id")))
        }
    }
}

fn meta_bool(meta: &HashMap<String, Value>, key: &str) -> Result<Option<bool>> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v.to_bool().map(Some).map_err(|e| bad_key(key, e)),
    }
}

/// A tiny byte-level vocabulary as GGUF metadata, for tests here and in other modules.
#[cfg(test)]
pub(crate) mod testutil {
    use std::collections::HashMap;

    use candle_core::quantized::gguf_file::{Content, Value, VersionedMagic};

    /// Ids: 0 `<|endoftext|>`, 1 `<|im_start|>`, 2 `<|im_end|>`, 3 `<s>` (all control), then
    /// the 256 byte characters (byte `b` is id `4 + b`), then the merges' results in order.
    pub const MERGES: &[&str] = &["h e", "l l", "he ll", "hell o", "1 2", "Ċ Ċ", "Ġ w"];

    pub fn content(pre: Option<&str>, add_bos: bool) -> Content {
        let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut types = vec![3i32; 4];
        let mut chars: Vec<(u8, char)> = crate::text::pre_tokenizer::char_to_byte()
            .iter()
            .map(|(c, b)| (*b, *c))
            .collect();
        chars.sort();
        for (_, c) in chars {
            tokens.push(c.to_string());
            types.push(1);
        }
        for m in MERGES {
            tokens.push(m.replace(' ', ""));
            types.push(1);
        }
        let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
        let mut md = HashMap::new();
        md.insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        if let Some(p) = pre {
            md.insert("tokenizer.ggml.pre".into(), Value::String(p.into()));
        }
        md.insert("tokenizer.ggml.tokens".into(), strings(tokens));
        md.insert(
            "tokenizer.ggml.merges".into(),
            strings(MERGES.iter().map(|s| s.to_string()).collect()),
        );
        md.insert(
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        );
        md.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(3));
        md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(2));
        md.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos));
        Content {
            magic: VersionedMagic::GgufV3,
            metadata: md,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        }
    }

    /// The id of a single byte.
    pub fn byte(b: u8) -> u32 {
        4 + b as u32
    }

    /// The id of the `i`-th merge's result.
    pub fn merged(i: usize) -> u32 {
        4 + 256 + i as u32
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::{byte, content, merged};
    use super::*;

    fn tok(pre: Option<&str>) -> Tokenizer {
        Tokenizer::from_gguf(&content(pre, false)).unwrap()
    }

    /// `tokenizers` keeps BPE word caches in a thread-local map that outlives the tokenizer; a
    /// thread that loads many tokenizers (a run switching models, a fuzzer) must not keep them.
    #[test]
    fn dropped_tokenizers_leave_nothing_behind_on_the_thread() {
        // 300 distinct letter-only words (digits would be split off one by one).
        let letter = |i: usize| char::from(b'a' + (i % 26) as u8);
        let text: String = (0..300)
            .map(|i| format!(" q{}{}{}", letter(i), letter(i / 26), letter(i * 7)))
            .collect();
        let held = std::thread::spawn(move || {
            crate::budget::alloc_budget::with_budget(1 << 30, "unused", || {
                let once = || {
                    let t = tok(Some("smollm"));
                    assert!(!t.encode(&text).unwrap().is_empty());
                };
                // The first one pays for what is set up once per thread.
                once();
                let before = crate::budget::alloc_budget::remaining().unwrap();
                for _ in 0..40 {
                    once();
                }
                before - crate::budget::alloc_budget::remaining().unwrap()
            })
            .unwrap()
        })
        .join()
        .unwrap();
        assert!(
            held < 64 << 10,
            "{held} bytes held after 40 tokenizers were dropped"
        );
    }

    #[test]
    fn merges_apply_and_specials_parse() {
        let t = tok(Some("smollm"));
        let hello = merged(3);
        assert_eq!(t.encode("hello").unwrap(), vec![hello]);
        assert_eq!(
            t.encode("<|im_start|>hello<|im_end|>").unwrap(),
            vec![1, hello, 2]
        );
        // ` w` merges; ` hello` does not (no merge with Ġ).
        assert_eq!(
            t.encode(" world").unwrap(),
            vec![merged(6), byte(b'o'), byte(b'r'), byte(b'l'), byte(b'd')]
        );
    }

    #[test]
    fn smollm_splits_digits_gpt2_does_not() {
        let smol = tok(Some("smollm"));
        let gpt2 = tok(Some("gpt2"));
        assert_eq!(smol.encode("12").unwrap(), vec![byte(b'1'), byte(b'2')]);
        assert_eq!(gpt2.encode("12").unwrap(), vec![merged(4)]);
        // "\n\n5": the blank line stays one piece only when the digit is split off first.
        assert_eq!(smol.encode("\n\n5").unwrap(), vec![merged(5), byte(b'5')]);
        assert_eq!(
            gpt2.encode("\n\n5").unwrap(),
            vec![byte(b'\n'), byte(b'\n'), byte(b'5')]
        );
    }

    #[test]
    fn llama_bpe_keeps_up_to_three_digits_together() {
        let t = tok(Some("llama-bpe"));
        assert_eq!(t.encode("x12").unwrap(), vec![byte(b'x'), merged(4)]);
        assert_eq!(t.encode("\n\n5").unwrap(), vec![merged(5), byte(b'5')]);
        assert_eq!(t.encode(" world").unwrap()[0], merged(6));
    }

    #[test]
    fn default_profile_splits_runs_of_three_digits() {
        let t = tok(None);
        // `\p{N}+` then `[0-9]{3}`: "12345" → "123", "45"; our vocab merges only "12".
        assert_eq!(
            t.encode("12345").unwrap(),
            vec![merged(4), byte(b'3'), byte(b'4'), byte(b'5')]
        );
    }

    /// The vocab-only GGUF of `tests/fixtures/<name>` gives llama-tokenize's ids for each of
    /// the `count` texts in `expected.json` there (written by `make_vocab.py` there); returns
    /// the whole `expected.json` and the file's metadata, to build it otherwise.
    fn assert_fixture_ids(name: &str, count: usize) -> (serde_json::Value, Content) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let tok = Tokenizer::from_gguf_file(&dir.join("vocab.gguf")).unwrap();
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let cases = expected["cases"].as_array().unwrap();
        assert_eq!(cases.len(), count, "{name}");
        for case in cases {
            let text = case["text"].as_str().unwrap();
            assert_eq!(tok.encode(text).unwrap(), ids(case), "{name}: {text:?}");
        }
        let mut f = std::fs::File::open(dir.join("vocab.gguf")).unwrap();
        (expected, Content::read(&mut f).unwrap())
    }

    /// A case's expected ids.
    fn ids(case: &serde_json::Value) -> Vec<u32> {
        serde_json::from_value(case["ids"].clone()).unwrap()
    }

    /// The tokenizer of `content` with one metadata key set otherwise.
    fn with_key(content: &Content, key: &str, value: Value) -> Tokenizer {
        let mut metadata = content.metadata.clone();
        metadata.insert(key.into(), value);
        Tokenizer::from_gguf(&Content {
            magic: candle_core::quantized::gguf_file::VersionedMagic::GgufV3,
            metadata,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        })
        .unwrap()
    }

    /// The tokenizer of `content` under another pre-tokenizer.
    fn with_pre(content: &Content, pre: &str) -> Tokenizer {
        with_key(content, "tokenizer.ggml.pre", Value::String(pre.into()))
    }

    /// Under a wrong pre-tokenizer, `case`'s text (which must be `text`) gets other ids.
    fn assert_other_ids(wrong: &Tokenizer, case: &serde_json::Value, text: &str) {
        assert_eq!(case["text"], text);
        assert_ne!(wrong.encode(text).unwrap(), ids(case), "{text:?}");
    }

    /// The `gpt-4o` pre-tokenizer (gpt-oss) gives llama.cpp's ids: a vocab-only GGUF whose
    /// merges would join across the splits it must make (case changes, contractions, digit
    /// runs, punctuation with `/`), tokenized by `llama-tokenize` into
    /// `tests/fixtures/gpt4o/expected.json`. No real o200k vocabulary is available offline:
    /// this checks the split, not o200k's merges. Under Qwen2's profile the digit runs split
    /// otherwise.
    #[test]
    fn gpt4o_pre_tokenizer_tokenizes_like_llama_cpp() {
        let (expected, content) = assert_fixture_ids("gpt4o", 16);
        let qwen2 = with_pre(&content, "qwen2");
        assert_other_ids(&qwen2, &expected["cases"][4], "1234567 12 345");
    }

    /// The `qwen35` pre-tokenizer (Qwen3.5/3.6) gives llama.cpp's ids: a vocab-only GGUF whose
    /// merges join a letter and the combining marks after it (decomposed accents, Devanagari,
    /// Thai, Arabic, Hebrew), which Qwen2's profile splits, and would join across the splits
    /// both make; tokenized by `llama-tokenize` into `tests/fixtures/qwen35/expected.json`.
    /// This checks the split, not Qwen3.5's merges. Under Qwen2's profile the combining accent
    /// is split off its letter.
    #[test]
    fn qwen35_pre_tokenizer_tokenizes_like_llama_cpp() {
        let (expected, content) = assert_fixture_ids("qwen35", 13);
        let qwen2 = with_pre(&content, "qwen2");
        assert_other_ids(&qwen2, &expected["cases"][1], "cafe\u{301} cafe\u{301}");
    }

    /// The `tekken` pre-tokenizer (Mistral Nemo, Mistral Small 3.x, Ministral 3, Magistral,
    /// Devstral) gives llama.cpp's ids: a vocab-only GGUF with Mistral's control tokens first,
    /// merges that would join across the splits tekken must make, and whole words no merge
    /// builds, tokenized by `llama-tokenize` into `tests/fixtures/tekken/expected.json` (57
    /// texts: case changes, contractions, digits, punctuation with `/` and newlines, whitespace
    /// runs, accented, Greek, Cyrillic and CJK letters, combining marks, other scripts' digits,
    /// emoji, Unicode whitespace, letters newer than llama.cpp's Unicode tables, the control
    /// tokens as Mistral's templates write them). This checks the split, ignore_merges and the
    /// special tokens; Mistral's own vocabulary and merges, too large to commit, are checked by
    /// the ignored `tekken_real_vocabulary_tokenizes_like_llama_cpp` (tests/it/tokenizer.rs).
    #[test]
    fn tekken_pre_tokenizer_tokenizes_like_llama_cpp() {
        use crate::text::message::Message;
        let (expected, content) = assert_fixture_ids("tekken", 57);
        let cases = expected["cases"].as_array().unwrap();
        let case = |text: &str| cases.iter().find(|c| c["text"] == text).unwrap();
        // o200k's profile keeps contractions and up to three digits together.
        let gpt4o = with_pre(&content, "gpt-4o");
        assert_other_ids(&gpt4o, case("don't DON'T I'm"), "don't DON'T I'm");
        assert_other_ids(&gpt4o, case("1234567 12 345"), "1234567 12 345");
        // Qwen2's profile splits these words alike but merges them: only ignore_merges finds
        // the whole words the vocabulary holds without a merge path.
        let tok = Tokenizer::from_gguf(&content).unwrap();
        let mistral = [1, tok.token_to_id("Mistral").unwrap()];
        assert_eq!(ids(case("Mistral Tekken"))[..2], mistral);
        let qwen2 = with_pre(&content, "qwen2");
        assert_other_ids(&qwen2, case("Mistral Tekken"), "Mistral Tekken");

        // The file does not say whether to add BOS: llama.cpp adds it for tekken, and honours
        // `add_bos_token = false` (`make_vocab.py` tokenized that too).
        assert!(tok.add_bos_token());
        assert!(ids(case("Hello World")).starts_with(&[1]));
        // The same vocabulary under Llama 3's and SmolLM3's pre-tokenizers, tokenized by
        // llama.cpp: one regex, but `llama-bpe` takes a whole word found in the vocabulary as
        // one token and adds BOS, `smaug-bpe` merges it and adds none.
        let texts: Vec<&str> = expected["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap())
            .collect();
        // llama.cpp's `dbrx` (Phi-4) is `smaug-bpe` under another name (one case of its
        // `tokenizer_pre` switch).
        for (pre, as_pre) in [
            ("llama-bpe", "llama-bpe"),
            ("smaug-bpe", "smaug-bpe"),
            ("dbrx", "smaug-bpe"),
        ] {
            let other = with_pre(&content, pre);
            let want = expected["other_pre"][as_pre].as_array().unwrap();
            assert_eq!(want.len(), texts.len());
            for (text, want) in texts.iter().zip(want) {
                let want: Vec<u32> = serde_json::from_value(want.clone()).unwrap();
                assert_eq!(other.encode(text).unwrap(), want, "{pre}: {text:?}");
            }
        }
        let (llama, smaug) = (
            with_pre(&content, "llama-bpe"),
            with_pre(&content, "smaug-bpe"),
        );
        assert_ne!(
            llama.encode("HelloWorld").unwrap(),
            smaug.encode("HelloWorld").unwrap()
        );
        // Without the key llama.cpp also adds BOS for its Llama 3 profile (Pixtral's name
        // included), and for no other here.
        for (pre, bos) in [
            ("llama-bpe", true),
            ("pixtral", true),
            ("smaug-bpe", false),
            ("dbrx", false),
            ("gpt2", false),
            ("qwen2", false),
        ] {
            assert_eq!(with_pre(&content, pre).add_bos_token(), bos, "{pre}");
        }
        let nobos = &expected["add_bos_token_false"];
        let said = with_key(&content, "tokenizer.ggml.add_bos_token", Value::Bool(false));
        assert_eq!(
            said.encode(nobos["text"].as_str().unwrap()).unwrap(),
            ids(nobos)
        );

        // Mistral Nemo's template writes `<s>` itself: the prompt gets one BOS, as llama.cpp's
        // chat path (which strips the template's BOS before tokenizing) gives it.
        let src = include_str!(
            "../../tests/fixtures/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja"
        );
        let t = crate::text::chat_template::ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let chat = [
            Message::user("Hi there"),
            Message::assistant("Hello!"),
            Message::user("Bonjour, ça va?"),
        ];
        let rendered = t.render(&chat, true).unwrap();
        let turns = "[INST]Hi there[/INST]Hello!</s>[INST]Bonjour, ça va?[/INST]";
        assert_eq!(rendered, format!("<s>{turns}"));
        assert_eq!(tok.encode(&rendered).unwrap(), ids(case(turns)));
        assert_eq!(t.stop_token_ids(&tok), [2]);
    }

    /// Gemma 4's vocabulary (`tokenizer.ggml.model = gemma4`) gives llama.cpp's ids: a
    /// vocab-only GGUF cut from the real Gemma 4 vocabulary (llama.cpp's
    /// `models/ggml-vocab-gemma-4.gguf`, see `tests/fixtures/gemma4/make_vocab.py`),
    /// tokenized by `llama-tokenize` into `tests/fixtures/gemma4/expected.json`: spaces as `▁`,
    /// whitespace runs, newline runs that are tokens, numbers, code, unicode, emoji, the chat
    /// turn markers as special tokens, and characters the vocabulary lacks as byte tokens.
    /// Every case decodes back to its text; BOS is added even where the file says not to, as
    /// llama.cpp does for Gemma 4.
    #[test]
    fn gemma4_vocabulary_tokenizes_like_llama_cpp() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gemma4");
        let tok = Tokenizer::from_gguf_file(&dir.join("vocab.gguf")).unwrap();
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let cases = expected["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 13);
        let bos = tok.bos_token_id().unwrap();
        assert_eq!(tok.bos_token(), "<bos>");
        let mut bytes = 0;
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
            let got = tok.encode(text).unwrap();
            assert_eq!(got, want, "{text:?}");
            assert_eq!(got[0], bos);
            assert_eq!(tok.decode(&got[1..]), text);
            bytes += got
                .iter()
                .filter(|&&id| tok.token_kind(id) == Some(TokenKind::Byte))
                .count();
        }
        assert!(bytes > 0, "no case falls back to byte tokens");
        let nl3 = tok.token_to_id("\n\n\n").unwrap();
        assert_eq!(tok.encode_plain("\n\n\n").unwrap(), [nl3]);
        let turn = tok.token_to_id("<|turn>").unwrap();
        assert_eq!(tok.token_kind(turn), Some(TokenKind::Control));
        assert_eq!(tok.encode_plain("<|turn>").unwrap(), [turn]);
        // A chat ends at the end of its turn, `<turn|>`, as well as at EOS.
        let src =
            std::fs::read_to_string(dir.join("../templates/google-gemma-4-31B-it.jinja")).unwrap();
        let t = crate::text::chat_template::ChatTemplate::new(src, "<bos>", "<eos>").unwrap();
        let mut stops = vec![tok.eos_token_id(), tok.token_to_id("<turn|>").unwrap()];
        stops.sort_unstable();
        assert_eq!(t.stop_token_ids(&tok), stops);

        let mut f = std::fs::File::open(dir.join("vocab.gguf")).unwrap();
        let mut content = Content::read(&mut f).unwrap();
        content
            .metadata
            .insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(false));
        let forced = Tokenizer::from_gguf(&content).unwrap();
        assert!(forced.add_bos_token());
        assert_eq!(
            forced.encode("Hello world").unwrap(),
            cases[0]["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect::<Vec<_>>()
        );
        content.metadata.insert(
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![Value::String("nospace".into())]),
        );
        let err = Tokenizer::from_gguf(&content).unwrap_err().to_string();
        assert!(err.contains("merge 0 `nospace` has no space"), "{err}");
    }

    /// The whole real Gemma 4 vocabulary against llama.cpp's own tokenizer test for it
    /// (`models/ggml-vocab-gemma-4.gguf` with its `.inp` texts and `.out` ids, 15 MB, not
    /// committed): run with `CANDOR_GEMMA4_VOCAB=<llama.cpp>/models/ggml-vocab-gemma-4.gguf
    /// cargo test --lib gemma4_real -- --ignored`.
    #[test]
    #[ignore = "needs llama.cpp's ggml-vocab-gemma-4.gguf (CANDOR_GEMMA4_VOCAB)"]
    fn gemma4_real_vocabulary_passes_llama_cpp_vocab_test() {
        let path = std::env::var("CANDOR_GEMMA4_VOCAB").expect("CANDOR_GEMMA4_VOCAB");
        let tok = Tokenizer::from_gguf_file(Path::new(&path)).unwrap();
        let inp = std::fs::read_to_string(format!("{path}.inp")).unwrap();
        let out = std::fs::read_to_string(format!("{path}.out")).unwrap();
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let ids: Vec<&str> = out.lines().collect();
        assert!(
            texts.len() >= ids.len() && ids.len() > 30,
            "{} {}",
            texts.len(),
            ids.len()
        );
        for (text, want) in texts.iter().zip(&ids) {
            let want: Vec<u32> = want
                .split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect();
            assert_eq!(tok.encode_plain(text).unwrap(), want, "{text:?}");
        }
        // The file's metadata is 26B-A4B's: Candor reads its geometry and its experts.
        use crate::model::arch::ModelConfig;
        use crate::model::gemma4::PerLayer;
        let mut f = std::fs::File::open(&path).unwrap();
        let mut content = Content::read(&mut f).unwrap();
        // A vocab-only file: the embedding the vocabulary size is read from, as the model's.
        content.tensor_infos.insert(
            "token_embd.weight".into(),
            candle_core::quantized::gguf_file::TensorInfo {
                ggml_dtype: candle_core::quantized::GgmlDType::F16,
                shape: (262144, 2816).into(),
                offset: 0,
            },
        );
        let c = ModelConfig::from_gguf(&content).unwrap();
        let moe = c.moe.expect("experts");
        assert_eq!((moe.experts, moe.used, moe.ffn_dim), (128, 8, 704));
        let p = PerLayer::from_gguf(&content, &c)
            .unwrap()
            .expect("per-layer geometry");
        assert_eq!((p.layers.len(), p.kv_layers, p.ple_dim), (30, 30, 0));
    }

    /// `tests/fixtures/deepseek_glm` (written by `make_vocab.py` there): a vocab-only GGUF
    /// with DeepSeek's and GLM's control tokens, merges that would join across the splits
    /// their pre-tokenizers make and whole words no merge builds, 62 texts (digit runs, CJK,
    /// kana, Hangul, punctuation and symbols before letters, accents and combining marks,
    /// scripts outside DeepSeek-LLM's letter list, emoji, newlines, whitespace that is not
    /// ASCII, code, the chat templates' control tokens), and llama-tokenize's ids for each text
    /// under several runs: the same vocabulary with `tokenizer.ggml.pre`, the BOS id and
    /// `add_bos_token` set as the run says. Returns the file's metadata, the texts and the runs.
    fn deepseek_glm_fixture() -> (Content, Vec<String>, Vec<serde_json::Value>) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/deepseek_glm");
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let texts: Vec<String> = serde_json::from_value(expected["texts"].clone()).unwrap();
        assert_eq!(texts.len(), 62);
        let runs = expected["runs"].as_array().unwrap().clone();
        let mut f = std::fs::File::open(dir.join("vocab.gguf")).unwrap();
        (Content::read(&mut f).unwrap(), texts, runs)
    }

    /// The tokenizer of a fixture run: the vocabulary under `pre`, with the run's BOS and
    /// `add_bos_token` (absent when null).
    fn run_tokenizer(content: &Content, run: &serde_json::Value, pre: &str) -> Tokenizer {
        let mut metadata = content.metadata.clone();
        metadata.insert("tokenizer.ggml.pre".into(), Value::String(pre.into()));
        let probe = Tokenizer::from_gguf(content).unwrap();
        let bos = probe.token_to_id(run["bos"].as_str().unwrap()).unwrap();
        metadata.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(bos));
        match run["add_bos_token"].as_bool() {
            Some(b) => {
                metadata.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(b));
            }
            None => {
                metadata.remove("tokenizer.ggml.add_bos_token");
            }
        }
        Tokenizer::from_gguf(&Content {
            magic: candle_core::quantized::gguf_file::VersionedMagic::GgufV3,
            metadata,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        })
        .unwrap()
    }

    /// Every run of `pre` in the fixture gives llama-tokenize's ids for every text, and each
    /// text decodes back to itself (llama.cpp's `clean_spaces` is off for DeepSeek's profiles:
    /// its detokenizer, like ours, only joins the pieces). One deliberate difference: a text
    /// that starts with BOS where BOS is added gets a second one from llama-tokenize, none from
    /// [`Tokenizer::encode`] (as llama.cpp's chat path, which strips the template's BOS).
    /// Returns the runs of `pre`.
    fn assert_runs(pre: &str) -> Vec<serde_json::Value> {
        let (content, texts, runs) = deepseek_glm_fixture();
        let runs: Vec<serde_json::Value> = runs.into_iter().filter(|r| r["pre"] == pre).collect();
        assert!(!runs.is_empty(), "{pre}");
        let mut doubled = 0;
        for run in &runs {
            let tok = run_tokenizer(&content, run, pre);
            let bos = tok.bos_token_id().unwrap();
            let want: Vec<Vec<u32>> = serde_json::from_value(run["ids"].clone()).unwrap();
            for (text, want) in texts.iter().zip(&want) {
                let got = tok.encode(text).unwrap();
                if want.len() >= 2 && want[0] == bos && want[1] == bos {
                    assert_eq!(got, want[1..], "{pre} {}: {text:?}", run["add_bos_token"]);
                    doubled += 1;
                } else {
                    assert_eq!(&got, want, "{pre} {}: {text:?}", run["add_bos_token"]);
                }
                let plain = tok.encode_plain(text).unwrap();
                assert_eq!(tok.decode(&plain), *text, "{pre}");
            }
        }
        assert!(doubled <= 1, "{pre}: {doubled} texts with two BOS");
        runs
    }

    /// The texts of the fixture whose ids (BOS left out) `wrong` gets otherwise than `run`.
    /// Under the `pre` profile, the fixture run `plain`'s `text` comes out otherwise.
    fn assert_disagrees_on(content: &Content, plain: &serde_json::Value, pre: &str, text: &str) {
        let differ = disagreements(&run_tokenizer(content, plain, pre), plain);
        assert!(differ.iter().any(|t| t == text), "{pre}: {differ:?}");
    }

    fn disagreements(wrong: &Tokenizer, run: &serde_json::Value) -> Vec<String> {
        let (_, texts, _) = deepseek_glm_fixture();
        let want: Vec<Vec<u32>> = serde_json::from_value(run["ids"].clone()).unwrap();
        assert_eq!(run["add_bos_token"], serde_json::Value::Null);
        texts
            .into_iter()
            .zip(want)
            .filter(|(text, want)| wrong.encode_plain(text).unwrap() != *want)
            .map(|(text, _)| text)
            .collect()
    }

    /// The `deepseek-v3` pre-tokenizer (DeepSeek-V3, V3.1, R1) gives llama.cpp's ids, with and
    /// without `add_bos_token`; under its neighbours' profiles the fixture's texts split
    /// otherwise.
    #[test]
    fn deepseek_v3_pre_tokenizer_tokenizes_like_llama_cpp() {
        assert_deepseek_profile(
            "deepseek-v3",
            &[
                // Llama 3's letter runs take any punctuation before them, and not combining marks.
                ("llama-bpe", "!héllo (test) [x] {y}"),
                ("glm4", "«bonjour» “quoted” ‘single’"),
                ("qwen2", "1 12 123 1234 1234567"),
                // Qwen3.5's letter runs take the marks, but also a symbol before them.
                ("qwen35", "€uro +x -y ~z"),
                ("deepseek-llm", "1 12 123 1234 1234567"),
                // Tekken's letter runs split at case changes and leave out combining marks.
                ("tekken", "cafe\u{301} e\u{301}\u{301}x ñ vs n\u{303}"),
            ],
        );
    }

    /// A DeepSeek profile's two runs (without and with `add_bos_token`): BOS only where the file
    /// says so, and under each neighbour profile its text comes out otherwise.
    fn assert_deepseek_profile(pre: &str, neighbours: &[(&str, &str)]) {
        let runs = assert_runs(pre);
        assert_eq!(runs.len(), 2);
        let (content, _, _) = deepseek_glm_fixture();
        let plain = &runs[0];
        assert!(!run_tokenizer(&content, plain, pre).add_bos_token());
        assert!(run_tokenizer(&content, &runs[1], pre).add_bos_token());
        for (other, text) in neighbours {
            assert_disagrees_on(&content, plain, other, text);
        }
    }

    /// The `deepseek-llm` pre-tokenizer (DeepSeek-V2, V2-Lite) gives llama.cpp's ids, with and
    /// without `add_bos_token`; under its neighbours' profiles the fixture's texts split
    /// otherwise.
    #[test]
    fn deepseek_llm_pre_tokenizer_tokenizes_like_llama_cpp() {
        assert_deepseek_profile(
            "deepseek-llm",
            &[
                // Whole digit runs, newlines one by one, symbols from U+0800 on in CJK's run.
                ("deepseek-v3", "1 12 123 1234 1234567"),
                ("deepseek-v3", "a\n\nb"),
                ("llama-bpe", "❤❤ ☺ →"),
                ("gpt2", "中文 日本語のテキスト ひらがな カタカナ"),
                ("default", "ƻa aƻ ʔ ʰa"),
            ],
        );
    }

    /// The `glm4` and `glm5` pre-tokenizers (GLM-4.5 to 4.7, GLM-5) give llama.cpp's ids: Llama
    /// 3's split, whole words found in the vocabulary taken as one token, and BOS (`[gMASK]`)
    /// only where the file says `add_bos_token`. Under `smaug-bpe` (merges applied) the whole
    /// words come out otherwise; under `llama-bpe` BOS is added.
    #[test]
    fn glm4_pre_tokenizer_tokenizes_like_llama_cpp() {
        let runs = assert_runs("glm4");
        assert_eq!(runs.len(), 2);
        assert_eq!(assert_runs("glm5").len(), 1);
        let (content, texts, _) = deepseek_glm_fixture();
        let plain = &runs[0];
        let glm = run_tokenizer(&content, plain, "glm4");
        assert!(!glm.add_bos_token());
        assert!(run_tokenizer(&content, &runs[1], "glm4").add_bos_token());
        // `Ġ` is the space in the vocabulary's byte alphabet.
        let whole = glm.token_to_id("\u{120}Zhipu").unwrap();
        let i = texts.iter().position(|t| t == "GLM Zhipu 你好").unwrap();
        let want: Vec<u32> = serde_json::from_value(plain["ids"][i].clone()).unwrap();
        assert!(want.contains(&whole), "{want:?}");
        let smaug = run_tokenizer(&content, plain, "smaug-bpe");
        let differ = disagreements(&smaug, plain);
        assert!(differ.iter().any(|t| t == "GLM Zhipu 你好"), "{differ:?}");
        // Llama 3's profile splits and merges alike, but adds BOS when the file is silent.
        let llama = run_tokenizer(&content, plain, "llama-bpe");
        assert!(disagreements(&llama, plain).is_empty());
        assert!(llama.add_bos_token());
        assert_ne!(
            llama.encode(&texts[0]).unwrap(),
            glm.encode(&texts[0]).unwrap()
        );
    }

    /// Whole vocabularies against llama.cpp's tokenizer tests: each GGUF named in
    /// `CANDOR_LLAMA_VOCAB_TESTS` (colon-separated) with its `.inp` texts and `.out` ids beside
    /// it, in the layout of llama.cpp's `models/ggml-vocab-*.gguf` tests (ids without BOS), e.g.
    /// `models/ggml-vocab-deepseek-llm.gguf` (4 MB, not committed), or llama-bpe's vocabulary
    /// rewritten with `tokenizer.ggml.pre = deepseek-v3` or `glm4` and its texts tokenized by
    /// `llama-tokenize --no-bos`. Run with `cargo test --lib llama_cpp_vocab_tests -- --ignored`.
    #[test]
    #[ignore = "needs llama.cpp vocabulary tests (CANDOR_LLAMA_VOCAB_TESTS)"]
    fn llama_cpp_vocab_tests_pass() {
        let paths = std::env::var("CANDOR_LLAMA_VOCAB_TESTS").expect("CANDOR_LLAMA_VOCAB_TESTS");
        for path in paths.split(':') {
            let tok = Tokenizer::from_gguf_file(Path::new(path)).unwrap();
            let inp = std::fs::read_to_string(format!("{path}.inp")).unwrap();
            let out = std::fs::read_to_string(format!("{path}.out")).unwrap();
            let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
            let ids: Vec<&str> = out.lines().collect();
            assert!(texts.len() >= ids.len() && ids.len() > 30, "{path}");
            let mut bad = Vec::new();
            for (text, want) in texts.iter().zip(&ids) {
                let want: Vec<u32> = want
                    .split_whitespace()
                    .map(|t| t.parse().unwrap())
                    .collect();
                if tok.encode_plain(text).unwrap() != want {
                    bad.push(*text);
                }
            }
            assert!(
                bad.is_empty(),
                "{path}: {} of {} differ: {bad:?}",
                bad.len(),
                ids.len()
            );
        }
    }

    #[test]
    fn unknown_pre_tokenizer_is_named() {
        let err = Tokenizer::from_gguf(&content(Some("qwen9"), false)).unwrap_err();
        assert!(matches!(err, TextError::UnsupportedPreTokenizer(ref p) if p == "qwen9"));
        assert!(err.to_string().contains("qwen9"));
    }

    #[test]
    fn bos_added_once() {
        let t = Tokenizer::from_gguf(&content(Some("smollm"), true)).unwrap();
        assert_eq!(t.encode("hello").unwrap(), vec![3, merged(3)]);
        assert_eq!(t.encode("<s>hello").unwrap(), vec![3, merged(3)]);
        assert_eq!(t.encode_plain("hello").unwrap(), vec![merged(3)]);
        assert!(t.add_bos_token());
        assert_eq!(t.bos_token(), "<s>");
        assert_eq!(t.eos_token(), "<|im_end|>");
    }

    #[test]
    fn decode_round_trips_bytes() {
        let t = tok(Some("smollm"));
        let text = "<|im_start|>héllo 😀\n\n42<|im_end|>";
        let ids = t.encode(text).unwrap();
        assert_eq!(t.decode(&ids), text);
        assert_eq!(t.decode_skip_special(&ids), "héllo 😀\n\n42");
        // "é" is two byte tokens: each alone is not text, both together are.
        let e = t.encode("é").unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(t.token_bytes(e[0]), Some(&[0xC3u8][..]));
        assert_eq!(t.token_to_piece(e[0]), "\u{FFFD}");
        assert_eq!(t.decode(&e), "é");
        assert_eq!(t.decode(&[99_999]), "");
    }

    #[test]
    fn sha256_depends_on_definition() {
        let a = tok(Some("smollm"));
        let b = tok(Some("gpt2"));
        assert_eq!(a.sha256(), tok(Some("smollm")).sha256());
        assert_ne!(a.sha256(), b.sha256());
        assert_eq!(a.sha256().len(), 64);
    }

    /// The synthetic vocabulary as a Hugging Face tokenizer.json + tokenizer_config.json.
    fn write_tokenizer_json(dir: &Path, add_bos: bool) -> std::path::PathBuf {
        let c = content(Some("smollm"), false);
        let Value::Array(tokens) = &c.metadata["tokenizer.ggml.tokens"] else {
            unreachable!()
        };
        let mut vocab = serde_json::Map::new();
        let mut added = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            let t = t.to_string().unwrap().clone();
            if i < 4 {
                added.push(
                    serde_json::json!({"id": i, "content": t, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false, "special": true}),
                );
            }
            vocab.insert(t, serde_json::json!(i));
        }
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added, "normalizer": null,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
            ]},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": super::testutil::MERGES}
        });
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        let config = serde_json::json!({"bos_token": "<s>", "eos_token": {"content": "<|im_end|>"},
            "add_bos_token": add_bos});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        path
    }

    #[test]
    fn tokenizer_json_matches_gguf_build() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_tokenizer_json(dir.path(), false);
        let from_json = Tokenizer::from_tokenizer_json(&path).unwrap();
        let from_gguf = tok(Some("smollm"));
        for text in [
            "hello world",
            "<|im_start|>user\n\n5 héllo 12<|im_end|>",
            "  a\t\tb  ",
            "",
        ] {
            let ids = from_json.encode(text).unwrap();
            assert_eq!(ids, from_gguf.encode(text).unwrap(), "{text:?}");
            assert_eq!(from_json.decode(&ids), text);
        }
        assert_eq!(from_json.eos_token_id(), 2);
        assert_eq!(from_json.bos_token_id(), Some(3));
        assert!(!from_json.add_bos_token());
        assert_eq!(from_json.token_kind(1), Some(TokenKind::Control));
        assert_eq!(from_json.vocab_size(), from_gguf.vocab_size());

        let path = write_tokenizer_json(dir.path(), true);
        let with_bos = Tokenizer::from_tokenizer_json(&path).unwrap();
        assert_eq!(with_bos.encode("hello").unwrap(), vec![3, merged(3)]);
        assert_ne!(with_bos.sha256(), from_json.sha256());
    }

    #[test]
    fn bad_metadata_is_a_typed_error() {
        let mut c = content(Some("smollm"), false);
        c.metadata.remove("tokenizer.ggml.eos_token_id");
        let err = Tokenizer::from_gguf(&c).unwrap_err().to_string();
        assert!(err.contains("tokenizer.ggml.eos_token_id"), "{err}");
        let mut c = content(Some("smollm"), false);
        c.metadata
            .insert("tokenizer.ggml.model".into(), Value::String("bert".into()));
        let err = Tokenizer::from_gguf(&c).unwrap_err().to_string();
        assert!(err.contains("bert"), "{err}");
    }
}
