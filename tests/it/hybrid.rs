//! Hybrid models (issue #43): a tiny seeded `qwen35` (Gated DeltaNet linear attention between
//! gated full-attention layers), quantized by llama.cpp's own llama-quantize, against
//! llama.cpp's teacher-forced argmax (`tests/fixtures/quant/tiny_hybrid_teacher_forced.jsonl`,
//! written by `make_tiny_hybrid_reference.py`); invariant under batch size, neighbours and
//! threads, and under every split of a prompt (one prefill, chunks of any size, token by
//! token, a prefix-cache resume); plus the refusals a hybrid file gets.

use std::sync::Arc;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candor::engine::draft::{DraftConfig, DraftSource};
use candor::engine::kv::{KvLayout, SeqKv};
use candor::engine::prefix::resume_point;
use candor::engine::{Decoder, NoText, SamplingParams, SchedulerConfig, TokenRequest};
use candor::model::kv::{Logits, SeqStep};
use candor::model::runner::Model;
use candor::model::transformer::{Scratch, Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

use crate::moe::TinyRecord;
use crate::quant::{assert_verdicts, q, tiny_fixture, Draw, TinyTensor, TQ_VOCAB};

pub(crate) const DIM: usize = 256;
pub(crate) const HEADS: usize = 4;
pub(crate) const KV_HEADS: usize = 2;
const LAYERS: usize = 4;
pub(crate) const FFN: usize = 512;
/// Every `INTERVAL`-th layer is full attention.
pub(crate) const INTERVAL: usize = 2;
/// Gated DeltaNet: conv taps, state (head) size, key heads, value heads.
pub(crate) const CONV: usize = 4;
pub(crate) const STATE: usize = 64;
pub(crate) const K_HEADS: usize = 2;
pub(crate) const V_HEADS: usize = 4;
pub(crate) const ROPE_DIM: u32 = 16;
pub(crate) const SECTIONS: [i32; 4] = [2, 2, 2, 2];

/// The script's `tensors()`: drawn in the same order from the same `SplitMix64` stream.
fn hybrid_tensors() -> Vec<TinyTensor> {
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    w.add("token_embd.weight".into(), vec![TQ_VOCAB, DIM], 1.0, None);
    for i in 0..LAYERS {
        draw_hybrid_attention(&mut w, i, INTERVAL, SsmLayout::Qwen35);
        let b = |s: &str| format!("blk.{i}.{s}");
        w.norm(b("post_attention_norm.weight"), DIM);
        w.mat(b("ffn_gate.weight"), FFN, DIM);
        w.mat(b("ffn_up.weight"), FFN, DIM);
        w.mat(b("ffn_down.weight"), DIM, FFN);
    }
    w.norm("output_norm.weight".into(), DIM);
    w.mat("output.weight".into(), TQ_VOCAB, DIM);
    w.out
}

/// How a linear-attention layer's β and α are stored.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum SsmLayout {
    /// `ssm_beta`, `ssm_alpha` (Qwen3.5).
    Qwen35,
    /// One `ssm_ba` (Qwen3-Next).
    Qwen3Next,
}

/// The attention half of layer `i` of the hybrid fixtures, drawn in their scripts' order (the
/// fixtures' shared geometry): the pre-norm, then linear attention unless
/// `(i + 1) % interval == 0`, else gated full attention.
pub(crate) fn draw_hybrid_attention(w: &mut Draw, i: usize, interval: usize, layout: SsmLayout) {
    let hd = DIM / HEADS;
    let kv = hd * KV_HEADS;
    let (key_dim, value_dim) = (STATE * K_HEADS, STATE * V_HEADS);
    let b = |s: &str| format!("blk.{i}.{s}");
    w.norm(b("attn_norm.weight"), DIM);
    if !(i + 1).is_multiple_of(interval) {
        w.mat(b("attn_qkv.weight"), 2 * key_dim + value_dim, DIM);
        w.mat(b("attn_gate.weight"), value_dim, DIM);
        match layout {
            SsmLayout::Qwen35 => {
                w.mat(b("ssm_beta.weight"), V_HEADS, DIM);
                w.mat(b("ssm_alpha.weight"), V_HEADS, DIM);
            }
            SsmLayout::Qwen3Next => w.mat(b("ssm_ba.weight"), 2 * V_HEADS, DIM),
        }
        w.add(
            b("ssm_conv1d.weight"),
            vec![2 * key_dim + value_dim, CONV],
            0.5,
            None,
        );
        w.add(b("ssm_dt.bias"), vec![V_HEADS], 0.5, None);
        w.add(b("ssm_a"), vec![V_HEADS], 0.5, Some(-1.0));
        w.norm(b("ssm_norm.weight"), STATE);
        w.mat(b("ssm_out.weight"), DIM, value_dim);
    } else {
        w.mat(b("attn_q.weight"), 2 * DIM, DIM);
        w.mat(b("attn_k.weight"), kv, DIM);
        w.mat(b("attn_v.weight"), kv, DIM);
        w.norm(b("attn_q_norm.weight"), hd);
        w.norm(b("attn_k_norm.weight"), hd);
        w.mat(b("attn_output.weight"), DIM, DIM);
    }
}

