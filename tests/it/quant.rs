//! GGUF quant types end to end: tiny seeded models stored in every type Candor runs natively
//! (batch-size, neighbour and thread invariance of the decode, per type); teacher-forced
//! agreement with llama.cpp per architecture and type on tiny seeded models quantized by
//! llama-quantize (`tiny_teacher_forced.jsonl`), and per type on the default model
//! requantized by llama-quantize (behind `CANDOR_QUANT_MODELS`); see
//! `tests/fixtures/quant/README.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use candor::engine::{Decoder, NoText, SamplingParams, SchedulerConfig, TokenRequest};
use candor::model::runner::Model;
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;
use serde::Deserialize;

pub(crate) mod kquants;
pub(crate) mod mxfp4;

/// Every GGUF type with a native kernel.
const TYPES: [GgmlDType; 11] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::BF16,
    GgmlDType::F16,
    GgmlDType::F32,
];

const VOCAB: usize = 96;
/// A multiple of 256, so that the k-quants apply to every matrix.
const DIM: usize = 256;
const FFN: usize = 512;
const LAYERS: usize = 2;

pub(crate) fn q(v: Vec<f32>, shape: &[usize], dtype: GgmlDType) -> QTensor {
    let t = Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor");
    QTensor::quantize(&t, dtype).expect("quantize")
}

/// Writes a random llama GGUF whose matrices (embedding included) are all `dtype`.
fn write_tiny(dir: &Path, dtype: GgmlDType, seed: u64) -> PathBuf {
    let mut rng = SplitMix64::new(seed);
    let mut random = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
            .collect()
    };
    let md = crate::util::llama_metadata(&crate::util::TinyShape {
        arch: "llama",
        layers: LAYERS,
        dim: DIM,
        ffn: FFN,
        heads: 4,
        kv_heads: 2,
        context: 256,
    });
    let kv_dim = DIM / 2;
    let mut tensors: Vec<(String, QTensor)> = vec![(
        "token_embd.weight".into(),
        q(random(VOCAB * DIM, 1.0), &[VOCAB, DIM], dtype),
    )];
    for i in 0..LAYERS {
        for (s, n, k) in [
            ("attn_q", DIM, DIM),
            ("attn_k", kv_dim, DIM),
            ("attn_v", kv_dim, DIM),
            ("attn_output", DIM, DIM),
            ("ffn_gate", FFN, DIM),
            ("ffn_up", FFN, DIM),
            ("ffn_down", DIM, FFN),
        ] {
            let w = random(n * k, 1.5 / (k as f32).sqrt());
            tensors.push((format!("blk.{i}.{s}.weight"), q(w, &[n, k], dtype)));
        }
        for s in ["attn_norm", "ffn_norm"] {
            tensors.push((
                format!("blk.{i}.{s}.weight"),
                q(vec![1.0; DIM], &[DIM], GgmlDType::F32),
            ));
        }
    }
    tensors.push((
        "output_norm.weight".into(),
        q(vec![1.0; DIM], &[DIM], GgmlDType::F32),
    ));
    let path = dir.join(format!("tiny-{dtype:?}.gguf"));
    crate::util::write_gguf(&path, &md, &tensors);
    path
}

pub(crate) fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

