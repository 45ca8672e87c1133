//! Scoring finished RefuteBench dialogues: feedback acceptance (FA) and response rate (RR),
//! per task and setting, each with a seeded bootstrap 95% interval (over dialogues) and the
//! count of FA judgements that could not be parsed. Also the transcript file format that
//! `candor score refutebench` reads.
//!
//! RR follows section 5.2 of the paper: a dialogue's RR is the mean of R(f, r) over its viable
//! (feedback, later reply) pairs as [`super::dialogue`] lists them, and a setting's RR is the
//! mean over dialogues that have at least one such pair. FA is the share of judged feedback turns
//! whose judge said Yes, pooled over the dialogues (for single-feedback settings, one turn per
//! dialogue). Both are reported in percent, like the paper. Dialogues that are unfinished, ended
//! by a conflict before any pair, or without any viable pair are counted beside the metrics,
//! never scored as zero.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::data::Item;
use super::dialogue::{self, End, ReplayOptions, TurnKind};
use super::Error;
use crate::bench::item_scores::{ItemValue, LeftOut, MetricItems};
use crate::bench::panel::{self, Panel, PanelRule};
use crate::bench::plan::{StepOutput, Transcript};
use crate::bench::stats::Metric;
use crate::bench::stats::{bootstrap, RESAMPLES};
use crate::bench::table::{Cell, Table};
use crate::bench::BenchResults;
use crate::judge::feedback_acceptance::{self, Acceptance};
use crate::judge::Verdict;
use crate::stats::summary::mean;

/// One item's finished steps, as read from a transcript file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemTranscript {
    pub item: String,
    pub steps: Transcript,
}

/// Reads a transcript file: JSON lines, each either a whole item
/// (`{"item": ID, "steps": {KEY: StepOutput, …}}`) or one finished step as the run's samples
/// record it (`{"item": ID, "key": KEY, "output": StepOutput, …}`; `item_id` is accepted for
/// `item`; a line with an `error` and no `output` is a failed step and is skipped). Steps of one
/// item may be spread over many lines; items keep the order they first appear in.
pub fn read_transcripts(path: &Path) -> Result<Vec<ItemTranscript>, Error> {
    let file = std::fs::File::open(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_transcripts(std::io::BufReader::new(file), path)
}

/// [`read_transcripts`] on any reader; `path` only labels errors.
pub fn parse_transcripts(reader: impl BufRead, path: &Path) -> Result<Vec<ItemTranscript>, Error> {
    let mut order: Vec<String> = Vec::new();
    let mut steps: BTreeMap<String, Transcript> = BTreeMap::new();
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        let line = line.map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |m: String| Error::line(path, lineno, m);
        let v: Value = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        let item = v
            .get("item")
            .or_else(|| v.get("item_id"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing string field `item`".into()))?
            .to_string();
        let entry = steps.entry(item.clone()).or_insert_with(|| {
            order.push(item.clone());
            Transcript::new()
        });
        if let Some(all) = v.get("steps") {
            let t: Transcript =
                serde_json::from_value(all.clone()).map_err(|e| bad(format!("steps: {e}")))?;
            for (k, s) in t {
                if entry.insert(k.clone(), s).is_some() {
                    return Err(bad(format!("step {k:?} of item {item:?} appears twice")));
                }
            }
        } else if let Some(key) = v.get("key").and_then(Value::as_str) {
            match v.get("output") {
                Some(out) if !out.is_null() => {
                    let s: StepOutput = serde_json::from_value(out.clone())
                        .map_err(|e| bad(format!("output: {e}")))?;
                    if entry.insert(key.to_string(), s).is_some() {
                        return Err(bad(format!("step {key:?} of item {item:?} appears twice")));
                    }
                }
                _ if v.get("error").is_some() => {}
                _ => return Err(bad("a step line needs `output` (or `error`)".into())),
            }
        } else {
            return Err(bad("expected `steps`, or `key` with `output`".into()));
        }
    }
    Ok(order
        .into_iter()
        .map(|item| {
            let steps = steps.remove(&item).unwrap_or_default();
            ItemTranscript { item, steps }
        })
        .collect())
}

/// Settings of a scoring run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScoreOptions {
    /// Must match the run's, so that the replayed feedback choices are the ones asked.
    pub replay: ReplayOptions,
    /// Seed of the bootstrap.
    pub bootstrap_seed: u64,
    /// The FA judges: one, or a panel and its rule.
    pub panel: Panel,
}

/// Whose FA verdicts a score reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judges {
    /// Judge `j` alone (0 for a one-judge run).
    One(usize),
    /// The panel's verdict per feedback turn: under `majority` Yes when more judges said
    /// Yes than No (a tie is No: the panel was not convinced that the feedback was taken);
    /// under `mean` the share of judges that said Yes. A judge whose answer cannot be read
    /// is left out of the turn's vote; a turn no judge could read is unscored.
    Panel(Panel),
}

