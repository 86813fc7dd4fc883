//! `constraints`: IFEval-style programmatic checks of a response.

use std::collections::BTreeMap;

use crate::result::GradeResult;
use crate::spec::{CodeScoring, ConstraintCheck};

/// Runs every check; the score is all-pass or the fraction of checks that hold.
pub fn grade(text: &str, checks: &[ConstraintCheck], scoring: CodeScoring) -> GradeResult {
    let mut sub_scores = BTreeMap::new();
    let mut failed = Vec::new();
    for (i, check) in checks.iter().enumerate() {
        let (ok, detail) = run_check(text, check);
        sub_scores.insert(format!("{i}_{}", check.name()), if ok { 1.0 } else { 0.0 });
        if !ok {
            failed.push(format!("{} ({detail})", check.name()));
        }
    }
    let passed = checks.len() - failed.len();
    let score = match scoring {
        _ if checks.is_empty() => 1.0,
        CodeScoring::AllPass => f64::from(u8::from(failed.is_empty())),
        CodeScoring::Fraction => passed as f64 / checks.len() as f64,
    };
    let reason = if failed.is_empty() {
        format!("all {} checks hold", checks.len())
    } else {
        format!("{passed}/{} checks hold; failed: {}", checks.len(), failed.join(", "))
    };
    GradeResult::scored(score, reason).with_sub_scores(sub_scores)
}

fn within(n: usize, min: Option<usize>, max: Option<usize>) -> (bool, String) {
    let ok = min.is_none_or(|m| n >= m) && max.is_none_or(|m| n <= m);
    (ok, format!("found {n}"))
}

fn run_check(text: &str, check: &ConstraintCheck) -> (bool, String) {
    match check {
        ConstraintCheck::WordCount { min, max } => {
            within(text.split_whitespace().count(), *min, *max)
        }
        ConstraintCheck::SentenceCount { min, max } => within(sentence_count(text), *min, *max),
        ConstraintCheck::ParagraphCount { min, max } => within(paragraph_count(text), *min, *max),
        ConstraintCheck::BulletCount { min, max } => within(bullet_count(text), *min, *max),
        ConstraintCheck::IncludeKeywords { keywords, case_sensitive } => {
            let missing: Vec<&str> = keywords
                .iter()
                .filter(|k| !contains_word(text, k, *case_sensitive))
                .map(String::as_str)
                .collect();
            (missing.is_empty(), format!("missing {missing:?}"))
        }
        ConstraintCheck::ExcludeKeywords { keywords, case_sensitive } => {
            let present: Vec<&str> = keywords
                .iter()
                .filter(|k| contains_word(text, k, *case_sensitive))
                .map(String::as_str)
                .collect();
            (present.is_empty(), format!("present {present:?}"))
        }
        ConstraintCheck::ValidJson {} => (is_json(text), "not valid JSON".into()),
        ConstraintCheck::Lowercase {} => {
            (!text.chars().any(char::is_uppercase), "has uppercase letters".into())
        }
        ConstraintCheck::Uppercase {} => {
            (!text.chars().any(char::is_lowercase), "has lowercase letters".into())
        }
        ConstraintCheck::StartsWith { prefix } => {
            (text.trim().starts_with(prefix.as_str()), "wrong start".into())
        }
        ConstraintCheck::EndsWith { suffix } => {
            (text.trim().ends_with(suffix.as_str()), "wrong end".into())
        }
        ConstraintCheck::Language { language } => match detect_language(text) {
            Some(found) => {
                (language_matches(language, found), format!("detected {}", found.code()))
            }
            None => (false, "language not detected".into()),
        },
    }
}

fn sentence_count(text: &str) -> usize {
    text.split(['.', '!', '?']).filter(|s| s.chars().any(char::is_alphanumeric)).count()
}

fn paragraph_count(text: &str) -> usize {
    let mut count = 0;
    let mut in_paragraph = false;
    for line in text.lines() {
        let blank = line.trim().is_empty() || line.trim() == "***";
        if !blank && !in_paragraph {
            count += 1;
        }
        in_paragraph = !blank;
    }
    count
}

fn bullet_count(text: &str) -> usize {
    text.lines().map(str::trim_start).filter(|l| l.starts_with("* ") || l.starts_with("- ")).count()
}

fn contains_word(text: &str, keyword: &str, case_sensitive: bool) -> bool {
    let (text, keyword) = if case_sensitive {
        (text.to_string(), keyword.to_string())
    } else {
        (text.to_lowercase(), keyword.to_lowercase())
    };
    if keyword.is_empty() {
        return true;
    }
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    text.match_indices(&keyword).any(|(i, m)| {
        let before = text[..i].chars().next_back();
        let after = text[i + m.len()..].chars().next();
        !is_word(before) && !is_word(after)
    })
}

fn is_json(text: &str) -> bool {
    let trimmed = text.trim();
    let body = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|t| t.strip_suffix("```"))
        .unwrap_or(trimmed);
    serde_json::from_str::<serde_json::Value>(body.trim()).is_ok()
}

