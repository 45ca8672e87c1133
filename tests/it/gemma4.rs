//! Gemma 4 (issue #43): a tiny seeded `gemma4` (a per-layer sliding-window pattern array,
//! sliding and full layers with different head sizes and KV heads, proportional RoPE on the
//! full layers, two layers sharing earlier layers' KV, a layer whose values are its keys'
//! projection, per-layer token embeddings, per-layer FFN widths, layer output scales),
//! quantized by llama.cpp's own llama-quantize, against llama.cpp's teacher-forced argmax
//! (`tests/fixtures/quant/tiny_gemma4_teacher_forced.jsonl`, written by
//! `make_tiny_gemma4_reference.py`); invariant under batch size, neighbours, threads and
//! every split of a prompt; its plan; and what a file gets refused for.

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candor::model::arch::{Activation, Gating};
use candor::model::plan::{trace, Block, Matrix, Place, RopeTable, Step};
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

use crate::hybrid::{assert_chunks_give_one_prefills_bits, logits_in_chunks};
use crate::moe::TinyRecord;
use crate::quant::{assert_verdicts, q, tiny_fixture, Draw, TinyTensor, TQ_VOCAB};

const DIM: usize = 256;
const HEADS: usize = 4;
/// The script's per-layer sliding-window pattern.
const SWA: [bool; 5] = [true, true, false, true, false];
const LAYERS: usize = SWA.len();
/// The last layers store no KV: 3 reads layer 1's, 4 layer 2's.
const SHARED: usize = 2;
const WINDOW: u32 = 16;
const HD_SWA: usize = 64;
const HD_FULL: usize = 128;
const KV_SWA: usize = 2;
const KV_FULL: usize = 1;
const FFN: [usize; LAYERS] = [512, 512, 512, 768, 768];
/// Per-layer embedding width.
const PLE: usize = 256;
/// Full layers rotate the first 16 of their 64 pairs (partial rotary factor 0.25).
const ROTATED_PAIRS: usize = 16;
/// Layer 2 has no `attn_v`: its values are its keys' projection.
const KEY_AS_VALUE: usize = 2;

/// The script's `tensors()`: drawn in the same order from the same `SplitMix64` stream, then
/// the proportional RoPE's frequency factors.
fn gemma4_tensors() -> Vec<TinyTensor> {
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 0.05, None);
    w.add(
        "per_layer_token_embd.weight".into(),
        vec![TQ_VOCAB, PLE * LAYERS],
        0.05,
        None,
    );
    w.mat("per_layer_model_proj.weight".into(), PLE * LAYERS, DIM);
    w.norm("per_layer_proj_norm.weight".into(), PLE);
    for (i, &swa) in SWA.iter().enumerate() {
        let b = |s: &str| format!("blk.{i}.{s}");
        let (hd, kv) = if swa {
            (HD_SWA, KV_SWA)
        } else {
            (HD_FULL, KV_FULL)
        };
        let owns_kv = i < LAYERS - SHARED;
        w.norm(b("attn_norm.weight"), DIM);
        w.mat(b("attn_q.weight"), HEADS * hd, DIM);
        if owns_kv {
            w.mat(b("attn_k.weight"), kv * hd, DIM);
            if i != KEY_AS_VALUE {
                w.mat(b("attn_v.weight"), kv * hd, DIM);
            }
        }
        w.norm(b("attn_q_norm.weight"), hd);
        if owns_kv {
            w.norm(b("attn_k_norm.weight"), hd);
        }
        w.mat(b("attn_output.weight"), DIM, HEADS * hd);
        w.norm(b("post_attention_norm.weight"), DIM);
        w.norm(b("ffn_norm.weight"), DIM);
        w.mat(b("ffn_gate.weight"), FFN[i], DIM);
        w.mat(b("ffn_up.weight"), FFN[i], DIM);
        w.mat(b("ffn_down.weight"), DIM, FFN[i]);
        w.norm(b("post_ffw_norm.weight"), DIM);
        w.mat(b("inp_gate.weight"), PLE, DIM);
        w.mat(b("proj.weight"), DIM, PLE);
        w.norm(b("post_norm.weight"), DIM);
        w.add(b("layer_output_scale.weight"), vec![1], 0.25, Some(1.0));
    }
    w.norm("output_norm.weight".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    let pairs = HD_FULL / 2;
    let factors = (0..pairs)
        .map(|i| if i < ROTATED_PAIRS { 1.0 } else { 1e30 })
        .collect();
    w.out
        .push(("rope_freqs.weight".into(), vec![pairs], factors));
    w.out
}

