//! The authors' published score tables, read back and compared with Candor's. The authors
//! publish them as `.xlsx` workbooks (`data/feedback-benchmark/model_analysis/gpt-4o-2024-08-06/`
//! at each dataset version's commit; the data root holds them as
//! `fbbench/tables/<version>_<table>.xlsx`): the overall table is one sheet with a row per
//! model, each per-category table has one sheet per model, named after it. Both read into a
//! [`Table`] shaped as [`super::score::published_tables`] makes it (a `model` column first, then
//! the authors' columns), numbers written as the shortest text that reads back as the same
//! float, as Candor writes its own. A CSV of the same shape (a local copy's export) is read
//! when no workbook is there. Not responsible for fetching the files (`store::data`) nor for
//! scoring.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use calamine::{Data, Reader, Xlsx};

use super::data::{FbBenchError, Version};
use crate::bench::table::{table_id, texts, Cell, Table};

/// The five tables, by identifier (the authors' file names), in the order
/// [`super::score::published_tables`] returns them.
pub const TABLES: [&str; 5] = [
    table_id::FBBENCH_OVERALL,
    table_id::FBBENCH_PER_TASK,
    table_id::FBBENCH_PER_ERROR,
    table_id::FBBENCH_PER_FEEDBACK_CORRECT,
    table_id::FBBENCH_PER_FEEDBACK_ANTISYCO,
];

/// `<dir>/<version>_<id>.<ext>` (`dir` is the data root's `fbbench/tables`).
pub fn table_path(dir: &Path, version: Version, id: &str, ext: &str) -> PathBuf {
    let v = match version {
        Version::V1 => "v1",
        Version::V3 => "v3",
    };
    dir.join(format!("{v}_{id}.{ext}"))
}

/// The published tables of `version` found in `dir`, each from its `.xlsx`, else its `.csv`;
/// `None` when any of the five is in neither form (nothing to compare with).
pub fn load(dir: &Path, version: Version) -> Result<Option<Vec<(PathBuf, Table)>>, FbBenchError> {
    let mut out = Vec::new();
    for id in TABLES {
        let (xlsx, csv) = (
            table_path(dir, version, id, "xlsx"),
            table_path(dir, version, id, "csv"),
        );
        let table = if xlsx.is_file() {
            read_xlsx(&xlsx, id)?
        } else if csv.is_file() {
            read_csv(&csv, id)?
        } else {
            return Ok(None);
        };
        out.push((if xlsx.is_file() { xlsx } else { csv }, table));
    }
    Ok(Some(out))
}

