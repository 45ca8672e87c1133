//! A seeded random-mutation fuzzer on the stable toolchain, run from `cargo test`.
//!
//! Each target takes arbitrary bytes and must return (an error is fine) without panicking,
//! hanging or allocating without bound. Inputs are the committed corpus under
//! `tests/fixtures/fuzz/<target>/` mutated by a seeded generator (bit flips, interesting
//! integers, inserted/deleted/duplicated ranges, truncations, splices between corpus files),
//! so a failure reproduces from its seed and iteration number. The `template_source` target's
//! inputs are chat template sources, mutated also by inserting constructs that build one large
//! value in a step ([`LARGE_VALUES`]); each runs in a child process whose peak resident memory
//! and CPU time are asserted.
//!
//! `cargo test --test it fuzz` runs a short smoke (a few hundred inputs per target, seconds).
//! `CANDOR_FUZZ_ITERS=1000000 cargo test --release --test it fuzz -- --nocapture` is the long
//! run; `CANDOR_FUZZ_SEED` changes the seed, `CANDOR_FUZZ_TARGET` picks one target and
//! `CANDOR_FUZZ_SECONDS` stops each target after that long (the count is printed);
//! `CANDOR_FUZZ_REPLAY=<file>` with `CANDOR_FUZZ_TARGET` runs one saved input and times it;
//! `CANDOR_FUZZ_PEAKS=1` saves every input after which the peak resident set has grown by 16 MiB
//! (with malloc's in-use bytes, which tell a large input from memory held across inputs). Take
//! long runs with `RUST_BACKTRACE` unset: with it set, the backtraces that candle's errors capture
//! are resolved and cached, hundreds of MB that users do not see. A
//! panicking input is written to `target/fuzz-crashes/<target>-<seed>-<iteration>` and the test
//! fails naming it; an input slower than [`SLOW`] fails too.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use candor::text::chat_template::ChatTemplate;
use candor::text::message::{Message, Role};

use crate::util;

/// An input that takes longer than this is a failure (a hang, in a smoke).
const SLOW: Duration = Duration::from_secs(5);

/// Smoke iterations per target when `CANDOR_FUZZ_ITERS` is unset.
const SMOKE_ITERS: u64 = 300;

/// SplitMix64: small, seeded, good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

