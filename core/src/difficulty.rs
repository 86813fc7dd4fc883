//! Difficulty profiles (Verity extension): what k base completions per prompt of a subset of a
//! training file say before a GRPO job is launched. The pass-rate histogram, the predicted
//! fraction of zero-advantage groups at the job's group size, the rows the base always or never
//! solves (and the filtered file without them), and the cost and time estimate from the
//! profile's measured sampling and grading throughput and one measured training step. Pure
//! arithmetic shared by the worker (which computes the report) and the server (which filters).

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Prompts profiled by default.
pub const DEFAULT_PROMPTS: usize = 32;

/// Most prompts one profile may sample.
pub const MAX_PROMPTS: usize = 4096;

/// The non-blank lines of a JSONL text as `(1-based line number, line)`: row `i` of a dataset
/// is the `i`-th of them (blank lines hold no record).
pub fn file_rows(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| (i + 1, l))
}

/// The rows profiled out of `total`: every row when `prompts ≥ total`, else `prompts` rows
/// evenly spaced over the file (row `⌊i · total / prompts⌋`), so a file sorted by difficulty
/// is still sampled across its range.
pub fn profiled_rows(total: usize, prompts: usize) -> Vec<usize> {
    if prompts >= total {
        return (0..total).collect();
    }
    (0..prompts).map(|i| i * total / prompts).collect()
}

/// Probability that `group_size` rewards drawn (with replacement) from a prompt's measured
/// rewards are all equal, i.e. that its GRPO group has zero advantage: `Σ_v (c_v / k)^G` over
/// the distinct reward values `v` (counted `c_v` times among the `k` samples). For binary
/// rewards with pass rate `p` this is `p^G + (1 − p)^G`. A prompt without samples counts 1.
pub fn zero_advantage_probability(rewards: &[f64], group_size: usize) -> f64 {
    if rewards.is_empty() {
        return 1.0;
    }
    let mut sorted = rewards.to_vec();
    sorted.sort_by(f64::total_cmp);
    let k = sorted.len() as f64;
    sorted
        .chunk_by(|a, b| a == b)
        .map(|run| (run.len() as f64 / k).powi(group_size.min(i32::MAX as usize) as i32))
        .sum()
}

/// One profiled prompt's graded samples, as the worker measured them.
#[derive(Debug, Clone, PartialEq)]
pub struct RowOutcome {
    /// Row index in the file (0-based, blank lines not counted).
    pub row: usize,
    /// Its 1-based line in the file.
    pub line: usize,
    /// The rewards of its samples as the trainer would see them (a failed grading takes the
    /// mean of the successful ones).
    pub rewards: Vec<f64>,
    /// Samples that passed (scored at the success threshold, grading not failed).
    pub passing: usize,
}

/// One profiled prompt in the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowProfile {
    /// Row index in the file (0-based).
    pub row: usize,
    /// 1-based line in the file.
    pub line: usize,
    /// Samples graded.
    pub samples: usize,
    /// Samples that passed.
    pub passing: usize,
    /// `passing / samples`.
    pub pass_rate: f64,
    /// Whether every sample's reward was the same (a zero-advantage group at group size k).
    pub all_equal: bool,
    /// Probability of a zero-advantage group at the job's group size.
    pub zero_advantage_probability: f64,
}

impl RowProfile {
    /// Whether every sample passed.
    pub fn always_solved(&self) -> bool {
        self.samples > 0 && self.passing == self.samples
    }

    /// Whether no sample passed.
    pub fn never_solved(&self) -> bool {
        self.passing == 0
    }
}

/// Prompts with `passing` passing samples of `samples_per_prompt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistogramBin {
    /// Passing samples.
    pub passing: usize,
    /// `passing / samples_per_prompt`.
    pub pass_rate: f64,
    /// Prompts in the bin.
    pub prompts: usize,
}

