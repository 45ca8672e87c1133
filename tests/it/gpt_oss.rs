//! gpt-oss Hugging Face checkpoints: as OpenAI publishes them (MXFP4 experts) and dequantized,
//! against transformers and against the GGUF llama.cpp's converter writes from them.
//!
//! The fixtures `tests/fixtures/tiny/gpt-oss{,-bf16}/` and the transformers reference are
//! written by `tests/reference/make_tiny_gpt_oss.py`; with `--gguf` it also converts both with
//! llama.cpp's `convert_hf_to_gguf.py` (`CANDOR_TINY_GGUF=<dir>`: `<dir>/gpt-oss.gguf`,
//! `<dir>/gpt-oss-bf16.gguf`, each tensor in the checkpoint's type).

use std::path::Path;

use candor::model::checkpoint::Checkpoint;
use candor::model::transformer::{Transformer, WeightDType};
use candor::weights::gguf::GgufFile;

use crate::arch::{check_against_reference, fixture, packed_logits, same_bits};

/// The fixture `name`'s checkpoint loaded with `dtype`, every tensor of it read.
fn load(name: &str, dtype: WeightDType) -> Transformer {
    let mut ck = Checkpoint::open(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let model =
        Transformer::from_checkpoint(&mut ck, dtype).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        ck.unread_tensors(),
        Vec::<String>::new(),
        "{name}: every tensor read"
    );
    model
}

/// Prompts of 1 to 23 tokens: past the tiny model's window of 6.
fn prompts() -> Vec<Vec<u32>> {
    (0..6u32)
        .map(|i| {
            (0..1 + 4 * i)
                .map(|j| (11 + 37 * i + 17 * j) % 500 + 3)
                .collect()
        })
        .collect()
}

/// The tiny gpt-oss model as OpenAI publishes its checkpoints (`gpt_oss`, MXFP4 experts as
/// `{gate_up,down}_proj_{blocks,scales}` with `quantization_config` mxfp4, gate and up rows
/// interleaved, the router `mlp.router` with its bias, attention sinks, every projection's
/// bias) and as transformers saves it dequantized (`gate_up_proj` `[experts, hidden, 2·ffn]`,
/// BF16): both load (every tensor read) as gpt-oss with the config's geometry, and
/// - greedy decoding with the weights in f32 agrees with transformers' f32 reference (48/48
///   steps), and the last-position logits lie within 1e-3 of it (measured: 5.3e-6);
/// - the two checkpoints are one model: dequantized, their logits are equal bit for bit;
/// - in their own types (MXFP4 experts on the integer kernels), the logits do not depend on
///   how prompts are packed and chunked.
///
/// The reference rounds YaRN's ramp ends to whole pairs, as llama.cpp does (transformers with
/// the config's `truncate: false` differs from it by up to 0.014 here). Gate and up swapped, or
/// a nibble order reversed, fails the reference.
#[test]
fn a_gpt_oss_checkpoint_is_the_model_transformers_runs() {
    let mx = load("gpt-oss", WeightDType::F32);
    let c = mx.config();
    assert_eq!(
        (
            c.architecture.as_str(),
            c.n_layer,
            c.dim,
            c.n_head,
            c.n_kv_head
        ),
        ("gpt-oss", 2, 64, 4, 2)
    );
    let moe = c.moe.expect("experts");
    assert_eq!((moe.experts, moe.used, moe.ffn_dim), (4, 2, 64));
    assert_eq!(
        (c.sliding_window, c.swa_layers.clone()),
        (Some(6), vec![true, false])
    );
    check_against_reference("gpt-oss", &mx, "MXFP4 checkpoint, f32");
    let bf = load("gpt-oss-bf16", WeightDType::F32);
    check_against_reference("gpt-oss", &bf, "BF16 checkpoint, f32");
    let p = prompts();
    assert!(
        same_bits(&packed_logits(&mx, &p, 3, 5), &packed_logits(&bf, &p, 3, 5)),
        "the MXFP4 and BF16 checkpoints' logits differ"
    );
    let native = load("gpt-oss", WeightDType::Native);
    assert!(
        same_bits(
            &packed_logits(&native, &p, 1, 64),
            &packed_logits(&native, &p, 6, 5)
        ),
        "the MXFP4 checkpoint's logits depend on packing"
    );
}

