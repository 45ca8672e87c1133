//! Paired comparisons between candidates scored on the same items (`candor compare`, and the
//! section `candor report` adds when several runs share a protocol and items): for every
//! headline metric and every pair of candidates, the difference over the items both scored,
//! its paired bootstrap 95% interval, a paired test of the difference as the metric weighs
//! its items (exact McNemar for binary outcomes that weigh the same, else the sign-flip
//! permutation test with the metric's own weights, stratified by its groups), p-values
//! adjusted with Holm across every comparison of the report, the smallest difference the items could detect and, for a difference that is
//! not significant, roughly how many items would detect it. Rendered as Markdown, HTML and
//! JSON, each byte-identical for the same inputs and seed.
//!
//! The inputs are `item_scores.json` documents ([`crate::bench::item_scores`]); documents of
//! one protocol that differ in data, scoring or items are refused with the reason. The
//! statistics are [`crate::stats::paired`]'s; this file pairs items, names and formats.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write;

use serde::Serialize;

use super::format::{html as esc, markdown as md, number};
use crate::bench::item_scores::{CandidateScores, ItemScores, MetricItems};
use crate::stats::paired::{self, Method, Paired};

/// Salt between a comparison's bootstrap stream and its permutation stream.
const PERMUTATION_SALT: u64 = 0x5851_F42D_4C95_7F2D;
/// The significance level of "significant" (after Holm).
pub const ALPHA: f64 = 0.05;

/// One document and how to name it in messages (its path).
#[derive(Debug, Clone)]
pub struct Source {
    pub label: String,
    pub scores: ItemScores,
}

/// Seed and draw counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    pub seed: u64,
    pub resamples: usize,
    pub permutations: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 0,
            resamples: paired::RESAMPLES,
            permutations: paired::PERMUTATIONS,
        }
    }
}

/// One comparison: candidate `a` against `b` on one metric.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub protocol: String,
    pub metric: String,
    pub a: String,
    pub b: String,
    /// Items both scored.
    pub n: usize,
    /// Items of the metric that one or both left unscored or failed.
    pub left_out: usize,
    /// `a − b` over the `n` items, on the metric's scale.
    pub diff: f64,
    pub low: f64,
    pub high: f64,
    /// `mcnemar_exact`, `sign_flip_exact`, `sign_flip_normal` or `sign_flip_monte_carlo`.
    pub test: &'static str,
    /// The groups the metric averages over (the sign flip's strata; 1 for a plain mean).
    pub strata: usize,
    /// McNemar's discordant counts (only `a` succeeds, only `b` does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discordant: Option<(u64, u64)>,
    pub p: f64,
    pub p_holm: f64,
    /// Standard error of `diff`, and the smallest difference detectable with 80% power.
    pub se: f64,
    pub detectable: f64,
    /// For a difference not significant after Holm: roughly the items that would detect it.
    pub items_needed: Option<u64>,
    /// Decimals the numbers are shown with (1 on 0–100 scales, 3 on proportions).
    pub decimals: u8,
}

impl Comparison {
    /// The line a reader can quote: `A − B = +4.1 [1.2, 7.0], p = 0.006 (Holm), n = 412`.
    pub fn claim(&self) -> String {
        let d = self.decimals;
        let diff = if self.diff.is_finite() {
            format!("{:+.*}", usize::from(d), self.diff)
        } else {
            "n/a".to_string()
        };
        format!(
            "{} − {} = {diff} [{}, {}], p {} (Holm), n = {}",
            self.a,
            self.b,
            number(self.low, d),
            number(self.high, d),
            p_text(self.p_holm),
            self.n
        )
    }

    /// What stands beside the claim: the detectable difference, the items a non-significant
    /// difference would need.
    pub fn power_note(&self) -> String {
        let mut s = format!("detectable ±{}", number(self.detectable, self.decimals));
        if let Some(k) = self.items_needed {
            let _ = write!(
                s,
                "; ~{k} items would detect {}",
                number(self.diff.abs(), self.decimals)
            );
        } else if self.p < ALPHA && (self.p_holm >= ALPHA || self.p_holm.is_nan()) {
            s.push_str("; p < 0.05 alone, not after Holm");
        }
        s
    }
}

