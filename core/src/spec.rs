//! The job specification: method, grader and hyperparameters, with documented defaults and
//! validation that names the offending field.

use crate::sampling::{self, MAX_STOP_STRINGS, MAX_TEMPERATURE};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// A value that may be given as `"auto"` (OpenAI's convention): `None` means "use the default".
fn auto_or<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s == "auto" => Ok(None),
        Some(Value::String(s)) => {
            Err(serde::de::Error::custom(format!("expected a number or \"auto\", got {s:?}")))
        }
        Some(value) => serde_json::from_value(value.clone()).map(Some).map_err(|_| {
            serde::de::Error::custom(format!("expected a number or \"auto\", got {value}"))
        }),
    }
}

/// Precision of the weights the sampler reads during rollouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum RolloutDtype {
    /// The f32 parameters themselves (sampling log-probs match the trainer's to rounding).
    #[default]
    F32,
    /// bf16 copies of the projection and LM-head weights, refreshed every step: half the bytes
    /// per decoded token; the sampler/trainer mismatch is logged (`sampler_kl`) and `tis_cap`
    /// corrects for it.
    Bf16,
    /// int8 copies (symmetric, one scale per output channel), refreshed every step: a quarter
    /// of the f32 bytes per decoded token, and a larger sampler/trainer mismatch than bf16
    /// (logged as `sampler_kl`, corrected by `tis_cap`).
    Int8,
}

/// The policy-loss family: the one description of every loss, its spelling, its defaults and
/// its dashboard preset (the worker's loss configuration and the API's presets derive from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// Per-token clip, mean per response then over responses (DeepSeekMath).
    #[default]
    Grpo,
    /// Clip-higher, token-level mean (plus dynamic sampling / overlong shaping when enabled).
    Dapo,
    /// No std scaling, constant normaliser `N × max_completion_tokens` (Dr. GRPO).
    DrGrpo,
    /// Sequence-level length-normalised ratio and clip, token-level mean (GSPO).
    Gspo,
    /// Clipped stop-gradient importance weight times logp, token-level mean (CISPO).
    Cispo,
}

impl Loss {
    /// Every loss, in documentation order.
    pub const ALL: [Loss; 5] = [Loss::Grpo, Loss::Dapo, Loss::DrGrpo, Loss::Gspo, Loss::Cispo];

    /// The JSON spelling (`grpo`, `dapo`, `dr_grpo`, `gspo`, `cispo`).
    pub fn as_str(self) -> &'static str {
        match self {
            Loss::Grpo => "grpo",
            Loss::Dapo => "dapo",
            Loss::DrGrpo => "dr_grpo",
            Loss::Gspo => "gspo",
            Loss::Cispo => "cispo",
        }
    }

    /// The name people read (`GRPO`, `Dr. GRPO`, …).
    pub fn label(self) -> &'static str {
        match self {
            Loss::Grpo => "GRPO",
            Loss::Dapo => "DAPO",
            Loss::DrGrpo => "Dr. GRPO",
            Loss::Gspo => "GSPO",
            Loss::Cispo => "CISPO",
        }
    }

    /// Default clip range (ε_low, ε_high): (0.2, 0.2) for grpo and dr_grpo, (0.2, 0.28) for
    /// dapo, (3e-4, 4e-4) for gspo (paper values), (1.0, 0.28) for cispo (no lower bound on the
    /// importance weight).
    pub fn default_clip_range(self) -> (f64, f64) {
        match self {
            Loss::Grpo | Loss::DrGrpo => (0.2, 0.2),
            Loss::Dapo => (0.2, 0.28),
            Loss::Gspo => (3e-4, 4e-4),
            Loss::Cispo => (1.0, 0.28),
        }
    }

    /// Whether advantages are divided by the group std by default (false only for dr_grpo).
    pub fn default_scale_rewards(self) -> bool {
        self != Loss::DrGrpo
    }

    /// The hyperparameters the loss's preset sets: the loss, its defaults made explicit, no KL
    /// penalty, and dynamic sampling for DAPO.
    pub fn preset(self) -> LossPreset {
        let (epsilon_low, epsilon_high) = self.default_clip_range();
        LossPreset {
            loss: self,
            epsilon_low,
            epsilon_high,
            scale_rewards: self.default_scale_rewards(),
            dynamic_sampling: self == Loss::Dapo,
            beta: 0.0,
        }
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl std::str::FromStr for Loss {
    type Err = String;

    /// Parses the JSON spelling.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Loss::ALL.into_iter().find(|loss| loss.as_str() == s).ok_or_else(|| {
            format!("unknown loss {s:?}; expected one of grpo, dapo, dr_grpo, gspo, cispo")
        })
    }
}

/// The hyperparameters a loss preset sets, named as in [`Hyperparameters`] (so the object
/// merges into a job's `hyperparameters` as is).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossPreset {
    /// The loss.
    pub loss: Loss,
    /// Its default ε_low.
    pub epsilon_low: f64,
    /// Its default ε_high.
    pub epsilon_high: f64,
    /// Its default for dividing advantages by the group std.
    pub scale_rewards: bool,
    /// Over-sample for reward contrast (on for DAPO).
    pub dynamic_sampling: bool,
    /// KL coefficient (0: no reference model).
    pub beta: f64,
}

/// Learning-rate decay after warm-up (the `lr_schedule` hyperparameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LrDecay {
    /// Constant after warm-up.
    #[default]
    Constant,
    /// Cosine decay to zero at the last step.
    Cosine,
}

/// Low-rank adapters; when absent, all weights are trained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSpec {
    /// Adapter rank.
    pub rank: usize,
    /// Scaling numerator (scale = alpha / rank).
    pub alpha: f64,
    /// Dropout on the adapter input.
    pub dropout: f64,
    /// Projection names to adapt.
    pub targets: Vec<String>,
}

impl Default for LoraSpec {
    fn default() -> Self {
        LoraSpec {
            rank: 16,
            alpha: 32.0,
            dropout: 0.0,
            targets: ["q_proj", "k_proj", "v_proj", "o_proj"].map(String::from).to_vec(),
        }
    }
}

/// OpenAI's `reasoning_effort`: how long the model may think. Verity's models have no separate
/// reasoning mode, so the effort sets the completion-token budget (the default of
/// `max_completion_tokens`; an explicit `max_completion_tokens` wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    /// OpenAI's "the model's default": the same budget as `medium`.
    #[default]
    Default,
    /// 128 completion tokens.
    Low,
    /// 256 completion tokens.
    Medium,
    /// 1024 completion tokens.
    High,
}

impl ReasoningEffort {
    /// The completion-token budget this effort stands for.
    pub fn max_completion_tokens(self) -> usize {
        match self {
            ReasoningEffort::Low => 128,
            ReasoningEffort::Default | ReasoningEffort::Medium => 256,
            ReasoningEffort::High => 1024,
        }
    }

    /// The effort echoed in a resolved job: `default` resolves to `medium`.
    pub fn resolved(self) -> ReasoningEffort {
        match self {
            ReasoningEffort::Default => ReasoningEffort::Medium,
            other => other,
        }
    }
}

