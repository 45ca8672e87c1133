//! The engine layer's error ([`EngineError`]); the model's errors pass through it.

use super::kv::SeqId;
use crate::model::ModelError;
use crate::text::error::TextError;
use crate::weights::error::WeightsError;

/// Errors of the engine layer.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("request {index}: empty prompt")]
    EmptyPrompt { index: usize },
    #[error("token id {id} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("prefix of {len} tokens does not fit the context of {context}")]
    PrefixTooLong { len: usize, context: usize },
    #[error("unknown sequence {0:?}")]
    UnknownSequence(SeqId),
    #[error("request {index}: constraint: {msg}")]
    Constraint { index: usize, msg: String },
    /// A device's KV pool cannot hold the positions of a step even after the prefix cache gave
    /// its blocks back (the scheduler first makes requests wait for running ones to finish).
    #[error(
        "the device's KV cache is full: {want} more blocks needed, {free} free (lower \
         --batch-size or --kv-cache-mb, or shorten the prompts)"
    )]
    KvFull { want: usize, free: usize },
    /// A draft model whose vocabulary is not the model's (its drafts could not be verified).
    #[error("the draft model's vocabulary differs from the model's: {0}")]
    DraftVocabulary(String),
    /// Drafts on a model whose sequences cannot be rolled back (a recurrent state).
    #[error("{0}")]
    DraftsRefused(String),
    #[error("internal engine error: {0}")]
    Internal(String),
}

impl From<TextError> for EngineError {
    fn from(e: TextError) -> Self {
        EngineError::Model(e.into())
    }
}

impl From<WeightsError> for EngineError {
    fn from(e: WeightsError) -> Self {
        EngineError::Model(e.into())
    }
}
