//! Engine tests: the llama forward pass and decode loop on the real default model and on tiny
//! synthetic GGUF files, determinism across batch sizes and thread counts, forks, and
//! agreement with the committed reference fixture.

use std::sync::Arc;

use candor::engine::kv::{KvLayout, SeqKv};
use candor::engine::{
    Decoder, Engine, EngineOptions, Generate, NoText, SamplingParams, SchedulerConfig, StopReason,
    TextDecoder, TokenRequest,
};
use candor::model::kv::{KvSeq, Logits, SeqStep};
use candor::model::runner::Model;
use candor::model::transformer::{Scratch, Transformer, WeightDType};
use candor::weights::error::WeightsError;

use crate::util;

fn decoder(dtype: WeightDType, batch_size: usize) -> Option<Decoder> {
    let path = util::default_model()?;
    let model = Transformer::from_gguf_path(&path, dtype).expect("load default model");
    let cfg = SchedulerConfig {
        batch_size,
        ..SchedulerConfig::default()
    };
    Some(Decoder::new(Arc::new(Model::from(model)), cfg, vec![2]))
}

/// `<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n`
const FRANCE: [u32; 16] = [
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
];

#[test]
fn greedy_answers_capital_of_france() {
    // Independently computed with a float64 numpy forward pass over the dequantized weights.
    let expected = [504, 3575, 282, 4649, 314, 7042, 30, 2];
    for dtype in [WeightDType::F32, WeightDType::Native] {
        let Some(mut dec) = decoder(dtype, 1) else {
            return;
        };
        let params = SamplingParams {
            max_new_tokens: 16,
            ..SamplingParams::default()
        };
        let req = TokenRequest::new(FRANCE.to_vec(), params);
        let reply = dec.generate(&[req], &NoText).expect("generate");
        assert_eq!(reply[0].output_ids, expected, "{dtype:?}");
        assert_eq!(reply[0].stop_reason, StopReason::Eos);
    }
}

// ---------------------------------------------------------------------------------------------
// Tiny synthetic models (random weights written as GGUF by the test).

mod tiny {
    use std::path::{Path, PathBuf};

    use candle_core::quantized::gguf_file::Value;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};
    use candor::stats::rng::SplitMix64;

    pub const VOCAB: usize = 96;
    pub const DIM: usize = 64;
    pub const FFN: usize = 128;
    pub const LAYERS: usize = 2;

    pub struct Spec {
        pub arch: &'static str,
        pub tied: bool,
        pub context: u32,
        pub matrix_dtype: GgmlDType,
        /// Skip writing this tensor.
        pub omit: Option<&'static str>,
        /// Also write this tensor (eight f32 values), which no architecture uses.
        pub extra: Option<&'static str>,
        /// Also write this matrix (8 × 32, Q8_0), which no architecture uses.
        pub extra_matrix: Option<&'static str>,
        /// Also write `<arch>.rope.scaling.attn_factor` with this value.
        pub attn_factor: Option<f32>,
        pub seed: u64,
    }

    impl Default for Spec {
        fn default() -> Self {
            Spec {
                arch: "llama",
                tied: true,
                context: 256,
                matrix_dtype: GgmlDType::Q4_1,
                omit: None,
                extra: None,
                extra_matrix: None,
                attn_factor: None,
                seed: 1,
            }
        }
    }

    fn random(rng: &mut SplitMix64, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
            .collect()
    }

    fn q(v: Vec<f32>, shape: &[usize], dtype: GgmlDType) -> QTensor {
        let t = Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor");
        QTensor::quantize(&t, dtype).expect("quantize")
    }

    /// Writes a random llama-architecture GGUF and returns its path (inside `dir`).
    pub fn write(dir: &Path, name: &str, spec: &Spec) -> PathBuf {
        let mut rng = SplitMix64::new(spec.seed);
        let (heads, kv_heads) = (4, 2);
        let kv_dim = DIM / 2;
        let mut md = crate::util::llama_metadata(&crate::util::TinyShape {
            arch: spec.arch,
            layers: LAYERS,
            dim: DIM,
            ffn: FFN,
            heads,
            kv_heads,
            context: spec.context,
        });
        md.push((
            format!("{}.rope.dimension_count", spec.arch),
            Value::U32(16),
        ));
        if let Some(f) = spec.attn_factor {
            md.push((
                format!("{}.rope.scaling.attn_factor", spec.arch),
                Value::F32(f),
            ));
        }
        let mut tensors: Vec<(String, QTensor)> = vec![(
            "token_embd.weight".into(),
            q(
                random(&mut rng, VOCAB * DIM, 1.0),
                &[VOCAB, DIM],
                GgmlDType::Q8_0,
            ),
        )];
        let ones = |n| vec![1.0f32; n];
        for i in 0..LAYERS {
            let mut m = |s: &str, n: usize, k: usize| {
                let w = random(&mut rng, n * k, 0.5 / (k as f32).sqrt() * 3.0);
                (
                    format!("blk.{i}.{s}.weight"),
                    q(w, &[n, k], spec.matrix_dtype),
                )
            };
            let mats = [
                m("attn_q", DIM, DIM),
                m("attn_k", kv_dim, DIM),
                m("attn_v", kv_dim, DIM),
                m("attn_output", DIM, DIM),
                m("ffn_gate", FFN, DIM),
                m("ffn_up", FFN, DIM),
                m("ffn_down", DIM, FFN),
            ];
            tensors.extend(mats);
            for s in ["attn_norm", "ffn_norm"] {
                tensors.push((
                    format!("blk.{i}.{s}.weight"),
                    q(ones(DIM), &[DIM], GgmlDType::F32),
                ));
            }
        }
        tensors.push((
            "output_norm.weight".into(),
            q(ones(DIM), &[DIM], GgmlDType::F32),
        ));
        if !spec.tied {
            let w = random(&mut rng, VOCAB * DIM, 1.0);
            tensors.push(("output.weight".into(), q(w, &[VOCAB, DIM], GgmlDType::Q8_0)));
        }
        if let Some(name) = spec.extra {
            tensors.push((name.into(), q(ones(8), &[8], GgmlDType::F32)));
        }
        if let Some(name) = spec.extra_matrix {
            tensors.push((name.into(), q(ones(8 * 32), &[8, 32], GgmlDType::Q8_0)));
        }
        tensors.retain(|(n, _)| Some(n.as_str()) != spec.omit);
        let path = dir.join(name);
        crate::util::write_gguf(&path, &md, &tensors);
        path
    }
}

