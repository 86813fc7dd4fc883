//! Sampling runs (Verity extensions): *evaluation reports* (n completions per prompt of a file
//! from each of several models, graded, summarised as mean reward and unbiased pass@k) and
//! *rejection sampling* (k completions per prompt from one model, the passing ones kept as a
//! supervised chat file). Both are rows of the job queue (`jobs.kind`), so they are leased,
//! fenced, retried and cancellable like fine-tuning jobs; this module holds their spec (what the
//! worker runs), their reads, and the report built from the per-model metrics rows.

use crate::jobs::JobRecord;
use crate::metrics_csv::csv_field;
pub use crate::sampling::{InvalidSetting, SamplingSettings};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use std::collections::BTreeMap;
use uuid::Uuid;

/// The kinds of sampling runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// An evaluation report.
    Evaluation,
    /// A rejection-sampling run.
    RejectionSampling,
    /// A difficulty profile of a job's training file.
    DifficultyProfile,
}

impl RunKind {
    /// The value of `jobs.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Evaluation => "evaluation",
            RunKind::RejectionSampling => "rejection_sampling",
            RunKind::DifficultyProfile => "difficulty_profile",
        }
    }

    /// A fresh id of this kind (`evaljob-…`, `rsjob-…` or `dpjob-…`).
    pub fn new_id(self) -> String {
        crate::ids::new_id(match self {
            RunKind::Evaluation => "evaljob",
            RunKind::RejectionSampling => "rsjob",
            RunKind::DifficultyProfile => "dpjob",
        })
    }
}

/// Most completions per prompt a run may ask for.
pub const MAX_SAMPLES_PER_PROMPT: usize = 1024;

/// Checks a samples-per-prompt count (`n`, `k`): 1 to [`MAX_SAMPLES_PER_PROMPT`].
pub fn validate_samples(param: &str, n: usize) -> Result<(), InvalidSetting> {
    if (1..=MAX_SAMPLES_PER_PROMPT).contains(&n) {
        Ok(())
    } else {
        Err(InvalidSetting::new(param, format!("must be between 1 and {MAX_SAMPLES_PER_PROMPT}")))
    }
}

/// A model of a run as resolved when it was created: its name and the base it applies to (its
/// own name for a base model; the job's base for a fine-tuned model or checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunModel {
    /// The name the request gave (a base, a `fine_tuned_model`, or `…:ckpt-step-N`).
    pub name: String,
    /// The base model it is compared with.
    pub base: String,
}

impl RunModel {
    /// Whether this is a base model itself.
    pub fn is_base(&self) -> bool {
        self.name == self.base
    }
}

/// What to keep of a prompt's graded completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionPolicy {
    /// The highest-scoring completion at or above `min_score` (the first on ties).
    Best,
    /// Every completion at or above `min_score`, identical texts kept once.
    AllPassing,
}

impl SelectionPolicy {
    /// Every policy.
    pub const ALL: [SelectionPolicy; 2] = [SelectionPolicy::Best, SelectionPolicy::AllPassing];

    /// Its name in the API (`best`, `all_passing`).
    pub fn as_str(self) -> &'static str {
        match self {
            SelectionPolicy::Best => "best",
            SelectionPolicy::AllPassing => "all_passing",
        }
    }

    /// The policy called `name`, if any.
    pub fn parse(name: &str) -> Option<SelectionPolicy> {
        SelectionPolicy::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// What an evaluation runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluationSpec {
    /// The models, in report order.
    pub models: Vec<RunModel>,
    /// The grader, as the RL jobs take it.
    pub grader: Value,
    /// Completions per prompt.
    pub n: usize,
    /// Sampling settings.
    pub sampling: SamplingSettings,
    /// The fine-tuning job the report compares with its base, when created for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
}

/// What a rejection-sampling run runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RejectionSamplingSpec {
    /// The sampler model.
    pub model: RunModel,
    /// The grader.
    pub grader: Value,
    /// Completions per prompt.
    pub k: usize,
    /// What to keep.
    pub policy: SelectionPolicy,
    /// Lowest score a kept completion has.
    pub min_score: f64,
    /// Sampling settings.
    pub sampling: SamplingSettings,
}

/// What a difficulty profile runs: the job's model, grader and hyperparameters on a subset of
/// its training file ([`crate::difficulty`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DifficultyProfileSpec {
    /// The job's model.
    pub model: RunModel,
    /// The job's grader.
    pub grader: Value,
    /// Completions per prompt (default: the job's group size).
    pub k: usize,
    /// Prompts profiled (evenly spaced over the file; every row when the file is shorter).
    pub prompts: usize,
    /// The job's sampling settings (temperature, top_p, max_completion_tokens, stop).
    pub sampling: SamplingSettings,
    /// The job's resolved reinforcement hyperparameters (group size, batch, steps, top_k…).
    pub hyperparameters: Box<crate::spec::Hyperparameters>,
    /// Whether to run and time one training step of the job.
    pub measure_step: bool,
}

