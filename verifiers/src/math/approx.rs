//! Decimal approximations of exact values: `0.3333` for `\frac{1}{3}`, `3.14159` for `\pi`.
//!
//! The rule: the candidate is a plain decimal (`[-]digits.digits`, after LaTeX normalisation)
//! with `d` decimal places and at least [`MIN_SIGNIFICANT_DIGITS`] significant digits; the
//! reference is one expression without variables whose exact value has no terminating decimal
//! expansion (an irrational number such as `\pi` or `\sqrt{2}`, or a fraction such as 1/3). The
//! candidate matches when it is that value rounded to `d` places (within half a unit of the last
//! place) or truncated to `d` places (toward zero). A reference that is a terminating decimal
//! (`0.75`, `12`, `\frac{3}{8}`) is only matched by its exact value.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};

use super::answer::Answer;
use super::expr::{eval, Val};
use super::normalize::normalize;

/// Fewest significant digits a decimal needs to stand for an exact value (`0.3333` does,
/// `0.333` and `3.14` do not).
pub const MIN_SIGNIFICANT_DIGITS: usize = 4;
/// Most significant digits checked against a floating-point value (irrational references);
/// beyond that, the relative tolerance of the value comparison decides.
const MAX_FLOAT_DIGITS: usize = 12;
/// Work budget for evaluating the reference.
const BUDGET: u32 = 10_000;

/// A decimal literal: its sign, its digits as an integer, its decimal places.
struct Decimal {
    scaled: BigInt,
    places: usize,
    significant: usize,
}

fn parse_decimal(raw: &str) -> Option<Decimal> {
    let text: String = normalize(raw).chars().filter(|c| !c.is_whitespace()).collect();
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (whole, fraction) = unsigned.split_once('.')?;
    if fraction.is_empty()
        || !whole.chars().all(|c| c.is_ascii_digit())
        || !fraction.chars().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let significant = digits.trim_start_matches('0').len();
    let magnitude: BigInt = digits.parse().ok()?;
    Some(Decimal {
        scaled: if negative { -magnitude } else { magnitude },
        places: fraction.len(),
        significant,
    })
}

/// Whether `rational` has a terminating decimal expansion (its denominator is 2^a·5^b).
fn terminates(rational: &BigRational) -> bool {
    let mut denominator = rational.denom().clone();
    for prime in [2u32, 5] {
        let p = BigInt::from(prime);
        while (&denominator % &p).is_zero() {
            denominator /= &p;
        }
    }
    denominator == BigInt::from(1)
}

/// The number of decimal places when `candidate` is `reference`'s exact value rounded or
/// truncated to the places it gives (see the module documentation), else `None`.
pub fn decimal_places_matched(candidate: &str, reference: &Answer) -> Option<usize> {
    let Answer::Expr(expr) = reference else { return None };
    let decimal = parse_decimal(candidate)?;
    if decimal.significant < MIN_SIGNIFICANT_DIGITS {
        return None;
    }
    let mut vars = Vec::new();
    expr.vars(&mut vars);
    if !vars.is_empty() {
        return None;
    }
    let no_vars = |_: &str| None;
    let mut budget = BUDGET;
    let matched = match eval(expr, &no_vars, &mut budget)? {
        Val::Rat(exact) => !terminates(&exact) && rational_matches(&decimal, &exact),
        Val::F(value) => float_matches(&decimal, value),
    };
    matched.then_some(decimal.places)
}

fn rational_matches(decimal: &Decimal, exact: &BigRational) -> bool {
    let unit = num_traits::pow(BigInt::from(10), decimal.places);
    let scaled = exact * BigRational::from_integer(unit);
    let candidate = BigRational::from_integer(decimal.scaled.clone());
    let rounded = (&candidate - &scaled).abs() * BigRational::from_integer(2.into())
        <= BigRational::from_integer(1.into());
    rounded || scaled.trunc().to_integer() == decimal.scaled
}

fn float_matches(decimal: &Decimal, value: f64) -> bool {
    if decimal.significant > MAX_FLOAT_DIGITS || !value.is_finite() {
        return false;
    }
    let Ok(places) = i32::try_from(decimal.places) else { return false };
    let Some(candidate) = decimal.scaled.to_f64() else { return false };
    let scaled = value * 10f64.powi(places);
    // floating-point noise of the evaluation, in units of the last place
    let slack = 8.0 * f64::EPSILON * scaled.abs().max(1.0);
    if (candidate - scaled).abs() <= 0.5 + slack {
        return true;
    }
    // Truncation, unless the value is (up to noise) a decimal with this many places: then
    // 2.9999999999999996 stands for 3, and truncating it to 2.9999 would be wrong.
    let is_short_decimal = (scaled - scaled.round()).abs() <= slack;
    !is_short_decimal
        && candidate.signum() == scaled.signum()
        && candidate.abs() <= scaled.abs() + slack
        && scaled.abs() - candidate.abs() < 1.0
}

#[cfg(test)]
mod tests {
    use super::super::answer::parse_answer;
    use super::*;

    fn places(candidate: &str, reference: &str) -> Option<usize> {
        decimal_places_matched(candidate, &parse_answer(reference))
    }

    #[test]
    fn rounded_or_truncated_to_the_given_places() {
        assert_eq!(places("0.3333", r"\frac{1}{3}"), Some(4));
        assert_eq!(places("0.333333", r"\frac{1}{3}"), Some(6));
        assert_eq!(places("0.6667", r"\frac{2}{3}"), Some(4));
        assert_eq!(places("0.6666", r"\frac{2}{3}"), Some(4));
        assert_eq!(places("-0.6667", r"-\frac{2}{3}"), Some(4));
        assert_eq!(places("3.14159", r"\pi"), Some(5));
        assert_eq!(places("3.1416", r"\pi"), Some(4));
        assert_eq!(places("1.41421", r"\sqrt{2}"), Some(5));
        assert_eq!(places("$1.4142$", r"\sqrt{2}"), Some(4));
    }

    #[test]
    fn too_short_wrong_or_exact_references_do_not_match() {
        assert_eq!(places("0.3", r"\frac{1}{3}"), None);
        assert_eq!(places("0.333", r"\frac{1}{3}"), None);
        assert_eq!(places("3.14", r"\pi"), None);
        assert_eq!(places("0.3334", r"\frac{1}{3}"), None);
        assert_eq!(places("0.6668", r"\frac{2}{3}"), None);
        assert_eq!(places("3.1415", r"-\pi"), None);
        assert_eq!(places("3.14160", r"\pi"), None);
        // terminating decimals are compared exactly
        assert_eq!(places("0.7499", "0.75"), None);
        assert_eq!(places("0.1250", r"\frac{1}{8}"), None);
        // a float that stands for a whole number is not truncated
        assert_eq!(places("2.9999", r"\log_2 8"), None);
        // only plain decimals, only expressions without variables
        assert_eq!(places("3333", r"\frac{10000}{3}"), None);
        assert_eq!(places("0.3333x", r"\frac{x}{3}"), None);
        assert_eq!(places("0.3333", r"\frac{x}{3}"), None);
    }
}