fn tiny_decoder(path: &std::path::Path, batch_size: usize) -> Decoder {
    let model = Transformer::from_gguf_path(path, WeightDType::Native).expect("load tiny model");
    let cfg = SchedulerConfig {
        batch_size,
        prefill_chunk: 7,
        max_step_tokens: 20,
        ..SchedulerConfig::default()
    };
    Decoder::new(Arc::new(Model::from(model)), cfg, Vec::new())
}

fn greedy(max_new_tokens: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        ..SamplingParams::default()
    }
}

#[test]
fn tiny_model_tied_and_untied_embeddings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tied = tiny::write(dir.path(), "tied.gguf", &tiny::Spec::default());
    let untied = tiny::write(
        dir.path(),
        "untied.gguf",
        &tiny::Spec {
            tied: false,
            ..tiny::Spec::default()
        },
    );
    let m_tied = Transformer::from_gguf_path(&tied, WeightDType::Native).expect("tied");
    let m_untied = Transformer::from_gguf_path(&untied, WeightDType::Native).expect("untied");
    assert!(m_tied.tied_embeddings());
    assert!(!m_untied.tied_embeddings());
    assert_eq!(m_tied.config().vocab_size, tiny::VOCAB);
    assert_eq!(m_tied.config().head_dim, 16);
    // Same embedding and layers, different output projection: different predictions.
    let ids: Vec<u32> = (0..24).map(|i| (i * 7 % tiny::VOCAB) as u32).collect();
    let a = tiny_decoder(&tied, 1)
        .next_token_argmax(&ids, 0)
        .expect("tied");
    let b = tiny_decoder(&untied, 1)
        .next_token_argmax(&ids, 0)
        .expect("untied");
    assert_eq!(a.len(), ids.len());
    assert_ne!(a, b);
}

/// A tensor the architecture does not use (Phi-3-128k's long-context RoPE factors; a quantized
/// matrix, such as a shared expert on a file whose architecture has none) is refused with one
/// line naming it and the file, never ignored: sizing the weights for the memory check at load
/// looks at every tensor without counting it as used.
#[test]
fn tiny_model_with_a_tensor_it_does_not_use_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny::write(
        dir.path(),
        "extra.gguf",
        &tiny::Spec {
            extra: Some("rope_factors_long.weight"),
            ..tiny::Spec::default()
        },
    );
    let err = Transformer::from_gguf_path(&path, WeightDType::Native)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("rope_factors_long.weight"), "{err}");
    assert!(err.contains("extra.gguf"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    let matrix = tiny::write(
        dir.path(),
        "matrix.gguf",
        &tiny::Spec {
            extra_matrix: Some("blk.0.ffn_gate_shexp.weight"),
            ..tiny::Spec::default()
        },
    );
    let err = Transformer::from_gguf_path(&matrix, WeightDType::Native)
        .err()
        .expect("a matrix the pass never reads is refused")
        .to_string();
    assert!(
        err.contains("blk.0.ffn_gate_shexp.weight") && err.contains("matrix.gguf"),
        "{err}"
    );
    // The same model without it loads, and so does a neutral attention factor.
    let plain = tiny::write(dir.path(), "plain.gguf", &tiny::Spec::default());
    Transformer::from_gguf_path(&plain, WeightDType::Native).expect("plain");
    let neutral = tiny::write(
        dir.path(),
        "neutral.gguf",
        &tiny::Spec {
            attn_factor: Some(1.0),
            ..tiny::Spec::default()
        },
    );
    Transformer::from_gguf_path(&neutral, WeightDType::Native).expect("neutral");
    // A key that changes the arithmetic in a way Candor does not implement is refused too.
    let scaled = tiny::write(
        dir.path(),
        "scaled.gguf",
        &tiny::Spec {
            attn_factor: Some(1.19),
            ..tiny::Spec::default()
        },
    );
    let err = Transformer::from_gguf_path(&scaled, WeightDType::Native)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("rope.scaling.attn_factor"), "{err}");
}

