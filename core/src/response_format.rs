//! `response_format`: OpenAI's structured-outputs setting (`text`, `json_object`,
//! `json_schema`), one definition for reinforcement jobs, sampling runs and chat completions.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest `json_schema.name` OpenAI accepts.
const MAX_NAME_LEN: usize = 64;

/// What the completions must be.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Free text (OpenAI's default).
    Text,
    /// A JSON object.
    JsonObject,
    /// JSON that follows a schema.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The format's name (letters, digits, `_` and `-`, at most 64).
    pub name: String,
    /// What the format is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema the output follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// Whether the schema is followed exactly (OpenAI's default: false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// A `response_format` that is malformed: the field at fault (relative to the format) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidResponseFormat {
    /// The field under `response_format` (e.g. `json_schema.name`).
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

impl ResponseFormat {
    /// Whether the completions are JSON (so graders may read `sample.output_json`).
    pub fn is_json(&self) -> bool {
        !matches!(self, ResponseFormat::Text)
    }

    /// The schema's top-level property names, when the format has a schema that lists them.
    pub fn schema_properties(&self) -> Option<Vec<String>> {
        let ResponseFormat::JsonSchema { json_schema } = self else { return None };
        let properties = json_schema.schema.as_ref()?.get("properties")?.as_object()?;
        Some(properties.keys().cloned().collect())
    }

    /// Checks the name and that the schema is a JSON object.
    pub fn validate(&self) -> Result<(), InvalidResponseFormat> {
        let ResponseFormat::JsonSchema { json_schema } = self else { return Ok(()) };
        let name = &json_schema.name;
        let name_ok = !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(InvalidResponseFormat {
                field: "json_schema.name",
                message: format!(
                    "must be 1 to {MAX_NAME_LEN} letters, digits, underscores or dashes, got {name:?}"
                ),
            });
        }
        if json_schema.schema.as_ref().is_some_and(|s| !s.is_object()) {
            return Err(InvalidResponseFormat {
                field: "json_schema.schema",
                message: "must be a JSON Schema object".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<ResponseFormat, serde_json::Error> {
        serde_json::from_value(value)
    }

    #[test]
    fn openais_three_formats_parse_and_say_whether_they_are_json() {
        assert!(!parse(json!({"type": "text"})).unwrap().is_json());
        assert!(parse(json!({"type": "json_object"})).unwrap().is_json());
        let schema = parse(json!({"type": "json_schema", "json_schema": {
            "name": "security_assistant", "strict": true,
            "schema": {"type": "object", "properties": {"compliant": {"type": "string"},
                "explanation": {"type": "string"}}, "required": ["compliant", "explanation"],
                "additionalProperties": false}}}))
        .unwrap();
        schema.validate().unwrap();
        assert!(schema.is_json());
        assert_eq!(schema.schema_properties().unwrap(), ["compliant", "explanation"]);
    }

    #[test]
    fn malformed_formats_name_their_field() {
        assert!(parse(json!({"type": "xml"})).is_err());
        let bad = parse(json!({"type": "json_schema", "json_schema": {"name": "a b"}})).unwrap();
        assert_eq!(bad.validate().unwrap_err().field, "json_schema.name");
        let bad = parse(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}))
            .unwrap();
        assert_eq!(bad.validate().unwrap_err().field, "json_schema.schema");
    }
}