/// `= 0.006`, or `< 0.001`.
fn p_text(p: f64) -> String {
    if !p.is_finite() {
        "= n/a".to_string()
    } else if p < 0.001 {
        "< 0.001".to_string()
    } else {
        format!("= {p:.3}")
    }
}

/// Every comparison of a report, and the protocols whose documents could not be compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub seed: u64,
    pub resamples: usize,
    pub permutations: usize,
    pub comparisons: Vec<Comparison>,
    /// Why documents were not compared (one line each).
    pub refused: Vec<String>,
}

/// A candidate as compared: its name (with its document when another document has the same
/// name) and its values.
struct Entry<'a> {
    name: String,
    scores: &'a CandidateScores,
}

/// Why two documents of one protocol cannot be compared, if they cannot.
fn incompatible(a: &Source, b: &Source) -> Option<String> {
    let (x, y) = (&a.scores, &b.scores);
    if x.data != y.data {
        return Some(format!("different data ({:?} vs {:?})", x.data, y.data));
    }
    if x.scoring != y.scoring {
        return Some(format!(
            "scored otherwise ({:?} vs {:?})",
            x.scoring, y.scoring
        ));
    }
    let xs: BTreeSet<&String> = x.items.iter().collect();
    let ys: BTreeSet<&String> = y.items.iter().collect();
    if xs != ys {
        return Some(format!(
            "different items ({} vs {}; {} only in the first, {} only in the second)",
            xs.len(),
            ys.len(),
            xs.difference(&ys).count(),
            ys.difference(&xs).count()
        ));
    }
    None
}

/// Every paired comparison of the documents, Holm-adjusted together.
pub fn build(sources: &[Source], opts: &Options) -> Report {
    let mut protocols: Vec<&str> = Vec::new();
    for s in sources {
        if !protocols.contains(&s.scores.protocol.as_str()) {
            protocols.push(&s.scores.protocol);
        }
    }
    let mut comparisons = Vec::new();
    let mut refused = Vec::new();
    for protocol in protocols {
        let docs: Vec<&Source> = sources
            .iter()
            .filter(|s| s.scores.protocol == protocol)
            .collect();
        if let Some((b, why)) = docs[1..]
            .iter()
            .find_map(|b| incompatible(docs[0], b).map(|why| (b, why)))
        {
            refused.push(format!(
                "{protocol}: {} and {} cannot be compared: {why}",
                docs[0].label, b.label
            ));
            continue;
        }
        let mut entries: Vec<Entry> = Vec::new();
        for d in &docs {
            for c in &d.scores.candidates {
                entries.push(Entry {
                    name: c.name.clone(),
                    scores: c,
                });
            }
        }
        let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        let mut k = 0;
        for d in &docs {
            for _ in &d.scores.candidates {
                if names.iter().filter(|n| **n == entries[k].name).count() > 1 {
                    entries[k].name = format!("{} ({})", entries[k].name, d.label);
                }
                k += 1;
            }
        }
        let mut metrics: Vec<&str> = Vec::new();
        for e in &entries {
            for m in &e.scores.metrics {
                if !metrics.contains(&m.metric.as_str()) {
                    metrics.push(&m.metric);
                }
            }
        }
        for metric in metrics {
            for i in 0..entries.len() {
                for j in i + 1..entries.len() {
                    let find = |e: &Entry<'_>| {
                        e.scores
                            .metrics
                            .iter()
                            .find(|m| m.metric == metric)
                            .cloned()
                    };
                    if let (Some(ma), Some(mb)) = (find(&entries[i]), find(&entries[j])) {
                        comparisons.push(compare_pair(
                            protocol,
                            (&entries[i].name, &ma),
                            (&entries[j].name, &mb),
                            opts,
                        ));
                    }
                }
            }
        }
    }
    let adjusted = paired::holm(&comparisons.iter().map(|c| c.p).collect::<Vec<_>>());
    for (c, p) in comparisons.iter_mut().zip(adjusted) {
        c.p_holm = p;
        // More items would make a difference significant only where it is not even alone; one
        // that is significant alone but not after Holm is said to be so (power_note).
        if (p.is_nan() || p >= ALPHA) && (c.p.is_nan() || c.p >= ALPHA) {
            c.items_needed = paired::items_needed(c.n, c.se, c.diff);
        }
    }
    Report {
        seed: opts.seed,
        resamples: opts.resamples,
        permutations: opts.permutations,
        comparisons,
        refused,
    }
}

