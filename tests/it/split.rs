//! GGUF split sets (`<prefix>-00001-of-0000N.gguf` …, as `llama-gguf-split` writes them and as
//! the Hub serves gpt-oss-120b or Qwen3-235B-A22B): loaded from their first file or their
//! folder with the bits of the whole file, hashed as a set, and refused in one line naming
//! the file when a split is missing, misnumbered or repeats a tensor.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};
use candor::engine::{Decoder, NoText, SchedulerConfig};
use candor::model::memory::ExpertPanels;
use candor::model::runner::Model;
use candor::model::transformer::{Transformer, WeightDType};
use candor::weights::gguf::GgufFile;
use candor::weights::source;

use crate::moe::{moe_metadata, moe_tensors, raw_tensors, write_record, TinyRecord};
use crate::quant::{tiny_fixture, TQ_VOCAB};
use crate::util::{self, write_gguf_split, RawTensor};

/// A GGUF file's metadata, as written.
pub(crate) type Metadata = Vec<(String, Value)>;

/// A GGUF file's metadata, sorted by key, and its tensors in name order.
pub(crate) fn parts_of(path: &Path) -> (Metadata, Vec<RawTensor>) {
    let mut f = std::fs::File::open(path).expect("open");
    let content = Content::read(&mut f).expect("header");
    let mut md: Metadata = content.metadata.clone().into_iter().collect();
    md.sort_by(|a, b| a.0.cmp(&b.0));
    let tensors = util::gguf_tensors(&content, &mut f)
        .iter()
        .map(|(n, t)| RawTensor::from_q(n, t))
        .collect();
    (md, tensors)
}

/// Greedy replies of the model in `path` to two chat prompts, at batch 2.
fn greedy(path: &Path) -> Vec<Vec<u32>> {
    let model = Transformer::from_gguf_path(path, WeightDType::Native)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let cfg = SchedulerConfig {
        batch_size: 2,
        ..SchedulerConfig::default()
    };
    let mut dec = Decoder::new(Arc::new(Model::from(model)), cfg, vec![2]);
    // `<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n`,
    // and the same question cut short.
    let france = vec![
        1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
    ];
    let reqs = [
        util::greedy_request(france.clone(), 24),
        util::greedy_request(france[..9].to_vec(), 24),
    ];
    let replies = dec.generate(&reqs, &NoText).expect("generate");
    replies.into_iter().map(|r| r.output_ids).collect()
}

/// The default model written as three splits, and as four with no tensor in the first
/// (`--no-tensor-first-split`), decodes the whole file's tokens, loaded from the first file
/// and from the folder; its digest is the set's (another when a later split changes), and a
/// later split given alone is refused, naming the first.
#[test]
fn a_split_model_decodes_the_tokens_of_the_whole_file() {
    let Some(whole) = util::default_model() else {
        return;
    };
    let want = greedy(&whole);
    let (md, tensors) = parts_of(&whole);
    for (parts, first_empty) in [(3, false), (4, true)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = write_gguf_split(
            dir.path(),
            "smol",
            &md,
            &tensors,
            parts,
            first_empty,
            |_, _| {},
        );
        let label = format!("{parts} splits, first empty: {first_empty}");
        assert_eq!(greedy(&files[0]), want, "{label}");
        let resolved = source::resolve(dir.path().to_str().expect("utf-8")).expect("folder");
        assert_eq!(
            resolved.weights, files[0],
            "{label}: the folder is one model"
        );

        let file = GgufFile::open(&files[0]).expect("open");
        assert_eq!(file.paths().collect::<Vec<_>>(), files, "{label}");
        let last = tensors.last().expect("tensors");
        assert_eq!(file.tensor_path(&last.name), files[parts - 1], "{label}");

        let digest = source::weights_sha256(&files[0]).expect("digest");
        let lines: String = files
            .iter()
            .map(|p| {
                let sha = candor::weights::gguf::file_sha256(p).expect("sha");
                format!(
                    "{sha}  {}\n",
                    p.file_name().expect("name").to_string_lossy()
                )
            })
            .collect();
        assert_eq!(
            digest,
            candor::store::run_dir::sha256_bytes(lines.as_bytes()),
            "{label}"
        );
        let mut bytes = std::fs::read(&files[parts - 1]).expect("read");
        let at = bytes.len() - 1;
        bytes[at] ^= 1;
        std::fs::write(&files[parts - 1], &bytes).expect("write");
        assert_ne!(
            source::weights_sha256(&files[0]).expect("digest"),
            digest,
            "{label}"
        );

        let e = Transformer::from_gguf_path(&files[1], WeightDType::Native)
            .err()
            .expect("a later split alone is refused")
            .to_string();
        let first = files[0]
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(
            e.contains(&format!("split 2 of {parts}")) && e.contains(&first),
            "{label}: {e}"
        );
    }
}

