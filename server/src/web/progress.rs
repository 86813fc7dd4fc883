//! A job's progress as the dashboard shows it, computed in one place for the jobs list, the job
//! page and its live stream: the step (never behind the metrics rows the charts draw), the
//! phase under way with its count, the time left from the worker's measured `estimated_finish`
//! (or when its budget will pause it), why it paused itself, its budget, and which controls
//! are valid in the job's state.

use serde::Serialize;
use serde_json::Value;
use verity_core::jobs::JobRecord;
use verity_core::JobState;

/// What the page shows of a job's progress.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct JobProgress {
    /// The job's state.
    pub status: String,
    /// Steps done: the worker's report or the last metrics row, whichever is further.
    pub step: u64,
    /// Steps in all (0 until the worker reports).
    pub total: u64,
    /// Percent done.
    pub percent: u64,
    /// What the job is doing, e.g. `evaluating 37/200`, `pausing…`, `queued`.
    pub phase: String,
    /// Time left, e.g. `~3 min left` (empty when unknown or not running).
    pub eta: String,
    /// When the job should finish (Unix seconds), while running.
    pub estimated_finish: Option<i64>,
    /// A cancel or pause the worker has not acted on yet.
    pub pending_control: Option<String>,
    /// Which controls are valid now.
    pub controls: Controls,
    /// Why the job failed.
    pub error: Option<String>,
    /// Why a paused job paused itself (its budget, `auto_pause_on`, an unavailable judge).
    pub paused_reason: Option<String>,
    /// The budget's caps and use, e.g. `612 s of 600 s · 4000 of 10000 generated tokens`
    /// (empty without caps).
    pub budget: String,
    /// The fine-tuned model's name (`ft:…`) once the job has produced one: what a user passes
    /// as `model` to chat completions or a new job.
    pub fine_tuned_model: Option<String>,
}

/// Which of a job's controls are valid in its state.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Controls {
    /// Pause: queued, or running with no request pending.
    pub pause: bool,
    /// Resume: paused, or running with a pause not yet acted on (withdraws it).
    pub resume: bool,
    /// Cancel: not final and no cancel pending.
    pub cancel: bool,
}

/// Seconds as `~42 s`, `~3 min`, `~1.5 h`.
pub fn duration_text(seconds: i64) -> String {
    match seconds.max(0) {
        s if s < 90 => format!("~{s} s"),
        s if s < 5400 => format!("~{} min", (s + 30) / 60),
        s => format!("~{:.1} h", s as f64 / 3600.0),
    }
}

impl JobProgress {
    /// The progress of `job` whose last metrics row is `last_metric_step`, at `now` (Unix
    /// seconds).
    pub fn of(job: &JobRecord, last_metric_step: Option<i64>, now: i64) -> JobProgress {
        let report = job.progress.as_ref();
        let number = |key: &str| report.and_then(|p| p.get(key)).and_then(Value::as_u64);
        let reported = number("step").unwrap_or(0);
        let total = number("total_steps").unwrap_or(0);
        let mut step =
            reported.max(last_metric_step.and_then(|s| u64::try_from(s).ok()).unwrap_or(0));
        if job.state == JobState::Succeeded {
            step = step.max(total);
        }
        let percent = if job.state == JobState::Succeeded {
            100
        } else {
            (step * 100).checked_div(total).map_or(0, |p| p.min(100))
        };
        let running = job.state == JobState::Running;
        let pending = (job.control != "none").then(|| job.control.clone());
        let estimated_finish = running
            .then(|| report.and_then(|p| p.get("estimated_finish")).and_then(Value::as_i64))
            .flatten();
        let phase = match (job.state, pending.as_deref()) {
            (JobState::Running, Some("pause")) => "pausing…".to_string(),
            (JobState::Running, Some("cancel")) => "cancelling…".to_string(),
            (JobState::Running, _) => running_phase(report, step, total),
            (state, _) => state.to_string(),
        };
        let budget_pause = running
            .then(|| report.and_then(|p| p.get("budget_pause")).filter(|b| !b.is_null()))
            .flatten();
        let eta = match (estimated_finish, budget_pause) {
            (Some(at), _) if at > now => format!("{} left", duration_text(at - now)),
            (Some(_), _) => "finishing".to_string(),
            (None, Some(pause)) => {
                let step = pause.get("step").and_then(Value::as_u64).unwrap_or(0);
                let at = pause.get("at").and_then(Value::as_i64).unwrap_or(now);
                format!("budget pauses it at step {step} ({})", duration_text(at - now))
            }
            (None, None) => String::new(),
        };
        let state = job.state;
        let controls = Controls {
            pause: state == JobState::Queued || (running && pending.is_none()),
            resume: state == JobState::Paused || (running && pending.as_deref() == Some("pause")),
            cancel: !state.is_terminal() && pending.as_deref() != Some("cancel"),
        };
        let error = job.failure("job").map(|f| f.message);
        let paused_reason = (state == JobState::Paused)
            .then(|| report.and_then(|p| p.get("paused_reason")).and_then(Value::as_str))
            .flatten()
            .map(str::to_string);
        JobProgress {
            paused_reason,
            budget: budget_text(job),
            status: job.state.to_string(),
            step,
            total,
            percent,
            phase,
            eta,
            estimated_finish,
            pending_control: pending,
            controls,
            error,
            fine_tuned_model: job.fine_tuned_model.clone(),
        }
    }