/// The script's GGUF metadata (without the vocabulary, which these ids-only tests do not
/// read).
fn hybrid_metadata() -> Vec<(String, Value)> {
    let a = "qwen35";
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
        ],
    );
    md.push((
        format!("{a}.rope.dimension_sections"),
        Value::Array(SECTIONS.iter().map(|&s| Value::I32(s)).collect()),
    ));
    md
}

/// The script's tensors, all F32.
fn f32_tensors() -> Vec<(String, QTensor)> {
    hybrid_tensors()
        .into_iter()
        .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
        .collect()
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes
/// checked against llama-quantize's) into `dir`.
pub(crate) fn write_model(dir: &std::path::Path, t: &TinyRecord) -> std::path::PathBuf {
    crate::moe::write_fixture_model(dir, t, &hybrid_tensors(), &hybrid_metadata())
}

/// qwen35 in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's weights,
/// stores each tensor in the type llama-quantize chose and requires its bytes; then Candor's
/// teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well as
/// llama.cpp's own other execution paths), every miss a near tie (llama.cpp's top-2 gap below
/// 0.1, the dense models' bound); and decoding does not depend on batch size, neighbours or
/// threads.
#[test]
fn tiny_hybrid_models_match_llama_cpp_and_are_batch_invariant() {
    let report = crate::moe::verdicts(crate::moe::against_llama_cpp(
        "quant/tiny_hybrid_teacher_forced.jsonl",
        |_| true,
        write_model,
    ));
    assert_eq!(report.len(), 3, "models in the fixture");
    assert_verdicts(&report, 0.1);
}

/// Every position's logits of `ids` fed in chunks of `sizes` (cycled), all rows' logits.
pub(crate) fn logits_in_chunks(model: &Transformer, ids: &[u32], sizes: &[usize]) -> Vec<f32> {
    let mut kv = SeqKv::new(KvLayout::of(model)).with_state(model.state_len());
    let mut scratch = Scratch::default();
    let mut out = Vec::new();
    let mut at = 0;
    for &n in sizes.iter().cycle() {
        if at == ids.len() {
            break;
        }
        let n = n.min(ids.len() - at);
        let logits = model.forward(
            &mut [SeqStep {
                tokens: &ids[at..at + n],
                kv: &mut kv,
                logits: Logits::All,
            }],
            &mut scratch,
        );
        out.extend_from_slice(logits);
        at += n;
    }
    out
}

/// `ids` fed in chunks of each of `splits` (cycled), on 1 and 2 threads, give every position
/// the logits of one prefill, bit for bit (`label` names the model); returns those logits.
pub(crate) fn assert_chunks_give_one_prefills_bits(
    model: &Transformer,
    ids: &[u32],
    splits: &[&[usize]],
    label: &str,
) -> Vec<f32> {
    let whole = logits_in_chunks(model, ids, &[ids.len()]);
    assert_eq!(whole.len(), ids.len() * TQ_VOCAB, "{label}");
    for sizes in splits {
        for threads in [1, 2] {
            let got = crate::quant::pool(threads).install(|| logits_in_chunks(model, ids, sizes));
            assert!(
                got.iter()
                    .zip(&whole)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{label}: chunks {sizes:?} on {threads} threads differ from one prefill"
            );
        }
    }
    whole
}

/// The determinism contract for recurrence: a prompt's logits at every position are the same
/// bits in one prefill, in chunks of 1 (token by token), 2, 3, 7, 16 and uneven sizes, and on
/// 1 or 2 threads; a fork of the sequence continued elsewhere does not disturb it.
#[test]
fn every_split_of_a_prompt_gives_the_same_bits() {
    let records = tiny_fixture::<TinyRecord>("quant/tiny_hybrid_teacher_forced.jsonl").1;
    let dir = tempfile::tempdir().expect("tempdir");
    for t in records.iter().filter(|t| t.ftype != "Q8_0") {
        let file = write_model(dir.path(), t);
        let model = Transformer::from_gguf_path(&file, WeightDType::Native).expect("load");
        assert_every_split_gives_the_same_bits(&model, &format!("{} {}", t.arch, t.ftype));
    }
}

/// The dense architectures' split check: a 40-token prompt (`random_ids(40, 11)`) in chunks
/// of 1, 3, 16 and uneven sizes, on 1 and 2 threads, gives the bits of one prefill.
pub(crate) fn assert_dense_splits_give_one_prefills_bits(model: &Transformer, label: &str) {
    assert_chunks_give_one_prefills_bits(
        model,
        &crate::quant::random_ids(DENSE_SPLIT_TOKENS, 11),
        &[&[1], &[3], &[16], &[5, 1, 11, 2]],
        label,
    );
}

/// The prompt length of [`assert_dense_splits_give_one_prefills_bits`].
pub(crate) const DENSE_SPLIT_TOKENS: usize = 40;

/// [`every_split_of_a_prompt_gives_the_same_bits`] for one hybrid model (`label` names it):
/// a 45-token prompt's logits in chunks of every size listed, on 1 and 2 threads, are the
/// bits of one prefill, and its second half alone predicts otherwise.
pub(crate) fn assert_every_split_gives_the_same_bits(model: &Transformer, label: &str) {
    assert!(
        model.state_len() > 0,
        "{label}: a hybrid model holds a state"
    );
    let ids = crate::quant::random_ids(45, 11);
    let whole = assert_chunks_give_one_prefills_bits(
        model,
        &ids,
        &[&[1], &[2], &[3], &[7], &[16], &[5, 1, 11, 2]],
        label,
    );
    // The state matters: a model fed the prompt's second half alone predicts otherwise.
    let half = logits_in_chunks(model, &ids[20..], &[25]);
    assert_ne!(&half[..], &whole[20 * TQ_VOCAB..], "{label}");
}

/// A prompt resumed from the prefix cache (a later turn extending a stored reply, a shared
/// prefix) gives the same tokens as computed from scratch, whether the cache held a state
/// snapshot at the resume point or not; and drafts are refused for a model whose state
/// cannot be rolled back.
#[test]
fn prefix_cache_resumes_a_hybrid_model_only_from_its_state() {
    let records = tiny_fixture::<TinyRecord>("quant/tiny_hybrid_teacher_forced.jsonl").1;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_model(dir.path(), &records[0]);
    let model = Arc::new(Model::from(
        Transformer::from_gguf_path(&file, WeightDType::Native).expect("load"),
    ));
    let decoder = |cache: usize| {
        let cfg = SchedulerConfig {
            prefill_chunk: 5,
            prefix_cache_bytes: cache,
            ..SchedulerConfig::default()
        };
        Decoder::new(Arc::clone(&model), cfg, Vec::new())
    };
    let mut rng = SplitMix64::new(3);
    let mut draw = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| (rng.next_u64() % TQ_VOCAB as u64) as u32)
            .collect()
    };
    // A 20-token prompt and 13 generated tokens: 32 positions stored (the last token is not
    // fed), a block boundary, so a snapshot; then a 21-token prompt and 7 tokens: 27
    // positions, no snapshot.
    let (p1, p2) = (draw(20), draw(21));
    let mut cached = decoder(64 << 20);
    let mut fresh = decoder(0);
    for (prompt, n) in [(p1, 13), (p2, 7)] {
        let first = cached
            .generate(&[crate::util::greedy_request(prompt.clone(), n)], &NoText)
            .expect("generate")
            .remove(0)
            .output_ids;
        let mut next = prompt.clone();
        next.extend_from_slice(&first);
        next.extend(draw(9));
        let reqs = [crate::util::greedy_request(next.clone(), 8)];
        let a = cached.generate(&reqs, &NoText).expect("cached");
        let b = fresh.generate(&reqs, &NoText).expect("fresh");
        assert_eq!(a[0].output_ids, b[0].output_ids, "{n}");
    }
    let s = cached.prefill_stats();
    assert!(
        s.reused >= 32,
        "the snapshot at 32 positions was used: {s:?}"
    );
    let e = decoder(0)
        .set_drafting(Some((DraftSource::Lookup, DraftConfig::default())))
        .expect_err("drafts on a recurrent model");
    assert!(e.to_string().contains("rolled back"), "{e}");
}