/// Completions per prompt at `compute_multiplier` 1 (the default of `group_size`).
const BASE_GROUP_SIZE: f64 = 8.0;
/// Largest `compute_multiplier`.
const MAX_COMPUTE_MULTIPLIER: f64 = 128.0;
/// Largest `max_staleness`: the asynchronous pipeline samples one step ahead.
pub const MAX_STALENESS: u32 = 1;
/// Longest stop string of a job, in bytes.
const MAX_STOP_LEN: usize = 64;

/// Training hyperparameters. Every field has a default; `"auto"` is accepted where OpenAI's
/// API accepts it and means the default. OpenAI's coarse knobs (`compute_multiplier`,
/// `reasoning_effort`) choose the defaults of Verity's precise ones (`group_size`,
/// `max_completion_tokens`); a precise knob given explicitly wins. [`Hyperparameters::resolved`]
/// fills every default in, and is what a job echoes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Hyperparameters {
    /// Prompts per step.
    #[serde(deserialize_with = "auto_or")]
    pub batch_size: Option<usize>,
    /// Completions sampled per prompt (default: 8 × `compute_multiplier`, at least 2).
    pub group_size: Option<usize>,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// OpenAI-style multiplier on the learning rate.
    #[serde(deserialize_with = "auto_or")]
    pub learning_rate_multiplier: Option<f64>,
    /// Passes over the training file (ignored when `max_steps` is set).
    #[serde(deserialize_with = "auto_or")]
    pub n_epochs: Option<usize>,
    /// Stop after this many steps.
    pub max_steps: Option<usize>,
    /// Longest completion, in tokens (default: the `reasoning_effort` budget, 256).
    pub max_completion_tokens: Option<usize>,
    /// OpenAI's multiplier on exploration compute: scales the rollouts per prompt (the default
    /// `group_size`). Default 1.
    #[serde(deserialize_with = "auto_or")]
    pub compute_multiplier: Option<f64>,
    /// OpenAI's reasoning effort: sets the completion-token budget (the default
    /// `max_completion_tokens`): low 128, medium (and default) 256, high 1024.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Sampling temperature, in (0, 2].
    pub temperature: f64,
    /// Nucleus sampling mass.
    pub top_p: f64,
    /// Top-k sampling (0 = off).
    pub top_k: usize,
    /// Precision of the weights rollouts read (`f32`, `bf16` or `int8`).
    pub rollout_dtype: RolloutDtype,
    /// Stop strings: a completion ends when its text contains one (kept in the completion).
    pub stop: Vec<String>,
    /// The policy loss.
    pub loss: Loss,
    /// Lower clip range ε_low (default depends on the loss).
    pub epsilon_low: Option<f64>,
    /// Upper clip range ε_high (default depends on the loss).
    pub epsilon_high: Option<f64>,
    /// KL coefficient to the reference model (0 = no reference model).
    pub beta: f64,
    /// Divide advantages by the group's std (default: true except for dr_grpo).
    pub scale_rewards: Option<bool>,
    /// Over-sample until every group in the batch has reward contrast (DAPO).
    pub dynamic_sampling: bool,
    /// Cap on groups drawn per step with dynamic sampling (default 3 × batch_size).
    pub max_groups_drawn: Option<usize>,
    /// Soft overlong penalty over the last N tokens before the limit (0 = off).
    pub overlong_buffer: usize,
    /// Size of the overlong penalty at the limit.
    pub overlong_penalty: f64,
    /// Exclude truncated completions from the loss.
    pub mask_truncated: bool,
    /// Optimisation passes (μ) over each batch of rollouts.
    pub inner_epochs: usize,
    /// Completions per forward/backward micro-batch.
    pub micro_batch_size: usize,
    /// Global gradient-norm clip (0 = off).
    pub max_grad_norm: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Linear warm-up steps.
    pub warmup_steps: usize,
    /// Schedule after warm-up.
    pub lr_schedule: LrDecay,
    /// Low-rank adapters; `null` trains all weights.
    pub lora: Option<LoraSpec>,
    /// Cap for the truncated importance correction of sampler/trainer mismatch (off when null).
    pub tis_cap: Option<f64>,
    /// Most sequences the rollout sampler decodes at once (continuous batching: waiting
    /// prompts are prefilled and join as rows finish). Default `batch_size × group_size`.
    pub max_batch_rows: Option<u32>,
    /// Asynchronous pipeline: how many optimizer steps older than the policy being trained its
    /// rollouts may be. 0 (default): on-policy, each step samples then trains. 1: the next
    /// step's rollouts are sampled from the current weights while this step trains (needs
    /// `tis_cap`, which corrects for the lag).
    pub max_staleness: u32,
    /// Partial rollouts (Verity extension): each step decodes at most this many new tokens of
    /// a completion; groups still decoding are carried to the next step, their tokens keeping
    /// the log-probs of the weights that sampled them (needs `tis_cap`), and the step trains on
    /// the groups that finished. Off (null) by default: every completion is decoded to its end.
    pub partial_rollout_tokens: Option<usize>,
    /// Evaluate on the validation file every N steps (0 = only at the end).
    #[serde(deserialize_with = "auto_or")]
    pub eval_interval: Option<usize>,
    /// Also evaluate before the first step (the baseline, an `eval` event for step 0; default
    /// on when the job has a validation file).
    pub eval_on_start: bool,
    /// Completions per validation prompt (pass@k for k ≤ this).
    #[serde(deserialize_with = "auto_or")]
    pub eval_samples: Option<usize>,
    /// Save a checkpoint every N steps (and always at the end).
    pub checkpoint_interval: usize,
    /// Seed for everything random (overrides the job's seed when set).
    pub seed: Option<u64>,
    /// Verity extension: warning kinds of the monitor ([`crate::monitor::WarningKind`]) that
    /// pause the job when they first fire (default none).
    pub auto_pause_on: Vec<String>,
}

impl Default for Hyperparameters {
    fn default() -> Self {
        Hyperparameters {
            batch_size: None,
            group_size: None,
            learning_rate: 1e-6,
            learning_rate_multiplier: None,
            n_epochs: None,
            max_steps: None,
            max_completion_tokens: None,
            compute_multiplier: None,
            reasoning_effort: None,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            rollout_dtype: RolloutDtype::F32,
            stop: Vec::new(),
            loss: Loss::Grpo,
            epsilon_low: None,
            epsilon_high: None,
            beta: 0.0,
            scale_rewards: None,
            dynamic_sampling: false,
            max_groups_drawn: None,
            overlong_buffer: 0,
            overlong_penalty: 1.0,
            mask_truncated: false,
            inner_epochs: 1,
            micro_batch_size: 8,
            max_grad_norm: 1.0,
            weight_decay: 0.0,
            warmup_steps: 0,
            lr_schedule: LrDecay::Constant,
            lora: None,
            tis_cap: None,
            max_batch_rows: None,
            max_staleness: 0,
            partial_rollout_tokens: None,
            eval_interval: None,
            eval_on_start: true,
            eval_samples: None,
            checkpoint_interval: 10,
            seed: None,
            auto_pause_on: Vec::new(),
        }
    }
}

