//! The progress display: one bar on stderr across a run's stages (model loading, each round
//! of steps, scoring), with counts and an ETA for the round under way.
//!
//! The runner reports through the [`Progress`] trait and never prints; [`BarProgress`] draws
//! with indicatif when stderr is a terminal and otherwise writes one plain line per stage (so
//! logs of batch jobs stay readable); [`NoProgress`] is silent, for tests.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// What the runner tells a display.
pub trait Progress {
    /// A stage without a count: loading a model, scoring, writing. The next
    /// [`Progress::advance`] returns to the current round's count.
    fn stage(&mut self, message: &str);
    /// A round of `total` steps begins, described by `label`.
    fn round(&mut self, label: &str, total: usize);
    /// `n` more steps of the round finished (`replayed`: taken from the log, not computed).
    fn advance(&mut self, n: usize, replayed: bool);
    /// The run is over.
    fn finish(&mut self, message: &str);
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

/// An indicatif bar on stderr (or plain lines when stderr is not a terminal).
#[derive(Debug)]
pub struct BarProgress {
    bar: Option<ProgressBar>,
    label: String,
    in_stage: bool,
    computed: usize,
    replayed: usize,
}

impl Default for BarProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl BarProgress {
    pub fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        BarProgress {
            bar,
            label: String::new(),
            in_stage: false,
            computed: 0,
            replayed: 0,
        }
    }

    fn totals(&self) -> String {
        if self.replayed > 0 {
            format!("{} computed, {} from the log", self.computed, self.replayed)
        } else {
            format!("{} computed", self.computed)
        }
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar())
}

const ROUND_STYLE: &str = "{spinner} [{elapsed_precise}] {msg} [{bar:30}] {pos}/{len} (ETA {eta})";

impl Progress for BarProgress {
    fn stage(&mut self, message: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_style(style("{spinner} [{elapsed_precise}] {msg}"));
                bar.set_message(message.to_string());
                self.in_stage = true;
            }
            None => eprintln!("candor: {message}"),
        }
    }

    fn round(&mut self, label: &str, total: usize) {
        self.label = label.to_string();
        match &self.bar {
            Some(bar) => {
                bar.set_style(style(ROUND_STYLE));
                self.in_stage = false;
                bar.set_length(total as u64);
                bar.set_position(0);
                bar.reset_eta();
                bar.set_message(format!("{label} · {}", self.totals()));
            }
            None => eprintln!("candor: {label}: {total} steps"),
        }
    }

    fn advance(&mut self, n: usize, replayed: bool) {
        if replayed {
            self.replayed += n;
        } else {
            self.computed += n;
        }
        if let Some(bar) = &self.bar {
            if self.in_stage {
                bar.set_style(style(ROUND_STYLE));
                bar.reset_eta();
                self.in_stage = false;
            }
            bar.inc(n as u64);
            bar.set_message(format!("{} · {}", self.label, self.totals()));
        }
    }

    fn finish(&mut self, message: &str) {
        match &self.bar {
            Some(bar) => {
                bar.finish_and_clear();
                eprintln!("candor: {message} ({})", self.totals());
            }
            None => eprintln!("candor: {message} ({})", self.totals()),
        }
    }
}
