//! What a Tinker training client asks of its worker and what it gets back: the calls
//! (`forward_backward`, `optim_step`, …) as the API server queues them and the training worker
//! runs them, one definition shared by both sides. The wire formats (protobuf, JSON) are the API
//! server's business; these are the checked values behind them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One training example: the model's input tokens and, per input position, what the loss needs
/// there (Tinker's next-token alignment: position `t` of `tokens` predicts `target_tokens[t]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Datum {
    /// The model input, its text chunks concatenated.
    pub tokens: Vec<u32>,
    /// The token each position predicts.
    pub target_tokens: Vec<u32>,
    /// Per-position weight of the cross-entropy (absent: 1 everywhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Vec<f32>>,
    /// Per-position advantage of the policy-gradient losses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advantages: Option<Vec<f32>>,
    /// Per-position log-probability of the target under the policy that sampled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<f32>>,
}

/// The built-in losses, each a sum over every datum's positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossFn {
    /// `−Σ w·log p` (weights default to 1).
    CrossEntropy,
    /// REINFORCE with importance sampling: `−Σ ρ·A`, `ρ = exp(log p − log q)`.
    ImportanceSampling,
    /// PPO's clipped surrogate, token by token: `−Σ min(ρ·A, clip(ρ, low, high)·A)`.
    Ppo,
    /// CISPO: `−Σ sg(clip(ρ, low, high))·A·log p`.
    Cispo,
}

impl LossFn {
    /// Every loss by its wire name.
    pub const ALL: [LossFn; 4] =
        [LossFn::CrossEntropy, LossFn::ImportanceSampling, LossFn::Ppo, LossFn::Cispo];

    /// The loss named `name` on the wire (`cross_entropy`, …).
    pub fn parse(name: &str) -> Option<LossFn> {
        LossFn::ALL.into_iter().find(|loss| loss.as_str() == name)
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            LossFn::CrossEntropy => "cross_entropy",
            LossFn::ImportanceSampling => "importance_sampling",
            LossFn::Ppo => "ppo",
            LossFn::Cispo => "cispo",
        }
    }

    /// The `loss_fn_inputs` each datum must carry besides `target_tokens`.
    pub fn required_inputs(self) -> &'static [&'static str] {
        match self {
            LossFn::CrossEntropy => &[],
            _ => &["logprobs", "advantages"],
        }
    }

    /// The `loss_fn_inputs` this loss reads (required or optional).
    pub fn known_inputs(self) -> &'static [&'static str] {
        match self {
            LossFn::CrossEntropy => &["target_tokens", "weights"],
            _ => &["target_tokens", "logprobs", "advantages"],
        }
    }

    /// The `loss_fn_config` keys this loss reads.
    pub fn known_config(self) -> &'static [&'static str] {
        match self {
            LossFn::Ppo | LossFn::Cispo => &["clip_low_threshold", "clip_high_threshold"],
            _ => &[],
        }
    }
}

/// The clip range of `ppo` and `cispo`: ratios are clamped to `[low, high]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClipThresholds {
    /// Lower bound of the clamped ratio.
    pub low: f64,
    /// Upper bound of the clamped ratio.
    pub high: f64,
}

impl Default for ClipThresholds {
    /// Tinker's: ε = 0.2 on both sides.
    fn default() -> Self {
        ClipThresholds { low: 0.8, high: 1.2 }
    }
}

/// A `forward_backward` (or, with `forward_only`, a `forward`) call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardBackward {
    /// The examples.
    pub data: Vec<Datum>,
    /// The loss.
    pub loss_fn: LossFn,
    /// `ppo` / `cispo` clip range.
    #[serde(default)]
    pub clip: ClipThresholds,
    /// Log-probabilities and loss only, no gradient.
    #[serde(default)]
    pub forward_only: bool,
}