#[test]
fn tiny_model_errors_are_typed() {
    use candle_core::quantized::GgmlDType;
    use candor::model::ModelError;
    let dir = tempfile::tempdir().expect("tempdir");
    let gpt2 = tiny::write(
        dir.path(),
        "gpt2.gguf",
        &tiny::Spec {
            arch: "gpt2",
            ..tiny::Spec::default()
        },
    );
    let err = Transformer::from_gguf_path(&gpt2, WeightDType::Native).err();
    assert!(
        matches!(&err, Some(ModelError::UnsupportedArchitecture(a)) if a == "gpt2"),
        "{err:?}"
    );
    let missing = tiny::write(
        dir.path(),
        "missing.gguf",
        &tiny::Spec {
            omit: Some("blk.1.ffn_up.weight"),
            ..tiny::Spec::default()
        },
    );
    let err = Transformer::from_gguf_path(&missing, WeightDType::Native).err();
    assert!(
        matches!(&err, Some(ModelError::Weights(WeightsError::MissingTensor(n))) if n == "blk.1.ffn_up.weight"),
        "{err:?}"
    );
    // Q5_0 has a native kernel now (an unsupported type, Q3_K, is tests/it/quant.rs's case):
    // it loads as stored and dequantized.
    let q5 = tiny::write(
        dir.path(),
        "q5.gguf",
        &tiny::Spec {
            matrix_dtype: GgmlDType::Q5_0,
            ..tiny::Spec::default()
        },
    );
    let native = Transformer::from_gguf_path(&q5, WeightDType::Native);
    assert!(native.is_ok(), "{:?}", native.err());
    assert!(Transformer::from_gguf_path(&q5, WeightDType::F32).is_ok());
    let not_gguf = dir.path().join("not.gguf");
    std::fs::write(&not_gguf, b"hello").expect("write");
    let err = Transformer::from_gguf_path(&not_gguf, WeightDType::Native).err();
    assert!(
        matches!(
            &err,
            Some(ModelError::Weights(
                candor::weights::error::WeightsError::Gguf { .. }
            ))
        ),
        "{err:?}"
    );
}

#[test]
fn tiny_model_forked_sequence_decodes_like_a_fresh_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny::write(dir.path(), "m.gguf", &tiny::Spec::default());
    let mut dec = tiny_decoder(&path, 4);
    // A 21-token shared prefix: it ends inside a KV block, so forks copy on write.
    let prefix: Vec<u32> = (0..21).map(|i| (i * 5 % 90) as u32 + 3).collect();
    let tails: Vec<Vec<u32>> = vec![vec![4, 9], vec![17], vec![50, 51, 52, 53, 54, 55, 56, 57]];
    let base = dec.prefill(&prefix).expect("prefill");
    let mut forked = Vec::new();
    for t in &tails {
        let id = dec.fork(base).expect("fork");
        forked.push(TokenRequest {
            prompt_ids: t.clone(),
            params: greedy(12),
            prefix: Some(id),
            reasoning: None,
            draft_tokens: None,
        });
    }
    let from_forks = dec.generate(&forked, &NoText).expect("forked");
    let fresh: Vec<TokenRequest> = tails
        .iter()
        .map(|t| TokenRequest::new([prefix.clone(), t.clone()].concat(), greedy(12)))
        .collect();
    let from_scratch = dec.generate(&fresh, &NoText).expect("fresh");
    for (a, b) in from_forks.iter().zip(&from_scratch) {
        assert_eq!(a.output_ids, b.output_ids);
        assert_eq!(a.output_ids.len(), 12);
    }
    // The stored prefix is untouched by its forks' generations.
    assert_eq!(dec.seq_len(base), Some(prefix.len()));
    dec.release(base).expect("release");
    assert!(dec.fork(base).is_err());
}

#[test]
fn tiny_model_context_full_and_limits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny::write(
        dir.path(),
        "short.gguf",
        &tiny::Spec {
            context: 16,
            ..tiny::Spec::default()
        },
    );
    let mut dec = tiny_decoder(&path, 3);
    let reqs = vec![
        TokenRequest::new(vec![1; 10], greedy(100)),
        TokenRequest::new(vec![1; 17], greedy(100)),
        TokenRequest::new(vec![1; 3], greedy(4)),
        TokenRequest::new(vec![1; 3], greedy(0)),
    ];
    let r = dec.generate(&reqs, &NoText).expect("generate");
    // 10 prompt positions + 6 generated tokens fill 16 positions (the last one is not fed).
    assert_eq!(r[0].stop_reason, StopReason::ContextFull);
    assert_eq!(r[0].output_ids.len(), 7);
    assert_eq!(r[1].stop_reason, StopReason::ContextFull);
    assert!(r[1].output_ids.is_empty());
    assert_eq!(r[2].stop_reason, StopReason::MaxTokens);
    assert_eq!(r[2].output_ids.len(), 4);
    assert_eq!(r[3].stop_reason, StopReason::MaxTokens);
    assert!(r[3].output_ids.is_empty());
    let bad = [TokenRequest::new(vec![tiny::VOCAB as u32], greedy(1))];
    assert!(dec.generate(&bad, &NoText).is_err());
    let empty = [TokenRequest::new(Vec::new(), greedy(1))];
    assert!(dec.generate(&empty, &NoText).is_err());
}

