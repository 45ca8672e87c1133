//! `report.html`: one self-contained page for one run or a comparison of several.
//!
//! Everything is inline: the styles, and the charts, which are SVG drawn here (no script, no
//! font, no image, no network; a Content-Security-Policy forbids any outside resource). For
//! each protocol there are the charts it declares ([`crate::bench::figure`]: a leaderboard of
//! its headline metrics with their bootstrap 95% intervals as whiskers, then its breakdowns),
//! each figure with its `n`,
//! unscored and failed counts beside it, and every table with the exact numbers. A last
//! section summarises each run's manifest (models with hashes, settings, decoding, Candor
//! version). The page is written from `results.json` and the manifest's identity alone, so
//! it is as deterministic as they are (two runs of the same manifest write the same bytes).

use std::collections::BTreeMap;
use std::fmt::Write;

use super::format::{self, html as esc, metric_interval, metric_value};
use super::RunResults;
use crate::bench;
use crate::bench::figure::{Chart, Labels, RowNote};
use crate::bench::item_scores::ItemScores;
use crate::bench::plan::Actor;
use crate::bench::reliability;
use crate::bench::stats::Metric;
use crate::bench::table::{Cell, Table};
use crate::store::manifest::RunIdentity;

/// One run as the report shows it.
#[derive(Debug, Clone)]
pub struct ReportRun {
    /// How the run is named in legends (its candidate models, or its directory).
    pub label: String,
    pub results: RunResults,
    /// The manifest's identity, when the run directory had one.
    pub identity: Option<RunIdentity>,
    /// The run's per-item values (`item_scores.json`), for the paired comparisons.
    pub item_scores: Option<ItemScores>,
    /// What the run's directory says beside its results (how a replicated run's devices
    /// shared it: `crate::report::run_notes`).
    pub notes: Vec<String>,
}

impl ReportRun {
    /// A run labelled by its candidate models (and its judge, when another model).
    pub fn new(results: RunResults, identity: Option<RunIdentity>) -> Self {
        let candidates: Vec<&str> = results
            .models
            .iter()
            .filter(|m| m.role.starts_with("candidate"))
            .map(|m| m.name.as_str())
            .collect();
        let judge = results
            .models
            .iter()
            .find(|m| m.role == "judge")
            .map(|m| m.name.as_str());
        let mut label = candidates.join(" + ");
        if let Some(j) = judge.filter(|j| candidates.first() != Some(j)) {
            label = format!("{label} (judge {j})");
        }
        if label.is_empty() {
            label = results.protocol.clone();
        }
        ReportRun {
            label,
            results,
            identity,
            item_scores: None,
            notes: Vec::new(),
        }
    }
}

/// Colours of the runs, in order (and again after eight).
const PALETTE: [&str; 8] = [
    "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f",
];

fn colour(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// A value of a figure: the point, its interval when known, the two as the tables write them,
/// and what is written beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub value: Option<f64>,
    pub interval: Option<(f64, f64)>,
    /// The value (with its interval) as text, by [`format`]: the same as in the tables.
    pub text: String,
    /// `n`, unscored and failed counts, shown beside the bar.
    pub note: String,
}

impl Bar {
    fn from_metric(m: &Metric, failed: usize) -> Bar {
        let i = m.interval;
        Bar {
            value: i.value.is_finite().then_some(i.value),
            interval: (i.low.is_finite() && i.high.is_finite()).then_some((i.low, i.high)),
            text: metric_value(&i).to_string(),
            note: format!("n={} · unscored {} · failed {}", m.n, m.unscored, failed),
        }
    }
}

/// A row group of a chart: a category and one bar per run (`None`: the run lacks it).
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub label: String,
    pub bars: Vec<Option<Bar>>,
}

/// The value range of a chart's axis: bars are drawn from 0 to their value, clipped to it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Axis {
    pub min: f64,
    pub max: f64,
}

impl Axis {
    /// κ's own range, whatever the values (a κ near 0.3 on a 0–100 axis is no bar at all).
    pub const KAPPA: Axis = Axis {
        min: -1.0,
        max: 1.0,
    };

    /// From 0 to [`axis_max`] of the values.
    fn of(groups: &[Group]) -> Axis {
        Axis {
            min: 0.0,
            max: axis_max(groups),
        }
    }
}

/// The upper end of a chart's axis: 1 for proportions, 100 for percentages, else the
/// largest value rounded up.
fn axis_max(groups: &[Group]) -> f64 {
    let top = groups
        .iter()
        .flat_map(|g| g.bars.iter().flatten())
        .flat_map(|b| [b.value, b.interval.map(|i| i.1)])
        .flatten()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    if top <= 1.0 {
        1.0
    } else if top <= 100.0 {
        100.0
    } else {
        let p = 10f64.powf(top.log10().floor());
        (top / p).ceil() * p
    }
}

