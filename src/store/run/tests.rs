//! The runner as a whole: log order, batch invariance, resume, failures.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::*;
use crate::bench::plan::Actor;
use crate::engine::ChatRequest;
use crate::store::error_chain;
use crate::store::manifest::{Environment, ModelIdentity, RunIdentity};
use crate::store::progress::NoProgress;
use crate::store::samples::Sample;
use crate::store::testkit::{toy_items, toy_score, FakeModels, ToyItem, ToyPlan};

fn manifest(seed: u64) -> Manifest {
    Manifest::new(
        RunIdentity {
            candor_version: "test".into(),
            protocol: "toy".into(),
            settings: serde_json::json!({"candidates": 1}),
            seed,
            models: vec![ModelIdentity {
                role: "candidate/0".into(),
                name: "fake:cand".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
        // Not compared, and detecting it runs git: leave it empty here.
        Environment::default(),
    )
}

fn run_toy(
    dir: &Path,
    items: &[ToyItem],
    plan: &ToyPlan,
    models: &mut FakeModels,
    batch_size: usize,
) -> Result<RunOutcome, StoreError> {
    Run {
        dir,
        manifest: manifest(plan.seed),
        plan,
        items,
        batch_size,
    }
    .execute(models, &mut NoProgress, |done| toy_score(plan, done, 7))
}

struct Files {
    samples: Vec<u8>,
    results: Vec<u8>,
}

fn files(dir: &Path) -> Files {
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    Files {
        samples: read("samples.jsonl"),
        results: read("results.json"),
    }
}

fn plan(candidates: usize) -> ToyPlan {
    ToyPlan {
        candidates,
        seed: 11,
    }
}

#[test]
fn same_run_twice_and_any_batch_size_writes_identical_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(9);
    let plan = plan(2);
    let mut outs = Vec::new();
    for (k, batch) in [1, 4, 4, 64].into_iter().enumerate() {
        let dir = tmp.path().join(format!("run{k}"));
        let mut models = FakeModels::new(&["a", "b"], "judge");
        let out = run_toy(&dir, &items, &plan, &mut models, batch).unwrap();
        assert!(!out.resumed);
        assert_eq!(out.replayed, 0);
        assert!(models.stats.max_batch.load(Ordering::SeqCst) <= batch);
        outs.push(files(&dir));
    }
    for f in &outs[1..] {
        assert_eq!(f.samples, outs[0].samples);
        assert_eq!(f.results, outs[0].results);
    }
    // 9 items: item 5 refuses its first step and stops; the others take 6 steps each.
    let lines = outs[0].samples.iter().filter(|&&b| b == b'\n').count();
    assert_eq!(lines, 8 * 6 + 1);
}

#[test]
fn log_order_is_actor_rounds_then_items_then_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(3);
    let mut models = FakeModels::new(&["a", "b"], "j");
    run_toy(tmp.path(), &items, &plan(2), &mut models, 2).unwrap();
    let text = std::fs::read_to_string(tmp.path().join("samples.jsonl")).unwrap();
    let order: Vec<(String, String)> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["item"].as_str().unwrap().into(),
                v["key"].as_str().unwrap().into(),
            )
        })
        .collect();
    let mut want = Vec::new();
    for key in ["c0/turn/1", "c0/turn/2", "c1/turn/1", "c1/turn/2"] {
        for i in 0..3 {
            want.push((format!("toy-{i:03}"), key.to_string()));
        }
    }
    for i in 0..3 {
        for key in ["judge/c0", "judge/c1"] {
            want.push((format!("toy-{i:03}"), key.to_string()));
        }
    }
    assert_eq!(order, want);
    // Candidate 0, candidate 1, judge: three loads, never two models at once.
    let loads = models.stats.loads.lock().unwrap().clone();
    assert_eq!(
        loads,
        [Actor::Candidate(0), Actor::Candidate(1), Actor::Judge]
    );
    assert_eq!(models.stats.max_alive.load(Ordering::SeqCst), 1);
    assert_eq!(models.stats.alive.load(Ordering::SeqCst), 0);
}