/// Decodes token `i` as the letter `'a' + i % 26`.
struct Letters;

impl candor::engine::TextDecoder for Letters {
    fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| (b'a' + (i % 26) as u8) as char)
            .collect()
    }
}

#[test]
fn tiny_model_stops_on_stop_ids_and_strings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny::write(dir.path(), "m.gguf", &tiny::Spec::default());
    let prompt: Vec<u32> = vec![5, 6, 7, 8];
    let mut dec = tiny_decoder(&path, 2);
    let free = dec
        .generate(&[TokenRequest::new(prompt.clone(), greedy(20))], &Letters)
        .expect("free")
        .remove(0);
    assert_eq!(free.output_ids.len(), 20);
    // Stop on the token generated third: it ends the output and is kept in the ids only.
    let stop = free.output_ids[2];
    let first = free
        .output_ids
        .iter()
        .position(|&t| t == stop)
        .expect("present");
    let model = Transformer::from_gguf_path(&path, WeightDType::Native).expect("load");
    let mut with_stop = Decoder::new(
        Arc::new(Model::from(model)),
        SchedulerConfig::default(),
        vec![stop],
    );
    let r = with_stop
        .generate(&[TokenRequest::new(prompt.clone(), greedy(20))], &Letters)
        .expect("stop id")
        .remove(0);
    assert_eq!(r.stop_reason, StopReason::Eos);
    assert_eq!(r.output_ids, free.output_ids[..=first]);
    assert_eq!(r.text, Letters.decode(&free.output_ids[..first]));
    // A stop string made of the 4th and 5th tokens' letters: text is cut before it.
    let s = Letters.decode(&free.output_ids[3..5]);
    let mut params = greedy(20);
    params.stop_strings = vec![s.clone()];
    let r = dec
        .generate(&[TokenRequest::new(prompt, params)], &Letters)
        .expect("stop string")
        .remove(0);
    let full = Letters.decode(&free.output_ids);
    let cut = full.find(&s).expect("in text");
    assert_eq!(r.stop_reason, StopReason::StopString);
    assert_eq!(r.text, full[..cut]);
    assert!(r.output_ids.len() <= 5 && free.output_ids.starts_with(&r.output_ids));
}

// ---------------------------------------------------------------------------------------------
// The real model through the chat API, and against the reference fixture.

mod reference {
    use std::path::{Path, PathBuf};

    use candor::text::message::Message;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    pub struct Conversation {
        pub id: String,
        pub messages: Vec<Message>,
    }

    #[derive(Debug, Deserialize)]
    pub struct TeacherForced {
        pub id: String,
        pub ids: Vec<u32>,
        pub start: usize,
        pub argmax: Vec<u32>,
        pub top2_gap: Vec<f32>,
    }

    #[derive(Debug, Deserialize)]
    pub struct F32Greedy {
        pub id: String,
        pub prompt_ids: Vec<u32>,
        pub output_ids: Vec<u32>,
        pub top2_gap: Vec<f32>,
    }

    pub fn path(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/reference")
            .join(name)
    }

    /// The records of a fixture file, or `None` (skip) when it is absent outside CI.
    #[track_caller]
    pub fn read<T: for<'de> Deserialize<'de>>(name: &str) -> Option<Vec<T>> {
        let p = path(name);
        let Ok(text) = std::fs::read_to_string(&p) else {
            crate::util::absent(
                crate::util::Need::Fixture,
                format!("{} not found", p.display()),
            );
            return None;
        };
        let records = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{}:{}: {e}", p.display(), i + 1))
            })
            .collect();
        Some(records)
    }
}

fn engine(dtype: WeightDType, batch_size: usize) -> Option<Engine> {
    let path = util::default_model()?;
    let options = EngineOptions {
        dtype,
        device: Default::default(),
        scheduler: SchedulerConfig {
            batch_size,
            ..SchedulerConfig::default()
        },
        gpu_kv_bytes: None,
    };
    Some(Engine::load(&path, options).expect("load default model"))
}

#[test]
fn quantized_teacher_forced_agrees_with_llama_cpp() {
    let Some(cases) = reference::read::<reference::TeacherForced>("teacher_forced.jsonl") else {
        return;
    };
    let Some(mut eng) = engine(WeightDType::Native, 1) else {
        return;
    };
    let (mut total, mut agree, mut near_tie_misses) = (0, 0, 0);
    for case in &cases {
        let pred = eng
            .decoder()
            .next_token_argmax(&case.ids, case.start - 1)
            .expect("forward");
        let ours = &pred[..case.ids.len() - case.start];
        assert_eq!(ours.len(), case.argmax.len(), "{}", case.id);
        for (k, (a, b)) in ours.iter().zip(&case.argmax).enumerate() {
            total += 1;
            if a == b {
                agree += 1;
            } else if case.top2_gap[k] < 0.5 {
                near_tie_misses += 1;
            }
        }
    }
    let rate = agree as f64 / total as f64;
    println!(
        "teacher-forced agreement with llama.cpp: {agree}/{total} ({:.2}%), {near_tie_misses} of {} misses at top2_gap < 0.5",
        rate * 100.0,
        total - agree
    );
    assert!(total >= 500, "fixture too small: {total} positions");
    assert!(rate >= 0.95, "agreement {agree}/{total} below 95%");
    // The claim the agreement rests on: every disagreement is a near tie in llama.cpp's own
    // logits (top-2 gap under 0.5), never a clear preference overturned.
    assert_eq!(
        near_tie_misses,
        total - agree,
        "{} of the {} misses are not near ties",
        total - agree - near_tie_misses,
        total - agree
    );
}

