//! RefuteBench: loaders on every file of the authors' data (with the published counts), prompt
//! snapshots on our own samples (data/refutebench), and scoring of synthetic transcripts through
//! the library and the `candor score refutebench` command.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candor::bench::plan::Plan;
use candor::bench::plan::{StepOutput, Transcript};
use candor::bench::refutebench::data::{self, Content, Item, Setting};
use candor::bench::refutebench::dialogue::{self, End, ReplayOptions, TurnKind};
use candor::bench::refutebench::prompts;
use candor::bench::refutebench::score::{score, ScoreOptions, Status};
use candor::bench::refutebench::{RefutePlan, Strategy};
use candor::engine::StopReason;

use crate::util::shared_file;

fn samples_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/refutebench")
}

fn out(text: &str) -> StepOutput {
    StepOutput {
        text: text.to_string(),
        stop_reason: StopReason::Eos,
        prompt_tokens: 0,
        output_tokens: 0,
        truncated: None,
        reasoning: None,
    }
}

/// Lines per file of the authors' data at commit 24c2135 (`wc -l`).
const PUBLISHED: &[(&str, usize)] = &[
    ("email/multi/email.jsonl", 100),
    ("mt/multi/en-he.jsonl", 194),
    ("mt/multi/en-zh.jsonl", 283),
    ("qa/multi/qa.jsonl", 200),
];

#[test]
fn loads_every_real_file_with_published_counts() {
    let Some(root) = shared_file("refutebench") else {
        return;
    };
    let files = data::list_files(&root).expect("list");
    assert_eq!(files.len(), 36, "{files:?}");
    let mut total = 0;
    let mut by_setting: BTreeMap<(String, String), usize> = BTreeMap::new();
    for rel in &files {
        let items = data::load_file(&root, rel).unwrap_or_else(|e| panic!("{e}"));
        let source = &items[0].source;
        let want = match PUBLISHED.iter().find(|(f, _)| f == rel) {
            Some((_, n)) => *n,
            None => match (source.task.as_str(), rel.contains(".memory.")) {
                ("qa", true) => 200,
                ("qa", false) => 1227,
                ("mt", _) => 250,
                ("email", _) => 100,
                _ => unreachable!(),
            },
        };
        assert_eq!(items.len(), want, "{rel}");
        if let Setting::Single { context, .. } = source.setting {
            assert!(
                items.iter().all(|i| i.queries.len() == context + 3),
                "{rel}"
            );
        }
        total += items.len();
        *by_setting
            .entry((source.group(), source.setting.label()))
            .or_default() += items.len();
    }
    eprintln!("refutebench: {} files, {total} items", files.len());
    assert_eq!(total, 11285);
    // The paper's Table 1 sizes.
    assert_eq!(
        by_setting[&("qa".into(), "generalization_nc0".into())],
        1227
    );
    assert_eq!(by_setting[&("mt_en_zh".into(), "multi".into())], 283);
    assert_eq!(by_setting[&("email".into(), "multi".into())], 100);
    let all = data::load_all(&root).expect("load all");
    let ids: std::collections::HashSet<&str> = all.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids.len(), all.len(), "item ids are unique");
}

#[test]
fn real_data_replays_with_all_feedback_given_on_blank_replies() {
    // With empty replies nothing is "already satisfied", so every marker gets feedback except
    // MT markers whose sentence holds no remaining word, and email sentence rules where an empty
    // reply already has "less than N sentences".
    let Some(root) = shared_file("refutebench") else {
        return;
    };
    let items = data::load_all(&root).expect("load");
    let opts = ReplayOptions::default();
    let mut given = 0;
    let mut conflicts = 0;
    for item in &items {
        let t = run_canned(item, &opts, |_, _| String::new());
        let r = dialogue::replay(item, &t, &opts);
        assert!(!matches!(r.end, End::Waiting(_)), "{}", item.id);
        conflicts += usize::from(matches!(r.end, End::Conflict { .. }));
        given += r.turns.iter().filter(|t| t.is_feedback()).count();
        if let (Content::Qa(_), Setting::Single { .. }) = (&item.content, item.source.setting) {
            assert!(r.turns.iter().any(|t| t.is_feedback()), "{}", item.id);
        }
    }
    eprintln!(
        "refutebench: {given} feedback turns over {} items, {conflicts} conflicts",
        items.len()
    );
    assert_eq!(conflicts, 0);
    assert!(given > items.len());
}

