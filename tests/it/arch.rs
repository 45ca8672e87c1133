//! Every architecture against a float reference, and the batch-invariance contract per
//! architecture.
//!
//! The fixtures under `tests/fixtures/tiny/<arch>/` are tiny random-weight checkpoints and
//! transformers' f32 greedy continuations, written by `tests/reference/make_tiny.py`. Greedy
//! decoding in f32 must give the reference's tokens, except after a step whose reference
//! top-2 logit gap is below 0.01 (there float noise may legitimately flip the choice). With
//! `CANDOR_TINY_GGUF=<dir>` the same checks also run on the GGUF files that script converts
//! with llama.cpp's `convert_hf_to_gguf.py` (`<dir>/<arch>-f32.gguf`).

use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::Device;

use candor::model::checkpoint::Checkpoint;
use candor::model::kv::{KvSeq, Logits, SeqStep};
use candor::model::transformer::{Scratch, Transformer, WeightDType};
use candor::weights::gguf::GgufFile;

const ARCHS: &[&str] = &[
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
];

/// A plain growable KV store, with a hybrid model's recurrent state.
struct VecKv {
    kv_dim: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    state: Vec<f32>,
}

impl VecKv {
    fn new(model: &Transformer) -> VecKv {
        let c = model.config();
        VecKv {
            kv_dim: c.kv_dim(),
            keys: vec![Vec::new(); c.n_layer],
            values: vec![Vec::new(); c.n_layer],
            len: 0,
            state: vec![0.0; model.state_len()],
        }
    }
}

impl KvSeq for VecKv {
    fn len(&self) -> usize {
        self.len
    }
    fn grow(&mut self, n: usize) {
        self.len += n;
        for l in 0..self.keys.len() {
            self.keys[l].resize(self.len * self.kv_dim, 0.0);
            self.values[l].resize(self.len * self.kv_dim, 0.0);
        }
    }
    fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) {
        let d = self.kv_dim;
        self.keys[layer][pos * d..(pos + 1) * d].copy_from_slice(key);
        self.values[layer][pos * d..(pos + 1) * d].copy_from_slice(value);
    }
    fn key(&self, layer: usize, pos: usize) -> &[f32] {
        &self.keys[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }
    fn value(&self, layer: usize, pos: usize) -> &[f32] {
        &self.values[layer][pos * self.kv_dim..(pos + 1) * self.kv_dim]
    }
    fn state(&self) -> &[f32] {
        &self.state
    }
    fn state_mut(&mut self) -> &mut [f32] {
        &mut self.state
    }
}

pub(crate) fn fixture(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny")
        .join(arch)
}