/// Template constructs that build one large value in a single step (repetition, ranges,
/// joins, padding widths, widening filters and methods), inserted by the `template_source`
/// target's mutations; each must be refused quickly with bounded memory.
const LARGE_VALUES: &[&str] = &[
    "{{ 'a' * 1000000000 }}",
    "{{ 'ab' * 10**18 }}",
    "{{ 'ab' * 2**62 }}",
    " * 10**9",
    " * 4294967295",
    "{% set n = 10**9 %}{{ 'a' * n }}",
    "{% set n = 2**62 %}{{ 'ab' * n }}",
    "{{ [1, 2, 3] * 1000000000 }}",
    "{{ ([1, 2] * 100000) ~ 'x' }}",
    "{{ x ~ (x ~ (x ~ (x ~ ('a' * 1000000)))) }}",
    "{% for m in messages %}{{ m.content * 100000000 }}{% endfor %}",
    "{{ 'a\nb' | indent(1000000000) }}",
    " | indent(4294967295)",
    "{{ ('a' * 1000) | replace('a', 'a' * 100000) }}",
    " | replace('', 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx')",
    "{{ ('a' * 1000).replace('a', 'b' * 100000) }}",
    "{{ range(100000) | join('x' * 100000) }}",
    " | join('x' * 100000)",
    "{{ ('x' * 1000).join(range(100000)) }}",
    "{{ [1] | batch(1000000000, fill_with='x') | list }}",
    " | batch(18446744073709551615)",
    "{{ [[[[1]]]] | tojson(indent=1000000000) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{{ range(100000) | list | string }}",
    "{% set n = 10**9 %}{{ ([1] * n) | unique | list }}",
    "{% set n = 10**9 %}{{ ([1, 2] * n) | sort | first }}",
    "{% set n = 10**9 %}{{ ([1] * n) | sum }}",
    "{% set n = 10**9 %}{{ ([1] * n) | select('odd') | list | length }}",
    "{% set n = 10**9 %}{{ messages * n | map(attribute='role') | join }}",
    "{% set a = [1] * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{{ a | unique | list }}",
    " | unique | list",
    " | reverse | list",
    // Padding and format widths.
    "{{ '%-1000000000s' | format('a') }}",
    "{{ '%1000000000d' | format(1) }}",
    "{{ '{:>1000000000}'.format('a') }}",
    "{{ 'a' | center(1000000000) }}",
    "{{ 'a'.center(1000000000) }}{{ 'a'.ljust(1000000000) }}{{ 'a'.rjust(1000000000) }}{{ 'a'.zfill(1000000000) }}",
    "{{ 'a\tb'.expandtabs(1000000000) }}",
    // Single instructions that walk a value of unbounded size (the CPU-time budget).
    "{% set a = [1] * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{{ 2 in a }}",
    "{% set a = [1] * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{% set b = a * 100 %}{% set a = a * 100 %}{{ a == b }}",
    "{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = ns.a + ns.a %}{% endfor %}{{ 2 in ns.a }}",
    "{% set ns = namespace(a=[1]) %}{% for i in range(40) %}{% set ns.a = ns.a | chain(ns.a) %}{% endfor %}{{ 2 in ns.a }}",
    "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(50) %}{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}",
    "{% set ns = namespace(s='x' * 60000) %}{% for i in range(1000) %}{% for j in range(1000) %}{% set t = ns.s ~ ns.s %}{% endfor %}{% endfor %}",
    " * 100 %}{% set a = a * 100 %}{% set a = a * 100 %}{{ 2 in a }}",
    " == messages * 100",
];

/// Every whole template in [`LARGE_VALUES`], alone, through the `template_source` target's
/// child process: each ends within its CPU time and memory, whatever mutations the smoke
/// draws this time.
#[test]
fn fuzz_template_source_every_large_value_alone() {
    for src in LARGE_VALUES.iter().filter(|s| s.starts_with("{")) {
        let start = Instant::now();
        target_template_source(src.as_bytes());
        eprintln!("{:?}: {src}", start.elapsed());
    }
    eprintln!(
        "largest child peak {} KiB, most CPU time {} ms",
        TEMPLATE_PEAK.load(Ordering::Relaxed),
        TEMPLATE_CPU_US.load(Ordering::Relaxed) / 1000
    );
}

/// One random mutation of `data` (corpus files in `others` for splicing; `words`: the
/// target's own tokens for its text-aware mutation).
fn mutate(rng: &mut Rng, data: &mut Vec<u8>, others: &[Vec<u8>], words: &[&str]) {
    let len = data.len();
    match rng.below(10) {
        0 if len > 0 => {
            let i = rng.below(len);
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len);
            data[i] = rng.next() as u8;
        }
        2 if len > 0 => {
            let v = INTERESTING[rng.below(INTERESTING.len())];
            let width = [1, 2, 4, 8][rng.below(4)];
            let i = rng.below(len);
            let bytes = v.to_le_bytes();
            for (k, b) in bytes.iter().take(width).enumerate() {
                if i + k < len {
                    data[i + k] = *b;
                }
            }
        }
        3 => {
            let i = rng.below(len + 1);
            let n = 1 + rng.below(16);
            let ins: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            data.splice(i..i, ins);
        }
        4 if len > 0 => {
            let i = rng.below(len);
            let n = 1 + rng.below((len - i).min(64));
            data.drain(i..i + n);
        }
        5 if len > 0 => {
            let i = rng.below(len);
            let n = 1 + rng.below((len - i).min(64));
            let copy = data[i..i + n].to_vec();
            let at = rng.below(len + 1);
            data.splice(at..at, copy);
        }
        6 if len > 0 => {
            data.truncate(rng.below(len));
        }
        7 if !others.is_empty() => {
            let other = &others[rng.below(others.len())];
            if !other.is_empty() {
                let i = rng.below(other.len());
                let n = 1 + rng.below((other.len() - i).min(256));
                let at = rng.below(len + 1);
                data.splice(at..at, other[i..i + n].iter().copied());
            }
        }
        8 => {
            // Text-aware: insert a token that parsers look for.
            const TOKENS: &[&str] = &[
                "\"", "{", "}", "[", "]", ",", ":", "\n", "\\", "\\u", "null", "true", "-1",
                "1e999", "是", "否", "yes", "no", "error", "no_error", "Score", "[[", "]]",
                "\u{0}", "\u{ffff}", "😀",
            ];
            let t = if !words.is_empty() && rng.below(2) == 0 {
                words[rng.below(words.len())].as_bytes()
            } else {
                TOKENS[rng.below(TOKENS.len())].as_bytes()
            };
            let at = rng.below(len + 1);
            data.splice(at..at, t.iter().copied());
        }
        _ => {
            for _ in 0..1 + rng.below(4) {
                if !data.is_empty() {
                    let i = rng.below(data.len());
                    data[i] = rng.next() as u8;
                }
            }
        }
    }
}

