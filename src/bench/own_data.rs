//! Users' own data files (`candor run fennec --pairs FILE`, `fbbench --items FILE`,
//! `realmistake --items FILE`): the checks every format shares. Each protocol's `data.rs`
//! turns a file into the same item structs its published set produces, so plans, scoring,
//! resume, cache, shards, merge and verify work unchanged; the file's path and sha256 are
//! recorded in the manifest like a published file's.
//!
//! A bad line is refused as `FILE:LINE: field \`x\`: what is wrong` (a missing field, a wrong
//! type, an unknown field, a bad value, a duplicate id); an empty file is refused too.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value};

use super::loader::{jsonl_lines, DataError};

/// Reads a user's file as text.
pub fn read(path: &Path) -> Result<String, DataError> {
    std::fs::read_to_string(path).map_err(|e| DataError::io(path, e))
}

/// A bad field on a line: `FILE:LINE: field \`x\`: message`.
pub fn field_error(path: &Path, line: usize, field: &str, message: impl AsRef<str>) -> DataError {
    DataError::line(path, line, format!("field `{field}`: {}", message.as_ref()))
}

/// One JSON object of a user's file and where it is.
#[derive(Debug)]
pub struct Record<'a> {
    pub path: &'a Path,
    /// 1-based line (of the object's first character).
    pub line: usize,
    pub object: Map<String, Value>,
}

impl Record<'_> {
    /// A bad field of this record.
    pub fn error(&self, field: &str, message: impl AsRef<str>) -> DataError {
        field_error(self.path, self.line, field, message)
    }

    /// Refuses any field outside `known` (a misspelt optional field would be ignored
    /// silently otherwise).
    pub fn only(&self, known: &[&str]) -> Result<(), DataError> {
        match self.object.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(self.error(
                k,
                format!("unknown field (the fields are {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// A required string field.
    pub fn text(&self, field: &str) -> Result<String, DataError> {
        self.opt_text(field)?
            .ok_or_else(|| self.error(field, "missing (a string is required)"))
    }

    /// An optional string field (`null` is absent).
    pub fn opt_text(&self, field: &str) -> Result<Option<String>, DataError> {
        match self.object.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.error(field, format!("expected a string, got {}", kind(v)))),
        }
    }

    /// The item's `id`: a string or an integer, else the line number.
    pub fn id(&self) -> Result<String, DataError> {
        match self.object.get("id") {
            None | Some(Value::Null) => Ok(self.line.to_string()),
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::Number(n)) if n.is_u64() || n.is_i64() => Ok(n.to_string()),
            Some(v) => Err(self.error(
                "id",
                format!("expected a non-empty string or an integer, got {}", kind(v)),
            )),
        }
    }
}

/// The JSON type of a value, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn object<'a>(path: &'a Path, line: usize, v: Value) -> Result<Record<'a>, DataError> {
    match v {
        Value::Object(object) => Ok(Record { path, line, object }),
        other => Err(DataError::line(
            path,
            line,
            format!("expected a JSON object, got {}", kind(&other)),
        )),
    }
}

/// The objects of a JSONL text, one per non-blank line; an empty file is refused.
pub fn jsonl_records<'a>(text: &str, path: &'a Path) -> Result<Vec<Record<'a>>, DataError> {
    let mut out = Vec::new();
    for (n, line) in jsonl_lines(text) {
        let v: Value = serde_json::from_str(line)
            .map_err(|e| DataError::line(path, n, format!("not JSON: {e}")))?;
        out.push(object(path, n, v)?);
    }
    non_empty(out, path)
}

