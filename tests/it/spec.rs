//! Speculative decoding gives exactly the plain tokens: verifying k drafted tokens as k+1 rows
//! of one sequence gives the bits of k+1 single-token decode steps (for every architecture),
//! and the scheduler with drafts (prompt lookup or a draft model) returns the tokens, log-
//! probabilities and stop reasons of the scheduler without, across batch sizes, with the prefix
//! cache on and off, greedy and seeded; a draft model of another vocabulary is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candor::engine::draft::{DraftConfig, DraftSource};
use candor::engine::kv::KvLayout;
use candor::engine::{
    Decoder, NoText, SamplingParams, SchedulerConfig, SeqKv, StopReason, TextDecoder, TokenReply,
    TokenRequest,
};
use candor::model::checkpoint::Checkpoint;
use candor::model::kv::{Logits, SeqStep};
use candor::model::runner::Model;
use candor::model::transformer::{Scratch, Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

use crate::quant::{q, tiny_metadata, tiny_tensors, TQ_VOCAB};

/// Every architecture's tiny model, loaded: the float checkpoints of `tests/fixtures/tiny`
/// (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3), the quant tests' seeded GGUFs of the
/// same architectures in Q8_0 and Q4_0, and the MoE tests' qwen3moe, mixtral and gpt-oss in
/// Q8_0. Returns (label, model, vocabulary).
fn every_tiny_model(dir: &Path) -> Vec<(String, Arc<Model>, usize)> {
    let mut out = Vec::new();
    for arch in [
        "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny")
            .join(arch);
        let mut ck = Checkpoint::open(&path).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let m = Transformer::from_checkpoint(&mut ck, WeightDType::F32)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let vocab = m.config().vocab_size;
        out.push((format!("{arch} f32"), Arc::new(Model::from(m)), vocab));
    }
    for arch in ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"] {
        for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
            let path = write_dense(dir, arch, dtype);
            out.push((format!("{arch} {dtype:?}"), load(&path), TQ_VOCAB));
        }
    }
    for arch in ["qwen3moe", "mixtral", "gpt-oss"] {
        let path = dir.join(format!("{arch}-Q8_0.gguf"));
        let tensors: Vec<(String, QTensor)> = crate::moe::moe_tensors(arch)
            .into_iter()
            .map(|(name, shape, v)| {
                let t = if shape.len() == 1 {
                    GgmlDType::F32
                } else {
                    GgmlDType::Q8_0
                };
                (name, q(v, &shape, t))
            })
            .collect();
        crate::util::write_gguf(&path, &crate::moe::moe_metadata(arch), &tensors);
        out.push((format!("{arch} Q8_0"), load(&path), TQ_VOCAB));
    }
    out
}

/// The quant tests' seeded `arch` model with every matrix in `dtype`.
fn write_dense(dir: &Path, arch: &'static str, dtype: GgmlDType) -> PathBuf {
    let tensors: Vec<(String, QTensor)> = tiny_tensors(arch)
        .into_iter()
        .map(|(name, shape, v)| {
            let t = if shape.len() == 1 {
                GgmlDType::F32
            } else {
                dtype
            };
            (name, q(v, &shape, t))
        })
        .collect();
    let path = dir.join(format!("{arch}-{dtype:?}.gguf"));
    crate::util::write_gguf(&path, &tiny_metadata(arch), &tensors);
    path
}

fn load(path: &Path) -> Arc<Model> {
    Arc::new(Model::from(
        Transformer::from_gguf_path(path, WeightDType::Native)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    ))
}

fn new_kv(model: &Model) -> SeqKv {
    let c = model.config();
    SeqKv::new(KvLayout {
        n_layer: c.n_layer,
        kv_dim: c.kv_dim(),
    })
}

