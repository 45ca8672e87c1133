//! What every request handler shares: the server's options and the served models, each with
//! its engine's thread and its queue places.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::{error, worker};

/// How the server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// Required as `Authorization: Bearer KEY` on `/v1/*` when set.
    pub api_key: Option<String>,
    /// Most sequences (choices) per model waiting or decoding; more are refused with 429.
    pub queue: usize,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            api_key: None,
            queue: 256,
            max_body_bytes: 4 << 20,
        }
    }
}

/// A served model: its name in requests and its engine's thread.
pub struct ServedModel {
    pub id: String,
    pub created: u64,
    pub(super) jobs: Mutex<std::sync::mpsc::Sender<worker::Job>>,
    pub context_len: usize,
    /// Sequences admitted (one permit each) and not yet answered.
    pub(super) permits: Arc<Semaphore>,
    pub(super) capacity: usize,
    pub(super) live: Arc<std::sync::atomic::AtomicUsize>,
    pub(super) drafts: Arc<std::sync::Mutex<Option<crate::engine::DraftStats>>>,
}

impl ServedModel {
    /// Most sequences waiting or decoding at once (`--queue`).
    pub fn queue_capacity(&self) -> usize {
        self.capacity
    }

    /// The model's speculative drafts so far, when it drafts: drafted and accepted tokens,
    /// verify steps.
    pub fn drafts(&self) -> Option<crate::engine::DraftStats> {
        self.drafts.lock().ok().and_then(|d| *d)
    }

    /// Sequences started and not finished, as the engine's thread last counted.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    pub(super) fn send(&self, job: worker::Job) -> Result<(), error::ApiError> {
        let jobs = self
            .jobs
            .lock()
            .map_err(|_| error::ApiError::internal("the job queue's lock is poisoned"))?;
        jobs.send(job).map_err(|_| {
            error::ApiError::unavailable(format!("the engine of model `{}` has stopped", self.id))
        })
    }
}

/// What every handler shares.
pub struct AppState {
    pub models: Vec<ServedModel>,
    pub options: ServeOptions,
}

impl AppState {
    pub fn model(&self, id: &str) -> Result<&ServedModel, error::ApiError> {
        self.models.iter().find(|m| m.id == id).ok_or_else(|| {
            let ids: Vec<String> = self.models.iter().map(|m| m.id.clone()).collect();
            error::ApiError::model_not_found(id, &ids)
        })
    }
}