/// Characters of a row label's line; a longer label takes a second line, and a line still
/// too long keeps its start and its end (`answerability_cl…prompt_1`), which is where labels
/// of one chart differ.
const LABEL_CHARS: usize = 34;

/// A row label as at most two lines of at most [`LABEL_CHARS`] characters, broken only
/// between words: at a ` · ` where there is one, else at the last space (dropped) or after the
/// last `/`, `_`, `-` or `,` that leaves the first line at most [`LABEL_CHARS`] long. A label
/// without such a place stays one line, cut in its middle.
fn label_lines(label: &str) -> Vec<String> {
    if label.chars().count() <= LABEL_CHARS {
        return vec![label.to_string()];
    }
    let split = label.split_once(" · ").or_else(|| {
        let mut best = None;
        for (k, (i, c)) in label.char_indices().enumerate() {
            if k > LABEL_CHARS {
                break;
            }
            if c == ' ' && k > 0 {
                best = Some((&label[..i], &label[i + 1..]));
            } else if matches!(c, '/' | '_' | '-' | ',') && k < LABEL_CHARS {
                let end = i + c.len_utf8();
                best = Some((&label[..end], &label[end..]));
            }
        }
        best.filter(|(_, rest)| !rest.is_empty())
    });
    match split {
        Some((first, rest)) => vec![
            middle_cut(first, LABEL_CHARS),
            middle_cut(rest, LABEL_CHARS),
        ],
        None => vec![middle_cut(label, LABEL_CHARS)],
    }
}