/// A sampling run's spec as stored in `jobs.spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RunSpec {
    /// An evaluation report.
    Evaluation(EvaluationSpec),
    /// A rejection-sampling run.
    RejectionSampling(RejectionSamplingSpec),
    /// A difficulty profile.
    DifficultyProfile(DifficultyProfileSpec),
}

impl RunSpec {
    /// The spec of a job row, if it is a sampling run (`None` for a fine-tuning job).
    pub fn of_job(spec: &Value) -> Option<Result<RunSpec, serde_json::Error>> {
        spec.get("kind")?;
        Some(serde_json::from_value(spec.clone()))
    }

    /// Its kind.
    pub fn kind(&self) -> RunKind {
        match self {
            RunSpec::Evaluation(_) => RunKind::Evaluation,
            RunSpec::RejectionSampling(_) => RunKind::RejectionSampling,
            RunSpec::DifficultyProfile(_) => RunKind::DifficultyProfile,
        }
    }

    /// The models it samples, in order (the metrics row of model `i` has step `i`).
    pub fn models(&self) -> Vec<&RunModel> {
        match self {
            RunSpec::Evaluation(spec) => spec.models.iter().collect(),
            RunSpec::RejectionSampling(spec) => vec![&spec.model],
            RunSpec::DifficultyProfile(spec) => vec![&spec.model],
        }
    }

    /// Its grader.
    pub fn grader(&self) -> &Value {
        match self {
            RunSpec::Evaluation(spec) => &spec.grader,
            RunSpec::RejectionSampling(spec) => &spec.grader,
            RunSpec::DifficultyProfile(spec) => &spec.grader,
        }
    }

    /// Completions per prompt.
    pub fn samples_per_prompt(&self) -> usize {
        match self {
            RunSpec::Evaluation(spec) => spec.n,
            RunSpec::RejectionSampling(spec) => spec.k,
            RunSpec::DifficultyProfile(spec) => spec.k,
        }
    }

    /// Its sampling settings.
    pub fn sampling(&self) -> &SamplingSettings {
        match self {
            RunSpec::Evaluation(spec) => &spec.sampling,
            RunSpec::RejectionSampling(spec) => &spec.sampling,
            RunSpec::DifficultyProfile(spec) => &spec.sampling,
        }
    }
}

/// The org's run `id` of `kind`.
pub async fn get_run(
    pool: &PgPool,
    org_id: Uuid,
    kind: RunKind,
    id: &str,
) -> Result<Option<JobRecord>, sqlx::Error> {
    crate::jobs::get_job_of_kind(pool, org_id, kind.as_str(), id).await
}

/// The org's runs of `kind`, newest first, after run `after` (exclusive); at most `limit`.
pub async fn list_runs(
    pool: &PgPool,
    org_id: Uuid,
    kind: RunKind,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<JobRecord>, sqlx::Error> {
    let any = crate::jobs::MetadataFilter::Any;
    crate::jobs::list_jobs_of_kind(pool, org_id, kind.as_str(), after, limit, &any).await
}

/// The org's evaluations created for fine-tuning job `job_id`, newest first, as `(id, state)`.
pub async fn job_evaluations(
    pool: &PgPool,
    org_id: Uuid,
    job_id: &str,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT id, state FROM jobs
           WHERE org_id = $1 AND kind = 'evaluation' AND spec->>'job_id' = $2
           ORDER BY created_at DESC, id DESC LIMIT 20"#,
        org_id,
        job_id
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.state)).collect())
}

/// The baseline of fine-tuning job `job_id`: the data of its `eval` event for step 0 (the
/// evaluation of the base before the first step), if it ran.
pub async fn job_baseline(pool: &PgPool, job_id: &str) -> Result<Option<Value>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT data AS "data!" FROM job_events
           WHERE job_id = $1 AND kind = 'eval' AND data->>'step' = '0' AND data IS NOT NULL
           ORDER BY id DESC LIMIT 1"#,
        job_id
    )
    .fetch_optional(pool)
    .await
}

/// One model's results in an evaluation (its metrics row).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResult {
    /// The model.
    pub model: String,
    /// The base it is compared with (itself for a base).
    pub base: String,
    /// Prompts graded.
    pub prompts: usize,
    /// Completions per prompt.
    pub samples_per_prompt: usize,
    /// Mean grader score over every graded completion.
    pub mean_reward: f64,
    /// Unbiased pass@k by `pass@k` key, k = 1, 2, 4, … and n.
    pub pass_at_k: BTreeMap<String, f64>,
    /// Failed gradings (excluded from the means).
    pub grader_errors: usize,
    /// Completion tokens sampled.
    #[serde(default)]
    pub completion_tokens: usize,
}