#[test]
fn plan_runs_every_real_item_to_the_end() {
    // Canned replies that echo the step key: no feedback is "already satisfied" by them.
    let Some(root) = shared_file("refutebench") else {
        return;
    };
    let items = data::load_all(&root).expect("load");
    for strategy in [Strategy::Vanilla, Strategy::RecallRepeat] {
        let plan = RefutePlan {
            strategy,
            ..RefutePlan::new(0)
        };
        let (mut turns, mut judged, mut recalled) = (0usize, 0usize, 0usize);
        for item in &items {
            let mut done = Transcript::new();
            for round in 0.. {
                assert!(round < 200, "{} does not finish", item.id);
                let steps = plan.next_steps(item, &done);
                if steps.is_empty() {
                    break;
                }
                for step in steps {
                    assert!(!done.contains_key(&step.key), "{} {}", item.id, step.key);
                    let last = step.messages.last().expect("a message");
                    assert!(!last.content.is_empty(), "{} {}", item.id, step.key);
                    recalled += usize::from(last.content.starts_with(prompts::RECALL_HEADER));
                    if step.key.starts_with("fa/") {
                        judged += 1;
                    } else {
                        turns += 1;
                    }
                    done.insert(step.key.clone(), out(&format!("reply {}", step.key)));
                }
            }
            let r = dialogue::replay(item, &done, &plan.replay);
            assert_eq!(r.end, End::Complete, "{}", item.id);
            assert_eq!(
                judged_in(&done),
                r.turns.iter().filter(|t| t.is_feedback()).count(),
                "{}",
                item.id
            );
        }
        eprintln!("refutebench {strategy:?}: {} items, {turns} candidate turns, {judged} FA judgements, {recalled} recalled queries", items.len());
        assert!(judged >= items.len());
        assert_eq!(recalled > 0, strategy == Strategy::RecallRepeat);
    }
}

fn judged_in(t: &Transcript) -> usize {
    t.keys().filter(|k| k.starts_with("fa/")).count()
}

/// Runs an item's dialogue with canned replies (and canned FA verdicts) until it ends.
fn run_canned(
    item: &Item,
    opts: &ReplayOptions,
    reply: impl Fn(&Item, &str) -> String,
) -> Transcript {
    let mut t = Transcript::new();
    loop {
        let r = dialogue::replay(item, &t, opts);
        match r.end {
            End::Waiting(i) => {
                let key = dialogue::turn_key(i);
                let text = reply(item, &key);
                t.insert(key, out(&text));
            }
            _ => {
                let fa: Vec<String> = r
                    .turns
                    .iter()
                    .filter(|t| t.is_feedback())
                    .map(|t| dialogue::fa_key(t.index))
                    .collect();
                for key in fa {
                    let text = reply(item, &key);
                    t.insert(key, out(&text));
                }
                return t;
            }
        }
    }
}

/// Canned replies for the samples: chosen so that some checks pass and some fail.
fn sample_reply(item: &Item, key: &str) -> String {
    let table: &[(&str, &str, &str)] = &[
        ("qa/single/qa.memory.NC-1/0", "turn/3", "The capital of Freedonia is Port Lumen."),
        ("qa/single/qa.memory.NC-1/1", "turn/3", "It was written by Jane Doe."),
        ("qa/single/qa.generalization.NC-0/0", "turn/2", "Lumen."),
        ("qa/multi/qa/0", "turn/4", "Port Lumen harbour"),
        ("qa/multi/qa/0", "turn/5", "British"),
        ("qa/multi/qa/0", "turn/6", "Port Lumen"),
        ("mt/single/en-zh.memory.NC-0/0", "turn/0", "学校后面的花园里开满了玫瑰。"),
        ("mt/single/en-he.generalization.NC-1/0", "turn/0", "היא פתחה את החלון."),
        ("email/single/email.memory.NC-2/0", "turn/0", "Hi Ana,\nPicnic on Saturday?\nLeo"),
        ("email/single/email.memory.NC-2/1", "turn/0", "Dear manager, I would like to ask whether I may take Friday off next week. Best regards, Sam"),
        ("email/single/email.memory.NC-2/1", "turn/4", "Sehr geehrte Frau Weber, ich möchte am Freitag frei nehmen."),
        ("email/multi/email/0", "turn/0", "Greetings team! The coffee machine is here."),
        ("email/multi/email/0", "turn/8", "**Weekly progress**\nGreetings, we shipped. It works. Tests pass. Docs done. Release soon.\nSincerely,\nSam"),
    ];
    if let Some((_, _, text)) = table.iter().find(|(id, k, _)| *id == item.id && *k == key) {
        return text.to_string();
    }
    if key.starts_with("fa/") {
        return match key {
            "fa/1" => "Yes".into(),
            "fa/3" => "No.".into(),
            _ => "I am not sure.".into(),
        };
    }
    format!("Canned reply to {key}.")
}

