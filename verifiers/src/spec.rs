//! The grader spec: the JSON a user writes (serde, unknown fields rejected, JSON Schema exported).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One grader, tagged by `type` (OpenAI-compatible kinds plus Verity's RLVR kinds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GraderSpec {
    /// Compare a rendered input with a rendered reference.
    StringCheck(StringCheckSpec),
    /// Similarity metric between input and reference.
    TextSimilarity(TextSimilaritySpec),
    /// User `def grade(sample, item) -> float`, run in the sandbox.
    Python(PythonSpec),
    /// Named graders combined by a formula.
    Multi(MultiSpec),
    /// Final-answer equivalence for mathematics.
    Math(MathSpec),
    /// Program run against tests or stdin/stdout cases in the sandbox.
    Code(CodeSpec),
    /// Structural format of the completion.
    Format(FormatSpec),
    /// IFEval-style instruction constraints.
    Constraints(ConstraintsSpec),
    /// A judge model scores the sample with a number in `range`.
    ScoreModel(ScoreModelSpec),
    /// A judge model picks one of `labels`; 1 when it is a passing label.
    LabelModel(LabelModelSpec),
}

/// `string_check`: `input` compared with `reference` by `operation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StringCheckSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Template of the checked text, e.g. `{{sample.output_text}}`.
    pub input: String,
    /// Template of the reference text, e.g. `{{item.reference_answer}}`.
    pub reference: String,
    /// Comparison operation.
    pub operation: StringOperation,
}

/// The comparison of `string_check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StringOperation {
    /// Exactly equal.
    Eq,
    /// Not equal.
    Ne,
    /// Input contains reference (case-sensitive).
    Like,
    /// Input contains reference (case-insensitive).
    Ilike,
}

/// `text_similarity`: a similarity metric in [0, 1].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TextSimilaritySpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Template of the candidate text.
    pub input: String,
    /// Template of the reference text.
    pub reference: String,
    /// The metric.
    pub evaluation_metric: SimilarityMetric,
    /// When set, `sub_scores.passed` is 1 when the metric reaches it (the score stays the metric).
    #[serde(default)]
    pub pass_threshold: Option<f64>,
    /// `cosine` only (a Verity extension): the embedding model, a model registered with kind
    /// `embedding` (`verity models import --kind embedding`); default: the operator's
    /// `VERITY_EMBEDDING_MODEL` folder.
    #[serde(default)]
    pub model: Option<String>,
}

/// Metrics of `text_similarity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SimilarityMetric {
    /// Cosine similarity of sentence embeddings (the configured embedding model).
    Cosine,
    /// METEOR with exact and stem matching (NLTK's defaults, no WordNet synonyms).
    Meteor,
    /// Normalised Indel similarity of the characters (rapidfuzz `ratio`).
    FuzzyMatch,
    /// Sentence BLEU-4 with add-one smoothing and brevity penalty.
    Bleu,
    /// Google-BLEU: min(precision, recall) of 1..4-grams.
    Gleu,
    /// ROUGE-1 F1.
    #[serde(rename = "rouge_1")]
    Rouge1,
    /// ROUGE-2 F1.
    #[serde(rename = "rouge_2")]
    Rouge2,
    /// ROUGE-3 F1.
    #[serde(rename = "rouge_3")]
    Rouge3,
    /// ROUGE-4 F1.
    #[serde(rename = "rouge_4")]
    Rouge4,
    /// ROUGE-5 F1.
    #[serde(rename = "rouge_5")]
    Rouge5,
    /// ROUGE-L (longest common subsequence) F1.
    #[serde(rename = "rouge_l")]
    RougeL,
}

/// `python`: user code defining `grade(sample, item) -> float`, run in the sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PythonSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Python source defining `grade(sample, item)`.
    pub source: String,
    /// Accepted for OpenAI compatibility; ignored.
    #[serde(default)]
    pub image_tag: Option<String>,
    /// Wall-clock limit of one grading in milliseconds (default 10000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Address-space limit in MiB (default 512).
    #[serde(default)]
    pub memory_mb: Option<u64>,
}

