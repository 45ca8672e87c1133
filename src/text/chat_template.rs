//! The model's own chat template: its Jinja source (GGUF `tokenizer.chat_template`, or
//! `tokenizer_config.json`'s `chat_template`) rendered with minijinja the way transformers'
//! `apply_chat_template` renders it.
//!
//! Rendering follows transformers: blocks trimmed and left-stripped, Python string and dict
//! methods through minijinja-contrib's `pycompat`, `raise_exception(msg)` available, and
//! `messages`, `add_generation_prompt`, `bos_token`, `eos_token` in the context. A template
//! that raises or fails to render is a typed error, never a fallback format. This module also
//! says which tokens end a turn ([`ChatTemplate::stop_token_ids`]); it does not tokenize.
//!
//! The template comes from a downloaded file and is untrusted code, so every render runs under
//! a budget: at most [`FUEL`] minijinja instructions, an output of at most [`MAX_OUTPUT_FIXED`]
//! bytes plus [`MAX_OUTPUT_PER_INPUT_BYTE`] per byte of the messages, a memory budget for
//! intermediate values ([`crate::budget::alloc_budget`]), and a CPU-time budget for the single
//! instructions that walk a value of any size on one unit of fuel ([`crate::budget::cpu_budget`]);
//! memory and CPU time end the process with a one-line message. A value whose size is known before it is
//! built (a constant folded while compiling, a widening filter) is sized first and refused
//! with a typed error ([`super::template_size`]). A template that exceeds a budget on a short
//! probe conversation is refused when it is loaded; errors name the model file.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use candle_core::quantized::gguf_file::Content;
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use super::error::{Result, TextError};
use super::message::{Message, Role};
use super::reasoning::ReasoningFormat;
use super::template_date::TemplateDate;
use super::template_size;
use super::tokenizer::Tokenizer;
use crate::budget::alloc_budget;
use crate::budget::cpu_budget;

const TEMPLATE_NAME: &str = "chat_template";

/// Marks errors that come from the template's own `raise_exception` call.
const RAISED: &str = "\u{1}raised\u{1}";

/// The context variable that carries the render's date to `strftime_now`.
const DATE_VAR: &str = "__candor_template_date";

/// What a render passes to the template beside the messages: extra variables (transformers'
/// `chat_template_kwargs`: `enable_thinking`, `reasoning_effort`, …) and the date
/// `strftime_now` renders. The default passes nothing and renders today's UTC date.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateArgs {
    /// Extra template variables; `messages`, `add_generation_prompt`, `bos_token` and
    /// `eos_token` cannot be overridden.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kwargs: BTreeMap<String, serde_json::Value>,
    /// The date `strftime_now` formats (a run's recorded date); `None`: today (UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<TemplateDate>,
}

impl TemplateArgs {
    pub fn is_default(&self) -> bool {
        self == &TemplateArgs::default()
    }
}

/// Instructions one render may execute. Real templates use a few hundred per message (the
/// tests print their figures); this is a few tenths of a second of work.
pub const FUEL: u64 = 2_000_000;

/// Output every render may write regardless of the messages (system prompts, dates, tool
/// preambles that real templates add).
pub const MAX_OUTPUT_FIXED: usize = 64 * 1024;

/// Output allowed per byte of message content (role markers, repeated system prompts).
pub const MAX_OUTPUT_PER_INPUT_BYTE: usize = 4;

/// Memory a render may hold beyond its output, fixed part and per byte of the messages.
const MAX_MEMORY_FIXED: usize = 64 << 20;
const MAX_MEMORY_PER_INPUT_BYTE: usize = 64;

/// CPU time a render (or the compile) may take, fixed part and per MiB of the messages. A
/// render that runs out of fuel takes under 0.2 s on instructions of ordinary cost; past this,
/// one instruction is walking or comparing a value of unbounded size
/// ([`crate::budget::cpu_budget`]).
const MAX_CPU_FIXED: Duration = Duration::from_secs(1);
const MAX_CPU_PER_INPUT_MIB: Duration = Duration::from_secs(1);

/// End-of-turn tokens used by common chat templates.
const END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|end|>",
    "<end_of_turn>",
    // Gemma 4 (llama.cpp counts it among the end-of-generation tokens).
    "<turn|>",
    "</s>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|END_OF_TURN_TOKEN|>",
    // GLM-4.x: the model ends its turn by opening the next one; llama.cpp's converter writes
    // these as the GGUF's `eot` and `eom` tokens, which end generation there.
    "<|user|>",
    "<|observation|>",
    // DeepSeek-V3/R1's end of a turn (their EOS; a distill's GGUF may name another).
    "<｜end▁of▁sentence｜>",
];