/// The script's GGUF metadata (without the vocabulary, which these ids-only tests do not
/// read).
fn gemma4_metadata() -> Vec<(String, Value)> {
    let a = "gemma4";
    let u = |k: &str, v: usize| (format!("{a}.{k}"), Value::U32(v as u32));
    let f = |k: &str, v: f32| (format!("{a}.{k}"), Value::F32(v));
    let arr = |k: &str, v: Vec<Value>| (format!("{a}.{k}"), Value::Array(v));
    vec![
        ("general.architecture".into(), Value::String(a.into())),
        u("context_length", 256),
        u("embedding_length", DIM),
        u("block_count", LAYERS),
        arr(
            "feed_forward_length",
            FFN.iter().map(|&n| Value::U32(n as u32)).collect(),
        ),
        u("attention.head_count", HEADS),
        arr(
            "attention.head_count_kv",
            SWA.iter()
                .map(|&s| Value::U32(if s { KV_SWA } else { KV_FULL } as u32))
                .collect(),
        ),
        u("attention.key_length", HD_FULL),
        u("attention.value_length", HD_FULL),
        u("attention.key_length_swa", HD_SWA),
        u("attention.value_length_swa", HD_SWA),
        f("attention.layer_norm_rms_epsilon", 1e-6),
        u("rope.dimension_count", HD_FULL),
        u("rope.dimension_count_swa", HD_SWA),
        f("rope.freq_base", 1_000_000.0),
        f("rope.freq_base_swa", 10_000.0),
        u("attention.sliding_window", WINDOW as usize),
        arr(
            "attention.sliding_window_pattern",
            SWA.iter().map(|&s| Value::Bool(s)).collect(),
        ),
        u("attention.shared_kv_layers", SHARED),
        u("embedding_length_per_layer_input", PLE),
        f("final_logit_softcapping", 30.0),
    ]
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes
/// checked against llama-quantize's) into `dir`.
pub(crate) fn write_model(dir: &std::path::Path, t: &TinyRecord) -> std::path::PathBuf {
    crate::moe::write_fixture_model(dir, t, &gemma4_tensors(), &gemma4_metadata())
}

/// gemma4 in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's weights,
/// stores each tensor in the type llama-quantize chose and requires its bytes; then Candor's
/// teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well as
/// llama.cpp's own other execution paths), every miss a near tie (llama.cpp's top-2 gap below
/// 0.1, the dense models' bound); and decoding the Q4_K_M model does not depend on batch
/// size, neighbours or threads. Measured: F32 879/880 (the miss at a gap of 0.000, an exact tie), Q4_K_M 866/880
/// (llama.cpp's own paths 865–866). Q8_0 is held to 97% with every miss below a gap of 0.05:
/// Candor's Q8_0 products are not llama.cpp's bit for bit on any architecture (the MoE and
/// hybrid fixtures' Q8_0 models agree at 871–874/880 where llama.cpp's own paths reach
/// 877–880), and this model, with two more matrices per layer, measures 857/880, its widest
/// miss at 0.042; llama.cpp's own paths 878–880.
#[test]
fn tiny_gemma4_models_match_llama_cpp_and_are_batch_invariant() {
    match_llama_cpp(
        "quant/tiny_gemma4_teacher_forced.jsonl",
        write_model,
        0.1,
        0.05,
    );
}

/// The fixture's models against llama.cpp's teacher-forced argmaxes (see the two tests): every
/// miss below a top-2 gap of `near_tie` (Q8_0: 97% and below `q8_near_tie`), Q4_K_M batch-
/// invariant.
fn match_llama_cpp(
    fixture: &str,
    write: fn(&std::path::Path, &TinyRecord) -> std::path::PathBuf,
    near_tie: f32,
    q8_near_tie: f32,
) {
    // Batch invariance on the richest mix only (Q4_K and Q6_K beside F32 tensors): the F32
    // and Q8_0 kernels are the other architectures' (`quant.rs`), and CI time is short.
    let measured = crate::moe::against_llama_cpp(fixture, |t| t.ftype == "Q4_K_M", write);
    let (q8, report): (Vec<_>, Vec<_>) =
        measured.into_iter().partition(|m| m.record.ftype == "Q8_0");
    for m in &q8 {
        let (a, label) = (&m.agreement, format!("tiny {} Q8_0", m.record.arch));
        assert!(a.agree * 100 >= a.total * 97, "{label}: below 97%");
        assert!(
            a.widest_miss < q8_near_tie,
            "{label}: a miss beyond a near tie"
        );
    }
    let report = crate::moe::verdicts(report);
    assert_eq!(report.len(), 2, "F32 and Q4_K_M in the fixture");
    assert_verdicts(&report, near_tie);
}

/// A prompt's logits at every position are the same bits in one prefill, in chunks of 1
/// (token by token), 3, 16 and uneven sizes, and on 1 or 2 threads: the sliding windows, the
/// shared KV and the per-layer inputs depend on positions, never on the split.
#[test]
fn every_split_of_a_gemma4_prompt_gives_the_same_bits() {
    let (_dir, model) = crate::moe::fixture_model(
        "quant/tiny_gemma4_teacher_forced.jsonl",
        |t| t.ftype == "Q4_K_M",
        write_model,
    );
    // Longer than the window, so the sliding layers forget.
    let ids = crate::quant::random_ids(40, 11);
    assert_chunks_give_one_prefills_bits(
        &model,
        &ids,
        &[&[1], &[3], &[16], &[5, 1, 11, 2]],
        "gemma4",
    );
}

/// The tiny model's plan shows each Gemma 4 feature where llama.cpp's graph has it, the CPU
/// executes exactly that plan, the KV layout holds the 3 layers that store KV at the widest
/// layer's width, and every step lowers for `--device cuda`: the values as the keys' copy, the
/// value norm, the per-layer inputs and embeddings, the layer scale one launch each, and a
/// sharing layer rotating its queries alone and attending without a KV write.
#[test]
fn the_gemma4_plan_has_its_features_and_the_gpu_lowers_it() {
    let records = tiny_fixture::<TinyRecord>("quant/tiny_gemma4_teacher_forced.jsonl").1;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_model(dir.path(), &records[0]);
    let model = Transformer::from_gguf_path(&file, WeightDType::Native).expect("load");
    let plan = model.plan();
    let layer = |l: usize| plan.layer(l).to_vec();
    assert_eq!(layer(0)[0], Step::PerLayerInputs);
    assert!(!layer(1).contains(&Step::PerLayerInputs));
    for (l, &swa) in SWA.iter().enumerate() {
        let steps = layer(l);
        let table = if swa { RopeTable::Swa } else { RopeTable::Full };
        assert!(steps.contains(&Step::Rope(table)), "layer {l}");
        assert_eq!(
            steps[steps.len() - 2..],
            [Step::PerLayerEmbed, Step::LayerScale],
            "layer {l}"
        );
        let window = swa.then_some(WINDOW as usize);
        let shared = match l {
            3 => Some(1),
            4 => Some(2),
            _ => None,
        };
        match shared {
            Some(from) => {
                assert!(steps.contains(&Step::AttendShared {
                    window,
                    layer: from
                }));
                assert!(!steps.contains(&Step::KvWrite) && !steps.contains(&Step::VNorm));
            }
            None => {
                let attend = Step::Attention {
                    window,
                    sinks: false,
                };
                assert!(steps.contains(&attend) && steps.contains(&Step::VNorm));
            }
        }
        assert_eq!(
            steps.contains(&Step::KeyAsValue),
            l == KEY_AS_VALUE,
            "layer {l}"
        );
    }
    assert_eq!(plan.head().last(), Some(&Step::Softcap));
    assert_eq!(
        (model.kv_layers(), model.kv_width()),
        (LAYERS - SHARED, (KV_SWA * HD_SWA).max(KV_FULL * HD_FULL))
    );

    let want: Vec<trace::Event> = plan
        .places()
        .flat_map(|(p, steps)| steps.iter().map(move |&s| trace::Event::Step(p, s)))
        .collect();
    trace::start();
    logits_in_chunks(&model, &[1, 5, 9], &[3]);
    assert_eq!(trace::take(), want, "the CPU's steps");
    assert!(want.contains(&trace::Event::Step(Place::Head, Step::Softcap)));

    crate::moe::assert_lowered_step_for_step(&model, "gemma4", |low, place, steps| {
        let names: Vec<&str> = low
            .launches(place)
            .iter()
            .map(|l| l.kernel.name())
            .collect();
        crate::moe::assert_one_launch_per_step(low, place, steps, "gemma4", |s| match s {
            Step::KeyAsValue => Some("copy_cols"),
            Step::VNorm => Some("rms_norm"),
            Step::LayerScale => Some("scale"),
            Step::PerLayerInputs => Some("per_layer_inputs"),
            Step::PerLayerEmbed => Some("per_layer_embed"),
            _ => None,
        });
        if steps.iter().any(|s| matches!(s, Step::AttendShared { .. })) {
            let ropes = names.iter().filter(|n| n.starts_with("rope")).count();
            assert_eq!(ropes, 1, "{place:?}: the queries alone: {names:?}");
            assert!(!names.iter().any(|n| n.contains("kv_write")), "{names:?}");
        }
    });
}

/// What a gemma4 file gets refused for, naming the key or tensor: a sharing layer that would
/// read a layer of the other kind, a per-layer array of the wrong length, a missing head
/// size of the sliding layers, and a missing per-layer embedding tensor.
#[test]
fn gemma4_metadata_errors_name_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f32_tensors = |skip: &str| -> Vec<_> {
        gemma4_tensors()
            .into_iter()
            .filter(|(n, _, _)| n != skip)
            .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
            .collect()
    };
    let ws = f32_tensors("");
    let load = |md: &[(String, Value)], ws: &[(String, candle_core::quantized::QTensor)]| {
        let path = dir.path().join("m.gguf");
        crate::util::write_gguf(&path, md, ws);
        match Transformer::from_gguf_path(&path, WeightDType::Native) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    };
    let with = |key: &str, v: Value| {
        let mut md = gemma4_metadata();
        md.retain(|(k, _)| k != key);
        md.push((key.into(), v));
        md
    };
    // Layers 2.. sharing: layer 4 (full) would read layer 2, layer 3 (sliding) layer 1; with
    // 3 shared, layer 2 (full) would read layer 0 (sliding).
    let e = load(
        &with("gemma4.attention.shared_kv_layers", Value::U32(3)),
        &ws,
    );
    assert!(
        e.contains("gemma4.attention.shared_kv_layers") && e.contains("other kind"),
        "{e}"
    );
    let e = load(
        &with(
            "gemma4.feed_forward_length",
            Value::Array(vec![Value::U32(512); 3]),
        ),
        &ws,
    );
    assert!(
        e.contains("gemma4.feed_forward_length") && e.contains("3 values for 5 layers"),
        "{e}"
    );
    let mut md = gemma4_metadata();
    md.retain(|(k, _)| k != "gemma4.attention.key_length_swa");
    let e = load(&md, &ws);
    assert!(e.contains("gemma4.attention.key_length_swa"), "{e}");
    let e = load(&gemma4_metadata(), &f32_tensors("blk.3.inp_gate.weight"));
    assert!(e.contains("blk.3.inp_gate.weight"), "{e}");
}

