//! Where a RefuteBench item comes from: its task, its MT language pair and its setting, all read
//! from the file's path in the authors' layout (`<task>/<single|multi>/<file>.jsonl`, single files
//! named `<stem>.<memory|generalization>.NC-<k>.jsonl`). Reading the lines is [`super::data`]'s job.

/// The three tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Task {
    /// Knowledge: counterfactual facts from RippleEdits.
    Qa,
    /// Multilinguality: lexical constraints in WMT23 translation.
    Mt,
    /// Writing: verifiable email-format instructions.
    Email,
}

impl Task {
    pub fn as_str(self) -> &'static str {
        match self {
            Task::Qa => "qa",
            Task::Mt => "mt",
            Task::Email => "email",
        }
    }
    fn from_dir(s: &str) -> Option<Task> {
        match s {
            "qa" => Some(Task::Qa),
            "mt" => Some(Task::Mt),
            "email" => Some(Task::Email),
            _ => None,
        }
    }
}

/// The verification query of the single-feedback setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verification {
    /// The initial query asked again (the paper's "memory" / "forgetting").
    Memory,
    /// A different query the same feedback applies to.
    Generalization,
}

/// Which protocol setting a file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Setting {
    /// One feedback, then `context` unrelated chat turns (the file's `NC-k`, the paper's
    /// Context=k), then the verification query.
    Single {
        verification: Verification,
        context: usize,
    },
    /// Several queries and feedbacks interleaved.
    Multi,
}

impl Setting {
    /// `memory_nc0` … `generalization_nc3`, or `multi`.
    pub fn label(self) -> String {
        match self {
            Setting::Single {
                verification,
                context,
            } => {
                let v = match verification {
                    Verification::Memory => "memory",
                    Verification::Generalization => "generalization",
                };
                format!("{v}_nc{context}")
            }
            Setting::Multi => "multi".to_string(),
        }
    }
}

/// Where an item comes from: task, language pair (MT only), setting and file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub task: Task,
    /// `en-zh` or `en-he` for MT.
    pub pair: Option<String>,
    pub setting: Setting,
    /// Path relative to the RefuteBench data root, e.g. `qa/single/qa.memory.NC-1.jsonl`.
    pub file: String,
}

impl Source {
    /// Reads task, pair and setting from a path relative to the data root.
    pub fn from_rel_path(rel: &str) -> Result<Source, String> {
        let parts: Vec<&str> = rel.split('/').collect();
        let [task, scenario, name] = parts[..] else {
            return Err("expected <task>/<single|multi>/<file>.jsonl".into());
        };
        let task = Task::from_dir(task).ok_or_else(|| format!("unknown task folder {task:?}"))?;
        let stem = name
            .strip_suffix(".jsonl")
            .ok_or("expected a .jsonl file")?;
        let (pair_stem, setting) = match scenario {
            "multi" => (stem, Setting::Multi),
            "single" => {
                let mut it = stem.rsplitn(3, '.');
                let (nc, kind, base) = match (it.next(), it.next(), it.next()) {
                    (Some(nc), Some(kind), Some(base)) => (nc, kind, base),
                    _ => return Err("expected <stem>.<memory|generalization>.NC-<k>.jsonl".into()),
                };
                let verification = match kind {
                    "memory" => Verification::Memory,
                    "generalization" => Verification::Generalization,
                    other => return Err(format!("unknown verification type {other:?}")),
                };
                let context = nc
                    .strip_prefix("NC-")
                    .and_then(|k| k.parse::<usize>().ok())
                    .ok_or_else(|| format!("expected NC-<k>, found {nc:?}"))?;
                (
                    base,
                    Setting::Single {
                        verification,
                        context,
                    },
                )
            }
            other => return Err(format!("unknown scenario folder {other:?}")),
        };
        let pair = match task {
            Task::Mt => {
                let (src, tgt) = pair_stem.split_once('-').ok_or_else(|| {
                    format!("expected a language pair like en-zh, found {pair_stem:?}")
                })?;
                if src != "en" || !matches!(tgt, "zh" | "he") {
                    return Err(format!("unsupported language pair {pair_stem:?}"));
                }
                Some(pair_stem.to_string())
            }
            _ => None,
        };
        Ok(Source {
            task,
            pair,
            setting,
            file: rel.to_string(),
        })
    }

    /// Whether this source belongs to a named subset (the `--subset` of a run): one or more
    /// `/`-separated parts, each a task (`qa`, `mt`, `email`), a group (`mt_en_zh`, `mt_en_he`),
    /// a scenario (`single`, `multi`), a verification type (`memory`, `generalization`), a
    /// context (`nc0` … `nc3`) or a setting label (`memory_nc1`); every part must match.
    /// E.g. `qa`, `mt_en_he/multi`, `email/generalization_nc3`, `memory/nc0`.
    pub fn matches(&self, subset: &str) -> bool {
        let setting = self.setting.label();
        subset.split('/').all(|part| {
            part == self.task.as_str()
                || part == self.group()
                || part == setting
                || match self.setting {
                    Setting::Multi => part == "multi",
                    Setting::Single {
                        verification,
                        context,
                    } => {
                        part == "single"
                            || part == format!("nc{context}")
                            || part
                                == match verification {
                                    Verification::Memory => "memory",
                                    Verification::Generalization => "generalization",
                                }
                    }
                }
        })
    }

    /// `qa`, `mt_en_zh`, `mt_en_he` or `email`: the rows of the report tables.
    pub fn group(&self) -> String {
        match &self.pair {
            Some(p) => format!("{}_{}", self.task.as_str(), p.replace('-', "_")),
            None => self.task.as_str().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsets_match_by_every_part() {
        let s = Source::from_rel_path("mt/single/en-he.generalization.NC-3.jsonl").expect("ok");
        for yes in [
            "mt",
            "mt_en_he",
            "single",
            "generalization",
            "nc3",
            "generalization_nc3",
            "mt/nc3",
            "mt_en_he/single/generalization",
        ] {
            assert!(s.matches(yes), "{yes}");
        }
        for no in [
            "qa",
            "mt_en_zh",
            "multi",
            "memory",
            "nc0",
            "mt/memory",
            "",
            "en-he",
        ] {
            assert!(!s.matches(no), "{no}");
        }
        let m = Source::from_rel_path("qa/multi/qa.jsonl").expect("ok");
        assert!(m.matches("qa/multi") && !m.matches("qa/single"));
    }

    #[test]
    fn file_names_give_task_pair_and_setting() {
        let s = Source::from_rel_path("mt/single/en-he.generalization.NC-3.jsonl").expect("ok");
        assert_eq!(s.task, Task::Mt);
        assert_eq!(s.pair.as_deref(), Some("en-he"));
        assert_eq!(s.setting.label(), "generalization_nc3");
        assert_eq!(s.group(), "mt_en_he");
        let m = Source::from_rel_path("qa/multi/qa.jsonl").expect("ok");
        assert_eq!(m.setting, Setting::Multi);
        assert!(Source::from_rel_path("qa/single/qa.memory.jsonl").is_err());
        assert!(Source::from_rel_path("mt/multi/de-en.jsonl").is_err());
        assert!(Source::from_rel_path("qa/other/qa.jsonl").is_err());
    }
}
