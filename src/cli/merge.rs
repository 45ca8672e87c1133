//! `candor merge SHARD_DIR… --out DIR`: joins the N shard directories of one run
//! (`candor run … --shard I/N`) into the run directory an unsharded run would have written.
//!
//! The checks (one run, shards `0..N` each finished, no item twice) and the replay are
//! [`crate::store::shard`]'s; this file re-runs the recorded `candor run` arguments with every
//! step answered from the shards' logs (no model is loaded; the model files are still hashed
//! into the manifest, so they must be where the shards found them — run the merge from the
//! same working directory). It then checks that every logged sample was used.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::Parser;

use crate::store::samples::parse_log;
use crate::store::shard::{check_shards, ReplayPool, ShardDir};

use super::run::{run_config, RunArgs, RunConfig};

/// `candor run ARGS` alone: how the shards' recorded run arguments are parsed again (the same
/// [`RunArgs`] as the whole command line's `run`, which has no arguments of its own besides).
#[derive(Debug, Parser)]
#[command(name = "candor")]
struct RunCommandLine {
    #[command(subcommand)]
    command: RunOnly,
}

#[derive(Debug, clap::Subcommand)]
enum RunOnly {
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// The shard directories (all N of them, any order).
    #[arg(required = true, value_name = "SHARD_DIR")]
    pub shards: Vec<PathBuf>,
    /// The merged run directory (new, or a merge to finish).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

pub fn run(args: MergeArgs) -> anyhow::Result<()> {
    let shards = args
        .shards
        .iter()
        .map(|d| ShardDir::open(d))
        .collect::<Result<Vec<_>, _>>()?;
    merge(&shards, &args.out)
}

/// Joins the opened `shards` into `out` (what `candor merge` does once it read them).
pub fn merge(shards: &[ShardDir], out: &std::path::Path) -> anyhow::Result<()> {
    let run_args = check_shards(shards)?;
    let pool = Arc::new(ReplayPool::new(shards));
    // A merge being finished (or done again) already holds some steps: the run resumes past
    // them without asking.
    let merged = out.join("samples.jsonl");
    if let Ok(bytes) = std::fs::read(&merged) {
        let (logged, _) = parse_log(&merged, &bytes)?;
        pool.already_merged(logged.iter().map(|l| &l.sample));
    }
    let mut argv = vec!["candor".to_string(), "run".to_string()];
    argv.extend(run_args.iter().cloned());
    argv.push("--out".into());
    argv.push(out.display().to_string());
    let parsed = RunCommandLine::try_parse_from(&argv)
        .with_context(|| format!("the shards' run arguments: {}", run_args.join(" ")))?;
    let RunOnly::Run(run) = parsed.command;
    let mut cfg = RunConfig::from_args(run)?;
    cfg.shard = None;
    cfg.replay = Some(Arc::clone(&pool));
    run_config(cfg).context("merging the shards")?;
    let unused = pool.unused();
    if unused > 0 {
        bail!(
            "{unused} logged samples of the shards were not part of the run: the shards are \
             not from this run's items (the merged files in {} are not to be trusted)",
            out.display()
        );
    }
    println!("merged {} shards into {}", shards.len(), out.display());
    Ok(())
}
