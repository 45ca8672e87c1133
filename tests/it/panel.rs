//! Panels of judges (`--judge A --judge B --judge C`) through the binary with `fake:` models:
//! every judge's steps are logged, an interrupted run resumes to the same bytes, `candor
//! verify` recomputes every judge's steps, shards merge to the unsharded bytes, and the
//! generation cache serves every judge; RefuteBench's FA panel votes as documented.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::util::shared_data;

fn candor() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_candor"));
    c.stdin(Stdio::null());
    c.env("CANDOR_NO_CACHE", "1");
    c
}

fn ok(args: &[String]) -> Output {
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

fn sample_items() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/fbbench/sample_v3.json")
}

/// `candor run fbbench` on the sample items with a three-judge panel, into `out`.
fn fbbench_args(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["run", "fbbench", "--items"].map(String::from).to_vec();
    args.push(sample_items().display().to_string());
    args.extend(
        [
            "--model",
            "fake:cand",
            "--judge",
            "fake:ja",
            "--judge",
            "fake:jb",
            "--judge",
            "fake:cand",
            "--threads",
            "1",
            "--batch-size",
            "2",
            "--out",
        ]
        .map(String::from),
    );
    args.push(out.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn keys(samples: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(samples)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["key"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn fbbench_panel_logs_every_judge_resumes_verifies_merges_and_caches() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    ok(&fbbench_args(&whole, &[]));
    let samples = read(&whole, "samples.jsonl");
    let k = keys(&samples);
    // Four items: a follow-up and three judges each.
    assert_eq!(k.len(), 16, "{k:?}");
    for key in ["followup", "judge", "judge/judge/1", "judge/judge/2"] {
        assert_eq!(k.iter().filter(|x| *x == key).count(), 4, "{key}: {k:?}");
    }
    let results: serde_json::Value = serde_json::from_slice(&read(&whole, "results.json")).unwrap();
    let text = results.to_string();
    // The panel's metrics, then each judge's; the fakes' replies are no JSON, so every
    // judgement is unscored, per judge and for the panel, and counted.
    for name in ["\"overall\"", "\"judge/0/overall\"", "\"judge/2/overall\""] {
        assert!(text.contains(name), "{name} missing: {text}");
    }
    assert!(
        text.contains("panel_judges") && text.contains("judge_kappa"),
        "{text}"
    );
    assert!(
        text.contains("judge 2 (fake:cand; self-judging: also the candidate)"),
        "the self-judging judge is named: {text}"
    );
    // The length-limit table names the panel's other judges' steps by judge (it once said
    // `judge/judge/*`).
    assert!(
        text.contains("\"judge · judge 1\"") && text.contains("\"judge · judge 2\""),
        "{text}"
    );
    assert!(!text.contains("judge/judge/*"), "{text}");
    let manifest: serde_json::Value =
        serde_json::from_slice(&read(&whole, "manifest.json")).unwrap();
    let roles: Vec<&str> = manifest["identity"]["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["candidate/0", "judge", "judge/1", "judge/2"]);
    // One judgement file per judge.
    for j in [
        "fake_cand.jsonl",
        "fake_cand.judge1.jsonl",
        "fake_cand.judge2.jsonl",
    ] {
        assert!(whole.join("judgments").join(j).is_file(), "{j}");
    }

    // Interrupted after 7 steps: the rerun resumes to the same bytes.
    let resumed = tmp.path().join("resumed");
    ok(&fbbench_args(&resumed, &[]));
    let half: Vec<&str> = std::str::from_utf8(&samples)
        .unwrap()
        .lines()
        .take(7)
        .collect();
    std::fs::write(resumed.join("samples.jsonl"), half.join("\n") + "\n").unwrap();
    for f in ["results.json", "report.md", "report.html"] {
        std::fs::remove_file(resumed.join(f)).unwrap();
    }
    let out = ok(&fbbench_args(&resumed, &[]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("resumed"));
    for f in ["samples.jsonl", "results.json", "report.md"] {
        assert!(
            read(&resumed, f) == read(&whole, f),
            "{f} differs after resuming"
        );
    }

    // Verify recomputes every judge's steps.
    let out = ok(&["verify".to_string(), whole.display().to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("16 identical, 0 differing"), "{text}");

    // Two shards merge to the unsharded bytes.
    let mut merge = vec!["merge".to_string()];
    for i in 0..2 {
        let d = tmp.path().join(format!("shard{i}"));
        ok(&fbbench_args(&d, &["--shard", &format!("{i}/2")]));
        merge.push(d.display().to_string());
    }
    let merged = tmp.path().join("merged");
    merge.extend(["--out".to_string(), merged.display().to_string()]);
    ok(&merge);
    for f in ["samples.jsonl", "results.json", "report.md"] {
        assert!(
            read(&merged, f) == read(&whole, f),
            "{f} differs after merging"
        );
    }

    // The generation cache serves every judge on a second run.
    let cache = tmp.path().join("cache");
    let cached = |dir: &Path| {
        let mut args = fbbench_args(dir, &["--cache-dir"]);
        args.push(cache.display().to_string());
        let out = Command::new(env!("CARGO_BIN_EXE_candor"))
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    cached(&tmp.path().join("c1"));
    let err = cached(&tmp.path().join("c2"));
    assert!(err.contains("16 replies reused"), "{err}");
    assert!(read(&tmp.path().join("c2"), "results.json") == read(&whole, "results.json"));
}

#[test]
fn panels_are_refused_where_they_do_not_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let refused = |args: Vec<String>, want: &str| {
        let out = candor().args(&args).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{want}: {err}");
    };
    let out = tmp.path().join("x");
    let mut one = fbbench_args(&out, &["--panel", "mean"]);
    // One judge only: drop the second and third.
    let at = one.iter().position(|a| a == "fake:jb").unwrap();
    one.drain(at - 1..at + 3);
    refused(one, "--panel \"mean\": needs several --judge");
    refused(
        fbbench_args(&out, &["--panel", "vote"]),
        "the values are `majority` and `mean`",
    );
    let fennec: Vec<String> = [
        "run", "fennec", "--judge", "fake:a", "--judge", "fake:b", "--out",
    ]
    .map(String::from)
    .into_iter()
    .chain([out.display().to_string()])
    .collect();
    refused(fennec, "fennec takes one --judge, but 2 were given");
}

#[test]
fn refutebench_fa_panel_votes_by_majority_and_mean() {
    let Some(data) = shared_data() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| -> serde_json::Value {
        let dir = tmp.path().join(name);
        let mut args: Vec<String> = [
            "run",
            "refutebench",
            "--subset",
            "qa/memory_nc0",
            "--limit",
            "3",
            "--model",
            "fake:cand",
            "--judge",
            "fake:yes-a",
            "--judge",
            "fake:no-b",
            "--judge",
            "fake:yes-c",
            "--threads",
            "1",
            "--data",
        ]
        .map(String::from)
        .to_vec();
        args.push(data.display().to_string());
        args.extend(["--out".to_string(), dir.display().to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        ok(&args);
        serde_json::from_slice(&read(&dir, "results.json")).unwrap()
    };
    let metric = |r: &serde_json::Value, name: &str| -> f64 {
        r["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {r}"))["interval"]["value"]
            .as_f64()
            .unwrap()
    };
    let majority = run("majority", &[]);
    // Two of three judges say Yes on every turn: the panel accepts all; judge 1 none.
    assert_eq!(metric(&majority, "qa_memory_nc0_fa"), 100.0);
    assert_eq!(metric(&majority, "judge/0/qa_memory_nc0_fa"), 100.0);
    assert_eq!(metric(&majority, "judge/1/qa_memory_nc0_fa"), 0.0);
    let mean = run("mean", &["--panel", "mean"]);
    assert!((metric(&mean, "qa_memory_nc0_fa") - 200.0 / 3.0).abs() < 1e-9);
    // The judges never agree beyond chance: always Yes against always No.
    let text = majority.to_string();
    assert!(text.contains("Agreement between the FA judges"), "{text}");
}
