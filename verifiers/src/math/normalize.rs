//! LaTeX clean-up before parsing: wrappers, spacing, text, units, currency, separators.

use std::sync::LazyLock;

use regex::Regex;

use super::extract::matching_brace;

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).unwrap_or_else(|e| panic!("static regex {pattern}: {e}"))
}

/// Unit and currency words dropped after a number.
const UNITS: &[&str] = &[
    "units",
    "unit",
    "square",
    "sq",
    "cubic",
    "cm",
    "mm",
    "km",
    "meters",
    "meter",
    "metres",
    "metre",
    "centimeters",
    "centimeter",
    "kilometers",
    "kilometer",
    "inches",
    "inch",
    "feet",
    "foot",
    "yards",
    "yard",
    "yd",
    "miles",
    "mile",
    "mi",
    "mph",
    "kg",
    "grams",
    "gram",
    "kilograms",
    "pounds",
    "pound",
    "lbs",
    "lb",
    "ounces",
    "ounce",
    "oz",
    "liters",
    "liter",
    "litres",
    "ml",
    "gallons",
    "gallon",
    "seconds",
    "second",
    "sec",
    "minutes",
    "minute",
    "min",
    "hours",
    "hour",
    "hrs",
    "hr",
    "days",
    "day",
    "weeks",
    "week",
    "months",
    "month",
    "years",
    "year",
    "dollars",
    "dollar",
    "cents",
    "cent",
    "euros",
    "euro",
    "degrees",
    "degree",
    "deg",
    "people",
    "students",
    "apples",
    "marbles",
    "times",
    "ways",
    "points",
    "percent",
];

/// One-letter units, dropped only after a bare number (`5 m`), never after an expression (`r^2 h`).
const SHORT_UNITS: &[&str] = &["m", "g", "s", "h", "l", "in", "ft"];

/// Applies every normalisation; the result is what the parser sees.
pub fn normalize(raw: &str) -> String {
    let mut s = raw.trim().to_string();
    s = unwrap_commands(
        &s,
        &[
            "\\text",
            "\\textbf",
            "\\textit",
            "\\mathrm",
            "\\mathbf",
            "\\mathit",
            "\\mbox",
            "\\operatorname",
            "\\textnormal",
        ],
    );
    static THIN_SEPARATOR: LazyLock<Regex> = LazyLock::new(|| re(r"(\d)\\,(\d{3})"));
    for _ in 0..4 {
        s = THIN_SEPARATOR.replace_all(&s, "${1}${2}").into_owned();
    }
    static DROP: LazyLock<Regex> = LazyLock::new(|| {
        re(
            r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\\quad|\\qquad|\\displaystyle|\\big|\\Big|\\bigg|\\Bigg|\\limits|~|\\\$|\$|\\\(|\\\)|\\\[|\\\]|\^\s*\{\\circ\}|\^\s*\\circ|\\circ|°|\{,\}",
        )
    });
    s = DROP
        .replace_all(&s, |c: &regex::Captures| if &c[0] == "{,}" { "" } else { " " })
        .into_owned();
    s = s
        .replace("\\dfrac", "\\frac")
        .replace("\\tfrac", "\\frac")
        .replace("\\%", "%")
        .replace("\\le ", "\\leq ");
    s = s
        .replace('−', "-")
        .replace('×', "\\times")
        .replace('÷', "\\div")
        .replace('π', "\\pi")
        .replace('∞', "\\infty");
    s = repeating_decimals(&s);
    s = strip_thousands(&s);
    s = strip_units(&s);
    let s = s.trim().trim_end_matches('.').trim();
    s.to_string()
}

/// `0.1\overline{6}` → `\frac{15}{90}` (the exact value of a repeating decimal).
fn repeating_decimals(s: &str) -> String {
    static REPEATING: LazyLock<Regex> =
        LazyLock::new(|| re(r"(\d*)\.(\d*)\\overline\{(\d{1,12})\}"));
    REPEATING
        .replace_all(s, |c: &regex::Captures| {
            let (whole, fixed, period) = (&c[1], &c[2], &c[3]);
            if fixed.len() > 12 || whole.len() > 12 {
                return c[0].to_string();
            }
            let all: u128 = format!("{whole}{fixed}{period}").parse().unwrap_or(0);
            let head: u128 = format!("{whole}{fixed}").parse().unwrap_or(0);
            let denominator =
                10u128.pow(fixed.len() as u32) * (10u128.pow(period.len() as u32) - 1);
            format!("\\frac{{{}}}{{{denominator}}}", all - head)
        })
        .into_owned()
}

