//! The monitor's warnings (`verity_core::monitor`) as banner lines for the job page, each naming
//! the metric that triggered it.

use serde_json::Value;
use verity_core::monitor::{detect, Warning};

/// One banner line: the message, then `kind: metric = value (threshold t, step n)`.
pub fn banner_line(w: &Warning) -> String {
    format!(
        "{} [{}: {} = {:.3}, threshold {:.3}, step {}]",
        w.message,
        w.kind.as_str(),
        w.metric,
        w.value,
        w.threshold,
        w.step
    )
}

/// The warnings that `rows` (metrics rows in step order) call for, as banner lines.
pub fn warnings(rows: &[Value]) -> Vec<String> {
    detect(rows).iter().map(banner_line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn banner_lines_name_the_kind_and_metric() {
        let rows: Vec<Value> = (1..=8)
            .map(|i| json!({"step": i, "entropy": 1.0 / (1.0 + 10.0 * (i - 1) as f64), "completion_length_mean": 50.0}))
            .collect();
        let lines = warnings(&rows);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("Entropy collapsed")
                && lines[0].contains("[entropy_collapse: entropy = ")
        );
    }
}