/// A hyperparameter that fails validation, with its JSON path.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct HyperparameterError {
    /// Dotted path of the field, e.g. `method.reinforcement.hyperparameters.group_size`.
    pub param: String,
    /// What is wrong.
    pub message: String,
}

impl Hyperparameters {
    /// Prompts per step (default 4).
    pub fn batch_size(&self) -> usize {
        self.batch_size.unwrap_or(4)
    }

    /// Multiplier on exploration compute (default 1).
    pub fn compute_multiplier(&self) -> f64 {
        self.compute_multiplier.unwrap_or(1.0)
    }

    /// Completions sampled per prompt: `group_size`, else 8 × `compute_multiplier` rounded, at
    /// least 2.
    pub fn group_size(&self) -> usize {
        self.group_size.unwrap_or_else(|| {
            ((BASE_GROUP_SIZE * self.compute_multiplier()).round() as usize).max(2)
        })
    }

    /// Reasoning effort (default `medium`).
    pub fn reasoning_effort(&self) -> ReasoningEffort {
        self.reasoning_effort.unwrap_or_default().resolved()
    }

    /// Longest completion: `max_completion_tokens`, else the reasoning effort's budget.
    pub fn max_completion_tokens(&self) -> usize {
        self.max_completion_tokens
            .unwrap_or_else(|| self.reasoning_effort().max_completion_tokens())
    }

    /// Every default filled in (what a job echoes as its hyperparameters): OpenAI's `"auto"`
    /// values become the numbers Verity trains with. Resolving twice changes nothing.
    pub fn resolved(&self) -> Hyperparameters {
        let (epsilon_low, epsilon_high) = self.clip_range();
        Hyperparameters {
            batch_size: Some(self.batch_size()),
            group_size: Some(self.group_size()),
            learning_rate_multiplier: Some(self.learning_rate_multiplier.unwrap_or(1.0)),
            n_epochs: Some(self.n_epochs()),
            max_completion_tokens: Some(self.max_completion_tokens()),
            compute_multiplier: Some(self.compute_multiplier()),
            reasoning_effort: Some(self.reasoning_effort()),
            epsilon_low: Some(epsilon_low),
            epsilon_high: Some(epsilon_high),
            scale_rewards: Some(self.scale_rewards()),
            eval_interval: Some(self.eval_interval()),
            eval_samples: Some(self.eval_samples()),
            ..self.clone()
        }
    }

    /// Learning rate after the multiplier.
    pub fn effective_learning_rate(&self) -> f64 {
        self.learning_rate * self.learning_rate_multiplier.unwrap_or(1.0)
    }

    /// Passes over the training data (default 1).
    pub fn n_epochs(&self) -> usize {
        self.n_epochs.unwrap_or(1)
    }

    /// Most sequences the rollout sampler decodes at once (default `batch_size × group_size`).
    pub fn max_batch_rows(&self) -> usize {
        self.max_batch_rows.map_or(self.batch_size() * self.group_size(), |rows| rows as usize)
    }

    /// Evaluation interval in steps (0 = only at the end).
    pub fn eval_interval(&self) -> usize {
        self.eval_interval.unwrap_or(0)
    }

    /// Completions per validation prompt (default 4).
    pub fn eval_samples(&self) -> usize {
        self.eval_samples.unwrap_or(4)
    }

    /// (ε_low, ε_high) with the loss's defaults filled in.
    pub fn clip_range(&self) -> (f64, f64) {
        let (low, high) = self.loss.default_clip_range();
        (self.epsilon_low.unwrap_or(low), self.epsilon_high.unwrap_or(high))
    }

    /// Whether advantages are divided by the group std.
    pub fn scale_rewards(&self) -> bool {
        self.scale_rewards.unwrap_or(self.loss.default_scale_rewards())
    }

