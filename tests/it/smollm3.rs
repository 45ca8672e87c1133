//! `smollm3` (Hugging Face's SmolLM3 as llama.cpp converts it): tiny seeded models, 8 layers
//! with a tied output and 4 with a separate one, quantized by llama.cpp's own
//! llama-quantize, against llama.cpp's teacher-forced argmax
//! (`tests/fixtures/quant/tiny_smollm3_teacher_forced.jsonl`, written by
//! `make_tiny_smollm3_reference.py`); invariant under batch size, neighbours, threads and
//! every split of a prompt; every fourth layer without RoPE in the plan, on the CPU and in
//! every lowering; its chat template, a `<think>` one, as llama.cpp renders it.

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candor::model::lowering::{covered, not_lowered, target_of, Lowering};
use candor::model::plan::{trace, Place, RopeTable, Step};
use candor::model::transformer::{Transformer, WeightDType};
use candor::stats::rng::SplitMix64;

use crate::hybrid::{assert_dense_splits_give_one_prefills_bits, logits_in_chunks};
use crate::moe::TinyRecord;
use crate::quant::{
    agreement, assert_disagrees, assert_verdicts, q, tiny_fixture, Draw, TinyTensor, TQ_VOCAB,
};

const FIXTURE: &str = "quant/tiny_smollm3_teacher_forced.jsonl";
/// SmolLM3-3B's RoPE base, which the script's models use too.
const ROPE_BASE: f32 = 5e6;
/// The script's geometry (make_tiny_quant_reference.py's): width, FFN, heads, KV heads.
const TQ_DIM: usize = 256;
const TQ_FFN: usize = 512;
const TQ_HEADS: usize = 4;
const TQ_KV_HEADS: usize = 2;

/// The script's models: (layers, output tied to the embedding).
fn variant(name: &str) -> (usize, bool) {
    match name {
        "smollm3" => (8, true),
        "smollm3-untied" => (4, false),
        other => panic!("unknown model {other} in the fixture"),
    }
}

/// The script's `smollm3_tensors`: drawn in the same order from the same `SplitMix64` stream
/// (seed 7); a tied model's embedding drawn as a matrix (±1.5/√256).
fn smollm3_tensors(name: &str) -> Vec<TinyTensor> {
    let (layers, tied) = variant(name);
    let (d, f) = (TQ_DIM, TQ_FFN);
    let kv = d / TQ_HEADS * TQ_KV_HEADS;
    let mut w = Draw {
        rng: SplitMix64::new(7),
        out: Vec::new(),
    };
    match tied {
        true => w.mat("token_embd.weight".into(), TQ_VOCAB, d),
        false => w.add("token_embd.weight".into(), vec![TQ_VOCAB, d], 1.0, None),
    }
    for i in 0..layers {
        let b = |s: &str| format!("blk.{i}.{s}");
        w.norm(b("attn_norm.weight"), d);
        w.mat(b("attn_q.weight"), d, d);
        w.mat(b("attn_k.weight"), kv, d);
        w.mat(b("attn_v.weight"), kv, d);
        w.mat(b("attn_output.weight"), d, d);
        w.norm(b("ffn_norm.weight"), d);
        w.mat(b("ffn_gate.weight"), f, d);
        w.mat(b("ffn_up.weight"), f, d);
        w.mat(b("ffn_down.weight"), d, f);
    }
    w.norm("output_norm.weight".into(), d);
    if !tied {
        w.mat("output.weight".into(), TQ_VOCAB, d);
    }
    w.out
}

/// The script's GGUF metadata of `name` under architecture `arch` (`smollm3`, or `llama` for
/// the same model with RoPE on every layer), without the vocabulary, which these ids-only
/// tests do not read.
fn smollm3_metadata(name: &str, arch: &'static str) -> Vec<(String, Value)> {
    let shape = crate::util::TinyShape {
        arch,
        layers: variant(name).0,
        dim: TQ_DIM,
        ffn: TQ_FFN,
        heads: TQ_HEADS,
        kv_heads: TQ_KV_HEADS,
        context: 256,
    };
    let extra = [
        ("attention.key_length", 64),
        ("attention.value_length", 64),
        ("rope.dimension_count", 64),
    ];
    let mut md = crate::util::tiny_metadata(&shape, &extra);
    let base = format!("{arch}.rope.freq_base");
    let eps = format!("{arch}.attention.layer_norm_rms_epsilon");
    md.retain(|(k, _)| k != &base && k != &eps);
    md.extend([(base, Value::F32(ROPE_BASE)), (eps, Value::F32(1e-6))]);
    md
}