/// The log the round loop writes, computed here step by step without the runner: each
/// round is the lowest actor's pending steps in (item, key) order, answered one by one
/// with the fake model's own rules.
fn round_loop_log(items: &[ToyItem], plan: &ToyPlan, models: &FakeModels) -> Vec<u8> {
    use crate::store::testkit::{fake_reply, FAIL_MARKER};
    let mut done = vec![Transcript::new(); items.len()];
    let mut stopped = vec![false; items.len()];
    let mut log = Vec::new();
    loop {
        let pending: Vec<(usize, Step)> = (0..items.len())
            .filter(|&i| !stopped[i])
            .flat_map(|i| {
                let mut steps = plan.next_steps(&items[i], &done[i]);
                steps.sort_by(|a, b| a.key.cmp(&b.key));
                steps.into_iter().map(move |s| (i, s))
            })
            .collect();
        let Some(actor) = pending.iter().map(|(_, s)| s.actor).min() else {
            return log;
        };
        for (i, step) in pending.into_iter().filter(|(_, s)| s.actor == actor) {
            let label = match actor {
                Actor::Candidate(c) => models.candidates[c].clone(),
                Actor::Judge => models.judge.clone(),
                Actor::Panel(j) => models.panel[j - 1].clone(),
            };
            let request = ChatRequest {
                messages: step.messages.clone(),
                params: step.params.clone(),
                ..Default::default()
            };
            let refused = step
                .messages
                .iter()
                .any(|m| m.content.contains(FAIL_MARKER));
            let outcome = match models.preflight_reason(&request) {
                Some(reason) => SampleOutcome::Error(reason),
                None if refused => {
                    SampleOutcome::Error(error_chain(&crate::store::testkit::FakeError::Refused))
                }
                None => reply_outcome(fake_reply(&label, &request)),
            };
            match &outcome {
                SampleOutcome::Output(o) => {
                    done[i].insert(step.key.clone(), o.clone());
                }
                SampleOutcome::Error(_) => stopped[i] = true,
            }
            log.extend(Sample::new(&items[i].id, &step, outcome).to_line());
        }
    }
}

#[test]
fn the_queue_logs_exactly_what_the_round_loop_logged() {
    let tmp = tempfile::tempdir().unwrap();
    // 24 items: refused, template and overflow failures among them.
    let items = toy_items(24);
    for (k, (cands, judge, batch)) in [
        (&["a", "b"][..], "j", 1),
        (&["a", "b"][..], "j", 5),
        (&["a", "a"][..], "a", 7),
        (&["a"][..], "j", 64),
    ]
    .into_iter()
    .enumerate()
    {
        let plan = plan(cands.len());
        let mut models = FakeModels::new(cands, judge);
        let want = round_loop_log(&items, &plan, &models);
        let dir = tmp.path().join(format!("run{k}"));
        run_toy(&dir, &items, &plan, &mut models, batch).unwrap();
        let got = std::fs::read(dir.join("samples.jsonl")).unwrap();
        assert!(
            got == want,
            "case {k}: the log differs from the round loop's"
        );
        assert!(!dir.join("pending.jsonl").exists());
    }
}

