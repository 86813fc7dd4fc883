//! Constrained decoding on the real SmolLM2-135M-Instruct (skipped loudly when the fixture is
//! absent): a JSON schema's grammar masks every decode step, the outputs parse and follow the
//! schema, and the trainer scores the sampled tokens under the masks the sampler used.

use candle_core::Device;
use serde_json::{json, Value};
use verity_core::response_format::ResponseFormat;
use verity_worker::constrained::{check_format, OutputConstraint};
use verity_worker::sampler::FinishReason;
use verity_worker::testing::smollm2_dir;
use verity_worker::{load_model, sample, ChatMessage, LoadedModel, SamplingParams};

/// The RFT guide's structured-output shape, narrowed so that every output is short: a verdict
/// from an enum, a boolean and a one-digit confidence.
fn verdict_format() -> ResponseFormat {
    serde_json::from_value(json!({"type": "json_schema", "json_schema": {
        "name": "verdict", "strict": true,
        "schema": {"type": "object", "additionalProperties": false,
            "required": ["compliant", "escalate", "confidence"],
            "properties": {
                "compliant": {"type": "string", "enum": ["yes", "no"]},
                "escalate": {"type": "boolean"},
                "confidence": {"type": "integer", "minimum": 0, "maximum": 9}}}}}))
    .unwrap()
}

fn prompt(lm: &LoadedModel) -> Vec<u32> {
    let question = "Is the email 'Send me your password' compliant with our security policy? \
                    Answer in JSON.";
    let text =
        lm.tokenizer.apply_chat_template(&[ChatMessage::new("user", question)], true).unwrap();
    lm.tokenizer.encode(&text).unwrap()
}

fn constrained_params(lm: &LoadedModel, format: &ResponseFormat, n: usize) -> SamplingParams {
    let constraint =
        OutputConstraint::compile(format, &lm.tokenizer, lm.model.config.vocab_size).unwrap();
    assert!(constraint.is_some(), "a JSON format compiles into a grammar");
    SamplingParams {
        n,
        temperature: 1.0,
        max_new_tokens: 48,
        seed: 11,
        constraint,
        ..Default::default()
    }
}

#[test]
fn sampled_outputs_follow_the_schema_and_end_with_eos() {
    let Some(dir) = smollm2_dir("sampled_outputs_follow_the_schema_and_end_with_eos") else {
        return;
    };
    let lm = load_model(&dir, &Device::Cpu).unwrap();
    let params = constrained_params(&lm, &verdict_format(), 6);
    let (eos, pad) = (&lm.tokenizer.eos_token_ids, lm.tokenizer.pad_id());
    let out = sample(&lm.model, &[prompt(&lm)], &params, eos, pad, Some(&lm.tokenizer)).unwrap();
    assert_eq!(out.len(), 6);
    for c in &out {
        let text = lm.tokenizer.decode(&c.token_ids, true).unwrap();
        assert_eq!(c.finish_reason, FinishReason::Eos, "the grammar ends the output: {text:?}");
        assert_eq!(c.token_masks.len(), c.token_ids.len(), "one mask per sampled token");
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(["yes", "no"].contains(&value["compliant"].as_str().unwrap()), "{text}");
        assert!(value["escalate"].is_boolean(), "{text}");
        assert!((0..=9).contains(&value["confidence"].as_i64().unwrap()), "{text}");
        assert_eq!(value.as_object().unwrap().len(), 3, "no other keys: {text}");
        assert!(c.logprobs.iter().all(|lp| lp.is_finite() && *lp <= 1e-6));
    }
    // Without the grammar the same model and seed do not write this JSON.
    let free = SamplingParams { constraint: None, ..params };
    let loose = sample(&lm.model, &[prompt(&lm)], &free, eos, pad, None).unwrap();
    assert!(loose.iter().all(|c| c.token_masks.is_empty()));
    let parsed = loose
        .iter()
        .filter(|c| {
            let text = lm.tokenizer.decode(&c.token_ids, true).unwrap_or_default();
            serde_json::from_str::<Value>(&text).is_ok_and(|v| v.get("confidence").is_some())
        })
        .count();
    assert!(parsed < loose.len(), "free sampling is not already schema-shaped");
}