/// Writes the fixture's model of `t` (each tensor in llama-quantize's type, its bytes checked
/// against llama-quantize's) into `dir`, under architecture `arch`.
fn write_model(dir: &std::path::Path, t: &TinyRecord, arch: &'static str) -> std::path::PathBuf {
    crate::moe::write_fixture_model(
        dir,
        t,
        &smollm3_tensors(&t.arch),
        &smollm3_metadata(&t.arch, arch),
    )
}

/// Both models in F32, Q8_0 and llama-quantize's Q4_K_M mix: the test draws the script's
/// weights, stores each tensor in the type llama-quantize chose and requires its bytes; then
/// Candor's teacher-forced argmax agrees with llama.cpp's at 98% or more (or at least as well
/// as llama.cpp's own other execution paths), every miss a near tie (llama.cpp's top-2 gap
/// below 0.1, the dense models' bound); and decoding the Q4_K_M models does not depend on
/// batch size, neighbours or threads.
#[test]
fn tiny_smollm3_models_match_llama_cpp_and_are_batch_invariant() {
    let report = crate::moe::verdicts(crate::moe::against_llama_cpp(
        FIXTURE,
        |t| t.ftype == "Q4_K_M",
        |dir, t| write_model(dir, t, "smollm3"),
    ));
    assert_eq!(report.len(), 6, "two models in three types");
    assert_verdicts(&report, 0.1);
}

/// The NoPE layers matter to the comparison above: the same F32 weights read as a `llama`
/// file, which rotates every layer, fall below 98% of llama.cpp's smollm3 argmax, missing
/// where llama.cpp's choice is no near tie.
#[test]
fn the_same_weights_with_rope_on_every_layer_disagree_with_llama_cpp() {
    let (head, records) = tiny_fixture::<TinyRecord>(FIXTURE);
    let seqs = head.seqs();
    let dir = tempfile::tempdir().expect("tempdir");
    for t in records.iter().filter(|t| t.ftype == "F32") {
        let file = write_model(dir.path(), t, "llama");
        let a = agreement(&file, &seqs, &t.argmax, &t.top2_gap);
        assert_disagrees(&format!("{} as llama", t.arch), &a);
    }
}

/// A prompt's logits at every position are the same bits in one prefill, in chunks of 1
/// (token by token), 3, 16 and uneven sizes, and on 1 or 2 threads: a NoPE layer's
/// unrotated keys are stored and read back like any other's.
#[test]
fn every_split_of_a_smollm3_prompt_gives_the_same_bits() {
    let (_dir, model) = crate::moe::fixture_model(
        FIXTURE,
        |t| t.arch == "smollm3" && t.ftype == "Q4_K_M",
        |dir, t| write_model(dir, t, "smollm3"),
    );
    assert_dense_splits_give_one_prefills_bits(&model, "smollm3");
}

