//! What loading a model costs in memory: about its file size, never an inflated copy (and for
//! a Mixture-of-Experts model, its experts not at all: they are read in place from panel files). A
//! seeded llama (40 M parameters) is written as a BF16 GGUF, a Q4_K GGUF, a Q8_0 GGUF and a
//! BF16 Hugging Face checkpoint; each is loaded in a child process (this test binary, running
//! the ignored `load_in_child`) that reports its `/proc/self/status` before and after the load.
//! Float weights must be read in place from the file's memory map (no anonymous copy), quantized
//! weights are repacked once into the kernels' panels and their mapped pages released.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use candor::engine::{Decoder, SchedulerConfig};
use candor::model::arch::TensorSource;
use candor::model::checkpoint::Checkpoint;
use candor::model::runner::Model;
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

const VOCAB: usize = 8192;
const DIM: usize = 1024;
/// A multiple of 256 (the k-quant block).
const FFN: usize = 2816;
const LAYERS: usize = 2;
const HEADS: usize = 8;
const KV_HEADS: usize = 4;
const MIB: u64 = 1024;

/// The model's matrices: GGUF name, Hugging Face name, shape.
fn matrices() -> Vec<(String, String, [usize; 2])> {
    let kv = DIM / HEADS * KV_HEADS;
    let mut out = vec![(
        "token_embd.weight".to_string(),
        "model.embed_tokens.weight".to_string(),
        [VOCAB, DIM],
    )];
    for i in 0..LAYERS {
        for (g, h, n, k) in [
            ("attn_q", "self_attn.q_proj", DIM, DIM),
            ("attn_k", "self_attn.k_proj", kv, DIM),
            ("attn_v", "self_attn.v_proj", kv, DIM),
            ("attn_output", "self_attn.o_proj", DIM, DIM),
            ("ffn_gate", "mlp.gate_proj", FFN, DIM),
            ("ffn_up", "mlp.up_proj", FFN, DIM),
            ("ffn_down", "mlp.down_proj", DIM, FFN),
        ] {
            out.push((
                format!("blk.{i}.{g}.weight"),
                format!("model.layers.{i}.{h}.weight"),
                [n, k],
            ));
        }
    }
    out.push((
        "output.weight".to_string(),
        "lm_head.weight".to_string(),
        [VOCAB, DIM],
    ));
    out
}

/// The norms: GGUF name, Hugging Face name.
fn norms() -> Vec<(String, String)> {
    let mut out = vec![(
        "output_norm.weight".to_string(),
        "model.norm.weight".to_string(),
    )];
    for i in 0..LAYERS {
        out.push((
            format!("blk.{i}.attn_norm.weight"),
            format!("model.layers.{i}.input_layernorm.weight"),
        ));
        out.push((
            format!("blk.{i}.ffn_norm.weight"),
            format!("model.layers.{i}.post_attention_layernorm.weight"),
        ));
    }
    out
}

/// Writes the seeded model as GGUF files of the given types and as a BF16 checkpoint folder.
fn write_models(dir: &Path, types: &[GgmlDType]) -> (Vec<PathBuf>, PathBuf) {
    let mut rng = SplitMix64::new(7);
    let mut ggufs: Vec<Vec<(String, QTensor)>> = types.iter().map(|_| Vec::new()).collect();
    let mut hf: HashMap<String, Tensor> = HashMap::new();
    for (g, h, [n, k]) in matrices() {
        let scale = 1.5 / (k as f32).sqrt();
        let v: Vec<f32> = (0..n * k)
            .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
            .collect();
        let t = Tensor::from_vec(v, (n, k), &Device::Cpu).expect("tensor");
        for (file, &dtype) in ggufs.iter_mut().zip(types) {
            file.push((g.clone(), QTensor::quantize(&t, dtype).expect("quantize")));
        }
        hf.insert(h, t.to_dtype(DType::BF16).expect("bf16"));
    }
    for (g, h) in norms() {
        let t = Tensor::ones(DIM, DType::F32, &Device::Cpu).expect("ones");
        for file in ggufs.iter_mut() {
            file.push((
                g.clone(),
                QTensor::quantize(&t, GgmlDType::F32).expect("f32"),
            ));
        }
        hf.insert(h, t.to_dtype(DType::BF16).expect("bf16"));
    }
    let md = crate::util::llama_metadata(&crate::util::TinyShape {
        arch: "llama",
        layers: LAYERS,
        dim: DIM,
        ffn: FFN,
        heads: HEADS,
        kv_heads: KV_HEADS,
        context: 256,
    });
    let mut paths = Vec::new();
    for (tensors, dtype) in ggufs.iter().zip(types) {
        let path = dir.join(format!("memory-{dtype:?}.gguf"));
        crate::util::write_gguf(&path, &md, tensors);
        paths.push(path);
    }
    let ck = dir.join("checkpoint-bf16");
    std::fs::create_dir_all(&ck).expect("mkdir");
    candle_core::safetensors::save(&hf, ck.join("model.safetensors")).expect("safetensors");
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": DIM,
        "intermediate_size": FFN,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "vocab_size": VOCAB,
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    std::fs::write(ck.join("config.json"), config.to_string()).expect("config");
    (paths, ck)
}