/// Turn 2 of an item starts as soon as its turn 1 is answered, not when the slowest
/// turn 1 of the round is; the judge (same model) starts before the last candidate turn
/// is answered; and the batch is kept full.
#[test]
fn later_steps_start_before_the_slowest_step_of_the_round_finishes() {
    use crate::store::testkit::FakeEvent;
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(9);
    let mut models = FakeModels::new(&["m"], "m");
    run_toy(tmp.path(), &items, &plan(1), &mut models, 4).unwrap();
    let events = models.stats.events.lock().unwrap().clone();
    let turn2 = |t: &str| t.starts_with("Are you sure");
    let judge = |t: &str| t.starts_with("Question:");
    let first_turn2_start = events
        .iter()
        .position(|e| matches!(e, FakeEvent::Start { text, .. } if turn2(text)))
        .unwrap();
    let last_turn1_finish = events
        .iter()
        .rposition(|e| matches!(e, FakeEvent::Finish { text, .. } if !turn2(text) && !judge(text)))
        .unwrap();
    assert!(
        first_turn2_start < last_turn1_finish,
        "turn 2 waited for every turn 1: {events:?}"
    );
    let first_judge_start = events
        .iter()
        .position(|e| matches!(e, FakeEvent::Start { text, .. } if judge(text)))
        .unwrap();
    let last_turn2_finish = events
        .iter()
        .rposition(|e| matches!(e, FakeEvent::Finish { text, .. } if turn2(text)))
        .unwrap();
    assert!(first_judge_start < last_turn2_finish, "{events:?}");
    assert_eq!(models.stats.max_batch.load(Ordering::SeqCst), 4);
    assert_eq!(models.stats.loads.lock().unwrap().len(), 1);
    // And the bytes are those of a run one step at a time.
    let one = tmp.path().join("one");
    run_toy(&one, &items, &plan(1), &mut FakeModels::new(&["m"], "m"), 1).unwrap();
    assert_eq!(
        std::fs::read(one.join("samples.jsonl")).unwrap(),
        std::fs::read(tmp.path().join("samples.jsonl")).unwrap()
    );
}

/// Steps that finished but were not logged when the engine failed are kept in
/// `pending.jsonl` and taken from there on resume, not generated again.
#[test]
fn finished_unlogged_steps_survive_a_failure_and_are_not_recomputed() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(10);
    let full_dir = tmp.path().join("full");
    run_toy(
        &full_dir,
        &items,
        &plan(2),
        &mut FakeModels::new(&["a", "b"], "j"),
        6,
    )
    .unwrap();
    let full = files(&full_dir);
    let total = full.samples.iter().filter(|&&b| b == b'\n').count();
    let mut recovered_any = false;
    for break_after in [1, 2, 3, 5, 8, 13] {
        let dir = tmp.path().join(format!("broken{break_after}"));
        let mut broken = FakeModels::new(&["a", "b"], "j");
        broken.break_after = Some(break_after);
        run_toy(&dir, &items, &plan(2), &mut broken, 6).unwrap_err();
        let logged = std::fs::read(dir.join("samples.jsonl")).unwrap();
        let logged = logged.iter().filter(|&&b| b == b'\n').count();
        let mut again = FakeModels::new(&["a", "b"], "j");
        let out = run_toy(&dir, &items, &plan(2), &mut again, 3).unwrap();
        assert_eq!(out.replayed, logged);
        assert_eq!(out.replayed + out.recovered + out.computed, total);
        recovered_any |= out.recovered > 0;
        // Only the computed steps reached the model (refused ones never do).
        let asked = again.stats.requests.load(Ordering::SeqCst);
        assert!(asked <= out.computed, "{asked} > {}", out.computed);
        let got = files(&dir);
        assert!(got.samples == full.samples && got.results == full.results);
        assert!(!dir.join("pending.jsonl").exists());
    }
    assert!(recovered_any, "no failure left finished steps unlogged");
}

#[test]
fn same_model_for_two_actors_is_loaded_once() {
    let tmp = tempfile::tempdir().unwrap();
    let mut models = FakeModels::new(&["m"], "m");
    run_toy(tmp.path(), &toy_items(2), &plan(1), &mut models, 8).unwrap();
    assert_eq!(models.stats.loads.lock().unwrap().len(), 1);
}

/// A scratch directory on tmpfs when there is one: the every-byte resume test makes
/// thousands of fsyncs, which are free there and slow on a disk.
fn fast_tempdir() -> (tempfile::TempDir, bool) {
    let shm = Path::new("/dev/shm");
    match tempfile::tempdir_in(shm) {
        Ok(d) if shm.is_dir() => (d, true),
        _ => (tempfile::tempdir().unwrap(), false),
    }
}

