//! GGUF quant types end to end: tiny seeded models stored in every type Candor runs natively
//! (batch-size, neighbour and thread invariance of the decode, per type), and teacher-forced
//! agreement with llama.cpp per type on the default model requantized by llama-quantize
//! (behind `CANDOR_QUANT_MODELS`, see `tests/fixtures/quant/README.md`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use candor::engine::sampling::SplitMix64;
use candor::engine::{Decoder, NoText, SamplingParams, SchedulerConfig, TokenRequest};
use candor::model::llama::{Llama, WeightDType};
use candor::model::runner::Model;
use serde::Deserialize;

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

fn q(v: Vec<f32>, shape: &[usize], dtype: GgmlDType) -> QTensor {
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

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

/// Per quant type: the same requests give the same tokens at batch sizes 1, 3 and 16, with
/// other neighbours (reversed order) and on 1 or 2 threads.
#[test]
fn tiny_models_of_every_quant_type_are_batch_invariant() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = SplitMix64::new(5);
    let reqs: Vec<TokenRequest> = (0..16)
        .map(|i| {
            let len = 3 + (rng.next_u64() % 20) as usize;
            let ids = (0..len)
                .map(|_| (rng.next_u64() % VOCAB as u64) as u32)
                .collect();
            // Every fourth request samples (seeded); the others are greedy.
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
        .collect();
    for dtype in TYPES {
        let path = write_tiny(dir.path(), dtype, 17);
        let model = Arc::new(Model::from(
            Llama::from_gguf_path(&path, WeightDType::Native).expect("load"),
        ));
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
        assert!(base.iter().all(|o| o.len() == 12), "{dtype:?}");
        for (bs, threads) in [(1, 2), (3, 1), (16, 1)] {
            assert_eq!(
                run(&reqs, bs, threads),
                base,
                "{dtype:?} bs={bs} t={threads}"
            );
        }
        let rev: Vec<TokenRequest> = reqs.iter().rev().cloned().collect();
        let mut got = run(&rev, 3, 2);
        got.reverse();
        assert_eq!(got, base, "{dtype:?} reversed neighbours");
        // Not all the same token: the model is doing something type-specific.
        let distinct: std::collections::BTreeSet<u32> = base.iter().flatten().copied().collect();
        assert!(distinct.len() > 3, "{dtype:?}: {distinct:?}");
    }
}

/// The tensor-type error names the tensor and the type.
#[test]
fn an_unsupported_type_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_tiny(dir.path(), GgmlDType::Q3K, 3);
    let err = match Llama::from_gguf_path(&path, WeightDType::Native) {
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
    id: String,
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
}

fn fixture(rel: &str) -> PathBuf {
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

/// Per quant type, Candor's teacher-forced next-token argmax on the default model agrees with
/// llama.cpp's (`tests/fixtures/quant/teacher_forced.jsonl`) at ≥ 98% of positions. Needs the
/// requantized model files (`CANDOR_QUANT_MODELS=dir`, made by `make_quant_reference.py`); a
/// type whose file is absent there is skipped loudly, and at least one must be present.
#[test]
fn teacher_forced_agreement_with_llama_cpp_per_quant_type() {
    let Some(dir) = std::env::var_os("CANDOR_QUANT_MODELS").map(PathBuf::from) else {
        eprintln!("\n*** SKIPPED: set CANDOR_QUANT_MODELS to the folder of make_quant_reference.py's models ***\n");
        return;
    };
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
            eprintln!(
                "\n*** SKIPPED {}: {} not found ***\n",
                t.ftype,
                path.display()
            );
            continue;
        }
        let model = Arc::new(Model::from(
            Llama::from_gguf_path(&path, WeightDType::Native)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
        ));
        let mut dec = Decoder::new(model, SchedulerConfig::default(), Vec::new());
        let (mut total, mut agree, mut near) = (0, 0, 0);
        let mut dump = Vec::new();
        assert_eq!(refs.len(), t.argmax.len(), "{}", t.ftype);
        for (r, (want, gaps)) in refs.iter().zip(t.argmax.iter().zip(&t.top2_gap)) {
            let got = dec.next_token_argmax(&r.ids, r.start - 1).expect("forward");
            let got = &got[..r.ids.len() - r.start];
            dump.push(got.to_vec());
            assert_eq!(got.len(), want.len(), "{} {}", t.ftype, r.id);
            for (k, (a, b)) in got.iter().zip(want).enumerate() {
                total += 1;
                if a == b {
                    agree += 1;
                } else if gaps[k] < 0.5 {
                    near += 1;
                }
            }
        }
        let line = format!(
            "{}: {agree}/{total} ({:.2}%) agree with llama.cpp; {near} of {} misses at top2_gap < 0.5",
            t.ftype,
            100.0 * agree as f64 / total as f64,
            total - agree
        );
        println!("{line}");
        // CANDOR_QUANT_DUMP=dir writes Candor's argmaxes (`{ftype}.json`) for comparisons.
        if let Some(d) = std::env::var_os("CANDOR_QUANT_DUMP") {
            let f = PathBuf::from(d).join(format!("{}.json", t.ftype));
            std::fs::write(&f, serde_json::to_string(&dump).expect("json")).expect("dump");
        }
        report.push((t.ftype.clone(), agree as f64 / total as f64, line));
    }
    assert!(
        !report.is_empty(),
        "none of the fixture's model files in {}",
        dir.display()
    );
    for (ftype, rate, line) in report {
        assert!(rate >= 0.98, "{ftype}: {line}");
    }
}