/// A fuzz target: a name, its corpus folder name, and a function that must not panic.
struct Target {
    name: &'static str,
    run: fn(&[u8]),
    /// Tokens for the text-aware mutation beside the common ones.
    words: &'static [&'static str],
}

fn corpus_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fuzz")
        .join(name)
}

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let out: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!out.is_empty(), "empty corpus {}", dir.display());
    out
}

/// A scratch file per thread for targets that read from a path.
fn scratch(ext: &str, data: &[u8]) -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    let p = dir
        .path()
        .join(format!("input-{:?}.{ext}", std::thread::current().id()).replace(['(', ')'], ""));
    std::fs::write(&p, data).unwrap();
    p
}

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

fn target_gguf(data: &[u8]) {
    let path = Path::new("fuzz.gguf");
    let mut cur = std::io::Cursor::new(data);
    if let Ok(content) = candor::weights::gguf::read_checked(path, &mut cur) {
        let _ = candor::model::arch::ModelConfig::from_gguf(&content);
        if let Ok(tok) = candor::text::tokenizer::Tokenizer::from_gguf(&content) {
            let _ = tok.encode("Hello, world! 123");
            if let Ok(t) = ChatTemplate::from_gguf(&content, &tok) {
                // A mutated template may run out of budget; it must not run away.
                let _ = t.render(&[Message::user("hi")], true);
            }
        }
    }
}

/// Each input is read both as a safetensors file and as a shard index (beside a valid shard), so
/// mutants of either corpus file reach the header checks and the index/shard agreement checks.
fn target_safetensors(data: &[u8]) {
    use candor::weights::safetensors::{read_header, shards_from_index};
    let _ = read_header(&scratch("safetensors", data));
    thread_local! {
        static DIR: tempfile::TempDir = {
            let dir = tempfile::tempdir().unwrap();
            let shard = std::fs::read(corpus_dir("safetensors").join("model.safetensors")).unwrap();
            std::fs::write(dir.path().join("model-00001-of-00001.safetensors"), shard).unwrap();
            dir
        };
    }
    DIR.with(|dir| {
        let index = dir.path().join("model.safetensors.index.json");
        std::fs::write(&index, data).unwrap();
        let _ = shards_from_index(&index);
    });
}

fn default_tokenizer() -> Option<&'static candor::text::tokenizer::Tokenizer> {
    static TOK: OnceLock<Option<candor::text::tokenizer::Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let model = util::default_model()?;
        Some(candor::text::tokenizer::Tokenizer::from_gguf_file(&model).unwrap())
    })
    .as_ref()
}

