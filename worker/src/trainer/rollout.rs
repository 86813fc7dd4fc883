//! Rollouts: sample G completions for a set of prompts, then grade them on the grader pool.

use super::dataset::Example;
use super::error::{Result, TrainerError};
use super::phase::{tell, Phase, PhaseObserver};
use super::step::SampleRecord;
use crate::constrained::OutputConstraint;
use crate::episodes::tools::ToolHost;
use crate::episodes::{completion_sample, grader_sample, Episode, EpisodeRunner};
use crate::model::Transformer;
use crate::sampler::{
    sample_stream, sample_with_progress, Completion, FinishReason, SamplingParams,
};
use crate::tokenizer::ChatTokenizer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Instant;
use verity_core::environment::{Environment, HttpAllowList};
use verity_verifiers::{ErrorKind, GradeResult, Grader, GraderPool, Sample, SandboxConfig};

/// One prompt's sampled and graded completions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// Row index of the prompt in its dataset.
    pub example: usize,
    /// The completions, in sample order.
    pub completions: Vec<Completion>,
    /// Their decoded texts.
    pub texts: Vec<String>,
    /// Their gradings.
    pub grades: Vec<GradeResult>,
    /// The episodes behind the completions, when the job has a tool environment (else empty).
    pub episodes: Vec<Episode>,
}

impl Group {
    /// Grader scores (0 for failed gradings; see [`Group::grader_failed`]).
    pub fn scores(&self) -> Vec<f64> {
        self.grades.iter().map(|g| g.score).collect()
    }

    /// The turn-by-turn record of completion `j`'s episode (tool jobs only).
    pub fn episode_record(
        &self,
        tokenizer: &ChatTokenizer,
        j: usize,
    ) -> Option<crate::episodes::EpisodeRecord> {
        self.episodes.get(j).and_then(|e| crate::episodes::EpisodeRecord::of(tokenizer, e).ok())
    }

    /// The stored form of this group's completions (one `samples/step-{step}.jsonl` line each),
    /// numbered by the prompt's row (`idx` = row × n + sample) with the score as the reward and
    /// no advantage: what sampling runs and evaluations store; a training step renumbers them by
    /// position and sets the rewards and advantages it trained with.
    pub fn sample_records(
        &self,
        step: u64,
        examples: &[Example],
        grader_name: &str,
        tokenizer: &ChatTokenizer,
    ) -> Vec<SampleRecord> {
        let n = self.completions.len();
        let completions = self.completions.iter().zip(&self.texts).zip(&self.grades);
        completions
            .enumerate()
            .map(|(j, ((c, text), grade))| SampleRecord {
                step,
                idx: self.example * n + j,
                prompt_idx: self.example,
                row: Some(self.example),
                prompt: examples[self.example].prompt_text.clone(),
                completion: text.clone(),
                score: grade.score,
                per_grader: per_grader_scores(grade, grader_name),
                reason: grade.reason.clone(),
                grader_error: grade.error.as_ref().map(|e| e.message.clone()),
                reward: grade.score,
                advantage: 0.0,
                finish_reason: finish_reason_name(c.finish_reason).to_string(),
                tokens: c.token_ids.len(),
                reference: None,
                episode: self.episode_record(tokenizer, j),
            })
            .collect()
    }

    /// Per completion, which of its tokens the model sampled (`None` for plain completions,
    /// whose every token is the model's).
    pub fn model_masks(&self) -> Vec<Option<Vec<bool>>> {
        (0..self.completions.len())
            .map(|i| self.episodes.get(i).map(|e| e.model_mask.clone()))
            .collect()
    }

    /// Which gradings failed for infrastructure reasons.
    pub fn grader_failed(&self) -> Vec<bool> {
        self.grades.iter().map(GradeResult::is_error).collect()
    }

    /// Rewards for the advantage: failed gradings take the mean of the group's successful ones
    /// (so they get a zero advantage instead of being scored as wrong).
    pub fn rewards(&self) -> Vec<f64> {
        let ok: Vec<f64> = self.grades.iter().filter(|g| !g.is_error()).map(|g| g.score).collect();
        let fill = if ok.is_empty() { 0.0 } else { ok.iter().sum::<f64>() / ok.len() as f64 };
        self.grades.iter().map(|g| if g.is_error() { fill } else { g.score }).collect()
    }
}

