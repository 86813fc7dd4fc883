//! The API reference in Markdown, generated from the OpenAPI document (`docs/api-reference.md`,
//! written by `verity openapi --markdown`; a test keeps the committed file current).

use serde_json::Value;
use std::fmt::Write;

/// HTTP methods in the order the reference lists them.
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// A short type name for a JSON schema (`string`, `integer`, `File`, `array of Job`, …).
fn type_name(schema: &Value) -> String {
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        return format!("`{}`", reference.rsplit('/').next().unwrap_or(reference));
    }
    for combinator in ["oneOf", "anyOf", "allOf"] {
        if let Some(options) = schema.get(combinator).and_then(Value::as_array) {
            let names: Vec<String> =
                options.iter().map(type_name).filter(|n| n != "null").collect();
            return names.join(" or ");
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .filter(|k| *k != "null")
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_string(),
    };
    match (kind.as_str(), schema.get("items")) {
        ("array", Some(items)) => format!("array of {}", type_name(items)),
        _ => kind,
    }
}

/// One line of text for a table cell.
fn cell(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

fn operation(out: &mut String, method: &str, path: &str, op: &Value) {
    let _ = writeln!(out, "### `{} {path}`\n", method.to_uppercase());
    for key in ["summary", "description"] {
        if let Some(text) = op.get(key).and_then(Value::as_str).filter(|t| !t.is_empty()) {
            let _ = writeln!(out, "{text}\n");
        }
    }
    if let Some(params) = op.get("parameters").and_then(Value::as_array).filter(|p| !p.is_empty()) {
        out.push_str("| parameter | in | type | required | description |\n|---|---|---|---|---|\n");
        for p in params {
            let text = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            let required = if p.get("required").and_then(Value::as_bool).unwrap_or(false) {
                "yes"
            } else {
                "no"
            };
            let kind = p.get("schema").map(type_name).unwrap_or_default();
            let _ = writeln!(
                out,
                "| `{}` | {} | {kind} | {required} | {} |",
                text("name"),
                text("in"),
                cell(&text("description"))
            );
        }
        out.push('\n');
    }
    if let Some(content) = op.pointer("/requestBody/content").and_then(Value::as_object) {
        for (media, body) in content {
            let kind = body.get("schema").map(type_name).unwrap_or_else(|| "any".into());
            let _ = writeln!(out, "Request body (`{media}`): {kind}\n");
        }
    }
    if let Some(responses) = op.get("responses").and_then(Value::as_object) {
        out.push_str("| status | response |\n|---|---|\n");
        for (status, response) in responses {
            let description = response
                .get("description")
                .and_then(Value::as_str)
                .filter(|d| !d.is_empty())
                .or_else(|| {
                    axum::http::StatusCode::from_bytes(status.as_bytes())
                        .ok()
                        .and_then(|s| s.canonical_reason())
                })
                .unwrap_or_default();
            let media: Vec<String> = response
                .get("content")
                .and_then(Value::as_object)
                .map(|c| {
                    c.iter()
                        .map(|(m, b)| {
                            format!("`{m}` {}", b.get("schema").map(type_name).unwrap_or_default())
                        })
                        .collect()
                })
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| {status} | {} |",
                cell(&format!("{description} {}", media.join(", ")))
            );
        }
        out.push('\n');
    }
}

fn schema_section(out: &mut String, name: &str, schema: &Value) {
    let _ = writeln!(out, "### `{name}`\n");
    if let Some(text) = schema.get("description").and_then(Value::as_str) {
        let _ = writeln!(out, "{text}\n");
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match schema.get("properties").and_then(Value::as_object) {
        Some(properties) => {
            out.push_str("| field | type | required | description |\n|---|---|---|---|\n");
            for (field, property) in properties {
                let description =
                    property.get("description").and_then(Value::as_str).unwrap_or_default();
                let needed = if required.contains(&field.as_str()) { "yes" } else { "no" };
                let _ = writeln!(
                    out,
                    "| `{field}` | {} | {needed} | {} |",
                    type_name(property),
                    cell(description)
                );
            }
        }
        None => {
            let _ = writeln!(out, "Type: {}", type_name(schema));
            if let Some(values) = schema.get("enum").and_then(Value::as_array) {
                let values: Vec<String> = values
                    .iter()
                    .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
                    .collect();
                let _ = writeln!(out, "; one of {}", values.join(", "));
            }
        }
    }
    out.push('\n');
}

/// Renders the OpenAPI document `spec` (as JSON) as Markdown: every operation grouped by tag,
/// with its parameters, request body and responses, then every schema with its fields.
pub fn reference_markdown(spec: &Value) -> String {
    let mut out = String::from(
        "# API reference\n\n<!-- Generated from /openapi.json by `verity openapi --markdown > docs/api-reference.md`; do not edit. -->\n\n\
         Every endpoint of the REST API as the server describes it at `GET /openapi.json`. Authentication, \
         configuration, and examples with curl and the OpenAI SDK are in [api.md](api.md).\n\n",
    );
    let mut by_tag: std::collections::BTreeMap<String, Vec<(String, String, Value)>> =
        Default::default();
    if let Some(paths) = spec.get("paths").and_then(Value::as_object) {
        for (path, item) in paths {
            for method in METHODS {
                if let Some(op) = item.get(method) {
                    let tag = op
                        .pointer("/tags/0")
                        .and_then(Value::as_str)
                        .unwrap_or("other")
                        .to_string();
                    by_tag.entry(tag).or_default().push((
                        method.to_string(),
                        path.clone(),
                        op.clone(),
                    ));
                }
            }
        }
    }
    for (tag, operations) in &by_tag {
        let _ = writeln!(out, "## {tag}\n");
        for (method, path, op) in operations {
            operation(&mut out, method, path, op);
        }
    }
    if let Some(schemas) = spec.pointer("/components/schemas").and_then(Value::as_object) {
        out.push_str("## Schemas\n\n");
        for (name, schema) in schemas {
            schema_section(&mut out, name, schema);
        }
    }
    out.trim_end().to_string() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn operations_and_schemas_render() {
        let spec = json!({
            "paths": {"/v1/files/{file_id}": {"get": {"tags": ["files"], "summary": "One file.",
                "parameters": [{"name": "file_id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the file", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/File"}}}}}}}},
            "components": {"schemas": {"File": {"type": "object", "required": ["id"],
                "properties": {"id": {"type": "string", "description": "`file-…`"}, "bytes": {"type": ["integer", "null"]}}}}}
        });
        let md = reference_markdown(&spec);
        assert!(md.contains("### `GET /v1/files/{file_id}`"), "{md}");
        assert!(md.contains("| `file_id` | path | string | yes |"), "{md}");
        assert!(md.contains("| 200 | the file `application/json` `File` |"), "{md}");
        assert!(
            md.contains("| `bytes` | integer | no |")
                && md.contains("| `id` | string | yes | `file-…` |"),
            "{md}"
        );
    }
}