/// The same requests give the same tokens on `model` at batch sizes 1, 3 and 16, with other
/// neighbours (reversed order) and on 1 or 2 threads (every fourth request samples, seeded).
pub(crate) fn assert_batch_invariant(model: &Path, vocab: usize, label: &str) {
    let model = Arc::new(Model::from(
        Transformer::from_gguf_path(model, WeightDType::Native)
            .unwrap_or_else(|e| panic!("{}: {e}", model.display())),
    ));
    let reqs = mixed_requests(16, 20, vocab);
    let run = |reqs: &[TokenRequest], bs: usize, threads: usize| {
        let cfg = SchedulerConfig {
            batch_size: bs,
            prefill_chunk: 7,
            max_step_tokens: 40,
            ..SchedulerConfig::default()
        };
        let mut dec = Decoder::new(Arc::clone(&model), cfg, Vec::new());
        pool(threads)
            .install(|| dec.generate(reqs, &NoText))
            .expect("generate")
            .into_iter()
            .map(|r| r.output_ids)
            .collect::<Vec<_>>()
    };
    let base = run(&reqs, 16, 2);
    assert!(base.iter().all(|o| o.len() == 12), "{label}");
    for (bs, threads) in [(1, 2), (3, 1), (16, 1)] {
        assert_eq!(run(&reqs, bs, threads), base, "{label} bs={bs} t={threads}");
    }
    let rev: Vec<TokenRequest> = reqs.iter().rev().cloned().collect();
    let mut got = run(&rev, 3, 2);
    got.reverse();
    assert_eq!(got, base, "{label} reversed neighbours");
    // Not all the same token: the model is doing something type-specific.
    let distinct: std::collections::BTreeSet<u32> = base.iter().flatten().copied().collect();
    assert!(distinct.len() > 3, "{label}: {distinct:?}");
}

/// Per quant type (on a llama model; every architecture in every type in
/// `teacher_forced_agreement_on_tiny_models_per_quant_type`): [`assert_batch_invariant`].
#[test]
fn tiny_models_of_every_quant_type_are_batch_invariant() {
    let dir = tempfile::tempdir().expect("tempdir");
    for dtype in TYPES {
        let path = write_tiny(dir.path(), dtype, 17);
        assert_batch_invariant(&path, VOCAB, &format!("{dtype:?}"));
    }
}

/// The tensor-type error names the tensor and the type.
#[test]
fn an_unsupported_type_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_tiny(dir.path(), GgmlDType::Q3K, 3);
    let err = match Transformer::from_gguf_path(&path, WeightDType::Native) {
        Ok(_) => panic!("Q3_K loaded"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("token_embd.weight") && err.contains("Q3K"),
        "{err}"
    );
}

#[derive(Deserialize)]
struct Reference {
    ids: Vec<u32>,
    start: usize,
}

#[derive(Deserialize)]
struct TypeRecord {
    /// The llama-quantize type name (e.g. `Q4_K_M`).
    ftype: String,
    /// The model file, relative to `CANDOR_QUANT_MODELS`.
    file: String,
    /// Per reference conversation: llama.cpp's argmax and top-1 minus top-2 logit gap.
    argmax: Vec<Vec<u32>>,
    top2_gap: Vec<Vec<f32>>,
    /// How many of `argmax` llama.cpp itself reproduces through its other execution paths.
    llama_cpp_paths: std::collections::BTreeMap<String, usize>,
}