/// What each model's file says is read (its RoPE base, a tied or separate output); the
/// NoPE layers are exactly every fourth (3, and 7 of 8), whose plan is the other layers'
/// without RoPE, the KV still written before attention; the CPU executes exactly the plan;
/// the GPU lowers every step of it on every target, with no RoPE launch in a NoPE layer.
#[test]
fn every_fourth_smollm3_layer_skips_rope_on_the_cpu_and_in_every_lowering() {
    let records = tiny_fixture::<TinyRecord>(FIXTURE).1;
    let dir = tempfile::tempdir().expect("tempdir");
    for t in records.iter().filter(|t| t.ftype == "F32") {
        let label = &t.arch;
        let (layers, tied) = variant(&t.arch);
        assert_eq!(t.types.contains_key("output.weight"), !tied, "{label}");
        let file = write_model(dir.path(), t, "smollm3");
        let model = Transformer::from_gguf_path(&file, WeightDType::Native).expect("load");
        let c = model.config();
        assert_eq!(
            (c.n_layer, c.rope_base, c.rope_neox),
            (layers, ROPE_BASE, false)
        );
        let nope: Vec<usize> = (0..layers).filter(|&l| !c.rope(l)).collect();
        assert_eq!(nope, (3..layers).step_by(4).collect::<Vec<_>>(), "{label}");
        let plan = model.plan();
        let rope = Step::Rope(RopeTable::Full);
        let attend = Step::Attention {
            window: None,
            sinks: false,
        };
        for l in 0..plan.n_layers() {
            let steps = plan.layer(l);
            let mut rotated = plan.layer(0).to_vec();
            if nope.contains(&l) {
                rotated.retain(|&s| s != rope);
            }
            assert_eq!(steps, rotated, "{label} layer {l}");
            let at = steps.iter().position(|&s| s == Step::KvWrite).expect("KV");
            let before = if nope.contains(&l) {
                Step::Project(candor::model::plan::Matrix::Qkv)
            } else {
                rope
            };
            assert_eq!(steps[at - 1..at + 2], [before, Step::KvWrite, attend]);
        }
        let events: Vec<trace::Event> = plan
            .places()
            .flat_map(|(p, steps)| steps.iter().map(move |&s| trace::Event::Step(p, s)))
            .collect();
        trace::start();
        logits_in_chunks(&model, &[1, 5, 9, 4], &[4]);
        assert_eq!(trace::take(), events, "{label}: the CPU's steps");

        assert_eq!(not_lowered(&model), None, "{label}");
        for integer in [true, false] {
            for fuse in [true, false] {
                let low = Lowering::new(plan, &target_of(&model, integer, fuse));
                for (place, steps) in plan.places() {
                    let got = covered(steps, low.launches(place))
                        .unwrap_or_else(|e| panic!("{label} {place:?}: {e}"));
                    assert_eq!(got.into_iter().copied().collect::<Vec<_>>(), steps);
                    let Place::Layer(l) = place else { continue };
                    let ropes = low
                        .launches(place)
                        .iter()
                        .filter(|x| x.kernel.name().starts_with("rope"))
                        .count();
                    let want = match (nope.contains(&l), fuse) {
                        (true, _) => 0,
                        (false, true) => 1,
                        (false, false) => 2,
                    };
                    assert_eq!(ropes, want, "{label} layer {l} fuse {fuse}");
                }
            }
        }
    }
}

/// What a smollm3 file gets refused for, naming the key: `attention.scale` (llama.cpp's
/// smollm3 loader never reads it: its graph's scale stays `1/sqrt(head_dim)`), experts (its
/// layers are dense) and a YaRN beta other than llama.cpp's default (its loader reads none;
/// YaRN itself is read, `tests/it/yarn.rs`).
#[test]
fn smollm3_metadata_errors_name_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws: Vec<_> = smollm3_tensors("smollm3-untied")
        .into_iter()
        .map(|(n, s, v)| (n, q(v, &s, GgmlDType::F32)))
        .collect();
    let path = dir.path().join("m.gguf");
    let md = smollm3_metadata("smollm3-untied", "smollm3");
    crate::util::write_gguf(&path, &md, &ws);
    Transformer::from_gguf_path(&path, WeightDType::Native).expect("the file itself loads");
    let load = |key: &str, v: Value| {
        let mut md = md.clone();
        md.push((key.into(), v));
        crate::util::write_gguf(&path, &md, &ws);
        match Transformer::from_gguf_path(&path, WeightDType::Native) {
            Ok(_) => panic!("{key}: loaded"),
            Err(e) => e.to_string(),
        }
    };
    let e = load("smollm3.attention.scale", Value::F32(0.1));
    assert!(e.contains("smollm3.attention.scale = 0.1"), "{e}");
    let e = load("smollm3.expert_count", Value::U32(8));
    assert!(e.contains("smollm3.expert_count"), "{e}");
    let e = load("smollm3.rope.scaling.yarn_beta_fast", Value::F32(8.0));
    assert!(e.contains("smollm3.rope.scaling.yarn_beta_fast"), "{e}");
}

