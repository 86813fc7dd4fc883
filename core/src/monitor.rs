//! The reward-hacking and collapse monitor: known failure patterns read off a job's metrics rows
//! (`{"step": n, …}` in step order, an evaluation under `eval`), as typed warnings. The worker
//! runs it after each step (events, `auto_pause_on`); the server shows it (API, job page).

use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Steps averaged for "at the start" and "recently".
const WINDOW: usize = 3;
/// Recent zero-advantage fraction at or above which learning has stalled.
pub const ZERO_ADVANTAGE_LIMIT: f64 = 0.8;
/// Recent entropy below this fraction of the starting entropy is a collapse.
pub const ENTROPY_COLLAPSE_RATIO: f64 = 0.2;
/// Recent completion length at or above this multiple of the start is drift upwards.
pub const LENGTH_RISE_RATIO: f64 = 1.5;
/// Recent completion length at or below this fraction of the start is drift downwards.
pub const LENGTH_FALL_RATIO: f64 = 0.5;
/// Change in a sub-grader's mean reward (start to recent) that counts as rising or falling.
pub const SUB_GRADER_SHIFT: f64 = 0.1;
/// Training-reward gain minus validation-reward gain above which training is not generalising.
pub const VALIDATION_GAP: f64 = 0.2;

/// The failure patterns the monitor knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// Completion length rose or fell sharply against the start.
    LengthDrift,
    /// One sub-grader of a `multi` grader rose while another fell.
    SubGraderDivergence,
    /// Training reward rose while validation reward did not.
    ValidationGap,
    /// Policy entropy fell to a fraction of its start.
    EntropyCollapse,
    /// Most groups get identical rewards.
    ZeroAdvantage,
    /// The grader fails more and more often.
    GraderErrors,
}

impl WarningKind {
    /// Every kind, in display order.
    pub const ALL: [WarningKind; 6] = [
        WarningKind::LengthDrift,
        WarningKind::SubGraderDivergence,
        WarningKind::ValidationGap,
        WarningKind::EntropyCollapse,
        WarningKind::ZeroAdvantage,
        WarningKind::GraderErrors,
    ];

    /// The name used in the API and in `auto_pause_on`.
    pub fn as_str(self) -> &'static str {
        match self {
            WarningKind::LengthDrift => "length_drift",
            WarningKind::SubGraderDivergence => "sub_grader_divergence",
            WarningKind::ValidationGap => "validation_gap",
            WarningKind::EntropyCollapse => "entropy_collapse",
            WarningKind::ZeroAdvantage => "zero_advantage",
            WarningKind::GraderErrors => "grader_errors",
        }
    }

    /// The kind named `name`, if any.
    pub fn from_name(name: &str) -> Option<WarningKind> {
        WarningKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Every kind's name, comma-separated (for error messages and docs).
    pub fn names() -> String {
        WarningKind::ALL.map(WarningKind::as_str).join(", ")
    }
}

/// One warning: which pattern, the metric and value that triggered it, the threshold it
/// crossed, the step it was seen at, and what it means.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Warning {
    /// The pattern.
    pub kind: WarningKind,
    /// The metric that triggered it (a metrics-row key, dotted for nested ones).
    pub metric: String,
    /// Its value (for drifts and gaps, the measured ratio or difference).
    pub value: f64,
    /// The threshold `value` crossed.
    pub threshold: f64,
    /// The latest step of the rows it was read from.
    pub step: i64,
    /// What it means and what to do.
    pub message: String,
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Means of the first and the last [`WINDOW`] values, when there are `2 × WINDOW` of them.
fn start_and_recent(values: &[f64]) -> Option<(f64, f64)> {
    if values.len() < 2 * WINDOW {
        return None;
    }
    Some((mean(&values[..WINDOW])?, mean(&values[values.len() - WINDOW..])?))
}

/// Whether a row is a step that trained on something (a step where dynamic sampling kept no
/// group logs zeros, which are not measurements).
fn trained(row: &Value) -> bool {
    row.get("completion_length_mean").and_then(Value::as_f64).is_none_or(|l| l > 0.0)
}

fn series(rows: &[Value], key: &str) -> Vec<f64> {
    rows.iter().filter(|r| trained(r)).filter_map(|row| row.get(key)?.as_f64()).collect()
}

