//! The default model's tokenizer and chat template against llama.cpp's reference fixture
//! (tests/fixtures/reference/): rendered prompts and token ids must match exactly.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use candor::text::chat_template::ChatTemplate;
use candor::text::message::Message;
use candor::text::tokenizer::Tokenizer;
use serde::Deserialize;

use crate::util::default_model;

#[derive(Deserialize)]
struct Conversation {
    id: String,
    messages: Vec<Message>,
}

#[derive(Deserialize)]
struct Tokenized {
    id: String,
    prompt: String,
    ids: Vec<u32>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reference")
        .join(name)
}

fn read_jsonl<T: for<'de> Deserialize<'de>>(name: &str) -> Vec<T> {
    let path = fixture(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

fn load(path: &Path) -> (Tokenizer, ChatTemplate) {
    let mut f = std::fs::File::open(path).unwrap();
    let content = Content::read(&mut f).unwrap();
    let tok = Tokenizer::from_gguf(&content).unwrap();
    let tmpl = ChatTemplate::from_gguf(&content, &tok).unwrap();
    (tok, tmpl)
}

/// Pairs every conversation with its llama.cpp tokenization, by id.
fn cases() -> Vec<(Conversation, Tokenized)> {
    let convs: Vec<Conversation> = read_jsonl("conversations.jsonl");
    let toks: Vec<Tokenized> = read_jsonl("tokenization.jsonl");
    assert!(
        convs.len() >= 16,
        "the fixture has {} conversations",
        convs.len()
    );
    assert_eq!(convs.len(), toks.len(), "one tokenization per conversation");
    convs
        .into_iter()
        .map(|c| {
            let t = toks
                .iter()
                .find(|t| t.id == c.id)
                .unwrap_or_else(|| panic!("no tokenization for `{}`", c.id));
            let t = Tokenized {
                id: t.id.clone(),
                prompt: t.prompt.clone(),
                ids: t.ids.clone(),
            };
            (c, t)
        })
        .collect()
}

#[test]
fn tokenization_matches_llama_cpp_on_every_fixture_conversation() {
    let Some(model) = default_model() else { return };
    let (tok, tmpl) = load(&model);
    let cases = cases();
    let mut failures = Vec::new();
    for (conv, reference) in &cases {
        let prompt = tmpl.render(&conv.messages, true).unwrap();
        if prompt != reference.prompt {
            failures.push(format!(
                "{}: prompt differs\n  ours:      {prompt:?}\n  reference: {:?}",
                conv.id, reference.prompt
            ));
            continue;
        }
        let ids = tok.encode(&prompt).unwrap();
        if ids != reference.ids {
            let at = ids
                .iter()
                .zip(&reference.ids)
                .position(|(a, b)| a != b)
                .unwrap_or(ids.len().min(reference.ids.len()));
            failures.push(format!(
                "{}: ids differ from position {at}: ours {:?}, llama.cpp {:?}",
                conv.id,
                &ids[at..ids.len().min(at + 8)],
                &reference.ids[at..reference.ids.len().min(at + 8)]
            ));
        }
    }
    eprintln!(
        "tokenization: {}/{} conversations identical to llama.cpp",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn decode_round_trips_fixture_prompts() {
    let Some(model) = default_model() else { return };
    let (tok, _) = load(&model);
    for (conv, reference) in cases() {
        assert_eq!(tok.decode(&reference.ids), reference.prompt, "{}", conv.id);
        let plain = tok.decode_skip_special(&reference.ids);
        assert!(!plain.contains("<|im_start|>"), "{}", conv.id);
        let pieces: String = reference
            .ids
            .iter()
            .map(|&i| tok.token_to_piece(i))
            .collect();
        if reference.prompt.is_ascii() {
            assert_eq!(pieces, reference.prompt, "{}", conv.id);
        }
    }
}

#[test]
fn digits_after_a_blank_line_split_like_llama_cpp() {
    let Some(model) = default_model() else { return };
    let (tok, _) = load(&model);
    // Regression: without the `smollm` digit split, "\n\n5" tokenizes as "\n", "\n", "5".
    let ids = tok.encode("\n\n5").unwrap();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(tok.decode(&ids[..1]), "\n\n");
    assert_eq!(tok.decode(&ids[1..]), "5");
    let ids = tok.encode("2024").unwrap();
    assert_eq!(ids.len(), 4, "one token per digit: {ids:?}");
}

#[test]
fn default_model_special_tokens() {
    let Some(model) = default_model() else { return };
    let (tok, tmpl) = load(&model);
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.eos_token_id(), 2);
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    assert!(!tok.add_bos_token());
    assert_eq!(tmpl.stop_token_ids(&tok), vec![2]);
    assert_eq!(tok.encode("<|im_start|>user").unwrap()[0], 1);
    assert_eq!(tok.sha256().len(), 64);
}

/// The vocabularies whose pre-tokenizers Candor implements, as llama.cpp names its test files.
const LLAMA_CPP_VOCABS: [&str; 6] = [
    "llama-bpe",
    "qwen2",
    "llama-spm",
    "gpt-2",
    "qwen35",
    "phi-3",
];

/// Candor against llama.cpp's own tokenizer test (`tests/test-tokenizer-0.cpp`): the
/// vocab-only `models/ggml-vocab-<name>.gguf` of llama.cpp's source tree with its `.inp`
/// texts and `.out` ids (written by llama.cpp's `convert_hf_to_gguf_update.py` with the
/// models' own Hugging Face tokenizers, and what llama.cpp must reproduce), encoded without
/// BOS as that test does. `CANDOR_LLAMA_CPP_MODELS` names that `models/` folder (e.g. the
/// llama.cpp vendored in llama-cpp-python 0.3.36); ignored unless asked for (`-- --ignored`).
#[test]
#[ignore = "needs CANDOR_LLAMA_CPP_MODELS (llama.cpp's models/ folder); run with --ignored"]
fn llama_cpp_vocab_tests_tokenize_identically() {
    let dir = crate::util::reference_dir(
        "CANDOR_LLAMA_CPP_MODELS",
        "set it to llama.cpp's models/ folder (its ggml-vocab-*.gguf with .inp/.out)",
    );
    let mut failures = Vec::new();
    for name in LLAMA_CPP_VOCABS {
        failures.extend(vocab_test_failures(
            &dir.join(format!("ggml-vocab-{name}.gguf")),
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A real Mistral tekken vocabulary (mistral-common's `tekken_240911.json`, 131072 tokens)
/// against llama-tokenize, in the format of llama.cpp's tokenizer test: written by
/// `tests/fixtures/tekken/make_real_vocab.py` (8 MB, not committed) with llama.cpp's test
/// texts and the tekken fixture's. `CANDOR_TEKKEN_VOCAB` names its `ggml-vocab-tekken.gguf`.
#[test]
#[ignore = "needs CANDOR_TEKKEN_VOCAB (tests/fixtures/tekken/make_real_vocab.py); run with --ignored"]
fn tekken_real_vocabulary_tokenizes_like_llama_cpp() {
    let gguf = crate::util::reference_dir(
        "CANDOR_TEKKEN_VOCAB",
        "set it to the ggml-vocab-tekken.gguf tests/fixtures/tekken/make_real_vocab.py writes",
    );
    let failures = vocab_test_failures(&gguf);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The texts of a vocab-only GGUF's `.inp` whose ids differ from its `.out`, without BOS.
fn vocab_test_failures(gguf: &Path) -> Vec<String> {
    let name = gguf.file_name().unwrap().to_string_lossy();
    let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).expect("inp");
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).expect("out");
    // As test-tokenizer-0.cpp splits them.
    let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let texts = match texts.last() {
        Some(&"") => &texts[..texts.len() - 1],
        _ => &texts[..],
    };
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp vs .out");
    let tok = Tokenizer::from_gguf_file(gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut failures = Vec::new();
    for (text, want) in texts.iter().zip(&ids) {
        let got = tok.encode_plain(text).expect("encode");
        if &got != want {
            failures.push(format!(
                "{name}: {text:?}: candor {got:?}, llama.cpp {want:?}"
            ));
        }
    }
    println!(
        "{name}: {}/{} texts tokenized identically to llama.cpp's",
        texts.len() - failures.len(),
        texts.len()
    );
    failures
}

/// A model's chat template is the first there is of: the `--chat-template` file,
/// transformers' `chat_template.jinja` beside the weights (transformers 5 writes the template
/// there alone, not in `tokenizer_config.json`), `tokenizer_config.json`'s `chat_template`,
/// and the GGUF's own. A `tokenizer_config.json` without a template no longer hides the
/// GGUF's; a checkpoint folder (no GGUF) with none of them has no template.
#[test]
fn the_chat_template_is_the_first_of_the_file_the_jinja_the_config_and_the_gguf() {
    use candor::engine::model_template;
    use candor::text::error::TextError;
    use candor::weights::gguf::GgufFile;
    use candor::weights::source::{resolve_path, CHAT_TEMPLATE_FILE};
    let Some(model) = default_model() else { return };
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&model, dir.path().join("m.gguf")).unwrap();
    let file = GgufFile::open(&model).unwrap();
    let tokenizer = Tokenizer::from_gguf(file.content()).unwrap();
    let own = ChatTemplate::from_gguf(file.content(), &tokenizer).unwrap();
    let pick = |flag: Option<&Path>, gguf: bool| -> Result<String, TextError> {
        let mut files = resolve_path(dir.path()).unwrap();
        files.chat_template = flag.map(Path::to_path_buf);
        let content = gguf.then(|| file.content());
        model_template(&files, &tokenizer, content).map(|t| t.source().to_string())
    };
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    assert_eq!(pick(None, true).unwrap(), own.source());
    write("tokenizer_config.json", r#"{"eos_token": "<|im_end|>"}"#);
    assert_eq!(
        pick(None, true).unwrap(),
        own.source(),
        "a config without one"
    );
    assert!(matches!(pick(None, false), Err(TextError::NoChatTemplate)));
    write(
        "tokenizer_config.json",
        r#"{"eos_token": "<|im_end|>", "chat_template": "config {{ messages[0].content }}"}"#,
    );
    assert_eq!(
        pick(None, true).unwrap(),
        "config {{ messages[0].content }}"
    );
    write(CHAT_TEMPLATE_FILE, "jinja {{ messages[0].content }}");
    assert_eq!(pick(None, true).unwrap(), "jinja {{ messages[0].content }}");
    assert_eq!(
        pick(None, false).unwrap(),
        "jinja {{ messages[0].content }}"
    );
    std::fs::remove_file(dir.path().join("tokenizer_config.json")).unwrap();
    assert_eq!(
        pick(None, false).unwrap(),
        "jinja {{ messages[0].content }}"
    );
    write("flag.jinja", "flag {{ messages[0].content }}");
    let flag = dir.path().join("flag.jinja");
    assert_eq!(
        pick(Some(&flag), true).unwrap(),
        "flag {{ messages[0].content }}"
    );
    // A checkpoint folder's `chat_template.jinja` is found as a GGUF folder's is.
    let ck = tempfile::tempdir().unwrap();
    std::fs::write(ck.path().join("config.json"), "{}").unwrap();
    std::fs::write(ck.path().join("model.safetensors"), "x").unwrap();
    assert_eq!(resolve_path(ck.path()).unwrap().chat_template_jinja, None);
    std::fs::write(ck.path().join(CHAT_TEMPLATE_FILE), "t").unwrap();
    let files = resolve_path(ck.path()).unwrap();
    assert!(files.checkpoint);
    assert_eq!(
        files.chat_template_jinja,
        Some(ck.path().join(CHAT_TEMPLATE_FILE))
    );
}