pub(crate) fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn jsonl<T: for<'de> Deserialize<'de>>(path: &Path) -> Vec<T> {
    let text = std::fs::read_to_string(path).expect("committed fixture");
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Candor's teacher-forced argmax on `path` against llama.cpp's (`want`, with its top-2 gaps):
/// positions compared, agreeing, misses at a gap below 0.5, and Candor's argmaxes.
pub(crate) struct Agreement {
    pub(crate) total: usize,
    pub(crate) agree: usize,
    pub(crate) near: usize,
    /// llama.cpp's largest top-2 gap at a position where the two disagree.
    pub(crate) widest_miss: f32,
    pub(crate) dump: Vec<Vec<u32>>,
}

pub(crate) fn agreement(
    path: &Path,
    seqs: &[(&[u32], usize)],
    want: &[Vec<u32>],
    gaps: &[Vec<f32>],
) -> Agreement {
    let model = Arc::new(Model::from(
        Transformer::from_gguf_path(path, WeightDType::Native)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    ));
    let mut dec = Decoder::new(model, SchedulerConfig::default(), Vec::new());
    let mut a = Agreement {
        total: 0,
        agree: 0,
        near: 0,
        widest_miss: 0.0,
        dump: Vec::new(),
    };
    for ((ids, start), (want, gaps)) in seqs.iter().zip(want.iter().zip(gaps)) {
        let got = dec.next_token_argmax(ids, start - 1).expect("forward");
        let got = &got[..ids.len() - start];
        assert_eq!(got.len(), want.len(), "{}", path.display());
        a.dump.push(got.to_vec());
        for (k, (x, y)) in got.iter().zip(want).enumerate() {
            a.total += 1;
            if x == y {
                a.agree += 1;
                continue;
            }
            if gaps[k] < 0.5 {
                a.near += 1;
            }
            a.widest_miss = a.widest_miss.max(gaps[k]);
        }
    }
    a
}

/// Per quant type, Candor's teacher-forced next-token argmax on the default model against
/// llama.cpp's (`tests/fixtures/quant/teacher_forced.jsonl`), printed beside how many of them
/// llama.cpp itself reproduces through its other paths: at least 95% of positions, and every
/// miss at a top-2 gap below 1. Issue #7's 98% does not hold on this 30-layer model, for
/// llama.cpp's own paths either: one token per decode reproduces 95.3-99.7% per type and
/// misses at gaps up to 0.62 (Q6_K); Candor 95.6-99.9%, its widest miss at 0.69 (Q4_K_M);
/// `tests/fixtures/quant/README.md`.
/// Needs the requantized model files (`CANDOR_QUANT_MODELS=dir`, made by
/// `make_quant_reference.py`); a type whose file is absent there is skipped loudly, and at
/// least one must be present.
#[test]
#[ignore = "needs CANDOR_QUANT_MODELS (make_quant_reference.py); run with --ignored"]
fn teacher_forced_agreement_with_llama_cpp_per_quant_type() {
    let dir = crate::util::reference_dir(
        "CANDOR_QUANT_MODELS",
        "set it to the folder of tests/fixtures/quant/make_quant_reference.py's models",
    );
    let refs: Vec<Reference> = jsonl(&fixture("reference/teacher_forced.jsonl"));
    let types: Vec<TypeRecord> = jsonl(&fixture("quant/teacher_forced.jsonl"));
    assert!(types.len() >= 2, "{} types in the fixture", types.len());
    // CANDOR_QUANT_TYPES=Q4_0,Q8_0 runs only those fixture lines.
    let only: Option<Vec<String>> = std::env::var("CANDOR_QUANT_TYPES")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let mut report = Vec::new();
    for t in &types {
        if only.as_ref().is_some_and(|o| !o.contains(&t.ftype)) {
            continue;
        }
        let path = dir.join(&t.file);
        if !path.exists() {
            // make_quant_reference.py --quantizer gguf-py writes only some of the types.
            crate::util::absent(
                crate::util::Need::Reference,
                format!("{}: {} not found", t.ftype, path.display()),
            );
            continue;
        }
        assert_eq!(refs.len(), t.argmax.len(), "{}", t.ftype);
        let seqs: Vec<(&[u32], usize)> = refs.iter().map(|r| (&r.ids[..], r.start)).collect();
        let Agreement {
            total,
            agree,
            near,
            dump,
            widest_miss,
        } = agreement(&path, &seqs, &t.argmax, &t.top2_gap);
        let line = format!(
            "{}: {agree}/{total} ({:.2}%) agree with llama.cpp (its own other paths: {:?}); {near} of {} misses at top2_gap < 0.5, the widest at {widest_miss:.3}",
            t.ftype,
            100.0 * agree as f64 / total as f64,
            t.llama_cpp_paths,
            total - agree
        );
        println!("{line}");
        // CANDOR_QUANT_DUMP=dir writes Candor's argmaxes (`{ftype}.json`) for comparisons.
        if let Some(d) = std::env::var_os("CANDOR_QUANT_DUMP") {
            let f = PathBuf::from(d).join(format!("{}.json", t.ftype));
            std::fs::write(&f, serde_json::to_string(&dump).expect("json")).expect("dump");
        }
        report.push((agree as f64 / total as f64, widest_miss, line));
    }
    assert!(
        !report.is_empty(),
        "none of the fixture's model files in {}",
        dir.display()
    );
    for (rate, widest, line) in report {
        assert!(rate >= 0.95, "{line}: below 95%");
        assert!(widest < 1.0, "{line}: a miss at a top-2 gap of 1 or more");
    }
}

#[derive(Deserialize)]
pub(crate) struct TinySequences {
    pub(crate) start: usize,
    pub(crate) sequences: Vec<Vec<u32>>,
}

impl TinySequences {
    /// Each sequence with its first predicted position.
    pub(crate) fn seqs(&self) -> Vec<(&[u32], usize)> {
        self.sequences
            .iter()
            .map(|s| (&s[..], self.start))
            .collect()
    }
}

#[derive(Deserialize)]
pub(crate) struct TinyTypeRecord {
    pub(crate) arch: String,
    pub(crate) ftype: String,
    /// The first 16 hex digits of the sha256 of every tensor as llama-quantize stored it.
    pub(crate) tensors: std::collections::BTreeMap<String, String>,
    pub(crate) argmax: Vec<Vec<u32>>,
    pub(crate) top2_gap: Vec<Vec<f32>>,
    /// How many of `argmax` llama.cpp itself reproduces through its other execution paths
    /// (`one_token_per_decode`, `no_repack`).
    llama_cpp_paths: std::collections::BTreeMap<String, usize>,
}

/// A tensor of a tiny model: name, shape, f32 values.
pub(crate) type TinyTensor = (String, Vec<usize>, Vec<f32>);

/// `make_tiny_quant_reference.py`'s models: 256 wide, 4 layers (gemma3: 6, five sliding
/// then a global one), 4 heads / 2 KV heads, FFN 512, 96 tokens.
const TQ_DIM: usize = 256;
const TQ_FFN: usize = 512;
pub(crate) const TQ_VOCAB: usize = 96;
const TQ_HEADS: usize = 4;
const TQ_KV_HEADS: usize = 2;

fn tq_layers(arch: &str) -> usize {
    if arch == "gemma3" {
        6
    } else {
        4
    }
}

/// Draws a tiny model's tensors in order from one `SplitMix64` stream, as the script does.
pub(crate) struct Draw {
    pub(crate) rng: SplitMix64,
    pub(crate) out: Vec<TinyTensor>,
}

impl Draw {
    /// `(next_f64() as f32 * 2 - 1) * scale`, plus `offset` when given, in f32.
    pub(crate) fn add(&mut self, name: String, shape: Vec<usize>, scale: f32, offset: Option<f32>) {
        let n = shape.iter().product();
        let v = (0..n)
            .map(|_| {
                let x = (self.rng.next_f64() as f32 * 2.0 - 1.0) * scale;
                offset.map_or(x, |o| o + x)
            })
            .collect();
        self.out.push((name, shape, v));
    }

    /// An `n × k` matrix, uniform in ±1.5/√k.
    pub(crate) fn mat(&mut self, name: String, n: usize, k: usize) {
        self.add(name, vec![n, k], 1.5f32 / (k as f32).sqrt(), None);
    }

    /// A norm weight, 1 + 0.1 · uniform.
    pub(crate) fn norm(&mut self, name: String, n: usize) {
        self.add(name, vec![n], 0.1, Some(1.0));
    }
}

/// The tensors of `make_tiny_quant_reference.py`'s `tensors(arch)`, drawn in the same order
/// from the same `SplitMix64` stream (seed 7) by the same f32 arithmetic.
pub(crate) fn tiny_tensors(arch: &str) -> Vec<TinyTensor> {
    let (d, f) = (TQ_DIM, TQ_FFN);
    let hd = d / TQ_HEADS;
    let kv = hd * TQ_KV_HEADS;
    let gemma = arch.starts_with("gemma");
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    let embd_scale = if gemma { 0.05 } else { 1.0 };
    w.add(
        "token_embd.weight".into(),
        vec![TQ_VOCAB, d],
        embd_scale,
        None,
    );
    for i in 0..tq_layers(arch) {
        let b = |s: &str| format!("blk.{i}.{s}");
        w.norm(b("attn_norm.weight"), d);
        if arch == "phi3" {
            w.mat(b("attn_qkv.weight"), d + 2 * kv, d);
        } else {
            w.mat(b("attn_q.weight"), d, d);
            w.mat(b("attn_k.weight"), kv, d);
            w.mat(b("attn_v.weight"), kv, d);
        }
        if arch == "qwen2" {
            w.add(b("attn_q.bias"), vec![d], 0.1, None);
            w.add(b("attn_k.bias"), vec![kv], 0.1, None);
            w.add(b("attn_v.bias"), vec![kv], 0.1, None);
        }
        if arch == "qwen3" || arch == "gemma3" {
            w.norm(b("attn_q_norm.weight"), hd);
            w.norm(b("attn_k_norm.weight"), hd);
        }
        w.mat(b("attn_output.weight"), d, d);
        if gemma {
            w.norm(b("post_attention_norm.weight"), d);
        }
        w.norm(b("ffn_norm.weight"), d);
        if arch == "phi3" {
            w.mat(b("ffn_up.weight"), 2 * f, d);
        } else {
            w.mat(b("ffn_gate.weight"), f, d);
            w.mat(b("ffn_up.weight"), f, d);
        }
        w.mat(b("ffn_down.weight"), d, f);
        if gemma {
            w.norm(b("post_ffw_norm.weight"), d);
        }
    }
    w.norm("output_norm.weight".into(), d);
    if !gemma {
        w.mat("output.weight".into(), TQ_VOCAB, d);
    }
    w.out
}

/// The GGUF metadata of `make_tiny_quant_reference.py`'s `arch` model (without its
/// vocabulary, which Candor's loader does not read for these ids-only tests).
pub(crate) fn tiny_metadata(
    arch: &'static str,
) -> Vec<(String, candle_core::quantized::gguf_file::Value)> {
    use candle_core::quantized::gguf_file::Value;
    let hd = (TQ_DIM / TQ_HEADS) as u32;
    let mut md = crate::util::llama_metadata(&crate::util::TinyShape {
        arch,
        layers: tq_layers(arch),
        dim: TQ_DIM,
        ffn: TQ_FFN,
        heads: TQ_HEADS,
        kv_heads: TQ_KV_HEADS,
        context: 256,
    });
    md.push((format!("{arch}.attention.key_length"), Value::U32(hd)));
    md.push((format!("{arch}.attention.value_length"), Value::U32(hd)));
    md.push((format!("{arch}.rope.dimension_count"), Value::U32(hd)));
    if arch == "gemma2" {
        md.push((format!("{arch}.attn_logit_softcapping"), Value::F32(50.0)));
        md.push((format!("{arch}.final_logit_softcapping"), Value::F32(30.0)));
    }
    if arch.starts_with("gemma") {
        md.push((format!("{arch}.attention.sliding_window"), Value::U32(32)));
    }
    md
}

pub(crate) fn ggml_type(name: &str) -> GgmlDType {
    match name {
        "Q4_0" => GgmlDType::Q4_0,
        "Q4_1" => GgmlDType::Q4_1,
        "Q5_0" => GgmlDType::Q5_0,
        "Q5_1" => GgmlDType::Q5_1,
        "Q8_0" => GgmlDType::Q8_0,
        "Q4_K" => GgmlDType::Q4K,
        "Q5_K" => GgmlDType::Q5K,
        "Q6_K" => GgmlDType::Q6K,
        "BF16" => GgmlDType::BF16,
        "F16" => GgmlDType::F16,
        "F32" => GgmlDType::F32,
        other => panic!("unknown type {other} in the fixture"),
    }
}

/// Per architecture (llama, qwen2, qwen3, phi3, gemma2, gemma3) and quant type, on tiny seeded
/// random models quantized by llama.cpp's own llama-quantize (`--pure`: every matrix in the
/// type; 256 wide, so the k-quants are the k-quants), Candor's teacher-forced argmax against
/// llama.cpp's (`tests/fixtures/quant/tiny_teacher_forced.jsonl`). Every model agrees at 98%
/// or more, or at least as well as llama.cpp's own other execution paths reproduce that
/// reference (the fewer of one token per decode and no repacked kernels: on gemma3 Q4_K,
/// llama.cpp's reference takes the repacked Q4_K `gemm`, whose summation order depends on a
/// row's place in the batch and so cannot be matched batch-invariantly); and every
/// disagreement is a near tie (llama.cpp's top-2 logit gap below 0.1). Random models have
/// many near ties (a quarter of the positions below 0.1 in f32), and each quantized matmul
/// rounds its input to 8 bits, so an ulp upstream sometimes moves an activation by a whole
/// step. The test draws the same weights as the script, quantizes them (with candle for the
/// legacy and float types, with `kquants`, llama-quantize's k-quant search, for Q4_K, Q5_K
/// and Q6_K) and first requires every tensor's bytes to hash as llama-quantize's did, so CI
/// runs the very 66 models llama.cpp ran, without llama.cpp or model files. Each model also
/// passes [`assert_batch_invariant`], so the contract holds for every architecture in every
/// type.
#[test]
fn teacher_forced_agreement_on_tiny_models_per_quant_type() {
    let (head, records) = tiny_fixture::<TinyTypeRecord>("quant/tiny_teacher_forced.jsonl");
    let seqs = head.seqs();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut weights: Option<(String, Vec<TinyTensor>)> = None;
    let mut report = Vec::new();
    for t in records {
        let arch: &'static str = ["llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"]
            .into_iter()
            .find(|a| *a == t.arch)
            .unwrap_or_else(|| panic!("unknown arch {} in the fixture", t.arch));
        if weights.as_ref().is_none_or(|(a, _)| a != arch) {
            weights = Some((arch.to_string(), tiny_tensors(arch)));
        }
        let (_, ws) = weights.as_ref().expect("weights");
        let dtype = ggml_type(&t.ftype);
        let mut tensors = Vec::with_capacity(ws.len());
        for (name, shape, v) in ws {
            let qt = match dtype {
                // llama-quantize leaves vectors (norms, biases) in F32.
                _ if shape.len() == 1 => q(v.clone(), shape, GgmlDType::F32),
                // candle's k-quant quantizers search differently from llama-quantize's.
                GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K => {
                    kquants::quantize(v, shape, dtype)
                }
                _ => q(v.clone(), shape, dtype),
            };
            let want = t
                .tensors
                .get(name)
                .unwrap_or_else(|| panic!("{arch} {}: no {name}", t.ftype));
            assert_eq!(
                &hash16(&qt),
                want,
                "{arch} {} {name}: the test's bytes are not llama-quantize's",
                t.ftype
            );
            tensors.push((name.clone(), qt));
        }
        assert_eq!(
            tensors.len(),
            t.tensors.len(),
            "{arch} {}: tensor count",
            t.ftype
        );
        let file = dir.path().join(format!("tiny-{arch}-{}.gguf", t.ftype));
        crate::util::write_gguf(&file, &tiny_metadata(arch), &tensors);
        assert_batch_invariant(&file, TQ_VOCAB, &format!("tiny {arch} {}", t.ftype));
        let a = agreement(&file, &seqs, &t.argmax, &t.top2_gap);
        let label = format!("tiny {arch} {}", t.ftype);
        report.push(Verdict::new(&label, &a, &t.llama_cpp_paths));
        std::fs::remove_file(&file).ok();
    }
    assert_eq!(report.len(), 6 * 11, "models in the fixture");
    assert_verdicts(&report, 0.1);
}

/// A mutation check's verdict: the model `label` with something taken away, compared with
/// llama.cpp's argmax (`a`), must fail what [`assert_verdicts`] requires: below 98% (llama.cpp's
/// own paths reach 880/880 on F32) with a miss that is no near tie (a top-2 gap of 0.1 or more).
pub(crate) fn assert_disagrees(label: &str, a: &Agreement) {
    println!(
        "{label}: {}/{}, the widest miss at a gap of {:.3}",
        a.agree, a.total, a.widest_miss
    );
    assert!(
        a.agree * 50 < a.total * 49 && a.widest_miss >= 0.1,
        "{label}: {}/{}, widest {}",
        a.agree,
        a.total,
        a.widest_miss
    );
}

/// `n` token ids below [`TQ_VOCAB`] from a `SplitMix64` stream of seed `seed`.
pub(crate) fn random_ids(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() % TQ_VOCAB as u64) as u32)
        .collect()
}

