//! Mixture-of-Experts models (issue #42): tiny seeded qwen3moe and Mixtral (`llama` with
//! experts) models, quantized by llama.cpp's own llama-quantize, against llama.cpp's
//! teacher-forced argmax (`tests/fixtures/quant/tiny_moe_teacher_forced.jsonl`, written by
//! `make_tiny_moe_reference.py`), and batch-invariant; plus the refusals an MoE file gets.

use std::collections::BTreeMap;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;
use serde::Deserialize;

use crate::quant::{
    agreement, assert_batch_invariant, fixture, ggml_type, kquants, q, Draw, TinySequences,
    TinyTensor, TQ_VOCAB,
};

const DIM: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const LAYERS: usize = 4;

/// A fixture model: GGUF architecture, experts, experts used, expert FFN, q/k norms.
fn model(arch: &str) -> (&'static str, usize, usize, usize, bool) {
    match arch {
        "qwen3moe" => ("qwen3moe", 16, 4, 256, true),
        "mixtral" => ("llama", 8, 2, 256, false),
        other => panic!("unknown arch {other} in the fixture"),
    }
}

/// The script's `tensors(arch)`: drawn in the same order from the same `SplitMix64` stream.
fn moe_tensors(arch: &str) -> Vec<TinyTensor> {
    let (_, experts, _, ffn, qk_norm) = model(arch);
    let hd = DIM / HEADS;
    let kv = hd * KV_HEADS;
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    let scale = |k: usize| 1.5f32 / (k as f32).sqrt();
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 1.0, None);
    for i in 0..LAYERS {
        let b = |s: &str| format!("blk.{i}.{s}");
        w.norm(b("attn_norm.weight"), DIM);
        w.mat(b("attn_q.weight"), DIM, DIM);
        w.mat(b("attn_k.weight"), kv, DIM);
        w.mat(b("attn_v.weight"), kv, DIM);
        if qk_norm {
            w.norm(b("attn_q_norm.weight"), hd);
            w.norm(b("attn_k_norm.weight"), hd);
        }
        w.mat(b("attn_output.weight"), DIM, DIM);
        w.norm(b("ffn_norm.weight"), DIM);
        w.mat(b("ffn_gate_inp.weight"), experts, DIM);
        w.add(
            b("ffn_gate_exps.weight"),
            vec![experts, ffn, DIM],
            scale(DIM),
            None,
        );
        w.add(
            b("ffn_up_exps.weight"),
            vec![experts, ffn, DIM],
            scale(DIM),
            None,
        );
        w.add(
            b("ffn_down_exps.weight"),
            vec![experts, DIM, ffn],
            scale(ffn),
            None,
        );
    }
    w.norm("output_norm.weight".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    w.out
}

/// The script's GGUF metadata for `arch` (without the vocabulary, which these ids-only tests
/// do not read).
fn moe_metadata(arch: &str) -> Vec<(String, Value)> {
    let (name, experts, used, ffn, _) = model(arch);
    let hd = (DIM / HEADS) as u32;
    let mut md = crate::util::llama_metadata(&crate::util::TinyShape {
        arch: name,
        layers: LAYERS,
        dim: DIM,
        ffn: if name == "llama" { ffn } else { 2 * ffn },
        heads: HEADS,
        kv_heads: KV_HEADS,
        context: 256,
    });
    for (k, v) in [
        ("attention.key_length", hd),
        ("attention.value_length", hd),
        ("rope.dimension_count", hd),
        ("expert_count", experts as u32),
        ("expert_used_count", used as u32),
    ] {
        md.push((format!("{name}.{k}"), Value::U32(v)));
    }
    if name == "qwen3moe" {
        md.push((
            format!("{name}.expert_feed_forward_length"),
            Value::U32(ffn as u32),
        ));
    }
    md
}

#[derive(Deserialize)]
struct MoeRecord {
    arch: String,
    ftype: String,
    /// Every tensor's stored type, as llama-quantize chose it.
    types: BTreeMap<String, String>,
    /// The first 16 hex digits of the sha256 of every tensor's stored bytes.
    tensors: BTreeMap<String, String>,
    argmax: Vec<Vec<u32>>,
    top2_gap: Vec<Vec<f32>>,
    llama_cpp_paths: BTreeMap<String, usize>,
}

/// `v` stored as `dtype`, as llama-quantize stores it.
fn stored(v: &[f32], shape: &[usize], dtype: GgmlDType) -> QTensor {
    match dtype {
        GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K => kquants::quantize(v, shape, dtype),
        _ => q(v.to_vec(), shape, dtype),
    }
}