/// The MoE fixture's layers (`make_tiny_gemma4_moe_reference.py`): 26B-A4B's layout, no
/// shared KV and no per-layer embeddings; layers 0, 1 and 3 route to experts beside their
/// dense MLP, layer 2 (full, its values its keys' projection) is dense.
const MOE_SWA: [bool; 4] = [true, true, false, true];
const MOE_LAYERS: [bool; 4] = [true, true, false, true];
const MOE_FFN: usize = 512;
const EXPERTS: usize = 8;
const USED: usize = 2;
const EXPERT_FFN: usize = 256;

/// The MoE script's `tensors()`, drawn in the same order from the same stream, then the
/// proportional RoPE's factors.
fn gemma4_moe_tensors() -> Vec<TinyTensor> {
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 0.05, None);
    for (i, &swa) in MOE_SWA.iter().enumerate() {
        let b = |s: &str| format!("blk.{i}.{s}");
        let (hd, kv) = if swa {
            (HD_SWA, KV_SWA)
        } else {
            (HD_FULL, KV_FULL)
        };
        w.norm(b("attn_norm.weight"), DIM);
        w.mat(b("attn_q.weight"), HEADS * hd, DIM);
        w.mat(b("attn_k.weight"), kv * hd, DIM);
        if i != KEY_AS_VALUE {
            w.mat(b("attn_v.weight"), kv * hd, DIM);
        }
        w.norm(b("attn_q_norm.weight"), hd);
        w.norm(b("attn_k_norm.weight"), hd);
        w.mat(b("attn_output.weight"), DIM, HEADS * hd);
        w.norm(b("post_attention_norm.weight"), DIM);
        w.norm(b("ffn_norm.weight"), DIM);
        w.mat(b("ffn_gate.weight"), MOE_FFN, DIM);
        w.mat(b("ffn_up.weight"), MOE_FFN, DIM);
        w.mat(b("ffn_down.weight"), DIM, MOE_FFN);
        if MOE_LAYERS[i] {
            w.norm(b("post_ffw_norm_1.weight"), DIM);
            w.norm(b("pre_ffw_norm_2.weight"), DIM);
            w.mat(b("ffn_gate_inp.weight"), EXPERTS, DIM);
            w.add(b("ffn_gate_inp.scale"), vec![DIM], 4.0, Some(16.0));
            for (m, rows, cols) in [
                ("gate", EXPERT_FFN, DIM),
                ("up", EXPERT_FFN, DIM),
                ("down", DIM, EXPERT_FFN),
            ] {
                let scale = 1.5f32 / (cols as f32).sqrt();
                w.add(
                    b(&format!("ffn_{m}_exps.weight")),
                    vec![EXPERTS, rows, cols],
                    scale,
                    None,
                );
            }
            w.add(b("ffn_down_exps.scale"), vec![EXPERTS], 0.5, Some(1.0));
            w.norm(b("post_ffw_norm_2.weight"), DIM);
        }
        w.norm(b("post_ffw_norm.weight"), DIM);
        w.add(b("layer_output_scale.weight"), vec![1], 0.25, Some(1.0));
    }
    w.norm("output_norm.weight".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    let pairs = HD_FULL / 2;
    let factors = (0..pairs)
        .map(|i| if i < ROTATED_PAIRS { 1.0 } else { 1e30 })
        .collect();
    w.out
        .push(("rope_freqs.weight".into(), vec![pairs], factors));
    w.out
}

