//! What a protocol's report draws: charts from its metrics and from the rows of its typed
//! tables ([`crate::bench::table`]). Each protocol declares its figures in its own folder
//! (`bench/<name>/figures.rs`, listed by [`crate::bench::figures`]); the writers in `report/`
//! draw any declaration and name no protocol. A protocol without one (a new one, the tests'
//! `toy`) gets the writers' default: its metrics, then each table's last numeric column by its
//! first column.

/// One protocol's page section: its display title and its charts, in order.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// The protocol's name, as in `results.json`.
    pub protocol: &'static str,
    /// The section title (the paper's spelling).
    pub title: &'static str,
    pub charts: &'static [Chart],
}

/// One chart: bars per group, one bar per run.
#[derive(Debug, Clone, Copy)]
pub enum Chart {
    /// A group per metric the runs have, among those `pick` takes.
    Metrics { title: &'static str, pick: Pick },
    /// A group per row of the table `table` ([`crate::bench::table::Table::id`]): labelled by
    /// `labels`, valued by the column `value`, with `note` beside each bar. A table no run has
    /// draws nothing.
    Rows {
        title: &'static str,
        table: &'static str,
        labels: Labels,
        value: &'static str,
        note: RowNote,
    },
    /// A group per row of the κ table `table` ([`crate::bench::reliability::kappa_table`]):
    /// labelled by its raters, valued by κ with its interval, `n` and `unscored` beside; drawn
    /// on κ's own axis, −1 to 1 (not a percentage's 0–100).
    Kappa {
        title: &'static str,
        table: &'static str,
    },
}

/// Which metrics a [`Chart::Metrics`] draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Every metric, labelled by its name.
    All,
    /// The metrics whose name ends with the suffix, labelled by the rest of the name with
    /// `_` read as a space.
    Suffix(&'static str),
}

impl Pick {
    /// Whether the metric `name` is drawn.
    pub fn takes(self, name: &str) -> bool {
        match self {
            Pick::All => true,
            Pick::Suffix(s) => name.ends_with(s),
        }
    }

    /// The label of the metric `name`.
    pub fn label(self, name: &str) -> String {
        match self {
            Pick::All => name.to_string(),
            Pick::Suffix(s) => name.strip_suffix(s).unwrap_or(name).replace('_', " "),
        }
    }
}

/// How a [`Chart::Rows`] row is labelled.
#[derive(Debug, Clone, Copy)]
pub enum Labels {
    /// These columns' cells, joined by ` · `.
    Columns(&'static [&'static str]),
    /// The table's second column (tables whose category column is named after the category,
    /// such as FB-Bench's per-task and per-error-type tables).
    SecondColumn,
}

/// The note beside a bar drawn from a row: `n=…`, `unscored …`, `incomplete …` from the row's
/// columns where the table has them, then the run's failed steps.
#[derive(Debug, Clone, Copy)]
pub struct RowNote {
    /// `n=`: the first of these columns the table has.
    pub n: &'static [&'static str],
    /// `unscored`: this column.
    pub unscored: Option<&'static str>,
    /// `incomplete`: this column.
    pub incomplete: Option<&'static str>,
}

impl RowNote {
    /// Only the run's failed steps.
    pub const FAILED: RowNote = RowNote {
        n: &[],
        unscored: None,
        incomplete: None,
    };

    /// `n=` and `unscored` from the columns of those names.
    pub const N_UNSCORED: RowNote = RowNote {
        n: &["n"],
        unscored: Some("unscored"),
        incomplete: None,
    };
}