#[test]
#[ignore = "needs CANDOR_TINY_GGUF (make_tiny_gpt_oss.py --gguf); run with --ignored"]
fn a_gpt_oss_checkpoint_gives_the_converted_gguf_s_logits() {
    let dir = crate::util::reference_dir(
        "CANDOR_TINY_GGUF",
        "set it to the output of tests/reference/make_tiny_gpt_oss.py --gguf",
    );
    for name in ["gpt-oss", "gpt-oss-bf16"] {
        let path = Path::new(&dir).join(format!("{name}.gguf"));
        let mut file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let gguf = Transformer::from_gguf(&mut file, WeightDType::Native)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let ck = load(name, WeightDType::Native);
        let mut want = gguf.config().clone();
        // The converter's q/k rows rotate halves too (gpt-oss is NeoX-style): nothing differs.
        want.rope_neox = ck.config().rope_neox;
        assert_eq!(
            &want,
            ck.config(),
            "{name}: GGUF (left) and checkpoint (right)"
        );
        let p = prompts();
        assert!(
            same_bits(
                &packed_logits(&gguf, &p, 3, 5),
                &packed_logits(&ck, &p, 3, 5)
            ),
            "{name}: the checkpoint's logits differ from the converted GGUF's"
        );
    }
}

/// A copy of the MXFP4 fixture with its `config.json` edited by `edit`: the configuration
/// it resolves to, or the load's error.
fn with_config(edit: impl FnOnce(&mut serde_json::Value)) -> Result<Transformer, String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let ck = crate::arch::edited_checkpoint(dir.path(), "gpt-oss", edit, &[]);
    let mut ck = Checkpoint::open(&ck).map_err(|e| e.to_string())?;
    Transformer::from_checkpoint(&mut ck, WeightDType::F32).map_err(|e| e.to_string())
}

/// The config as OpenAI publishes gpt-oss's (transformers 4's keys: `rope_theta`,
/// `rope_scaling`, `experts_per_token`, `initial_context_length`, no `swiglu_alpha`) resolves
/// to the same configuration as transformers 5's; what Candor's gpt-oss would not run as
/// transformers does is refused naming the key or tensor: a SwiGLU limit or alpha of its own,
/// a config silent on its YaRN or window (transformers' defaults would apply), another
/// quantization method, expert blocks of another shape.
#[test]
fn a_gpt_oss_config_is_read_as_published_and_refused_where_it_differs() {
    let v5 = with_config(|_| {}).expect("the fixture loads");
    let published = with_config(|c| {
        let o = c.as_object_mut().expect("object");
        let mut rope = o.remove("rope_parameters").expect("v5 rope");
        let theta = rope
            .as_object_mut()
            .and_then(|r| r.remove("rope_theta"))
            .expect("theta");
        o.insert("rope_theta".into(), theta);
        o.insert("rope_scaling".into(), rope);
        o.remove("swiglu_alpha");
        o.insert("experts_per_token".into(), 2.into());
        o.insert("initial_context_length".into(), 4096.into());
    })
    .expect("the published layout loads");
    assert_eq!(v5.config(), published.config());

    let refused = |edit: fn(&mut serde_json::Value), want: &[&str]| {
        let e = match with_config(edit) {
            Ok(_) => panic!("loaded; wanted {want:?}"),
            Err(e) => e,
        };
        for w in want {
            assert!(e.contains(w), "{w:?} not in: {e}");
        }
    };
    refused(|c| c["swiglu_limit"] = 8.0.into(), &["swiglu_limit", "8"]);
    refused(|c| c["swiglu_alpha"] = 1.0.into(), &["swiglu_alpha"]);
    refused(
        |c| {
            c.as_object_mut().expect("object").remove("sliding_window");
        },
        &["sliding_window", "absent"],
    );
    refused(
        |c| {
            c.as_object_mut().expect("object").remove("rope_parameters");
        },
        &["rope_scaling", "absent"],
    );
    refused(
        |c| c["quantization_config"]["quant_method"] = "fp8".into(),
        &["quantization_config"],
    );
    refused(
        |c| c["intermediate_size"] = 32.into(),
        &["gate_up_proj_blocks", "[4, 64, 2, 16]", "[4, 128, 2, 16]"],
    );
}
