//! `candor run` through the binary: help, argument errors, a run killed with SIGKILL and
//! resumed to byte-identical files, and the refusal of a mismatched resume.
//!
//! These use the hidden `toy` protocol with `fake:` models (a scripted stand-in whose reply is
//! a hash of the prompt), so they need neither weights nor data.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn candor() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_candor"));
    c.stdin(Stdio::null());
    // Repeated runs must recompute, not reuse the generation cache.
    c.env("CANDOR_NO_CACHE", "1");
    c
}

fn toy_args(out: &Path, limit: usize, batch: usize) -> Vec<String> {
    [
        "run",
        "toy",
        "--model",
        "fake:cand",
        "--judge",
        "fake:judge",
        "--limit",
        &limit.to_string(),
        "--batch-size",
        &batch.to_string(),
        "--threads",
        "1",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.display().to_string()])
    .collect()
}

fn run_ok(args: &[String]) -> Output {
    let out = candor().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "candor {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `candor report DIR --out DIR/report-page` succeeds and writes a page; returns its text.
fn report_ok(dir: &Path) -> String {
    let page = dir.join("report-page");
    run_ok(&[
        "report".to_string(),
        dir.display().to_string(),
        "--out".to_string(),
        page.display().to_string(),
    ]);
    String::from_utf8(std::fs::read(page.join("index.html")).unwrap()).unwrap()
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{}/{name}: {e}", dir.display()))
}

fn lines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n').count()
}

#[test]
fn run_help_explains_every_option() {
    let out = candor().args(["run", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--model",
        "--judge",
        "--subset",
        "--limit",
        "--out",
        "--batch-size",
        "--threads",
        "--seed",
        "fbbench",
        "refutebench",
        "realmistake",
        "fennec",
        "resumed",
    ] {
        assert!(help.contains(flag), "help lacks {flag}:\n{help}");
    }
    assert!(
        !help.contains("toy"),
        "the test protocol is hidden:\n{help}"
    );
    assert!(
        !help.contains("fake:"),
        "the test models' options are hidden, and their text is not another option's:\n{help}"
    );
}

#[test]
fn bad_arguments_exit_non_zero_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = toy_args(tmp.path(), 3, 1);
    let i = args.iter().position(|a| a == "--batch-size").unwrap();
    args[i + 1] = "0".into();
    let out = candor().args(&args).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--batch-size must be at least 1"), "{err}");
    let out = candor()
        .args(["run", "nonesuch", "--out", "x"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// A run whose items fail on their own (a request the model refuses, a chat template that
/// raises, a prompt longer than the context) completes with exit 0: each failure is a failed
/// step with its reason in samples.jsonl, the item's later steps are skipped and counted, and
/// results.json and report.md show the failed count beside every metric.
#[test]
fn a_run_with_failed_items_completes_and_counts_them() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run_ok(&toy_args(tmp.path(), 12, 4));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("toy: 12 items, 9 completed, 3 failed (6 later steps skipped)"),
        "{stdout}"
    );
    assert!(stdout.contains("n=7 unscored=2 failed=3"), "{stdout}");
    let samples = String::from_utf8(read(tmp.path(), "samples.jsonl")).unwrap();
    let errors: Vec<serde_json::Value> = samples
        .lines()
        .filter(|l| l.contains("\"error\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got: Vec<(&str, &str)> = errors
        .iter()
        .map(|e| (e["item"].as_str().unwrap(), e["error"].as_str().unwrap()))
        .collect();
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[0].0, "toy-005");
    assert!(got[0].1.contains("refuses"), "{got:?}");
    assert_eq!(got[1].0, "toy-009");
    assert!(got[1].1.starts_with("chat template raised"), "{got:?}");
    assert_eq!(got[2].0, "toy-010");
    assert!(got[2].1.contains("fills the model's context"), "{got:?}");
    // 9 complete items × 3 steps, 3 failed first steps; nothing else was asked for them.
    assert_eq!(samples.lines().count(), 9 * 3 + 3);
    let results: serde_json::Value =
        serde_json::from_slice(&read(tmp.path(), "results.json")).unwrap();
    assert_eq!(results["skipped_steps"], 6);
    assert_eq!(results["metrics"][0]["failed"], 3);
    let report = String::from_utf8(read(tmp.path(), "report.md")).unwrap();
    assert!(report.contains("| n | unscored | failed |"), "{report}");
    // `candor report` reads a run with failed items.
    let page = report_ok(tmp.path());
    assert!(
        page.contains("failed 3"),
        "the page does not count the failed items"
    );
}

/// Without a terminal, progress is plain lines on stderr at a fixed interval, each with the
/// whole run's steps done out of planned, tokens, tok/s and a measured ETA.
#[test]
fn progress_without_a_terminal_is_periodic_plain_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = toy_args(tmp.path(), 12, 2);
    args.extend(["--fake-delay-ms".to_string(), "300".to_string()]);
    let out = candor()
        .args(&args)
        .env("CANDOR_PROGRESS_SECS", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(" steps (")).collect();
    assert!(lines.len() >= 3, "{err}");
    // The planned total covers every round: 12 items × 3 steps, less what failed items skip.
    assert!(lines[0].contains("/36 steps"), "{err}");
    assert!(
        lines.last().unwrap().contains("30/30 steps (100%)"),
        "{err}"
    );
    assert!(lines.iter().any(|l| l.contains("tok/s, ETA 00:")), "{err}");
}

#[test]
fn options_a_protocol_does_not_use_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("fbbench")).unwrap();
    let base = ["run", "fbbench", "--data", data.to_str().unwrap(), "--out"];
    let cases: [(&[&str], &str); 3] = [
        (
            &["--branches", "3"],
            "candor: error: --branches does not apply to fbbench\n",
        ),
        (
            &["--model", "a.gguf", "--model", "b.gguf"],
            "candor: error: fbbench evaluates one --model, but 2 were given; run it once per \
             model\n",
        ),
        (
            &["--recall"],
            "candor: error: --recall does not apply to fbbench\n",
        ),
    ];
    for (extra, want) in cases {
        let out = candor()
            .args(base)
            .arg(tmp.path().join("out"))
            .args(extra)
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{extra:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), want, "{extra:?}");
    }
    // Refused before any data is looked for.
    let out = candor()
        .args([
            "run",
            "realmistake",
            "--judge",
            "j.gguf",
            "--data",
            "/nonexistent",
            "--out",
        ])
        .arg(tmp.path().join("rm"))
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "candor: error: --judge does not apply to realmistake: no judge takes part (every \
         --model is evaluated)\n"
    );
}