pub(crate) fn load_checkpoint(arch: &str) -> Transformer {
    let mut ck = Checkpoint::open(&fixture(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"));
    Transformer::from_checkpoint(&mut ck, WeightDType::F32)
        .unwrap_or_else(|e| panic!("{arch}: {e}"))
}

struct Run {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    gaps: Vec<f64>,
    last_logits: Vec<f64>,
}

fn reference(arch: &str) -> Vec<Run> {
    let text = std::fs::read_to_string(fixture(arch).join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let nums = |x: &serde_json::Value| -> Vec<f64> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_f64().unwrap())
            .collect()
    };
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Run {
            prompt: nums(&r["prompt"]).into_iter().map(|x| x as u32).collect(),
            tokens: nums(&r["tokens"]).into_iter().map(|x| x as u32).collect(),
            gaps: nums(&r["gaps"]),
            last_logits: nums(&r["last_logits"]),
        })
        .collect()
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy decoding of `n` tokens; also returns the prompt's last-position logits.
fn greedy(model: &Transformer, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut kv = VecKv::new(model);
    let mut scratch = Scratch::default();
    let mut out = Vec::new();
    let mut first = Vec::new();
    let mut next: Vec<u32> = prompt.to_vec();
    for step in 0..n {
        let logits = model.forward(
            &mut [SeqStep {
                tokens: &next,
                kv: &mut kv,
                logits: Logits::Last,
            }],
            &mut scratch,
        );
        if step == 0 {
            first = logits.to_vec();
        }
        let t = argmax(logits);
        out.push(t);
        next = vec![t];
    }
    (out, first)
}

/// Checks greedy agreement with the reference; returns (agreeing steps, compared steps).
pub(crate) fn check_against_reference(
    arch: &str,
    model: &Transformer,
    what: &str,
) -> (usize, usize) {
    let (mut agree, mut total) = (0, 0);
    for (i, run) in reference(arch).iter().enumerate() {
        let (tokens, logits) = greedy(model, &run.prompt, run.tokens.len());
        let max_diff = logits
            .iter()
            .zip(&run.last_logits)
            .map(|(&a, &b)| (a as f64 - b).abs())
            .fold(0.0, f64::max);
        eprintln!("{arch} ({what}) prompt {i}: last-position logits within {max_diff:.2e}");
        assert!(
            max_diff < 1e-3,
            "{arch} ({what}) prompt {i}: last-position logits differ from transformers by {max_diff}"
        );
        for (s, (&ours, &theirs)) in tokens.iter().zip(&run.tokens).enumerate() {
            total += 1;
            if ours == theirs {
                agree += 1;
                continue;
            }
            let close = run.gaps[..=s].iter().any(|&g| g < 0.01);
            assert!(
                close,
                "{arch} ({what}) prompt {i} step {s}: greedy token {ours}, transformers {theirs} \
                 (gaps so far {:?})",
                &run.gaps[..=s]
            );
            break;
        }
    }
    eprintln!("{arch} ({what}): {agree}/{total} greedy steps identical to transformers f32");
    (agree, total)
}

#[test]
fn every_architecture_matches_transformers_greedy() {
    let only = std::env::var("CANDOR_ARCH").ok();
    for arch in ARCHS
        .iter()
        .filter(|a| only.as_deref().is_none_or(|o| o == **a))
    {
        let model = load_checkpoint(arch);
        assert_eq!(model.config().architecture, *arch);
        check_against_reference(arch, &model, "checkpoint");
    }
}

#[test]
#[ignore = "needs CANDOR_TINY_GGUF (make_tiny.py --gguf); run with --ignored"]
fn gguf_conversions_match_transformers_greedy() {
    let dir = crate::util::reference_dir(
        "CANDOR_TINY_GGUF",
        "set it to the output of tests/reference/make_tiny.py --gguf",
    );
    // convert_hf_to_gguf.py writes Mistral as `llama` without its sliding window (llama.cpp
    // runs it with full attention), so the transformers reference does not apply to it.
    for arch in ARCHS.iter().filter(|a| **a != "mistral") {
        let path = Path::new(&dir).join(format!("{arch}-f32.gguf"));
        let mut file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let model = Transformer::from_gguf(&mut file, WeightDType::F32)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        check_against_reference(arch, &model, "gguf");
    }
}

/// Whether two sets of logits (as [`packed_logits`] returns them) are equal bit for bit.
pub(crate) fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
        })
}

/// Logits of every prompt token for each prompt, run with the prompts packed `batch` at a
/// time, prefilled in chunks of `chunk` tokens.
pub(crate) fn packed_logits(
    model: &Transformer,
    prompts: &[Vec<u32>],
    batch: usize,
    chunk: usize,
) -> Vec<Vec<f32>> {
    let c = model.config();
    let v = c.vocab_size;
    let mut all = vec![Vec::new(); prompts.len()];
    let mut scratch = Scratch::default();
    for (g, group) in prompts.chunks(batch).enumerate() {
        let mut kvs: Vec<VecKv> = group.iter().map(|_| VecKv::new(model)).collect();
        let longest = group.iter().map(Vec::len).max().unwrap();
        let mut start = 0;
        while start < longest {
            let mut steps = Vec::new();
            let mut owners = Vec::new();
            for (i, (p, kv)) in group.iter().zip(kvs.iter_mut()).enumerate() {
                if start < p.len() {
                    let end = (start + chunk).min(p.len());
                    steps.push(SeqStep {
                        tokens: &p[start..end],
                        kv,
                        logits: Logits::All,
                    });
                    owners.push((g * batch + i, end - start));
                }
            }
            let logits = model.forward(&mut steps, &mut scratch);
            let mut off = 0;
            for (who, n) in owners {
                all[who].extend_from_slice(&logits[off..off + n * v]);
                off += n * v;
            }
            start += chunk;
        }
    }
    all
}

