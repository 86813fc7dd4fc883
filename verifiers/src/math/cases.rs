//! The shared table of math equivalence cases (tests, `verity bench graders`, the Math-Verify
//! comparison script all read `tests/data/math_cases.tsv`).

/// The raw table: `expected<TAB>reference<TAB>response`, `#` comments.
pub const TABLE: &str = include_str!("../../tests/data/math_cases.tsv");

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MathCase {
    /// Whether the response must be graded correct.
    pub expected: bool,
    /// The reference answer.
    pub reference: String,
    /// A bare answer or a full response.
    pub response: String,
}

impl MathCase {
    /// The response as a completion: bare answers are wrapped in `\boxed{}`.
    pub fn completion(&self) -> String {
        let r = &self.response;
        let full = r.contains("\\boxed")
            || r.contains("\\fbox")
            || r.contains("<answer>")
            || r.contains("answer")
            || (r.contains(' ') && r.chars().filter(|c| c.is_alphabetic()).count() > 12);
        if full {
            r.clone()
        } else {
            format!("\\boxed{{{r}}}")
        }
    }
}

/// Every case of the table.
pub fn table() -> Vec<MathCase> {
    TABLE
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut parts = l.splitn(3, '\t');
            let expected = parts.next()? == "1";
            Some(MathCase {
                expected,
                reference: parts.next()?.to_string(),
                response: parts.next()?.to_string(),
            })
        })
        .collect()
}
