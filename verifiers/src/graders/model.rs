//! Model graders (`score_model`, `label_model`): render the judge prompt, ask a [`Judge`], and
//! turn its reply into a score. An unparsable reply or a judge failure is a grading error
//! (counted, masked out of the loss), never a silent 0.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::grader::SpecError;
use crate::judge::{
    parse_label, parse_score, Judge, JudgeMessage, JudgePrompt, JudgeReply, JudgeSampling,
};
use crate::result::{ErrorKind, GradeResult};
use crate::sample::Sample;
use crate::sampling::{check_temperature, check_top_p};
use crate::spec::{JudgeInputMessage, JudgeSamplingParams};
use crate::template::{MissingField, Template};

/// Longest judge reply by default, in tokens.
pub const DEFAULT_MAX_COMPLETION_TOKENS: usize = 256;

/// Longest judge reply a grader may ask for, in tokens: no refusal below any real context
/// (OpenAI's guide asks for 32768); a local judge clamps it to its model's context.
pub const MAX_COMPLETION_TOKENS: usize = 1 << 20;

/// Roles a judge message may have.
const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];

/// Values of `reasoning_effort`.
const EFFORTS: [&str; 5] = ["none", "minimal", "low", "medium", "high"];

/// Most characters of a judge reply kept in a grading's reason.
const REASON_CHARS: usize = 2000;

/// The compiled prompt of a model grader: judge name, message templates and sampling.
#[derive(Debug, Clone)]
pub struct JudgeTemplate {
    model: String,
    messages: Vec<(String, Template)>,
    sampling: JudgeSampling,
}

impl JudgeTemplate {
    /// Checks and compiles `input` and `sampling_params`; problems are pushed with their path.
    pub fn compile(
        model: &str,
        input: &[JudgeInputMessage],
        params: Option<&JudgeSamplingParams>,
        at: &dyn Fn(&str) -> String,
        errors: &mut Vec<SpecError>,
    ) -> Self {
        let mut push = |path: String, message: String| errors.push(SpecError { path, message });
        if model.trim().is_empty() {
            push(at("model"), "must name a judge model".into());
        }
        if input.is_empty() {
            push(at("input"), "must hold at least one message".into());
        }
        let mut messages = Vec::new();
        for (i, message) in input.iter().enumerate() {
            if !ROLES.contains(&message.role.as_str()) {
                push(at(&format!("input.{i}.role")), format!("must be one of {ROLES:?}"));
            }
            if message.kind.as_deref().is_some_and(|k| k != "message") {
                push(at(&format!("input.{i}.type")), "must be 'message'".into());
            }
            let mut text = Vec::new();
            for (kind, part) in message.content.texts() {
                if kind != "input_text" && kind != "output_text" {
                    let what = match kind {
                        "input_image" => "image parts are not supported: Verity's judges read text",
                        "input_audio" => "audio parts are not supported: Verity's judges read text",
                        _ => "this part type is not supported",
                    };
                    push(
                        at(&format!("input.{i}.content")),
                        format!("'{kind}': {what} (parts of type input_text and output_text, or a string)"),
                    );
                }
                text.push(part);
            }
            match Template::parse(&text.join("\n")) {
                Ok(t) => messages.push((message.role.clone(), t)),
                Err(e) => push(at(&format!("input.{i}.content")), e.to_string()),
            }
        }
        let p = params.cloned().unwrap_or_default();
        let temperature = p.temperature.unwrap_or(0.0);
        if let Err(m) = check_temperature(temperature) {
            push(at("sampling_params.temperature"), m);
        }
        let top_p = p.top_p.unwrap_or(1.0);
        if let Err(m) = check_top_p(top_p) {
            push(at("sampling_params.top_p"), m);
        }
        let max_tokens = p.max_completions_tokens.unwrap_or(DEFAULT_MAX_COMPLETION_TOKENS);
        if max_tokens == 0 || max_tokens > MAX_COMPLETION_TOKENS {
            push(
                at("sampling_params.max_completions_tokens"),
                format!("must be in 1..={MAX_COMPLETION_TOKENS}"),
            );
        }
        if let Some(effort) = &p.reasoning_effort {
            if !EFFORTS.contains(&effort.as_str()) {
                push(at("sampling_params.reasoning_effort"), format!("must be one of {EFFORTS:?}"));
            }
        }
        Self {
            model: model.to_string(),
            messages,
            sampling: JudgeSampling {
                temperature,
                top_p,
                seed: p.seed.unwrap_or(0),
                max_completion_tokens: max_tokens,
                reasoning_effort: p.reasoning_effort.clone(),
            },
        }
    }

    /// The judge model's name.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// How the judge samples its reply (temperature, seed, reply budget, …).
    pub fn sampling(&self) -> &JudgeSampling {
        &self.sampling
    }

