//! The ranges of sampling settings, defined once for every crate that checks them: a job's
//! hyperparameters, OpenAI's inference requests and the sampling runs (through
//! `verity_core::sampling`) and the judges of model graders (`sampling_params`).

/// Largest sampling temperature (OpenAI's range is 0 to 2).
pub const MAX_TEMPERATURE: f64 = 2.0;
/// Most stop strings a request may set (as OpenAI's `stop`).
pub const MAX_STOP_STRINGS: usize = 4;

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
}