#[test]
fn f32_greedy_follows_the_float_reference() {
    let Some(cases) = reference::read::<reference::F32Greedy>("f32_greedy.jsonl") else {
        return;
    };
    let Some(mut eng) = engine(WeightDType::F32, 16) else {
        return;
    };
    let reqs: Vec<TokenRequest> = cases
        .iter()
        .map(|c| TokenRequest::new(c.prompt_ids.clone(), greedy(48)))
        .collect();
    let replies = eng.generate_tokens(&reqs).expect("generate");
    let (mut compared, mut exact) = (0, 0);
    for (case, reply) in cases.iter().zip(&replies) {
        // Compare up to (not including) the first near-tie step of the reference.
        let firm = case
            .top2_gap
            .iter()
            .position(|&g| g < 0.01)
            .unwrap_or(case.output_ids.len());
        let n = firm.min(case.output_ids.len());
        compared += 1;
        assert_eq!(
            reply.output_ids.get(..n),
            Some(&case.output_ids[..n]),
            "{}: diverges before the first near tie (step {firm})",
            case.id
        );
        if reply.output_ids == case.output_ids {
            exact += 1;
        }
    }
    println!("f32 greedy: {exact}/{compared} conversations identical to the float reference, all agree up to their first near tie");
}

fn conversations() -> Vec<reference::Conversation> {
    reference::read("conversations.jsonl").expect("committed fixture conversations")
}

#[test]
fn chat_replies_do_not_depend_on_batch_size_neighbours_or_threads() {
    use candor::engine::ChatRequest;
    let convs = conversations();
    assert!(convs.len() >= 12);
    let Some(mut eng) = engine(WeightDType::Native, 16) else {
        return;
    };
    let reqs: Vec<ChatRequest> = convs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            // Every third request samples (seeded); the rest are greedy.
            let (temperature, top_p) = if i % 3 == 2 { (0.9, 0.9) } else { (0.0, 1.0) };
            ChatRequest {
                messages: c.messages.clone(),
                params: SamplingParams {
                    temperature,
                    top_p,
                    seed: 77 + i as u64,
                    max_new_tokens: 24,
                    ..SamplingParams::default()
                },
                ..Default::default()
            }
        })
        .collect();
    let pool = |n| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .expect("thread pool")
    };
    let run = |eng: &mut Engine, reqs: &[ChatRequest], bs: usize, threads: usize| {
        eng.set_batch_size(bs);
        pool(threads)
            .install(|| eng.generate_chat(reqs))
            .expect("generate")
    };
    let baseline = run(&mut eng, &reqs, 16, 2);
    assert!(baseline.iter().all(|r| !r.output_ids.is_empty()));
    for (bs, threads) in [(1, 2), (16, 1)] {
        let got = run(&mut eng, &reqs, bs, threads);
        for (i, (g, b)) in got.iter().zip(&baseline).enumerate() {
            assert_eq!(
                g, b,
                "{}: differs at batch size {bs}, {threads} threads",
                convs[i].id
            );
        }
    }
    // Different neighbours: reversed order at batch size 3 on one thread.
    let rev: Vec<ChatRequest> = reqs.iter().rev().cloned().collect();
    let got = run(&mut eng, &rev, 3, 1);
    for (i, g) in got.iter().rev().enumerate() {
        assert_eq!(
            g, &baseline[i],
            "{}: differs in reversed order",
            convs[i].id
        );
    }
    // Run after run.
    assert_eq!(run(&mut eng, &reqs, 16, 2), baseline);
    let stopped = baseline
        .iter()
        .filter(|r| r.stop_reason == StopReason::Eos)
        .count();
    println!(
        "{} conversations, {stopped} stopped on end of turn",
        baseline.len()
    );
}