/// `/proc/self/status` fields in kB (VmRSS, RssAnon, RssFile, VmHWM).
fn status() -> HashMap<String, u64> {
    let text = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let kb = v.trim().strip_suffix(" kB")?.trim().parse().ok()?;
            Some((k.to_string(), kb))
        })
        .collect()
}

/// The child: loads `CANDOR_MEMORY_CHILD` (a GGUF file or a checkpoint folder) natively and
/// prints one `MEMORY {...}` line with its memory before and after the load.
#[test]
#[ignore = "child process of memory_after_load_is_about_the_file_size; run by it with --ignored --exact"]
fn load_in_child() {
    let path = std::env::var_os("CANDOR_MEMORY_CHILD")
        .map(PathBuf::from)
        .expect(
        "the child process of memory_after_load_is_about_the_file_size: needs CANDOR_MEMORY_CHILD",
    );
    let before = status();
    let model = if path.is_dir() {
        let mut ck = Checkpoint::open(&path).expect("checkpoint");
        let config = ck.config().clone();
        let src: &mut dyn TensorSource = &mut ck;
        Transformer::from_source(config, src, WeightDType::Native).expect("load")
    } else {
        Transformer::from_gguf_path(&path, WeightDType::Native).expect("load")
    };
    let loaded = status();
    let vocab = model.config().vocab_size as u32;
    // Touch every weight matrix (mapped pages are read lazily): a few tokens through the model.
    let mut dec = Decoder::new(
        Arc::new(Model::from(model)),
        SchedulerConfig::default(),
        Vec::new(),
    );
    dec.next_token_argmax(&[1, 5, 9, 200].map(|t| t % vocab), 0)
        .expect("forward");
    let after = status();
    println!(
        "MEMORY {}",
        serde_json::json!({"before": before, "loaded": loaded, "after": after})
    );
}

struct Loaded {
    /// Growth of VmRSS over the load alone (mapped pages not read yet), then of VmRSS, RssAnon,
    /// RssFile once a forward pass has read every matrix, and peak VmHWM above the start (kB).
    load: u64,
    rss: u64,
    anon: u64,
    file: u64,
    peak: u64,
}

fn load_in_child_process(path: &Path) -> Loaded {
    load_in_child_process_with(path, &[])
}

