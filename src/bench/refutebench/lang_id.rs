//! A small, rule-based language identifier for RefuteBench's "response language" email
//! feedback (Chinese, English, French, German), standing in for the `langdetect` package the
//! authors call. It is not a general language detector.
//!
//! The rule, in two steps:
//! 1. Script: every alphabetic character is counted by script (Han, Hebrew, Latin, other). The
//!    script with the most characters wins; Han means Chinese, Hebrew means Hebrew, any other
//!    non-Latin script is [`Lang::Other`]. Text without letters has no language (`None`), which
//!    the email checker treats as the authors do when `langdetect` raises: as followed.
//! 2. Latin script only: each of English, German and French scores one point per word found in
//!    its short list of very frequent function words, plus two points per letter only it uses
//!    (German `äöüß`, French `éèêàçùâîôûëïœ`). The highest score wins; ties and zero evidence go
//!    to English, in the order English, German, French.

/// A language the identifier can tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lang {
    En,
    De,
    Fr,
    Zh,
    He,
    /// A script other than Latin, Han or Hebrew (Cyrillic, Arabic, kana, Hangul, …).
    Other,
}

impl Lang {
    /// The language names used in the email data ("German", "Chinese", "English", "French").
    pub fn from_name(name: &str) -> Option<Lang> {
        match name {
            "English" => Some(Lang::En),
            "German" => Some(Lang::De),
            "French" => Some(Lang::Fr),
            "Chinese" => Some(Lang::Zh),
            "Hebrew" => Some(Lang::He),
            _ => None,
        }
    }
}

const EN_WORDS: &[&str] = &[
    "the", "and", "to", "of", "a", "in", "is", "you", "that", "it", "for", "i", "with", "be",
    "this", "on", "are", "have", "your", "will", "my", "we", "as", "at", "not", "but", "me", "so",
    "our", "would", "hope", "dear", "best", "please", "regards", "thank", "from", "all",
];
const DE_WORDS: &[&str] = &[
    "der", "die", "das", "und", "ich", "sie", "nicht", "ist", "zu", "den", "mit", "von", "ein",
    "eine", "es", "dem", "auf", "für", "wir", "dich", "dir", "du", "ihr", "mein", "meine", "liebe",
    "lieber", "grüße", "hallo", "viele", "auch", "wie", "bei", "wenn", "uns", "sehr",
];
const FR_WORDS: &[&str] = &[
    "le",
    "la",
    "les",
    "et",
    "je",
    "vous",
    "de",
    "des",
    "un",
    "une",
    "est",
    "pour",
    "que",
    "qui",
    "dans",
    "pas",
    "nous",
    "tu",
    "te",
    "ton",
    "ta",
    "mon",
    "ma",
    "avec",
    "sur",
    "au",
    "du",
    "bonjour",
    "cher",
    "chère",
    "merci",
    "cordialement",
    "bien",
    "suis",
    "votre",
    "ce",
];
const DE_LETTERS: &str = "äöüß";
const FR_LETTERS: &str = "éèêàçùâîôûëïœ";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    Han,
    Hebrew,
    Latin,
    Other,
}

fn script(c: char) -> Script {
    match u32::from(c) {
        0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x2FFFF => Script::Han,
        0x0590..=0x05FF | 0xFB1D..=0xFB4F => Script::Hebrew,
        0x0041..=0x005A | 0x0061..=0x007A | 0x00C0..=0x024F | 0x1E00..=0x1EFF => Script::Latin,
        _ => Script::Other,
    }
}

/// The language of `text` by the rule in the module doc, or `None` when it has no letters.
pub fn identify(text: &str) -> Option<Lang> {
    let mut counts = [0usize; 4];
    for c in text.chars().filter(|c| c.is_alphabetic()) {
        let i = match script(c) {
            Script::Han => 0,
            Script::Hebrew => 1,
            Script::Latin => 2,
            Script::Other => 3,
        };
        counts[i] += 1;
    }
    let total: usize = counts.iter().sum();
    if total == 0 {
        return None;
    }
    // First maximum in the order Han, Hebrew, Latin, other.
    let best = (0..4).fold(0, |b, i| if counts[i] > counts[b] { i } else { b });
    Some(match best {
        0 => Lang::Zh,
        1 => Lang::He,
        2 => latin_language(text),
        _ => Lang::Other,
    })
}

fn latin_language(text: &str) -> Lang {
    let lower = text.to_lowercase();
    let mut scores = [0usize; 3];
    for word in lower
        .split(|c: char| !c.is_alphabetic())
        .filter(|w| !w.is_empty())
    {
        scores[0] += usize::from(EN_WORDS.contains(&word));
        scores[1] += usize::from(DE_WORDS.contains(&word));
        scores[2] += usize::from(FR_WORDS.contains(&word));
    }
    for c in lower.chars() {
        if DE_LETTERS.contains(c) {
            scores[1] += 2;
        }
        if FR_LETTERS.contains(c) {
            scores[2] += 2;
        }
    }
    match (0..3).fold(0, |b, i| if scores[i] > scores[b] { i } else { b }) {
        1 => Lang::De,
        2 => Lang::Fr,
        _ => Lang::En,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifies_the_email_languages() {
        let cases: &[(&str, Option<Lang>)] = &[
            (
                "Dear Mark, I hope you are well. See you on Tuesday!",
                Some(Lang::En),
            ),
            (
                "Lieber Mark, ich hoffe, es geht dir gut. Viele Grüße",
                Some(Lang::De),
            ),
            (
                "Cher Marc, j'espère que tu vas bien. Je suis très content de te voir.",
                Some(Lang::Fr),
            ),
            ("亲爱的马克，希望你一切都好。我们周二见！", Some(Lang::Zh)),
            ("亲爱的Mark，希望你一切都好。", Some(Lang::Zh)),
            ("שלום, מה שלומך?", Some(Lang::He)),
            ("Привет, как дела?", Some(Lang::Other)),
            ("12345 !!! ...", None),
            ("", None),
            ("Xyzzy", Some(Lang::En)),
        ];
        for (text, want) in cases {
            assert_eq!(identify(text), *want, "{text}");
        }
    }

    #[test]
    fn names_map_to_languages() {
        assert_eq!(Lang::from_name("German"), Some(Lang::De));
        assert_eq!(Lang::from_name("Chinese"), Some(Lang::Zh));
        assert_eq!(Lang::from_name("Klingon"), None);
    }
}
