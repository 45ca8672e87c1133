//! Qwen3-Next (GGUF `qwen3next`): tiny seeded models of llama.cpp's qwen3next.cpp (qwen35moe's
//! blocks with the value heads grouped by key head, β and α fused in `ssm_ba`, plain partial
//! RoPE; and an older file's fused q|k|v|z `ssm_in`), quantized by llama.cpp's own
//! llama-quantize, against llama.cpp's teacher-forced argmax
//! (`tests/fixtures/quant/tiny_qwen3next_teacher_forced.jsonl`, written by
//! `make_tiny_qwen3next_reference.py`); the grouping matters; both layouts are one model;
//! invariant under batch size, neighbours, threads and every split of a prompt; lowered for
//! the GPU; its refusals.

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candor::model::lowering::not_lowered;
use candor::model::memory::{residency, ExpertPanels};
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

use crate::hybrid::{assert_every_split_gives_the_same_bits, logits_in_chunks};
use crate::hybrid::{
    SsmLayout, CONV, DIM, FFN, HEADS, INTERVAL, KV_HEADS, K_HEADS, STATE, V_HEADS,
};
use crate::hybrid_moe::{draw_hybrid_moe_layer, EXPERTS, EXPERT_FFN, SHARED_FFN, USED};
use crate::moe::TinyRecord;
use crate::quant::{
    agreement, assert_disagrees, assert_verdicts, q, random_ids, tiny_fixture, Draw, TinyTensor,
    TQ_VOCAB,
};

const FIXTURE: &str = "quant/tiny_qwen3next_teacher_forced.jsonl";
/// Layers 0 and 2 linear attention, 1 and 3 full attention (the MoE hybrid fixture's layers,
/// `hybrid_moe.rs`'s geometry, twice).
const LAYERS: usize = 4;
/// RoPE over the first 16 of the 64 head dimensions.
const ROPE_DIM: usize = 16;

/// `attn_qkv` and `attn_gate` as the older converter's `ssm_in`: per key head its q, its k, its
/// value heads' v, then their z (the script's `legacy_ssm_in`).
fn legacy_ssm_in(qkv: &[f32], z: &[f32]) -> Vec<f32> {
    let (key_dim, r) = (STATE * K_HEADS, V_HEADS / K_HEADS);
    let rows = |m: &[f32], from: usize, n: usize| m[from * DIM..(from + n) * DIM].to_vec();
    (0..K_HEADS)
        .flat_map(|g| {
            [
                rows(qkv, g * STATE, STATE),
                rows(qkv, key_dim + g * STATE, STATE),
                rows(qkv, 2 * key_dim + g * r * STATE, r * STATE),
                rows(z, g * r * STATE, r * STATE),
            ]
        })
        .flatten()
        .collect()
}

/// The script's `qwen3next_tensors`: drawn in the same order from the same `SplitMix64` stream
/// (the legacy model's `ssm_in` in its `attn_qkv`'s place).
fn qwen3next_tensors(name: &str) -> Vec<TinyTensor> {
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 1.0, None);
    for i in 0..LAYERS {
        draw_hybrid_moe_layer(&mut w, i, INTERVAL, SsmLayout::Qwen3Next);
    }
    w.norm("output_norm.weight".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    if name == "qwen3next-legacy" {
        // `attn_qkv` and `attn_gate` become one `ssm_in` in `attn_qkv`'s place.
        for i in (0..LAYERS).filter(|i| (i + 1) % INTERVAL != 0) {
            let at = |n: &str| w.out.iter().position(|t| t.0 == format!("blk.{i}.{n}"));
            let (q, z) = (
                at("attn_qkv.weight").unwrap(),
                at("attn_gate.weight").unwrap(),
            );
            let fused = legacy_ssm_in(&w.out[q].2, &w.out[z].2);
            w.out[q] = (
                format!("blk.{i}.ssm_in.weight"),
                vec![fused.len() / DIM, DIM],
                fused,
            );
            w.out.remove(z);
        }
    }
    w.out
}