/// A tiny-model fixture of `make_tiny_*_reference.py`: its first line (the sequences), then
/// one record per model and type.
pub(crate) fn tiny_fixture<T: for<'de> Deserialize<'de>>(rel: &str) -> (TinySequences, Vec<T>) {
    let path = fixture(rel);
    let text = std::fs::read_to_string(&path).expect("fixture");
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let (_, first) = lines.next().expect("sequences line");
    let head: TinySequences = serde_json::from_str(first).expect("sequences");
    let records = lines
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect();
    (head, records)
}

/// The first 16 hex digits of the sha256 of a tensor's stored bytes (the fixtures' hashes).
pub(crate) fn hash16(qt: &QTensor) -> String {
    hash16_bytes(&qt.data().expect("tensor bytes"))
}

/// The first 16 hex digits of the SHA-256 of `bytes` (the fixtures' tensor hashes).
pub(crate) fn hash16_bytes(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(bytes))[..16].to_string()
}

/// One tiny model's agreement with llama.cpp, with how many positions llama.cpp's own other
/// paths reproduce, and the line that says it (printed).
pub(crate) struct Verdict {
    agree: usize,
    total: usize,
    own: usize,
    widest: f32,
    line: String,
}

impl Verdict {
    pub(crate) fn new(label: &str, a: &Agreement, paths: &BTreeMap<String, usize>) -> Verdict {
        let own = paths
            .values()
            .copied()
            .min()
            .unwrap_or_else(|| panic!("{label}: no llama_cpp_paths"));
        let line = format!(
            "{label}: {}/{} ({:.2}%) agree with llama.cpp (its own other paths: {paths:?}); {} of {} misses at top2_gap < 0.5, the widest at {:.3}",
            a.agree,
            a.total,
            100.0 * a.agree as f64 / a.total as f64,
            a.near,
            a.total - a.agree,
            a.widest_miss
        );
        println!("{line}");
        Verdict {
            agree: a.agree,
            total: a.total,
            own,
            widest: a.widest_miss,
            line,
        }
    }
}