/// What `forward_backward` returns: per datum, the fields the loss outputs, and summed metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForwardBackwardOutput {
    /// One record per datum: `logprobs` (of each target) and, for `cross_entropy`,
    /// `elementwise_loss`; each as long as the datum.
    pub outputs: Vec<BTreeMap<String, Vec<f32>>>,
    /// `name:reduction` → value (`loss:sum`, …), as the SDK merges them across chunks.
    pub metrics: BTreeMap<String, f64>,
}

/// `optim_step`'s Adam settings (Tinker's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdamParams {
    /// Learning rate.
    pub learning_rate: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 disables).
    pub grad_clip_norm: f64,
}

impl Default for AdamParams {
    fn default() -> Self {
        AdamParams {
            learning_rate: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-12,
            weight_decay: 0.0,
            grad_clip_norm: 0.0,
        }
    }
}

impl AdamParams {
    /// The first field out of range, as `(field, message)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let fields = [
            ("learning_rate", self.learning_rate, 0.0, f64::INFINITY),
            ("beta1", self.beta1, 0.0, 1.0),
            ("beta2", self.beta2, 0.0, 1.0),
            ("eps", self.eps, 0.0, f64::INFINITY),
            ("weight_decay", self.weight_decay, 0.0, f64::INFINITY),
            ("grad_clip_norm", self.grad_clip_norm, 0.0, f64::INFINITY),
        ];
        for (name, value, low, high) in fields {
            let open_top = high.is_finite();
            let ok = value.is_finite() && value >= low && (!open_top || value < high);
            if !ok {
                let range =
                    if open_top { format!("in [{low}, {high})") } else { format!(">= {low}") };
                return Err((name, format!("must be finite and {range}, got {value}")));
            }
        }
        Ok(())
    }
}

/// What `optim_step` returns: `name:reduction` → value.
pub type OptimStepOutput = BTreeMap<String, f64>;

/// A bad field of a call: where (`data[i].loss_fn_inputs.weights`, …) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The JSON-path-like place of the problem.
    pub field: String,
    /// What is wrong there.
    pub message: String,
}

impl FieldError {
    /// The problem `message` at `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), message: message.into() }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl ForwardBackward {
    /// Checks every datum against the loss: non-empty input, one value per position in each
    /// input, the inputs the loss needs present, finite values, targets below `vocab_size`.
    pub fn check(&self, vocab_size: usize) -> Result<(), FieldError> {
        if self.data.is_empty() {
            return Err(FieldError { field: "data".into(), message: "no datums".into() });
        }
        if !(self.clip.low.is_finite() && self.clip.high.is_finite())
            || self.clip.low < 0.0
            || self.clip.low > self.clip.high
        {
            return Err(FieldError {
                field: "loss_fn_config".into(),
                message: format!(
                    "clip_low_threshold ({}) and clip_high_threshold ({}) must be finite with \
                     0 <= low <= high",
                    self.clip.low, self.clip.high
                ),
            });
        }
        for (i, datum) in self.data.iter().enumerate() {
            datum.check(self.loss_fn, vocab_size).map_err(|(input, message)| FieldError {
                field: match input {
                    "model_input" => format!("data[{i}].model_input"),
                    input => format!("data[{i}].loss_fn_inputs.{input}"),
                },
                message,
            })?;
        }
        Ok(())
    }
}