    /// Checks every field; `prefix` is the JSON path of this object for error messages.
    pub fn validate(&self, prefix: &str) -> Result<(), HyperparameterError> {
        let err = |field: &str, message: String| {
            Err(HyperparameterError { param: format!("{prefix}.{field}"), message })
        };
        let positive = |field: &str, value: usize, max: usize| {
            if value == 0 || value > max {
                err(field, format!("must be between 1 and {max}, got {value}"))
            } else {
                Ok(())
            }
        };
        positive("batch_size", self.batch_size(), 4096)?;
        if let Some(multiplier) = self.compute_multiplier {
            if !(multiplier.is_finite() && multiplier > 0.0 && multiplier <= MAX_COMPUTE_MULTIPLIER)
            {
                return err(
                    "compute_multiplier",
                    format!("must be in (0, {MAX_COMPUTE_MULTIPLIER}], got {multiplier}"),
                );
            }
        }
        positive("group_size", self.group_size(), 1024)?;
        if self.group_size() < 2 {
            return err(
                "group_size",
                "must be at least 2: advantages compare completions of one prompt".into(),
            );
        }
        positive("n_epochs", self.n_epochs(), 1000)?;
        if let Some(steps) = self.max_steps {
            positive("max_steps", steps, 10_000_000)?;
        }
        positive("max_completion_tokens", self.max_completion_tokens(), 131_072)?;
        positive("inner_epochs", self.inner_epochs, 64)?;
        positive("micro_batch_size", self.micro_batch_size, 4096)?;
        positive("checkpoint_interval", self.checkpoint_interval, 10_000_000)?;
        positive("eval_samples", self.eval_samples(), 1024)?;
        if let Some(m) = self.learning_rate_multiplier {
            if !(m.is_finite() && m > 0.0) {
                return err("learning_rate_multiplier", format!("must be positive, got {m}"));
            }
        }
        let lr = self.effective_learning_rate();
        if !(lr.is_finite() && lr > 0.0 && lr <= 1.0) {
            return err(
                "learning_rate",
                format!("must be in (0, 1] after the multiplier, got {lr}"),
            );
        }
        if !(self.temperature.is_finite()
            && self.temperature > 0.0
            && self.temperature <= MAX_TEMPERATURE)
        {
            return err(
                "temperature",
                format!("must be in (0, {MAX_TEMPERATURE}], got {}", self.temperature),
            );
        }
        if let Err(m) = sampling::check_top_p(self.top_p) {
            return err("top_p", format!("{m}, got {}", self.top_p));
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return err(
                "stop",
                format!("at most {MAX_STOP_STRINGS} stop strings, got {}", self.stop.len()),
            );
        }
        if let Some(bad) = self.stop.iter().find(|s| s.is_empty() || s.len() > MAX_STOP_LEN) {
            return err(
                "stop",
                format!("each stop string must be 1 to {MAX_STOP_LEN} bytes, got {bad:?}"),
            );
        }
        let (low, high) = self.clip_range();
        if !(low.is_finite() && low > 0.0 && low <= 1.0) {
            return err("epsilon_low", format!("must be in (0, 1], got {low}"));
        }
        if !(high.is_finite() && high > 0.0 && high <= 10.0) {
            return err("epsilon_high", format!("must be in (0, 10], got {high}"));
        }
        if !(self.beta.is_finite() && (0.0..=10.0).contains(&self.beta)) {
            return err("beta", format!("must be in [0, 10], got {}", self.beta));
        }
        if self.overlong_buffer >= self.max_completion_tokens() && self.overlong_buffer > 0 {
            return err(
                "overlong_buffer",
                format!(
                    "must be smaller than max_completion_tokens ({})",
                    self.max_completion_tokens()
                ),
            );
        }
        if !(self.overlong_penalty.is_finite() && self.overlong_penalty >= 0.0) {
            return err("overlong_penalty", "must be a non-negative number".into());
        }
        if !(self.max_grad_norm.is_finite() && self.max_grad_norm >= 0.0) {
            return err("max_grad_norm", "must be a non-negative number (0 = no clipping)".into());
        }
        if !(self.weight_decay.is_finite() && (0.0..=1.0).contains(&self.weight_decay)) {
            return err("weight_decay", "must be in [0, 1]".into());
        }
        if let Some(cap) = self.tis_cap {
            if !(cap.is_finite() && cap >= 1.0) {
                return err("tis_cap", format!("must be at least 1, got {cap}"));
            }
        }
        if let Some(rows) = self.max_batch_rows.map(|rows| rows as usize) {
            positive("max_batch_rows", rows, 1 << 20)?;
            if rows < self.group_size() {
                return err(
                    "max_batch_rows",
                    format!("must be at least group_size ({})", self.group_size()),
                );
            }
        }
        if self.max_staleness > MAX_STALENESS {
            return err(
                "max_staleness",
                format!(
                    "must be 0 or {MAX_STALENESS} (the pipeline samples one step ahead), got {}",
                    self.max_staleness
                ),
            );
        }
        if self.max_staleness > 0 && self.tis_cap.is_none() {
            return err(
                "max_staleness",
                "needs tis_cap (e.g. 2): rollouts of older weights must be importance-corrected"
                    .into(),
            );
        }
        if let Some(tokens) = self.partial_rollout_tokens {
            let limit = self.max_completion_tokens();
            if tokens == 0 || tokens >= limit {
                return err(
                    "partial_rollout_tokens",
                    format!("must be at least 1 and below max_completion_tokens ({limit})"),
                );
            }
            if self.tis_cap.is_none() {
                return err(
                    "partial_rollout_tokens",
                    "needs tis_cap (e.g. 2): carried tokens were sampled by older weights".into(),
                );
            }
            for (set, name) in [
                (self.max_staleness > 0, "max_staleness"),
                (self.dynamic_sampling, "dynamic_sampling"),
            ] {
                if set {
                    return err(
                        "partial_rollout_tokens",
                        format!("cannot be combined with {name}"),
                    );
                }
            }
        }
        if let Some(drawn) = self.max_groups_drawn {
            if drawn < self.batch_size() {
                return err(
                    "max_groups_drawn",
                    format!("must be at least batch_size ({})", self.batch_size()),
                );
            }
        }
        for (i, name) in self.auto_pause_on.iter().enumerate() {
            if crate::monitor::WarningKind::from_name(name).is_none() {
                return err(
                    &format!("auto_pause_on[{i}]"),
                    format!(
                        "unknown warning kind {name:?}; known kinds: {}",
                        crate::monitor::WarningKind::names()
                    ),
                );
            }
        }
        if let Some(lora) = &self.lora {
            if lora.rank == 0 || lora.rank > 1024 {
                return err("lora.rank", format!("must be between 1 and 1024, got {}", lora.rank));
            }
            if !(lora.alpha.is_finite() && lora.alpha > 0.0) {
                return err("lora.alpha", "must be positive".into());
            }
            if !(0.0..1.0).contains(&lora.dropout) {
                return err("lora.dropout", "must be in [0, 1)".into());
            }
            if lora.targets.is_empty() {
                return err("lora.targets", "must name at least one projection".into());
            }
        }
        Ok(())
    }
}

/// The reinforcement method: a grader, hyperparameters and (Verity extension) an optional
/// tool environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reinforcement {
    /// The grader (reward spec); validated by `verity-verifiers`.
    pub grader: Value,
    /// Training hyperparameters.
    #[serde(default)]
    pub hyperparameters: Hyperparameters,
    /// Multi-turn episodes with tools (docs/tools.md); absent, one completion per rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Box<crate::environment::Environment>>,
    /// OpenAI's structured outputs: with a JSON format, graders read the completion parsed as
    /// JSON as `sample.output_json` (`null` and absent mean free text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<crate::response_format::ResponseFormat>,
}

impl Reinforcement {
    /// Validates the `environment` block, if any (errors name
    /// `method.reinforcement.environment.{field}`); overlong shaping, which measures one
    /// completion, and partial rollouts, which continue one, are refused with it. HTTP tools
    /// must be on this process's allow-list ([`crate::environment::HTTP_ALLOW_ENV`]).
    pub fn validate_environment(&self) -> Result<(), HyperparameterError> {
        let Some(environment) = &self.environment else { return Ok(()) };
        let hp = &self.hyperparameters;
        for (set, name, what) in [
            (hp.overlong_buffer > 0, "overlong_buffer", "overlong shaping"),
            (hp.partial_rollout_tokens.is_some(), "partial_rollout_tokens", "partial rollouts"),
        ] {
            if set {
                return Err(HyperparameterError {
                    param: format!("method.reinforcement.hyperparameters.{name}"),
                    message: format!("{what} is not supported with an environment yet"),
                });
            }
        }
        environment.validate(
            "method.reinforcement.environment",
            hp.max_completion_tokens(),
            &crate::environment::HttpAllowList::from_env(),
        )
    }
}

/// Default learning rate of supervised jobs (TRL's `SFTConfig` default).
pub const SUPERVISED_LEARNING_RATE: f64 = 2e-5;
/// Default learning rate of DPO jobs (TRL's `DPOConfig` default).
pub const DPO_LEARNING_RATE: f64 = 1e-6;
/// Default DPO β (OpenAI's and TRL's).
pub const DPO_BETA: f64 = 0.1;

