//! Sampling runs under their lease: an evaluation samples and grades each model in turn (one
//! metrics row, samples file and `eval` event per model, step = the model's index, so a retried
//! attempt resumes after the last finished model); a rejection-sampling run samples its model,
//! keeps what the policy selects, and registers the kept samples as a new supervised file; a
//! difficulty profile runs in `super::profile` on the helpers here.

use super::cancellable::blocking_until_cancelled;
use super::handler::TrainingHandler;
use super::stop::{event, lease_error, persist, retryable, trainer_error, user_error, Stop};
use crate::constrained::OutputConstraint;
use crate::loader::LoadedModel;
use crate::runs::{prompt_chunks, sample_and_grade, sample_records, select, supervised_jsonl};
use crate::sampler::SamplingParams;
use crate::trainer::eval::summarize_groups;
use crate::trainer::rollout::{Group, Rollout, RolloutTimes};
use crate::trainer::{mix_seed, Dataset};
use bytes::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;
use verity_core::queue::{
    is_transient_db_error, EventLevel, Heartbeat, HeartbeatState, JobOutcome, Lease, QueueError,
    ResultsFile,
};
use verity_core::sampling_runs::{
    EvaluationReport, ModelResult, RejectionSamplingSpec, RunModel, RunSpec,
};
use verity_core::storage::StorageError;
use verity_core::ControlSignal;
use verity_verifiers::Grader;

/// `purpose` of the files rejection sampling writes (they train supervised jobs).
pub const SUPERVISED_PURPOSE: &str = "fine-tune";

/// One model's sampled and graded dataset.
struct Sampled {
    groups: Vec<Group>,
    dataset: Dataset,
}

/// Stops with the outcome a heartbeat asks for, if any (a pause is not offered for runs and is
/// treated as a cancel).
pub(super) fn interrupted(heartbeat: &Heartbeat) -> Option<JobOutcome> {
    match heartbeat.state() {
        HeartbeatState::Lost => Some(JobOutcome::LeaseLost),
        HeartbeatState::Held(ControlSignal::Cancel | ControlSignal::Pause) => {
            Some(JobOutcome::Cancelled)
        }
        HeartbeatState::Held(ControlSignal::Continue) => None,
    }
}

impl TrainingHandler {
    /// Runs a claimed sampling run.
    pub(super) async fn sampling_run(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: Result<RunSpec, serde_json::Error>,
    ) -> Result<JobOutcome, Stop> {
        let spec = spec.map_err(|e| user_error(format!("invalid run: {e}")))?;
        let job = lease.job();
        let file = job.training_file.clone().ok_or_else(|| user_error("the run has no file"))?;
        let text = Arc::new(self.read_file(&file, heartbeat).await?);
        let grader = self.prepare_grader(lease, heartbeat, spec.grader()).await?;
        if let RunSpec::DifficultyProfile(profile) = &spec {
            let ctx = RunContext { lease, heartbeat, spec: &spec, grader: &grader, text: &text };
            return self.difficulty_profile(&ctx, profile).await;
        }
        let pool = lease.queue().pool();
        let read = || verity_core::jobs::metrics_rows(pool, &job.id);
        let done = persist("reading the results", heartbeat, is_transient_db_error, read)
            .await
            .map_err(|e| retryable("reading the results", e))?;
        let models = spec.models();
        let data = json!({"kind": spec.kind().as_str(), "models": models.len()});
        event(lease, heartbeat, EventLevel::Info, "started", "sampling started", Some(&data))
            .await?;
        let mut last = None;
        for (index, model) in models.iter().enumerate() {
            // An evaluation resumes after its finished models; rejection sampling needs the
            // texts again, so it samples anew (the same seed gives the same samples).
            let resumable = matches!(spec, RunSpec::Evaluation(_));
            if resumable && done.iter().any(|(step, _)| *step == index as i32) {
                continue;
            }
            if let Some(outcome) = interrupted(heartbeat) {
                return Ok(outcome);
            }
            let ctx = RunContext { lease, heartbeat, spec: &spec, grader: &grader, text: &text };
            let Some(sampled) = self.sample_model(&ctx, index, model).await? else {
                return Ok(interrupted(heartbeat).unwrap_or(JobOutcome::LeaseLost));
            };
            last = Some(sampled);
        }
        match &spec {
            RunSpec::Evaluation(_) => {
                let read = || verity_core::jobs::metrics_rows(pool, &job.id);
                let rows = persist("reading the results", heartbeat, is_transient_db_error, read)
                    .await
                    .map_err(|e| retryable("reading the results", e))?;
                let report = EvaluationReport::from_rows(&rows);
                let result =
                    serde_json::to_value(&report).map_err(|e| retryable("encoding results", e))?;
                for flag in &report.flags {
                    let data = serde_json::to_value(flag).unwrap_or(Value::Null);
                    event(
                        lease,
                        heartbeat,
                        EventLevel::Warn,
                        "narrowing",
                        &flag.message,
                        Some(&data),
                    )
                    .await?;
                }
                let message = format!("evaluated {} model(s)", report.models.len());
                event(lease, heartbeat, EventLevel::Info, "succeeded", &message, None).await?;
                Ok(JobOutcome::Succeeded { result, fine_tuned_model: None })
            }
            RunSpec::RejectionSampling(rs) => {
                let sampled = last.ok_or_else(|| user_error("nothing was sampled"))?;
                self.keep_samples(lease, heartbeat, rs, &sampled).await
            }
            RunSpec::DifficultyProfile(_) => Err(user_error("a difficulty profile runs apart")),
        }
    }