fn target_tokenizer(data: &[u8]) {
    let Some(tok) = default_tokenizer() else {
        return;
    };
    let s = text(data);
    if let Ok(ids) = tok.encode(&s) {
        // Not an exact round trip: SmolLM2's vocabulary lacks some byte tokens (0x1d, found
        // by this target), which llama.cpp and tokenizers drop too. Decoding must not panic
        // and re-encoding is deterministic.
        let back = tok.decode(&ids);
        assert_eq!(tok.encode(&back).ok(), tok.encode(&back).ok());
    }
    let _ = tok.encode_plain(&s);
    // Arbitrary ids, including out-of-vocabulary ones.
    let ids: Vec<u32> = data
        .chunks(2)
        .map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0)))
        .collect();
    let _ = tok.decode(&ids);
    let _ = tok.decode_skip_special(&ids);
}

fn templates() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
            .collect();
        files.sort();
        files
            .iter()
            .map(|p| {
                ChatTemplate::new(std::fs::read_to_string(p).unwrap(), "<s>", "</s>")
                    .unwrap()
                    .with_origin(p.display())
                    .unwrap()
            })
            .collect()
    })
}

fn target_template(data: &[u8]) {
    // Messages from the bytes: each 0x00 starts a message whose first byte picks the role.
    let mut messages = Vec::new();
    for chunk in data.split(|&b| b == 0) {
        let (role, rest) = match chunk.split_first() {
            Some((r, rest)) => (r % 3, rest),
            None => (0, chunk),
        };
        let role = [Role::System, Role::User, Role::Assistant][role as usize];
        messages.push(Message::new(role, text(rest)));
    }
    for t in templates() {
        for gen in [true, false] {
            match t.render(&messages, gen) {
                Ok(_) => {}
                Err(e) => {
                    // Budget errors on arbitrary messages would mean the budget is too small
                    // for real templates.
                    let msg = e.to_string();
                    assert!(!msg.contains("over budget"), "{msg}");
                }
            }
        }
    }
}

/// The environment variable that names the input a `template_source` child renders.
const CHILD_INPUT: &str = "CANDOR_FUZZ_TEMPLATE_CHILD";

/// Peak resident memory one template source may take (its whole child process).
const TEMPLATE_PEAK_KIB: i64 = 256 * 1024;

/// The largest peak resident memory (KiB) and CPU time (µs) of the `template_source` children.
static TEMPLATE_PEAK: AtomicI64 = AtomicI64::new(0);
static TEMPLATE_CPU_US: AtomicI64 = AtomicI64::new(0);

