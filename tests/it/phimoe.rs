//! `phimoe` (Phi-3.5-MoE as llama.cpp runs it: phi3's graph with a bias after every RMS norm,
//! q/k/v, output and logit biases, LongRoPE and Mixtral-style experts): a tiny seeded model,
//! quantized by llama.cpp's own llama-quantize, against llama.cpp's teacher-forced argmax
//! (`tests/fixtures/quant/tiny_phimoe_teacher_forced.jsonl`, written by
//! `make_tiny_phimoe_reference.py`); the norm and logit biases matter; invariant under batch
//! size, neighbours, threads and every split of a prompt; the plan's bias steps, each one
//! `add_bias` launch on the GPU.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candor::model::plan::{Block, Step};
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

use crate::hybrid::assert_dense_splits_give_one_prefills_bits;
use crate::moe::TinyRecord;
use crate::quant::{
    agreement, assert_disagrees, assert_verdicts, q, tiny_fixture, Draw, TinyTensor, TQ_VOCAB,
};

const FIXTURE: &str = "quant/tiny_phimoe_teacher_forced.jsonl";
const DIM: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 4;
/// Experts, used per token, their width (`feed_forward_length`).
const EXPERTS: usize = 4;
const USED: usize = 2;
const FFN: usize = 256;
/// The context over the original: LongRoPE's long factors run.
const CTX: u32 = 4096;
const ORIG: u32 = 256;

/// The script's `phimoe_tensors`: drawn in the same order from the same `SplitMix64` stream;
/// biases 0.1 · uniform.
fn phimoe_tensors() -> Vec<TinyTensor> {
    let hd = DIM / HEADS;
    let kv = hd * KV_HEADS;
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    let scale = |k: usize| 1.5f32 / (k as f32).sqrt();
    let bias = |w: &mut Draw, name: String, n: usize| w.add(name, vec![n], 0.1, None);
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 1.0, None);
    for i in 0..LAYERS {
        let b = |s: &str| format!("blk.{i}.{s}");
        w.norm(b("attn_norm.weight"), DIM);
        bias(&mut w, b("attn_norm.bias"), DIM);
        w.mat(b("attn_q.weight"), DIM, DIM);
        w.mat(b("attn_k.weight"), kv, DIM);
        w.mat(b("attn_v.weight"), kv, DIM);
        bias(&mut w, b("attn_q.bias"), DIM);
        bias(&mut w, b("attn_k.bias"), kv);
        bias(&mut w, b("attn_v.bias"), kv);
        w.mat(b("attn_output.weight"), DIM, DIM);
        bias(&mut w, b("attn_output.bias"), DIM);
        w.norm(b("ffn_norm.weight"), DIM);
        bias(&mut w, b("ffn_norm.bias"), DIM);
        w.mat(b("ffn_gate_inp.weight"), EXPERTS, DIM);
        for (m, rows, cols) in [("gate", FFN, DIM), ("up", FFN, DIM), ("down", DIM, FFN)] {
            w.add(
                b(&format!("ffn_{m}_exps.weight")),
                vec![EXPERTS, rows, cols],
                scale(cols),
                None,
            );
        }
    }
    w.norm("output_norm.weight".into(), DIM);
    bias(&mut w, "output_norm.bias".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    bias(&mut w, "output.bias".into(), TQ_VOCAB);
    w.add(
        "rope_factors_long.weight".into(),
        vec![hd / 2],
        2.0,
        Some(3.0),
    );
    w.add(
        "rope_factors_short.weight".into(),
        vec![hd / 2],
        0.1,
        Some(1.1),
    );
    w.out
}

