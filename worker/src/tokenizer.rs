//! Tokenizer plus chat template and special tokens, loaded from an HF folder or a GGUF file.

use crate::chat_template::{ChatMessage, ChatTemplate};
use crate::error::{read_json, read_to_string, Result, WorkerError};
use std::path::Path;

/// Names of the special tokens HF's `tokenizer_config.json` records.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    /// Beginning-of-sequence token text.
    pub bos: Option<String>,
    /// End-of-sequence token text.
    pub eos: Option<String>,
    /// Padding token text.
    pub pad: Option<String>,
    /// Unknown token text.
    pub unk: Option<String>,
}

/// A tokenizer with the model's chat template and stop ids.
#[derive(Clone)]
pub struct ChatTokenizer {
    /// The underlying HF tokenizer.
    pub tokenizer: tokenizers::Tokenizer,
    /// The chat template source, if the model has one.
    pub chat_template_source: Option<String>,
    template: Option<ChatTemplate>,
    /// Special token texts.
    pub special: SpecialTokens,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
}

/// The chat layout of models without a chat template (supervised and DPO rows): each message's
/// content then a newline, an assistant message's content followed by the EOS token.
pub const PLAIN_CHAT_TEMPLATE: &str = "{% for m in messages %}{{ m.content }}{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}";

fn tok_err(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Tokenizer(e.to_string())
}

/// A token entry of tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => {
            o.get("content").and_then(|c| c.as_str()).map(str::to_owned)
        }
        _ => None,
    }
}

impl ChatTokenizer {
    /// Assembles a chat tokenizer; EOS ids also include the id of the EOS token text.
    pub fn new(
        tokenizer: tokenizers::Tokenizer,
        chat_template_source: Option<String>,
        special: SpecialTokens,
        mut eos_token_ids: Vec<u32>,
    ) -> Self {
        if let Some(id) = special.eos.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        let template = chat_template_source.as_deref().and_then(|s| match ChatTemplate::new(s) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "chat template does not compile; chat formatting disabled");
                None
            }
        });
        Self { tokenizer, chat_template_source, template, special, eos_token_ids }
    }

    /// Loads `tokenizer.json`, `tokenizer_config.json` (or `chat_template.jinja`) and the EOS ids
    /// of `generation_config.json` from an HF folder; `extra_eos` come from `config.json`.
    pub fn from_hf_dir(dir: &Path, extra_eos: &[u32]) -> Result<Self> {
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
            .map_err(|e| WorkerError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value =
            if cfg_path.is_file() { read_json(&cfg_path)? } else { serde_json::json!({}) };
        let mut template = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
            _ => None,
        };
        let jinja = dir.join("chat_template.jinja");
        if template.is_none() && jinja.is_file() {
            template = Some(read_to_string(&jinja)?);
        }
        let mut eos = extra_eos.to_vec();
        let gen_path = dir.join("generation_config.json");
        if gen_path.is_file() {
            let gen: serde_json::Value = read_json(&gen_path)?;
            match gen.get("eos_token_id") {
                Some(serde_json::Value::Number(n)) => eos.extend(n.as_u64().map(|x| x as u32)),
                Some(serde_json::Value::Array(a)) => {
                    eos.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                }
                _ => {}
            }
        }
        eos.sort_unstable();
        eos.dedup();
        let special = SpecialTokens {
            bos: token_text(cfg.get("bos_token")),
            eos: token_text(cfg.get("eos_token")),
            pad: token_text(cfg.get("pad_token")),
            unk: token_text(cfg.get("unk_token")),
        };
        Ok(Self::new(tokenizer, template, special, eos))
    }

    /// Token ids of `text`, without adding special tokens (the chat template already has them).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(text, false).map_err(tok_err)?.get_ids().to_vec())
    }

    /// Text of `ids`, optionally dropping special tokens.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer.decode(ids, skip_special_tokens).map_err(tok_err)
    }

    /// Renders messages with the chat template as HF `apply_chat_template(tokenize=False)` does.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let t = self.template.as_ref().ok_or_else(|| {
            WorkerError::Template("this model has no (usable) chat template".into())
        })?;
        t.render(
            messages,
            add_generation_prompt,
            self.special.bos.as_deref(),
            self.special.eos.as_deref(),
        )
    }

    /// Renders a chat of OpenAI-shaped messages (and `tools`) with the chat template; a model
    /// without one renders [`PLAIN_CHAT_TEMPLATE`] (each message's content on its own line, the
    /// assistant's followed by the EOS token).
    pub fn render_chat(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let (bos, eos) = (self.special.bos.as_deref(), self.special.eos.as_deref());
        match (&self.template, &self.chat_template_source) {
            (Some(t), _) => t.render_with_tools(messages, tools, add_generation_prompt, bos, eos),
            (None, Some(_)) => {
                Err(WorkerError::Template("this model's chat template does not compile".into()))
            }
            (None, None) => ChatTemplate::new(PLAIN_CHAT_TEMPLATE)?.render_with_tools(
                messages,
                tools,
                add_generation_prompt,
                bos,
                eos,
            ),
        }
    }

    /// The id used to pad batches (pad, else EOS, else 0); padded positions are masked anyway.
    pub fn pad_id(&self) -> u32 {
        self.special
            .pad
            .as_deref()
            .and_then(|t| self.tokenizer.token_to_id(t))
            .or_else(|| self.eos_token_ids.first().copied())
            .unwrap_or(0)
    }

    /// An HF `tokenizer_config.json` document describing this tokenizer.
    pub fn tokenizer_config_json(&self, model_max_length: usize) -> serde_json::Value {
        let mut added = serde_json::Map::new();
        let mut decoder: Vec<_> = self.tokenizer.get_added_tokens_decoder().into_iter().collect();
        decoder.sort_by_key(|(id, _)| *id);
        for (id, t) in decoder {
            added.insert(
                id.to_string(),
                serde_json::json!({
                    "content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                    "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special,
                }),
            );
        }
        serde_json::json!({
            "add_prefix_space": false,
            "added_tokens_decoder": added,
            "bos_token": self.special.bos,
            "eos_token": self.special.eos,
            "pad_token": self.special.pad,
            "unk_token": self.special.unk,
            "chat_template": self.chat_template_source,
            "clean_up_tokenization_spaces": false,
            "model_max_length": model_max_length,
            "tokenizer_class": "GPT2Tokenizer",
        })
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` into `dir`.
    pub fn save_hf(&self, dir: &Path, model_max_length: usize) -> Result<()> {
        let path = dir.join("tokenizer.json");
        self.tokenizer
            .save(&path, true)
            .map_err(|e| WorkerError::Tokenizer(format!("{}: {e}", path.display())))?;
        crate::error::write_json(
            &dir.join("tokenizer_config.json"),
            &self.tokenizer_config_json(model_max_length),
        )
    }
}