/// The logits of `tail` after `prompt`: fed as one step of `tail.len()` rows (how a verify
/// step feeds a token and its drafts), or one token per step, each step packed beside an
/// unrelated neighbour (plain decoding in a batch). As bits.
fn tail_logits(model: &Model, prompt: &[u32], tail: &[u32], one_step: bool) -> Vec<u32> {
    let mut scratch = Scratch::default();
    let mut kv = new_kv(model);
    let mut other = new_kv(model);
    let mut steps = [SeqStep {
        tokens: prompt,
        kv: &mut kv,
        logits: Logits::None,
    }];
    model.forward(&mut steps, &mut scratch).expect("prefill");
    let mut out = Vec::new();
    if one_step {
        let mut steps = [SeqStep {
            tokens: tail,
            kv: &mut kv,
            logits: Logits::All,
        }];
        let l = model.forward(&mut steps, &mut scratch).expect("verify");
        out.extend(l.iter().map(|x| x.to_bits()));
    } else {
        let vocab = model.config().vocab_size;
        for (i, t) in tail.iter().enumerate() {
            let neighbour = [(i as u32 * 7 + 3) % vocab as u32; 2];
            let mut steps = [
                SeqStep {
                    tokens: &neighbour[..],
                    kv: &mut other,
                    logits: Logits::Last,
                },
                SeqStep {
                    tokens: std::slice::from_ref(t),
                    kv: &mut kv,
                    logits: Logits::Last,
                },
            ];
            let l = model.forward(&mut steps, &mut scratch).expect("decode");
            out.extend(l[vocab..].iter().map(|x| x.to_bits()));
        }
    }
    out
}

/// The fact speculative decoding rests on: for every architecture (dense and MoE, float and
/// quantized), k+1 rows of one sequence verified in one pass have exactly the logits of k+1
/// single-token decode steps.
#[test]
fn verify_rows_equal_single_decode_steps_for_every_architecture() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (label, model, vocab) in every_tiny_model(dir.path()) {
        let v = vocab as u32;
        let prompt: Vec<u32> = (0..21).map(|i| (i * 13 + 5) % v).collect();
        let tail: Vec<u32> = (0..7).map(|i| (i * 29 + 11) % v).collect();
        let one = tail_logits(&model, &prompt, &tail, true);
        let steps = tail_logits(&model, &prompt, &tail, false);
        assert_eq!(one.len(), tail.len() * vocab, "{label}");
        assert!(
            one == steps,
            "{label}: verifying {} rows in one pass differs from decoding them one by one",
            tail.len()
        );
    }
}

/// Requests whose prompts repeat a pattern (so prompt lookup drafts), the first 20 tokens
/// shared by all (so the prefix cache reuses them), greedy except every fourth (seeded
/// sampling at temperature 0.8).
fn repetitive_requests(n: usize, vocab: usize, max_new_tokens: usize) -> Vec<TokenRequest> {
    let mut rng = SplitMix64::new(11);
    let shared: Vec<u32> = (0..20)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect();
    (0..n)
        .map(|i| {
            let pattern: Vec<u32> = (0..5 + i % 4)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect();
            let mut ids = shared.clone();
            for _ in 0..3 {
                ids.extend_from_slice(&pattern);
            }
            let sampled = i % 4 == 3;
            TokenRequest::new(
                ids,
                SamplingParams {
                    temperature: if sampled { 0.8 } else { 0.0 },
                    top_p: if sampled { 0.95 } else { 1.0 },
                    seed: 40 + i as u64,
                    max_new_tokens,
                    ..SamplingParams::default()
                },
            )
        })
        .collect()
}

fn scheduler(batch_size: usize, prefix_cache: bool) -> SchedulerConfig {
    SchedulerConfig {
        batch_size,
        prefill_chunk: 7,
        max_step_tokens: 64,
        prefix_cache_bytes: if prefix_cache { 64 << 20 } else { 0 },
    }
}

fn drafts(tokens: usize, max_batch: usize) -> DraftConfig {
    DraftConfig {
        tokens,
        adaptive: true,
        max_batch,
    }
}