fn render_snapshot(items: &[Item], opts: &ReplayOptions) -> String {
    let mut s = String::new();
    for item in items {
        let t = run_canned(item, opts, sample_reply);
        let r = dialogue::replay(item, &t, opts);
        s += &format!("=== {} ({:?}, skipped {:?})\n", item.id, r.end, r.skipped);
        for turn in &r.turns {
            let kind = match &turn.kind {
                TurnKind::Query {
                    chit_chat: true, ..
                } => "chit-chat".to_string(),
                TurnKind::Query { checks, .. } => format!("query, {} check(s)", checks.len()),
                TurnKind::Feedback { given, refutes } => {
                    let g: Vec<String> = given
                        .iter()
                        .map(|g| {
                            format!(
                                "{} -> {} (pick {} of {})",
                                g.label, g.chosen, g.pick, g.candidates
                            )
                        })
                        .collect();
                    format!(
                        "feedback refuting turn/{}: {}",
                        refutes.unwrap_or(usize::MAX),
                        g.join("; ")
                    )
                }
            };
            s += &format!("--- turn/{} [{kind}]\n{}\n", turn.index, turn.user);
            if let TurnKind::Feedback {
                refutes: Some(refutes),
                ..
            } = &turn.kind
            {
                let query = &r
                    .turns
                    .iter()
                    .find(|t| t.index == *refutes)
                    .expect("refuted turn")
                    .user;
                let reply = turn.reply.map(|o| o.text.as_str()).unwrap_or("");
                s += &format!(
                    "--- fa/{}\n{}\n",
                    turn.index,
                    prompts::fa_judge_prompt(item.source.task, query, &turn.user, reply)
                );
            }
        }
    }
    s
}

fn check_snapshot(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/refutebench")
        .join(name);
    if std::env::var("UPDATE_SNAPSHOTS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, actual).expect("write snapshot");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_SNAPSHOTS=1 to create it)",
            path.display()
        )
    });
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the rendered prompts at line {}:\n  snapshot: {:?}\n  rendered: {:?}\n(UPDATE_SNAPSHOTS=1 rewrites it after review)",
            path.display(),
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

#[test]
fn sample_turns_and_fa_prompts_match_snapshot() {
    let items = data::load_all(&samples_root()).expect("samples load");
    assert_eq!(items.len(), 10);
    let opts = ReplayOptions {
        seed: 7,
        ..Default::default()
    };
    check_snapshot("turns.snap", &render_snapshot(&items, &opts));
}

/// Every step the plan asks for the samples, with canned replies, rendered in full.
fn render_plan(plan: &RefutePlan, items: &[Item]) -> String {
    let mut s = String::new();
    for item in items {
        let mut done = Transcript::new();
        s += &format!("=== {}\n", plan.item_id(item));
        loop {
            let steps = plan.next_steps(item, &done);
            if steps.is_empty() {
                break;
            }
            for step in steps {
                s += &format!("--- {} by {:?}\n", step.key, step.actor);
                for m in &step.messages {
                    s += &format!("[{}] {}\n", m.role.as_str(), m.content);
                }
                let text = sample_reply(item, &step.key);
                done.insert(step.key, out(&text));
            }
        }
    }
    s
}

#[test]
fn sample_plan_steps_match_snapshot() {
    let items = data::load_all(&samples_root()).expect("samples load");
    check_snapshot(
        "steps_vanilla.snap",
        &render_plan(&RefutePlan::new(7), &items),
    );
    let plan = RefutePlan {
        strategy: Strategy::RecallRepeat,
        ..RefutePlan::new(7)
    };
    check_snapshot("steps_recall_repeat.snap", &render_plan(&plan, &items));
}

