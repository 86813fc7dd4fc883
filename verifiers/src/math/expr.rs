//! Math expressions: tokens, a recursive-descent parser for LaTeX/plain notation, and bounded
//! evaluation (exact rationals where possible, `f64` otherwise).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

/// Deepest nesting the parser accepts (keeps recursion far from any thread's stack limit).
const MAX_DEPTH: usize = 50;
/// Most operator nodes in one expression (bounds the tree depth, hence evaluation recursion).
const MAX_NODES: usize = 256;
/// Longest number literal accepted (digits).
const MAX_DIGITS: usize = 400;
/// Largest result, in bits, of an exact power.
const MAX_POW_BITS: u64 = 4096;

/// A token of the answer language.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// A number literal (digits, optional fraction).
    Num(String),
    /// A one-letter (or Greek, or subscripted) variable.
    Ident(String),
    /// A LaTeX command or function name without the backslash.
    Cmd(String),
    /// A word joining answers (`or`, `and`).
    Word(String),
    /// Punctuation or an operator.
    Sym(char),
}

/// Splits normalised text into tokens; `None` when the text holds something unknown.
pub fn tokenize(s: &str) -> Option<Vec<Tok>> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i < chars.len()
                && chars[i] == '.'
                && chars.get(i + 1).is_some_and(char::is_ascii_digit)
            {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let mut lit: String = chars[start..i].iter().collect();
            // scientific notation 1.5e3 / 2E-4
            if i + 1 < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                let mut j = i + 1;
                if j < chars.len() && (chars[j] == '-' || chars[j] == '+') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    let exp_start = j;
                    while j < chars.len() && chars[j].is_ascii_digit() {
                        j += 1;
                    }
                    let exp: String = chars[i + 1..j].iter().collect();
                    if j - exp_start > 4 {
                        return None;
                    }
                    lit = format!("{lit}e{exp}");
                    i = j;
                }
            }
            if lit.len() > MAX_DIGITS {
                return None;
            }
            out.push(Tok::Num(lit));
        } else if c == '\\' {
            i += 1;
            let start = i;
            while i < chars.len() && chars[i].is_ascii_alphabetic() {
                i += 1;
            }
            if i == start {
                // escaped symbol: \{ \} \| \%
                let sym = *chars.get(i)?;
                i += 1;
                out.push(match sym {
                    '{' => Tok::Sym('⦃'),
                    '}' => Tok::Sym('⦄'),
                    '|' => Tok::Sym('|'),
                    '%' => Tok::Sym('%'),
                    _ => return None,
                });
                continue;
            }
            let name: String = chars[start..i].iter().collect();
            out.push(command_token(&name)?);
        } else if c.is_alphabetic() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_alphabetic() {
                i += 1;
            }
            if i == start {
                // a non-ASCII letter: one variable
                out.push(Tok::Ident(c.to_string()));
                i += 1;
                continue;
            }
            let word: String = chars[start..i].iter().collect();
            match word.as_str() {
                "or" | "and" => out.push(Tok::Word(word)),
                "sin" | "cos" | "tan" | "ln" | "log" | "exp" | "sqrt" => out.push(Tok::Cmd(word)),
                "pi" => out.push(Tok::Cmd("pi".into())),
                "inf" | "infty" | "infinity" => out.push(Tok::Cmd("infty".into())),
                _ => out.extend(word.chars().map(|ch| Tok::Ident(ch.to_string()))),
            }
        } else {
            let sym = match c {
                '+' | '-' | '*' | '/' | '^' | '_' | '(' | ')' | '[' | ']' | '{' | '}' | ','
                | '=' | '!' | '%' | '|' | '<' | '>' | ';' => c,
                '≤' => '≤',
                '≥' => '≥',
                '±' => '±',
                '&' => '&',
                '·' | '⋅' => '*',
                '∪' => '∪',
                '√' => {
                    out.push(Tok::Cmd("sqrt".into()));
                    i += 1;
                    continue;
                }
                _ => return None,
            };
            out.push(Tok::Sym(sym));
            i += 1;
        }
    }
    Some(out)
}

