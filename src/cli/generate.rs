//! `candor generate`: replies to the chat conversations of a JSONL file with a local model,
//! one JSON line per conversation, in input order.
//!
//! Input lines are `{"id": ..., "messages": [...]}` (rendered with the model's chat template, or
//! `--chat-template FILE`) or `{"id": ..., "prompt": "raw text"}` (encoded as it is, with BOS
//! where the model's metadata asks for it: a base model needs no template), optionally with
//! `"seed"`; output lines carry
//! the id, prompt and output token ids, the reply text, the stop reason and timings. The output
//! is written to a temporary file beside `--out` and renamed into place at the end, so a failed
//! run leaves nothing half-written. A malformed input line is an error naming `path:line`.
//! This module parses arguments and files; decoding is [`crate::engine`]'s.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::{
    ChatReply, ChatRequest, Engine, EngineOptions, SamplingParams, SchedulerConfig, TokenReply,
    TokenRequest,
};
use crate::model::transformer::WeightDType;
use crate::text::message::Message;

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Model: `default`, a GGUF path, or a Hugging Face Hub id (`org/repo[:file.gguf]`, or `org/repo:Q4_K_M` for a quantization).
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Input JSONL: one `{"id": ..., "messages": [{"role": ..., "content": ...}]}` (a chat) or
    /// `{"id": ..., "prompt": "raw text"}` (no template; BOS as the model's metadata says)
    /// per line; a line's `"params"` (as a run's samples.jsonl records them) replace the
    /// sampling options below for it.
    #[arg(long)]
    pub prompts: PathBuf,
    /// A Jinja chat template file for `messages` lines: replaces the model's own, or gives a
    /// base model one.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Output JSONL, written atomically when every reply is done.
    #[arg(long)]
    pub out: PathBuf,
    /// Most conversations decoding at once.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Weight type: `native` (quantized weights stay quantized) or `f32` (all dequantized).
    #[arg(long, default_value = "native", value_parser = ["native", "f32"])]
    pub dtype: String,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus (top-p) mass; 1 disables it.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Base seed; each conversation samples with this plus a stable hash of its id, unless its
    /// line gives its own `"seed"`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most tokens generated per conversation.
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Worker threads (default: rayon's choice, one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the model runs: `cpu`, or `cuda` / `cuda:N` (a build with `--features cuda`).
    #[arg(long, value_name = "DEVICE", default_value = "cpu", value_parser = super::run::parse_device)]
    pub device: crate::model::device::DeviceSpec,
    #[command(flatten)]
    pub draft: super::draft::DraftArgs,
}

/// One input line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptLine {
    id: Value,
    #[serde(default)]
    messages: Option<Vec<Message>>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    /// Sampling parameters as a run records them (`samples.jsonl`'s `params`: temperature,
    /// top-p, seed, new-token limit, stop strings, constraint), used as they are in place of
    /// the command's: a run's steps replayed (`benches/spec.sh` times its judge steps so).
    #[serde(default)]
    params: Option<SamplingParams>,
}

/// A conversation (or raw prompt) to answer, with its id as written in the input.
#[derive(Debug)]
struct Prompt {
    id: Value,
    /// `Some` for a `prompt` line: the text is encoded as it is, `request.messages` is empty.
    raw: Option<String>,
    request: ChatRequest,
}