    /// Loads model `index` of the run, samples and grades the whole file with it, and writes
    /// its samples, metrics row and `eval` event; `None` when the run was interrupted.
    async fn sample_model(
        &self,
        ctx: &RunContext<'_>,
        index: usize,
        model: &RunModel,
    ) -> Result<Option<Sampled>, Stop> {
        let (lease, heartbeat, spec) = (ctx.lease, ctx.heartbeat, ctx.spec);
        let loaded = self.load_run_model(lease, heartbeat, &model.name).await?;
        let settings = spec.sampling();
        let n = spec.samples_per_prompt();
        // every model samples from the same streams, so their results are comparable
        let params = SamplingParams { n, seed: run_seed(lease), ..settings.into() };
        let (loaded, dataset) = parse_dataset(lease, loaded, ctx.text, settings.max_tokens).await?;
        let rows: Vec<usize> = (0..dataset.len()).collect();
        let models = spec.models().len();
        let progress = |done: usize, total: usize| json!({"model_index": index, "models": models, "prompts_done": done, "prompts": total});
        let Some((groups, _)) =
            self.sample_rows(ctx, (&loaded, &dataset), &rows, &params, progress).await?
        else {
            return Ok(None);
        };
        let summary = summarize_groups(&groups, n).map_err(trainer_error)?;
        let grader_name = ctx.grader.spec().name().unwrap_or(ctx.grader.spec().kind()).to_string();
        let records = sample_records(
            index as u64,
            &groups,
            &dataset.examples,
            &grader_name,
            &loaded.tokenizer,
        );
        let result = ModelResult {
            model: model.name.clone(),
            base: model.base.clone(),
            prompts: dataset.len(),
            samples_per_prompt: n,
            mean_reward: summary.mean_reward,
            pass_at_k: summary.pass_at_k,
            grader_errors: summary.grader_errors,
            completion_tokens: records.iter().map(|r| r.tokens).sum(),
        };
        let row = serde_json::to_value(&result).map_err(|e| retryable("encoding results", e))?;
        self.record_samples(lease, heartbeat, index as i32, &records, false).await?;
        let metric = || lease.metric(index as i32, &row);
        persist("writing results", heartbeat, QueueError::is_transient, metric)
            .await
            .map_err(|e| lease_error("writing results", e))?;
        let message = format!(
            "{}: mean reward {:.3}, pass@1 {:.3}",
            model.name,
            result.mean_reward,
            result.at(1).unwrap_or(0.0)
        );
        event(lease, heartbeat, EventLevel::Info, "eval", &message, Some(&row)).await?;
        let dataset = Arc::try_unwrap(dataset).unwrap_or_else(|shared| (*shared).clone());
        Ok(Some(Sampled { groups, dataset }))
    }

    /// Loads a run's model as a job starting from it would: a base, or a fine-tuned model or
    /// checkpoint with the folders below it merged in ([`crate::loader::load_stack`]).
    pub(super) async fn load_run_model(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        name: &str,
    ) -> Result<LoadedModel, Stop> {
        let stack = self.fetch_model(lease, heartbeat, name).await?;
        let device = self.config.device.clone();
        let model_name = name.to_string();
        tokio::task::spawn_blocking(move || stack.load(&device))
            .await
            .map_err(|e| retryable("loading the model", e))?
            .map_err(|e| user_error(format!("model {model_name:?} cannot be loaded: {e}")))
    }

    /// Samples and grades `rows` of `dataset` in rollout calls of bounded width, reporting
    /// `progress(done, total)` and checking the lease between calls; the groups in row order
    /// and the summed times, or `None` when the run was interrupted.
    pub(super) async fn sample_rows(
        &self,
        ctx: &RunContext<'_>,
        (loaded, dataset): (&Arc<LoadedModel>, &Arc<Dataset>),
        rows: &[usize],
        params: &SamplingParams,
        progress: impl Fn(usize, usize) -> Value,
    ) -> Result<Option<(Vec<Group>, RolloutTimes)>, Stop> {
        let mut groups = Vec::with_capacity(rows.len());
        let mut times = RolloutTimes::default();
        // OpenAI's structured outputs, enforced while sampling with this model's tokenizer
        let constraint = match &ctx.spec.sampling().response_format {
            Some(format) => {
                let vocab = loaded.model.config.vocab_size;
                OutputConstraint::compile(format, &loaded.tokenizer, vocab)
                    .map_err(|e| user_error(e.to_string()))?
            }
            None => None,
        };
        for chunk in prompt_chunks(rows.len(), params.n) {
            if interrupted(ctx.heartbeat).is_some() {
                return Ok(None);
            }
            let chunk: Vec<usize> = chunk.into_iter().map(|i| rows[i]).collect();
            let (m, d, g, pool, p, c) = (
                loaded.clone(),
                dataset.clone(),
                ctx.grader.clone(),
                self.graders.clone(),
                params.clone(),
                constraint.clone(),
            );
            let (out, t) = blocking_until_cancelled(ctx.heartbeat, "sampling", move || {
                let rollout = Rollout {
                    model: &m.model,
                    tokenizer: &m.tokenizer,
                    grader: &g,
                    pool: &pool,
                    phases: None,
                    environment: None,
                    sampled: None,
                    constraint: c.as_ref(),
                };
                sample_and_grade(&rollout, &d, &chunk, &p)
            })
            .await?
            .map_err(trainer_error)?;
            groups.extend(out);
            times.add(t);
            ctx.heartbeat.set_progress(progress(groups.len(), rows.len()));
        }
        Ok(Some((groups, times)))
    }

