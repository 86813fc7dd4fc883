//! A recipe's stages as submitted, the references between them (`"{{stages.rl.fine_tuned_model}}"`)
//! and the checks that need no database: names, kinds, where a reference may stand and whether
//! what it names fits there.

use crate::budget::Caps;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// Most stages in one recipe.
pub const MAX_STAGES: usize = 16;

/// Longest stage name.
pub const MAX_STAGE_NAME: usize = 64;

/// What a stage runs: the queue row kinds a recipe can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageKind {
    /// A fine-tuning job (`POST /v1/fine_tuning/jobs`: supervised, DPO or reinforcement).
    FineTuningJob,
    /// A rejection-sampling run (`POST /v1/verity/rejection_sampling`).
    RejectionSampling,
    /// An evaluation report (`POST /v1/verity/evaluations`).
    Evaluation,
}

impl StageKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [StageKind; 3] =
        [StageKind::FineTuningJob, StageKind::RejectionSampling, StageKind::Evaluation];

    /// The stage's `type` (also the key of its body).
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::FineTuningJob => "fine_tuning_job",
            StageKind::RejectionSampling => "rejection_sampling",
            StageKind::Evaluation => "evaluation",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<StageKind> {
        StageKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The `jobs.kind` of the queue row that runs it.
    pub fn job_kind(self) -> &'static str {
        match self {
            StageKind::FineTuningJob => crate::queue::FINE_TUNING,
            StageKind::RejectionSampling => {
                crate::sampling_runs::RunKind::RejectionSampling.as_str()
            }
            StageKind::Evaluation => crate::sampling_runs::RunKind::Evaluation.as_str(),
        }
    }

    /// A fresh id for the queue row that runs it.
    pub fn new_job_id(self) -> String {
        match self {
            StageKind::FineTuningJob => crate::ids::job_id(),
            StageKind::RejectionSampling => {
                crate::sampling_runs::RunKind::RejectionSampling.new_id()
            }
            StageKind::Evaluation => crate::sampling_runs::RunKind::Evaluation.new_id(),
        }
    }

    /// The outputs a later stage can refer to, with what each is.
    pub fn outputs(self) -> &'static [(&'static str, ValueType)] {
        match self {
            StageKind::FineTuningJob => &[("fine_tuned_model", ValueType::Model)],
            StageKind::RejectionSampling => &[("file", ValueType::SupervisedFile)],
            StageKind::Evaluation => &[],
        }
    }
}

/// What a reference stands for, so that it can only stand where such a value goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// A model name (a fine-tuned model).
    Model,
    /// A file of supervised chat rows (`{"messages": […]}`), as rejection sampling writes.
    SupervisedFile,
}

impl ValueType {
    /// How errors call it.
    pub fn describe(self) -> &'static str {
        match self {
            ValueType::Model => "a model",
            ValueType::SupervisedFile => "a supervised chat file",
        }
    }
}

/// `{{stages.<stage>.<output>}}`: an earlier stage's output, filled in when this stage starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The stage named.
    pub stage: String,
    /// Its output named.
    pub output: String,
}

impl Reference {
    /// The reference `text` holds: `None` when it names no stage (a grader's `{{item.x}}` and
    /// `{{sample.output_text}}` are left alone), an error when it names one but is not exactly
    /// one well-formed reference.
    pub fn parse(text: &str) -> Option<Result<Reference, String>> {
        let names_a_stage = text
            .match_indices("{{")
            .any(|(at, _)| text[at + 2..].trim_start().starts_with("stages."));
        if !names_a_stage {
            return None;
        }
        let malformed = || {
            Err(format!(
                "{text:?} is not a reference: write the whole value as {{{{stages.<stage>.<output>}}}}"
            ))
        };
        let trimmed = text.trim();
        let Some(inner) = trimmed.strip_prefix("{{").and_then(|t| t.strip_suffix("}}")) else {
            return Some(malformed());
        };
        let parts: Vec<&str> = inner.trim().split('.').collect();
        match parts.as_slice() {
            ["stages", stage, output] if !stage.is_empty() && !output.is_empty() => {
                Some(Ok(Reference { stage: stage.to_string(), output: output.to_string() }))
            }
            _ => Some(malformed()),
        }
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{{{stages.{}.{}}}}}", self.stage, self.output)
    }
}