impl ScoreOptions {
    /// The judges a score reads by default: the panel when there is one, else judge 0.
    pub fn judges(&self) -> Judges {
        if self.panel.is_panel() {
            Judges::Panel(self.panel)
        } else {
            Judges::One(0)
        }
    }
}

/// Why a dialogue has no RR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// At least one viable (feedback, reply) pair was checked.
    Scored,
    /// Finished without a viable pair: no feedback applied, or no later query it applies to
    /// (e.g. a QA question published without an answer).
    NotViable,
    /// A feedback word had no candidate left before any pair was checked.
    Conflict,
    /// Some step has no output yet.
    Incomplete,
}

/// One FA judgement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaRecord {
    /// Position of the feedback turn.
    pub turn: usize,
    /// `None` when the judge step has not run. A panel's verdict under a panel.
    pub verdict: Option<Verdict<Acceptance>>,
    /// Under a panel, every judge's verdict (judge 0 first), as `verdict` is for one judge.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub judges: Vec<Option<Verdict<Acceptance>>>,
    /// Under a panel's `mean` rule, the share of the judges who read it as accepted (what
    /// enters FA instead of the verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
}

impl FaRecord {
    /// The record of feedback turn `turn` read by `judges` from `done`.
    fn read(turn: usize, done: &Transcript, judges: Judges) -> FaRecord {
        let read = |j: usize| {
            dialogue::find_step(done, &Panel::key(&dialogue::fa_key(turn), j))
                .map(|(_, s)| s.verdict(feedback_acceptance::parse))
        };
        let p = match judges {
            Judges::One(j) => {
                return FaRecord {
                    turn,
                    verdict: read(j),
                    judges: Vec::new(),
                    mean: None,
                }
            }
            Judges::Panel(p) => p,
        };
        let all: Vec<Option<Verdict<Acceptance>>> = (0..p.judges).map(read).collect();
        let votes: Vec<bool> = all
            .iter()
            .flatten()
            .filter_map(Verdict::scored)
            .map(|a| *a == Acceptance::Accepted)
            .collect();
        let verdict = if all.iter().all(Option::is_none) {
            None
        } else {
            Some(match panel::majority(&votes) {
                Some(true) => Verdict::Scored(Acceptance::Accepted),
                Some(false) => Verdict::Scored(Acceptance::Rejected),
                None => Verdict::unscored("no judge of the panel gave a readable answer"),
            })
        };
        let mean = match p.rule {
            PanelRule::Mean => panel::mean(&votes),
            PanelRule::Majority => None,
        };
        FaRecord {
            turn,
            verdict,
            judges: all,
            mean,
        }
    }
}

/// One feedback as given, for the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GivenRecord {
    pub turn: usize,
    pub label: String,
    pub chosen: String,
    pub candidates: usize,
    pub pick: usize,
}

/// One dialogue's scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemScore {
    pub item: String,
    pub group: String,
    pub setting: String,
    pub status: Status,
    /// Viable (feedback, reply) pairs checked, and how many passed.
    pub checks: usize,
    pub passed: usize,
    pub feedback: Vec<GivenRecord>,
    pub fa: Vec<FaRecord>,
}

