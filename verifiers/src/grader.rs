//! A compiled grader: a checked spec plus its parsed templates, patterns and formula.

use std::collections::BTreeMap;
use std::sync::Arc;

use regex::Regex;
use serde_json::Value;
use thiserror::Error;

use crate::embed::{cosine_similarity, SharedEmbedder};
use crate::formula::Formula;
use crate::graders::model::JudgeTemplate;
use crate::graders::{constraints, format, model, string_check, text_similarity};
use crate::judge::{Judge, JudgeCache, JudgePrompt, DEFAULT_CACHE_ENTRIES};
use crate::result::{ErrorKind, GradeResult};
use crate::sample::Sample;
use crate::sandbox::SandboxConfig;
use crate::spec::{
    CodeScoring, ConstraintCheck, FormatPreset, GraderSpec, MathExtract, SimilarityMetric,
    StringOperation,
};
use crate::template::{MissingField, Template};
use crate::{code, math, python};

/// One problem of a grader spec, located by a JSON path such as `graders.acc.reference`.
#[derive(Debug, Clone, PartialEq, Eq, Error, serde::Serialize)]
#[error("{path}: {message}")]
pub struct SpecError {
    /// JSON path of the offending value (`.` when the whole document).
    pub path: String,
    /// What is wrong.
    pub message: String,
}

/// A grader spec that failed to parse or check.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid grader: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidGrader(pub Vec<SpecError>);

/// A grader ready to grade rows; cheap to share across threads.
#[derive(Debug, Clone)]
pub struct Grader {
    spec: GraderSpec,
    compiled: Compiled,
    sandbox: Arc<SandboxConfig>,
    judge: Option<Arc<JudgeCache>>,
}

#[derive(Debug, Clone)]
enum Compiled {
    StringCheck {
        input: Template,
        reference: Template,
        operation: StringOperation,
    },
    TextSimilarity {
        input: Template,
        reference: Template,
        metric: SimilarityMetric,
        threshold: Option<f64>,
        /// The embedding model `cosine` names (`None`: the process's default model).
        model: Option<String>,
        /// The embedding model of `cosine` (given after compiling: [`Grader::with_embedder`]).
        embedder: Option<SharedEmbedder>,
    },
    Python {
        source: String,
        limits: code::Limits,
    },
    Multi {
        graders: BTreeMap<String, Grader>,
        formula: Formula,
        range: Option<[f64; 2]>,
    },
    Math {
        input: Template,
        reference: Template,
        extract: MathExtract,
    },
    Code {
        input: Template,
        tests: Option<Template>,
        cases: Option<Template>,
        scoring: CodeScoring,
        limits: code::Limits,
    },
    Format {
        input: Template,
        preset: FormatPreset,
        regex: Option<Regex>,
    },
    Constraints {
        input: Template,
        checks: Vec<ConstraintCheck>,
        checks_from: Option<Template>,
        scoring: CodeScoring,
    },
    ScoreModel {
        prompt: JudgeTemplate,
        range: [f64; 2],
        pass_threshold: Option<f64>,
    },
    LabelModel {
        prompt: JudgeTemplate,
        labels: Vec<String>,
        passing: Vec<String>,
    },
}

impl Grader {
    /// Parses and checks a JSON grader spec; every problem is reported with its JSON path.
    pub fn from_json(json: &str) -> Result<Self, InvalidGrader> {
        let value: Value = serde_json::from_str(json).map_err(|e| {
            InvalidGrader(vec![SpecError { path: ".".into(), message: e.to_string() }])
        })?;
        let spec = parse_spec_value(&value, "").map_err(|e| InvalidGrader(vec![e]))?;
        Self::new(spec)
    }

    /// Checks a parsed spec (templates, patterns, formula) and compiles it.
    /// The sandbox is discovered (once per process) only for specs that run programs.
    pub fn new(spec: GraderSpec) -> Result<Self, InvalidGrader> {
        let sandbox = if spec_runs_programs(&spec) {
            SandboxConfig::default()
        } else {
            SandboxConfig::not_needed()
        };
        Self::with_sandbox(spec, Arc::new(sandbox))
    }

    /// Like [`Grader::new`] with an explicit sandbox configuration.
    pub fn with_sandbox(
        spec: GraderSpec,
        sandbox: Arc<SandboxConfig>,
    ) -> Result<Self, InvalidGrader> {
        let mut errors = Vec::new();
        let compiled = compile(&spec, "", &sandbox, &mut errors);
        match compiled {
            Some(compiled) if errors.is_empty() => {
                Ok(Self { spec, compiled, sandbox, judge: None })
            }
            _ => Err(InvalidGrader(errors)),
        }
    }

    /// The spec this grader was built from.
    pub fn spec(&self) -> &GraderSpec {
        &self.spec
    }

