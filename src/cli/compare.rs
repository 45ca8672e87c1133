//! `candor compare RUN… [--out DIR]`: paired comparisons between the candidates of runs scored
//! on the same items (see [`crate::report::compare`]), printed one quotable line each, and
//! with `--out` written as `compare.md`, `compare.html` and `compare.json`.
//!
//! A RUN is a run directory holding `item_scores.json`, a folder of such directories (a
//! `candor run all` output), an `item_scores.json` file, or a `candor score` output folder
//! (which holds one). Runs that cannot be compared are refused with the reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::bench::item_scores::{self, ItemScores};
use crate::report::compare::{self, Options, Source};
use crate::stats::paired;

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// Run directories (with item_scores.json), folders of them, or item_scores.json files.
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Folder to write compare.md, compare.html and compare.json into (created if absent).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seed of the bootstrap and the permutations.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Bootstrap resamples per comparison.
    #[arg(long, default_value_t = paired::RESAMPLES)]
    pub resamples: usize,
    /// Random sign patterns per sign-flip test beyond 20 differing items; 0 (the default):
    /// the pattern distribution's normal approximation instead (precise in the tails, where
    /// a sampled p stops at 1/(N+1)).
    #[arg(long, default_value_t = paired::PERMUTATIONS)]
    pub permutations: usize,
}

pub fn run(args: CompareArgs) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for r in &args.runs {
        files.extend(score_files(r)?);
    }
    let sources = files
        .iter()
        .map(|f| {
            let scores = ItemScores::load(f)?;
            let dir = f.parent().unwrap_or(Path::new("."));
            Ok(Source {
                label: dir.display().to_string(),
                scores,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let opts = Options {
        seed: args.seed,
        resamples: args.resamples,
        permutations: args.permutations,
    };
    anyhow::ensure!(opts.resamples > 0, "--resamples must be at least 1");
    let report = compare::build(&sources, &opts);
    if !report.refused.is_empty() {
        bail!("{}", report.refused.join("; "));
    }
    if report.comparisons.is_empty() {
        bail!(
            "nothing to compare: {}; paired comparisons need two candidates of one protocol \
             scored on the same items",
            nothing_to_compare(&sources)
        );
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let write =
            |name: &str, bytes: &[u8]| crate::store::run_dir::write_atomic(&out.join(name), bytes);
        write("compare.md", compare::markdown(&report).as_bytes())?;
        write("compare.html", compare::page(&report).as_bytes())?;
        write("compare.json", &compare::json(&report))?;
    }
    print!("{}", compare::text(&report));
    if let Some(out) = &args.out {
        println!(
            "wrote compare.md, compare.html, compare.json to {}",
            out.display()
        );
    }
    Ok(())
}

/// Why documents gave no comparison: the runs are of different protocols (each named with its
/// runs), or their one protocol has fewer than two candidates.
fn nothing_to_compare(sources: &[Source]) -> String {
    let mut protocols: BTreeMap<&str, (usize, Vec<&str>)> = BTreeMap::new();
    for s in sources {
        let e = protocols.entry(&s.scores.protocol).or_default();
        e.0 += s.scores.candidates.len();
        e.1.push(&s.label);
    }
    if protocols.len() > 1 {
        let each: Vec<String> = protocols
            .iter()
            .map(|(p, (_, labels))| format!("{p}: {}", labels.join(", ")))
            .collect();
        return format!("the runs are of different protocols ({})", each.join("; "));
    }
    match protocols.iter().next() {
        Some((p, (1, _))) => format!("one candidate of {p}"),
        Some((p, (n, _))) => format!("{n} candidates of {p}"),
        None => "no candidates".to_string(),
    }
}

/// The `item_scores.json` files `path` names: itself, the one in it, or those of its
/// subdirectories (sorted by name).
fn score_files(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let own = path.join(item_scores::FILE);
    if own.is_file() {
        return Ok(vec![own]);
    }
    if !path.is_dir() {
        bail!("{}: no such run directory or file", path.display());
    }
    let mut subs: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join(item_scores::FILE)))
        .filter(|p| p.is_file())
        .collect();
    subs.sort();
    if subs.is_empty() {
        let why = if path.join("results.json").is_file() {
            "the run has no per-item scores (every protocol's runs write them, as do \
             `candor score fbbench` and `candor score realmistake --item-scores`; runs made \
             before them have none: `candor run` with the same settings rescores the finished \
             steps and writes them)"
        } else {
            "no item_scores.json here or in its subdirectories"
        };
        bail!("{}: {why}", path.display());
    }
    Ok(subs)
}