/// The warnings `rows` call for, one per kind at most.
pub fn detect(rows: &[Value]) -> Vec<Warning> {
    let step = rows.iter().filter_map(|r| r.get("step")?.as_i64()).max().unwrap_or(0);
    let found = [
        length_drift(rows),
        sub_grader_divergence(rows),
        validation_gap(rows),
        entropy_collapse(rows),
        zero_advantage(rows),
        grader_errors(rows),
    ];
    found
        .into_iter()
        .flatten()
        .map(|(kind, metric, value, threshold, message)| Warning {
            kind,
            metric,
            value,
            threshold,
            step,
            message,
        })
        .collect()
}

/// A job's metrics rows as the monitor reads them: `{"step": n, …}` by step, preceded by the
/// baseline evaluation (`{"step": 0, "eval": …}`) when one ran.
pub async fn job_rows(pool: &sqlx::PgPool, job_id: &str) -> Result<Vec<Value>, sqlx::Error> {
    let baseline = crate::sampling_runs::job_baseline(pool, job_id).await?;
    let mut rows: Vec<Value> =
        baseline.map(|eval| serde_json::json!({"step": 0, "eval": eval})).into_iter().collect();
    for (step, mut data) in crate::jobs::metrics_rows(pool, job_id).await? {
        if let Value::Object(map) = &mut data {
            map.insert("step".into(), step.into());
        }
        rows.push(data);
    }
    Ok(rows)
}

/// The warnings of job `job_id` now.
pub async fn job_warnings(pool: &sqlx::PgPool, job_id: &str) -> Result<Vec<Warning>, sqlx::Error> {
    Ok(detect(&job_rows(pool, job_id).await?))
}

/// The warning kinds that paused job `job_id` (its `auto_pause` events), each with the step it
/// paused at, oldest first.
pub async fn auto_pauses(
    pool: &sqlx::PgPool,
    job_id: &str,
) -> Result<Vec<(WarningKind, i64)>, sqlx::Error> {
    let rows = sqlx::query_scalar!(
        "SELECT data FROM job_events WHERE job_id = $1 AND kind = 'auto_pause' ORDER BY id",
        job_id
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .flatten()
        .filter_map(|data| {
            let kind = WarningKind::from_name(data.get("kind")?.as_str()?)?;
            Some((kind, data.get("step")?.as_i64()?))
        })
        .collect())
}

type Found = Option<(WarningKind, String, f64, f64, String)>;

fn length_drift(rows: &[Value]) -> Found {
    let (start, recent) = start_and_recent(&series(rows, "completion_length_mean"))?;
    if start <= 0.0 {
        return None;
    }
    let ratio = recent / start;
    let (threshold, message) = if ratio >= LENGTH_RISE_RATIO {
        (LENGTH_RISE_RATIO, format!(
            "Completions grew from {start:.0} to {recent:.0} tokens: the model may be padding or rambling \
             for reward. Read recent completions; consider an overlong penalty or a length-constraint grader."
        ))
    } else if ratio <= LENGTH_FALL_RATIO {
        (LENGTH_FALL_RATIO, format!(
            "Completions shrank from {start:.0} to {recent:.0} tokens: the model may have found a short answer \
             the grader accepts, or stopped reasoning. Read recent completions and test the grader on them."
        ))
    } else {
        return None;
    };
    Some((WarningKind::LengthDrift, "completion_length_mean".into(), ratio, threshold, message))
}

fn sub_grader_divergence(rows: &[Value]) -> Found {
    let mut per: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for row in rows.iter().filter(|r| trained(r)) {
        let Some(graders) = row.get("reward_per_grader").and_then(Value::as_object) else {
            continue;
        };
        for (name, summary) in graders {
            if let Some(m) = summary.get("mean").and_then(Value::as_f64) {
                per.entry(name.as_str()).or_default().push(m);
            }
        }
    }
    let shifts: Vec<(&str, f64)> = per
        .iter()
        .filter_map(|(name, values)| start_and_recent(values).map(|(s, r)| (*name, r - s)))
        .collect();
    let rising = shifts.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1))?;
    let falling = shifts.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1))?;
    if rising.0 == falling.0 || rising.1 < SUB_GRADER_SHIFT || falling.1 > -SUB_GRADER_SHIFT {
        return None;
    }
    let message = format!(
        "Sub-grader \"{}\" rose by {:.2} while \"{}\" fell by {:.2}: the policy may be trading one part of \
         the reward for another (e.g. format for correctness). Check the multi grader's weights and read \
         completions that score high on \"{}\".",
        rising.0, rising.1, falling.0, -falling.1, rising.0
    );
    let metric = format!("reward_per_grader.{}.mean", falling.0);
    Some((WarningKind::SubGraderDivergence, metric, falling.1, -SUB_GRADER_SHIFT, message))
}

