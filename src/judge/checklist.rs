//! The FB-Bench checklist judge: the judge prompt and the parser of its verdicts.
//!
//! The judge sees the two-turn conversation, the candidate's follow-up and a checklist, and
//! answers, per checklist entry, `{"评判理由": reason, "评判结果": "是"|"否", "weight": w}`. The
//! prompt is rendered exactly as the authors' `gen_judgment.py` renders it (Python
//! `str.format` of the YAML template, the checklist as Python's `repr` of the published
//! list, the answer skeleton as `json.dumps(indent=4, ensure_ascii=False)`), so a Candor judge
//! reads byte for byte what GPT-4o read. Parsing is *per judgement*: when any entry cannot be
//! read, the whole judgement is [`Verdict::Unscored`] (a weighted sum with a missing entry has
//! no meaning; the authors' code also rejected the whole judgement). Turning verdicts into
//! scores is not done here (see `bench::fbbench::score`).

mod pyrepr;

use serde_json::{Map, Number, Value};

use self::pyrepr::py_json_str;
pub use self::pyrepr::{py_float_repr, py_number_repr, py_str_repr};
use super::Verdict;

/// The v3 judge prompt (`config/judge_config.yaml` `prompt_template_zh` @ dacc09b), verbatim.
pub const TEMPLATE_V3_ZH: &str = r#"# 任务

你是一位优秀的回答评估师，你的任务是根据评判细则，对一段用户与模型之间的两轮对话中的第二轮模型的回答进行评估，并以JSON格式输出

# 用户和模型之间的两轮对话

## 第一轮用户的问题
<role>user</role>
<content>
{user_query}
</content>

## 第一轮模型的回答
<role>assistant</role>
<content>
{origin_first_response}
</content>

## 第二轮用户的问题
<role>user</role>
<content>
{feedback}
</content>

## 第二轮模型的回答
<role>assistant</role>
<content>
{second_response}
</content>

# 评判细则
<评判细则>
{checklist}
</评判细则>

# 输出的评估信息

请你认真阅读上述两轮对话，严格以评判细则为评判标准，针对评判细则当中的逐条要求，检查第二轮模型的回答是否满足各条要求。

请以json格式回答，包含三个字段：评判理由、评判结果（取值限制为"是"或"否"，如果只是部分正确，则仍然是“否”）和weight（其值是预设的，无需更改，即使是None）。

输出格式如下：
```json
{checklist_judgement}
```
"#;

/// The v1 judge prompt, with the reference follow-up (`config/judge_config.yaml` `prompt_template_zh` @ 1ecdbfd), verbatim.
pub const TEMPLATE_V1_ZH: &str = r#"# 任务

你是一位优秀的回答评估师，你的任务是根据给定的第二轮对话的参考回答和评判细则，对一段用户与模型之间的两轮对话中的模型的第二轮回答进行评估，并以JSON格式输出

# 用户和模型之间的两轮对话

<role>user</role>
<content>
{user_query}
</content>

<role>assistant</role>
<content>
{origin_first_response}
</content>

<role>user</role>
<content>
{feedback}
</content>

<role>assistant</role>
<content>
{second_response}
</content>

# 模型第二轮回复的参考回答

<content>
{reference_second_response}
</content>

# 评判细则

<评判细则>
{checklist}
</评判细则>

# 输出的评估信息

请你认真阅读上述两轮对话，严格以评判细则为评判标准，针对评判细则当中的逐条要求，检查模型的第二轮回答是否满足各条要求。请注意，参考回答仅供参考，实际评判应关注模型的第二轮回答是否充分符合评判细则中的要求，而不是其与参考答案的相似性。

请以json格式回答，包含三个字段：评判理由、评判结果（取值限制为"是"或"否"，如果只是部分正确，则仍然是“否”）和weight（其值是预设的，无需更改）。

输出格式如下：
```json
{checklist_judgement}
```
"#;

/// The verdict key the judge fills with its reasoning.
pub const REASON_KEY: &str = "评判理由";
/// The verdict key the judge fills with "是" (met) or "否" (not met).
pub const RESULT_KEY: &str = "评判结果";
/// The verdict key echoing the entry's preset weight.
pub const WEIGHT_KEY: &str = "weight";