/// Kills `candor run` with SIGKILL at several points (before anything is written, and after
/// 1, a third and two thirds of the samples), resumes each, and compares every output file
/// with an uninterrupted run's.
#[test]
fn run_killed_with_sigkill_resumes_to_identical_files() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = tmp.path().join("reference");
    let out = run_ok(&toy_args(&reference, 24, 4));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("c0_score"), "{stdout}");
    let (samples, results, report) = (
        read(&reference, "samples.jsonl"),
        read(&reference, "results.json"),
        read(&reference, "report.md"),
    );
    let total = lines(&samples);
    assert!(total > 30, "{total}");

    let mut mid_run_kills = 0;
    for (k, wait_lines) in [0, 1, total / 3, 2 * total / 3].into_iter().enumerate() {
        let dir = tmp.path().join(format!("killed{k}"));
        let mut args = toy_args(&dir, 24, 2);
        args.extend(["--fake-delay-ms".to_string(), "25".to_string()]);
        let mut child = candor()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while wait_lines > 0 && start.elapsed() < Duration::from_secs(60) {
            let n = std::fs::read(dir.join("samples.jsonl")).map_or(0, |b| lines(&b));
            if n >= wait_lines || child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap(); // SIGKILL on Unix
        let status = child.wait().unwrap();
        let partial = std::fs::read(dir.join("samples.jsonl")).unwrap_or_default();
        let kept = lines(&partial);
        let complete_prefix = &partial[..partial
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1)];
        assert!(
            samples.starts_with(complete_prefix),
            "kill {k}: the killed log is not a prefix of the reference"
        );
        if !status.success() && kept > 0 && kept < total {
            mid_run_kills += 1;
        }
        assert!(!dir.join("results.json").exists() || kept == total);
        eprintln!("kill {k}: {kept} of {total} lines logged when killed");

        let out = run_ok(&toy_args(&dir, 24, 3));
        let err = String::from_utf8_lossy(&out.stderr);
        if kept > 0 {
            assert!(err.contains("resumed"), "{err}");
        }
        assert!(
            read(&dir, "samples.jsonl") == samples,
            "kill {k}: samples differ"
        );
        assert!(
            read(&dir, "results.json") == results,
            "kill {k}: results differ"
        );
        assert!(
            read(&dir, "report.md") == report,
            "kill {k}: report differs"
        );
    }
    assert!(
        mid_run_kills >= 2,
        "only {mid_run_kills} kills landed mid-run"
    );
}

