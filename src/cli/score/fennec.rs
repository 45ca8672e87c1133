//! `candor score fennec`: a pairwise judge's verdict files against a labelled set, to Auto-J's
//! Agreement and Consistency (or single-verdict Accuracy).

use std::path::PathBuf;

use anyhow::Context;

use crate::bench::fennec::{data, score};
use crate::bench::table::texts;
use crate::bench::BenchResults;

/// The labelled data sets.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    /// Auto-J's `testdata_pairwise.jsonl` (label 0 = response 1, 1 = response 2, 2 = tie).
    #[value(name = "auto-j")]
    AutoJ,
    /// PandaLM's `testset-v1.json` (majority of three annotators; 0 = tie, 1, 2).
    Pandalm,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Format of the labelled data.
    #[arg(long, value_enum)]
    format: Format,
    /// The labelled data file.
    #[arg(long)]
    data: PathBuf,
    /// Verdicts in the data's order: one `{"output": 0|1|2}` per line (0 = first shown
    /// better, 1 = second, 2 = tie; null = none). Without it (PandaLM only) only the
    /// annotators' agreement with each other is computed: the human ceiling.
    #[arg(long)]
    normal: Option<PathBuf>,
    /// Verdicts with the two responses swapped, in the same coding (relative to the order
    /// shown). Without it only single-verdict Accuracy is computed.
    #[arg(long)]
    exchanged: Option<PathBuf>,
    /// Where to write the results (JSON).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seed of the bootstrap.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let items = match args.format {
        Format::AutoJ => data::load_autoj(&args.data)?,
        Format::Pandalm => data::load_pandalm(&args.data, data::PandaLabel::Annotator1)?,
    };
    let mut results: BenchResults = match (&args.normal, &args.exchanged) {
        (None, None) => BenchResults::default(),
        (None, Some(_)) => anyhow::bail!("--exchanged needs --normal"),
        (Some(normal), Some(ex)) => {
            let outcomes = score::pair_outcomes(
                &items,
                (normal, data::load_verdicts(normal)?),
                (ex, data::load_verdicts(ex)?),
            )?;
            score::pairwise_results(&outcomes, args.seed)
        }
        (Some(normal), None) => {
            let outcomes = score::single_outcomes(&items, (normal, data::load_verdicts(normal)?))?;
            score::single_results(&outcomes, args.seed)
        }
    };
    let refs: Vec<&data::PairItem> = items.iter().collect();
    results
        .tables
        .extend(score::annotator_table(&refs, args.seed));
    if args.normal.is_none() && results.tables.is_empty() {
        anyhow::bail!(
            "--normal is needed: {} has one label per item, so there is no annotator \
             agreement to compute without verdicts",
            args.data.display()
        );
    }
    println!("{} items from {}", items.len(), args.data.display());
    for m in &results.metrics {
        println!(
            "{}: {} [{}, {}] (n = {}, unscored = {})",
            m.name,
            score::percent(m.interval.value),
            score::percent(m.interval.low),
            score::percent(m.interval.high),
            m.n,
            m.unscored
        );
    }
    for table in &results.tables {
        println!("\n{}\n{}", table.title, table.columns.join("\t"));
        for row in &table.rows {
            println!("{}", texts(row).join("\t"));
        }
    }
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&results)? + "\n")
            .with_context(|| format!("writing {}", out.display()))?;
        println!("wrote {}", out.display());
    }
    Ok(())
}
