//! Thinking models: the engine's reasoning budget, truncation and grammar-after-reasoning on the
//! real default model with a real template that opens `<think>` (QwQ's, from llama.cpp), and
//! runs through the binary whose judge is a scripted thinking model (`fake:thinker`): scored
//! from its answers only, never from its reasoning; cut inside its reasoning, unscored.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use candor::engine::{ChatRequest, Constraint, Engine, EngineOptions, Generate, SamplingParams};
use candor::store::testkit::DECOY_REASONING;
use candor::text::chat_template::TemplateArgs;
use candor::text::message::Message;
use candor::weights::source::ModelFiles;

use crate::util;

fn candor() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_candor"));
    c.stdin(Stdio::null());
    c.env("CANDOR_NO_CACHE", "1");
    c
}

fn toy(out: &Path, judge: &str, extra: &[&str]) -> Output {
    let out_s = out.display().to_string();
    let mut args = vec![
        "run",
        "toy",
        "--model",
        "fake:thinker-cand",
        "--judge",
        judge,
        "--limit",
        "12",
        "--threads",
        "1",
        "--out",
        &out_s,
    ];
    args.extend_from_slice(extra);
    candor().args(&args).output().unwrap()
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn samples(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The toy judge's score in an answer (`score: N` → N / 10).
fn score_in(text: &str) -> Option<f64> {
    let rest = text.split("score: ").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse::<f64>().ok().map(|x| x / 10.0)
}

#[test]
fn a_thinking_judge_is_scored_from_its_answers_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    ok(toy(
        &dir,
        "fake:thinker-judge",
        &["--template-date", "2026-01-02"],
    ));
    let lines = samples(&dir);
    let judged: Vec<&serde_json::Value> = lines.iter().filter(|s| s["actor"] == "judge").collect();
    // (Some toy items carry markers that make the fake refuse: they stop before the judge.)
    assert!(judged.len() >= 6, "{}", judged.len());
    let mut scores = Vec::new();
    let mut unscored = 0;
    for s in &judged {
        let out = &s["output"];
        // The reasoning is kept, as reasoning, and holds a verdict (`score: 0`) that must not
        // be read; the answer is what the parser sees.
        assert_eq!(out["reasoning"]["text"], DECOY_REASONING, "{s}");
        let answer = out["text"].as_str().unwrap();
        assert!(!answer.contains("Draft verdict"), "{s}");
        match score_in(answer) {
            Some(v) => scores.push(v),
            None => unscored += 1,
        }
    }
    // The candidate's reasoning is never sent back: its second turn repeats the answer only.
    for s in lines.iter().filter(|s| s["key"] == "c0/turn/2") {
        assert!(!s["messages"].to_string().contains("Draft verdict"), "{s}");
    }
    let results = json(&dir.join("results.json"));
    let metric = &results["metrics"][0];
    assert_eq!(metric["n"], scores.len(), "{metric}");
    assert_eq!(metric["unscored"], unscored, "{metric}");
    let mean = scores.iter().sum::<f64>() / scores.len() as f64;
    let got = metric["interval"]["value"].as_f64().unwrap();
    assert!(
        (got - mean).abs() < 1e-9,
        "{got} vs {mean} from the answers"
    );
    assert!(
        mean > 0.0,
        "read from the reasoning, every score would be 0"
    );

    // The manifest records the settings; a resume renders with the recorded date (no flag
    // needed) and refuses another one.
    let manifest = json(&dir.join("manifest.json"));
    assert_eq!(
        manifest["identity"]["chat"],
        serde_json::json!({"template_date": "2026-01-02"})
    );
    let before = std::fs::read(dir.join("samples.jsonl")).unwrap();
    ok(toy(&dir, "fake:thinker-judge", &[]));
    let o = toy(
        &dir,
        "fake:thinker-judge",
        &["--template-date", "2026-01-03"],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("chat.template_date"), "{err}");
    assert_eq!(std::fs::read(dir.join("samples.jsonl")).unwrap(), before);
}

#[test]
fn judge_thinking_off_reaches_the_template_and_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    ok(toy(
        &dir,
        "fake:thinker-judge",
        &["--judge-thinking", "off"],
    ));
    for s in samples(&dir).iter().filter(|s| !s["output"].is_null()) {
        // The fake thinks unless its request carries `enable_thinking: false`.
        let reasoned = !s["output"]["reasoning"].is_null();
        assert_eq!(reasoned, s["actor"] != "judge", "{s}");
    }
    let chat = &json(&dir.join("manifest.json"))["identity"]["chat"];
    assert_eq!(chat["judge_thinking"], "off", "{chat}");
    assert!(chat["thinking"].is_null(), "{chat}");
    let o = candor()
        .args(["run", "toy", "--model", "fake:a", "--thinking", "max"])
        .args(["--out", &tmp.path().join("x").display().to_string()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("off, on, low, medium, high"), "{err}");
}

#[test]
fn a_judge_cut_inside_its_reasoning_is_unscored() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    ok(toy(&dir, "fake:thinker-cut", &[]));
    let lines = samples(&dir);
    let judged: Vec<_> = lines.iter().filter(|s| s["actor"] == "judge").collect();
    assert!(judged.len() >= 6, "{}", judged.len());
    for s in &judged {
        assert_eq!(s["output"]["reasoning"]["truncated"], true, "{s}");
        assert_eq!(s["output"]["text"], "", "{s}");
    }
    let results = json(&dir.join("results.json"));
    let metric = &results["metrics"][0];
    assert_eq!(
        (metric["n"].as_u64(), metric["unscored"].as_u64()),
        (Some(0), Some(judged.len() as u64))
    );
    // The report's reasoning table counts them per step kind.
    let table = results["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "reasoning")
        .expect("a reasoning table");
    let row = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[0].to_string().contains("judge/c0"))
        .expect("the judge's row");
    assert!(
        row[5].to_string().contains(&judged.len().to_string()),
        "{row}"
    );
}

