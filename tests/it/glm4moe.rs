//! `glm4moe` (GLM-4.5, GLM-4.5-Air, GLM-4.6 and GLM-4.7 as llama.cpp converts them: GQA with
//! q/k/v biases, optional per-head q/k norms, NEOX RoPE over half of each head, a leading dense
//! layer, then sigmoid-routed experts with a selection bias, normalized and scaled weights, and
//! a shared expert; a multi-token-prediction layer after the trunk that decoding skips): tiny
//! seeded models, quantized by llama.cpp's own llama-quantize, against llama.cpp's
//! teacher-forced argmax (`tests/fixtures/quant/tiny_glm4moe_teacher_forced.jsonl`, written by
//! `make_tiny_glm4moe_reference.py`); the selection bias, the partial rotary dimension, the
//! weights scale and norm, the q/k norms and the attention biases matter; invariant under batch
//! size, neighbours, threads and every split of a prompt; not lowered for the GPU yet.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candor::model::arch::Gating;
use candor::model::plan::Step;
use candor::stats::rng::SplitMix64;

use crate::hybrid::assert_dense_splits_give_one_prefills_bits;
use crate::moe::TinyRecord;
use crate::quant::{assert_verdicts, Draw, TinyTensor, TQ_VOCAB};

const FIXTURE: &str = "quant/tiny_glm4moe_teacher_forced.jsonl";
const DIM: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
/// Each head's query/key/value width (`attention.key_length` / `value_length`).
const HEAD_DIM: usize = 64;
/// RoPE (NEOX) over the first 32 of each head's 64 dimensions (GLM's partial_rotary_factor
/// 0.5).
const ROPE_DIM: usize = 32;
/// Trunk layers (the MTP model has one more block, `nextn_predict_layers` 1).
const LAYERS: usize = 3;
/// Layers with a dense FFN (of `FFN`) before the MoE layers (`leading_dense_block_count`).
const DENSE_LEAD: usize = 1;
const FFN: usize = 512;
/// Experts, used per token, their width, shared experts.
const EXPERTS: usize = 16;
const USED: usize = 4;
const EXPERT_FFN: usize = 128;
const SHARED: usize = 1;

/// One of the script's models.
#[derive(Clone, Copy)]
struct Variant {
    /// `attn_q_norm` / `attn_k_norm`.
    qk_norm: bool,
    /// `expert_weights_scale`.
    scale: f32,
    /// One multi-token-prediction layer after the trunk (`nextn_predict_layers` 1).
    mtp: bool,
    /// `rope.dimension_count` (a mutation changes it).
    rope_dim: usize,
    /// `expert_weights_norm`.
    weights_norm: bool,
}

/// The script's `MODELS`.
fn variant(name: &str) -> Variant {
    let (qk_norm, scale, mtp) = match name {
        "glm4moe" => (false, 1.0, false),
        "glm4moe-qknorm" => (true, 2.5, false),
        "glm4moe-mtp" => (false, 1.0, true),
        other => panic!("unknown model {other} in the fixture"),
    };
    Variant {
        qk_norm,
        scale,
        mtp,
        rope_dim: ROPE_DIM,
        weights_norm: true,
    }
}