fn command_token(name: &str) -> Option<Tok> {
    const GREEK: &[&str] = &[
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "varepsilon",
        "zeta",
        "eta",
        "theta",
        "vartheta",
        "iota",
        "kappa",
        "lambda",
        "mu",
        "nu",
        "xi",
        "rho",
        "sigma",
        "tau",
        "upsilon",
        "phi",
        "varphi",
        "chi",
        "psi",
        "omega",
        "Gamma",
        "Delta",
        "Theta",
        "Lambda",
        "Xi",
        "Sigma",
        "Phi",
        "Psi",
        "Omega",
    ];
    Some(match name {
        "cdot" | "times" | "ast" => Tok::Sym('*'),
        "div" => Tok::Sym('/'),
        "cup" => Tok::Sym('∪'),
        "pm" => Tok::Sym('±'),
        "le" | "leq" | "leqslant" => Tok::Sym('≤'),
        "ge" | "geq" | "geqslant" => Tok::Sym('≥'),
        "lt" => Tok::Sym('<'),
        "gt" => Tok::Sym('>'),
        "lbrace" => Tok::Sym('⦃'),
        "rbrace" => Tok::Sym('⦄'),
        "pi" | "infty" | "frac" | "cfrac" | "sqrt" | "sin" | "cos" | "tan" | "sec" | "csc"
        | "cot" | "arcsin" | "arccos" | "arctan" | "ln" | "log" | "exp" | "binom" => {
            Tok::Cmd(name.to_string())
        }
        "in" => Tok::Sym('∈'),
        "or" | "and" => Tok::Word(name.to_string()),
        g if GREEK.contains(&g) => Tok::Ident(g.to_string()),
        _ => return None,
    })
}

/// Functions that are evaluated in floating point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    /// sin
    Sin,
    /// cos
    Cos,
    /// tan
    Tan,
    /// sec
    Sec,
    /// csc
    Csc,
    /// cot
    Cot,
    /// arcsin
    Asin,
    /// arccos
    Acos,
    /// arctan
    Atan,
    /// natural log
    Ln,
    /// exp
    Exp,
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// An exact number.
    Num(BigRational),
    /// A variable.
    Var(String),
    /// π.
    Pi,
    /// ∞.
    Inf,
    /// Euler's number (a bare `e`).
    E,
    /// −a.
    Neg(Box<Expr>),
    /// a + b.
    Add(Box<Expr>, Box<Expr>),
    /// a − b.
    Sub(Box<Expr>, Box<Expr>),
    /// a · b.
    Mul(Box<Expr>, Box<Expr>),
    /// a / b.
    Div(Box<Expr>, Box<Expr>),
    /// a ^ b.
    Pow(Box<Expr>, Box<Expr>),
    /// n-th root of x: (x, n).
    Root(Box<Expr>, Box<Expr>),
    /// log base b of x: (x, b).
    Log(Box<Expr>, Box<Expr>),
    /// A float function.
    Func(Func, Box<Expr>),
    /// n!.
    Factorial(Box<Expr>),
    /// Binomial coefficient.
    Binom(Box<Expr>, Box<Expr>),
    /// x% (= x/100; compared also as x).
    Percent(Box<Expr>),
}

impl Expr {
    /// Names of the free variables.
    pub fn vars(&self, out: &mut Vec<String>) {
        match self {
            Self::Var(v) => {
                if !out.contains(v) {
                    out.push(v.clone());
                }
            }
            Self::Num(_) | Self::Pi | Self::Inf | Self::E => {}
            Self::Neg(a) | Self::Func(_, a) | Self::Factorial(a) | Self::Percent(a) => a.vars(out),
            Self::Add(a, b)
            | Self::Sub(a, b)
            | Self::Mul(a, b)
            | Self::Div(a, b)
            | Self::Pow(a, b)
            | Self::Root(a, b)
            | Self::Log(a, b)
            | Self::Binom(a, b) => {
                a.vars(out);
                b.vars(out);
            }
        }
    }
}