/// The objects of a JSON array (each with the line it starts on), or of JSONL text when the
/// file does not start with `[`; an empty file or array is refused.
pub fn array_or_jsonl_records<'a>(
    text: &str,
    path: &'a Path,
) -> Result<Vec<Record<'a>>, DataError> {
    let trimmed = text.trim_start();
    if !trimmed.starts_with('[') {
        return jsonl_records(text, path);
    }
    let line_at = |offset: usize| text[..offset].matches('\n').count() + 1;
    let skip_ws = |mut p: usize| {
        while text[p..].starts_with(|c: char| c.is_whitespace()) {
            p += text[p..].chars().next().map_or(1, char::len_utf8);
        }
        p
    };
    let mut p = skip_ws(text.len() - trimmed.len() + 1);
    let mut out = Vec::new();
    if text[p..].starts_with(']') {
        return non_empty(out, path);
    }
    loop {
        let start = p;
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        let v = match stream.next() {
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                return Err(DataError::line(
                    path,
                    line_at(start) + e.line() - 1,
                    format!("not JSON: {e}"),
                ))
            }
            None => return Err(DataError::line(path, line_at(start), "unterminated array")),
        };
        out.push(object(path, line_at(start), v)?);
        p = skip_ws(start + stream.byte_offset());
        match text[p..].chars().next() {
            Some(',') => p = skip_ws(p + 1),
            Some(']') if text[p + 1..].trim().is_empty() => break,
            _ => {
                return Err(DataError::line(
                    path,
                    line_at(p),
                    "expected `,` or the closing `]` of the array",
                ))
            }
        }
    }
    non_empty(out, path)
}

fn non_empty<'a>(records: Vec<Record<'a>>, path: &Path) -> Result<Vec<Record<'a>>, DataError> {
    if records.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            what: "items (the file is empty)",
        });
    }
    Ok(records)
}

/// Refuses an id given twice: the second line is named, with the first.
pub fn unique_ids<'a>(
    path: &Path,
    ids: impl IntoIterator<Item = (usize, &'a str)>,
) -> Result<(), DataError> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (line, id) in ids {
        if let Some(first) = seen.insert(id, line) {
            return Err(field_error(
                path,
                line,
                "id",
                format!("duplicate id {id:?} (first on line {first})"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_elements_carry_their_lines() {
        let p = Path::new("f.json");
        let text = "[\n  {\"a\": 1},\n  {\"b\":\n 2}\n]\n";
        let r = array_or_jsonl_records(text, p).unwrap();
        assert_eq!(r.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 3]);
        let e = array_or_jsonl_records("[\n{\"a\": 1},\n3\n]", p).unwrap_err();
        assert_eq!(
            e.to_string(),
            "f.json:3: expected a JSON object, got a number"
        );
        let e = array_or_jsonl_records("[\n{\"a\": 1}\n{\"b\": 1}]", p).unwrap_err();
        assert!(e.to_string().starts_with("f.json:3: expected `,`"), "{e}");
        let e = array_or_jsonl_records(" [ ] ", p).unwrap_err();
        assert_eq!(e.to_string(), "f.json: no items (the file is empty)");
        let r = array_or_jsonl_records("{\"a\": 1}\n\n{\"a\": 2}\n", p).unwrap();
        assert_eq!(r.iter().map(|r| r.line).collect::<Vec<_>>(), [1, 3]);
    }

    #[test]
    fn fields_and_ids() {
        let p = Path::new("f.jsonl");
        let r = &jsonl_records("{\"x\": 3, \"id\": 7}", p).unwrap()[0];
        assert_eq!(r.id().unwrap(), "7");
        assert_eq!(
            r.text("x").unwrap_err().to_string(),
            "f.jsonl:1: field `x`: expected a string, got a number"
        );
        assert_eq!(
            r.text("y").unwrap_err().to_string(),
            "f.jsonl:1: field `y`: missing (a string is required)"
        );
        assert!(r
            .only(&["x"])
            .unwrap_err()
            .to_string()
            .contains("`id`: unknown"));
        let e = unique_ids(p, [(1, "a"), (4, "a")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "f.jsonl:4: field `id`: duplicate id \"a\" (first on line 1)"
        );
        assert!(jsonl_records("\n\n", p).is_err());
    }
}
