//! The one place numbers become text for people: table cells (the `Display` of
//! [`Cell`]) and metrics with their intervals ([`metric_value`]), written alike in
//! `report.md`, `report.html` and CSV files. Each output format then only escapes the text
//! ([`markdown`], [`html`], [`write_csv`]).
//!
//! This module decides how many decimals nothing has: a cell carries its own, a metric gets
//! two from 10 up and four below (percentages and proportions alike stay readable). It does
//! not lay out tables or pages; `markdown.rs` and `html.rs` do.

use std::fmt;

use crate::bench::stats::Interval;
use crate::bench::table::{Cell, Table};

/// `x` with `decimals` decimals; `n/a` when it is not a finite number.
pub fn number(x: f64, decimals: u8) -> String {
    if x.is_finite() {
        format!("{x:.*}", usize::from(decimals))
    } else {
        "n/a".to_string()
    }
}

/// The decimals of a metric's value and interval: 2 when the largest of them is at least 10
/// (FB-Bench's and RefuteBench's 0–100 scores), else 4 (proportions).
pub fn metric_decimals(i: &Interval) -> u8 {
    let top = [i.value, i.low, i.high]
        .into_iter()
        .filter(|x| x.is_finite())
        .fold(0.0f64, |m, x| m.max(x.abs()));
    if top >= 10.0 {
        2
    } else {
        4
    }
}

/// A metric's value and interval as a cell (`60.00 [55.00, 65.00]`).
pub fn metric_value(i: &Interval) -> Cell {
    Cell::Interval {
        value: i.value,
        low: i.low,
        high: i.high,
        decimals: metric_decimals(i),
    }
}

/// A metric's interval alone (`[55.00, 65.00]`), with the decimals of [`metric_value`].
pub fn metric_interval(i: &Interval) -> String {
    let d = metric_decimals(i);
    format!("[{}, {}]", number(i.low, d), number(i.high, d))
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Text(t) => f.write_str(t),
            Cell::Int(n) => write!(f, "{n}"),
            Cell::Num { value, decimals } => f.write_str(&number(*value, *decimals)),
            Cell::Interval {
                value,
                low,
                high,
                decimals,
            } => {
                let d = *decimals;
                if value.is_finite() {
                    write!(
                        f,
                        "{} [{}, {}]",
                        number(*value, d),
                        number(*low, d),
                        number(*high, d)
                    )
                } else {
                    f.write_str("n/a")
                }
            }
            Cell::Float(x) => f.write_str(&shortest(*x)),
            Cell::Empty => Ok(()),
        }
    }
}

/// Text for a Markdown table cell: `|` and `\` escaped, line breaks as spaces.
pub fn markdown(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace("\r\n", " ")
        .replace(['\n', '\r'], " ")
}

