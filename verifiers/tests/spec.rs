//! Spec parsing, validation paths, schema export and the in-process graders end to end.

use serde_json::json;
use verity_verifiers::{grader_json_schema, ErrorKind, Grader, Sample};

fn grade(
    spec: serde_json::Value,
    item: serde_json::Value,
    text: &str,
) -> verity_verifiers::GradeResult {
    Grader::from_json(&spec.to_string())
        .expect("valid grader")
        .grade(&item, &Sample::from_text(text))
}

#[test]
fn unknown_fields_are_rejected_with_their_path() {
    let err = Grader::from_json(
        r#"{"type":"string_check","input":"a","reference":"b","operation":"eq","bogus":1}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
    let err = Grader::from_json(
        r#"{"type":"multi","calculate_output":"a","graders":{"a":{"type":"math","reference":"x","extract":"nope"}}}"#,
    )
    .unwrap_err();
    assert_eq!(err.0[0].path, "graders.a.extract", "{err}");
    let err = Grader::from_json(
        r#"{"type":"constraints","checks":[{"check":"word_count","min":1,"oops":2}]}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("oops"), "{err}");
}

#[test]
fn semantic_errors_name_their_path() {
    let err = Grader::from_json(
        r#"{"type":"multi","calculate_output":"0.5 * acc + fmt","graders":{"acc":{"type":"math","reference":"{{itm.x}}"}}}"#,
    )
    .unwrap_err();
    let paths: Vec<_> = err.0.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"graders.acc.reference"), "{paths:?}");
    assert!(paths.contains(&"calculate_output"), "{paths:?}");
    let err = Grader::from_json(r#"{"type":"format","preset":"regex"}"#).unwrap_err();
    assert_eq!(err.0[0].path, "pattern");
}

/// OpenAI's API reference sends an image part as `{type, image_url, file_id: null, detail}`:
/// every field of it parses, so the refusal names the part's type, not serde's "did not match
/// any variant".
#[test]
fn a_judge_image_part_is_refused_by_its_type() {
    let image = json!({"type": "input_image", "image_url": "https://example.com/reference.png",
                       "file_id": null, "detail": "auto"});
    let spec = json!({"type": "score_model", "name": "look", "model": "judge", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Score it"}, image]}]});
    let err = Grader::from_json(&spec.to_string()).unwrap_err();
    assert_eq!(err.0[0].path, "input.0.content", "{err}");
    assert!(err.0[0].message.contains("'input_image': image parts are not supported"), "{err}");
}

/// A judge's sampling settings are checked with the ranges every other sampling edge uses
/// (`verity_verifiers::sampling`): each refusal names its field and gives the shared rule.
#[test]
fn a_judge_s_sampling_settings_are_checked_with_the_shared_ranges() {
    let judge = |params: serde_json::Value| {
        json!({"type": "score_model", "name": "j", "model": "judge", "sampling_params": params,
               "input": [{"role": "user", "content": "Score {{sample.output_text}}"}]})
    };
    Grader::from_json(&judge(json!({"temperature": 2.0, "top_p": 1.0})).to_string()).unwrap();
    let err = Grader::from_json(&judge(json!({"temperature": 2.5, "top_p": 0.0})).to_string())
        .unwrap_err();
    let found: Vec<(&str, &str)> =
        err.0.iter().map(|e| (e.path.as_str(), e.message.as_str())).collect();
    let temperature = verity_verifiers::sampling::check_temperature(2.5).unwrap_err();
    let top_p = verity_verifiers::sampling::check_top_p(0.0).unwrap_err();
    assert!(found.contains(&("sampling_params.temperature", temperature.as_str())), "{found:?}");
    assert!(found.contains(&("sampling_params.top_p", top_p.as_str())), "{found:?}");
}

#[test]
fn schema_is_exported() {
    let schema = grader_json_schema().to_string();
    for kind in [
        "string_check",
        "text_similarity",
        "python",
        "multi",
        "math",
        "code",
        "format",
        "constraints",
    ] {
        assert!(schema.contains(kind), "{kind} missing from schema");
    }
    assert!(schema.contains("additionalProperties"));
}

#[test]
fn missing_item_field_is_an_error_naming_it() {
    let r = grade(
        json!({"type":"string_check","input":"{{sample.output_text}}","reference":"{{item.answer}}","operation":"eq"}),
        json!({}),
        "x",
    );
    assert_eq!(r.score, 0.0);
    let e = r.error.expect("error");
    assert_eq!(e.kind, ErrorKind::MissingField);
    assert!(e.message.contains("item.answer"));
}

#[test]
fn result_serialises_error_as_null() {
    let r = grade(
        json!({"type":"string_check","input":"{{sample.output_text}}","reference":"{{item.a.b}}","operation":"eq"}),
        json!({"a":{"b":"x"}}),
        "x",
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["score"], 1.0);
    assert!(v["error"].is_null());
    assert!(v["sub_scores"].is_object());
}

#[test]
fn multi_combines_by_formula() {
    let spec = json!({"type":"multi","calculate_output":"0.8 * acc + 0.2 * fmt","graders":{
        "acc": {"type":"math","reference":"{{item.answer}}"},
        "fmt": {"type":"format","preset":"think_answer"}}});
    let text = "<think>1/2 + 1/4 = 3/4</think> The answer is \\boxed{\\frac{3}{4}}";
    let r = grade(spec.clone(), json!({"answer":"0.75"}), text);
    assert!((r.score - 1.0).abs() < 1e-9, "{r:?}");
    assert_eq!(r.sub_scores["fmt"], 1.0);
    let r = grade(spec.clone(), json!({"answer":"0.5"}), text);
    assert!((r.score - 0.2).abs() < 1e-9, "{r:?}");
    let r = grade(spec, json!({}), text);
    assert_eq!(r.error.unwrap().kind, ErrorKind::MissingField);
}

#[test]
fn text_similarity_threshold() {
    let spec = json!({"type":"text_similarity","input":"{{sample.output_text}}","reference":"{{item.r}}","evaluation_metric":"fuzzy_match","pass_threshold":0.9});
    let r = grade(spec.clone(), json!({"r":"hello world"}), "hello world");
    assert_eq!((r.score, r.sub_scores["passed"]), (1.0, 1.0));
    let r = grade(spec, json!({"r":"hello world"}), "hello");
    assert!(r.score > 0.5 && r.score < 0.9, "{r:?}");
    assert_eq!(r.sub_scores["passed"], 0.0);
}

#[test]
fn over_long_text_similarity_says_it_was_capped() {
    let spec = json!({"type":"text_similarity","input":"{{sample.output_text}}","reference":"{{item.r}}","evaluation_metric":"fuzzy_match"});
    let long = "abcdefghij".repeat(3_000);
    let r = grade(spec, json!({"r": long}), &long);
    assert_eq!(r.score, 1.0, "{r:?}");
    assert!(r.reason.contains("compared only the first 20000 characters"), "{}", r.reason);
    assert!(r.reason.contains("input has 30000"), "{}", r.reason);
}

#[test]
fn constraints_can_come_from_the_row() {
    let spec = json!({"type": "constraints", "checks": [{"check": "lowercase"}], "checks_from": "{{item.constraints}}", "scoring": "fraction"});
    let item = json!({"constraints": [{"check": "word_count", "max": 3}, {"check": "include_keywords", "keywords": ["cat"]}]});
    let r = grade(spec.clone(), item, "the cat sat down");
    assert!((r.score - 2.0 / 3.0).abs() < 1e-9, "{r:?}");
    let r = grade(spec, json!({"constraints": [{"check": "nonsense"}]}), "x");
    assert_eq!(r.error.unwrap().kind, ErrorKind::BadItem);
    assert!(Grader::from_json(r#"{"type":"constraints"}"#).is_err());
}

fn fields(spec: serde_json::Value) -> Vec<String> {
    Grader::from_json(&spec.to_string())
        .expect("valid grader")
        .item_fields()
        .into_iter()
        .map(|path| path.join("."))
        .collect()
}

#[test]
fn item_fields_lists_every_item_path_the_templates_read() {
    // sample fields and literal text are not item fields
    assert_eq!(
        fields(
            json!({"type": "string_check", "input": "{{sample.output_text}}", "reference": "Answer: {{ item.reference_answer }}", "operation": "eq"})
        ),
        vec!["reference_answer"]
    );
    assert_eq!(
        fields(json!({"type": "math", "reference": "{{item.meta.answer}}"})),
        vec!["meta.answer"]
    );
    assert_eq!(
        fields(
            json!({"type": "code", "input": "{{item.prefix}}{{sample.output_text}}", "cases": "{{item.cases}}"})
        ),
        vec!["cases", "prefix"]
    );
    assert_eq!(
        fields(json!({"type": "constraints", "checks_from": "{{item.constraints}}"})),
        vec!["constraints"]
    );
    assert!(fields(json!({"type": "format", "preset": "think_answer"})).is_empty());
    // a python grader's source is not inspected: it may read any field, or guard its reads
    assert!(fields(json!({"type": "python", "source": "def grade(sample, item):\n    return float(item['x'] == 1)"})).is_empty());
    // every sub-grader of a multi, nested multis included, each path once and sorted
    let multi = json!({
        "type": "multi",
        "calculate_output": "a + b",
        "graders": {
            "a": {"type": "math", "reference": "{{item.reference_answer}}"},
            "b": {
                "type": "multi",
                "calculate_output": "c * d",
                "graders": {
                    "c": {"type": "text_similarity", "input": "{{sample.output_text}}", "reference": "{{item.explanation}} {{item.reference_answer}}", "evaluation_metric": "bleu"},
                    "d": {"type": "code", "tests": "{{item.tests.0}}"}
                }
            }
        }
    });
    assert_eq!(fields(multi), vec!["explanation", "reference_answer", "tests.0"]);
}

#[test]
fn cosine_graders_name_their_embedding_model() {
    let sim = |metric: &str, model: Option<&str>| {
        let mut spec = json!({"type": "text_similarity", "input": "{{sample.output_text}}",
                              "reference": "r", "evaluation_metric": metric});
        if let Some(model) = model {
            spec["model"] = json!(model);
        }
        spec
    };
    let multi = json!({"type": "multi", "calculate_output": "a + b",
                       "graders": {"a": sim("cosine", Some("minilm")), "b": sim("cosine", None)}});
    let grader = Grader::from_json(&multi.to_string()).unwrap();
    assert_eq!(
        grader.embedding_models(),
        vec![
            ("graders.a.model".to_string(), Some("minilm".to_string())),
            ("graders.b.evaluation_metric".to_string(), None)
        ]
    );
    assert_eq!(grader.embedding_paths(), vec!["graders.b.evaluation_metric".to_string()]);
    for bad in [sim("bleu", Some("minilm")), sim("cosine", Some(" "))] {
        let err = Grader::from_json(&bad.to_string()).unwrap_err();
        assert_eq!(err.0[0].path, "model", "{err}");
    }
    // Not given its model, a named cosine grader says which one is missing.
    let result = grade(sim("cosine", Some("minilm")), json!({}), "x");
    assert_eq!(result.error.as_ref().map(|e| e.kind), Some(ErrorKind::Embedding));
    assert!(result.error.unwrap().message.contains("\"minilm\""));
}

/// The RFT guide's shape: a multi grader over `sample.output_json` fields and a tool call.
#[test]
fn output_json_and_output_tools_are_graded_and_a_non_json_completion_scores_zero() {
    let grader = Grader::from_json(
        &json!({"type": "multi", "calculate_output": "compliant * 0.5 + tool * 0.5", "graders": {
            "compliant": {"type": "string_check", "name": "compliant", "operation": "eq",
                "input": "{{sample.output_json.compliant}}", "reference": "{{item.compliant}}"},
            "tool": {"type": "string_check", "name": "tool", "operation": "eq",
                "input": "{{sample.output_tools[0].function.name}}", "reference": "lookup"}}})
        .to_string(),
    )
    .unwrap();
    let fields: Vec<Vec<String>> = grader.sample_fields().into_iter().map(|(_, p)| p).collect();
    assert!(fields.contains(&vec!["output_json".to_string(), "compliant".to_string()]));
    let item = json!({"compliant": "yes"});
    let call = verity_verifiers::sample::openai_tool_call("call_0", "lookup", &json!({}));
    let good = Sample::from_text("{\"compliant\": \"yes\"}")
        .with_output_json()
        .with_output_tools(vec![call]);
    let result = grader.grade(&item, &good);
    assert_eq!((result.score, result.error.is_none()), (1.0, true), "{result:?}");
    let bad = Sample::from_text("yes, compliant").with_output_json().with_output_tools(vec![]);
    let result = grader.grade(&item, &bad);
    assert_eq!(result.score, 0.0);
    assert!(result.error.is_none(), "a non-JSON completion is the sample's fault: {result:?}");
    assert!(result.sample_parse_error.unwrap().contains("not valid JSON"));
}

/// A completion without the JSON key or the tool call a grader reads scores 0 (the sample's
/// fault); the same reference on a sample that never had the field is a missing-field error.
#[test]
fn a_missing_key_or_call_of_the_completion_scores_zero() {
    let spec = |input: &str| json!({"type": "string_check", "input": input, "reference": "x", "operation": "eq"});
    let no_key = Grader::from_json(&spec("{{sample.output_json.email}}").to_string()).unwrap();
    let result = no_key.grade(&json!({}), &Sample::from_text("{\"name\": 1}").with_output_json());
    assert_eq!((result.score, result.error.is_none()), (0.0, true), "{result:?}");
    assert!(result.sample_parse_error.is_some());
    let no_call =
        Grader::from_json(&spec("{{sample.output_tools[0].function.name}}").to_string()).unwrap();
    let result = no_call.grade(&json!({}), &Sample::from_text("x").with_output_tools(vec![]));
    assert!(result.error.is_none() && result.sample_parse_error.is_some(), "{result:?}");
    let never = no_call.grade(&json!({}), &Sample::from_text("x"));
    assert_eq!(never.error.unwrap().kind, ErrorKind::MissingField);
}