/// The difficulty part of a profile: per-row pass rates, their histogram and the predicted
/// zero-advantage fraction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difficulty {
    /// Prompts profiled.
    pub prompts: usize,
    /// Samples per prompt (k).
    pub samples_per_prompt: usize,
    /// The job's group size (G) the prediction is for.
    pub group_size: usize,
    /// Whether every reward was 0 or 1 (then the prediction is `mean(p^G + (1 − p)^G)`).
    pub binary_rewards: bool,
    /// Mean pass rate over the profiled prompts.
    pub mean_pass_rate: f64,
    /// Prompts every sample solved.
    pub always_solved: usize,
    /// Prompts no sample solved.
    pub never_solved: usize,
    /// One bin per passing count 0..=k.
    pub histogram: Vec<HistogramBin>,
    /// Predicted fraction of the job's groups with zero advantage: the mean over profiled
    /// prompts of [`zero_advantage_probability`] at the job's group size.
    pub predicted_zero_advantage_fraction: f64,
    /// The same prediction over the prompts a filtered file keeps (neither always nor never
    /// solved); `None` when the filter would keep none.
    pub predicted_zero_advantage_fraction_after_filter: Option<f64>,
    /// Fraction of profiled prompts whose k samples all had the same reward (zero-advantage
    /// groups measured at group size k).
    pub measured_zero_advantage_fraction: f64,
    /// Every profiled prompt, in file order.
    pub rows: Vec<RowProfile>,
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

impl Difficulty {
    /// The difficulty of `outcomes` (k samples each) for a job of `group_size`.
    pub fn of(outcomes: &[RowOutcome], samples_per_prompt: usize, group_size: usize) -> Self {
        let rows: Vec<RowProfile> = outcomes
            .iter()
            .map(|o| {
                let samples = o.rewards.len();
                RowProfile {
                    row: o.row,
                    line: o.line,
                    samples,
                    passing: o.passing,
                    pass_rate: if samples > 0 { o.passing as f64 / samples as f64 } else { 0.0 },
                    all_equal: o.rewards.windows(2).all(|w| w[0] == w[1]),
                    zero_advantage_probability: zero_advantage_probability(&o.rewards, group_size),
                }
            })
            .collect();
        let histogram = (0..=samples_per_prompt)
            .map(|passing| HistogramBin {
                passing,
                pass_rate: passing as f64 / samples_per_prompt.max(1) as f64,
                prompts: rows.iter().filter(|r| r.passing == passing).count(),
            })
            .collect();
        let kept = rows.iter().filter(|r| !r.always_solved() && !r.never_solved());
        Difficulty {
            prompts: rows.len(),
            samples_per_prompt,
            group_size,
            binary_rewards: outcomes.iter().flat_map(|o| &o.rewards).all(|&r| r == 0.0 || r == 1.0),
            mean_pass_rate: mean(rows.iter().map(|r| r.pass_rate)).unwrap_or(0.0),
            always_solved: rows.iter().filter(|r| r.always_solved()).count(),
            never_solved: rows.iter().filter(|r| r.never_solved()).count(),
            histogram,
            predicted_zero_advantage_fraction: mean(
                rows.iter().map(|r| r.zero_advantage_probability),
            )
            .unwrap_or(0.0),
            predicted_zero_advantage_fraction_after_filter: mean(
                kept.map(|r| r.zero_advantage_probability),
            ),
            measured_zero_advantage_fraction: mean(rows.iter().map(|r| {
                if r.all_equal {
                    1.0
                } else {
                    0.0
                }
            }))
            .unwrap_or(0.0),
            rows,
        }
    }

    /// The rows a filtered file drops: those always solved (`drop_always_solved`) and those
    /// never solved (`drop_never_solved`). Rows not profiled are never dropped.
    pub fn dropped_rows(
        &self,
        drop_always_solved: bool,
        drop_never_solved: bool,
    ) -> BTreeSet<usize> {
        self.rows
            .iter()
            .filter(|r| {
                (drop_always_solved && r.always_solved()) || (drop_never_solved && r.never_solved())
            })
            .map(|r| r.row)
            .collect()
    }
}

/// `text` without the rows in `dropped`: every other non-blank line, unchanged and in order,
/// one per line. Returns the text and the rows kept.
pub fn filter_jsonl(text: &str, dropped: &BTreeSet<usize>) -> (String, usize) {
    let mut out = String::with_capacity(text.len());
    let mut kept = 0;
    for (row, (_, line)) in file_rows(text).enumerate() {
        if !dropped.contains(&row) {
            out.push_str(line);
            out.push('\n');
            kept += 1;
        }
    }
    (out, kept)
}

/// The name of the filtered copy of file `filename`: `<stem>.filtered.jsonl`.
pub fn filtered_filename(filename: &str) -> String {
    let stem = filename.strip_suffix(".jsonl").unwrap_or(filename);
    format!("{stem}.filtered.jsonl")
}

