//! What a grader grades: the model's sample (the dataset row is a plain JSON `item`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One model output for a dataset row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sample {
    /// The completion text.
    pub output_text: String,
    /// Any further fields (e.g. `output_json`, `output_tools`), reachable as `{{sample.field}}`.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Value>,
    /// Why `output_json` is absent when it was asked for: the completion is not valid JSON.
    #[serde(skip)]
    pub output_json_error: Option<String>,
}

impl Sample {
    /// A sample holding only a completion text.
    pub fn from_text(text: impl Into<String>) -> Self {
        Self { output_text: text.into(), ..Self::default() }
    }

    /// Fills `output_json` with the completion text parsed as JSON (OpenAI's structured
    /// outputs); when it is not JSON, `output_json` stays unset and [`Sample::output_json_error`]
    /// says why, so a grader reading it scores 0 with a sample parse error.
    pub fn with_output_json(mut self) -> Self {
        match serde_json::from_str::<Value>(self.output_text.trim()) {
            Ok(value) => {
                self.extra.insert("output_json".into(), value);
                self.output_json_error = None;
            }
            Err(e) => {
                self.extra.remove("output_json");
                self.output_json_error = Some(format!("the completion is not valid JSON: {e}"));
            }
        }
        self
    }

    /// Sets `output_tools`: the completion's tool calls in OpenAI's shape (`id`,
    /// `type: "function"`, `function.name`, `function.arguments` as a JSON string).
    pub fn with_output_tools(mut self, calls: Vec<Value>) -> Self {
        self.extra.insert("output_tools".into(), Value::Array(calls));
        self
    }

    /// The sample as a JSON object (for templates and the python grader).
    pub fn to_json(&self) -> Value {
        let mut map = self.extra.clone();
        map.insert("output_text".into(), Value::String(self.output_text.clone()));
        Value::Object(map)
    }
}

/// One tool call in OpenAI's shape (`sample.output_tools[i]`); `arguments` is an object,
/// written as its JSON text as OpenAI does.
pub fn openai_tool_call(id: &str, name: &str, arguments: &Value) -> Value {
    serde_json::json!({
        "id": id,
        "type": "function",
        "function": { "name": name, "arguments": arguments.to_string() },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn output_json_is_the_parsed_completion_or_an_explained_absence() {
        let ok = Sample::from_text(" {\"email\": \"a@b.c\"} ").with_output_json();
        assert_eq!(ok.extra["output_json"], json!({"email": "a@b.c"}));
        assert!(ok.output_json_error.is_none());
        let bad = Sample::from_text("not json").with_output_json();
        assert!(!bad.extra.contains_key("output_json"));
        assert!(bad.output_json_error.unwrap().contains("not valid JSON"));
    }

    #[test]
    fn tool_calls_take_openais_shape() {
        let call = openai_tool_call("call_0", "get_weather", &json!({"city": "Paris"}));
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
    }
}
