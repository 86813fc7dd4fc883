//! Finding the final answer(s) in a completion: `\boxed{}`, `<answer>`, "the answer is", last number.

use std::sync::LazyLock;

use regex::Regex;

use crate::spec::MathExtract;

/// Longest completion scanned, in bytes (longer text is scanned from its tail).
const MAX_SCAN: usize = 200_000;
/// Most box-in-box levels unwrapped (`\boxed{\boxed{5}}`).
const MAX_BOX_NESTING: usize = 8;
/// The box commands.
const BOX_COMMANDS: &[&str] = &["\\boxed", "\\fbox"];
/// Text commands that may wrap an inner box (`\boxed{\text{\boxed{5}}}`).
const TEXT_WRAPPERS: &[&str] = &["\\text", "\\textbf", "\\mathrm", "\\mbox"];

/// A `\boxed{` (or `\fbox{`) whose brace is never closed: the final answer is cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unterminated \\boxed{{: the final answer is cut off")]
pub struct Unterminated;

/// Every final-answer candidate in order of appearance, for the chosen extraction mode.
/// Several candidates are compared by the caller: different ones are a hacking attempt.
/// A box left open (`\boxed{42`) is an error in every mode that reads boxes: it is neither
/// closed silently nor skipped in favour of a weaker extraction.
pub fn candidates(text: &str, mode: MathExtract) -> Result<Vec<String>, Unterminated> {
    let text = tail(text, MAX_SCAN);
    Ok(match mode {
        MathExtract::Boxed => boxes(text)?,
        MathExtract::AnswerTag => answer_tags(text)?,
        MathExtract::LastNumber => last_number(text).into_iter().collect(),
        MathExtract::Auto => {
            let boxed = boxes(text)?;
            if !boxed.is_empty() {
                return Ok(boxed);
            }
            let tags = answer_tags(text)?;
            if !tags.is_empty() {
                return Ok(tags);
            }
            if let Some(a) = answer_is(text) {
                return Ok(vec![a]);
            }
            last_number(text).into_iter().collect()
        }
    })
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

/// Contents of every closed `\boxed{…}` / `\fbox{…}` (nested braces) and `\boxed x`; a box that
/// holds only another box (`\boxed{\boxed{5}}`, `\boxed{\text{\boxed{5}}}`) gives the inner one.
pub fn boxed_all(text: &str) -> Vec<String> {
    scan_boxes(text).0
}

/// The closed boxes of `text`, or [`Unterminated`] when one is left open.
fn boxes(text: &str) -> Result<Vec<String>, Unterminated> {
    match scan_boxes(text) {
        (_, true) => Err(Unterminated),
        (found, false) => Ok(found),
    }
}

/// The contents of the closed boxes, and whether a box was left open.
fn scan_boxes(text: &str) -> (Vec<String>, bool) {
    let mut out = Vec::new();
    let mut unterminated = false;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // Bytes, not `&text[i..]`: `i` steps through multi-byte characters.
        let rest = &bytes[i..];
        let Some(skip) =
            BOX_COMMANDS.iter().find(|c| rest.starts_with(c.as_bytes())).map(|c| c.len())
        else {
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
                    out.push(innermost(&text[j + 1..end]).to_string());
                    i = end + 1;
                }
                None => {
                    unterminated = true;
                    i = j + 1;
                }
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
    (out, unterminated)
}

/// The content of the innermost box when `content` is only a box (possibly inside `$…$` or a
/// text command such as `\text{}`), else `content` itself.
fn innermost(content: &str) -> &str {
    let mut current = content;
    for _ in 0..MAX_BOX_NESTING {
        let t = strip_dollars(current);
        if let Some(inner) = sole_command(t, BOX_COMMANDS) {
            current = inner;
            continue;
        }
        match sole_command(t, TEXT_WRAPPERS) {
            Some(inner) if sole_command(strip_dollars(inner), BOX_COMMANDS).is_some() => {
                current = inner;
            }
            _ => break,
        }
    }
    current
}

/// `s` trimmed, without one pair of surrounding `$`.
fn strip_dollars(s: &str) -> &str {
    let t = s.trim();
    t.strip_prefix('$').and_then(|x| x.strip_suffix('$')).map_or(t, str::trim)
}

/// The argument of `\cmd{…}` when `s` is exactly that for one of `commands`, else `None`.
fn sole_command<'a>(s: &'a str, commands: &[&str]) -> Option<&'a str> {
    let bytes = s.as_bytes();
    commands.iter().find_map(|cmd| {
        let rest = s.strip_prefix(*cmd)?;
        let open = s.len() - rest.trim_start_matches(' ').len();
        if bytes.get(open) != Some(&b'{') {
            return None;
        }
        let close = matching_brace(bytes, open)?;
        (close + 1 == s.len()).then(|| &s[open + 1..close])
    })
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
fn answer_tags(text: &str) -> Result<Vec<String>, Unterminated> {
    static TAG: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?s)<answer>(.*?)</answer>").unwrap_or_else(|e| panic!("static regex: {e}"))
    });
    TAG.captures_iter(text)
        .map(|c| {
            let inner = c.get(1).map_or("", |m| m.as_str());
            Ok(boxes(inner)?.pop().unwrap_or_else(|| inner.trim().to_string()))
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
    fn nested_boxes_give_the_inner_content() {
        assert_eq!(boxed_all(r"\boxed{\boxed{5}}"), vec!["5"]);
        assert_eq!(boxed_all(r"\boxed{ \fbox{$\boxed{5}$} }"), vec!["5"]);
        assert_eq!(boxed_all(r"\boxed{\text{\boxed{5}}}"), vec!["5"]);
        assert_eq!(boxed_all(r"\boxed{\text{5}}"), vec![r"\text{5}"]);
        assert_eq!(boxed_all(r"\boxed{\boxed{5}+1}"), vec![r"\boxed{5}+1"]);
    }

    #[test]
    fn an_open_box_is_an_error_not_a_weaker_answer() {
        for mode in [MathExtract::Auto, MathExtract::Boxed] {
            assert_eq!(candidates(r"so \boxed{42", mode), Err(Unterminated));
            assert_eq!(candidates(r"\boxed{3} then \boxed{\boxed{4}", mode), Err(Unterminated));
        }
        assert_eq!(
            candidates(r"<answer>\boxed{4</answer>", MathExtract::AnswerTag),
            Err(Unterminated)
        );
        assert_eq!(candidates(r"\boxed{42 and 42", MathExtract::LastNumber), Ok(vec!["42".into()]));
    }

    #[test]
    fn modes() {
        let found = |text: &str, mode| candidates(text, mode).unwrap();
        assert_eq!(found("<answer>42</answer>", MathExtract::AnswerTag), vec!["42"]);
        assert_eq!(found("So the answer is $7$. Done", MathExtract::Auto), vec!["$7$"]);
        assert_eq!(found("we get 3 then 1,234.5 apples", MathExtract::LastNumber), vec!["1,234.5"]);
        assert_eq!(found("x 3/4", MathExtract::Auto), vec!["3/4"]);
        assert!(found("it is 3", MathExtract::Boxed).is_empty());
    }
}