/// The default model with QwQ's template, which opens `<think>` in the generation prompt, so
/// every reply starts inside its reasoning.
fn qwq_engine() -> Option<Engine> {
    let weights = util::default_model()?;
    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates/Qwen-QwQ-32B.jinja");
    let files = ModelFiles {
        weights,
        checkpoint: false,
        tokenizer_json: None,
        tokenizer_config: None,
        chat_template_jinja: None,
        generation_config: None,
        chat_template: Some(template),
    };
    Some(Engine::from_files(&files, EngineOptions::default()).expect("load"))
}

fn request(max_new_tokens: usize, budget: Option<usize>) -> ChatRequest {
    ChatRequest {
        messages: vec![Message::user("Is 17 a prime number? Answer yes or no.")],
        params: SamplingParams {
            max_new_tokens,
            ..SamplingParams::default()
        },
        // QwQ's template closes the block at once unless thinking is on.
        template: TemplateArgs {
            kwargs: [("enable_thinking".to_string(), serde_json::Value::Bool(true))].into(),
            date: None,
        },
        max_thinking_tokens: budget,
    }
}

#[test]
fn the_reasoning_budget_forces_the_close_and_a_cut_reply_is_truncated() {
    let Some(mut eng) = qwq_engine() else { return };
    let close = eng.tokenizer().encode_plain("</think>\n\n").unwrap();
    let replies = eng
        .generate_chat(&[request(24, Some(5)), request(6, None), request(24, Some(0))])
        .unwrap();
    // Budget 5: five free tokens, then `</think>\n\n` forced, then the answer.
    let r = &replies[0];
    assert_eq!(&r.output_ids[5..5 + close.len()], &close[..], "{r:?}");
    let reasoning = r.reasoning.as_ref().expect("reasoning");
    assert_eq!((reasoning.tokens, reasoning.truncated), (5, false), "{r:?}");
    let mut answer_ids = &r.output_ids[5 + close.len()..];
    if let Some((last, body)) = answer_ids.split_last() {
        if eng.stop_ids().contains(last) {
            answer_ids = body;
        }
    }
    assert_eq!(
        r.text,
        eng.tokenizer().decode(answer_ids).trim_start(),
        "{r:?}"
    );
    assert!(!r.text.contains("</think>"));
    // No budget, 6 tokens: cut inside the reasoning, no answer.
    let r = &replies[1];
    let reasoning = r.reasoning.as_ref().expect("reasoning");
    assert!(reasoning.truncated, "{r:?}");
    assert_eq!(r.text, "");
    // Budget 0: the block closes at once.
    assert_eq!(&replies[2].output_ids[..close.len()], &close[..]);
    assert_eq!(replies[2].reasoning.as_ref().unwrap().tokens, 0);
    // The same request alone gives the same tokens (the budget depends on nothing else).
    let alone = eng.generate_chat(&[request(24, Some(5))]).unwrap();
    assert_eq!(alone[0], replies[0]);
}

#[test]
fn a_constrained_judge_reasons_first_then_answers_in_its_grammar() {
    let Some(mut eng) = qwq_engine() else { return };
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"verdict": {"enum": ["yes", "no"]}},
        "required": ["verdict"],
        "additionalProperties": false
    });
    let mut req = request(48, Some(6));
    req.params.constraint = Some(Constraint::JsonSchema(schema));
    let r = &eng.generate_chat(&[req]).unwrap()[0];
    let reasoning = r.reasoning.as_ref().expect("reasoning");
    assert_eq!(reasoning.tokens, 6, "{r:?}");
    // The free reasoning is not JSON; the answer follows the grammar.
    assert!(!reasoning.text.trim_start().starts_with('{'), "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r.text).expect("answer is the grammar's");
    assert!(v["verdict"] == "yes" || v["verdict"] == "no", "{v}");
}
