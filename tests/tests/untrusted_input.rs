//! Property tests of every parser of untrusted text (issue #43 item 10): object names, outbound
//! URLs, uploaded JSONL rows, grader specs and their templates and formulas, `response_format`,
//! tool calls in completions and chat templates' inputs. Each runs a fixed number of generated
//! cases (seconds in all, so CI runs them with the suite) and asserts what must hold for any
//! input: no panic, and the invariant the parser exists to keep.

use proptest::prelude::*;
use serde_json::{json, Value};
use std::path::Path;
use verity_core::names::{check_name, child_folder, strictly_inside};
use verity_core::urls::{AllowList, OutboundUrl};
use verity_server::api::files::jsonl::{JsonlValidator, RowFormat};
use verity_verifiers::template::Template;
use verity_verifiers::{Grader, Sample};
use verity_worker::chat_template::ChatTemplate;
use verity_worker::episodes::format::{openai_tool_calls, parse_tool_calls};
use verity_worker::ChatMessage;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// Text that mixes the characters parsers care about with arbitrary Unicode.
fn tricky_text(max: usize) -> impl Strategy<Value = String> {
    let pieces = prop_oneof![
        Just("/".to_string()),
        Just("\\".to_string()),
        Just(".".to_string()),
        Just("..".to_string()),
        Just("%2e".to_string()),
        Just("%2F".to_string()),
        Just("%00".to_string()),
        Just("\u{0}".to_string()),
        Just("\n".to_string()),
        Just("{{".to_string()),
        Just("}}".to_string()),
        Just("\"".to_string()),
        Just("@".to_string()),
        Just(":".to_string()),
        "[a-z0-9]{1,4}",
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(pieces, 0..max).prop_map(|parts| parts.concat())
}

/// Arbitrary JSON up to a small depth.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        tricky_text(8).prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config(2000))]

    /// A name the rule accepts becomes exactly one folder strictly inside the root, whatever
    /// it holds; everything else is refused before any path is built.
    #[test]
    fn accepted_names_stay_strictly_inside_their_root(name in tricky_text(12)) {
        let root = Path::new("/var/cache/verity/models");
        match check_name(&name) {
            Ok(()) => {
                let folder = child_folder(root, &name).unwrap();
                prop_assert!(strictly_inside(root, &folder), "{name:?} -> {folder:?}");
                prop_assert_eq!(folder.parent(), Some(root));
            }
            Err(_) => prop_assert!(child_folder(root, &name).is_err()),
        }
    }

    /// Whatever follows an allow-listed prefix, an admitted URL has the entry's scheme, host and
    /// port, no userinfo, and decoded path segments that start with the entry's and hold no
    /// `.` or `..` (so `…/v1/../internal` and `…/v1/%2e%2e/x` are refused).
    #[test]
    fn allow_listed_urls_never_escape_their_prefix(tail in tricky_text(10), port in 1u16..65535) {
        let entry = format!("http://127.0.0.1:{port}/v1/");
        let allow = AllowList::parse(&entry).unwrap();
        for candidate in [format!("{entry}{tail}"), format!("http://127.0.0.1:{port}{tail}"), tail.clone()] {
            if let Ok(url) = allow.check(&candidate) {
                let url = url.url();
                prop_assert_eq!(url.scheme(), "http");
                prop_assert_eq!(url.host_str(), Some("127.0.0.1"));
                prop_assert_eq!(url.port_or_known_default(), Some(port));
                prop_assert!(url.username().is_empty() && url.password().is_none());
                let segments: Vec<String> = url
                    .path_segments()
                    .into_iter()
                    .flatten()
                    .map(percent_decode)
                    .collect();
                prop_assert_eq!(segments.first().map(String::as_str), Some("v1"), "{}", candidate);
                prop_assert!(segments.iter().all(|s| s != "." && s != ".."), "{}", candidate);
            }
        }
        // Any text at all parses or is refused; nothing panics.
        let _ = OutboundUrl::parse(&tail);
    }

    /// The upload validator gives the same verdict however the bytes are split into chunks,
    /// and an error names a line that exists (or line 0, the file as a whole).
    #[test]
    fn jsonl_validation_does_not_depend_on_chunking(
        lines in prop::collection::vec(prop_oneof![
            json_value().prop_map(|v| v.to_string()),
            Just(r#"{"prompt": "2+2?", "answer": "4"}"#.to_string()),
            Just(r#"{"messages": [{"role": "user", "content": "hi"}]}"#.to_string()),
            tricky_text(20),
        ], 0..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        format in prop_oneof![Just(RowFormat::Any), Just(RowFormat::Prompt), Just(RowFormat::Supervised), Just(RowFormat::Preference)],
    ) {
        let text = lines.join("\n");
        let bytes = text.as_bytes();
        let mut whole = JsonlValidator::for_format(format);
        whole.feed(bytes);
        let whole = whole.finish_all();
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        at.sort_unstable();
        let mut pieces = JsonlValidator::for_format(format);
        let mut start = 0;
        for end in at.into_iter().chain([bytes.len()]) {
            pieces.feed(&bytes[start..end]);
            start = end;
        }
        let pieces = pieces.finish_all();
        prop_assert_eq!(&whole, &pieces);
        if let Err(errors) = whole {
            let count = text.split('\n').count() as u64;
            // Line 0 is the file as a whole (no records at all); any other names a real line.
            prop_assert!(
                errors.iter().all(|e| e.line <= count && (e.line >= 1 || e.field.is_empty())),
                "{errors:?} of {count} lines"
            );
        }
    }

    /// `response_format` bodies of any shape are accepted or refused with a message; never a
    /// panic, and an accepted JSON schema names properties only from the schema.
    #[test]
    fn response_formats_parse_or_refuse(body in json_value(), schema in json_value()) {
        for candidate in [body.clone(), json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}})] {
            if let Ok(format) = serde_json::from_value::<verity_core::response_format::ResponseFormat>(candidate) {
                let _ = format.validate();
                let _ = format.schema_properties();
            }
        }
    }
}

