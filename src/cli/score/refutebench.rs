//! `candor score refutebench`: rescoring recorded RefuteBench transcripts into feedback
//! acceptance and response rate, printed as a table and written as JSON.
//!
//! The transcripts name their items by id; the items come from the data folder, and the feedback
//! each dialogue received is replayed with the run's `--seed` (see
//! `candor::bench::refutebench::dialogue`), so the seed must be the one the run used.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;

use crate::bench::refutebench::data::{self, Item};
use crate::bench::refutebench::dialogue::{MtTarget, ReplayOptions};
use crate::bench::refutebench::score::{self, read_transcripts, ScoreOptions};
use crate::bench::table::{texts, Table};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Transcript JSONL: lines `{"item": ID, "steps": {KEY: output}}`, or the run's samples
    /// (one finished step per line: `{"item": ID, "key": KEY, "output": {...}}`).
    #[arg(long)]
    pub samples: PathBuf,
    /// The RefuteBench data folder (default: $CANDOR_DATA/refutebench).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Where to write the scores as JSON (metrics, table and per-dialogue details).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The seed the run used for its feedback choices.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Which MT translation the run's feedback asked for.
    #[arg(long, value_enum, default_value_t = MtTargetArg::Dictionary)]
    pub mt_target: MtTargetArg,
    /// Seed of the bootstrap intervals.
    #[arg(long, default_value_t = 0)]
    pub bootstrap_seed: u64,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MtTargetArg {
    /// A dictionary translation (the paper's main setting).
    Dictionary,
    /// The item's random target-language word.
    Random,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let root = args.data.clone().unwrap_or_else(data::default_root);
    let items = data::load_all(&root)
        .with_context(|| format!("loading RefuteBench data from {}", root.display()))?;
    if items.is_empty() {
        anyhow::bail!("no RefuteBench data files under {}", root.display());
    }
    let by_id: HashMap<&str, &Item> = items.iter().map(|i| (i.id.as_str(), i)).collect();
    let transcripts = read_transcripts(&args.samples)?;
    let mut pairs = Vec::with_capacity(transcripts.len());
    for t in &transcripts {
        let item = by_id.get(t.item.as_str()).with_context(|| {
            format!(
                "{}: item {:?} is not in the data under {}",
                args.samples.display(),
                t.item,
                root.display()
            )
        })?;
        pairs.push((*item, &t.steps));
    }
    let opts = ScoreOptions {
        replay: ReplayOptions {
            seed: args.seed,
            mt_target: match args.mt_target {
                MtTargetArg::Dictionary => MtTarget::Dictionary,
                MtTargetArg::Random => MtTarget::Random,
            },
        },
        bootstrap_seed: args.bootstrap_seed,
        panel: Default::default(),
    };
    let scored = score::score(&pairs, &opts);
    for table in &scored.results.tables {
        print!("{}", render(table));
    }
    if let Some(out) = &args.out {
        let json = serde_json::to_string_pretty(&scored)?;
        std::fs::write(out, json + "\n").with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// A plain aligned text table.
fn render(table: &Table) -> String {
    let rows: Vec<Vec<String>> = table.rows.iter().map(|r| texts(r)).collect();
    let mut widths: Vec<usize> = table.columns.iter().map(|c| c.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}", w = *w))
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = format!("{}\n", table.title);
    out += &line(&table.columns);
    for row in &rows {
        out += &line(row);
    }
    out
}
