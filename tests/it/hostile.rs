//! Hostile and corrupt model files: copies of the default model with a hostile chat template
//! or a misaligned tensor offset are refused quickly by `candor generate`, with a one-line
//! error naming the file and bounded memory.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util;

/// Where the fields of a GGUF header lie (v2/v3 files).
pub struct Header {
    /// Metadata entries: key, byte range of the whole entry (key, type and value).
    pub kvs: Vec<(String, std::ops::Range<usize>)>,
    /// Tensor infos: name, byte position of the u64 data offset.
    pub tensors: Vec<(String, usize)>,
    /// End of the tensor infos.
    pub end: usize,
    pub alignment: usize,
}

fn rd_u32(b: &[u8], p: &mut usize) -> u32 {
    let v = u32::from_le_bytes(b[*p..*p + 4].try_into().unwrap());
    *p += 4;
    v
}

fn rd_u64(b: &[u8], p: &mut usize) -> u64 {
    let v = u64::from_le_bytes(b[*p..*p + 8].try_into().unwrap());
    *p += 8;
    v
}

fn rd_str(b: &[u8], p: &mut usize) -> String {
    let n = rd_u64(b, p) as usize;
    let s = String::from_utf8_lossy(&b[*p..*p + n]).into_owned();
    *p += n;
    s
}

fn skip_value(b: &[u8], p: &mut usize, ty: u32) {
    match ty {
        0 | 1 | 7 => *p += 1,
        2 | 3 => *p += 2,
        4..=6 => *p += 4,
        10..=12 => *p += 8,
        8 => {
            rd_str(b, p);
        }
        9 => {
            let item = rd_u32(b, p);
            let n = rd_u64(b, p);
            for _ in 0..n {
                skip_value(b, p, item);
            }
        }
        t => panic!("unknown gguf value type {t}"),
    }
}

/// Parses the header of a well-formed GGUF file.
pub fn header(b: &[u8]) -> Header {
    assert_eq!(&b[..4], b"GGUF");
    let mut p = 8;
    let n_tensors = rd_u64(b, &mut p);
    let n_kv = rd_u64(b, &mut p);
    let mut kvs = Vec::new();
    let mut alignment = 32;
    for _ in 0..n_kv {
        let start = p;
        let key = rd_str(b, &mut p);
        let ty = rd_u32(b, &mut p);
        let vpos = p;
        skip_value(b, &mut p, ty);
        if key == "general.alignment" {
            alignment = rd_u32(b, &mut vpos.clone()) as usize;
        }
        kvs.push((key, start..p));
    }
    let mut tensors = Vec::new();
    for _ in 0..n_tensors {
        let name = rd_str(b, &mut p);
        let n_dims = rd_u32(b, &mut p);
        p += 8 * n_dims as usize + 4;
        tensors.push((name, p));
        p += 8;
    }
    Header {
        kvs,
        tensors,
        end: p,
        alignment,
    }
}

/// A copy of a GGUF file with one string metadata value replaced (the header is rebuilt and
/// re-padded; tensor data is copied unchanged).
pub fn with_string(b: &[u8], key: &str, value: &str) -> Vec<u8> {
    let h = header(b);
    let (_, range) = h.kvs.iter().find(|(k, _)| k == key).expect("key present");
    let mut out = b[..range.start].to_vec();
    out.extend((key.len() as u64).to_le_bytes());
    out.extend(key.as_bytes());
    out.extend(8u32.to_le_bytes());
    out.extend((value.len() as u64).to_le_bytes());
    out.extend(value.as_bytes());
    out.extend(&b[range.end..h.end]);
    while !out.len().is_multiple_of(h.alignment) {
        out.push(0);
    }
    let data_start = h.end.div_ceil(h.alignment) * h.alignment;
    out.extend(&b[data_start..]);
    out
}

