//! A job's budget (Verity extension): optional caps on the wall time its attempts spend
//! (`max_wall_seconds`) and on the completion tokens its policy generates (`max_tokens`), what
//! it has used, whether a cap is reached, and how many steps remain before one is at the
//! measured pace. The worker adds its usage at the end of every step and pauses the job (as a
//! user's pause does) at the first step boundary where a cap is reached.
//!
//! The caps live on the job row, not in the hyperparameters: they change when a job stops, not
//! what it computes, so they may be raised (or removed) at any time before it ends, and a job
//! paused by its budget resumes once the cap is above what it used.

use crate::jobs::JobRecord;
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

/// Largest `max_wall_seconds` accepted (30 days).
pub const WALL_SECONDS_LIMIT: i64 = 30 * 24 * 3600;
/// Largest `max_tokens` accepted (10¹²).
pub const TOKENS_LIMIT: i64 = 1_000_000_000_000;

/// A job's caps (`None`: no cap).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Caps {
    /// Wall seconds the job's attempts may spend.
    pub max_wall_seconds: Option<i64>,
    /// Completion tokens its policy may generate in training steps.
    pub max_tokens: Option<i64>,
}

/// What a job has used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    /// Wall seconds of its attempts: from the moment a worker starts one (model download and
    /// load included) to the end of its last step; time queued or paused does not count.
    pub wall_seconds: f64,
    /// Completion tokens the policy generated in training steps (every completion sampled,
    /// those of groups dynamic sampling discarded included; not prompts, not evaluations).
    pub tokens: i64,
}

/// One of the caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// `max_wall_seconds`.
    WallSeconds,
    /// `max_tokens`.
    Tokens,
}

impl Cap {
    /// The field that sets it.
    pub fn field(self) -> &'static str {
        match self {
            Cap::WallSeconds => "max_wall_seconds",
            Cap::Tokens => "max_tokens",
        }
    }

    /// `amount` of this cap's unit: `600 s`, `5000 generated tokens`.
    fn amount(self, amount: f64) -> String {
        match self {
            Cap::WallSeconds => format!("{amount:.0} s"),
            Cap::Tokens => format!("{amount:.0} generated tokens"),
        }
    }
}

/// A cap the usage has reached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reached {
    /// Which cap.
    pub cap: Cap,
    /// Its value.
    pub limit: i64,
    /// The usage that reached it.
    pub used: f64,
}

impl Reached {
    /// `budget of 600 s reached at step 7 (612 s used)`.
    pub fn describe(&self, step: u64) -> String {
        format!(
            "budget of {} reached at step {step} ({} used)",
            self.cap.amount(self.limit as f64),
            self.cap.amount(self.used)
        )
    }

    /// `budget of 600 s is reached (612 s used)`.
    pub fn summary(&self) -> String {
        format!(
            "budget of {} is reached ({} used)",
            self.cap.amount(self.limit as f64),
            self.cap.amount(self.used)
        )
    }
}

