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