#[test]
fn forked_prefix_decodes_like_a_fresh_prompt_on_the_default_model() {
    let Some(mut eng) = engine(WeightDType::Native, 4) else {
        return;
    };
    let convs = conversations();
    let prompt = eng
        .prompt_ids(&candor::engine::ChatRequest {
            messages: convs[1].messages.clone(),
            params: SamplingParams::default(),
            ..Default::default()
        })
        .expect("prompt");
    let split = prompt.len() - 3;
    let base = eng.prefill(&prompt[..split]).expect("prefill");
    let fork_a = eng.fork(base).expect("fork");
    let fork_b = eng.fork(base).expect("fork");
    let tail = prompt[split..].to_vec();
    let forked = [fork_a, fork_b].map(|id| TokenRequest {
        prompt_ids: tail.clone(),
        params: greedy(16),
        prefix: Some(id),
        reasoning: None,
        draft_tokens: None,
    });
    let from_forks = eng.generate_tokens(&forked).expect("forks");
    let fresh = eng
        .generate_tokens(&[TokenRequest::new(prompt.clone(), greedy(16))])
        .expect("fresh");
    assert_eq!(from_forks[0].output_ids, fresh[0].output_ids);
    assert_eq!(from_forks[1].output_ids, fresh[0].output_ids);
    assert!(!fresh[0].output_ids.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Constrained decoding (an FB-Bench judge's JSON object) on the default model.

fn checklist_request(i: usize, max_new_tokens: usize) -> candor::engine::ChatRequest {
    use candor::engine::{ChatRequest, Constraint};
    use candor::judge::checklist::{judgement_schema, judgement_skeleton};
    use candor::text::message::Message;
    let criteria = checklist(i);
    let prompt = format!(
        "Question: what is {i} + 2? Answer: {}.\nJudge the answer against each checklist entry \
         and reply in JSON:\n```json\n{}\n```",
        i + 3,
        judgement_skeleton(&criteria)
    );
    ChatRequest {
        messages: vec![Message::user(prompt)],
        params: SamplingParams {
            max_new_tokens,
            seed: i as u64,
            temperature: if i % 4 == 3 { 0.8 } else { 0.0 },
            constraint: Some(Constraint::JsonSchema(judgement_schema(&criteria))),
            ..SamplingParams::default()
        },
        ..Default::default()
    }
}

fn checklist(i: usize) -> Vec<candor::judge::checklist::Criterion> {
    use candor::judge::checklist::Criterion;
    let mut c = vec![Criterion {
        text: "回答是否给出了正确的结果".into(),
        weight: serde_json::Number::from_f64(0.6),
    }];
    if i.is_multiple_of(2) {
        c.push(Criterion {
            text: format!("The answer states {} exactly", i + 2),
            weight: serde_json::Number::from_f64(0.4),
        });
    }
    c
}

#[test]
fn constrained_judge_reply_has_exactly_the_checklist_entries() {
    use candor::judge::checklist::parse_output;
    use candor::judge::Verdict;
    let Some(mut eng) = engine(WeightDType::Native, 2) else {
        return;
    };
    let reqs = [checklist_request(0, 400), checklist_request(1, 400)];
    let replies = eng.generate_chat(&reqs).expect("generate");
    for (i, r) in replies.iter().enumerate() {
        println!("constrained reply {i} ({:?}): {}", r.stop_reason, r.text);
        assert_eq!(
            r.stop_reason,
            StopReason::Eos,
            "reply {i} did not finish: {}",
            r.text
        );
        let json: serde_json::Value = serde_json::from_str(r.text.trim()).expect("valid JSON");
        let keys: Vec<&String> = json.as_object().expect("an object").keys().collect();
        let want = checklist(i);
        assert_eq!(keys, want.iter().map(|c| &c.text).collect::<Vec<_>>());
        let Verdict::Scored(v) = parse_output(&r.text, &want) else {
            panic!("reply {i} unscored: {}", r.text)
        };
        assert_eq!(v.len(), want.len());
    }
    // The same prompt unconstrained is not a verdict object (the default model's free text).
    let mut free = reqs[0].clone();
    free.params.constraint = None;
    free.params.max_new_tokens = 60;
    let r = eng.generate_chat(&[free]).expect("generate");
    println!("unconstrained reply: {}", r[0].text);
}

#[test]
fn constrained_replies_do_not_depend_on_batch_size_or_neighbours() {
    use candor::engine::ChatRequest;
    let Some(mut eng) = engine(WeightDType::Native, 16) else {
        return;
    };
    // Constrained requests (greedy and seeded) between unconstrained neighbours.
    let convs = conversations();
    let reqs: Vec<ChatRequest> = (0..16)
        .map(|i| {
            if i % 2 == 0 {
                checklist_request(i, 32)
            } else {
                ChatRequest {
                    messages: convs[i % convs.len()].messages.clone(),
                    params: SamplingParams {
                        max_new_tokens: 32,
                        ..SamplingParams::default()
                    },
                    ..Default::default()
                }
            }
        })
        .collect();
    eng.set_batch_size(16);
    let baseline = eng.generate_chat(&reqs).expect("generate");
    for bs in [1, 3] {
        eng.set_batch_size(bs);
        assert_eq!(
            eng.generate_chat(&reqs).expect("generate"),
            baseline,
            "batch {bs}"
        );
    }
    // Other neighbours: constrained requests alone, reversed, at batch size 3.
    let alone: Vec<ChatRequest> = reqs.iter().step_by(2).rev().cloned().collect();
    let got = eng.generate_chat(&alone).expect("generate");
    for (g, b) in got.iter().rev().zip(baseline.iter().step_by(2)) {
        assert_eq!(g, b);
    }
    // Constrained output starts as the schema says.
    for r in baseline.iter().step_by(2) {
        assert!(r.text.trim_start().starts_with('{'), "{}", r.text);
    }
}

// ---- prefix cache: a position's KV does not depend on how its prompt was chunked ----

/// Every position's keys and values (all layers), as bits, after feeding `ids` in chunks of
/// `chunk`, each step packed with an unrelated neighbour sequence.
fn kv_bits(model: &Transformer, ids: &[u32], chunk: usize) -> Vec<u32> {
    let c = model.config();
    let layout = KvLayout {
        n_layer: c.n_layer,
        kv_dim: c.kv_dim(),
    };
    let mut kv = SeqKv::new(layout);
    let mut scratch = Scratch::default();
    for (k, part) in ids.chunks(chunk).enumerate() {
        let mut neighbour = SeqKv::new(layout);
        let noise: Vec<u32> = ids.iter().rev().take(k % 5 + 1).copied().collect();
        let mut steps = [
            SeqStep {
                tokens: &noise,
                kv: &mut neighbour,
                logits: Logits::Last,
            },
            SeqStep {
                tokens: part,
                kv: &mut kv,
                logits: if k % 2 == 0 {
                    Logits::Last
                } else {
                    Logits::All
                },
            },
        ];
        model.forward(&mut steps, &mut scratch);
    }
    let mut bits = Vec::new();
    for layer in 0..c.n_layer {
        for p in 0..ids.len() {
            bits.extend(kv.key(layer, p).iter().map(|v| v.to_bits()));
            bits.extend(kv.value(layer, p).iter().map(|v| v.to_bits()));
        }
    }
    bits
}

fn assert_kv_independent_of_chunking(model: &Transformer, ids: &[u32]) {
    let whole = kv_bits(model, ids, ids.len());
    for chunk in [1, 3, 16, 17, 64] {
        assert!(
            kv_bits(model, ids, chunk) == whole,
            "KV differs when the prompt is fed in chunks of {chunk}"
        );
    }
}

#[test]
fn tiny_model_kv_does_not_depend_on_prefill_chunking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny::write(dir.path(), "m.gguf", &tiny::Spec::default());
    let model = Transformer::from_gguf_path(&path, WeightDType::Native).expect("load tiny model");
    let ids: Vec<u32> = (0..45).map(|i| (i * 11 % 90) as u32 + 3).collect();
    assert_kv_independent_of_chunking(&model, &ids);
}

#[test]
fn default_model_kv_does_not_depend_on_prefill_chunking() {
    let Some(path) = util::default_model() else {
        return;
    };
    let model =
        Transformer::from_gguf_path(&path, WeightDType::Native).expect("load default model");
    let ids: Vec<u32> = FRANCE.iter().cycle().take(70).copied().collect();
    assert_kv_independent_of_chunking(&model, &ids);
}

/// Two-turn dialogues, answered turn after turn by `dec`: every second-turn prompt extends
/// its first turn's prompt and reply, so the cache can serve it. Returns all outputs.
/// The tiny-model scheduler of the multi-turn tests: small prefill chunks and steps, so that
/// turns and chunks interleave; `bytes` of prefix cache.
fn config(bytes: usize, batch_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        batch_size,
        prefill_chunk: 7,
        max_step_tokens: 20,
        prefix_cache_bytes: bytes,
    }
}

fn two_turns(dec: &mut Decoder, firsts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let first: Vec<TokenRequest> = firsts
        .iter()
        .map(|p| TokenRequest::new(p.clone(), greedy(20)))
        .collect();
    let replies = dec.generate(&first, &NoText).expect("first turn");
    let second: Vec<TokenRequest> = firsts
        .iter()
        .zip(&replies)
        .map(|(p, r)| {
            let ids = [p.clone(), r.output_ids.clone(), vec![7, 8, 9]].concat();
            TokenRequest::new(ids, greedy(20))
        })
        .collect();
    let again = dec.generate(&second, &NoText).expect("second turn");
    replies
        .into_iter()
        .chain(again)
        .map(|r| r.output_ids)
        .collect()
}

/// [`two_turns`] as a stream: each second turn is submitted as soon as its first turn is
/// answered, while the other dialogues are still decoding.
fn two_turns_streamed(dec: &mut Decoder, firsts: &[Vec<u32>]) -> (Vec<Vec<u32>>, bool) {
    let n = firsts.len();
    let mut out = vec![Vec::new(); 2 * n];
    for (d, p) in firsts.iter().enumerate() {
        dec.submit(d as u64, TokenRequest::new(p.clone(), greedy(20)))
            .expect("submit");
    }
    let mut overlapped = false;
    while dec.in_flight() > 0 {
        for (id, reply) in dec.step(&NoText).expect("step") {
            let id = id as usize;
            out[id] = reply.output_ids;
            if id < n {
                let ids = [firsts[id].clone(), out[id].clone(), vec![7, 8, 9]].concat();
                overlapped |= dec.in_flight() > 0;
                dec.submit((n + id) as u64, TokenRequest::new(ids, greedy(20)))
                    .expect("submit");
            }
        }
    }
    (out, overlapped)
}

#[test]
fn tiny_model_streamed_turns_match_turn_by_turn_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny::write(dir.path(), "m.gguf", &tiny::Spec::default());
    let firsts: Vec<Vec<u32>> = (0..5)
        .map(|d| {
            (0..8 + 9 * d)
                .map(|i| ((i * 5 + d) % 90) as u32 + 3)
                .collect()
        })
        .collect();
    let model = Arc::new(Model::from(
        Transformer::from_gguf_path(&path, WeightDType::Native).expect("load"),
    ));
    let mut batched = Decoder::new(Arc::clone(&model), config(0, 5), Vec::new());
    let want = two_turns(&mut batched, &firsts);
    for (bytes, batch) in [(0, 2), (1 << 30, 2), (1 << 30, 8), (0, 1)] {
        let mut dec = Decoder::new(Arc::clone(&model), config(bytes, batch), Vec::new());
        let (got, overlapped) = two_turns_streamed(&mut dec, &firsts);
        assert_eq!(got, want, "budget {bytes}, batch {batch}");
        assert!(overlapped, "a second turn started while others decoded");
        assert_eq!(dec.in_flight(), 0);
    }
    // A request the engine cannot take is refused at once, and nothing is queued.
    let mut dec = Decoder::new(model, config(0, 2), Vec::new());
    let err = dec
        .submit(1, TokenRequest::new(Vec::new(), greedy(3)))
        .unwrap_err();
    assert_eq!(err.to_string(), "request 0: empty prompt");
    assert_eq!(dec.in_flight(), 0);
    assert!(dec.step(&NoText).expect("idle step").is_empty());
}

