//! The safe formula language of `multi`: numbers, names, + - * /, min, max, abs, parentheses.

use std::collections::BTreeMap;

use thiserror::Error;

/// Longest formula accepted, in bytes.
const MAX_FORMULA_LEN: usize = 4096;
/// Deepest nesting accepted.
const MAX_DEPTH: usize = 64;
/// Most operations accepted (bounds the tree depth, hence evaluation recursion).
const MAX_NODES: usize = 512;

/// A formula that could not be parsed or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FormulaError {
    /// The text is not a formula of the language.
    #[error("invalid formula at byte {at}: {message}")]
    Syntax {
        /// Byte offset.
        at: usize,
        /// What was wrong.
        message: String,
    },
    /// A name that is not defined.
    #[error("unknown name '{0}'")]
    UnknownName(String),
    /// Evaluation gave no finite number (e.g. division by zero).
    #[error("formula gave a non-finite value: {0}")]
    NotFinite(String),
}

/// A parsed formula.
#[derive(Debug, Clone, PartialEq)]
pub enum Formula {
    /// A literal.
    Number(f64),
    /// A named value.
    Name(String),
    /// Negation.
    Neg(Box<Formula>),
    /// A binary operation.
    Binary(char, Box<Formula>, Box<Formula>),
    /// min / max / abs.
    Call(String, Vec<Formula>),
}

impl Formula {
    /// Parses a formula.
    pub fn parse(text: &str) -> Result<Self, FormulaError> {
        if text.len() > MAX_FORMULA_LEN {
            return Err(FormulaError::Syntax { at: 0, message: "formula too long".into() });
        }
        let mut parser = Parser { bytes: text.as_bytes(), pos: 0, nodes: 0 };
        let formula = parser.sum(0)?;
        parser.skip_spaces();
        if parser.pos != parser.bytes.len() {
            return Err(parser.error("unexpected trailing input"));
        }
        Ok(formula)
    }

    /// The names the formula reads.
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_names(&mut out);
        out
    }

    fn collect_names(&self, out: &mut Vec<String>) {
        match self {
            Self::Number(_) => {}
            Self::Name(n) => out.push(n.clone()),
            Self::Neg(a) => a.collect_names(out),
            Self::Binary(_, a, b) => {
                a.collect_names(out);
                b.collect_names(out);
            }
            Self::Call(_, args) => args.iter().for_each(|a| a.collect_names(out)),
        }
    }

    /// Evaluates with the given values of names.
    pub fn eval(&self, values: &BTreeMap<String, f64>) -> Result<f64, FormulaError> {
        let v = self.eval_raw(values)?;
        if v.is_finite() {
            Ok(v)
        } else {
            Err(FormulaError::NotFinite(v.to_string()))
        }
    }

    fn eval_raw(&self, values: &BTreeMap<String, f64>) -> Result<f64, FormulaError> {
        Ok(match self {
            Self::Number(n) => *n,
            Self::Name(n) => *values.get(n).ok_or_else(|| FormulaError::UnknownName(n.clone()))?,
            Self::Neg(a) => -a.eval_raw(values)?,
            Self::Binary(op, a, b) => {
                let (a, b) = (a.eval_raw(values)?, b.eval_raw(values)?);
                match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    _ => {
                        if b == 0.0 {
                            return Err(FormulaError::NotFinite("division by zero".into()));
                        }
                        a / b
                    }
                }
            }
            Self::Call(name, args) => {
                let args =
                    args.iter().map(|a| a.eval_raw(values)).collect::<Result<Vec<_>, _>>()?;
                match name.as_str() {
                    "abs" => args[0].abs(),
                    "min" => args.iter().copied().fold(f64::INFINITY, f64::min),
                    _ => args.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                }
            }
        })
    }
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
    nodes: usize,
}