/// The fixture's model with room for a 300-token prompt (its context is 256).
fn long_context_model(dir: &std::path::Path) -> Arc<Model> {
    let records = tiny_fixture::<TinyRecord>("quant/tiny_hybrid_teacher_forced.jsonl").1;
    let mut metadata = hybrid_metadata();
    for (key, value) in &mut metadata {
        if key.ends_with(".context_length") {
            *value = Value::U32(1024);
        }
    }
    let file = crate::moe::write_fixture_model(dir, &records[0], &hybrid_tensors(), &metadata);
    Arc::new(Model::from(
        Transformer::from_gguf_path(&file, WeightDType::Native).expect("load"),
    ))
}

/// Prompts sharing a prefix with an earlier one resume from a snapshot of the state where the
/// shared part ends and every 256 positions (not only where a stored sequence happened to end
/// on a block boundary), and give the tokens computed from scratch.
#[test]
fn hybrid_prompts_resume_at_shared_prefix_ends_and_every_256_positions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = long_context_model(dir.path());
    let decoder = |cache: usize| {
        let cfg = SchedulerConfig {
            // Not a divisor of 256: the pauses, not the chunks, put the snapshots in place.
            prefill_chunk: 100,
            prefix_cache_bytes: cache,
            ..SchedulerConfig::default()
        };
        Decoder::new(Arc::clone(&model), cfg, Vec::new())
    };
    let mut rng = SplitMix64::new(5);
    let mut draw = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| (rng.next_u64() % TQ_VOCAB as u64) as u32)
            .collect()
    };
    let req = |ids: &[u32], n: usize| {
        TokenRequest::new(
            ids.to_vec(),
            SamplingParams {
                max_new_tokens: n,
                ..SamplingParams::default()
            },
        )
    };
    // Three branches of a 40-token prefix (blocks 0-31 shared, block 32-47 not), 30 tokens
    // each; then a 300-token prompt and one sharing its first 280 tokens.
    let shared = draw(40);
    let branches: Vec<Vec<u32>> = (0..3)
        .map(|_| shared.iter().copied().chain(draw(30)).collect())
        .collect();
    let long = draw(300);
    let mut other = long[..280].to_vec();
    other.extend(draw(20));
    let mut cached = decoder(64 << 20);
    let mut fresh = decoder(0);
    let mut reused = Vec::new();
    for ids in branches.iter().chain([&long, &other]) {
        let before = cached.prefill_stats().reused;
        let a = cached.generate(&[req(ids, 4)], &NoText).expect("cached");
        let b = fresh.generate(&[req(ids, 4)], &NoText).expect("fresh");
        assert_eq!(a[0].output_ids, b[0].output_ids, "{} tokens", ids.len());
        reused.push(cached.prefill_stats().reused - before);
    }
    // The first branch snapshots at its last block (64), which the second does not share:
    // it computes everything and snapshots where the shared part ends (32), which the third
    // resumes from. The long prompt snapshots at 256, where the other one resumes.
    assert_eq!(reused, [0, 0, 32, 0, 256]);
    // A dialogue's next turn resumes where the reply's last block ends: a 21-token prompt and
    // 20 generated tokens hold 40 positions (the last token is not fed); the state at 32 was
    // kept while decoding, so the next turn reuses 32 (16, the prompt's last block, without).
    let prompt = draw(21);
    let reply = cached
        .generate(&[req(&prompt, 20)], &NoText)
        .expect("first turn")
        .remove(0)
        .output_ids;
    assert_eq!(reply.len(), 20, "a random model stopped early: {reply:?}");
    let mut next = prompt.clone();
    next.extend_from_slice(&reply);
    next.extend(draw(9));
    let before = cached.prefill_stats().reused;
    let a = cached.generate(&[req(&next, 4)], &NoText).expect("cached");
    let b = fresh.generate(&[req(&next, 4)], &NoText).expect("fresh");
    assert_eq!(a[0].output_ids, b[0].output_ids);
    assert_eq!(cached.prefill_stats().reused - before, 32);
}

