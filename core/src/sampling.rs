//! How completions are sampled: the one place the ranges and defaults of sampling settings are
//! defined. A job's hyperparameters, OpenAI's inference requests and the sampling runs check
//! their fields with these rules; the worker converts each of them into its `SamplingParams`.

use crate::response_format::ResponseFormat;
use crate::spec::Hyperparameters;
use serde::{Deserialize, Serialize};

/// Largest sampling temperature (OpenAI's range is 0 to 2).
pub const MAX_TEMPERATURE: f64 = 2.0;
/// Most stop strings a request may set (as OpenAI's `stop`).
pub const MAX_STOP_STRINGS: usize = 4;
/// Longest completion a sampling run may ask for, in tokens.
pub const MAX_COMPLETION_TOKENS: usize = 32_768;
/// Completion budget when a sampling run does not set one, in tokens.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Checks a temperature: finite, 0 (greedy) to [`MAX_TEMPERATURE`]; the error is the message.
pub fn check_temperature(temperature: f64) -> Result<(), String> {
    if temperature.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&temperature) {
        Ok(())
    } else {
        Err(format!("must be between 0 and {MAX_TEMPERATURE}"))
    }
}

/// Checks a nucleus mass: in (0, 1]; the error is the message.
pub fn check_top_p(top_p: f64) -> Result<(), String> {
    if top_p.is_finite() && top_p > 0.0 && top_p <= 1.0 {
        Ok(())
    } else {
        Err("must be in (0, 1]".to_string())
    }
}

/// Checks stop strings: at most [`MAX_STOP_STRINGS`], none empty; the error is the message.
pub fn check_stop(stop: &[String]) -> Result<(), String> {
    if stop.len() <= MAX_STOP_STRINGS && !stop.iter().any(String::is_empty) {
        Ok(())
    } else {
        Err(format!("at most {MAX_STOP_STRINGS} non-empty strings"))
    }
}

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
    fn the_rules_accept_openai_s_ranges_and_name_what_they_refuse() {
        for t in [0.0, 1.0, 2.0] {
            check_temperature(t).unwrap();
        }
        for t in [-0.1, 2.01, f64::NAN] {
            assert_eq!(check_temperature(t).unwrap_err(), "must be between 0 and 2");
        }
        check_top_p(1.0).unwrap();
        for p in [0.0, 1.5, f64::NAN] {
            check_top_p(p).unwrap_err();
        }
        check_stop(&["a".into(), "b".into(), "c".into(), "d".into()]).unwrap();
        check_stop(&vec!["a".to_string(); 5]).unwrap_err();
        check_stop(&["".into()]).unwrap_err();
    }

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