/// `s` cut to `n` characters by an ellipsis in its middle.
fn middle_cut(s: &str, n: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= n {
        return s.to_string();
    }
    let head = (n - 1) / 2;
    let tail = n - 1 - head;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// The text at the right of a bar: its value and note.
fn note_text(b: &Bar) -> String {
    format!("{} · {}", b.text, b.note)
}

/// A generous estimate of `text`'s width in pixels at the notes' 11 px: about 7 px for a
/// Latin character, 12 for a wide (CJK) one.
fn note_width(text: &str) -> f64 {
    text.chars()
        .map(|c| if (c as u32) < 0x2e80 { 7.0 } else { 12.0 })
        .sum()
}

/// A horizontal bar chart as inline SVG on the axis the values call for ([`Axis::of`]): see
/// [`chart_on`].
pub fn chart(title: &str, groups: &[Group]) -> String {
    chart_on(title, groups, Axis::of(groups))
}

/// A horizontal bar chart as inline SVG on `axis`: per group one bar per run (its colour, from
/// 0 to the value), whiskers for intervals, the value and the note at the right; a group's
/// label takes two lines when it is long. Each drawn bar is a `rect.bar`; a chart without any
/// value says so on a line of its own above the rows (and then has no bar).
pub fn chart_on(title: &str, groups: &[Group], axis: Axis) -> String {
    const LABEL_W: f64 = 230.0;
    const PLOT_W: f64 = 360.0;
    const NOTE_W: f64 = 330.0;
    const BAR_H: f64 = 14.0;
    const LINE_H: f64 = 14.0;
    const GAP: f64 = 10.0;
    let Axis { min, max } = axis;
    let marks = groups
        .iter()
        .flat_map(|g| g.bars.iter().flatten())
        .filter(|b| b.value.is_some())
        .count();
    // The "no values" line has the space above the rows to itself.
    let top = if marks == 0 { 44.0 } else { 26.0 };
    let lines: Vec<Vec<String>> = groups.iter().map(|g| label_lines(&g.label)).collect();
    let group_h = |g: &Group, l: &[String]| {
        (g.bars.len().max(1) as f64 * (BAR_H + 2.0)).max(l.len() as f64 * LINE_H + 2.0)
    };
    let rows_h: f64 = groups
        .iter()
        .zip(&lines)
        .map(|(g, l)| group_h(g, l) + GAP)
        .sum();
    let height = top + rows_h + 24.0;
    // The notes' column is as wide as its longest note (at least NOTE_W), so no note runs
    // past the chart's edge; CSS scales a wide chart down to the page.
    let note_w = groups
        .iter()
        .flat_map(|g| g.bars.iter().flatten())
        .map(|b| note_width(&note_text(b)) + 16.0)
        .fold(NOTE_W, f64::max);
    let width = (LABEL_W + PLOT_W + note_w).ceil();
    let x = |v: f64| LABEL_W + ((v.clamp(min, max) - min) / (max - min)) * PLOT_W;
    let zero = x(0.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<figure><figcaption>{}</figcaption><svg class="chart" data-marks="{marks}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0}" viewBox="0 0 {width} {height:.0}" role="img">"#,
        esc(title)
    );
    if marks == 0 {
        let _ = write!(
            s,
            r##"<text class="empty" x="{:.1}" y="16" font-size="12" fill="#b91c1c">no values to draw</text>"##,
            LABEL_W + 8.0
        );
    }
    let bottom = height - 20.0;
    for k in 0..=4 {
        let v = min + (max - min) * f64::from(k) / 4.0;
        let gx = x(v);
        let _ = write!(
            s,
            r##"<line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{bottom:.1}" stroke="#e5e7eb"/><text class="tick" x="{gx:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#6b7280">{}</text>"##,
            top - 6.0,
            bottom + 13.0,
            format::number(v, if max - min <= 2.0 { 2 } else { 0 })
        );
    }
    let mut y = top;
    for (g, l) in groups.iter().zip(&lines) {
        let h = group_h(g, l);
        let mid = y + h / 2.0;
        let first = mid + 4.0 - (l.len() as f64 - 1.0) * LINE_H / 2.0;
        let _ = write!(
            s,
            r##"<text class="label" x="{:.1}" y="{first:.1}" font-size="12" text-anchor="end" fill="#111827"><title>{}</title>"##,
            LABEL_W - 8.0,
            esc(&g.label)
        );
        for (i, line) in l.iter().enumerate() {
            let _ = write!(
                s,
                r#"<tspan x="{:.1}" dy="{}">{}</tspan>"#,
                LABEL_W - 8.0,
                if i == 0 { 0.0 } else { LINE_H },
                esc(line)
            );
        }
        s.push_str("</text>");
        let bars_h = g.bars.len().max(1) as f64 * (BAR_H + 2.0);
        let y0 = y + (h - bars_h) / 2.0;
        for (r, bar) in g.bars.iter().enumerate() {
            let by = y0 + r as f64 * (BAR_H + 2.0);
            let cy = by + BAR_H / 2.0;
            let note_x = LABEL_W + PLOT_W + 8.0;
            let Some(b) = bar else {
                continue;
            };
            match b.value {
                Some(v) => {
                    let _ = write!(
                        s,
                        r#"<rect class="bar" x="{:.1}" y="{by:.1}" width="{:.1}" height="{BAR_H}" fill="{}" fill-opacity="0.75"><title>{}: {}</title></rect>"#,
                        zero.min(x(v)),
                        (x(v) - zero).abs().max(0.5),
                        colour(r),
                        esc(&g.label),
                        esc(&b.text)
                    );
                    if let Some((lo, hi)) = b.interval {
                        let (x1, x2) = (x(lo), x(hi));
                        let _ = write!(
                            s,
                            r##"<g class="whisker" stroke="#111827" stroke-width="1.2"><line x1="{x1:.1}" y1="{cy:.1}" x2="{x2:.1}" y2="{cy:.1}"/><line x1="{x1:.1}" y1="{:.1}" x2="{x1:.1}" y2="{:.1}"/><line x1="{x2:.1}" y1="{:.1}" x2="{x2:.1}" y2="{:.1}"/></g>"##,
                            cy - 4.0,
                            cy + 4.0,
                            cy - 4.0,
                            cy + 4.0
                        );
                    }
                    let _ = write!(
                        s,
                        r##"<text class="note" x="{note_x:.1}" y="{:.1}" font-size="11" fill="#111827">{}</text>"##,
                        cy + 4.0,
                        esc(&note_text(b))
                    );
                }
                None => {
                    let _ = write!(
                        s,
                        r##"<text class="note" x="{:.1}" y="{:.1}" font-size="11" fill="#6b7280">no value · {}</text>"##,
                        LABEL_W + 4.0,
                        cy + 4.0,
                        esc(&b.note)
                    );
                }
            }
        }
        y += h + GAP;
    }
    s.push_str("</svg></figure>\n");
    s
}

/// What one run has to say about one protocol's figures.
struct Figures<'a> {
    runs: Vec<&'a ReportRun>,
}

