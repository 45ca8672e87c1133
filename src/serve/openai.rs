//! The OpenAI request bodies `candor serve` takes, and their checks: each turns into the
//! engine's [`SamplingParams`] (one per choice) or a 400 naming the field at fault.
//!
//! Fields this server does not know are ignored (clients send many); a known field of the
//! wrong type, or a value outside its range, is an error. Parameters that would change
//! tokens and that the engine does not implement (penalties, `logit_bias`, tools) are refused
//! rather than ignored, so a client never gets silently different sampling.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::engine::{Constraint, SamplingParams};
use crate::text::chat_template::TemplateArgs;
use crate::text::message::{Message, Role};

/// Most choices (`n`) one request may ask for.
pub const MAX_N: usize = 16;
/// Most alternatives per token (`top_logprobs`), as OpenAI allows.
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most stop strings, as OpenAI allows.
pub const MAX_STOPS: usize = 4;

/// Parses a request body: malformed JSON and wrongly typed fields are 400s that say where.
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

/// Reads a request (or its sampling fields) from a parsed body.
pub fn typed<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid_param(&path, format!("invalid `{path}`: {inner}"))
        }
    })
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// The sampling fields `/v1/chat/completions` and `/v1/completions` share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub max_tokens: Option<u64>,
    pub stop: Option<Value>,
    pub n: Option<u64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Most tokens drafted per verify step for this request (llama.cpp server's name); 0:
    /// none. Only the speed changes: the tokens are those without drafts.
    #[serde(rename = "speculative.n_max")]
    pub speculative_n_max: Option<u64>,
}

/// A `/v1/chat/completions` body.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<Value>,
    #[serde(skip)]
    pub sampling: Sampling,
    /// The newer name of `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    pub response_format: Option<Value>,
    pub tools: Option<Value>,
    pub functions: Option<Value>,
    /// Extra chat-template variables (`enable_thinking`, `reasoning_effort`, …), as vLLM and
    /// llama.cpp's server take them.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// A reasoning model's effort (`low`, `medium`, `high`), passed to the template as
    /// `reasoning_effort` unless `chat_template_kwargs` sets it.
    pub reasoning_effort: Option<String>,
}

/// A `/v1/completions` body.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Value,
    #[serde(skip)]
    pub sampling: Sampling,
    /// Here a number: how many alternatives per token (0 to 5).
    pub logprobs: Option<u64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
}

/// What a request asks of the engine, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The first choice's params; choice `i` samples with seed `seed + i`.
    pub params: SamplingParams,
    /// `None`: as many as the context leaves after the prompt.
    pub max_tokens: Option<usize>,
    pub n: usize,
    /// Alternatives per token when log-probabilities are asked for.
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    /// `speculative.n_max`: this request's draft length, in place of the server's.
    pub draft_tokens: Option<usize>,
}

impl Plan {
    /// Choice `i`'s sampling parameters.
    pub fn choice_params(&self, i: usize) -> SamplingParams {
        SamplingParams {
            seed: self.params.seed.wrapping_add(i as u64),
            ..self.params.clone()
        }
    }
}

fn refuse_if(set: bool, param: &str, what: &str) -> Result<(), ApiError> {
    if set {
        return Err(ApiError::invalid_param(
            param,
            format!("`{param}` is not supported by this server ({what})"),
        ));
    }
    Ok(())
}

impl Sampling {
    /// The checked plan; `default_max` is the endpoint's `max_tokens` when none is given.
    fn plan(&self, default_max: Option<usize>) -> Result<Plan, ApiError> {
        let temperature = self.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && (0.0..=2.0).contains(&temperature)) {
            return Err(ApiError::invalid_param(
                "temperature",
                format!("`temperature` must be between 0 and 2, got {temperature}"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid_param(
                "top_p",
                format!("`top_p` must be in (0, 1], got {top_p}"),
            ));
        }
        let n = self.n.unwrap_or(1);
        if n == 0 || n > MAX_N as u64 {
            return Err(ApiError::invalid_param(
                "n",
                format!("`n` must be between 1 and {MAX_N}, got {n}"),
            ));
        }
        let max_tokens = match self.max_tokens {
            Some(0) => {
                return Err(ApiError::invalid_param(
                    "max_tokens",
                    "`max_tokens` must be at least 1",
                ))
            }
            Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
            None => default_max,
        };
        let nonzero = |v: Option<f32>| v.is_some_and(|x| x != 0.0);
        refuse_if(
            nonzero(self.frequency_penalty),
            "frequency_penalty",
            "only 0 is accepted",
        )?;
        refuse_if(
            nonzero(self.presence_penalty),
            "presence_penalty",
            "only 0 is accepted",
        )?;
        refuse_if(
            self.logit_bias.as_ref().is_some_and(|m| !m.is_empty()),
            "logit_bias",
            "only an empty map is accepted",
        )?;
        let stream = self.stream.unwrap_or(false);
        let include_usage = self
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        Ok(Plan {
            params: SamplingParams {
                temperature,
                top_p,
                // No seed: 0, so that sampling without one is reproducible too.
                seed: self.seed.unwrap_or(0) as u64,
                max_new_tokens: 0,
                stop_strings: stop_strings(self.stop.as_ref())?,
                constraint: None,
            },
            max_tokens,
            n: n as usize,
            logprobs: None,
            stream,
            include_usage,
            draft_tokens: self
                .speculative_n_max
                .map(|k| usize::try_from(k).unwrap_or(usize::MAX)),
        })
    }
}

/// `stop`: a string or an array of at most four strings.
fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = |msg: String| ApiError::invalid_param("stop", msg);
    let stops = match stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(bad(format!("`stop` entries must be strings, got {other}"))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(bad(format!(
                "`stop` must be a string or an array of strings, got {other}"
            )))
        }
    };
    if stops.len() > MAX_STOPS {
        return Err(bad(format!(
            "`stop` has {} strings; at most {MAX_STOPS} are allowed",
            stops.len()
        )));
    }
    if stops.iter().any(String::is_empty) {
        return Err(bad("`stop` strings must not be empty".into()));
    }
    Ok(stops)
}

