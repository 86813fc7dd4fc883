//! The grid of a sweep: axes given as `key=v1,v2,…` (hyperparameters of a job's
//! `method.reinforcement.hyperparameters`), every combination of their values, each run with
//! every seed.

use super::SweepError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use verity_core::spec::Hyperparameters;

/// One axis of the grid: a hyperparameter and the values it takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Axis {
    /// The hyperparameter (`loss`, `group_size`, `temperature`, …).
    pub key: String,
    /// Its values, in the order given.
    pub values: Vec<Value>,
}

impl Axis {
    /// Parses `key=v1,v2,…`. Each value is read as JSON when it is JSON (`8`, `0.7`, `true`,
    /// `null`, `[0.2,0.28]`), else as a string (`dapo`); commas inside brackets or braces do not
    /// split values.
    pub fn parse(arg: &str) -> Result<Axis, SweepError> {
        let bad =
            |message: &str| SweepError::Setting { arg: arg.to_string(), message: message.into() };
        let (key, values) = arg.split_once('=').ok_or_else(|| bad("expected KEY=V1,V2,…"))?;
        let key = key.trim();
        if key.is_empty() {
            return Err(bad("the hyperparameter's name is empty"));
        }
        if key == "seed" {
            return Err(bad("seeds are given with --seeds or --seed-list"));
        }
        let values: Vec<Value> = split_top_level(values)
            .into_iter()
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
            .map(|v| serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string())))
            .collect();
        if values.is_empty() {
            return Err(bad("no values"));
        }
        Ok(Axis { key: key.to_string(), values })
    }
}

/// Splits at the commas outside brackets, braces and quotes.
fn split_top_level(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut quoted, mut start) = (Vec::new(), 0i32, false, 0);
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '[' | '{' if !quoted => depth += 1,
            ']' | '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// One point of the grid: a value for each axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Setting {
    /// `(key, value)` per axis, in the axes' order.
    pub values: Vec<(String, Value)>,
}

impl Setting {
    /// `loss=dapo group_size=8` (`base` for the grid of no axes: the recipe as it is).
    pub fn label(&self) -> String {
        if self.values.is_empty() {
            return "base".into();
        }
        let shown: Vec<String> = self
            .values
            .iter()
            .map(|(key, value)| match value {
                Value::String(s) => format!("{key}={s}"),
                other => format!("{key}={other}"),
            })
            .collect();
        shown.join(" ")
    }

    /// The recipe `base` with this setting's values and `seed`, checked as a job's
    /// hyperparameters are (an error names the setting).
    pub fn hyperparameters(
        &self,
        base: &Map<String, Value>,
        seed: u64,
    ) -> Result<Hyperparameters, SweepError> {
        let mut recipe = base.clone();
        for (key, value) in &self.values {
            recipe.insert(key.clone(), value.clone());
        }
        recipe.insert("seed".into(), seed.into());
        let bad = |message: String| SweepError::Setting { arg: self.label(), message };
        let hp: Hyperparameters =
            serde_json::from_value(Value::Object(recipe)).map_err(|e| bad(e.to_string()))?;
        hp.validate("hyperparameters").map_err(|e| bad(format!("{}: {}", e.param, e.message)))?;
        Ok(hp)
    }
}

/// Every combination of the axes' values, the first axis varying slowest (one empty setting
/// for no axes).
pub fn settings(axes: &[Axis]) -> Vec<Setting> {
    let mut grid = vec![Setting { values: Vec::new() }];
    for axis in axes {
        grid = grid
            .into_iter()
            .flat_map(|setting| {
                axis.values.iter().map(move |value| {
                    let mut values = setting.values.clone();
                    values.push((axis.key.clone(), value.clone()));
                    Setting { values }
                })
            })
            .collect();
    }
    grid
}

/// A file name for the run of `setting` with `seed`: its label with every character other
/// than letters, digits, `.`, `-` and `=` replaced, and the seed.
pub fn run_file_stem(setting: &Setting, seed: u64) -> String {
    let label: String = setting
        .label()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '=') { c } else { '_' })
        .collect();
    format!("{label}__seed={seed}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_json_when_they_parse_and_strings_otherwise() {
        let axis = Axis::parse("loss=grpo,dapo").unwrap();
        assert_eq!(axis.values, [json!("grpo"), json!("dapo")]);
        let axis = Axis::parse("temperature= 0.7, 1.0").unwrap();
        assert_eq!(axis.values, [json!(0.7), json!(1.0)]);
        let axis = Axis::parse("clip_range=[0.2,0.28],[0.2,0.2]").unwrap();
        assert_eq!(axis.values, [json!([0.2, 0.28]), json!([0.2, 0.2])]);
        let axis = Axis::parse(r#"stop={"a":1,"b":"x,y"},null"#).unwrap();
        assert_eq!(axis.values, [json!({"a": 1, "b": "x,y"}), Value::Null]);
        for bad in ["loss", "=1,2", "loss=", "seed=1,2"] {
            assert!(Axis::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_grid_is_every_combination_with_the_first_axis_slowest() {
        let axes = [Axis::parse("loss=grpo,dapo").unwrap(), Axis::parse("group_size=4,8").unwrap()];
        let labels: Vec<String> = settings(&axes).iter().map(Setting::label).collect();
        assert_eq!(
            labels,
            [
                "loss=grpo group_size=4",
                "loss=grpo group_size=8",
                "loss=dapo group_size=4",
                "loss=dapo group_size=8"
            ]
        );
        assert_eq!(settings(&[])[0].label(), "base");
        assert_eq!(run_file_stem(&settings(&axes)[3], 11), "loss=dapo_group_size=8__seed=11");
    }

    #[test]
    fn a_settings_hyperparameters_are_the_recipe_with_its_values_and_seed_checked() {
        let base = json!({"group_size": 4, "max_steps": 3}).as_object().unwrap().clone();
        let setting = &settings(&[Axis::parse("loss=dapo").unwrap()])[0];
        let hp = setting.hyperparameters(&base, 23).unwrap();
        assert_eq!((hp.seed, hp.group_size()), (Some(23), 4));
        assert_eq!(hp.clip_range(), (0.2, 0.28), "dapo's clip-higher");
        let bad = &settings(&[Axis::parse("group_size=0").unwrap()])[0];
        let e = bad.hyperparameters(&base, 1).unwrap_err().to_string();
        assert!(e.contains("group_size=0") && e.contains("group_size"), "{e}");
        let unknown = &settings(&[Axis::parse("lr=1").unwrap()])[0];
        assert!(unknown.hyperparameters(&base, 1).is_err());
    }
}