/// The profile's measured sampling and grading throughput (on the base model, in rollout
/// calls of up to 64 sequences).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// Completions sampled.
    pub completions: usize,
    /// Completion tokens generated.
    pub completion_tokens: usize,
    /// Mean prompt length of the profiled prompts, in tokens.
    pub mean_prompt_tokens: f64,
    /// Seconds spent sampling.
    pub sampling_seconds: f64,
    /// Seconds spent grading.
    pub grading_seconds: f64,
}

impl Throughput {
    /// Generated tokens per second of sampling.
    pub fn tokens_per_second(&self) -> f64 {
        if self.sampling_seconds > 0.0 {
            self.completion_tokens as f64 / self.sampling_seconds
        } else {
            0.0
        }
    }

    /// Mean completion length in tokens.
    pub fn mean_completion_tokens(&self) -> f64 {
        self.completion_tokens as f64 / self.completions.max(1) as f64
    }

    /// Grading seconds per completion.
    pub fn grading_seconds_per_completion(&self) -> f64 {
        self.grading_seconds / self.completions.max(1) as f64
    }
}

/// One GRPO step of the job measured in the worker (the job's hyperparameters on profiled
/// prompts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredStep {
    /// Wall seconds of the whole step.
    pub seconds: f64,
    /// Seconds sampling.
    pub sampling_seconds: f64,
    /// Seconds grading.
    pub grading_seconds: f64,
    /// Seconds of the forward and backward passes and the optimizer.
    pub training_seconds: f64,
    /// Prompt plus completion tokens trained on.
    pub trained_tokens: u64,
}

/// The job shape an estimate is for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobShape {
    /// Steps the job takes (`max_steps`, else `n_epochs × ⌈rows / batch_size⌉`).
    pub steps: u64,
    /// Prompts per step (B).
    pub batch_size: usize,
    /// Completions per prompt (G).
    pub group_size: usize,
    /// Longest completion.
    pub max_completion_tokens: usize,
    /// Dynamic sampling (DAPO), with its cap on groups drawn per step.
    pub dynamic_sampling: Option<usize>,
}

impl JobShape {
    /// Steps of a job over `rows` training rows: `max_steps`, else `n_epochs × ⌈rows / B⌉`, at
    /// least 1 (as the trainer counts them).
    pub fn steps(rows: usize, batch_size: usize, n_epochs: usize, max_steps: Option<usize>) -> u64 {
        let per_epoch = rows.div_ceil(batch_size.max(1)) as u64;
        max_steps.map(|s| s as u64).unwrap_or(per_epoch * n_epochs as u64).max(1)
    }
}

/// A cost and time estimate of the job (see `docs/training.md`, "Difficulty profile").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostEstimate {
    /// Steps.
    pub steps: u64,
    /// Groups sampled per step: B, or with dynamic sampling `min(cap, B / (1 − z))`.
    pub groups_per_step: f64,
    /// Completion tokens generated per step: groups × G × mean completion length.
    pub completion_tokens_per_step: f64,
    /// Tokens trained per step: B × G × (mean prompt + mean completion length).
    pub trained_tokens_per_step: f64,
    /// Sampling seconds per step: completion tokens / measured tokens per second.
    pub sampling_seconds_per_step: f64,
    /// Grading seconds per step: groups × G × measured grading seconds per completion.
    pub grading_seconds_per_step: f64,
    /// Training seconds per step: trained tokens × the measured step's training seconds per
    /// trained token (`None` without a measured step).
    pub training_seconds_per_step: Option<f64>,
    /// Sum of the three.
    pub seconds_per_step: f64,
    /// `steps × seconds_per_step`.
    pub total_seconds: f64,
    /// `steps × completion_tokens_per_step`.
    pub total_completion_tokens: f64,
    /// `steps × trained_tokens_per_step`.
    pub total_trained_tokens: f64,
    /// What the estimate leaves out.
    pub caveats: Vec<String>,
}