#[test]
fn a_run_with_other_settings_in_the_same_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("run");
    run_ok(&toy_args(&dir, 4, 2));
    let before = read(&dir, "samples.jsonl");
    let mut args = toy_args(&dir, 4, 2);
    args.extend(["--seed".to_string(), "5".to_string()]);
    let out = candor().args(&args).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("different settings"), "{err}");
    assert!(err.contains("seed (on disk 0, now 5)"), "{err}");
    let args = toy_args(&dir, 5, 2);
    let out = candor().args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("settings.limit (on disk 4, now 5)"), "{err}");
    assert_eq!(read(&dir, "samples.jsonl"), before);
    // Batch size and threads do not change results: resuming with others is allowed.
    run_ok(&toy_args(&dir, 4, 7));
    assert_eq!(read(&dir, "samples.jsonl"), before);
}

// ---- integrate: the four protocols end to end with the real default model ----
//
// Small slices (one or two items, a few new tokens per step) so each run stays well under a
// minute on two cores. Each protocol completes and writes its four files; the same run twice
// gives identical samples and results; a real run killed with SIGKILL resumes to identical
// files.

/// `candor run <protocol>` with the default model on a small slice, or `None` (skipped) when
/// the model or the data is absent.
fn real_args(protocol: &str, out: &Path, extra: &[&str]) -> Option<Vec<String>> {
    crate::util::default_model()?;
    crate::util::shared_file(protocol)?;
    let mut args: Vec<String> = ["run", protocol, "--threads", "2", "--out"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    Some(args)
}

const RUN_FILES: [&str; 4] = [
    "manifest.json",
    "samples.jsonl",
    "results.json",
    "report.md",
];

/// Runs a real slice twice into two directories; checks the files and that samples and
/// results are identical. Returns the first run's directory.
fn real_run_twice(tmp: &Path, protocol: &str, extra: &[&str]) -> Option<PathBuf> {
    let a = tmp.join(format!("{protocol}-a"));
    let b = tmp.join(format!("{protocol}-b"));
    let start = Instant::now();
    let out = run_ok(&real_args(protocol, &a, extra)?);
    eprintln!("{protocol}: {:.1}s", start.elapsed().as_secs_f64());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("completed"), "{stdout}");
    for f in RUN_FILES {
        assert!(a.join(f).is_file(), "{protocol}: no {f}");
    }
    let manifest: serde_json::Value = serde_json::from_slice(&read(&a, "manifest.json")).unwrap();
    let models = manifest["identity"]["models"].as_array().unwrap();
    assert_eq!(
        models[0]["sha256"],
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    );
    for key in ["tokenizer_sha256", "chat_template_sha256"] {
        assert_eq!(models[0][key].as_str().map(str::len), Some(64), "{key}");
    }
    assert!(!manifest["identity"]["data_files"]
        .as_array()
        .unwrap()
        .is_empty());
    assert!(!manifest["identity"]["prompt_templates"]
        .as_object()
        .unwrap()
        .is_empty());
    let samples = read(&a, "samples.jsonl");
    for line in samples.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_slice(line).unwrap();
        assert!(v["output"]["output_tokens"].as_u64().is_some(), "{v}");
    }
    // The second run recomputes every prompt (no prefix cache): reuse changes no byte.
    let mut off = extra.to_vec();
    off.extend(["--kv-cache-mb", "0"]);
    run_ok(&real_args(protocol, &b, &off)?);
    assert!(
        read(&a, "samples.jsonl") == read(&b, "samples.jsonl"),
        "{protocol}: samples differ between runs with and without the prefix cache"
    );
    assert!(
        read(&a, "results.json") == read(&b, "results.json"),
        "{protocol}: results differ between runs with and without the prefix cache"
    );
    let engine = |dir: &Path| -> serde_json::Value {
        serde_json::from_slice(&read(dir, "engine.json")).unwrap()
    };
    let (on, no) = (engine(&a), engine(&b));
    eprintln!("{protocol}: prefill with the prefix cache {on}, without {no}");
    assert_eq!(no["prefill_tokens_reused"], 0, "{protocol}: {no}");
    let total = |v: &serde_json::Value| {
        v["prefill_tokens_computed"].as_u64().unwrap()
            + v["prefill_tokens_reused"].as_u64().unwrap()
    };
    assert_eq!(
        total(&on),
        total(&no),
        "{protocol}: the same prompts either way"
    );
    let manifest: serde_json::Value = serde_json::from_slice(&read(&b, "manifest.json")).unwrap();
    assert_eq!(manifest["environment"]["kv_cache_mb"], 0);
    // `candor report` reads every run Candor writes, n/a (unscored) metrics included
    // (regression: `invalid type: null, expected f64` on a RefuteBench run).
    let results = String::from_utf8(read(&a, "results.json")).unwrap();
    eprintln!(
        "{protocol}: results.json has {} null values",
        results.matches("null").count()
    );
    let page = report_ok(&a);
    assert!(
        page.contains(protocol),
        "{protocol}: report page names no protocol"
    );
    Some(a)
}