/// A chat message's content: a string, or an array of `{"type": "text", "text": ...}` parts.
fn message(i: usize, v: &Value) -> Result<Message, ApiError> {
    let param = format!("messages[{i}]");
    let bad = |msg: String| ApiError::invalid_param(&param, format!("`{param}`: {msg}"));
    let obj = v
        .as_object()
        .ok_or_else(|| bad(format!("a message must be an object, got {v}")))?;
    let role = match obj.get("role").and_then(Value::as_str) {
        Some("system") | Some("developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some(other) => {
            return Err(bad(format!(
                "unsupported role `{other}` (system, developer, user or assistant)"
            )))
        }
        None => return Err(bad("missing `role` (a string)".into())),
    };
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(bad(format!(
                            "only text content parts are supported, got {p}"
                        )))
                    }
                }
            }
            text
        }
        Some(Value::Null) | None if role == Role::Assistant => String::new(),
        Some(other) => {
            return Err(bad(format!(
                "`content` must be a string or an array of text parts, got {other}"
            )))
        }
        None => return Err(bad("missing `content`".into())),
    };
    Ok(Message { role, content })
}

/// `response_format`: `text`, `json_object` (any JSON object) or `json_schema`.
fn response_format(v: Option<&Value>) -> Result<Option<Constraint>, ApiError> {
    let bad = |msg: String| ApiError::invalid_param("response_format", msg);
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonSchema(
            serde_json::json!({"type": "object"}),
        ))),
        Some("json_schema") => {
            let schema = v
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| s.is_object())
                .ok_or_else(|| {
                    bad("`response_format.json_schema.schema` must be a JSON schema object".into())
                })?;
            Ok(Some(Constraint::JsonSchema(schema.clone())))
        }
        Some(other) => Err(bad(format!(
            "unsupported `response_format.type` `{other}` (text, json_object or json_schema)"
        ))),
        None => Err(bad(format!(
            "`response_format` must be an object with a `type`, got {v}"
        ))),
    }
}

impl ChatCompletionRequest {
    /// Reads a parsed `/v1/chat/completions` body.
    pub fn from_body(body: &Value) -> Result<ChatCompletionRequest, ApiError> {
        let mut r: ChatCompletionRequest = typed(body)?;
        r.sampling = typed(body)?;
        Ok(r)
    }

    /// What the chat template is given beside the messages (the date is today's: a server has
    /// no run manifest).
    pub fn template_args(&self) -> Result<TemplateArgs, ApiError> {
        let mut kwargs: std::collections::BTreeMap<String, Value> = self
            .chat_template_kwargs
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        if let Some(effort) = &self.reasoning_effort {
            if !["minimal", "low", "medium", "high"].contains(&effort.as_str()) {
                return Err(ApiError::invalid_param(
                    "reasoning_effort",
                    format!(
                        "`reasoning_effort` must be minimal, low, medium or high, got {effort:?}"
                    ),
                ));
            }
            kwargs
                .entry("reasoning_effort".into())
                .or_insert_with(|| Value::from(effort.as_str()));
        }
        Ok(TemplateArgs { kwargs, date: None })
    }

