//! Answers as structures (expressions, equations, tuples, intervals, sets, text) and their
//! equivalence by value.

use num_rational::BigRational;
use num_traits::Zero;

use super::expr::{eval, tokenize, Expr, Parser, Tok, Val};
use super::normalize::normalize;

/// Work budget (evaluation steps) for one comparison.
const COMPARISON_BUDGET: u32 = 200_000;
/// Most items compared in a list or set.
const MAX_ITEMS: usize = 64;
/// Points at which expressions with variables are compared.
const SAMPLE_POINTS: usize = 6;

/// A parsed final answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A single expression.
    Expr(Expr),
    /// `lhs = rhs`.
    Equation(Expr, Expr),
    /// A bracketed tuple or interval: `(`/`[` … `)`/`]`.
    Bracketed {
        /// Opening bracket.
        open: char,
        /// Closing bracket.
        close: char,
        /// Items in order.
        items: Vec<Answer>,
    },
    /// An order-insensitive collection: `\{…\}`, a bare comma list, "a or b".
    Set(Vec<Answer>),
    /// A union of intervals.
    Union(Vec<Answer>),
    /// A matrix or vector (`\begin{pmatrix}…\end{pmatrix}`), rows of cells.
    Matrix(Vec<Vec<Answer>>),
    /// Anything else, compared as normalised text.
    Text(String),
}

/// Parses a raw answer (LaTeX or plain).
pub fn parse_answer(raw: &str) -> Answer {
    if let Some(matrix) = parse_matrix(raw) {
        return matrix;
    }
    let normalized = normalize(raw);
    if is_prose(&normalized) {
        return Answer::Text(canonical_text(&normalized));
    }
    match tokenize(&normalized) {
        Some(toks) if !toks.is_empty() => {
            structure(&toks, 0).unwrap_or_else(|| Answer::Text(canonical_text(&normalized)))
        }
        _ => Answer::Text(canonical_text(&normalized)),
    }
}

/// `\begin{pmatrix} a & b \\ c & d \end{pmatrix}` (and bmatrix, matrix, …) as rows of cells.
fn parse_matrix(raw: &str) -> Option<Answer> {
    static MATRIX: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r"(?s)^[\s$]*\\begin\{[pbBvV]?matrix\}(.*)\\end\{[pbBvV]?matrix\}[\s$.]*$",
        )
        .unwrap_or_else(|e| panic!("static regex: {e}"))
    });
    let body = MATRIX.captures(raw.trim())?.get(1)?.as_str();
    if body.contains("\\begin") {
        return None;
    }
    let rows: Vec<Vec<Answer>> = body
        .split("\\\\")
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(|row| row.split('&').map(parse_answer).collect())
        .collect();
    (!rows.is_empty() && rows.len() <= MAX_ITEMS).then_some(Answer::Matrix(rows))
}

/// Letters and spaces only, with a word of two or more letters: a word answer, not a product.
fn is_prose(s: &str) -> bool {
    let t = s.trim().trim_start_matches('(').trim_end_matches(')');
    t.chars().all(|c| c.is_alphabetic() || c.is_whitespace())
        && t.split_whitespace().any(|w| w.chars().count() >= 2 && !matches!(w, "or" | "and" | "pi"))
}

/// Text compared literally: lower case, no spaces, no braces, `(a)` → `a`.
fn canonical_text(s: &str) -> String {
    let t: String = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '{' && *c != '}')
        .collect::<String>()
        .to_lowercase();
    let t = t
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .filter(|x| x.chars().count() == 1)
        .map_or(t.clone(), str::to_string);
    t
}

fn is_open(t: &Tok) -> bool {
    matches!(t, Tok::Sym('(' | '[' | '{' | '⦃'))
}

fn is_close(t: &Tok) -> bool {
    matches!(t, Tok::Sym(')' | ']' | '}' | '⦄'))
}

/// Splits at top-level separators chosen by `is_sep`.
fn split_top(toks: &[Tok], is_sep: impl Fn(&Tok) -> bool) -> Vec<&[Tok]> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, t) in toks.iter().enumerate() {
        if is_open(t) {
            depth += 1;
        } else if is_close(t) {
            depth -= 1;
        } else if depth == 0 && is_sep(t) {
            parts.push(&toks[start..i]);
            start = i + 1;
        }
    }
    parts.push(&toks[start..]);
    parts
}

