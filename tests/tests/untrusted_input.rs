//! Property tests of every parser of untrusted text (issue #43 item 10): object names, outbound
//! URLs, uploaded JSONL rows, grader specs and their templates and formulas, `response_format`,
//! tool calls in completions and chat templates' inputs. Each runs a fixed number of generated
//! cases (seconds in all, so CI runs them with the suite) and asserts what must hold for any
//! input: no panic, and the invariant the parser exists to keep.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
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

/// Runs `check` on `cases` inputs drawn by `draw` from a seeded generator (a fixed seed, so a
/// failure is reproducible); a failing case panics with its case number and input.
fn for_all<T: std::fmt::Debug>(
    cases: u32,
    draw: impl Fn(&mut StdRng) -> T,
    check: impl Fn(&T) -> Result<(), String>,
) {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    for case in 0..cases {
        let input = draw(&mut rng);
        if let Err(why) = check(&input) {
            panic!("case {case}: {why}\ninput: {input:?}");
        }
    }
}

/// Fails the case with `why` unless `holds`.
fn ensure(holds: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if holds {
        Ok(())
    } else {
        Err(why())
    }
}

/// Text that mixes the characters parsers care about with arbitrary Unicode.
fn tricky_text(rng: &mut StdRng, max: usize) -> String {
    const PIECES: &[&str] = &[
        "/",
        "\\",
        ".",
        "..",
        "%2e",
        "%2F",
        "%00",
        "\u{0}",
        "\n",
        "{{",
        "}}",
        "\"",
        "@",
        ":",
        "{%",
        "%}",
        "<tool_call>",
        "</tool_call>",
        "[TOOL_CALLS]",
        "<|im_end|>",
        " ",
    ];
    let count = rng.random_range(0..=max);
    (0..count)
        .map(|_| match rng.random_range(0..4) {
            0 => PIECES[rng.random_range(0..PIECES.len())].to_string(),
            1 => (0..rng.random_range(1..4))
                .map(|_| char::from(rng.random_range(b'a'..=b'z')))
                .collect(),
            _ => rng.random::<char>().to_string(),
        })
        .collect()
}

/// Arbitrary JSON up to `depth` levels.
fn json_value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.random_range(0..if depth == 0 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => Value::from(rng.random::<i64>()),
        3 => serde_json::Number::from_f64(rng.random::<f64>() * 1e6 - 5e5)
            .map_or(Value::Null, Value::Number),
        4 => Value::String(tricky_text(rng, 8)),
        5 => {
            Value::Array((0..rng.random_range(0..4)).map(|_| json_value(rng, depth - 1)).collect())
        }
        _ => Value::Object(
            (0..rng.random_range(0..4))
                .map(|_| (tricky_text(rng, 2), json_value(rng, depth - 1)))
                .collect(),
        ),
    }
}

/// A name the rule accepts becomes exactly one folder strictly inside the root, whatever it
/// holds; everything else is refused before any path is built.
#[test]
fn accepted_names_stay_strictly_inside_their_root() {
    let root = Path::new("/var/cache/verity/models");
    for_all(
        3000,
        |rng| tricky_text(rng, 12),
        |name| match check_name(name) {
            Ok(()) => {
                let folder = child_folder(root, name).map_err(|e| e.to_string())?;
                ensure(strictly_inside(root, &folder), || format!("{folder:?} escapes"))?;
                ensure(folder.parent() == Some(root), || {
                    format!("{folder:?} is not one level down")
                })
            }
            Err(_) => {
                ensure(child_folder(root, name).is_err(), || "a refused name made a path".into())
            }
        },
    );
}