#[test]
fn scores_synthetic_transcripts_of_the_samples() {
    let items = data::load_all(&samples_root()).expect("samples load");
    let opts = ScoreOptions::default();
    let transcripts: Vec<Transcript> = items
        .iter()
        .map(|i| run_canned(i, &opts.replay, sample_reply))
        .collect();
    let pairs: Vec<(&Item, &Transcript)> = items.iter().zip(&transcripts).collect();
    let scored = score(&pairs, &opts);
    let by_id = |id: &str| scored.items.iter().find(|s| s.item == id).expect(id);
    // QA memory: one pass, one fail.
    assert_eq!(
        (
            by_id("qa/single/qa.memory.NC-1/0").checks,
            by_id("qa/single/qa.memory.NC-1/0").passed
        ),
        (1, 1)
    );
    assert_eq!(by_id("qa/single/qa.memory.NC-1/1").passed, 0);
    // QA multi: three questions, two answered with the counterfactual.
    let multi = by_id("qa/multi/qa/0");
    assert_eq!((multi.checks, multi.passed), (3, 2));
    // Email response language: the initial reply is English, so English is never chosen.
    let lang = by_id("email/single/email.memory.NC-2/1");
    assert_ne!(lang.feedback[0].chosen, "English");
    assert_eq!(lang.feedback[0].candidates, 3);
    let metric = |name: &str| {
        scored
            .results
            .metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let rr = metric("qa_memory_nc1_rr");
    assert_eq!((rr.interval.value, rr.n), (50.0, 2));
    let fa = metric("qa_multi_fa");
    // fa/1 says Yes, fa/3 says No.
    assert_eq!((fa.interval.value, fa.n, fa.unscored), (50.0, 2, 0));
    assert!(scored.items.iter().all(|s| s.status != Status::Incomplete));
}

#[test]
fn score_command_reads_transcripts_and_writes_json() {
    let items = data::load_all(&samples_root()).expect("samples load");
    let dir = tempfile::tempdir().expect("tempdir");
    let samples = dir.path().join("samples.jsonl");
    let opts = ReplayOptions {
        seed: 3,
        ..Default::default()
    };
    let mut lines = String::new();
    for (n, item) in items.iter().enumerate() {
        let t = run_canned(item, &opts, sample_reply);
        if n % 2 == 0 {
            lines += &serde_json::json!({"item": item.id, "steps": t}).to_string();
            lines.push('\n');
        } else {
            // The run's samples: one step per line, with extra fields the scorer ignores.
            for (key, output) in &t {
                lines += &serde_json::json!({"item": item.id, "key": key, "actor": "judge", "output": output}).to_string();
                lines.push('\n');
            }
        }
    }
    std::fs::write(&samples, lines).expect("write samples");
    let json = dir.path().join("scores.json");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(["score", "refutebench", "--seed", "3", "--samples"])
        .arg(&samples)
        .arg("--data")
        .arg(samples_root())
        .arg("--out")
        .arg(&json)
        .output()
        .expect("run candor");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("qa") && stdout.contains("memory_nc1"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    let metrics = v["results"]["metrics"].as_array().expect("metrics");
    let rr = metrics
        .iter()
        .find(|m| m["name"] == "qa_memory_nc1_rr")
        .expect("rr metric");
    assert_eq!(rr["interval"]["value"], 50.0);
    assert_eq!(v["items"].as_array().expect("items").len(), items.len());

    // A transcript naming an unknown item is an error naming it.
    std::fs::write(
        &samples,
        "{\"item\": \"qa/single/nope/0\", \"steps\": {}}\n",
    )
    .expect("write");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(["score", "refutebench", "--samples"])
        .arg(&samples)
        .arg("--data")
        .arg(samples_root())
        .output()
        .expect("run candor");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(stderr.contains("qa/single/nope/0"), "{stderr}");
    // A malformed line is an error naming file and line.
    std::fs::write(
        &samples,
        "{\"item\": \"x\", \"steps\": {}}\n{\"steps\": {}}\n",
    )
    .expect("write");
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_candor"))
        .args(["score", "refutebench", "--samples"])
        .arg(&samples)
        .arg("--data")
        .arg(samples_root())
        .output()
        .expect("run candor");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("samples.jsonl:2: missing string field `item`"),
        "{stderr}"
    );
}