/// One pair on one metric (before Holm).
fn compare_pair(
    protocol: &str,
    (a, ma): (&str, &MetricItems),
    (b, mb): (&str, &MetricItems),
    opts: &Options,
) -> Comparison {
    let theirs: HashMap<&str, f64> = mb.values.iter().map(|v| (v.id.as_str(), v.value)).collect();
    let mut universe: BTreeSet<&str> = BTreeSet::new();
    for m in [ma, mb] {
        universe.extend(m.values.iter().map(|v| v.id.as_str()));
        universe.extend(m.left_out.iter().map(|l| l.id.as_str()));
    }
    let mut group_ids: BTreeMap<&str, usize> = BTreeMap::new();
    let common: Vec<(&str, f64)> = ma
        .values
        .iter()
        .filter_map(|v| {
            theirs
                .get(v.id.as_str())
                .map(|w| (v.group.as_str(), v.value - w))
        })
        .collect();
    for (g, _) in &common {
        group_ids.insert(g, 0);
    }
    for (k, v) in group_ids.values_mut().enumerate() {
        *v = k;
    }
    let pairs = Paired::new(
        common.iter().map(|c| c.1).collect(),
        common.iter().map(|c| group_ids[c.0]).collect(),
    );
    let seed = paired::seed_for(opts.seed, &format!("{protocol}/{}/{a}/{b}", ma.metric));
    let (low, high) = pairs.bootstrap(seed, opts.resamples);
    // McNemar tests the plain mean: only where every item weighs the same is that the
    // metric's difference. Otherwise (a macro average over groups of unequal size) the sign
    // flip of the weighted differences tests what is reported.
    let binary = ma.binary && mb.binary && pairs.equal_weights();
    let (test, discordant, t) = if binary {
        let plus = pairs.diffs().iter().filter(|d| **d > 0.0).count() as u64;
        let minus = pairs.diffs().iter().filter(|d| **d < 0.0).count() as u64;
        let t = paired::mcnemar_exact(plus, minus);
        ("mcnemar_exact", Some((plus, minus)), t)
    } else {
        let t = pairs.sign_flip(seed ^ PERMUTATION_SALT, opts.permutations);
        let name = match t.method {
            Method::Exact => "sign_flip_exact",
            Method::Normal => "sign_flip_normal",
            Method::MonteCarlo(_) => "sign_flip_monte_carlo",
        };
        (name, None, t)
    };
    let top = ma
        .values
        .iter()
        .chain(&mb.values)
        .fold(0.0f64, |m, v| m.max(v.value.abs()));
    let se = pairs.standard_error();
    Comparison {
        protocol: protocol.to_string(),
        metric: ma.metric.clone(),
        a: a.to_string(),
        b: b.to_string(),
        n: pairs.n(),
        left_out: universe.len() - pairs.n(),
        diff: pairs.mean(),
        low,
        high,
        test,
        strata: pairs.strata(),
        discordant,
        p: t.p,
        p_holm: f64::NAN,
        se,
        detectable: paired::min_detectable(se),
        items_needed: None,
        decimals: if top > 1.0 { 1 } else { 3 },
    }
}

fn test_text(c: &Comparison, permutations: usize) -> String {
    let flip = if c.strata > 1 {
        format!("sign flip weighted over {} strata", c.strata)
    } else {
        "sign flip".to_string()
    };
    match (c.test, c.discordant) {
        ("mcnemar_exact", Some((x, y))) => format!("McNemar exact ({x} vs {y} discordant)"),
        ("sign_flip_exact", _) => format!("{flip}, every pattern"),
        ("sign_flip_normal", _) => format!("{flip}, normal approximation"),
        _ => format!("{flip}, {permutations} permutations"),
    }
}