/// `\text{abc}` → `abc` (nested braces respected) for each named command.
fn unwrap_commands(s: &str, commands: &[&str]) -> String {
    let mut out = String::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    'outer: while i < s.len() {
        if bytes[i] == b'\\' {
            for cmd in commands {
                let end = i + cmd.len();
                if s[i..].starts_with(cmd) && bytes.get(end) == Some(&b'{') {
                    if let Some(close) = matching_brace(bytes, end) {
                        out.push(' ');
                        out.push_str(&unwrap_commands(&s[end + 1..close], commands));
                        out.push(' ');
                        i = close + 1;
                        continue 'outer;
                    }
                }
            }
        }
        let ch = s[i..].chars().next().unwrap_or(' ');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// `1,234,567` → `1234567` unless the answer is a bracketed list.
fn strip_thousands(s: &str) -> String {
    static GROUPED: LazyLock<Regex> =
        LazyLock::new(|| re(r"(^|[^\d.,])(\d{1,3}(?:,\d{3})+)(\.\d+)?($|[^\d,])"));
    let t = s.trim_start();
    if t.starts_with('(') || t.starts_with('[') || t.starts_with("\\{") {
        return s.to_string();
    }
    let mut current = s.to_string();
    // replace_all does not see overlapping boundaries; two passes cover adjacent numbers
    for _ in 0..2 {
        current = GROUPED
            .replace_all(&current, |c: &regex::Captures| {
                format!(
                    "{}{}{}{}",
                    &c[1],
                    c[2].replace(',', ""),
                    c.get(3).map_or("", |m| m.as_str()),
                    &c[4]
                )
            })
            .into_owned();
    }
    current
}

/// Drops unit and currency words (and `^2`/`^3` on them) after a number.
fn strip_units(s: &str) -> String {
    static TRAILING_UNIT: LazyLock<Regex> = LazyLock::new(|| {
        re(&format!(
            r"(?i)^(.*?[\d}}%])\s*(?:(?:{})\b\s*)+(?:\s*\^\s*\{{?[23]\}}?)?\s*\.?\s*$",
            UNITS.join("|")
        ))
    });
    let mut current = s.trim().to_string();
    for _ in 0..4 {
        let Some(c) = TRAILING_UNIT.captures(&current) else { break };
        let head = c[1].to_string();
        // a single letter right after a digit is a variable (2x, 3m?) unless spaced: keep `2x` intact
        let unit_len = current.len() - head.len();
        let spaced = current[head.len()..].starts_with(char::is_whitespace);
        if !spaced && unit_len <= 1 {
            break;
        }
        current = head;
    }
    static SHORT: LazyLock<Regex> = LazyLock::new(|| {
        re(&format!(
            r"^\s*(-?[\d.]+)\s+(?:{})(?:\s*\^\s*\{{?[23]\}}?)?\s*\.?\s*$",
            SHORT_UNITS.join("|")
        ))
    });
    if let Some(c) = SHORT.captures(&current) {
        return c[1].to_string();
    }
    current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_wrappers_units_and_separators() {
        assert_eq!(normalize(r"$\left( 1, 2 \right)$").replace(' ', ""), "(1,2)");
        assert_eq!(normalize(r"10\text{ cm}^2"), "10");
        assert_eq!(normalize(r"\$1,000.50"), "1000.50");
        assert_eq!(normalize(r"45^\circ"), "45");
        assert_eq!(normalize(r"5 dollars."), "5");
        assert_eq!(normalize(r"\dfrac{1}{2}"), r"\frac{1}{2}");
        assert_eq!(normalize(r"\text{(A)}"), "(A)");
        assert_eq!(normalize(r"1{,}000"), "1000");
        assert_eq!(normalize(r"5 m"), "5");
        assert_eq!(normalize(r"0.\overline{3}"), r"\frac{3}{9}");
        assert_eq!(normalize(r"0.1\overline{6}"), r"\frac{15}{90}");
        assert_eq!(normalize(r"\pi r^2 h"), r"\pi r^2 h");
    }
}
