//! The rules that decide whether a reply applies a feedback (the paper's R(f, r), section 5.2):
//! QA answer aliases, the MT target word, and the email checkers ported from the authors'
//! `src/instructions_checker.py` (title, greetings, signature, sentence count, paragraph count,
//! response language).
//!
//! The email checkers use the authors' tools' counterparts: sentences are counted by NLTK's
//! punkt with its English parameters ([`super::punkt`]), the response language is identified
//! by [`super::lang_id`] (whatlang, for their langdetect). The QA and MT matches are not
//! published by the authors; the rules here are documented on [`qa_answer_matches`] and
//! [`mt_word_present`].

use std::sync::LazyLock;

use regex::Regex;

use super::lang_id::{self, Lang};
use super::punkt;

/// The email feedback kinds (the data's `checker` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EmailRule {
    Greetings,
    Signature,
    Title,
    Sentence,
    Paragraph,
    ResponseLanguage,
}

impl EmailRule {
    pub fn from_name(name: &str) -> Option<EmailRule> {
        Some(match name {
            "greetings" => EmailRule::Greetings,
            "signature" => EmailRule::Signature,
            "title" => EmailRule::Title,
            "sentence" => EmailRule::Sentence,
            "paragraph" => EmailRule::Paragraph,
            "response_language" => EmailRule::ResponseLanguage,
            _ => return None,
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            EmailRule::Greetings => "greetings",
            EmailRule::Signature => "signature",
            EmailRule::Title => "title",
            EmailRule::Sentence => "sentence",
            EmailRule::Paragraph => "paragraph",
            EmailRule::ResponseLanguage => "response_language",
        }
    }
}

/// A count comparison, as written in the choices ("less than 13 sentences").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    LessThan,
    AtLeast,
    Exactly,
}

impl Relation {
    fn holds(self, actual: usize, asked: usize) -> bool {
        match self {
            Relation::LessThan => actual < asked,
            Relation::AtLeast => actual >= asked,
            Relation::Exactly => actual == asked,
        }
    }
}

/// How the subject line must be wrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TitleStyle {
    /// `<<subject>>`
    AngularBrackets,
    /// `**subject**`
    Asterisks,
}

/// One email choice, parsed.
#[derive(Debug, Clone, PartialEq)]
pub enum EmailCheck {
    /// Greetings and signatures: the phrase (one trailing `.` or `,` removed) occurs,
    /// case-insensitively.
    Contains(String),
    Title(TitleStyle),
    Sentences(Relation, usize),
    Paragraphs(Relation, usize),
    Language(Lang),
}

impl EmailCheck {
    /// Parses a choice of the given rule, e.g. `less than 13 sentences`, `German`.
    pub fn parse(rule: EmailRule, choice: &str) -> Result<EmailCheck, String> {
        match rule {
            EmailRule::Greetings | EmailRule::Signature => {
                let phrase = choice
                    .strip_suffix('.')
                    .or_else(|| choice.strip_suffix(','))
                    .unwrap_or(choice);
                if phrase.trim().is_empty() {
                    return Err(format!("empty {} choice", rule.as_str()));
                }
                Ok(EmailCheck::Contains(phrase.to_lowercase()))
            }
            EmailRule::Title => {
                if choice.contains("angular brackets") {
                    Ok(EmailCheck::Title(TitleStyle::AngularBrackets))
                } else if choice.contains("asterisks") {
                    Ok(EmailCheck::Title(TitleStyle::Asterisks))
                } else {
                    Err(format!(
                        "title choice names neither angular brackets nor asterisks: {choice:?}"
                    ))
                }
            }
            EmailRule::Sentence => {
                let (rel, n) = parse_count(choice, "sentences")?;
                Ok(EmailCheck::Sentences(rel, n))
            }
            EmailRule::Paragraph => {
                let (rel, n) = parse_count(choice, "paragraphs")?;
                Ok(EmailCheck::Paragraphs(rel, n))
            }
            EmailRule::ResponseLanguage => Lang::from_name(choice)
                .map(EmailCheck::Language)
                .ok_or_else(|| format!("unknown response language {choice:?}")),
        }
    }

    /// Whether `response` follows this choice.
    pub fn check(&self, response: &str) -> bool {
        match self {
            EmailCheck::Contains(phrase) => response.to_lowercase().contains(phrase.as_str()),
            EmailCheck::Title(style) => has_title(response, *style),
            EmailCheck::Sentences(rel, n) => rel.holds(punkt::count_sentences(response), *n),
            EmailCheck::Paragraphs(rel, n) => {
                count_paragraphs(response).is_some_and(|p| rel.holds(p, *n))
            }
            // The authors count an undetectable language as followed.
            EmailCheck::Language(lang) => lang_id::identify(response).is_none_or(|l| l == *lang),
        }
    }
}