impl Expr {
    /// The same expression with the operands of every sum (`+`, `−`, unary `−` terms) and of
    /// every product (`·`, implicit) in one fixed order, so that expressions equal up to
    /// commutativity and associativity of `+` and `·` (`x+1` and `1+x`, `2\pi` and `\pi \cdot 2`)
    /// have equal canonical forms, whether or not they can be evaluated.
    pub fn canonical(&self) -> Expr {
        let un = |a: &Expr| b(a.canonical());
        match self {
            Self::Add(..) | Self::Sub(..) => {
                let mut terms = Vec::new();
                collect_terms(self, false, &mut terms);
                let mut keyed: Vec<(String, bool, Expr)> = terms
                    .into_iter()
                    .map(|(negative, term)| {
                        let term = term.canonical();
                        (format!("{term:?}"), negative, term)
                    })
                    .collect();
                keyed.sort_by(|x, y| (&x.0, x.1).cmp(&(&y.0, y.1)));
                let mut iter = keyed.into_iter();
                let Some((_, negative, first)) = iter.next() else { return self.clone() };
                let start = if negative { Self::Neg(b(first)) } else { first };
                iter.fold(start, |sum, (_, negative, term)| {
                    if negative {
                        Self::Sub(b(sum), b(term))
                    } else {
                        Self::Add(b(sum), b(term))
                    }
                })
            }
            Self::Mul(..) => {
                let mut factors = Vec::new();
                collect_factors(self, &mut factors);
                let mut keyed: Vec<(String, Expr)> = factors
                    .into_iter()
                    .map(|f| {
                        let f = f.canonical();
                        (format!("{f:?}"), f)
                    })
                    .collect();
                keyed.sort_by(|x, y| x.0.cmp(&y.0));
                let mut iter = keyed.into_iter().map(|(_, f)| f);
                let Some(first) = iter.next() else { return self.clone() };
                iter.fold(first, |product, f| Self::Mul(b(product), b(f)))
            }
            Self::Num(_) | Self::Var(_) | Self::Pi | Self::Inf | Self::E => self.clone(),
            Self::Neg(a) => Self::Neg(un(a)),
            Self::Func(f, a) => Self::Func(*f, un(a)),
            Self::Factorial(a) => Self::Factorial(un(a)),
            Self::Percent(a) => Self::Percent(un(a)),
            Self::Div(x, y) => Self::Div(un(x), un(y)),
            Self::Pow(x, y) => Self::Pow(un(x), un(y)),
            Self::Root(x, y) => Self::Root(un(x), un(y)),
            Self::Log(x, y) => Self::Log(un(x), un(y)),
            Self::Binom(x, y) => Self::Binom(un(x), un(y)),
        }
    }
}

/// The terms of a sum, each with whether it is subtracted.
fn collect_terms<'a>(e: &'a Expr, negative: bool, out: &mut Vec<(bool, &'a Expr)>) {
    match e {
        Expr::Add(x, y) => {
            collect_terms(x, negative, out);
            collect_terms(y, negative, out);
        }
        Expr::Sub(x, y) => {
            collect_terms(x, negative, out);
            collect_terms(y, !negative, out);
        }
        Expr::Neg(x) if matches!(**x, Expr::Add(..) | Expr::Sub(..) | Expr::Neg(_)) => {
            collect_terms(x, !negative, out)
        }
        Expr::Neg(x) => out.push((!negative, &**x)),
        other => out.push((negative, other)),
    }
}

/// The factors of a product.
fn collect_factors<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::Mul(x, y) => {
            collect_factors(x, out);
            collect_factors(y, out);
        }
        other => out.push(other),
    }
}

/// The token parser for one expression; the caller splits lists and relations.
pub struct Parser {
    toks: Vec<Tok>,
    pos: usize,
    nodes: usize,
}