/// Whatever follows an allow-listed prefix, an admitted URL has the entry's scheme, host and
/// port, no userinfo, and decoded path segments that start with the entry's and hold no `.` or
/// `..` (so `…/v1/../internal` and `…/v1/%2e%2e/x` are refused).
#[test]
fn allow_listed_urls_never_escape_their_prefix() {
    let draw = |rng: &mut StdRng| (tricky_text(rng, 10), rng.random_range(1u16..65535));
    for_all(3000, draw, |(tail, port)| {
        let entry = format!("http://127.0.0.1:{port}/v1/");
        let allow = AllowList::parse(&entry).map_err(|e| format!("{e:?}"))?;
        for candidate in
            [format!("{entry}{tail}"), format!("http://127.0.0.1:{port}{tail}"), tail.clone()]
        {
            let Ok(url) = allow.check(&candidate) else { continue };
            let url = url.url();
            let why = || format!("{candidate} admitted as {url}");
            ensure(url.scheme() == "http" && url.host_str() == Some("127.0.0.1"), why)?;
            ensure(url.port_or_known_default() == Some(*port), why)?;
            ensure(url.username().is_empty() && url.password().is_none(), why)?;
            let segments: Vec<String> =
                url.path_segments().into_iter().flatten().map(percent_decode).collect();
            ensure(segments.first().map(String::as_str) == Some("v1"), why)?;
            ensure(segments.iter().all(|s| s != "." && s != ".."), why)?;
        }
        // Any text at all parses or is refused; nothing panics.
        let _ = OutboundUrl::parse(tail);
        Ok(())
    });
}

/// The upload validator gives the same verdict however the bytes are split into chunks, and an
/// error names a line that exists (or line 0, the file as a whole).
#[test]
fn jsonl_validation_does_not_depend_on_chunking() {
    let draw = |rng: &mut StdRng| {
        let lines: Vec<String> = (0..rng.random_range(0..8))
            .map(|_| match rng.random_range(0..4) {
                0 => json_value(rng, 3).to_string(),
                1 => r#"{"prompt": "2+2?", "answer": "4"}"#.to_string(),
                2 => r#"{"messages": [{"role": "user", "content": "hi"}]}"#.to_string(),
                _ => tricky_text(rng, 20),
            })
            .collect();
        let text = lines.join("\n");
        let mut cuts: Vec<usize> =
            (0..rng.random_range(0..6)).map(|_| rng.random_range(0..=text.len())).collect();
        cuts.sort_unstable();
        let format =
            [RowFormat::Any, RowFormat::Prompt, RowFormat::Supervised, RowFormat::Preference]
                [rng.random_range(0..4)];
        (text, cuts, format)
    };
    for_all(2000, draw, |(text, cuts, format)| {
        let bytes = text.as_bytes();
        let mut whole = JsonlValidator::for_format(*format);
        whole.feed(bytes);
        let whole = whole.finish_all();
        let mut pieces = JsonlValidator::for_format(*format);
        let mut start = 0;
        for &end in cuts.iter().chain([&bytes.len()]) {
            pieces.feed(&bytes[start..end]);
            start = end;
        }
        let pieces = pieces.finish_all();
        ensure(whole == pieces, || format!("{whole:?} whole, {pieces:?} in pieces"))?;
        if let Err(errors) = whole {
            let count = text.split('\n').count() as u64;
            let real = |e: &verity_server::api::files::jsonl::LineError| {
                e.line <= count && (e.line >= 1 || e.field.is_empty())
            };
            ensure(errors.iter().all(real), || format!("{errors:?} of {count} lines"))?;
        }
        Ok(())
    });
}

/// `response_format` bodies of any shape are accepted or refused; never a panic.
#[test]
fn response_formats_parse_or_refuse() {
    let draw = |rng: &mut StdRng| (json_value(rng, 3), json_value(rng, 3));
    for_all(2000, draw, |(body, schema)| {
        let strict = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        for candidate in [body.clone(), strict] {
            if let Ok(format) =
                serde_json::from_value::<verity_core::response_format::ResponseFormat>(candidate)
            {
                let _ = format.validate();
                let _ = format.schema_properties();
            }
        }
        Ok(())
    });
}

/// Templates of any text compile or are refused; a compiled one renders against any row and
/// sample or names the field it misses.
#[test]
fn templates_render_or_name_the_missing_field() {
    let draw = |rng: &mut StdRng| (tricky_text(rng, 16), json_value(rng, 3), tricky_text(rng, 12));
    for_all(1000, draw, |(text, item, output)| {
        let text = format!("{text}{{{{item.a}}}} {{{{sample.output_text}}}}");
        if let Ok(template) = Template::parse(&text) {
            let _ = template.fields();
            let _ = template.render(item, &Sample::from_text(output.clone()).with_output_json());
        }
        Ok(())
    });
}