fn validation_gap(rows: &[Value]) -> Found {
    let evals: Vec<f64> =
        rows.iter().filter_map(|r| r.get("eval")?.get("mean_reward")?.as_f64()).collect();
    let (first_eval, last_eval) = (*evals.first()?, *evals.last()?);
    if evals.len() < 2 {
        return None;
    }
    let (start, recent) = start_and_recent(&series(rows, "reward_mean"))?;
    let train_gain = recent - start;
    let validation_gain = last_eval - first_eval;
    let gap = train_gain - validation_gain;
    if train_gain <= 0.0 || gap < VALIDATION_GAP {
        return None;
    }
    let message = format!(
        "Training reward rose by {train_gain:.2} but validation reward changed by {validation_gain:+.2}: the \
         policy may be exploiting the grader or memorising the training prompts. Compare training and \
         validation completions; check the grader against the exploit probes."
    );
    Some((WarningKind::ValidationGap, "eval.mean_reward".into(), gap, VALIDATION_GAP, message))
}

fn entropy_collapse(rows: &[Value]) -> Found {
    let (start, recent) = start_and_recent(&series(rows, "entropy"))?;
    if start <= 0.0 || recent >= ENTROPY_COLLAPSE_RATIO * start {
        return None;
    }
    let message = format!(
        "Entropy collapsed from {start:.3} to {recent:.3}: the policy stopped exploring and will stop \
         improving. Lower the learning rate, raise the temperature, or use DAPO's clip-higher (epsilon_high)."
    );
    Some((
        WarningKind::EntropyCollapse,
        "entropy".into(),
        recent / start,
        ENTROPY_COLLAPSE_RATIO,
        message,
    ))
}

fn zero_advantage(rows: &[Value]) -> Found {
    let values = series(rows, "zero_advantage_group_fraction");
    if values.len() < 2 {
        return None;
    }
    let recent = mean(&values[values.len().saturating_sub(WINDOW)..])?;
    if recent < ZERO_ADVANTAGE_LIMIT {
        return None;
    }
    let message = format!(
        "Zero-advantage fraction is {:.0}%: most groups get identical rewards, so there is little to learn \
         from. Make the task easier or harder, raise group_size, use dynamic_sampling, or a graded \
         (non-binary) grader.",
        recent * 100.0
    );
    Some((
        WarningKind::ZeroAdvantage,
        "zero_advantage_group_fraction".into(),
        recent,
        ZERO_ADVANTAGE_LIMIT,
        message,
    ))
}

