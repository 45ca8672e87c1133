//! `candor serve`: the engine behind OpenAI-compatible HTTP endpoints (`/v1/chat/completions`,
//! plain and streamed, `/v1/completions`, `/v1/models`), on tokio and axum.
//!
//! Each served model has one engine on a thread of its own ([`worker`]) running the same
//! scheduler as every other command: continuous batching, prefix cache, constrained decoding.
//! The determinism contract holds over HTTP: a request's tokens depend on the request alone
//! (its prompt, sampling fields and seed), never on what else is in flight.
//!
//! The server holds up: errors are OpenAI-style JSON bodies with the status that fits
//! ([`error`]); keys are checked ([`auth`]); each model's queue is bounded (429 with
//! `Retry-After` when full); a client that goes away frees its slot; bodies are capped; the
//! caller's shutdown future drains what is in flight.
//!
//! - [`openai`]: request bodies and their checks.
//! - [`routes`]: the handlers and JSON replies.
//! - [`stream`]: server-sent events for `"stream": true`.

pub mod auth;
pub mod error;
pub mod openai;
pub mod reply;
pub mod routes;
pub mod state;
pub mod stream;
pub mod worker;

pub use state::{AppState, ServeOptions, ServedModel};

use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::Semaphore;

use crate::engine::{Engine, EngineError};

/// Errors of starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("model `{model}`: {msg}")]
    Load { model: String, msg: String },
    #[error("model `{0}` is given twice")]
    DuplicateModel(String),
    #[error("--queue must be at least 1")]
    EmptyQueue,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A model to load: its name and how to load it (on its engine's thread).
pub type Loader = Box<dyn FnOnce() -> Result<Engine, EngineError> + Send>;

/// The loaded models, ready to serve; [`Server::run`] serves them.
pub struct Server {
    state: Arc<AppState>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Loads every model, each on its own thread.
    pub fn load(
        models: Vec<(String, Loader)>,
        options: ServeOptions,
    ) -> Result<Server, ServeError> {
        if options.queue == 0 {
            return Err(ServeError::EmptyQueue);
        }
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut served = Vec::new();
        let mut threads = Vec::new();
        for (id, load) in models {
            if served.iter().any(|m: &ServedModel| m.id == id) {
                return Err(ServeError::DuplicateModel(id));
            }
            let w = worker::spawn(&id, load).map_err(|msg| ServeError::Load {
                model: id.clone(),
                msg,
            })?;
            threads.push(w.thread);
            served.push(ServedModel {
                id,
                created,
                jobs: Mutex::new(w.jobs),
                context_len: w.context_len,
                permits: Arc::new(Semaphore::new(options.queue)),
                capacity: options.queue,
                live: w.live,
                drafts: w.drafts,
            });
        }
        Ok(Server {
            state: Arc::new(AppState {
                models: served,
                options,
            }),
            threads,
        })
    }

    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// The routes over this server's models.
    pub fn router(&self) -> Router {
        router(Arc::clone(&self.state))
    }

    /// Serves on `listener` until `shutdown` completes, then stops accepting, lets the requests
    /// in flight finish (streams included), and joins the engines' threads.
    pub async fn run(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let app = self.router();
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await?;
        let Server { state, threads } = self;
        drop(state);
        for t in threads {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        Ok(())
    }
}

/// The server's routes: `/v1/*` behind the key (when one is set), `/health` open.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/models", get(routes::list_models))
        .route("/v1/models/{id}", get(routes::get_model))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::require_key,
        ));
    Router::new()
        .merge(v1)
        .route("/health", get(routes::health))
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(state.options.max_body_bytes))
        .with_state(state)
}
