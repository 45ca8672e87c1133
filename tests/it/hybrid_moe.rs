//! Qwen3.5-MoE (issue #43): a tiny seeded `qwen35moe` (the hybrid layers of `hybrid.rs` with a
//! Mixture-of-Experts feed-forward block and a shared expert behind a sigmoid gate), quantized
//! by llama.cpp's own llama-quantize, against llama.cpp's teacher-forced argmax
//! (`tests/fixtures/quant/tiny_hybrid_moe_teacher_forced.jsonl`, written by
//! `make_tiny_hybrid_moe_reference.py`); invariant under batch size, neighbours and threads and
//! under every split of a prompt; its experts in panel files; its refusals.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candor::model::lowering::not_lowered;
use candor::model::memory::ExpertPanels;
use candor::model::plan::Step;
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;
use candor::weights::gguf::GgufFile;

use crate::hybrid::{
    assert_every_split_gives_the_same_bits, draw_hybrid_attention, logits_in_chunks, SsmLayout,
    CONV, DIM, FFN, HEADS, INTERVAL, KV_HEADS, K_HEADS, ROPE_DIM, SECTIONS, STATE, V_HEADS,
};
use crate::moe::TinyRecord;
use crate::quant::{assert_verdicts, q, tiny_fixture, Draw, TinyTensor, TQ_VOCAB};

const FIXTURE: &str = "quant/tiny_hybrid_moe_teacher_forced.jsonl";
/// Layer 0 linear attention, layer 1 full attention.
const LAYERS: usize = 2;
/// Routed experts, used per token, their width; the shared expert's width.
pub(crate) const EXPERTS: usize = 8;
pub(crate) const USED: usize = 2;
pub(crate) const EXPERT_FFN: usize = 256;
pub(crate) const SHARED_FFN: usize = 256;

/// The script's `tensors()`: drawn in the same order from the same `SplitMix64` stream.
fn hybrid_moe_tensors() -> Vec<TinyTensor> {
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 1.0, None);
    for i in 0..LAYERS {
        draw_hybrid_moe_layer(&mut w, i, INTERVAL, SsmLayout::Qwen35);
    }
    w.norm("output_norm.weight".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    w.out
}

/// Layer `i` of the MoE hybrid fixtures, drawn in their scripts' order: the attention half
/// ([`draw_hybrid_attention`]), then the routed experts and the shared expert.
pub(crate) fn draw_hybrid_moe_layer(w: &mut Draw, i: usize, interval: usize, layout: SsmLayout) {
    draw_hybrid_attention(w, i, interval, layout);
    let scale = |k: usize| 1.5f32 / (k as f32).sqrt();
    let b = |s: &str| format!("blk.{i}.{s}");
    w.norm(b("post_attention_norm.weight"), DIM);
    w.mat(b("ffn_gate_inp.weight"), EXPERTS, DIM);
    for (m, rows, cols) in [
        ("gate", EXPERT_FFN, DIM),
        ("up", EXPERT_FFN, DIM),
        ("down", DIM, EXPERT_FFN),
    ] {
        w.add(
            b(&format!("ffn_{m}_exps.weight")),
            vec![EXPERTS, rows, cols],
            scale(cols),
            None,
        );
    }
    w.add(b("ffn_gate_inp_shexp.weight"), vec![DIM], scale(DIM), None);
    w.mat(b("ffn_gate_shexp.weight"), SHARED_FFN, DIM);
    w.mat(b("ffn_up_shexp.weight"), SHARED_FFN, DIM);
    w.mat(b("ffn_down_shexp.weight"), DIM, SHARED_FFN);
}

