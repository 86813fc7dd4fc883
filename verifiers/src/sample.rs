//! What a grader grades: the model's sample (the dataset row is a plain JSON `item`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One model output for a dataset row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Sample {
    /// The completion text.
    pub output_text: String,
    /// Any further fields (e.g. `output_json`), reachable as `{{sample.field}}`.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Sample {
    /// A sample holding only a completion text.
    pub fn from_text(text: impl Into<String>) -> Self {
        Self { output_text: text.into(), extra: serde_json::Map::new() }
    }

    /// The sample as a JSON object (for templates and the python grader).
    pub fn to_json(&self) -> serde_json::Value {
        let mut map = self.extra.clone();
        map.insert("output_text".into(), serde_json::Value::String(self.output_text.clone()));
        serde_json::Value::Object(map)
    }
}
