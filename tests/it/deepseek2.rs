//! `deepseek2` and `mistral4` (DeepSeek-V2/V3 and Mistral Small 4 as llama.cpp converts them:
//! Multi-head Latent Attention in its absorbed form, DeepSeek's MoE with shared experts): tiny
//! seeded models, quantized by llama.cpp's own llama-quantize, against llama.cpp's
//! teacher-forced argmax (`tests/fixtures/quant/tiny_deepseek2_teacher_forced.jsonl`, written by
//! `make_tiny_deepseek2_reference.py`); the selection bias, the expert groups, the YaRN mscale
//! of GGUF arch `deepseek2`, the attention temperature and the weights scale matter; invariant
//! under batch size, neighbours, threads and every split of a prompt; not lowered for the GPU
//! yet.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candor::model::plan::Step;
use candor::stats::rng::SplitMix64;

use crate::hybrid::assert_dense_splits_give_one_prefills_bits;
use crate::moe::TinyRecord;
use crate::quant::{assert_verdicts, q, Draw, TinyTensor, TQ_VOCAB};

const FIXTURE: &str = "quant/tiny_deepseek2_teacher_forced.jsonl";
const DIM: usize = 256;
const HEADS: usize = 4;
const LAYERS: usize = 3;
/// Layers with a dense FFN (of `FFN`) before the MoE layers (`leading_dense_block_count`).
const DENSE_LEAD: usize = 1;
const FFN: usize = 512;
/// Experts, used per token, their width (and the shared experts' unit width).
const EXPERTS: usize = 16;
const USED: usize = 4;
const EXPERT_FFN: usize = 128;
/// MLA: the latent's width, each head's unrotated and rotated query/key dimensions, each head's
/// value width after `attn_v_b`.
const KV_LORA: usize = 128;
const QK_NOPE: usize = 64;
const QK_ROPE: usize = 32;
const V_HEAD: usize = 64;
/// YaRN (deepseek2 and mistral4): factor over the original context.
const YARN_FACTOR: f32 = 4.0;
const ORIG_CTX: u32 = 64;
/// mistral4's attention temperature: scale, and the positions per step (not the original
/// context, so that both are read).
const TEMP_SCALE: f32 = 0.1;
const TEMP_LENGTH: u32 = 16;

/// One of the script's models.
#[derive(Clone, Copy)]
struct Variant {
    /// GGUF architecture.
    arch: &'static str,
    /// `attention.q_lora_rank` (0: a plain `attn_q`).
    q_lora: usize,
    /// `expert_gating_func`: 1 softmax, 2 sigmoid.
    gating: u32,
    /// `exp_probs_b.bias`, the selection bias.
    bias: bool,
    /// `expert_weights_norm`.
    norm: bool,
    /// `expert_weights_scale`.
    scale: f32,
    /// `expert_group_count`, `expert_group_used_count`.
    groups: Option<(u32, u32)>,
    /// `expert_shared_count`.
    shared: usize,
    /// `rope.scaling.yarn_log_multiplier` (with YaRN), or no RoPE scaling.
    yarn_log_mul: Option<f32>,
    /// The attention temperature keys.
    temperature: bool,
}

/// The script's `MODELS`.
fn variant(name: &str) -> Variant {
    match name {
        "deepseek2" => Variant {
            arch: "deepseek2",
            q_lora: 64,
            gating: 2,
            bias: true,
            norm: true,
            scale: 2.5,
            groups: Some((4, 2)),
            shared: 1,
            yarn_log_mul: Some(0.0707),
            temperature: false,
        },
        "deepseek2-lite" => Variant {
            arch: "deepseek2",
            q_lora: 0,
            gating: 1,
            bias: false,
            norm: false,
            scale: 1.0,
            groups: None,
            shared: 2,
            yarn_log_mul: None,
            temperature: false,
        },
        "mistral4" => Variant {
            arch: "mistral4",
            q_lora: 64,
            gating: 1,
            bias: false,
            norm: true,
            scale: 1.0,
            groups: None,
            shared: 1,
            yarn_log_mul: Some(0.1),
            temperature: true,
        },
        other => panic!("unknown model {other} in the fixture"),
    }
}

