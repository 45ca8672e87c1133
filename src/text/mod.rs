//! Text: the tokenizer (byte-level BPE with its pre-tokenizers, SentencePiece, Gemma 4's
//! SentencePiece-style BPE), chat messages
//! and the model's chat template with its size checks.
//!
//! Turns messages into prompt tokens and tokens back into text; knows no weights and no kernel.

pub mod chat_template;
pub mod error;
pub mod message;
pub mod pre_tokenizer;
pub mod reasoning;
pub mod spm;
pub mod spm_bpe;
pub mod template_date;
pub mod template_size;
pub mod tokenizer;