/// gpt-oss with MXFP4 experts, split in four: its experts, read from the later files into
/// panel files, give every logit the bits of the whole file's.
#[test]
fn a_split_gpt_oss_model_reads_its_experts_from_every_file() {
    let (_, records) = tiny_fixture::<TinyRecord>("quant/tiny_moe_teacher_forced.jsonl");
    let t: TinyRecord = records
        .into_iter()
        .find(|t| t.arch == "gpt-oss" && t.ftype == "MXFP4_MOE")
        .expect("gpt-oss MXFP4 in the fixture");
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = write_record(dir.path(), &t);
    let tensors = raw_tensors(&moe_tensors(&t.arch), &t);
    let files = write_gguf_split(
        dir.path(),
        "gpt-oss",
        &moe_metadata(&t.arch),
        &tensors,
        4,
        false,
        |_, _| {},
    );
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|p| {
            (0..7 + p)
                .map(|i| (i * 53 + p * 29) % TQ_VOCAB as u32)
                .collect()
        })
        .collect();
    let load = |path: &Path, panels: &str| {
        let mut f = GgufFile::open(path).expect("open");
        let panels = ExpertPanels::Files(dir.path().join(panels));
        Transformer::from_gguf_with(&mut f, WeightDType::Native, &panels).expect("load")
    };
    let want = crate::arch::packed_logits(&load(&whole, "whole"), &prompts, 2, 3);
    let got = crate::arch::packed_logits(&load(&files[0], "split"), &prompts, 2, 3);
    let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
        v.iter()
            .map(|r| r.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    assert_eq!(bits(&got), bits(&want), "logits of the split model");
    let file = GgufFile::open(&files[0]).expect("open");
    let in_later = tensors
        .iter()
        .filter(|r| r.ggml_type == 39 && file.tensor_path(&r.name) != files[0])
        .count();
    assert!(in_later > 0, "some MXFP4 experts lie in later splits");
}