    /// Selects the kept completions, writes them as a supervised file, registers it, and ends
    /// the run with the per-prompt summary.
    async fn keep_samples(
        &self,
        lease: &Lease,
        heartbeat: &Heartbeat,
        spec: &RejectionSamplingSpec,
        sampled: &Sampled,
    ) -> Result<JobOutcome, Stop> {
        let job = lease.job();
        let selection = select(&sampled.groups, spec.policy, spec.min_score);
        let prompts = selection.prompts.len();
        let mean_pass_rate = if prompts > 0 {
            selection.prompts.iter().map(|p| p.pass_rate).sum::<f64>() / prompts as f64
        } else {
            0.0
        };
        let solved = selection.prompts.iter().filter(|p| p.passing > 0).count();
        let output_file = if selection.kept.is_empty() {
            let message = "no completion reached min_score: no file was written";
            event(lease, heartbeat, EventLevel::Warn, "nothing_kept", message, None).await?;
            None
        } else {
            let text = supervised_jsonl(&sampled.dataset, &selection.kept);
            let id = format!("file-{}", job.id);
            let file = ResultsFile {
                storage_key: verity_core::keys::dataset_file(&id),
                filename: format!("{}.jsonl", job.id),
                bytes: text.len() as i64,
                line_count: selection.kept.len() as i64,
                id,
            };
            let body = Bytes::from(text);
            let put = || self.store.put_bytes(&file.storage_key, body.clone());
            persist("writing the output file", heartbeat, StorageError::is_transient, put)
                .await
                .map_err(|e| retryable("writing the output file", e))?;
            let register = || lease.register_file(&file, SUPERVISED_PURPOSE);
            persist("registering the output file", heartbeat, QueueError::is_transient, register)
                .await
                .map_err(|e| lease_error("registering the output file", e))?;
            Some(file.id)
        };
        let result = json!({
            "output_file": output_file,
            "prompts": prompts,
            "samples": sampled.groups.iter().map(|g| g.grades.len()).sum::<usize>(),
            "kept": selection.kept.len(),
            "prompts_with_a_pass": solved,
            "mean_pass_rate": mean_pass_rate,
            "per_prompt": selection.prompts,
        });
        let message = format!(
            "kept {} completion(s) of {prompts} prompt(s) ({solved} with a passing one)",
            selection.kept.len()
        );
        event(lease, heartbeat, EventLevel::Info, "succeeded", &message, None).await?;
        Ok(JobOutcome::Succeeded { result, fine_tuned_model: None })
    }
}

/// What every model of a run shares.
pub(super) struct RunContext<'a> {
    pub(super) lease: &'a Lease,
    pub(super) heartbeat: &'a Heartbeat,
    pub(super) spec: &'a RunSpec,
    pub(super) grader: &'a Grader,
    pub(super) text: &'a Arc<String>,
}

/// The seed a run samples with (the same for every model of a run, so results compare).
pub(super) fn run_seed(lease: &Lease) -> u64 {
    mix_seed(lease.job().seed as u64, &[0xe7a1])
}

/// Parses the run's file for `loaded` (prompts leaving room for `max_tokens` of completion).
pub(super) async fn parse_dataset(
    lease: &Lease,
    loaded: LoadedModel,
    text: &Arc<String>,
    max_tokens: usize,
) -> Result<(Arc<LoadedModel>, Arc<Dataset>), Stop> {
    let text = text.clone();
    let file = lease.job().training_file.clone().unwrap_or_default();
    let parsed = tokio::task::spawn_blocking(move || {
        let context = loaded.model.config.max_position_embeddings;
        let dataset = Dataset::from_jsonl(
            &text,
            &format!("file {file}"),
            &loaded.tokenizer,
            context.saturating_sub(max_tokens),
        );
        (loaded, dataset)
    })
    .await
    .map_err(|e| retryable("reading the file", e))?;
    Ok((Arc::new(parsed.0), Arc::new(parsed.1.map_err(trainer_error)?)))
}
