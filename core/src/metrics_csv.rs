//! A job's per-step metrics as CSV: every metric as stored (`GET …/metrics?format=csv`), and the
//! OpenAI-shaped results file a finished job lists in `result_files`.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The results file's leading columns after `step`: OpenAI's names, and the stored metric each
/// is read from (a `/`-separated path into the step's row).
/// The validation columns of reinforcement jobs come first, then those of supervised jobs
/// (`valid_loss`, `valid_mean_token_accuracy`, as OpenAI's supervised results file) and DPO jobs.
const RESULT_COLUMNS: [(&str, &str); 10] = [
    ("train_loss", "loss"),
    ("train_reward_mean", "reward_mean"),
    ("train_reward_std", "reward_std"),
    ("train_accuracy", "accuracy"),
    ("valid_reward_mean", "eval/mean_reward"),
    ("valid_pass_at_1", "eval/pass_at_k/pass@1"),
    ("valid_loss", "eval/loss"),
    ("valid_mean_token_accuracy", "eval/token_accuracy"),
    ("valid_preference_accuracy", "eval/preference_accuracy"),
    ("trained_tokens", "trained_tokens"),
];

/// CSV with `step` then every metric name (sorted) as columns; absent values are empty.
pub fn metrics_csv(rows: &[(i32, Value)]) -> String {
    let cells: Vec<(i32, BTreeMap<String, String>)> = rows
        .iter()
        .map(|(step, data)| {
            let map = match data {
                Value::Object(map) => map
                    .iter()
                    .filter(|(k, _)| k.as_str() != "step")
                    .filter_map(|(k, v)| cell(v).map(|c| (k.clone(), c)))
                    .collect(),
                _ => BTreeMap::new(),
            };
            (*step, map)
        })
        .collect();
    let mut columns = BTreeSet::new();
    for (_, data) in rows {
        if let Value::Object(map) = data {
            columns.extend(map.keys().filter(|k| k.as_str() != "step").cloned());
        }
    }
    table(&[], &columns, &cells)
}

/// The results file of a finished job, like OpenAI's: `step`, then `train_loss`,
/// `train_reward_mean`, `train_reward_std`, `train_accuracy`, `valid_reward_mean`,
/// `valid_pass_at_1`, `valid_loss`, `valid_mean_token_accuracy`, `valid_preference_accuracy`
/// (empty on steps without a validation run, and where the method has no such metric),
/// `trained_tokens`, then
/// `train_reward_{grader}_mean` per named grader and every other scalar metric under its own
/// name (sorted).
pub fn results_csv(rows: &[(i32, Value)]) -> String {
    let fixed: Vec<&str> = RESULT_COLUMNS.iter().map(|(name, _)| *name).collect();
    let used: BTreeSet<&str> = RESULT_COLUMNS.iter().map(|(_, path)| *path).collect();
    let mut columns = BTreeSet::new();
    let cells: Vec<(i32, BTreeMap<String, String>)> = rows
        .iter()
        .map(|(step, data)| {
            let mut row = BTreeMap::new();
            for (name, path) in RESULT_COLUMNS {
                let value = path.split('/').try_fold(data, |v, key| v.get(key));
                if let Some(text) = value.and_then(cell) {
                    row.insert(name.to_string(), text);
                }
            }
            if let Some(Value::Object(graders)) = data.get("reward_per_grader") {
                for (grader, summary) in graders {
                    if let Some(text) = summary.get("mean").and_then(cell) {
                        let name = format!("train_reward_{grader}_mean");
                        columns.insert(name.clone());
                        row.insert(name, text);
                    }
                }
            }
            if let Value::Object(map) = data {
                for (key, value) in map {
                    let scalar = matches!(value, Value::Number(_) | Value::Bool(_));
                    if scalar && key != "step" && !used.contains(key.as_str()) {
                        columns.insert(key.clone());
                        row.insert(key.clone(), cell(value).unwrap_or_default());
                    }
                }
            }
            (*step, row)
        })
        .collect();
    table(&fixed, &columns, &cells)
}

/// The CSV text of one value; `None` for null.
fn cell(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(csv_field(s)),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        other => Some(csv_field(&other.to_string())),
    }
}

/// A header of `step`, `fixed` then `rest`, and one line per row (missing cells empty).
fn table(
    fixed: &[&str],
    rest: &BTreeSet<String>,
    rows: &[(i32, BTreeMap<String, String>)],
) -> String {
    let columns: Vec<&str> = fixed.iter().copied().chain(rest.iter().map(String::as_str)).collect();
    let mut out = String::from("step");
    for column in &columns {
        out.push(',');
        out.push_str(&csv_field(column));
    }
    out.push('\n');
    for (step, row) in rows {
        out.push_str(&step.to_string());
        for column in &columns {
            out.push(',');
            if let Some(text) = row.get(*column) {
                out.push_str(text);
            }
        }
        out.push('\n');
    }
    out
}

/// A CSV field, quoted when it holds a comma, quote or newline.
pub fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn csv_has_union_of_columns_and_escapes() {
        let rows = vec![(1, json!({"reward": 0.5, "note": "a,b"})), (2, json!({"kl": 0.1}))];
        assert_eq!(metrics_csv(&rows), "step,kl,note,reward\n1,,\"a,b\",0.5\n2,0.1,,\n");
    }

    #[test]
    fn results_file_leads_with_openai_columns() {
        let rows = vec![
            (
                1,
                json!({"loss": 0.5, "reward_mean": 0.25, "reward_std": 0.1, "accuracy": 0.0,
                       "trained_tokens": 40, "kl": 0.01,
                       "reward_per_grader": {"exact": {"mean": 0.25, "std": 0.1}}}),
            ),
            (
                2,
                json!({"loss": 0.4, "reward_mean": 0.5, "reward_std": 0.2, "accuracy": 0.5,
                       "trained_tokens": 42, "kl": 0.02,
                       "eval": {"mean_reward": 0.75, "pass_at_k": {"pass@1": 0.5}}}),
            ),
        ];
        let csv = results_csv(&rows);
        let mut lines = csv.lines();
        assert_eq!(
            lines.next().unwrap(),
            "step,train_loss,train_reward_mean,train_reward_std,train_accuracy,valid_reward_mean,\
             valid_pass_at_1,valid_loss,valid_mean_token_accuracy,valid_preference_accuracy,\
             trained_tokens,kl,train_reward_exact_mean"
        );
        assert_eq!(lines.next().unwrap(), "1,0.5,0.25,0.1,0.0,,,,,,40,0.01,0.25");
        assert_eq!(lines.next().unwrap(), "2,0.4,0.5,0.2,0.5,0.75,0.5,,,,42,0.02,");
    }

    #[test]
    fn a_supervised_jobs_results_have_its_validation_loss_and_token_accuracy() {
        let rows = vec![
            (1, json!({"loss": 2.5, "trained_tokens": 30})),
            (
                2,
                json!({"loss": 2.0, "trained_tokens": 30,
                       "eval": {"step": 2, "examples": 3, "loss": 2.25, "token_accuracy": 0.4}}),
            ),
        ];
        let csv = results_csv(&rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert!(lines[0].starts_with("step,train_loss,"), "{csv}");
        assert_eq!(lines[1], "1,2.5,,,,,,,,,30");
        assert_eq!(lines[2], "2,2.0,,,,,,2.25,0.4,,30");
    }
}