/// Hyperparameters of supervised and DPO jobs: OpenAI's (`batch_size`, `n_epochs`,
/// `learning_rate_multiplier`, and `beta` for DPO), each a number or `"auto"`, plus Verity's
/// optimisation, LoRA, evaluation and checkpoint settings. Each field means, defaults to and is
/// validated as the [`Hyperparameters`] field of the same name ([`TuningHyperparameters::training`]
/// maps them there; only the default learning rate depends on the method). Sampling and loss
/// settings of reinforcement jobs do not apply and are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TuningHyperparameters {
    /// Examples (supervised) or preference pairs (DPO) per step.
    #[serde(deserialize_with = "auto_or")]
    pub batch_size: Option<usize>,
    /// OpenAI-style multiplier on the learning rate.
    #[serde(deserialize_with = "auto_or")]
    pub learning_rate_multiplier: Option<f64>,
    /// Passes over the training file (ignored when `max_steps` is set).
    #[serde(deserialize_with = "auto_or")]
    pub n_epochs: Option<usize>,
    /// DPO's β: how far the policy may move from the reference (DPO only; default 0.1).
    #[serde(deserialize_with = "auto_or", skip_serializing_if = "Option::is_none")]
    pub beta: Option<f64>,
    /// Peak learning rate (default 2e-5 supervised, 1e-6 DPO).
    pub learning_rate: Option<f64>,
    /// Stop after this many steps.
    pub max_steps: Option<usize>,
    /// Sequences per forward/backward micro-batch.
    pub micro_batch_size: Option<usize>,
    /// Global gradient-norm clip (0 = off).
    pub max_grad_norm: Option<f64>,
    /// AdamW weight decay.
    pub weight_decay: Option<f64>,
    /// Linear warm-up steps.
    pub warmup_steps: Option<usize>,
    /// Schedule after warm-up.
    pub lr_schedule: Option<LrDecay>,
    /// Low-rank adapters; `null` trains all weights.
    pub lora: Option<LoraSpec>,
    /// Evaluate on the validation file every N steps (0 = only at the end).
    #[serde(deserialize_with = "auto_or")]
    pub eval_interval: Option<usize>,
    /// Save a checkpoint every N steps (and always at the end).
    pub checkpoint_interval: Option<usize>,
    /// Longest greedy completion of the samples written at each evaluation, in tokens.
    pub max_completion_tokens: Option<usize>,
    /// Seed for everything random (overrides the job's seed when set).
    pub seed: Option<u64>,
}

impl TuningHyperparameters {
    /// The trainer's hyperparameters: each field given here, every other one at the
    /// [`Hyperparameters`] default, the learning rate at `default_learning_rate` unless given.
    pub fn training(&self, default_learning_rate: f64) -> Hyperparameters {
        let base = Hyperparameters::default();
        Hyperparameters {
            batch_size: self.batch_size,
            learning_rate: self.learning_rate.unwrap_or(default_learning_rate),
            learning_rate_multiplier: self.learning_rate_multiplier,
            n_epochs: self.n_epochs,
            max_steps: self.max_steps,
            max_completion_tokens: self.max_completion_tokens,
            micro_batch_size: self.micro_batch_size.unwrap_or(base.micro_batch_size),
            max_grad_norm: self.max_grad_norm.unwrap_or(base.max_grad_norm),
            weight_decay: self.weight_decay.unwrap_or(base.weight_decay),
            warmup_steps: self.warmup_steps.unwrap_or(base.warmup_steps),
            lr_schedule: self.lr_schedule.unwrap_or(base.lr_schedule),
            lora: self.lora.clone(),
            eval_interval: self.eval_interval,
            checkpoint_interval: self.checkpoint_interval.unwrap_or(base.checkpoint_interval),
            seed: self.seed,
            ..base
        }
    }

    /// DPO's β with its default.
    pub fn beta(&self) -> f64 {
        self.beta.unwrap_or(DPO_BETA)
    }

    /// Every default filled in (what a job echoes); `dpo` adds β.
    pub fn resolved(&self, default_learning_rate: f64, dpo: bool) -> TuningHyperparameters {
        let hp = self.training(default_learning_rate).resolved();
        TuningHyperparameters {
            batch_size: hp.batch_size,
            learning_rate_multiplier: hp.learning_rate_multiplier,
            n_epochs: hp.n_epochs,
            beta: dpo.then(|| self.beta()),
            learning_rate: Some(hp.learning_rate),
            max_steps: hp.max_steps,
            micro_batch_size: Some(hp.micro_batch_size),
            max_grad_norm: Some(hp.max_grad_norm),
            weight_decay: Some(hp.weight_decay),
            warmup_steps: Some(hp.warmup_steps),
            lr_schedule: Some(hp.lr_schedule),
            lora: hp.lora,
            eval_interval: hp.eval_interval,
            checkpoint_interval: Some(hp.checkpoint_interval),
            max_completion_tokens: hp.max_completion_tokens,
            seed: hp.seed,
        }
    }

    /// Checks every field ([`Hyperparameters::validate`] for the shared ones, then β, which
    /// only DPO takes); `prefix` is the JSON path of this object.
    pub fn validate(
        &self,
        prefix: &str,
        default_learning_rate: f64,
        dpo: bool,
    ) -> Result<(), HyperparameterError> {
        self.training(default_learning_rate).validate(prefix)?;
        let beta_error =
            |message: String| Err(HyperparameterError { param: format!("{prefix}.beta"), message });
        match (dpo, self.beta) {
            (false, Some(_)) => beta_error(
                "beta is DPO's; supervised jobs have no reference model to stay near".into(),
            ),
            (true, _)
                if !(self.beta().is_finite() && self.beta() > 0.0 && self.beta() <= 100.0) =>
            {
                beta_error(format!("must be in (0, 100], got {}", self.beta()))
            }
            _ => Ok(()),
        }
    }
}

/// The supervised or DPO method's settings (neither has a grader: the data is the target).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    /// Training hyperparameters.
    #[serde(default)]
    pub hyperparameters: TuningHyperparameters,
}

/// Which method a job trains with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodKind {
    /// Rollouts scored by a grader, GRPO-family losses.
    Reinforcement,
    /// Next-token cross-entropy on the assistant messages of chats.
    Supervised,
    /// Direct preference optimisation on preferred / non-preferred pairs.
    Dpo,
}

impl MethodKind {
    /// The JSON spelling (`reinforcement`, `supervised`, `dpo`).
    pub fn as_str(self) -> &'static str {
        match self {
            MethodKind::Reinforcement => "reinforcement",
            MethodKind::Supervised => "supervised",
            MethodKind::Dpo => "dpo",
        }
    }
}

/// `method` of a fine-tuning job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
// One value per job, moved rarely: the reinforcement variant's size costs nothing worth boxing.
#[allow(clippy::large_enum_variant)]
pub enum Method {
    /// Reinforcement fine-tuning with a grader.
    Reinforcement {
        /// The method's settings.
        reinforcement: Reinforcement,
    },
    /// Supervised fine-tuning on chats (OpenAI's `supervised`).
    Supervised {
        /// The method's settings.
        #[serde(default)]
        supervised: Tuning,
    },
    /// Direct preference optimisation (OpenAI's `dpo`).
    Dpo {
        /// The method's settings.
        #[serde(default)]
        dpo: Tuning,
    },
}

impl Method {
    /// Which method this is.
    pub fn kind(&self) -> MethodKind {
        match self {
            Method::Reinforcement { .. } => MethodKind::Reinforcement,
            Method::Supervised { .. } => MethodKind::Supervised,
            Method::Dpo { .. } => MethodKind::Dpo,
        }
    }