impl Figures<'_> {
    fn failed(&self, r: usize) -> usize {
        self.runs[r].results.failed.len()
    }

    /// One group per metric name in `names` (those no run has are left out).
    fn metric_groups(&self, names: &[String], label: impl Fn(&str) -> String) -> Vec<Group> {
        names
            .iter()
            .filter_map(|name| {
                let bars: Vec<Option<Bar>> = self
                    .runs
                    .iter()
                    .enumerate()
                    .map(|(r, run)| {
                        run.results
                            .results
                            .metrics
                            .iter()
                            .find(|m| &m.name == name)
                            .map(|m| Bar::from_metric(m, self.failed(r)))
                    })
                    .collect();
                bars.iter().any(Option::is_some).then(|| Group {
                    label: label(name),
                    bars,
                })
            })
            .collect()
    }

    /// Every metric name of the runs, first-seen order.
    fn metric_names(&self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for run in &self.runs {
            for m in &run.results.results.metrics {
                if keep(&m.name) && !names.contains(&m.name) {
                    names.push(m.name.clone());
                }
            }
        }
        names
    }

    /// Groups from the table `id` ([`Table::id`]) of every run: the row label is the
    /// `label_cols` joined, the value the column `value_col`; `note` makes the note of a row.
    fn table_groups(
        &self,
        id: &str,
        label_cols: &[&str],
        value_col: &str,
        note: &dyn Fn(&Table, &[Cell], usize) -> String,
    ) -> Vec<Group> {
        let mut order: Vec<String> = Vec::new();
        let mut cells: BTreeMap<(String, usize), Bar> = BTreeMap::new();
        for (r, run) in self.runs.iter().enumerate() {
            let Some(t) = run.results.results.tables.iter().find(|t| t.id == id) else {
                continue;
            };
            let (Some(vc), Some(lcs)) = (
                t.column(value_col),
                label_cols
                    .iter()
                    .map(|c| t.column(c))
                    .collect::<Option<Vec<_>>>(),
            ) else {
                continue;
            };
            for row in &t.rows {
                let label = lcs
                    .iter()
                    .map(|&i| row.get(i).map_or(String::new(), Cell::to_string))
                    .collect::<Vec<_>>()
                    .join(" · ");
                let cell = row.get(vc).unwrap_or(&Cell::Empty);
                let parsed = cell.value();
                if !order.contains(&label) {
                    order.push(label.clone());
                }
                cells.insert(
                    (label, r),
                    Bar {
                        value: parsed.map(|p| p.0),
                        interval: parsed.and_then(|p| p.1),
                        text: cell.to_string(),
                        note: note(t, row, self.failed(r)),
                    },
                );
            }
        }
        order
            .into_iter()
            .map(|label| Group {
                bars: (0..self.runs.len())
                    .map(|r| cells.get(&(label.clone(), r)).cloned())
                    .collect(),
                label,
            })
            .collect()
    }
}

fn failed_note(failed: usize) -> String {
    format!("failed {failed}")
}

/// The value of the first of `names` that `t` has, in `row`.
fn first_col(t: &Table, row: &[Cell], names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|c| t.column(c))
        .map(|i| row.get(i).map_or(String::new(), Cell::to_string))
}

/// The note beside a bar drawn from `row` of `t` ([`RowNote`]).
fn row_note(note: &RowNote, t: &Table, row: &[Cell], failed: usize) -> String {
    let mut parts = Vec::new();
    if let Some(n) = first_col(t, row, note.n) {
        parts.push(format!("n={n}"));
    }
    for (what, column) in [("unscored", note.unscored), ("incomplete", note.incomplete)] {
        if let Some(v) = column.and_then(|c| first_col(t, row, &[c])) {
            parts.push(format!("{what} {v}"));
        }
    }
    parts.push(failed_note(failed));
    parts.join(" · ")
}

/// The charts of one protocol: those it declares ([`crate::bench::figures`]), else its metrics
/// and each table's last numeric column by its first column.
fn protocol_charts(protocol: &str, f: &Figures<'_>) -> String {
    let mut out = String::new();
    let Some(declared) = bench::figures(protocol) else {
        let names = f.metric_names(|_| true);
        out += &chart("Leaderboard", &f.metric_groups(&names, str::to_string));
        let note = |_: &Table, _: &[Cell], failed: usize| failed_note(failed);
        let mut titles: Vec<(String, String, String)> = Vec::new();
        for run in &f.runs {
            for t in &run.results.results.tables {
                let numeric = (1..t.columns.len()).rev().find(|&c| {
                    t.rows
                        .iter()
                        .any(|r| r.get(c).and_then(Cell::value).is_some())
                });
                if let (Some(c), Some(first)) = (numeric, t.columns.first()) {
                    let key = (t.id.clone(), first.clone(), t.columns[c].clone());
                    if !titles.contains(&key) {
                        titles.push(key);
                    }
                }
            }
        }
        for (id, label, value) in titles {
            let title = (f.runs.iter().flat_map(|r| &r.results.results.tables))
                .find(|t| t.id == id)
                .map_or(id.as_str(), |t| t.title.as_str());
            let groups = f.table_groups(&id, &[&label], &value, &note);
            out += &chart(&format!("{title}: {value}"), &groups);
        }
        return out;
    };
    for c in declared.charts {
        match *c {
            Chart::Metrics { title, pick } => {
                let names = f.metric_names(|n| pick.takes(n));
                if !names.is_empty() {
                    out += &chart(title, &f.metric_groups(&names, |n| pick.label(n)));
                }
            }
            Chart::Rows {
                title,
                table,
                labels,
                value,
                note,
            } => {
                let columns: Vec<String> = match labels {
                    Labels::Columns(cs) => cs.iter().map(|c| c.to_string()).collect(),
                    Labels::SecondColumn => f
                        .runs
                        .iter()
                        .flat_map(|r| &r.results.results.tables)
                        .find(|t| t.id == table)
                        .and_then(|t| t.columns.get(1).cloned())
                        .into_iter()
                        .collect(),
                };
                let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
                let groups = f.table_groups(table, &columns, value, &|t, row, failed| {
                    row_note(&note, t, row, failed)
                });
                if !groups.is_empty() {
                    out += &chart(title, &groups);
                }
            }
            Chart::Kappa { title, table } => {
                let groups = f.table_groups(
                    table,
                    &[reliability::RATERS_COLUMN],
                    reliability::KAPPA_COLUMN,
                    &|t, row, failed| row_note(&RowNote::N_UNSCORED, t, row, failed),
                );
                if !groups.is_empty() {
                    out += &chart_on(title, &groups, Axis::KAPPA);
                }
            }
        }
    }
    out
}

