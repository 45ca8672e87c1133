//! `results.json`: a run's scores plus what the run covered, as one deterministic document.
//!
//! Nothing in it depends on when, where or how fast the run went (no timestamps, timings or
//! paths), so two runs of the same manifest write the same bytes. Floats are written by
//! `serde_json` (shortest round-trip form); a NaN (an empty metric) becomes `null`.
//!
//! Every metric carries, beside `n` and `unscored` (judge outputs that could not be parsed),
//! `failed`: the items left out because one of their steps failed (a template, tokenizer or
//! context-length failure, listed under `failed` with the steps each one skipped).

use serde::{Deserialize, Serialize};

use crate::bench::plan::Actor;
use crate::bench::BenchResults;

/// A model that took part, as the report names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunModel {
    pub role: String,
    pub name: String,
    pub sha256: String,
}

/// A step that failed on its own (its item was left out of scoring).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedStep {
    pub item: String,
    pub key: String,
    pub actor: Actor,
    pub error: String,
    /// The item's planned steps that did not run because of the failure (when the plan
    /// says how many it has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<usize>,
}

/// Everything `results.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResults {
    pub protocol: String,
    pub models: Vec<RunModel>,
    /// Items in the run.
    pub items: usize,
    /// Items whose every step finished (these were scored).
    pub completed: usize,
    /// Lines in samples.jsonl.
    pub samples: usize,
    /// Planned steps of failed items that did not run.
    #[serde(default)]
    pub skipped_steps: usize,
    /// One failed step per failed item.
    pub failed: Vec<FailedStep>,
    #[serde(flatten)]
    pub results: BenchResults,
}

impl RunResults {
    /// The document as written: pretty JSON and a final newline.
    pub fn to_json(&self) -> Vec<u8> {
        // Plain data with string keys: serialisation cannot fail.
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(metrics) = value.get_mut("metrics").and_then(|m| m.as_array_mut()) {
            for m in metrics.iter_mut().filter_map(|m| m.as_object_mut()) {
                m.insert("failed".to_string(), self.failed.len().into());
            }
        }
        let mut bytes = serde_json::to_vec_pretty(&value).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::Interval;
    use crate::bench::stats::Metric;

    #[test]
    fn json_has_metrics_at_top_level_and_nan_as_null() {
        let r = RunResults {
            protocol: "toy".into(),
            models: vec![],
            items: 2,
            completed: 1,
            samples: 5,
            skipped_steps: 2,
            failed: vec![FailedStep {
                item: "b".into(),
                key: "turn/1".into(),
                actor: Actor::Candidate(0),
                error: "too long".into(),
                skipped: Some(2),
            }],
            results: BenchResults {
                metrics: vec![Metric {
                    name: "score".into(),
                    interval: Interval {
                        value: f64::NAN,
                        low: 0.25,
                        high: 1.0,
                    },
                    n: 0,
                    unscored: 1,
                }],
                tables: vec![],
            },
        };
        let s = String::from_utf8(r.to_json()).unwrap();
        assert!(s.contains("\"metrics\": ["), "{s}");
        assert!(s.contains("\"value\": null"), "{s}");
        assert!(
            s.contains("\"n\": 0,\n      \"unscored\": 1,\n      \"failed\": 1\n"),
            "{s}"
        );
        assert!(s.contains("\"skipped_steps\": 2,"), "{s}");
        assert!(s.contains("\"skipped\": 2"), "{s}");
        assert!(s.contains("\"actor\": {\n        \"candidate\": 0"), "{s}");
        assert!(s.ends_with("}\n"));
        // What was written reads back: n/a values (null) are NaN again, `failed` is ignored.
        let back: RunResults = serde_json::from_str(&s).unwrap();
        let i = back.results.metrics[0].interval;
        assert!(i.value.is_nan(), "{i:?}");
        assert_eq!((i.low, i.high), (0.25, 1.0));
        assert_eq!(back.failed, r.failed);
        assert_eq!(back.skipped_steps, 2);
    }
}
