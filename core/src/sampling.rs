//! How completions are sampled: the sampling runs' settings and defaults, and the ranges every
//! setting is checked with (defined in `verity_verifiers::sampling`, the lowest crate that checks
//! them: model graders' judges do too). A job's hyperparameters, OpenAI's inference requests and
//! the sampling runs check their fields with these rules; the worker converts each of them into
//! its `SamplingParams`.

use crate::response_format::ResponseFormat;
use crate::spec::Hyperparameters;
use serde::{Deserialize, Serialize};

pub use verity_verifiers::sampling::{
    check_stop, check_temperature, check_top_p, MAX_STOP_STRINGS, MAX_TEMPERATURE,
};

/// Longest completion a sampling run may ask for, in tokens.
pub const MAX_COMPLETION_TOKENS: usize = 32_768;
/// Completion budget when a sampling run does not set one, in tokens.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// A setting that is out of range: the field and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSetting {
    /// The request field at fault.
    pub param: String,
    /// What is wrong.
    pub message: String,
}

impl InvalidSetting {
    /// The field `param` is wrong because of `message`.
    pub fn new(param: &str, message: impl Into<String>) -> Self {
        InvalidSetting { param: param.to_string(), message: message.into() }
    }
}

/// How a sampling run's completions are sampled (one set for every model of a run, so they are
/// comparable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingSettings {
    /// Softmax temperature (0 = greedy; default 1, the temperature pass@k is meant for).
    #[serde(default = "one")]
    pub temperature: f64,
    /// Nucleus mass kept (default 1).
    #[serde(default = "one")]
    pub top_p: f64,
    /// Longest completion in tokens (default [`DEFAULT_MAX_TOKENS`]).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Texts that end a completion.
    #[serde(default)]
    pub stop: Vec<String>,
    /// OpenAI's structured outputs (graders read `sample.output_json` with a JSON format).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
}

fn one() -> f64 {
    1.0
}

fn default_max_tokens() -> usize {
    DEFAULT_MAX_TOKENS
}

impl Default for SamplingSettings {
    fn default() -> Self {
        SamplingSettings {
            temperature: one(),
            top_p: one(),
            max_tokens: DEFAULT_MAX_TOKENS,
            stop: Vec::new(),
            response_format: None,
        }
    }
}

impl SamplingSettings {
    /// The settings a job's training samples with (its recipe's temperature, nucleus, completion
    /// budget and stop strings, and the job's `response_format`): what a run that mirrors a job
    /// (an evaluation of its models, a difficulty profile of its file) samples with.
    pub fn of_recipe(hp: &Hyperparameters, response_format: Option<ResponseFormat>) -> Self {
        SamplingSettings {
            temperature: hp.temperature,
            top_p: hp.top_p,
            max_tokens: hp.max_completion_tokens(),
            stop: hp.stop.clone(),
            response_format,
        }
    }

    /// Checks the ranges (temperature 0–2, top_p in (0, 1], max_tokens 1–32768, ≤ 4 stops).
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        check_temperature(self.temperature).map_err(|m| InvalidSetting::new("temperature", m))?;
        check_top_p(self.top_p).map_err(|m| InvalidSetting::new("top_p", m))?;
        if !(1..=MAX_COMPLETION_TOKENS).contains(&self.max_tokens) {
            return Err(InvalidSetting::new(
                "max_tokens",
                format!("must be between 1 and {MAX_COMPLETION_TOKENS}"),
            ));
        }
        check_stop(&self.stop).map_err(|m| InvalidSetting::new("stop", m))?;
        if let Some(Err(e)) = self.response_format.as_ref().map(|f| f.validate()) {
            return Err(InvalidSetting::new(&format!("response_format.{}", e.field), e.message));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recipe_s_settings_are_the_job_s_sampling() {
        let hp =
            Hyperparameters { temperature: 0.7, stop: vec!["\n\n".into()], ..Default::default() };
        let s = SamplingSettings::of_recipe(&hp, None);
        assert_eq!((s.temperature, s.top_p, s.stop.clone()), (0.7, hp.top_p, hp.stop.clone()));
        assert_eq!(s.max_tokens, hp.max_completion_tokens());
        s.validate().unwrap();
    }
}