/// The rows of the comparison table, as text.
fn rows(r: &Report) -> Vec<[String; 7]> {
    r.comparisons
        .iter()
        .map(|c| {
            [
                c.protocol.clone(),
                c.metric.clone(),
                c.claim(),
                format!("{:.4}", c.p),
                test_text(c, r.permutations),
                c.left_out.to_string(),
                c.power_note(),
            ]
        })
        .collect()
}

const COLUMNS: [&str; 7] = [
    "protocol",
    "metric",
    "claim (A − B, paired bootstrap 95% interval, Holm-adjusted p, items both scored)",
    "p unadjusted",
    "test",
    "left out",
    "smallest detectable (80% power, α = 0.05) / items needed",
];

/// What the numbers are, in one paragraph (Markdown and HTML alike).
fn preamble(r: &Report) -> String {
    format!(
        "Each line compares two candidates over the items both scored (items unscored or \
         failed in either are left out and counted). Interval: paired bootstrap, {} \
         resamples; test: exact McNemar where each item's outcome is binary and every item \
         weighs the same in the metric, else the sign-flip permutation test of the \
         differences weighted as the metric weighs them (stratified by its groups; every sign \
         pattern up to 20 differing items, else its normal approximation, or random patterns \
         when asked); p adjusted with Holm across all {} comparisons; seed {}. \
         Significant: p < {ALPHA} after Holm.",
        r.resamples,
        r.comparisons.len(),
        r.seed
    )
}

/// The section as Markdown (`## Paired comparisons` and a table), empty when there is
/// nothing to compare or refuse.
pub fn markdown(r: &Report) -> String {
    if r.comparisons.is_empty() && r.refused.is_empty() {
        return String::new();
    }
    let mut s = format!("## Paired comparisons\n\n{}\n\n", preamble(r));
    for why in &r.refused {
        let _ = writeln!(s, "- not compared: {}", md(why));
    }
    if !r.refused.is_empty() {
        s.push('\n');
    }
    if !r.comparisons.is_empty() {
        let _ = writeln!(s, "| {} |", COLUMNS.map(md).join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(COLUMNS.len()));
        for row in rows(r) {
            let _ = writeln!(s, "| {} |", row.map(|c| md(&c)).join(" | "));
        }
        s.push('\n');
    }
    s
}

/// The section as HTML, empty when there is nothing to compare or refuse.
pub fn html(r: &Report) -> String {
    if r.comparisons.is_empty() && r.refused.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "<section><h2>Paired comparisons</h2>\n<p>{}</p>\n",
        esc(&preamble(r))
    );
    for why in &r.refused {
        let _ = writeln!(s, "<p class=\"refused\">not compared: {}</p>", esc(why));
    }
    if !r.comparisons.is_empty() {
        s.push_str("<table><tr>");
        for c in COLUMNS {
            let _ = write!(s, "<th>{}</th>", esc(c));
        }
        s.push_str("</tr>");
        for (row, c) in rows(r).iter().zip(&r.comparisons) {
            let mark = if c.p_holm < ALPHA {
                " class=\"sig\""
            } else {
                ""
            };
            let _ = write!(s, "<tr{mark}>");
            for cell in row {
                let _ = write!(s, "<td>{}</td>", esc(cell));
            }
            s.push_str("</tr>");
        }
        s.push_str("</table>\n");
    }
    s.push_str("</section>\n");
    s
}

/// The report as plain text for the terminal: per protocol and metric, one claim a line with
/// its detectable difference and test.
pub fn text(r: &Report) -> String {
    let mut s = String::new();
    let mut heading = (String::new(), String::new());
    for c in &r.comparisons {
        if heading != (c.protocol.clone(), c.metric.clone()) {
            heading = (c.protocol.clone(), c.metric.clone());
            let _ = writeln!(s, "{} {}:", c.protocol, c.metric);
        }
        let _ = writeln!(
            s,
            "  {}  ({}; {}; left out {})",
            c.claim(),
            c.power_note(),
            test_text(c, r.permutations),
            c.left_out
        );
    }
    let significant = r.comparisons.iter().filter(|c| c.p_holm < ALPHA).count();
    let _ = writeln!(
        s,
        "{} comparisons, {significant} significant at {ALPHA} after Holm (bootstrap {} \
         resamples, seed {})",
        r.comparisons.len(),
        r.resamples,
        r.seed
    );
    s
}

