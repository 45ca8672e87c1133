//! `phi3` with LongRoPE (Phi-3 128k, Phi-3.5-mini, Phi-4-mini as llama.cpp converts them):
//! tiny seeded models, one with every dimension rotated and the long factors, one with
//! Phi-4-mini's partial rotation, tied output and the short factors, quantized by llama.cpp's
//! own llama-quantize, against llama.cpp's teacher-forced argmax
//! (`tests/fixtures/quant/tiny_phi3_longrope_teacher_forced.jsonl`, written by
//! `make_tiny_phi3_longrope_reference.py`); the factors and attention factor each matter;
//! invariant under batch size, neighbours, threads and every split of a prompt; a
//! `config.json` with `rope_scaling` of type `longrope` runs the same model as the GGUF
//! llama.cpp's converter makes of it.

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use candor::model::checkpoint::Checkpoint;
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

use crate::hybrid::{assert_dense_splits_give_one_prefills_bits, logits_in_chunks};
use crate::moe::TinyRecord;
use crate::quant::{
    agreement, assert_disagrees, assert_verdicts, q, tiny_fixture, Draw, TinyTensor, TQ_VOCAB,
};

const FIXTURE: &str = "quant/tiny_phi3_longrope_teacher_forced.jsonl";
/// The script's geometry (make_tiny_quant_reference.py's): width, FFN, heads, KV heads,
/// layers; and the models' context.
const TQ_DIM: usize = 256;
const TQ_FFN: usize = 512;
const TQ_HEADS: usize = 4;
const TQ_KV_HEADS: usize = 2;
const LAYERS: usize = 4;
const CTX: usize = 4096;

/// The script's models: (rotated dimensions per head, output tied to the embedding,
/// original context, attention factor as the GGUF stores it).
fn variant(name: &str) -> (usize, bool, usize, f32) {
    match name {
        // sqrt(1 + ln(4096 / 256) / ln 256), llama.cpp's converter's factor.
        "phi3-longrope" => (64, false, 256, 1.5f64.sqrt() as f32),
        "phi4-mini" => (48, true, 4096, 1.190238),
        other => panic!("unknown model {other} in the fixture"),
    }
}

/// The script's `phi3_tensors`: drawn in the same order from the same `SplitMix64` stream
/// (seed 7); a tied model's embedding drawn as a matrix (±1.5/√256); the long factors in
/// 1..5 and the short ones in 1.0..1.2, last.
fn phi3_tensors(name: &str) -> Vec<TinyTensor> {
    let (rope_dim, tied, _, _) = variant(name);
    let (d, f) = (TQ_DIM, TQ_FFN);
    let kv = d / TQ_HEADS * TQ_KV_HEADS;
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    match tied {
        true => w.mat("token_embd.weight".into(), TQ_VOCAB, d),
        false => w.add("token_embd.weight".into(), vec![TQ_VOCAB, d], 1.0, None),
    }
    for i in 0..LAYERS {
        let b = |s: &str| format!("blk.{i}.{s}");
        w.norm(b("attn_norm.weight"), d);
        w.mat(b("attn_qkv.weight"), d + 2 * kv, d);
        w.mat(b("attn_output.weight"), d, d);
        w.norm(b("ffn_norm.weight"), d);
        w.mat(b("ffn_up.weight"), 2 * f, d);
        w.mat(b("ffn_down.weight"), d, f);
    }
    w.norm("output_norm.weight".into(), d);
    if !tied {
        w.mat("output.weight".into(), TQ_VOCAB, d);
    }
    w.add(
        "rope_factors_long.weight".into(),
        vec![rope_dim / 2],
        2.0,
        Some(3.0),
    );
    w.add(
        "rope_factors_short.weight".into(),
        vec![rope_dim / 2],
        0.1,
        Some(1.1),
    );
    w.out
}

/// The script's GGUF metadata of `name`, without the vocabulary, which these ids-only tests
/// do not read.
fn phi3_metadata(name: &str) -> Vec<(String, Value)> {
    let (rope_dim, _, orig, attn_factor) = variant(name);
    let shape = crate::util::TinyShape {
        arch: "phi3",
        layers: LAYERS,
        dim: TQ_DIM,
        ffn: TQ_FFN,
        heads: TQ_HEADS,
        kv_heads: TQ_KV_HEADS,
        context: CTX as u32,
    };
    let extra = [
        ("attention.key_length", 64),
        ("attention.value_length", 64),
        ("attention.sliding_window", 0),
        ("rope.dimension_count", rope_dim as u32),
        ("rope.scaling.original_context_length", orig as u32),
    ];
    let mut md = crate::util::tiny_metadata(&shape, &extra);
    md.push((
        "phi3.rope.scaling.attn_factor".into(),
        Value::F32(attn_factor),
    ));
    md
}