#[test]
fn the_trainer_scores_constrained_tokens_under_the_samplers_masks() {
    let Some(dir) = smollm2_dir("the_trainer_scores_constrained_tokens_under_the_samplers_masks")
    else {
        return;
    };
    let lm = load_model(&dir, &Device::Cpu).unwrap();
    let params = constrained_params(&lm, &verdict_format(), 3);
    let (eos, pad) = (&lm.tokenizer.eos_token_ids, lm.tokenizer.pad_id());
    let prompt = prompt(&lm);
    let out = sample(&lm.model, std::slice::from_ref(&prompt), &params, eos, pad, None).unwrap();
    let prompts = vec![prompt; out.len()];
    let tokens: Vec<Vec<u32>> = out.iter().map(|c| c.token_ids.clone()).collect();
    let masks: Vec<_> = out.iter().map(|c| c.token_masks.clone()).collect();
    let masked =
        lm.model.completion_logprobs_masked(&prompts, &tokens, &masks, 1.0, pad, false).unwrap();
    let free = lm.model.completion_logprobs(&prompts, &tokens, 1.0, pad, false).unwrap();
    let (masked, free) =
        (masked.logprobs.to_vec2::<f32>().unwrap(), free.logprobs.to_vec2::<f32>().unwrap());
    let mut gained = 0;
    for (i, c) in out.iter().enumerate() {
        for (j, &sampled) in c.logprobs.iter().enumerate() {
            let (m, f) = (masked[i][j], free[i][j]);
            assert!((m - sampled).abs() < 2e-3, "token {j} of {i}: trainer {m}, sampler {sampled}");
            assert!(f <= m + 1e-4, "a mask only removes mass from other tokens");
            if m - f > 1e-2 {
                gained += 1;
            }
        }
    }
    assert!(gained > 0, "the masks changed some tokens' distribution");
    // Masks that do not pair with the tokens are refused, not misapplied.
    let short = vec![masks[0][..1].to_vec(), vec![], vec![]];
    assert!(lm
        .model
        .completion_logprobs_masked(&prompts, &tokens, &short, 1.0, pad, false)
        .is_err());
}

#[test]
fn formats_are_checked_before_anything_samples() {
    let format = |value: Value| serde_json::from_value::<ResponseFormat>(value).unwrap();
    assert!(check_format(&format(json!({"type": "text"}))).is_ok());
    assert!(check_format(&format(json!({"type": "json_object"}))).is_ok());
    assert!(check_format(&verdict_format()).is_ok());
    let impossible = format(json!({"type": "json_schema", "json_schema": {"name": "n",
        "strict": true, "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}));
    let message = check_format(&impossible).unwrap_err();
    assert!(!message.is_empty());
}

#[tokio::test]
async fn the_serving_engine_answers_in_the_requested_json() {
    use std::sync::Arc;
    use verity_core::storage::{publish_folder, LocalStore, ObjectStore};
    use verity_worker::inference::request::{
        GenerationEvent, GenerationParams, GenerationRequest, ModelSource, PromptInput,
    };
    use verity_worker::inference::{Engine, EngineConfig};
    let Some(dir) = smollm2_dir("the_serving_engine_answers_in_the_requested_json") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(scratch.path().join("objects"), None).await.unwrap());
    publish_folder(store.as_ref(), &dir, "models/smollm2").await.unwrap();
    let engine = Engine::new(
        store,
        EngineConfig {
            cache_dir: scratch.path().join("cache"),
            device: Device::Cpu,
            memory_budget_bytes: usize::MAX / 2,
            max_batch: 8,
            decode_dtype: Default::default(),
            idle_unload: None,
        },
    );
    let question = "Is the email 'Send me your password' compliant? Answer in JSON.";
    let request = GenerationRequest {
        model: ModelSource {
            base_prefix: "models/smollm2".into(),
            base_format: "hf".into(),
            merged: Vec::new(),
            checkpoint_prefix: None,
        },
        prompt: PromptInput::Chat(vec![ChatMessage::new("user", question)]),
        params: GenerationParams {
            n: 2,
            max_tokens: Some(48),
            seed: 5,
            logprobs: Some(0),
            response_format: Some(verdict_format()),
            ..GenerationParams::default()
        },
    };
    let mut generation = engine.generate(request).await.unwrap();
    let mut texts = vec![String::new(); 2];
    let mut finished = 0;
    while let Some(event) = generation.events.recv().await {
        match event {
            GenerationEvent::Delta { index, text, logprobs } => {
                texts[index].push_str(&text);
                assert!(logprobs.iter().all(|lp| lp.logprob.is_finite()));
            }
            GenerationEvent::Finished { .. } => finished += 1,
            other @ (GenerationEvent::Failed { .. } | GenerationEvent::Refused { .. }) => {
                panic!("{other:?}")
            }
            GenerationEvent::Started { .. } | GenerationEvent::PromptLogprobs { .. } => {}
        }
    }
    assert_eq!(finished, 2);
    for text in texts {
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(value["escalate"].is_boolean(), "{text}");
    }
}
