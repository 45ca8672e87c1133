//! The speculative-decoding options shared by `generate`, `run`, `serve` and `bench`
//! (`--draft lookup|MODEL`, `--draft-tokens`, `--draft-max-batch`, `--draft-fixed`), turned
//! into the engine's drafting. Drafting never changes a token, so it is no part of a run's
//! identity or cache key: it is recorded as a note only.

use anyhow::{bail, Context};

use crate::engine::draft::{DEFAULT_DRAFT_MAX_BATCH, DEFAULT_DRAFT_TOKENS};
use crate::engine::{DraftConfig, Engine};
use crate::model::transformer::WeightDType;

/// How an engine drafts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DraftSpec {
    Lookup(DraftConfig),
    /// A draft model as `--model` names one (`default`, a path or a Hub id).
    Model(String, DraftConfig),
}

impl DraftSpec {
    /// The spec of `--draft VALUE` with its settings, or `None` without `--draft`.
    pub fn parse(
        value: Option<&str>,
        tokens: usize,
        max_batch: usize,
        fixed: bool,
    ) -> anyhow::Result<Option<DraftSpec>> {
        let Some(v) = value else { return Ok(None) };
        if tokens == 0 {
            bail!("--draft-tokens must be at least 1");
        }
        let config = DraftConfig {
            tokens,
            adaptive: !fixed,
            max_batch,
        };
        Ok(Some(match v.trim() {
            "" => bail!("--draft needs `lookup` or a model"),
            "lookup" => DraftSpec::Lookup(config),
            m => DraftSpec::Model(m.to_string(), config),
        }))
    }

    pub fn config(&self) -> DraftConfig {
        match self {
            DraftSpec::Lookup(c) | DraftSpec::Model(_, c) => *c,
        }
    }

    /// Turns drafting on in `engine` (loading a draft model onto its device).
    pub fn apply(&self, engine: &mut Engine, dtype: WeightDType) -> anyhow::Result<()> {
        match self {
            DraftSpec::Lookup(c) => engine.set_lookup_drafts(Some(*c)),
            DraftSpec::Model(name, c) => {
                let files = super::models::resolve(name)
                    .with_context(|| format!("resolving the draft model {name:?}"))?;
                engine
                    .set_draft_model(&files, dtype, *c)
                    .with_context(|| format!("the draft model {name:?}"))?;
            }
        }
        Ok(())
    }

    /// A one-line note for manifests and logs (not part of any identity).
    pub fn note(&self) -> String {
        let c = self.config();
        let source = match self {
            DraftSpec::Lookup(_) => "prompt lookup".to_string(),
            DraftSpec::Model(m, _) => format!("draft model {m}"),
        };
        format!(
            "speculative decoding: {source}, up to {} tokens per draft{}, off above {} decoding \
             sequences (the tokens are those of plain decoding)",
            c.tokens,
            if c.adaptive { " (adaptive)" } else { "" },
            c.max_batch
        )
    }
}

/// The drafting options of one engine role.
#[derive(Debug, Clone, clap::Args)]
pub struct DraftArgs {
    /// Speculative decoding: `lookup` (drafts copied from n-grams of the prompt and the reply
    /// so far) or a smaller model with the same tokenizer (`default`, a GGUF path or a Hub
    /// id). The tokens are exactly those without drafts; only the speed changes.
    #[arg(long, value_name = "lookup|MODEL")]
    pub draft: Option<String>,
    /// Most tokens drafted per sequence and step.
    #[arg(long, value_name = "K", default_value_t = DEFAULT_DRAFT_TOKENS)]
    pub draft_tokens: usize,
    /// Drafting is off in steps where more sequences decode than this (verification costs
    /// more than it saves at large batches).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DRAFT_MAX_BATCH)]
    pub draft_max_batch: usize,
    /// Always draft --draft-tokens (no shrinking after rejections).
    #[arg(long)]
    pub draft_fixed: bool,
}

impl DraftArgs {
    pub fn spec(&self) -> anyhow::Result<Option<DraftSpec>> {
        DraftSpec::parse(
            self.draft.as_deref(),
            self.draft_tokens,
            self.draft_max_batch,
            self.draft_fixed,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lookup_models_and_bad_values() {
        assert_eq!(DraftSpec::parse(None, 8, 4, false).unwrap(), None);
        let s = DraftSpec::parse(Some("lookup"), 5, 2, true)
            .unwrap()
            .unwrap();
        assert_eq!(
            s,
            DraftSpec::Lookup(DraftConfig {
                tokens: 5,
                adaptive: false,
                max_batch: 2
            })
        );
        assert!(s.note().contains("prompt lookup"));
        let m = DraftSpec::parse(Some("x.gguf"), 8, 4, false)
            .unwrap()
            .unwrap();
        assert!(matches!(m, DraftSpec::Model(ref n, _) if n == "x.gguf"));
        assert!(DraftSpec::parse(Some("lookup"), 0, 4, false).is_err());
        assert!(DraftSpec::parse(Some(" "), 8, 4, false).is_err());
    }
}