/// The script's GGUF metadata (without the vocabulary, which these ids-only tests do not
/// read).
fn hybrid_moe_metadata() -> Vec<(String, Value)> {
    let a = "qwen35moe";
    let hd = (DIM / HEADS) as u32;
    let shape = crate::util::TinyShape {
        arch: a,
        layers: LAYERS,
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        kv_heads: KV_HEADS,
        context: 256,
    };
    let mut md = crate::util::tiny_metadata(
        &shape,
        &[
            ("attention.key_length", hd),
            ("attention.value_length", hd),
            ("rope.dimension_count", ROPE_DIM),
            ("full_attention_interval", INTERVAL as u32),
            ("ssm.conv_kernel", CONV as u32),
            ("ssm.inner_size", (STATE * V_HEADS) as u32),
            ("ssm.state_size", STATE as u32),
            ("ssm.time_step_rank", V_HEADS as u32),
            ("ssm.group_count", K_HEADS as u32),
            ("expert_count", EXPERTS as u32),
            ("expert_used_count", USED as u32),
            ("expert_feed_forward_length", EXPERT_FFN as u32),
            ("expert_shared_feed_forward_length", SHARED_FFN as u32),
        ],
    );
    md.push((
        format!("{a}.rope.dimension_sections"),
        Value::Array(SECTIONS.iter().map(|&s| Value::I32(s)).collect()),
    ));
    md
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes
/// checked against llama-quantize's) into `dir`.
pub(crate) fn write_model(dir: &Path, t: &TinyRecord) -> PathBuf {
    crate::moe::write_fixture_model(dir, t, &hybrid_moe_tensors(), &hybrid_moe_metadata())
}

/// The fixture's record of type `ftype`.
fn record(ftype: &str) -> TinyRecord {
    tiny_fixture::<TinyRecord>(FIXTURE)
        .1
        .into_iter()
        .find(|t| t.ftype == ftype)
        .unwrap_or_else(|| panic!("no {ftype} in {FIXTURE}"))
}

/// qwen35moe in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's
/// weights, stores each tensor in the type llama-quantize chose and requires its bytes; then
/// Candor's teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well
/// as llama.cpp's own other execution paths), every miss a near tie (llama.cpp's top-2 gap
/// below 0.1); and decoding does not depend on batch size, neighbours or threads.
#[test]
fn tiny_hybrid_moe_models_match_llama_cpp_and_are_batch_invariant() {
    let report = crate::moe::verdicts(crate::moe::against_llama_cpp(
        FIXTURE,
        |_| true,
        write_model,
    ));
    assert_eq!(report.len(), 3, "models in the fixture");
    assert_verdicts(&report, 0.1);
}

/// The determinism contract for recurrence with experts: a prompt's logits are the same bits
/// in one prefill and in chunks of every size, on 1 or 2 threads (`hybrid.rs`'s check).
#[test]
fn every_split_of_a_hybrid_moe_prompt_gives_the_same_bits() {
    let dir = tempfile::tempdir().expect("tempdir");
    for ftype in ["F32", "Q4_K_M"] {
        let file = write_model(dir.path(), &record(ftype));
        let model = Transformer::from_gguf_path(&file, WeightDType::Native).expect("load");
        assert_every_split_gives_the_same_bits(&model, &format!("qwen35moe {ftype}"));
    }
}

/// The shared expert is part of every layer's plan and of its arithmetic: the plan runs it
/// after the routed experts and adds it to their sum; a model whose shared expert's down
/// projection is zero predicts otherwise; a file without one of its tensors is refused naming
/// it; every step of the model lowers for `--device cuda` (the shared expert, linear attention
/// and the output gate have kernels); and a multi-token-prediction layer after the trunk is
/// loaded and ignored, as for qwen35.
#[test]
fn the_shared_expert_is_planned_used_required_and_lowered_for_the_gpu() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f32 = |ws: Vec<TinyTensor>| -> Vec<(String, candle_core::quantized::QTensor)> {
        ws.into_iter()
            .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
            .collect()
    };
    let write =
        |name: &str, md: &[(String, Value)], ws: &[(String, candle_core::quantized::QTensor)]| {
            let path = dir.path().join(name);
            crate::util::write_gguf(&path, md, ws);
            path
        };
    let load = |p: &Path| Transformer::from_gguf_path(p, WeightDType::Native);
    let md = hybrid_moe_metadata();
    let plain = load(&write("plain.gguf", &md, &f32(hybrid_moe_tensors()))).expect("plain");
    for l in 0..LAYERS {
        let steps = plain.plan().layer(l);
        let at = |s: Step| steps.iter().position(|&x| x == s);
        let shared = at(Step::SharedExpert(candor::model::arch::Activation::Silu)).expect("shared");
        assert!(at(Step::Combine) > Some(shared) && at(Step::AddShared) > at(Step::Combine));
    }
    let ids = [1, 5, 9, 2, 7, 3, 40, 41];
    let want = logits_in_chunks(&plain, &ids, &[ids.len()]);

    // Without the shared expert's contribution the logits move.
    let mut zeroed = hybrid_moe_tensors();
    for (n, _, v) in zeroed.iter_mut() {
        if n.ends_with("ffn_down_shexp.weight") {
            v.iter_mut().for_each(|x| *x = 0.0);
        }
    }
    let without = load(&write("zeroed.gguf", &md, &f32(zeroed))).expect("zeroed");
    assert_ne!(logits_in_chunks(&without, &ids, &[ids.len()]), want);

    // A missing shared-expert tensor is named.
    let mut short = f32(hybrid_moe_tensors());
    short.retain(|(n, _)| n != "blk.1.ffn_gate_inp_shexp.weight");
    let e = match load(&write("short.gguf", &md, &short)) {
        Ok(_) => panic!("loaded without blk.1.ffn_gate_inp_shexp.weight"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("blk.1.ffn_gate_inp_shexp.weight"), "{e}");

    // The GPU has kernels for every step.
    assert_eq!(not_lowered(&plain), None);

    // A nextn block after the trunk (block_count 3, nextn_predict_layers 1).
    let mut md = hybrid_moe_metadata();
    md.retain(|(k, _)| k != "qwen35moe.block_count");
    md.push(("qwen35moe.block_count".into(), Value::U32(3)));
    md.push(("qwen35moe.nextn_predict_layers".into(), Value::U32(1)));
    let mut with_mtp = f32(hybrid_moe_tensors());
    for (name, len) in [
        ("blk.2.nextn.enorm.weight", DIM),
        ("blk.2.ffn_gate_inp_shexp.weight", DIM),
    ] {
        with_mtp.push((name.into(), q(vec![1.0; len], &[len], GgmlDType::F32)));
    }
    let mtp = load(&write("mtp.gguf", &md, &with_mtp)).expect("with nextn");
    assert_eq!(mtp.config().n_layer, LAYERS);
    assert_eq!(logits_in_chunks(&mtp, &ids, &[ids.len()]), want);
}

/// Experts kept in panel files and read in place (what real MoE files get by default) give
/// the Q4_K_M model's logits the bits of experts repacked into memory, each prompt prefilled in
/// chunks of 5; the panel files hold the routed experts (one per
/// quantized expert tensor), the shared expert stays a matrix of the model's own.
#[test]
fn hybrid_moe_experts_in_panel_files_have_the_bits_of_experts_in_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_model(dir.path(), &record("Q4_K_M"));
    let panels = dir.path().join("panels");
    let load = |p: &ExpertPanels| {
        let mut f = GgufFile::open(&file).expect("open");
        Transformer::from_gguf_with(&mut f, WeightDType::Native, p).expect("load")
    };
    let memory = load(&ExpertPanels::Memory);
    let mapped = load(&ExpertPanels::Files(panels.clone()));
    let written: Vec<PathBuf> = std::fs::read_dir(&panels)
        .expect("panels")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(written.len(), 3 * LAYERS, "{written:?}");
    let bytes: usize = written
        .iter()
        .map(|p| std::fs::metadata(p).expect("meta").len() as usize)
        .sum();
    assert_eq!(memory.owned_bytes() - mapped.owned_bytes(), bytes);
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|p| {
            (0..9 + p)
                .map(|i| (i * 37 + p * 101) % TQ_VOCAB as u32)
                .collect()
        })
        .collect();
    for (i, p) in prompts.iter().enumerate() {
        let want = logits_in_chunks(&memory, p, &[5]);
        let got = logits_in_chunks(&mapped, p, &[5]);
        let same = want.len() == got.len()
            && want
                .iter()
                .zip(&got)
                .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same,
            "prompt {i}: logits differ with experts in panel files"
        );
    }
}