/// [`load_in_child_process`] with environment variables set for the child.
fn load_in_child_process_with(path: &Path, env: &[(&str, &std::ffi::OsStr)]) -> Loaded {
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "memory::load_in_child",
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads", "1"])
        .env("CANDOR_MEMORY_CHILD", path)
        .envs(env.iter().copied())
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout}\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("MEMORY ").map(|(_, j)| j))
        .unwrap_or_else(|| panic!("no MEMORY line: {stdout}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("json");
    let kb = |when: &str, key: &str| v[when][key].as_u64().unwrap_or_else(|| panic!("{key}"));
    let grow = |key: &str| kb("after", key).saturating_sub(kb("before", key));
    Loaded {
        load: kb("loaded", "VmRSS").saturating_sub(kb("before", "VmRSS")),
        rss: grow("VmRSS"),
        anon: grow("RssAnon"),
        file: grow("RssFile"),
        peak: kb("after", "VmHWM").saturating_sub(kb("before", "VmRSS")),
    }
}

fn size_kb(path: &Path) -> u64 {
    let files: Vec<PathBuf> = if path.is_dir() {
        std::fs::read_dir(path)
            .expect("dir")
            .map(|e| e.expect("entry").path())
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    files
        .iter()
        .map(|p| std::fs::metadata(p).expect("size").len())
        .sum::<u64>()
        / 1024
}

/// Loading costs about the file size: resident memory grows by at most the file size plus
/// 16 MiB during and after the load. Float weights (BF16 GGUF, BF16 checkpoint) are the mapped
/// file's pages, not a copy (anonymous memory grows by under 16 MiB); quantized weights are one
/// repacked copy and the mapped pages they were read from are released (file-backed resident
/// memory grows by under 16 MiB).
#[test]
fn memory_after_load_is_about_the_file_size() {
    if !Path::new("/proc/self/status").exists() {
        crate::util::absent(crate::util::Need::Os, "no /proc/self/status on this system");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let types = [GgmlDType::BF16, GgmlDType::Q4K, GgmlDType::Q8_0];
    let (ggufs, ck) = write_models(dir.path(), &types);
    let margin = 16 * MIB;
    let mut failures = Vec::new();
    for (path, float) in [
        (&ggufs[0], true),
        (&ggufs[1], false),
        (&ggufs[2], false),
        (&ck, true),
    ] {
        let size = size_kb(path);
        let m = load_in_child_process(path);
        let name = path.file_name().expect("name").to_string_lossy();
        println!(
            "{name}: file {} MiB; VmRSS +{} MiB after the load, +{} MiB after a forward pass (anonymous +{}, file-backed +{}), peak +{} MiB",
            size / MIB,
            m.load / MIB,
            m.rss / MIB,
            m.anon / MIB,
            m.file / MIB,
            m.peak / MIB
        );
        if m.rss > size + margin || m.peak > size + margin {
            failures.push(format!(
                "{name}: resident +{} kB, peak +{} kB for a {size} kB file",
                m.rss, m.peak
            ));
        }
        if float && m.anon > margin {
            failures.push(format!(
                "{name}: anonymous memory +{} kB: float weights were copied, not mapped",
                m.anon
            ));
        }
        if !float && m.file > margin {
            failures.push(format!(
                "{name}: file-backed resident memory +{} kB: mapped pages kept after repacking",
                m.file
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A Mixture-of-Experts model's experts are read in place from panel files: a qwen3moe of 128
/// experts (102 MiB of Q8_0 experts, 4 layers of the fixture's shapes otherwise) loaded with
/// its experts in panel files (`CANDOR_EXPERTS=DIR`) grows its anonymous memory by under 16 MiB
/// over a forward pass that routes to them, where the same model with its experts in memory
/// (`CANDOR_EXPERTS=memory`) grows it by at least their size; a second load finds the panel
/// files. What lets a file larger than the free memory run: the experts' pages are the page
/// cache's, read on demand.
#[test]
fn moe_experts_in_panel_files_are_not_held_in_anonymous_memory() {
    if !Path::new("/proc/self/status").exists() {
        crate::util::absent(crate::util::Need::Os, "no /proc/self/status on this system");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let experts = 128usize;
    let mut rng = SplitMix64::new(11);
    let tensors: Vec<(String, QTensor)> = crate::moe::moe_tensors("qwen3moe")
        .into_iter()
        .map(|(name, mut shape, v)| {
            if name.contains("_exps.") || name.contains("ffn_gate_inp") {
                shape[0] = experts;
                let k = *shape.last().expect("dims");
                let scale = 1.5 / (k as f32).sqrt();
                let n: usize = shape.iter().product();
                let v = (0..n)
                    .map(|_| (rng.next_f64() as f32 * 2.0 - 1.0) * scale)
                    .collect();
                (name, crate::quant::q(v, &shape, GgmlDType::Q8_0))
            } else if shape.len() == 1 {
                (name, crate::quant::q(v, &shape, GgmlDType::F32))
            } else {
                (name, crate::quant::q(v, &shape, GgmlDType::Q8_0))
            }
        })
        .collect();
    let expert_kb: u64 = tensors
        .iter()
        .filter(|(n, _)| n.contains("_exps."))
        .map(|(_, t)| t.storage_size_in_bytes() as u64)
        .sum::<u64>()
        / 1024;
    let mut md = crate::moe::moe_metadata("qwen3moe");
    md.retain(|(k, _)| !k.ends_with(".expert_count") && !k.ends_with(".expert_used_count"));
    md.push((
        "qwen3moe.expert_count".into(),
        candle_core::quantized::gguf_file::Value::U32(experts as u32),
    ));
    md.push((
        "qwen3moe.expert_used_count".into(),
        candle_core::quantized::gguf_file::Value::U32(8),
    ));
    let path = dir.path().join("moe-128.gguf");
    crate::util::write_gguf(&path, &md, &tensors);
    let panels = dir.path().join("panels");
    let mapped = load_in_child_process_with(&path, &[("CANDOR_EXPERTS", panels.as_os_str())]);
    let memory = load_in_child_process_with(&path, &[("CANDOR_EXPERTS", "memory".as_ref())]);
    let again = load_in_child_process_with(&path, &[("CANDOR_EXPERTS", panels.as_os_str())]);
    println!(
        "qwen3moe, {} MiB of experts: anonymous +{} MiB with them in panel files (+{} MiB loaded again), +{} MiB in memory",
        expert_kb / MIB,
        mapped.anon / MIB,
        again.anon / MIB,
        memory.anon / MIB
    );
    let margin = 16 * MIB;
    assert!(
        expert_kb > 6 * margin,
        "{expert_kb} kB of experts: too few to tell"
    );
    assert!(
        mapped.anon < margin && again.anon < margin,
        "experts held: +{} kB, +{} kB",
        mapped.anon,
        again.anon
    );
    assert!(
        memory.anon >= expert_kb,
        "in memory, anonymous memory grew by only {} kB",
        memory.anon
    );
    let files = std::fs::read_dir(&panels).expect("panel files").count();
    assert_eq!(files, 3 * 4, "one panel file per expert tensor");
}