#[test]
fn tiny_model_prefix_cache_changes_no_token_and_reuses_earlier_turns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = tiny::write(dir.path(), "m.gguf", &tiny::Spec::default());
    // Three dialogues sharing a 20-token system prompt; first prompts of 30 to 50 tokens.
    let system: Vec<u32> = (0..20).map(|i| (i * 3 % 90) as u32 + 3).collect();
    let firsts: Vec<Vec<u32>> = (0..3)
        .map(|d| {
            let tail = (0..10 + 10 * d).map(|i| ((i * 7 + d) % 90) as u32 + 3);
            system.iter().copied().chain(tail).collect()
        })
        .collect();
    let model = Arc::new(Model::from(
        Transformer::from_gguf_path(&path, WeightDType::Native).expect("load"),
    ));
    let mut off = Decoder::new(Arc::clone(&model), config(0, 2), Vec::new());
    let want = two_turns(&mut off, &firsts);
    assert_eq!(off.prefill_stats().reused, 0);
    assert_eq!(off.cached_blocks(), 0);
    // A large budget, and one so small that blocks are evicted all the time.
    let c = model.config();
    let block = candor::engine::kv::Block::bytes(KvLayout {
        n_layer: c.n_layer,
        kv_dim: c.kv_dim(),
    });
    for (bytes, batch) in [(1 << 30, 2), (1 << 30, 1), (3 * block, 3)] {
        let mut on = Decoder::new(Arc::clone(&model), config(bytes, batch), Vec::new());
        assert_eq!(
            two_turns(&mut on, &firsts),
            want,
            "budget {bytes}, batch {batch}"
        );
        let (s_on, s_off) = (on.prefill_stats(), off.prefill_stats());
        assert_eq!(s_on.computed + s_on.reused, s_off.computed);
        if bytes > 1 << 20 {
            // Each second turn reuses at least its first turn's whole blocks.
            assert!(s_on.reused >= 16 * 3, "{s_on:?}");
        }
    }
}

