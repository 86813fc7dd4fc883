//! `format`: the think/answer structure or a user regex over the whole text.

use regex::Regex;

use crate::result::GradeResult;

/// `<think>…</think>` then a non-empty answer; exactly one think block.
pub fn think_answer(text: &str) -> GradeResult {
    match think_split(text) {
        Err(reason) => GradeResult::pass_fail(false, reason),
        Ok(after) if after.trim().is_empty() => {
            GradeResult::pass_fail(false, "no answer after </think>")
        }
        Ok(_) => GradeResult::pass_fail(true, "one <think> block followed by an answer"),
    }
}

/// `<think>…</think>` then exactly one non-empty `<answer>…</answer>` and nothing after it.
pub fn think_answer_tag(text: &str) -> GradeResult {
    let after = match think_split(text) {
        Err(reason) => return GradeResult::pass_fail(false, reason),
        Ok(after) => after.trim(),
    };
    let ok = after.starts_with("<answer>")
        && after.ends_with("</answer>")
        && after.matches("<answer>").count() == 1
        && after.matches("</answer>").count() == 1
        && !after["<answer>".len()..after.len() - "</answer>".len()].trim().is_empty();
    if ok {
        GradeResult::pass_fail(true, "<think> block then one <answer> block")
    } else {
        GradeResult::pass_fail(false, "after </think> there must be exactly one non-empty <answer>…</answer> and nothing else")
    }
}

/// Splits off a leading non-empty think block; returns the text after `</think>`.
fn think_split(text: &str) -> Result<&str, &'static str> {
    let trimmed = text.trim_start();
    if !trimmed.starts_with("<think>") {
        return Err("the text does not start with <think>");
    }
    if text.matches("<think>").count() != 1 || text.matches("</think>").count() != 1 {
        return Err("there must be exactly one <think> and one </think>");
    }
    let end = trimmed.find("</think>").ok_or("no </think>")?;
    if trimmed["<think>".len()..end].trim().is_empty() {
        return Err("the <think> block is empty");
    }
    Ok(&trimmed[end + "</think>".len()..])
}

/// The whole text matches `pattern` (compiled with `^(?s:…)$`).
pub fn regex_match(text: &str, pattern: &Regex) -> GradeResult {
    if pattern.is_match(text) {
        GradeResult::pass_fail(true, "the text matches the pattern")
    } else {
        GradeResult::pass_fail(false, "the text does not match the pattern")
    }
}

/// Compiles a user pattern anchored to the whole text (size-limited, linear-time engine).
pub fn compile_full_match(pattern: &str) -> Result<Regex, regex::Error> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .dot_matches_new_line(true)
        .size_limit(1 << 20)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chapter_example_passes() {
        let resp = "<think>1/2 + 1/4 = 3/4</think> The answer is \\boxed{\\frac{3}{4}}";
        assert_eq!(think_answer(resp).score, 1.0);
    }

    #[test]
    fn malformed_think_fails() {
        for bad in [
            "no think",
            "<think></think> x",
            "<think>a</think>",
            "<think>a</think><think>b</think> x",
            "x <think>a</think> y",
        ] {
            assert_eq!(think_answer(bad).score, 0.0, "{bad}");
        }
    }

    #[test]
    fn answer_tag_preset() {
        assert_eq!(think_answer_tag("<think>r</think>\n<answer>4</answer>\n").score, 1.0);
        assert_eq!(think_answer_tag("<think>r</think><answer>4</answer> extra").score, 0.0);
        assert_eq!(
            think_answer_tag("<think>r</think><answer>4</answer><answer>5</answer>").score,
            0.0
        );
        assert_eq!(think_answer_tag("<think>r</think><answer> </answer>").score, 0.0);
    }

    #[test]
    fn regex_is_anchored() {
        let re = compile_full_match(r"\d+").unwrap();
        assert_eq!(regex_match("123", &re).score, 1.0);
        assert_eq!(regex_match("a123", &re).score, 0.0);
    }
}