/// The MoE script's GGUF metadata (without the vocabulary).
fn gemma4_moe_metadata() -> Vec<(String, Value)> {
    let a = "gemma4";
    let u = |k: &str, v: usize| (format!("{a}.{k}"), Value::U32(v as u32));
    let f = |k: &str, v: f32| (format!("{a}.{k}"), Value::F32(v));
    let arr = |k: &str, v: Vec<Value>| (format!("{a}.{k}"), Value::Array(v));
    vec![
        ("general.architecture".into(), Value::String(a.into())),
        u("context_length", 256),
        u("embedding_length", DIM),
        u("block_count", MOE_SWA.len()),
        u("feed_forward_length", MOE_FFN),
        u("attention.head_count", HEADS),
        arr(
            "attention.head_count_kv",
            MOE_SWA
                .iter()
                .map(|&s| Value::U32(if s { KV_SWA } else { KV_FULL } as u32))
                .collect(),
        ),
        u("attention.key_length", HD_FULL),
        u("attention.value_length", HD_FULL),
        u("attention.key_length_swa", HD_SWA),
        u("attention.value_length_swa", HD_SWA),
        f("attention.layer_norm_rms_epsilon", 1e-6),
        u("rope.dimension_count", HD_FULL),
        u("rope.dimension_count_swa", HD_SWA),
        f("rope.freq_base", 1_000_000.0),
        f("rope.freq_base_swa", 10_000.0),
        u("attention.sliding_window", WINDOW as usize),
        arr(
            "attention.sliding_window_pattern",
            MOE_SWA.iter().map(|&s| Value::Bool(s)).collect(),
        ),
        u("attention.shared_kv_layers", 0),
        u("embedding_length_per_layer_input", 0),
        u("expert_count", EXPERTS),
        u("expert_used_count", USED),
        u("expert_feed_forward_length", EXPERT_FFN),
        f("final_logit_softcapping", 30.0),
    ]
}