/// Truncates a finished run's log at every byte and resumes: always the same bytes, and
/// only the steps missing from the log are computed. (Without tmpfs, to bound the time:
/// every byte of the first, second and last lines, and every 13th byte elsewhere.)
#[test]
fn resume_after_truncation_at_every_byte_is_byte_identical() {
    let (tmp, fast) = fast_tempdir();
    let items = toy_items(6);
    let plan = plan(1);
    let full_dir = tmp.path().join("full");
    let mut models = FakeModels::new(&["a"], "j");
    run_toy(&full_dir, &items, &plan, &mut models, 3).unwrap();
    let full = files(&full_dir);
    let total_lines = full.samples.iter().filter(|&&b| b == b'\n').count();
    let dir = tmp.path().join("cut");
    let newlines: Vec<usize> = (0..full.samples.len())
        .filter(|&i| full.samples[i] == b'\n')
        .collect();
    let (second_end, last_start) = (newlines[1], newlines[newlines.len() - 2]);
    let cuts = (0..=full.samples.len())
        .filter(|&c| fast || c <= second_end + 1 || c > last_start || c % 13 == 0);
    let mut tried = 0;
    for cut in cuts {
        tried += 1;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(full_dir.join("manifest.json"), dir.join("manifest.json")).unwrap();
        std::fs::write(dir.join("samples.jsonl"), &full.samples[..cut]).unwrap();
        let kept = full.samples[..cut].iter().filter(|&&b| b == b'\n').count();
        let mut models = FakeModels::new(&["a"], "j");
        let out = run_toy(&dir, &items, &plan, &mut models, 1 + cut % 4).unwrap();
        assert!(out.resumed);
        assert_eq!(
            (out.replayed, out.computed),
            (kept, total_lines - kept),
            "cut {cut}"
        );
        let got = files(&dir);
        assert!(
            got.samples == full.samples,
            "samples differ after cut at {cut}"
        );
        assert!(
            got.results == full.results,
            "results differ after cut at {cut}"
        );
    }
    eprintln!(
        "resumed from {tried} cuts of a {}-byte log",
        full.samples.len()
    );
}

#[test]
fn finished_run_rerun_computes_nothing_and_loads_no_model() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(4);
    let mut models = FakeModels::new(&["a"], "j");
    run_toy(tmp.path(), &items, &plan(1), &mut models, 2).unwrap();
    let before = files(tmp.path());
    let mut again = FakeModels::new(&["a"], "j");
    let out = run_toy(tmp.path(), &items, &plan(1), &mut again, 2).unwrap();
    assert_eq!(out.computed, 0);
    assert!(again.stats.loads.lock().unwrap().is_empty());
    let after = files(tmp.path());
    assert_eq!(before.samples, after.samples);
    assert_eq!(before.results, after.results);
    let attempts = std::fs::read_to_string(tmp.path().join("attempts.jsonl")).unwrap();
    let attempts: Vec<serde_json::Value> = attempts
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["resumed"], false);
    assert_eq!(attempts[1]["resumed"], true);
    assert_eq!(attempts[1]["logged_samples"], 12);
}

#[test]
fn manifest_mismatch_is_refused_naming_the_fields() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(3);
    let mut models = FakeModels::new(&["a"], "j");
    run_toy(tmp.path(), &items, &plan(1), &mut models, 2).unwrap();
    let before = std::fs::read(tmp.path().join("samples.jsonl")).unwrap();
    let other_seed = ToyPlan {
        candidates: 1,
        seed: 12,
    };
    let err = run_toy(tmp.path(), &items, &other_seed, &mut models, 2).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StoreError::ManifestMismatch { .. }), "{msg}");
    assert!(msg.contains("seed (on disk 11, now 12)"), "{msg}");
    let err = run_toy(tmp.path(), &toy_items(4), &plan(1), &mut models, 2).unwrap_err();
    assert!(
        err.to_string().contains("items.count (on disk 3, now 4)"),
        "{err}"
    );
    // Nothing was touched.
    assert_eq!(
        std::fs::read(tmp.path().join("samples.jsonl")).unwrap(),
        before
    );
    assert!(tmp.path().join("results.json").exists());
}