/// A recipe field that is wrong: its JSON path from the request's root and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipeError {
    /// JSON path of the field (`stages[2].fine_tuning_job.model`).
    pub param: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for RecipeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.param, self.message)
    }
}

fn error(param: impl Into<String>, message: impl Into<String>) -> RecipeError {
    RecipeError { param: param.into(), message: message.into() }
}

/// One stage: its name, what it runs and the body it would have on its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// Unique within the recipe; what references name.
    pub name: String,
    /// What it runs.
    pub kind: StageKind,
    /// The body of the request it stands for, references and all.
    pub body: Map<String, Value>,
    /// A fine-tuning stage that trains the recipe's base model (the root base of its first
    /// model) rather than a model named in its body: distillation into a fresh base.
    pub fresh_base: bool,
    /// The references in `body`: each field's path inside the body and what it refers to.
    pub references: Vec<(String, Reference)>,
}

/// The check before each reinforcement stage: a difficulty profile of the stage's training file
/// on the model it starts from; above `max_zero_advantage_fraction` predicted groups without an
/// advantage, the recipe pauses instead of spending the stage on steps that cannot move the
/// weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Guard {
    /// Highest predicted fraction of zero-advantage groups a stage may start with (0–1).
    pub max_zero_advantage_fraction: f64,
    /// Prompts the profile samples (evenly spaced over the file).
    pub prompts: usize,
}

impl Default for Guard {
    fn default() -> Guard {
        Guard { max_zero_advantage_fraction: 0.9, prompts: 16 }
    }
}

impl Guard {
    /// Reads a request's `guard`: absent for the default, `false` or `null` for none, or
    /// `{max_zero_advantage_fraction?, prompts?}`.
    pub fn parse(value: Option<&Value>) -> Result<Option<Guard>, RecipeError> {
        let object = match value {
            None => return Ok(Some(Guard::default())),
            Some(Value::Null) | Some(Value::Bool(false)) => return Ok(None),
            Some(Value::Bool(true)) => return Ok(Some(Guard::default())),
            Some(Value::Object(object)) => object,
            Some(_) => {
                return Err(error("guard", "false, or {max_zero_advantage_fraction, prompts}"))
            }
        };
        let mut guard = Guard::default();
        for (key, value) in object {
            match key.as_str() {
                "max_zero_advantage_fraction" => {
                    guard.max_zero_advantage_fraction =
                        value.as_f64().filter(|f| (0.0..=1.0).contains(f)).ok_or_else(|| {
                            error("guard.max_zero_advantage_fraction", "a number from 0 to 1")
                        })?;
                }
                "prompts" => {
                    guard.prompts = value
                        .as_u64()
                        .filter(|n| (1..=crate::difficulty::MAX_PROMPTS as u64).contains(n))
                        .ok_or_else(|| {
                            let max = crate::difficulty::MAX_PROMPTS;
                            error("guard.prompts", format!("an integer from 1 to {max}"))
                        })? as usize;
                }
                other => {
                    return Err(error(
                        format!("guard.{other}"),
                        "unknown field (a guard has max_zero_advantage_fraction and prompts)",
                    ))
                }
            }
        }
        Ok(Some(guard))
    }

    /// The guard as a request writes it.
    pub fn to_value(guard: Option<&Guard>) -> Value {
        match guard {
            Some(g) => serde_json::json!({
                "max_zero_advantage_fraction": g.max_zero_advantage_fraction,
                "prompts": g.prompts,
            }),
            None => Value::Bool(false),
        }
    }
}