/// `multi`: named graders combined by `calculate_output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MultiSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// The combined graders by name (the names of the formula).
    pub graders: BTreeMap<String, GraderSpec>,
    /// Formula: numbers, grader names, + - * /, min, max, abs, parentheses.
    pub calculate_output: String,
    /// Accepted for OpenAI compatibility: the formula's range, mapped linearly onto [0, 1].
    #[serde(default)]
    pub range: Option<[f64; 2]>,
}

/// `math`: extract the final answer and compare it with the reference by value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MathSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Template of the completion (default `{{sample.output_text}}`).
    #[serde(default = "default_output_template")]
    pub input: String,
    /// Template of the reference answer.
    pub reference: String,
    /// Where the final answer is taken from (default `auto`).
    #[serde(default)]
    pub extract: MathExtract,
}

/// Answer extraction of the `math` grader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MathExtract {
    /// The last `\boxed{}` / `\fbox{}`.
    Boxed,
    /// The last `<answer>…</answer>`.
    AnswerTag,
    /// The last number of the text.
    LastNumber,
    /// Boxed, then answer tag, then "the answer is", then the last number.
    #[default]
    Auto,
}

/// `code`: the completion's program run against tests or cases in the sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Template of the completion: the program is its last fenced code block, or the whole text.
    #[serde(default = "default_output_template")]
    pub input: String,
    /// Language of the program.
    #[serde(default)]
    pub language: CodeLanguage,
    /// Template of Python test code (asserts); each top-level statement that fails counts as failed.
    #[serde(default)]
    pub tests: Option<String>,
    /// Template rendering to a JSON array of `{"input": str, "output": str}` stdin/stdout cases.
    #[serde(default)]
    pub cases: Option<String>,
    /// all_pass (default) or fraction.
    #[serde(default)]
    pub scoring: CodeScoring,
    /// Wall-clock limit of the whole run in milliseconds (default 10000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Address-space limit in MiB (default 512).
    #[serde(default)]
    pub memory_mb: Option<u64>,
}

/// Languages the `code` grader runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CodeLanguage {
    /// Python 3.
    #[default]
    Python,
}

/// How passed tests become a score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CodeScoring {
    /// 1 when every test passes, else 0.
    #[default]
    AllPass,
    /// Passed tests / all tests.
    Fraction,
}

/// `format`: a structural check of the completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FormatSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Template of the checked text (default `{{sample.output_text}}`).
    #[serde(default = "default_output_template")]
    pub input: String,
    /// The preset.
    pub preset: FormatPreset,
    /// For `regex`: the pattern the whole text must match (linear-time regex syntax).
    #[serde(default)]
    pub pattern: Option<String>,
}

/// Presets of the `format` grader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FormatPreset {
    /// One non-empty `<think>…</think>` first, then a non-empty answer.
    ThinkAnswer,
    /// `<think>…</think>` then exactly one `<answer>…</answer>` and nothing after it.
    ThinkAnswerTag,
    /// The whole text matches `pattern`.
    Regex,
}

/// `constraints`: IFEval-style checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConstraintsSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// Template of the checked text (default `{{sample.output_text}}`).
    #[serde(default = "default_output_template")]
    pub input: String,
    /// The checks (fixed for every row).
    #[serde(default)]
    pub checks: Vec<ConstraintCheck>,
    /// Template of per-row checks (e.g. `{{item.constraints}}`): a JSON array of checks, added to `checks`.
    #[serde(default)]
    pub checks_from: Option<String>,
    /// all_pass (default: 1 only when every check holds) or fraction.
    #[serde(default)]
    pub scoring: CodeScoring,
}