impl ModelResult {
    /// `(k, pass@k)` by increasing k.
    pub fn pass_at_k_by_k(&self) -> Vec<(usize, f64)> {
        let mut ks: Vec<(usize, f64)> = self
            .pass_at_k
            .iter()
            .filter_map(|(key, &v)| Some((key.strip_prefix("pass@")?.parse().ok()?, v)))
            .collect();
        ks.sort_by_key(|&(k, _)| k);
        ks
    }

    /// pass@k at `k`, if measured.
    pub fn at(&self, k: usize) -> Option<f64> {
        self.pass_at_k.get(&format!("pass@{k}")).copied()
    }
}

/// A fine-tuned model or checkpoint whose pass@k at the largest k falls below its base's: RL
/// sharpened pass@1 (perhaps) but narrowed what the model can solve with many tries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NarrowingFlag {
    /// The fine-tuned model or checkpoint.
    pub model: String,
    /// Its base.
    pub base: String,
    /// The largest k both were measured at.
    pub k: usize,
    /// The model's pass@k.
    pub pass_at_k: f64,
    /// The base's pass@k.
    pub base_pass_at_k: f64,
    /// The model's pass@1.
    pub pass_at_1: Option<f64>,
    /// The base's pass@1.
    pub base_pass_at_1: Option<f64>,
    /// A sentence saying so.
    pub message: String,
}

/// The narrowing flags of an evaluation: every non-base model whose pass@k at the largest k
/// measured for both falls below that of its base (when the base was evaluated too).
pub fn narrowing_flags(results: &[ModelResult]) -> Vec<NarrowingFlag> {
    let mut flags = Vec::new();
    for result in results.iter().filter(|r| r.model != r.base) {
        let Some(base) = results.iter().find(|b| b.model == result.base) else { continue };
        let Some(k) =
            result.pass_at_k_by_k().iter().map(|&(k, _)| k).filter(|&k| base.at(k).is_some()).max()
        else {
            continue;
        };
        let (Some(mine), Some(theirs)) = (result.at(k), base.at(k)) else { continue };
        if mine >= theirs {
            continue;
        }
        let (p1, base_p1) = (result.at(1), base.at(1));
        let sharpened = match (p1, base_p1) {
            (Some(a), Some(b)) if a > b => {
                format!(" while its pass@1 rose from {b:.3} to {a:.3} (sharpened, but narrower)")
            }
            _ => String::new(),
        };
        flags.push(NarrowingFlag {
            model: result.model.clone(),
            base: base.model.clone(),
            k,
            pass_at_k: mine,
            base_pass_at_k: theirs,
            pass_at_1: p1,
            base_pass_at_1: base_p1,
            message: format!(
                "{}: pass@{k} {mine:.3} is below the base {}'s {theirs:.3}{sharpened}",
                result.model, base.model
            ),
        });
    }
    flags
}

/// An evaluation's results: one entry per evaluated model (in the run's order) and the flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluationReport {
    /// Per-model results, for the models done so far.
    pub models: Vec<ModelResult>,
    /// Every k reported by some model, increasing.
    pub ks: Vec<usize>,
    /// Checkpoints narrower than their base at the largest k.
    pub flags: Vec<NarrowingFlag>,
}

impl EvaluationReport {
    /// The report of the per-model metrics rows `(step = model index, data)`.
    pub fn from_rows(rows: &[(i32, Value)]) -> EvaluationReport {
        let models: Vec<ModelResult> =
            rows.iter().filter_map(|(_, data)| serde_json::from_value(data.clone()).ok()).collect();
        let mut ks: Vec<usize> =
            models.iter().flat_map(|m| m.pass_at_k_by_k().into_iter().map(|(k, _)| k)).collect();
        ks.sort_unstable();
        ks.dedup();
        let flags = narrowing_flags(&models);
        EvaluationReport { models, ks, flags }
    }