/// A recipe's stages, in the order they run, with every reference checked.
#[derive(Debug, Clone, PartialEq)]
pub struct RecipeSpec {
    /// The stages.
    pub stages: Vec<Stage>,
    /// The seed of every stage whose body sets none.
    pub seed: Option<i64>,
    /// The check before each reinforcement stage (none when turned off).
    pub guard: Option<Guard>,
    /// Caps on the whole recipe: the wall seconds and tokens its stages' jobs use together.
    pub budget: Caps,
}

fn check_stage_name(param: &str, name: &str) -> Result<(), RecipeError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_STAGE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(error(
            param,
            format!(
                "stage name {name:?} must be 1-{MAX_STAGE_NAME} characters of a-z, 0-9, _ and -"
            ),
        ))
    }
}

/// Every string leaf of `value` under `path`, with its path.
fn string_leaves<'a>(path: String, value: &'a Value, out: &mut Vec<(String, &'a str)>) {
    match value {
        Value::String(text) => out.push((path, text)),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                string_leaves(format!("{path}[{i}]"), item, out);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                let child = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                string_leaves(child, item, out);
            }
        }
        _ => {}
    }
}

/// The method `type` of a fine-tuning body (`supervised` when it names none, as OpenAI's legacy
/// shape).
fn method_type(body: &Map<String, Value>) -> &str {
    match body.get("method") {
        None | Some(Value::Null) => "supervised",
        Some(method) => method.get("type").and_then(Value::as_str).unwrap_or(""),
    }
}

/// What may stand at `path` of a `kind` body, or why nothing may.
fn slot(kind: StageKind, path: &str, body: &Map<String, Value>) -> Result<ValueType, String> {
    let is_model_list_item = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('['))
            .and_then(|rest| rest.strip_suffix(']'))
            .is_some_and(|index| index.parse::<usize>().is_ok())
    };
    match (kind, path) {
        (StageKind::FineTuningJob | StageKind::RejectionSampling, "model") => Ok(ValueType::Model),
        (StageKind::FineTuningJob, "training_file" | "validation_file") => {
            match method_type(body) {
                "supervised" => Ok(ValueType::SupervisedFile),
                other => Err(format!(
                    "an earlier stage's file is a supervised chat file: it can train a \
                     supervised job, not a {other:?} one"
                )),
            }
        }
        (StageKind::Evaluation, _) if is_model_list_item("models") => Ok(ValueType::Model),
        _ => Err(format!(
            "a reference may stand only where an earlier stage's output goes ({})",
            match kind {
                StageKind::FineTuningJob => "model, training_file, validation_file",
                StageKind::RejectionSampling => "model",
                StageKind::Evaluation => "an item of models",
            }
        )),
    }
}

