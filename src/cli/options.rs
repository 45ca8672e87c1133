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
    /// `auto-j` (default, 1392 pairwise items) or `pandalm` (999 items; see `--label`).
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

    /// refutebench: how a conversation longer than the context is shortened, `authors`
    /// (default: oldest messages first, system prompt included, budget the model's maximum
    /// length − 261, that length 2,048 for LLaMA-2-class models) or `candor` (chit-chat, then
    /// queries, then feedback; the system prompt kept).
    #[arg(long, value_name = "POLICY")]
    pub truncation: Option<String>,

    /// realmistake: a detection prompt, `1-A`, `1-B`, `2-A`, `2-B` or `steps` (1-A with the
    /// authors' evaluation steps, `cot_instruction_prompt`; the paper's advanced prompt)
    /// (repeatable; default the four simple ones).
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

    /// fennec: skip the correction of low-scored responses (single mode; pairwise runs skip
    /// it unless `--correction`).
    #[arg(long)]
    pub no_correction: bool,

    /// fennec: correct low-scored responses in pairwise runs too (the authors' pairwise
    /// evaluation does not; no metric reads the corrections).
    #[arg(long, conflicts_with = "no_correction")]
    pub correction: bool,

    /// fennec with `--dataset pandalm`: the gold label, `annotator1` (default, what Fennec's
    /// code reads) or `majority` (of the three annotators).
    #[arg(long, value_name = "L")]
    pub label: Option<String>,

    /// All protocols: the new-token limit of every generation, replacing each protocol's own
    /// (the papers': FB-Bench 4096, RefuteBench 256 and 16 for the judge, ReaLMistake 4096,
    /// Fennec 1024 per step and 2048 for corrections), higher or lower. Recorded in the
    /// manifest; replies that stopped at the limit are marked `max_tokens` in the samples and
    /// counted per step kind in the results.
    #[arg(long, value_name = "N")]
    pub max_new_tokens: Option<usize>,

    /// All protocols: the new-token limit of the steps whose replies are read as verdicts
    /// (FB-Bench's judge, RefuteBench's FA judge, Fennec's judgements, ReaLMistake's
    /// detections), replacing --max-new-tokens and the protocol's own there. A judge's JSON
    /// or score lines need more room than a quick run gives its candidates.
    #[arg(long, value_name = "N")]
    pub judge_max_new_tokens: Option<usize>,

    /// fbbench, fennec, refutebench (FA judge), realmistake: `on` or `off`, constrain the
    /// judge's output to the format its prompt asks for (decoding masked by a grammar,
    /// llguidance; the local counterpart of an API's JSON mode). Defaults: on for fbbench (the
    /// authors' judge ran in JSON mode), off for the others (the authors' judges and detectors
    /// wrote free text).
    /// Recorded in the manifest with the grammar's hash.
    #[arg(long, value_name = "on|off")]
    pub constrain: Option<String>,

    /// fennec: judge your own pairs instead of a published set: a JSONL file of
    /// `{"id"?, "question", "answer_a", "answer_b", "label"?: "a"|"b"|"tie"}` (README, "Your
    /// own data"). Agreement needs labels; Consistency is always computed.
    #[arg(long, value_name = "FILE.jsonl")]
    pub pairs: Option<std::path::PathBuf>,

    /// fbbench: your own items in the authors' format (a JSON array, or one item per line)
    /// with your checklists and weights; the candidate answers the follow-up. realmistake: a
    /// JSONL file of `{"id"?, "input", "response", "label"?: "error"|"no_error"}`. README,
    /// "Your own data".
    #[arg(long, value_name = "FILE")]
    pub items: Option<std::path::PathBuf>,

    /// fbbench, refutebench with several --judge: how the judges' verdicts on a unit become
    /// the panel's. `majority` (default): fbbench votes per checklist entry, refutebench per
    /// feedback turn, a tie counting as not met / not accepted; `mean`: the mean of the
    /// judges' item scores (fbbench) or acceptances (refutebench). Every judge's verdicts and
    /// metrics are kept beside the panel's.
    #[arg(long, value_name = "majority|mean")]
    pub panel: Option<String>,
}

impl ProtocolArgs {
    /// The library's options.
    pub fn to_options(&self) -> ProtocolOptions {
        ProtocolOptions {
            dataset: self.dataset.clone(),
            rule: self.rule.clone(),
            recall: self.recall,
            recall_repeat: self.recall_repeat,
            truncation: self.truncation.clone(),
            prompts: self.prompts.clone(),
            samples: self.samples,
            branches: self.branches,
            mode: self.mode.clone(),
            no_correction: self.no_correction,
            correction: self.correction,
            label: self.label.clone(),
            max_new_tokens: self.max_new_tokens,
            judge_max_new_tokens: self.judge_max_new_tokens,
            constrain: self.constrain.clone(),
            pairs: self.pairs.clone(),
            items: self.items.clone(),
            panel: self.panel.clone(),
            all: false,
        }
    }
}
