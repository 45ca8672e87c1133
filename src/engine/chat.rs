//! The loaded engine: a model's weights, tokenizer and chat template behind one [`Engine`] that
//! answers chat requests ([`Generate`]) and token-level requests.
//!
//! Chat requests are rendered with the model's own template (generation prompt added),
//! encoded, and handed to the one decode loop in [`super::scheduler`]; replies are decoded
//! with the same tokenizer. The end-of-sequence and end-of-turn tokens the template uses stop
//! generation. The engine also exposes what a run manifest records about the model: its
//! file's sha256, the tokenizer's hash and the template text. It does not pick models or
//! read request files (that is `cli`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::constraint::ConstraintCompiler;
use super::draft::{DraftConfig, DraftSource};
use super::kv::SeqId;
use super::reasoning::ReasoningGate;
use super::scheduler::{Decoder, SchedulerConfig, TextDecoder, TokenReply, TokenRequest};
use super::{ChatReply, ChatRequest, EngineError, Generate, PrefillStats, Reasoning, StopReason};
use crate::model::arch::ModelConfig;
use crate::model::checkpoint::Checkpoint;
use crate::model::device::DeviceSpec;
use crate::model::runner::Model;
use crate::model::transformer::{Transformer, WeightDType};
use crate::model::ModelError;
use crate::text::chat_template::ChatTemplate;
use crate::text::error::TextError;
use crate::text::reasoning::ReasoningFormat;
use crate::text::tokenizer::Tokenizer;
use crate::weights::error::WeightsError;
use crate::weights::gguf::GgufFile;
use crate::weights::source::{weights_sha256, ModelFiles};
use candle_core::quantized::gguf_file::Content;

/// The `eos_token_id` (one id or a list) of a `generation_config.json`.
pub fn generation_eos_ids(path: &Path) -> Result<Vec<u32>, ModelError> {
    let bad = |msg: String| ModelError::Config {
        path: path.to_path_buf(),
        key: "eos_token_id".into(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let id = |v: &serde_json::Value| {
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| bad(format!("{v} is not a token id")))
    };
    match json.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a.iter().map(id).collect(),
        Some(v) => Ok(vec![id(v)?]),
    }
}

impl TextDecoder for Tokenizer {
    fn decode(&self, ids: &[u32]) -> String {
        Tokenizer::decode(self, ids)
    }
}

/// How to load and run a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineOptions {
    pub dtype: WeightDType,
    /// Where the forward pass runs.
    pub device: DeviceSpec,
    pub scheduler: SchedulerConfig,
    /// On a GPU, the most bytes the model's KV pool takes (`None`: 90% of the memory left after
    /// its weights, less 1 GiB — one model per card). Ignored on the CPU.
    pub gpu_kv_bytes: Option<usize>,
}

/// A loaded model ready to generate.
pub struct Engine {
    decoder: Decoder,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    model_path: PathBuf,
    model_sha256: OnceLock<String>,
    /// The streamed chat requests in flight, by id: prompt ids, and whether the reply starts
    /// inside its reasoning.
    streamed: HashMap<u64, (Vec<u32>, bool)>,
}

/// A chat request as the decoder sees it, and what splitting its reply needs.
pub struct Prepared {
    pub prompt_ids: Vec<u32>,
    /// The reply's reasoning gate (a thinking model's template), for [`TokenRequest::reasoning`].
    pub reasoning: Option<ReasoningGate>,
    /// The reply starts inside its reasoning ([`ReasoningFormat::starts_open`]).
    pub starts_open: bool,
}

/// The chat template of resolved model files: the first there is of the `--chat-template`
/// file, transformers' `chat_template.jinja` beside the weights, `tokenizer_config.json`'s
/// `chat_template` and the GGUF's own (`gguf`, its metadata); [`TextError::NoChatTemplate`]
/// when none has one.
pub fn model_template(
    files: &ModelFiles,
    tokenizer: &Tokenizer,
    gguf: Option<&Content>,
) -> Result<ChatTemplate, TextError> {
    if let Some(path) = files
        .chat_template
        .as_ref()
        .or(files.chat_template_jinja.as_ref())
    {
        return ChatTemplate::from_file(path, tokenizer);
    }
    if let Some(path) = &files.tokenizer_config {
        match ChatTemplate::from_tokenizer_config(path, tokenizer) {
            Err(TextError::NoChatTemplate) => {}
            other => return other,
        }
    }
    match gguf {
        Some(content) => {
            ChatTemplate::from_gguf(content, tokenizer)?.with_origin(files.weights.display())
        }
        None => Err(TextError::NoChatTemplate),
    }
}