/// Grader specs: valid ones with a field replaced by arbitrary JSON are accepted or refused with
/// a message; an accepted grader scores any row and completion in [0, 1] (or reports an error),
/// never panics. Formulas of `multi` graders get arbitrary text appended.
#[test]
fn graders_from_mutated_specs_grade_in_range() {
    const FIELDS: &[&str] = &[
        "type",
        "name",
        "input",
        "reference",
        "operation",
        "evaluation_metric",
        "graders",
        "calculate_output",
        "range",
        "pass_threshold",
    ];
    let draw = |rng: &mut StdRng| {
        let which = rng.random_range(0..4);
        let formula = tricky_text(rng, 10);
        let mut spec = match which {
            0 => {
                json!({"type": "string_check", "name": "s", "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "eq"})
            }
            1 => {
                json!({"type": "text_similarity", "name": "t", "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "evaluation_metric": "fuzzy_match"})
            }
            2 => {
                json!({"type": "multi", "graders": {"a": {"type": "string_check", "name": "a", "input": "{{sample.output_text}}", "reference": "{{item.answer}}", "operation": "like"}}, "calculate_output": format!("a * 1 {formula}")})
            }
            _ => {
                json!({"type": "multi", "graders": {"a": {"type": "string_check", "name": "a", "input": "{{sample.output_json.x}}", "reference": "y", "operation": "eq"}}, "calculate_output": "a"})
            }
        };
        if rng.random_bool(0.7) {
            spec[FIELDS[rng.random_range(0..FIELDS.len())]] = json_value(rng, 2);
        }
        (spec, json!({"answer": json_value(rng, 2)}), tricky_text(rng, 24))
    };
    for_all(1000, draw, |(spec, item, output)| {
        if let Ok(grader) = Grader::from_json(&spec.to_string()) {
            let result = grader.grade(item, &Sample::from_text(output.clone()).with_output_json());
            ensure(result.error.is_some() || (0.0..=1.0).contains(&result.score), || {
                format!("{result:?}")
            })?;
        }
        Ok(())
    });
}

/// Tool calls in a completion: any text parses without panicking, and every call handed to
/// graders (`sample.output_tools`) has OpenAI's shape with JSON-object arguments.
#[test]
fn tool_calls_in_completions_parse_into_openai_shape() {
    let draw = |rng: &mut StdRng| {
        let call =
            json!({"name": tricky_text(rng, 6), "arguments": json_value(rng, 2)}).to_string();
        let (before, after) = (tricky_text(rng, 8), tricky_text(rng, 8));
        [
            format!("{before}<tool_call>{call}</tool_call>{after}"),
            format!("{before}<tool_call>{after}"),
            format!("{before}[TOOL_CALLS]{call}{after}"),
            format!("{before}{after}"),
        ]
    };
    for_all(1000, draw, |texts| {
        for text in texts {
            let _ = parse_tool_calls(text);
            for tool_call in openai_tool_calls(text) {
                let why = || format!("{tool_call}");
                ensure(tool_call["type"] == "function", why)?;
                ensure(tool_call["function"]["name"].is_string(), why)?;
                let arguments = tool_call["function"]["arguments"].as_str().unwrap_or("");
                let parsed: Value = serde_json::from_str(arguments).map_err(|e| e.to_string())?;
                ensure(parsed.is_object(), why)?;
            }
        }
        Ok(())
    });
}

/// A chat template renders users' text as data: whatever a message holds (Jinja syntax
/// included), rendering does not fail and the text comes out verbatim.
#[test]
fn chat_templates_render_message_text_verbatim() {
    let template = ChatTemplate::new(CHATML).unwrap();
    let draw = |rng: &mut StdRng| (tricky_text(rng, 24), tricky_text(rng, 8));
    for_all(1000, draw, |(content, system)| {
        let messages =
            [ChatMessage::new("system", system.clone()), ChatMessage::new("user", content.clone())];
        let rendered = template.render(&messages, true, None, None).map_err(|e| e.to_string())?;
        let why = || format!("{rendered:?}");
        ensure(rendered.contains(&format!("<|im_start|>user\n{content}<|im_end|>")), why)?;
        ensure(rendered.ends_with("<|im_start|>assistant\n"), why)
    });
}

/// The ChatML template of SmolLM2 and Qwen.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn percent_decode(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment).decode_utf8_lossy().into_owned()
}
