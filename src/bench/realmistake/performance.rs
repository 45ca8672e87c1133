//! The authors' `performance.json` structure: per task, response model and detector, one
//! entry per prompt and their `average` (mean and population standard deviation), then a
//! top-level `average` over tasks, keyed with the authors' model names (`initial_model=…`,
//! `baseline_model=…`), as `calculate_performance.py` writes it; and a cell-by-cell comparison
//! of two such files. The numbers come from [`super::score`]; this module only arranges them.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::data::{RESPONSE_MODELS, TASKS};
use super::score::{mean_std, Cell, Confusion};

/// The authors' key for a response model file stem.
pub fn response_model_key(stem: &str) -> String {
    match stem {
        "Llama-2-70b-chat-hf" => "meta-llama/Llama-2-70b-chat-hf".to_string(),
        other => other.to_string(),
    }
}

/// The authors' detectors (folder name, key), in their order.
const DETECTORS: [(&str, &str); 12] = [
    ("gemma-7b-it", "google/gemma-7b-it"),
    ("Llama-2-13b-chat-hf", "meta-llama/Llama-2-13b-chat-hf"),
    ("Llama-2-70b-chat-hf", "meta-llama/Llama-2-70b-chat-hf"),
    (
        "Mistral-7B-Instruct-v0.1",
        "mistralai/Mistral-7B-Instruct-v0.1",
    ),
    (
        "Mixtral-8x7B-Instruct-v0.1",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
    ),
    ("Qwen1.5-14B-Chat", "Qwen/Qwen1.5-14B-Chat"),
    ("Qwen1.5-72B-Chat", "Qwen/Qwen1.5-72B-Chat"),
    ("gpt-3.5-turbo-0125", "gpt-3.5-turbo-0125"),
    ("gemini-1.0-pro-001", "models/gemini-1.0-pro-001"),
    ("claude-3-opus-20240229", "claude-3-opus-20240229"),
    ("gpt-4-0613", "gpt-4-0613"),
    ("gpt-4-0125-preview", "gpt-4-0125-preview"),
];

/// The authors' key for a detector folder name (other names are kept as they are).
pub fn detector_key(folder: &str) -> String {
    DETECTORS
        .iter()
        .find(|(f, _)| *f == folder)
        .map_or_else(|| folder.to_string(), |(_, k)| k.to_string())
}

/// Sort rank: known names in the authors' order, then others by name.
fn rank(known: &[&str], name: &str) -> (usize, String) {
    let pos = known.iter().position(|k| *k == name).unwrap_or(known.len());
    (pos, name.to_string())
}

fn cell_json(c: &Confusion) -> Value {
    let metrics: Map<String, Value> = c
        .metrics()
        .named()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    json!({
        "total_num": c.total(),
        "prediction_error_num": c.predicted_errors(),
        "gold_error_num": c.gold_errors(),
        "metrics": metrics,
    })
}