impl Engine {
    /// Loads a GGUF file whose metadata also carries the tokenizer and chat template.
    pub fn load(gguf: &Path, options: EngineOptions) -> Result<Engine, EngineError> {
        let mut file = GgufFile::open(gguf)?;
        let tokenizer = Tokenizer::from_gguf(file.content())?;
        let template =
            ChatTemplate::from_gguf(file.content(), &tokenizer)?.with_origin(gguf.display())?;
        let model = Transformer::from_gguf(&mut file, options.dtype)?;
        Engine::build(model, gguf, tokenizer, template, &[], options)
    }

    /// Loads resolved model files: a `tokenizer.json` (and its `tokenizer_config.json`) beside
    /// the GGUF take precedence over the GGUF's own tokenizer and template. A checkpoint
    /// folder needs its `tokenizer.json`; its `generation_config.json` eos ids also stop.
    pub fn from_files(files: &ModelFiles, options: EngineOptions) -> Result<Engine, EngineError> {
        if files.checkpoint {
            return Engine::from_checkpoint(files, options);
        }
        let mut file = GgufFile::open(&files.weights)?;
        let tokenizer = match &files.tokenizer_json {
            Some(path) => Tokenizer::from_tokenizer_json(path)?,
            None => Tokenizer::from_gguf(file.content())?,
        };
        // A model with none loads (raw prompts), its chat renders fail.
        let template = match model_template(files, &tokenizer, Some(file.content())) {
            Err(TextError::NoChatTemplate) => ChatTemplate::missing(files.weights.display())?,
            other => other?,
        };
        let model = Transformer::from_gguf(&mut file, options.dtype)?;
        Engine::build(model, &files.weights, tokenizer, template, &[], options)
    }

    fn from_checkpoint(files: &ModelFiles, options: EngineOptions) -> Result<Engine, EngineError> {
        let dir = &files.weights;
        let missing = |what: &str| WeightsError::Source {
            source_name: dir.display().to_string(),
            msg: format!("checkpoint folder has no {what}"),
        };
        let tok_path = files
            .tokenizer_json
            .as_ref()
            .ok_or_else(|| missing("tokenizer.json"))?;
        let tokenizer = Tokenizer::from_tokenizer_json(tok_path)?;
        let template = model_template(files, &tokenizer, None)?;
        let eos = match &files.generation_config {
            Some(p) => generation_eos_ids(p)?,
            None => Vec::new(),
        };
        let mut ck = Checkpoint::open(dir)?;
        let model = Transformer::from_checkpoint(&mut ck, options.dtype)?;
        Engine::build(model, dir, tokenizer, template, &eos, options)
    }