/// SmolLM3's chat template (llama.cpp's `models/templates/HuggingFaceTB-SmolLM3-3B.jinja`)
/// renders every case exactly as llama.cpp's llama-server renders it (`/apply-template`,
/// `tests/fixtures/templates/rendered/HuggingFaceTB-SmolLM3-3B.json`, written by
/// `render_with_llama_server.py` with SmolLM2's BOS): `/think` by default, the empty think
/// block of `enable_thinking` false and of a system message's `/no_think`. Candor reads it
/// as the `<think>` family: with thinking on the model opens the block itself (the prompt
/// ends at `assistant\n`), and a reply splits at `</think>`.
#[test]
fn the_smollm3_chat_template_renders_like_llama_cpp_and_thinks_in_think_tags() {
    use candor::text::chat_template::{ChatTemplate, TemplateArgs};
    use candor::text::message::Message;
    use candor::text::reasoning::{ReasoningFormat, Split, Thinking};

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
    let name = "HuggingFaceTB-SmolLM3-3B";
    let text = std::fs::read_to_string(dir.join(format!("rendered/{name}.json"))).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
    assert_eq!(ReasoningFormat::from_template(&src), ReasoningFormat::Think);
    // SmolLM2's BOS/EOS, the model llama-server was started with.
    let t = ChatTemplate::new(src, "<|im_start|>", "<|im_end|>").unwrap();
    assert_eq!(t.reasoning_format(), ReasoningFormat::Think);
    // Each case equals llama-server's render in `text::chat_template`'s
    // `real_thinking_templates_render_like_llama_cpp`; here, the template's own default
    // (Candor passes nothing) is thinking on, as llama-server's `enable_thinking: true`.
    let defaults: Vec<&serde_json::Value> = expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["chat_template_kwargs"] == serde_json::json!({}))
        .collect();
    assert_eq!(defaults.len(), 3);
    for case in defaults {
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let want = case["prompt"].as_str().unwrap();
        assert_eq!(t.render(&messages, true).unwrap(), want, "{}", case["name"]);
    }

    let user = [Message::user("Hi")];
    let render = |thinking: Thinking| {
        let args = TemplateArgs {
            kwargs: thinking
                .template_kwargs()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            date: None,
        };
        t.render_with(&user, true, &args).unwrap()
    };
    let (on, off) = (render(Thinking::On), render(Thinking::Off));
    assert!(on.ends_with("<|im_start|>assistant\n") && on.contains("Reasoning Mode: /think"));
    assert!(off.ends_with("<think>\n\n</think>\n") && off.contains("Reasoning Mode: /no_think"));
    let think = ReasoningFormat::Think;
    assert!(!think.starts_open(&on));
    assert_eq!(
        think.split("<think>\nAdd them.\n</think>\n\n4.", false),
        Split {
            reasoning: Some("Add them.".into()),
            answer: Some("4.".into())
        }
    );
    assert_eq!(
        think.split("4.", false),
        Split {
            reasoning: None,
            answer: Some("4.".into())
        }
    );
}

/// The tiny SmolLM3 model as transformers 5.24 saves it (`smollm3`: `no_rope_layers` with
/// every fourth layer unrotated, tied embeddings, `rope_parameters`; by
/// `tests/reference/make_tiny.py smollm3`) loads with those layers without RoPE, its greedy
/// decoding agrees with transformers' f32 reference (48/48 steps) and its last-position
/// logits lie within 1e-3 of it; the same config without `no_rope_layers` (transformers'
/// default, every fourth) is the same model, one with another flag is not, and a flag other
/// than 0 or 1 is refused by name.
#[test]
fn a_smollm3_checkpoint_is_the_model_transformers_runs() {
    use candor::model::arch::ModelConfig;
    let model = crate::arch::load_checkpoint("smollm3");
    let c = model.config();
    assert_eq!(c.architecture, "smollm3");
    assert_eq!(c.nope_layers, vec![false, false, false, true]);
    crate::arch::check_against_reference("smollm3", &model, "checkpoint");
    let path = crate::arch::fixture("smollm3").join("config.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
    let read = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut j = json.clone();
        edit(&mut j);
        ModelConfig::from_hf_config(&path, &j)
    };
    let without = read(&|j| {
        j.as_object_mut().expect("object").remove("no_rope_layers");
    });
    assert_eq!(without.expect("loads"), *c);
    let other = read(&|j| j["no_rope_layers"][0] = 0.into()).expect("loads");
    assert_eq!(other.nope_layers, vec![true, false, false, true]);
    let e = read(&|j| j["no_rope_layers"][1] = 2.into()).expect_err("refused");
    assert!(e.to_string().contains("no_rope_layers"), "{e}");
}