    /// Attaches the judge that model graders (here and inside a `multi`) ask, behind a cache
    /// that judges each identical (judge, prompt, sampling) once.
    pub fn with_judge(self, judge: Arc<dyn Judge>) -> Self {
        let cache = Arc::new(JudgeCache::new(judge, DEFAULT_CACHE_ENTRIES));
        self.with_judge_cache(&cache)
    }

    /// This grader with every sandboxed run (here and inside a `multi`) capped at `max_run_ms`
    /// of wall-clock time, whatever its `timeout_ms` and number of cases (the API's
    /// `graders/run` caps what one request may take).
    pub fn with_run_cap(mut self, max_run_ms: u64) -> Self {
        match &mut self.compiled {
            Compiled::Multi { graders, .. } => {
                let taken = std::mem::take(graders);
                *graders =
                    taken.into_iter().map(|(k, g)| (k, g.with_run_cap(max_run_ms))).collect();
            }
            Compiled::Python { limits, .. } | Compiled::Code { limits, .. } => {
                *limits = limits.capped(max_run_ms);
            }
            _ => {}
        }
        self
    }

    fn with_judge_cache(mut self, cache: &Arc<JudgeCache>) -> Self {
        if let Compiled::Multi { graders, .. } = &mut self.compiled {
            let taken = std::mem::take(graders);
            *graders = taken.into_iter().map(|(k, g)| (k, g.with_judge_cache(cache))).collect();
        }
        self.judge = Some(Arc::clone(cache));
        self
    }

    /// The attached judge's cache, if any.
    pub fn judge_cache(&self) -> Option<&JudgeCache> {
        self.judge.as_deref()
    }

    /// Every judge model the grader's model graders name, with the JSON path of its `model`.
    pub fn judge_models(&self) -> Vec<(String, String)> {
        self.model_graders()
            .into_iter()
            .map(|(prefix, prompt)| (join_path(&prefix, "model"), prompt.model().to_string()))
            .collect()
    }

    /// Every model grader's reply budget: the JSON path of its `max_completions_tokens`, the
    /// judge model it asks and the tokens it asks for.
    pub fn judge_budgets(&self) -> Vec<(String, String, usize)> {
        self.model_graders()
            .into_iter()
            .map(|(prefix, prompt)| {
                let path = join_path(&prefix, "sampling_params.max_completions_tokens");
                (path, prompt.model().to_string(), prompt.sampling().max_completion_tokens)
            })
            .collect()
    }

    /// The model graders (here or inside a multi), each with its JSON path.
    fn model_graders(&self) -> Vec<(String, &JudgeTemplate)> {
        let mut out = Vec::new();
        self.collect_model_graders(String::new(), &mut out);
        out
    }

    fn collect_model_graders<'a>(
        &'a self,
        prefix: String,
        out: &mut Vec<(String, &'a JudgeTemplate)>,
    ) {
        match &self.compiled {
            Compiled::ScoreModel { prompt, .. } | Compiled::LabelModel { prompt, .. } => {
                out.push((prefix, prompt));
            }
            Compiled::Multi { graders, .. } => {
                for (name, g) in graders {
                    g.collect_model_graders(join_path(&join_path(&prefix, "graders"), name), out);
                }
            }
            _ => {}
        }
    }

    /// Whether grading asks a judge model (a model grader, or a multi holding one).
    pub fn uses_judge(&self) -> bool {
        !self.judge_models().is_empty()
    }