/// A template source, compiled and rendered in a child process (a template over its memory
/// budget ends its process, by design) whose peak resident memory and CPU time are measured:
/// every input must end in under [`SLOW`] of CPU time and [`TEMPLATE_PEAK_KIB`], either
/// rendering, refused with an error, or refused by the memory or CPU-time budget's one-line
/// exit.
/// CPU time rather than wall time, so that a machine that pauses the child does not fail it.
fn target_template_source(data: &[u8]) {
    let input = scratch("jinja", data);
    // Reaped below by `wait4`, which also gives the child's resource usage.
    #[allow(clippy::zombie_processes)]
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "fuzz::template_source_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_INPUT, &input)
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut pipe, &mut s);
        s
    });
    // A hang guard (the CPU time below is what is asserted), and the child's peak resident
    // memory: its own high-water mark (`VmHWM`, which starts afresh at exec), read every few
    // milliseconds while it runs. `wait4`'s `ru_maxrss` cannot serve: Linux carries the
    // parent's high-water mark into a child at exec, and this test binary's other tests hold
    // models of hundreds of megabytes.
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let hwm = std::sync::Arc::new(AtomicI64::new(0));
    let watchdog = {
        let (done, hwm) = (done.clone(), hwm.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let status = format!("/proc/{pid}/status");
            while !done.load(Ordering::Relaxed) {
                if start.elapsed() > Duration::from_secs(120) {
                    // SAFETY: kill only signals the child this call spawned and has not reaped.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return;
                }
                if let Ok(text) = std::fs::read_to_string(&status) {
                    let kib = text
                        .lines()
                        .find_map(|l| l.strip_prefix("VmHWM:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
                    if let Some(kib) = kib {
                        hwm.fetch_max(kib, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for the child we spawned.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our unreaped child; the pointers are to live locals.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    done.store(true, Ordering::Relaxed);
    watchdog.join().unwrap();
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    let stderr = reader.join().unwrap();
    // The child's own report on a normal exit (the last line), else the samples; a child
    // ended by the memory budget was held under it.
    let reported: Option<i64> = stderr
        .lines()
        .last()
        .and_then(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok());
    let peak_kib = hwm.load(Ordering::Relaxed).max(reported.unwrap_or(0));
    let cpu_us = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1_000_000
        + usage.ru_utime.tv_usec
        + usage.ru_stime.tv_usec;
    TEMPLATE_PEAK.fetch_max(peak_kib, Ordering::Relaxed);
    TEMPLATE_CPU_US.fetch_max(cpu_us, Ordering::Relaxed);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        libc::WIFEXITED(status),
        "child ended by signal {}: {last}",
        libc::WTERMSIG(status)
    );
    let code = libc::WEXITSTATUS(status);
    assert!(
        code == 0
            || (code == 1
                && (last.contains("chat template exceeded its memory budget")
                    || last.contains("chat template exceeded its CPU-time budget"))),
        "child exited with {code}: {stderr}"
    );
    assert!(
        code != 0 || reported.is_some(),
        "the child did not report its VmHWM: {stderr}"
    );
    assert!(
        peak_kib < TEMPLATE_PEAK_KIB,
        "peak resident memory {peak_kib} KiB: {last}"
    );
    assert!(
        cpu_us < SLOW.as_micros() as i64,
        "{cpu_us} µs of CPU time: {last}"
    );
}

/// The child side of [`target_template_source`], which runs it with [`CHILD_INPUT`] set.
#[test]
#[ignore = "child process of the template_source fuzz target; run by it with --ignored --exact"]
fn template_source_child() {
    let path = std::env::var_os(CHILD_INPUT).unwrap_or_else(|| {
        panic!("the child process of the template_source fuzz target: needs {CHILD_INPUT}")
    });
    render_template_source(&std::fs::read(path).unwrap());
    // The parent reads this process's own high-water mark from the last line.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if let Some(hwm) = status.lines().find(|l| l.starts_with("VmHWM:")) {
        eprintln!("{hwm}");
    }
}

fn render_template_source(data: &[u8]) {
    let source = text(data);
    let Ok(t) = ChatTemplate::new(source, "<s>", "</s>").and_then(|t| t.with_origin("fuzz.jinja"))
    else {
        return;
    };
    let long = Message::user("word ".repeat(2000));
    for messages in [
        vec![Message::user("hi")],
        vec![Message::system("Be brief."), long, Message::assistant("4")],
    ] {
        let _ = t.render(&messages, true);
    }
}

fn target_fbbench(data: &[u8]) {
    let p = Path::new("fuzz.json");
    let _ = candor::bench::fbbench::data::parse_dataset(data, p);
    let path = scratch("jsonl", data);
    let _ = candor::bench::fbbench::data::load_judgements(&path);
    let _ = candor::bench::fbbench::data::load_answers(&path);
}

fn target_refutebench(data: &[u8]) {
    use candor::bench::refutebench::source::Source;
    for rel in [
        "qa/single/qa.memory.NC-1.jsonl",
        "mt/multi/en-zh.jsonl",
        "email/single/email.generalization.NC-0.jsonl",
    ] {
        let source = Source::from_rel_path(rel).unwrap();
        let _ = candor::bench::refutebench::data::parse_reader(data, &source, Path::new(rel));
    }
}

fn target_realmistake(data: &[u8]) {
    let path = scratch("zip", data);
    let _ = candor::bench::realmistake::data::load_benchmark(&path);
    let _ = candor::bench::realmistake::data::load_detector_outputs(&path);
}

fn target_fennec(data: &[u8]) {
    let p = Path::new("fuzz.jsonl");
    let s = text(data);
    let _ = candor::bench::fennec::data::parse_autoj(&s, p);
    use candor::bench::fennec::data::PandaLabel;
    for label in [PandaLabel::Annotator1, PandaLabel::Majority] {
        let _ = candor::bench::fennec::data::parse_pandalm(&s, p, label);
    }
    let _ = candor::bench::fennec::data::parse_verdicts(&s, p);
    let path = scratch("jsonl", data);
    let _ = candor::bench::fennec::data::load_mt_bench(&path);
}

fn target_verdicts(data: &[u8]) {
    use candor::judge::{checklist, error_detection, feedback_acceptance, fennec};
    let s = text(data);
    let criteria: Vec<checklist::Criterion> = ["回答是否正确", "是否礼貌", "x"]
        .iter()
        .enumerate()
        .map(|(i, t)| checklist::Criterion {
            text: t.to_string(),
            weight: (i < 2).then(|| serde_json::Number::from_f64(0.5).unwrap()),
        })
        .collect();
    let _ = checklist::parse_output(&s, &criteria);
    let _ = checklist::parse_output(&s, &[]);
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&s) {
        let _ = checklist::from_recorded(&v);
    }
    let _ = feedback_acceptance::parse(&s);
    let _ = error_detection::parse_detection(&s);
    let _ = fennec::parse_pair_scores(&s);
    let _ = fennec::parse_single_score(&s);
    let _ = fennec::parse_criteria(&s, 5);
    let _ = fennec::clean_guideline(&s);
}

fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "gguf",
            words: &[],
            run: target_gguf,
        },
        Target {
            name: "safetensors",
            words: &[],
            run: target_safetensors,
        },
        Target {
            name: "tokenizer",
            words: &[],
            run: target_tokenizer,
        },
        Target {
            name: "template",
            words: &[],
            run: target_template,
        },
        Target {
            name: "template_source",
            words: LARGE_VALUES,
            run: target_template_source,
        },
        Target {
            name: "fbbench",
            words: &[],
            run: target_fbbench,
        },
        Target {
            name: "refutebench",
            words: &[],
            run: target_refutebench,
        },
        Target {
            name: "realmistake",
            words: &[],
            run: target_realmistake,
        },
        Target {
            name: "fennec",
            words: &[],
            run: target_fennec,
        },
        Target {
            name: "verdicts",
            words: &[],
            run: target_verdicts,
        },
    ]
}

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|v| v.parse().ok())
}