impl Parser<'_> {
    fn error(&self, message: &str) -> FormulaError {
        FormulaError::Syntax { at: self.pos, message: message.to_string() }
    }

    fn node(&mut self) -> Result<(), FormulaError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(self.error("formula too large"));
        }
        Ok(())
    }

    fn skip_spaces(&mut self) {
        while self.pos < self.bytes.len() && self.bytes[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_spaces();
        self.bytes.get(self.pos).copied()
    }

    fn sum(&mut self, depth: usize) -> Result<Formula, FormulaError> {
        let mut left = self.product(depth)?;
        while let Some(op @ (b'+' | b'-')) = self.peek() {
            self.pos += 1;
            self.node()?;
            let right = self.product(depth)?;
            left = Formula::Binary(op as char, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn product(&mut self, depth: usize) -> Result<Formula, FormulaError> {
        let mut left = self.unary(depth)?;
        while let Some(op @ (b'*' | b'/')) = self.peek() {
            self.pos += 1;
            self.node()?;
            let right = self.unary(depth)?;
            left = Formula::Binary(op as char, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self, depth: usize) -> Result<Formula, FormulaError> {
        if depth > MAX_DEPTH {
            return Err(self.error("formula nested too deeply"));
        }
        match self.peek() {
            Some(b'-') => {
                self.pos += 1;
                self.node()?;
                Ok(Formula::Neg(Box::new(self.unary(depth + 1)?)))
            }
            Some(b'+') => {
                self.pos += 1;
                self.unary(depth + 1)
            }
            _ => self.atom(depth),
        }
    }

    fn atom(&mut self, depth: usize) -> Result<Formula, FormulaError> {
        match self.peek() {
            Some(b'(') => {
                self.pos += 1;
                let inner = self.sum(depth + 1)?;
                self.expect(b')')?;
                Ok(inner)
            }
            Some(c) if c.is_ascii_digit() || c == b'.' => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.pos;
                while self.pos < self.bytes.len()
                    && (self.bytes[self.pos].is_ascii_alphanumeric()
                        || self.bytes[self.pos] == b'_')
                {
                    self.pos += 1;
                }
                let name = String::from_utf8_lossy(&self.bytes[start..self.pos]).into_owned();
                if self.peek() == Some(b'(') {
                    self.call(name, depth)
                } else {
                    Ok(Formula::Name(name))
                }
            }
            Some(_) => Err(self.error("expected a number, a name or '('")),
            None => Err(self.error("unexpected end of formula")),
        }
    }

    fn call(&mut self, name: String, depth: usize) -> Result<Formula, FormulaError> {
        let arity_ok: fn(usize) -> bool = match name.as_str() {
            "abs" => |n| n == 1,
            "min" | "max" => |n| n >= 1,
            _ => return Err(self.error(&format!("unknown function '{name}' (min, max, abs only)"))),
        };
        self.expect(b'(')?;
        let mut args = vec![self.sum(depth + 1)?];
        while self.peek() == Some(b',') {
            self.pos += 1;
            args.push(self.sum(depth + 1)?);
        }
        self.expect(b')')?;
        if !arity_ok(args.len()) {
            return Err(self.error(&format!("wrong number of arguments for '{name}'")));
        }
        Ok(Formula::Call(name, args))
    }

    fn number(&mut self) -> Result<Formula, FormulaError> {
        let start = self.pos;
        while self.pos < self.bytes.len()
            && (self.bytes[self.pos].is_ascii_digit() || self.bytes[self.pos] == b'.')
        {
            self.pos += 1;
        }
        let text = String::from_utf8_lossy(&self.bytes[start..self.pos]).into_owned();
        text.parse::<f64>().map(Formula::Number).map_err(|_| FormulaError::Syntax {
            at: start,
            message: format!("bad number '{text}'"),
        })
    }

    fn expect(&mut self, byte: u8) -> Result<(), FormulaError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected '{}'", byte as char)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> BTreeMap<String, f64> {
        [("acc".to_string(), 1.0), ("fmt".to_string(), 0.5)].into_iter().collect()
    }

    #[test]
    fn evaluates_weighted_sum_and_functions() {
        let f = Formula::parse("0.8 * acc + 0.2 * fmt").unwrap();
        assert!((f.eval(&values()).unwrap() - 0.9).abs() < 1e-12);
        let f = Formula::parse("min(acc, fmt) + abs(-(fmt)) - max(0, 1) / 2").unwrap();
        assert!((f.eval(&values()).unwrap() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "__import__('os')",
            "acc ** 2",
            "acc; fmt",
            "pow(acc, 2)",
            "acc[0]",
            "'a'",
            "acc.real",
            "",
            "((acc)",
        ] {
            assert!(Formula::parse(bad).is_err(), "{bad} should be rejected");
        }
        let deep = format!("{}1{}", "(".repeat(200), ")".repeat(200));
        assert!(Formula::parse(&deep).is_err());
        let long = "1+".repeat(1000) + "1";
        assert!(Formula::parse(&long).is_err());
    }

    #[test]
    fn division_by_zero_and_unknown_names_are_errors() {
        assert!(Formula::parse("acc / 0").unwrap().eval(&values()).is_err());
        assert!(Formula::parse("nope + 1").unwrap().eval(&values()).is_err());
    }
}