    /// The judge prompts grading `(item, sample)` will ask (rows missing a field ask none).
    pub fn judge_prompts(&self, item: &Value, sample: &Sample) -> Vec<JudgePrompt> {
        match &self.compiled {
            Compiled::ScoreModel { prompt, .. } | Compiled::LabelModel { prompt, .. } => {
                prompt.render(item, sample).into_iter().collect()
            }
            Compiled::Multi { graders, .. } => {
                graders.values().flat_map(|g| g.judge_prompts(item, sample)).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Asks the judge every prompt of `rows` in one batch, so that grading the rows afterwards
    /// reads the replies from the cache (one batched generation instead of one per sample).
    pub fn prefetch_judge(&self, rows: &[(Value, Sample)]) {
        let Some(cache) = &self.judge else { return };
        cache.forget_outages();
        let prompts: Vec<JudgePrompt> =
            rows.iter().flat_map(|(item, sample)| self.judge_prompts(item, sample)).collect();
        if !prompts.is_empty() {
            let _ = cache.complete(&prompts);
        }
    }

    /// The reference answer a sample is compared with for `item`: the `reference` template of a
    /// string_check, text_similarity or math grader (the first such inside a multi), rendered
    /// from the row; `None` for other graders or a row missing the field.
    pub fn reference_for(&self, item: &Value) -> Option<String> {
        match &self.compiled {
            Compiled::StringCheck { reference, .. }
            | Compiled::TextSimilarity { reference, .. }
            | Compiled::Math { reference, .. } => reference.render(item, &Sample::default()).ok(),
            Compiled::Multi { graders, .. } => graders.values().find_map(|g| g.reference_for(item)),
            _ => None,
        }
    }

    /// The Python tests a `code` grader (here or inside a multi) runs the completion against
    /// for `item`; `None` when it has none (stdin/stdout cases, or no code grader).
    pub fn code_tests_for(&self, item: &Value) -> Option<String> {
        match &self.compiled {
            Compiled::Code { tests: Some(tests), .. } => {
                tests.render(item, &Sample::default()).ok()
            }
            Compiled::Multi { graders, .. } => {
                graders.values().find_map(|g| g.code_tests_for(item))
            }
            _ => None,
        }
    }

    /// Whether this grader (or one inside a multi) runs the completion as a program.
    pub fn runs_completion_code(&self) -> bool {
        match &self.compiled {
            Compiled::Code { .. } => true,
            Compiled::Multi { graders, .. } => graders.values().any(Grader::runs_completion_code),
            _ => false,
        }
    }

    /// The sandbox configuration used by code and python graders.
    pub fn sandbox(&self) -> &SandboxConfig {
        &self.sandbox
    }

    /// Every `item.…` field path the grader's templates read (for dataset validation).
    pub fn item_fields(&self) -> Vec<Vec<String>> {
        let mut templates = Vec::new();
        self.collect_templates("", &mut templates);
        let mut out: Vec<Vec<String>> =
            templates.iter().flat_map(|(_, t)| t.item_paths()).collect();
        out.sort();
        out.dedup();
        out
    }

    /// Every `sample.…` field path the grader's templates read, each with the grader that
    /// reads it: its name, or its JSON path (`graders.<name>` in a multi) when unnamed. For the
    /// creation checks of `sample.output_json` and `sample.output_tools`.
    pub fn sample_fields(&self) -> Vec<(String, Vec<String>)> {
        let mut templates = Vec::new();
        self.collect_templates("", &mut templates);
        let mut out: Vec<(String, Vec<String>)> = templates
            .iter()
            .flat_map(|(grader, t)| t.sample_paths().into_iter().map(|p| (grader.clone(), p)))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The templates of this grader and its sub-graders, each with the name (or JSON path,
    /// under `prefix`) of the grader holding it.
    fn collect_templates<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Template)>) {
        let templates: Vec<&Template> = match &self.compiled {
            Compiled::StringCheck { input, reference, .. }
            | Compiled::TextSimilarity { input, reference, .. }
            | Compiled::Math { input, reference, .. } => vec![input, reference],
            Compiled::Code { input, tests, cases, .. } => {
                std::iter::once(input).chain(tests.iter()).chain(cases.iter()).collect()
            }
            Compiled::Format { input, .. } => vec![input],
            Compiled::Constraints { input, checks_from, .. } => {
                std::iter::once(input).chain(checks_from.iter()).collect()
            }
            Compiled::Python { .. } => vec![],
            Compiled::ScoreModel { prompt, .. } | Compiled::LabelModel { prompt, .. } => {
                prompt.templates().collect()
            }
            Compiled::Multi { graders, .. } => {
                for (name, grader) in graders {
                    grader.collect_templates(&join_path(prefix, &format!("graders.{name}")), out);
                }
                vec![]
            }
        };
        let label = match self.spec.name() {
            Some(name) => name.to_string(),
            None if prefix.is_empty() => self.spec.kind().to_string(),
            None => prefix.to_string(),
        };
        out.extend(templates.into_iter().map(|t| (label.clone(), t)));
    }

    /// JSON paths (`evaluation_metric`, under `graders.<name>` in a multi) of the `cosine`
    /// graders that use the default embedding model (they name none): empty when none does.
    pub fn embedding_paths(&self) -> Vec<String> {
        self.embedding_models()
            .into_iter()
            .filter(|(_, model)| model.is_none())
            .map(|(path, _)| path)
            .collect()
    }

    /// Every `cosine` grader's embedding model: `(JSON path, name)`, the path that of its
    /// `model` when it names one (else its `evaluation_metric`, and the name `None`: the
    /// default model).
    pub fn embedding_models(&self) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        self.collect_embedding_models("", &mut out);
        out
    }

    fn collect_embedding_models(&self, prefix: &str, out: &mut Vec<(String, Option<String>)>) {
        match &self.compiled {
            Compiled::TextSimilarity { metric: SimilarityMetric::Cosine, model, .. } => {
                let field = if model.is_some() { "model" } else { "evaluation_metric" };
                out.push((join_path(prefix, field), model.clone()));
            }
            Compiled::Multi { graders, .. } => {
                for (name, grader) in graders {
                    grader.collect_embedding_models(
                        &join_path(&join_path(prefix, "graders"), name),
                        out,
                    );
                }
            }
            _ => {}
        }
    }

    /// Whether a `python` grader is here or inside a `multi`.
    pub fn runs_python(&self) -> bool {
        match &self.compiled {
            Compiled::Python { .. } => true,
            Compiled::Multi { graders, .. } => graders.values().any(Grader::runs_python),
            _ => false,
        }
    }

    /// Runs every `python` grader (here and inside a `multi`) once on `item` and an empty
    /// sample, as OpenAI's validation does ([`python::trial`]): the first whose source does not
    /// load or whose `grade()` fails an import, as (JSON path of its `source`, why).
    pub fn python_trial(&self, item: &Value) -> Result<(), (String, String)> {
        self.python_trial_at("", item)
    }

    fn python_trial_at(&self, prefix: &str, item: &Value) -> Result<(), (String, String)> {
        match &self.compiled {
            Compiled::Python { source, limits } => {
                python::trial(&self.sandbox, source, item, limits)
                    .map_err(|why| (join_path(prefix, "source"), why))
            }
            Compiled::Multi { graders, .. } => graders.iter().try_for_each(|(name, grader)| {
                grader.python_trial_at(&join_path(&join_path(prefix, "graders"), name), item)
            }),
            _ => Ok(()),
        }
    }

    /// This grader with `embedder` as the model of every `cosine` grader in it that uses the
    /// default model.
    pub fn with_embedder(self, model: SharedEmbedder) -> Self {
        self.with_embedders(&|name| name.is_none().then(|| Arc::clone(&model)))
    }

    /// This grader with `model_for(name)` as the model of every `cosine` grader naming `name`
    /// (`None`: the default); graders it answers `None` for are left as they are.
    pub fn with_embedders(
        mut self,
        model_for: &dyn Fn(Option<&str>) -> Option<SharedEmbedder>,
    ) -> Self {
        self.set_embedders(model_for);
        self
    }

    fn set_embedders(&mut self, model_for: &dyn Fn(Option<&str>) -> Option<SharedEmbedder>) {
        match &mut self.compiled {
            Compiled::TextSimilarity {
                metric: SimilarityMetric::Cosine, model, embedder, ..
            } => {
                if let Some(found) = model_for(model.as_deref()) {
                    *embedder = Some(found);
                }
            }
            Compiled::Multi { graders, .. } => {
                graders.values_mut().for_each(|g| g.set_embedders(model_for));
            }
            _ => {}
        }
    }

    /// Whether grading runs programs in the sandbox (code, python, or a multi holding one).
    pub fn uses_sandbox(&self) -> bool {
        match &self.compiled {
            Compiled::Python { .. } | Compiled::Code { .. } => true,
            Compiled::Multi { graders, .. } => graders.values().any(Grader::uses_sandbox),
            _ => false,
        }
    }

    /// Grades one sample of one dataset row. Never panics on any input.
    pub fn grade(&self, item: &Value, sample: &Sample) -> GradeResult {
        match self.grade_inner(item, sample) {
            Ok(result) => result,
            Err(MissingField(field)) => match sample_shape_error(sample, &field) {
                Some(why) => {
                    GradeResult::unparsable_sample(format!("'{field}' cannot be read: {why}"))
                }
                None => {
                    GradeResult::failed(ErrorKind::MissingField, format!("missing field '{field}'"))
                }
            },
        }
    }

    fn grade_inner(&self, item: &Value, sample: &Sample) -> Result<GradeResult, MissingField> {
        Ok(match &self.compiled {
            Compiled::StringCheck { input, reference, operation } => string_check::grade(
                &input.render(item, sample)?,
                &reference.render(item, sample)?,
                *operation,
            ),
            Compiled::TextSimilarity { input, reference, metric, threshold, model, embedder } => {
                let (candidate, reference) =
                    (input.render(item, sample)?, reference.render(item, sample)?);
                let similarity = match (metric, embedder) {
                    (SimilarityMetric::Cosine, Some(model)) => {
                        match cosine_similarity(model.as_ref(), &candidate, &reference) {
                            Ok(similarity) => similarity,
                            Err(e) => {
                                return Ok(GradeResult::failed(ErrorKind::Embedding, e.to_string()))
                            }
                        }
                    }
                    (SimilarityMetric::Cosine, None) => {
                        let message = match model {
                            Some(name) => format!(
                                "the embedding model {name:?} is not loaded here (registered \
                                 embedding models run on the API server and the workers)"
                            ),
                            None => "cosine needs an embedding model and none is configured".into(),
                        };
                        return Ok(GradeResult::failed(ErrorKind::Embedding, message));
                    }
                    (lexical, _) => {
                        match text_similarity::similarity(&candidate, &reference, *lexical) {
                            Some(similarity) => similarity,
                            None => {
                                return Ok(GradeResult::failed(
                                    ErrorKind::Internal,
                                    format!("{lexical:?} is not a lexical metric"),
                                ))
                            }
                        }
                    }
                };
                similarity_result(similarity, *threshold)
            }
            Compiled::Math { input, reference, extract } => math::grade(
                &input.render(item, sample)?,
                &reference.render(item, sample)?,
                *extract,
            ),
            Compiled::Format { input, preset, regex } => {
                let text = input.render(item, sample)?;
                match (preset, regex) {
                    (FormatPreset::ThinkAnswer, _) => format::think_answer(&text),
                    (FormatPreset::ThinkAnswerTag, _) => format::think_answer_tag(&text),
                    (FormatPreset::Regex, Some(re)) => format::regex_match(&text, re),
                    (FormatPreset::Regex, None) => {
                        GradeResult::failed(ErrorKind::BadItem, "regex preset without pattern")
                    }
                }
            }
            Compiled::Constraints { input, checks, checks_from, scoring } => {
                let text = input.render(item, sample)?;
                match checks_from {
                    None => constraints::grade(&text, checks, *scoring),
                    Some(template) => {
                        let value = match template.resolve_single(item, sample) {
                            Some(value) => value?,
                            None => Value::String(template.render(item, sample)?),
                        };
                        match row_checks(value) {
                            Ok(extra) => {
                                let all: Vec<ConstraintCheck> =
                                    checks.iter().cloned().chain(extra).collect();
                                constraints::grade(&text, &all, *scoring)
                            }
                            Err(message) => GradeResult::failed(ErrorKind::BadItem, message),
                        }
                    }
                }
            }
            Compiled::Code { input, tests, cases, scoring, limits } => {
                let completion = input.render(item, sample)?;
                let tests = tests.as_ref().map(|t| t.render(item, sample)).transpose()?;
                let cases = match cases {
                    Some(t) => Some(match t.resolve_single(item, sample) {
                        Some(value) => value?,
                        None => Value::String(t.render(item, sample)?),
                    }),
                    None => None,
                };
                code::grade(
                    &self.sandbox,
                    &completion,
                    tests.as_deref(),
                    cases.as_ref(),
                    *scoring,
                    limits,
                )
            }
            Compiled::Python { source, limits } => {
                python::grade(&self.sandbox, source, item, sample, limits)
            }
            Compiled::Multi { graders, formula, range } => {
                grade_multi(graders, formula, *range, item, sample)
            }
            Compiled::ScoreModel { prompt, range, pass_threshold } => model::grade_score(
                &prompt.render(item, sample)?,
                self.judge.as_deref().map(|j| j as &dyn Judge),
                *range,
                *pass_threshold,
            ),
            Compiled::LabelModel { prompt, labels, passing } => model::grade_label(
                &prompt.render(item, sample)?,
                self.judge.as_deref().map(|j| j as &dyn Judge),
                labels,
                passing,
            ),
        })
    }
}

/// Why a missing `sample.output_json…` or `sample.output_tools…` field is the completion's
/// fault (it is not JSON, or lacks that key or call): such a grading scores 0 as a sample parse
/// error rather than an infrastructure error. `None` for any other missing field.
fn sample_shape_error(sample: &Sample, field: &str) -> Option<String> {
    let under = |root: &str| field == root || field.starts_with(&format!("{root}."));
    if under("sample.output_json") {
        return match &sample.output_json_error {
            Some(why) => Some(why.clone()),
            None if sample.extra.contains_key("output_json") => {
                Some("the completion's JSON has no such field".into())
            }
            None => None,
        };
    }
    (under("sample.output_tools") && sample.extra.contains_key("output_tools"))
        .then(|| "the completion made no such tool call".into())
}

/// The result of a `text_similarity` grading: the metric is the score; the threshold, as in
/// OpenAI's API, only decides `passed`.
fn similarity_result(
    similarity: text_similarity::Similarity,
    threshold: Option<f64>,
) -> GradeResult {
    let value = similarity.value;
    let mut subs = BTreeMap::from([("similarity".to_string(), value)]);
    let reason = match threshold {
        Some(t) => {
            let passed = value >= t;
            subs.insert("passed".into(), f64::from(u8::from(passed)));
            format!(
                "similarity {value:.4} {} threshold {t}",
                if passed { "meets" } else { "is below" }
            )
        }
        None => format!("similarity {value:.4}"),
    };
    let reason = match similarity.capped {
        Some(cap) => format!("{reason}; {cap}"),
        None => reason,
    };
    GradeResult::scored(value, reason).with_sub_scores(subs)
}

/// Per-row constraint checks: a JSON array of checks or its JSON text.
fn row_checks(value: Value) -> Result<Vec<ConstraintCheck>, String> {
    let value = match value {
        Value::String(text) => {
            serde_json::from_str(&text).map_err(|e| format!("checks_from is not JSON: {e}"))?
        }
        other => other,
    };
    serde_path_to_error::deserialize::<_, Vec<ConstraintCheck>>(value)
        .map_err(|e| format!("checks_from: invalid check at '{}': {}", e.path(), e.inner()))
}

fn spec_runs_programs(spec: &GraderSpec) -> bool {
    match spec {
        GraderSpec::Python(_) | GraderSpec::Code(_) => true,
        GraderSpec::Multi(m) => m.graders.values().any(spec_runs_programs),
        _ => false,
    }
}

fn grade_multi(
    graders: &BTreeMap<String, Grader>,
    formula: &Formula,
    range: Option<[f64; 2]>,
    item: &Value,
    sample: &Sample,
) -> GradeResult {
    let mut values = BTreeMap::new();
    let mut reasons = Vec::new();
    // What the sub-graders' judges spent, reported whatever the outcome.
    let mut usage = BTreeMap::new();
    for (name, grader) in graders {
        let result = grader.grade(item, sample);
        crate::judge::merge_usage(&mut usage, &result.judge_usage);
        if let Some(why) = &result.sample_parse_error {
            let mut unparsable = GradeResult::unparsable_sample(format!("grader '{name}': {why}"));
            unparsable.sub_scores = values;
            return unparsable.with_usage_of(&usage);
        }
        if let Some(error) = result.error {
            let mut failed =
                GradeResult::failed(error.kind, format!("grader '{name}': {}", error.message));
            failed.sub_scores = values;
            return failed.with_usage_of(&usage);
        }
        for (sub, v) in &result.sub_scores {
            values.insert(format!("{name}.{sub}"), *v);
        }
        values.insert(name.clone(), result.score);
        reasons.push(format!("{name}={:.4} ({})", result.score, result.reason));
    }
    let raw = match formula.eval(&values) {
        Ok(v) => v,
        Err(e) => {
            let mut failed = GradeResult::failed(ErrorKind::Formula, e.to_string());
            failed.sub_scores = values;
            return failed.with_usage_of(&usage);
        }
    };
    let score = match range {
        Some([lo, hi]) if hi > lo => (raw - lo) / (hi - lo),
        _ => raw,
    };
    let clamped = if (0.0..=1.0).contains(&score) { "" } else { " (clamped to [0, 1])" };
    GradeResult::scored(score, format!("formula = {raw:.4}{clamped}; {}", reasons.join("; ")))
        .with_sub_scores(values)
        .with_usage_of(&usage)
}

/// Parses one spec value so that errors inside nested graders keep their JSON path
/// (serde loses paths inside internally tagged enums, so each level is checked on its own).
pub fn parse_spec_value(value: &Value, prefix: &str) -> Result<GraderSpec, SpecError> {
    let at = |path: &str| {
        if path.is_empty() || path == "." {
            if prefix.is_empty() {
                ".".to_string()
            } else {
                prefix.to_string()
            }
        } else {
            join_path(prefix, path)
        }
    };
    let object = value.as_object().ok_or_else(|| SpecError {
        path: at(""),
        message: "a grader must be a JSON object".into(),
    })?;
    let kind = object.get("type").and_then(Value::as_str).ok_or_else(|| SpecError {
        path: at("type"),
        message: "missing or non-string 'type'".into(),
    })?;
    if kind == "multi" {
        if let Some(Value::Object(graders)) = object.get("graders") {
            for (name, sub) in graders {
                parse_spec_value(sub, &join_path(&join_path(prefix, "graders"), name))?;
            }
        }
    }
    let mut body = object.clone();
    body.remove("type");
    let body = Value::Object(body);
    fn typed<T: serde::de::DeserializeOwned>(
        body: Value,
        at: &dyn Fn(&str) -> String,
    ) -> Result<T, SpecError> {
        serde_path_to_error::deserialize::<_, T>(body).map_err(|e| {
            let path = e.path().to_string();
            SpecError { path: at(&path), message: e.into_inner().to_string() }
        })
    }
    use crate::spec as s;
    Ok(match kind {
        "string_check" => GraderSpec::StringCheck(typed::<s::StringCheckSpec>(body, &at)?),
        "text_similarity" => GraderSpec::TextSimilarity(typed::<s::TextSimilaritySpec>(body, &at)?),
        "python" => GraderSpec::Python(typed::<s::PythonSpec>(body, &at)?),
        "multi" => GraderSpec::Multi(typed::<s::MultiSpec>(body, &at)?),
        "math" => GraderSpec::Math(typed::<s::MathSpec>(body, &at)?),
        "code" => GraderSpec::Code(typed::<s::CodeSpec>(body, &at)?),
        "format" => GraderSpec::Format(typed::<s::FormatSpec>(body, &at)?),
        "constraints" => GraderSpec::Constraints(typed::<s::ConstraintsSpec>(body, &at)?),
        "score_model" => GraderSpec::ScoreModel(typed::<s::ScoreModelSpec>(body, &at)?),
        "label_model" => GraderSpec::LabelModel(typed::<s::LabelModelSpec>(body, &at)?),
        other => {
            return Err(SpecError {
                path: at("type"),
                message: format!(
                    "unknown grader type '{other}' (string_check, text_similarity, python, multi, math, code, format, constraints, score_model, label_model)"
                ),
            })
        }
    })
}

fn join_path(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_string()
    } else {
        format!("{prefix}.{field}")
    }
}

fn template(text: &str, path: String, errors: &mut Vec<SpecError>) -> Template {
    Template::parse(text).unwrap_or_else(|e| {
        errors.push(SpecError { path, message: e.to_string() });
        Template::parse("").unwrap_or_else(|_| unreachable!("an empty template always parses"))
    })
}

fn check_limits(limits: &code::Limits, prefix: &str, errors: &mut Vec<SpecError>) {
    if limits.timeout_ms == 0 || limits.timeout_ms > 600_000 {
        errors.push(SpecError {
            path: join_path(prefix, "timeout_ms"),
            message: "must be in 1..=600000".into(),
        });
    }
    if limits.memory_mb < 64 || limits.memory_mb > 65_536 {
        errors.push(SpecError {
            path: join_path(prefix, "memory_mb"),
            message: "must be in 64..=65536".into(),
        });
    }
}

fn compile(
    spec: &GraderSpec,
    prefix: &str,
    sandbox: &Arc<SandboxConfig>,
    errors: &mut Vec<SpecError>,
) -> Option<Compiled> {
    let p = |f: &str| join_path(prefix, f);
    Some(match spec {
        GraderSpec::StringCheck(s) => Compiled::StringCheck {
            input: template(&s.input, p("input"), errors),
            reference: template(&s.reference, p("reference"), errors),
            operation: s.operation,
        },
        GraderSpec::TextSimilarity(s) => {
            if let Some(t) = s.pass_threshold {
                if !(0.0..=1.0).contains(&t) {
                    errors.push(SpecError {
                        path: p("pass_threshold"),
                        message: "must be in [0, 1]".into(),
                    });
                }
            }
            match &s.model {
                Some(_) if s.evaluation_metric != SimilarityMetric::Cosine => {
                    errors.push(SpecError {
                        path: p("model"),
                        message: "only the cosine metric uses an embedding model".into(),
                    })
                }
                Some(name) if name.trim().is_empty() => {
                    errors.push(SpecError { path: p("model"), message: "must not be empty".into() })
                }
                _ => {}
            }
            Compiled::TextSimilarity {
                input: template(&s.input, p("input"), errors),
                reference: template(&s.reference, p("reference"), errors),
                metric: s.evaluation_metric,
                threshold: s.pass_threshold,
                model: s.model.clone(),
                embedder: None,
            }
        }
        GraderSpec::Python(s) => {
            if !s.source.contains("def grade") {
                errors.push(SpecError {
                    path: p("source"),
                    message: "must define grade(sample, item)".into(),
                });
            }
            let limits = code::Limits::from_spec(s.timeout_ms, s.memory_mb);
            check_limits(&limits, prefix, errors);
            Compiled::Python { source: s.source.clone(), limits }
        }
        GraderSpec::Multi(s) => {
            let mut graders = BTreeMap::new();
            for (name, sub) in &s.graders {
                let sub_prefix = join_path(&p("graders"), name);
                if let Some(compiled) = compile(sub, &sub_prefix, sandbox, errors) {
                    graders.insert(
                        name.clone(),
                        Grader {
                            spec: sub.clone(),
                            compiled,
                            sandbox: Arc::clone(sandbox),
                            judge: None,
                        },
                    );
                }
            }
            let formula = match Formula::parse(&s.calculate_output) {
                Ok(f) => f,
                Err(e) => {
                    errors.push(SpecError { path: p("calculate_output"), message: e.to_string() });
                    return None;
                }
            };
            for name in formula.names() {
                let known = s.graders.contains_key(&name)
                    || name.split_once('.').is_some_and(|(g, _)| s.graders.contains_key(g));
                if !known {
                    errors.push(SpecError {
                        path: p("calculate_output"),
                        message: format!("'{name}' is not one of the graders"),
                    });
                }
            }
            if let Some([lo, hi]) = s.range {
                if hi <= lo {
                    errors.push(SpecError {
                        path: p("range"),
                        message: "must be [low, high] with low < high".into(),
                    });
                }
            }
            Compiled::Multi { graders, formula, range: s.range }
        }
        GraderSpec::Math(s) => Compiled::Math {
            input: template(&s.input, p("input"), errors),
            reference: template(&s.reference, p("reference"), errors),
            extract: s.extract,
        },
        GraderSpec::Code(s) => {
            if s.tests.is_none() == s.cases.is_none() {
                errors.push(SpecError {
                    path: p("tests"),
                    message: "exactly one of 'tests' or 'cases' is required".into(),
                });
            }
            let limits = code::Limits::from_spec(s.timeout_ms, s.memory_mb);
            check_limits(&limits, prefix, errors);
            Compiled::Code {
                input: template(&s.input, p("input"), errors),
                tests: s.tests.as_ref().map(|t| template(t, p("tests"), errors)),
                cases: s.cases.as_ref().map(|t| template(t, p("cases"), errors)),
                scoring: s.scoring,
                limits,
            }
        }
        GraderSpec::Format(s) => {
            let regex = match (s.preset, &s.pattern) {
                (FormatPreset::Regex, None) => {
                    errors.push(SpecError {
                        path: p("pattern"),
                        message: "required by preset 'regex'".into(),
                    });
                    None
                }
                (FormatPreset::Regex, Some(pattern)) => match format::compile_full_match(pattern) {
                    Ok(re) => Some(re),
                    Err(e) => {
                        errors.push(SpecError { path: p("pattern"), message: e.to_string() });
                        None
                    }
                },
                (_, Some(_)) => {
                    errors.push(SpecError {
                        path: p("pattern"),
                        message: "only used by preset 'regex'".into(),
                    });
                    None
                }
                (_, None) => None,
            };
            Compiled::Format {
                input: template(&s.input, p("input"), errors),
                preset: s.preset,
                regex,
            }
        }
        GraderSpec::ScoreModel(s) => {
            let prompt =
                JudgeTemplate::compile(&s.model, &s.input, s.sampling_params.as_ref(), &p, errors);
            let range = s.range.unwrap_or([0.0, 1.0]);
            if !(range[0].is_finite() && range[1].is_finite() && range[0] < range[1]) {
                errors.push(SpecError {
                    path: p("range"),
                    message: "must be [min, max] with min < max".into(),
                });
            }
            if let Some(t) = s.pass_threshold {
                if !(range[0]..=range[1]).contains(&t) {
                    errors.push(SpecError {
                        path: p("pass_threshold"),
                        message: "must lie within range".into(),
                    });
                }
            }
            Compiled::ScoreModel { prompt, range, pass_threshold: s.pass_threshold }
        }
        GraderSpec::LabelModel(s) => {
            let prompt =
                JudgeTemplate::compile(&s.model, &s.input, s.sampling_params.as_ref(), &p, errors);
            if s.labels.is_empty() {
                errors.push(SpecError { path: p("labels"), message: "must not be empty".into() });
            }
            for (i, label) in s.labels.iter().enumerate() {
                if label.trim().is_empty() {
                    errors.push(SpecError {
                        path: format!("{}.{i}", p("labels")),
                        message: "must not be empty".into(),
                    });
                }
            }
            if s.passing_labels.is_empty() {
                errors.push(SpecError {
                    path: p("passing_labels"),
                    message: "must name at least one of 'labels'".into(),
                });
            }
            for (i, label) in s.passing_labels.iter().enumerate() {
                if !s.labels.contains(label) {
                    errors.push(SpecError {
                        path: format!("{}.{i}", p("passing_labels")),
                        message: format!("'{label}' is not one of 'labels'"),
                    });
                }
            }
            Compiled::LabelModel {
                prompt,
                labels: s.labels.clone(),
                passing: s.passing_labels.clone(),
            }
        }
        GraderSpec::Constraints(s) => {
            for (i, check) in s.checks.iter().enumerate() {
                if let ConstraintCheck::Language { language } = check {
                    if language.trim().is_empty() {
                        errors.push(SpecError {
                            path: format!("{}.{i}.language", p("checks")),
                            message: "empty".into(),
                        });
                    }
                }
            }
            if s.checks.is_empty() && s.checks_from.is_none() {
                errors.push(SpecError {
                    path: p("checks"),
                    message: "give 'checks', 'checks_from' or both".into(),
                });
            }
            Compiled::Constraints {
                input: template(&s.input, p("input"), errors),
                checks: s.checks.clone(),
                checks_from: s.checks_from.as_ref().map(|t| template(t, p("checks_from"), errors)),
                scoring: s.scoring,
            }
        }
    })
}