/// Prompts the engine holds together (one `generate` call, or submitted while another runs)
/// resume where a model without a recurrent state would: a prompt's prefill also pauses
/// where each other prompt held resumes from it ([`resume_point`]), so the first prompt to
/// share a prefix finds a snapshot at its end, and the tokens are those computed from scratch.
#[test]
fn hybrid_prompts_held_together_resume_where_a_dense_model_would() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = long_context_model(dir.path());
    let decoder_of = |batch_size: usize, cache: usize| {
        let cfg = SchedulerConfig {
            batch_size,
            // Small chunks: a prompt is still prefilling when the next one is admitted.
            prefill_chunk: 8,
            prefix_cache_bytes: cache,
            ..SchedulerConfig::default()
        };
        Decoder::new(Arc::clone(&model), cfg, Vec::new())
    };
    let decoder = |cache: usize| decoder_of(1, cache);
    let mut rng = SplitMix64::new(5);
    let mut draw = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| (rng.next_u64() % TQ_VOCAB as u64) as u32)
            .collect()
    };
    let req = |ids: &[u32]| {
        TokenRequest::new(
            ids.to_vec(),
            SamplingParams {
                max_new_tokens: 4,
                ..SamplingParams::default()
            },
        )
    };
    // Three branches of a 40-token prefix, a 300-token prompt and one sharing its first 280
    // tokens, and a prompt that is the first 49 tokens of the first branch.
    let shared = draw(40);
    let mut prompts: Vec<Vec<u32>> = (0..3)
        .map(|_| shared.iter().copied().chain(draw(30)).collect())
        .collect();
    let long = draw(300);
    let mut other = long[..280].to_vec();
    other.extend(draw(20));
    let head = prompts[0][..49].to_vec();
    prompts.extend([long, other, head]);
    // A dense model resumes each at the last whole block it shares with an earlier prompt.
    let dense: Vec<u64> = (0..prompts.len())
        .map(|i| {
            (0..i)
                .map(|j| resume_point(&prompts[j], &prompts[i]) as u64)
                .max()
                .unwrap_or(0)
        })
        .collect();
    assert_eq!(dense, [0, 32, 32, 0, 272, 48]);
    // All submitted at once, one at a time in the batch: each reply's prompt reuse.
    let mut cached = decoder(64 << 20);
    for (i, ids) in prompts.iter().enumerate() {
        cached.submit(i as u64, req(ids)).expect("submit");
    }
    let mut reused = vec![0; prompts.len()];
    let mut outputs = vec![Vec::new(); prompts.len()];
    let mut before = 0;
    while cached.in_flight() > 0 {
        for (id, reply) in cached.step(&NoText).expect("step") {
            let now = cached.prefill_stats().reused;
            reused[id as usize] = now - before;
            before = now;
            outputs[id as usize] = reply.output_ids;
        }
    }
    assert_eq!(reused, dense);
    let fresh = decoder(0)
        .generate(&prompts.iter().map(|p| req(p)).collect::<Vec<_>>(), &NoText)
        .expect("fresh");
    for (i, f) in fresh.iter().enumerate() {
        assert_eq!(outputs[i], f.output_ids, "prompt {i}");
    }
    // Two prompts running side by side (the second submitted while the first prefills): the
    // second pauses where it shares with the first, so a third sharing the same 50 tokens
    // resumes at 48 (as a dense model) and not from nothing.
    let shared = draw(50);
    let [a, b, c] =
        [0; 3].map(|_| -> Vec<u32> { shared.iter().copied().chain(draw(30)).collect() });
    let mut side = decoder_of(2, 64 << 20);
    side.submit(0, req(&a)).expect("a");
    side.step(&NoText).expect("a admitted");
    side.submit(1, req(&b)).expect("b");
    while side.in_flight() > 0 {
        side.step(&NoText).expect("step");
    }
    let before = side.prefill_stats().reused;
    let got = side.generate(&[req(&c)], &NoText).expect("c");
    assert_eq!(side.prefill_stats().reused - before, 48);
    let want = decoder(0).generate(&[req(&c)], &NoText).expect("fresh c");
    assert_eq!(got[0].output_ids, want[0].output_ids);
}

