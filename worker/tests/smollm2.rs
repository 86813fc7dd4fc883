//! Tests on the real SmolLM2-135M-Instruct (skipped loudly when the fixture is absent).

use candle_core::Device;
use verity_worker::testing::{greedy_ids, smollm2_dir, smollm2_gguf};
use verity_worker::{load_model, sample, ChatMessage, SamplingParams};

#[test]
fn greedy_answers_seven_plus_five() {
    let Some(dir) = smollm2_dir("greedy_answers_seven_plus_five") else {
        return;
    };
    let lm = load_model(&dir, &Device::Cpu).unwrap();
    let text = lm
        .tokenizer
        .apply_chat_template(
            &[ChatMessage::new("user", "What is 7 + 5? Answer with just the number.")],
            true,
        )
        .unwrap();
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
    let ids = lm.tokenizer.encode(&text).unwrap();
    let answer = lm.tokenizer.decode(&greedy_ids(&lm, ids, 8).unwrap(), true).unwrap();
    eprintln!("greedy answer: {answer:?}");
    // The dequantised model answers "7 + 5 = 12": the answer must end with the number 12.
    let last_number: String = answer
        .trim()
        .rsplit(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .unwrap_or("")
        .to_string();
    assert_eq!(last_number, "12", "got {answer:?}");
}

#[test]
fn gguf_tokenizer_matches_converted_folder() {
    let (Some(dir), Some(gguf)) =
        (smollm2_dir("gguf_tokenizer_matches"), smollm2_gguf("gguf_tokenizer_matches"))
    else {
        return;
    };
    let from_dir = verity_worker::ChatTokenizer::from_hf_dir(&dir, &[]).unwrap();
    let from_gguf = verity_worker::gguf::GgufFile::open(&gguf).unwrap().tokenizer().unwrap();
    let text = "<|im_start|>user\nWhat is 1234 + 56?  Tabs\tand émojis 🙂<|im_end|>\n";
    let ids = from_gguf.encode(text).unwrap();
    assert_eq!(ids, from_dir.encode(text).unwrap());
    assert_eq!(ids[0], 1, "special token <|im_start|> must be one id");
    // Golden ids from the Python `tokenizers` package loading the converted tokenizer.json.
    let golden = [
        1, 4093, 198, 1780, 314, 216, 33, 34, 35, 36, 1232, 216, 37, 38, 47, 216, 312, 7366, 197,
        397, 26411, 15771, 90, 271, 47526, 2, 198,
    ];
    assert_eq!(ids, golden);
    // Digits are split one by one.
    let digits = from_gguf.encode("1234").unwrap();
    assert_eq!(digits.len(), 4);
    assert_eq!(from_gguf.decode(&ids, false).unwrap(), text);
}

#[test]
fn logits_match_quantised_gguf_reference() {
    let Some(gguf) = smollm2_gguf("logits_match_quantised_gguf_reference") else {
        return;
    };
    use candle_transformers::models::quantized_llama::ModelWeights;
    let lm = load_model(&gguf, &Device::Cpu).unwrap();
    let text = lm
        .tokenizer
        .apply_chat_template(&[ChatMessage::new("user", "What is the capital of France?")], true)
        .unwrap();
    let ids = lm.tokenizer.encode(&text).unwrap();
    let ours = lm.model.sequence_logits(&[&ids], 0).unwrap();
    let ours: Vec<f32> = ours.get(0).unwrap().get(ids.len() - 1).unwrap().to_vec1().unwrap();

    let mut f = std::fs::File::open(&gguf).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let mut reference = ModelWeights::from_gguf(content, &mut f, &Device::Cpu).unwrap();
    let input =
        candle_core::Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let theirs: Vec<f32> =
        reference.forward(&input, 0).unwrap().flatten_all().unwrap().to_vec1().unwrap();

    let argmax = |v: &[f32]| v.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
    let max_diff = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let spread = theirs.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
        - theirs.iter().fold(f32::INFINITY, |m, &x| m.min(x));
    eprintln!("max |logit diff| vs quantised reference: {max_diff} (logit range {spread})");
    // The reference quantises activations to Q8 inside its matmuls, so it is only close:
    // our top token must be among its top 5 and no logit may be off by more than 10% of the range.
    let mut order: Vec<usize> = (0..theirs.len()).collect();
    order.sort_by(|&a, &b| theirs[b].total_cmp(&theirs[a]));
    assert!(order[..5].contains(&argmax(&ours)), "our top token is not in the reference top 5");
    assert!(max_diff < 0.1 * spread, "max diff {max_diff} vs range {spread}");
}

#[test]
fn logits_match_candle_llama_on_converted_folder() {
    let Some(dir) = smollm2_dir("logits_match_candle_llama_on_converted_folder") else {
        return;
    };
    use candle_transformers::models::llama as cl;
    let lm = load_model(&dir, &Device::Cpu).unwrap();
    let text = lm
        .tokenizer
        .apply_chat_template(&[ChatMessage::new("user", "Name three colours.")], true)
        .unwrap();
    let ids = lm.tokenizer.encode(&text).unwrap();
    let ours: Vec<f32> = lm
        .model
        .sequence_logits(&[&ids], 0)
        .unwrap()
        .get(0)
        .unwrap()
        .get(ids.len() - 1)
        .unwrap()
        .to_vec1()
        .unwrap();
    let cfg: cl::LlamaConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let cfg = cfg.into_config(false);
    // SAFETY: the test does not modify the file while it is mapped.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(
            &[dir.join("model.safetensors")],
            candle_core::DType::F32,
            &Device::Cpu,
        )
        .unwrap()
    };
    let reference = cl::Llama::load(vb, &cfg).unwrap();
    let mut cache = cl::Cache::new(false, candle_core::DType::F32, &cfg, &Device::Cpu).unwrap();
    let input =
        candle_core::Tensor::new(ids.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let theirs: Vec<f32> =
        reference.forward(&input, 0, &mut cache).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let max_diff = ours.iter().zip(&theirs).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(max_diff < 1e-3, "max |logit diff| {max_diff}");
}

#[test]
fn stop_strings_end_generation() {
    let Some(dir) = smollm2_dir("stop_strings_end_generation") else {
        return;
    };
    let lm = load_model(&dir, &Device::Cpu).unwrap();
    let ids =
        verity_worker::testing::chat_prompt_ids(&lm, "What is 7 + 5? Answer with just the number.")
            .unwrap();
    let params = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 8,
        stop_strings: vec![" =".into()],
        ..Default::default()
    };
    let out = sample(
        &lm.model,
        &[ids],
        &params,
        &lm.tokenizer.eos_token_ids,
        lm.tokenizer.pad_id(),
        Some(&lm.tokenizer),
    )
    .unwrap();
    let answer = lm.tokenizer.decode(&out[0].token_ids, true).unwrap();
    assert_eq!(out[0].finish_reason, verity_worker::FinishReason::Stop, "{answer:?}");
    assert!(answer.ends_with(" ="), "{answer:?}");
}