/// One IFEval-style check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "check", rename_all = "snake_case", deny_unknown_fields)]
pub enum ConstraintCheck {
    /// Whitespace-separated word count within bounds.
    WordCount {
        /// Inclusive minimum.
        #[serde(default)]
        min: Option<usize>,
        /// Inclusive maximum.
        #[serde(default)]
        max: Option<usize>,
    },
    /// Sentence count (split on . ! ?) within bounds.
    SentenceCount {
        /// Inclusive minimum.
        #[serde(default)]
        min: Option<usize>,
        /// Inclusive maximum.
        #[serde(default)]
        max: Option<usize>,
    },
    /// Paragraph count (split on blank lines or `***`) within bounds.
    ParagraphCount {
        /// Inclusive minimum.
        #[serde(default)]
        min: Option<usize>,
        /// Inclusive maximum.
        #[serde(default)]
        max: Option<usize>,
    },
    /// Markdown bullet count (`* ` or `- ` lines) within bounds.
    BulletCount {
        /// Inclusive minimum.
        #[serde(default)]
        min: Option<usize>,
        /// Inclusive maximum.
        #[serde(default)]
        max: Option<usize>,
    },
    /// Every keyword appears (as a whole word).
    IncludeKeywords {
        /// The keywords.
        keywords: Vec<String>,
        /// Case-sensitive match (default false).
        #[serde(default)]
        case_sensitive: bool,
    },
    /// No keyword appears (as a whole word).
    ExcludeKeywords {
        /// The keywords.
        keywords: Vec<String>,
        /// Case-sensitive match (default false).
        #[serde(default)]
        case_sensitive: bool,
    },
    /// The text (or its single fenced block) parses as JSON.
    ValidJson {},
    /// No uppercase letters.
    Lowercase {},
    /// No lowercase letters.
    Uppercase {},
    /// The trimmed text starts with `prefix`.
    StartsWith {
        /// The prefix.
        prefix: String,
    },
    /// The trimmed text ends with `suffix`.
    EndsWith {
        /// The suffix.
        suffix: String,
    },
    /// The detected language is `language` (ISO 639-1 like `fr` or 639-3 like `fra`).
    Language {
        /// The language code.
        language: String,
    },
}

impl ConstraintCheck {
    /// The check's name as written in the spec.
    pub fn name(&self) -> &'static str {
        match self {
            Self::WordCount { .. } => "word_count",
            Self::SentenceCount { .. } => "sentence_count",
            Self::ParagraphCount { .. } => "paragraph_count",
            Self::BulletCount { .. } => "bullet_count",
            Self::IncludeKeywords { .. } => "include_keywords",
            Self::ExcludeKeywords { .. } => "exclude_keywords",
            Self::ValidJson {} => "valid_json",
            Self::Lowercase {} => "lowercase",
            Self::Uppercase {} => "uppercase",
            Self::StartsWith { .. } => "starts_with",
            Self::EndsWith { .. } => "ends_with",
            Self::Language { .. } => "language",
        }
    }
}

/// `score_model`: a judge model (registered in Verity) replies with a score in `range`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScoreModelSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// The judge: a model registered in Verity (base or fine-tuned) or routed to an endpoint.
    pub model: String,
    /// The judge's chat messages; contents may hold `{{item.…}}` / `{{sample.…}}` templates.
    pub input: Vec<JudgeInputMessage>,
    /// `[min, max]` of the judge's score (default `[0, 1]`), mapped linearly onto [0, 1].
    #[serde(default)]
    pub range: Option<[f64; 2]>,
    /// How the judge samples its reply.
    #[serde(default)]
    pub sampling_params: Option<JudgeSamplingParams>,
    /// Accepted for OpenAI compatibility: `sub_scores.passed` is 1 when the raw score reaches it.
    #[serde(default)]
    pub pass_threshold: Option<f64>,
}

/// `label_model`: a judge model picks one of `labels`; the score is 1 for a passing label.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabelModelSpec {
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// The judge: a model registered in Verity (base or fine-tuned) or routed to an endpoint.
    pub model: String,
    /// The judge's chat messages; contents may hold `{{item.…}}` / `{{sample.…}}` templates.
    pub input: Vec<JudgeInputMessage>,
    /// The labels the judge chooses from.
    pub labels: Vec<String>,
    /// The labels that score 1 (a subset of `labels`).
    pub passing_labels: Vec<String>,
    /// How the judge samples its reply (Verity extension; OpenAI's label_model has none).
    #[serde(default)]
    pub sampling_params: Option<JudgeSamplingParams>,
}