type Metadata = Vec<(String, Value)>;

/// `md` with `key` set to `v` (added when absent).
fn with(md: &[(String, Value)], key: &str, v: Value) -> Vec<(String, Value)> {
    let mut md: Vec<_> = md.iter().filter(|(k, _)| k != key).cloned().collect();
    md.push((key.into(), v));
    md
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes checked
/// against llama-quantize's) into `dir`, with metadata `md`.
fn write_model(
    dir: &std::path::Path,
    t: &TinyRecord,
    md: &[(String, Value)],
) -> std::path::PathBuf {
    crate::moe::write_fixture_model(dir, t, &phi3_tensors(&t.arch), md)
}

/// Both models in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's
/// weights, stores each tensor in the type llama-quantize chose and requires its bytes; then
/// Candor's teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well
/// as llama.cpp's own other execution paths), every miss a near tie (llama.cpp's top-2 gap
/// below 0.1, the dense models' bound); and decoding the Q4_K_M models does not depend on
/// batch size, neighbours or threads.
#[test]
fn tiny_longrope_phi3_models_match_llama_cpp_and_are_batch_invariant() {
    let report = crate::moe::verdicts(crate::moe::against_llama_cpp(
        FIXTURE,
        |t| t.ftype == "Q4_K_M",
        |dir, t| write_model(dir, t, &phi3_metadata(&t.arch)),
    ));
    assert_eq!(report.len(), 6, "two models in three types");
    assert_verdicts(&report, 0.1);
}

/// Each part of LongRoPE matters to the comparison above: the same F32 weights with the other
/// factor set chosen (the original context moved across the context), with an attention
/// factor of 1, or with neither factor set nor attention factor (plain RoPE) each fall below
/// 98% of llama.cpp's argmax, missing where llama.cpp's choice is no near tie.
#[test]
fn longrope_without_its_factors_or_attention_factor_disagrees_with_llama_cpp() {
    let (head, records) = tiny_fixture::<TinyRecord>(FIXTURE);
    let seqs = head.seqs();
    let dir = tempfile::tempdir().expect("tempdir");
    let orig_key = "phi3.rope.scaling.original_context_length";
    let attn_key = "phi3.rope.scaling.attn_factor";
    for t in records.iter().filter(|t| t.ftype == "F32") {
        let md = phi3_metadata(&t.arch);
        let (_, _, orig, _) = variant(&t.arch);
        // 256 → 4096 runs the short factors; 4096 → 256 the long ones.
        let other = if orig == CTX { 256 } else { CTX as u32 };
        let cases: [(&str, Metadata, bool); 3] = [
            (
                "the other factors",
                with(&md, orig_key, Value::U32(other)),
                true,
            ),
            (
                "attention factor 1",
                with(&md, attn_key, Value::F32(1.0)),
                true,
            ),
            (
                "plain RoPE",
                md.iter().filter(|(k, _)| k != attn_key).cloned().collect(),
                false,
            ),
        ];
        for (what, md, factors) in cases {
            let ws: Vec<_> = phi3_tensors(&t.arch)
                .into_iter()
                .filter(|(n, _, _)| factors || !n.starts_with("rope_factors"))
                .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
                .collect();
            let file = dir.path().join("m.gguf");
            crate::util::write_gguf(&file, &md, &ws);
            let a = agreement(&file, &seqs, &t.argmax, &t.top2_gap);
            assert_disagrees(&format!("{} with {what}", t.arch), &a);
        }
    }
}

/// What each file says is read: the rotated dimensions, a tied or separate output, the
/// original context and attention factor, and which factor set the context picks (a model
/// whose context exceeds its original runs the long set); the plan is plain phi3's.
#[test]
fn the_file_picks_the_factor_set_and_the_attention_factor() {
    let records = tiny_fixture::<TinyRecord>(FIXTURE).1;
    let dir = tempfile::tempdir().expect("tempdir");
    for t in records.iter().filter(|t| t.ftype == "F32") {
        let label = &t.arch;
        let (rope_dim, tied, orig, attn_factor) = variant(&t.arch);
        assert_eq!(t.types.contains_key("output.weight"), !tied, "{label}");
        let file = write_model(dir.path(), t, &phi3_metadata(&t.arch));
        let model = Transformer::from_gguf_path(&file, WeightDType::Native).expect("load");
        let c = model.config();
        let lr = c.long_rope.expect("LongRoPE");
        assert_eq!(
            (c.rope_dim, lr.orig_ctx, lr.attn_factor),
            (rope_dim, orig, attn_factor)
        );
        let ws = phi3_tensors(&t.arch);
        let want = if lr.long(c.context_len) {
            "rope_factors_long.weight"
        } else {
            "rope_factors_short.weight"
        };
        assert_eq!(lr.long(c.context_len), t.arch == "phi3-longrope", "{label}");
        let factors = &ws.iter().find(|(n, _, _)| n == want).unwrap().2;
        let freqs = model.rope_freqs();
        assert_eq!(freqs.factors.as_deref(), Some(&factors[..]), "{label}");
        assert_eq!(freqs.mscale, attn_factor, "{label}");
        // At position 0 every angle is 0: the cosines are the attention factor itself.
        let mut cs = vec![0.0; rope_dim];
        freqs.cos_sin(0, &mut cs);
        assert!(cs.chunks(2).all(|p| p == [attn_factor, 0.0]), "{label}");
    }
}

/// A prompt's logits at every position are the same bits in one prefill, in chunks of 1
/// (token by token), 3, 16 and uneven sizes, and on 1 or 2 threads.
#[test]
fn every_split_of_a_longrope_prompt_gives_the_same_bits() {
    let (_dir, model) = crate::moe::fixture_model(
        FIXTURE,
        |t| t.arch == "phi4-mini" && t.ftype == "Q4_K_M",
        |dir, t| write_model(dir, t, &phi3_metadata(&t.arch)),
    );
    assert_dense_splits_give_one_prefills_bits(&model, "phi4-mini");
}

/// The Hugging Face form of the long-factor model: a `config.json` as Phi-3.5-mini's
/// (`rope_scaling` of type `longrope` with both factor lists, `original_max_position_embeddings`
/// beside it) and the same F32 weights under transformers' names. Candor reads from it what
/// llama.cpp's converter writes into the GGUF (the long factors, the attention factor
/// `sqrt(1 + ln(4096 / 256) / ln 256)`), so both give the same logits, bit for bit. With
/// `max_position_embeddings` equal to the original, the short factors and an attention
/// factor of 1 run. An explicit `attention_factor` or a factor list of the wrong length is
/// refused, naming the key.
#[test]
fn a_longrope_config_json_runs_the_model_llama_cpps_converter_writes() {
    let records = tiny_fixture::<TinyRecord>(FIXTURE).1;
    let dir = tempfile::tempdir().expect("tempdir");
    let t = records
        .iter()
        .find(|t| t.arch == "phi3-longrope" && t.ftype == "F32")
        .expect("an F32 phi3-longrope record");
    let gguf = write_model(dir.path(), t, &phi3_metadata(&t.arch));
    let ws = phi3_tensors(&t.arch);
    let factors =
        |name: &str| -> Vec<f32> { ws.iter().find(|(n, _, _)| n == name).unwrap().2.clone() };
    let hf_name = |n: &str| -> Option<String> {
        Some(match n {
            "token_embd.weight" => "model.embed_tokens.weight".into(),
            "output_norm.weight" => "model.norm.weight".into(),
            "output.weight" => "lm_head.weight".into(),
            n if n.starts_with("rope_factors") => return None,
            n => {
                let (l, rest) = n.strip_prefix("blk.").unwrap().split_once('.').unwrap();
                let hf = match rest {
                    "attn_norm.weight" => "input_layernorm.weight",
                    "attn_qkv.weight" => "self_attn.qkv_proj.weight",
                    "attn_output.weight" => "self_attn.o_proj.weight",
                    "ffn_norm.weight" => "post_attention_layernorm.weight",
                    "ffn_up.weight" => "mlp.gate_up_proj.weight",
                    "ffn_down.weight" => "mlp.down_proj.weight",
                    other => panic!("{other}"),
                };
                format!("model.layers.{l}.{hf}")
            }
        })
    };
    let tensors: std::collections::HashMap<String, Tensor> = ws
        .iter()
        .filter_map(|(n, s, v)| {
            let t = Tensor::from_vec(v.clone(), s.as_slice(), &Device::Cpu).unwrap();
            hf_name(n).map(|h| (h, t))
        })
        .collect();
    let ck = dir.path().join("ck");
    std::fs::create_dir(&ck).unwrap();
    candle_core::safetensors::save(&tensors, ck.join("model.safetensors")).unwrap();
    let config = |max_pos: usize, extra: serde_json::Value| {
        let mut rope_scaling = serde_json::json!({
            "type": "longrope",
            "long_factor": factors("rope_factors_long.weight"),
            "short_factor": factors("rope_factors_short.weight"),
        });
        rope_scaling
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let cfg = serde_json::json!({
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "hidden_size": TQ_DIM,
            "intermediate_size": TQ_FFN,
            "num_hidden_layers": LAYERS,
            "num_attention_heads": TQ_HEADS,
            "num_key_value_heads": TQ_KV_HEADS,
            "max_position_embeddings": max_pos,
            "original_max_position_embeddings": 256,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "rope_scaling": rope_scaling,
            "sliding_window": 262144,
            "tie_word_embeddings": false,
            "vocab_size": TQ_VOCAB,
            "hidden_act": "silu",
        });
        std::fs::write(ck.join("config.json"), cfg.to_string()).unwrap();
    };
    let load_hf = || -> candor::model::error::Result<Transformer> {
        let mut c = Checkpoint::open(&ck)?;
        Transformer::from_checkpoint(&mut c, WeightDType::F32)
    };
    let ids = [1u32, 17, 40, 3, 88, 9, 61, 25];

    config(CTX, serde_json::json!({}));
    let hf = load_hf().expect("checkpoint");
    let from_gguf = Transformer::from_gguf_path(&gguf, WeightDType::F32).expect("gguf");
    assert_eq!(hf.config().long_rope, from_gguf.config().long_rope);
    assert_eq!(hf.rope_freqs(), from_gguf.rope_freqs());
    let (a, b) = (
        logits_in_chunks(&hf, &ids, &[3]),
        logits_in_chunks(&from_gguf, &ids, &[3]),
    );
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "the checkpoint's logits differ from the GGUF's"
    );

    // The original context: the short factors, no attention factor.
    config(256, serde_json::json!({}));
    let hf = load_hf().expect("checkpoint");
    let lr = hf.config().long_rope.expect("LongRoPE");
    assert_eq!(lr.attn_factor, 1.0);
    assert_eq!(
        hf.rope_freqs().factors.as_deref(),
        Some(&factors("rope_factors_short.weight")[..])
    );

    config(CTX, serde_json::json!({"attention_factor": 1.2}));
    let e = load_hf().err().expect("refused").to_string();
    assert!(
        e.contains("rope_scaling") && e.contains("attention_factor"),
        "{e}"
    );
    config(CTX, serde_json::json!({"long_factor": [1.0, 2.0]}));
    let e = load_hf().err().expect("refused").to_string();
    assert!(
        e.contains("rope_scaling.long_factor") && e.contains("2 factors for 32"),
        "{e}"
    );
}