/// One checklist entry to judge: its text and, for Error Correction entries, its weight as
/// the JSON number the dataset holds (kept as a number so it renders as the authors did).
#[derive(Debug, Clone, PartialEq)]
pub struct Criterion {
    pub text: String,
    pub weight: Option<Number>,
}

/// Which of the authors' judge prompts to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// v3: no reference answer.
    V3,
    /// v1 (the paper's): shows the human-curated reference follow-up.
    V1,
}

impl Template {
    pub fn text(self) -> &'static str {
        match self {
            Template::V3 => TEMPLATE_V3_ZH,
            Template::V1 => TEMPLATE_V1_ZH,
        }
    }
}

/// What the judge prompt is filled with.
#[derive(Debug, Clone, Copy)]
pub struct JudgeInput<'a> {
    pub user_query: &'a str,
    pub origin_first_response: &'a str,
    pub feedback: &'a str,
    pub second_response: &'a str,
    pub reference_second_response: Option<&'a str>,
    pub criteria: &'a [Criterion],
}

/// Why a judge prompt could not be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecklistError {
    #[error("the v1 judge prompt needs a reference follow-up response")]
    MissingReference,
    #[error("empty checklist")]
    EmptyChecklist,
}

/// Renders the judge prompt (the single user message the authors send, no system prompt).
pub fn render_prompt(template: Template, input: &JudgeInput) -> Result<String, ChecklistError> {
    if input.criteria.is_empty() {
        return Err(ChecklistError::EmptyChecklist);
    }
    let reference = match (template, input.reference_second_response) {
        (Template::V1, None) => return Err(ChecklistError::MissingReference),
        (_, r) => r.unwrap_or(""),
    };
    let checklist = checklist_repr(input.criteria);
    let skeleton = judgement_skeleton(input.criteria);
    Ok(format_fields(template.text(), |name| match name {
        "user_query" => Some(input.user_query),
        "origin_first_response" => Some(input.origin_first_response),
        "feedback" => Some(input.feedback),
        "second_response" => Some(input.second_response),
        "reference_second_response" => Some(reference),
        "checklist" => Some(&checklist),
        "checklist_judgement" => Some(&skeleton),
        _ => None,
    }))
}

