//! Judge panels: several judges (`--judge A --judge B --judge C`) grade the same units, and
//! one verdict per unit is made from theirs (`--panel majority|mean`), as in Verga et al.
//! (2024), "Replacing Judges with Juries". Judge 0 is [`Actor::Judge`] and keeps the step
//! keys of a one-judge run; judge `j ≥ 1` is [`Actor::Panel`]`(j)` and its steps carry
//! `/judge/<j>` (see [`Panel::key`]), so every judge's reply is kept in the samples and
//! resumes, caches, shards and merges like any step.
//!
//! What a unit's panel verdict is depends on the protocol (FB-Bench votes per checklist
//! entry, RefuteBench per feedback turn); this module holds what they share: the rule, the
//! binary vote with its tie rule, and the keys. A judge whose reply cannot be parsed is left
//! out of that unit's vote (and counted unscored for that judge); a unit no judge could score
//! is unscored.

use crate::bench::plan::Actor;
use crate::bench::protocol::{ProtocolError, ProtocolOptions, RunContext};

/// How the judges' verdicts on a unit become the panel's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PanelRule {
    /// The verdict most judges gave; each protocol says what a tie is.
    #[default]
    Majority,
    /// The mean of the judges' scores for the unit.
    Mean,
}

impl PanelRule {
    /// `--panel majority|mean` (majority when not given).
    pub fn parse(value: Option<&str>) -> Result<PanelRule, ProtocolError> {
        match value {
            None | Some("majority") => Ok(PanelRule::Majority),
            Some("mean") => Ok(PanelRule::Mean),
            Some(other) => Err(ProtocolError::bad_value(
                "--panel",
                other,
                "the values are `majority` and `mean`",
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PanelRule::Majority => "majority",
            PanelRule::Mean => "mean",
        }
    }
}

/// The judges of a run and their rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panel {
    /// How many judges (1: no panel).
    pub judges: usize,
    pub rule: PanelRule,
}

impl Default for Panel {
    fn default() -> Self {
        Panel {
            judges: 1,
            rule: PanelRule::Majority,
        }
    }
}

impl Panel {
    /// The key of judge `j`'s step whose one-judge key is `base`: `base` itself for judge 0,
    /// `base/judge/<j>` for the others.
    pub fn key(base: &str, j: usize) -> String {
        if j == 0 {
            base.to_string()
        } else {
            format!("{base}/judge/{j}")
        }
    }

    /// The inverse of [`Panel::key`] for the judges after the first: `(base, j)` when `key` is
    /// `base/judge/<j>` with `j ≥ 1`.
    pub fn split_key(key: &str) -> Option<(&str, usize)> {
        let (base, j) = key.rsplit_once("/judge/")?;
        let j: usize =
            (!j.is_empty() && j.bytes().all(|b| b.is_ascii_digit())).then(|| j.parse().ok())??;
        (j >= 1 && !base.is_empty()).then_some((base, j))
    }

    /// The run's panel: one judge per `--judge`, the rule `--panel` names (refused with a
    /// single judge).
    pub fn from_run(ctx: &RunContext, opts: &ProtocolOptions) -> Result<Panel, ProtocolError> {
        let judges = 1 + ctx.panel.len();
        let rule = PanelRule::parse(opts.panel.as_deref())?;
        if judges == 1 && opts.panel.is_some() && !opts.all {
            return Err(ProtocolError::bad_value(
                "--panel",
                rule.as_str(),
                "needs several --judge (a panel)",
            ));
        }
        Ok(Panel { judges, rule })
    }

    /// Whether there is more than one judge.
    pub fn is_panel(&self) -> bool {
        self.judges > 1
    }
}

/// The actor of judge `j`: [`Actor::Judge`] for 0, [`Actor::Panel`]`(j)` for the others.
pub fn judge_actor(j: usize) -> Actor {
    if j == 0 {
        Actor::Judge
    } else {
        Actor::Panel(j)
    }
}

/// The majority of binary votes: `Some(true)` when more votes are `true` than `false`,
/// `Some(false)` otherwise (a tie is `false`: the panel was not convinced), `None` without
/// votes.
pub fn majority(votes: &[bool]) -> Option<bool> {
    if votes.is_empty() {
        return None;
    }
    let yes = votes.iter().filter(|v| **v).count();
    Some(2 * yes > votes.len())
}

/// The share of `true` votes; `None` without votes.
pub fn mean(votes: &[bool]) -> Option<f64> {
    (!votes.is_empty()).then(|| votes.iter().filter(|v| **v).count() as f64 / votes.len() as f64)
}

/// The settings with the panel's judges and rule added, when there is a panel (a one-judge
/// run's settings stay as they were, so earlier runs resume).
pub fn settings(
    ctx: &RunContext,
    panel: Panel,
    mut settings: serde_json::Value,
) -> serde_json::Value {
    if panel.is_panel() {
        settings["panel"] = serde_json::json!({
            "judges": ctx.judges(),
            "rule": panel.rule.as_str(),
        });
    }
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_rules_and_votes() {
        assert_eq!(Panel::key("judge", 0), "judge");
        assert_eq!(Panel::key("fa/3", 2), "fa/3/judge/2");
        assert_eq!(Panel::split_key("fa/3/judge/2"), Some(("fa/3", 2)));
        assert_eq!(Panel::split_key("judge/judge/1"), Some(("judge", 1)));
        for key in [
            "judge",
            "judge/judge/0",
            "judge/judge/x",
            "/judge/1",
            "fa/3",
        ] {
            assert_eq!(Panel::split_key(key), None, "{key}");
        }
        assert_eq!(judge_actor(0), Actor::Judge);
        assert_eq!(judge_actor(2), Actor::Panel(2));
        assert_eq!(PanelRule::parse(None).unwrap(), PanelRule::Majority);
        assert_eq!(PanelRule::parse(Some("mean")).unwrap(), PanelRule::Mean);
        let e = PanelRule::parse(Some("vote")).unwrap_err().to_string();
        assert!(e.contains("--panel") && e.contains("majority"), "{e}");
        assert_eq!(majority(&[true, false, true]), Some(true));
        assert_eq!(
            majority(&[true, false]),
            Some(false),
            "a tie is not convinced"
        );
        assert_eq!(majority(&[]), None);
        assert_eq!(mean(&[true, false, true, true]), Some(0.75));
        assert_eq!(mean(&[]), None);
    }
}
