//! `calculator`: evaluates `{"expression": "..."}` with the safe formula language of `multi`
//! (numbers, `+ - * /`, parentheses, `min`, `max`, `abs`; no names).

use std::collections::BTreeMap;

use serde_json::Value;

use super::ToolReply;
use crate::formula::Formula;

/// Largest magnitude printed as an exact integer (2^53: every integer below is exact in f64).
const EXACT_INTEGER_LIMIT: f64 = 9_007_199_254_740_992.0;

/// The calculator's function schema, in OpenAI's `tools` format.
pub fn schema() -> Value {
    serde_json::json!({"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression (+ - * /, parentheses, min, max, abs).",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "e.g. 1234 * 5678"}},
            "required": ["expression"]}}})
}

/// Runs one call.
pub fn call(arguments: &Value) -> ToolReply {
    let Some(expression) = arguments.get("expression").and_then(Value::as_str) else {
        return ToolReply::error("calculator takes {\"expression\": \"...\"}");
    };
    let value = Formula::parse(expression).and_then(|f| f.eval(&BTreeMap::new()));
    match value {
        Ok(v) if v.fract() == 0.0 && v.abs() < EXACT_INTEGER_LIMIT => {
            ToolReply::ok(format!("{}", v as i64))
        }
        Ok(v) => ToolReply::ok(format!("{v}")),
        Err(e) => ToolReply::error(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn evaluates_arithmetic_and_reports_bad_input_as_errors() {
        assert_eq!(call(&json!({"expression": "1234 * 5678"})), ToolReply::ok("7006652"));
        assert_eq!(call(&json!({"expression": "7 / 2"})).content, "3.5");
        assert!(call(&json!({"expression": "1 / 0"})).error);
        assert!(call(&json!({"expression": "x + 1"})).error, "no names");
        assert!(call(&json!({"expr": "1"})).error);
        assert!(call(&json!({"expression": "1 +"})).fatal.is_none(), "recoverable");
    }
}