/// `less than N <unit>`, `at least N <unit>`, or `N <unit>` (exactly).
fn parse_count(choice: &str, unit: &str) -> Result<(Relation, usize), String> {
    let bad =
        || format!("expected \"less than N {unit}\" or \"at least N {unit}\", found {choice:?}");
    let rest = choice.trim().strip_suffix(unit).ok_or_else(bad)?.trim_end();
    let (rel, num) = if let Some(n) = rest.strip_prefix("less than ") {
        (Relation::LessThan, n)
    } else if let Some(n) = rest.strip_prefix("at least ") {
        (Relation::AtLeast, n)
    } else {
        (Relation::Exactly, rest)
    };
    let n = num.trim().parse::<usize>().map_err(|_| bad())?;
    Ok((rel, n))
}

static TITLE_ANGULAR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<<[^\n]+>>").expect("valid regex"));
static TITLE_ASTERISKS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\*\*[^\n]+\*\*").expect("valid regex"));

/// The authors' `TitleChecker`: some `<<…>>` (or `**…**`) on one line with non-blank content.
fn has_title(response: &str, style: TitleStyle) -> bool {
    let (re, edge) = match style {
        TitleStyle::AngularBrackets => (&*TITLE_ANGULAR, ['<', '>']),
        TitleStyle::Asterisks => (&*TITLE_ASTERISKS, ['*', '*']),
    };
    re.find_iter(response).any(|m| {
        !m.as_str()
            .trim_start_matches(edge[0])
            .trim_end_matches(edge[1])
            .trim()
            .is_empty()
    })
}

/// The authors' `ParagraphChecker`: paragraphs are separated by runs of newlines; a blank
/// paragraph at either end is dropped, one in the middle fails the check (`None`).
fn count_paragraphs(response: &str) -> Option<usize> {
    // `re.split(r'\n{1,}', value)`
    let paragraphs: Vec<&str> = NEWLINES.split(response).collect();
    let n = paragraphs.len();
    let mut count = n;
    for (i, p) in paragraphs.iter().enumerate() {
        if p.trim().is_empty() {
            if i == 0 || i + 1 == n {
                count -= 1;
            } else {
                return None;
            }
        }
    }
    Some(count)
}

static NEWLINES: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\n+").expect("valid regex"));
/// QA: whether the reply contains the counterfactual answer or one of its aliases. Both are
/// lower-cased; an alias loses surrounding whitespace and trailing `.`; it must occur in the
/// reply with no letter or digit right before or after it (so the alias "sy" does not match
/// "easy"). Empty aliases never match.
pub fn qa_answer_matches(aliases: &[String], response: &str) -> bool {
    let hay = response.to_lowercase();
    aliases.iter().any(|alias| {
        let needle = alias.trim().trim_end_matches('.').trim().to_lowercase();
        !needle.is_empty() && contains_bounded(&hay, &needle)
    })
}

fn contains_bounded(hay: &str, needle: &str) -> bool {
    let first_alnum = needle.chars().next().is_some_and(char::is_alphanumeric);
    let last_alnum = needle.chars().last().is_some_and(char::is_alphanumeric);
    hay.match_indices(needle).any(|(at, _)| {
        let before_ok = !first_alnum
            || !hay[..at]
                .chars()
                .next_back()
                .is_some_and(char::is_alphanumeric);
        let after_ok = !last_alnum
            || !hay[at + needle.len()..]
                .chars()
                .next()
                .is_some_and(char::is_alphanumeric);
        before_ok && after_ok
    })
}

/// MT: whether the required target word occurs in the reply. Chinese and Hebrew attach words
/// without spaces (Hebrew also prefixes ו/ה/ב/ל/…), so this is a substring test, after
/// removing Hebrew vowel points and cantillation marks from both sides (the dictionaries mix
/// pointed and unpointed forms) and lower-casing. The authors tokenized with jieba / a Hebrew
/// tokenizer only when choosing feedback ([`super::segment`]); their scoring code is not
/// published, and this test is what the response rate reads.
pub fn mt_word_present(target: &str, response: &str) -> bool {
    let needle = normalize_mt(target);
    !needle.trim().is_empty() && normalize_mt(response).contains(needle.trim())
}

fn normalize_mt(s: &str) -> String {
    s.chars()
        .filter(|c| !is_hebrew_point(*c))
        .flat_map(char::to_lowercase)
        .collect()
}

fn is_hebrew_point(c: char) -> bool {
    matches!(u32::from(c), 0x0591..=0x05BD | 0x05BF | 0x05C1..=0x05C2 | 0x05C4..=0x05C5 | 0x05C7)
}