    fn build(
        model: Transformer,
        path: &Path,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        extra_stops: &[u32],
        options: EngineOptions,
    ) -> Result<Engine, EngineError> {
        let model = Model::with_kv_limit(model, options.device, options.gpu_kv_bytes)?;
        let mut stop_ids = template.stop_token_ids(&tokenizer);
        stop_ids.extend(extra_stops);
        stop_ids.sort_unstable();
        stop_ids.dedup();
        let mut decoder = Decoder::new(Arc::new(model), options.scheduler, stop_ids);
        decoder.set_constraints(Arc::new(ConstraintCompiler::new(&tokenizer)));
        Ok(Engine {
            decoder,
            tokenizer: Arc::new(tokenizer),
            template,
            model_path: path.to_path_buf(),
            model_sha256: OnceLock::new(),
            streamed: HashMap::new(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.decoder.model().config()
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The chat template's source text (for run manifests).
    pub fn template_source(&self) -> &str {
        self.template.source()
    }

    /// The tokenizer's hash (for run manifests).
    pub fn tokenizer_sha256(&self) -> &str {
        self.tokenizer.sha256()
    }

    pub fn model_path(&self) -> &Path {
        &self.model_path
    }

    /// The sha256 of the weights file (computed once, on first use).
    pub fn model_sha256(&self) -> Result<&str, EngineError> {
        if let Some(h) = self.model_sha256.get() {
            return Ok(h);
        }
        let h = weights_sha256(&self.model_path)?;
        Ok(self.model_sha256.get_or_init(|| h))
    }

    /// Token ids that end generation (EOS and the template's end-of-turn tokens).
    pub fn stop_ids(&self) -> &[u32] {
        self.decoder.stop_ids()
    }

    pub fn set_batch_size(&mut self, batch_size: usize) {
        self.decoder.set_batch_size(batch_size);
    }

    /// The tokenizer, shared (to decode while the decoder is borrowed mutably).
    pub fn shared_tokenizer(&self) -> Arc<Tokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// The token-level decoder (prefixes, forks, teacher forcing).
    pub fn decoder(&mut self) -> &mut Decoder {
        &mut self.decoder
    }

    /// Speculative decoding by prompt lookup (`None` turns drafting off). The tokens do not
    /// change: see [`Decoder::set_drafting`].
    pub fn set_lookup_drafts(&mut self, config: Option<DraftConfig>) {
        let draft = config.map(|c| (DraftSource::Lookup, c));
        self.decoder
            .set_drafting(draft)
            .expect("lookup drafting has no vocabulary to check");
    }

    /// Speculative decoding with a draft model loaded from `files` onto this engine's device:
    /// refused unless its tokenizer has exactly this model's tokens (same count, same bytes
    /// for every id).
    pub fn set_draft_model(
        &mut self,
        files: &ModelFiles,
        dtype: WeightDType,
        config: DraftConfig,
    ) -> Result<(), EngineError> {
        let theirs = if files.checkpoint {
            let path = files.tokenizer_json.as_ref().ok_or_else(|| {
                EngineError::DraftVocabulary(format!(
                    "the draft checkpoint {} has no tokenizer.json",
                    files.weights.display()
                ))
            })?;
            Tokenizer::from_tokenizer_json(path)?
        } else {
            match &files.tokenizer_json {
                Some(path) => Tokenizer::from_tokenizer_json(path)?,
                None => Tokenizer::from_gguf_file(&files.weights)?,
            }
        };
        let ours = &self.tokenizer;
        if theirs.vocab_size() != ours.vocab_size() {
            return Err(EngineError::DraftVocabulary(format!(
                "{} has {} tokens, the model {}",
                files.weights.display(),
                theirs.vocab_size(),
                ours.vocab_size()
            )));
        }
        if let Some(id) = (0..ours.vocab_size() as u32).find(|&i| {
            theirs.token_bytes(i) != ours.token_bytes(i)
                || theirs.id_to_token(i) != ours.id_to_token(i)
        }) {
            return Err(EngineError::DraftVocabulary(format!(
                "{}: token {id} is {:?}, the model's is {:?}",
                files.weights.display(),
                theirs.id_to_token(id).unwrap_or(""),
                ours.id_to_token(id).unwrap_or("")
            )));
        }
        let model = Model::load_weights(files, dtype, self.decoder.model().device())?;
        self.decoder
            .set_drafting(Some((DraftSource::Model(Arc::new(model)), config)))
    }

    /// The prompt ids of raw text (a base model's prompt): encoded as is, with BOS where the
    /// model's metadata asks for it.
    pub fn raw_prompt_ids(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        Ok(self.tokenizer.encode(text)?)
    }

    /// The prompt ids of a chat conversation: rendered with the generation prompt (and the
    /// request's template variables), encoded.
    pub fn prompt_ids(&self, request: &ChatRequest) -> Result<Vec<u32>, EngineError> {
        Ok(self.prepare(request)?.prompt_ids)
    }

    /// The family of reasoning blocks this model's template writes.
    pub fn reasoning_format(&self) -> ReasoningFormat {
        self.template.reasoning_format()
    }

    /// Renders and encodes a chat request, and builds its reasoning gate for a thinking
    /// model's template.
    pub fn prepare(&self, request: &ChatRequest) -> Result<Prepared, EngineError> {
        let text = self
            .template
            .render_with(&request.messages, true, &request.template)?;
        let prompt_ids = self.tokenizer.encode(&text)?;
        let format = self.reasoning_format();
        let starts_open = format.starts_open(&text);
        let ids = |marker: Option<&str>| -> Result<Vec<u32>, EngineError> {
            Ok(match marker {
                Some(m) => self.tokenizer.encode_plain(m)?,
                None => Vec::new(),
            })
        };
        let reasoning = match format {
            ReasoningFormat::Plain => None,
            _ => Some(ReasoningGate {
                starts_open,
                open: ids(format.open_marker())?,
                close: ids(format.close_marker())?,
                forced_close: ids(format.forced_close())?,
                budget: request.max_thinking_tokens,
            }),
        };
        Ok(Prepared {
            prompt_ids,
            reasoning,
            starts_open,
        })
    }

    /// The chat reply of a token-level reply: for a thinking model, its answer split from its
    /// reasoning ([`ReasoningFormat::split`]).
    fn chat_reply(&self, prompt_ids: Vec<u32>, t: &TokenReply, starts_open: bool) -> ChatReply {
        let mut reply = ChatReply::from_tokens(prompt_ids, t);
        let format = self.reasoning_format();
        if format == ReasoningFormat::Plain {
            return reply;
        }
        let split = format.split(&t.text, starts_open);
        let cut = matches!(
            t.stop_reason,
            StopReason::MaxTokens | StopReason::ContextFull
        );
        reply.reasoning = split.reasoning.map(|text| Reasoning {
            text,
            tokens: t.reasoning_tokens.unwrap_or(0),
            truncated: split.answer.is_none() && cut,
        });
        reply.text = split.answer.unwrap_or_default();
        reply
    }

    /// Generates for token-level requests; replies come back in request order.
    pub fn generate_tokens(
        &mut self,
        requests: &[TokenRequest],
    ) -> Result<Vec<TokenReply>, EngineError> {
        self.generate_tokens_with_progress(requests, &mut |_| {})
    }

    /// [`Engine::generate_tokens`], calling `done(i)` as soon as request `i` is answered.
    pub fn generate_tokens_with_progress(
        &mut self,
        requests: &[TokenRequest],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<TokenReply>, EngineError> {
        let tokenizer = Arc::clone(&self.tokenizer);
        self.decoder
            .generate_with_progress(requests, tokenizer.as_ref(), done)
    }

    /// Feeds `ids` into a stored sequence that later requests can start from (a shared prefix).
    pub fn prefill(&mut self, ids: &[u32]) -> Result<SeqId, EngineError> {
        self.decoder.prefill(ids)
    }

    /// A new stored sequence sharing `id`'s positions.
    pub fn fork(&mut self, id: SeqId) -> Result<SeqId, EngineError> {
        self.decoder.fork(id)
    }

    /// Drops a stored sequence.
    pub fn release(&mut self, id: SeqId) -> Result<(), EngineError> {
        self.decoder.release(id)
    }

    /// Answers chat requests, returning each reply with its timings; `done(i)` is called as
    /// soon as request `i` is answered.
    pub fn chat_with_timings(
        &mut self,
        requests: &[ChatRequest],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<(ChatReply, TokenReply)>, EngineError> {
        let prepared = requests
            .iter()
            .map(|r| self.prepare(r))
            .collect::<Result<Vec<_>, _>>()?;
        let token_requests: Vec<TokenRequest> = prepared
            .iter()
            .zip(requests)
            .map(|(p, r)| TokenRequest {
                reasoning: p.reasoning.clone(),
                ..TokenRequest::new(p.prompt_ids.clone(), r.params.clone())
            })
            .collect();
        let replies = self.generate_tokens_with_progress(&token_requests, done)?;
        Ok(prepared
            .into_iter()
            .zip(replies)
            .map(|(p, t)| (self.chat_reply(p.prompt_ids, &t, p.starts_open), t))
            .collect())
    }
}

impl Generate for Engine {
    type Error = EngineError;

    fn start(&mut self, id: u64, request: &ChatRequest) -> Result<Option<ChatReply>, EngineError> {
        let p = self.prepare(request)?;
        let token_request = TokenRequest {
            reasoning: p.reasoning,
            ..TokenRequest::new(p.prompt_ids.clone(), request.params.clone())
        };
        self.decoder.submit(id, token_request)?;
        self.streamed.insert(id, (p.prompt_ids, p.starts_open));
        Ok(None)
    }

    fn poll(&mut self) -> Result<Vec<(u64, ChatReply)>, EngineError> {
        let tokenizer = Arc::clone(&self.tokenizer);
        while self.decoder.in_flight() > 0 {
            let finished = self.decoder.step(tokenizer.as_ref())?;
            if finished.is_empty() {
                continue;
            }
            return finished
                .into_iter()
                .map(|(id, t)| {
                    let (prompt_ids, starts_open) = self.streamed.remove(&id).ok_or_else(|| {
                        EngineError::Internal(format!("a reply to unknown request {id}"))
                    })?;
                    Ok((id, self.chat_reply(prompt_ids, &t, starts_open)))
                })
                .collect();
        }
        Ok(Vec::new())
    }

    fn generate_chat(&mut self, requests: &[ChatRequest]) -> Result<Vec<ChatReply>, EngineError> {
        self.generate_chat_with_progress(requests, &mut |_| {})
    }

    fn generate_chat_with_progress(
        &mut self,
        requests: &[ChatRequest],
        done: &mut dyn FnMut(usize),
    ) -> Result<Vec<ChatReply>, EngineError> {
        Ok(self
            .chat_with_timings(requests, done)?
            .into_iter()
            .map(|(chat, _)| chat)
            .collect())
    }

    fn prefill_stats(&self) -> PrefillStats {
        self.decoder.prefill_stats()
    }
}