/// One published workbook as a [`Table`] with identifier `id`.
pub fn read_xlsx(path: &Path, id: &str) -> Result<Table, FbBenchError> {
    let file = std::fs::File::open(path).map_err(|source| FbBenchError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_xlsx(std::io::BufReader::new(file), id).map_err(|(sheet, message)| match sheet {
        Some(member) => FbBenchError::Member {
            path: path.to_path_buf(),
            member,
            message,
        },
        None => FbBenchError::Layout {
            path: path.to_path_buf(),
            message,
        },
    })
}

/// [`read_xlsx`] of bytes; an error names the sheet when one is at fault.
pub fn parse_xlsx<R: Read + Seek>(reader: R, id: &str) -> Result<Table, (Option<String>, String)> {
    let mut book = Xlsx::new(reader).map_err(|e| (None, format!("not a readable .xlsx: {e}")))?;
    let names = book.sheet_names();
    let mut sheets = Vec::new();
    for name in &names {
        let range = book
            .worksheet_range(name)
            .map_err(|e| (Some(name.clone()), e.to_string()))?;
        if range.start().is_some_and(|s| s != (0, 0)) {
            return Err((Some(name.clone()), "the table does not start at A1".into()));
        }
        let rows: Vec<Vec<String>> = range
            .rows()
            .map(|r| r.iter().map(cell_text).collect())
            .collect();
        sheets.push((name.clone(), rows));
    }
    let Some((first, first_rows)) = sheets.first() else {
        return Err((None, "no sheet".into()));
    };
    let Some(header) = first_rows.first() else {
        return Err((Some(first.clone()), "no header row".into()));
    };
    if id == table_id::FBBENCH_OVERALL {
        // One sheet, a model per row; its first column (`Model`, `Model_name`) is the model.
        if sheets.len() != 1 {
            return Err((None, format!("{} sheets, expected one", sheets.len())));
        }
        let mut columns = header.clone();
        columns[0] = "model".into();
        return Ok(table(id, columns, first_rows[1..].to_vec()));
    }
    // A sheet per model, each with the same header.
    let mut columns = vec!["model".to_string()];
    columns.extend(header.iter().cloned());
    let mut rows = Vec::new();
    for (model, sheet) in &sheets {
        if sheet.first() != Some(header) {
            return Err((
                Some(model.clone()),
                format!("header {:?}, expected {header:?}", sheet.first()),
            ));
        }
        for r in &sheet[1..] {
            let mut row = vec![model.clone()];
            row.extend(r.iter().cloned());
            rows.push(row);
        }
    }
    Ok(table(id, columns, rows))
}

/// A cell as text: numbers as the shortest text that reads back as the same float (`74.24`
/// for the workbook's `74.23999999999999`, `49` for `49`), an empty cell as `""` (the tables
/// leave a score of exactly 0 empty).
fn cell_text(d: &Data) -> String {
    match d {
        Data::Empty => String::new(),
        Data::Int(i) => i.to_string(),
        Data::Float(f) => f.to_string(),
        other => other.to_string(),
    }
}

/// A published table: its cells as the text the file spells them (compared as text).
fn table(id: &str, columns: Vec<String>, rows: Vec<Vec<String>>) -> Table {
    Table {
        id: id.to_string(),
        title: id.to_string(),
        columns,
        rows: rows
            .into_iter()
            .map(|r| r.into_iter().map(Cell::Text).collect())
            .collect(),
    }
}

/// A CSV of the shape [`read_xlsx`] returns (a header row, then the rows).
pub fn read_csv(path: &Path, id: &str) -> Result<Table, FbBenchError> {
    let layout = |e: csv::Error| FbBenchError::Layout {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut r = csv::Reader::from_path(path).map_err(layout)?;
    let columns = r
        .headers()
        .map_err(layout)?
        .iter()
        .map(String::from)
        .collect();
    let rows = r
        .records()
        .map(|rec| rec.map(|rec| rec.iter().map(String::from).collect()))
        .collect::<Result<_, _>>()
        .map_err(layout)?;
    Ok(table(id, columns, rows))
}

/// How a table of Candor's matches a published one, over the published rows of the models
/// Candor's table has and the value columns both have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Models compared (rows of Candor's table found in the published one).
    pub models: usize,
    /// Cells compared, and those identical as text.
    pub cells: usize,
    pub identical: usize,
    /// The models Candor scored that the published table does not list.
    pub unpublished: Vec<String>,
    /// `"<labels> <column>: published X, Candor Y"` for each differing or missing cell.
    pub differing: Vec<String>,
}

/// Compares Candor's `ours` with the `published` table of the same identifier, keyed by the
/// label columns (the model, and the category of a per-category table).
pub fn compare(ours: &Table, published: &Table) -> Comparison {
    let labels = if ours.id == table_id::FBBENCH_OVERALL {
        1
    } else {
        2
    };
    let theirs: BTreeMap<Vec<String>, &Vec<Cell>> = published
        .rows
        .iter()
        .filter(|r| r.len() >= labels)
        .map(|r| (texts(&r[..labels]), r))
        .collect();
    let listed: BTreeSet<String> = published.rows.iter().map(|r| r[0].to_string()).collect();
    let mut c = Comparison::default();
    let mut seen = BTreeSet::new();
    for row in ours.rows.iter().filter(|r| r.len() >= labels) {
        let model = row[0].to_string();
        if !listed.contains(&model) {
            if seen.insert(model.clone()) {
                c.unpublished.push(model);
            }
            continue;
        }
        if seen.insert(model) {
            c.models += 1;
        }
        let label = texts(&row[..labels]);
        let pub_row = theirs.get(&label).copied();
        for (j, name) in ours.columns.iter().enumerate().skip(labels) {
            let Some(i) = published.columns.iter().position(|p| p == name) else {
                continue;
            };
            c.cells += 1;
            let mine = row.get(j).map_or(String::new(), Cell::to_string);
            let other = pub_row.and_then(|r| r.get(i)).map(Cell::to_string);
            if other.as_deref() == Some(mine.as_str()) {
                c.identical += 1;
            } else {
                c.differing.push(format!(
                    "{} {name}: published {}, Candor {mine:?}",
                    label.join(" / "),
                    other.map_or("no row".to_string(), |o| format!("{o:?}"))
                ));
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A minimal workbook: `sheets` as (name, rows of cells), a cell `n:<v>` a number,
    /// `""` an empty cell, anything else an inline string.
    fn workbook(sheets: &[(&str, &[&[&str]])]) -> Vec<u8> {
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        let mut put = |name: &str, text: String| {
            zip.start_file(name, opts).unwrap();
            zip.write_all(text.as_bytes()).unwrap();
        };
        let ns = "http://schemas.openxmlformats.org";
        let mut types = String::new();
        let (mut list, mut rels) = (String::new(), String::new());
        for (k, (name, rows)) in sheets.iter().enumerate() {
            let n = k + 1;
            types += &format!(
                r#"<Override PartName="/xl/worksheets/sheet{n}.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>"#
            );
            list += &format!(r#"<sheet name="{name}" sheetId="{n}" r:id="rId{n}"/>"#);
            rels += &format!(
                r#"<Relationship Id="rId{n}" Type="{ns}/officeDocument/2006/relationships/worksheet" Target="/xl/worksheets/sheet{n}.xml"/>"#
            );
            let mut data = String::new();
            for (i, row) in rows.iter().enumerate() {
                data += &format!(r#"<row r="{}">"#, i + 1);
                for (j, v) in row.iter().enumerate() {
                    let r = format!("{}{}", (b'A' + j as u8) as char, i + 1);
                    if let Some(num) = v.strip_prefix("n:") {
                        data += &format!(r#"<c r="{r}" t="n"><v>{num}</v></c>"#);
                    } else if !v.is_empty() {
                        data += &format!(r#"<c r="{r}" t="inlineStr"><is><t>{v}</t></is></c>"#);
                    }
                }
                data += "</row>";
            }
            put(
                &format!("xl/worksheets/sheet{n}.xml"),
                format!(
                    r#"<worksheet xmlns="{ns}/spreadsheetml/2006/main"><sheetData>{data}</sheetData></worksheet>"#
                ),
            );
        }
        put(
            "[Content_Types].xml",
            format!(
                r#"<Types xmlns="{ns}/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>{types}</Types>"#
            ),
        );
        put(
            "_rels/.rels",
            format!(
                r#"<Relationships xmlns="{ns}/package/2006/relationships"><Relationship Id="rId1" Type="{ns}/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/></Relationships>"#
            ),
        );
        put(
            "xl/workbook.xml",
            format!(
                r#"<workbook xmlns="{ns}/spreadsheetml/2006/main" xmlns:r="{ns}/officeDocument/2006/relationships"><sheets>{list}</sheets></workbook>"#
            ),
        );
        put(
            "xl/_rels/workbook.xml.rels",
            format!(
                r#"<Relationships xmlns="{ns}/package/2006/relationships">{rels}</Relationships>"#
            ),
        );
        zip.finish().unwrap().into_inner()
    }

    fn strings(rows: &[&[&str]]) -> Vec<Vec<Cell>> {
        rows.iter()
            .map(|r| r.iter().map(|&c| Cell::from(c)).collect())
            .collect()
    }

    #[test]
    fn overall_sheet_reads_with_the_model_column_and_shortest_numbers() {
        let book = workbook(&[(
            "Sheet1",
            &[
                &["Model", "Error Correction", "Overall"],
                &["a", "n:74.23999999999999", "n:49"],
                &["b", "", "n:-1.240000000000009"],
            ],
        )]);
        let t = parse_xlsx(std::io::Cursor::new(book), "overall_score").unwrap();
        assert_eq!(t.id, "overall_score");
        assert_eq!(t.columns, ["model", "Error Correction", "Overall"]);
        assert_eq!(
            t.rows,
            strings(&[&["a", "74.24", "49"], &["b", "", "-1.240000000000009"]])
        );
    }

    #[test]
    fn per_category_sheets_are_models() {
        let header: &[&str] = &["task_type", "all_avg_score"];
        let book = workbook(&[
            (
                "m1",
                &[
                    header,
                    &["Coding", "n:80.25"],
                    &["Knowledge Q&amp;A", "n:60"],
                ],
            ),
            ("m2", &[header, &["Coding", "n:1.5"]]),
        ]);
        let t = parse_xlsx(std::io::Cursor::new(book), "per_task_score").unwrap();
        assert_eq!(t.columns, ["model", "task_type", "all_avg_score"]);
        assert_eq!(
            t.rows,
            strings(&[
                &["m1", "Coding", "80.25"],
                &["m1", "Knowledge Q&A", "60"],
                &["m2", "Coding", "1.5"]
            ])
        );
        let bad = workbook(&[("m1", &[header]), ("m2", &[&["error_type", "x"]])]);
        let (sheet, msg) = parse_xlsx(std::io::Cursor::new(bad), "per_task_score").unwrap_err();
        assert_eq!(sheet.as_deref(), Some("m2"));
        assert!(msg.contains("header"), "{msg}");
        let (sheet, msg) =
            parse_xlsx(std::io::Cursor::new(b"not a zip".to_vec()), "overall_score").unwrap_err();
        assert_eq!(sheet, None);
        assert!(msg.contains("not a readable .xlsx"), "{msg}");
    }

    #[test]
    fn compare_counts_identical_cells_of_the_models_scored() {
        let t = |rows: &[&[&str]]| {
            let text = |r: &[&str]| r.iter().map(|c| c.to_string()).collect::<Vec<_>>();
            table(
                "overall_score",
                text(&["model", "x", "y"]),
                rows.iter().map(|r| text(r)).collect(),
            )
        };
        let published = t(&[&["a", "1", "2"], &["b", "3", ""], &["c", "5", "6"]]);
        let ours = t(&[&["a", "1", "2"], &["b", "3", "0.01"], &["mine", "9", "9"]]);
        let c = compare(&ours, &published);
        assert_eq!((c.models, c.cells, c.identical), (2, 4, 3));
        assert_eq!(c.unpublished, ["mine"]);
        assert_eq!(c.differing, [r#"b y: published "", Candor "0.01""#]);
    }
}
