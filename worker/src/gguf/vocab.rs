//! A tokenizer as llama.cpp's GGUF metadata: the byte-level BPE vocabulary with token types,
//! the merges, the special token ids, the pre-tokenizer under llama.cpp's name for it, and the
//! chat template (what `convert_hf_to_gguf.py` writes for a `gpt2`-style vocabulary).

use crate::error::{Result, WorkerError};
use crate::tokenizer::ChatTokenizer;
use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;

/// llama.cpp's token types (`llama_token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// Pre-tokenizer regexes of the HF `Split` step and the llama.cpp name of each.
const SPLIT_REGEXES: &[(&str, &str)] = &[
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        "qwen2",
    ),
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        "llama-bpe",
    ),
];

fn unsupported(what: impl std::fmt::Display) -> WorkerError {
    WorkerError::InvalidArgument(format!("cannot export this tokenizer to GGUF: {what}"))
}

/// The `tokenizer.*` metadata of `tok` for a model with `vocab_size` embedding rows (ids the
/// tokenizer lacks become llama.cpp's `[PAD{id}]` unused tokens, as its converter writes them).
pub fn tokenizer_metadata(tok: &ChatTokenizer, vocab_size: usize) -> Result<Vec<(String, Value)>> {
    let model = serde_json::to_value(tok.tokenizer.get_model())
        .map_err(|e| unsupported(format!("its model does not serialise: {e}")))?;
    if model["type"] != "BPE" {
        return Err(unsupported(format!(
            "only byte-level BPE vocabularies are written, this one is {}",
            model["type"]
        )));
    }
    let merges = merges(&model["merges"])?;
    let vocab = tok.tokenizer.get_vocab(true);
    let added = tok.tokenizer.get_added_tokens_decoder();
    if let Some(id) = vocab.values().find(|id| **id as usize >= vocab_size) {
        return Err(unsupported(format!(
            "token id {id} lies beyond the model's {vocab_size} embedding rows"
        )));
    }
    let mut tokens = vec![None; vocab_size];
    for (text, id) in vocab {
        tokens[id as usize] = Some(text);
    }
    let mut types = Vec::with_capacity(vocab_size);
    let tokens: Vec<Value> = tokens
        .into_iter()
        .enumerate()
        .map(|(id, text)| {
            let (text, kind) = match (text, added.get(&(id as u32))) {
                (None, _) => (format!("[PAD{id}]"), UNUSED),
                (Some(text), Some(t)) if t.special => (text, CONTROL),
                (Some(text), Some(_)) => (text, USER_DEFINED),
                (Some(text), None) => (text, NORMAL),
            };
            types.push(Value::I32(kind));
            Value::String(text)
        })
        .collect();
    let mut meta = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre_tokenizer_name(tok)?.into())),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types)),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges)),
    ];
    let id_of = |text: &Option<String>| text.as_deref().and_then(|t| tok.tokenizer.token_to_id(t));
    let bos = id_of(&tok.special.bos);
    let eos = id_of(&tok.special.eos).or_else(|| tok.eos_token_ids.first().copied());
    for (key, id) in [
        ("bos_token_id", bos),
        ("eos_token_id", eos),
        ("unknown_token_id", id_of(&tok.special.unk)),
        ("padding_token_id", id_of(&tok.special.pad)),
    ] {
        if let Some(id) = id {
            meta.push((format!("tokenizer.ggml.{key}"), Value::U32(id)));
        }
    }
    let adds_bos = bos.is_some_and(|bos| {
        tok.tokenizer.encode("a", true).is_ok_and(|e| e.get_ids().first() == Some(&bos))
    });
    meta.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(adds_bos)));
    meta.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(false)));
    if let Some(template) = &tok.chat_template_source {
        meta.push(("tokenizer.chat_template".into(), Value::String(template.clone())));
    }
    Ok(meta)
}

/// The merges as llama.cpp stores them (`"left right"`), from either of HF's two layouts.
fn merges(json: &Json) -> Result<Vec<Value>> {
    let list = json.as_array().ok_or_else(|| unsupported("its BPE model has no merges"))?;
    list.iter()
        .map(|merge| match merge {
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Array(pair) => match (pair.first(), pair.get(1)) {
                (Some(Json::String(a)), Some(Json::String(b))) => {
                    Ok(Value::String(format!("{a} {b}")))
                }
                _ => Err(unsupported(format!("merge {merge} is not a pair of strings"))),
            },
            other => Err(unsupported(format!("merge {other} is not a string"))),
        })
        .collect()
}

/// llama.cpp's name for the tokenizer's pre-tokenizer (`tokenizer.ggml.pre`): `smollm` (digits
/// one by one, then GPT-2 byte level), `gpt2`, or the regex of a known `Split` step; anything
/// else is refused, since llama.cpp would split the text differently.
pub fn pre_tokenizer_name(tok: &ChatTokenizer) -> Result<&'static str> {
    let json = serde_json::to_value(tok.tokenizer.get_pre_tokenizer())
        .map_err(|e| unsupported(format!("its pre-tokenizer does not serialise: {e}")))?;
    let steps: Vec<&Json> = match json["type"].as_str() {
        Some("Sequence") => {
            json["pretokenizers"].as_array().map(|s| s.iter().collect()).unwrap_or_default()
        }
        Some(_) => vec![&json],
        None => return Err(unsupported("it has no pre-tokenizer")),
    };
    let is = |step: &Json, kind: &str| step["type"] == kind;
    let name = match steps.as_slice() {
        [b] if is(b, "ByteLevel") && b["use_regex"] != false => Some("gpt2"),
        [d, b] if is(d, "Digits") && d["individual_digits"] == true && is(b, "ByteLevel") => {
            Some("smollm")
        }
        [s, b] if is(s, "Split") && is(b, "ByteLevel") && b["use_regex"] == false => s["pattern"]
            ["Regex"]
            .as_str()
            .and_then(|re| SPLIT_REGEXES.iter().find(|(r, _)| *r == re).map(|(_, n)| *n)),
        _ => None,
    };
    name.ok_or_else(|| {
        unsupported(format!(
            "its pre-tokenizer {json} has no llama.cpp counterpart Verity knows (gpt2, smollm, \
             qwen2, llama-bpe)"
        ))
    })
}