/// What a hybrid file gets refused for, naming the key: a missing DeltaNet key, an inner
/// size that is not the value heads' width, as many multi-token-prediction layers as layers,
/// and a missing tensor.
#[test]
fn hybrid_metadata_errors_name_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = f32_tensors();
    let load = |md: Vec<(String, Value)>, name: &str| -> String {
        let path = dir.path().join(name);
        crate::util::write_gguf(&path, &md, &ws);
        match Transformer::from_gguf_path(&path, WeightDType::Native) {
            Ok(_) => panic!("{name} loaded"),
            Err(e) => e.to_string(),
        }
    };
    let mut md = hybrid_metadata();
    md.retain(|(k, _)| !k.ends_with("ssm.state_size"));
    let e = load(md, "missing.gguf");
    assert!(
        e.contains("qwen35.ssm.state_size") && e.contains("missing.gguf"),
        "{e}"
    );
    let mut md = hybrid_metadata();
    md.retain(|(k, _)| !k.ends_with("ssm.inner_size"));
    md.push(("qwen35.ssm.inner_size".into(), Value::U32(100)));
    let e = load(md, "inner.gguf");
    assert!(
        e.contains("qwen35.ssm.inner_size") && e.contains("100"),
        "{e}"
    );
    let mut md = hybrid_metadata();
    md.push(("qwen35.nextn_predict_layers".into(), Value::U32(4)));
    let e = load(md, "nextn.gguf");
    assert!(
        e.contains("qwen35.nextn_predict_layers") && e.contains("4 of 4 layers"),
        "{e}"
    );
    // A missing tensor is named.
    let mut short = f32_tensors();
    short.retain(|(n, _)| n != "blk.0.ssm_a");
    let path = dir.path().join("tensor.gguf");
    crate::util::write_gguf(&path, &hybrid_metadata(), &short);
    let e = match Transformer::from_gguf_path(&path, WeightDType::Native) {
        Ok(_) => panic!("loaded without blk.0.ssm_a"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("blk.0.ssm_a"), "{e}");
}