fn b(e: Expr) -> Box<Expr> {
    Box::new(e)
}

impl Parser {
    /// A parser over `toks`.
    pub fn new(toks: Vec<Tok>) -> Self {
        Self { toks, pos: 0, nodes: 0 }
    }

    /// Whether every token was consumed.
    pub fn done(&self) -> bool {
        self.pos >= self.toks.len()
    }

    /// The next token.
    pub fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    /// Consumes the next token.
    pub fn bump(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    /// Counts one operator node; `None` past the limit.
    fn node(&mut self) -> Option<()> {
        self.nodes += 1;
        (self.nodes <= MAX_NODES).then_some(())
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Sym(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// sum := product (('+'|'-') product)*
    pub fn sum(&mut self, depth: usize) -> Option<Expr> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut left = self.product(depth + 1)?;
        loop {
            if self.eat('+') {
                self.node()?;
                left = Expr::Add(b(left), b(self.product(depth + 1)?));
            } else if self.eat('-') {
                self.node()?;
                left = Expr::Sub(b(left), b(self.product(depth + 1)?));
            } else {
                return Some(left);
            }
        }
    }

    fn starts_atom(&self) -> bool {
        match self.peek() {
            Some(Tok::Num(_) | Tok::Ident(_)) => true,
            Some(Tok::Cmd(_)) => true,
            Some(Tok::Sym(c)) => matches!(c, '(' | '{'),
            _ => false,
        }
    }

    fn product(&mut self, depth: usize) -> Option<Expr> {
        let mut left = self.unary(depth)?;
        loop {
            if self.eat('*') {
                self.node()?;
                left = Expr::Mul(b(left), b(self.unary(depth)?));
            } else if self.eat('/') {
                self.node()?;
                left = Expr::Div(b(left), b(self.unary(depth)?));
            } else if self.starts_atom() {
                self.node()?;
                left = Expr::Mul(b(left), b(self.power(depth)?));
            } else {
                return Some(left);
            }
        }
    }

    fn unary(&mut self, depth: usize) -> Option<Expr> {
        if depth > MAX_DEPTH {
            return None;
        }
        if self.eat('-') {
            self.node()?;
            return Some(Expr::Neg(b(self.unary(depth + 1)?)));
        }
        if self.eat('+') {
            return self.unary(depth + 1);
        }
        self.power(depth)
    }

    fn power(&mut self, depth: usize) -> Option<Expr> {
        let base = self.postfix(depth)?;
        if self.eat('^') {
            self.node()?;
            let exponent = self.script(depth + 1)?;
            let e = Expr::Pow(b(base), b(exponent));
            return self.postfix_ops(e);
        }
        Some(base)
    }

    /// The argument of `^`, `_`, `\frac`: a braced group or a single token (one digit of a number).
    fn script(&mut self, depth: usize) -> Option<Expr> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            Tok::Sym('{') => {
                self.pos += 1;
                let e = self.sum(depth + 1)?;
                self.eat('}').then_some(e)
            }
            Tok::Sym('-') => {
                self.pos += 1;
                Some(Expr::Neg(b(self.script(depth + 1)?)))
            }
            Tok::Num(n) if n.len() > 1 && n.chars().all(|c| c.is_ascii_digit()) => {
                let n = n.clone();
                let (first, rest) = n.split_at(1);
                self.toks[self.pos] = Tok::Num(rest.to_string());
                Some(Expr::Num(parse_number(first)?))
            }
            _ => self.postfix(depth + 1),
        }
    }

    fn postfix(&mut self, depth: usize) -> Option<Expr> {
        let atom = self.atom(depth)?;
        self.postfix_ops(atom)
    }

    fn postfix_ops(&mut self, mut e: Expr) -> Option<Expr> {
        loop {
            if self.eat('!') {
                self.node()?;
                e = Expr::Factorial(b(e));
            } else if self.eat('%') {
                self.node()?;
                e = Expr::Percent(b(e));
            } else {
                return Some(e);
            }
        }
    }

