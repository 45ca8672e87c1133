//! The real models of `candor run`: resolving each `--model` / `--judge` value to files
//! ([`crate::weights::source`]), identifying them for the manifest (sha256 of the weights, of the
//! tokenizer and of the chat template), and loading an [`Engine`] per actor for the runner.
//!
//! The runner keeps one generator at a time and drops it before loading the next, so only one
//! model is in memory; actors named alike share one load. Batch size and thread count only
//! change speed (the engine's outputs do not depend on them); the weight dtype changes outputs
//! and is recorded with the model. Scheduling and the decode loop are the engine's and the
//! runner's business, not this file's.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;

use super::draft::DraftSpec;
use crate::bench::refutebench::plan::TokenCounter;
use crate::engine::{
    model_template, ChatRequest, DraftStats, Engine, EngineError, EngineOptions, SchedulerConfig,
};
use crate::model::arch::ModelConfig;
use crate::model::device::DeviceSpec;
use crate::model::transformer::WeightDType;
use crate::model::ModelError;
use crate::store::manifest::ModelIdentity;
use crate::store::run_dir::sha256_bytes;
use crate::store::{error_chain, BoxError, FnModels};
use crate::text::chat_template::ChatTemplate;
use crate::text::error::TextError;
use crate::text::message::Message;
use crate::text::tokenizer::Tokenizer;
use crate::weights::gguf::GgufFile;
use crate::weights::source::{self, ModelFiles, DEFAULT_MODEL_FILE, DEFAULT_MODEL_SHA256};