/// The replies of `reqs` on `model`, generated twice on one decoder (the second time from the
/// prefix cache, when it is on).
fn replies(
    model: &Arc<Model>,
    reqs: &[TokenRequest],
    cfg: SchedulerConfig,
    draft: Option<(DraftSource, DraftConfig)>,
) -> (Vec<TokenReply>, candor::engine::DraftStats) {
    let mut dec = Decoder::new(Arc::clone(model), cfg, Vec::new());
    dec.set_drafting(draft).expect("drafting");
    let first = dec.generate(reqs, &NoText).expect("generate");
    let again = dec.generate(reqs, &NoText).expect("generate again");
    assert_eq!(ids(&first), ids(&again), "a second run differs");
    (first, dec.draft_stats())
}

fn ids(r: &[TokenReply]) -> Vec<(Vec<u32>, StopReason)> {
    r.iter()
        .map(|r| (r.output_ids.clone(), r.stop_reason))
        .collect()
}

/// Prompt lookup on every architecture's tiny model: the tokens and stop reasons of plain
/// decoding at batch sizes 1, 3 and 8, with the prefix cache on and off, greedy and seeded;
/// drafts were made and accepted (or the test would not test anything); and with drafting
/// turned off by the scheduler for large batches, the same tokens again.
#[test]
fn lookup_drafts_change_no_token_on_every_architecture() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut accepted = 0;
    for (label, model, vocab) in every_tiny_model(dir.path()) {
        let reqs = repetitive_requests(8, vocab, 32);
        let (plain, _) = replies(&model, &reqs, scheduler(8, false), None);
        for (bs, cache) in [(1, false), (3, true), (8, true), (8, false)] {
            let (got, stats) = replies(
                &model,
                &reqs,
                scheduler(bs, cache),
                Some((DraftSource::Lookup, drafts(5, 16))),
            );
            assert_eq!(ids(&got), ids(&plain), "{label}: bs={bs} cache={cache}");
            // Random tiny models repeat their prompts' patterns more or less: every one is
            // drafted for, and drafts are accepted over all of them.
            assert!(stats.drafted > 0, "{label}: bs={bs}: nothing drafted");
            println!("{label} bs={bs} cache={cache}: {}", stats.summary());
            accepted += stats.accepted;
        }
        // Batch 8 with drafting allowed up to 2 decoding sequences: it is off while many
        // decode, and the tokens do not change.
        let (got, stats) = replies(
            &model,
            &reqs,
            scheduler(8, true),
            Some((DraftSource::Lookup, drafts(5, 2))),
        );
        assert_eq!(ids(&got), ids(&plain), "{label}: auto-off");
        assert!(stats.skipped_steps > 0, "{label}: {stats:?}");
    }
    assert!(
        accepted > 100,
        "only {accepted} drafted tokens accepted in all"
    );
}

/// A draft model (another tiny model of the same vocabulary: the same weights in another
/// type, or another architecture) gives the plain tokens, greedy and seeded, across batch
/// sizes and with the prefix cache on and off; the draft of the same weights is accepted
/// often.
#[test]
fn draft_model_changes_no_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    for arch in ["llama", "qwen3", "gemma2", "phi3"] {
        let target = load(&write_dense(dir.path(), arch, GgmlDType::Q8_0));
        let close = load(&write_dense(dir.path(), arch, GgmlDType::Q4_0));
        let other = load(&write_dense(dir.path(), "qwen2", GgmlDType::Q4_0));
        let reqs = repetitive_requests(8, TQ_VOCAB, 20);
        let (plain, _) = replies(&target, &reqs, scheduler(8, false), None);
        for (draft, bs, cache) in [(&close, 1, false), (&close, 8, true), (&other, 3, true)] {
            let (got, stats) = replies(
                &target,
                &reqs,
                scheduler(bs, cache),
                Some((DraftSource::Model(Arc::clone(draft)), drafts(4, 8))),
            );
            assert_eq!(ids(&got), ids(&plain), "{arch}: bs={bs} cache={cache}");
            assert!(stats.drafted > 0, "{arch}: {stats:?}");
            if Arc::ptr_eq(draft, &close) {
                assert!(
                    stats.acceptance_rate() > 0.25,
                    "{arch}: its own weights in Q4_0 as the draft: {stats:?}"
                );
            }
        }
    }
}