#[test]
fn refused_requests_are_logged_and_their_items_left_out_of_scoring() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(7);
    let mut models = FakeModels::new(&["a"], "j");
    let out = run_toy(tmp.path(), &items, &plan(1), &mut models, 4).unwrap();
    assert_eq!(out.results.items, 7);
    assert_eq!(out.results.completed, 6);
    assert_eq!(out.results.failed.len(), 1);
    let f = &out.results.failed[0];
    assert_eq!((f.item.as_str(), f.key.as_str()), ("toy-005", "c0/turn/1"));
    assert!(f.error.contains("refuses"), "{}", f.error);
    let text = std::fs::read_to_string(tmp.path().join("samples.jsonl")).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("\"error\"")).collect();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("\"item\":\"toy-005\""));
    let scored: usize = out
        .results
        .results
        .metrics
        .iter()
        .map(|m| m.n + m.unscored)
        .sum();
    assert_eq!(scored, 6);
}

#[test]
fn template_tokenizer_and_context_failures_are_failed_steps_and_the_run_goes_on() {
    use crate::store::testkit::{OVERFLOW_MARKER, TEMPLATE_MARKER, TOKENIZER_MARKER};
    let tmp = tempfile::tempdir().unwrap();
    let mut items = toy_items(5);
    items[1].question.push_str(TEMPLATE_MARKER);
    items[2].question.push_str(TOKENIZER_MARKER);
    items[3].question.push_str(OVERFLOW_MARKER);
    let plan = plan(1);
    let mut models = FakeModels::new(&["a"], "j");
    let out = run_toy(tmp.path(), &items, &plan, &mut models, 4).unwrap();
    let r = &out.results;
    assert_eq!((r.items, r.completed, r.failed.len()), (5, 2, 3));
    let failed: Vec<(&str, &str, Option<usize>)> = r
        .failed
        .iter()
        .map(|f| (f.item.as_str(), f.key.as_str(), f.skipped))
        .collect();
    // Each failed on its first step; the second turn and the judgement were skipped.
    assert_eq!(
        failed,
        [
            ("toy-001", "c0/turn/1", Some(2)),
            ("toy-002", "c0/turn/1", Some(2)),
            ("toy-003", "c0/turn/1", Some(2)),
        ]
    );
    assert_eq!(r.skipped_steps, 6);
    assert!(
        r.failed[0].error.contains("chat template raised"),
        "{:?}",
        r.failed[0]
    );
    assert!(
        r.failed[1].error.starts_with("tokenizer:"),
        "{:?}",
        r.failed[1]
    );
    assert_eq!(
        r.failed[2].error,
        "the prompt (9000 tokens) fills the model's context: nothing could be generated"
    );
    // The reasons are in the samples, and the failed items asked for nothing more.
    let text = std::fs::read_to_string(tmp.path().join("samples.jsonl")).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("\"error\"")).collect();
    assert_eq!(errors.len(), 3);
    assert!(
        errors[2].contains("fills the model's context"),
        "{}",
        errors[2]
    );
    assert_eq!(text.lines().count(), 2 * 3 + 3);
    // Counts beside every metric (report.md renders them from these; see report::markdown).
    let json = std::fs::read_to_string(tmp.path().join("results.json")).unwrap();
    assert!(
        json.contains("\"unscored\": 0,\n      \"failed\": 3"),
        "{json}"
    );
    assert!(json.contains("\"skipped_steps\": 6,"), "{json}");
    assert_eq!((r.items, r.completed), (5, 2));
    let m = &r.results.metrics[0];
    assert_eq!(m.n + m.unscored, 2);
}