pub(crate) fn write_moe_model(dir: &std::path::Path, t: &TinyRecord) -> std::path::PathBuf {
    crate::moe::write_fixture_model(dir, t, &gemma4_moe_tensors(), &gemma4_moe_metadata())
}

const MOE_FIXTURE: &str = "quant/tiny_gemma4_moe_teacher_forced.jsonl";

/// gemma4 with MoE layers (26B-A4B's layout: the dense MLP beside the experts, each branch
/// with its own norms, the router on the residual's own RMS norm times its scale, per-expert
/// output scales) in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's
/// weights, stores each tensor in the type llama-quantize chose and requires its bytes; then
/// Candor's teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well
/// as llama.cpp's own other execution paths), every miss a near tie (llama.cpp's top-2 gap
/// below 0.5, the MoE models' bound: a router near-tie moves the logits further than in a
/// dense layer); and decoding does not depend on batch size, neighbours or threads.
/// Measured: F32 879/880 (llama.cpp one token per decode also 879), Q4_K_M 861/880 (llama.cpp's
/// own paths 856 and 862), widest miss 0.374. Q8_0 is held to 97% as the dense model's (see
/// above): 861/880, its widest miss at 0.261, llama.cpp's own paths 878–880.
#[test]
fn tiny_gemma4_moe_models_match_llama_cpp_and_are_batch_invariant() {
    match_llama_cpp(MOE_FIXTURE, write_moe_model, 0.5, 0.5);
}