/// A file with a multi-token-prediction (`nextn`) layer after its trunk (`block_count` 5,
/// `nextn_predict_layers` 1, a `blk.4.*` block) loads with the trunk's 4 layers, ignores the
/// extra block and computes the logits of the file without it; a stray tensor inside the
/// trunk is still refused.
#[test]
fn nextn_layers_are_loaded_and_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trunk = f32_tensors();
    let plain = dir.path().join("plain.gguf");
    crate::util::write_gguf(&plain, &hybrid_metadata(), &trunk);
    let mut md = hybrid_metadata();
    md.retain(|(k, _)| k != "qwen35.block_count");
    md.push(("qwen35.block_count".into(), Value::U32(5)));
    md.push(("qwen35.nextn_predict_layers".into(), Value::U32(1)));
    let mut with_mtp = f32_tensors();
    for (name, len) in [
        ("blk.4.nextn.enorm.weight", DIM),
        ("blk.4.attn_norm.weight", DIM),
    ] {
        with_mtp.push((name.into(), q(vec![1.0; len], &[len], GgmlDType::F32)));
    }
    let mtp = dir.path().join("mtp.gguf");
    crate::util::write_gguf(&mtp, &md, &with_mtp);
    let a = Transformer::from_gguf_path(&plain, WeightDType::Native).expect("plain");
    let b = Transformer::from_gguf_path(&mtp, WeightDType::Native).expect("with nextn");
    assert_eq!(b.config().n_layer, LAYERS);
    let ids = [1, 5, 9, 2, 7, 3];
    assert_eq!(
        logits_in_chunks(&a, &ids, &[6]),
        logits_in_chunks(&b, &ids, &[6])
    );
    with_mtp.push((
        "blk.1.stray.weight".into(),
        q(vec![1.0; 4], &[4], GgmlDType::F32),
    ));
    crate::util::write_gguf(&mtp, &md, &with_mtp);
    let e = match Transformer::from_gguf_path(&mtp, WeightDType::Native) {
        Ok(_) => panic!("a stray trunk tensor loaded"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("blk.1.stray.weight"), "{e}");
}