/// A budget field that is not valid, named by its JSON path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct BudgetError {
    /// The field at fault (`budget.max_wall_seconds`, …).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl Caps {
    /// Each cap with the usage it limits.
    fn pairs(&self, usage: Usage) -> [(Cap, Option<i64>, f64); 2] {
        [
            (Cap::WallSeconds, self.max_wall_seconds, usage.wall_seconds),
            (Cap::Tokens, self.max_tokens, usage.tokens as f64),
        ]
    }

    /// The first cap `usage` has reached (wall time, then tokens).
    pub fn reached(&self, usage: Usage) -> Option<Reached> {
        self.pairs(usage).into_iter().find_map(|(cap, limit, used)| {
            let limit = limit?;
            (used >= limit as f64).then_some(Reached { cap, limit, used })
        })
    }

    /// Steps the job can still run before a cap pauses it, at `seconds_per_step` and
    /// `tokens_per_step` (the cap is checked after each step, so the step that crosses it
    /// runs): `None` when no cap applies or none can be predicted from the pace.
    pub fn steps_left(
        &self,
        usage: Usage,
        seconds_per_step: f64,
        tokens_per_step: f64,
    ) -> Option<u64> {
        let paces = [seconds_per_step, tokens_per_step];
        self.pairs(usage)
            .into_iter()
            .zip(paces)
            .filter_map(|((_, limit, used), pace)| {
                let left = limit? as f64 - used;
                if left <= 0.0 {
                    return Some(0);
                }
                (pace > 0.0).then(|| (left / pace).ceil() as u64)
            })
            .min()
    }

    /// Whether any cap is set.
    pub fn any(&self) -> bool {
        self.max_wall_seconds.is_some() || self.max_tokens.is_some()
    }

    /// What these caps leave after `used` (a cap already reached leaves 0).
    pub fn left_after(&self, used: Usage) -> Caps {
        Caps {
            max_wall_seconds: self
                .max_wall_seconds
                .map(|cap| (cap as f64 - used.wall_seconds).ceil().max(0.0) as i64),
            max_tokens: self.max_tokens.map(|cap| (cap - used.tokens).max(0)),
        }
    }

    /// The tighter of each cap of `self` and `other`.
    pub fn tightest(&self, other: Caps) -> Caps {
        let min = |a: Option<i64>, b: Option<i64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Caps {
            max_wall_seconds: min(self.max_wall_seconds, other.max_wall_seconds),
            max_tokens: min(self.max_tokens, other.max_tokens),
        }
    }

    /// The caps `body` sets over `current`: a field absent keeps its cap, `null` removes it, a
    /// whole number from 1 to its limit sets it. Fields are named under `path` (`budget`, or
    /// empty for a body of its own).
    pub fn apply(&self, body: &Value, path: &str) -> Result<Caps, BudgetError> {
        let named =
            |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
        let Some(fields) = body.as_object() else {
            let field = if path.is_empty() { "body".to_string() } else { path.to_string() };
            return Err(BudgetError {
                field,
                message: "expected an object like {\"max_wall_seconds\": 600}".into(),
            });
        };
        let mut caps = *self;
        for (key, value) in fields {
            let (slot, limit) = match key.as_str() {
                "max_wall_seconds" => (&mut caps.max_wall_seconds, WALL_SECONDS_LIMIT),
                "max_tokens" => (&mut caps.max_tokens, TOKENS_LIMIT),
                _ => {
                    return Err(BudgetError {
                        field: named(key),
                        message: "unknown field; a budget has max_wall_seconds and max_tokens"
                            .into(),
                    })
                }
            };
            *slot = match value {
                Value::Null => None,
                v => match v.as_i64().filter(|n| (1..=limit).contains(n)) {
                    Some(n) => Some(n),
                    None => {
                        return Err(BudgetError {
                            field: named(key),
                            message: format!(
                                "expected a whole number from 1 to {limit}, or null for no cap; got {v}"
                            ),
                        })
                    }
                },
            };
        }
        Ok(caps)
    }
}

impl JobRecord {
    /// The job's caps.
    pub fn caps(&self) -> Caps {
        Caps { max_wall_seconds: self.max_wall_seconds, max_tokens: self.max_tokens }
    }

    /// What the job has used.
    pub fn usage(&self) -> Usage {
        Usage { wall_seconds: self.used_wall_seconds, tokens: self.used_tokens }
    }
}

/// The caps and usage of job `job_id`, if it exists.
pub async fn job_budget(pool: &PgPool, job_id: &str) -> Result<Option<(Caps, Usage)>, sqlx::Error> {
    let row = sqlx::query!(
        r#"SELECT max_wall_seconds, max_tokens, used_wall_seconds, used_tokens
           FROM jobs WHERE id = $1"#,
        job_id
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| {
        (
            Caps { max_wall_seconds: r.max_wall_seconds, max_tokens: r.max_tokens },
            Usage { wall_seconds: r.used_wall_seconds, tokens: r.used_tokens },
        )
    }))
}