/// English words of a source sentence for the MT feedback rule: maximal runs of letters and
/// digits (an approximation of the authors' spaCy tokens for the nouns that carry feedback).
pub fn english_words(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(rule: EmailRule, choice: &str, response: &str) -> bool {
        EmailCheck::parse(rule, choice)
            .expect("valid choice")
            .check(response)
    }

    #[test]
    fn email_rules_pass_and_fail() {
        use EmailRule::*;
        let table: &[(EmailRule, &str, &str, bool)] = &[
            (
                Title,
                "wrapped in double angular brackets, i.e. <<subject>>",
                "<<Softball team>>\nHi Mark",
                true,
            ),
            (
                Title,
                "wrapped in double angular brackets, i.e. <<subject>>",
                "<< >>\nHi",
                false,
            ),
            (
                Title,
                "wrapped in double angular brackets, i.e. <<subject>>",
                "**Softball**",
                false,
            ),
            (
                Title,
                "wrapped in double asterisks, i.e. **subject**.",
                "Subject: **Softball team**",
                true,
            ),
            (
                Title,
                "wrapped in double asterisks, i.e. **subject**.",
                "**\nx**",
                false,
            ),
            (Greetings, "Happy New Year", "happy new year, Mark!", true),
            (Greetings, "Happy New Year", "Hello Mark", false),
            (
                Greetings,
                "I hope this email finds you well.",
                "I hope this email finds you well!",
                true,
            ),
            (Signature, "Peace,\nBob", "Thanks.\nPeace,\nBob", true),
            (Signature, "Peace,\nBob", "Peace, Bob", false),
            (Signature, "Sincerely,", "Sincerely\nCameron", true),
            (Sentence, "less than 3 sentences", "One. Two.", true),
            (Sentence, "less than 3 sentences", "One. Two. Three.", false),
            (Sentence, "at least 3 sentences", "One. Two! Three?", true),
            (
                Sentence,
                "at least 3 sentences",
                "Mr. Smith met Dr. Jones. Bye.",
                false,
            ),
            (
                Paragraph,
                "at least 2 paragraphs",
                "Para one.\n\nPara two.",
                true,
            ),
            (
                Paragraph,
                "at least 2 paragraphs",
                "Just one paragraph.",
                false,
            ),
            (Paragraph, "less than 2 paragraphs", "\nJust one.\n", true),
            (
                ResponseLanguage,
                "German",
                "Lieber Mark, ich hoffe, es geht dir gut.",
                true,
            ),
            (
                ResponseLanguage,
                "German",
                "Dear Mark, I hope you are well.",
                false,
            ),
            (ResponseLanguage, "Chinese", "亲爱的马克，你好。", true),
            (
                ResponseLanguage,
                "French",
                "Cher Marc, j'espère que tu vas bien. Je suis très content de te voir mardi.",
                true,
            ),
            (
                ResponseLanguage,
                "English",
                "Cher Marc, j'espère que tu vas bien. Je suis très content de te voir mardi.",
                false,
            ),
            (ResponseLanguage, "English", "...", true),
        ];
        for (rule, choice, response, want) in table {
            assert_eq!(
                check(*rule, choice, response),
                *want,
                "{rule:?} {choice:?} on {response:?}"
            );
        }
    }

    #[test]
    fn bad_choices_are_errors() {
        assert!(EmailCheck::parse(EmailRule::Sentence, "many sentences").is_err());
        assert!(EmailCheck::parse(EmailRule::Title, "in bold").is_err());
        assert!(EmailCheck::parse(EmailRule::ResponseLanguage, "Klingon").is_err());
        assert!(EmailCheck::parse(EmailRule::Greetings, ".").is_err());
        assert_eq!(
            EmailCheck::parse(EmailRule::Sentence, "at least 13 sentences"),
            Ok(EmailCheck::Sentences(Relation::AtLeast, 13))
        );
    }

    #[test]
    fn qa_aliases_match_on_word_boundaries() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let table: &[(&[&str], &str, bool)] = &[
            (&["Syria."], "Syria", true),
            (
                &["Syria."],
                "Leonardo DiCaprio is a citizen of syria.",
                true,
            ),
            (&["Syria."], "He is American.", false),
            (
                &["Syrian pound", "SYP"],
                "The currency is the Syrian Pound (SYP).",
                true,
            ),
            (&["sy"], "That is easy.", false),
            (&["sy"], "Code: sy", true),
            (&["🇸🇾"], "🇸🇾!", true),
            (&["", " "], "anything", false),
        ];
        for (aliases, response, want) in table {
            assert_eq!(
                qa_answer_matches(&a(aliases), response),
                *want,
                "{aliases:?} in {response:?}"
            );
        }
    }

    #[test]
    fn mt_target_word_is_a_normalized_substring() {
        let table: &[(&str, &str, bool)] = &[
            ("函数", "被修改的版本因为调用了函数而崩溃。", true),
            ("函数", "被修改的版本因为调用了功能而崩溃。", false),
            ("חַמְצָן", "והחמצן נגמר", true),
            ("חמצן", "החַמְצָן נגמר", true),
            ("חמצן", "המים נגמרו", false),
            ("", "anything", false),
        ];
        for (target, response, want) in table {
            assert_eq!(
                mt_word_present(target, response),
                *want,
                "{target} in {response}"
            );
        }
        assert_eq!(
            english_words("a vtable's end-of-line, 3D"),
            ["a", "vtable", "s", "end", "of", "line", "3D"]
        );
    }
}