/// A draft model whose vocabulary differs is refused when drafting is set, with a message
/// naming both sizes.
#[test]
fn draft_model_with_another_vocabulary_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = load(&write_dense(dir.path(), "llama", GgmlDType::Q8_0));
    let ck = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/llama");
    let draft = Arc::new(Model::from(
        Transformer::from_checkpoint(&mut Checkpoint::open(&ck).expect("open"), WeightDType::F32)
            .expect("load"),
    ));
    assert_ne!(draft.config().vocab_size, TQ_VOCAB);
    let mut dec = Decoder::new(target, scheduler(2, false), Vec::new());
    let err = dec
        .set_drafting(Some((DraftSource::Model(draft), DraftConfig::default())))
        .expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains("vocabulary") && msg.contains("96"), "{msg}");
    assert!(dec.draft_config().is_none());
}

/// Letters for ids (a test's text): id `i` is `a + i % 26`.
struct Letters;

impl TextDecoder for Letters {
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| char::from(b'a' + (i % 26) as u8))
            .collect()
    }
}

/// Streamed with log-probabilities and a stop string that the plain reply reaches in its
/// middle: drafts change neither the log-probabilities, nor where the reply stops, nor its
/// text (the stop string falls inside a verified run of drafted tokens).
#[test]
fn logprobs_and_stop_strings_inside_drafted_runs_are_the_plain_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = load(&write_dense(dir.path(), "llama", GgmlDType::Q8_0));
    let reqs = repetitive_requests(4, TQ_VOCAB, 40);
    let run = |draft: bool, stops: &[String]| {
        let mut dec = Decoder::new(Arc::clone(&model), scheduler(4, true), Vec::new());
        if draft {
            dec.set_drafting(Some((DraftSource::Lookup, drafts(6, 4))))
                .expect("drafting");
        }
        for (i, r) in reqs.iter().enumerate() {
            let mut r = r.clone();
            r.params.stop_strings = stops.to_vec();
            dec.submit_with_logprobs(i as u64, r, 3).expect("submit");
        }
        let mut out = vec![None; reqs.len()];
        while dec.in_flight() > 0 {
            for (id, reply) in dec.step(&Letters).expect("step") {
                let lp = dec.take_logprobs(id).expect("logprobs");
                out[id as usize] = Some((reply, lp));
            }
        }
        let stats = dec.draft_stats();
        (
            out.into_iter()
                .map(|o| o.expect("reply"))
                .collect::<Vec<_>>(),
            stats,
        )
    };
    let (plain, _) = run(false, &[]);
    let (drafted, stats) = run(true, &[]);
    assert!(stats.accepted > 0, "{stats:?}");
    for ((a, la), (b, lb)) in plain.iter().zip(&drafted) {
        assert_eq!(a.output_ids, b.output_ids);
        assert_eq!(la, lb, "log-probabilities differ");
    }
    // A stop string made of the greedy reply's letters 10..13: found mid-reply.
    let text = Letters.decode(&plain[0].0.output_ids);
    let stop = text[10..13].to_string();
    let cut = text.find(&stop).expect("in the text");
    let (plain_s, _) = run(false, std::slice::from_ref(&stop));
    let (drafted_s, stats) = run(true, std::slice::from_ref(&stop));
    assert_eq!(plain_s[0].0.stop_reason, StopReason::StopString);
    assert_eq!(plain_s[0].0.text, text[..cut]);
    assert!(stats.accepted > 0, "{stats:?}");
    for ((a, la), (b, lb)) in plain_s.iter().zip(&drafted_s) {
        assert_eq!(
            (&a.output_ids, &a.text, a.stop_reason),
            (&b.output_ids, &b.text, b.stop_reason)
        );
        assert_eq!(la, lb);
    }
}

