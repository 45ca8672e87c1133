//! What the runner tells a display of its progress, and a display that shows nothing.
//!
//! The runner reports through [`Progress`] and never prints; the display a person sees
//! (`report::BarProgress`) implements it above the store.

/// What the runner tells a display.
pub trait Progress {
    /// A stage without a count: loading a model, scoring, writing.
    fn stage(&mut self, message: &str);
    /// A round of `total` steps begins, described by `label` (the run's total is not reset).
    fn round(&mut self, label: &str, total: usize);
    /// `n` more steps finished (`replayed`: taken from the log, not computed).
    fn advance(&mut self, n: usize, replayed: bool);
    /// The run is over.
    fn finish(&mut self, message: &str);
    /// `steps` more steps are planned (added to the whole run's total).
    fn plan(&mut self, _steps: usize) {}
    /// A correction of the planned total: an item finished with fewer (negative) or more
    /// steps than planned, or failed and skips its remaining steps.
    fn replan(&mut self, _delta: i64) {}
    /// `n` steps have finished but are not logged yet: they wait for earlier steps of the
    /// log's order (reset by the next [`Progress::advance`], which counts logged steps for
    /// good).
    fn in_flight(&mut self, _n: usize) {}
    /// `n` more tokens were generated.
    fn tokens(&mut self, _n: usize) {}
}

/// Shows nothing.
#[derive(Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn stage(&mut self, _: &str) {}
    fn round(&mut self, _: &str, _: usize) {}
    fn advance(&mut self, _: usize, _: bool) {}
    fn finish(&mut self, _: &str) {}
}
