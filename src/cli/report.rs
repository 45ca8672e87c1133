//! `candor report RUN… --out DIR`: one self-contained `index.html` for one run or a comparison
//! of several (see [`crate::report::html`]).
//!
//! A RUN is a finished run directory (it has `results.json`), or a folder of them such as the
//! one `candor run all` writes (one subdirectory per protocol). Runs of the same protocol are
//! compared in one leaderboard; runs that would be named alike are told apart by their
//! directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::report::html::{self, ReportRun};
use crate::report::RunResults;
use crate::store::manifest::Manifest;

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Finished run directories, or folders holding them (e.g. a `candor run all` output).
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Folder to write index.html into (created if absent).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let mut dirs = Vec::new();
    for r in &args.runs {
        dirs.extend(run_dirs(r)?);
    }
    let runs = load_runs(&dirs)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join("index.html");
    crate::store::run_dir::write_atomic(&path, html::render(&runs).as_bytes())?;
    println!("{} runs: {}", runs.len(), path.display());
    Ok(())
}

/// The finished run directories `path` names: itself, or its subdirectories holding a
/// `results.json` (sorted by name).
pub fn run_dirs(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if path.join("results.json").is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        bail!("{}: not a run directory", path.display());
    }
    let mut subs: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("results.json").is_file())
        .collect();
    subs.sort();
    if subs.is_empty() {
        let what = if path.join("manifest.json").is_file() {
            "the run has not finished (no results.json yet)"
        } else {
            "no results.json here or in its subdirectories"
        };
        bail!("{}: {what}", path.display());
    }
    Ok(subs)
}

/// Reads each directory's results and manifest, labelled for the page.
pub fn load_runs(dirs: &[PathBuf]) -> anyhow::Result<Vec<ReportRun>> {
    let mut runs = Vec::new();
    for dir in dirs {
        let path = dir.join("results.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let results: RunResults = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a Candor results.json", path.display()))?;
        let manifest_path = dir.join("manifest.json");
        let identity = if manifest_path.is_file() {
            Some(Manifest::load(&manifest_path)?.identity)
        } else {
            None
        };
        let mut run = ReportRun::new(results, identity);
        run.notes = crate::report::run_notes(dir);
        let scores = dir.join(crate::bench::item_scores::FILE);
        if scores.is_file() {
            run.item_scores = Some(crate::bench::item_scores::ItemScores::load(&scores)?);
        }
        runs.push(run);
    }
    // Runs of one protocol named alike: add the directory.
    let labels: Vec<(String, String)> = runs
        .iter()
        .map(|r| (r.results.protocol.clone(), r.label.clone()))
        .collect();
    for (i, run) in runs.iter_mut().enumerate() {
        if labels.iter().filter(|l| **l == labels[i]).count() > 1 {
            run.label = format!("{} — {}", run.label, dirs[i].display());
        }
    }
    Ok(runs)
}
