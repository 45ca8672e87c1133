//! `candor score realmistake`: detector outputs (the authors' archive or a folder of the same
//! layout) to the authors' `performance.json` structure, with a printed summary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::bench::item_scores::{CandidateScores, ItemScores};
use crate::bench::realmistake::{data, performance, score};
use crate::bench::table::texts;
use crate::report::format::number;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Detector outputs: `detector_outputs_open.zip` (decrypted in memory) or a folder holding
    /// `<task>/<response model>/<detector>/baseline_errordetection_prompt_<n>.jsonl`.
    #[arg(long)]
    outputs: PathBuf,
    /// Where to write the performance JSON (the structure of `published_performance.json`).
    #[arg(long)]
    out: PathBuf,
    /// Read verdicts from the raw `response` text with Candor's parser instead of using the
    /// published `prediction` field.
    #[arg(long)]
    reparse: bool,
    /// The benchmark (`data.zip` or a folder with `data/<task>/<model>.jsonl`) for gold labels;
    /// default: `<data root>/realmistake/data.zip` when present, else the outputs' own labels.
    #[arg(long)]
    data: Option<PathBuf>,
    /// A published `performance.json` to compare every cell with (prints the matching count).
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Where to write the headline metrics with bootstrap intervals and each detector's κ
    /// against the expert labels (JSON, per detector).
    #[arg(long)]
    results: Option<PathBuf>,
    /// Seed of the bootstrap.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to write every detector's per-item accuracy (`item_scores.json`, which `candor
    /// compare` reads to compare the detectors); its folder is created if absent.
    #[arg(long)]
    item_scores: Option<PathBuf>,
}

/// Writes one of the output files, creating its folder first when absent (as every output
/// path of this command may name a folder that does not exist yet).
fn write_output(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let files = data::load_detector_outputs(&args.outputs)?;
    let data_path = args.data.clone().or_else(|| {
        let p = data::default_dir().join("data.zip");
        p.is_file().then_some(p)
    });
    let benchmark = match &data_path {
        Some(p) => Some(data::load_benchmark(p)?),
        None => None,
    };
    let source = if args.reparse {
        score::Predictions::Reparsed
    } else {
        score::Predictions::Published
    };
    let cells = files
        .iter()
        .map(|f| score::cell(f, benchmark.as_ref(), source))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = &args.item_scores {
        let ids: Vec<Vec<String>> = files
            .iter()
            .map(|f| f.records.iter().map(|r| r.id.clone()).collect())
            .collect();
        let per_detector = score::accuracy_items(&cells, &ids);
        let mut items: Vec<String> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (_, m) in &per_detector {
            for v in &m.values {
                if seen.insert(v.id.clone()) {
                    items.push(v.id.clone());
                }
            }
        }
        let doc = ItemScores {
            protocol: "realmistake".to_string(),
            data: match &data_path {
                Some(p) => format!(
                    "realmistake {}",
                    p.file_name().unwrap_or_default().to_string_lossy()
                ),
                None => "realmistake (labels of the outputs)".to_string(),
            },
            scoring: format!(
                "verdicts={}",
                if args.reparse {
                    "reparsed"
                } else {
                    "published"
                }
            ),
            items,
            candidates: per_detector
                .into_iter()
                .map(|(name, m)| CandidateScores {
                    name,
                    metrics: vec![m],
                })
                .collect(),
        };
        if let Err(e) = doc.check() {
            anyhow::bail!("{}: {e}", args.outputs.display());
        }
        write_output(path, &doc.to_json())?;
        println!(
            "wrote per-item accuracy of {} detectors to {}",
            doc.candidates.len(),
            path.display()
        );
    }
    let perf = performance::performance_json(&cells);
    let text = serde_json::to_string_pretty(&perf)?;
    write_output(&args.out, (text + "\n").as_bytes())?;
    println!(
        "{} cells ({} predictions) from {}; gold labels from {}; verdicts: {}",
        cells.len(),
        cells.iter().map(|c| c.pairs.len()).sum::<usize>(),
        args.outputs.display(),
        data_path
            .as_ref()
            .map_or("the outputs".to_string(), |p| p.display().to_string()),
        if args.reparse {
            "Candor's parser"
        } else {
            "published"
        }
    );
    if args.reparse {
        let agree: usize = files
            .iter()
            .flat_map(|f| &f.records)
            .filter(|r| {
                crate::judge::error_detection::parse_detection(&r.response)
                    .scored()
                    .copied()
                    == r.prediction
            })
            .count();
        let total: usize = files.iter().map(|f| f.records.len()).sum();
        println!("parser agrees with the published predictions on {agree}/{total}");
    }
    let mut by_detector: BTreeMap<&str, Vec<score::Cell>> = BTreeMap::new();
    for c in &cells {
        by_detector.entry(&c.detector).or_default().push(c.clone());
    }
    let mut results = BTreeMap::new();
    println!("detector\tf1\tprecision\trecall\taccuracy\t(95% bootstrap, no verdict)");
    for (det, cells) in &by_detector {
        let mut r = score::headline(cells, args.seed);
        // Each detector's own κ against the expert labels (pooled and per prompt).
        r.tables
            .extend(crate::bench::realmistake::reliability::reliability_tables(
                cells, args.seed,
            ));
        let cols: Vec<String> = r
            .metrics
            .iter()
            .map(|m| {
                let i = m.interval;
                let pct = |x: f64| number(100.0 * x, 1);
                format!("{} [{}, {}]", pct(i.value), pct(i.low), pct(i.high))
            })
            .collect();
        let unscored = r.metrics.first().map_or(0, |m| m.unscored);
        println!("{det}\t{}\t({unscored})", cols.join("\t"));
        results.insert(det.to_string(), r);
    }
    let mut all = score::headline(&cells, args.seed);
    all.tables
        .extend(crate::bench::realmistake::reliability::reliability_tables(
            &cells, args.seed,
        ));
    for table in &all.tables {
        println!("\n{}\n{}", table.title, table.columns.join("\t"));
        for row in &table.rows {
            println!("{}", texts(row).join("\t"));
        }
    }
    if let Some(p) = &args.results {
        write_output(
            p,
            (serde_json::to_string_pretty(&results)? + "\n").as_bytes(),
        )?;
    }
    println!("wrote {}", args.out.display());
    if let Some(p) = &args.compare {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        let published: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
        let (ok, n, notes) = performance::compare_cells(&perf, &published, 1e-9);
        println!("{ok}/{n} cells match {}", p.display());
        for note in notes {
            println!("  differs: {note}");
        }
    }
    Ok(())
}