/// The script's `glm4moe_tensors`: drawn in the same order from the same `SplitMix64` stream
/// (the MTP layer after `output.weight`, so the trunk is glm4moe's).
fn glm4moe_tensors(name: &str) -> Vec<TinyTensor> {
    let v = variant(name);
    let kv = HEAD_DIM * KV_HEADS;
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    let scale = |k: usize| 1.5f32 / (k as f32).sqrt();
    // A 3-d matrix (outermost first), uniform in ±1.5/√(innermost).
    let mat3 = |w: &mut Draw, name: String, shape: [usize; 3]| {
        w.add(name, shape.to_vec(), scale(shape[2]), None)
    };
    let layer = |w: &mut Draw, i: usize| {
        let b = |s: &str| format!("blk.{i}.{s}");
        w.norm(b("attn_norm.weight"), DIM);
        w.mat(b("attn_q.weight"), HEADS * HEAD_DIM, DIM);
        w.add(b("attn_q.bias"), vec![HEADS * HEAD_DIM], 0.1, None);
        w.mat(b("attn_k.weight"), kv, DIM);
        w.add(b("attn_k.bias"), vec![kv], 0.1, None);
        w.mat(b("attn_v.weight"), kv, DIM);
        w.add(b("attn_v.bias"), vec![kv], 0.1, None);
        if v.qk_norm {
            w.norm(b("attn_q_norm.weight"), HEAD_DIM);
            w.norm(b("attn_k_norm.weight"), HEAD_DIM);
        }
        w.mat(b("attn_output.weight"), DIM, HEADS * HEAD_DIM);
        w.norm(b("post_attention_norm.weight"), DIM);
        if i < DENSE_LEAD {
            w.mat(b("ffn_gate.weight"), FFN, DIM);
            w.mat(b("ffn_up.weight"), FFN, DIM);
            w.mat(b("ffn_down.weight"), DIM, FFN);
        } else {
            w.mat(b("ffn_gate_inp.weight"), EXPERTS, DIM);
            w.add(b("exp_probs_b.bias"), vec![EXPERTS], 0.1, None);
            mat3(w, b("ffn_gate_exps.weight"), [EXPERTS, EXPERT_FFN, DIM]);
            mat3(w, b("ffn_up_exps.weight"), [EXPERTS, EXPERT_FFN, DIM]);
            mat3(w, b("ffn_down_exps.weight"), [EXPERTS, DIM, EXPERT_FFN]);
            let sh = EXPERT_FFN * SHARED;
            w.mat(b("ffn_gate_shexp.weight"), sh, DIM);
            w.mat(b("ffn_up_shexp.weight"), sh, DIM);
            w.mat(b("ffn_down_shexp.weight"), DIM, sh);
        }
    };
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 1.0, None);
    for i in 0..LAYERS {
        layer(&mut w, i);
    }
    w.norm("output_norm.weight".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    if v.mtp {
        let b = |s: &str| format!("blk.{LAYERS}.{s}");
        w.norm(b("nextn.enorm.weight"), DIM);
        w.norm(b("nextn.hnorm.weight"), DIM);
        w.mat(b("nextn.eh_proj.weight"), DIM, 2 * DIM);
        layer(&mut w, LAYERS);
        w.norm(b("nextn.shared_head_norm.weight"), DIM);
    }
    w.out
}

