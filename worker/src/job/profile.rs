//! Difficulty profiles under their lease: k completions per prompt of an evenly spaced subset
//! of the job's training file, sampled with the job's model and sampling hyperparameters and
//! graded by its grader (the samples stored as step 0); then, when asked, one real training
//! step of the job timed on those prompts; the report ([`verity_core::difficulty`]) is the
//! run's result.

use super::cancellable::blocking_until_cancelled;
use super::handler::TrainingHandler;
use super::runs::{interrupted, parse_dataset, run_seed, RunContext};
use super::stop::{event, retryable, Stop};
use crate::loader::LoadedModel;
use crate::runs::sample_records;
use crate::trainer::draw::sampling_params;
use crate::trainer::rollout::Group;
use crate::trainer::step::SUCCESS_THRESHOLD;
use crate::trainer::{Dataset, Trainer, TrainerOptions};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;
use verity_core::difficulty::{
    file_rows, profiled_rows, CostEstimate, Difficulty, JobShape, MeasuredStep, ProfileReport,
    RowOutcome, Throughput,
};
use verity_core::queue::{EventLevel, JobOutcome};
use verity_core::sampling_runs::DifficultyProfileSpec;

/// What one profiled prompt's group says: its rewards as the trainer sees them and its passes.
fn row_outcome(group: &Group, lines: &[usize]) -> RowOutcome {
    RowOutcome {
        row: group.example,
        line: lines.get(group.example).copied().unwrap_or(0),
        rewards: group.rewards(),
        passing: group
            .grades
            .iter()
            .filter(|g| !g.is_error() && g.score >= SUCCESS_THRESHOLD)
            .count(),
    }
}

impl TrainingHandler {
    /// Runs a claimed difficulty profile.
    pub(super) async fn difficulty_profile(
        &self,
        ctx: &RunContext<'_>,
        profile: &DifficultyProfileSpec,
    ) -> Result<JobOutcome, Stop> {
        let (lease, heartbeat) = (ctx.lease, ctx.heartbeat);
        let hp = &profile.hyperparameters;
        let data =
            json!({"kind": "difficulty_profile", "prompts": profile.prompts, "k": profile.k});
        event(lease, heartbeat, EventLevel::Info, "started", "profiling started", Some(&data))
            .await?;
        let loaded = self.load_run_model(lease, heartbeat, &profile.model.name).await?;
        // the job's own sampling settings, k samples per prompt
        let params = sampling_params(hp, profile.k, run_seed(lease));
        let (loaded, dataset) =
            parse_dataset(lease, loaded, ctx.text, hp.max_completion_tokens()).await?;
        let rows = profiled_rows(dataset.len(), profile.prompts);
        let progress = |done: usize, total: usize| json!({"phase": "sampling", "prompts_done": done, "prompts": total});
        let Some((groups, times)) =
            self.sample_rows(ctx, (&loaded, &dataset), &rows, &params, progress).await?
        else {
            return Ok(interrupted(heartbeat).unwrap_or(JobOutcome::LeaseLost));
        };
        let lines: Vec<usize> = file_rows(ctx.text).map(|(line, _)| line).collect();
        let outcomes: Vec<RowOutcome> = groups.iter().map(|g| row_outcome(g, &lines)).collect();
        let difficulty = Difficulty::of(&outcomes, profile.k, hp.group_size());
        let grader_name = ctx.grader.spec().name().unwrap_or(ctx.grader.spec().kind()).to_string();
        let records =
            sample_records(0, &groups, &dataset.examples, &grader_name, &loaded.tokenizer);
        self.record_samples(lease, heartbeat, 0, &records, false).await?;
        let prompt_tokens: usize = rows.iter().map(|&r| dataset.examples[r].prompt_ids.len()).sum();
        let throughput = Throughput {
            completions: groups.iter().map(|g| g.completions.len()).sum(),
            completion_tokens: times.tokens,
            mean_prompt_tokens: prompt_tokens as f64 / rows.len().max(1) as f64,
            sampling_seconds: times.sampling,
            grading_seconds: times.grading,
        };
        let measured_step = if profile.measure_step && interrupted(heartbeat).is_none() {
            heartbeat.set_progress(json!({"phase": "measuring a training step",
                "prompts_done": rows.len(), "prompts": rows.len()}));
            let train =
                Dataset { examples: rows.iter().map(|&r| dataset.examples[r].clone()).collect() };
            drop(dataset);
            self.measure_step(ctx, profile, loaded, train).await?
        } else {
            None
        };
        if let Some(outcome) = interrupted(heartbeat) {
            return Ok(outcome);
        }
        let batch_size = hp.batch_size();
        let shape = JobShape {
            steps: JobShape::steps(lines.len(), batch_size, hp.n_epochs(), hp.max_steps),
            batch_size,
            group_size: hp.group_size(),
            max_completion_tokens: hp.max_completion_tokens(),
            dynamic_sampling: hp
                .dynamic_sampling
                .then(|| hp.max_groups_drawn.unwrap_or(3 * batch_size)),
        };
        let zero = difficulty.predicted_zero_advantage_fraction;
        let estimate = CostEstimate::of(&shape, &throughput, measured_step.as_ref(), zero);
        let message = format!(
            "{} prompt(s): predicted zero-advantage fraction {zero:.2} at G = {}; {} always and {} \
             never solved; about {:.0} s for {} step(s)",
            difficulty.prompts,
            difficulty.group_size,
            difficulty.always_solved,
            difficulty.never_solved,
            estimate.total_seconds,
            estimate.steps
        );
        let report = ProfileReport {
            difficulty,
            file_rows: lines.len(),
            throughput,
            measured_step,
            estimate,
        };
        let result = serde_json::to_value(&report).map_err(|e| retryable("encoding results", e))?;
        tracing::info!(run_id = %lease.job().id, zero_advantage = zero, "difficulty profile done");
        event(lease, heartbeat, EventLevel::Info, "succeeded", &message, None).await?;
        Ok(JobOutcome::Succeeded { result, fine_tuned_model: None })
    }

