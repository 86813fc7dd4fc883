//! `string_check`: eq / ne / like / ilike.

use crate::result::GradeResult;
use crate::spec::StringOperation;

/// Grades `input` against `reference` with `operation`.
pub fn grade(input: &str, reference: &str, operation: StringOperation) -> GradeResult {
    let passed = match operation {
        StringOperation::Eq => input == reference,
        StringOperation::Ne => input != reference,
        StringOperation::Like => input.contains(reference),
        StringOperation::Ilike => input.to_lowercase().contains(&reference.to_lowercase()),
    };
    let op = match operation {
        StringOperation::Eq => "equals",
        StringOperation::Ne => "differs from",
        StringOperation::Like => "contains",
        StringOperation::Ilike => "contains (ignoring case)",
    };
    let verdict = if passed { "" } else { "not " };
    GradeResult::pass_fail(passed, format!("input {verdict}satisfied: {op} reference"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations() {
        assert_eq!(grade("abc", "abc", StringOperation::Eq).score, 1.0);
        assert_eq!(grade("abc", "abd", StringOperation::Eq).score, 0.0);
        assert_eq!(grade("abc", "abd", StringOperation::Ne).score, 1.0);
        assert_eq!(grade("xabcx", "abc", StringOperation::Like).score, 1.0);
        assert_eq!(grade("xABCx", "abc", StringOperation::Like).score, 0.0);
        assert_eq!(grade("xABCx", "abc", StringOperation::Ilike).score, 1.0);
    }
}
