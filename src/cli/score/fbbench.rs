//! `candor score fbbench`: judgement JSONL files (one per model, the authors' format) to the
//! five published score tables as CSV, plus a readable summary with bootstrap intervals and,
//! where the authors' own tables are at hand, a cell-by-cell comparison with them; and
//! `item_scores.json`, every model's per-item values, which `candor compare` reads.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::bench::fbbench::data::{load_judgements, pairing_id, Version};
use crate::bench::fbbench::published;
use crate::bench::fbbench::score::{
    check_categories, metric_items, published_tables, results, scoring_label, tables_for_version,
    units_from_records, ModelUnits, Rule,
};
use crate::bench::item_scores::{self, CandidateScores, ItemScores};
use crate::bench::table::Table;
use crate::report::format;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuleArg {
    /// The authors' code (reproduces the published numbers): Response Maintenance scores 1
    /// when any criterion is met; a judgement the authors recorded as failed counts at its
    /// recorded score (0).
    Published,
    /// The paper's formula: Response Maintenance scores 1 only when every criterion is met;
    /// unreadable judgements are left out and counted.
    Paper,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Folder of judgement JSONL files, one per model (`<model>.jsonl`).
    #[arg(long)]
    pub judgments: PathBuf,
    /// Folder to write overall_score.csv, per_task_score.csv, per_error_score.csv,
    /// per_feedback_score_correct.csv and per_feedback_score_antisyco.csv into, and
    /// item_scores.json (every model's per-item values, for `candor compare`).
    #[arg(long)]
    pub out: PathBuf,
    /// How checklist verdicts become item scores.
    #[arg(long, value_enum, default_value_t = RuleArg::Published)]
    pub rule: RuleArg,
    /// Re-parse the judge's raw text (`judge_output`, kept by Candor's runs) instead of
    /// reading the recorded `judgement` verdicts.
    #[arg(long)]
    pub reparse: bool,
    /// Seed of the bootstrap intervals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Folder of the authors' published tables (`v3_overall_score.xlsx`, … as `candor data
    /// fetch fbbench` stores them; `.csv` of the same shape also read) to compare every cell
    /// with; default: the data root's `fbbench/tables` ($CANDOR_DATA, ../shared/data, else
    /// the cache). Without them the comparison says so and the scoring completes.
    #[arg(long)]
    pub published: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let rule = match args.rule {
        RuleArg::Published => Rule::Published,
        RuleArg::Paper => Rule::Paper,
    };
    let (models, version, scores) = load_models(&args.judgments, rule, args.reparse)?;
    let tables = tables_for_version(published_tables(&models, rule), version);
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    for table in &tables {
        let path = args.out.join(format!("{}.csv", table.title));
        write_csv(&path, table).with_context(|| format!("writing {}", path.display()))?;
    }
    let path = args.out.join(item_scores::FILE);
    crate::store::run_dir::write_atomic(&path, &scores.to_json())?;
    let mut out = std::io::stdout().lock();
    let published_dir = args
        .published
        .clone()
        .unwrap_or_else(|| crate::store::data::default_root().join("fbbench/tables"));
    let theirs = published::load(&published_dir, version)?;
    let printed = print_summary(&mut out, &models, rule, args.seed, &tables)
        .and_then(|()| {
            print_comparison(
                &mut out,
                &tables,
                theirs.as_deref(),
                &published_dir,
                version,
            )
        })
        .and_then(|()| {
            writeln!(
                out,
                "wrote {} tables and {} to {}",
                tables.len(),
                item_scores::FILE,
                args.out.display()
            )
        });
    match printed {
        // A closed pipe (`| head`) is the reader's choice, not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Every `*.jsonl` in `dir`, by file name; the model is the file stem. Also the dataset
/// version the records come from (v1 records all carry a reference follow-up response), and
/// the per-item values of every model (`item_scores.json`, for `candor compare`).
fn load_models(
    dir: &Path,
    rule: Rule,
    reparse: bool,
) -> anyhow::Result<(Vec<ModelUnits>, Version, ItemScores)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    files.retain(|p| p.extension().is_some_and(|e| e == "jsonl"));
    files.sort();
    anyhow::ensure!(
        !files.is_empty(),
        "{}: no *.jsonl judgement files",
        dir.display()
    );
    let mut versions = Vec::new();
    let (mut items, mut judges, mut candidates) = (Vec::new(), Vec::new(), Vec::new());
    let models = files
        .iter()
        .map(|path| {
            let records = load_judgements(path)?;
            versions.push((path, Version::recognise(records.iter().map(|r| &r.item))));
            let units = units_from_records(&records, rule, reparse)
                .and_then(|u| check_categories(&u).map(|()| u))
                .with_context(|| path.display().to_string())?;
            let model = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let ids: Vec<String> = records.iter().map(|r| pairing_id(&r.item)).collect();
            for (id, r) in ids.iter().zip(&records) {
                if !judges.contains(&r.judge_model) {
                    judges.push(r.judge_model.clone());
                }
                if !items.contains(id) {
                    items.push(id.clone());
                }
            }
            candidates.push(CandidateScores {
                name: model.clone(),
                metrics: metric_items(&units, &ids),
            });
            Ok(ModelUnits { model, units })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let version = versions[0].1;
    if let Some((path, v)) = versions.iter().find(|(_, v)| *v != version) {
        anyhow::bail!(
            "{}: {v:?} judgements, but {} holds {version:?} ones; score one version at a time",
            path.display(),
            versions[0].0.display()
        );
    }
    let scores = ItemScores {
        protocol: "fbbench".to_string(),
        data: format!("fbbench {}", format!("{version:?}").to_lowercase()),
        scoring: scoring_label(rule, &judges.join(",")),
        items,
        candidates,
    };
    if let Err(e) = scores.check() {
        bail!("{}: {e}", dir.display());
    }
    Ok((models, version, scores))
}

fn write_csv(path: &Path, table: &Table) -> anyhow::Result<()> {
    let file = std::fs::File::create(path)?;
    format::write_csv(std::io::BufWriter::new(file), table)?;
    Ok(())
}

fn print_summary(
    out: &mut impl Write,
    models: &[ModelUnits],
    rule: Rule,
    seed: u64,
    tables: &[Table],
) -> std::io::Result<()> {
    writeln!(
        out,
        "FB-Bench ({rule:?} rule), scores x100 with bootstrap 95% intervals over items"
    )?;
    let width = models
        .iter()
        .map(|m| m.model.len())
        .max()
        .unwrap_or(5)
        .max(5);
    writeln!(
        out,
        "{:width$}  {:>22}  {:>22}  {:>22}  {:>5}  {:>8}",
        "model", "error_correction", "response_maintenance", "overall", "items", "unscored"
    )?;
    // In the order of the overall table (by Overall, descending).
    let order: Vec<String> = tables
        .first()
        .map(|t| t.rows.iter().map(|r| r[0].to_string()).collect())
        .unwrap_or_default();
    for name in order {
        let Some(m) = models.iter().find(|m| m.model == name) else {
            continue;
        };
        let r = results(m, rule, seed);
        let cells: Vec<String> = r
            .metrics
            .iter()
            .map(|x| {
                let i = x.interval;
                let n = |x| format::number(x, 2);
                format!("{:>6} [{:>6},{:>6}]", n(i.value), n(i.low), n(i.high))
            })
            .collect();
        let flagged = m.units.iter().filter(|u| u.unscored.is_some()).count();
        writeln!(
            out,
            "{:width$}  {:>22}  {:>22}  {:>22}  {:>5}  {:>8}",
            m.model,
            cells[0],
            cells[1],
            cells[2],
            m.units.len(),
            flagged
        )?;
        for u in m.units.iter().filter(|u| u.unscored.is_some()) {
            let how = match u.score {
                Some(s) => format!(
                    "counted at the recorded score {}, as the authors' code did",
                    s.value
                ),
                None => "left out of the metric".to_string(),
            };
            writeln!(
                out,
                "    unscored ({}, {}): {}; {how}",
                u.bench_type.as_str(),
                u.task_type,
                u.unscored.as_deref().unwrap_or_default()
            )?;
        }
    }
    Ok(())
}

/// Candor's tables against the authors' published ones, table by table (identical cells of
/// the models scored, and the first cells that differ), or a line saying they are not at hand.
fn print_comparison(
    out: &mut impl Write,
    ours: &[Table],
    published: Option<&[(PathBuf, Table)]>,
    dir: &Path,
    version: Version,
) -> std::io::Result<()> {
    let version = format!("{version:?}").to_lowercase();
    let Some(published) = published else {
        return writeln!(
            out,
            "published {version} tables: not available in {} (`candor data fetch fbbench` \
             fetches the authors' .xlsx files); no comparison",
            dir.display()
        );
    };
    writeln!(
        out,
        "published {version} tables (GPT-4o judge), cell by cell:"
    )?;
    for (path, theirs) in published {
        let Some(mine) = ours.iter().find(|t| t.id == theirs.id) else {
            continue;
        };
        let c = published::compare(mine, theirs);
        writeln!(
            out,
            "  {}: {} models, {}/{} cells identical ({})",
            theirs.id,
            c.models,
            c.identical,
            c.cells,
            path.display()
        )?;
        if !c.unpublished.is_empty() {
            writeln!(
                out,
                "    not in the published table: {}",
                c.unpublished.join(", ")
            )?;
        }
        for d in c.differing.iter().take(5) {
            writeln!(out, "    differs: {d}")?;
        }
        if c.differing.len() > 5 {
            writeln!(out, "    … and {} more", c.differing.len() - 5)?;
        }
    }
    Ok(())
}
