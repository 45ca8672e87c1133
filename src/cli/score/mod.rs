//! `candor score <bench>`: rescoring recorded outputs, one file per benchmark.

mod fbbench;
mod fennec;
mod realmistake;
mod refutebench;

#[derive(Debug, clap::Args)]
pub struct ScoreArgs {
    #[command(subcommand)]
    pub bench: ScoreBench,
}

#[derive(Debug, clap::Subcommand)]
pub enum ScoreBench {
    /// FB-Bench judgement JSONL files (one per model) to the published score tables.
    Fbbench(fbbench::Args),
    /// RefuteBench transcripts to feedback acceptance and response rate.
    Refutebench(refutebench::Args),
    /// ReaLMistake detector outputs to precision, recall, F1 and accuracy.
    Realmistake(realmistake::Args),
    /// Fennec / pairwise judge verdicts to Agreement and Consistency.
    Fennec(fennec::Args),
}

pub fn run(args: ScoreArgs) -> anyhow::Result<()> {
    match args.bench {
        ScoreBench::Fbbench(a) => fbbench::run(a),
        ScoreBench::Refutebench(a) => refutebench::run(a),
        ScoreBench::Realmistake(a) => realmistake::run(a),
        ScoreBench::Fennec(a) => fennec::run(a),
    }
}