/// Every model agrees at 98% or more, or at least as well as llama.cpp's own other paths, and
/// misses only where llama.cpp's top-2 gap is below `near`.
pub(crate) fn assert_verdicts(report: &[Verdict], near: f32) {
    let at_98 = report
        .iter()
        .filter(|r| r.agree * 50 >= r.total * 49)
        .count();
    println!("{at_98} of {} models agree at >= 98%", report.len());
    for v in report {
        assert!(
            v.agree * 50 >= v.total * 49 || v.agree >= v.own,
            "{}: below 98% and below llama.cpp's own other paths ({})",
            v.line,
            v.own
        );
        assert!(
            v.widest < near,
            "{}: a miss where llama.cpp's top-2 gap is not a near tie",
            v.line
        );
    }
}

/// `n` seeded random requests of 3 to `3 + spread - 1` tokens below `vocab`, 12 new tokens
/// each; every fourth samples (temperature 0.8, top-p 0.95, its own seed), the others greedy.
pub fn mixed_requests(n: usize, spread: u64, vocab: usize) -> Vec<TokenRequest> {
    let mut rng = SplitMix64::new(5);
    (0..n)
        .map(|i| {
            let len = 3 + (rng.next_u64() % spread) as usize;
            let ids = (0..len)
                .map(|_| (rng.next_u64() % vocab as u64) as u32)
                .collect();
            let (temperature, top_p) = if i % 4 == 3 { (0.8, 0.95) } else { (0.0, 1.0) };
            TokenRequest::new(
                ids,
                SamplingParams {
                    temperature,
                    top_p,
                    seed: 100 + i as u64,
                    max_new_tokens: 12,
                    ..SamplingParams::default()
                },
            )
        })
        .collect()
}