fn detect_language(text: &str) -> Option<whatlang::Lang> {
    whatlang::detect(text).map(|info| info.lang())
}

fn language_matches(wanted: &str, found: whatlang::Lang) -> bool {
    let wanted = wanted.trim().to_lowercase();
    if found.code() == wanted {
        return true;
    }
    const ISO_639_1: &[(&str, &str)] = &[
        ("en", "eng"),
        ("fr", "fra"),
        ("de", "deu"),
        ("es", "spa"),
        ("it", "ita"),
        ("pt", "por"),
        ("ru", "rus"),
        ("zh", "cmn"),
        ("ja", "jpn"),
        ("ko", "kor"),
        ("ar", "ara"),
        ("hi", "hin"),
        ("nl", "nld"),
        ("sv", "swe"),
        ("pl", "pol"),
        ("tr", "tur"),
        ("uk", "ukr"),
        ("fi", "fin"),
        ("da", "dan"),
        ("nb", "nob"),
        ("no", "nob"),
        ("cs", "ces"),
        ("el", "ell"),
        ("he", "heb"),
        ("vi", "vie"),
        ("th", "tha"),
        ("id", "ind"),
        ("fa", "pes"),
        ("bn", "ben"),
        ("ta", "tam"),
        ("te", "tel"),
        ("mr", "mar"),
        ("ur", "urd"),
        ("sw", "swa"),
        ("ro", "ron"),
        ("hu", "hun"),
        ("bg", "bul"),
        ("hr", "hrv"),
        ("sr", "srp"),
        ("sk", "slk"),
        ("sl", "slv"),
        ("lt", "lit"),
        ("lv", "lav"),
        ("et", "est"),
        ("ka", "kat"),
        ("hy", "hye"),
        ("pa", "pan"),
        ("gu", "guj"),
        ("kn", "kan"),
        ("ml", "mal"),
        ("ne", "nep"),
        ("af", "afr"),
    ];
    ISO_639_1.iter().any(|(two, three)| *two == wanted && *three == found.code())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str, check: ConstraintCheck) -> f64 {
        grade(text, &[check], CodeScoring::AllPass).score
    }

    #[test]
    fn counts() {
        assert_eq!(one("a b c", ConstraintCheck::WordCount { min: Some(3), max: Some(3) }), 1.0);
        assert_eq!(one("a b c d", ConstraintCheck::WordCount { min: None, max: Some(3) }), 0.0);
        assert_eq!(
            one("One. Two! Three?", ConstraintCheck::SentenceCount { min: Some(3), max: None }),
            1.0
        );
        assert_eq!(
            one(
                "p1\n\np2\n***\np3",
                ConstraintCheck::ParagraphCount { min: Some(3), max: Some(3) }
            ),
            1.0
        );
        assert_eq!(
            one("* a\n* b\n- c\nx", ConstraintCheck::BulletCount { min: Some(3), max: Some(3) }),
            1.0
        );
    }

    #[test]
    fn keywords_case_json_affixes() {
        let inc = ConstraintCheck::IncludeKeywords {
            keywords: vec!["cat".into()],
            case_sensitive: false,
        };
        assert_eq!(one("The Cat sat", inc.clone()), 1.0);
        assert_eq!(one("concatenate", inc), 0.0);
        let exc = ConstraintCheck::ExcludeKeywords {
            keywords: vec!["dog".into()],
            case_sensitive: false,
        };
        assert_eq!(one("a DOG", exc), 0.0);
        assert_eq!(one("```json\n{\"a\": 1}\n```", ConstraintCheck::ValidJson {}), 1.0);
        assert_eq!(one("{a: 1}", ConstraintCheck::ValidJson {}), 0.0);
        assert_eq!(one("all lower", ConstraintCheck::Lowercase {}), 1.0);
        assert_eq!(one("ALL UPPER 1", ConstraintCheck::Uppercase {}), 1.0);
        assert_eq!(
            one("  Dear sir, hi. P.S.", ConstraintCheck::StartsWith { prefix: "Dear".into() }),
            1.0
        );
        assert_eq!(
            one(
                "hi. Any other questions?",
                ConstraintCheck::EndsWith { suffix: "questions?".into() }
            ),
            1.0
        );
    }

    #[test]
    fn language_detection() {
        let fr = "Le chat est assis sur le tapis et il regarde les oiseaux dans le jardin.";
        assert_eq!(one(fr, ConstraintCheck::Language { language: "fr".into() }), 1.0);
        assert_eq!(one(fr, ConstraintCheck::Language { language: "en".into() }), 0.0);
    }

    #[test]
    fn fraction_scoring() {
        let checks = vec![ConstraintCheck::Lowercase {}, ConstraintCheck::Uppercase {}];
        assert_eq!(grade("abc", &checks, CodeScoring::Fraction).score, 0.5);
        assert_eq!(grade("abc", &checks, CodeScoring::AllPass).score, 0.0);
    }
}