    fn group(&mut self, depth: usize, close: char) -> Option<Expr> {
        let e = self.sum(depth + 1)?;
        self.eat(close).then_some(e)
    }

    fn atom(&mut self, depth: usize) -> Option<Expr> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.node()?;
        match self.bump()? {
            Tok::Num(n) => {
                let value = Expr::Num(parse_number(&n)?);
                // mixed number: 3\frac{1}{2}
                if n.chars().all(|c| c.is_ascii_digit())
                    && self.peek() == Some(&Tok::Cmd("frac".into()))
                {
                    let save = self.pos;
                    self.pos += 1;
                    if let (Some(Expr::Num(p)), Some(Expr::Num(q))) =
                        (self.script(depth + 1), self.script(depth + 1))
                    {
                        if !q.is_zero() {
                            return Some(Expr::Add(b(value), b(Expr::Num(p / q))));
                        }
                    }
                    self.pos = save;
                }
                Some(value)
            }
            Tok::Ident(name) => {
                if self.eat('_') {
                    let sub = match self.bump()? {
                        Tok::Sym('{') => {
                            let mut s = String::new();
                            loop {
                                match self.bump()? {
                                    Tok::Sym('}') => break,
                                    Tok::Num(n) | Tok::Ident(n) | Tok::Cmd(n) | Tok::Word(n) => {
                                        s.push_str(&n)
                                    }
                                    Tok::Sym(c) => s.push(c),
                                }
                            }
                            s
                        }
                        Tok::Num(n) | Tok::Ident(n) => n,
                        _ => return None,
                    };
                    return Some(Expr::Var(format!("{name}_{sub}")));
                }
                if name == "e" {
                    return Some(Expr::E);
                }
                Some(Expr::Var(name))
            }
            Tok::Sym('(') => self.group(depth, ')'),
            Tok::Sym('{') => self.group(depth, '}'),
            Tok::Sym('|') => {
                let inner = self.group(depth, '|')?;
                // |x| = sqrt(x^2), evaluated numerically
                Some(Expr::Root(b(Expr::Pow(b(inner), b(Expr::Num(int(2))))), b(Expr::Num(int(2)))))
            }
            Tok::Cmd(c) => self.command(&c, depth),
            _ => None,
        }
    }

    fn command(&mut self, c: &str, depth: usize) -> Option<Expr> {
        Some(match c {
            "pi" => Expr::Pi,
            "infty" => Expr::Inf,
            "frac" | "cfrac" => {
                let num = self.script(depth + 1)?;
                let den = self.script(depth + 1)?;
                Expr::Div(b(num), b(den))
            }
            "binom" => {
                let n = self.script(depth + 1)?;
                let k = self.script(depth + 1)?;
                Expr::Binom(b(n), b(k))
            }
            "sqrt" => {
                let index = if self.eat('[') { Some(self.group(depth, ']')?) } else { None };
                let radicand = self.script(depth + 1)?;
                Expr::Root(b(radicand), b(index.unwrap_or(Expr::Num(int(2)))))
            }
            "log" => {
                let base = if self.eat('_') { Some(self.script(depth + 1)?) } else { None };
                let arg = self.func_arg(depth)?;
                match base {
                    Some(base) => Expr::Log(b(arg), b(base)),
                    None => Expr::Log(b(arg), b(Expr::Num(int(10)))),
                }
            }
            _ => {
                let f = match c {
                    "sin" => Func::Sin,
                    "cos" => Func::Cos,
                    "tan" => Func::Tan,
                    "sec" => Func::Sec,
                    "csc" => Func::Csc,
                    "cot" => Func::Cot,
                    "arcsin" => Func::Asin,
                    "arccos" => Func::Acos,
                    "arctan" => Func::Atan,
                    "ln" => Func::Ln,
                    "exp" => Func::Exp,
                    _ => return None,
                };
                // \sin^2 x
                if self.eat('^') {
                    let p = self.script(depth + 1)?;
                    let arg = self.func_arg(depth)?;
                    return Some(Expr::Pow(b(Expr::Func(f, b(arg))), b(p)));
                }
                Expr::Func(f, b(self.func_arg(depth)?))
            }
        })
    }

    /// A function argument: a parenthesised group, or a bare implicit product (`\sin 2x` is
    /// sin(2x)) that stops at the next function (`\sin x \cos x` is sin(x)·cos(x)).
    fn func_arg(&mut self, depth: usize) -> Option<Expr> {
        if matches!(self.peek()?, Tok::Sym('(') | Tok::Sym('{')) {
            return self.power(depth + 1);
        }
        let mut arg = self.power(depth + 1)?;
        while matches!(self.peek(), Some(Tok::Num(_) | Tok::Ident(_)))
            || matches!(self.peek(), Some(Tok::Cmd(c)) if matches!(c.as_str(), "pi" | "frac" | "sqrt"))
        {
            self.node()?;
            arg = Expr::Mul(b(arg), b(self.power(depth + 1)?));
        }
        Some(arg)
    }
}