    /// The message templates.
    pub fn templates(&self) -> impl Iterator<Item = &Template> {
        self.messages.iter().map(|(_, t)| t)
    }

    /// The judge prompt for one row.
    pub fn render(&self, item: &Value, sample: &Sample) -> Result<JudgePrompt, MissingField> {
        let messages = self
            .messages
            .iter()
            .map(|(role, t)| {
                Ok(JudgeMessage { role: role.clone(), content: t.render(item, sample)? })
            })
            .collect::<Result<Vec<_>, MissingField>>()?;
        Ok(JudgePrompt { model: self.model.clone(), messages, sampling: self.sampling.clone() })
    }
}

/// Asks the judge one prompt (answered from the cache when the batch was prefetched).
fn ask(judge: Option<&dyn Judge>, prompt: &JudgePrompt) -> Result<JudgeReply, Box<GradeResult>> {
    let Some(judge) = judge else {
        let why = format!("no judge is attached to grade with model '{}'", prompt.model);
        return Err(Box::new(GradeResult::failed(ErrorKind::Judge, why)));
    };
    let failed = |kind, message: String| Err(Box::new(GradeResult::failed(kind, message)));
    match judge.complete(std::slice::from_ref(prompt)).pop() {
        Some(Ok(reply)) => Ok(reply),
        Some(Err(e)) if e.is_outage() => failed(ErrorKind::JudgeUnavailable, e.to_string()),
        Some(Err(e)) => failed(ErrorKind::Judge, e.to_string()),
        None => failed(ErrorKind::Judge, "the judge returned no reply".into()),
    }
}

fn shortened(reply: &str) -> String {
    let trimmed = reply.trim();
    match trimmed.char_indices().nth(REASON_CHARS) {
        Some((at, _)) => format!("{}…", &trimmed[..at]),
        None => trimmed.to_string(),
    }
}

/// Grades with `score_model`: the reply's number in `range`, mapped linearly onto [0, 1].
pub fn grade_score(
    prompt: &JudgePrompt,
    judge: Option<&dyn Judge>,
    range: [f64; 2],
    pass_threshold: Option<f64>,
) -> GradeResult {
    let (reply, usage) = match ask(judge, prompt) {
        Ok(reply) => (reply.text, reply.usage),
        Err(failed) => return *failed,
    };
    score_reply(prompt, &reply, range, pass_threshold).with_judge_usage(&prompt.model, usage)
}

/// The `score_model` grading of one judge reply.
fn score_reply(
    prompt: &JudgePrompt,
    reply: &str,
    range: [f64; 2],
    pass_threshold: Option<f64>,
) -> GradeResult {
    let [lo, hi] = range;
    let Some(parsed) = parse_score(reply) else {
        return GradeResult::failed(
            ErrorKind::JudgeReply,
            format!("judge reply holds no score: {}", shortened(reply)),
        );
    };
    if !(lo..=hi).contains(&parsed.value) {
        return GradeResult::failed(
            ErrorKind::JudgeReply,
            format!(
                "judge score {} is outside range [{lo}, {hi}]: {}",
                parsed.value,
                shortened(reply)
            ),
        );
    }
    let score = (parsed.value - lo) / (hi - lo);
    let mut subs = BTreeMap::new();
    if let Some(t) = pass_threshold {
        // as for text_similarity: the score stays the judge's; the threshold decides `passed`
        subs.insert("score".to_string(), score);
        subs.insert("passed".to_string(), f64::from(u8::from(parsed.value >= t)));
    }
    GradeResult::scored(
        score,
        format!(
            "judge {} scored {} in [{lo}, {hi}] ({}): {}",
            prompt.model,
            parsed.value,
            parsed.source,
            shortened(reply)
        ),
    )
    .with_sub_scores(subs)
}

/// Grades with `label_model`: 1 when the reply's label is one of `passing`, else 0.
pub fn grade_label(
    prompt: &JudgePrompt,
    judge: Option<&dyn Judge>,
    labels: &[String],
    passing: &[String],
) -> GradeResult {
    let (reply, usage) = match ask(judge, prompt) {
        Ok(reply) => (reply.text, reply.usage),
        Err(failed) => return *failed,
    };
    let graded = match parse_label(&reply, labels) {
        Some(label) => GradeResult::pass_fail(
            passing.iter().any(|p| p == label),
            format!("judge {} labelled '{label}': {}", prompt.model, shortened(&reply)),
        ),
        None => GradeResult::failed(
            ErrorKind::JudgeReply,
            format!("judge reply names none (or several) of {labels:?}: {}", shortened(&reply)),
        ),
    };
    graded.with_judge_usage(&prompt.model, usage)
}