#[test]
fn default_model_prefix_cache_changes_no_token() {
    let Some(path) = util::default_model() else {
        return;
    };
    let model = Arc::new(Model::from(
        Transformer::from_gguf_path(&path, WeightDType::Native).expect("load"),
    ));
    let firsts: Vec<Vec<u32>> = (0..2)
        .map(|d| FRANCE.iter().cycle().take(40 + 9 * d).copied().collect())
        .collect();
    let mut outs = Vec::new();
    for bytes in [0, 64 << 20] {
        let cfg = SchedulerConfig {
            batch_size: 2,
            prefix_cache_bytes: bytes,
            ..SchedulerConfig::default()
        };
        let mut dec = Decoder::new(Arc::clone(&model), cfg, vec![2]);
        outs.push(two_turns(&mut dec, &firsts));
        assert_eq!(dec.prefill_stats().reused > 0, bytes > 0);
    }
    assert_eq!(outs[0], outs[1]);
}

/// `candor bench --batch-size 1,3` measures both sizes on one load: one JSON line each, in
/// order, then one table with a row each; a zero batch size is refused before loading.
#[test]
fn bench_measures_several_batch_sizes_in_one_load() {
    let Some(path) = util::default_model() else {
        return;
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_candor"))
        .args([
            "bench",
            "--threads",
            "2",
            "--prompt-tokens",
            "8",
            "--new-tokens",
            "2",
        ])
        .args(["--batch-size", "1,3", "--model"])
        .arg(&path)
        .output()
        .expect("runs candor bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let batches: Vec<u64> = lines
        .iter()
        .map(|l| l["batch_size"].as_u64().unwrap())
        .collect();
    assert_eq!(batches, [1, 3], "{stdout}");
    for l in &lines {
        assert!(l["decode_tok_s"].as_f64().unwrap() > 0.0, "{l}");
    }
    let rows = stdout
        .lines()
        .filter(|l| l.starts_with("|     8 |"))
        .count();
    assert_eq!(rows, 2, "{stdout}");

    let zero = std::process::Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(["bench", "--batch-size", "2,0", "--model"])
        .arg(&path)
        .output()
        .expect("runs candor bench");
    assert!(!zero.status.success());
    assert!(String::from_utf8_lossy(&zero.stderr).contains("--batch-size"));
}