/// Sets the caps of the org's job `job_id` unless it has ended; true when it was changed.
pub async fn set_caps(
    pool: &PgPool,
    org_id: Uuid,
    job_id: &str,
    caps: Caps,
) -> Result<bool, sqlx::Error> {
    let changed = sqlx::query!(
        r#"UPDATE jobs SET max_wall_seconds = $3, max_tokens = $4
           WHERE org_id = $1 AND id = $2 AND state IN ('queued', 'running', 'paused')"#,
        org_id,
        job_id,
        caps.max_wall_seconds,
        caps.max_tokens
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(changed > 0)
}

/// Stores what attempt `attempt` of the running job has brought the usage to (a total, so a
/// retried write changes nothing) and returns the caps as they are now (a user may have
/// changed them); `None` when the attempt no longer holds the job.
pub async fn record_usage(
    pool: &PgPool,
    job_id: &str,
    attempt: i32,
    usage: Usage,
) -> Result<Option<Caps>, sqlx::Error> {
    let row = sqlx::query!(
        r#"UPDATE jobs SET used_wall_seconds = $3, used_tokens = $4
           WHERE id = $1 AND attempt = $2 AND state = 'running'
           RETURNING max_wall_seconds, max_tokens"#,
        job_id,
        attempt,
        usage.wall_seconds,
        usage.tokens
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| Caps { max_wall_seconds: r.max_wall_seconds, max_tokens: r.max_tokens }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_caps_leave_and_the_tightest_of_two() {
        let caps = Caps { max_wall_seconds: Some(100), max_tokens: Some(50) };
        let left = caps.left_after(Usage { wall_seconds: 30.5, tokens: 60 });
        assert_eq!(left, Caps { max_wall_seconds: Some(70), max_tokens: Some(0) });
        let own = Caps { max_wall_seconds: Some(40), max_tokens: None };
        assert_eq!(own.tightest(left), Caps { max_wall_seconds: Some(40), max_tokens: Some(0) });
        assert_eq!(Caps::default().tightest(Caps::default()), Caps::default());
        assert!(caps.any() && !Caps::default().any());
    }
    use serde_json::json;

    fn usage(wall_seconds: f64, tokens: i64) -> Usage {
        Usage { wall_seconds, tokens }
    }

    #[test]
    fn a_cap_is_reached_at_or_above_its_value_and_describes_itself() {
        let caps = Caps { max_wall_seconds: Some(600), max_tokens: Some(5000) };
        assert_eq!(caps.reached(usage(599.9, 4999)), None);
        let wall = caps.reached(usage(612.4, 100)).unwrap();
        assert_eq!((wall.cap, wall.limit), (Cap::WallSeconds, 600));
        assert_eq!(wall.describe(7), "budget of 600 s reached at step 7 (612 s used)");
        assert_eq!(wall.summary(), "budget of 600 s is reached (612 s used)");
        let tokens = caps.reached(usage(10.0, 5000)).unwrap();
        assert_eq!(tokens.cap.field(), "max_tokens");
        assert_eq!(
            tokens.describe(3),
            "budget of 5000 generated tokens reached at step 3 (5000 generated tokens used)"
        );
        assert_eq!(Caps::default().reached(usage(1e9, i64::MAX)), None);
    }

    #[test]
    fn steps_left_counts_the_step_that_crosses_the_cap() {
        let caps = Caps { max_wall_seconds: Some(100), max_tokens: None };
        // 30 s used at 20 s a step: steps 1..3 end at 50, 70, 90 s; the 4th crosses 100.
        assert_eq!(caps.steps_left(usage(30.0, 0), 20.0, 50.0), Some(4));
        assert_eq!(caps.steps_left(usage(100.0, 0), 20.0, 50.0), Some(0));
        assert_eq!(caps.steps_left(usage(30.0, 0), 0.0, 50.0), None, "no pace measured");
        let both = Caps { max_wall_seconds: Some(100), max_tokens: Some(120) };
        assert_eq!(both.steps_left(usage(30.0, 20), 20.0, 50.0), Some(2), "tokens first");
        assert_eq!(Caps::default().steps_left(usage(30.0, 0), 20.0, 50.0), None);
    }

    #[test]
    fn apply_keeps_absent_fields_removes_nulls_and_names_bad_ones() {
        let caps = Caps { max_wall_seconds: Some(600), max_tokens: Some(10) };
        let raised = caps.apply(&json!({"max_wall_seconds": 1200}), "").unwrap();
        assert_eq!(raised, Caps { max_wall_seconds: Some(1200), max_tokens: Some(10) });
        let removed = caps.apply(&json!({"max_tokens": null}), "").unwrap();
        assert_eq!(removed.max_tokens, None);
        for (body, field) in [
            (json!({"max_wall_seconds": 0}), "budget.max_wall_seconds"),
            (json!({"max_wall_seconds": 1.5}), "budget.max_wall_seconds"),
            (json!({"max_wall_seconds": "600"}), "budget.max_wall_seconds"),
            (json!({"max_tokens": TOKENS_LIMIT + 1}), "budget.max_tokens"),
            (json!({"max_seconds": 5}), "budget.max_seconds"),
            (json!([600]), "budget"),
        ] {
            assert_eq!(caps.apply(&body, "budget").unwrap_err().field, field, "{body}");
        }
        assert_eq!(caps.apply(&json!(1), "").unwrap_err().field, "body");
    }
}