/// Index of the token closing the bracket opened at 0, ignoring bracket kinds (intervals mix them).
fn closing_index(toks: &[Tok]) -> Option<usize> {
    let mut depth = 0i32;
    for (i, t) in toks.iter().enumerate() {
        if is_open(t) {
            depth += 1;
        } else if is_close(t) {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

fn structure(toks: &[Tok], depth: usize) -> Option<Answer> {
    if depth > 8 || toks.is_empty() {
        return None;
    }
    // a \pm b: both signs
    let pm: Vec<usize> =
        toks.iter().enumerate().filter(|(_, t)| **t == Tok::Sym('±')).map(|(i, _)| i).collect();
    if pm.len() == 1 && split_top(toks, |t| *t == Tok::Sym('±')).len() == 2 {
        let with = |sign: char| {
            let mut v = toks.to_vec();
            v[pm[0]] = Tok::Sym(sign);
            v
        };
        let plus = structure(&with('+'), depth + 1)?;
        let minus = structure(&with('-'), depth + 1)?;
        return Some(Answer::Set(vec![plus, minus]));
    }
    if let Some(interval) = inequality(toks) {
        return Some(interval);
    }
    // a or b, a and b, a; b
    let alternatives = split_top(toks, |t| matches!(t, Tok::Word(_) | Tok::Sym(';')));
    if alternatives.len() > 1 {
        return list(alternatives, depth, Answer::Set);
    }
    let unions = split_top(toks, |t| *t == Tok::Sym('∪'));
    if unions.len() > 1 {
        return list(unions, depth, Answer::Union);
    }
    let first = toks.first()?;
    let last = toks.last()?;
    if closing_index(toks) == Some(toks.len() - 1) {
        let inner = &toks[1..toks.len() - 1];
        let items = split_top(inner, |t| *t == Tok::Sym(','));
        if *first == Tok::Sym('⦃') {
            let items = if inner.is_empty() { vec![] } else { items };
            return list(items, depth, Answer::Set);
        }
        if items.len() > 1 {
            if let (Tok::Sym(open @ ('(' | '[')), Tok::Sym(close @ (')' | ']'))) = (first, last) {
                let parsed = items
                    .into_iter()
                    .map(|i| structure(i, depth + 1))
                    .collect::<Option<Vec<_>>>()?;
                if parsed.len() > MAX_ITEMS {
                    return None;
                }
                return Some(Answer::Bracketed { open: *open, close: *close, items: parsed });
            }
        }
    }
    let items = split_top(toks, |t| *t == Tok::Sym(','));
    if items.len() > 1 {
        return list(items, depth, Answer::Set);
    }
    // x \in [a, b]
    let member = split_top(toks, |t| *t == Tok::Sym('∈'));
    if member.len() == 2 {
        return structure(member[1], depth + 1);
    }
    let sides = split_top(toks, |t| *t == Tok::Sym('='));
    if sides.len() > 1 {
        let lhs = expression(sides[0])?;
        let rhs = expression(sides[sides.len() - 1])?;
        return Some(Answer::Equation(lhs, rhs));
    }
    expression(toks).map(Answer::Expr)
}

fn is_relation(t: &Tok) -> bool {
    matches!(t, Tok::Sym('<' | '>' | '≤' | '≥'))
}

/// `x > 3`, `3 \le x`, `1 < x \le 5` as the interval they describe.
fn inequality(toks: &[Tok]) -> Option<Answer> {
    let ops: Vec<&Tok> = toks.iter().filter(|t| is_relation(t)).collect();
    if ops.is_empty() || ops.len() > 2 {
        return None;
    }
    let parts = split_top(toks, is_relation);
    if parts.len() != ops.len() + 1 {
        return None;
    }
    let is_var = |p: &[Tok]| matches!(p, [Tok::Ident(_)]);
    let inf = || Expr::Inf;
    let neg_inf = || Expr::Neg(Box::new(Expr::Inf));
    let strict = |t: &Tok| matches!(t, Tok::Sym('<' | '>'));
    let less = |t: &Tok| matches!(t, Tok::Sym('<' | '≤'));
    let interval = |lo: Expr, lo_open: bool, hi: Expr, hi_open: bool| Answer::Bracketed {
        open: if lo_open { '(' } else { '[' },
        close: if hi_open { ')' } else { ']' },
        items: vec![Answer::Expr(lo), Answer::Expr(hi)],
    };
    match (parts.as_slice(), ops.as_slice()) {
        ([x, bound], [op]) if is_var(x) => {
            let b = expression(bound)?;
            Some(if less(op) {
                interval(neg_inf(), true, b, strict(op))
            } else {
                interval(b, strict(op), inf(), true)
            })
        }
        ([bound, x], [op]) if is_var(x) => {
            let b = expression(bound)?;
            Some(if less(op) {
                interval(b, strict(op), inf(), true)
            } else {
                interval(neg_inf(), true, b, strict(op))
            })
        }
        ([a, x, c], [op1, op2]) if is_var(x) && less(op1) == less(op2) => {
            let (a, c) = (expression(a)?, expression(c)?);
            Some(if less(op1) {
                interval(a, strict(op1), c, strict(op2))
            } else {
                interval(c, strict(op2), a, strict(op1))
            })
        }
        _ => None,
    }
}

fn list(parts: Vec<&[Tok]>, depth: usize, make: fn(Vec<Answer>) -> Answer) -> Option<Answer> {
    if parts.len() > MAX_ITEMS {
        return None;
    }
    let parsed = parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .map(|p| structure(p, depth + 1))
        .collect::<Option<Vec<_>>>()?;
    Some(make(parsed))
}

fn expression(toks: &[Tok]) -> Option<Expr> {
    let mut p = Parser::new(toks.to_vec());
    let e = p.sum(0)?;
    p.done().then_some(e)
}

/// Whether two answers are equal by value (bounded work).
pub fn equivalent(a: &Answer, b: &Answer) -> bool {
    let mut budget = COMPARISON_BUDGET;
    equiv(a, b, &mut budget)
}

fn equiv(a: &Answer, b: &Answer, budget: &mut u32) -> bool {
    use Answer::*;
    match (a, b) {
        (Expr(x), Expr(y)) => expr_equiv(x, y, budget),
        (Equation(l, r), Expr(e)) | (Expr(e), Equation(l, r)) => {
            (is_name(l) && expr_equiv(r, e, budget)) || (is_name(r) && expr_equiv(l, e, budget))
        }
        (Equation(l1, r1), Equation(l2, r2)) => {
            if l1 == l2 && expr_equiv(r1, r2, budget) {
                return true;
            }
            let d1 = super::expr::Expr::Sub(Box::new(l1.clone()), Box::new(r1.clone()));
            let d2 = super::expr::Expr::Sub(Box::new(l2.clone()), Box::new(r2.clone()));
            expr_equiv(&d1, &d2, budget)
        }
        (
            Bracketed { open: o1, close: c1, items: i1 },
            Bracketed { open: o2, close: c2, items: i2 },
        ) => {
            o1 == o2
                && c1 == c2
                && i1.len() == i2.len()
                && i1.iter().zip(i2).all(|(x, y)| equiv(x, y, budget))
        }
        // a bare list "1, 2" against the tuple "(1, 2)": same items in the same order
        (Bracketed { open: '(', close: ')', items: i1 }, Set(i2))
        | (Set(i2), Bracketed { open: '(', close: ')', items: i1 }) => {
            i1.len() == i2.len() && i1.iter().zip(i2).all(|(x, y)| equiv(x, y, budget))
        }
        (Set(i1), Set(i2)) | (Union(i1), Union(i2)) => unordered_equiv(i1, i2, budget),
        (Set(items), other) | (other, Set(items)) if items.len() == 1 => {
            equiv(&items[0], other, budget)
        }
        (Union(items), other) | (other, Union(items)) if items.len() == 1 => {
            equiv(&items[0], other, budget)
        }
        (Matrix(r1), Matrix(r2)) => {
            r1.len() == r2.len()
                && r1.iter().zip(r2).all(|(a, b)| {
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| equiv(x, y, budget))
                })
        }
        (Text(x), Text(y)) => x == y,
        _ => false,
    }
}

/// `Some(±1)` for a literal `\infty` / `-\infty`.
fn infinity_sign(e: &Expr) -> Option<i8> {
    match e {
        Expr::Inf => Some(1),
        Expr::Neg(inner) => infinity_sign(inner).map(|s| -s),
        _ => None,
    }
}

/// A name on the left of `=`: `x`, or function notation `f(x)`.
fn is_name(e: &Expr) -> bool {
    match e {
        Expr::Var(_) => true,
        Expr::Mul(f, x) => matches!((&**f, &**x), (Expr::Var(_), Expr::Var(_))),
        _ => false,
    }
}

fn unordered_equiv(a: &[Answer], b: &[Answer], budget: &mut u32) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut used = vec![false; b.len()];
    'outer: for x in a {
        for (j, y) in b.iter().enumerate() {
            if !used[j] && equiv(x, y, budget) {
                used[j] = true;
                continue 'outer;
            }
        }
        return false;
    }
    true
}