fn int(n: i64) -> BigRational {
    BigRational::from_integer(BigInt::from(n))
}

/// Parses a decimal literal (with optional `e` exponent) exactly.
pub fn parse_number(s: &str) -> Option<BigRational> {
    let (mantissa, exp) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int_part}{frac_part}");
    let digits = if digits.is_empty() { "0".to_string() } else { digits };
    let numer: BigInt = digits.parse().ok()?;
    let scale = exp - i32::try_from(frac_part.len()).ok()?;
    let ten = BigInt::from(10);
    let pow = num_traits::pow(ten, scale.unsigned_abs() as usize);
    Some(if scale >= 0 {
        BigRational::from_integer(numer * pow)
    } else {
        BigRational::new(numer, pow)
    })
}

/// A value: exact when every step allowed it.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    /// Exact rational.
    Rat(BigRational),
    /// Floating point.
    F(f64),
}

impl Val {
    /// As a float.
    pub fn f(&self) -> f64 {
        match self {
            Self::Rat(r) => rat_to_f64(r),
            Self::F(x) => *x,
        }
    }
}

fn rat_to_f64(r: &BigRational) -> f64 {
    r.to_f64().unwrap_or_else(|| {
        // huge numerator or denominator: scale down through the bit lengths
        let n = r.numer().bits() as i64 - r.denom().bits() as i64;
        if n > 1100 {
            if r.is_negative() {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            }
        } else {
            0.0
        }
    })
}

