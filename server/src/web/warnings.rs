//! The monitor's warnings (`verity_core::monitor`) as structured items for the job page and its
//! live stream: the kind, the metric that triggered it, its value against the threshold, the
//! step, and whether it paused the job (`auto_pause_on`).

use serde::Serialize;
use serde_json::Value;
use verity_core::jobs::JobRecord;
use verity_core::monitor::{auto_pauses, detect, Warning, WarningKind};

/// One warning as the page shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarningItem {
    /// `entropy_collapse`, …
    pub kind: &'static str,
    /// The metric that triggered it.
    pub metric: String,
    /// Its value, formatted.
    pub value: String,
    /// The threshold it crossed, formatted.
    pub threshold: String,
    /// The step it was seen at.
    pub step: i64,
    /// What it means and what to do.
    pub message: String,
    /// The step at which it paused the job, if it did.
    pub paused_at: Option<i64>,
    /// `auto-paused the job at step 6`, `pauses the job (auto_pause_on)`, or `does not pause
    /// the job (not in auto_pause_on)`.
    pub pause_text: String,
}

impl WarningItem {
    /// The item of `warning`, for a job pausing on `pause_on` that `paused` paused.
    fn new(warning: &Warning, pause_on: &[WarningKind], paused: &[(WarningKind, i64)]) -> Self {
        let paused_at = paused.iter().find(|(k, _)| *k == warning.kind).map(|(_, step)| *step);
        let pause_text = match paused_at {
            Some(step) => format!("auto-paused the job at step {step}"),
            None if pause_on.contains(&warning.kind) => "pauses the job (auto_pause_on)".into(),
            None => "does not pause the job (not in auto_pause_on)".into(),
        };
        WarningItem {
            kind: warning.kind.as_str(),
            metric: warning.metric.clone(),
            value: format!("{:.3}", warning.value),
            threshold: format!("{:.3}", warning.threshold),
            step: warning.step,
            message: warning.message.clone(),
            paused_at,
            pause_text,
        }
    }
}

/// The kinds a job lists in `auto_pause_on`.
pub fn pause_on(job: &JobRecord) -> Vec<WarningKind> {
    job.spec
        .pointer("/method/reinforcement/hyperparameters/auto_pause_on")
        .and_then(Value::as_array)
        .map(|kinds| kinds.iter().filter_map(|k| WarningKind::from_name(k.as_str()?)).collect())
        .unwrap_or_default()
}

/// The warnings that `rows` (metrics rows in step order) call for, for a job pausing on
/// `pause_on` that `paused` paused.
pub fn items(
    rows: &[Value],
    pause_on: &[WarningKind],
    paused: &[(WarningKind, i64)],
) -> Vec<WarningItem> {
    detect(rows).iter().map(|w| WarningItem::new(w, pause_on, paused)).collect()
}

/// The warnings of `job` whose metrics rows are `rows`, with the pauses they caused.
pub async fn job_items(
    pool: &sqlx::PgPool,
    job: &JobRecord,
    rows: &[Value],
) -> Result<Vec<WarningItem>, sqlx::Error> {
    let paused = auto_pauses(pool, &job.id).await?;
    Ok(items(rows, &pause_on(job), &paused))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn items_name_the_kind_metric_threshold_step_and_pause() {
        let rows: Vec<Value> = (1..=8)
            .map(|i| json!({"step": i, "entropy": 1.0 / (1.0 + 10.0 * (i - 1) as f64), "completion_length_mean": 50.0}))
            .collect();
        let quiet = items(&rows, &[], &[]);
        assert_eq!(quiet.len(), 1, "{quiet:?}");
        let w = &quiet[0];
        assert_eq!((w.kind, w.metric.as_str(), w.step), ("entropy_collapse", "entropy", 8));
        assert_eq!(w.threshold, format!("{:.3}", verity_core::monitor::ENTROPY_COLLAPSE_RATIO));
        assert!(w.message.contains("Entropy collapsed"));
        assert_eq!(w.pause_text, "does not pause the job (not in auto_pause_on)");
        let listed = items(&rows, &[WarningKind::EntropyCollapse], &[]);
        assert_eq!(listed[0].pause_text, "pauses the job (auto_pause_on)");
        let paused =
            items(&rows, &[WarningKind::EntropyCollapse], &[(WarningKind::EntropyCollapse, 6)]);
        assert_eq!(paused[0].paused_at, Some(6));
        assert_eq!(paused[0].pause_text, "auto-paused the job at step 6");
    }
}
