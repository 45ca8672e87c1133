//! Python's text forms that the authors' judge prompt is made of: `repr` of strings and
//! numbers (the checklist is `str.format`ted as a Python list) and `json.dumps(...,
//! ensure_ascii=False)` strings (the answer skeleton). Only what the prompt needs.

use serde_json::Number;

/// Python's `repr` of a JSON number as `json.load` read it: ints as ints, floats with the
/// shortest round-trip digits (`1.0`, `0.35`, `1e-05`).
pub fn py_number_repr(n: &Number) -> String {
    if n.is_f64() {
        py_float_repr(n.as_f64().unwrap_or(f64::NAN))
    } else {
        n.to_string()
    }
}

/// Python's `repr(float)`.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let a = x.abs();
    if a == 0.0 || (1e-4..1e16).contains(&a) {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        // Rust: "1e-5", "1.5e20"; Python: "1e-05", "1.5e+20".
        let s = format!("{x:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = match exp.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', exp),
        };
        format!("{mantissa}e{sign}{digits:0>2}")
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`; escapes
/// backslash, the quote, `\t \n \r`, and non-printable characters as `\xNN`, `\uNNNN`,
/// `\UNNNNNNNN`.
pub fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let u = c as u32;
                if u < 0x100 {
                    out.push_str(&format!("\\x{u:02x}"));
                } else if u < 0x10000 {
                    out.push_str(&format!("\\u{u:04x}"));
                } else {
                    out.push_str(&format!("\\U{u:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str.isprintable` for one character: false for control (Cc), format (Cf),
/// private-use (Co), line/paragraph separators and spaces other than ' ' (Z*). Unassigned
/// code points (Cn) are not tracked (they would need the Unicode tables): they count as
/// printable here, unlike Python.
fn py_printable(c: char) -> bool {
    let u = c as u32;
    let unprintable = matches!(u,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2
        | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064
        | 0x2066..=0x206f | 0x3000 | 0xd800..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3 | 0x1d173..=0x1d17a
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..=0x10ffff);
    !unprintable
}

/// Python `json.dumps(str, ensure_ascii=False)`.
pub fn py_json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_reprs() {
        let cases = [
            ("abc", "'abc'"),
            ("it's", "\"it's\""),
            ("it's \"q\"", "'it\\'s \"q\"'"),
            ("a\\b\tc\nd", "'a\\\\b\\tc\\nd'"),
            (
                "\u{c}rac 中文\u{200c}\u{3000}",
                "'\\x0crac 中文\\u200c\\u3000'",
            ),
        ];
        for (s, want) in cases {
            assert_eq!(py_str_repr(s), want, "{s:?}");
        }
        let floats = [
            (0.6, "0.6"),
            (1.0, "1.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (123.5, "123.5"),
        ];
        for (x, want) in floats {
            assert_eq!(py_float_repr(x), want);
        }
        assert_eq!(py_number_repr(&Number::from(1)), "1");
        assert_eq!(py_json_str("a\"\u{c}\u{1}中"), "\"a\\\"\\f\\u0001中\"");
    }
}