/// A self-contained page holding [`html`] (as `compare.html`).
pub fn page(r: &Report) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'\"><title>Candor paired comparisons</title><style>{STYLE}\
         </style></head><body>\n{}</body></html>\n",
        html(r)
    )
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#111827}\
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #e5e7eb;padding:2px 6px;text-align:left}\
tr.sig td:nth-child(3){font-weight:600}p.refused{color:#b91c1c}";

/// The report as JSON (pretty, final newline); a number that does not exist is `null`.
pub fn json(r: &Report) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(r).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The section for `candor report`'s page: the documents that runs carry, labelled.
pub fn report_section<'a>(docs: impl IntoIterator<Item = (&'a str, &'a ItemScores)>) -> String {
    let sources: Vec<Source> = docs
        .into_iter()
        .map(|(label, scores)| Source {
            label: label.to_string(),
            scores: scores.clone(),
        })
        .collect();
    html(&build(&sources, &Options::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::item_scores::{ItemValue, LeftOut};

    fn doc(name: &str, values: &[(f64, &str)], binary: bool) -> ItemScores {
        let ids: Vec<String> = (0..values.len()).map(|i| format!("i{i}")).collect();
        ItemScores {
            protocol: "toy".into(),
            data: "toy v1".into(),
            scoring: "rule=x".into(),
            items: ids.clone(),
            candidates: vec![CandidateScores {
                name: name.into(),
                metrics: vec![MetricItems {
                    metric: "score".into(),
                    binary,
                    values: ids
                        .iter()
                        .zip(values)
                        .filter(|(_, v)| v.0.is_finite())
                        .map(|(id, (v, g))| ItemValue {
                            id: id.clone(),
                            group: g.to_string(),
                            value: *v,
                        })
                        .collect(),
                    left_out: ids
                        .iter()
                        .zip(values)
                        .filter(|(_, v)| !v.0.is_finite())
                        .map(|(id, _)| LeftOut {
                            id: id.clone(),
                            reason: "unparseable".into(),
                        })
                        .collect(),
                }],
            }],
        }
    }

    fn src(label: &str, scores: ItemScores) -> Source {
        Source {
            label: label.into(),
            scores,
        }
    }

    #[test]
    fn binary_outcomes_use_mcnemar_and_left_out_items_are_counted() {
        // a wins on 9 items, b on 1, one tie, and item 11 unscored for b.
        let mut va: Vec<(f64, &str)> = vec![(1.0, "g"); 9];
        va.extend([(0.0, "g"), (1.0, "g"), (1.0, "g")]);
        let mut vb: Vec<(f64, &str)> = vec![(0.0, "g"); 9];
        vb.extend([(1.0, "g"), (1.0, "g"), (f64::NAN, "g")]);
        let r = build(
            &[src("x", doc("a", &va, true)), src("y", doc("b", &vb, true))],
            &Options::default(),
        );
        assert!(r.refused.is_empty());
        let c = &r.comparisons[0];
        assert_eq!((c.n, c.left_out, c.test), (11, 1, "mcnemar_exact"));
        assert_eq!(c.discordant, Some((9, 1)));
        assert!((c.p - 22.0 / 1024.0).abs() < 1e-15);
        assert_eq!(c.p_holm, c.p, "one comparison");
        assert!((c.diff - 8.0 / 11.0).abs() < 1e-15);
        assert_eq!(
            c.claim(),
            "a − b = +0.727 [0.364, 1.000], p = 0.021 (Holm), n = 11"
        );
        assert_eq!(c.items_needed, None, "significant");
        let again = build(
            &[src("x", doc("a", &va, true)), src("y", doc("b", &vb, true))],
            &Options::default(),
        );
        assert_eq!(json(&again), json(&r), "byte-identical");
        let md = markdown(&r);
        assert!(md.contains("| toy | score | a − b = +0.727"), "{md}");
        assert!(md.contains("McNemar exact (9 vs 1 discordant)"), "{md}");
        assert!(html(&r).contains("<tr class=\"sig\">"));
    }

    /// A binary metric averaged over groups of unequal size is tested with the metric's own
    /// weights, not McNemar's equal ones: group g1 (a wins both items, weight 1/4 each), group
    /// g2 (b wins 2 of 6 items, weight 1/12 each). McNemar (2 vs 2) would give p = 1 for a
    /// difference of +0.333; the weighted sign flip: 8 of the 16 patterns of ±1/4 ±1/4 ±1/12
    /// ±1/12 reach 1/3.
    #[test]
    fn binary_outcomes_over_unequal_groups_use_the_weighted_sign_flip() {
        let groups = ["g1", "g1", "g2", "g2", "g2", "g2", "g2", "g2"];
        let va: Vec<(f64, &str)> = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
            .into_iter()
            .zip(groups)
            .collect();
        let vb: Vec<(f64, &str)> = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
            .into_iter()
            .zip(groups)
            .collect();
        let r = build(
            &[src("x", doc("a", &va, true)), src("y", doc("b", &vb, true))],
            &Options::default(),
        );
        let c = &r.comparisons[0];
        assert!((c.diff - 1.0 / 3.0).abs() < 1e-15, "{c:?}");
        assert_eq!(
            (c.test, c.strata, c.discordant),
            ("sign_flip_exact", 2, None)
        );
        assert_eq!(c.p, 0.5);
        assert!(text(&r).contains("sign flip weighted over 2 strata, every pattern"));
    }

    #[test]
    fn graded_outcomes_use_the_sign_flip_and_holm_covers_every_comparison() {
        let vals = |k: f64| -> Vec<(f64, &'static str)> {
            (0..8)
                .map(|i| (k + (i % 3) as f64, if i < 4 { "g1" } else { "g2" }))
                .collect()
        };
        let r = build(
            &[
                src("x", doc("a", &vals(50.0), false)),
                src("y", doc("b", &vals(48.5), false)),
                src("z", doc("c", &vals(50.0), false)),
            ],
            &Options::default(),
        );
        assert_eq!(r.comparisons.len(), 3);
        let ab = &r.comparisons[0];
        assert_eq!(ab.test, "sign_flip_exact");
        // Every item +1.5: only the two extreme patterns of 8 reach it.
        assert_eq!(ab.p, 2.0 / 256.0);
        assert_eq!(ab.decimals, 1);
        let ac = &r.comparisons[1];
        assert_eq!((ac.diff, ac.p), (0.0, 1.0));
        // Holm over three: 3 · 2/256 for the smallest.
        assert!((ab.p_holm - 6.0 / 256.0).abs() < 1e-15);
        assert_eq!(ac.items_needed, None, "no difference to detect");
        assert!(ab
            .claim()
            .starts_with("a − b = +1.5 [1.5, 1.5], p = 0.023 (Holm), n = 8"));
    }

    #[test]
    fn documents_of_other_items_or_scoring_are_refused() {
        let a = doc("a", &[(1.0, "g"), (0.0, "g")], true);
        let mut b = doc("b", &[(1.0, "g"), (0.0, "g"), (1.0, "g")], true);
        let r = build(
            &[src("x", a.clone()), src("y", b.clone())],
            &Options::default(),
        );
        assert!(r.comparisons.is_empty());
        assert_eq!(
            r.refused,
            ["toy: x and y cannot be compared: different items (2 vs 3; 0 only in the first, 1 only in the second)"]
        );
        b = doc("b", &[(1.0, "g"), (0.0, "g")], true);
        b.scoring = "rule=y".into();
        let r = build(&[src("x", a.clone()), src("y", b)], &Options::default());
        assert!(r.refused[0].contains("scored otherwise (\"rule=x\" vs \"rule=y\")"));
        // The same name in two documents is told apart by the document.
        let r = build(&[src("x", a.clone()), src("y", a)], &Options::default());
        assert_eq!(r.comparisons[0].a, "a (x)");
        assert_eq!(r.comparisons[0].b, "a (y)");
    }
}