/// The default model with a real tokenizer: a quoting request (lookup's best case), a
/// constrained FB-Bench checklist judgement (greedy and seeded) and a reply with a stop string,
/// with and without lookup drafts and with the draft model being the model itself: the same
/// replies, and drafts accepted.
#[test]
fn default_model_replies_are_the_same_with_drafts() {
    use candor::engine::{ChatRequest, Constraint, Engine, EngineOptions, Generate};
    use candor::judge::checklist::{judgement_schema, judgement_skeleton, Criterion};
    use candor::text::message::Message;
    let Some(path) = crate::util::default_model() else {
        return;
    };
    let passage = "The committee met on Tuesday to review the budget. It approved the \
                   library's new roof, postponed the park renovation until spring, and asked \
                   the treasurer to report on the water utility's rising costs by March. Two \
                   members objected to the delay, citing safety concerns at the playground.";
    let quote = ChatRequest {
        messages: vec![Message::user(format!(
            "Repeat this passage word for word:\n\n{passage}"
        ))],
        params: SamplingParams {
            max_new_tokens: 80,
            ..SamplingParams::default()
        },
        ..Default::default()
    };
    let criteria = vec![
        Criterion {
            text: "The reply repeats the passage exactly".into(),
            weight: serde_json::Number::from_f64(0.5),
        },
        Criterion {
            text: "The reply mentions the park renovation".into(),
            weight: serde_json::Number::from_f64(0.5),
        },
    ];
    let judge = |temperature: f32| ChatRequest {
        messages: vec![Message::user(format!(
            "Passage: {passage}\nReply: {passage}\nJudge the reply against each checklist \
             entry and reply in JSON:\n```json\n{}\n```",
            judgement_skeleton(&criteria)
        ))],
        params: SamplingParams {
            max_new_tokens: 120,
            temperature,
            seed: 3,
            constraint: Some(Constraint::JsonSchema(judgement_schema(&criteria))),
            ..SamplingParams::default()
        },
        ..Default::default()
    };
    let mut stopped = quote.clone();
    stopped.params.stop_strings = vec!["park".into()];
    let reqs = [quote, judge(0.0), judge(0.7), stopped];
    let load = |batch_size| {
        Engine::load(
            &path,
            EngineOptions {
                dtype: WeightDType::Native,
                device: Default::default(),
                scheduler: SchedulerConfig {
                    batch_size,
                    ..SchedulerConfig::default()
                },
                gpu_kv_bytes: None,
            },
        )
        .expect("load the default model")
    };
    let plain = load(4).generate_chat(&reqs).expect("plain");
    assert!(plain[0].text.contains("library"), "{}", plain[0].text);
    assert_eq!(plain[3].stop_reason, StopReason::StopString);
    for bs in [1, 4] {
        let mut eng = load(bs);
        eng.set_lookup_drafts(Some(drafts(8, 4)));
        let got = eng.generate_chat(&reqs).expect("drafted");
        let stats = eng.decoder().draft_stats();
        println!("default model bs={bs}, lookup: {}", stats.summary());
        for (a, b) in plain.iter().zip(&got) {
            assert_eq!(
                (&a.output_ids, &a.text, a.stop_reason),
                (&b.output_ids, &b.text, b.stop_reason)
            );
        }
        assert!(stats.acceptance_rate() > 0.3, "{stats:?}");
    }
    // The model as its own draft: its greedy drafts are accepted unless the grammar masks them.
    let mut eng = load(2);
    eng.set_draft_model(
        &candor::weights::source::resolve_path(&path).expect("files"),
        WeightDType::Native,
        drafts(4, 4),
    )
    .expect("same vocabulary");
    let got = eng.generate_chat(&reqs[..2]).expect("drafted");
    let stats = eng.decoder().draft_stats();
    println!("default model, itself as the draft: {}", stats.summary());
    assert_eq!(got[0].output_ids, plain[0].output_ids);
    assert_eq!(got[1].output_ids, plain[1].output_ids);
    assert!(stats.acceptance_rate() > 0.5, "{stats:?}");
}