/// What a `candor generate` run did: status, stderr, elapsed time, and the peak resident
/// memory seen (Linux `VmHWM`, polled; 0 where unknown).
struct Outcome {
    status: std::process::ExitStatus,
    stderr: String,
    elapsed: Duration,
    peak_kib: u64,
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs `candor generate` on a model file with one short prompt.
fn generate(model: &Path, dir: &Path) -> Outcome {
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"id\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n",
    )
    .unwrap();
    let out = dir.join("out.jsonl");
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(["generate", "--max-new-tokens", "2", "--model"])
        .arg(model)
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut peak_kib = 0;
    let status = loop {
        if let Some(kib) = vm_hwm_kib(child.id()) {
            peak_kib = peak_kib.max(kib);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{} still running after 60 s", model.display());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = start.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!out.exists(), "no output is written for a refused model");
    Outcome {
        status,
        stderr,
        elapsed,
        peak_kib,
    }
}

const LOOPS: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
const DOUBLING: &str = "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}";
/// Single instructions that walk a value of unbounded size on one unit of fuel, with next to
/// no memory: lazy repetitions chained through a variable (10¹⁰ items) walked by `in`, lazy
/// `+` and `chain` of sequences doubled in a loop (2⁴⁰ items), and `==` on two nested lists
/// built by doubling (2⁵⁰ comparisons). The CPU-time budget ends each (or the memory budget,
/// where the walk allocates as it goes: the lazy `+` does).
const WALKS: &[(&str, &str)] = &[
    (
        "chained_repetition_in",
        "{% set a = [1] * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{{ 2 in a }}",
    ),
    (
        "chained_repetition_eq",
        "{% set a = [1] * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set b = a * 100 %}{% set a = a * 100 %}{{ a == b }}",
    ),
    (
        "doubled_concatenation_in",
        "{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = ns.a + ns.a %}{% endfor %}{{ 2 in ns.a }}",
    ),
    (
        "doubled_chain_in",
        "{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = ns.a | chain(ns.a) %}{% endfor %}{{ 2 in ns.a }}",
    ),
    (
        "nested_lists_eq",
        "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(50) %}{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}",
    ),
];

#[test]
fn hostile_templates_are_refused_quickly_with_bounded_memory() {
    let Some(model) = util::default_model() else {
        return;
    };
    let bytes = std::fs::read(&model).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let walks = WALKS
        .iter()
        .map(|&(name, template)| (name, template, "chat template exceeded its "));
    for (name, template, want) in [
        ("loops", LOOPS, "chat template over budget: output over"),
        (
            "doubling",
            DOUBLING,
            "chat template exceeded its memory budget",
        ),
    ]
    .into_iter()
    .chain(walks)
    {
        let path = dir.path().join(format!("{name}.gguf"));
        std::fs::write(
            &path,
            with_string(&bytes, "tokenizer.chat_template", template),
        )
        .unwrap();
        let Outcome {
            status,
            stderr,
            elapsed,
            peak_kib,
        } = generate(&path, dir.path());
        eprintln!("{name}: {elapsed:?}, peak {peak_kib} KiB: {stderr}");
        assert!(!status.success(), "{name}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{name}: one line: {stderr}");
        assert!(lines[0].contains(&*path.to_string_lossy()), "{stderr}");
        assert!(lines[0].contains(want), "{stderr}");
        // Loading the model's header and tokenizer takes most of this; the template fails
        // within a fraction of a second (the unit tests in chat_template time it alone).
        assert!(elapsed < Duration::from_secs(20), "{name}: {elapsed:?}");
        assert!(peak_kib < 1536 * 1024, "{name}: peak {peak_kib} KiB");
    }
}

#[test]
fn misaligned_tensor_offset_is_refused() {
    let Some(model) = util::default_model() else {
        return;
    };
    let mut bytes = std::fs::read(&model).unwrap();
    let h = header(&bytes);
    let (_, pos) = h
        .tensors
        .iter()
        .find(|(n, _)| n == "blk.21.ffn_norm.weight")
        .expect("tensor present");
    bytes[*pos..*pos + 8].copy_from_slice(&30u64.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("misaligned.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let Outcome {
        status,
        stderr,
        elapsed,
        ..
    } = generate(&path, dir.path());
    eprintln!("misaligned: {elapsed:?}: {stderr}");
    assert!(!status.success());
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains(&*path.to_string_lossy()), "{stderr}");
    assert!(
        lines[0].contains("tensor `blk.21.ffn_norm.weight`: data offset 30"),
        "{stderr}"
    );
}

#[test]
fn default_model_template_renders_well_inside_the_budget() {
    let Some(model) = util::default_model() else {
        return;
    };
    let file = candor::weights::gguf::GgufFile::open(&model).unwrap();
    let tok = candor::text::tokenizer::Tokenizer::from_gguf(file.content()).unwrap();
    let t = candor::text::chat_template::ChatTemplate::from_gguf(file.content(), &tok)
        .unwrap()
        .with_origin(model.display())
        .unwrap();
    use candor::text::message::Message;
    let turns: Vec<Message> = (0..40)
        .map(|i| {
            let text = format!("turn {i}: {}", "word ".repeat(400));
            if i % 2 == 0 {
                Message::user(text)
            } else {
                Message::assistant(text)
            }
        })
        .collect();
    let (text, fuel) = t.render_counted(&turns, true).unwrap();
    assert!(text.ends_with("<|im_start|>assistant\n"));
    eprintln!("default model: {fuel} instructions for 40 turns");
    assert!(fuel < candor::text::chat_template::FUEL / 20);
}
