//! Report tables, for every benchmark alike: an identifier, a title, columns and rows of typed
//! cells (among them the replies that stopped at their length limit, per step kind, which
//! every run reports). Numbers stay numbers here: a cell says how many decimals it is shown
//! with, and `report::format` (the one place a cell becomes text, through its `Display`)
//! writes it the same in Markdown, HTML and CSV.
//!
//! In `results.json` a cell is a string (text), an integer (a count), a float (a
//! [`Cell::Float`]), `null` (empty) or an object (`{"value", "decimals"}`, plus `low` and
//! `high` for an interval). Runs written before cells were typed hold every cell as a string;
//! a string that spells a number the way a cell prints it is read as that number, so their
//! reports draw the same charts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::panel::Panel;
use super::plan::Transcript;
use crate::engine::StopReason;

/// A table for reports: an identifier, a title, column names and rows of typed cells.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// What the table is, for code that looks for it (the HTML report's charts): one of
    /// [`table_id`]'s, or another snake_case name unique within a protocol's tables. Titles
    /// are for people and may change.
    #[serde(default)]
    pub id: String,
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// The column named `name`, by position.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
}

/// One cell of a [`Table`].
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Words: a model, a category, a note.
    Text(String),
    /// A count.
    Int(i64),
    /// A number shown with `decimals` decimals (`54.96`); NaN when it does not exist (an
    /// empty group), shown `n/a`.
    Num { value: f64, decimals: u8 },
    /// A number with its bootstrap 95% interval, the three shown with `decimals` decimals
    /// (`12.50 [10.00, 15.00]`); a NaN value (an empty group) is shown `n/a`.
    Interval {
        value: f64,
        low: f64,
        high: f64,
        decimals: u8,
    },
    /// A number in its shortest exact form, as Python prints a float: FB-Bench's published
    /// tables (`74.24`, `49`, `-1.240000000000009`).
    Float(f64),
    /// Nothing (FB-Bench's published tables leave a score of 0 empty).
    Empty,
}

impl Cell {
    /// A number with `decimals` decimals.
    pub fn num(value: f64, decimals: u8) -> Cell {
        Cell::Num { value, decimals }
    }

    /// The cell's number and its interval, for charts; None for text, an empty cell or a
    /// value that does not exist.
    pub fn value(&self) -> Option<(f64, Option<(f64, f64)>)> {
        let (v, interval) = match *self {
            Cell::Int(n) => (n as f64, None),
            Cell::Num { value, .. } | Cell::Float(value) => (value, None),
            Cell::Interval {
                value, low, high, ..
            } => (
                value,
                (low.is_finite() && high.is_finite()).then_some((low, high)),
            ),
            Cell::Text(_) | Cell::Empty => return None,
        };
        v.is_finite().then_some((v, interval))
    }

    /// A cell of a `results.json` written before cells were typed: the number it spells
    /// (`12`, `54.96`, `50.00 [25.00, 75.00]`, with as many decimals as written), empty for
    /// `""`, else text.
    pub fn from_legacy(s: &str) -> Cell {
        if s.is_empty() {
            return Cell::Empty;
        }
        if let Some((head, rest)) = s.split_once(" [") {
            let parts = rest
                .strip_suffix(']')
                .and_then(|r| r.split_once(", "))
                .and_then(|(lo, hi)| Some((decimal(head)?, decimal(lo)?, decimal(hi)?)));
            return match parts {
                Some(((value, d), (low, dl), (high, dh))) if d == dl && d == dh => Cell::Interval {
                    value,
                    low,
                    high,
                    decimals: d,
                },
                _ => Cell::Text(s.to_string()),
            };
        }
        if integer(s) && s != "-0" {
            if let Ok(n) = s.parse() {
                return Cell::Int(n);
            }
        }
        match decimal(s) {
            Some((value, decimals)) if decimals > 0 => Cell::Num { value, decimals },
            _ => Cell::Text(s.to_string()),
        }
    }
}

/// `-?(0|[1-9][0-9]*)`: an integer as a cell prints one.
fn integer(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
}

/// A number with a fixed count of decimals as a cell prints one (`-12.50`: -12.5 and 2), at
/// most 17 of them.
fn decimal(s: &str) -> Option<(f64, u8)> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = frac.len() <= 17 && frac.bytes().all(|b| b.is_ascii_digit());
    let ok = integer(int) && digits && !s.ends_with('.');
    let value: f64 = s.parse().ok().filter(|v: &f64| v.is_finite())?;
    ok.then_some((value, frac.len() as u8))
}

