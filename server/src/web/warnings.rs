//! Known failure patterns read off a job's metrics rows, shown as a banner on the job page.

use serde_json::Value;

/// Zero-advantage fraction (mean over the last steps) above which learning has stalled.
pub const ZERO_ADVANTAGE_LIMIT: f64 = 0.8;
/// Entropy below this fraction of its start means the policy is collapsing.
pub const ENTROPY_COLLAPSE_RATIO: f64 = 0.2;
/// Steps looked at for "recent" averages.
const RECENT: usize = 3;

fn series(rows: &[Value], key: &str) -> Vec<f64> {
    rows.iter().filter_map(|row| row.get(key).and_then(Value::as_f64)).collect()
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

fn recent(values: &[f64]) -> &[f64] {
    &values[values.len().saturating_sub(RECENT)..]
}

fn early(values: &[f64]) -> &[f64] {
    &values[..values.len().min(RECENT)]
}

/// The warnings that `rows` (metrics rows in step order) call for, as sentences.
pub fn warnings(rows: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let zero = series(rows, "zero_advantage_group_fraction");
    if let Some(m) = mean(recent(&zero)).filter(|m| zero.len() >= 2 && *m >= ZERO_ADVANTAGE_LIMIT) {
        out.push(format!(
            "Zero-advantage fraction is {:.0}%: most groups get identical rewards, so there is little to learn from. \
             Make the task easier or harder, raise group_size, or use a graded (non-binary) grader.",
            m * 100.0
        ));
    }
    let entropy = series(rows, "entropy");
    if entropy.len() >= 2 * RECENT {
        if let (Some(start), Some(end)) = (mean(early(&entropy)), mean(recent(&entropy))) {
            if start > 0.0 && end < ENTROPY_COLLAPSE_RATIO * start {
                out.push(format!(
                    "Entropy collapsed from {start:.3} to {end:.3}: the policy stopped exploring. \
                     Lower the learning rate, raise temperature, or try DAPO's clip-higher."
                ));
            }
        }
    }
    let errors = series(rows, "grader_errors");
    if errors.len() >= 2 {
        let (start, end) =
            (mean(early(&errors)).unwrap_or(0.0), mean(recent(&errors)).unwrap_or(0.0));
        if end > 0.0 && end > start {
            out.push(format!(
                "Grader errors are rising ({end:.1} per step recently): completions are being scored 0 for \
                 infrastructure reasons. Check the grader with Test grader and the events log."
            ));
        }
    }
    let length = series(rows, "completion_length_mean");
    let reward = series(rows, "reward_mean");
    if length.len() >= 2 * RECENT && reward.len() >= 2 * RECENT {
        let (l0, l1) = (mean(early(&length)).unwrap_or(0.0), mean(recent(&length)).unwrap_or(0.0));
        let (r0, r1) = (mean(early(&reward)).unwrap_or(0.0), mean(recent(&reward)).unwrap_or(0.0));
        if l0 > 0.0 && l1 >= 1.5 * l0 && (r1 - r0).abs() < 0.05 {
            out.push(format!(
                "Completions grew from {l0:.0} to {l1:.0} tokens while reward stayed flat: the model may be padding \
                 or rambling. Consider an overlong penalty or a length constraint grader."
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn healthy_runs_have_no_warnings_and_known_failures_do() {
        let healthy: Vec<Value> = (0..8)
            .map(|i| {
                json!({"zero_advantage_group_fraction": 0.2, "entropy": 1.0, "grader_errors": 0,
                            "completion_length_mean": 50.0, "reward_mean": 0.1 * i as f64})
            })
            .collect();
        assert!(warnings(&healthy).is_empty());
        let stalled: Vec<Value> = (0..8)
            .map(|i| json!({"zero_advantage_group_fraction": 1.0, "entropy": 1.0 / (1.0 + 10.0 * i as f64),
                            "grader_errors": i, "completion_length_mean": 50.0 * (1.0 + i as f64), "reward_mean": 0.5}))
            .collect();
        let found = warnings(&stalled).join("\n");
        for needle in ["Zero-advantage", "Entropy collapsed", "Grader errors", "Completions grew"] {
            assert!(found.contains(needle), "{needle} missing from {found}");
        }
    }
}