impl Stage {
    /// Reads stage `index` of a request (`{"name", "type", "<type>": {…}, "fresh_base"}`),
    /// checking its references against the stages before it.
    pub fn parse(index: usize, value: &Value, earlier: &[Stage]) -> Result<Stage, RecipeError> {
        let at = format!("stages[{index}]");
        let object = value
            .as_object()
            .ok_or_else(|| error(&at, "a stage is an object with name and type"))?;
        let name = match object.get("name") {
            Some(Value::String(name)) => name.clone(),
            _ => return Err(error(format!("{at}.name"), "missing `name` (a string)")),
        };
        check_stage_name(&format!("{at}.name"), &name)?;
        if earlier.iter().any(|s| s.name == name) {
            return Err(error(format!("{at}.name"), format!("two stages are named {name:?}")));
        }
        let kinds = || StageKind::ALL.map(StageKind::as_str).join(", ");
        let kind = match object.get("type") {
            Some(Value::String(kind)) => StageKind::parse(kind).ok_or_else(|| {
                error(format!("{at}.type"), format!("unknown stage type {kind:?}; use {}", kinds()))
            })?,
            _ => return Err(error(format!("{at}.type"), format!("missing `type` ({})", kinds()))),
        };
        let at_body = format!("{at}.{}", kind.as_str());
        let body = match object.get(kind.as_str()) {
            Some(Value::Object(body)) => body.clone(),
            _ => {
                return Err(error(
                    &at_body,
                    format!(
                        "missing `{}`: the body of the request the stage stands for",
                        kind.as_str()
                    ),
                ))
            }
        };
        let fresh_base = match object.get("fresh_base") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(flag)) => *flag,
            Some(_) => return Err(error(format!("{at}.fresh_base"), "must be true or false")),
        };
        if let Some(key) = object
            .keys()
            .find(|k| !["name", "type", "fresh_base", kind.as_str()].contains(&k.as_str()))
        {
            return Err(error(
                format!("{at}.{key}"),
                format!(
                    "unknown stage field {key:?} (a stage has name, type, fresh_base and its body \
                     under {:?})",
                    kind.as_str()
                ),
            ));
        }
        if fresh_base {
            if kind != StageKind::FineTuningJob {
                return Err(error(
                    format!("{at}.fresh_base"),
                    "only a fine_tuning_job stage trains a fresh base",
                ));
            }
            if body.get("model").is_some_and(|m| !m.is_null()) {
                return Err(error(
                    format!("{at_body}.model"),
                    "a fresh_base stage trains the recipe's base model: leave `model` out",
                ));
            }
            if index == 0 {
                return Err(error(
                    format!("{at}.fresh_base"),
                    "the first stage has no base to start again from: name its model",
                ));
            }
        }
        let mut leaves = Vec::new();
        for (key, value) in &body {
            string_leaves(key.clone(), value, &mut leaves);
        }
        let mut references = Vec::new();
        for (path, text) in leaves {
            let Some(parsed) = Reference::parse(text) else { continue };
            let param = format!("{at_body}.{path}");
            let reference = parsed.map_err(|m| error(&param, m))?;
            let wanted = slot(kind, &path, &body).map_err(|m| error(&param, m))?;
            let Some(source) = earlier.iter().find(|s| s.name == reference.stage) else {
                let names: Vec<&str> = earlier.iter().map(|s| s.name.as_str()).collect();
                return Err(error(
                    &param,
                    format!(
                        "{reference} names no earlier stage (stages before this one: {})",
                        if names.is_empty() { "none".to_string() } else { names.join(", ") }
                    ),
                ));
            };
            let Some((_, found)) =
                source.kind.outputs().iter().find(|(o, _)| *o == reference.output)
            else {
                let outputs: Vec<&str> = source.kind.outputs().iter().map(|(o, _)| *o).collect();
                return Err(error(
                    &param,
                    format!(
                        "a {} stage has no output {:?} (it has: {})",
                        source.kind.as_str(),
                        reference.output,
                        if outputs.is_empty() { "none".to_string() } else { outputs.join(", ") }
                    ),
                ));
            };
            if *found != wanted {
                return Err(error(
                    &param,
                    format!(
                        "{reference} is {}, but {} goes here",
                        found.describe(),
                        wanted.describe()
                    ),
                ));
            }
            references.push((path, reference));
        }
        Ok(Stage { name, kind, body, fresh_base, references })
    }

    /// Whether it is a reinforcement job (the stages a [`Guard`] checks).
    pub fn is_reinforcement(&self) -> bool {
        self.kind == StageKind::FineTuningJob && method_type(&self.body) == "reinforcement"
    }

    /// The stage as a request holds it.
    pub fn to_value(&self) -> Value {
        let mut object = Map::new();
        object.insert("name".into(), Value::String(self.name.clone()));
        object.insert("type".into(), Value::String(self.kind.as_str().into()));
        object.insert(self.kind.as_str().into(), Value::Object(self.body.clone()));
        if self.fresh_base {
            object.insert("fresh_base".into(), Value::Bool(true));
        }
        Value::Object(object)
    }

    /// The model the stage starts from when written literally (`model`, or an evaluation's
    /// first of `models`), if any.
    pub fn literal_model(&self) -> Option<&str> {
        let model = match self.kind {
            StageKind::Evaluation => self.body.get("models").and_then(|m| m.get(0)),
            _ => self.body.get("model"),
        }?;
        model.as_str().filter(|m| Reference::parse(m).is_none())
    }

    /// The body with every reference replaced by `resolve`'s value for it (given the field's
    /// path and the reference), the base model in
    /// `model` for a fresh-base stage and the recipe's seed where the body sets none; the paths
    /// `resolve` had no value for keep their reference and are returned.
    pub fn render(
        &self,
        base_model: &str,
        seed: Option<i64>,
        resolve: impl Fn(&str, &Reference) -> Option<Value>,
    ) -> (Map<String, Value>, Vec<String>) {
        let mut body = self.body.clone();
        let mut unresolved = Vec::new();
        for (path, reference) in &self.references {
            match resolve(path, reference) {
                Some(value) => set_path(&mut body, path, value),
                None => unresolved.push(path.clone()),
            }
        }
        if self.fresh_base {
            body.insert("model".into(), Value::String(base_model.to_string()));
        }
        if let Some(seed) = seed {
            if body.get("seed").is_none_or(Value::is_null) {
                body.insert("seed".into(), Value::from(seed));
            }
        }
        (body, unresolved)
    }
}