#[test]
fn engine_failure_stops_the_run_and_resume_finishes_it_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(8);
    let full_dir = tmp.path().join("full");
    run_toy(
        &full_dir,
        &items,
        &plan(1),
        &mut FakeModels::new(&["a"], "j"),
        2,
    )
    .unwrap();
    let full = files(&full_dir);
    for break_after in [0, 1, 3, 6, 9] {
        let dir = tmp.path().join(format!("broken{break_after}"));
        let mut broken = FakeModels::new(&["a"], "j");
        broken.break_after = Some(break_after);
        let err = run_toy(&dir, &items, &plan(1), &mut broken, 2).unwrap_err();
        assert!(matches!(err, StoreError::Engine { .. }), "{err}");
        assert!(
            error_chain(&err).contains("broke down"),
            "{}",
            error_chain(&err)
        );
        assert!(!dir.join("results.json").exists());
        let partial = std::fs::read(dir.join("samples.jsonl")).unwrap();
        assert!(full.samples.starts_with(&partial));
        run_toy(&dir, &items, &plan(1), &mut FakeModels::new(&["a"], "j"), 3).unwrap();
        let got = files(&dir);
        assert!(got.samples == full.samples && got.results == full.results);
    }
}

#[test]
fn a_log_from_another_run_is_reported_with_its_line() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(3);
    let mut models = FakeModels::new(&["a"], "j");
    run_toy(tmp.path(), &items, &plan(1), &mut models, 2).unwrap();
    let p = tmp.path().join("samples.jsonl");
    let text = std::fs::read_to_string(&p).unwrap();
    let edited: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let l = if i == 1 {
                l.replace("What is", "Who is")
            } else {
                l.to_string()
            };
            l + "\n"
        })
        .collect();
    std::fs::write(&p, edited).unwrap();
    let err = run_toy(tmp.path(), &items, &plan(1), &mut models, 2).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("samples.jsonl:2:"), "{msg}");
    assert!(msg.contains("other messages"), "{msg}");
}

#[test]
fn samples_without_manifest_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("samples.jsonl"), b"{}\n").unwrap();
    let mut models = FakeModels::new(&["a"], "j");
    let err = run_toy(tmp.path(), &toy_items(1), &plan(1), &mut models, 1).unwrap_err();
    assert!(matches!(err, StoreError::NotARunDir { .. }), "{err}");
}

struct BadPlan;
impl Plan for BadPlan {
    type Item = ToyItem;
    fn item_id(&self, item: &ToyItem) -> String {
        item.id.clone()
    }
    fn next_steps(&self, item: &ToyItem, _done: &Transcript) -> Vec<Step> {
        // Never notices that its step finished.
        ToyPlan {
            candidates: 1,
            seed: 0,
        }
        .next_steps(item, &Transcript::new())
    }
}

struct NanPlan;
impl Plan for NanPlan {
    type Item = ToyItem;
    fn item_id(&self, item: &ToyItem) -> String {
        item.id.clone()
    }
    fn next_steps(&self, item: &ToyItem, done: &Transcript) -> Vec<Step> {
        let mut steps = plan(1).next_steps(item, done);
        for s in &mut steps {
            s.params.temperature = f32::NAN;
        }
        steps
    }
}

#[test]
fn plan_bugs_and_duplicate_items_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let items = toy_items(2);
    let run = |dir: PathBuf, items: &[ToyItem]| {
        Run {
            dir: &dir,
            manifest: manifest(0),
            plan: &BadPlan,
            items,
            batch_size: 2,
        }
        .execute(&mut FakeModels::new(&["a"], "j"), &mut NoProgress, |_| {
            BenchResults::default()
        })
    };
    let err = run(tmp.path().join("a"), &items).unwrap_err();
    assert!(err.to_string().contains("already finished"), "{err}");
    let nan = Run {
        dir: &tmp.path().join("c"),
        manifest: manifest(0),
        plan: &NanPlan,
        items: &items,
        batch_size: 2,
    }
    .execute(&mut FakeModels::new(&["a"], "j"), &mut NoProgress, |_| {
        BenchResults::default()
    });
    let err = nan.unwrap_err().to_string();
    assert!(err.contains("non-finite temperature"), "{err}");
    let dup = vec![items[0].clone(), items[0].clone()];
    let err = run(tmp.path().join("b"), &dup).unwrap_err();
    assert!(matches!(err, StoreError::DuplicateItem { .. }), "{err}");
}