/// The tiny Qwen3.5 and Qwen3-Next models as transformers 5.24 saves them (`qwen3_5_text`,
/// `qwen3_5_moe_text` and `qwen3_next`, by `tests/reference/make_tiny.py qwen35 qwen35moe
/// qwen3next`): Gated DeltaNet layers as `linear_attn.{in_proj_qkv,in_proj_z,in_proj_b,
/// in_proj_a,conv1d,dt_bias,A_log,norm,out_proj}` (Qwen3-Next: `in_proj_qkvz` and
/// `in_proj_ba` fused per key head) with two key heads and four value heads, grouped by key
/// head; a full-attention layer with its output gate in `q_proj`, q/k norms and partial RoPE
/// (interleaved multi-section for Qwen3.5); every norm but the gated one stored as `w` for
/// `1 + w`; `rope_parameters`; the MoE ones' experts per expert, `mlp.gate` and a
/// sigmoid-gated `mlp.shared_expert`. Each loads (every tensor read) with the config's
/// geometry, in f32 and in its own types; its greedy decoding agrees with transformers' f32
/// reference (48/48 steps), the last-position logits within 1e-3 of it (measured: within
/// 5.6e-5); and its logits do not depend on how prompts are packed and chunked. Value heads
/// tiled rather than grouped fails it (by 6.6), and so does `A_log` read as `exp` without the
/// sign.
#[test]
fn a_qwen35_checkpoint_is_the_model_transformers_runs() {
    use candor::model::checkpoint::Checkpoint;
    use candor::model::transformer::{Transformer, WeightDType};
    let prompts: Vec<Vec<u32>> = (0..6u32)
        .map(|i| {
            (0..1 + 4 * i)
                .map(|j| (5 + 41 * i + 13 * j) % 500 + 3)
                .collect()
        })
        .collect();
    for (name, gguf, experts, sections) in [
        ("qwen35", "qwen35", None, Some([2, 1, 1, 0])),
        ("qwen35moe", "qwen35moe", Some(4), Some([2, 1, 1, 0])),
        ("qwen3next", "qwen3next", Some(4), None),
    ] {
        let dir = crate::arch::fixture(name);
        for dtype in [WeightDType::F32, WeightDType::Native] {
            let mut ck = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
            let model = Transformer::from_checkpoint(&mut ck, dtype)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                ck.unread_tensors(),
                Vec::<String>::new(),
                "{name}: every tensor read"
            );
            let c = model.config();
            assert_eq!(
                (
                    c.architecture.as_str(),
                    c.n_layer,
                    c.rope_dim,
                    c.rope_sections
                ),
                (gguf, 4, 8, sections),
                "{name}"
            );
            assert_eq!(c.moe.map(|m| m.experts), experts, "{name}");
            let what = format!("checkpoint, {dtype:?}");
            crate::arch::check_against_reference(name, &model, &what);
            let one = crate::arch::packed_logits(&model, &prompts, 1, 64);
            let packed = crate::arch::packed_logits(&model, &prompts, 6, 5);
            assert!(
                crate::arch::same_bits(&one, &packed),
                "{name} ({what}): the logits depend on packing"
            );
        }
    }
}