impl ItemScore {
    /// This dialogue's RR in percent, when it has one.
    pub fn rr(&self) -> Option<f64> {
        (self.status == Status::Scored && self.checks > 0)
            .then(|| 100.0 * self.passed as f64 / self.checks as f64)
    }
    /// (accepted, judged, unscored) over the feedback turns; accepted is fractional under a
    /// panel's `mean` rule.
    fn fa_counts(&self) -> (f64, usize, usize) {
        let mut accepted = 0.0;
        let mut judged = 0;
        let mut unscored = 0;
        for r in &self.fa {
            match &r.verdict {
                Some(Verdict::Scored(a)) => {
                    judged += 1;
                    accepted += r
                        .mean
                        .unwrap_or(f64::from(u8::from(*a == Acceptance::Accepted)));
                }
                Some(Verdict::Unscored { .. }) => unscored += 1,
                None => {}
            }
        }
        (accepted, judged, unscored)
    }
}

/// Scores one dialogue from its finished steps, its FA as `judges` read it.
pub fn score_item(
    item: &Item,
    done: &Transcript,
    opts: &ReplayOptions,
    judges: Judges,
) -> ItemScore {
    let replay = dialogue::replay(item, done, opts);
    let mut checks = 0;
    let mut passed = 0;
    let mut feedback = Vec::new();
    let mut fa = Vec::new();
    for turn in &replay.turns {
        match &turn.kind {
            TurnKind::Query { checks: cs, .. } => {
                if let Some(reply) = turn.reply {
                    checks += cs.len();
                    passed += cs.iter().filter(|c| c.passes(&reply.text)).count();
                }
            }
            TurnKind::Feedback { given, .. } => {
                feedback.extend(given.iter().map(|g| GivenRecord {
                    turn: turn.index,
                    label: g.label.clone(),
                    chosen: g.chosen.clone(),
                    candidates: g.candidates,
                    pick: g.pick,
                }));
                if turn.reply.is_some() {
                    fa.push(FaRecord::read(turn.index, done, judges));
                }
            }
        }
    }
    let status = match replay.end {
        End::Waiting(_) => Status::Incomplete,
        _ if checks > 0 => Status::Scored,
        End::Conflict { .. } => Status::Conflict,
        End::Complete => Status::NotViable,
    };
    ItemScore {
        item: item.id.clone(),
        group: item.source.group(),
        setting: item.source.setting.label(),
        status,
        checks,
        passed,
        feedback,
        fa,
    }
}

/// Scores and their per-dialogue details.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scored {
    pub results: BenchResults,
    pub items: Vec<ItemScore>,
}

/// Scores a set of dialogues: headline metrics `<task>_<setting>_rr` and `<task>_<setting>_fa`
/// (MT language pairs pooled), and a table with one row per group (task or MT pair) and setting.
pub fn score(pairs: &[(&Item, &Transcript)], opts: &ScoreOptions) -> Scored {
    score_with(pairs, opts, opts.judges())
}