/// A row as text, each cell as reports write it (its `Display`, in `report::format`).
pub fn texts(row: &[Cell]) -> Vec<String> {
    row.iter().map(Cell::to_string).collect()
}

impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_string())
    }
}

impl From<usize> for Cell {
    fn from(n: usize) -> Cell {
        Cell::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// How a cell is written in JSON; a non-finite number becomes `null`.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Wire {
    Empty,
    Int(i64),
    Float(f64),
    Text(String),
    Interval {
        #[serde(with = "nullable")]
        value: f64,
        #[serde(with = "nullable")]
        low: f64,
        #[serde(with = "nullable")]
        high: f64,
        decimals: u8,
    },
    Num {
        #[serde(with = "nullable")]
        value: f64,
        decimals: u8,
    },
}

/// A float that is `null` in JSON when not finite.
mod nullable {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        match x.is_finite() {
            true => s.serialize_f64(*x),
            false => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

impl Serialize for Cell {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let wire = match self.clone() {
            Cell::Text(t) => Wire::Text(t),
            Cell::Int(n) => Wire::Int(n),
            Cell::Float(x) if x.is_finite() => Wire::Float(x),
            Cell::Float(_) | Cell::Empty => Wire::Empty,
            Cell::Num { value, decimals } => Wire::Num { value, decimals },
            Cell::Interval {
                value,
                low,
                high,
                decimals,
            } => Wire::Interval {
                value,
                low,
                high,
                decimals,
            },
        };
        wire.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Cell {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cell, D::Error> {
        Ok(match Wire::deserialize(d)? {
            Wire::Empty => Cell::Empty,
            Wire::Int(n) => Cell::Int(n),
            Wire::Float(x) => Cell::Float(x),
            Wire::Text(t) => Cell::from_legacy(&t),
            Wire::Num { value, decimals } => Cell::Num { value, decimals },
            Wire::Interval {
                value,
                low,
                high,
                decimals,
            } => Cell::Interval {
                value,
                low,
                high,
                decimals,
            },
        })
    }
}

/// The identifiers of the tables that reports look for.
pub mod table_id {
    /// [`super::length_limit_table`].
    pub const LENGTH_LIMIT: &str = "length_limit";
    /// [`super::reasoning_table`].
    pub const REASONING: &str = "reasoning";
    /// Notes of the run (`smoke test`, …), every protocol.
    pub const RUN_NOTES: &str = "run_notes";
    /// FB-Bench: the published leaderboard and its per-category tables.
    pub const FBBENCH_OVERALL: &str = "overall_score";
    pub const FBBENCH_PER_TASK: &str = "per_task_score";
    pub const FBBENCH_PER_ERROR: &str = "per_error_score";
    pub const FBBENCH_PER_FEEDBACK_CORRECT: &str = "per_feedback_score_correct";
    pub const FBBENCH_PER_FEEDBACK_ANTISYCO: &str = "per_feedback_score_antisyco";
    /// RefuteBench: RR and FA by context depth and setting.
    pub const REFUTEBENCH_GROUPS: &str = "refutebench_groups";
    /// ReaLMistake.
    pub const REALMISTAKE_PER_DETECTOR: &str = "realmistake_per_detector";
    pub const REALMISTAKE_PER_TASK_PROMPT: &str = "realmistake_per_task_prompt";
    pub const REALMISTAKE_RANDOM_BASELINE: &str = "realmistake_random_baseline";
    /// Fennec: pairwise agreement and consistency, single-verdict accuracy, judge replies.
    pub const FENNEC_PAIRWISE: &str = "fennec_pairwise";
    pub const FENNEC_SINGLE: &str = "fennec_single";
    pub const FENNEC_REPLIES: &str = "fennec_replies";
    /// Judge reliability (any protocol): Cohen's / Fleiss' κ of a judge against human labels,
    /// between judges, or between a judge's two orders; confusion matrices have their own
    /// ids, starting `confusion_`.
    pub const JUDGE_KAPPA: &str = "judge_kappa";
    /// The annotators' agreement with each other (PandaLM): the human ceiling.
    pub const HUMAN_KAPPA: &str = "human_kappa";
    /// Fennec: first- and second-position preference and consistency across the two orders.
    pub const POSITION_BIAS: &str = "position_bias";
    /// A panel of judges: the panel's headline metrics and each judge's beside them.
    pub const PANEL_JUDGES: &str = "panel_judges";
    /// ReaLMistake: the detectors' agreement with each other.
    pub const DETECTOR_KAPPA: &str = "detector_kappa";
}

/// The kind of a step, for counts: its key without what follows a `+` (RefuteBench's
/// `+dropped=` record), with every numeric part written `*` (`turn/3` → `turn/*`,
/// `pairwise/0/normal` → `pairwise/*/normal`); a panel judge's step ([`Panel::key`]) is its
/// first judge's kind and the judge (`judge/judge/2` → `judge · judge 2`, `fa/3/judge/1` →
/// `fa/* · judge 1`).
pub fn step_kind(key: &str) -> String {
    let key = key.split('+').next().unwrap_or(key);
    if let Some((base, j)) = Panel::split_key(key) {
        return format!("{} · judge {j}", step_kind(base));
    }
    key.split('/')
        .map(|p| {
            if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                p
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Per step kind: finished replies, those that stopped at their new-token limit (cut short:
/// a verdict or score after the cut is lost), those that stopped because the context was full,
/// and steps whose conversation lost earlier turns to fit the context.
pub fn length_limit_table<'a>(transcripts: impl IntoIterator<Item = &'a Transcript>) -> Table {
    let mut counts: BTreeMap<String, [usize; 4]> = BTreeMap::new();
    for done in transcripts {
        for (key, out) in done {
            let c = counts.entry(step_kind(key)).or_default();
            c[0] += 1;
            c[1] += usize::from(out.stop_reason == StopReason::MaxTokens);
            c[2] += usize::from(out.stop_reason == StopReason::ContextFull);
            c[3] += usize::from(key.contains("+dropped=") || out.truncated.is_some());
        }
    }
    Table {
        id: table_id::LENGTH_LIMIT.to_string(),
        title: "Replies stopped at the length limit".to_string(),
        columns: [
            "step kind",
            "replies",
            "stopped at max_new_tokens",
            "context full",
            "lost earlier turns",
        ]
        .map(String::from)
        .to_vec(),
        rows: counts
            .into_iter()
            .map(|(k, c)| {
                let mut row = vec![Cell::Text(k)];
                row.extend(c.map(Cell::from));
                row
            })
            .collect(),
    }
}

/// Per step kind (each kind is one role's: the candidate's turns, the judge's verdicts), a
/// thinking model's reasoning: replies that reasoned, their reasoning length in tokens (mean
/// and largest), and the replies cut inside their reasoning (unscored, "reasoning
/// truncated"). `None` when no reply reasoned.
pub fn reasoning_table<'a>(transcripts: impl IntoIterator<Item = &'a Transcript>) -> Option<Table> {
    // Per kind: replies, replies that reasoned, reasoning tokens, largest, cut.
    let mut counts: BTreeMap<String, [usize; 5]> = BTreeMap::new();
    for done in transcripts {
        for (key, out) in done {
            let c = counts.entry(step_kind(key)).or_default();
            c[0] += 1;
            if let Some(r) = &out.reasoning {
                c[1] += 1;
                c[2] += r.tokens;
                c[3] = c[3].max(r.tokens);
                c[4] += usize::from(r.truncated);
            }
        }
    }
    if counts.values().all(|c| c[1] == 0) {
        return None;
    }
    Some(Table {
        id: table_id::REASONING.to_string(),
        title: "Reasoning of thinking models".to_string(),
        columns: [
            "step kind",
            "replies",
            "with reasoning",
            "mean reasoning tokens",
            "most reasoning tokens",
            "cut inside the reasoning",
        ]
        .map(String::from)
        .to_vec(),
        rows: counts
            .into_iter()
            .map(|(k, c)| {
                let mean = match c[1] {
                    0 => Cell::from("–"),
                    n => Cell::num(c[2] as f64 / n as f64, 1),
                };
                vec![
                    Cell::Text(k),
                    Cell::from(c[0]),
                    Cell::from(c[1]),
                    mean,
                    Cell::from(c[3]),
                    Cell::from(c[4]),
                ]
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::plan::StepOutput;

    #[test]
    fn reasoning_counts_per_step_kind() {
        use crate::engine::Reasoning;
        let with = |tokens, truncated| StepOutput {
            reasoning: Some(Reasoning {
                text: "r".into(),
                tokens,
                truncated,
            }),
            ..StepOutput::scripted(if truncated { "" } else { "a" })
        };
        let mut a = Transcript::new();
        a.insert("turn/1".into(), StepOutput::scripted("x"));
        a.insert("judge".into(), with(10, false));
        let mut b = Transcript::new();
        b.insert("turn/1".into(), StepOutput::scripted("y"));
        b.insert("judge".into(), with(30, true));
        let t = reasoning_table([&a, &b]).expect("a table");
        assert_eq!(
            t.rows,
            vec![
                vec![
                    Cell::Text("judge".into()),
                    Cell::from(2usize),
                    Cell::from(2usize),
                    Cell::num(20.0, 1),
                    Cell::from(30usize),
                    Cell::from(1usize),
                ],
                vec![
                    Cell::Text("turn/*".into()),
                    Cell::from(2usize),
                    Cell::from(0usize),
                    Cell::from("–"),
                    Cell::from(0usize),
                    Cell::from(0usize),
                ],
            ]
        );
        a.remove("judge");
        assert!(reasoning_table([&a]).is_none());
    }

    #[test]
    fn kinds_and_length_limit_counts() {
        assert_eq!(step_kind("turn/3+dropped=0,1"), "turn/*");
        assert_eq!(step_kind("pairwise/0/normal"), "pairwise/*/normal");
        assert_eq!(step_kind("detector/1/prompt/5"), "detector/*/prompt/*");
        assert_eq!(step_kind("judge"), "judge");
        // A panel's other judges: no `judge/judge/*`.
        assert_eq!(step_kind("judge/judge/2"), "judge · judge 2");
        assert_eq!(step_kind("fa/3/judge/1+dropped=0"), "fa/* · judge 1");
        let cut = StepOutput {
            stop_reason: StopReason::MaxTokens,
            ..StepOutput::scripted("Response A Score: 4")
        };
        let a: Transcript = [
            ("turn/0".to_string(), StepOutput::scripted("x")),
            ("turn/2+dropped=0".to_string(), cut.clone()),
            ("fa/1".to_string(), cut),
        ]
        .into_iter()
        .collect();
        let b: Transcript = [("turn/0".to_string(), StepOutput::scripted("y"))]
            .into_iter()
            .collect();
        let t = length_limit_table([&a, &b]);
        let rows: Vec<Vec<String>> = t.rows.iter().map(|r| texts(r)).collect();
        assert_eq!(
            rows,
            [["fa/*", "1", "1", "0", "0"], ["turn/*", "3", "1", "0", "1"],]
        );
        assert_eq!(t.rows[0][1], Cell::Int(1));
    }

    #[test]
    fn cells_round_trip_through_json() {
        let row = vec![
            Cell::from("Coding"),
            Cell::Int(3),
            Cell::num(54.96, 2),
            Cell::Interval {
                value: 50.0,
                low: 25.0,
                high: 75.0,
                decimals: 2,
            },
            Cell::Float(74.24),
            Cell::Float(49.0),
            Cell::Empty,
        ];
        let json = serde_json::to_string(&row).unwrap();
        assert_eq!(
            json,
            r#"["Coding",3,{"value":54.96,"decimals":2},{"value":50.0,"low":25.0,"high":75.0,"decimals":2},74.24,49.0,null]"#
        );
        let back: Vec<Cell> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, row);
        // A value that does not exist is null, and NaN again when read.
        let nan = serde_json::to_string(&Cell::num(f64::NAN, 1)).unwrap();
        assert_eq!(nan, r#"{"value":null,"decimals":1}"#);
        let back: Cell = serde_json::from_str(&nan).unwrap();
        assert!(matches!(back, Cell::Num { value, decimals: 1 } if value.is_nan()));
    }

    #[test]
    fn string_cells_of_older_runs_read_as_the_numbers_they_spell() {
        let old = r#"["Coding", "40", "", "54.96", "50.00 [25.00, 75.00]", "-", "NaN", "007",
            "1.5 [1, 2]", "-1.240000000000009", "-20"]"#;
        let cells: Vec<Cell> = serde_json::from_str(old).unwrap();
        assert_eq!(
            cells[..5],
            [
                Cell::from("Coding"),
                Cell::Int(40),
                Cell::Empty,
                Cell::num(54.96, 2),
                Cell::Interval {
                    value: 50.0,
                    low: 25.0,
                    high: 75.0,
                    decimals: 2
                },
            ]
        );
        for text in ["-", "NaN", "007", "1.5 [1, 2]", "-0", "1.", "1. [0., 2.]"] {
            assert_eq!(Cell::from_legacy(text), Cell::from(text), "{text}");
        }
        for text in ["-", "NaN", "007", "1.5 [1, 2]"] {
            assert!(cells.contains(&Cell::from(text)), "{text}");
        }
        assert_eq!(cells[9], Cell::num(-1.240000000000009, 15));
        assert_eq!(cells[10], Cell::Int(-20));
        // Each prints as it was written.
        let strings: Vec<String> = serde_json::from_str(old).unwrap();
        assert_eq!(texts(&cells), strings);
    }
}