impl Datum {
    /// The first problem of this datum for `loss`, as `(input name, message)`.
    fn check(&self, loss: LossFn, vocab_size: usize) -> Result<(), (&'static str, String)> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(("model_input", "no tokens".into()));
        }
        if let Some(&bad) = self.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err((
                "model_input",
                format!("token {bad} is outside the vocabulary ({vocab_size})"),
            ));
        }
        if self.target_tokens.len() != n {
            return Err((
                "target_tokens",
                format!("{} values for {n} input tokens", self.target_tokens.len()),
            ));
        }
        if let Some(&bad) = self.target_tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err((
                "target_tokens",
                format!("token {bad} is outside the vocabulary ({vocab_size})"),
            ));
        }
        let inputs = [
            ("weights", &self.weights),
            ("advantages", &self.advantages),
            ("logprobs", &self.logprobs),
        ];
        for (name, values) in inputs {
            match values {
                None if loss.required_inputs().contains(&name) => {
                    return Err((name, format!("required by the {} loss", loss.as_str())));
                }
                None => {}
                Some(_) if !loss.known_inputs().contains(&name) => {
                    return Err((name, format!("not an input of the {} loss", loss.as_str())));
                }
                Some(values) if values.len() != n => {
                    return Err((name, format!("{} values for {n} input tokens", values.len())));
                }
                Some(values) => {
                    if let Some(bad) = values.iter().find(|v| !v.is_finite()) {
                        return Err((name, format!("{bad} is not a finite number")));
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datum() -> Datum {
        Datum {
            tokens: vec![1, 2, 3],
            target_tokens: vec![2, 3, 4],
            weights: None,
            advantages: Some(vec![1.0; 3]),
            logprobs: Some(vec![-1.0; 3]),
        }
    }

    fn call(loss_fn: LossFn, data: Vec<Datum>) -> ForwardBackward {
        ForwardBackward { data, loss_fn, clip: ClipThresholds::default(), forward_only: false }
    }

    #[test]
    fn losses_round_trip_their_wire_names() {
        for loss in LossFn::ALL {
            assert_eq!(LossFn::parse(loss.as_str()), Some(loss));
            assert_eq!(serde_json::to_value(loss).unwrap(), loss.as_str());
        }
        assert_eq!(LossFn::parse("dro"), None);
    }

    #[test]
    fn a_bad_datum_is_named_by_its_index_and_input() {
        assert_eq!(call(LossFn::Ppo, vec![datum()]).check(10), Ok(()));
        let mut short = datum();
        short.advantages = Some(vec![1.0; 2]);
        let err = call(LossFn::Ppo, vec![datum(), short]).check(10).unwrap_err();
        assert_eq!(err.field, "data[1].loss_fn_inputs.advantages");
        assert!(err.message.contains("2 values for 3"), "{err}");
        let mut missing = datum();
        missing.logprobs = None;
        let err = call(LossFn::Cispo, vec![missing]).check(10).unwrap_err();
        assert_eq!(err.field, "data[0].loss_fn_inputs.logprobs");
        let err = call(LossFn::CrossEntropy, vec![datum()]).check(10).unwrap_err();
        assert_eq!(err.field, "data[0].loss_fn_inputs.advantages");
        assert!(err.message.contains("not an input of the cross_entropy loss"), "{err}");
        let mut far = datum();
        far.target_tokens[1] = 10;
        let err = call(LossFn::Ppo, vec![far]).check(10).unwrap_err();
        assert_eq!(err.field, "data[0].loss_fn_inputs.target_tokens");
        let mut nan = datum();
        nan.advantages = Some(vec![1.0, f32::NAN, 0.0]);
        assert!(call(LossFn::Ppo, vec![nan]).check(10).is_err());
        let err = call(LossFn::Ppo, vec![]).check(10).unwrap_err();
        assert_eq!(err.field, "data");
    }

    #[test]
    fn adam_params_name_the_field_out_of_range() {
        assert_eq!(AdamParams::default().check(), Ok(()));
        let bad = AdamParams { beta2: 1.0, ..AdamParams::default() };
        assert_eq!(bad.check().unwrap_err().0, "beta2");
        let bad = AdamParams { learning_rate: -1.0, ..AdamParams::default() };
        assert_eq!(bad.check().unwrap_err().0, "learning_rate");
        let parsed: AdamParams = serde_json::from_str(r#"{"learning_rate": 0.5}"#).unwrap();
        assert_eq!(parsed, AdamParams { learning_rate: 0.5, ..AdamParams::default() });
    }
}
