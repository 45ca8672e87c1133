//! The protocol options of `candor run` as the command line spells them ([`ProtocolArgs`],
//! shown under "Protocol options" in `candor run --help`); they become the library's
//! [`ProtocolOptions`], which each protocol reads.

use crate::bench::ProtocolOptions;

/// Options of the individual protocols; each names the protocols it applies to.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Protocol options")]
pub struct ProtocolArgs {
    /// fbbench: the dataset version, `v3` (default, 591 items) or `v1` (the paper's, 734
    /// items; its judge prompt shows the reference answer). fennec: the evaluation set,
    /// `auto-j` (default, 1392 pairwise items) or `pandalm` (999 items, majority of three
    /// annotators).
    #[arg(long, value_name = "NAME")]
    pub dataset: Option<String>,

    /// fbbench: how checklist verdicts become item scores: `published` (the authors' code,
    /// default) or `paper` (Response Maintenance needs every criterion).
    #[arg(long, value_name = "RULE", default_value = "published")]
    pub rule: String,

    /// refutebench: recall earlier instructions before each benchmark query (the paper's
    /// section 6.3, without the repeat request).
    #[arg(long, conflicts_with = "recall_repeat")]
    pub recall: bool,

    /// refutebench: recall earlier instructions before each benchmark query and ask the model
    /// to repeat them first (the paper's recall-and-repeat).
    #[arg(long)]
    pub recall_repeat: bool,

    /// realmistake: a detection prompt, `1-A`, `1-B`, `2-A` or `2-B` (repeatable; default all
    /// four).
    #[arg(long = "prompt", value_name = "P")]
    pub prompts: Vec<String>,

    /// realmistake: samples per prompt; k > 1 is self-consistency (temperature 0.5, seeded,
    /// majority of the k verdicts).
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub samples: usize,

    /// fennec: evaluation criteria (branches) kept per item.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub branches: usize,

    /// fennec: `pairwise` (both orders; Agreement and Consistency, default) or `single` (one
    /// score per response; Accuracy).
    #[arg(long, value_name = "MODE", default_value = "pairwise")]
    pub mode: String,

    /// fennec: skip the correction of low-scored responses.
    #[arg(long)]
    pub no_correction: bool,

    /// All protocols: the most tokens any one generation may produce (default: each protocol's
    /// own limits, e.g. FB-Bench 4096, RefuteBench 256). For quick runs; recorded in the
    /// manifest, and replies cut short are marked `max_tokens` in the samples.
    #[arg(long, value_name = "N")]
    pub max_new_tokens: Option<usize>,
}

impl ProtocolArgs {
    /// The library's options.
    pub fn to_options(&self) -> ProtocolOptions {
        ProtocolOptions {
            dataset: self.dataset.clone(),
            rule: self.rule.clone(),
            recall: self.recall,
            recall_repeat: self.recall_repeat,
            prompts: self.prompts.clone(),
            samples: self.samples,
            branches: self.branches,
            mode: self.mode.clone(),
            no_correction: self.no_correction,
            max_new_tokens: self.max_new_tokens,
            all: false,
        }
    }
}
