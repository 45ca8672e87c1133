//! The per-item values behind headline metrics, kept so that candidates scored on the same
//! items can be compared item by item (`candor compare` and the report's paired comparisons,
//! in `report::compare`). A protocol's scoring writes them as `item_scores.json` beside
//! `results.json` (and `candor score` beside its tables); this module only defines the
//! document and reads it. It computes no statistics (`crate::stats`).
//!
//! Each metric is, over the values listed, the mean over groups of each group's mean (a
//! plain mean when every value has the same group), on the metric's own scale, so the
//! difference of two candidates' metrics over their common items is the same statistic of
//! the per-item differences.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file name in a run directory (or a `candor score` output folder).
pub const FILE: &str = "item_scores.json";

/// Everything `item_scores.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemScores {
    /// The protocol's snake_case name.
    pub protocol: String,
    /// What the items are (`fbbench v3`, a user's file): documents of other data are not
    /// compared.
    pub data: String,
    /// How replies became values (rule, judge): documents scored otherwise are not compared.
    pub scoring: String,
    /// Every item of the run by id, scored or not, in run order.
    pub items: Vec<String>,
    pub candidates: Vec<CandidateScores>,
}

/// One candidate's values per headline metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateScores {
    pub name: String,
    pub metrics: Vec<MetricItems>,
}

/// One headline metric's per-item values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricItems {
    /// As in `results.json` (`overall`, `accuracy`).
    pub metric: String,
    /// Whether each item's outcome is one of two values (success or not), so that two
    /// candidates are compared with McNemar's exact test where every item weighs the same in
    /// the metric (else with the weighted sign flip, [`crate::stats::paired`]).
    pub binary: bool,
    pub values: Vec<ItemValue>,
    /// Items of the metric that have no value (unscored), with the reason.
    #[serde(default)]
    pub left_out: Vec<LeftOut>,
}

/// One item's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemValue {
    pub id: String,
    pub group: String,
    pub value: f64,
}

/// An item without a value, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeftOut {
    pub id: String,
    pub reason: String,
}

/// Errors of reading an `item_scores.json`.
#[derive(Debug, thiserror::Error)]
pub enum ItemScoresError {
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: not an item_scores.json: {message}", path.display())]
    Parse {
        path: std::path::PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Invalid {
        path: std::path::PathBuf,
        message: String,
    },
}

impl ItemScores {
    /// The document as written: pretty JSON and a final newline (no float is NaN: values
    /// that do not exist are [`LeftOut`]).
    pub fn to_json(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Reads and checks a document: every value finite, no item twice in a metric, every
    /// item among `items`.
    pub fn load(path: &Path) -> Result<ItemScores, ItemScoresError> {
        let text = std::fs::read_to_string(path).map_err(|source| ItemScoresError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let doc: ItemScores = serde_json::from_str(&text).map_err(|e| ItemScoresError::Parse {
            path: path.to_path_buf(),
            line: e.line(),
            message: e.to_string(),
        })?;
        doc.check().map_err(|message| ItemScoresError::Invalid {
            path: path.to_path_buf(),
            message,
        })?;
        Ok(doc)
    }

    /// What is wrong with the document, if anything.
    pub fn check(&self) -> Result<(), String> {
        let items: std::collections::BTreeSet<&str> =
            self.items.iter().map(String::as_str).collect();
        if items.len() != self.items.len() {
            return Err("an item id is listed twice in `items`".to_string());
        }
        for c in &self.candidates {
            for m in &c.metrics {
                let mut seen = std::collections::BTreeSet::new();
                let ids = m
                    .values
                    .iter()
                    .map(|v| &v.id)
                    .chain(m.left_out.iter().map(|l| &l.id));
                for id in ids {
                    if !items.contains(id.as_str()) {
                        return Err(format!(
                            "{} {}: item {id:?} is not in `items`",
                            c.name, m.metric
                        ));
                    }
                    if !seen.insert(id) {
                        return Err(format!(
                            "{} {}: item {id:?} appears twice",
                            c.name, m.metric
                        ));
                    }
                }
                if let Some(v) = m.values.iter().find(|v| !v.value.is_finite()) {
                    return Err(format!(
                        "{} {}: item {:?} has no finite value",
                        c.name, m.metric, v.id
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> ItemScores {
        ItemScores {
            protocol: "toy".into(),
            data: "toy v1".into(),
            scoring: "rule=x".into(),
            items: vec!["a".into(), "b".into()],
            candidates: vec![CandidateScores {
                name: "m".into(),
                metrics: vec![MetricItems {
                    metric: "score".into(),
                    binary: true,
                    values: vec![ItemValue {
                        id: "a".into(),
                        group: "g".into(),
                        value: 1.0,
                    }],
                    left_out: vec![LeftOut {
                        id: "b".into(),
                        reason: "no verdict".into(),
                    }],
                }],
            }],
        }
    }

    #[test]
    fn round_trips_and_refuses_bad_documents() {
        let dir = std::env::temp_dir().join(format!("candor-item-scores-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(FILE);
        std::fs::write(&path, doc().to_json()).unwrap();
        assert_eq!(ItemScores::load(&path).unwrap(), doc());
        let mut bad = doc();
        bad.candidates[0].metrics[0].values[0].id = "z".into();
        assert_eq!(
            bad.check().unwrap_err(),
            "m score: item \"z\" is not in `items`"
        );
        let mut twice = doc();
        twice.candidates[0].metrics[0].left_out[0].id = "a".into();
        assert!(twice.check().unwrap_err().contains("twice"));
        std::fs::write(&path, "{\n\"protocol\": 3}").unwrap();
        let err = ItemScores::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("item_scores.json:2: not an item_scores.json"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