/// [`score`] with the FA of `judges` (one judge of a panel, or the panel).
pub fn score_with(pairs: &[(&Item, &Transcript)], opts: &ScoreOptions, judges: Judges) -> Scored {
    let items: Vec<ItemScore> = pairs
        .iter()
        .map(|(i, t)| score_item(i, t, &opts.replay, judges))
        .collect();
    let task_of = |s: &ItemScore| s.item.split('/').next().unwrap_or("").to_string();
    let mut metrics = Vec::new();
    let mut by_task: BTreeMap<(String, String), Vec<&ItemScore>> = BTreeMap::new();
    let mut by_group: BTreeMap<(String, String), Vec<&ItemScore>> = BTreeMap::new();
    for s in &items {
        by_task
            .entry((task_of(s), s.setting.clone()))
            .or_default()
            .push(s);
        by_group
            .entry((s.group.clone(), s.setting.clone()))
            .or_default()
            .push(s);
    }
    for ((task, setting), group) in &by_task {
        let (rr, fa) = summarize(group, opts.bootstrap_seed);
        metrics.push(Metric {
            name: format!("{task}_{setting}_rr"),
            ..rr.metric
        });
        metrics.push(Metric {
            name: format!("{task}_{setting}_fa"),
            ..fa.metric
        });
    }
    let mut rows = Vec::new();
    for ((group, setting), g) in &by_group {
        let (rr, fa) = summarize(g, opts.bootstrap_seed);
        let count = |st: Status| Cell::from(g.iter().filter(|s| s.status == st).count());
        rows.push(vec![
            Cell::from(group.as_str()),
            Cell::from(setting.as_str()),
            Cell::from(g.len()),
            rr.cell(),
            Cell::from(rr.metric.n),
            fa.cell(),
            Cell::from(fa.metric.n),
            Cell::from(fa.metric.unscored),
            count(Status::NotViable),
            count(Status::Conflict),
            count(Status::Incomplete),
        ]);
    }
    let table = Table {
        id: crate::bench::table::table_id::REFUTEBENCH_GROUPS.to_string(),
        title: "RefuteBench: response rate (RR) and feedback acceptance (FA), % with bootstrap 95% interval".into(),
        columns: [
            "group", "setting", "dialogues", "RR", "RR n", "FA", "FA n", "FA unscored", "not viable", "conflict",
            "incomplete",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    };
    Scored {
        results: BenchResults {
            metrics,
            tables: vec![table],
        },
        items,
    }
}

/// The per-item values of the headline metrics, for `candor compare`
/// ([`crate::bench::item_scores`]): `<task>_<setting>_rr`, each scored dialogue's RR (the
/// metric is their plain mean), and `<task>_<setting>_fa`, each judged feedback turn as
/// `<item>#<turn>`, the turn its index among the queries (the metric pools the turns, so it is their plain mean): 100 when accepted,
/// 0 when not, or a panel's share of Yes in percent under the `mean` rule (then not binary).
/// Dialogues without an RR and turns whose verdict could not be read are left out with the
/// reason; unfinished dialogues are left out of FA as they are of the metric.
pub fn item_values(items: &[ItemScore]) -> Vec<MetricItems> {
    let task_of = |s: &ItemScore| s.item.split('/').next().unwrap_or("").to_string();
    let mut by: BTreeMap<(String, String), Vec<&ItemScore>> = BTreeMap::new();
    for s in items {
        by.entry((task_of(s), s.setting.clone()))
            .or_default()
            .push(s);
    }
    let mut out = Vec::new();
    for ((task, setting), group) in by {
        let mut rr = MetricItems {
            metric: format!("{task}_{setting}_rr"),
            binary: false,
            values: Vec::new(),
            left_out: Vec::new(),
        };
        let mut fa = MetricItems {
            metric: format!("{task}_{setting}_fa"),
            binary: true,
            values: Vec::new(),
            left_out: Vec::new(),
        };
        for s in group {
            match s.rr() {
                Some(v) => rr.values.push(ItemValue {
                    id: s.item.clone(),
                    group: String::new(),
                    value: v,
                }),
                None => rr.left_out.push(LeftOut {
                    id: s.item.clone(),
                    reason: match s.status {
                        Status::NotViable => "no viable (feedback, reply) pair",
                        Status::Conflict => "a conflict before any pair",
                        Status::Incomplete => "unfinished",
                        Status::Scored => "no checks",
                    }
                    .to_string(),
                }),
            }
            if s.status == Status::Incomplete {
                continue;
            }
            for r in &s.fa {
                let id = format!("{}#{}", s.item, r.turn);
                match &r.verdict {
                    Some(Verdict::Scored(a)) => {
                        fa.binary &= r.mean.is_none();
                        let accepted = f64::from(u8::from(*a == Acceptance::Accepted));
                        fa.values.push(ItemValue {
                            id,
                            group: String::new(),
                            value: 100.0 * r.mean.unwrap_or(accepted),
                        });
                    }
                    Some(Verdict::Unscored { reason }) => fa.left_out.push(LeftOut {
                        id,
                        reason: format!("unscored: {reason}"),
                    }),
                    None => {}
                }
            }
        }
        out.push(rr);
        out.push(fa);
    }
    out
}

struct Summary {
    metric: Metric,
}

impl Summary {
    /// The value with its interval, two decimals; `n/a` (a NaN value) when nothing entered.
    fn cell(&self) -> Cell {
        let i = self.metric.interval;
        let value = if self.metric.n == 0 {
            f64::NAN
        } else {
            i.value
        };
        Cell::Interval {
            value,
            low: i.low,
            high: i.high,
            decimals: 2,
        }
    }
}

fn summarize(group: &[&ItemScore], seed: u64) -> (Summary, Summary) {
    let rr_values: Vec<f64> = group.iter().filter_map(|s| s.rr()).collect();
    let rr = bootstrap(&rr_values, mean, seed, RESAMPLES);
    let fa_units: Vec<(f64, usize)> = group
        .iter()
        .filter(|s| s.status != Status::Incomplete)
        .map(|s| s.fa_counts())
        .filter(|(_, judged, _)| *judged > 0)
        .map(|(a, j, _)| (a, j))
        .collect();
    let unscored: usize = group
        .iter()
        .filter(|s| s.status != Status::Incomplete)
        .map(|s| s.fa_counts().2)
        .sum();
    let ratio = |u: &[(f64, usize)]| {
        let (a, j) = u.iter().fold((0.0, 0), |(a, j), (x, y)| (a + x, j + y));
        if j == 0 {
            f64::NAN
        } else {
            100.0 * a / j as f64
        }
    };
    let fa = bootstrap(&fa_units, ratio, seed, RESAMPLES);
    let judged: usize = fa_units.iter().map(|(_, j)| j).sum();
    (
        Summary {
            metric: Metric {
                name: String::new(),
                interval: rr,
                n: rr_values.len(),
                unscored: 0,
            },
        },
        Summary {
            metric: Metric {
                name: String::new(),
                interval: fa,
                n: judged,
                unscored,
            },
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<ItemTranscript>, Error> {
        parse_transcripts(text.as_bytes(), Path::new("t.jsonl"))
    }

    const OUT: &str =
        r#"{"text": "hi", "stop_reason": "eos", "prompt_tokens": 3, "output_tokens": 1}"#;

    #[test]
    fn transcripts_merge_step_lines_and_whole_items() {
        let text = format!(
            "{{\"item\": \"a\", \"steps\": {{\"turn/0\": {OUT}}}}}\n\
             {{\"item_id\": \"b\", \"key\": \"turn/0\", \"output\": {OUT}}}\n\
             \n\
             {{\"item\": \"a\", \"key\": \"fa/1\", \"output\": {OUT}}}\n\
             {{\"item\": \"b\", \"key\": \"turn/1\", \"error\": \"engine failed\"}}\n"
        );
        let t = parse(&text).expect("parses");
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].item, "a");
        assert_eq!(t[0].steps.keys().collect::<Vec<_>>(), ["fa/1", "turn/0"]);
        assert_eq!(t[1].steps.len(), 1);
    }

    #[test]
    fn transcript_errors_name_the_line() {
        let cases = [
            (format!("{{\"item\": \"a\", \"key\": \"k\", \"output\": {OUT}}}\n{{\"item\": \"a\", \"key\": \"k\", \"output\": {OUT}}}"), "t.jsonl:2: step \"k\""),
            ("{\"item\": \"a\"}".to_string(), "t.jsonl:1: expected `steps`"),
            ("{\"item\": \"a\", \"key\": \"k\"}".to_string(), "t.jsonl:1: a step line needs"),
            ("[1]".to_string(), "t.jsonl:1: missing string field `item`"),
            ("{\"item\": \"a\", \"steps\": {\"k\": {\"text\": 1}}}".to_string(), "t.jsonl:1: steps:"),
        ];
        for (text, want) in cases {
            let err = parse(&text).expect_err(&text).to_string();
            assert!(err.starts_with(want), "{err} (wanted {want})");
        }
    }

    fn fake(
        status: Status,
        checks: usize,
        passed: usize,
        fa: &[Option<Verdict<Acceptance>>],
    ) -> ItemScore {
        ItemScore {
            item: "qa/single/x/0".into(),
            group: "qa".into(),
            setting: "memory_nc0".into(),
            status,
            checks,
            passed,
            feedback: Vec::new(),
            fa: fa
                .iter()
                .enumerate()
                .map(|(turn, v)| FaRecord {
                    turn,
                    verdict: v.clone(),
                    judges: Vec::new(),
                    mean: None,
                })
                .collect(),
        }
    }

    #[test]
    fn summaries_average_dialogues_and_pool_fa() {
        let yes = Some(Verdict::Scored(Acceptance::Accepted));
        let no = Some(Verdict::Scored(Acceptance::Rejected));
        let bad = Some(Verdict::unscored("neither"));
        let scores = [
            fake(Status::Scored, 2, 1, &[yes.clone(), no.clone()]),
            fake(Status::Scored, 1, 1, std::slice::from_ref(&yes)),
            fake(Status::NotViable, 0, 0, std::slice::from_ref(&bad)),
            fake(Status::Incomplete, 1, 0, std::slice::from_ref(&no)),
            fake(Status::Scored, 4, 0, &[None]),
        ];
        let refs: Vec<&ItemScore> = scores.iter().collect();
        let (rr, fa) = summarize(&refs, 0);
        // RR: mean of 50, 100 and 0 over the three scored dialogues.
        assert_eq!(rr.metric.n, 3);
        assert_eq!(rr.metric.interval.value, 50.0);
        assert!(rr.metric.interval.low <= 50.0 && rr.metric.interval.high >= 50.0);
        // FA: 2 accepted of 3 judged (the incomplete dialogue and the missing judgement left out),
        // one unparseable judgement counted beside.
        assert_eq!((fa.metric.n, fa.metric.unscored), (3, 1));
        assert!((fa.metric.interval.value - 200.0 / 3.0).abs() < 1e-9);
        let (rr, _) = summarize(&refs, 0);
        let (rr2, _) = summarize(&refs, 0);
        assert_eq!(rr.metric.interval, rr2.metric.interval, "seeded");
        assert_eq!(
            Summary {
                metric: Metric {
                    n: 0,
                    ..rr.metric.clone()
                }
            }
            .cell()
            .to_string(),
            "n/a"
        );
    }

    #[test]
    fn item_values_are_the_metrics_items() {
        let yes = Some(Verdict::Scored(Acceptance::Accepted));
        let no = Some(Verdict::Scored(Acceptance::Rejected));
        let bad = Some(Verdict::unscored("neither"));
        let mut scores = [
            fake(Status::Scored, 2, 1, &[yes.clone(), no.clone()]),
            fake(Status::Scored, 1, 1, std::slice::from_ref(&yes)),
            fake(Status::NotViable, 0, 0, std::slice::from_ref(&bad)),
            fake(Status::Incomplete, 1, 0, std::slice::from_ref(&no)),
            fake(Status::Scored, 4, 0, &[None]),
        ];
        for (k, s) in scores.iter_mut().enumerate() {
            s.item = format!("qa/single/x/{k}");
        }
        let refs: Vec<&ItemScore> = scores.iter().collect();
        let (rr, fa) = summarize(&refs, 0);
        let items = item_values(&scores);
        let names: Vec<&str> = items.iter().map(|m| m.metric.as_str()).collect();
        assert_eq!(names, ["qa_memory_nc0_rr", "qa_memory_nc0_fa"]);
        let mean =
            |m: &MetricItems| m.values.iter().map(|v| v.value).sum::<f64>() / m.values.len() as f64;
        // RR: the three scored dialogues; the other two left out with their reason.
        assert!(!items[0].binary);
        assert_eq!(items[0].values.len(), rr.metric.n);
        assert_eq!(mean(&items[0]), rr.metric.interval.value);
        let why: Vec<&str> = items[0]
            .left_out
            .iter()
            .map(|l| l.reason.as_str())
            .collect();
        assert_eq!(why, ["no viable (feedback, reply) pair", "unfinished"]);
        // FA: one value per judged turn of a finished dialogue (0 or 100), pooled as the
        // metric pools them; the unreadable judgement left out, the missing one absent.
        assert!(items[1].binary);
        let ids: Vec<&str> = items[1].values.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(
            ids,
            ["qa/single/x/0#0", "qa/single/x/0#1", "qa/single/x/1#0"]
        );
        assert_eq!(items[1].values.len(), fa.metric.n);
        assert!((mean(&items[1]) - fa.metric.interval.value).abs() < 1e-9);
        assert_eq!(items[1].left_out.len(), fa.metric.unscored);
        assert_eq!(items[1].left_out[0].reason, "unscored: neither");
    }
}