#[test]
fn every_architecture_is_batch_invariant() {
    // 16 prompts of different lengths (2..=33), so batches mix lengths and sliding windows.
    let prompts: Vec<Vec<u32>> = (0..16u32)
        .map(|i| {
            (0..2 + 2 * i)
                .map(|j| (7 + 31 * i + 13 * j) % 500 + 3)
                .collect()
        })
        .collect();
    for arch in ARCHS {
        let model = load_checkpoint(arch);
        let one = packed_logits(&model, &prompts, 1, 64);
        for (batch, chunk) in [(3, 64), (16, 64), (16, 5), (1, 1)] {
            let other = packed_logits(&model, &prompts, batch, chunk);
            for (i, (a, b)) in one.iter().zip(&other).enumerate() {
                let same =
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{arch}: prompt {i} logits differ between batch 1 and batch {batch} (chunk {chunk})"
                );
            }
        }
        // Thread count: one thread against the default pool.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let single = pool.install(|| packed_logits(&model, &prompts, 16, 64));
        assert!(
            single
                .iter()
                .flatten()
                .zip(one.iter().flatten())
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{arch}: logits depend on the thread count"
        );
    }
}

/// Candor's tokenizer against llama.cpp's `llama-tokenize` on real vocabularies: with
/// `CANDOR_TOKENIZER_GGUFS=<dir>` holding `<name>.gguf` (vocab-only conversions) and the
/// `<name>.expected.jsonl` that `tests/reference/tokenizer_agreement.py` writes.
#[test]
#[ignore = "needs CANDOR_TOKENIZER_GGUFS (tests/reference/tokenizer_agreement.py); run with --ignored"]
fn tokenizer_agreement_with_llama_cpp() {
    let dir = crate::util::reference_dir(
        "CANDOR_TOKENIZER_GGUFS",
        "see tests/reference/tokenizer_agreement.py",
    );
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    names.sort();
    let mut failures = Vec::new();
    for gguf in names {
        let expected = gguf.with_extension("expected.jsonl");
        let Ok(text) = std::fs::read_to_string(&expected) else {
            continue;
        };
        let tok = candor::text::tokenizer::Tokenizer::from_gguf_file(&gguf)
            .unwrap_or_else(|e| panic!("{}: {e}", gguf.display()));
        let (mut same, mut total) = (0, 0);
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let sample = v["text"].as_str().unwrap();
            let want: Vec<u32> = v["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(sample).unwrap();
            total += 1;
            if got == want {
                same += 1;
            } else {
                failures.push(format!(
                    "{}: {sample:?}: candor {got:?}, llama.cpp {want:?}",
                    gguf.display()
                ));
            }
        }
        eprintln!(
            "{}: {same}/{total} samples tokenized identically to llama.cpp",
            gguf.file_name().unwrap().to_string_lossy()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The GGUF metadata llama.cpp's `convert_hf_to_gguf.py` writes for a fixture's
/// `config.json` (`conversion/{llama,qwen,gemma,phi}.py`), written out by hand per
/// architecture, so that the two readers are checked against the converter's choices rather
/// than against each other's code. Mistral is written under Candor's own `mistral` name
/// with its window (the converter writes it as `llama` without one).
fn converted_metadata(arch: &str, hf: &serde_json::Value) -> Vec<(String, Value)> {
    let u = |k: &str| Value::U32(hf[k].as_u64().unwrap_or_else(|| panic!("{arch}: {k}")) as u32);
    let f = |k: &str| Value::F32(hf[k].as_f64().unwrap_or_else(|| panic!("{arch}: {k}")) as f32);
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (format!("{arch}.block_count"), u("num_hidden_layers")),
        (
            format!("{arch}.context_length"),
            u("max_position_embeddings"),
        ),
        (format!("{arch}.embedding_length"), u("hidden_size")),
        (
            format!("{arch}.feed_forward_length"),
            u("intermediate_size"),
        ),
        (
            format!("{arch}.attention.head_count"),
            u("num_attention_heads"),
        ),
        (
            format!("{arch}.attention.head_count_kv"),
            u("num_key_value_heads"),
        ),
        (format!("{arch}.rope.freq_base"), f("rope_theta")),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            f("rms_norm_eps"),
        ),
    ];
    if hf["head_dim"].is_u64() {
        md.push((format!("{arch}.attention.key_length"), u("head_dim")));
        md.push((format!("{arch}.attention.value_length"), u("head_dim")));
    }
    match arch {
        "gemma2" => {
            md.push((
                format!("{arch}.attention.sliding_window"),
                u("sliding_window"),
            ));
            md.push((
                format!("{arch}.attn_logit_softcapping"),
                f("attn_logit_softcapping"),
            ));
            md.push((
                format!("{arch}.final_logit_softcapping"),
                f("final_logit_softcapping"),
            ));
        }
        "gemma3" => {
            md.push((
                format!("{arch}.attention.sliding_window"),
                u("sliding_window"),
            ));
            md.push((
                format!("{arch}.rope.freq_base_swa"),
                f("rope_local_base_freq"),
            ));
        }
        "mistral" => md.push((
            format!("{arch}.attention.sliding_window"),
            u("sliding_window"),
        )),
        // `sliding_window: null` is written as 0 (phi.py), which llama.cpp reads as none.
        "phi3" => md.push((format!("{arch}.attention.sliding_window"), Value::U32(0))),
        _ => {}
    }
    // YaRN as conversion/base.py writes it: type, factor, original context.
    let rs = &hf["rope_scaling"];
    if rs["rope_type"] == "yarn" {
        md.extend([
            (
                format!("{arch}.rope.scaling.type"),
                Value::String("yarn".into()),
            ),
            (
                format!("{arch}.rope.scaling.factor"),
                Value::F32(rs["factor"].as_f64().expect("factor") as f32),
            ),
            (
                format!("{arch}.rope.scaling.original_context_length"),
                Value::U32(
                    rs["original_max_position_embeddings"]
                        .as_u64()
                        .expect("orig") as u32,
                ),
            ),
        ]);
    }
    md
}

/// The configuration read back from a GGUF (written in `dir`) of the metadata the converter
/// makes of `hf` ([`converted_metadata`]) and an embedding of its shape.
fn converted_config(
    dir: &Path,
    arch: &str,
    hf: &serde_json::Value,
) -> candor::model::arch::ModelConfig {
    let vocab = hf["vocab_size"].as_u64().unwrap() as usize;
    let dim = hf["hidden_size"].as_u64().unwrap() as usize;
    let embd =
        candle_core::Tensor::zeros((vocab, dim), candle_core::DType::F32, &Device::Cpu).unwrap();
    let embd = candle_core::quantized::QTensor::quantize(&embd, GgmlDType::F32).unwrap();
    let path = dir.join(format!("{arch}.gguf"));
    crate::util::write_gguf(
        &path,
        &converted_metadata(arch, hf),
        &[("token_embd.weight".into(), embd)],
    );
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    candor::model::arch::ModelConfig::from_gguf(&content).unwrap_or_else(|e| panic!("{arch}: {e}"))
}

/// Each architecture's tiny model, read from its `config.json` and from the GGUF metadata the
/// converter makes of it, resolves to the same configuration field by field, except the two
/// fields that differ by format by design: the RoPE layout of Llama/Mistral (the converter
/// permutes q/k rows to rotate adjacent pairs) and Gemma's GELU (llama.cpp's f16 table).
#[test]
fn gguf_and_checkpoint_configs_agree_field_by_field() {
    use candor::model::arch::{Activation, ModelConfig};
    let dir = tempfile::tempdir().unwrap();
    for arch in ARCHS {
        let cfg_path = fixture(arch).join("config.json");
        let hf: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        let from_hf =
            ModelConfig::from_hf_config(&cfg_path, &hf).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let mut from_gguf = converted_config(dir.path(), arch, &hf);
        let adjacent = matches!(*arch, "llama" | "mistral");
        assert_eq!(from_gguf.rope_neox, !adjacent, "{arch}");
        assert!(from_hf.rope_neox, "{arch}");
        from_gguf.rope_neox = true;
        if arch.starts_with("gemma") {
            assert_eq!(from_gguf.activation, Activation::GeluTanhF16, "{arch}");
            assert_eq!(from_hf.activation, Activation::GeluTanh, "{arch}");
            from_gguf.activation = Activation::GeluTanh;
        }
        assert_eq!(
            from_gguf, from_hf,
            "{arch}: GGUF (left) and config.json (right) differ"
        );
    }
}

/// A `config.json`'s YaRN (`rope_scaling` of type `yarn`, as Qwen's model cards tell users to
/// add for long contexts) resolves to the configuration of the GGUF llama.cpp's converter makes
/// of it, for every architecture whose checkpoints and YaRN Candor reads (llama, qwen2, qwen3:
/// `tests/it/yarn.rs` holds their YaRN to llama.cpp's); a checkpoint's model loads with it and
/// its logits move; betas other than llama.cpp's defaults, a factor llama.cpp's loader would not
/// read, and YaRN on an architecture without it are refused, naming the key.
#[test]
fn a_checkpoints_yarn_is_the_converted_gguf_s() {
    use candor::model::arch::ModelConfig;
    let yarn = serde_json::json!({
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096
    });
    let dir = tempfile::tempdir().unwrap();
    for arch in ["llama", "qwen2", "qwen3"] {
        let cfg_path = fixture(arch).join("config.json");
        let mut hf: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        hf["rope_scaling"] = yarn.clone();
        let from_hf =
            ModelConfig::from_hf_config(&cfg_path, &hf).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(from_hf.yarn.is_some(), "{arch}: YaRN read");
        let mut from_gguf = converted_config(dir.path(), arch, &hf);
        from_gguf.rope_neox = from_hf.rope_neox;
        assert_eq!(
            from_gguf, from_hf,
            "{arch}: GGUF (left) and config.json (right) differ"
        );

        let ck = tempfile::tempdir().unwrap();
        let with = edited_checkpoint(ck.path(), arch, |c| c["rope_scaling"] = yarn.clone(), &[]);
        let mut c = Checkpoint::open(&with).unwrap();
        let model = Transformer::from_checkpoint(&mut c, WeightDType::F32)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let prompt: Vec<u32> = (0..24).map(|i| (i * 7 + 3) % 64).collect();
        let logits =
            |m: &Transformer| crate::arch::packed_logits(m, std::slice::from_ref(&prompt), 1, 24);
        assert_ne!(
            logits(&model),
            logits(&load_checkpoint(arch)),
            "{arch}: YaRN changes no logit"
        );
    }
    let refused = |arch: &str, rs: serde_json::Value| -> String {
        let ck = tempfile::tempdir().unwrap();
        let with = edited_checkpoint(ck.path(), arch, |c| c["rope_scaling"] = rs, &[]);
        match Checkpoint::open(&with) {
            Err(e) => e.to_string(),
            Ok(mut c) => match Transformer::from_checkpoint(&mut c, WeightDType::F32) {
                Ok(_) => panic!("{arch}: loaded"),
                Err(e) => e.to_string(),
            },
        }
    };
    let mut beta = yarn.clone();
    beta["beta_fast"] = 8.0.into();
    let e = refused("qwen3", beta);
    assert!(
        e.contains("rope_scaling.beta_fast") && e.contains('8'),
        "{e}"
    );
    let mut attn = yarn.clone();
    attn["attention_factor"] = 1.2.into();
    let e = refused("qwen2", attn);
    assert!(e.contains("rope_scaling.attention_factor"), "{e}");
    let e = refused("gemma2", yarn.clone());
    assert!(
        e.contains("rope_scaling") && e.contains("`yarn` is not supported"),
        "{e}"
    );
}

/// transformers 5 writes a config's RoPE as one `rope_parameters` object (per layer type for
/// Gemma 3), without `rope_theta`, `rope_scaling` or `rope_local_base_freq`. Each fixture's
/// config as transformers 5.24 writes it (`config.v5.json`, by
/// `tests/reference/make_v5_configs.py`, which also checks that transformers 5 reads the
/// checkpoint as the reference's model) resolves to the configuration of the fixture's own
/// `config.json`, and the checkpoint with it gives the same logits bit for bit (Llama's
/// llama3 frequency factors among them).
#[test]
fn a_transformers_5_config_is_read_as_the_same_model() {
    use candor::model::arch::ModelConfig;
    for arch in ARCHS {
        let json = |name: &str| -> serde_json::Value {
            let text = std::fs::read_to_string(fixture(arch).join(name)).unwrap();
            serde_json::from_str(&text).unwrap()
        };
        let v5 = json("config.v5.json");
        assert!(
            v5.get("rope_parameters").is_some() && v5.get("rope_theta").is_none(),
            "{arch}: not transformers 5's layout"
        );
        let read = |name: &str| {
            let path = fixture(arch).join(name);
            ModelConfig::from_hf_config(&path, &json(name))
                .unwrap_or_else(|e| panic!("{arch}: {e}"))
        };
        assert_eq!(read("config.v5.json"), read("config.json"), "{arch}");

        let d = tempfile::tempdir().unwrap();
        let ck = edited_checkpoint(d.path(), arch, |c| *c = v5, &[]);
        let mut c = Checkpoint::open(&ck).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let model = Transformer::from_checkpoint(&mut c, WeightDType::F32)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let prompt: Vec<u32> = (0..24).map(|i| (i * 7 + 3) % 64).collect();
        let logits =
            |m: &Transformer| crate::arch::packed_logits(m, std::slice::from_ref(&prompt), 1, 24);
        assert!(
            logits(&model) == logits(&load_checkpoint(arch)),
            "{arch}: the logits differ"
        );
    }
}

/// A copy of a fixture checkpoint with its `config.json` edited by `edit` and `extra` tensors
/// added to its safetensors.
pub(crate) fn edited_checkpoint(
    dir: &Path,
    arch: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    extra: &[&str],
) -> PathBuf {
    let src = fixture(arch);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    for name in extra {
        let t = candle_core::Tensor::ones(8, candle_core::DType::F32, &Device::Cpu).unwrap();
        tensors.insert(name.to_string(), t);
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    dir.to_path_buf()
}

#[test]
fn checkpoints_refuse_what_the_pass_would_ignore() {
    let load = |dir: &Path| -> String {
        match Checkpoint::open(dir) {
            Err(e) => e.to_string(),
            Ok(mut ck) => match Transformer::from_checkpoint(&mut ck, WeightDType::F32) {
                Err(e) => e.to_string(),
                Ok(_) => "loaded".into(),
            },
        }
    };
    // The unedited copy loads: what follows is refused for the edit alone.
    let d = tempfile::tempdir().unwrap();
    assert_eq!(
        load(&edited_checkpoint(d.path(), "llama", |_| {}, &[])),
        "loaded"
    );

    let d = tempfile::tempdir().unwrap();
    let ck = edited_checkpoint(
        d.path(),
        "llama",
        |_| {},
        &["model.layers.1.mlp.extra_norm.weight"],
    );
    let err = load(&ck);
    assert!(
        err.contains("model.layers.1.mlp.extra_norm.weight")
            && err.contains(&d.path().display().to_string())
            && !err.contains('\n'),
        "{err}"
    );

    type Edit = fn(&mut serde_json::Value);
    let cases: &[(&str, Edit, &str)] = &[
        (
            "llama",
            |c| c["tie_word_embeddings"] = false.into(),
            "loaded",
        ),
        (
            "qwen2",
            |c| c["tie_word_embeddings"] = false.into(),
            "lm_head.weight",
        ),
        (
            "llama",
            |c| c["sliding_window"] = 16.into(),
            "sliding_window",
        ),
        (
            "llama",
            |c| c["attn_logit_softcapping"] = 30.0.into(),
            "attn_logit_softcapping",
        ),
        (
            "qwen2",
            |c| c["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            "llama3",
        ),
        (
            "phi3",
            // LongRoPE runs the short factors at this context: they must be there.
            |c| c["rope_scaling"] = serde_json::json!({"type": "longrope", "long_factor": [1.0]}),
            "rope_scaling.short_factor",
        ),
        (
            "llama",
            |c| c["quantization_config"] = serde_json::json!({"quant_method": "gptq"}),
            "quantization_config",
        ),
    ];
    for (arch, edit, want) in cases {
        let d = tempfile::tempdir().unwrap();
        let err = load(&edited_checkpoint(d.path(), arch, edit, &[]));
        assert!(err.contains(want) && !err.contains('\n'), "{arch}: {err}");
        if *want != "loaded" {
            assert!(err.contains("config.json"), "{arch}: {err}");
        }
    }
}

#[test]
fn gguf_keys_that_change_the_arithmetic_are_refused_unless_read() {
    use candor::model::arch::ModelConfig;
    let cfg_path = fixture("llama").join("config.json");
    let hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    let embd =
        candle_core::Tensor::zeros((512, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let read = |extra: Vec<(String, Value)>| -> Result<(), String> {
        let mut md = converted_metadata("llama", &hf);
        md.extend(extra);
        let path = dir.path().join("m.gguf");
        crate::util::write_gguf(
            &path,
            &md,
            &[(
                "token_embd.weight".into(),
                candle_core::quantized::QTensor::quantize(&embd, GgmlDType::F32).unwrap(),
            )],
        );
        let mut file = std::fs::File::open(&path).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
        ModelConfig::from_gguf(&content)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    read(vec![]).unwrap();
    // Neutral values and keys that only inform are accepted.
    read(vec![
        ("llama.rope.scaling.attn_factor".into(), Value::F32(1.0)),
        ("llama.expert_count".into(), Value::U32(0)),
        ("llama.attention.sliding_window".into(), Value::U32(0)),
        (
            "llama.rope.scaling.original_context_length".into(),
            Value::U32(4096),
        ),
    ])
    .unwrap();
    for (key, value) in [
        ("llama.rope.scaling.yarn_ext_factor", Value::F32(1.0)),
        ("llama.attention.layer_norm_epsilon", Value::F32(1e-5)),
        ("llama.attention.scale", Value::F32(0.5)),
        ("llama.embedding_scale", Value::F32(12.0)),
        ("llama.attention.sliding_window", Value::U32(16)),
        ("llama.final_logit_softcapping", Value::F32(30.0)),
        ("llama.rope.scaling.attn_factor", Value::F32(1.19)),
    ] {
        let err = read(vec![(key.to_string(), value)]).unwrap_err();
        assert!(err.contains(key) && !err.contains('\n'), "{key}: {err}");
    }
    // YaRN is read for llama (`tests/it/yarn.rs`); a type Candor does not implement for llama
    // is refused, naming those it does.
    read(vec![(
        "llama.rope.scaling.type".into(),
        Value::String("yarn".into()),
    )])
    .unwrap();
    let err = read(vec![(
        "llama.rope.scaling.type".into(),
        Value::String("longrope".into()),
    )])
    .unwrap_err();
    assert!(
        err.contains("llama.rope.scaling.type") && err.contains("none, linear, yarn"),
        "{err}"
    );
}

/// Gemma 3 and Mistral Small 3.x as the Hub publishes them, image-text checkpoints
/// (`gemma3` with a `gemma3_text` language model, `mistral3` with a `mistral` one) in the
/// layout transformers 5 saves: the tiny models give their text-only checkpoints' logits bit
/// for bit, the vision tower and projector unread.
#[test]
fn image_text_checkpoints_are_read_as_their_language_models() {
    for (name, model_type, class) in [
        ("gemma3", "gemma3", "Gemma3ForConditionalGeneration"),
        ("mistral", "mistral3", "Mistral3ForConditionalGeneration"),
    ] {
        crate::hybrid::assert_image_text_layout_reads_the_text_model(name, model_type, class);
    }
}