/// Text for HTML and SVG, escaped.
pub fn html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `table` as CSV: its columns, then its rows, with CRLF line ends (as FB-Bench's published
/// tables have).
pub fn write_csv(out: impl std::io::Write, table: &Table) -> csv::Result<()> {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(out);
    w.write_record(&table.columns)?;
    for row in &table.rows {
        w.write_record(row.iter().map(Cell::to_string))?;
    }
    w.flush()?;
    Ok(())
}

/// A float as Python prints it and FB-Bench's published CSVs have it: the shortest
/// round-trip digits, capped at 16 significant digits (then as C `%.16g`): `74.24`, `49`,
/// `-1.240000000000009`, `-2.390000000000001` (shortest: `-2.3900000000000006`).
pub fn shortest(x: f64) -> String {
    let shortest = format!("{x}");
    let significant = shortest
        .trim_start_matches('-')
        .replace('.', "")
        .trim_start_matches('0')
        .trim_end_matches('0')
        .len();
    if x.is_finite() && significant <= 16 && x.abs() < 1e16 && (x == 0.0 || x.abs() >= 1e-4) {
        shortest
    } else {
        g16(x)
    }
}

/// C's `%.16g`: 16 significant digits, trailing zeros dropped.
fn g16(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    if x == 0.0 {
        return "0".into();
    }
    let sci = format!("{x:.15e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if !(-4..16).contains(&exp) {
        let m = trim(format!("{}.{}", &digits[..1], &digits[1..]));
        let e = if exp < 0 {
            format!("-{:02}", -exp)
        } else {
            format!("+{exp:02}")
        };
        return format!("{sign}{m}e{e}");
    }
    let body = if exp >= 0 {
        let point = exp as usize + 1;
        format!("{}.{}", &digits[..point], &digits[point..])
    } else {
        format!("0.{}{}", "0".repeat((-exp - 1) as usize), digits)
    };
    format!("{sign}{}", trim(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(cells: &[Cell]) -> Vec<String> {
        cells.iter().map(Cell::to_string).collect()
    }

    #[test]
    fn cells_print_with_their_decimals() {
        let cells = [
            Cell::from("a|b"),
            Cell::Int(-3),
            Cell::num(54.9568, 2),
            Cell::num(f64::NAN, 1),
            Cell::Interval {
                value: 50.0,
                low: 25.0,
                high: 75.0,
                decimals: 2,
            },
            Cell::Interval {
                value: f64::NAN,
                low: f64::NAN,
                high: f64::NAN,
                decimals: 2,
            },
            Cell::Float(74.24),
            Cell::Float(49.0),
            Cell::Empty,
        ];
        assert_eq!(
            strings(&cells),
            [
                "a|b",
                "-3",
                "54.96",
                "n/a",
                "50.00 [25.00, 75.00]",
                "n/a",
                "74.24",
                "49",
                ""
            ]
        );
    }

    #[test]
    fn the_same_table_has_the_same_numbers_in_markdown_html_and_csv() {
        let table = Table {
            id: "t".into(),
            title: "T".into(),
            columns: ["group", "n", "share", "rate", "score"]
                .map(String::from)
                .to_vec(),
            rows: vec![vec![
                Cell::from("x<y"),
                Cell::Int(7),
                Cell::num(0.123456, 4),
                Cell::Interval {
                    value: 12.345,
                    low: 10.0,
                    high: 14.5,
                    decimals: 2,
                },
                Cell::Float(-1.240000000000009),
            ]],
        };
        let run = crate::store::run_results::RunResults {
            protocol: "toy".into(),
            models: vec![],
            items: 1,
            completed: 1,
            samples: 1,
            skipped_steps: 0,
            failed: vec![],
            results: crate::bench::BenchResults {
                metrics: vec![],
                tables: vec![table.clone()],
            },
        };
        let md = super::super::markdown::render(&run, &[]);
        let page = super::super::html::render(&[super::super::html::ReportRun::new(run, None)]);
        let mut csv = Vec::new();
        write_csv(&mut csv, &table).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        assert_eq!(
            csv,
            "group,n,share,rate,score\r\nx<y,7,0.1235,\"12.35 [10.00, 14.50]\",-1.240000000000009\r\n"
        );
        assert!(
            md.contains("| x<y | 7 | 0.1235 | 12.35 [10.00, 14.50] | -1.240000000000009 |"),
            "{md}"
        );
        assert!(
            page.contains(
                "<td>x&lt;y</td><td>7</td><td>0.1235</td><td>12.35 [10.00, 14.50]</td>\
                 <td>-1.240000000000009</td>"
            ),
            "{page}"
        );
    }

    #[test]
    fn metrics_get_two_decimals_from_ten_up_and_four_below() {
        let i = |value, low, high| Interval { value, low, high };
        assert_eq!(
            metric_value(&i(60.0, 55.0, 65.0)).to_string(),
            "60.00 [55.00, 65.00]"
        );
        assert_eq!(
            metric_value(&i(9.5, 5.0, 14.0)).to_string(),
            "9.50 [5.00, 14.00]"
        );
        assert_eq!(metric_interval(&i(0.5, 0.25, f64::NAN)), "[0.2500, n/a]");
        assert_eq!(number(f64::INFINITY, 2), "n/a");
    }

    #[test]
    fn floats_print_like_the_published_csv() {
        let cases = [
            (74.24, "74.24"),
            (49.0, "49"),
            (74.24 - 75.48, "-1.240000000000009"),
            (72.03 - 74.42, "-2.390000000000001"),
            (48.14 - 67.45, "-19.31"),
            (0.0001234, "0.0001234"),
            (1e20, "1e+20"),
        ];
        for (x, want) in cases {
            assert_eq!(shortest(x), want, "{x}");
        }
        assert_eq!(g16(74.24), "74.23999999999999");
    }
}