fn html_table(title: &str, columns: &[String], rows: &[Vec<Cell>]) -> String {
    let mut s = format!("<details><summary>{}</summary><table><tr>", esc(title));
    for c in columns {
        let _ = write!(s, "<th>{}</th>", esc(c));
    }
    s.push_str("</tr>");
    for row in rows {
        s.push_str("<tr>");
        for c in row {
            let _ = write!(s, "<td>{}</td>", esc(&c.to_string()));
        }
        s.push_str("</tr>");
    }
    s.push_str("</table></details>\n");
    s
}

fn legend(runs: &[&ReportRun]) -> String {
    let mut s = String::from("<p class=\"legend\">");
    for (i, r) in runs.iter().enumerate() {
        let res = &r.results;
        let unscored: usize = res
            .results
            .metrics
            .iter()
            .map(|m| m.unscored)
            .max()
            .unwrap_or(0);
        let _ = write!(
            s,
            "<span><i style=\"background:{}\"></i>{} — {} items, {} completed, {} failed steps, \
             up to {} unscored per metric</span>",
            colour(i),
            esc(&r.label),
            res.items,
            res.completed,
            res.failed.len(),
            unscored
        );
    }
    s.push_str("</p>\n");
    s
}

fn json_compact(v: &serde_json::Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn manifest_summary(i: usize, run: &ReportRun) -> String {
    let r = &run.results;
    let mut s = format!(
        "<div class=\"run\"><h3><i style=\"background:{}\"></i>{}</h3>",
        colour(i),
        esc(&run.label)
    );
    let _ = write!(
        s,
        "<p>protocol <b>{}</b> · {} items, {} completed, {} failed steps, {} samples</p>",
        esc(&r.protocol),
        r.items,
        r.completed,
        r.failed.len(),
        r.samples
    );
    s.push_str("<table><tr><th>role</th><th>model</th><th>sha256</th><th>tokenizer sha256</th><th>options</th></tr>");
    match &run.identity {
        Some(id) => {
            for m in &id.models {
                let opts: Vec<String> = m.options.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = write!(
                    s,
                    "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td></tr>",
                    esc(&m.role),
                    esc(&m.name),
                    esc(&m.sha256),
                    esc(&m.tokenizer_sha256),
                    esc(&opts.join(", "))
                );
            }
        }
        None => {
            for m in &r.models {
                let _ = write!(
                    s,
                    "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td></td><td></td></tr>",
                    esc(&m.role),
                    esc(&m.name),
                    esc(&m.sha256)
                );
            }
        }
    }
    s.push_str("</table>");
    if let Some(id) = &run.identity {
        let _ = write!(
            s,
            "<dl><dt>Candor version</dt><dd>{}</dd><dt>seed</dt><dd>{}</dd>\
             <dt>settings</dt><dd><code>{}</code></dd><dt>decoding</dt><dd><code>{}</code></dd>\
             <dt>items</dt><dd>{} (ids sha256 <code>{}</code>)</dd>",
            esc(&id.candor_version),
            id.seed,
            esc(&json_compact(&id.settings)),
            esc(&json_compact(&id.decoding)),
            id.items.count,
            esc(&id.items.ids_sha256)
        );
        for d in &id.data_files {
            let _ = write!(
                s,
                "<dt>data</dt><dd>{} <code>{}</code></dd>",
                esc(&d.path),
                esc(&d.sha256)
            );
        }
        for (name, version) in &id.prompt_templates {
            let _ = write!(
                s,
                "<dt>template</dt><dd>{} <code>{}</code></dd>",
                esc(name),
                esc(version)
            );
        }
        s.push_str("</dl>");
    } else {
        s.push_str("<p>(no manifest.json beside the results)</p>");
    }
    if !run.notes.is_empty() {
        s.push_str("<p>Run notes</p><ul>");
        for n in &run.notes {
            let _ = write!(s, "<li>{}</li>", esc(n));
        }
        s.push_str("</ul>");
    }
    if !r.failed.is_empty() {
        let rows: Vec<Vec<Cell>> = r
            .failed
            .iter()
            .map(|f| {
                let actor = match f.actor {
                    Actor::Candidate(i) => format!("candidate {i}"),
                    Actor::Judge => "judge".to_string(),
                    Actor::Panel(j) => format!("judge {j}"),
                };
                [&f.item, &f.key, &actor, &f.error]
                    .map(|t| Cell::from(t.as_str()))
                    .to_vec()
            })
            .collect();
        let cols = ["item", "step", "actor", "error"].map(String::from);
        s += &html_table(&format!("Failed steps ({})", rows.len()), &cols, &rows);
    }
    s.push_str("</div>\n");
    s
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#111827}\
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #d1d5db;margin-top:32px}h3{font-size:15px}\
figure{margin:16px 0}figcaption{font-weight:600;margin-bottom:4px}svg.chart{max-width:100%;height:auto}\
table{border-collapse:collapse;font-size:12px;margin:6px 0}td,th{border:1px solid #e5e7eb;padding:2px 6px;text-align:left}\
code{font-size:11px;word-break:break-all}.legend span{display:inline-block;margin-right:16px}\
i{display:inline-block;width:10px;height:10px;margin-right:5px;border-radius:2px}\
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;font-size:12px}dd{margin:0}\
details{margin:4px 0}summary{cursor:pointer;color:#374151}";

/// Protocols in report order: those that declare figures in their declared order, then
/// others by name.
fn protocol_order(runs: &[ReportRun]) -> Vec<String> {
    let declared = bench::declared_figures();
    let mut names: Vec<String> = runs.iter().map(|r| r.results.protocol.clone()).collect();
    names.sort_by_key(|p| {
        let rank = declared
            .iter()
            .position(|d| d.protocol == p)
            .unwrap_or(declared.len());
        (rank, p.clone())
    });
    names.dedup();
    names
}

/// A protocol's section title: the one it declares, else its name.
fn protocol_title(p: &str) -> &str {
    bench::figures(p).map_or(p, |d| d.title)
}

/// The whole page.
pub fn render(runs: &[ReportRun]) -> String {
    let mut s = String::new();
    s.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    s.push_str(
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; img-src data:\">",
    );
    let _ = write!(
        s,
        "<title>Candor report</title><style>{STYLE}</style></head><body>\n<h1>Candor report</h1>\n"
    );
    let protocols = protocol_order(runs);
    let _ = writeln!(
        s,
        "<p>{} run{} · {}. Bars are point estimates; whiskers are seeded bootstrap 95% \
         intervals; beside each: n, unscored (judge outputs that could not be parsed, left out) \
         and failed steps (their items left out).</p>",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
        esc(&protocols
            .iter()
            .map(|p| protocol_title(p))
            .collect::<Vec<_>>()
            .join(", "))
    );
    for p in &protocols {
        let prs: Vec<&ReportRun> = runs.iter().filter(|r| &r.results.protocol == p).collect();
        let _ = writeln!(s, "<section><h2>{}</h2>", esc(protocol_title(p)));
        s += &legend(&prs);
        let f = Figures { runs: prs.clone() };
        s += &protocol_charts(p, &f);
        for run in &prs {
            for t in &run.results.results.tables {
                let title = if prs.len() > 1 {
                    format!("{} — {}", t.title, run.label)
                } else {
                    t.title.clone()
                };
                s += &html_table(&title, &t.columns, &t.rows);
            }
            let rows: Vec<Vec<Cell>> = run
                .results
                .results
                .metrics
                .iter()
                .map(|m| {
                    let decimals = format::metric_decimals(&m.interval);
                    vec![
                        m.name.clone().into(),
                        Cell::num(m.interval.value, decimals),
                        metric_interval(&m.interval).into(),
                        m.n.into(),
                        m.unscored.into(),
                    ]
                })
                .collect();
            let cols = ["metric", "value", "95% interval", "n", "unscored"].map(String::from);
            let title = if prs.len() > 1 {
                format!("Metrics — {}", run.label)
            } else {
                "Metrics".to_string()
            };
            s += &html_table(&title, &cols, &rows);
        }
        s.push_str("</section>\n");
    }
    s += &super::compare::report_section(
        runs.iter()
            .filter_map(|r| Some((r.label.as_str(), r.item_scores.as_ref()?))),
    );
    s.push_str("<section><h2>Runs</h2>\n");
    for p in &protocols {
        for (k, run) in runs.iter().filter(|r| &r.results.protocol == p).enumerate() {
            s += &manifest_summary(k, run);
        }
    }
    s.push_str("</section>\n<footer><p>Written by Candor ");
    s.push_str(env!("CARGO_PKG_VERSION"));
    s.push_str(" from results.json and manifest.json.</p></footer>\n</body></html>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::Interval;
    use crate::bench::table::table_id;
    use crate::bench::BenchResults;
    use crate::store::run_results::RunModel;

    fn run(protocol: &str, model: &str, value: f64) -> ReportRun {
        ReportRun::new(
            RunResults {
                protocol: protocol.into(),
                models: vec![
                    RunModel {
                        role: "candidate/0".into(),
                        name: model.into(),
                        sha256: "ab".into(),
                    },
                    RunModel {
                        role: "judge".into(),
                        name: "j<x>".into(),
                        sha256: "cd".into(),
                    },
                ],
                items: 3,
                completed: 2,
                samples: 6,
                failed: vec![],
                skipped_steps: 0,
                results: BenchResults {
                    metrics: vec![Metric {
                        name: "overall".into(),
                        interval: Interval {
                            value,
                            low: value - 5.0,
                            high: value + 5.0,
                        },
                        n: 2,
                        unscored: 1,
                    }],
                    tables: vec![Table {
                        id: "per_task_score".into(),
                        title: "per_task_score".into(),
                        columns: ["model", "task_type", "correct_avg_score", "all_avg_score"]
                            .map(String::from)
                            .to_vec(),
                        rows: vec![vec![
                            "m".into(),
                            "Coding".into(),
                            Cell::Float(40.0),
                            Cell::Empty,
                        ]],
                    }],
                },
            },
            None,
        )
    }

    #[test]
    fn charts_find_their_table_by_id_whatever_the_order() {
        let table = |id: &str, title: &str, column: &str, value: f64| Table {
            id: id.into(),
            title: title.into(),
            columns: ["group", column, "n", "unscored"]
                .map(String::from)
                .to_vec(),
            rows: vec![vec![
                "g".into(),
                Cell::num(value, 2),
                Cell::Int(4),
                Cell::Int(0),
            ]],
        };
        let mut r = run("fennec", "m", 50.0);
        // Another table first: charts used to take the first table of a Fennec run.
        r.results.results.tables = vec![
            table("other", "A table of something else", "agreement", 11.25),
            table(table_id::FENNEC_SINGLE, "Single", "accuracy", 62.5),
            table(table_id::FENNEC_PAIRWISE, "Pairwise", "agreement", 37.5),
        ];
        let html = render(&[r]);
        assert!(html.contains("Accuracy (%) per scenario group"), "{html}");
        assert!(html.contains("62.50 · n=4 · unscored 0"), "{html}");
        assert!(html.contains("Agreement (%) per scenario group"), "{html}");
        assert!(html.contains("37.50 · n=4 · unscored 0"), "{html}");
        assert!(!html.contains("11.25 · n=4"), "{html}");
    }

    #[test]
    fn page_is_self_contained_escaped_and_draws_every_value() {
        let runs = [run("fbbench", "a&b", 60.0), run("fbbench", "c", 40.0)];
        let html = render(&runs);
        assert!(html.starts_with("<!DOCTYPE html>"));
        for banned in ["<script", "http://", "https://", "<link", "@import", "url("] {
            let outside = html.replace("http://www.w3.org/2000/svg", "");
            assert!(!outside.contains(banned), "{banned}");
        }
        assert!(html.contains("a&amp;b (judge j&lt;x&gt;)"), "{html}");
        // Leaderboard: two bars with whiskers; per task: one bar (the other run's cell too).
        assert!(html.contains("data-marks=\"2\""), "{html}");
        assert_eq!(html.matches("class=\"whisker\"").count(), 2);
        assert!(html.contains("n=2 · unscored 1 · failed 0"));
        assert!(html.contains("[55.00, 65.00]"));
        assert_eq!(render(&runs), html, "deterministic");
        assert!(!html.contains("Run notes"));
        // A replicated run's notes, escaped, in its run's summary.
        let mut noted = run("fbbench", "c", 40.0);
        noted.notes = vec!["replica 1 on cuda:1: 3 items <fast>".into()];
        let html = render(&[noted]);
        assert!(
            html.contains(
                "<p>Run notes</p><ul><li>replica 1 on cuda:1: 3 items &lt;fast&gt;</li></ul>"
            ),
            "{html}"
        );
    }

    #[test]
    fn empty_chart_says_so() {
        let svg = chart(
            "t",
            &[Group {
                label: "x".into(),
                bars: vec![Some(Bar {
                    value: None,
                    interval: None,
                    text: "n/a".into(),
                    note: "n=0".into(),
                })],
            }],
        );
        assert!(svg.contains("data-marks=\"0\""));
        assert!(svg.contains("no values to draw"));
        // The message has the space above the rows to itself: the first row's text starts
        // below it (the message's baseline is 16, a 12 px font).
        let first_row_y: f64 = svg
            .split("class=\"label\" x=\"222.0\" y=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|y| y.parse().ok())
            .expect("a row label");
        assert!(first_row_y - 12.0 > 16.0 + 4.0, "row at {first_row_y}");
    }

    #[test]
    fn long_labels_take_two_lines_and_stay_apart() {
        let long =
            |p: usize| format!("answerability_classification · baseline_errordetection_prompt_{p}");
        let lines: Vec<Vec<String>> = (1..=4).map(|p| label_lines(&long(p))).collect();
        for l in &lines {
            assert_eq!(l.len(), 2, "{l:?}");
            assert!(l.iter().all(|s| s.chars().count() <= LABEL_CHARS), "{l:?}");
        }
        let shown: std::collections::BTreeSet<&Vec<String>> = lines.iter().collect();
        assert_eq!(shown.len(), 4, "{lines:?}");
        assert_eq!(label_lines("short"), vec!["short".to_string()]);
        // A line still too long keeps its start and its end.
        let cut = middle_cut("abcdefghijklmnopqrstuvwxyz0123456789_prompt_3", LABEL_CHARS);
        assert_eq!(cut.chars().count(), LABEL_CHARS);
        assert!(
            cut.starts_with("abcdefghijklmnop") && cut.ends_with("prompt_3"),
            "{cut}"
        );
    }

    /// Labels break between words only: at a space or after a separator, never inside a word
    /// ("orde / r", "(consi / stency)" were seen); one without such a place stays one line.
    #[test]
    fn long_labels_break_between_words() {
        let words = "both orders agree with each other (consistency)";
        assert_eq!(
            label_lines(words),
            ["both orders agree with each other", "(consistency)"]
        );
        let path = "checklist_entries_of_the_first_judge_in_order";
        let l = label_lines(path);
        assert_eq!(l.concat(), path, "{l:?}");
        assert!(l[0].ends_with('_'), "{l:?}");
        let word = "a".repeat(LABEL_CHARS + 5);
        assert_eq!(label_lines(&word), [middle_cut(&word, LABEL_CHARS)]);
        for label in [words, path] {
            for line in label_lines(label) {
                assert!(line.chars().count() <= LABEL_CHARS, "{line}");
            }
        }
    }

    /// κ charts have κ's own axis: −1 to 1, whatever the values, bars from 0 (leftwards for a
    /// negative κ), the interval's ends clipped to the axis.
    #[test]
    fn kappa_charts_use_their_own_axis() {
        let bar = |v: f64, lo: f64, hi: f64| Bar {
            value: Some(v),
            interval: Some((lo, hi)),
            text: format!("{v}"),
            note: String::new(),
        };
        let groups = vec![
            Group {
                label: "a".into(),
                bars: vec![Some(bar(0.75, 0.306, 1.194))],
            },
            Group {
                label: "b".into(),
                bars: vec![Some(bar(-0.25, -0.5, 0.0))],
            },
        ];
        // The values' own axis would be 0–100 here (1.194 > 1).
        assert_eq!(Axis::of(&groups).max, 100.0);
        let svg = chart_on("κ", &groups, Axis::KAPPA);
        let ticks: Vec<&str> = svg
            .split("class=\"tick\"")
            .skip(1)
            .map(|t| t.split('>').nth(1).unwrap().split('<').next().unwrap())
            .collect();
        assert_eq!(ticks, ["-1.00", "-0.50", "0.00", "0.50", "1.00"]);
        // The plot runs from 230 to 590: 0 at 410; 0.75 reaches 545, -0.25 starts at 365.
        assert!(svg.contains(r#"<rect class="bar" x="410.0""#), "{svg}");
        assert!(svg.contains(r#"width="135.0""#), "{svg}");
        assert!(svg.contains(r#"<rect class="bar" x="365.0""#), "{svg}");
        assert!(svg.contains(r#"width="45.0""#), "{svg}");
    }

    #[test]
    fn axis_is_proportion_percent_or_rounded() {
        let g = |v: f64| {
            vec![Group {
                label: "x".into(),
                bars: vec![Some(Bar {
                    value: Some(v),
                    interval: None,
                    text: v.to_string(),
                    note: String::new(),
                })],
            }]
        };
        assert_eq!(axis_max(&g(0.7)), 1.0);
        assert_eq!(axis_max(&g(70.0)), 100.0);
        assert_eq!(axis_max(&g(340.0)), 400.0);
    }

    #[test]
    fn results_json_with_string_cells_from_older_runs_still_draws() {
        // A Fennec run's results.json as written before cells were typed.
        let old = r#"{
  "protocol": "fennec",
  "models": [{"role": "candidate/0", "name": "m", "sha256": "ab"}],
  "items": 4, "completed": 4, "samples": 8, "failed": [],
  "metrics": [{"name": "accuracy", "interval": {"value": 0.625, "low": 0.25, "high": 1.0},
               "n": 4, "unscored": 0, "failed": 0}],
  "tables": [{"id": "fennec_single", "title": "Single-verdict accuracy (%)",
              "columns": ["group", "accuracy", "n", "unscored"],
              "rows": [["Code", "62.50", "4", "0"], ["Overall", "NaN", "0", "0"]]}]
}"#;
        let results: RunResults = serde_json::from_str(old).unwrap();
        assert_eq!(results.results.tables[0].rows[0][1], Cell::num(62.5, 2));
        let html = render(&[ReportRun::new(results, None)]);
        assert!(html.contains("62.50 · n=4 · unscored 0"), "{html}");
        assert!(
            html.contains("<td>Code</td><td>62.50</td><td>4</td>"),
            "{html}"
        );
        assert!(html.contains("<td>NaN</td>"), "{html}");
    }
}