/// Python `str.format` with named fields, in one pass (substituted text is never re-read);
/// an unknown `{name}` is left as it is.
fn format_fields<'a>(template: &str, field: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('}').map(|close| (&after[..close], close)) {
            Some((name, close)) if field(name).is_some() => {
                out.push_str(field(name).unwrap_or_default());
                rest = &after[close + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The checklist as Python's `repr` of the published list: `['a', 'b']` for plain entries,
/// `[['a', 0.3], ['b', 0.7]]` for weighted ones.
pub fn checklist_repr(criteria: &[Criterion]) -> String {
    let parts: Vec<String> = criteria
        .iter()
        .map(|c| match &c.weight {
            Some(w) => format!("[{}, {}]", py_str_repr(&c.text), py_number_repr(w)),
            None => py_str_repr(&c.text),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// Distinct checklist texts in first-seen order, each with its last weight (a Python dict's
/// behaviour on repeated keys): shared by the skeleton and the schema.
fn distinct_criteria(criteria: &[Criterion]) -> (Vec<&str>, Vec<Option<&Number>>) {
    let mut order: Vec<&str> = Vec::new();
    let mut weights: Vec<Option<&Number>> = Vec::new();
    for c in criteria {
        match order.iter().position(|t| *t == c.text) {
            Some(i) => weights[i] = c.weight.as_ref(),
            None => {
                order.push(&c.text);
                weights.push(c.weight.as_ref());
            }
        }
    }
    (order, weights)
}

/// The answer skeleton: `json.dumps({text: {"评判理由": "", "评判结果": "", "weight": w}},
/// indent=4, ensure_ascii=False)`. A repeated text keeps its first position and last
/// weight, as a Python dict does.
pub fn judgement_skeleton(criteria: &[Criterion]) -> String {
    let (order, weights) = distinct_criteria(criteria);
    if order.is_empty() {
        return "{}".into();
    }
    let mut out = String::from("{\n");
    for (i, (text, weight)) in order.iter().zip(&weights).enumerate() {
        let w = weight.map_or_else(|| "null".to_string(), py_number_repr);
        out.push_str(&format!(
            "    {}: {{\n        \"{REASON_KEY}\": \"\",\n        \"{RESULT_KEY}\": \"\",\n        \"{WEIGHT_KEY}\": {w}\n    }}",
            py_json_str(text)
        ));
        out.push_str(if i + 1 < order.len() { ",\n" } else { "\n" });
    }
    out.push('}');
    out
}

/// The JSON schema of the object the judge prompt asks for: one entry per distinct
/// checklist text, in the skeleton's order (a repeated text keeps its first position and last
/// weight, as the skeleton does), each `{"评判理由": string, "评判结果": "是"|"否", "weight":
/// the preset weight}`, nothing else. This is the local counterpart of the authors' JSON mode
/// (which only guaranteed *some* JSON object): decoding constrained by it always yields every
/// entry, unless it is cut at the token limit. Whitespace between tokens is limited to runs
/// of at most 16 spaces or newlines, enough for the skeleton's indentation, so a judge cannot
/// loop on blank space.
pub fn judgement_schema(criteria: &[Criterion]) -> Value {
    let (order, weights) = distinct_criteria(criteria);
    let mut properties = Map::new();
    for (text, weight) in order.iter().zip(&weights) {
        let weight = match weight {
            Some(w) => serde_json::json!({ "const": Value::Number((*w).clone()) }),
            None => serde_json::json!({ "type": "null" }),
        };
        properties.insert(
            text.to_string(),
            serde_json::json!({
                "type": "object",
                "properties": {
                    REASON_KEY: { "type": "string" },
                    RESULT_KEY: { "enum": ["是", "否"] },
                    WEIGHT_KEY: weight,
                },
                "required": [REASON_KEY, RESULT_KEY, WEIGHT_KEY],
                "additionalProperties": false,
            }),
        );
    }
    serde_json::json!({
        "x-guidance": { "whitespace_pattern": "[ \\n]{1,16}" },
        "type": "object",
        "properties": Value::Object(properties),
        "required": order,
        "additionalProperties": false,
    })
}

/// The judge's verdict on one checklist entry.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckVerdict {
    /// The entry's text (the checklist's, or the judge's key when read from a record).
    pub text: String,
    pub reason: String,
    /// "是": the follow-up meets the entry.
    pub met: bool,
    /// The entry's weight as the JSON number it was (None for Response Maintenance
    /// entries); kept as a number because the authors' Python sums ints and floats apart.
    pub weight: Option<Number>,
}

/// Reads a judge's raw output against the checklist it was given. Tolerates code fences
/// and prose around the JSON object. Entries are matched to criteria by exact text, else by
/// position when the judge returned exactly one entry per criterion (judges re-escape
/// LaTeX such as `\frac`). Weights come from the checklist (they are preset), not from the
/// judge's echo. Anything else is `Unscored` with the reason.
pub fn parse_output(raw: &str, criteria: &[Criterion]) -> Verdict<Vec<CheckVerdict>> {
    let Some(object) = find_verdict_object(raw) else {
        return Verdict::unscored("no json object of checklist verdicts in the judge output");
    };
    let entries: Vec<(&String, &Value)> = object.iter().collect();
    let by_text: Option<Vec<&Value>> = criteria
        .iter()
        .map(|c| object.get(&c.text))
        .collect::<Option<Vec<_>>>();
    let values = match by_text {
        Some(v) => v,
        None if entries.len() == criteria.len() => entries.iter().map(|(_, v)| *v).collect(),
        None => {
            return Verdict::unscored(format!(
                "judge gave {} verdicts for {} checklist entries, not matching their texts",
                entries.len(),
                criteria.len()
            ))
        }
    };
    let mut out = Vec::with_capacity(criteria.len());
    for (i, (c, v)) in criteria.iter().zip(values).enumerate() {
        match read_entry(v) {
            Ok((reason, met, _)) => out.push(CheckVerdict {
                text: c.text.clone(),
                reason,
                met,
                weight: c.weight.clone(),
            }),
            Err(e) => return Verdict::unscored(format!("checklist entry {}: {e}", i + 1)),
        }
    }
    Verdict::Scored(out)
}

/// [`parse_output`], else the entries that came back, as the authors' code scored them
/// (their JSON mode returned whatever entries the judge wrote and `get_score` summed over
/// those): an entry whose text is a criterion's takes that criterion's weight, another one
/// its echoed weight; an entry without a readable verdict counts as not met. A judgement cut
/// at the token limit keeps its complete entries. Unscored only when no entry can be read.
pub fn parse_output_partial(raw: &str, criteria: &[Criterion]) -> Verdict<Vec<CheckVerdict>> {
    let full = parse_output(raw, criteria);
    let Verdict::Unscored { reason } = full else {
        return full;
    };
    let Some(object) = find_verdict_object(raw).or_else(|| recover_truncated(raw)) else {
        return Verdict::Unscored { reason };
    };
    let mut out = Vec::with_capacity(object.len());
    for (text, v) in &object {
        let criterion = criteria.iter().rev().find(|c| &c.text == text);
        let (reason, met, echoed) = read_entry(v).unwrap_or_default();
        out.push(CheckVerdict {
            text: text.clone(),
            reason,
            met,
            weight: criterion.map_or(echoed, |c| c.weight.clone()),
        });
    }
    if out.is_empty() {
        return Verdict::Unscored { reason };
    }
    Verdict::Scored(out)
}

/// The complete entries of a verdict object cut short (at the token limit): the text from
/// the first `{` up to the last entry that closed, with the object closed after it.
fn recover_truncated(raw: &str) -> Option<Map<String, Value>> {
    let start = raw.find('{')?;
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    let mut last_entry_end = None;
    for (i, ch) in raw[start..].char_indices() {
        if in_str {
            match (esc, ch) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' => in_str = true,
            '{' | '[' => depth += 1,
            '}' | ']' => {
                depth = depth.checked_sub(1)?;
                if depth == 1 && ch == '}' {
                    last_entry_end = Some(start + i);
                }
                if depth == 0 {
                    return None;
                }
            }
            _ => {}
        }
    }
    let end = last_entry_end?;
    let text = format!("{}}}", &raw[start..=end]);
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(object))
            if object
                .values()
                .all(|v| v.as_object().is_some_and(|e| e.contains_key(RESULT_KEY))) =>
        {
            Some(object)
        }
        _ => None,
    }
}

/// Reads a recorded `judgement` object (the authors' JSONL field), entries in order with
/// their recorded weights. The authors' failure marker (`{"API fialed": "$REPETITIVE
/// PATTERNS$"}`) and anything malformed is `Unscored` with the reason.
pub fn from_recorded(value: &Value) -> Verdict<Vec<CheckVerdict>> {
    let Some(object) = value.as_object() else {
        return Verdict::unscored(format!("judgement is not an object: {value}"));
    };
    if object.is_empty() {
        return Verdict::unscored("judgement has no entries");
    }
    let mut out = Vec::with_capacity(object.len());
    for (text, v) in object {
        match read_entry(v) {
            Ok((reason, met, weight)) => out.push(CheckVerdict {
                text: text.clone(),
                reason,
                met,
                weight,
            }),
            Err(e) => return Verdict::unscored(format!("judge failed ({text}: {v}): {e}")),
        }
    }
    Verdict::Scored(out)
}

/// The published `judgement` object for verdicts (what [`from_recorded`] reads back).
pub fn to_recorded(verdicts: &[CheckVerdict]) -> Value {
    let mut object = Map::new();
    for v in verdicts {
        let mut entry = Map::new();
        entry.insert(REASON_KEY.into(), Value::String(v.reason.clone()));
        entry.insert(
            RESULT_KEY.into(),
            Value::String(if v.met { "是" } else { "否" }.into()),
        );
        entry.insert(
            WEIGHT_KEY.into(),
            v.weight.clone().map_or(Value::Null, Value::Number),
        );
        object.insert(v.text.clone(), Value::Object(entry));
    }
    Value::Object(object)
}

/// (reason, met, weight) of one verdict entry.
fn read_entry(v: &Value) -> Result<(String, bool, Option<Number>), String> {
    let Some(entry) = v.as_object() else {
        return Err("verdict is not an object".into());
    };
    let met = match entry.get(RESULT_KEY).and_then(Value::as_str).map(str::trim) {
        Some("是") => true,
        Some("否") => false,
        Some(other) => return Err(format!("{RESULT_KEY} is {other:?}, not \"是\" or \"否\"")),
        None => return Err(format!("no {RESULT_KEY}")),
    };
    let reason = entry
        .get(REASON_KEY)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let weight = match entry.get(WEIGHT_KEY) {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.clone()),
        Some(other) => return Err(format!("weight is {other}, not a number or null")),
    };
    Ok((reason, met, weight))
}

/// The first JSON object in `raw` whose values are verdict objects (with a result key);
/// scans every `{`, so fences and prose before or after do not matter.
fn find_verdict_object(raw: &str) -> Option<Map<String, Value>> {
    for (i, _) in raw.match_indices('{') {
        let mut stream = serde_json::Deserializer::from_str(&raw[i..]).into_iter::<Value>();
        if let Some(Ok(Value::Object(object))) = stream.next() {
            let is_verdicts = !object.is_empty()
                && object
                    .values()
                    .all(|v| v.as_object().is_some_and(|e| e.contains_key(RESULT_KEY)));
            if is_verdicts {
                return Some(object);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crit(text: &str, w: Option<f64>) -> Criterion {
        Criterion {
            text: text.into(),
            weight: w.and_then(Number::from_f64),
        }
    }

    #[test]
    fn skeleton_keeps_python_dict_semantics() {
        let c = [
            crit("a", Some(0.5)),
            crit("b", Some(0.25)),
            crit("a", Some(0.25)),
        ];
        let s = judgement_skeleton(&c);
        assert_eq!(s.matches("\"a\"").count(), 1);
        assert!(s.starts_with("{\n    \"a\": {\n        \"评判理由\": \"\",\n        \"评判结果\": \"\",\n        \"weight\": 0.25\n    },\n"), "{s}");
        assert!(s.ends_with("\"weight\": 0.25\n    }\n}"), "{s}");
        assert_eq!(
            judgement_skeleton(&[crit("x", None)])
                .matches("null")
                .count(),
            1
        );
    }

    #[test]
    fn format_is_single_pass() {
        let out = format_fields("{a}-{b}-{c}", |n| match n {
            "a" => Some("{b}"),
            "b" => Some("B"),
            _ => None,
        });
        assert_eq!(out, "{b}-B-{c}");
    }

    #[test]
    fn parses_fenced_output_with_prose() {
        let c = [crit("是否给出2", Some(0.8)), crit("是否致歉", Some(0.2))];
        let raw = "好的，评估如下：\n```json\n{\n  \"是否给出2\": {\"评判理由\": \"给出了 {2}\", \"评判结果\": \"是\", \"weight\": 0.5},\n  \"是否致歉\": {\"评判理由\": \"没有\", \"评判结果\": \" 否 \", \"weight\": 0.2}\n}\n```\n以上。";
        let Verdict::Scored(v) = parse_output(raw, &c) else {
            panic!("unscored")
        };
        assert_eq!(v.len(), 2);
        assert!(v[0].met && !v[1].met);
        assert_eq!(
            v[0].weight,
            Number::from_f64(0.8),
            "weights come from the checklist"
        );
        assert_eq!(v[0].reason, "给出了 {2}");
    }

    #[test]
    fn matches_by_position_when_keys_were_re_escaped() {
        let c = [crit("得到 $\u{c}rac{1}{2}$", None)];
        let raw = r#"{"得到 $\\frac{1}{2}$": {"评判理由": "r", "评判结果": "是", "weight": null}}"#;
        let Verdict::Scored(v) = parse_output(raw, &c) else {
            panic!("unscored")
        };
        assert_eq!(v[0].text, c[0].text);
        assert!(v[0].met);
    }

    #[test]
    fn unparseable_outputs_are_unscored_with_a_reason() {
        let c = [crit("a", Some(0.5)), crit("b", Some(0.5))];
        let cases = [
            ("I cannot judge this.", "no json object"),
            (r#"{"a": {"评判结果": "是"}}"#, "1 verdicts for 2"),
            (
                r#"{"a": {"评判结果": "是"}, "b": {"评判结果": "部分"}}"#,
                "entry 2",
            ),
            (
                r#"{"a": {"评判结果": "是"}, "b": {"评判结果": "否", "weight": "x"}}"#,
                "weight",
            ),
            (
                r#"{"a": {"评判结果": "是"}, "b": {"评判结果": "否""#,
                "no json object",
            ),
        ];
        for (raw, why) in cases {
            match parse_output(raw, &c) {
                Verdict::Unscored { reason } => assert!(reason.contains(why), "{raw}: {reason}"),
                Verdict::Scored(v) => panic!("{raw} scored: {v:?}"),
            }
        }
    }

    #[test]
    fn schema_has_one_entry_per_distinct_text_in_order() {
        let criteria = vec![
            crit("b", Some(0.3)),
            crit("a\n\"x\"", Some(0.7)),
            crit("b", Some(0.5)),
        ];
        let s = judgement_schema(&criteria);
        let props = s["properties"].as_object().unwrap();
        let keys: Vec<&String> = props.keys().collect();
        assert_eq!(keys, ["b", "a\n\"x\""]);
        assert_eq!(s["required"], serde_json::json!(["b", "a\n\"x\""]));
        assert_eq!(s["additionalProperties"], false);
        // The last weight of a repeated text, as the skeleton has it.
        assert_eq!(props["b"]["properties"]["weight"]["const"], 0.5);
        assert_eq!(
            props["b"]["properties"][RESULT_KEY]["enum"],
            serde_json::json!(["是", "否"])
        );
        assert_eq!(
            props["b"]["required"],
            serde_json::json!([REASON_KEY, RESULT_KEY, WEIGHT_KEY])
        );
        let plain = judgement_schema(&[crit("c", None)]);
        assert_eq!(
            plain["properties"]["c"]["properties"]["weight"]["type"],
            "null"
        );
    }

    #[test]
    fn partial_entry_sets_score_what_came_back() {
        let criteria = vec![
            crit("a", Some(0.4)),
            crit("b", Some(0.6)),
            crit("c", Some(0.2)),
        ];
        let entry = |r: &str| {
            format!("{{\"{REASON_KEY}\": \"x\", \"{RESULT_KEY}\": \"{r}\", \"weight\": 9}}")
        };
        // Two of three entries: unscored strictly, scored as the authors did.
        let two = format!("{{\"a\": {}, \"b\": {}}}", entry("是"), entry("否"));
        assert!(matches!(
            parse_output(&two, &criteria),
            Verdict::Unscored { .. }
        ));
        let Verdict::Scored(v) = parse_output_partial(&two, &criteria) else {
            panic!("partial set unscored")
        };
        assert_eq!(v.len(), 2);
        assert!(v[0].met && !v[1].met);
        assert_eq!(v[0].weight, Some(Number::from_f64(0.4).unwrap()));
        // Cut at the token limit inside the third entry: the two complete ones count.
        let cut = format!(
            "```json\n{{\"a\": {}, \"b\": {}, \"c\": {{\"{REASON_KEY}\": \"trunc}}",
            entry("否"),
            entry("是")
        );
        let Verdict::Scored(v) = parse_output_partial(&cut, &criteria) else {
            panic!("cut judgement unscored")
        };
        assert_eq!(v.iter().map(|v| v.met).collect::<Vec<_>>(), [false, true]);
        // An unknown entry keeps its echoed weight.
        let other = format!("{{\"zzz\": {}}}", entry("是"));
        let Verdict::Scored(v) = parse_output_partial(&other, &criteria) else {
            panic!("unscored")
        };
        assert_eq!(v[0].weight, Some(Number::from(9)));
        // Nothing readable stays unscored; a complete judgement is read as before.
        assert!(matches!(
            parse_output_partial("no json", &criteria),
            Verdict::Unscored { .. }
        ));
        let all = format!(
            "{{\"a\": {}, \"b\": {}, \"c\": {}}}",
            entry("是"),
            entry("是"),
            entry("否")
        );
        assert_eq!(
            parse_output_partial(&all, &criteria),
            parse_output(&all, &criteria)
        );
    }

    #[test]
    fn recorded_judgements_round_trip() {
        let v = vec![
            CheckVerdict {
                text: "a".into(),
                reason: "r".into(),
                met: true,
                weight: Number::from_f64(0.3),
            },
            CheckVerdict {
                text: "b".into(),
                reason: "s".into(),
                met: false,
                weight: None,
            },
        ];
        let value = to_recorded(&v);
        assert_eq!(value["a"][RESULT_KEY], "是");
        assert_eq!(value["b"][WEIGHT_KEY], Value::Null);
        assert_eq!(from_recorded(&value), Verdict::Scored(v));
        let marker = serde_json::json!({"API fialed": "$REPETITIVE PATTERNS$"});
        match from_recorded(&marker) {
            Verdict::Unscored { reason } => assert!(reason.contains("REPETITIVE"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}