/// Qwen3.5 as the Hub publishes it, an image-text checkpoint (`qwen3_5`: the language model's
/// config in `text_config`, its tensors under `model.language_model.`, the head at
/// `lm_head.weight`, a vision tower under `model.visual.` and multi-token-prediction layers
/// under `mtp.`, neither read): the tiny qwen35 model in that layout gives the logits of its
/// text-only checkpoint bit for bit.
#[test]
fn a_qwen35_image_text_checkpoint_is_read_as_its_language_model() {
    assert_image_text_layout_reads_the_text_model(
        "qwen35",
        "qwen3_5",
        "Qwen3_5ForConditionalGeneration",
    );
}

/// The text-only fixture `name` rewritten as transformers 5 saves an image-text model of
/// `model_type` (`architectures`: `class`): the config as `text_config`, the tensors under
/// `model.language_model.`, the head at `lm_head.weight`, beside a vision tower and
/// multi-token-prediction layers that are not read. Its logits are the text-only
/// checkpoint's bit for bit.
pub(crate) fn assert_image_text_layout_reads_the_text_model(
    name: &str,
    model_type: &str,
    class: &str,
) {
    use candle_core::{DType, Device, Tensor};
    use candor::model::checkpoint::Checkpoint;
    use candor::model::transformer::{Transformer, WeightDType};
    let src = crate::arch::fixture(name);
    let dir = tempfile::tempdir().expect("tempdir");
    let text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config"))
            .expect("json");
    let config = serde_json::json!({
        "architectures": [class], "model_type": model_type,
        "text_config": text, "vision_config": {"depth": 1},
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).expect("config");
    let tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).expect("load");
    let mut renamed: std::collections::HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(k, v)| match k.strip_prefix("model.") {
            Some(rest) => (format!("model.language_model.{rest}"), v),
            None => (k, v),
        })
        .collect();
    for extra in [
        "model.visual.merger.linear_fc1.weight",
        "model.vision_tower.transformer.layers.0.attention.q_proj.weight",
        "model.multi_modal_projector.linear_1.weight",
        "mtp.fc.weight",
    ] {
        let t = Tensor::ones((4, 4), DType::BF16, &Device::Cpu).expect("tensor");
        renamed.insert(extra.into(), t);
    }
    candle_core::safetensors::save(&renamed, dir.path().join("model.safetensors")).expect("save");
    let load = |d: &std::path::Path| {
        let mut ck = Checkpoint::open(d).unwrap_or_else(|e| panic!("{name}: {e}"));
        let m = Transformer::from_checkpoint(&mut ck, WeightDType::Native)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ck.unread_tensors(), Vec::<String>::new(), "{name}");
        m
    };
    let prompts: Vec<Vec<u32>> = vec![(3..20).collect(), (100..107).collect()];
    let want = crate::arch::packed_logits(&load(&src), &prompts, 2, 5);
    let got = crate::arch::packed_logits(&load(dir.path()), &prompts, 2, 5);
    assert!(
        crate::arch::same_bits(&want, &got),
        "{name}: the image-text layout's logits differ"
    );
}

/// A Qwen3.5 config that leaves out a linear-attention key (transformers' defaults are the
/// largest model's), or whose value heads are wider than its key heads, is refused naming
/// the key.
#[test]
fn a_qwen35_config_without_its_linear_geometry_is_refused() {
    use candor::model::checkpoint::Checkpoint;
    use candor::model::transformer::{Transformer, WeightDType};
    let refused = |edit: &dyn Fn(&mut serde_json::Value), want: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let ck = crate::arch::edited_checkpoint(dir.path(), "qwen35", edit, &[]);
        let e = match Checkpoint::open(&ck) {
            Err(e) => e.to_string(),
            Ok(mut ck) => match Transformer::from_checkpoint(&mut ck, WeightDType::F32) {
                Ok(_) => panic!("loaded; wanted {want}"),
                Err(e) => e.to_string(),
            },
        };
        assert!(
            e.contains(want) && e.contains("config.json"),
            "{want} not in: {e}"
        );
    };
    refused(
        &|c| {
            c.as_object_mut()
                .expect("object")
                .remove("linear_num_value_heads");
        },
        "linear_num_value_heads",
    );
    refused(
        &|c| c["linear_value_head_dim"] = 32.into(),
        "linear_value_head_dim",
    );
    refused(&|c| c["layer_types"][0] = "mamba".into(), "layer_types");
}
