//! What a run leaves for people: `report.md` (the results as tables), `report.html` (the same
//! with charts, self-contained; also `candor report`), and the progress display on stderr
//! while it runs. `results.json` itself is the store's ([`crate::store::run_results`]).
//! Numbers become text in one place, [`format`], so both reports and the CSV files of
//! `candor score` write them alike.
//!
//! Paired comparisons between candidates scored on the same items are [`compare`]'s.
//!
//! Reports are written from results only; this module does not run or score anything.

pub mod compare;
pub mod format;
pub mod html;
pub mod markdown;
pub mod progress;

use std::path::Path;

pub use crate::store::run_results::{FailedStep, RunModel, RunResults};
pub use progress::{BarProgress, NoProgress, Progress};

use crate::store::manifest::RunIdentity;
use crate::store::run_dir::{write_atomic, REPORT, REPORT_HTML};
use crate::store::StoreError;

/// Writes a finished run's `report.md` and `report.html` into its directory `dir`, with its
/// run notes ([`run_notes`]).
pub fn write_reports(
    dir: &Path,
    results: &RunResults,
    identity: &RunIdentity,
) -> Result<(), StoreError> {
    let notes = run_notes(dir);
    write_atomic(
        &dir.join(REPORT),
        markdown::render(results, &notes).as_bytes(),
    )?;
    let mut page = html::ReportRun::new(results.clone(), Some(identity.clone()));
    page.notes = notes;
    write_atomic(&dir.join(REPORT_HTML), html::render(&[page]).as_bytes())
}

/// What the reports of the run in `dir` say beside its results: each device's share of a
/// replicated run (`devices.json`: items, tokens, seconds, tokens per second); nothing for a
/// one-device run. A file that cannot be read is said in a note, not an error.
pub fn run_notes(dir: &Path) -> Vec<String> {
    match crate::store::devices::read(dir) {
        Ok(None) => Vec::new(),
        Ok(Some(shares)) => shares.iter().map(ToString::to_string).collect(),
        Err(e) => vec![format!("device shares not shown: {e}")],
    }
}
