//! The self-hosted judge: judge models loaded with candle, prompts generated in batches by the
//! rollout sampler (one batched prefill and decode per batch, not one per prompt).

use crate::chat_template::ChatMessage;
use crate::loader::LoadedModel;
use crate::sampler::{sample_seeded, SamplingParams};
use crate::tokenizer::ChatTokenizer;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use verity_verifiers::judge::SamplingKey;
use verity_verifiers::{Judge, JudgeError, JudgePrompt, JudgeReply, TokenUsage};

/// Most prompts generated in one batch (larger batches are split).
pub const MAX_JUDGE_BATCH: usize = 64;

/// A loaded judge model; generations on it are serialised.
pub type SharedModel = Arc<Mutex<LoadedModel>>;

/// Judge models loaded in this process, least recently used dropped first.
pub struct LoadedJudges {
    capacity: usize,
    models: Mutex<Vec<(String, SharedModel)>>,
}

impl LoadedJudges {
    /// Keeps at most `capacity` judge models (at least one).
    pub fn new(capacity: usize) -> Self {
        Self { capacity: capacity.max(1), models: Mutex::new(Vec::new()) }
    }

    /// The loaded model `name`, marked as just used.
    pub fn get(&self, name: &str) -> Option<SharedModel> {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        let at = models.iter().position(|(n, _)| n == name)?;
        let entry = models.remove(at);
        let model = Arc::clone(&entry.1);
        models.push(entry);
        Some(model)
    }

    /// Adds a loaded model, dropping the least recently used past capacity.
    pub fn insert(&self, name: &str, model: LoadedModel) -> SharedModel {
        let shared = Arc::new(Mutex::new(model));
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models.retain(|(n, _)| n != name);
        models.push((name.to_string(), Arc::clone(&shared)));
        while models.len() > self.capacity {
            models.remove(0);
        }
        shared
    }
}

/// The judges one grader asks, by model name.
pub struct LocalJudge {
    models: BTreeMap<String, SharedModel>,
}

impl LocalJudge {
    /// A judge answering for each named model.
    pub fn new(models: BTreeMap<String, SharedModel>) -> Self {
        Self { models }
    }
}

/// The per-prompt seed: the grader's seed mixed with the prompt's text, so a prompt samples the
/// same reply wherever it stands in a batch (and on whichever process asks it).
pub fn prompt_seed(prompt: &JudgePrompt) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    prompt.messages.hash(&mut hasher);
    prompt.sampling.seed ^ hasher.finish()
}

/// The chat messages of a judge prompt (`developer` is a `system` message to local models).
pub fn chat_messages(prompt: &JudgePrompt) -> Vec<ChatMessage> {
    prompt
        .messages
        .iter()
        .map(|m| {
            let role = if m.role == "developer" { "system" } else { m.role.as_str() };
            ChatMessage::new(role, m.content.clone())
        })
        .collect()
}

/// The text a judge model continues for `messages`: its chat template with an open assistant
/// turn, or, for a model without a chat template, the messages' contents one per line.
pub fn render_prompt(tokenizer: &ChatTokenizer, messages: &[ChatMessage]) -> crate::Result<String> {
    match tokenizer.apply_chat_template(messages, true) {
        Err(_) if tokenizer.chat_template_source.is_none() => {
            Ok(messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n"))
        }
        rendered => rendered,
    }
}

/// Generates the replies of `prompts` (same sampling settings) on one model, in batches.
pub fn generate(lm: &LoadedModel, prompts: &[&JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
    let Some(first) = prompts.first() else { return Vec::new() };
    let sampling = &first.sampling;
    let context = lm.model.config.max_position_embeddings;
    // OpenAI's guides ask judges for up to 32768 reply tokens: the reply budget is clamped to
    // what each batch's longest prompt leaves of this model's context, not refused.
    let asked = sampling.max_completion_tokens;
    let limit = context;
    let mut out: Vec<Option<Result<JudgeReply, JudgeError>>> = vec![None; prompts.len()];
    let mut ready: Vec<(usize, Vec<u32>, u64)> = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let text = match render_prompt(&lm.tokenizer, &chat_messages(prompt)) {
            Ok(text) => text,
            Err(e) => {
                out[i] = Some(Err(JudgeError::Failed(format!("chat template: {e}"))));
                continue;
            }
        };
        match lm.tokenizer.encode(&text) {
            Ok(ids) if ids.is_empty() => {
                out[i] = Some(Err(JudgeError::Failed("the prompt renders to no tokens".into())))
            }
            Ok(ids) if ids.len() >= limit => {
                out[i] = Some(Err(JudgeError::Failed(format!(
                    "the judge prompt has {} tokens; the judge's context holds {}",
                    ids.len(),
                    limit.saturating_sub(1)
                ))))
            }
            Ok(ids) => ready.push((i, ids, prompt_seed(prompt))),
            Err(e) => out[i] = Some(Err(JudgeError::Failed(format!("tokenizer: {e}")))),
        }
    }
    let eos = &lm.tokenizer.eos_token_ids;
    let pad = lm.tokenizer.pad_id();
    for chunk in ready.chunks(MAX_JUDGE_BATCH) {
        let ids: Vec<Vec<u32>> = chunk.iter().map(|(_, ids, _)| ids.clone()).collect();
        let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
        let room = context.saturating_sub(longest).max(1);
        let params = SamplingParams { max_new_tokens: asked.min(room), ..sampling.into() };
        let seeds: Vec<u64> = chunk.iter().map(|(_, _, seed)| *seed).collect();
        match sample_seeded(&lm.model, &ids, &seeds, &params, eos, pad, Some(&lm.tokenizer)) {
            Ok(completions) => {
                for c in completions {
                    let (i, ref prompt_ids, _) = chunk[c.prompt_index];
                    let usage = TokenUsage {
                        prompt_tokens: prompt_ids.len() as u64,
                        completion_tokens: c.token_ids.len() as u64,
                    };
                    out[i] = Some(
                        lm.tokenizer
                            .decode(&c.token_ids, true)
                            .map(|text| JudgeReply { text, usage })
                            .map_err(|e| JudgeError::Failed(format!("decoding: {e}"))),
                    );
                }
            }
            Err(e) => {
                for (i, _, _) in chunk {
                    out[*i] = Some(Err(JudgeError::Failed(format!("generation: {e}"))));
                }
            }
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(JudgeError::Failed("no reply generated".into()))))
        .collect()
}

impl Judge for LocalJudge {
    fn complete(&self, prompts: &[JudgePrompt]) -> Vec<Result<JudgeReply, JudgeError>> {
        let mut out: Vec<Option<Result<JudgeReply, JudgeError>>> = vec![None; prompts.len()];
        // one batch per (model, sampling settings)
        let mut groups: HashMap<(&str, SamplingKey), Vec<usize>> = HashMap::new();
        for (i, p) in prompts.iter().enumerate() {
            groups.entry((p.model.as_str(), p.sampling.key())).or_default().push(i);
        }
        for ((model, _), indices) in groups {
            let Some(shared) = self.models.get(model) else {
                for i in indices {
                    out[i] = Some(Err(JudgeError::UnknownModel(model.to_string())));
                }
                continue;
            };
            let lm = shared.lock().unwrap_or_else(|p| p.into_inner());
            let batch: Vec<&JudgePrompt> = indices.iter().map(|&i| &prompts[i]).collect();
            for (i, reply) in indices.iter().zip(generate(&lm, &batch)) {
                out[*i] = Some(reply);
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(JudgeError::Failed("no reply generated".into()))))
            .collect()
    }
}