/// Deterministic sample values for variables (positive, distinct, awkward rationals).
fn sample_value(var_index: usize, point: usize) -> BigRational {
    const NUM: [i64; 7] = [3, 5, 11, 13, 17, 19, 23];
    const DEN: [i64; 7] = [7, 3, 5, 11, 6, 13, 9];
    let k = (point + 3 * var_index) % NUM.len();
    BigRational::new(NUM[k].into(), DEN[k].into())
        + BigRational::from_integer((var_index as i64 + 1).into())
}

fn values_equal(x: &Val, y: &Val) -> bool {
    match (x, y) {
        (Val::Rat(a), Val::Rat(b)) => a == b,
        _ => {
            let (a, b) = (x.f(), y.f());
            if a.is_infinite() || b.is_infinite() {
                return a == b;
            }
            let scale = a.abs().max(b.abs());
            (a - b).abs() <= 1e-8 * scale.max(1e-300) || (a - b).abs() < 1e-12
        }
    }
}

fn expr_equiv(x: &Expr, y: &Expr, budget: &mut u32) -> bool {
    // equal as written, or up to the order of the operands of + and ·
    if x == y || x.canonical() == y.canonical() {
        return true;
    }
    // a percentage also matches its bare number: 50% ~ 50 and 50% ~ 0.5
    let strip = |e: &Expr| match e {
        Expr::Percent(inner) => Some((**inner).clone()),
        _ => None,
    };
    if let Some(inner) = strip(x) {
        if value_equiv(&inner, y, budget) {
            return true;
        }
    }
    if let Some(inner) = strip(y) {
        if value_equiv(x, &inner, budget) {
            return true;
        }
    }
    value_equiv(x, y, budget)
}