    /// The report as CSV: one row per model, columns `model, base, prompts,
    /// samples_per_prompt, mean_reward, grader_errors, pass@1 … pass@n, narrower_than_base`.
    pub fn to_csv(&self) -> String {
        let mut out =
            String::from("model,base,prompts,samples_per_prompt,mean_reward,grader_errors");
        for k in &self.ks {
            out.push_str(&format!(",pass@{k}"));
        }
        out.push_str(",narrower_than_base\n");
        for m in &self.models {
            let flagged = self.flags.iter().any(|f| f.model == m.model);
            out.push_str(&format!(
                "{},{},{},{},{},{}",
                csv_field(&m.model),
                csv_field(&m.base),
                m.prompts,
                m.samples_per_prompt,
                m.mean_reward,
                m.grader_errors
            ));
            for &k in &self.ks {
                out.push(',');
                if let Some(v) = m.at(k) {
                    out.push_str(&v.to_string());
                }
            }
            out.push_str(if flagged { ",true\n" } else { ",false\n" });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(model: &str, base: &str, pass: &[(usize, f64)]) -> ModelResult {
        ModelResult {
            model: model.into(),
            base: base.into(),
            prompts: 10,
            samples_per_prompt: 8,
            mean_reward: 0.5,
            pass_at_k: pass.iter().map(|&(k, v)| (format!("pass@{k}"), v)).collect(),
            grader_errors: 0,
            completion_tokens: 0,
        }
    }

    #[test]
    fn a_checkpoint_narrower_than_its_base_at_the_largest_k_is_flagged() {
        let base = result("base", "base", &[(1, 0.3), (2, 0.5), (8, 0.9)]);
        let sharp = result("ft:base:x:ckpt-step-10", "base", &[(1, 0.6), (2, 0.65), (8, 0.7)]);
        let broad = result("ft:base:x:ckpt-step-20", "base", &[(1, 0.5), (2, 0.7), (8, 0.9)]);
        let flags = narrowing_flags(&[base.clone(), sharp, broad]);
        assert_eq!(flags.len(), 1, "{flags:?}");
        let flag = &flags[0];
        assert_eq!((flag.model.as_str(), flag.k), ("ft:base:x:ckpt-step-10", 8));
        assert_eq!((flag.pass_at_k, flag.base_pass_at_k), (0.7, 0.9));
        assert!(flag.message.contains("sharpened"), "{}", flag.message);
        // Without the base in the report, nothing is compared.
        let alone = result("ft:base:x:ckpt-step-10", "base", &[(1, 0.6), (8, 0.1)]);
        assert!(narrowing_flags(std::slice::from_ref(&alone)).is_empty());
        // The largest k measured for both is the one compared.
        let short_base = result("base", "base", &[(1, 0.3), (2, 0.5)]);
        let flags = narrowing_flags(&[short_base, alone]);
        assert!(flags.is_empty(), "pass@1 0.6 ≥ 0.3 and no common k above it: {flags:?}");
        let base_only = narrowing_flags(&[base]);
        assert!(base_only.is_empty());
    }

    #[test]
    fn the_report_orders_ks_numerically_and_writes_csv() {
        let rows = vec![
            (0, serde_json::to_value(result("b", "b", &[(1, 0.25), (2, 0.5), (16, 1.0)])).unwrap()),
            (
                1,
                serde_json::to_value(result("c,1", "b", &[(1, 0.5), (2, 0.6), (16, 0.75)]))
                    .unwrap(),
            ),
            (2, json!({"unrelated": true})),
        ];
        let report = EvaluationReport::from_rows(&rows);
        assert_eq!(report.ks, vec![1, 2, 16]);
        assert_eq!(report.flags.len(), 1);
        let csv = report.to_csv();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "model,base,prompts,samples_per_prompt,mean_reward,grader_errors,pass@1,pass@2,pass@16,narrower_than_base"
        );
        assert_eq!(lines[1], "b,b,10,8,0.5,0,0.25,0.5,1,false");
        assert_eq!(lines[2], "\"c,1\",b,10,8,0.5,0,0.5,0.6,0.75,true");
    }

    #[test]
    fn specs_round_trip_with_their_kind() {
        let spec = RunSpec::RejectionSampling(RejectionSamplingSpec {
            model: RunModel { name: "m".into(), base: "m".into() },
            grader: json!({"type": "string_check"}),
            k: 4,
            policy: SelectionPolicy::AllPassing,
            min_score: 1.0,
            sampling: SamplingSettings::default(),
        });
        let value = serde_json::to_value(&spec).unwrap();
        assert_eq!(value["kind"], "rejection_sampling");
        assert_eq!(RunSpec::of_job(&value).unwrap().unwrap(), spec);
        assert!(RunSpec::of_job(&json!({"method": {}})).is_none());
        assert_eq!(SamplingSettings::default().validate(), Ok(()));
        let bad = SamplingSettings { top_p: 0.0, ..SamplingSettings::default() };
        assert_eq!(bad.validate().unwrap_err().param, "top_p");
        assert!(validate_samples("n", 0).is_err() && validate_samples("n", 1).is_ok());
    }
}