#[test]
fn real_fbbench_completes_and_repeats_identically() {
    let tmp = tempfile::tempdir().unwrap();
    // The v3 item with the shortest texts (the judge prompt alone is long).
    let extra = [
        "--subset",
        "cb29734183cf0fed",
        "--max-new-tokens",
        "8",
        "--judge",
        "default",
    ];
    let Some(dir) = real_run_twice(tmp.path(), "fbbench", &extra) else {
        return;
    };
    // The published output format: the authors' judgement JSONL, one file per model.
    assert!(dir
        .join("judgments/SmolLM2-135M-Instruct.Q4_1.jsonl")
        .is_file());
    let results: serde_json::Value = serde_json::from_slice(&read(&dir, "results.json")).unwrap();
    assert_eq!(results["items"], 1, "{results}");
    // The run names what it is comparable with, and that the candidate judged itself.
    let report = String::from_utf8(read(&dir, "report.md")).unwrap();
    assert!(
        report.contains("| comparable with | FB-Bench v3 (591 items)"),
        "{report}"
    );
    assert!(
        report.contains("(self-judging: the judge is also the candidate)"),
        "{report}"
    );
    // Replies cut at --max-new-tokens 8 are counted per step kind.
    let table = results["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["title"] == "Replies stopped at the length limit")
        .expect("length table");
    let rows = table["rows"].as_array().unwrap();
    assert!(rows.iter().any(|r| r[0] == "judge"), "{table}");
}

#[test]
fn real_realmistake_completes_and_repeats_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = ["--limit", "1", "--prompt", "1-A", "--max-new-tokens", "8"];
    real_run_twice(tmp.path(), "realmistake", &extra);
}

#[test]
fn real_fennec_completes_and_repeats_identically() {
    let tmp = tempfile::tempdir().unwrap();
    // The Auto-J item with the shortest texts.
    let extra = [
        "--subset",
        "auto_j/1059",
        "--branches",
        "1",
        "--no-correction",
        "--max-new-tokens",
        "16",
    ];
    real_run_twice(tmp.path(), "fennec", &extra);
}

/// RefuteBench's dialogues are sequential (each turn needs the previous reply), so a run with
/// batch size 1 logs one sample per batch and is easy to kill mid-way.
#[test]
fn real_refutebench_repeats_and_resumes_after_sigkill_to_identical_files() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = [
        "--subset",
        "qa/memory_nc0",
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--batch-size",
        "1",
        "--judge",
        "default",
    ];
    let Some(reference) = real_run_twice(tmp.path(), "refutebench", &extra) else {
        return;
    };
    let samples = read(&reference, "samples.jsonl");
    let total = lines(&samples);
    assert!(total >= 4, "{total}");
    // Each turn extends the previous turn's prompt and reply: its blocks came from the cache.
    let engine: serde_json::Value =
        serde_json::from_slice(&read(&reference, "engine.json")).unwrap();
    assert!(
        engine["prefill_tokens_reused"].as_u64().unwrap() > 0,
        "{engine}"
    );
    let dir = tmp.path().join("killed");
    let args = real_args("refutebench", &dir, &extra).unwrap();
    let mut child = candor()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) {
        let n = std::fs::read(dir.join("samples.jsonl")).map_or(0, |b| lines(&b));
        if n >= 1 || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    let status = child.wait().unwrap();
    let kept = lines(&std::fs::read(dir.join("samples.jsonl")).unwrap_or_default());
    assert!(
        !status.success() && kept >= 1 && kept < total,
        "the kill did not land mid-run ({kept} of {total} lines, {status})"
    );
    assert!(!dir.join("results.json").exists());
    let out = run_ok(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("resumed"), "{err}");
    for f in ["samples.jsonl", "results.json", "report.md"] {
        assert!(
            read(&dir, f) == read(&reference, f),
            "{f} differs after kill and resume"
        );
    }
}