    /// The conversation and the checked plan.
    pub fn plan(&self) -> Result<(Vec<Message>, Plan), ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::invalid_param(
                "messages",
                "`messages` must not be empty",
            ));
        }
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<Vec<_>, _>>()?;
        refuse_if(self.tools.is_some(), "tools", "no tool calling")?;
        refuse_if(self.functions.is_some(), "functions", "no function calling")?;
        let max = self.max_completion_tokens.or(self.sampling.max_tokens);
        let mut plan = Sampling {
            max_tokens: max,
            ..self.sampling.clone()
        }
        .plan(None)?;
        let top = self.top_logprobs.unwrap_or(0);
        if top > MAX_TOP_LOGPROBS as u64 {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {top}"),
            ));
        }
        match self.logprobs {
            Some(true) => plan.logprobs = Some(top as usize),
            _ if self.top_logprobs.is_some_and(|t| t > 0) => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs: true`",
                ))
            }
            _ => {}
        }
        plan.params.constraint = response_format(self.response_format.as_ref())?;
        Ok((messages, plan))
    }
}

/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;
/// Most alternatives per token for `/v1/completions`' `logprobs`, as OpenAI allows.
pub const MAX_COMPLETION_LOGPROBS: u64 = 5;

impl CompletionRequest {
    /// Reads a parsed `/v1/completions` body.
    pub fn from_body(body: &Value) -> Result<CompletionRequest, ApiError> {
        let mut r: CompletionRequest = typed(body)?;
        r.sampling = typed(body)?;
        Ok(r)
    }

    /// The prompts (a string or an array of strings) and the checked plan.
    pub fn plan(&self) -> Result<(Vec<String>, Plan), ApiError> {
        let bad = |msg: String| ApiError::invalid_param("prompt", msg);
        let prompts = match &self.prompt {
            Value::String(s) => vec![s.clone()],
            Value::Array(items) if !items.is_empty() => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(bad(format!(
                        "`prompt` entries must be strings (token arrays are not supported), got {other}"
                    ))),
                })
                .collect::<Result<_, _>>()?,
            other => {
                return Err(bad(format!(
                    "`prompt` must be a string or a non-empty array of strings, got {other}"
                )))
            }
        };
        if prompts.iter().any(String::is_empty) {
            return Err(bad("`prompt` must not be empty".into()));
        }
        refuse_if(self.echo == Some(true), "echo", "only false is accepted")?;
        refuse_if(self.suffix.is_some(), "suffix", "no insertion")?;
        refuse_if(
            self.best_of
                .is_some_and(|b| Some(b) != self.sampling.n.or(Some(1))),
            "best_of",
            "only best_of = n is accepted",
        )?;
        let mut plan = self.sampling.plan(Some(COMPLETIONS_DEFAULT_MAX_TOKENS))?;
        if let Some(k) = self.logprobs {
            if k > MAX_COMPLETION_LOGPROBS {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    format!("`logprobs` must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {k}"),
                ));
            }
            plan.logprobs = Some(k as usize);
        }
        Ok((prompts, plan))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<(Vec<Message>, Plan), ApiError> {
        ChatCompletionRequest::from_body(&parse_body(body.as_bytes())?)?.plan()
    }

    #[test]
    fn chat_requests_become_plans() {
        let (m, p) = chat(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
               "temperature":0.5,"seed":7,"n":2,"stop":"\n","max_completion_tokens":9,
               "logprobs":true,"top_logprobs":3,"user":"ignored",
               "response_format":{"type":"json_object"}}"#,
        )
        .expect("valid");
        assert_eq!(m, vec![Message::user("hi")]);
        assert_eq!(p.params.temperature, 0.5);
        assert_eq!(p.max_tokens, Some(9));
        assert_eq!(p.logprobs, Some(3));
        assert_eq!(p.params.stop_strings, vec!["\n".to_string()]);
        assert_eq!(p.choice_params(1).seed, 8);
        assert!(p.params.constraint.is_some());
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (r#"{"model":"m","messages":[]}"#, "messages"),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
                "temperature",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3}"#,
                "temperature",
            ),
            (
                r#"{"model":"m","messages":[{"role":"robot","content":"x"}]}"#,
                "messages[0]",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"n":0}"#,
                "n",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]}"#,
                "stop",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
                "top_logprobs",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"presence_penalty":1}"#,
                "presence_penalty",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}}"#,
                "response_format",
            ),
        ];
        for (body, param) in cases {
            let err = chat(body).expect_err(body);
            assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
            assert!(err.message.contains(param.trim_end_matches("[0]")), "{err}");
        }
        let err = chat("{nope").expect_err("malformed");
        assert!(err.message.contains("not valid JSON"), "{err}");
        let err = chat(r#"{"messages":[{"role":"user","content":"x"}]}"#).expect_err("no model");
        assert!(err.message.contains("model"), "{err}");
    }

    #[test]
    fn completion_prompts_and_defaults() {
        let parse = |b: &[u8]| CompletionRequest::from_body(&parse_body(b)?);
        let r = parse(br#"{"model":"m","prompt":["a","b"],"logprobs":2}"#).expect("valid");
        let (prompts, plan) = r.plan().expect("valid");
        assert_eq!(prompts, vec!["a", "b"]);
        assert_eq!(plan.max_tokens, Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
        assert_eq!(plan.logprobs, Some(2));
        let r = parse(br#"{"model":"m","prompt":[1,2]}"#).expect("parses");
        assert_eq!(
            r.plan().expect_err("tokens").param.as_deref(),
            Some("prompt")
        );
    }
}