/// Resolves a `--model` value ([`source::resolve`]); a Hub checkpoint whose `config.json`
/// Candor cannot load (an architecture or a setting it does not implement) is refused before
/// its weights are downloaded.
pub fn resolve(name: &str) -> crate::weights::error::Result<ModelFiles> {
    source::resolve_checked(name, &|config: &Path| {
        let text =
            std::fs::read_to_string(config).map_err(|e| format!("{}: {e}", config.display()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", config.display()))?;
        ModelConfig::from_hf_config(config, &json)
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

/// A resolved model: its files and what identifies it, without its weights in memory.
#[derive(Clone)]
pub struct ModelInfo {
    /// As named on the command line.
    pub name: String,
    pub files: ModelFiles,
    pub sha256: String,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    /// Positions the model attends over.
    pub context_len: usize,
    /// The number of weights (the GGUF's tensor elements); unknown for checkpoint folders.
    pub parameters: Option<u64>,
}

impl ModelInfo {
    /// Resolves `name` and reads its tokenizer, chat template and configuration (not the
    /// weights), hashing the weights file.
    pub fn inspect(name: &str) -> anyhow::Result<ModelInfo> {
        ModelInfo::inspect_with(name, None)
    }

    /// [`ModelInfo::inspect`] with a chat template file replacing the model's own. A model
    /// left without a template is refused: every protocol sends chat conversations.
    pub fn inspect_with(name: &str, chat_template: Option<&Path>) -> anyhow::Result<ModelInfo> {
        let mut files = resolve(name).with_context(|| format!("model {name:?}"))?;
        files.chat_template = chat_template.map(Path::to_path_buf);
        if files.checkpoint {
            return ModelInfo::inspect_checkpoint(name, files);
        }
        let file = GgufFile::open(&files.weights).with_context(|| format!("model {name:?}"))?;
        let tokenizer = match &files.tokenizer_json {
            Some(path) => Tokenizer::from_tokenizer_json(path),
            None => Tokenizer::from_gguf(file.content()),
        }
        .with_context(|| format!("model {name:?}: tokenizer"))?;
        let template = model_template(&files, &tokenizer, Some(file.content()))
            .with_context(|| format!("model {name:?}"))?;
        let config = ModelConfig::from_gguf(file.content())
            .with_context(|| format!("model {name:?}: configuration"))?;
        let sha256 = source::weights_sha256(&files.weights)
            .with_context(|| format!("model {name:?}: hashing {}", files.weights.display()))?;
        // Every tensor, MXFP4 ones included (candle's table leaves them out).
        let parameters = file
            .tensor_shapes()
            .map(|(_, s)| s.iter().product::<usize>() as u64)
            .sum();
        let is_default_file = files
            .weights
            .file_name()
            .is_some_and(|f| f == DEFAULT_MODEL_FILE);
        if is_default_file && sha256 != DEFAULT_MODEL_SHA256 {
            anyhow::bail!(
                "{}: sha256 {sha256} is not the default model's ({DEFAULT_MODEL_SHA256}); \
                 run `candor setup` again",
                files.weights.display()
            );
        }
        Ok(ModelInfo {
            name: name.to_string(),
            files,
            sha256,
            tokenizer: Arc::new(tokenizer),
            template: Arc::new(template),
            context_len: config.context_len,
            parameters: Some(parameters),
        })
    }

    /// [`ModelInfo::inspect`] for a Hugging Face checkpoint folder: `tokenizer.json`,
    /// `tokenizer_config.json` and `config.json` (not the weights).
    fn inspect_checkpoint(name: &str, files: ModelFiles) -> anyhow::Result<ModelInfo> {
        let tok = files
            .tokenizer_json
            .as_ref()
            .with_context(|| format!("model {name:?}: checkpoint folder has no tokenizer.json"))?;
        let tokenizer = Tokenizer::from_tokenizer_json(tok)
            .with_context(|| format!("model {name:?}: tokenizer"))?;
        let template = model_template(&files, &tokenizer, None)
            .with_context(|| format!("model {name:?}: chat template"))?;
        let config_path = files.weights.join("config.json");
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&config_path)
                .with_context(|| format!("model {name:?}: {}", config_path.display()))?,
        )
        .with_context(|| format!("model {name:?}: {}", config_path.display()))?;
        let config = ModelConfig::from_hf_config(&config_path, &json)
            .with_context(|| format!("model {name:?}: configuration"))?;
        let sha256 = source::weights_sha256(&files.weights)
            .with_context(|| format!("model {name:?}: hashing {}", files.weights.display()))?;
        Ok(ModelInfo {
            name: name.to_string(),
            files,
            sha256,
            tokenizer: Arc::new(tokenizer),
            template: Arc::new(template),
            context_len: config.context_len,
            parameters: None,
        })
    }

    /// The manifest entry of this model in `role`, with the loading options that change
    /// outputs.
    pub fn identity(&self, role: &str, dtype: WeightDType, device: DeviceSpec) -> ModelIdentity {
        let mut options = BTreeMap::new();
        options.insert("dtype".to_string(), dtype_name(dtype).to_string());
        // A GPU's tokens need not equal the CPU's: the device is part of what produced them.
        // (Absent for the CPU, so that manifests from before devices still match.)
        if !device.is_cpu() {
            options.insert("device".to_string(), device.to_string());
            // The GPU keeps its KV cache in half precision (the CPU in f32).
            options.insert("kv_cache".to_string(), "f16".to_string());
        }
        ModelIdentity {
            role: role.to_string(),
            name: self.name.clone(),
            sha256: self.sha256.clone(),
            tokenizer_sha256: self.tokenizer.sha256().to_string(),
            chat_template_sha256: sha256_bytes(self.template.source().as_bytes()),
            options,
        }
    }

    /// Counts a conversation's prompt tokens as the engine will (template with generation
    /// prompt, then the tokenizer). A conversation that cannot be rendered counts as
    /// `usize::MAX`, so it never looks like it fits.
    pub fn token_counter(&self) -> TokenCounter {
        let tokenizer = Arc::clone(&self.tokenizer);
        let template = Arc::clone(&self.template);
        Arc::new(move |messages: &[Message]| {
            template
                .render(messages, true)
                .ok()
                .and_then(|text| tokenizer.encode(&text).ok())
                .map_or(usize::MAX, |ids| ids.len())
        })
    }
}

/// Speculative decoding in a run: the candidates' (`--draft`) and the judges'
/// (`--judge-draft`), and where each drafting model's statistics are kept (model name, the
/// setting's note, its statistics).
#[derive(Default)]
pub struct RunDrafts {
    pub candidate: Option<DraftSpec>,
    pub judge: Option<DraftSpec>,
    #[allow(clippy::type_complexity)]
    pub stats: Arc<Mutex<Vec<(String, String, Arc<Mutex<DraftStats>>)>>>,
}

/// How the run's engines are built.
pub fn engine_options(batch_size: usize, dtype: WeightDType, device: DeviceSpec) -> EngineOptions {
    EngineOptions {
        dtype,
        device,
        scheduler: SchedulerConfig {
            batch_size,
            ..SchedulerConfig::default()
        },
        gpu_kv_bytes: None,
    }
}

/// The name a dtype has in manifests.
pub fn dtype_name(dtype: WeightDType) -> &'static str {
    match dtype {
        WeightDType::Native => "native",
        WeightDType::F32 => "f32",
    }
}

/// Errors that concern a request rather than the engine: the runner logs the request as a
/// failed step and goes on.
fn is_request_error(err: &EngineError) -> bool {
    matches!(
        err,
        EngineError::EmptyPrompt { .. }
            | EngineError::TokenOutOfRange { .. }
            | EngineError::PrefixTooLong { .. }
            | EngineError::Model(ModelError::Text(
                TextError::Template(_) | TextError::TemplateRaised(_) | TextError::Tokenizer(_)
            ))
    )
}

/// Whether a model can take `request`: its template renders the conversation, its tokenizer
/// encodes it, and the prompt leaves room in the context for at least one token. Returns the
/// prompt's length, or the reason (one line) it cannot be generated.
pub fn check_prompt(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    context_len: usize,
    messages: &[Message],
) -> Result<usize, String> {
    let text = template
        .render(messages, true)
        .map_err(|e| error_chain(&e))?;
    let ids = tokenizer.encode(&text).map_err(|e| error_chain(&e))?;
    if ids.len() >= context_len {
        return Err(format!(
            "the prompt has {} tokens and the model's context {context_len}: nothing could be \
             generated",
            ids.len()
        ));
    }
    Ok(ids.len())
}

/// [`check_prompt`] with a loaded engine, before the runner generates a request.
fn engine_preflight(engine: &Engine, request: &ChatRequest) -> Result<(), String> {
    check_prompt(
        engine.template(),
        engine.tokenizer(),
        engine.config().context_len,
        &request.messages,
    )
    .map(|_| ())
}

/// The runner's [`crate::store::Models`] over real engines: candidates by index, then the
/// judges (judge 0, then a panel's others), each loaded from its resolved files when the
/// runner first needs it. `judges` must not be empty.
pub fn engine_models(
    candidates: &[ModelInfo],
    judges: &[ModelInfo],
    options: EngineOptions,
    drafts: RunDrafts,
) -> FnModels<Engine, impl FnMut(&str) -> Result<Engine, BoxError>> {
    let judge_names: Vec<String> = judges.iter().map(|m| m.name.clone()).collect();
    let files: BTreeMap<String, ModelFiles> = candidates
        .iter()
        .chain(judges)
        .map(|m| (m.name.clone(), m.files.clone()))
        .collect();
    let loader = move |name: &str| -> Result<Engine, BoxError> {
        let f = files
            .get(name)
            .ok_or_else(|| format!("model {name:?} was not resolved"))?;
        let mut engine = Engine::from_files(f, options)
            .map_err(|e| -> BoxError { format!("model {name:?}: {}", error_chain(&e)).into() })?;
        // A model that judges drafts as --judge-draft says, a candidate as --draft.
        let spec = if judge_names.iter().any(|j| j == name) {
            &drafts.judge
        } else {
            &drafts.candidate
        };
        if let Some(spec) = spec {
            spec.apply(&mut engine, options.dtype)
                .map_err(|e| -> BoxError { format!("model {name:?}: {e:#}").into() })?;
            let sink = Arc::new(Mutex::new(DraftStats::default()));
            engine.decoder().share_draft_stats(Arc::clone(&sink));
            if let Ok(mut all) = drafts.stats.lock() {
                all.push((name.to_string(), spec.note(), sink));
            }
        }
        Ok(engine)
    };
    FnModels::new(
        candidates.iter().map(|m| m.name.clone()).collect(),
        judges[0].name.clone(),
        loader,
    )
    .with_panel(judges[1..].iter().map(|m| m.name.clone()).collect())
    .with_request_errors(is_request_error)
    .with_preflight(engine_preflight)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default model's files, or `None` (skipped loudly; a failure under `CI=true`).
    #[track_caller]
    fn default_model() -> Option<ModelInfo> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models")
            .join(DEFAULT_MODEL_FILE);
        if !p.is_file() {
            crate::skip::absent(
                crate::skip::Need::Model,
                format!(
                    "the default model not found at {} (run `cargo run -- setup`)",
                    p.display()
                ),
            );
            return None;
        }
        Some(ModelInfo::inspect(p.to_str()?).unwrap())
    }

    /// With the real tokenizer and context: a raising template, a prompt longer than the
    /// context and an ordinary prompt.
    #[test]
    fn prompts_the_model_cannot_take_are_refused_with_their_reason() {
        let Some(info) = default_model() else { return };
        let ctx = info.context_len;
        let check = |template: &ChatTemplate, messages: &[Message]| {
            check_prompt(template, &info.tokenizer, ctx, messages)
        };
        let hi = [Message::user("Hello")];
        let n = check(&info.template, &hi).unwrap();
        assert!(n > 1 && n < 64, "{n}");
        // A Mistral-style template raises where roles do not alternate (a system message it
        // does not write is folded into the next, as llama.cpp does, and raises nothing).
        let mistral = ChatTemplate::new(
            "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == messages[loop.index0 - 1]['role'] %}\
             {{ raise_exception('Conversation roles must alternate user/assistant') }}\
             {% endif %}[INST] {{ m['content'] }} [/INST]{% endfor %}",
            "<s>",
            "</s>",
        )
        .unwrap();
        assert!(check(&mistral, &hi).is_ok());
        assert!(check(
            &mistral,
            &[Message::system("Be brief."), Message::user("Hi")]
        )
        .is_ok());
        let err = check(&mistral, &[Message::user("Hi"), Message::user("Again")]).unwrap_err();
        assert!(err.contains("Conversation roles must alternate"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        // A prompt longer than the context (8192 for SmolLM2).
        let long = [Message::user("word ".repeat(ctx + 10))];
        let err = check(&info.template, &long).unwrap_err();
        assert!(
            err.starts_with("the prompt has ")
                && err.ends_with(&format!(
                    "tokens and the model's context {ctx}: nothing could be generated"
                )),
            "{err}"
        );
    }
}