/// `--device`: an unknown device is an argument error; `cuda` in a build without the `cuda`
/// feature is refused before anything is loaded or written, saying how to rebuild; in a build
/// with it, a device the machine lacks is refused the same way.
#[test]
fn device_option_is_checked_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r");
    let mut args = toy_args(&out, 2, 1);
    args.extend(["--device".into(), "gpu".into()]);
    let res = candor().args(&args).output().unwrap();
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(err.contains("unknown device `gpu`"), "{err}");
    let n = args.len();
    args[n - 1] = "cuda:1".into();
    let res = candor().args(&args).output().unwrap();
    if cfg!(feature = "cuda") {
        // Built with CUDA: the toy's fake models never touch a device, so a real model's run
        // is refused instead when the machine lacks the device (no driver, no GPU, one GPU):
        // one line naming it, before anything is loaded or written.
        let devices = candor().arg("devices").output().unwrap();
        let Some(model) = crate::util::default_model() else {
            return;
        };
        if String::from_utf8_lossy(&devices.stdout).contains("cuda:1") {
            return; // a second GPU would run it
        }
        let m = model.display().to_string();
        let out = dir.path().join("real");
        let res = candor()
            .args([
                "run", "fbbench", "--model", &m, "--judge", &m, "--limit", "1",
            ])
            .args(["--device", "cuda:1", "--out"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(!res.status.success());
        let err = String::from_utf8_lossy(&res.stderr);
        assert!(err.contains("--device cuda:1"), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(!out.exists(), "a refused run wrote {}", out.display());
        return;
    }
    assert!(!res.status.success());
    let err = String::from_utf8_lossy(&res.stderr);
    assert!(
        err.contains("--device cuda:1") && err.contains("--features cuda"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(!out.exists(), "a refused run wrote {}", out.display());
    let devices = candor().arg("devices").output().unwrap();
    assert!(devices.status.success());
    let text = String::from_utf8_lossy(&devices.stdout);
    assert!(
        text.starts_with("cpu") && text.contains("no CUDA support"),
        "{text}"
    );
}

/// The default model's GGUF rewritten without `tokenizer.chat_template`: a base model as far
/// as Candor can tell. Returns the path and the template text that was removed.
fn base_model(dir: &Path) -> Option<(PathBuf, String)> {
    use candle_core::quantized::gguf_file;
    let src = crate::util::default_model()?;
    let mut f = std::fs::File::open(&src).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let template = content.metadata["tokenizer.chat_template"]
        .to_string()
        .unwrap()
        .clone();
    let md: Vec<(String, gguf_file::Value)> = content
        .metadata
        .iter()
        .filter(|(k, _)| k.as_str() != "tokenizer.chat_template")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let tensors = crate::util::gguf_tensors(&content, &mut f);
    let path = dir.join("base.gguf");
    crate::util::write_gguf(&path, &md, &tensors);
    Some((path, template))
}

/// Regression (issue #27): a model without a chat template could not be used by `candor
/// generate` at all. Raw `prompt` lines now work with it; a chat line, and a protocol run, fail
/// at once saying a template is needed and how to give one; `--chat-template FILE` gives one.
#[test]
fn base_model_without_a_template_generates_raw_prompts_and_runs_refuse_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((base, template)) = base_model(tmp.path()) else {
        return;
    };
    let base_s = base.display().to_string();
    let prompts = tmp.path().join("prompts.jsonl");
    let out = tmp.path().join("out.jsonl");
    let generate = |lines: &str, extra: &[&str]| {
        std::fs::write(&prompts, lines).unwrap();
        let _ = std::fs::remove_file(&out);
        candor()
            .args([
                "generate",
                "--model",
                &base_s,
                "--max-new-tokens",
                "4",
                "--threads",
                "2",
            ])
            .arg("--prompts")
            .arg(&prompts)
            .arg("--out")
            .arg(&out)
            .args(extra)
            .output()
            .unwrap()
    };
    let raw = "{\"id\": \"r\", \"prompt\": \"The capital of France is\"}\n";
    let o = generate(raw, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    assert_eq!(line["id"], "r");
    assert!(!line["prompt_ids"].as_array().unwrap().is_empty(), "{line}");
    assert!(!line["output_ids"].as_array().unwrap().is_empty(), "{line}");

    let chat = "{\"id\": \"c\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n";
    let o = generate(chat, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("prompts.jsonl: id \"c\""), "{err}");
    assert!(
        err.contains("no chat template") && err.contains("--chat-template FILE"),
        "{err}"
    );
    assert!(!out.exists());

    let tfile = tmp.path().join("template.jinja");
    std::fs::write(&tfile, &template).unwrap();
    let o = generate(chat, &["--chat-template", &tfile.display().to_string()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // A protocol run refuses at once, in one line, before writing anything.
    if crate::util::shared_file("fennec").is_none() {
        return;
    }
    let dir = tmp.path().join("run");
    let o = candor()
        .args(["run", "fennec", "--model", &base_s, "--limit", "1", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("no chat template") && err.contains("--chat-template FILE"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!dir.join("manifest.json").exists());
}
