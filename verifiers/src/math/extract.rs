//! Finding the final answer(s) in a completion: `\boxed{}`, `<answer>`, "the answer is", last number.

use std::sync::LazyLock;

use regex::Regex;

use crate::spec::MathExtract;

/// Longest completion scanned, in bytes (longer text is scanned from its tail).
const MAX_SCAN: usize = 200_000;

/// Every final-answer candidate in order of appearance, for the chosen extraction mode.
/// Several candidates are compared by the caller: different ones are a hacking attempt.
pub fn candidates(text: &str, mode: MathExtract) -> Vec<String> {
    let text = tail(text, MAX_SCAN);
    match mode {
        MathExtract::Boxed => boxed_all(text),
        MathExtract::AnswerTag => answer_tags(text),
        MathExtract::LastNumber => last_number(text).into_iter().collect(),
        MathExtract::Auto => {
            let boxed = boxed_all(text);
            if !boxed.is_empty() {
                return boxed;
            }
            let tags = answer_tags(text);
            if !tags.is_empty() {
                return tags;
            }
            if let Some(a) = answer_is(text) {
                return vec![a];
            }
            last_number(text).into_iter().collect()
        }
    }
}

/// The reference's answer: its last `\boxed{}` when it has one, else the whole text.
pub fn reference_answer(reference: &str) -> String {
    boxed_all(reference).pop().unwrap_or_else(|| reference.to_string())
}

fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Contents of every `\boxed{…}` / `\fbox{…}` (nested braces) and `\boxed x`.
pub fn boxed_all(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // Bytes, not `&text[i..]`: `i` steps through multi-byte characters.
        let rest = &bytes[i..];
        let skip = if rest.starts_with(b"\\boxed") {
            6
        } else if rest.starts_with(b"\\fbox") {
            5
        } else {
            i += 1;
            continue;
        };
        let mut j = i + skip;
        if j < bytes.len() && bytes[j].is_ascii_alphabetic() {
            i = j; // another command, e.g. \boxedxyz
            continue;
        }
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        if j < bytes.len() && bytes[j] == b'{' {
            match matching_brace(bytes, j) {
                Some(end) => {
                    out.push(text[j + 1..end].to_string());
                    i = end + 1;
                }
                None => i = j + 1,
            }
        } else if j > i + skip {
            // `\boxed 5`: the next token
            let end = text[j..]
                .find(|c: char| c.is_whitespace() || c == '$')
                .map_or(text.len(), |e| j + e);
            if end > j {
                out.push(text[j..end].to_string());
            }
            i = end.max(j + 1);
        } else {
            i = j;
        }
    }
    out
}

/// Index of the `}` closing the `{` at `open`.
pub fn matching_brace(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut k = open;
    while k < bytes.len() {
        match bytes[k] {
            b'\\' => k += 1, // skip escaped char such as \{ or \}
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
        k += 1;
    }
    None
}

/// Contents of every `<answer>…</answer>`; a boxed answer inside a tag wins.
fn answer_tags(text: &str) -> Vec<String> {
    static TAG: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?s)<answer>(.*?)</answer>").unwrap_or_else(|e| panic!("static regex: {e}"))
    });
    TAG.captures_iter(text)
        .map(|c| {
            let inner = c.get(1).map_or("", |m| m.as_str());
            boxed_all(inner).pop().unwrap_or_else(|| inner.trim().to_string())
        })
        .collect()
}

/// The text after the last "the answer is" / "final answer:" up to the end of its sentence.
fn answer_is(text: &str) -> Option<String> {
    static PHRASE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?i)(?:final answer|the answer|answer)\s*(?:is|:)\s*:?")
            .unwrap_or_else(|e| panic!("static regex: {e}"))
    });
    let m = PHRASE.find_iter(text).last()?;
    let rest = &text[m.end()..];
    let line = rest.lines().next().unwrap_or("").trim();
    // cut at a sentence end: a period followed by a space or the end of the line
    let cut = line
        .char_indices()
        .find(|&(i, c)| c == '.' && line[i + 1..].starts_with(' '))
        .map_or(line, |(i, _)| &line[..i]);
    let answer = cut.trim().trim_end_matches('.').trim();
    (!answer.is_empty()).then(|| answer.to_string())
}

/// The last number of the text (integers, decimals, thousands separators, fractions a/b).
fn last_number(text: &str) -> Option<String> {
    static NUMBER: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
            .unwrap_or_else(|e| panic!("static regex: {e}"))
    });
    NUMBER.find_iter(text).last().map(|m| m.as_str().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_after_multibyte_characters() {
        assert_eq!(boxed_all("Check: 𝑥 ∶ 130 = 156, so \\boxed{156} é"), vec!["156"]);
        assert!(boxed_all("𝑥 ∶ 130 = 156").is_empty());
    }

    #[test]
    fn boxed_nested_and_fbox() {
        assert_eq!(boxed_all(r"so \boxed{\frac{1}{2}} and \fbox{3}"), vec![r"\frac{1}{2}", "3"]);
        assert_eq!(boxed_all(r"\boxed 5$"), vec!["5"]);
        assert_eq!(boxed_all(r"\boxed{\{1,2\}}"), vec![r"\{1,2\}"]);
        assert!(boxed_all(r"\boxed{unclosed").is_empty());
    }

    #[test]
    fn modes() {
        assert_eq!(candidates("<answer>42</answer>", MathExtract::AnswerTag), vec!["42"]);
        assert_eq!(candidates("So the answer is $7$. Done", MathExtract::Auto), vec!["$7$"]);
        assert_eq!(
            candidates("we get 3 then 1,234.5 apples", MathExtract::LastNumber),
            vec!["1,234.5"]
        );
        assert_eq!(candidates("x 3/4", MathExtract::Auto), vec!["3/4"]);
    }
}
