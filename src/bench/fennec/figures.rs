//! Fennec's report figures: the leaderboard (agreement, consistency, position bias), then
//! agreement and consistency per scenario group (pairwise) and accuracy (single), then the
//! judge's reliability: κ against the labels and across orders, position bias, and on
//! PandaLM the annotators' own κ (the ceiling).

use crate::bench::figure::{Chart, Figures, Labels, Pick, RowNote};
use crate::bench::table::table_id;

const GROUP: Labels = Labels::Columns(&["group"]);

pub const FIGURES: Figures = Figures {
    protocol: "fennec",
    title: "Fennec",
    charts: &[
        Chart::Metrics {
            title: "Leaderboard: Agreement, Consistency, first-position preference (position bias)",
            pick: Pick::All,
        },
        Chart::Rows {
            title: "Agreement (%) per scenario group",
            table: table_id::FENNEC_PAIRWISE,
            labels: GROUP,
            value: "agreement",
            note: RowNote::N_UNSCORED,
        },
        Chart::Rows {
            title: "Consistency (%) per scenario group",
            table: table_id::FENNEC_PAIRWISE,
            labels: GROUP,
            value: "consistency",
            note: RowNote::N_UNSCORED,
        },
        Chart::Rows {
            title: "Accuracy (%) per scenario group",
            table: table_id::FENNEC_SINGLE,
            labels: GROUP,
            value: "accuracy",
            note: RowNote::N_UNSCORED,
        },
        Chart::Kappa {
            title:
                "Judge reliability: Cohen's κ against the human labels and between the two orders",
            table: table_id::JUDGE_KAPPA,
        },
        Chart::Rows {
            title: "Position bias and consistency across the two orders (% of pairs)",
            table: table_id::POSITION_BIAS,
            labels: Labels::Columns(&["outcome"]),
            value: "share (%)",
            note: RowNote::N_UNSCORED,
        },
        Chart::Kappa {
            title: "Human ceiling: the annotators' κ with each other",
            table: table_id::HUMAN_KAPPA,
        },
    ],
};
