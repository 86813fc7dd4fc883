//! Templates such as `{{sample.output_text}}` and `{{item.a.b}}`, parsed once and rendered per row.

use serde_json::Value;
use thiserror::Error;

use crate::sample::Sample;

/// A template that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TemplateError {
    /// `{{` without a matching `}}`.
    #[error("unclosed '{{{{' at byte {0}")]
    Unclosed(usize),
    /// A reference that is not `sample.…` or `item.…`.
    #[error("'{0}' must start with 'sample.' or 'item.' and name a field")]
    BadReference(String),
}

/// A field a template needs but the row lacks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("missing field '{0}'")]
pub struct MissingField(pub String);

/// Where a reference points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Root {
    Sample,
    Item,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Field { root: Root, path: Vec<String> },
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    segments: Vec<Segment>,
}

impl Template {
    /// Parses `text`; `{{ root.a.b }}` references (spaces allowed) are the only syntax.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut segments = Vec::new();
        let mut rest = text;
        let mut offset = 0;
        while let Some(start) = rest.find("{{") {
            if start > 0 {
                segments.push(Segment::Literal(rest[..start].to_string()));
            }
            let after = &rest[start + 2..];
            let end = after.find("}}").ok_or(TemplateError::Unclosed(offset + start))?;
            segments.push(parse_reference(after[..end].trim())?);
            let consumed = start + 2 + end + 2;
            offset += consumed;
            rest = &rest[consumed..];
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest.to_string()));
        }
        Ok(Self { segments })
    }

    /// The dotted names of the fields this template reads (`item.a.b`).
    pub fn fields(&self) -> Vec<String> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::Field { root, path } => Some(dotted(*root, path)),
                Segment::Literal(_) => None,
            })
            .collect()
    }

    /// The `item` field paths this template reads.
    pub fn item_paths(&self) -> Vec<Vec<String>> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::Field { root: Root::Item, path } => Some(path.clone()),
                _ => None,
            })
            .collect()
    }

    /// The `sample` field paths this template reads.
    pub fn sample_paths(&self) -> Vec<Vec<String>> {
        self.segments
            .iter()
            .filter_map(|s| match s {
                Segment::Field { root: Root::Sample, path } => Some(path.clone()),
                _ => None,
            })
            .collect()
    }

    /// When the template is exactly one reference, the referenced JSON value (not stringified).
    pub fn resolve_single(
        &self,
        item: &Value,
        sample: &Sample,
    ) -> Option<Result<Value, MissingField>> {
        match self.segments.as_slice() {
            [Segment::Field { root, path }] => Some(lookup(*root, path, item, sample)),
            _ => None,
        }
    }

    /// Renders the template; strings are inserted as-is, other JSON values as JSON text.
    pub fn render(&self, item: &Value, sample: &Sample) -> Result<String, MissingField> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => out.push_str(text),
                Segment::Field { root, path } => match lookup(*root, path, item, sample)? {
                    Value::String(s) => out.push_str(&s),
                    other => out.push_str(&other.to_string()),
                },
            }
        }
        Ok(out)
    }
}

/// Parses `root.a.b`; an index may also be written `a[0]` (OpenAI's guides do:
/// `sample.output_tools[0].function.arguments`).
fn parse_reference(reference: &str) -> Result<Segment, TemplateError> {
    let dotted = reference.replace('[', ".").replace(']', "");
    let mut parts = dotted.split('.');
    let root = match parts.next() {
        Some("sample") => Root::Sample,
        Some("item") => Root::Item,
        _ => return Err(TemplateError::BadReference(reference.to_string())),
    };
    let path: Vec<String> = parts.map(str::to_string).collect();
    if path.is_empty() || path.iter().any(|p| p.is_empty()) {
        return Err(TemplateError::BadReference(reference.to_string()));
    }
    Ok(Segment::Field { root, path })
}

fn dotted(root: Root, path: &[String]) -> String {
    let head = match root {
        Root::Sample => "sample",
        Root::Item => "item",
    };
    format!("{head}.{}", path.join("."))
}

fn lookup(
    root: Root,
    path: &[String],
    item: &Value,
    sample: &Sample,
) -> Result<Value, MissingField> {
    let missing = || MissingField(dotted(root, path));
    let (first, rest) = path.split_first().ok_or_else(missing)?;
    let mut current = match root {
        Root::Item => item.get(first).cloned().ok_or_else(missing)?,
        Root::Sample if first == "output_text" => Value::String(sample.output_text.clone()),
        Root::Sample => sample.extra.get(first).cloned().ok_or_else(missing)?,
    };
    for key in rest {
        current = match &current {
            Value::Object(map) => map.get(key).cloned().ok_or_else(missing)?,
            Value::Array(items) => {
                key.parse::<usize>().ok().and_then(|i| items.get(i).cloned()).ok_or_else(missing)?
            }
            _ => return Err(missing()),
        };
    }
    if current.is_null() {
        return Err(missing());
    }
    Ok(current)
}

/// Whether `item` has the field at `path` (used by dataset validation).
pub fn item_has_path(item: &Value, path: &[String]) -> bool {
    lookup(Root::Item, path, item, &Sample::default()).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_sample_and_nested_item_fields() {
        let t = Template::parse("{{ sample.output_text }} vs {{item.a.b}}").unwrap();
        let s = t.render(&json!({"a": {"b": 3}}), &Sample::from_text("x")).unwrap();
        assert_eq!(s, "x vs 3");
    }

    #[test]
    fn episode_fields_of_the_sample_are_reachable() {
        let mut sample = Sample::from_text("42");
        sample.extra.insert(
            "tool_calls".into(),
            json!([{"name": "calculator", "arguments": {"expression": "6*7"}, "output": "42"}]),
        );
        sample.extra.insert("messages".into(), json!([{"role": "tool", "content": "42"}]));
        let t =
            Template::parse("{{sample.tool_calls.0.name}}={{sample.messages.0.content}}").unwrap();
        assert_eq!(t.render(&json!({}), &sample).unwrap(), "calculator=42");
        let all = Template::parse("{{sample.tool_calls}}").unwrap();
        assert!(all.render(&json!({}), &sample).unwrap().contains("\"name\":\"calculator\""));
    }

    #[test]
    fn bracket_indices_and_sample_paths() {
        let t = Template::parse("{{sample.output_tools[0].function.name}}").unwrap();
        assert_eq!(t.sample_paths(), [["output_tools", "0", "function", "name"]]);
        let mut sample = Sample::from_text("");
        sample.extra.insert("output_tools".into(), json!([{"function": {"name": "f"}}]));
        assert_eq!(t.render(&json!({}), &sample).unwrap(), "f");
        assert!(Template::parse("{{sample.a[]}}").is_err());
    }

    #[test]
    fn missing_field_is_named() {
        let t = Template::parse("{{item.reference_answer}}").unwrap();
        let err = t.render(&json!({}), &Sample::from_text("x")).unwrap_err();
        assert_eq!(err.to_string(), "missing field 'item.reference_answer'");
    }

    #[test]
    fn bad_references_are_rejected() {
        assert!(Template::parse("{{foo.bar}}").is_err());
        assert!(Template::parse("{{item}}").is_err());
        assert!(Template::parse("{{item.a").is_err());
    }
}