/// 64-bit FNV-1a of an id's JSON text: stable across runs, platforms and versions.
fn id_hash(id: &Value) -> u64 {
    let text = match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Parses the prompts file; every error names `path:line`.
fn read_prompts(path: &Path, args: &GenerateArgs) -> anyhow::Result<Vec<Prompt>> {
    let file = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    parse_prompts(BufReader::new(file), path, args)
}

fn parse_prompts(
    reader: impl BufRead,
    path: &Path,
    args: &GenerateArgs,
) -> anyhow::Result<Vec<Prompt>> {
    let mut prompts = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, line) in reader.lines().enumerate() {
        let at = || format!("{}:{}", path.display(), i + 1);
        let line = line.with_context(at)?;
        if line.trim().is_empty() {
            continue;
        }
        let p: PromptLine = serde_json::from_str(&line).with_context(at)?;
        if !matches!(p.id, Value::String(_) | Value::Number(_)) {
            bail!("{}: `id` must be a string or a number", at());
        }
        let (messages, raw) = match (p.messages, p.prompt) {
            (Some(_), Some(_)) => bail!("{}: give `messages` or `prompt`, not both", at()),
            (None, None) => bail!(
                "{}: missing `messages` (a chat) or `prompt` (raw text)",
                at()
            ),
            (Some(m), None) if m.is_empty() => bail!("{}: `messages` is empty", at()),
            (None, Some(t)) if t.is_empty() => bail!("{}: `prompt` is empty", at()),
            (Some(m), None) => (m, None),
            (None, Some(t)) => (Vec::new(), Some(t)),
        };
        if !seen.insert(p.id.to_string()) {
            bail!("{}: duplicate id {}", at(), p.id);
        }
        if let Some(params) = p.params {
            if p.seed.is_some() {
                bail!("{}: give `seed` or `params`, not both", at());
            }
            if params.max_new_tokens == 0 {
                bail!("{}: `params.max_new_tokens` must be at least 1", at());
            }
            prompts.push(Prompt {
                id: p.id,
                raw,
                request: ChatRequest::new(messages, params),
            });
            continue;
        }
        let seed = p
            .seed
            .unwrap_or_else(|| args.seed.wrapping_add(id_hash(&p.id)));
        let params = SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            seed,
            max_new_tokens: args.max_new_tokens,
            stop_strings: Vec::new(),
            constraint: None,
        };
        prompts.push(Prompt {
            id: p.id,
            raw,
            request: ChatRequest::new(messages, params),
        });
    }
    Ok(prompts)
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    args.device.check_built()?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        bail!("--temperature must be a finite number >= 0");
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--top-p must be in (0, 1]");
    }
    let draft = args.draft.spec()?;
    let prompts = read_prompts(&args.prompts, &args)?;
    let mut files = super::models::resolve(&args.model)?;
    files.chat_template = args.chat_template.clone();
    let dtype = match args.dtype.as_str() {
        "f32" => WeightDType::F32,
        _ => WeightDType::Native,
    };
    let options = EngineOptions {
        dtype,
        device: args.device,
        scheduler: SchedulerConfig {
            batch_size: args.batch_size,
            ..SchedulerConfig::default()
        },
        gpu_kv_bytes: None,
    };
    let mut engine = Engine::from_files(&files, options)
        .with_context(|| format!("loading {}", files.weights.display()))?;
    if let Some(d) = &draft {
        d.apply(&mut engine, dtype)?;
    }
    let mut pool = rayon::ThreadPoolBuilder::new();
    if let Some(n) = args.threads {
        pool = pool.num_threads(n);
    }
    let pool = pool.build().context("starting worker threads")?;

    let out_dir = match args.out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(&out_dir)
        .with_context(|| format!("creating a temporary file in {}", out_dir.display()))?;

    let bar = indicatif::ProgressBar::new(prompts.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    // Every prompt is encoded before anything runs: a chat line for a model without a template
    // fails here, naming its line's id.
    let mut prompt_ids = Vec::with_capacity(prompts.len());
    for p in &prompts {
        let ids = match &p.raw {
            Some(text) => engine.raw_prompt_ids(text),
            None => engine.prompt_ids(&p.request),
        };
        prompt_ids.push(ids.with_context(|| format!("{}: id {}", args.prompts.display(), p.id))?);
    }
    let requests: Vec<TokenRequest> = prompts
        .iter()
        .zip(&prompt_ids)
        .map(|(p, ids)| TokenRequest::new(ids.clone(), p.request.params.clone()))
        .collect();
    let tokens = pool
        .install(|| engine.generate_tokens_with_progress(&requests, &mut |_| bar.inc(1)))
        .context("generating")?;
    let replies: Vec<(ChatReply, TokenReply)> = prompt_ids
        .into_iter()
        .zip(tokens)
        .map(|(prompt_ids, t)| (ChatReply::from_tokens(prompt_ids, &t), t))
        .collect();
    bar.finish_and_clear();

    let mut total_out = 0usize;
    for (p, (chat, t)) in prompts.iter().zip(&replies) {
        total_out += chat.output_ids.len();
        let decode_tok_s = if t.decode_ms > 0.0 {
            (chat.output_ids.len().saturating_sub(1)) as f64 / (t.decode_ms / 1e3)
        } else {
            0.0
        };
        let line = json!({
            "id": p.id,
            "prompt_ids": chat.prompt_ids,
            "output_ids": chat.output_ids,
            "text": chat.text,
            "stop_reason": chat.stop_reason,
            "prefill_ms": round2(t.prefill_ms),
            "decode_ms": round2(t.decode_ms),
            "decode_tok_s": round2(decode_tok_s),
        });
        writeln!(tmp, "{line}").context("writing output")?;
    }
    tmp.as_file().sync_all().context("writing output")?;
    tmp.persist(&args.out)
        .with_context(|| format!("renaming output into {}", args.out.display()))?;
    let prefill = engine.decoder().prefill_stats();
    eprintln!(
        "wrote {} replies ({total_out} tokens) to {}; prompt tokens: {} computed, {} from the \
         prefix cache",
        replies.len(),
        args.out.display(),
        prefill.computed,
        prefill.reused
    );
    if draft.is_some() {
        eprintln!("drafts: {}", engine.decoder().draft_stats().summary());
    }
    Ok(())
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: GenerateArgs,
    }

    fn args(extra: &[&str]) -> GenerateArgs {
        let mut v = vec!["x", "--prompts", "in.jsonl", "--out", "out.jsonl"];
        v.extend_from_slice(extra);
        Wrap::parse_from(v).args
    }

    fn parse(text: &str, a: &GenerateArgs) -> anyhow::Result<Vec<Prompt>> {
        parse_prompts(text.as_bytes(), Path::new("in.jsonl"), a)
    }

    #[test]
    fn parses_lines_and_derives_seeds_from_ids() {
        let a = args(&["--seed", "5", "--temperature", "0.7"]);
        let text = "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n\n\
                    {\"id\": 7, \"messages\": [{\"role\": \"user\", \"content\": \"yo\"}], \"seed\": 3}\n";
        let p = parse(text, &a).expect("valid");
        assert_eq!(p.len(), 2);
        assert_eq!(
            p[0].request.params.seed,
            5u64.wrapping_add(id_hash(&json!("a")))
        );
        assert_eq!(p[1].request.params.seed, 3);
        assert_eq!(p[0].request.params.temperature, 0.7);
        assert_ne!(id_hash(&json!("a")), id_hash(&json!("b")));
    }

    #[test]
    fn a_runs_recorded_params_replace_the_commands() {
        let a = args(&["--seed", "5", "--max-new-tokens", "9"]);
        let text =
            "{\"id\": \"x/judge\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \
                    \"params\": {\"temperature\": 0.0, \"top_p\": 1.0, \"seed\": 42, \
                    \"max_new_tokens\": 300, \"stop_strings\": [\"END\"]}}\n";
        let p = parse(text, &a).expect("valid");
        let params = &p[0].request.params;
        assert_eq!(
            (params.seed, params.max_new_tokens, params.temperature),
            (42, 300, 0.0)
        );
        assert_eq!(params.stop_strings, ["END"]);
        let both = text.replace("\"params\"", "\"seed\": 1, \"params\"");
        let err = format!("{:#}", parse(&both, &a).expect_err("seed and params"));
        assert!(
            err.contains("in.jsonl:1") && err.contains("not both"),
            "{err}"
        );
    }

    #[test]
    fn raw_prompt_lines_sit_beside_chat_lines() {
        let a = args(&[]);
        let text =
            "{\"id\": \"chat\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n\
                    {\"id\": \"base\", \"prompt\": \"Once upon a time\"}\n";
        let p = parse(text, &a).expect("valid");
        assert_eq!(p[0].raw, None);
        assert_eq!(p[0].request.messages.len(), 1);
        assert_eq!(p[1].raw.as_deref(), Some("Once upon a time"));
        assert!(p[1].request.messages.is_empty());
    }

    #[test]
    fn malformed_lines_name_path_and_line() {
        let a = args(&[]);
        let good = "{\"id\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}";
        let cases = [
            format!("{good}\n{{not json"),
            format!("{good}\n{{\"id\": \"b\", \"messages\": [{{\"role\": \"robot\", \"content\": \"x\"}}]}}"),
            format!("{good}\n{{\"id\": \"b\", \"messages\": []}}"),
            format!("{good}\n{good}"),
            format!("{good}\n{{\"id\": null, \"messages\": [{{\"role\": \"user\", \"content\": \"x\"}}]}}"),
            format!("{good}\n{{\"id\": \"b\"}}"),
            format!("{good}\n{{\"id\": \"b\", \"prompt\": \"\"}}"),
            format!("{good}\n{{\"id\": \"b\", \"prompt\": \"x\", \"messages\": [{{\"role\": \"user\", \"content\": \"x\"}}]}}"),
        ];
        for text in cases {
            let err = format!("{:#}", parse(&text, &a).expect_err("invalid"));
            assert!(err.starts_with("in.jsonl:2"), "{err}");
        }
    }
}