/// The script's GGUF metadata under architecture `arch` (without the vocabulary, which these
/// ids-only tests do not read).
fn qwen3next_metadata(arch: &'static str) -> Vec<(String, Value)> {
    let hd = (DIM / HEADS) as u32;
    let shape = crate::util::TinyShape {
        arch,
        layers: LAYERS,
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        kv_heads: KV_HEADS,
        context: 256,
    };
    crate::util::tiny_metadata(
        &shape,
        &[
            ("attention.key_length", hd),
            ("attention.value_length", hd),
            ("rope.dimension_count", ROPE_DIM as u32),
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
    )
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes checked
/// against llama-quantize's) into `dir`.
fn write_model(dir: &Path, t: &TinyRecord) -> PathBuf {
    crate::moe::write_fixture_model(
        dir,
        t,
        &qwen3next_tensors(&t.arch),
        &qwen3next_metadata("qwen3next"),
    )
}

/// Both layouts in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's
/// weights, stores each tensor in the type llama-quantize chose and requires its bytes; then
/// Candor's teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well
/// as llama.cpp's own other execution paths), every miss a near tie (llama.cpp's top-2 gap
/// below 0.5, the Mixture-of-Experts models' bound of `moe.rs`: where an ulp upstream moves
/// an 8-bit activation a step, a router near tie can pick another expert, which moves the
/// logits further than a dense layer; measured: F32 880/880 for both layouts, Q8_0 875/880
/// at gaps up to 0.172, Q4_K_M 863 and 865/880 up to 0.280); and decoding the Q4_K_M models
/// does not depend on batch size, neighbours or threads.
#[test]
fn tiny_qwen3next_models_match_llama_cpp_and_are_batch_invariant() {
    let report = crate::moe::verdicts(crate::moe::against_llama_cpp(
        FIXTURE,
        |t| t.ftype == "Q4_K_M",
        write_model,
    ));
    assert_eq!(report.len(), 6, "two layouts in three types");
    assert_verdicts(&report, 0.5);
}

/// The grouping matters to the comparison above: the same weights as a `qwen35moe` file (its
/// value heads tiled over the key heads, β and α as `ssm_beta`/`ssm_alpha` split from
/// `ssm_ba`, RoPE sections [3, 3, 2, 0] under which every pair takes the token's position, as
/// plain RoPE) fall below 98% of llama.cpp's qwen3next argmax, missing where llama.cpp's
/// choice is no near tie.
#[test]
fn the_same_weights_with_tiled_value_heads_disagree_with_llama_cpp() {
    let (head, records) = tiny_fixture::<TinyRecord>(FIXTURE);
    let t = records
        .iter()
        .find(|t| t.arch == "qwen3next" && t.ftype == "F32")
        .expect("an F32 qwen3next record");
    let r = V_HEADS / K_HEADS;
    let ws: Vec<_> = qwen3next_tensors("qwen3next")
        .into_iter()
        .flat_map(|(n, s, v)| match n.strip_suffix("ssm_ba.weight") {
            // Per key head: its value heads' β, then their α.
            Some(b) => {
                let part = |k: usize| -> Vec<f32> {
                    (0..K_HEADS)
                        .flat_map(|g| v[(g * 2 * r + k * r) * DIM..][..r * DIM].to_vec())
                        .collect()
                };
                vec![
                    (format!("{b}ssm_beta.weight"), vec![V_HEADS, DIM], part(0)),
                    (format!("{b}ssm_alpha.weight"), vec![V_HEADS, DIM], part(1)),
                ]
            }
            None => vec![(n, s, v)],
        })
        .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
        .collect();
    let mut md = qwen3next_metadata("qwen35moe");
    md.push((
        "qwen35moe.rope.dimension_sections".into(),
        Value::Array([3, 3, 2, 0].map(Value::I32).to_vec()),
    ));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiled.gguf");
    crate::util::write_gguf(&file, &md, &ws);
    let a = agreement(&file, &head.seqs(), &t.argmax, &t.top2_gap);
    assert_disagrees("qwen3next as qwen35moe", &a);
}

/// The older layout is the same model: the legacy file's `ssm_in`, split as the plan reads it,
/// gives the newer file's logits bit for bit in F32 and Q8_0 (the same rows, each with the
/// same bytes; llama.cpp's own argmaxes agree at every position too), and the model reads
/// what the file says: grouped value heads, no RoPE sections, 16 rotated dimensions.
#[test]
fn the_legacy_ssm_in_layout_is_the_same_model() {
    let records = tiny_fixture::<TinyRecord>(FIXTURE).1;
    let dir = tempfile::tempdir().expect("tempdir");
    let ids = random_ids(30, 5);
    for ftype in ["F32", "Q8_0"] {
        let [new, old] = ["qwen3next", "qwen3next-legacy"].map(|arch| {
            let t = records
                .iter()
                .find(|t| t.arch == arch && t.ftype == ftype)
                .expect("record");
            assert_eq!(
                t.types.contains_key("blk.0.ssm_in.weight"),
                arch != "qwen3next"
            );
            let file = write_model(dir.path(), t);
            let gguf = candor::weights::gguf::GgufFile::open(&file).expect("open");
            let resident = residency(&gguf, WeightDType::Native, &ExpertPanels::Memory)
                .expect("residency")
                .resident;
            let model = Transformer::from_gguf_path(&file, WeightDType::Native).expect("load");
            (t, model, resident)
        });
        // A float `ssm_in`, split into new matrices, is held in memory, and counted so at
        // load; the newer file's float `attn_qkv` and `attn_gate` are read in place.
        let ssm_in = (2 * (2 * STATE * K_HEADS + 2 * STATE * V_HEADS) * DIM * 4) as u64;
        if ftype == "F32" {
            assert_eq!(old.2 - new.2, ssm_in);
        }
        assert_eq!(new.0.argmax, old.0.argmax, "llama.cpp's own {ftype}");
        let h = new.1.hybrid().expect("a hybrid model");
        assert!(h.grouped && new.1.config().rope_sections.is_none());
        assert_eq!((h.k_head(1), h.k_head(2)), (0, 1));
        assert_eq!(new.1.config().rope_dim, ROPE_DIM);
        assert_eq!(new.1.rope_freqs().fixed, None);
        let (a, b) = (
            logits_in_chunks(&new.1, &ids, &[7]),
            logits_in_chunks(&old.1, &ids, &[7]),
        );
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{ftype}: the layouts' logits differ"
        );
    }
}

/// The determinism contract for recurrence: a prompt's logits are the same bits in one
/// prefill and in chunks of every size, on 1 or 2 threads; and every step of the model lowers
/// for `--device cuda` (the delta rule's kernel takes the grouping as an argument; its
/// emulation equals the CPU in both layouts).
#[test]
fn every_split_of_a_qwen3next_prompt_gives_the_same_bits_and_it_lowers() {
    let (_dir, model) = crate::moe::fixture_model(
        FIXTURE,
        |t| t.arch == "qwen3next-legacy" && t.ftype == "Q4_K_M",
        write_model,
    );
    assert_eq!(not_lowered(&model), None);
    assert_every_split_gives_the_same_bits(&model, "qwen3next");
}

/// What a qwen3next file gets refused for, naming the key or tensor: RoPE sections (llama.cpp's
/// qwen3next reads none, its rotation is plain), and a linear layer without `ssm_ba` (it does
/// not read qwen35's separate `ssm_beta`/`ssm_alpha`).
#[test]
fn qwen3next_errors_name_the_key_or_tensor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    let ws = qwen3next_tensors("qwen3next");
    let md = qwen3next_metadata("qwen3next");
    let load = |md: &[(String, Value)], ws: &[TinyTensor]| {
        let ws: Vec<_> = ws
            .iter()
            .map(|(n, s, v)| (n.clone(), q(v.clone(), s, GgmlDType::F32)))
            .collect();
        crate::util::write_gguf(&path, md, &ws);
        Transformer::from_gguf_path(&path, WeightDType::Native).map(|_| ())
    };
    load(&md, &ws).expect("the file itself loads");
    let mut sections = md.clone();
    sections.push((
        "qwen3next.rope.dimension_sections".into(),
        Value::Array([3, 3, 2, 0].map(Value::I32).to_vec()),
    ));
    let e = load(&sections, &ws).unwrap_err().to_string();
    assert!(e.contains("qwen3next.rope.dimension_sections"), "{e}");
    let no_ba: Vec<TinyTensor> = ws
        .iter()
        .filter(|(n, _, _)| n != "blk.2.ssm_ba.weight")
        .cloned()
        .collect();
    let e = load(&md, &no_ba).unwrap_err().to_string();
    assert!(e.contains("blk.2.ssm_ba.weight"), "{e}");
}