/// One step of a path: an object key or a list index.
enum Segment {
    Key(String),
    Index(usize),
}

/// The steps of a path as [`string_leaves`] writes it (`a.b[2].c`).
fn segments(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let mut pieces = part.split('[');
        out.push(Segment::Key(pieces.next().unwrap_or_default().to_string()));
        out.extend(pieces.filter_map(|p| p.trim_end_matches(']').parse().ok().map(Segment::Index)));
    }
    out
}

/// Sets the leaf at `path` of `body` to `value`; a path that leads nowhere changes nothing.
fn set_path(body: &mut Map<String, Value>, path: &str, value: Value) {
    let steps = segments(path);
    let Some((Segment::Key(first), rest)) = steps.split_first() else { return };
    let Some(mut target) = body.get_mut(first) else { return };
    for step in rest {
        let next = match (step, target) {
            (Segment::Key(key), Value::Object(map)) => map.get_mut(key),
            (Segment::Index(i), Value::Array(items)) => items.get_mut(*i),
            _ => None,
        };
        let Some(next) = next else { return };
        target = next;
    }
    *target = value;
}

impl RecipeSpec {
    /// Reads and checks a recipe's `stages` (1 to [`MAX_STAGES`]), `seed` and `guard`
    /// ([`Guard::parse`]); no budget ([`RecipeSpec::with_budget`] sets one).
    pub fn parse(
        stages: &Value,
        seed: Option<i64>,
        guard: Option<&Value>,
    ) -> Result<RecipeSpec, RecipeError> {
        let guard = Guard::parse(guard)?;
        let items = stages
            .as_array()
            .ok_or_else(|| error("stages", "missing `stages` (a list of stages)"))?;
        if items.is_empty() || items.len() > MAX_STAGES {
            return Err(error("stages", format!("a recipe has 1 to {MAX_STAGES} stages")));
        }
        let mut parsed: Vec<Stage> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let stage = Stage::parse(i, item, &parsed)?;
            parsed.push(stage);
        }
        Ok(RecipeSpec { stages: parsed, seed, guard, budget: Caps::default() })
    }

    /// The spec with the caps a request's `budget` sets (`{max_wall_seconds?, max_tokens?}`,
    /// as a job's budget; absent or null for none).
    pub fn with_budget(mut self, budget: Option<&Value>) -> Result<RecipeSpec, RecipeError> {
        if let Some(body) = budget.filter(|b| !b.is_null()) {
            self.budget =
                Caps::default().apply(body, "budget").map_err(|e| error(e.field, e.message))?;
        }
        Ok(self)
    }

    /// The spec as stored (`{"stages": […], "seed": …, "guard": …}`); [`RecipeSpec::from_stored`]
    /// reads it.
    pub fn to_value(&self) -> Value {
        serde_json::json!({
            "stages": self.stages.iter().map(Stage::to_value).collect::<Vec<_>>(),
            "seed": self.seed,
            "guard": Guard::to_value(self.guard.as_ref()),
            "budget": self.budget,
        })
    }

    /// Reads a stored spec.
    pub fn from_stored(value: &Value) -> Result<RecipeSpec, RecipeError> {
        let seed = value.get("seed").and_then(Value::as_i64);
        let stages = value.get("stages").unwrap_or(&Value::Null);
        RecipeSpec::parse(stages, seed, Some(value.get("guard").unwrap_or(&Value::Bool(false))))?
            .with_budget(value.get("budget"))
    }

    /// The first model a stage names literally: the recipe's base is its root base.
    pub fn first_model(&self) -> Option<(usize, &str)> {
        self.stages.iter().enumerate().find_map(|(i, s)| s.literal_model().map(|m| (i, m)))
    }

    /// The index of the stage called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.name == name)
    }

    /// For each stage, the model it will start from when its references are not yet filled in:
    /// a literal model as written, a reference to an earlier stage's fine-tuned model as that
    /// stage's own starting model (a fine-tuned model has its base's architecture and
    /// tokenizer), a fresh base as `base_model`. Used to check stage bodies before the models
    /// they name exist.
    pub fn stand_in_models(&self, base_model: &str) -> Vec<BTreeMap<String, String>> {
        let mut starts: Vec<Option<String>> = Vec::with_capacity(self.stages.len());
        let mut stand_ins = Vec::with_capacity(self.stages.len());
        for stage in &self.stages {
            let mut by_path = BTreeMap::new();
            for (path, reference) in &stage.references {
                let Some(source) = self.position(&reference.stage) else { continue };
                let is_model = self.stages[source]
                    .kind
                    .outputs()
                    .iter()
                    .any(|(output, ty)| *output == reference.output && *ty == ValueType::Model);
                if let Some(model) = starts[source].clone().filter(|_| is_model) {
                    by_path.insert(path.clone(), model);
                }
            }
            let start = if stage.fresh_base {
                Some(base_model.to_string())
            } else if stage.kind == StageKind::Evaluation {
                None
            } else {
                by_path.get("model").cloned().or_else(|| stage.literal_model().map(str::to_string))
            };
            starts.push(start);
            stand_ins.push(by_path);
        }
        stand_ins
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn r1() -> Value {
        json!([
            {"name": "sft", "type": "fine_tuning_job", "fine_tuning_job": {
                "model": "base-m", "training_file": "file-a", "method": {"type": "supervised"}}},
            {"name": "rl", "type": "fine_tuning_job", "fine_tuning_job": {
                "model": "{{stages.sft.fine_tuned_model}}", "training_file": "file-b",
                "method": {"type": "reinforcement", "reinforcement": {"grader": {}}}}},
            {"name": "rs", "type": "rejection_sampling", "rejection_sampling": {
                "model": "{{ stages.rl.fine_tuned_model }}", "file": "file-b", "grader": {}}},
            {"name": "distill", "type": "fine_tuning_job", "fresh_base": true, "fine_tuning_job": {
                "training_file": "{{stages.rs.file}}", "method": {"type": "supervised"}}},
            {"name": "eval", "type": "evaluation", "evaluation": {
                "models": ["base-m", "{{stages.sft.fine_tuned_model}}", "{{stages.rl.fine_tuned_model}}",
                           "{{stages.distill.fine_tuned_model}}"], "file": "file-c", "grader": {}}}
        ])
    }

    #[test]
    fn the_r1_recipe_parses_with_its_references() {
        let spec = RecipeSpec::parse(&r1(), Some(7), None).unwrap();
        assert_eq!(spec.stages.len(), 5);
        assert_eq!(spec.stages[1].references[0].0, "model");
        assert_eq!(spec.stages[4].references.len(), 3);
        assert_eq!(spec.first_model(), Some((0, "base-m")));
        let again = RecipeSpec::from_stored(&spec.to_value()).unwrap();
        assert_eq!(again, spec);
    }

    #[test]
    fn references_render_and_fresh_base_takes_the_base() {
        let spec = RecipeSpec::parse(&r1(), Some(7), None).unwrap();
        let outputs = |_: &str, r: &Reference| match (r.stage.as_str(), r.output.as_str()) {
            ("rs", "file") => Some(json!("file-kept")),
            (stage, _) => Some(json!(format!("ft:{stage}"))),
        };
        let (body, unresolved) = spec.stages[3].render("base-m", spec.seed, outputs);
        assert!(unresolved.is_empty());
        assert_eq!(body["model"], "base-m");
        assert_eq!(body["training_file"], "file-kept");
        assert_eq!(body["seed"], 7);
        let (body, _) = spec.stages[4].render("base-m", None, outputs);
        assert_eq!(body["models"], json!(["base-m", "ft:sft", "ft:rl", "ft:distill"]));
        let (body, unresolved) = spec.stages[3].render("base-m", None, |_, _| None);
        assert_eq!(unresolved, vec!["training_file".to_string()]);
        assert_eq!(body["training_file"], "{{stages.rs.file}}");
    }

    #[test]
    fn stand_ins_are_the_models_stages_start_from() {
        let spec = RecipeSpec::parse(&r1(), None, None).unwrap();
        let stand_ins = spec.stand_in_models("base-m");
        assert_eq!(stand_ins[1]["model"], "base-m");
        assert_eq!(stand_ins[2]["model"], "base-m");
        assert_eq!(stand_ins[4]["models[3]"], "base-m");
        assert!(!stand_ins[3].contains_key("training_file"));
    }

    fn first_error(stages: Value) -> RecipeError {
        RecipeSpec::parse(&stages, None, None).unwrap_err()
    }

    #[test]
    fn bad_stages_are_refused_naming_the_field() {
        let mut stages = r1();
        stages[2]["rejection_sampling"]["model"] = json!("{{stages.eval.fine_tuned_model}}");
        let e = first_error(stages);
        assert_eq!(e.param, "stages[2].rejection_sampling.model");
        assert!(e.message.contains("no earlier stage"), "{}", e.message);

        let mut stages = r1();
        stages[1]["fine_tuning_job"]["model"] = json!("{{stages.sft.fine_tuned_modle}}");
        let e = first_error(stages);
        assert_eq!(e.param, "stages[1].fine_tuning_job.model");
        assert!(e.message.contains("fine_tuned_model"), "{}", e.message);

        let mut stages = r1();
        stages[3]["fine_tuning_job"]["training_file"] = json!("{{stages.rl.fine_tuned_model}}");
        let e = first_error(stages);
        assert!(
            e.message.contains("is a model, but a supervised chat file goes here"),
            "{}",
            e.message
        );

        let mut stages = r1();
        stages[1]["fine_tuning_job"]["training_file"] = json!("{{stages.sft.fine_tuned_model}}");
        let e = first_error(stages);
        assert_eq!(e.param, "stages[1].fine_tuning_job.training_file");
        assert!(e.message.contains("not a \"reinforcement\" one"), "{}", e.message);

        let mut stages = r1();
        stages[1]["fine_tuning_job"]["suffix"] = json!("{{stages.sft.fine_tuned_model}}");
        assert_eq!(first_error(stages).param, "stages[1].fine_tuning_job.suffix");

        let mut stages = r1();
        stages[1]["fine_tuning_job"]["model"] = json!("x-{{stages.sft.fine_tuned_model}}");
        assert!(first_error(stages).message.contains("not a reference"));

        let mut stages = r1();
        stages[1]["name"] = json!("sft");
        assert_eq!(first_error(stages).param, "stages[1].name");

        let mut stages = r1();
        stages[1]["type"] = json!("grpo");
        assert_eq!(first_error(stages).param, "stages[1].type");

        let mut stages = r1();
        stages[3]["fine_tuning_job"]["model"] = json!("base-m");
        assert_eq!(first_error(stages).param, "stages[3].fine_tuning_job.model");

        let mut stages = r1();
        stages[0]["extra"] = json!(1);
        assert_eq!(first_error(stages).param, "stages[0].extra");

        assert_eq!(first_error(json!([])).param, "stages");
    }

    #[test]
    fn the_guard_is_on_by_default_and_can_be_tuned_or_turned_off() {
        let spec = RecipeSpec::parse(&r1(), None, None).unwrap();
        assert_eq!(spec.guard, Some(Guard::default()));
        assert!(spec.stages[1].is_reinforcement() && !spec.stages[0].is_reinforcement());
        let off = RecipeSpec::parse(&r1(), None, Some(&json!(false))).unwrap();
        assert_eq!(RecipeSpec::from_stored(&off.to_value()).unwrap().guard, None);
        let tuned = json!({"max_zero_advantage_fraction": 0.5, "prompts": 8});
        let tuned = RecipeSpec::parse(&r1(), None, Some(&tuned)).unwrap();
        let again = RecipeSpec::from_stored(&tuned.to_value()).unwrap();
        assert_eq!(again.guard, Some(Guard { max_zero_advantage_fraction: 0.5, prompts: 8 }));
        for (bad, param) in [
            (json!({"prompts": 0}), "guard.prompts"),
            (json!({"max_zero_advantage_fraction": 2}), "guard.max_zero_advantage_fraction"),
            (json!({"limit": 1}), "guard.limit"),
            (json!(3), "guard"),
        ] {
            assert_eq!(RecipeSpec::parse(&r1(), None, Some(&bad)).unwrap_err().param, param);
        }
    }

    #[test]
    fn grader_templates_are_not_references() {
        for text in ["{{item.answer}}", "{{ sample.output_text }}", "plain", "{{stages}}"] {
            assert_eq!(Reference::parse(text), None, "{text}");
        }
        assert!(Reference::parse("see {{ stages.a.b }} here").unwrap().is_err());
        let mut stages = r1();
        stages[1]["fine_tuning_job"]["method"]["reinforcement"]["grader"] = json!({"type": "string_check", "input": "{{sample.output_text}}", "reference": "{{item.answer}}"});
        let spec = RecipeSpec::parse(&stages, None, None).unwrap();
        assert_eq!(spec.stages[1].references.len(), 1, "only the model");
    }

    #[test]
    fn a_budget_is_a_job_budget_for_the_whole_recipe() {
        let budget = json!({"max_wall_seconds": 3600, "max_tokens": 100000});
        let spec =
            RecipeSpec::parse(&r1(), None, None).unwrap().with_budget(Some(&budget)).unwrap();
        assert_eq!(spec.budget, Caps { max_wall_seconds: Some(3600), max_tokens: Some(100000) });
        assert_eq!(RecipeSpec::from_stored(&spec.to_value()).unwrap().budget, spec.budget);
        let none = RecipeSpec::parse(&r1(), None, None).unwrap();
        assert_eq!(RecipeSpec::from_stored(&none.to_value()).unwrap().budget, Caps::default());
        let bad = none.with_budget(Some(&json!({"max_wall_seconds": 0}))).unwrap_err();
        assert_eq!(bad.param, "budget.max_wall_seconds");
    }

    #[test]
    fn set_path_reaches_list_items_and_ignores_dead_ends() {
        let mut body = json!({"models": ["a", "b"], "x": {"y": "z"}}).as_object().unwrap().clone();
        set_path(&mut body, "models[1]", json!("B"));
        set_path(&mut body, "x.y", json!("Z"));
        set_path(&mut body, "nope[3]", json!("?"));
        assert_eq!(Value::Object(body), json!({"models": ["a", "B"], "x": {"y": "Z"}}));
    }
}
