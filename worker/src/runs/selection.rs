//! Rejection sampling's selection: which graded completions to keep, and the supervised chat
//! dataset (OpenAI's fine-tuning format) they make.

use crate::trainer::rollout::Group;
use crate::trainer::Dataset;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashSet;
use verity_core::sampling_runs::SelectionPolicy;

/// One kept completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    /// Row index of its prompt.
    pub example: usize,
    /// Its position among the prompt's samples.
    pub sample: usize,
    /// The completion text.
    pub text: String,
    /// Its score.
    pub score: f64,
}

/// One prompt's outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptSummary {
    /// Row index of the prompt in the file (0-based).
    pub prompt_index: usize,
    /// Completions sampled.
    pub samples: usize,
    /// Completions scoring at least `min_score` (failed gradings never pass).
    pub passing: usize,
    /// `passing / samples`.
    pub pass_rate: f64,
    /// Completions kept in the output file.
    pub kept: usize,
}

/// What a selection kept, and the per-prompt summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    /// Kept completions, by prompt then sample.
    pub kept: Vec<Kept>,
    /// One entry per prompt, in file order.
    pub prompts: Vec<PromptSummary>,
}

/// Applies `policy` to graded groups: completions scoring at least `min_score` (and not failed
/// gradings) pass; `best` keeps the highest-scoring passing one per prompt (the first on ties),
/// `all_passing` every passing one, identical texts of a prompt kept once.
pub fn select(groups: &[Group], policy: SelectionPolicy, min_score: f64) -> Selection {
    let mut kept = Vec::new();
    let mut prompts = Vec::with_capacity(groups.len());
    for g in groups {
        let passing: Vec<(usize, f64)> = g
            .grades
            .iter()
            .enumerate()
            .filter(|(_, grade)| !grade.is_error() && grade.score >= min_score)
            .map(|(i, grade)| (i, grade.score))
            .collect();
        let chosen: Vec<usize> = match policy {
            SelectionPolicy::Best => passing
                .iter()
                .copied()
                .reduce(|best, next| if next.1 > best.1 { next } else { best })
                .map(|(i, _)| i)
                .into_iter()
                .collect(),
            SelectionPolicy::AllPassing => {
                let mut seen = HashSet::new();
                passing.iter().map(|&(i, _)| i).filter(|&i| seen.insert(&g.texts[i])).collect()
            }
        };
        let samples = g.grades.len();
        prompts.push(PromptSummary {
            prompt_index: g.example,
            samples,
            passing: passing.len(),
            pass_rate: if samples > 0 { passing.len() as f64 / samples as f64 } else { 0.0 },
            kept: chosen.len(),
        });
        kept.extend(chosen.into_iter().map(|i| Kept {
            example: g.example,
            sample: i,
            text: g.texts[i].clone(),
            score: g.grades[i].score,
        }));
    }
    Selection { kept, prompts }
}

/// The chat of a dataset row: its `messages` (role and content), or `prompt` as a user turn.
fn prompt_messages(item: &Value) -> Vec<Value> {
    if let Some(Value::Array(messages)) = item.get("messages") {
        return messages
            .iter()
            .map(|m| {
                json!({"role": m.get("role").cloned().unwrap_or(Value::Null),
                            "content": m.get("content").cloned().unwrap_or(Value::Null)})
            })
            .collect();
    }
    let prompt = item.get("prompt").and_then(Value::as_str).unwrap_or_default();
    vec![json!({"role": "user", "content": prompt})]
}

/// The kept completions as supervised chat JSONL: one
/// `{"messages": [prompt messages…, {"role": "assistant", "content": completion}]}` line each.
pub fn supervised_jsonl(dataset: &Dataset, kept: &[Kept]) -> String {
    let mut out = String::new();
    for k in kept {
        let mut messages = prompt_messages(&dataset.examples[k.example].item);
        messages.push(json!({"role": "assistant", "content": k.text}));
        out.push_str(&json!({ "messages": messages }).to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::Example;
    use verity_verifiers::GradeResult;

    fn group(example: usize, graded: &[(&str, f64)]) -> Group {
        Group {
            example,
            completions: Vec::new(),
            texts: graded.iter().map(|(t, _)| t.to_string()).collect(),
            grades: graded.iter().map(|&(_, s)| GradeResult::scored(s, "")).collect(),
            episodes: Vec::new(),
        }
    }

    #[test]
    fn best_keeps_the_top_passing_completion_and_all_passing_drops_duplicates() {
        let groups = vec![
            group(0, &[("a", 0.5), ("b", 1.0), ("c", 1.0), ("b", 1.0)]),
            group(1, &[("x", 0.0), ("y", 0.2)]),
        ];
        let best = select(&groups, SelectionPolicy::Best, 0.5);
        let texts: Vec<&str> = best.kept.iter().map(|k| k.text.as_str()).collect();
        assert_eq!(texts, vec!["b"], "the first of the highest; prompt 1 has none passing");
        assert_eq!(best.prompts[0].passing, 4);
        assert_eq!(best.prompts[1].kept, 0);
        let all = select(&groups, SelectionPolicy::AllPassing, 1.0);
        let texts: Vec<&str> = all.kept.iter().map(|k| k.text.as_str()).collect();
        assert_eq!(texts, vec!["b", "c"]);
        assert_eq!(all.prompts[0].pass_rate, 0.75);
    }

    #[test]
    fn supervised_lines_append_the_completion_to_the_prompt_chat() {
        let row = |item: Value| Example { item, prompt_text: String::new(), prompt_ids: vec![] };
        let dataset = Dataset {
            examples: vec![
                row(json!({"prompt": "2+2?", "answer": "4"})),
                row(json!({"messages": [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "3+3?"}]})),
            ],
        };
        let kept = vec![
            Kept { example: 0, sample: 0, text: "4".into(), score: 1.0 },
            Kept { example: 1, sample: 2, text: "6".into(), score: 1.0 },
        ];
        let text = supervised_jsonl(&dataset, &kept);
        let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(
            lines[0],
            json!({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})
        );
        assert_eq!(lines[1]["messages"].as_array().unwrap().len(), 3);
        assert_eq!(lines[1]["messages"][2], json!({"role": "assistant", "content": "6"}));
    }
}