/// Runs one target for `iters` mutated inputs (or until `limit` has passed); returns
/// (executions, elapsed).
fn fuzz(target: &Target, seed: u64, iters: u64, limit: Option<Duration>) -> (u64, Duration) {
    let seeds = corpus(target.name);
    let mut rng = Rng(seed ^ fxhash(target.name));
    let start = Instant::now();
    // Every corpus file as is, then mutants.
    for s in &seeds {
        run_one(target, s, seed, u64::MAX);
    }
    // `CANDOR_FUZZ_PEAKS=1`: save each input that raises the peak resident set by 16 MiB or
    // more, to find what a long run's peak came from.
    let track_peaks = std::env::var_os("CANDOR_FUZZ_PEAKS").is_some();
    let mut peak_kb = peak_rss_kb().unwrap_or(0);
    let mut done = 0;
    for i in 0..iters {
        if limit.is_some_and(|l| start.elapsed() > l) {
            break;
        }
        done += 1;
        let mut data = seeds[rng.below(seeds.len())].clone();
        for _ in 0..1 + rng.below(8) {
            mutate(&mut rng, &mut data, &seeds, target.words);
        }
        data.truncate(1 << 20);
        run_one(target, &data, seed, i);
        if track_peaks {
            let now = peak_rss_kb().unwrap_or(0);
            if now >= peak_kb + 16 * 1024 {
                let file = crashes_dir().join(format!("{}-{seed}-{i}-peak-{now}kB", target.name));
                std::fs::write(&file, &data).unwrap();
                // SAFETY: mallinfo2 only reads the allocator's counters.
                let mi = unsafe { libc::mallinfo2() };
                eprintln!(
                    "fuzz {}: peak {now} kB after {} (malloc: {} kB in use, {} kB free in arenas, {} kB mmapped)",
                    target.name,
                    file.display(),
                    mi.uordblks / 1024,
                    mi.fordblks / 1024,
                    mi.hblkhd / 1024
                );
                peak_kb = now;
            }
        }
    }
    (done + seeds.len() as u64, start.elapsed())
}