    /// The step label, e.g. `step 3 / 20`; `step 3` while the total is not known (a resumed
    /// job loading); empty before both are.
    pub fn step_text(&self) -> String {
        match (self.step, self.total) {
            (step, total) if total > 0 => format!("step {step} / {total}"),
            (step, _) if step > 0 => format!("step {step}"),
            _ => String::new(),
        }
    }
}

/// A job's budget as `612 s of 600 s · 4000 of 10000 generated tokens` (empty without caps).
fn budget_text(job: &JobRecord) -> String {
    let (caps, usage) = (job.caps(), job.usage());
    let mut parts = Vec::new();
    if let Some(cap) = caps.max_wall_seconds {
        parts.push(format!("{:.0} s of {cap} s", usage.wall_seconds));
    }
    if let Some(cap) = caps.max_tokens {
        parts.push(format!("{} of {cap} generated tokens", usage.tokens));
    }
    parts.join(" · ")
}

/// A running job's phase from the worker's report: `evaluating 37/200`, `sampling`, …
fn running_phase(report: Option<&Value>, step: u64, total: u64) -> String {
    let field = |key: &str| report.and_then(|p| p.get(key));
    let name = field("phase").and_then(Value::as_str);
    let count = field("phase_done")
        .and_then(Value::as_u64)
        .zip(field("phase_total").and_then(Value::as_u64));
    match (name, count) {
        (Some(name), Some((done, total))) => format!("{name} {done}/{total}"),
        (Some(name), None) => name.to_string(),
        (None, _) if report.is_none() => "starting".to_string(),
        (None, _) if total > 0 && step >= total => "finishing".to_string(),
        (None, _) => "running".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(state: &str, control: &str, progress: Option<Value>) -> JobRecord {
        JobRecord {
            id: "ftjob-x".into(),
            org_id: uuid::Uuid::nil(),
            org_name: "acme".into(),
            model: "m".into(),
            training_file: None,
            validation_file: None,
            suffix: None,
            seed: 0,
            spec: json!({}),
            metadata: None,
            state: state.parse().unwrap(),
            control: control.into(),
            error: None,
            progress,
            result: None,
            fine_tuned_model: None,
            created_at: chrono::Utc::now(),
            finished_at: None,
            max_wall_seconds: None,
            max_tokens: None,
            used_wall_seconds: 0.0,
            used_tokens: 0,
        }
    }

    #[test]
    fn the_step_is_never_behind_the_metrics_rows() {
        let lagging = job("running", "none", Some(json!({"step": 1, "total_steps": 4})));
        let p = JobProgress::of(&lagging, Some(3), 0);
        assert_eq!((p.step, p.total, p.percent), (3, 4, 75));
        assert_eq!(p.step_text(), "step 3 / 4");
    }

    /// A resumed job loads its model and checkpoint before its trainer reports: the page says
    /// `loading` (not the phase it paused in) and the step the metrics reached.
    #[test]
    fn a_resumed_job_loading_says_so() {
        let p =
            JobProgress::of(&job("running", "none", Some(json!({"phase": "loading"}))), Some(4), 0);
        assert_eq!((p.phase.as_str(), p.step_text()), ("loading", "step 4".to_string()));
        assert_eq!(JobProgress::of(&job("queued", "none", None), None, 0).step_text(), "");
    }

    #[test]
    fn the_phase_names_its_count_and_pending_controls() {
        let evaluating = json!({"step": 4, "total_steps": 4, "phase": "evaluating", "phase_done": 37,
                                "phase_total": 200, "estimated_finish": 980});
        let p = JobProgress::of(&job("running", "none", Some(evaluating)), Some(4), 900);
        assert_eq!(p.phase, "evaluating 37/200");
        assert_eq!(p.eta, "~80 s left");
        assert_eq!(p.estimated_finish, Some(980));
        assert_eq!(p.controls, Controls { pause: true, resume: false, cancel: true });
        let pausing = JobProgress::of(&job("running", "pause", None), None, 0);
        assert_eq!(pausing.phase, "pausing…");
        assert_eq!(pausing.controls, Controls { pause: false, resume: true, cancel: true });
        let cancelling = JobProgress::of(&job("running", "cancel", None), None, 0);
        assert_eq!(cancelling.phase, "cancelling…");
        assert!(!cancelling.controls.cancel && !cancelling.controls.pause);
        let paused = JobProgress::of(&job("paused", "none", None), None, 0);
        assert_eq!(paused.controls, Controls { pause: false, resume: true, cancel: true });
        let budget =
            json!({"step": 2, "estimated_finish": null, "budget_pause": {"step": 7, "at": 960}});
        let p = JobProgress::of(&job("running", "none", Some(budget)), Some(2), 900);
        assert_eq!(p.eta, "budget pauses it at step 7 (~60 s)");
        let reason = "budget of 600 s reached at step 7 (612 s used); raise max_wall_seconds";
        let mut paused = job("paused", "none", Some(json!({"step": 7, "paused_reason": reason})));
        (paused.max_wall_seconds, paused.used_wall_seconds) = (Some(600), 612.4);
        let p = JobProgress::of(&paused, Some(7), 0);
        assert_eq!(p.paused_reason.as_deref(), Some(reason));
        assert_eq!(p.budget, "612 s of 600 s");
        assert!(JobProgress::of(&job("running", "none", None), None, 0).paused_reason.is_none());
        let failed = JobProgress::of(&job("failed", "none", None), None, 0);
        assert_eq!(failed.controls, Controls { pause: false, resume: false, cancel: false });
    }
}