/// The script's `deepseek2_tensors`: drawn in the same order from the same `SplitMix64` stream.
fn deepseek2_tensors(name: &str) -> Vec<TinyTensor> {
    let v = variant(name);
    let qk = QK_NOPE + QK_ROPE;
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    let scale = |k: usize| 1.5f32 / (k as f32).sqrt();
    // A 3-d matrix (outermost first), uniform in ±1.5/√(innermost).
    let mat3 = |w: &mut Draw, name: String, shape: [usize; 3]| {
        w.add(name, shape.to_vec(), scale(shape[2]), None)
    };
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 1.0, None);
    for i in 0..LAYERS {
        let b = |s: &str| format!("blk.{i}.{s}");
        w.norm(b("attn_norm.weight"), DIM);
        if v.q_lora > 0 {
            w.mat(b("attn_q_a.weight"), v.q_lora, DIM);
            w.norm(b("attn_q_a_norm.weight"), v.q_lora);
            w.mat(b("attn_q_b.weight"), HEADS * qk, v.q_lora);
        } else {
            w.mat(b("attn_q.weight"), HEADS * qk, DIM);
        }
        w.mat(b("attn_kv_a_mqa.weight"), KV_LORA + QK_ROPE, DIM);
        w.norm(b("attn_kv_a_norm.weight"), KV_LORA);
        mat3(&mut w, b("attn_k_b.weight"), [HEADS, KV_LORA, QK_NOPE]);
        mat3(&mut w, b("attn_v_b.weight"), [HEADS, V_HEAD, KV_LORA]);
        w.mat(b("attn_output.weight"), DIM, HEADS * V_HEAD);
        w.norm(b("ffn_norm.weight"), DIM);
        if i < DENSE_LEAD {
            w.mat(b("ffn_gate.weight"), FFN, DIM);
            w.mat(b("ffn_up.weight"), FFN, DIM);
            w.mat(b("ffn_down.weight"), DIM, FFN);
        } else {
            w.mat(b("ffn_gate_inp.weight"), EXPERTS, DIM);
            if v.bias {
                w.add(b("exp_probs_b.bias"), vec![EXPERTS], 0.1, None);
            }
            mat3(
                &mut w,
                b("ffn_gate_exps.weight"),
                [EXPERTS, EXPERT_FFN, DIM],
            );
            mat3(&mut w, b("ffn_up_exps.weight"), [EXPERTS, EXPERT_FFN, DIM]);
            mat3(
                &mut w,
                b("ffn_down_exps.weight"),
                [EXPERTS, DIM, EXPERT_FFN],
            );
            let sh = EXPERT_FFN * v.shared;
            w.mat(b("ffn_gate_shexp.weight"), sh, DIM);
            w.mat(b("ffn_up_shexp.weight"), sh, DIM);
            w.mat(b("ffn_down_shexp.weight"), DIM, sh);
        }
    }
    w.norm("output_norm.weight".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    w.out
}

/// The script's GGUF metadata of model `v` (the keys `DeepseekV2Model.set_gguf_parameters`
/// writes), without the vocabulary, which these ids-only tests do not read.
fn deepseek2_metadata(v: &Variant) -> Vec<(String, Value)> {
    let a = v.arch;
    let shape = crate::util::TinyShape {
        arch: a,
        layers: LAYERS,
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        // MLA converts into MQA: one key/value head of the latent.
        kv_heads: 1,
        context: 256,
    };
    let mut extra = vec![
        ("leading_dense_block_count", DENSE_LEAD as u32),
        ("vocab_size", TQ_VOCAB as u32),
        ("attention.q_lora_rank", v.q_lora as u32),
        ("attention.kv_lora_rank", KV_LORA as u32),
        ("attention.key_length", (KV_LORA + QK_ROPE) as u32),
        ("attention.value_length", KV_LORA as u32),
        ("attention.key_length_mla", (QK_NOPE + QK_ROPE) as u32),
        ("attention.value_length_mla", V_HEAD as u32),
        ("expert_feed_forward_length", EXPERT_FFN as u32),
        ("expert_count", EXPERTS as u32),
        ("expert_used_count", USED as u32),
        ("expert_shared_count", v.shared as u32),
        ("expert_gating_func", v.gating),
        ("rope.dimension_count", QK_ROPE as u32),
    ];
    if let Some((groups, used)) = v.groups {
        extra.extend([
            ("expert_group_count", groups),
            ("expert_group_used_count", used),
        ]);
    }
    let mut md = crate::util::tiny_metadata(&shape, &extra);
    let key = |k: &str| format!("{a}.{k}");
    md.retain(|(k, _)| k != &key("attention.layer_norm_rms_epsilon"));
    md.push((key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)));
    md.push((key("expert_weights_scale"), Value::F32(v.scale)));
    if v.norm {
        md.push((key("expert_weights_norm"), Value::Bool(true)));
    }
    if let Some(log_mul) = v.yarn_log_mul {
        md.extend([
            (key("rope.scaling.type"), Value::String("yarn".into())),
            (key("rope.scaling.factor"), Value::F32(YARN_FACTOR)),
            (
                key("rope.scaling.original_context_length"),
                Value::U32(ORIG_CTX),
            ),
            (key("rope.scaling.yarn_log_multiplier"), Value::F32(log_mul)),
        ]);
    }
    if v.temperature {
        md.extend([
            (key("attention.temperature_scale"), Value::F32(TEMP_SCALE)),
            (key("attention.temperature_length"), Value::U32(TEMP_LENGTH)),
        ]);
    }
    md
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes checked
/// against llama-quantize's) into `dir`.
pub(crate) fn write_model(dir: &Path, t: &TinyRecord) -> PathBuf {
    crate::moe::write_fixture_model(
        dir,
        t,
        &deepseek2_tensors(&t.arch),
        &deepseek2_metadata(&variant(&t.arch)),
    )
}