/// The process's peak resident set (`VmHWM`), where /proc tells it.
fn peak_rss() -> Option<String> {
    peak_rss_kb().map(|kb| format!("{kb} kB"))
}

fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line["VmHWM:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn crashes_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-crashes");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn run_one(target: &Target, data: &[u8], seed: u64, i: u64) {
    let start = Instant::now();
    let result = std::panic::catch_unwind(|| (target.run)(data));
    let elapsed = start.elapsed();
    let failure = match result {
        Err(e) => Some(format!(
            "panicked: {}",
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
        Ok(()) if elapsed > SLOW => Some(format!("took {elapsed:?}")),
        Ok(()) => None,
    };
    if let Some(why) = failure {
        let file = crashes_dir().join(format!("{}-{seed}-{i}", target.name));
        std::fs::write(&file, data).unwrap();
        panic!(
            "fuzz target {} {why} on input {} (seed {seed}, iteration {i})",
            target.name,
            file.display()
        );
    }
}

/// The GGUF seed is a valid model header, so mutants reach the metadata, tokenizer and
/// template checks rather than stopping at the magic.
#[test]
fn fuzz_gguf_seed_is_valid() {
    let bytes = std::fs::read(corpus_dir("gguf").join("tiny.gguf")).unwrap();
    let content = candor::weights::gguf::read_checked(
        Path::new("tiny.gguf"),
        &mut std::io::Cursor::new(&bytes),
    )
    .unwrap();
    candor::model::arch::ModelConfig::from_gguf(&content).unwrap();
    let tok = candor::text::tokenizer::Tokenizer::from_gguf(&content).unwrap();
    let t = ChatTemplate::from_gguf(&content, &tok).unwrap();
    assert!(t
        .render(&[Message::user("hi")], true)
        .unwrap()
        .contains("hi"));
}

#[test]
fn fuzz_smoke() {
    let iters = env_u64("CANDOR_FUZZ_ITERS").unwrap_or(SMOKE_ITERS);
    let seed = env_u64("CANDOR_FUZZ_SEED").unwrap_or(14);
    let only = std::env::var("CANDOR_FUZZ_TARGET").ok();
    let limit = env_u64("CANDOR_FUZZ_SECONDS").map(Duration::from_secs);
    if let Ok(file) = std::env::var("CANDOR_FUZZ_REPLAY") {
        // Reproduce one saved input: `CANDOR_FUZZ_TARGET=<name> CANDOR_FUZZ_REPLAY=<file>`.
        let name = only.expect("CANDOR_FUZZ_REPLAY needs CANDOR_FUZZ_TARGET");
        let target = targets()
            .into_iter()
            .find(|t| t.name == name)
            .expect("unknown target");
        let data = std::fs::read(&file).unwrap();
        let start = Instant::now();
        (target.run)(&data);
        eprintln!("fuzz {name}: {file} ran in {:?}", start.elapsed());
        return;
    }
    for target in targets() {
        if only.as_deref().is_some_and(|o| o != target.name) {
            continue;
        }
        let (n, elapsed) = fuzz(&target, seed, iters, limit);
        eprintln!(
            "fuzz {}: {n} executions in {:.1} s (seed {seed}), peak resident memory so far {}",
            target.name,
            elapsed.as_secs_f64(),
            peak_rss().unwrap_or_else(|| "unknown".into())
        );
        if target.name == "template_source" {
            eprintln!(
                "fuzz template_source: largest child peak {} KiB, most CPU time {} ms",
                TEMPLATE_PEAK.load(Ordering::Relaxed),
                TEMPLATE_CPU_US.load(Ordering::Relaxed) / 1000
            );
        }
    }
}