/// The script's GGUF metadata (without the vocabulary, which these ids-only tests do not
/// read).
fn phimoe_metadata() -> Vec<(String, Value)> {
    let shape = crate::util::TinyShape {
        arch: "phimoe",
        layers: LAYERS,
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        kv_heads: KV_HEADS,
        context: CTX,
    };
    let hd = (DIM / HEADS) as u32;
    let mut md = crate::util::tiny_metadata(
        &shape,
        &[
            ("attention.key_length", hd),
            ("attention.value_length", hd),
            ("rope.dimension_count", hd),
            ("rope.scaling.original_context_length", ORIG),
            ("expert_count", EXPERTS as u32),
            ("expert_used_count", USED as u32),
        ],
    );
    md.push((
        "phimoe.rope.scaling.attn_factor".into(),
        Value::F32(1.5f64.sqrt() as f32),
    ));
    md
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes checked
/// against llama-quantize's) into `dir`.
fn write_model(dir: &Path, t: &TinyRecord) -> PathBuf {
    crate::moe::write_fixture_model(dir, t, &phimoe_tensors(), &phimoe_metadata())
}

/// F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's weights, stores each
/// tensor in the type llama-quantize chose and requires its bytes; then Candor's
/// teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well as
/// llama.cpp's own other execution paths), every miss a near tie (below 0.5, the
/// Mixture-of-Experts bound of `moe.rs`); and decoding the Q4_K_M model does not depend on
/// batch size, neighbours or threads.
#[test]
fn tiny_phimoe_models_match_llama_cpp_and_are_batch_invariant() {
    let report = crate::moe::verdicts(crate::moe::against_llama_cpp(
        FIXTURE,
        |t| t.ftype == "Q4_K_M",
        write_model,
    ));
    assert_eq!(report.len(), 3, "three types");
    assert_verdicts(&report, 0.5);
}

/// The biases matter to the comparison above: the same F32 weights with the norms' biases,
/// or the logits', set to zero fall below 98% of llama.cpp's argmax, missing where its choice
/// is no near tie.
#[test]
fn phimoe_without_its_norm_or_logit_biases_disagrees_with_llama_cpp() {
    let (head, records) = tiny_fixture::<TinyRecord>(FIXTURE);
    let t = records
        .iter()
        .find(|t| t.ftype == "F32")
        .expect("an F32 record");
    let dir = tempfile::tempdir().expect("tempdir");
    for what in ["zero norm biases", "zero logit biases"] {
        let zeroed = |n: &str| match what {
            "zero norm biases" => n.ends_with("norm.bias"),
            _ => n == "output.bias",
        };
        let ws: Vec<_> = phimoe_tensors()
            .into_iter()
            .map(|(n, s, v)| {
                let v = if zeroed(&n) { vec![0.0; v.len()] } else { v };
                (n, q(v, &s, GgmlDType::F32))
            })
            .collect();
        let file = dir.path().join("m.gguf");
        crate::util::write_gguf(&file, &phimoe_metadata(), &ws);
        let a = agreement(&file, &head.seqs(), &t.argmax, &t.top2_gap);
        assert_disagrees(&format!("phimoe with {what}"), &a);
    }
}

/// Every layer's plan has a bias after each pre-norm, the head one after the final norm and
/// one on the logits; a prompt's logits are the same bits in one prefill and in chunks of
/// every size, on 1 or 2 threads; every step lowers for the GPU on every target, each bias
/// step as one `add_bias` launch (the gpt-oss output bias's kernel; not run on a card).
#[test]
fn the_phimoe_plan_has_its_biases_and_every_split_gives_the_same_bits() {
    let (_dir, model) = crate::moe::fixture_model(FIXTURE, |t| t.ftype == "Q4_K_M", write_model);
    let plan = model.plan();
    for l in 0..plan.n_layers() {
        let steps = plan.layer(l);
        for block in [Block::Attn, Block::Ffn] {
            let at = steps
                .iter()
                .position(|&s| s == Step::Norm(block))
                .expect("a norm");
            assert_eq!(steps[at + 1], Step::NormBias(block), "layer {l}");
        }
        assert!(steps.contains(&Step::Bias) && steps.contains(&Step::OutBias));
    }
    let head = plan.head();
    assert_eq!(
        head[1..],
        [
            Step::FinalNorm,
            Step::FinalNormBias,
            Step::Project(candor::model::plan::Matrix::Logits),
            Step::LogitBias
        ]
    );
    let is_bias = |s: &Step| {
        matches!(
            s,
            Step::NormBias(_) | Step::FinalNormBias | Step::LogitBias | Step::OutBias
        )
    };
    crate::moe::assert_lowered_step_for_step(&model, "phimoe", |low, place, steps| {
        // Each bias step is exactly one `add_bias` launch.
        for l in low.launches(place) {
            if is_bias(&steps[l.steps.start]) {
                assert_eq!((l.kernel.name(), l.steps.len()), ("add_bias", 1));
            }
        }
        let launched = low
            .launches(place)
            .iter()
            .filter(|l| is_bias(&steps[l.steps.start]))
            .count();
        assert_eq!(launched, steps.iter().filter(|s| is_bias(s)).count());
    });
    assert_dense_splits_give_one_prefills_bits(&model, "phimoe");
}

/// A phimoe file without one of its biases is refused, naming the tensor (llama.cpp requires
/// them all).
#[test]
fn a_phimoe_file_without_a_bias_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    for missing in ["blk.1.ffn_norm.bias", "output_norm.bias", "output.bias"] {
        let ws: Vec<_> = phimoe_tensors()
            .into_iter()
            .filter(|(n, _, _)| n != missing)
            .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
            .collect();
        crate::util::write_gguf(&path, &phimoe_metadata(), &ws);
        let e = match Transformer::from_gguf_path(&path, WeightDType::Native) {
            Ok(_) => panic!("{missing}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(missing), "{e}");
    }
}