proptest! {
    #![proptest_config(config(400))]

    /// Templates of any text compile or are refused; a compiled one renders against any row
    /// and sample or names the field it misses.
    #[test]
    fn templates_render_or_name_the_missing_field(text in tricky_text(16), item in json_value(), output in tricky_text(12)) {
        let text = format!("{text}{{{{item.a}}}} {{{{sample.output_text}}}}");
        if let Ok(template) = Template::parse(&text) {
            let _ = template.fields();
            let _ = template.render(&item, &Sample::from_text(output.clone()).with_output_json());
        }
    }

    /// Grader specs: valid ones with a field replaced by arbitrary JSON are accepted or refused
    /// with a message; an accepted grader scores any row and completion in [0, 1] (or reports an
    /// error), never panics.
    #[test]
    fn graders_from_mutated_specs_grade_in_range(
        which in 0usize..4,
        field in "[a-z_]{1,16}",
        value in json_value(),
        item in json_value(),
        output in tricky_text(24),
        formula in tricky_text(10),
    ) {
        let mut spec = match which {
            0 => json!({"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "eq"}),
            1 => json!({"type": "text_similarity", "name": "t", "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "evaluation_metric": "fuzzy_match"}),
            2 => json!({"type": "multi", "graders": {"a": {"type": "string_check", "name": "a", "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "like"}}, "calculate_output": format!("a * 1 {formula}")}),
            _ => json!({"type": "multi", "graders": {"a": {"type": "string_check", "name": "a", "input": "{{sample.output_json.x}}", "reference": "y", "operation": "eq"}}, "calculate_output": "a"}),
        };
        spec[field.as_str()] = value;
        if let Ok(grader) = Grader::from_json(&spec.to_string()) {
            let item = json!({"answer": item});
            let result = grader.grade(&item, &Sample::from_text(output).with_output_json());
            prop_assert!(result.error.is_some() || (0.0..=1.0).contains(&result.score), "{result:?}");
        }
    }

    /// Tool calls in a completion: any text parses without panicking, and every call handed
    /// to graders (`sample.output_tools`) has OpenAI's shape with JSON-object arguments.
    #[test]
    fn tool_calls_in_completions_parse_into_openai_shape(
        before in tricky_text(8),
        name in tricky_text(6),
        arguments in json_value(),
        after in tricky_text(8),
    ) {
        let call = json!({"name": name, "arguments": arguments}).to_string();
        for text in [
            format!("{before}<tool_call>{call}</tool_call>{after}"),
            format!("{before}<tool_call>{after}"),
            format!("{before}[TOOL_CALLS]{call}{after}"),
            format!("{before}{after}"),
        ] {
            let _ = parse_tool_calls(&text);
            for tool_call in openai_tool_calls(&text) {
                prop_assert_eq!(&tool_call["type"], "function");
                prop_assert!(tool_call["function"]["name"].is_string());
                let arguments = tool_call["function"]["arguments"].as_str().unwrap_or("");
                let parsed: Value = serde_json::from_str(arguments).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(parsed.is_object(), "{tool_call}");
            }
        }
    }

    /// A chat template renders users' text as data: whatever a message holds (Jinja syntax
    /// included), rendering does not fail or panic and the text comes out verbatim.
    #[test]
    fn chat_templates_render_message_text_verbatim(content in tricky_text(24), system in tricky_text(8)) {
        let template = ChatTemplate::new(CHATML).unwrap();
        let messages = [ChatMessage::new("system", system.clone()), ChatMessage::new("user", content.clone())];
        let rendered = template.render(&messages, true, None, None).unwrap();
        prop_assert!(rendered.contains(&format!("<|im_start|>user\n{content}<|im_end|>")), "{rendered:?}");
        prop_assert!(rendered.ends_with("<|im_start|>assistant\n"));
    }
}

/// The ChatML template of SmolLM2 and Qwen.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