/// The MoE model's plan runs the dense MLP, sets it aside, routes on the router's own norm,
/// runs the experts on theirs and adds the two branches before the feed-forward post-norm,
/// on the layers with a router only; the CPU executes exactly that plan; every split of a
/// prompt gives the same bits; every step lowers for `--device cuda`.
#[test]
fn the_gemma4_moe_plan_has_its_steps_and_every_split_gives_the_same_bits() {
    let records = tiny_fixture::<TinyRecord>(MOE_FIXTURE).1;
    let dir = tempfile::tempdir().expect("tempdir");
    let t = records
        .iter()
        .find(|t| t.ftype == "Q4_K_M")
        .expect("a Q4_K_M record");
    let file = write_moe_model(dir.path(), t);
    let model = Transformer::from_gguf_path(&file, WeightDType::Native).expect("load");
    let plan = model.plan();
    let ffn_block = [
        Step::Norm(Block::Ffn),
        Step::Project(Matrix::GateUp),
        Step::Gated(Activation::GeluTanhF16),
        Step::Project(Matrix::Down),
        Step::SetAside,
        Step::RouterNorm,
        Step::Route(Gating::SoftmaxTopK { normalize: true }),
        Step::ExpertNorm,
        Step::Experts(Activation::GeluTanhF16),
        Step::Combine,
        Step::ExpertPostNorm,
        Step::AddShared,
        Step::PostNorm(Block::Ffn),
        Step::Residual,
        Step::LayerScale,
    ];
    for (l, &moe) in MOE_LAYERS.iter().enumerate() {
        let steps = plan.layer(l);
        let at = steps
            .iter()
            .position(|&s| s == Step::Norm(Block::Ffn))
            .expect("a feed-forward block");
        if moe {
            assert_eq!(steps[at..], ffn_block, "layer {l}");
        } else {
            assert_eq!(
                steps[at..],
                [
                    Step::Norm(Block::Ffn),
                    Step::Project(Matrix::GateUp),
                    Step::Gated(Activation::GeluTanhF16),
                    Step::Project(Matrix::Down),
                    Step::PostNorm(Block::Ffn),
                    Step::Residual,
                    Step::LayerScale,
                ],
                "layer {l}"
            );
        }
    }
    let want: Vec<trace::Event> = plan
        .places()
        .flat_map(|(p, steps)| steps.iter().map(move |&s| trace::Event::Step(p, s)))
        .collect();
    trace::start();
    logits_in_chunks(&model, &[1, 5, 9], &[3]);
    assert_eq!(trace::take(), want, "the CPU's steps");

    let ids = crate::quant::random_ids(40, 11);
    assert_chunks_give_one_prefills_bits(&model, &ids, &[&[1], &[16], &[5, 1, 11, 2]], "gemma4");

    // Every step lowers for `--device cuda`: the norms of the two branches one `rms_norm`
    // each, the router's input its own launch.
    crate::moe::assert_lowered_step_for_step(&model, "gemma4 moe", |low, place, steps| {
        crate::moe::assert_one_launch_per_step(low, place, steps, "gemma4 moe", |s| match s {
            Step::SetAside | Step::ExpertNorm | Step::ExpertPostNorm => Some("rms_norm"),
            Step::RouterNorm => Some("router_norm"),
            Step::Experts(_) => Some("moe_experts"),
            _ => None,
        });
    });
}