    /// The reinforcement settings, for a reinforcement job.
    pub fn reinforcement(&self) -> Option<&Reinforcement> {
        match self {
            Method::Reinforcement { reinforcement } => Some(reinforcement),
            _ => None,
        }
    }

    /// The hyperparameters the trainer runs with (for supervised and DPO jobs, their
    /// [`TuningHyperparameters::training`]).
    pub fn training_hyperparameters(&self) -> Hyperparameters {
        match self {
            Method::Reinforcement { reinforcement } => reinforcement.hyperparameters.clone(),
            Method::Supervised { supervised } => {
                supervised.hyperparameters.training(SUPERVISED_LEARNING_RATE)
            }
            Method::Dpo { dpo } => dpo.hyperparameters.training(DPO_LEARNING_RATE),
        }
    }

    /// DPO's β (`None` for the other methods).
    pub fn dpo_beta(&self) -> Option<f64> {
        match self {
            Method::Dpo { dpo } => Some(dpo.hyperparameters.beta()),
            _ => None,
        }
    }

    /// The method with every hyperparameter default filled in ([`Hyperparameters::resolved`]).
    pub fn resolved(&self) -> Method {
        let dpo = self.kind() == MethodKind::Dpo;
        let tuned = |tuning: &Tuning, lr: f64| Tuning {
            hyperparameters: tuning.hyperparameters.resolved(lr, dpo),
        };
        match self {
            Method::Reinforcement { reinforcement } => Method::Reinforcement {
                reinforcement: Reinforcement {
                    grader: reinforcement.grader.clone(),
                    hyperparameters: reinforcement.hyperparameters.resolved(),
                    environment: reinforcement.environment.as_ref().map(|environment| {
                        Box::new(
                            environment
                                .resolved(reinforcement.hyperparameters.max_completion_tokens()),
                        )
                    }),
                    response_format: reinforcement.response_format.clone(),
                },
            },
            Method::Supervised { supervised } => {
                Method::Supervised { supervised: tuned(supervised, SUPERVISED_LEARNING_RATE) }
            }
            Method::Dpo { dpo } => Method::Dpo { dpo: tuned(dpo, DPO_LEARNING_RATE) },
        }
    }

    /// Validates the hyperparameters (the grader is validated by its own crate); errors name
    /// `method.{type}.hyperparameters.{field}`.
    pub fn validate(&self) -> Result<(), HyperparameterError> {
        let prefix = format!("method.{}.hyperparameters", self.kind().as_str());
        match self {
            Method::Reinforcement { reinforcement } => {
                // The format first: its conflicts are what a user combining them must hear.
                if let Some(format) = &reinforcement.response_format {
                    format.validate().map_err(|e| HyperparameterError {
                        param: format!("method.reinforcement.response_format.{}", e.field),
                        message: e.message,
                    })?;
                    let tools = reinforcement.environment.is_some();
                    let partial = reinforcement.hyperparameters.partial_rollout_tokens.is_some();
                    if let Some(conflict) = format.conflict(tools, partial) {
                        return Err(HyperparameterError {
                            param: "method.reinforcement.response_format".into(),
                            message: conflict.to_string(),
                        });
                    }
                }
                reinforcement.hyperparameters.validate(&prefix)?;
                reinforcement.validate_environment()
            }
            Method::Supervised { supervised } => {
                supervised.hyperparameters.validate(&prefix, SUPERVISED_LEARNING_RATE, false)
            }
            Method::Dpo { dpo } => dpo.hyperparameters.validate(&prefix, DPO_LEARNING_RATE, true),
        }
    }
}