fn candor() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_candor"));
    c.stdin(std::process::Stdio::null());
    c.env("CANDOR_NO_CACHE", "1");
    c
}

/// A run with drafts (the judge by lookup) writes its acceptance to `drafts.json` and keeps it
/// out of the manifest; `candor verify` replays it without drafts and finds every step
/// identical.
#[test]
fn drafted_run_verifies_without_drafts() {
    let (Some(data), Some(_)) = (crate::util::shared_data(), crate::util::default_model()) else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("run");
    let o = candor()
        .env("CANDOR_DATA", &data)
        .env("CANDOR_OFFLINE", "1")
        .args([
            "run",
            "fbbench",
            "--model",
            "default",
            "--judge",
            "default",
            // The v3 item with the shortest texts (the judge prompt alone is long): a tenth
            // of the time of the first item, with as many drafts accepted.
            "--subset",
            "cb29734183cf0fed",
            "--max-new-tokens",
            "24",
            "--judge-max-new-tokens",
            "160",
            "--constrain",
            "on",
            "--judge-draft",
            "lookup",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("speculative decoding: prompt lookup"), "{err}");
    let notes: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("drafts.json")).expect("drafts.json"))
            .expect("json");
    assert!(
        notes[0]["accepted"].as_u64().expect("accepted") > 0,
        "{notes}"
    );
    let manifest = std::fs::read_to_string(out.join("manifest.json")).expect("manifest");
    assert!(!manifest.contains("draft"), "{manifest}");
    let v = candor()
        .env("CANDOR_DATA", &data)
        .env("CANDOR_OFFLINE", "1")
        .arg("verify")
        .arg(&out)
        .output()
        .expect("verify");
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(
        v.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&v.stderr)
    );
    assert!(text.contains(" 0 differing"), "{text}");
}

/// `candor generate --draft MODEL` with a model whose tokenizer differs (the default model with
/// one special token renamed) is refused in one line naming the token, and nothing is written;
/// lookup drafts and the model itself as its draft work.
#[test]
fn generate_refuses_a_draft_model_of_another_vocabulary() {
    use candle_core::quantized::gguf_file;
    let Some(src) = crate::util::default_model() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut f = std::fs::File::open(&src).expect("open");
    let content = gguf_file::Content::read(&mut f).expect("read");
    let md: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("tokenizer.ggml.tokens", gguf_file::Value::Array(tokens)) => {
                    let mut tokens = tokens.clone();
                    tokens[10] = gguf_file::Value::String("<renamed>".into());
                    gguf_file::Value::Array(tokens)
                }
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect();
    let tensors = crate::util::gguf_tensors(&content, &mut f);
    let draft = tmp.path().join("other-vocab.gguf");
    crate::util::write_gguf(&draft, &md, &tensors);
    let prompts = tmp.path().join("p.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n",
    )
    .expect("write");
    let out = tmp.path().join("out.jsonl");
    let o = candor()
        .args(["generate", "--max-new-tokens", "4", "--draft"])
        .arg(&draft)
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("generate");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("vocabulary differs") && err.contains("token 10 "),
        "{err}"
    );
    assert!(!out.exists());
    // The same request with lookup drafts, and with the model itself as the draft, works.
    for draft in ["lookup", "default"] {
        let o = candor()
            .args(["generate", "--max-new-tokens", "8", "--draft", draft])
            .arg("--prompts")
            .arg(&prompts)
            .arg("--out")
            .arg(&out)
            .output()
            .expect("generate");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains("drafts: "), "{err}");
    }
}