/// A GGUF written by llama.cpp's own gguf-py (`tests/fixtures/quant/tiny_mxfp4.gguf`,
/// `make_tiny_mxfp4.py`) with a 3-d MXFP4 expert tensor between two F32 ones opens through
/// the public API; the tests' quantizer (`quant/mxfp4.rs`) gives the file's blocks from the
/// source values; the weight decodes to gguf-py's dequantized values bit for bit, per expert
/// too; and each output row is the same alone as in a batch.
#[test]
fn mxfp4_expert_tensor_written_by_gguf_py_loads_and_multiplies() {
    use candor::model::quant::QWeight;
    use candor::weights::gguf::GgufFile;
    use candor::weights::stored::StoredType;
    let f = GgufFile::open(&fixture("quant/tiny_mxfp4.gguf")).expect("opens");
    let f32_tensor = |name: &str| -> Vec<f32> {
        let (stored, m) = f.mapped_stored(name, &[16, 64]).expect("f32 tensor");
        assert_eq!(stored, StoredType::Ggml(GgmlDType::F32));
        m.bytes()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4")))
            .collect()
    };
    let (src, deq) = (f32_tensor("src.weight"), f32_tensor("deq.weight"));
    let name = "blk.0.ffn_up_exps.weight";
    let (stored, m) = f.mapped_stored(name, &[2, 8, 64]).expect("MXFP4 tensor");
    assert_eq!(stored, StoredType::Mxfp4);
    assert!(
        mxfp4::quantize(&src) == m.bytes(),
        "the tests' quantizer differs from gguf-py's"
    );
    // Expert 1 alone (as the MoE loader slices a 3-d tensor), then the whole as 16 rows.
    let per = m.bytes().len() / 2;
    let e1 = QWeight::from_stored_bytes(stored, 8, 64, &m.bytes()[per..]).expect("expert 1");
    let w = QWeight::from_stored(stored, 16, 64, m).expect("16 × 64");
    let mut row = vec![0f32; 64];
    for r in 0..16 {
        w.row_f32(r, &mut row);
        let want = &deq[r * 64..(r + 1) * 64];
        assert!(
            row.iter()
                .zip(want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "row {r} differs from gguf-py's dequantize"
        );
        if r >= 8 {
            let mut erow = vec![0f32; 64];
            e1.row_f32(r - 8, &mut erow);
            assert_eq!(erow, row, "expert 1 row {}", r - 8);
        }
    }
    let x: Vec<f32> = (0..5 * 64)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let mut all = vec![0f32; 5 * 16];
    w.matmul(&x, 5, &mut all);
    for i in 0..5 {
        let mut alone = vec![0f32; 16];
        w.matmul(&x[i * 64..(i + 1) * 64], 1, &mut alone);
        assert_eq!(&all[i * 16..(i + 1) * 16], &alone[..], "row {i}");
    }
}