/// What a gemma4 MoE file gets refused for, naming the key or tensor: a router in a file
/// declaring no experts, a missing expert width, a missing norm of the experts' branch, and
/// experts whose gate and up are one fused tensor.
#[test]
fn gemma4_moe_errors_name_the_key_or_tensor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tensors = |skip: &str| -> Vec<_> {
        gemma4_moe_tensors()
            .into_iter()
            .filter(|(n, _, _)| n != skip)
            .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
            .collect()
    };
    let load = |md: &[(String, Value)], ws: &[(String, candle_core::quantized::QTensor)]| {
        let path = dir.path().join("m.gguf");
        crate::util::write_gguf(&path, md, ws);
        match Transformer::from_gguf_path(&path, WeightDType::Native) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    };
    let without = |key: &str| {
        let mut md = gemma4_moe_metadata();
        md.retain(|(k, _)| k != key);
        md
    };
    let ws = tensors("");
    let e = load(&without("gemma4.expert_count"), &ws);
    assert!(
        e.contains("gemma4.expert_count") && e.contains("blk.0.ffn_gate_inp.weight"),
        "{e}"
    );
    let e = load(&without("gemma4.expert_feed_forward_length"), &ws);
    assert!(e.contains("gemma4.expert_feed_forward_length"), "{e}");
    let e = load(
        &gemma4_moe_metadata(),
        &tensors("blk.1.pre_ffw_norm_2.weight"),
    );
    assert!(e.contains("blk.1.pre_ffw_norm_2.weight"), "{e}");
    let mut fused = tensors("");
    fused.push((
        "blk.0.ffn_gate_up_exps.weight".into(),
        q(
            vec![0.0; EXPERTS * 2 * EXPERT_FFN * DIM],
            &[EXPERTS, 2 * EXPERT_FFN, DIM],
            GgmlDType::F32,
        ),
    ));
    let e = load(&gemma4_moe_metadata(), &fused);
    assert!(e.contains("blk.0.ffn_gate_up_exps.weight"), "{e}");
}

/// Gemma 4's chat template (llama.cpp's `models/templates/google-gemma-4-31B-it.jinja`)
/// renders every case exactly as llama.cpp's llama-server renders it (`/apply-template`,
/// `tests/fixtures/templates/rendered/google-gemma-4-31B-it.json`, written by
/// `render_with_llama_server.py` with SmolLM2's BOS): the system turn, `<|think|>` with
/// `enable_thinking`, and the empty thought channel the generation prompt opens without it.
#[test]
fn the_gemma4_chat_template_renders_like_llama_cpp() {
    use candor::text::chat_template::{ChatTemplate, TemplateArgs};
    use candor::text::message::Message;
    use std::collections::BTreeMap;

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
    let name = "google-gemma-4-31B-it";
    let text = std::fs::read_to_string(dir.join(format!("rendered/{name}.json"))).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
    // SmolLM2's BOS/EOS, the model llama-server was started with.
    let t = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").unwrap();
    let mut checked = 0;
    for case in expected["cases"].as_array().unwrap() {
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let mut kwargs: BTreeMap<String, serde_json::Value> =
            serde_json::from_value(case["chat_template_kwargs"].clone()).unwrap();
        // llama-server's default (`--reasoning auto`); Candor's is to pass nothing.
        kwargs
            .entry("enable_thinking".into())
            .or_insert(serde_json::Value::Bool(true));
        let args = TemplateArgs {
            kwargs,
            date: expected["date"].as_str().map(|d| d.parse().unwrap()),
        };
        let got = t.render_with(&messages, true, &args).unwrap();
        assert_eq!(got, case["prompt"].as_str().unwrap(), "{}", case["name"]);
        checked += 1;
    }
    assert_eq!(checked, 5);
}