/// A compiled chat template with the special-token strings it is rendered with.
#[derive(Clone)]
pub struct ChatTemplate {
    source: String,
    /// Where the template came from (the model file), for error messages.
    origin: String,
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The model has no template and none was given ([`ChatTemplate::missing`]): every render
    /// is [`TextError::NoChatTemplate`].
    missing: bool,
    /// Whether the template writes a leading system message's content (Gemma 2's raises
    /// instead): where it does not, a render folds that message into the next one, as
    /// llama.cpp does ([`ChatTemplate::fold_system`]). Probed at the first render that has a
    /// system message, under the origin the template is known by then.
    system_role: std::sync::OnceLock<bool>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles a template source; BOS/EOS are the strings the template sees as
    /// `bos_token` / `eos_token`.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self> {
        Self::compile(
            source.into(),
            "(template given inline)",
            bos_token.into(),
            eos_token.into(),
        )
    }

    /// [`ChatTemplate::new`], naming `origin` in errors. Constant expressions are sized
    /// before minijinja folds them ([`template_size::check_folding`]); compiling runs under
    /// the fixed part of the memory budget.
    fn compile(
        source: String,
        origin: impl std::fmt::Display,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self> {
        let origin = origin.to_string();
        template_size::check_folding(&source).map_err(|what| TextError::TemplateBudget {
            origin: origin.clone(),
            what,
        })?;
        let mut env = Environment::new();
        env.set_fuel(Some(FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        template_size::register(&mut env);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("{RAISED}{msg}"),
                ))
            },
        );
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", strftime_now);
        guarded(
            &origin,
            "compiling",
            MAX_MEMORY_FIXED,
            MAX_CPU_FIXED,
            || env.add_template_owned(TEMPLATE_NAME, generation_blocks(&source)),
        )?
        .map_err(|e| TextError::Template(describe(&e)))?;
        let t = ChatTemplate {
            source,
            origin,
            env,
            bos_token,
            eos_token,
            missing: false,
            system_role: std::sync::OnceLock::new(),
        };
        Ok(t)
    }

    /// Whether a render of a system and a user message writes the system message's content:
    /// llama.cpp's `supports_system_role` capability (it watches the content being read; a
    /// template that raises on a system message, or drops it, does not support one).
    fn writes_system_content(&self) -> bool {
        const PROBE: &str = "System message";
        let probe = [Message::system(PROBE), Message::user("User message")];
        matches!(
            self.render_as_given(&probe, true, &TemplateArgs::default()),
            Ok((text, _)) if text.contains(PROBE)
        )
    }

    /// llama.cpp's workaround for templates without a system role
    /// (`system_message_not_supported`): a leading system message is prepended to the next
    /// message's content with a newline, or dropped when it is the only one.
    fn fold_system<'m>(&self, messages: &'m [Message]) -> std::borrow::Cow<'m, [Message]> {
        match messages {
            [first, rest @ ..]
                if first.role == Role::System
                    && !*self
                        .system_role
                        .get_or_init(|| self.writes_system_content()) =>
            {
                let mut folded = rest.to_vec();
                if let Some(next) = folded.first_mut() {
                    next.content = format!("{}\n{}", first.content, next.content);
                }
                std::borrow::Cow::Owned(folded)
            }
            _ => std::borrow::Cow::Borrowed(messages),
        }
    }

    /// A Jinja template file (`--chat-template FILE`), with the tokenizer's BOS/EOS strings,
    /// checked like a model's own ([`ChatTemplate::with_origin`]).
    pub fn from_file(path: &Path, tokenizer: &Tokenizer) -> Result<Self> {
        let source = std::fs::read_to_string(path).map_err(|e| TextError::io(path, e))?;
        Self::compile(
            source,
            path.display(),
            tokenizer.bos_token().into(),
            tokenizer.eos_token().into(),
        )
        .map_err(|e| match e {
            TextError::Template(msg) => TextError::Template(format!("{}: {msg}", path.display())),
            other => other,
        })?
        .with_origin(path.display())
    }

    /// The stand-in for a model without a template (a base model): loading succeeds, raw
    /// prompts can be generated, and any chat render is [`TextError::NoChatTemplate`].
    pub fn missing(origin: impl std::fmt::Display) -> Result<Self> {
        let mut t = Self::new("", "", "")?;
        t.origin = origin.to_string();
        t.missing = true;
        Ok(t)
    }

    /// Whether this is [`ChatTemplate::missing`].
    pub fn is_missing(&self) -> bool {
        self.missing
    }

    /// Names the file the template came from (used in every error message) and checks on a
    /// short probe conversation that the template renders within its budget: a template that
    /// runs out of fuel, output or memory there is refused now rather than on every prompt.
    /// Ordinary render errors (a template that raises on the probe) are not refused here.
    pub fn with_origin(mut self, origin: impl std::fmt::Display) -> Result<Self> {
        self.origin = origin.to_string();
        let probe = [
            Message::system("You are a helpful assistant."),
            Message::user("Hello! What is 2 + 2?"),
            Message::assistant("2 + 2 = 4."),
            Message::user("Thanks."),
        ];
        for messages in [&probe[1..2], &probe[..]] {
            match self.render(messages, true) {
                Err(e @ TextError::TemplateBudget { .. }) => return Err(e),
                _ => continue,
            }
        }
        Ok(self)
    }

    /// The template a GGUF file carries (`tokenizer.chat_template`), with the tokenizer's
    /// BOS/EOS strings.
    pub fn from_gguf(content: &Content, tokenizer: &Tokenizer) -> Result<Self> {
        let source = match content.metadata.get("tokenizer.chat_template") {
            Some(v) => v.to_string().map_err(|e| TextError::Metadata {
                key: "tokenizer.chat_template".to_string(),
                msg: e.to_string(),
            })?,
            None => return Err(TextError::NoChatTemplate),
        };
        Self::compile(
            source.clone(),
            "GGUF tokenizer.chat_template",
            tokenizer.bos_token().into(),
            tokenizer.eos_token().into(),
        )
    }

    /// The template in a `tokenizer_config.json` (`chat_template`: a string, or a list of
    /// `{name, template}` of which `default` is used).
    pub fn from_tokenizer_config(path: &Path, tokenizer: &Tokenizer) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| TextError::io(path, e))?;
        let json: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| TextError::Template(format!("{}: {e}", path.display())))?;
        let source = match json.get("chat_template") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str())
                .map(str::to_string)
                .ok_or_else(|| {
                    TextError::Template(format!(
                        "{}: chat_template list has no `default` entry",
                        path.display()
                    ))
                })?,
            Some(_) => {
                return Err(TextError::Template(format!(
                    "{}: chat_template is neither a string nor a list",
                    path.display()
                )))
            }
            None => return Err(TextError::NoChatTemplate),
        };
        Self::compile(
            source,
            path.display(),
            tokenizer.bos_token().into(),
            tokenizer.eos_token().into(),
        )?
        .with_origin(path.display())
    }

    /// The Jinja source, for manifests.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the
    /// assistant's reply begins.
    ///
    /// The render runs under the template's budget (module docs); going over it is a
    /// [`TextError::TemplateBudget`] naming the model file (or, for memory and CPU time, a
    /// one-line message and exit, see [`crate::budget::alloc_budget`] and [`crate::budget::cpu_budget`]).
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &TemplateArgs::default())
    }

    /// [`ChatTemplate::render`] with extra template variables and the date `strftime_now`
    /// renders.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        args: &TemplateArgs,
    ) -> Result<String> {
        Ok(self
            .render_counted_with(messages, add_generation_prompt, args)?
            .0)
    }

    /// The reasoning family of this template (read from its source).
    pub fn reasoning_format(&self) -> ReasoningFormat {
        ReasoningFormat::from_template(&self.source)
    }

    /// [`ChatTemplate::render`], also returning the fuel the render consumed.
    pub fn render_counted(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<(String, u64)> {
        self.render_counted_with(messages, add_generation_prompt, &TemplateArgs::default())
    }

    fn render_counted_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        args: &TemplateArgs,
    ) -> Result<(String, u64)> {
        if self.missing {
            return Err(TextError::NoChatTemplate);
        }
        self.render_as_given(&self.fold_system(messages), add_generation_prompt, args)
    }

    /// [`ChatTemplate::render_counted_with`] of `messages` as they are (no system fold).
    fn render_as_given(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        args: &TemplateArgs,
    ) -> Result<(String, u64)> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TextError::Template(format!("{}: {}", self.origin, describe(&e))))?;
        let input: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.as_str().len())
            .sum::<usize>()
            + self.bos_token.len()
            + self.eos_token.len()
            + args
                .kwargs
                .iter()
                .map(|(k, v)| k.len() + v.to_string().len())
                .sum::<usize>();
        let max_output =
            MAX_OUTPUT_FIXED.saturating_add(input.saturating_mul(MAX_OUTPUT_PER_INPUT_BYTE));
        let max_memory = MAX_MEMORY_FIXED
            .saturating_add(input.saturating_mul(MAX_MEMORY_PER_INPUT_BYTE))
            .saturating_add(max_output.saturating_mul(2));
        let mut out = CappedWriter {
            buf: Vec::new(),
            cap: max_output,
            over: false,
        };
        let date = args.date.unwrap_or_else(TemplateDate::today);
        // llama.cpp's extra context: the render's date as `date_string` (Llama 3.x's "Today
        // Date") and `datetime`; the kwargs may replace them, as in llama.cpp.
        let mut extra = BTreeMap::new();
        for (name, format) in [("date_string", "%d %b %Y"), ("datetime", "%b %d %Y")] {
            let text = date.strftime(format).map_err(TextError::Template)?;
            extra.insert(name.to_string(), serde_json::Value::String(text));
        }
        extra.extend(args.kwargs.iter().map(|(k, v)| (k.clone(), v.clone())));
        // Named variables win over the kwargs (minijinja's `..` is a fallback).
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            __candor_template_date => date.to_string(),
            ..minijinja::Value::from_serialize(&extra)
        };
        let max_cpu =
            MAX_CPU_FIXED + MAX_CPU_PER_INPUT_MIB.mul_f64(input as f64 / (1 << 20) as f64);
        let rendered = guarded(&self.origin, "rendering", max_memory, max_cpu, || {
            tmpl.render_to_write(ctx, &mut out)
                .map(|state| state.fuel_levels().map_or(0, |(used, _)| used))
        })?;
        let budget = |what: String| TextError::TemplateBudget {
            origin: self.origin.clone(),
            what,
        };
        let fuel = match rendered {
            Ok(fuel) => fuel,
            Err(_) if out.over => {
                return Err(budget(format!(
                    "output over {max_output} bytes for {input} bytes of messages"
                )))
            }
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                return Err(budget(format!("more than {FUEL} instructions")))
            }
            Err(e) if marked(&e, template_size::OVER_BUDGET).is_some() => {
                return Err(budget(
                    marked(&e, template_size::OVER_BUDGET).unwrap_or_default(),
                ))
            }
            Err(e) => {
                return Err(match marked(&e, RAISED) {
                    Some(msg) => TextError::TemplateRaised(msg),
                    None => TextError::Template(format!("{}: {}", self.origin, describe(&e))),
                })
            }
        };
        let text = String::from_utf8(out.buf).map_err(|_| {
            TextError::Template(format!("{}: rendered text is not UTF-8", self.origin))
        })?;
        Ok((text, fuel))
    }

    /// Token ids that end a turn: EOS, plus the end-of-turn tokens this template writes that
    /// are in the vocabulary (sorted, no duplicates).
    pub fn stop_token_ids(&self, tokenizer: &Tokenizer) -> Vec<u32> {
        let mut ids = vec![tokenizer.eos_token_id()];
        // Harmony (gpt-oss): `<|end|>` closes a message the model continues after (its
        // analysis, before the final channel); `<|return|>` and `<|call|>` end the turn.
        let harmony = self.reasoning_format() == ReasoningFormat::Harmony;
        let ends: &[&str] = if harmony {
            &["<|return|>", "<|call|>"]
        } else {
            END_OF_TURN
        };
        for tok in ends {
            if harmony || self.source.contains(tok) {
                if let Some(id) = tokenizer.token_to_id(tok) {
                    ids.push(id);
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// transformers' `{% generation %}…{% endgeneration %}` (it marks the assistant's tokens for
/// training masks and renders its body as it is; LFM2.5's and Laguna's templates use it),
/// which minijinja does not know: as `{% if true %}…{% endif %}`, each tag's whitespace control
/// kept.
fn generation_blocks(source: &str) -> String {
    static TAG: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}").expect("valid regex")
    });
    TAG.replace_all(source, |c: &regex::Captures| {
        let body = if c.get(2).is_some() {
            "endif"
        } else {
            "if true"
        };
        format!("{{%{} {body} {}%}}", &c[1], &c[3])
    })
    .into_owned()
}

/// transformers' `strftime_now(format)`, formatting the render's date ([`TemplateArgs::date`])
/// instead of the clock.
fn strftime_now(
    state: &minijinja::State,
    format: String,
) -> std::result::Result<String, minijinja::Error> {
    let fail = |msg: String| minijinja::Error::new(ErrorKind::InvalidOperation, msg);
    let date: TemplateDate = state
        .lookup(DATE_VAR)
        .and_then(|v| v.as_str().map(str::to_string))
        .ok_or_else(|| fail("strftime_now: the render has no date".into()))?
        .parse()
        .map_err(|e| fail(format!("strftime_now: {e}")))?;
    date.strftime(&format)
        .map_err(|e| fail(format!("strftime_now({format:?}): {e}")))
}

/// The render's output, refused past `cap` bytes.
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
    over: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.cap {
            self.over = true;
            return Err(std::io::Error::other(
                "chat template output budget exceeded",
            ));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=indent)`, so
/// `", "` and `": "` separators and no HTML escaping (minijinja's own differs in both).
/// `ensure_ascii=True` writes every other character as `\uxxxx` (a UTF-16 surrogate pair past
/// U+FFFF), as Python and llama.cpp do; GLM-4.7's template passes `ensure_ascii=False`.
fn tojson(
    value: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<minijinja::Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    template_size::check_json_indent(&value, indent.unwrap_or(0))?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_python_json(&json, indent, 0, &mut out);
    if ensure_ascii == Some(true) {
        out = ascii_json(&out);
    }
    Ok(minijinja::Value::from_safe_string(out))
}

/// JSON text with every non-ASCII character escaped (they occur only inside strings).
fn ascii_json(json: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        }
    }
    out
}

fn write_python_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_python_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A minijinja error with its cause chain, on one line.
fn describe(err: &minijinja::Error) -> String {
    let mut msg = err.to_string();
    let mut cause = std::error::Error::source(err);
    while let Some(c) = cause {
        msg.push_str(": ");
        msg.push_str(&c.to_string());
        cause = c.source();
    }
    msg
}

/// A panic inside minijinja (a size computation that overflows, `'ab' * 2**62`) as an error.
/// Runs `f` (compiling or rendering the template, named by `when` in messages) under the
/// memory and CPU-time budgets, which end the process with a one-line message naming
/// `origin`; a panic (minijinja refusing a value too large to build) is a budget error.
fn guarded<T>(
    origin: &str,
    when: &str,
    memory: usize,
    cpu: Duration,
    f: impl FnOnce() -> T,
) -> Result<T> {
    let oom = format!(
        "{origin}: chat template exceeded its memory budget of {} MiB while {when}",
        memory >> 20
    );
    let slow = format!(
        "{origin}: chat template exceeded its CPU-time budget of {:.1} s while {when}",
        cpu.as_secs_f64()
    );
    cpu_budget::with_cpu_budget(cpu, &slow, || {
        alloc_budget::with_budget(memory, &oom, || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        })
    })
    .map_err(|e| TextError::Template(format!("{origin}: {e}")))?
    .map_err(|panic| panicked(origin, panic))
}

fn panicked(origin: &str, panic: Box<dyn std::any::Any + Send>) -> TextError {
    let msg = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    TextError::TemplateBudget {
        origin: origin.to_string(),
        what: format!("a value too large to build ({msg})"),
    }
}

/// The message after `marker` in an error the template's own code raised (`raise_exception`,
/// [`RAISED`], or a size check, [`template_size::OVER_BUDGET`]), if that is what failed.
fn marked(err: &minijinja::Error, marker: &str) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(mj) = e.downcast_ref::<minijinja::Error>() {
            if let Some(rest) = mj.detail().and_then(|d| d.strip_prefix(marker)) {
                return Some(rest.to_string());
            }
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenizer::testutil::content;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nBe kind.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_gguf(&content(Some("smollm"), false)).unwrap()
    }

    #[test]
    fn renders_chatml_with_default_system() {
        let t = ChatTemplate::new(CHATML, "<s>", "<|im_end|>").unwrap();
        let out = t.render(&[Message::user("Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t
            .render(&[Message::system("S"), Message::user("Hi")], false)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn python_methods_bos_and_trimmed_blocks() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {{ m.content.strip().upper() }}|{% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t.render(&[Message::user("  a b  ")], false).unwrap();
        assert_eq!(out, "<s>  A B|</s>");
    }

    #[test]
    fn tojson_writes_like_python() {
        let src =
            "{{ {'a': [1, 'é<'], 'b': {}} | tojson }}|{{ [1, {'k': none}] | tojson(indent=2) }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            "{\"a\": [1, \"é<\"], \"b\": {}}|[\n  1,\n  {\n    \"k\": null\n  }\n]"
        );
        // `ensure_ascii` (GLM-4.7 passes it false): Python's `\uxxxx` escapes when true.
        let src = "{{ 'é😀' | tojson(ensure_ascii=False) }}|{{ {'é': 'xé😀'} | tojson(ensure_ascii=True) }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(
            t.render(&[], false).unwrap(),
            "\"é😀\"|{\"\\u00e9\": \"x\\u00e9\\ud83d\\ude00\"}"
        );
    }

    #[test]
    fn raise_exception_is_typed() {
        let src = "{% if messages[0]['content'] == 'boom' %}{{ raise_exception('No boom') }}{% endif %}ok";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(t.render(&[Message::user("x")], true).unwrap(), "ok");
        let err = t.render(&[Message::user("boom")], true).unwrap_err();
        match err {
            TextError::TemplateRaised(msg) => assert_eq!(msg, "No boom"),
            other => panic!("expected TemplateRaised, got {other:?}"),
        }
    }

    /// A template without a system role (Gemma 2's raises on one; others drop it) gets the
    /// system message folded into the next one, as llama.cpp does; templates that write it
    /// get it as it is.
    #[test]
    fn a_system_message_is_folded_where_the_template_has_no_system_role() {
        let each = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
        let raises = format!(
            "{{% if messages[0]['role'] == 'system' %}}{{{{ raise_exception('System role not supported') }}}}{{% endif %}}{each}"
        );
        let drops = "{% for m in messages %}{% if m.role != 'system' %}<{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}";
        let conv = [
            Message::system("Be brief."),
            Message::user("Hi"),
            Message::assistant("Hello"),
        ];
        for src in [raises.as_str(), drops] {
            let t = ChatTemplate::new(src, "", "").unwrap();
            assert_eq!(
                t.render(&conv, false).unwrap(),
                "<user>Be brief.\nHi<assistant>Hello",
                "{src}"
            );
        }
        // Alone, the system message is dropped.
        let t = ChatTemplate::new(drops, "", "").unwrap();
        assert_eq!(t.render(&conv[..1], false).unwrap(), "");
        let t = ChatTemplate::new(each, "", "").unwrap();
        assert_eq!(
            t.render(&conv, false).unwrap(),
            "<system>Be brief.<user>Hi<assistant>Hello"
        );
    }

    /// transformers' `{% generation %}` blocks render their body, whitespace control kept;
    /// `{% break %}` and `{% continue %}` work as in Jinja (LFM2.5's, Kimi's and Command
    /// R7B's templates use them).
    #[test]
    fn generation_blocks_and_loop_controls() {
        let src = "{%- for m in messages -%}{%- if m.content == 'skip' %}{% continue %}{% endif -%}\n[{%- generation -%}\n {{ m.content }} \n{%- endgeneration -%}]{% if loop.index == 3 %}{% break %}{% endif %}{%- endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let conv = [
            Message::user("skip"),
            Message::assistant("a"),
            Message::user("b"),
            Message::assistant("c"),
        ];
        // The first message is skipped, the loop stops after its third: "b".
        assert_eq!(t.render(&conv, false).unwrap(), "[a][b]");
        // The source is kept as given (manifests hash it).
        assert!(t.source().contains("{%- generation -%}"));
        assert_eq!(
            generation_blocks("{% generation %}x{%+ endgeneration -%}"),
            "{% if true %}x{%+ endif -%}"
        );
    }

    /// llama.cpp's `date_string` and `datetime` carry the render's date (Llama 3.x's "Today
    /// Date"); a kwarg of the same name replaces them.
    #[test]
    fn date_string_and_datetime_are_the_render_date() {
        let t = ChatTemplate::new("{{ date_string }}|{{ datetime }}", "", "").unwrap();
        let mut args = TemplateArgs {
            date: Some("2024-07-09".parse().unwrap()),
            ..TemplateArgs::default()
        };
        assert_eq!(
            t.render_with(&[], false, &args).unwrap(),
            "09 Jul 2024|Jul 09 2024"
        );
        args.kwargs
            .insert("date_string".into(), serde_json::Value::from("then"));
        assert_eq!(
            t.render_with(&[], false, &args).unwrap(),
            "then|Jul 09 2024"
        );
    }

    #[test]
    fn broken_templates_are_errors() {
        let err = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
        assert!(matches!(err, TextError::Template(_)), "{err:?}");
        let t = ChatTemplate::new("{{ messages | no_such_filter }}", "", "");
        let err = match t {
            Ok(t) => t.render(&[Message::user("x")], true).unwrap_err(),
            Err(e) => e,
        };
        assert!(err.to_string().contains("no_such_filter"), "{err}");
    }

    #[test]
    fn stop_tokens_are_eos_and_template_end_of_turn() {
        let tok = tokenizer();
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        // EOS is <|im_end|> = 2 here; <|endoftext|> is in the vocab but not in the template.
        assert_eq!(t.stop_token_ids(&tok), vec![2]);
        let t = ChatTemplate::new("{{ '<|endoftext|>' }}", "", "").unwrap();
        assert_eq!(t.stop_token_ids(&tok), vec![0, 2]);
    }

    #[test]
    fn gguf_template_and_tokenizer_config() {
        let tok = tokenizer();
        let mut c = content(Some("smollm"), false);
        assert!(matches!(
            ChatTemplate::from_gguf(&c, &tok),
            Err(TextError::NoChatTemplate)
        ));
        c.metadata.insert(
            "tokenizer.chat_template".into(),
            candle_core::quantized::gguf_file::Value::String(CHATML.into()),
        );
        let t = ChatTemplate::from_gguf(&c, &tok).unwrap();
        assert_eq!(t.source(), CHATML);

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer_config.json");
        let cfg = serde_json::json!({"chat_template": [
            {"name": "tool_use", "template": "T"},
            {"name": "default", "template": "{{ eos_token }}D"}
        ]});
        std::fs::write(&p, cfg.to_string()).unwrap();
        let t = ChatTemplate::from_tokenizer_config(&p, &tok).unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "<|im_end|>D");
    }

    /// The real templates of the supported families render a long conversation well inside
    /// the budget.
    #[test]
    fn real_templates_render_well_inside_the_budget() {
        let templates: &[(&str, &str, &str, &str)] = &[
            (
                "llama-3.1",
                include_str!(
                    "../../tests/fixtures/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"
                ),
                "<|begin_of_text|>",
                "<|eot_id|>",
            ),
            (
                "mistral-nemo",
                include_str!(
                    "../../tests/fixtures/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja"
                ),
                "<s>",
                "</s>",
            ),
            (
                "qwen2.5",
                include_str!("../../tests/fixtures/templates/Qwen-Qwen2.5-7B-Instruct.jinja"),
                "",
                "<|im_end|>",
            ),
            (
                "gemma-2",
                include_str!("../../tests/fixtures/templates/google-gemma-2-2b-it.jinja"),
                "<bos>",
                "<eos>",
            ),
            (
                "phi-3.5",
                include_str!(
                    "../../tests/fixtures/templates/microsoft-Phi-3.5-mini-instruct.jinja"
                ),
                "<s>",
                "<|endoftext|>",
            ),
            ("chatml", CHATML, "", "<|im_end|>"),
        ];
        // 40 alternating turns of 2 KB each: longer than any protocol's dialogue.
        let turns: Vec<Message> = (0..40)
            .map(|i| {
                let text = format!("turn {i}: {}", "word ".repeat(400));
                if i % 2 == 0 {
                    Message::user(text)
                } else {
                    Message::assistant(text)
                }
            })
            .collect();
        for (name, src, bos, eos) in templates {
            let t = ChatTemplate::new(*src, *bos, *eos)
                .and_then(|t| t.with_origin(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let (text, fuel) = t
                .render_counted(&turns, true)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(text.contains("turn 39: word"), "{name}");
            eprintln!("{name}: {fuel} instructions for 40 turns");
            assert!(
                fuel < FUEL / 20,
                "{name} used {fuel} of {FUEL} instructions"
            );
        }
    }

    /// Qwen3, gpt-oss (Harmony), QwQ (a template that opens `<think>` itself), Qwen3.5
    /// (which opens `<think>` unless `enable_thinking` is false), Ministral 3 Reasoning
    /// (`[THINK]`, asked for by its default system prompt), Mistral Small 3.2 (`strftime_now`
    /// in its default system prompt), Llama 3.1 (llama.cpp's `date_string`), Gemma 2 (no
    /// system role: the system message folded into the first user message) and SmolLM3
    /// (`/think`, `/no_think`), DeepSeek-V3.1 (`thinking`, falling back to `enable_thinking`),
    /// GLM-4.7-Flash (`enable_thinking`, `clear_thinking`), GLM-4.5/4.6/4.7 (`enable_thinking`:
    /// `/nothink` on each user message and an empty think block) and DeepSeek-R1 (the distills'
    /// template and llama.cpp's own: `<think>\n` opened in the generation prompt) render every
    /// case exactly as llama.cpp's llama-server renders it (`/apply-template`), with the
    /// thinking switches (`enable_thinking`, `thinking`, `reasoning_effort`) and the date
    /// recorded beside the cases for `strftime_now`. The expected prompts were written by
    /// `tests/fixtures/templates/render_with_llama_server.py`.
    #[test]
    fn real_thinking_templates_render_like_llama_cpp() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        let mut checked = 0;
        for name in [
            "Qwen-Qwen3-0.6B",
            "openai-gpt-oss-120b",
            "Qwen-QwQ-32B",
            "Qwen-Qwen3.5-4B",
            "mistralai-Ministral-3-14B-Reasoning-2512",
            "Mistral-Small-3.2-24B-Instruct-2506",
            "meta-llama-Llama-3.1-8B-Instruct",
            "google-gemma-2-2b-it",
            "HuggingFaceTB-SmolLM3-3B",
            "deepseek-ai-DeepSeek-V3.1",
            "GLM-4.7-Flash",
            "GLM-4.6",
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
            "llama-cpp-deepseek-r1",
        ] {
            let path = dir.join(format!("rendered/{name}.json"));
            let text = std::fs::read_to_string(&path).unwrap();
            let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
            let date: TemplateDate = expected["date"].as_str().unwrap().parse().unwrap();
            let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
            // SmolLM2's BOS/EOS, the model llama-server was started with.
            let t = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").unwrap();
            for case in expected["cases"].as_array().unwrap() {
                let messages: Vec<Message> =
                    serde_json::from_value(case["messages"].clone()).unwrap();
                let kwargs: BTreeMap<String, serde_json::Value> =
                    serde_json::from_value(case["chat_template_kwargs"].clone()).unwrap();
                let kwargs = llama_server_kwargs(kwargs);
                let args = TemplateArgs {
                    kwargs,
                    date: Some(date),
                };
                let got = t.render_with(&messages, true, &args).unwrap();
                assert_eq!(
                    got,
                    case["prompt"].as_str().unwrap(),
                    "{name}: {}",
                    case["name"]
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 64);
        // Another date renders another prompt: the date is what the template stamps.
        let src = std::fs::read_to_string(dir.join("openai-gpt-oss-120b.jinja")).unwrap();
        let t = ChatTemplate::new(src, "", "").unwrap();
        let args = TemplateArgs {
            date: Some("2031-02-03".parse().unwrap()),
            ..TemplateArgs::default()
        };
        let out = t.render_with(&[Message::user("Hi")], true, &args).unwrap();
        assert!(out.contains("Current date: 2031-02-03\n"), "{out}");
    }

    /// The template variables llama-server renders a request's `chat_template_kwargs` with
    /// where Candor passes only the kwargs: `enable_thinking: true` (its `--reasoning auto`)
    /// and `preserve_reasoning: true` (its `--reasoning-preserve` default), which llama.cpp
    /// turns into `preserve_thinking`, `clear_thinking`, `truncate_history_thinking` and
    /// `drop_thinking` (`caps_apply_preserve_reasoning`; a kwarg of the same name wins), as
    /// it turns `reasoning_effort` into `reasoning_strength` too.
    fn llama_server_kwargs(
        mut kwargs: BTreeMap<String, serde_json::Value>,
    ) -> BTreeMap<String, serde_json::Value> {
        use serde_json::Value;
        kwargs
            .entry("enable_thinking".into())
            .or_insert(Value::Bool(true));
        let preserve = kwargs
            .entry("preserve_reasoning".into())
            .or_insert(Value::Bool(true))
            .as_bool();
        if let Some(on) = preserve {
            for (name, value) in [
                ("preserve_thinking", on),
                ("clear_thinking", !on),
                ("truncate_history_thinking", !on),
                ("drop_thinking", !on),
            ] {
                kwargs.entry(name.into()).or_insert(Value::Bool(value));
            }
        }
        if let Some(effort) = kwargs.get("reasoning_effort").cloned() {
            if effort.as_str().is_some_and(|e| !e.is_empty()) {
                kwargs.entry("reasoning_strength".into()).or_insert(effort);
            }
        }
        kwargs
    }

    /// A later turn does not resend an earlier reply's reasoning where the template does not:
    /// with Candor's defaults (no kwargs) and with each thinking switch, DeepSeek-V3.1 and
    /// DeepSeek-R1 send an earlier answer from after its `</think>`, GLM-4.7-Flash drops the
    /// reasoning of turns before the last user message unless `clear_thinking` is false (as
    /// llama-server's default `preserve_reasoning` passes it), and GLM-4.5/4.6/4.7's template
    /// drops it always (an empty `<think></think>` in its place). Candor sends the answer alone
    /// anyway; its render is the same as llama-server's (`rendered/*.json`).
    #[test]
    fn deepseek_and_glm_do_not_resend_earlier_reasoning() {
        use crate::text::reasoning::Thinking;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        let history = [
            Message::system("You are a careful grader."),
            Message::user("What is 2 + 2?"),
            Message::assistant("<think>\nAdd them.\n</think>\n\n2 + 2 = 4."),
            Message::user("Are you sure? Answer again."),
        ];
        for name in [
            "deepseek-ai-DeepSeek-V3.1",
            "GLM-4.7-Flash",
            "GLM-4.6",
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
            "llama-cpp-deepseek-r1",
        ] {
            let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
            let t = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").unwrap();
            for thinking in [None, Some(Thinking::Off), Some(Thinking::On)] {
                let args = TemplateArgs {
                    kwargs: thinking
                        .map(|t| t.template_kwargs())
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect(),
                    date: None,
                };
                let out = t.render_with(&history, true, &args).unwrap();
                assert!(!out.contains("Add them."), "{name} {thinking:?}: {out:?}");
                assert!(out.contains("2 + 2 = 4."), "{name} {thinking:?}: {out:?}");
            }
            if name == "GLM-4.7-Flash" {
                let args = TemplateArgs {
                    kwargs: [("clear_thinking".to_string(), serde_json::json!(false))].into(),
                    date: None,
                };
                let out = t.render_with(&history, true, &args).unwrap();
                assert!(
                    out.contains("<think>Add them.</think>2 + 2 = 4."),
                    "{out:?}"
                );
            }
            if name == "GLM-4.6" {
                // No `clear_thinking` here: llama-server's variables change nothing.
                let args = TemplateArgs {
                    kwargs: llama_server_kwargs(BTreeMap::new()),
                    date: None,
                };
                let out = t.render_with(&history, true, &args).unwrap();
                assert!(
                    out.contains("<|assistant|>\n<think></think>\n2 + 2 = 4.<|user|>"),
                    "{out:?}"
                );
            }
        }
    }

    /// `--thinking on|off` reaches DeepSeek-V3.1's switch, `thinking`: in llama.cpp's copy
    /// (which falls back to `enable_thinking`) and in its body under the published template's
    /// header, which reads `thinking` alone; the prompts are llama-server's
    /// (`rendered/*.json`).
    #[test]
    fn thinking_switch_reaches_deepseek_v3_1() {
        use crate::text::reasoning::Thinking;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        let copy = std::fs::read_to_string(dir.join("deepseek-ai-DeepSeek-V3.1.jinja")).unwrap();
        let body = &copy[copy.find("{%- set ns = namespace(").unwrap()..];
        let published = format!(
            "{{% if not add_generation_prompt is defined %}}{{% set add_generation_prompt = false %}}{{% endif %}}{{% if not thinking is defined %}}{{% set thinking = false %}}{{% endif %}}{body}"
        );
        let rendered: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("rendered/deepseek-ai-DeepSeek-V3.1.json")).unwrap(),
        )
        .unwrap();
        let prompt = |case: &str| {
            rendered["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == case)
                .unwrap()["prompt"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let user = [Message::user("Hi")];
        for src in [copy.as_str(), published.as_str()] {
            let t = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").unwrap();
            for (switch, case) in [
                (Thinking::On, "user, thinking on"),
                (Thinking::High, "user, thinking on"),
                (Thinking::Off, "user, thinking off"),
            ] {
                let args = TemplateArgs {
                    kwargs: switch
                        .template_kwargs()
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect(),
                    date: None,
                };
                assert_eq!(
                    t.render_with(&user, true, &args).unwrap(),
                    prompt(case),
                    "{switch}"
                );
            }
        }
        // Without a switch the published template does not think (its default); llama.cpp's
        // copy follows `enable_thinking`, which Candor then leaves undefined: no thinking either.
        let t = ChatTemplate::new(published, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(t.render(&user, true).unwrap(), prompt("user, thinking off"));
        let t = ChatTemplate::new(copy, "<|im_start|>", "<|im_end|>").unwrap();
        assert_eq!(t.render(&user, true).unwrap(), prompt("user, thinking off"));
    }

    /// GLM-4.x ends a turn by opening the next (`<|user|>`, `<|observation|>`: the GGUF's
    /// `eot` and `eom`), DeepSeek with `<｜end▁of▁sentence｜>`: each stops a chat where the
    /// vocabulary has it, beside EOS.
    #[test]
    fn glm_and_deepseek_turn_ends_stop() {
        use candle_core::quantized::gguf_file::Value;
        let mut c = content(Some("smollm"), false);
        let added = ["<|user|>", "<|observation|>", "<｜end▁of▁sentence｜>"];
        let Some(Value::Array(tokens)) = c.metadata.get_mut("tokenizer.ggml.tokens") else {
            panic!("no tokens")
        };
        let first = tokens.len() as u32;
        tokens.extend(added.iter().map(|t| Value::String(t.to_string())));
        let Some(Value::Array(types)) = c.metadata.get_mut("tokenizer.ggml.token_type") else {
            panic!("no token types")
        };
        types.extend(added.iter().map(|_| Value::I32(3)));
        let tok = Tokenizer::from_gguf(&c).unwrap();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        for (name, want) in [
            ("GLM-4.7-Flash", vec![2, first, first + 1]),
            ("GLM-4.6", vec![2, first, first + 1]),
            ("deepseek-ai-DeepSeek-V3.1", vec![2, first + 2]),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                vec![2, first + 2],
            ),
            ("llama-cpp-deepseek-r1", vec![2, first + 2]),
        ] {
            let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
            let t = ChatTemplate::new(src, "", "").unwrap();
            assert_eq!(t.stop_token_ids(&tok), want, "{name}");
        }
    }

    #[test]
    fn strftime_now_renders_the_given_date_and_refuses_unknown_directives() {
        let t = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}", "", "").unwrap();
        let args = TemplateArgs {
            date: Some("2024-07-09".parse().unwrap()),
            ..TemplateArgs::default()
        };
        assert_eq!(t.render_with(&[], false, &args).unwrap(), "09 Jul 2024");
        // Without a date: today's.
        assert_eq!(
            t.render(&[], false).unwrap(),
            TemplateDate::today().strftime("%d %b %Y").unwrap()
        );
        let t = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "").unwrap();
        let err = t.render_with(&[], false, &args).unwrap_err().to_string();
        assert!(err.contains("%Q"), "{err}");
        // Named variables cannot be overridden by kwargs.
        let t = ChatTemplate::new("{{ add_generation_prompt }}|{{ x }}", "", "").unwrap();
        let args = TemplateArgs {
            kwargs: [
                ("add_generation_prompt".to_string(), serde_json::json!("no")),
                ("x".to_string(), serde_json::json!(3)),
            ]
            .into(),
            date: None,
        };
        assert_eq!(t.render_with(&[], true, &args).unwrap(), "true|3");
    }

    #[test]
    fn harmony_stops_on_return_and_call_not_end() {
        let src = include_str!("../../tests/fixtures/templates/openai-gpt-oss-120b.jinja");
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(t.reasoning_format(), ReasoningFormat::Harmony);
        // The smollm test vocabulary has none of Harmony's tokens: only EOS stops.
        let tok = tokenizer();
        assert_eq!(t.stop_token_ids(&tok), vec![tok.eos_token_id()]);
    }

    fn refused_quickly(src: &str) -> String {
        let start = std::time::Instant::now();
        let err = ChatTemplate::new(src, "", "")
            .and_then(|t| t.with_origin("models/hostile.gguf"))
            .unwrap_err();
        assert!(start.elapsed().as_secs_f64() < 5.0, "{:?}", start.elapsed());
        assert!(matches!(err, TextError::TemplateBudget { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.starts_with("models/hostile.gguf: "), "{msg}");
        msg
    }

    #[test]
    fn endless_loops_and_huge_output_are_refused_at_load() {
        let msg = refused_quickly(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        );
        assert!(msg.contains("output over"), "{msg}");
        let msg = refused_quickly(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        );
        assert!(msg.contains("instructions"), "{msg}");
        // A template that is fine on the probe but explodes with long input is refused when
        // it renders that input.
        let t = ChatTemplate::new(
            "{% for m in messages %}{% for c in m.content %}{{ m.content }}{% endfor %}{% endfor %}",
            "",
            "",
        )
        .unwrap()
        .with_origin("m.gguf")
        .unwrap();
        let err = t
            .render(&[Message::user("y".repeat(5000))], true)
            .unwrap_err();
        assert!(matches!(err, TextError::TemplateBudget { .. }), "{err:?}");
    }

    /// Values whose size is known before they are built are refused before they are built:
    /// constants folded while compiling, and widening filters and methods while rendering.
    #[test]
    fn single_large_values_are_refused_before_they_are_built() {
        for (src, want) in [
            (
                "{{ 'a' * 1000000000 }}",
                "folds to a string of 1000000000 bytes",
            ),
            ("{{ 'ab' * 10**18 }}", "folds to a string"),
            (
                "{{ ([1, 2, 3] * 1000000000) ~ 'x' }}",
                "folds to a sequence",
            ),
            ("{{ 'a\nb' | indent(1000000000) }}", "indent would build"),
            (
                "{{ messages[0].content | indent(4294967295) }}",
                "indent would build",
            ),
            (
                "{{ ('a' * 1000) | replace('a', 'a' * 100000) }}",
                "replace would build",
            ),
            (
                "{{ ('a' * 1000).replace('a', 'b' * 100000) }}",
                "replace would build",
            ),
            (
                "{{ range(100000) | join('x' * 100000) }}",
                "join would build",
            ),
            ("{{ ('x' * 1000).join(range(100000)) }}", "join would build"),
            (
                "{{ [1] | batch(1000000000, fill_with='x') | list }}",
                "batch would build",
            ),
            (
                "{{ [[[[1]]]] | tojson(indent=1000000000) }}",
                "tojson would build",
            ),
        ] {
            // (A runtime repetition by a variable, `{% set n = 2**62 %}{{ 'ab' * n }}`, is
            // stopped by the memory budget, which ends the process: the fuzz target's child
            // processes cover it.)
            // From a file, so that refusals while compiling name it too.
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("hostile.jinja");
            std::fs::write(&path, src).unwrap();
            let start = std::time::Instant::now();
            let err = ChatTemplate::from_file(&path, &tokenizer()).unwrap_err();
            assert!(
                start.elapsed().as_secs_f64() < 5.0,
                "{src}: {:?}",
                start.elapsed()
            );
            assert!(
                matches!(err, TextError::TemplateBudget { .. }),
                "{src}: {err:?}"
            );
            let msg = err.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            assert!(msg.starts_with(&format!("{}: ", path.display())), "{msg}");
            assert!(msg.contains(want), "{src}: {msg}");
        }
        // `*` repeats a sequence lazily: a count known only when rendering, or over 100, is
        // refused while loading (an operator such as `in` would walk it on one instruction).
        for (src, want) in [
            (
                "{% set n = 10**9 %}{{ 2 in [1] * n }}",
                "known only when rendering",
            ),
            (
                "{% set n = 10**9 %}{{ (messages * n) | length }}",
                "known only when rendering",
            ),
            ("{{ 2 in [1, x] * 1000 }}", "sequence 1000 times"),
        ] {
            let err = ChatTemplate::new(src, "", "").unwrap_err();
            assert!(
                matches!(err, TextError::TemplateBudget { .. }),
                "{src}: {err:?}"
            );
            assert!(err.to_string().contains(want), "{src}: {err}");
        }
        // Repetitions chained through variables (10^10 items here) still build lazy
        // sequences: the filters that walk one (minijinja charges no fuel for the items a
        // filter walks) are refused by its length.
        let big = "{% set a = [1] * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}";
        for (tail, want) in [
            (
                "{{ a | unique | list }}",
                "unique would walk 10000000000 items",
            ),
            ("{{ a | sort | first }}", "sort would walk"),
            ("{{ a | sum }}", "sum would walk"),
            ("{{ a | max }}", "max would walk"),
            ("{{ a | select('odd') | list }}", "select would walk"),
            (
                "{{ a | map('string') | selectattr('x', 'eq', 1) | list }}",
                "map would walk",
            ),
            ("{{ a | reverse | first }}", "reverse would walk"),
            ("{{ a | join }}", "join would walk"),
            ("{{ a | last }}", "last would walk"),
        ] {
            let src = format!("{big}{tail}");
            let msg = refused_quickly(&src);
            assert!(msg.contains(want), "{src}: {msg}");
        }
        // The same filters at ordinary sizes render as minijinja's own.
        let t = ChatTemplate::new(
            "{{ [3, 1, 2] | sort | list }}|{{ [1, 1, 2] | unique | list }}|{{ [1, 2] | sum }}|{{ [4, 5] | min }}{{ [4, 5] | max }}|{{ [1, 2, 3] | reverse | list }}|{{ [1, 2, 3] | last }}|{{ [1, 2, 3] | slice(2) | list }}|{{ [1, 2, 3] | select('odd') | list }}|{{ [1, 2, 3] | reject('odd') | list }}|{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'eq', 'user') | list | length }}|{{ messages | rejectattr('role', 'eq', 'user') | list | length }}|{{ messages | groupby('role') | length }}|{{ ([1] * 3) | list }}|{% for m in messages %}{{ '-' * loop.index }}{{ loop.index0 * 2 }}{% endfor %}|{{ (messages | length) * 3 }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[Message::user("x"), Message::assistant("y")], true)
                .unwrap(),
            "[1, 2, 3]|[1, 2]|3|45|[3, 2, 1]|3|[[1, 2], [3]]|[1, 3]|[2]|user,assistant|1|1|2|[1, 1, 1]|-0--2|6"
        );
        let t = ChatTemplate::new(
            "{{ 'a\nb' | indent(2, true) }}|{{ 'aa' | replace('a', 'bb') }}|{{ 'aa'.replace('a', 'b', 1) }}|{{ range(3) | join(', ') }}|{{ '-'.join(['x', 'y']) }}|{{ [1, 2, 3] | batch(2, 0) | list }}|{{ 'ab' * 2 }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[Message::user("x")], true).unwrap(),
            "  a\n  b|bbbb|ba|0, 1, 2|x-y|[[1, 2], [3, 0]]|abab"
        );
    }
}
