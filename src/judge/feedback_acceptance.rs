//! RefuteBench's feedback-acceptance (FA) judge: the prompt that asks whether a reply
//! positively accepts a refuting instruction, and the parser of its Yes/No answer.
//!
//! The template is quoted from the paper (Yan et al., 2024, appendix A.1). For MT the authors
//! add four in-context demonstrations drawn from their own annotated samples, which are not
//! published; [`MT_DEMOS`] are four demonstrations written for Candor in the same form (two
//! accepting, two not), and their use is a choice of the caller. This module knows nothing of
//! dialogues: which reply answers which feedback is decided by the benchmark.

use super::Verdict;

/// The FA prompt, as printed in the paper (appendix A.1).
pub const TEMPLATE: &str = "Please check whether the Response positively accepts the Request. Answer the question with Yes or No. Query: {Query}. Request: {Request}. Response: {Response}. Answer:";

/// The answer the prompt asks for, as a Lark grammar (llguidance syntax) for constrained
/// decoding: `Yes` or `No`, after an optional space.
pub const ANSWER_GRAMMAR: &str = r#"start: " "? ("Yes" | "No")"#;

/// One in-context demonstration: a filled template followed by its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demo {
    pub query: &'static str,
    pub request: &'static str,
    pub response: &'static str,
    pub accepts: bool,
}

/// Candor's own MT demonstrations (the authors' four are unpublished).
pub const MT_DEMOS: [Demo; 4] = [
    Demo {
        query: "Please translate the following sentence from English into Chinese.\n[English]: The function returns a list. \n[Chinese]: ",
        request: "In the following translations, you should translate function to 函数.",
        response: "好的，我会把 function 翻译成“函数”：该函数返回一个列表。",
        accepts: true,
    },
    Demo {
        query: "Please translate the following sentence from English into Chinese.\n[English]: The old bank stands by the river. \n[Chinese]: ",
        request: "In the following translations, you should translate bank to 河岸.",
        response: "抱歉，这里的 bank 指的是银行，应译为：那家老银行坐落在河边。",
        accepts: false,
    },
    Demo {
        query: "Please translate the following sentence from English into Hebrew.\n[English]: She opened the window. \n[Hebrew]: ",
        request: "In the following translations, you should translate window to חלון.",
        response: "בסדר, אתרגם את window כ-חלון: היא פתחה את החלון.",
        accepts: true,
    },
    Demo {
        query: "Please translate the following sentence from English into Chinese.\n[English]: The end of the road is near. \n[Chinese]: ",
        request: "In the following translations, you should translate end to 终点.",
        response: "路的尽头就在附近。",
        accepts: false,
    },
];

/// The FA judge prompt for one reply: the demonstrations (each a filled template and its
/// answer, separated by blank lines), then the template filled with `query` (the query the
/// feedback refutes), `request` (the feedback) and `response` (the reply to the feedback).
pub fn prompt(query: &str, request: &str, response: &str, demos: &[Demo]) -> String {
    let mut out = String::new();
    for d in demos {
        out.push_str(&fill(d.query, d.request, d.response));
        out.push_str(if d.accepts { " Yes\n\n" } else { " No\n\n" });
    }
    out.push_str(&fill(query, request, response));
    out
}

fn fill(query: &str, request: &str, response: &str) -> String {
    // One pass, so braces inside the filled texts are never taken for placeholders.
    let mut out =
        String::with_capacity(TEMPLATE.len() + query.len() + request.len() + response.len());
    let mut rest = TEMPLATE;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let (value, len) = if after.starts_with("{Query}") {
            (query, "{Query}".len())
        } else if after.starts_with("{Request}") {
            (request, "{Request}".len())
        } else if after.starts_with("{Response}") {
            (response, "{Response}".len())
        } else {
            ("{", 1)
        };
        out.push_str(value);
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// The judge's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Acceptance {
    Accepted,
    Rejected,
}

/// Parses a judge's answer. The first word decides when it is "yes" or "no" (case and
/// surrounding punctuation or markdown ignored: `**Yes**`, `"No."`); otherwise the answer is
/// taken when exactly one of the two words occurs anywhere as a whole word. Anything else
/// (neither, or both) is [`Verdict::Unscored`] with the reason.
pub fn parse(output: &str) -> Verdict<Acceptance> {
    let lower = output.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    match words.first() {
        Some(&"yes") => return Verdict::Scored(Acceptance::Accepted),
        Some(&"no") => return Verdict::Scored(Acceptance::Rejected),
        _ => {}
    }
    let yes = words.contains(&"yes");
    let no = words.contains(&"no");
    match (yes, no) {
        (true, false) => Verdict::Scored(Acceptance::Accepted),
        (false, true) => Verdict::Scored(Acceptance::Rejected),
        (true, true) => Verdict::unscored(format!("both yes and no in {:?}", snippet(output))),
        (false, false) => Verdict::unscored(format!("neither yes nor no in {:?}", snippet(output))),
    }
}

fn snippet(s: &str) -> String {
    let t: String = s.chars().take(80).collect();
    if t.len() < s.len() {
        format!("{t}…")
    } else {
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_quotes_the_paper() {
        let p = prompt("Q?", "Adopt X.", "OK, X.", &[]);
        assert_eq!(
            p,
            "Please check whether the Response positively accepts the Request. Answer the question with Yes or No. Query: Q?. Request: Adopt X.. Response: OK, X.. Answer:"
        );
        let braces = prompt("{Request}", "r", "{x}", &[]);
        assert!(
            braces.contains("Query: {Request}. Request: r. Response: {x}."),
            "{braces}"
        );
    }

    #[test]
    fn demos_come_first_with_their_answers() {
        let p = prompt("Q", "R", "S", &MT_DEMOS);
        assert_eq!(p.matches("Answer the question with Yes or No.").count(), 5);
        assert_eq!(p.matches("Answer: Yes\n\n").count(), 2);
        assert_eq!(p.matches("Answer: No\n\n").count(), 2);
        assert!(p.ends_with("Query: Q. Request: R. Response: S. Answer:"));
    }

    #[test]
    fn parser_cases() {
        use Acceptance::*;
        let table: &[(&str, Option<Acceptance>)] = &[
            ("Yes", Some(Accepted)),
            ("yes.", Some(Accepted)),
            (" **Yes**, the response adopts it.", Some(Accepted)),
            ("No", Some(Rejected)),
            ("\"No.\" The model refuses.", Some(Rejected)),
            ("No, yes is wrong here", Some(Rejected)),
            ("The answer is yes.", Some(Accepted)),
            (
                "The response does not accept it. Answer: No",
                Some(Rejected),
            ),
            ("Yesterday", None),
            ("I cannot tell.", None),
            ("Maybe yes, maybe no.", None),
            ("", None),
        ];
        for (text, want) in table {
            let got = parse(text);
            assert_eq!(got.scored().copied(), *want, "{text:?} -> {got:?}");
            if want.is_none() {
                assert!(matches!(got, Verdict::Unscored { ref reason } if !reason.is_empty()));
            }
        }
    }
}
