//! The monitor during training: feeds each step's metrics row to
//! [`verity_core::monitor::detect`], reports each warning kind the first time it fires, and
//! says when a kind the job lists in `auto_pause_on` fired.

use serde_json::Value;
use std::collections::BTreeSet;
use verity_core::monitor::{detect, Warning, WarningKind};

/// A job's rows so far and the warning kinds already reported.
pub(super) struct Watch {
    rows: Vec<Value>,
    fired: BTreeSet<WarningKind>,
    pause_on: BTreeSet<WarningKind>,
}

impl Watch {
    /// Starts from the rows an earlier attempt wrote (their warnings count as reported, so a
    /// resumed job is not paused again for what paused it) and the job's `auto_pause_on`
    /// (validated when the job was created; unknown names are ignored).
    pub(super) fn new(rows: Vec<Value>, auto_pause_on: &[String]) -> Watch {
        let fired = detect(&rows).into_iter().map(|w| w.kind).collect();
        let pause_on = auto_pause_on.iter().filter_map(|n| WarningKind::from_name(n)).collect();
        Watch { rows, fired, pause_on }
    }

    /// Adds a row (a step, or the baseline `{"step": 0, "eval": …}`); returns the warnings that
    /// fired for the first time.
    pub(super) fn observe(&mut self, row: Value) -> Vec<Warning> {
        self.rows.push(row);
        detect(&self.rows).into_iter().filter(|w| self.fired.insert(w.kind)).collect()
    }

    /// Whether `warning` is of a kind that pauses the job.
    pub(super) fn pauses(&self, warning: &Warning) -> bool {
        self.pause_on.contains(&warning.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(step: usize) -> Value {
        json!({"step": step, "entropy": 1.0 / (1.0 + 10.0 * (step - 1) as f64), "completion_length_mean": 10.0})
    }

    #[test]
    fn a_kind_fires_once_and_pauses_only_when_listed() {
        let mut watch = Watch::new(Vec::new(), &["entropy_collapse".to_string()]);
        let fired: Vec<Warning> = (1..=8).flat_map(|s| watch.observe(row(s))).collect();
        assert_eq!(fired.len(), 1, "{fired:?}");
        assert_eq!((fired[0].kind, fired[0].step), (WarningKind::EntropyCollapse, 6));
        assert!(watch.pauses(&fired[0]));
        let quiet = Watch::new(Vec::new(), &[]);
        assert!(!quiet.pauses(&fired[0]));
        // Resumed after it fired: not reported (nor paused) again.
        let mut resumed = Watch::new((1..=8).map(row).collect(), &["entropy_collapse".to_string()]);
        assert!(resumed.observe(row(9)).is_empty());
    }
}