/// qwen3moe (16 experts, 4 used, q/k norms) and Mixtral (8 experts, 2 used) in F32, Q8_0
/// and llama-quantize's Q4_K_M mix: the test draws the script's weights, stores each tensor
/// in the type llama-quantize chose and requires its bytes; then Candor's teacher-forced
/// argmax agrees with llama.cpp's at 98% or more (or at least as well as llama.cpp's own
/// other execution paths), every miss a near tie (llama.cpp's top-2 gap below 0.25); and the
/// model's decode does not depend on batch size, neighbours or threads. The F32 models agree
/// at every position (measured: 880/880 each), so routing, experts and combine are
/// llama.cpp's; the quantized ones miss where an ulp upstream moves an 8-bit activation a
/// step, as for dense models, and a router near-tie can then pick another expert, which moves
/// the logits further than in a dense layer: the widest miss measured is at a gap of 0.191
/// (qwen3moe Q8_0), where the dense models' bound is 0.1.
#[test]
fn tiny_moe_models_match_llama_cpp_and_are_batch_invariant() {
    use sha2::Digest;
    let path = fixture("quant/tiny_moe_teacher_forced.jsonl");
    let text = std::fs::read_to_string(&path).expect("fixture");
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let head: TinySequences =
        serde_json::from_str(lines.next().expect("sequences line")).expect("sequences");
    let seqs: Vec<(&[u32], usize)> = head
        .sequences
        .iter()
        .map(|s| (&s[..], head.start))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut report = Vec::new();
    for (i, l) in lines.enumerate() {
        let t: MoeRecord =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 2));
        let label = format!("tiny {} {}", t.arch, t.ftype);
        let ws = moe_tensors(&t.arch);
        assert_eq!(ws.len(), t.tensors.len(), "{label}: tensor count");
        let mut tensors = Vec::with_capacity(ws.len());
        for (name, shape, v) in &ws {
            let ty = t
                .types
                .get(name)
                .unwrap_or_else(|| panic!("{label}: no type for {name}"));
            let qt = stored(v, shape, ggml_type(ty));
            let bytes = qt.data().expect("tensor bytes");
            let hash = format!("{:x}", sha2::Sha256::digest(&bytes[..]))[..16].to_string();
            assert_eq!(
                Some(&hash),
                t.tensors.get(name),
                "{label} {name} ({ty}): the test's bytes are not llama-quantize's"
            );
            tensors.push((name.clone(), qt));
        }
        let file = dir.path().join(format!("tiny-{}-{}.gguf", t.arch, t.ftype));
        crate::util::write_gguf(&file, &moe_metadata(&t.arch), &tensors);
        assert_batch_invariant(&file, TQ_VOCAB, &label);
        let a = agreement(&file, &seqs, &t.argmax, &t.top2_gap);
        let own = t.llama_cpp_paths.values().copied().min().unwrap_or(0);
        let line = format!(
            "{label}: {}/{} ({:.2}%) agree with llama.cpp (its own other paths: {:?}); {} of {} misses at top2_gap < 0.5, the widest at {:.3}",
            a.agree,
            a.total,
            100.0 * a.agree as f64 / a.total as f64,
            t.llama_cpp_paths,
            a.near,
            a.total - a.agree,
            a.widest_miss
        );
        println!("{line}");
        report.push((a.agree, a.total, own, a.widest_miss, line));
        std::fs::remove_file(&file).ok();
    }
    assert_eq!(report.len(), 2 * 3, "models in the fixture");
    for (agree, total, own, widest, line) in report {
        assert!(
            agree * 50 >= total * 49 || agree >= own,
            "{line}: below 98% and below llama.cpp's own other paths ({own})"
        );
        assert!(
            widest < 0.25,
            "{line}: a miss where llama.cpp's top-2 gap is not a near tie"
        );
    }
}

/// What an MoE file gets refused for, in one line naming the key: a qwen3moe with one
/// expert, more experts used than it has, and an expert count on an architecture without
/// experts.
#[test]
fn moe_metadata_errors_name_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws: Vec<(String, QTensor)> = moe_tensors("qwen3moe")
        .into_iter()
        .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
        .collect();
    let load = |md: Vec<(String, Value)>, name: &str| -> String {
        let path = dir.path().join(name);
        crate::util::write_gguf(&path, &md, &ws);
        match Transformer::from_gguf_path(&path, WeightDType::Native) {
            Ok(_) => panic!("{name} loaded"),
            Err(e) => e.to_string(),
        }
    };
    let with = |key: &str, v: u32| {
        let mut md = moe_metadata("qwen3moe");
        md.retain(|(k, _)| !k.ends_with(key));
        md.push((format!("qwen3moe.{key}"), Value::U32(v)));
        md
    };
    let e = load(with("expert_count", 1), "one.gguf");
    assert!(
        e.contains("qwen3moe.expert_count") && e.contains("more than one expert"),
        "{e}"
    );
    let e = load(with("expert_used_count", 17), "used.gguf");
    assert!(
        e.contains("qwen3moe.expert_used_count") && e.contains("17"),
        "{e}"
    );
    let mut md: Vec<(String, Value)> = with("expert_count", 16)
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "general.architecture" => (k, Value::String("qwen3".into())),
            _ => (k.replace("qwen3moe", "qwen3"), v),
        })
        .collect();
    md.retain(|(k, _)| !k.ends_with("expert_feed_forward_length"));
    let e = load(md, "dense.gguf");
    assert!(e.contains("qwen3.expert_count"), "{e}");
}