/// Evaluates with variables bound by `env`; `None` outside the domain or past the work budget.
pub fn eval(e: &Expr, env: &dyn Fn(&str) -> Option<BigRational>, budget: &mut u32) -> Option<Val> {
    if *budget == 0 {
        return None;
    }
    *budget -= 1;
    let ev = |x: &Expr, budget: &mut u32| eval(x, env, budget);
    Some(match e {
        Expr::Num(r) => Val::Rat(r.clone()),
        Expr::Var(v) => Val::Rat(env(v)?),
        Expr::Pi => Val::F(std::f64::consts::PI),
        Expr::Inf => Val::F(f64::INFINITY),
        Expr::E => Val::F(std::f64::consts::E),
        Expr::Neg(a) => match ev(a, budget)? {
            Val::Rat(r) => Val::Rat(-r),
            Val::F(x) => Val::F(-x),
        },
        Expr::Add(a, c) | Expr::Sub(a, c) | Expr::Mul(a, c) | Expr::Div(a, c) => {
            let (x, y) = (ev(a, budget)?, ev(c, budget)?);
            match (x, y) {
                (Val::Rat(x), Val::Rat(y)) => Val::Rat(match e {
                    Expr::Add(..) => x + y,
                    Expr::Sub(..) => x - y,
                    Expr::Mul(..) => x * y,
                    _ => {
                        if y.is_zero() {
                            return None;
                        }
                        x / y
                    }
                }),
                (x, y) => {
                    let (x, y) = (x.f(), y.f());
                    Val::F(match e {
                        Expr::Add(..) => x + y,
                        Expr::Sub(..) => x - y,
                        Expr::Mul(..) => x * y,
                        _ => {
                            if y == 0.0 {
                                return None;
                            }
                            x / y
                        }
                    })
                }
            }
        }
        Expr::Pow(a, c) => pow(ev(a, budget)?, ev(c, budget)?)?,
        Expr::Root(a, n) => {
            let n = ev(n, budget)?;
            let inv = match n {
                Val::Rat(r) if !r.is_zero() => Val::Rat(r.recip()),
                Val::F(x) if x != 0.0 => Val::F(1.0 / x),
                _ => return None,
            };
            pow(ev(a, budget)?, inv)?
        }
        Expr::Log(a, base) => {
            let (x, bse) = (ev(a, budget)?.f(), ev(base, budget)?.f());
            if x <= 0.0 || bse <= 0.0 || bse == 1.0 {
                return None;
            }
            Val::F(x.ln() / bse.ln())
        }
        Expr::Func(f, a) => {
            let x = ev(a, budget)?.f();
            let y = match f {
                Func::Sin => x.sin(),
                Func::Cos => x.cos(),
                Func::Tan => x.tan(),
                Func::Sec => 1.0 / x.cos(),
                Func::Csc => 1.0 / x.sin(),
                Func::Cot => 1.0 / x.tan(),
                Func::Asin => x.asin(),
                Func::Acos => x.acos(),
                Func::Atan => x.atan(),
                Func::Ln => {
                    if x <= 0.0 {
                        return None;
                    }
                    x.ln()
                }
                Func::Exp => x.exp(),
            };
            Val::F(y)
        }
        Expr::Factorial(a) => {
            let n = as_small_int(&ev(a, budget)?)?;
            if !(0..=300).contains(&n) {
                return None;
            }
            *budget = budget.checked_sub(n as u32)?;
            Val::Rat(BigRational::from_integer((1..=n).fold(BigInt::one(), |acc, k| acc * k)))
        }
        Expr::Binom(n, k) => {
            let (n, k) = (as_small_int(&ev(n, budget)?)?, as_small_int(&ev(k, budget)?)?);
            if !(0..=1000).contains(&n) || k < 0 || k > n {
                return None;
            }
            *budget = budget.checked_sub(k as u32)?;
            let mut acc = BigInt::one();
            for i in 0..k {
                acc = acc * (n - i) / (i + 1);
            }
            Val::Rat(BigRational::from_integer(acc))
        }
        Expr::Percent(a) => match ev(a, budget)? {
            Val::Rat(r) => Val::Rat(r / int(100)),
            Val::F(x) => Val::F(x / 100.0),
        },
    })
}

fn as_small_int(v: &Val) -> Option<i64> {
    match v {
        Val::Rat(r) if r.is_integer() => r.to_integer().to_i64(),
        Val::F(x) if x.fract() == 0.0 && x.abs() < 1e6 => Some(*x as i64),
        _ => None,
    }
}

/// Exact integer n-th root when it exists.
fn exact_root(x: &BigInt, n: u32) -> Option<BigInt> {
    if x.is_negative() {
        return if n % 2 == 1 { exact_root(&-x, n).map(|r| -r) } else { None };
    }
    let r = x.nth_root(n);
    (num_traits::pow(r.clone(), n as usize) == *x).then_some(r)
}

