//! The CLI entry points: `graders run`, `graders validate`, `bench graders`.

use std::io::Cursor;

use verity_cli::commands::graders::files::{bench, run_jsonl, validate, BenchOptions};
use verity_verifiers::{ErrorKind, Grader};

#[test]
fn run_jsonl_keeps_order_and_reports_bad_lines() {
    let grader = Grader::from_json(r#"{"type":"math","reference":"{{item.answer}}"}"#).unwrap();
    let mut input = String::new();
    for i in 0..40 {
        input.push_str(&format!("{{\"item\":{{\"answer\":\"{i}\"}},\"sample\":{{\"output_text\":\"\\\\boxed{{{}}}\"}}}}\n", if i % 2 == 0 { i } else { i + 1 }));
    }
    input.push_str("not json\n\n{\"item\":{},\"sample\":{\"output_text\":\"x\"}}\n");
    let mut out = Vec::new();
    let summary = run_jsonl(&grader, Cursor::new(input), &mut out, 3).unwrap();
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 42);
    assert_eq!(summary.rows, 42);
    for (i, line) in lines.iter().take(40).enumerate() {
        assert_eq!(line["score"], if i % 2 == 0 { 1.0 } else { 0.0 }, "line {i}");
        assert!(line["error"].is_null());
    }
    assert_eq!(lines[40]["error"]["kind"], "bad_item");
    assert_eq!(lines[41]["error"]["kind"], "missing_field");
    assert_eq!(summary.errors[&ErrorKind::BadItem], 1);
    assert_eq!(summary.errors[&ErrorKind::MissingField], 1);
    assert!((summary.mean_score - 0.5).abs() < 1e-9);
}

#[test]
fn validate_reports_paths_and_dataset_lines() {
    let report = validate(
        r#"{"type":"multi","calculate_output":"a","graders":{"a":{"type":"math","reference":"{{item.answer}}","bogus":1}}}"#,
        None,
    );
    assert!(!report.valid);
    assert_eq!(report.errors[0].path, "graders.a.bogus");
    assert!(report.errors[0].message.contains("bogus"));

    let dir = std::env::temp_dir().join(format!("verity-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("d.jsonl");
    std::fs::write(
        &data,
        "{\"answer\": \"1\", \"meta\": {\"id\": 1}}\n{\"question\": \"x\"}\n[1]\n",
    )
    .unwrap();
    let report = validate(
        r#"{"type":"string_check","input":"{{sample.output_text}}","reference":"{{item.answer}}","operation":"eq"}"#,
        Some(&data),
    );
    assert!(!report.valid);
    assert_eq!(report.rows_checked, 3);
    assert_eq!(report.errors.len(), 2);
    assert_eq!(report.errors[0].path, "item.answer");
    assert_eq!(report.errors[0].line, Some(2));
    assert_eq!(report.errors[1].line, Some(3));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn validate_runs_python_graders_once() {
    let python = |source: &str| {
        serde_json::json!({"type": "multi", "calculate_output": "p",
            "graders": {"p": {"type": "python", "source": source}}})
        .to_string()
    };
    let broken = validate(&python("def grade(sample, item) -> float:\n    return 1 +\n"), None);
    assert!(!broken.valid);
    assert_eq!(broken.errors[0].path, "graders.p.source");
    assert!(broken.errors[0].message.contains("SyntaxError"), "{:?}", broken.errors);
    let missing =
        validate(&python("import not_a_module_anywhere\ndef grade(s, i):\n    return 1.0\n"), None);
    assert!(!missing.valid && missing.errors[0].message.contains("not_a_module_anywhere"));
    // grade() failing on the trial's empty row is no verdict on the source
    let fine = validate(&python("def grade(sample, item):\n    return float(item['x'])\n"), None);
    assert!(fine.valid, "{:?}", fine.errors);
}

#[test]
fn bench_reports_rates() {
    let report = bench(&BenchOptions { jobs: 2, math_rounds: 1, code_gradings: 2 });
    assert!(report["math"]["single_thread_gradings_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(report["math"]["table_agreement"], 1.0);
    assert_eq!(report["code_trivial"]["passed"], 2, "{report}");
    assert_eq!(report["code_humaneval"]["passed"], 2, "{report}");
}