fn grader_errors(rows: &[Value]) -> Found {
    let values: Vec<f64> = rows.iter().filter_map(|r| r.get("grader_errors")?.as_f64()).collect();
    if values.len() < 2 {
        return None;
    }
    let start = mean(&values[..values.len().min(WINDOW)])?;
    let recent = mean(&values[values.len().saturating_sub(WINDOW)..])?;
    if recent <= 0.0 || recent <= start {
        return None;
    }
    let message = format!(
        "Grader errors are rising ({recent:.1} per step recently): completions are being scored 0 for \
         infrastructure reasons. Check the grader with Test grader and the events log."
    );
    Some((WarningKind::GraderErrors, "grader_errors".into(), recent, start, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn healthy(step: usize) -> Value {
        json!({"step": step, "zero_advantage_group_fraction": 0.2, "entropy": 1.0, "grader_errors": 0,
               "completion_length_mean": 50.0, "reward_mean": 0.1 + 0.01 * step as f64,
               "reward_per_grader": {"format": {"mean": 0.5, "std": 0.1}, "correct": {"mean": 0.5, "std": 0.1}}})
    }

    fn run(edit: impl Fn(usize, &mut Value)) -> Vec<Value> {
        (1..=8)
            .map(|step| {
                let mut row = healthy(step);
                edit(step, &mut row);
                row
            })
            .collect()
    }

    fn only(rows: &[Value], kind: WarningKind) -> Warning {
        let found = detect(rows);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].kind, kind);
        assert_eq!(found[0].step, 8);
        found[0].clone()
    }

    #[test]
    fn a_healthy_run_has_no_warnings() {
        assert!(detect(&run(|_, _| {})).is_empty());
        assert!(detect(&[]).is_empty());
    }

    #[test]
    fn length_drift_up_and_down() {
        let up = only(
            &run(|s, r| r["completion_length_mean"] = json!(50.0 * (1.0 + s as f64 / 2.0))),
            WarningKind::LengthDrift,
        );
        assert_eq!(up.metric, "completion_length_mean");
        assert!(up.value >= LENGTH_RISE_RATIO && up.message.contains("grew"));
        let down = only(
            &run(|s, r| r["completion_length_mean"] = json!(100.0 / s as f64)),
            WarningKind::LengthDrift,
        );
        assert!(down.value <= LENGTH_FALL_RATIO && down.message.contains("shrank"));
    }

    #[test]
    fn skipped_steps_are_not_measurements() {
        let rows = run(|s, r| {
            if s > 5 {
                *r = json!({"step": s, "completion_length_mean": 0.0, "entropy": 0.0, "reward_mean": 0.0});
            }
        });
        assert!(detect(&rows).is_empty(), "{:?}", detect(&rows));
    }

    #[test]
    fn one_sub_grader_rising_while_another_falls() {
        let w = only(
            &run(|s, r| {
                r["reward_per_grader"]["format"]["mean"] = json!(0.1 * s as f64);
                r["reward_per_grader"]["correct"]["mean"] = json!(0.9 - 0.1 * s as f64);
            }),
            WarningKind::SubGraderDivergence,
        );
        assert_eq!(w.metric, "reward_per_grader.correct.mean");
        assert!(w.value < -SUB_GRADER_SHIFT && w.message.contains("\"format\" rose"));
        // Both rising is learning, not a trade.
        let both = run(|s, r| {
            r["reward_per_grader"]["format"]["mean"] = json!(0.1 * s as f64);
            r["reward_per_grader"]["correct"]["mean"] = json!(0.1 * s as f64);
        });
        assert!(detect(&both).is_empty());
    }

    #[test]
    fn training_reward_rising_while_validation_does_not() {
        let rows = run(|s, r| {
            r["reward_mean"] = json!(0.1 * s as f64);
            if s == 2 || s == 8 {
                r["eval"] = json!({"step": s, "mean_reward": 0.3});
            }
        });
        let w = only(&rows, WarningKind::ValidationGap);
        assert_eq!(w.metric, "eval.mean_reward");
        assert!(w.value > VALIDATION_GAP);
        // Validation following training is fine.
        let following = run(|s, r| {
            r["reward_mean"] = json!(0.1 * s as f64);
            if s == 2 || s == 8 {
                r["eval"] = json!({"step": s, "mean_reward": 0.1 * s as f64});
            }
        });
        assert!(detect(&following).is_empty());
    }

    #[test]
    fn entropy_collapse() {
        let w = only(
            &run(|s, r| r["entropy"] = json!(1.0 / (1.0 + 10.0 * (s - 1) as f64))),
            WarningKind::EntropyCollapse,
        );
        assert_eq!(w.metric, "entropy");
        assert!(w.value < ENTROPY_COLLAPSE_RATIO);
    }

    #[test]
    fn zero_advantage_growth() {
        let w = only(
            &run(|s, r| r["zero_advantage_group_fraction"] = json!(if s > 4 { 1.0 } else { 0.2 })),
            WarningKind::ZeroAdvantage,
        );
        assert_eq!((w.metric.as_str(), w.value), ("zero_advantage_group_fraction", 1.0));
    }

    #[test]
    fn rising_grader_errors() {
        let w = only(&run(|s, r| r["grader_errors"] = json!(s)), WarningKind::GraderErrors);
        assert_eq!(w.metric, "grader_errors");
    }

    #[test]
    fn kinds_round_trip_by_name() {
        for kind in WarningKind::ALL {
            assert_eq!(WarningKind::from_name(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(kind.as_str()));
        }
        assert_eq!(WarningKind::from_name("nope"), None);
    }
}
