//! ReaLMistake's report figures: the leaderboard, F1 / precision / recall per task and prompt
//! (the paper's four prompts), F1 per detector and response model for published outputs, and
//! the detectors' κ against the expert labels and with each other.

use crate::bench::figure::{Chart, Figures, Labels, Pick, RowNote};
use crate::bench::table::table_id;

const NOTE: RowNote = RowNote {
    n: &["n", "cells", "tasks"],
    unscored: Some("unscored"),
    incomplete: None,
};

const TASK_PROMPT: Labels = Labels::Columns(&["task", "prompt"]);

pub const FIGURES: Figures = Figures {
    protocol: "realmistake",
    title: "ReaLMistake",
    charts: &[
        Chart::Metrics {
            title: "Leaderboard: F1, precision, recall, accuracy (mean over tasks and prompts)",
            pick: Pick::All,
        },
        Chart::Rows {
            title: "f1 (%) per task and prompt",
            table: table_id::REALMISTAKE_PER_TASK_PROMPT,
            labels: TASK_PROMPT,
            value: "f1",
            note: NOTE,
        },
        Chart::Rows {
            title: "precision (%) per task and prompt",
            table: table_id::REALMISTAKE_PER_TASK_PROMPT,
            labels: TASK_PROMPT,
            value: "precision",
            note: NOTE,
        },
        Chart::Rows {
            title: "recall (%) per task and prompt",
            table: table_id::REALMISTAKE_PER_TASK_PROMPT,
            labels: TASK_PROMPT,
            value: "recall",
            note: NOTE,
        },
        Chart::Rows {
            title: "F1 (%) per detector and response model",
            table: table_id::REALMISTAKE_PER_DETECTOR,
            labels: Labels::Columns(&["detector", "response_model"]),
            value: "f1",
            note: NOTE,
        },
        Chart::Kappa {
            title: "Detector reliability: Cohen's κ against the expert labels",
            table: table_id::JUDGE_KAPPA,
        },
        Chart::Kappa {
            title: "Agreement between detectors (κ)",
            table: table_id::DETECTOR_KAPPA,
        },
    ],
};