impl CostEstimate {
    /// The estimate for `shape` from the profile's `throughput`, the measured step (if any)
    /// and the predicted zero-advantage fraction `zero_advantage` (dynamic sampling only).
    pub fn of(
        shape: &JobShape,
        throughput: &Throughput,
        measured: Option<&MeasuredStep>,
        zero_advantage: f64,
    ) -> CostEstimate {
        let batch = shape.batch_size as f64;
        let group = shape.group_size as f64;
        let groups_per_step = match shape.dynamic_sampling {
            None => batch,
            Some(cap) if zero_advantage >= 1.0 => cap as f64,
            Some(cap) => (batch / (1.0 - zero_advantage)).min(cap as f64),
        };
        let completion_len = throughput.mean_completion_tokens();
        let completion_tokens_per_step = groups_per_step * group * completion_len;
        let trained_tokens_per_step =
            batch * group * (throughput.mean_prompt_tokens + completion_len);
        let tokens_per_second = throughput.tokens_per_second();
        let sampling_seconds_per_step = if tokens_per_second > 0.0 {
            completion_tokens_per_step / tokens_per_second
        } else {
            0.0
        };
        let grading_seconds_per_step =
            groups_per_step * group * throughput.grading_seconds_per_completion();
        let training_seconds_per_step = measured.map(|m| {
            if m.trained_tokens > 0 {
                trained_tokens_per_step * m.training_seconds / m.trained_tokens as f64
            } else {
                m.training_seconds
            }
        });
        let seconds_per_step = sampling_seconds_per_step
            + grading_seconds_per_step
            + training_seconds_per_step.unwrap_or(0.0);
        let steps = shape.steps as f64;
        let mut caveats = vec![
            "excludes loading the model, validation evaluations and checkpoint saving".to_string(),
            format!(
                "completion length measured on the base model ({completion_len:.0} tokens on \
                 average, at most {}); it changes as training proceeds",
                shape.max_completion_tokens
            ),
            "sampling throughput measured in rollout calls of up to 64 sequences; a step \
             samples B × G sequences at once"
                .to_string(),
        ];
        if measured.is_none() {
            caveats.push("no training step was measured: training time is not included".into());
        }
        CostEstimate {
            steps: shape.steps,
            groups_per_step,
            completion_tokens_per_step,
            trained_tokens_per_step,
            sampling_seconds_per_step,
            grading_seconds_per_step,
            training_seconds_per_step,
            seconds_per_step,
            total_seconds: steps * seconds_per_step,
            total_completion_tokens: steps * completion_tokens_per_step,
            total_trained_tokens: steps * trained_tokens_per_step,
            caveats,
        }
    }
}