/// The stored form of graded `groups` over `examples` ([`Group::sample_records`], group after
/// group): what a sampling run or an evaluation stores.
pub fn sample_records(
    step: u64,
    groups: &[Group],
    examples: &[Example],
    grader_name: &str,
    tokenizer: &ChatTokenizer,
) -> Vec<SampleRecord> {
    let records = groups.iter().map(|g| g.sample_records(step, examples, grader_name, tokenizer));
    records.flatten().collect()
}

/// Time spent in one rollout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RolloutTimes {
    /// Seconds sampling.
    pub sampling: f64,
    /// Seconds grading.
    pub grading: f64,
    /// Completion tokens generated.
    pub tokens: usize,
}

impl RolloutTimes {
    /// Adds another rollout's times.
    pub fn add(&mut self, other: RolloutTimes) {
        self.sampling += other.sampling;
        self.grading += other.grading;
        self.tokens += other.tokens;
    }
}

/// Everything a rollout needs besides the prompts.
pub struct Rollout<'a> {
    /// The policy.
    pub model: &'a Transformer,
    /// Its tokenizer.
    pub tokenizer: &'a ChatTokenizer,
    /// The grader.
    pub grader: &'a Grader,
    /// Parallel grading.
    pub pool: &'a GraderPool,
    /// Told when sampling and then grading begin.
    pub phases: Option<&'a PhaseObserver>,
    /// The tool environment: rollouts are multi-turn episodes when set.
    pub environment: Option<&'a Environment>,
    /// Told how many prompts are fully sampled each time that number grows.
    pub sampled: Option<&'a (dyn Fn(usize) + Sync)>,
    /// The grammar every completion follows (a JSON `response_format`), if any.
    pub constraint: Option<&'a OutputConstraint>,
}