/// The test draws the script's weights and stores each tensor as llama-quantize did, byte for
/// byte, in every record (the 3-d `attn_k_b` / `attn_v_b`, 64 and 128 wide, fall back from
/// Q4_K to Q5_0 in Q4_K_M, and so do the 128-wide expert and shared `ffn_down`, Q6_K to Q8_0
/// where llama-quantize wants more bits); needs no loader.
#[test]
fn every_deepseek2_tensor_has_llama_quantizes_bytes() {
    let records = crate::moe::write_every_record(FIXTURE, 3 * 3, write_model);
    let types = [
        ("blk.1.attn_k_b.weight", "Q5_0"),
        ("blk.1.attn_v_b.weight", "Q5_0"),
        ("blk.1.attn_q_b.weight", "Q5_0"),
        ("blk.1.ffn_down_exps.weight", "Q5_0"),
        ("blk.2.ffn_down_exps.weight", "Q8_0"),
        ("blk.1.ffn_up_exps.weight", "Q4_K"),
        ("blk.1.exp_probs_b.bias", "F32"),
    ];
    crate::moe::assert_stored_types(&records, "deepseek2", "Q4_K_M", &types);
}

/// All three models in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's
/// weights, stores each tensor in the type llama-quantize chose and requires its bytes; then
/// Candor's teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well
/// as llama.cpp's own other execution paths: on Q4_K_M they reproduce 864-873 of 880), every
/// miss where llama.cpp's top-2 gap is below 0.8 (all three are MoE: a router near tie can
/// pick another expert, `moe.rs`). Decoding the Q4_K_M models does not depend on batch size,
/// neighbours or threads.
#[test]
fn tiny_deepseek2_models_match_llama_cpp_and_are_batch_invariant() {
    let measured = crate::moe::against_llama_cpp(FIXTURE, |t| t.ftype == "Q4_K_M", write_model);
    assert_eq!(measured.len(), 3 * 3, "three models in three types");
    assert_verdicts(&crate::moe::verdicts(measured), 0.8);
}

/// What each model's keys and tensors do is needed: the same F32 weights with one taken away
/// or changed fall below 98% of llama.cpp's argmax, missing where its choice is no near tie.
/// llama.cpp itself on those files (measured, of 880): deepseek2 without its selection bias
/// `exp_probs_b` 515, without its expert groups 455, as GGUF arch `mistral4` 739 (YaRN's
/// mscale: llama.cpp sets mscale = mscale_all_dim for arch `deepseek2` only, so the RoPE
/// attention factor is 1 there and (1 + 0.1 ln 4)/(1 + 0.0707 ln 4) under `mistral4`);
/// mistral4 without its attention temperature 802; the lite model with
/// `expert_weights_scale` 2 in place of 1: 675. (mistral4 as GGUF arch `deepseek2` is the same
/// model: its log multiplier is 1, 880/880.)
#[test]
fn the_same_deepseek2_weights_without_a_feature_disagree_with_llama_cpp() {
    let mutations: [(&str, &str, Variant, bool); 5] = [
        (
            "deepseek2 without exp_probs_b",
            "deepseek2",
            variant("deepseek2"),
            false,
        ),
        (
            "deepseek2 without expert groups",
            "deepseek2",
            Variant {
                groups: None,
                ..variant("deepseek2")
            },
            true,
        ),
        (
            "deepseek2 as mistral4",
            "deepseek2",
            Variant {
                arch: "mistral4",
                ..variant("deepseek2")
            },
            true,
        ),
        (
            "mistral4 without temperature",
            "mistral4",
            Variant {
                temperature: false,
                ..variant("mistral4")
            },
            true,
        ),
        (
            "deepseek2-lite with expert_weights_scale 2",
            "deepseek2-lite",
            Variant {
                scale: 2.0,
                ..variant("deepseek2-lite")
            },
            true,
        ),
    ];
    for (label, name, v, keep_bias) in mutations {
        let ws: Vec<_> = deepseek2_tensors(name)
            .into_iter()
            .filter(|(n, _, _)| keep_bias || !n.ends_with("exp_probs_b.bias"))
            .collect();
        crate::moe::assert_f32_mutant_disagrees(FIXTURE, label, name, &deepseek2_metadata(&v), ws);
    }
}