    /// Runs and times one training step of the job (its hyperparameters, on the profiled
    /// prompts). A step that fails is reported as a warning and leaves the estimate without
    /// training time; it never fails the profile.
    async fn measure_step(
        &self,
        ctx: &RunContext<'_>,
        profile: &DifficultyProfileSpec,
        loaded: Arc<LoadedModel>,
        train: Dataset,
    ) -> Result<Option<MeasuredStep>, Stop> {
        let (lease, heartbeat) = (ctx.lease, ctx.heartbeat);
        let loaded = match Arc::try_unwrap(loaded) {
            Ok(loaded) => loaded,
            Err(_) => self.load_run_model(lease, heartbeat, &profile.model.name).await?,
        };
        let options = TrainerOptions {
            seed: lease.job().seed as u64,
            base_model: profile.model.name.clone(),
            graders: self.graders.clone(),
        };
        let (grader, hp) = (ctx.grader.clone(), (*profile.hyperparameters).clone());
        let step = blocking_until_cancelled(heartbeat, "measuring a training step", move || {
            let mut trainer =
                Trainer::new(loaded.model, loaded.tokenizer, grader, hp, train, None, options)?;
            let started = Instant::now();
            let out = trainer.train_step()?;
            let m = out.metrics;
            Ok::<_, crate::trainer::TrainerError>(MeasuredStep {
                seconds: started.elapsed().as_secs_f64(),
                sampling_seconds: m.sampling_seconds,
                grading_seconds: m.grading_seconds,
                training_seconds: m.training_seconds,
                trained_tokens: m.trained_tokens,
            })
        })
        .await?;
        match step {
            Ok(step) => Ok(Some(step)),
            Err(error) => {
                let message = format!("no training step was measured: {error}");
                event(lease, heartbeat, EventLevel::Warn, "measure_step", &message, None).await?;
                Ok(None)
            }
        }
    }
}