impl Rollout<'_> {
    /// `params` with the rollout's output grammar, if it has one.
    fn constrained(&self, params: &SamplingParams) -> SamplingParams {
        SamplingParams { constraint: self.constraint.cloned(), ..params.clone() }
    }

    /// Samples `params.n` plain completions (no tools) of each of `prompts`, prompt-major.
    pub fn sample_prompts(
        &self,
        prompts: &[Vec<u32>],
        params: &SamplingParams,
    ) -> Result<Vec<Completion>> {
        let mut completions = sample_with_progress(
            self.model,
            prompts,
            &self.constrained(params),
            (&self.tokenizer.eos_token_ids, self.tokenizer.pad_id()),
            Some(self.tokenizer),
            self.sampled.unwrap_or(&|_| {}),
        )?;
        completions.sort_by_key(|c| (c.prompt_index, c.sample_index));
        Ok(completions)
    }

    /// Samples `params.n` completions for each of `examples` (row indices into `rows`) and
    /// grades them.
    pub fn run(
        &self,
        rows: &[Example],
        examples: &[usize],
        params: &SamplingParams,
    ) -> Result<(Vec<Group>, RolloutTimes)> {
        tell(self.phases, Phase::Sampling);
        let started = Instant::now();
        let prompts: Vec<Vec<u32>> = examples.iter().map(|&i| rows[i].prompt_ids.clone()).collect();
        let (completions, episodes) = match self.environment {
            None => (self.sample_prompts(&prompts, params)?, Vec::new()),
            Some(environment) => {
                let sandbox = SandboxConfig::default();
                let http_allow = HttpAllowList::from_env();
                let runner = EpisodeRunner {
                    model: self.model,
                    tokenizer: self.tokenizer,
                    environment,
                    host: ToolHost { sandbox: &sandbox, http_allow: &http_allow },
                };
                // prompt-major, as the groups below take them
                let episodes = runner.run(&prompts, params)?;
                (episodes.iter().map(Episode::completion).collect::<Vec<_>>(), episodes)
            }
        };
        let sampling = started.elapsed().as_secs_f64();
        let tokens = completions.iter().map(|c| c.token_ids.len()).sum();
        let (groups, grading) = self.grade(rows, examples, params.n, completions, episodes)?;
        Ok((groups, RolloutTimes { sampling, grading, tokens }))
    }

    /// Samples and grades plain completions (no tool environment) of a stream of examples with
    /// continuous batching: it starts with `first` (row indices into `rows`); each group is
    /// graded as soon as its `params.n` samples have ended and handed to `next`, whose returned
    /// examples are sampled next, joining the rows still decoding. Sampling seconds exclude the
    /// grading done in between.
    pub fn run_stream(
        &self,
        rows: &[Example],
        first: &[usize],
        params: &SamplingParams,
        next: &mut (dyn FnMut(Group) -> Result<Vec<usize>> + Send),
    ) -> Result<RolloutTimes> {
        if self.environment.is_some() {
            return Err(TrainerError::Config("tool episodes are not sampled as a stream".into()));
        }
        tell(self.phases, Phase::Sampling);
        let started = Instant::now();
        let prompt_of = |i: &usize| rows[*i].prompt_ids.clone();
        let mut examples = first.to_vec();
        let mut times = RolloutTimes::default();
        sample_stream(
            self.model,
            first.iter().map(prompt_of).collect(),
            &self.constrained(params),
            (&self.tokenizer.eos_token_ids, self.tokenizer.pad_id()),
            (Some(self.tokenizer), self.sampled),
            &mut |index, mut completions| -> Result<Vec<Vec<u32>>> {
                times.tokens += completions.iter().map(|c| c.token_ids.len()).sum::<usize>();
                // `grade` names the example by `prompt_index` into the slice it is given.
                completions.iter_mut().for_each(|c| c.prompt_index = 0);
                let example = [examples[index]];
                let (groups, grading) =
                    self.grade(rows, &example, params.n, completions, vec![])?;
                times.grading += grading;
                tell(self.phases, Phase::Sampling);
                let mut added = Vec::new();
                for mut group in groups {
                    group.completions.iter_mut().for_each(|c| c.prompt_index = index);
                    added.extend(next(group)?);
                }
                examples.extend(&added);
                Ok(added.iter().map(prompt_of).collect())
            },
        )?;
        times.sampling = started.elapsed().as_secs_f64() - times.grading;
        Ok(times)
    }

    /// Grades sampled completions into groups: `n` per example, prompt-major, each naming its
    /// example by `prompt_index` into `examples` (episodes, if any, in the same order). Returns
    /// the groups and the seconds grading took.
    pub fn grade(
        &self,
        rows: &[Example],
        examples: &[usize],
        n: usize,
        completions: Vec<Completion>,
        episodes: Vec<Episode>,
    ) -> Result<(Vec<Group>, f64)> {
        let texts = completions
            .iter()
            .map(|c| self.tokenizer.decode(&c.token_ids, true))
            .collect::<crate::error::Result<Vec<String>>>()?;
        tell(self.phases, Phase::Grading);
        let started = Instant::now();
        let batch: Vec<(serde_json::Value, Sample)> = completions
            .iter()
            .zip(&texts)
            .enumerate()
            .map(|(i, (c, text))| {
                let item = &rows[examples[c.prompt_index]].item;
                let sample = match episodes.get(i) {
                    Some(episode) => grader_sample(self.tokenizer, episode)?,
                    None => completion_sample(text, item),
                };
                Ok((item.clone(), sample))
            })
            .collect::<crate::error::Result<_>>()?;
        let grades = self.pool.grade_batch_blocking(self.grader, &batch);
        // a judge outage stops the step: its samples are not scored as wrong
        if let Some(outage) = grades
            .iter()
            .find_map(|g| g.error.as_ref().filter(|e| e.kind == ErrorKind::JudgeUnavailable))
        {
            return Err(TrainerError::JudgeUnavailable(outage.message.clone()));
        }
        let mut grades = grades.into_iter();
        let grading = started.elapsed().as_secs_f64();
        let mut texts = texts.into_iter();
        let mut completions = completions.into_iter();
        let mut episodes = episodes.into_iter();
        let groups = examples
            .iter()
            .map(|&example| {
                let completions: Vec<Completion> = completions.by_ref().take(n).collect();
                Group {
                    example,
                    texts: texts.by_ref().take(n).collect(),
                    grades: grades.by_ref().take(n).collect(),
                    episodes: episodes.by_ref().take(n).collect(),
                    completions,
                }
            })
            .collect();
        Ok((groups, grading))
    }
}

/// Per-grader scores of a grading: its sub-scores, or the total under `name` when it has none.
pub fn per_grader_scores(grade: &GradeResult, name: &str) -> BTreeMap<String, f64> {
    if grade.sub_scores.is_empty() {
        BTreeMap::from([(name.to_string(), grade.score)])
    } else {
        grade.sub_scores.clone()
    }
}

/// `stop` / `length` as the API shows it.
pub fn finish_reason_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}
