//! `math`: final-answer extraction, LaTeX normalisation and equivalence by value.
//!
//! Every step is bounded (input length, parser depth, evaluation budget, exact-power size), so a
//! comparison is safe on any thread without signals or timeouts; nothing is ever `eval`ed.

pub mod answer;
pub mod approx;
pub mod cases;
pub mod expr;
pub mod extract;
pub mod normalize;

use crate::result::GradeResult;
use crate::spec::MathExtract;

pub use answer::{equivalent, parse_answer, Answer};

/// Longest final answer compared, in bytes; longer ones score 0.
const MAX_ANSWER_LEN: usize = 1000;

/// Whether two raw answers (LaTeX or plain) are mathematically equivalent.
pub fn answers_match(a: &str, b: &str) -> bool {
    if a.len() > MAX_ANSWER_LEN || b.len() > MAX_ANSWER_LEN {
        return false;
    }
    equivalent(&parse_answer(a), &parse_answer(b))
}

/// Grades a completion against a reference answer: the last final answer must equal the
/// reference by value (or be a decimal approximation of it, see [`approx`]), several different
/// final answers score 0, and so does a box left open.
pub fn grade(completion: &str, reference: &str, extract: MathExtract) -> GradeResult {
    let candidates = match extract::candidates(completion, extract) {
        Ok(candidates) => candidates,
        Err(unterminated) => return GradeResult::pass_fail(false, unterminated.to_string()),
    };
    let Some(last) = candidates.last() else {
        return GradeResult::pass_fail(false, "no final answer found");
    };
    if candidates.iter().any(|c| c.len() > MAX_ANSWER_LEN) {
        return GradeResult::pass_fail(false, "final answer too long");
    }
    let predicted = parse_answer(last);
    if candidates.len() > 1 {
        let distinct = candidates[..candidates.len() - 1]
            .iter()
            .any(|c| !equivalent(&parse_answer(c), &predicted));
        if distinct {
            return GradeResult::pass_fail(
                false,
                format!("{} different final answers given", candidates.len()),
            );
        }
    }
    let reference = extract::reference_answer(reference);
    if reference.len() > MAX_ANSWER_LEN {
        return GradeResult::pass_fail(false, "reference answer too long to compare");
    }
    let expected = parse_answer(&reference);
    if equivalent(&predicted, &expected) {
        GradeResult::pass_fail(true, format!("answer '{}' equals the reference", last.trim()))
    } else if let Some(places) = approx::decimal_places_matched(last, &expected) {
        GradeResult::pass_fail(
            true,
            format!("answer '{}' is the reference's value to {places} decimal places", last.trim()),
        )
    } else {
        GradeResult::pass_fail(
            false,
            format!("answer '{}' differs from the reference '{}'", last.trim(), reference.trim()),
        )
    }
}
