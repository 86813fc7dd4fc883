//! Property tests (bounded fuzzing) of the grader parser: any text, and any JSON shaped like a
//! grader, is a grader or a clear refusal — never a panic.

use proptest::prelude::*;
use serde_json::{json, Value};
use verity_verifiers::Grader;

/// JSON values biased toward graders: their type names and field names, nested.
fn grader_like() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![
            "string_check",
            "text_similarity",
            "math",
            "python",
            "score_model",
            "label_model",
            "multi",
            "{{item.reference_answer}}",
            "{{sample.output_text}}",
            "{{",
            "}}",
            "eq",
            "fuzzy_match",
            "",
            "..",
            "x",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        let key = prop::sample::select(vec![
            "type",
            "name",
            "input",
            "reference",
            "operation",
            "source",
            "graders",
            "calculate_output",
            "model",
            "evaluation_metric",
            "pass_threshold",
            "labels",
            "passing_labels",
            "range",
            "image_tag",
            "x",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(key, inner, 0..6).prop_map(|m| Value::Object(
                m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
            )),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_grader_json_parses_or_is_refused(spec in grader_like()) {
        let _ = Grader::from_json(&spec.to_string());
    }

    #[test]
    fn any_text_parses_or_is_refused(text in any::<String>()) {
        let _ = Grader::from_json(&text);
    }
}