/// A difficulty profile's results (`jobs.result` of a `difficulty_profile` run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileReport {
    /// Pass rates, histogram and zero-advantage prediction.
    #[serde(flatten)]
    pub difficulty: Difficulty,
    /// Rows in the training file.
    pub file_rows: usize,
    /// The profile's sampling and grading throughput.
    pub throughput: Throughput,
    /// The measured training step, when one was run.
    pub measured_step: Option<MeasuredStep>,
    /// The job's estimated cost and time.
    pub estimate: CostEstimate,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(row: usize, passing: usize, k: usize) -> RowOutcome {
        let rewards = (0..k).map(|i| if i < passing { 1.0 } else { 0.0 }).collect();
        RowOutcome { row, line: row + 1, rewards, passing }
    }

    #[test]
    fn the_histogram_and_zero_advantage_prediction_match_hand_computed_numbers() {
        // Pass rates 0, 1, 1/2, 1/4 at k = 4; G = 4:
        // 1, 1, 0.5⁴ + 0.5⁴ = 0.125, 0.25⁴ + 0.75⁴ = 0.3203125 → mean 0.611328125.
        let rows = [outcome(0, 0, 4), outcome(1, 4, 4), outcome(2, 2, 4), outcome(3, 1, 4)];
        let d = Difficulty::of(&rows, 4, 4);
        let counts: Vec<usize> = d.histogram.iter().map(|b| b.prompts).collect();
        assert_eq!(counts, vec![1, 1, 1, 0, 1]);
        assert_eq!(d.histogram[2].pass_rate, 0.5);
        assert!(d.binary_rewards);
        assert_eq!((d.always_solved, d.never_solved), (1, 1));
        assert!((d.predicted_zero_advantage_fraction - 0.611328125).abs() < 1e-12);
        let after = d.predicted_zero_advantage_fraction_after_filter.unwrap();
        assert!((after - 0.22265625).abs() < 1e-12, "(0.125 + 0.3203125) / 2");
        assert_eq!(d.measured_zero_advantage_fraction, 0.5);
        assert!((d.mean_pass_rate - 0.4375).abs() < 1e-12);
        // At G = 2: 1, 1, 0.5, 0.625 → 0.78125.
        assert!(
            (Difficulty::of(&rows, 4, 2).predicted_zero_advantage_fraction - 0.78125).abs() < 1e-12
        );
        assert_eq!(d.dropped_rows(true, true), BTreeSet::from([0, 1]));
        assert_eq!(d.dropped_rows(false, true), BTreeSet::from([0]));
        assert!(d.dropped_rows(false, false).is_empty());
    }

    #[test]
    fn non_binary_rewards_use_the_share_of_each_distinct_value() {
        // Rewards 0.5, 0.5, 1, 0 at G = 2: 0.5² + 0.25² + 0.25² = 0.375.
        let p = zero_advantage_probability(&[0.5, 1.0, 0.5, 0.0], 2);
        assert!((p - 0.375).abs() < 1e-12);
        assert_eq!(zero_advantage_probability(&[0.3; 5], 8), 1.0);
        assert_eq!(zero_advantage_probability(&[], 8), 1.0);
        let row = RowOutcome { row: 0, line: 1, rewards: vec![0.5, 1.0, 0.5, 0.0], passing: 1 };
        let d = Difficulty::of(&[row], 4, 2);
        assert!(!d.binary_rewards);
        assert_eq!(d.measured_zero_advantage_fraction, 0.0);
    }

    #[test]
    fn filtering_keeps_the_other_rows_unchanged_and_in_order() {
        let text = "{\"a\":0}\n\n{\"a\":1}\r\n{\"a\":2}\n  \n{\"a\":3}";
        let rows: Vec<(usize, &str)> = file_rows(text).collect();
        assert_eq!(rows[1], (3, "{\"a\":1}"));
        assert_eq!(rows[3], (6, "{\"a\":3}"));
        let (out, kept) = filter_jsonl(text, &BTreeSet::from([0, 2]));
        assert_eq!(out, "{\"a\":1}\n{\"a\":3}\n");
        assert_eq!(kept, 2);
        assert_eq!(filtered_filename("math.jsonl"), "math.filtered.jsonl");
        assert_eq!(filtered_filename("data"), "data.filtered.jsonl");
        assert_eq!(profiled_rows(10, 4), vec![0, 2, 5, 7]);
        assert_eq!(profiled_rows(3, 8), vec![0, 1, 2]);
    }

    #[test]
    fn the_estimate_multiplies_measured_rates_by_the_job_shape() {
        let throughput = Throughput {
            completions: 100,
            completion_tokens: 5_000,
            mean_prompt_tokens: 30.0,
            sampling_seconds: 10.0,
            grading_seconds: 2.0,
        };
        let measured = MeasuredStep {
            seconds: 9.0,
            sampling_seconds: 4.0,
            grading_seconds: 1.0,
            training_seconds: 4.0,
            trained_tokens: 2_000,
        };
        let shape = JobShape {
            steps: JobShape::steps(100, 4, 2, None),
            batch_size: 4,
            group_size: 8,
            max_completion_tokens: 256,
            dynamic_sampling: None,
        };
        assert_eq!(shape.steps, 50);
        let e = CostEstimate::of(&shape, &throughput, Some(&measured), 0.5);
        // 4 × 8 × 50 tokens = 1600 at 500 tok/s = 3.2 s; grading 32 × 0.02 = 0.64 s;
        // training 32 × 80 = 2560 tokens × 4 s / 2000 = 5.12 s.
        assert_eq!(e.completion_tokens_per_step, 1600.0);
        assert!((e.sampling_seconds_per_step - 3.2).abs() < 1e-9);
        assert!((e.grading_seconds_per_step - 0.64).abs() < 1e-9);
        assert!((e.training_seconds_per_step.unwrap() - 5.12).abs() < 1e-9);
        assert!((e.total_seconds - 50.0 * 8.96).abs() < 1e-6);
        assert_eq!(e.total_trained_tokens, 50.0 * 2560.0);
        // Dynamic sampling draws B / (1 − z) groups, at most the cap.
        let dynamic = JobShape { dynamic_sampling: Some(12), ..shape.clone() };
        assert_eq!(CostEstimate::of(&dynamic, &throughput, None, 0.5).groups_per_step, 8.0);
        assert_eq!(CostEstimate::of(&dynamic, &throughput, None, 0.9).groups_per_step, 12.0);
        assert_eq!(CostEstimate::of(&dynamic, &throughput, None, 1.0).groups_per_step, 12.0);
        assert!(CostEstimate::of(&shape, &throughput, None, 0.0)
            .training_seconds_per_step
            .is_none());
        assert_eq!(JobShape::steps(10, 4, 3, Some(7)), 7);
    }
}