/// The completion-token budget a stored method sets (`{type, <type>: {hyperparameters:
/// {max_completion_tokens}}}`, as a job keeps it resolved): the longest completion its rollouts
/// sample. `None` when the method names none.
pub fn method_completion_budget(method: &Value) -> Option<usize> {
    let kind = method.get("type")?.as_str()?;
    let tokens = method.get(kind)?.get("hyperparameters")?.get("max_completion_tokens")?;
    tokens.as_u64().and_then(|t| usize::try_from(t).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn method(hp: Value) -> Result<Method, serde_json::Error> {
        serde_json::from_value(
            json!({"type": "reinforcement", "reinforcement": {"grader": {"type": "math"}, "hyperparameters": hp}}),
        )
    }

    #[test]
    fn the_gemma_example_job_is_a_valid_method() {
        let job: Value =
            serde_json::from_str(include_str!("../../examples/gemma3-gpu/job.json")).unwrap();
        let m: Method = serde_json::from_value(job["method"].clone()).unwrap();
        m.validate().unwrap();
        let hp = &m.reinforcement().unwrap().hyperparameters;
        assert_eq!(hp.lora.as_ref().map(|l| l.rank), Some(32));
        assert_eq!(job["model"], "gemma-3-1b-it");
    }

    #[test]
    fn defaults_fill_in_and_auto_means_default() {
        let m = method(json!({"batch_size": "auto", "n_epochs": 2, "loss": "dapo"})).unwrap();
        let hp = &m.reinforcement().unwrap().hyperparameters;
        assert_eq!(hp.batch_size(), 4);
        assert_eq!(hp.n_epochs(), 2);
        assert_eq!(hp.clip_range(), (0.2, 0.28));
        assert!(hp.scale_rewards());
        m.validate().unwrap();
        let dr = method(json!({"loss": "dr_grpo"})).unwrap();
        assert!(!dr.reinforcement().unwrap().hyperparameters.scale_rewards());
    }

    #[test]
    fn openai_knobs_set_the_defaults_of_the_precise_ones_and_resolve_idempotently() {
        let all_auto = method(json!({"batch_size": "auto", "n_epochs": "auto",
            "learning_rate_multiplier": "auto", "eval_interval": "auto", "eval_samples": "auto",
            "compute_multiplier": "auto", "reasoning_effort": "default"}))
        .unwrap();
        all_auto.validate().unwrap();
        let resolved = serde_json::to_value(all_auto.resolved()).unwrap();
        let hp = &resolved["reinforcement"]["hyperparameters"];
        for (field, value) in [
            ("batch_size", json!(4)),
            ("n_epochs", json!(1)),
            ("learning_rate_multiplier", json!(1.0)),
            ("eval_interval", json!(0)),
            ("eval_samples", json!(4)),
            ("compute_multiplier", json!(1.0)),
            ("reasoning_effort", json!("medium")),
            ("group_size", json!(8)),
            ("max_completion_tokens", json!(256)),
            ("epsilon_low", json!(0.2)),
            ("scale_rewards", json!(true)),
        ] {
            assert_eq!(hp[field], value, "{field}");
        }
        let again: Method = serde_json::from_value(resolved.clone()).unwrap();
        assert_eq!(serde_json::to_value(again.resolved()).unwrap(), resolved, "idempotent");

        let scaled =
            method(json!({"compute_multiplier": 2.5, "reasoning_effort": "high"})).unwrap();
        let hp = &scaled.reinforcement().unwrap().hyperparameters;
        assert_eq!((hp.group_size(), hp.max_completion_tokens()), (20, 1024));
        let low = method(json!({"compute_multiplier": 0.1, "reasoning_effort": "low"})).unwrap();
        let hp = &low.reinforcement().unwrap().hyperparameters;
        assert_eq!((hp.group_size(), hp.max_completion_tokens()), (2, 128), "at least 2");
        let explicit = method(json!({"compute_multiplier": 4, "group_size": 3,
            "reasoning_effort": "high", "max_completion_tokens": 16}))
        .unwrap();
        let hp = &explicit.reinforcement().unwrap().hyperparameters;
        assert_eq!((hp.group_size(), hp.max_completion_tokens()), (3, 16), "explicit wins");
        for (bad, field) in [
            (json!({"compute_multiplier": 0}), "compute_multiplier"),
            (json!({"compute_multiplier": 1000}), "compute_multiplier"),
            (json!({"learning_rate_multiplier": -1}), "learning_rate_multiplier"),
            (json!({"eval_samples": 0}), "eval_samples"),
            (json!({"auto_pause_on": ["entropy_collapse", "nope"]}), "auto_pause_on[1]"),
        ] {
            let e = method(bad).unwrap().validate().unwrap_err();
            assert_eq!(e.param, format!("method.reinforcement.hyperparameters.{field}"));
        }
        let pausing =
            method(json!({"auto_pause_on": ["entropy_collapse", "zero_advantage"]})).unwrap();
        pausing.validate().unwrap();
        assert!(method(json!({"reasoning_effort": "extreme"})).is_err());
        assert!(method(json!({"compute_multiplier": "lots"})).is_err());
    }

    #[test]
    fn every_loss_has_one_spelling_and_a_valid_preset() {
        assert!("ppo".parse::<Loss>().is_err());
        for loss in Loss::ALL {
            assert_eq!(loss.as_str().parse::<Loss>(), Ok(loss));
            assert_eq!(serde_json::to_value(loss).unwrap(), json!(loss.as_str()));
            let preset = serde_json::to_value(loss.preset()).unwrap();
            let m = method(preset).unwrap();
            m.validate().unwrap();
            let hp = &m.reinforcement().unwrap().hyperparameters;
            assert_eq!(hp.loss, loss);
            assert_eq!(hp.clip_range(), loss.default_clip_range());
            assert_eq!(
                hp.scale_rewards(),
                Hyperparameters { loss, ..Default::default() }.scale_rewards()
            );
            assert_eq!(hp.dynamic_sampling, loss == Loss::Dapo);
        }
    }

    #[test]
    fn rollout_dtype_has_one_spelling_in_json_and_on_the_command_line() {
        for (text, dtype) in
            [("f32", RolloutDtype::F32), ("bf16", RolloutDtype::Bf16), ("int8", RolloutDtype::Int8)]
        {
            let m = method(json!({ "rollout_dtype": text })).unwrap();
            assert_eq!(m.reinforcement().unwrap().hyperparameters.rollout_dtype, dtype);
            assert_eq!(<RolloutDtype as clap::ValueEnum>::from_str(text, false), Ok(dtype));
            assert_eq!(serde_json::to_value(dtype).unwrap(), json!(text));
        }
        assert!(method(json!({"rollout_dtype": "fp8"})).is_err());
        assert!(<RolloutDtype as clap::ValueEnum>::from_str("fp8", false).is_err());
    }

    #[test]
    fn bad_values_name_their_field() {
        let e = method(json!({"group_size": 1})).unwrap().validate().unwrap_err();
        assert_eq!(e.param, "method.reinforcement.hyperparameters.group_size");
        let e = method(json!({"lora": {"rank": 0}})).unwrap().validate().unwrap_err();
        assert_eq!(e.param, "method.reinforcement.hyperparameters.lora.rank");
        let e = method(json!({"temperature": 0.0})).unwrap().validate().unwrap_err();
        assert!(e.param.ends_with("temperature"));
        let e = method(json!({"temperature": 5.0})).unwrap().validate().unwrap_err();
        assert!(e.param.ends_with("temperature") && e.message.contains("(0, 2]"), "{e:?}");
        method(json!({"temperature": 2.0})).unwrap().validate().unwrap();
        assert!(method(json!({"bogus": 1})).is_err(), "unknown fields are rejected");
        assert!(method(json!({"batch_size": "many"})).is_err());
        assert!(serde_json::from_value::<Method>(json!({"type": "rejection"})).is_err());
    }

    #[test]
    fn pipeline_settings_are_validated_by_name() {
        let ok = method(json!({"max_staleness": 1, "tis_cap": 2.0, "max_batch_rows": 16})).unwrap();
        ok.validate().unwrap();
        method(json!({"partial_rollout_tokens": 64, "tis_cap": 2.0})).unwrap().validate().unwrap();
        let hp = &ok.reinforcement().unwrap().hyperparameters;
        assert_eq!((hp.max_staleness, hp.max_batch_rows()), (1, 16));
        assert_eq!(Hyperparameters::default().max_batch_rows(), 4 * 8, "B × G by default");
        for (bad, field, says) in [
            (json!({"max_staleness": 1}), "max_staleness", "tis_cap"),
            (json!({"max_staleness": 2, "tis_cap": 2.0}), "max_staleness", "0 or 1"),
            (json!({"max_batch_rows": 4}), "max_batch_rows", "group_size"),
            (json!({"max_batch_rows": 0}), "max_batch_rows", "between 1"),
            (json!({"partial_rollout_tokens": 64}), "partial_rollout_tokens", "tis_cap"),
            (
                json!({"partial_rollout_tokens": 0, "tis_cap": 2.0}),
                "partial_rollout_tokens",
                "at least 1",
            ),
            (
                json!({"partial_rollout_tokens": 4096, "max_completion_tokens": 512, "tis_cap": 2.0}),
                "partial_rollout_tokens",
                "below max_completion_tokens (512)",
            ),
            (
                json!({"partial_rollout_tokens": 64, "tis_cap": 2.0, "max_staleness": 1}),
                "partial_rollout_tokens",
                "max_staleness",
            ),
            (
                json!({"partial_rollout_tokens": 64, "tis_cap": 2.0, "dynamic_sampling": true}),
                "partial_rollout_tokens",
                "dynamic_sampling",
            ),
        ] {
            let e = method(bad).unwrap().validate().unwrap_err();
            assert_eq!(e.param, format!("method.reinforcement.hyperparameters.{field}"));
            assert!(e.message.contains(says), "{e:?}");
        }
    }

    #[test]
    fn stop_strings_are_bounded() {
        let ok = method(json!({"stop": ["</answer>", "\n\n"]})).unwrap();
        ok.validate().unwrap();
        assert_eq!(
            ok.reinforcement().unwrap().hyperparameters.stop,
            vec!["</answer>".to_string(), "\n\n".to_string()]
        );
        let e = method(json!({"stop": [""]})).unwrap().validate().unwrap_err();
        assert!(e.param.ends_with("hyperparameters.stop"), "{e:?}");
        let e = method(json!({"stop": ["a", "b", "c", "d", "e"]})).unwrap().validate().unwrap_err();
        assert!(e.message.contains("at most 4"), "{e:?}");
    }

    #[test]
    fn an_environment_block_is_optional_validated_and_echoed() {
        let bare = serde_json::to_value(method(json!({})).unwrap().resolved()).unwrap();
        assert!(bare["reinforcement"].get("environment").is_none(), "absent stays absent");
        let with = |environment: Value, hp: Value| -> Method {
            serde_json::from_value(json!({"type": "reinforcement", "reinforcement": {
                "grader": {"type": "math"}, "hyperparameters": hp, "environment": environment}}))
            .unwrap()
        };
        let tools = with(json!({"tools": [{"type": "calculator"}], "max_turns": 3}), json!({}));
        tools.validate().unwrap();
        let echoed = serde_json::to_value(tools.resolved()).unwrap();
        assert_eq!(echoed["reinforcement"]["environment"]["max_episode_tokens"], json!(768));
        let e = with(json!({"tools": []}), json!({})).validate().unwrap_err();
        assert_eq!(e.param, "method.reinforcement.environment.tools");
        let e = with(json!({"tools": [{"type": "python"}]}), json!({"overlong_buffer": 8}))
            .validate()
            .unwrap_err();
        assert_eq!(e.param, "method.reinforcement.hyperparameters.overlong_buffer");
        let partial = json!({"partial_rollout_tokens": 32, "tis_cap": 2.0});
        let e = with(json!({"tools": [{"type": "python"}]}), partial).validate().unwrap_err();
        assert_eq!(e.param, "method.reinforcement.hyperparameters.partial_rollout_tokens");
    }

    #[test]
    fn a_response_format_is_optional_nullable_validated_and_echoed() {
        let with = |format: Value| -> Method {
            serde_json::from_value(json!({"type": "reinforcement", "reinforcement": {
                "grader": {"type": "math"}, "response_format": format}}))
            .unwrap()
        };
        let null = serde_json::to_value(with(Value::Null).resolved()).unwrap();
        assert!(null["reinforcement"].get("response_format").is_none(), "null means free text");
        let schema = json!({"type": "json_schema", "json_schema": {"name": "security_assistant",
            "strict": true, "schema": {"type": "object"}}});
        let echoed = serde_json::to_value(with(schema.clone()).resolved()).unwrap();
        assert_eq!(echoed["reinforcement"]["response_format"], schema);
        let bad = with(json!({"type": "json_schema", "json_schema": {"name": ""}}));
        assert_eq!(
            bad.validate().unwrap_err().param,
            "method.reinforcement.response_format.json_schema.name"
        );
    }

    #[test]
    fn a_json_response_format_is_refused_beside_tools_or_partial_rollouts_before_hyperparameters() {
        let json_format = json!({"type": "json_object"});
        let with = |extra: Value| -> Method {
            let mut reinforcement =
                json!({"grader": {"type": "math"}, "response_format": json_format});
            reinforcement.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            serde_json::from_value(json!({"type": "reinforcement", "reinforcement": reinforcement}))
                .unwrap()
        };
        // Without tis_cap the hyperparameters alone are invalid too: the format's conflict wins.
        let partial = with(json!({"hyperparameters": {"partial_rollout_tokens": 32}}));
        let e = partial.validate().unwrap_err();
        assert_eq!(e.param, "method.reinforcement.response_format");
        assert!(e.message.contains("partial_rollout_tokens"), "{}", e.message);
        let tools = with(json!({"environment": {"tools": [{"type": "python"}]}}));
        let e = tools.validate().unwrap_err();
        assert!(e.message.ends_with("method.reinforcement.environment"), "{}", e.message);
        with(json!({})).validate().unwrap();
    }

    fn tuning(kind: &str, hp: Value) -> Result<Method, serde_json::Error> {
        serde_json::from_value(json!({"type": kind, kind: {"hyperparameters": hp}}))
    }

    #[test]
    fn supervised_and_dpo_share_the_hyperparameter_definitions_and_resolve() {
        let bare: Method = serde_json::from_value(json!({"type": "supervised"})).unwrap();
        assert_eq!(bare.kind(), MethodKind::Supervised);
        bare.validate().unwrap();
        let resolved = serde_json::to_value(bare.resolved()).unwrap();
        let hp = &resolved["supervised"]["hyperparameters"];
        let defaults = Hyperparameters::default();
        assert_eq!(hp["batch_size"], json!(defaults.batch_size()));
        assert_eq!(hp["n_epochs"], json!(defaults.n_epochs()));
        assert_eq!(hp["learning_rate_multiplier"], json!(1.0));
        assert_eq!(hp["learning_rate"], json!(SUPERVISED_LEARNING_RATE));
        assert_eq!(hp["micro_batch_size"], json!(defaults.micro_batch_size));
        assert_eq!(hp["checkpoint_interval"], json!(defaults.checkpoint_interval));
        assert!(hp.get("beta").is_none(), "supervised jobs have no beta: {hp}");
        let again: Method = serde_json::from_value(resolved.clone()).unwrap();
        assert_eq!(serde_json::to_value(again.resolved()).unwrap(), resolved, "idempotent");

        let dpo =
            tuning("dpo", json!({"beta": "auto", "batch_size": 2, "lora": {"rank": 4}})).unwrap();
        dpo.validate().unwrap();
        assert_eq!(dpo.dpo_beta(), Some(DPO_BETA));
        let hp = dpo.training_hyperparameters();
        assert_eq!((hp.batch_size(), hp.learning_rate), (2, DPO_LEARNING_RATE));
        assert_eq!(hp.lora.as_ref().map(|l| l.rank), Some(4));
        let resolved = serde_json::to_value(dpo.resolved()).unwrap();
        assert_eq!(resolved["dpo"]["hyperparameters"]["beta"], json!(DPO_BETA));

        for (kind, bad, field) in [
            ("dpo", json!({"beta": 0}), "beta"),
            ("dpo", json!({"beta": -0.5}), "beta"),
            ("supervised", json!({"beta": 0.1}), "beta"),
            ("supervised", json!({"batch_size": 0}), "batch_size"),
            ("supervised", json!({"learning_rate_multiplier": -1}), "learning_rate_multiplier"),
            ("dpo", json!({"lora": {"rank": 0}}), "lora.rank"),
        ] {
            let e = tuning(kind, bad).unwrap().validate().unwrap_err();
            assert_eq!(e.param, format!("method.{kind}.hyperparameters.{field}"), "{e}");
        }
        assert!(tuning("supervised", json!({"group_size": 4})).is_err(), "RL-only fields");
        assert!(tuning("dpo", json!({"beta": "lots"})).is_err());
        assert!(serde_json::from_value::<Method>(
            json!({"type": "supervised", "supervised": {"grader": {"type": "math"}}})
        )
        .is_err());
    }
}