/// `{name: {"average": mean, "stdev": std}}` over a list of metric maps (the authors'
/// `get_average_of_list_of_dict`).
fn average_json(list: &[[(&'static str, f64); 8]]) -> Value {
    let mut out = Map::new();
    if let Some(first) = list.first() {
        for (i, (name, _)) in first.iter().enumerate() {
            let values: Vec<f64> = list.iter().map(|m| m[i].1).collect();
            let (mean, std) = mean_std(&values);
            out.insert(name.to_string(), json!({"average": mean, "stdev": std}));
        }
    }
    Value::Object(out)
}

/// A sort key: (rank in the authors' order, name).
type Ranked = (usize, String);

/// The eight metrics with their names.
type Named = [(&'static str, f64); 8];

/// Per task, for one (response model, detector): the prompt-averaged metrics, the item count
/// and the gold error count.
type TaskAverages = Vec<(Named, usize, usize)>;

type Grouped<'a> = BTreeMap<Ranked, BTreeMap<Ranked, BTreeMap<Ranked, Vec<&'a Cell>>>>;

/// The authors' `performance.json` for the cells given: per task, response model and
/// detector, one entry per prompt and their `average`; then a top-level `average` over tasks.
pub fn performance_json(cells: &[Cell]) -> Value {
    let detector_order: Vec<&str> = DETECTORS.iter().map(|(f, _)| *f).collect();
    let mut grouped: Grouped = BTreeMap::new();
    for c in cells {
        grouped
            .entry(rank(&TASKS, &c.task))
            .or_default()
            .entry(rank(&RESPONSE_MODELS, &c.response_model))
            .or_default()
            .entry(rank(&detector_order, &c.detector))
            .or_default()
            .push(c);
    }
    let mut root = Map::new();
    let mut across: BTreeMap<(Ranked, Ranked), TaskAverages> = BTreeMap::new();
    for ((_, task), models) in &grouped {
        let mut task_obj = Map::new();
        for (model_rank, detectors) in models {
            let mut model_obj = Map::new();
            for (det_rank, cells) in detectors {
                let mut det_obj = Map::new();
                let mut sorted = cells.clone();
                sorted.sort_by(|a, b| a.prompt.cmp(&b.prompt));
                let mut list = Vec::new();
                for c in &sorted {
                    let conf = c.confusion();
                    det_obj.insert(format!("prompt={}", c.prompt), cell_json(&conf));
                    list.push(conf.metrics().named());
                }
                let first = sorted[0].confusion();
                let averages = average_json(&list);
                det_obj.insert(
                    "average".to_string(),
                    json!({
                        "total_num": first.total(),
                        "gold_error_num": first.gold_errors(),
                        "metrics": averages,
                    }),
                );
                let means = list_means(&list);
                across
                    .entry((model_rank.clone(), det_rank.clone()))
                    .or_default()
                    .push((means, first.total(), first.gold_errors()));
                model_obj.insert(
                    format!("baseline_model={}", detector_key(&det_rank.1)),
                    Value::Object(det_obj),
                );
            }
            task_obj.insert(
                format!("initial_model={}", response_model_key(&model_rank.1)),
                Value::Object(model_obj),
            );
        }
        root.insert(task.clone(), Value::Object(task_obj));
    }
    let mut average = Map::new();
    for (((_, model), (_, detector)), per_task) in &across {
        let list: Vec<_> = per_task.iter().map(|(m, _, _)| *m).collect();
        let entry = json!({
            "average": {
                "total_num": per_task.iter().map(|t| t.1).sum::<usize>(),
                "gold_error_num": per_task.iter().map(|t| t.2).sum::<usize>(),
                "metrics": average_json(&list),
            }
        });
        let model_obj = average
            .entry(format!("initial_model={}", response_model_key(model)))
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = model_obj {
            m.insert(format!("baseline_model={}", detector_key(detector)), entry);
        }
    }
    root.insert("average".to_string(), Value::Object(average));
    Value::Object(root)
}

/// Element-wise means of metric lists (names kept).
fn list_means(list: &[[(&'static str, f64); 8]]) -> [(&'static str, f64); 8] {
    let mut out = list[0];
    for (i, slot) in out.iter_mut().enumerate() {
        let values: Vec<f64> = list.iter().map(|m| m[i].1).collect();
        slot.1 = mean_std(&values).0;
    }
    out
}

/// Compares two `performance.json` values cell by cell (every `prompt=` entry of `ours`
/// against `published`, all eight metrics within `tol`). Returns (matching, compared, the
/// first mismatches described).
pub fn compare_cells(ours: &Value, published: &Value, tol: f64) -> (usize, usize, Vec<String>) {
    let mut matching = 0;
    let mut compared = 0;
    let mut notes = Vec::new();
    let Some(tasks) = ours.as_object() else {
        return (0, 0, notes);
    };
    for (task, models) in tasks.iter().filter(|(t, _)| *t != "average") {
        for (model, dets) in models.as_object().into_iter().flatten() {
            for (det, prompts) in dets.as_object().into_iter().flatten() {
                for (prompt, cell) in prompts.as_object().into_iter().flatten() {
                    if !prompt.starts_with("prompt=") {
                        continue;
                    }
                    compared += 1;
                    let theirs = &published[task][model][det][prompt];
                    let ok = ["total_num", "gold_error_num", "prediction_error_num"]
                        .iter()
                        .all(|k| cell[k] == theirs[k])
                        && cell["metrics"].as_object().is_some_and(|m| {
                            m.iter().all(|(k, v)| {
                                match (v.as_f64(), theirs["metrics"][k].as_f64()) {
                                    (Some(a), Some(b)) => (a - b).abs() <= tol,
                                    _ => false,
                                }
                            })
                        });
                    if ok {
                        matching += 1;
                    } else if notes.len() < 10 {
                        notes.push(format!("{task} {model} {det} {prompt}"));
                    }
                }
            }
        }
    }
    (matching, compared, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::error_detection::{Detection, DetectionPrompt};
    use Detection::{Error as E, NoError as N};

    fn cell(
        task: &str,
        det: &str,
        prompt: DetectionPrompt,
        pairs: Vec<(Detection, Option<Detection>)>,
    ) -> Cell {
        Cell {
            task: task.into(),
            response_model: "Llama-2-70b-chat-hf".into(),
            detector: det.into(),
            prompt: prompt.file_stem(),
            pairs,
        }
    }

    #[test]
    fn performance_json_has_the_authors_shape() {
        let cells = vec![
            cell(
                TASKS[0],
                "gemma-7b-it",
                DetectionPrompt::P2,
                vec![(E, Some(E)), (N, Some(E))],
            ),
            cell(
                TASKS[0],
                "gemma-7b-it",
                DetectionPrompt::P1,
                vec![(E, Some(E)), (N, Some(N))],
            ),
            cell(
                TASKS[1],
                "gemma-7b-it",
                DetectionPrompt::P1,
                vec![(E, None), (N, Some(N))],
            ),
        ];
        let v = performance_json(&cells);
        let det = &v[TASKS[0]]["initial_model=meta-llama/Llama-2-70b-chat-hf"]
            ["baseline_model=google/gemma-7b-it"];
        let keys: Vec<&String> = det
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        assert_eq!(
            keys,
            [
                "prompt=baseline_errordetection_prompt_1",
                "prompt=baseline_errordetection_prompt_2",
                "average"
            ]
        );
        assert_eq!(
            det["average"]["metrics"]["accuracy"]["average"],
            json!(0.75)
        );
        assert_eq!(det["average"]["metrics"]["accuracy"]["stdev"], json!(0.25));
        let avg = &v["average"]["initial_model=meta-llama/Llama-2-70b-chat-hf"]
            ["baseline_model=google/gemma-7b-it"]["average"];
        assert_eq!(avg["total_num"], json!(4));
        // Task means 0.75 and 0.5.
        assert_eq!(avg["metrics"]["accuracy"]["average"], json!(0.625));
        let (ok, n, _) = compare_cells(&v, &v, 0.0);
        assert_eq!((ok, n), (3, 3));
    }
}