/// What a LongRoPE file gets refused for: one factor set without the other (llama.cpp would
/// run without factors whenever it picks the missing one), an attention factor without the
/// factor sets, and a factor set of the wrong length.
#[test]
fn incomplete_longrope_files_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    let md = phi3_metadata("phi3-longrope");
    let ws = phi3_tensors("phi3-longrope");
    let load = |md: &[(String, Value)], ws: &[TinyTensor]| {
        let ws: Vec<_> = ws
            .iter()
            .map(|(n, s, v)| (n.clone(), q(v.clone(), s, GgmlDType::F32)))
            .collect();
        crate::util::write_gguf(&path, md, &ws);
        Transformer::from_gguf_path(&path, WeightDType::Native).map(|_| ())
    };
    load(&md, &ws).expect("the file itself loads");
    let without = |name: &str| -> Vec<TinyTensor> {
        ws.iter().filter(|(n, _, _)| n != name).cloned().collect()
    };
    let e = load(&md, &without("rope_factors_short.weight"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rope_factors_short.weight"), "{e}");
    let no_factors = without("rope_factors_short.weight")
        .into_iter()
        .filter(|(n, _, _)| n != "rope_factors_long.weight")
        .collect::<Vec<_>>();
    let e = load(&md, &no_factors).unwrap_err().to_string();
    assert!(e.contains("phi3.rope.scaling.attn_factor"), "{e}");
    let mut short: Vec<_> = without("rope_factors_long.weight");
    short.push(("rope_factors_long.weight".into(), vec![8], vec![1.0; 8]));
    let e = load(&md, &short).unwrap_err().to_string();
    assert!(e.contains("rope_factors_long.weight"), "{e}");
}