/// The script's GGUF metadata of model `v` (the keys `Glm4MoeModel.set_gguf_parameters`
/// writes), without the vocabulary, which these ids-only tests do not read.
fn glm4moe_metadata(v: &Variant) -> Vec<(String, Value)> {
    let a = "glm4moe";
    let shape = crate::util::TinyShape {
        arch: a,
        layers: LAYERS + usize::from(v.mtp),
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        kv_heads: KV_HEADS,
        context: 256,
    };
    let mut extra = vec![
        ("attention.key_length", HEAD_DIM as u32),
        ("attention.value_length", HEAD_DIM as u32),
        ("expert_used_count", USED as u32),
        ("rope.dimension_count", v.rope_dim as u32),
        ("expert_count", EXPERTS as u32),
        ("expert_feed_forward_length", EXPERT_FFN as u32),
        ("expert_shared_count", SHARED as u32),
        ("leading_dense_block_count", DENSE_LEAD as u32),
        // sigmoid
        ("expert_gating_func", 2),
    ];
    if v.mtp {
        extra.push(("nextn_predict_layers", 1));
    }
    let mut md = crate::util::tiny_metadata(&shape, &extra);
    md.push((format!("{a}.expert_weights_scale"), Value::F32(v.scale)));
    md.push((
        format!("{a}.expert_weights_norm"),
        Value::Bool(v.weights_norm),
    ));
    md
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes checked
/// against llama-quantize's) into `dir`.
pub(crate) fn write_model(dir: &Path, t: &TinyRecord) -> PathBuf {
    crate::moe::write_fixture_model(
        dir,
        t,
        &glm4moe_tensors(&t.arch),
        &glm4moe_metadata(&variant(&t.arch)),
    )
}

/// The test draws the script's weights and stores each tensor as llama-quantize did, byte for
/// byte, in every record (in Q4_K_M the 128-wide expert and shared `ffn_down` fall back from
/// the k-quants to Q5_0, or Q8_0 where llama-quantize wants more bits); needs no loader. The
/// MTP model's trunk is glm4moe's, byte for byte, and llama.cpp's argmax on it is glm4moe's.
#[test]
fn every_glm4moe_tensor_has_llama_quantizes_bytes() {
    let records = crate::moe::write_every_record(FIXTURE, 3 * 3, write_model);
    let find = |name: &str, ftype: &str| {
        records
            .iter()
            .find(|t| t.arch == name && t.ftype == ftype)
            .unwrap_or_else(|| panic!("{name} {ftype}"))
    };
    let types = [
        ("output.weight", "Q6_K"),
        ("blk.1.ffn_down_exps.weight", "Q5_0"),
        ("blk.1.ffn_down_shexp.weight", "Q5_0"),
        ("blk.2.ffn_down_exps.weight", "Q8_0"),
        ("blk.2.attn_v.weight", "Q6_K"),
        ("blk.1.ffn_up_exps.weight", "Q4_K"),
        ("blk.1.attn_q.bias", "F32"),
        ("blk.1.exp_probs_b.bias", "F32"),
        ("blk.3.nextn.eh_proj.weight", "Q4_K"),
    ];
    crate::moe::assert_stored_types(&records, "glm4moe-mtp", "Q4_K_M", &types);
    for ftype in ["F32", "Q8_0", "Q4_K_M"] {
        let (plain, mtp) = (find("glm4moe", ftype), find("glm4moe-mtp", ftype));
        for (name, hash) in &plain.tensors {
            assert_eq!(mtp.tensors.get(name), Some(hash), "{ftype} {name}");
        }
        assert_eq!(
            plain.argmax, mtp.argmax,
            "{ftype}: llama.cpp skips the MTP layer"
        );
    }
}

/// All three models in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's
/// weights, stores each tensor in the type llama-quantize chose and requires its bytes; then
/// Candor's teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well
/// as llama.cpp's own other execution paths: on Q4_K_M they reproduce 872-879 of 880), every
/// miss where llama.cpp's top-2 gap is below 0.8 (MoE: a router near tie can pick another
/// expert, `moe.rs`). The MTP model's records are glm4moe's, so Candor must skip its MTP layer
/// as llama.cpp does. Decoding the Q4_K_M models does not depend on batch size, neighbours or
/// threads. Measured: F32 880/880 each; Q8_0 875, 867, 875; Q4_K_M 878, 871, 878 (glm4moe,
/// glm4moe-qknorm, glm4moe-mtp), the widest miss at a gap of 0.184.
#[test]
fn tiny_glm4moe_models_match_llama_cpp_and_are_batch_invariant() {
    let measured = crate::moe::against_llama_cpp(FIXTURE, |t| t.ftype == "Q4_K_M", write_model);
    assert_eq!(measured.len(), 3 * 3, "three models in three types");
    assert_verdicts(&crate::moe::verdicts(measured), 0.8);
}

/// What each model's keys and tensors do is needed: the same F32 weights with one taken away
/// or changed fall below 98% of llama.cpp's argmax, missing where its choice is no near tie.
/// llama.cpp itself on those files (measured, of 880): glm4moe-qknorm with a zero selection
/// bias 559 (llama.cpp refuses a glm4moe file without `exp_probs_b`; glm4moe's 738), glm4moe
/// with `rope.dimension_count` 64 (every dimension rotated) 529, glm4moe-qknorm with
/// `expert_weights_scale` 1 in place of 2.5: 471, glm4moe without `expert_weights_norm` 382,
/// glm4moe-qknorm without its q/k norms 609, glm4moe without its attention biases 602, and
/// the MTP file without `nextn_predict_layers` (and its `nextn.*` tensors), so that blk.3 runs
/// as a fourth trunk layer: 374. Candor on the same files: the same seven counts.
#[test]
fn the_same_glm4moe_weights_without_a_feature_disagree_with_llama_cpp() {
    // (label, model, metadata, tensors dropped (name contains), selection bias zeroed)
    let mutations: [(&str, &str, Variant, &[&str], bool); 7] = [
        (
            "glm4moe-qknorm with a zero exp_probs_b",
            "glm4moe-qknorm",
            variant("glm4moe-qknorm"),
            &[],
            true,
        ),
        (
            "glm4moe with rope.dimension_count 64",
            "glm4moe",
            Variant {
                rope_dim: HEAD_DIM,
                ..variant("glm4moe")
            },
            &[],
            false,
        ),
        (
            "glm4moe-qknorm with expert_weights_scale 1",
            "glm4moe-qknorm",
            Variant {
                scale: 1.0,
                ..variant("glm4moe-qknorm")
            },
            &[],
            false,
        ),
        (
            "glm4moe without expert_weights_norm",
            "glm4moe",
            Variant {
                weights_norm: false,
                ..variant("glm4moe")
            },
            &[],
            false,
        ),
        (
            "glm4moe-qknorm without q/k norms",
            "glm4moe-qknorm",
            variant("glm4moe-qknorm"),
            &["attn_q_norm", "attn_k_norm"],
            false,
        ),
        (
            "glm4moe without attention biases",
            "glm4moe",
            variant("glm4moe"),
            &["attn_q.bias", "attn_k.bias", "attn_v.bias"],
            false,
        ),
        (
            "glm4moe-mtp with its MTP layer in the trunk",
            "glm4moe-mtp",
            Variant {
                mtp: false,
                ..variant("glm4moe-mtp")
            },
            &["nextn."],
            false,
        ),
    ];
    for (label, name, v, drop, zero_bias) in mutations {
        let ws: Vec<_> = glm4moe_tensors(name)
            .into_iter()
            .filter(|(n, _, _)| !drop.iter().any(|d| n.contains(d)))
            .map(
                |(n, s, x)| match zero_bias && n.ends_with("exp_probs_b.bias") {
                    true => (n, s, vec![0.0; x.len()]),
                    false => (n, s, x),
                },
            )
            .collect();
        let mut md = glm4moe_metadata(&v);
        if name == "glm4moe-mtp" && !v.mtp {
            // Four trunk layers: blk.3 is an ordinary MoE layer.
            md.retain(|(k, _)| k != "glm4moe.block_count");
            md.push((
                "glm4moe.block_count".into(),
                Value::U32((LAYERS + 1) as u32),
            ));
        }
        crate::moe::assert_f32_mutant_disagrees(FIXTURE, label, name, &md, ws);
    }
}

/// A prompt's logits at every position are the same bits in one prefill, in chunks of 1
/// (token by token), 3, 16 and uneven sizes, and on 1 or 2 threads.
#[test]
fn every_split_of_a_glm4moe_prompt_gives_the_same_bits() {
    for name in ["glm4moe", "glm4moe-qknorm", "glm4moe-mtp"] {
        let (_dir, model) = crate::moe::fixture_model(
            FIXTURE,
            |t| t.arch == name && t.ftype == "Q4_K_M",
            write_model,
        );
        assert_dense_splits_give_one_prefills_bits(&model, name);
    }
}

/// Every step of the glm4moe models lowers for `--device cuda` (DeepSeek's router in
/// `moe_route`, the ungated shared experts, the leading dense layer, partial NeoX RoPE, q/k
/// norms), launch for step, with the integer or legacy matmuls, fused or not; the router's
/// launch is the one `moe_route` after its matmul.
#[test]
fn every_glm4moe_step_lowers_for_the_gpu() {
    for name in ["glm4moe", "glm4moe-qknorm", "glm4moe-mtp"] {
        let (_dir, model) =
            crate::moe::fixture_model(FIXTURE, |t| t.arch == name && t.ftype == "F32", write_model);
        let mut routes = 0;
        crate::moe::assert_lowered_step_for_step(&model, name, |low, place, steps| {
            routes += crate::moe::assert_one_launch_per_step(low, place, steps, name, |s| {
                matches!(s, Step::Route(Gating::Deepseek { .. })).then_some("moe_route")
            });
        });
        // Four lowerings of each MoE layer (the leading layers are dense).
        assert_eq!(routes, 4 * (model.plan().n_layers() - DENSE_LEAD), "{name}");
    }
}

/// The tiny GLM-4.5 model as transformers 5.24 saves it (`glm4_moe`: a dense first layer,
/// then four experts per expert with DeepSeek's sigmoid routing, `e_score_correction_bias`,
/// two groups of which one is used, weights renormalised and scaled by 2.5, a shared expert,
/// q/k/v biases and norms, half the head rotated; by `tests/reference/make_tiny.py
/// glm4moe`) loads as `glm4moe` with that configuration (every tensor read but a
/// multi-token-prediction layer after the trunk, as GLM's checkpoints keep one), in f32 and
/// in its own types, and its greedy decoding agrees with transformers' f32 reference (48/48
/// steps), last-position logits within 1e-3. A config without `n_group` is refused by name.
#[test]
fn a_glm4moe_checkpoint_is_the_model_transformers_runs() {
    use candle_core::{DType, Device, Tensor};
    use candor::model::arch::ModelConfig;
    use candor::model::checkpoint::Checkpoint;
    use candor::model::transformer::{Transformer, WeightDType};
    let src = crate::arch::fixture("glm4moe");
    // A multi-token-prediction layer after the trunk, as GLM-4.5's checkpoints hold.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).expect("config");
    let mut tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).expect("load");
    let eh = Tensor::ones((32, 64), DType::BF16, &Device::Cpu).expect("tensor");
    tensors.insert("model.layers.3.eh_proj.weight".into(), eh);
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).expect("save");
    for dtype in [WeightDType::F32, WeightDType::Native] {
        let mut ck = Checkpoint::open(dir.path()).expect("opens");
        let model = Transformer::from_checkpoint(&mut ck, dtype).expect("loads");
        let c = model.config();
        let moe = c.moe.expect("experts");
        assert_eq!(
            (
                c.architecture.as_str(),
                c.rope_dim,
                moe.experts,
                moe.used,
                moe.dense_lead
            ),
            ("glm4moe", 8, 4, 2, 1)
        );
        assert_eq!(
            (moe.groups, moe.shared_ffn, moe.weights_scale),
            (Some((2, 1)), Some(32), 2.5)
        );
        crate::arch::check_against_reference("glm4moe", &model, &format!("checkpoint, {dtype:?}"));
    }
    let path = src.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
    json.as_object_mut().expect("object").remove("n_group");
    let e = ModelConfig::from_hf_config(&path, &json).expect_err("refused");
    assert!(e.to_string().contains("n_group"), "{e}");
}