/// `attention.recurrent_layers` (one flag per layer, which llama.cpp's converter writes from
/// `layer_types` and llama.cpp prefers to `full_attention_interval`) says which layers are
/// linear: the fixture's flags `[true, false]` give the logits of its interval 2; `[false,
/// true]` make layer 0 full attention, whose tensors the file lacks (refused naming one,
/// where the interval alone would have loaded); one flag per layer is required.
#[test]
fn recurrent_layer_flags_choose_the_linear_layers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws: Vec<(String, candle_core::quantized::QTensor)> = hybrid_moe_tensors()
        .into_iter()
        .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
        .collect();
    let load = |flags: Option<&[bool]>, name: &str| {
        let mut md = hybrid_moe_metadata();
        if let Some(flags) = flags {
            md.push((
                "qwen35moe.attention.recurrent_layers".into(),
                Value::Array(flags.iter().map(|&b| Value::Bool(b)).collect()),
            ));
        }
        let path = dir.path().join(name);
        crate::util::write_gguf(&path, &md, &ws);
        Transformer::from_gguf_path(&path, WeightDType::Native).map_err(|e| e.to_string())
    };
    let ids = [1, 5, 9, 2, 7, 3, 40, 41];
    let plain = load(None, "plain.gguf").expect("interval");
    let flagged = load(Some(&[true, false]), "flags.gguf").expect("flags");
    assert_eq!(
        logits_in_chunks(&flagged, &ids, &[ids.len()]),
        logits_in_chunks(&plain, &ids, &[ids.len()])
    );
    let e = load(Some(&[false, true]), "swapped.gguf")
        .err()
        .expect("swapped");
    assert!(e.contains("blk.0.attn_q.weight"), "{e}");
    let e = load(Some(&[true]), "short.gguf").err().expect("short");
    assert!(
        e.contains("qwen35moe.attention.recurrent_layers") && e.contains("1 flags for 2 layers"),
        "{e}"
    );
}
