//! `candor data`: fetch the authors' files into the cache, and list what is there.

use std::path::PathBuf;

use anyhow::Context;

use crate::store::data::{self, Fetched, Need, Source, Status};

#[derive(Debug, clap::Args)]
pub struct DataArgs {
    #[command(subcommand)]
    pub command: DataCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum DataCommand {
    /// Download protocols' files at pinned commits (sha256-checked) into the cache
    /// ($CANDOR_HOME/data, else the platform cache folder); all protocols when none is named.
    /// Besides what a run reads, this fetches the comparison material the authors publish
    /// (published judgements, FB-Bench's score tables as .xlsx, detector outputs); what they do
    /// not publish on its own (e.g. the local copy's CSV exports) is skipped and named, and
    /// comparison material the source cannot give (a 404, a network failure) is named as not
    /// available with a warning: neither stops the fetch, since no run needs them. A file a run
    /// reads that cannot be fetched is an error. $CANDOR_MIRROR replaces the download base (a
    /// copy of the data folder); $CANDOR_GITHUB_RAW replaces https://raw.githubusercontent.com;
    /// $CANDOR_OFFLINE=1 never uses the network.
    Fetch {
        /// fbbench, refutebench, realmistake, fennec.
        protocols: Vec<String>,
        /// Fetch into this folder instead of the cache.
        #[arg(long, value_name = "DIR")]
        into: Option<PathBuf>,
    },
    /// Show each file of the cache (or of --data) and whether it is there.
    List {
        /// A data folder to list instead of the cache.
        #[arg(long, value_name = "DIR")]
        data: Option<PathBuf>,
    },
}

fn protocols(names: &[String]) -> Vec<String> {
    if names.is_empty() {
        data::PROTOCOLS.iter().map(|p| p.to_string()).collect()
    } else {
        names.to_vec()
    }
}

pub fn run(args: DataArgs) -> anyhow::Result<()> {
    match args.command {
        DataCommand::Fetch {
            protocols: names,
            into,
        } => {
            let root = into.unwrap_or_else(data::cache_root);
            let source = Source::from_env();
            let (mut fetched, mut present, mut unpublished, mut unavailable) = (0, 0, 0, 0);
            for p in protocols(&names) {
                for file in data::files_for(&p)? {
                    let there = data::status(&root, file) == Status::Present;
                    if !there && !source.has(file) {
                        // Comparison material only (a run never needs it): say so, go on.
                        unpublished += 1;
                        println!(
                            "skipped {}: not published upstream on its own (comparison \
                             material only; no run needs it)",
                            file.rel
                        );
                        continue;
                    }
                    let got = match data::fetch_file(&root, file, &source) {
                        // Comparison material the source cannot give: say so, go on.
                        Err(e) if file.need == Need::Compare && e.is_unavailable() => {
                            unavailable += 1;
                            eprintln!(
                                "warning: {} not available ({e}); comparison material only, \
                                 no run needs it",
                                file.rel
                            );
                            continue;
                        }
                        got => {
                            got.with_context(|| format!("fetching {p} into {}", root.display()))?
                        }
                    };
                    match got {
                        Fetched::Present => present += 1,
                        Fetched::Downloaded {
                            bytes,
                            resumed_from,
                        } => {
                            fetched += 1;
                            let resumed = if resumed_from > 0 {
                                format!(", resumed at {resumed_from}")
                            } else {
                                String::new()
                            };
                            println!("fetched {} ({bytes} bytes{resumed})", file.rel);
                        }
                    }
                }
            }
            println!(
                "{}: {fetched} fetched, {present} already present, {unpublished} not published \
                 upstream, {unavailable} not available",
                root.display()
            );
            Ok(())
        }
        DataCommand::List { data: dir } => {
            let root = dir.unwrap_or_else(data::cache_root);
            println!("{}", root.display());
            let mut counts = [0usize; 2];
            for file in data::FILES {
                let state = match data::status(&root, file) {
                    Status::Present => {
                        counts[0] += 1;
                        "cached".to_string()
                    }
                    Status::Partial(n) => format!("partial ({n} of {} bytes)", file.size),
                    Status::WrongSize(n) => format!("wrong size ({n}, expected {})", file.size),
                    Status::Missing => "missing".to_string(),
                };
                counts[1] += 1;
                println!(
                    "  {:<10} {:>10}  {}  {state}",
                    file.protocol(),
                    file.size,
                    file.rel
                );
            }
            println!("{} of {} files cached", counts[0], counts[1]);
            Ok(())
        }
    }
}