/// One message of a model grader's `input` (OpenAI's EvalItem).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JudgeInputMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// Text, a `{"type": "input_text"|"output_text", "text": …}` part, or a list of parts.
    pub content: JudgeContent,
    /// Always `message` when given.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

/// The content of a [`JudgeInputMessage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum JudgeContent {
    /// Plain text (a template).
    Text(String),
    /// One text part.
    Part(Box<JudgeContentPart>),
    /// Several text parts, joined by newlines.
    Parts(Vec<JudgeContentPart>),
}

/// A part of a judge message: OpenAI's `input_text`, `output_text`, `input_image` and
/// `input_audio` parse, so that a part a text judge cannot read is refused by its type, naming
/// what Verity supports (not with serde's "did not match any variant").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JudgeContentPart {
    /// `input_text` or `output_text` (`input_image` and `input_audio` are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text (a template) of a text part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// An `input_image` part's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_url: Option<serde_json::Value>,
    /// An `input_image` part's uploaded file, the alternative to `image_url` (OpenAI's examples
    /// send it as `null` beside a URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_id: Option<serde_json::Value>,
    /// An `input_image` part's detail level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
    /// An `input_audio` part's audio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_audio: Option<serde_json::Value>,
}

impl JudgeContent {
    /// The parts, in order: each part's type and its text (empty for a part without text).
    pub fn texts(&self) -> Vec<(&str, &str)> {
        fn part(p: &JudgeContentPart) -> (&str, &str) {
            (p.kind.as_str(), p.text.as_deref().unwrap_or(""))
        }
        match self {
            Self::Text(t) => vec![("input_text", t.as_str())],
            Self::Part(p) => vec![part(p)],
            Self::Parts(ps) => ps.iter().map(part).collect(),
        }
    }
}

/// OpenAI's `sampling_params` of a model grader.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JudgeSamplingParams {
    /// Softmax temperature (default 0: greedy, so a grading is reproducible).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus mass kept (default 1).
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Seed of the judge's sampling (default 0).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Longest judge reply in tokens (default 256).
    #[serde(default)]
    pub max_completions_tokens: Option<usize>,
    /// `none`, `minimal`, `low`, `medium` or `high`: forwarded to an endpoint judge; a local
    /// judge without a reasoning mode ignores it.
    #[serde(default)]
    pub reasoning_effort: Option<String>,
}

fn default_output_template() -> String {
    "{{sample.output_text}}".to_string()
}

impl GraderSpec {
    /// The display name, when the spec gives one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::StringCheck(s) => s.name.as_deref(),
            Self::TextSimilarity(s) => s.name.as_deref(),
            Self::Python(s) => s.name.as_deref(),
            Self::Multi(s) => s.name.as_deref(),
            Self::Math(s) => s.name.as_deref(),
            Self::Code(s) => s.name.as_deref(),
            Self::Format(s) => s.name.as_deref(),
            Self::Constraints(s) => s.name.as_deref(),
            Self::LabelModel(s) => s.name.as_deref(),
            Self::ScoreModel(s) => s.name.as_deref(),
        }
    }

    /// The `type` tag of the spec.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::StringCheck(_) => "string_check",
            Self::TextSimilarity(_) => "text_similarity",
            Self::Python(_) => "python",
            Self::Multi(_) => "multi",
            Self::Math(_) => "math",
            Self::Code(_) => "code",
            Self::Format(_) => "format",
            Self::Constraints(_) => "constraints",
            Self::LabelModel(_) => "label_model",
            Self::ScoreModel(_) => "score_model",
        }
    }
}

/// The JSON Schema of a grader spec.
pub fn grader_json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(GraderSpec);
    serde_json::to_value(&schema).unwrap_or(serde_json::Value::Null)
}
