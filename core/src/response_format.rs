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

    /// What this format cannot be combined with: a JSON grammar follows one completion from
    /// its first token, so neither tool episodes nor partial rollouts (continued across
    /// steps) can follow it. Free text combines with everything.
    pub fn conflict(&self, tool_episodes: bool, partial_rollouts: bool) -> Option<FormatConflict> {
        if !self.is_json() {
            return None;
        }
        if tool_episodes {
            Some(FormatConflict::ToolEpisodes)
        } else if partial_rollouts {
            Some(FormatConflict::PartialRollouts)
        } else {
            None
        }
    }
}

/// A setting a JSON `response_format` cannot be combined with ([`ResponseFormat::conflict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatConflict {
    /// Multi-turn episodes with tools (`method.reinforcement.environment`).
    ToolEpisodes,
    /// Completions continued across steps (`hyperparameters.partial_rollout_tokens`).
    PartialRollouts,
}

impl FormatConflict {
    /// The job field that conflicts with the format.
    pub fn field(self) -> &'static str {
        match self {
            FormatConflict::ToolEpisodes => "method.reinforcement.environment",
            FormatConflict::PartialRollouts => {
                "method.reinforcement.hyperparameters.partial_rollout_tokens"
            }
        }
    }
}

impl std::fmt::Display for FormatConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a JSON response_format is enforced on single completions; it cannot be combined \
             with {}",
            self.field()
        )
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

    #[test]
    fn a_json_format_conflicts_with_tool_episodes_and_partial_rollouts_only() {
        let text = parse(json!({"type": "text"})).unwrap();
        let json_object = parse(json!({"type": "json_object"})).unwrap();
        assert_eq!(text.conflict(true, true), None, "free text combines with everything");
        assert_eq!(json_object.conflict(false, false), None);
        assert_eq!(json_object.conflict(true, true), Some(FormatConflict::ToolEpisodes));
        let partial = json_object.conflict(false, true).unwrap();
        assert_eq!(partial, FormatConflict::PartialRollouts);
        assert!(partial.to_string().ends_with("partial_rollout_tokens"), "{partial}");
    }
}