/// What a malformed split set is refused for, each in one line naming the file at fault: a
/// missing split, a split numbered as another, a tensor in two splits, and a first file whose
/// tensor count is not the set's.
#[test]
fn malformed_split_sets_are_refused_naming_the_file() {
    let f32s = |name: &str, n: usize| RawTensor {
        name: name.to_string(),
        dims: vec![n],
        ggml_type: 0,
        bytes: (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect(),
    };
    let tensors: Vec<RawTensor> = (0..6).map(|i| f32s(&format!("t{i}.weight"), 8)).collect();
    let md = vec![(
        "general.architecture".to_string(),
        Value::String("llama".into()),
    )];
    let open_err = |files: &[PathBuf]| -> String {
        match GgufFile::open(&files[0]) {
            Ok(_) => panic!("{} opened", files[0].display()),
            Err(e) => e.to_string(),
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |prefix: &str, edit: &mut dyn FnMut(usize, &mut Metadata)| {
        write_gguf_split(dir.path(), prefix, &md, &tensors, 3, false, edit)
    };
    let name = |p: &PathBuf| p.file_name().expect("name").to_string_lossy().into_owned();

    let ok = write("ok", &mut |_, _| {});
    let file = GgufFile::open(&ok[0]).expect("a well-formed set opens");
    assert_eq!(file.tensor_shapes().count(), 6);

    let missing = write("missing", &mut |_, _| {});
    std::fs::remove_file(&missing[2]).expect("remove");
    let e = open_err(&missing);
    assert!(
        e.contains(&name(&missing[2])) && e.contains("split 3 of 3") && e.contains("missing"),
        "{e}"
    );

    let renumbered = write("renumbered", &mut |i, md| {
        if i == 2 {
            md.retain(|(k, _)| k != "split.no");
            md.push(("split.no".into(), Value::U16(1)));
        }
    });
    let e = open_err(&renumbered);
    assert!(
        e.contains(&name(&renumbered[2])) && e.contains("split.no") && e.contains("expected 2"),
        "{e}"
    );

    let mut twice = write("twice", &mut |_, _| {});
    let mut doubled: Vec<RawTensor> = tensors[4..].iter().map(|t| f32s(&t.name, 8)).collect();
    doubled.insert(0, f32s("t0.weight", 8));
    util::write_gguf_raw(
        &twice[2],
        &[
            ("split.no".into(), Value::U16(2)),
            ("split.count".into(), Value::U16(3)),
        ],
        &doubled,
    );
    let e = open_err(&twice);
    assert!(
        e.contains(&name(&twice[2])) && e.contains("`t0.weight` is also in an earlier split"),
        "{e}"
    );
    twice.clear();

    let counted = write("counted", &mut |i, md| {
        if i == 0 {
            md.retain(|(k, _)| k != "split.tensors.count");
            md.push(("split.tensors.count".into(), Value::I32(7)));
        }
    });
    let e = open_err(&counted);
    assert!(
        e.contains(&name(&counted[0])) && e.contains("is 7") && e.contains("hold 6 tensors"),
        "{e}"
    );

    // A first split under another name: its siblings cannot be found.
    let renamed = dir.path().join("first.gguf");
    std::fs::copy(&ok[0], &renamed).expect("copy");
    let e = open_err(&[renamed]);
    assert!(
        e.contains("first.gguf") && e.contains("cannot be found"),
        "{e}"
    );
}

/// A split set in a folder of the Hub's cache beside another quantization and a vision
/// projector, with `HF_HUB_OFFLINE=1`: `org/repo:q4_1` (as llama.cpp's `-hf` takes a
/// quantization) and `org/repo:<first file>` both load the whole set and reply as the whole
/// file does; `org/repo` alone names the two models to choose from; with a split missing from
/// the cache, the run fails naming it.
#[test]
fn a_split_model_in_the_hub_cache_loads_offline() {
    let Some(whole) = util::default_model() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (md, tensors) = parts_of(&whole);
    let repo = dir.path().join("hf/hub/models--org--smol");
    let snapshot = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(snapshot.join("Q4_1")).expect("snapshot");
    std::fs::create_dir_all(repo.join("refs")).expect("refs");
    std::fs::write(repo.join("refs/main"), "0123abcd").expect("ref");
    write_gguf_split(
        &snapshot.join("Q4_1"),
        "smol-Q4_1",
        &md,
        &tensors,
        3,
        false,
        |_, _| {},
    );
    for other in ["smol-Q8_0.gguf", "mmproj-smol-F16.gguf"] {
        std::fs::write(snapshot.join(other), b"not loaded").expect("other");
    }
    let generate = |model: &str| crate::hub::generate(dir.path(), model, None);
    let want = generate(whole.to_str().expect("utf-8")).expect("the whole file");
    for model in [
        "org/smol:q4_1",
        "org/smol:Q4_1/smol-Q4_1-00001-of-00003.gguf",
    ] {
        assert_eq!(generate(model).as_ref(), Ok(&want), "{model}");
    }
    let e = generate("org/smol").expect_err("loaded one of two models");
    assert!(
        e.contains("2 .gguf models")
            && e.contains("Q4_1/smol-Q4_1-00001-of-00003.gguf, smol-Q8_0.gguf")
            && !e.contains("mmproj"),
        "{e}"
    );
    std::fs::remove_file(snapshot.join("Q4_1/smol-Q4_1-00003-of-00003.gguf")).expect("remove");
    let e = generate("org/smol:Q4_1").expect_err("loaded with a split missing");
    assert!(
        e.contains("Q4_1/smol-Q4_1-00003-of-00003.gguf") && e.contains("not in the Hub cache"),
        "{e}"
    );
}