fn pow(base: Val, exponent: Val) -> Option<Val> {
    if let (Val::Rat(bs), Val::Rat(ex)) = (&base, &exponent) {
        let (p, q) = (ex.numer().to_i64(), ex.denom().to_u32());
        if let (Some(p), Some(q)) = (p, q) {
            if q <= 16 {
                // exact q-th root of base, then integer power p
                let rooted = if q == 1 {
                    Some(bs.clone())
                } else {
                    match (exact_root(bs.numer(), q), exact_root(bs.denom(), q)) {
                        (Some(n), Some(d)) => Some(BigRational::new(n, d)),
                        _ => None,
                    }
                };
                if let Some(r) = rooted {
                    let bits = r.numer().bits() + r.denom().bits();
                    if bits.saturating_mul(p.unsigned_abs()) <= MAX_POW_BITS {
                        if r.is_zero() && p < 0 {
                            return None;
                        }
                        let magnitude = num_traits::pow(r, p.unsigned_abs() as usize);
                        return Some(Val::Rat(if p < 0 { magnitude.recip() } else { magnitude }));
                    }
                } else if bs.is_negative() && q % 2 == 0 {
                    return None;
                }
            }
        }
    }
    let (x, y) = (base.f(), exponent.f());
    let v = if x < 0.0 && y.fract() != 0.0 {
        // odd roots of negatives: x^(1/3) = -|x|^(1/3)
        let inv = 1.0 / y;
        if (inv.round() - inv).abs() < 1e-9 && (inv.round() as i64) % 2 != 0 {
            -(-x).powf(y)
        } else {
            return None;
        }
    } else {
        x.powf(y)
    };
    (!v.is_nan()).then_some(Val::F(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(s: &str) -> Val {
        let mut p = Parser::new(tokenize(s).unwrap());
        let e = p.sum(0).unwrap();
        assert!(p.done(), "{s}");
        eval(&e, &|_| None, &mut 10_000).unwrap()
    }

    #[test]
    fn exact_arithmetic() {
        assert_eq!(value(r"\frac{3}{4}"), Val::Rat(BigRational::new(3.into(), 4.into())));
        assert_eq!(value(r"\frac12"), Val::Rat(BigRational::new(1.into(), 2.into())));
        assert_eq!(value(r"3\frac{1}{2}"), Val::Rat(BigRational::new(7.into(), 2.into())));
        assert_eq!(value(r"\sqrt{16}"), Val::Rat(int(4)));
        assert_eq!(value(r"2^{10}"), Val::Rat(int(1024)));
        assert_eq!(value(r"1.5e3"), Val::Rat(int(1500)));
        assert_eq!(value(r"5!"), Val::Rat(int(120)));
        assert_eq!(value(r"8^{2/3}"), Val::Rat(int(4)));
        assert!((value(r"2\pi").f() - 2.0 * std::f64::consts::PI).abs() < 1e-12);
    }

    fn canonical(s: &str) -> Expr {
        let mut p = Parser::new(tokenize(s).unwrap());
        let e = p.sum(0).unwrap();
        assert!(p.done(), "{s}");
        e.canonical()
    }

    #[test]
    fn canonical_order_of_sums_and_products() {
        for (a, c) in [
            ("x+1", "1+x"),
            (r"2\pi", r"\pi \cdot 2"),
            (r"2\pi", r"\pi*2"),
            ("ab", "ba"),
            ("abc", "c(ab)"),
            ("a-b+c", "c-b+a"),
            ("-b+a", "a-b"),
            (r"\sqrt{x-10}+1", r"1+\sqrt{-10+x}"),
            (r"\frac{y x}{2}+3", r"3+\frac{xy}{2}"),
        ] {
            assert_eq!(canonical(a), canonical(c), "{a} vs {c}");
        }
        for (a, c) in [("x-1", "1-x"), ("x/2", "2/x"), ("x^2", "2^x"), ("a-b", "-a+b")] {
            assert_ne!(canonical(a), canonical(c), "{a} vs {c}");
        }
    }

    #[test]
    fn huge_powers_stay_bounded() {
        let v = value("2^{99999999}");
        assert!(v.f().is_infinite());
        let mut p = Parser::new(tokenize("(((((((((((1)))))))))))").unwrap());
        assert!(p.sum(0).is_some());
        let deep = format!("{}1{}", "(".repeat(60), ")".repeat(60));
        assert!(Parser::new(tokenize(&deep).unwrap()).sum(0).is_none());
    }
}