fn value_equiv(x: &Expr, y: &Expr, budget: &mut u32) -> bool {
    let mut vars = Vec::new();
    x.vars(&mut vars);
    y.vars(&mut vars);
    if vars.is_empty() {
        let no_vars = |_: &str| None;
        return match (eval(x, &no_vars, budget), eval(y, &no_vars, budget)) {
            // an overflow is not infinity: 2^{10000} and 3^{10000} must not compare equal
            (Some(a), Some(b)) if !a.f().is_finite() || !b.f().is_finite() => {
                infinity_sign(x).is_some() && infinity_sign(x) == infinity_sign(y)
            }
            (Some(a), Some(b)) => values_equal(&a, &b),
            _ => false,
        };
    }
    if vars.len() > 8 {
        return false;
    }
    let mut agreeing = 0;
    for point in 0..SAMPLE_POINTS {
        let env = |name: &str| vars.iter().position(|v| v == name).map(|i| sample_value(i, point));
        match (eval(x, &env, budget), eval(y, &env, budget)) {
            (Some(a), Some(b)) => {
                let relaxed = matches!((&a, &b), (Val::F(_), _) | (_, Val::F(_)));
                let same = if relaxed {
                    let (p, q) = (a.f(), b.f());
                    (p - q).abs() <= 1e-6 * p.abs().max(q.abs()).max(1.0)
                } else {
                    values_equal(&a, &b)
                };
                if !same {
                    return false;
                }
                agreeing += 1;
            }
            (None, None) => {}
            _ => return false,
        }
        if *budget == 0 {
            return false;
        }
    }
    agreeing >= 2
}

/// Whether the answer is a bare number (used for reasons and tests).
pub fn is_zero_number(a: &Answer) -> bool {
    matches!(a, Answer::Expr(Expr::Num(n)) if n.is_zero())
}