/// A prompt's logits at every position are the same bits in one prefill, in chunks of 1
/// (token by token), 3, 16 and uneven sizes, and on 1 or 2 threads (the temperature of
/// mistral4 steps every 16 positions, inside the 40-token prompt).
#[test]
fn every_split_of_a_deepseek2_prompt_gives_the_same_bits() {
    const { assert!(crate::hybrid::DENSE_SPLIT_TOKENS > 2 * TEMP_LENGTH as usize) };
    for name in ["deepseek2", "deepseek2-lite", "mistral4"] {
        let (_dir, model) = crate::moe::fixture_model(
            FIXTURE,
            |t| t.arch == name && t.ftype == "Q4_K_M",
            write_model,
        );
        assert_dense_splits_give_one_prefills_bits(&model, name);
    }
}

/// Every step of the deepseek2 and mistral4 models lowers for `--device cuda`, launch for
/// step, with the integer or legacy matmuls, fused or not: the three latent steps one launch
/// each, DeepSeek's router one `moe_route`.
#[test]
fn every_deepseek2_step_lowers_for_the_gpu() {
    for name in ["deepseek2", "deepseek2-lite", "mistral4"] {
        let (_dir, model) =
            crate::moe::fixture_model(FIXTURE, |t| t.arch == name && t.ftype == "F32", write_model);
        let mut latent = 0;
        crate::moe::assert_lowered_step_for_step(&model, name, |low, place, steps| {
            use crate::moe::assert_one_launch_per_step as one;
            latent += one(low, place, steps, name, |s| match s {
                Step::LatentProject => Some("latent_project"),
                Step::Absorb => Some("absorb"),
                Step::Expand => Some("expand"),
                _ => None,
            });
            one(low, place, steps, name, |s| {
                matches!(s, Step::Route(_)).then_some("moe_route")
            });
        });
        assert_eq!(latent, 4 * 3 * model.plan().n_layers(), "{name}");
    }
}

/// What Candor does not implement is refused, naming the key or tensor: a gating function
/// other than softmax and sigmoid, a cached value that is not the latent (a file converted
/// without MLA), and an older conversion's unsplit `attn_kv_b`.
#[test]
fn a_deepseek2_file_it_cannot_run_is_refused_with_the_key_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f32 = |name: &str| -> Vec<_> {
        deepseek2_tensors(name)
            .into_iter()
            .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
            .collect()
    };
    let load = |md: &[(String, Value)], ws: &[(String, candle_core::quantized::QTensor)]| {
        let file = dir.path().join("refused.gguf");
        crate::util::write_gguf(&file, md, ws);
        candor::model::transformer::Transformer::from_gguf_path(
            &file,
            candor::model::transformer::WeightDType::Native,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    let v = variant("deepseek2-lite");
    let with = |key: &str, value: Value| {
        let mut md = deepseek2_metadata(&v);
        let key = format!("deepseek2.{key}");
        md.retain(|(k, _)| k != &key);
        md.push((key, value));
        md
    };
    let msg = load(
        &with("expert_gating_func", Value::U32(4)),
        &f32("deepseek2-lite"),
    );
    assert!(msg.contains("deepseek2.expert_gating_func"), "{msg}");
    let msg = load(
        &with(
            "attention.value_length",
            Value::U32((KV_LORA + QK_ROPE) as u32),
        ),
        &f32("deepseek2-lite"),
    );
    assert!(msg.contains("deepseek2.attention.value_length"), "{msg}");
    let mut ws = f32("deepseek2-lite");
    let kv_b = vec![0.0f32; HEADS * (QK_NOPE + V_HEAD) * KV_LORA];
    ws.push((
        "blk.0.attn_kv_b.weight".into(),
        q(kv_b, &[HEADS * (QK_NOPE + V_HEAD), KV_LORA], GgmlDType::F32),
    ));
    let msg = load(&deepseek2_metadata(&v), &ws);
    assert!(msg.contains("blk.0.attn_kv_b.weight"), "{msg}");
}
