//! What a run leaves for people and tools: `results.json` (every metric with its interval
//! and unscored count, byte-identical across runs), `report.md` (the same as tables),
//! `report.html` (the same with charts, self-contained; also `candor report`), and the
//! progress display on stderr while it runs.
//!
//! Reports are written from results only; this module does not run or score anything.

pub mod html;
pub mod markdown;
pub mod progress;
pub mod results;

pub use progress::{BarProgress, NoProgress, Progress};
pub use results::{FailedStep, RunModel, RunResults};
