//! FB-Bench's report figures: the leaderboard, then the authors' per-category tables drawn as
//! charts (the category column is named after the category, so rows are labelled by it), and
//! with a panel of judges each judge's Overall beside the panel's and their κ.

use crate::bench::figure::{Chart, Figures, Labels, Pick, RowNote};
use crate::bench::table::table_id;

pub const FIGURES: Figures = Figures {
    protocol: "fbbench",
    title: "FB-Bench",
    charts: &[
        Chart::Metrics {
            title: "Leaderboard: Error Correction, Response Maintenance, Overall (0–100)",
            pick: Pick::All,
        },
        Chart::Rows {
            title: "Per task type (all_avg_score)",
            table: table_id::FBBENCH_PER_TASK,
            labels: Labels::SecondColumn,
            value: "all_avg_score",
            note: RowNote::FAILED,
        },
        Chart::Rows {
            title: "Per error type (Error Correction)",
            table: table_id::FBBENCH_PER_ERROR,
            labels: Labels::SecondColumn,
            value: "correct_avg_score",
            note: RowNote::FAILED,
        },
        Chart::Rows {
            title: "Per feedback type, Error Correction",
            table: table_id::FBBENCH_PER_FEEDBACK_CORRECT,
            labels: Labels::SecondColumn,
            value: "error_correct_score",
            note: RowNote::FAILED,
        },
        Chart::Rows {
            title: "Per feedback type, Response Maintenance",
            table: table_id::FBBENCH_PER_FEEDBACK_ANTISYCO,
            labels: Labels::SecondColumn,
            value: "response_maintenance_score",
            note: RowNote::FAILED,
        },
        Chart::Rows {
            title: "Judge panel: Overall of the panel and of each judge",
            table: table_id::PANEL_JUDGES,
            labels: Labels::Columns(&["judge"]),
            value: "overall",
            note: RowNote::N_UNSCORED,
        },
        Chart::Kappa {
            title: "Judge panel: agreement between the judges on checklist entries (κ)",
            table: table_id::JUDGE_KAPPA,
        },
    ],
};
