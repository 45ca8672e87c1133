//! The HTTP handlers: parse and check a request, hand its choices to the model's engine
//! thread, and answer with OpenAI's JSON (or, streamed, [`super::stream`]'s events).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc::unbounded_channel;

use super::error::ApiError;
use super::openai::{parse_body, ChatCompletionRequest, CompletionRequest, Plan};
use super::reply::{
    chat_logprobs, completion_logprobs, finish_reason, usage, Endpoint, Running, FINGERPRINT,
};
use super::worker::{Event, Finished, Job, Prompt};
use super::{stream, AppState, ServedModel};

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn response_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{:x}{:06x}",
        now(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The body, or a 413 / 400 that says why not.
fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rej| {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(state.options.max_body_bytes)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {}", rej.body_text()))
        }
    })
}

/// Takes queue places for every choice of every prompt and hands the choices to the engine;
/// returns once each is checked and queued (or the first refusal).
async fn start(
    model: &ServedModel,
    prompts: Vec<Prompt>,
    plan: &Plan,
    endpoint: Endpoint,
) -> Result<Running, ApiError> {
    let choices = prompts.len() * plan.n;
    let permit = Arc::clone(&model.permits)
        .try_acquire_many_owned(choices as u32)
        .map_err(|_| ApiError::queue_full(&model.id, model.queue_capacity(), 1))?;
    let (tx, mut rx) = unbounded_channel();
    for (p, prompt) in prompts.iter().enumerate() {
        for j in 0..plan.n {
            model.send(Job {
                prompt: prompt.clone(),
                params: plan.choice_params(j),
                max_tokens: plan.max_tokens,
                logprobs: plan.logprobs,
                stream: plan.stream,
                choice: p * plan.n + j,
                draft_tokens: plan.draft_tokens,
                events: tx.clone(),
            })?;
        }
    }
    drop(tx);
    let mut started = 0;
    let mut prompt_tokens = 0;
    let mut early = Vec::new();
    while started < choices {
        match rx.recv().await {
            Some((i, Event::Started { prompt_tokens: t })) => {
                started += 1;
                if i % plan.n == 0 {
                    prompt_tokens += t;
                }
            }
            Some((_, Event::Failed(e))) => return Err(e),
            Some(other) => early.push(other),
            None => return Err(ApiError::internal("the engine dropped the request")),
        }
    }
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    Ok(Running {
        rx,
        permit,
        prompt_tokens,
        choices,
        early,
        id: response_id(prefix),
        created: now(),
        model: model.id.clone(),
        endpoint,
        include_usage: plan.include_usage,
    })
}

/// Waits for every choice and answers with one JSON body.
async fn collect(mut run: Running) -> Result<Response, ApiError> {
    let mut done: Vec<Option<Finished>> = vec![None; run.choices];
    let mut left = run.choices;
    let mut early = std::mem::take(&mut run.early).into_iter();
    while left > 0 {
        let event = match early.next() {
            Some(e) => Some(e),
            None => run.rx.recv().await,
        };
        match event {
            Some((i, Event::Done(f))) => {
                if done[i].replace(f).is_none() {
                    left -= 1;
                }
            }
            Some((_, Event::Failed(e))) => return Err(e),
            Some(_) => {}
            None => return Err(ApiError::internal("the engine dropped the request")),
        }
    }
    let done: Vec<Finished> = done.into_iter().flatten().collect();
    let completion_tokens: usize = done.iter().map(|f| f.output_ids.len()).sum();
    let choices: Vec<Value> = done
        .iter()
        .enumerate()
        .map(|(i, f)| match run.endpoint {
            Endpoint::Chat => json!({
                "index": i,
                "message": message(f),
                "logprobs": f.logprobs.as_deref().map(chat_logprobs),
                "finish_reason": finish_reason(f.stop_reason),
            }),
            Endpoint::Completions => json!({
                "index": i,
                "text": f.text,
                "logprobs": f.logprobs.as_deref().map(|l| completion_logprobs(l, 0)),
                "finish_reason": finish_reason(f.stop_reason),
            }),
        })
        .collect();
    let object = match run.endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Completions => "text_completion",
    };
    let body = json!({
        "id": run.id,
        "object": object,
        "created": run.created,
        "model": run.model,
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
        "usage": usage(run.prompt_tokens, completion_tokens),
    });
    drop(run.permit);
    Ok(Json(body).into_response())
}

async fn answer(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let value = parse_body(&body)?;
    let (model_id, prompts, plan) = match endpoint {
        Endpoint::Chat => {
            let req = ChatCompletionRequest::from_body(&value)?;
            state.model(&req.model)?;
            let (messages, plan) = req.plan()?;
            let args = req.template_args()?;
            (req.model, vec![Prompt::Chat(messages, args)], plan)
        }
        Endpoint::Completions => {
            let req = CompletionRequest::from_body(&value)?;
            state.model(&req.model)?;
            let (prompts, plan) = req.plan()?;
            let prompts = prompts.into_iter().map(Prompt::Text).collect();
            (req.model, prompts, plan)
        }
    };
    let model = state.model(&model_id)?;
    let choices = prompts.len() * plan.n;
    if choices > model.queue_capacity() {
        return Err(ApiError::invalid_param(
            "n",
            format!(
                "the request asks for {choices} sequences; this server's queue holds {}",
                model.queue_capacity()
            ),
        ));
    }
    let stream = plan.stream;
    let run = start(model, prompts, &plan, endpoint).await?;
    if stream {
        Ok(stream::response(run))
    } else {
        collect(run).await
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(state, body, Endpoint::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(state, body, Endpoint::Completions)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn model_json(m: &ServedModel) -> Value {
    json!({
        "id": m.id,
        "object": "model",
        "created": m.created,
        "owned_by": "candor",
        "context_length": m.context_len,
    })
}

/// `GET /v1/models`.
pub async fn list_models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<Value> = state.models.iter().map(model_json).collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`.
pub async fn get_model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.model(&id) {
        Ok(m) => Json(model_json(m)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /health`: each model's sequences in flight (queued or decoding).
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let models: Vec<Value> = state
        .models
        .iter()
        .map(|m| {
            let mut v = json!({"id": m.id, "in_flight": m.live(), "queue": m.queue_capacity()});
            if let Some(d) = m.drafts() {
                v["drafts"] = json!({
                    "verify_steps": d.verify_steps,
                    "drafted": d.drafted,
                    "accepted": d.accepted,
                    "acceptance_rate": d.acceptance_rate(),
                    "tokens_per_verify_step": d.tokens_per_step(),
                    "steps_without_drafts_for_batch_size": d.skipped_steps,
                });
            }
            v
        })
        .collect();
    Json(json!({"status": "ok", "models": models})).into_response()
}

/// Any other path.
pub async fn not_found(uri: Uri) -> Response {
    ApiError::not_found(format!(
        "no route {}: this server answers /v1/chat/completions, /v1/completions, /v1/models \
         and /health",
        uri.path()
    ))
    .into_response()
}

/// A finished chat choice's message: the answer as `content`, a thinking model's reasoning
/// as `reasoning_content` (as vLLM and llama.cpp's server return it).
fn message(f: &Finished) -> Value {
    let mut m = json!({"role": "assistant", "content": f.text});
    if let Some(r) = &f.reasoning {
        m["reasoning_content"] = json!(r);
    }
    m
}
