//! RefuteBench's report figures: FA and RR by context depth and setting (the paper's figures),
//! then per task and setting, and with a panel of FA judges each judge's FA and their κ.

use crate::bench::figure::{Chart, Figures, Labels, Pick, RowNote};
use crate::bench::table::table_id;

const GROUP: Labels = Labels::Columns(&["group", "setting"]);

pub const FIGURES: Figures = Figures {
    protocol: "refutebench",
    title: "RefuteBench",
    charts: &[
        Chart::Rows {
            title: "Feedback acceptance (FA, %) by context depth and setting",
            table: table_id::REFUTEBENCH_GROUPS,
            labels: GROUP,
            value: "FA",
            note: RowNote {
                n: &["FA n"],
                unscored: Some("FA unscored"),
                incomplete: Some("incomplete"),
            },
        },
        Chart::Rows {
            title: "Response rate (RR, %) by context depth and setting",
            table: table_id::REFUTEBENCH_GROUPS,
            labels: GROUP,
            value: "RR",
            note: RowNote {
                n: &["RR n"],
                unscored: None,
                incomplete: Some("incomplete"),
            },
        },
        Chart::Metrics {
            title: "Leaderboard: FA per task and setting (%)",
            pick: Pick::Suffix("_fa"),
        },
        Chart::Metrics {
            title: "Leaderboard: RR per task and setting (%)",
            pick: Pick::Suffix("_rr"),
        },
        Chart::Rows {
            title: "Judge panel: FA (%) of the panel and of each judge",
            table: table_id::PANEL_JUDGES,
            labels: Labels::Columns(&["judge", "metric"]),
            value: "FA",
            note: RowNote::N_UNSCORED,
        },
        Chart::Kappa {
            title: "Judge panel: agreement between the FA judges (κ)",
            table: table_id::JUDGE_KAPPA,
        },
    ],
};
