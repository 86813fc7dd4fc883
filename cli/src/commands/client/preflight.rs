//! The text form of a pre-flight report (`verity jobs create --dry-run`).

use serde_json::Value;

/// `report` (the answer of `POST /v1/verity/preflight`) as lines of text: each file's rows or
/// problems (line and field), the grader on the first rows, each probe's score, the verdict.
pub fn report_text(report: &Value) -> String {
    let mut out = String::new();
    for file in report["files"].as_array().into_iter().flatten() {
        let (param, id) = (text(&file["param"]), text(&file["file_id"]));
        match file["errors"].as_array().filter(|e| !e.is_empty()) {
            None => out.push_str(&format!("{param} {id}: {} rows ok\n", number(&file["rows"]))),
            Some(errors) => {
                for error in errors {
                    let field = text(&error["field"]);
                    let at =
                        if field.is_empty() { String::new() } else { format!(" field `{field}`:") };
                    out.push_str(&format!(
                        "{param} {id} line {}:{at} {}\n",
                        number(&error["line"]),
                        text(&error["reason"])
                    ));
                }
            }
        }
    }
    for run in report["grader_runs"].as_array().into_iter().flatten() {
        let outcome = match run["error"].as_str() {
            Some(error) => format!("error: {error}"),
            None => format!("scored {} ({})", number(&run["score"]), text(&run["reason"])),
        };
        out.push_str(&format!(
            "grader on line {} given {:?}: {outcome}\n",
            number(&run["line"]),
            text(&run["sample"])
        ));
    }
    if let Some(results) = report["probes"]["results"].as_array() {
        out.push_str(&format!("exploit probes on line {}:\n", number(&report["probes"]["line"])));
        for probe in results {
            let flag = match (text(&probe["kind"]).as_str(), probe["rewarded"].as_bool()) {
                ("exploit", Some(true)) => "  REWARDED",
                _ => "",
            };
            out.push_str(&format!(
                "  {:<20} scored {}{flag}  ({})\n",
                text(&probe["name"]),
                number(&probe["score"]),
                text(&probe["description"])
            ));
        }
    }
    let verdict = if report["ok"] == Value::Bool(true) {
        "pre-flight: ok, job creation would accept this request"
    } else {
        "pre-flight: job creation would refuse this request"
    };
    out.push_str(verdict);
    out.push('\n');
    out
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

fn number(value: &Value) -> String {
    match value.as_f64() {
        Some(n) if n.fract() == 0.0 => format!("{n:.0}"),
        Some(n) => format!("{n:.3}"),
        None => "?".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_lines_fields_and_rewarded_probes() {
        let report = json!({"ok": false,
            "files": [{"param": "training_file", "file_id": "file-1", "rows": null,
                "errors": [{"line": 3, "field": "reference_answer", "reason": "missing"}]}],
            "grader_runs": [{"line": 1, "sample": "4", "score": 1.0, "reason": "equal", "error": null}],
            "probes": {"line": 1, "results": [
                {"name": "boxed_dump", "kind": "exploit", "score": 1.0, "rewarded": true, "description": "d"},
                {"name": "empty_answer", "kind": "exploit", "score": 0.0, "rewarded": false, "description": "e"}]}});
        let text = report_text(&report);
        assert!(
            text.contains("training_file file-1 line 3: field `reference_answer`: missing"),
            "{text}"
        );
        assert!(text.contains("grader on line 1 given \"4\": scored 1 (equal)"), "{text}");
        assert!(text.contains("boxed_dump           scored 1  REWARDED"), "{text}");
        assert!(text.contains("empty_answer         scored 0  (e)"), "{text}");
        assert!(text.ends_with("would refuse this request\n"));
    }
}
