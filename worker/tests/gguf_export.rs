//! GGUF export of the real SmolLM2-135M-Instruct (skipped loudly when the fixture is absent):
//! read back by Verity's loader (config, tokenizer, chat template, greedy answers), and checked
//! with llama.cpp's own `gguf` package when `VERITY_TEST_PYTHON` has it (scripts/test-services.sh).

use candle_core::Device;
use serde_json::Value;
use std::path::Path;
use verity_worker::gguf::{export_gguf, modelfile, GgufQuant};
use verity_worker::testing::{chat_prompt_ids, greedy_ids, smollm2_dir};
use verity_worker::{load_model, LoadedModel};

/// Ten prompts of the kind the demo trains on, plus a few of other shapes.
const PROMPTS: [&str; 10] = [
    "What is 7 + 5? Answer with just the number.",
    "What is 12 + 30?",
    "Name a colour of the sky.",
    "Write one word that rhymes with cat.",
    "What is the capital of France?",
    "Count from 1 to 5.",
    "Say hello in French.",
    "What is 9 times 3?",
    "Give me a short greeting.",
    "Is 17 a prime number?",
];

fn greedy(lm: &LoadedModel, prompt: &str, tokens: usize) -> Vec<u32> {
    greedy_ids(lm, chat_prompt_ids(lm, prompt).unwrap(), tokens).unwrap()
}

/// Runs llama.cpp's `gguf` package over the export; `None` (loudly) without it.
fn llama_cpp_report(gguf: &Path, hf: &Path) -> Option<Value> {
    let Ok(python) = std::env::var("VERITY_TEST_PYTHON") else {
        eprintln!("SKIPPED: the gguf-py check: VERITY_TEST_PYTHON is not set (scripts/test-services.sh sets it)");
        return None;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gguf_check.py");
    let out = std::process::Command::new(python).arg(script).arg(gguf).arg(hf).output().unwrap();
    assert!(out.status.success(), "gguf_check.py: {}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn smollm2_exports_to_gguf_that_reads_back_and_answers_the_same() {
    let Some(dir) = smollm2_dir("smollm2_exports_to_gguf_that_reads_back_and_answers_the_same")
    else {
        return;
    };
    let original = load_model(&dir, &Device::Cpu).unwrap();
    let answers: Vec<Vec<u32>> = PROMPTS.iter().map(|p| greedy(&original, p, 16)).collect();
    let tmp = tempfile::tempdir().unwrap();
    // VERITY_GGUF_DUMP=DIR keeps the exports and the f32 answers there for llama.cpp itself
    // (bench/peers/llamacpp_gguf_check.py compares its greedy answers with these).
    let dump = std::env::var_os("VERITY_GGUF_DUMP").map(std::path::PathBuf::from);
    if let Some(dump) = &dump {
        std::fs::create_dir_all(dump).unwrap();
        let rows: Vec<Value> = PROMPTS
            .iter()
            .zip(&answers)
            .map(|(p, a)| {
                let ids = chat_prompt_ids(&original, p).unwrap();
                serde_json::json!({"prompt": p, "prompt_ids": ids, "f32_answer_ids": a})
            })
            .collect();
        let eos = &original.tokenizer.eos_token_ids;
        let doc = serde_json::json!({"eos_token_ids": eos, "prompts": rows});
        std::fs::write(dump.join("answers.json"), doc.to_string()).unwrap();
    }
    let mut answers_checked = Vec::new();
    for quant in GgufQuant::ALL {
        let path = tmp.path().join(format!("smollm2.{quant}.gguf"));
        let written = export_gguf(&original, "smollm2", quant, &path).unwrap();
        assert_eq!(written.bytes, std::fs::metadata(&path).unwrap().len());
        assert!(!tmp.path().join(format!("smollm2.{quant}.gguf.partial")).exists());
        if let Some(dump) = &dump {
            std::fs::copy(&path, dump.join(path.file_name().unwrap())).unwrap();
        }

        // Verity's own GGUF reader gets the same model, tokenizer and chat template back.
        let back = load_model(&path, &Device::Cpu).unwrap();
        let (a, b) = (&original.model.config, &back.model.config);
        assert_eq!(
            (a.family, a.vocab_size, a.hidden_size, a.num_hidden_layers, a.num_key_value_heads),
            (b.family, b.vocab_size, b.hidden_size, b.num_hidden_layers, b.num_key_value_heads)
        );
        assert_eq!(a.tie_word_embeddings, b.tie_word_embeddings);
        assert_eq!(back.tokenizer.chat_template_source, original.tokenizer.chat_template_source);
        for text in ["12345 apples + 67 pears", "  Hello,\nworld! ", "<|im_start|>user\nhi"] {
            assert_eq!(
                back.tokenizer.encode(text).unwrap(),
                original.tokenizer.encode(text).unwrap(),
                "{quant}: {text:?}"
            );
        }
        // Tokens each answer shares with the f32 model's before they part.
        let got: Vec<Vec<u32>> = PROMPTS.iter().map(|p| greedy(&back, p, 16)).collect();
        let same = got.iter().zip(&answers).filter(|(g, w)| g == w).count();
        let shared: Vec<usize> = got
            .iter()
            .zip(&answers)
            .map(|(g, w)| g.iter().zip(w).take_while(|(a, b)| a == b).count())
            .collect();
        eprintln!(
            "{quant}: {same}/10 greedy answers identical (shared tokens {shared:?}), {} bytes, {:?}",
            written.bytes, written.types
        );
        answers_checked.push((quant, same, shared));
        let Some(report) = llama_cpp_report(&path, &dir) else { continue };
        let meta = &report["metadata"];
        assert_eq!(meta["general.architecture"], "llama");
        assert_eq!(meta["tokenizer.ggml.model"], "gpt2");
        assert_eq!(meta["tokenizer.ggml.pre"], "smollm");
        assert_eq!(meta["tokenizer.ggml.tokens"], original.model.config.vocab_size);
        assert_eq!(meta["llama.block_count"], 30);
        assert!(meta["tokenizer.chat_template"].as_str().unwrap().contains("<|im_start|>"));
        assert_eq!(report["missing"], serde_json::json!([]), "every weight is in the file");
        for (name, t) in report["tensors"].as_object().unwrap() {
            let kind = t["type"].as_str().unwrap();
            let err = t["rel_rms_err"].as_f64().unwrap();
            // llama.cpp's decoders read back what was written, within each format's error.
            let bound = match kind {
                "F32" => 0.0,
                "F16" => 1e-3,
                "Q8_0" => 1e-2,
                "Q6_K" => 3e-2,
                "Q5_0" => 6e-2,
                "Q4_K" => 1.2e-1,
                other => panic!("{name}: unexpected type {other}"),
            };
            assert!(err <= bound, "{quant} {name} ({kind}): relative RMS error {err}");
            if let Some(same) = t.get("same_bytes_as_gguf_py") {
                assert_eq!(
                    same, true,
                    "{quant} {name} ({kind}): bytes differ from llama.cpp's quantiser"
                );
            }
        }
        let types: Vec<&str> = report["tensors"]
            .as_object()
            .unwrap()
            .values()
            .filter_map(|t| t["type"].as_str())
            .collect();
        match quant {
            GgufQuant::F16 => assert!(types.iter().all(|t| ["F16", "F32"].contains(t))),
            GgufQuant::Q8_0 => assert!(types.iter().all(|t| ["Q8_0", "F32"].contains(t))),
            // SmolLM2's 576-wide rows take llama-quantize's fallbacks; ffn_down's 1536 are k-quants.
            GgufQuant::Q4KM => {
                assert!(types.contains(&"Q4_K") && types.contains(&"Q6_K"), "{types:?}");
                assert!(types.contains(&"Q5_0") && types.contains(&"Q8_0"), "{types:?}");
            }
        }
    }
    // f16 changes no answer. q8_0 flips a near tie in two of these ten on this fixture (a Q4_1
    // model dequantised), and q4_k_m (mostly q5_0 here: 576-wide rows) most answers after a few
    // tokens; the bytes are llama.cpp's own quantisers' (checked above).
    for (quant, same, shared) in answers_checked {
        let first_tokens = shared.iter().filter(|n| **n >= 1).count();
        let (least_same, least_first) = match quant {
            GgufQuant::F16 => (10, 10),
            GgufQuant::Q8_0 => (8, 9),
            GgufQuant::Q4KM => (0, 6),
        };
        assert!(same >= least_same, "{quant}: only {same}/10 greedy answers identical");
        assert!(
            first_tokens >= least_first,
            "{quant}: only {first_tokens}/10 first tokens the same"
        );
    }
    let text = modelfile("smollm2.q8_0.gguf", &original.tokenizer);
    assert!(text.starts_with("FROM ./smollm2.q8_0.gguf\nTEMPLATE \"\"\""), "{text}");
    assert!(text.contains("PARAMETER stop \"<|im_end|>\"\n"), "{text}");
}

#[test]
fn a_word_level_tokenizer_is_refused_by_name() {
    let model = verity_worker::testing::tiny_model(verity_worker::Family::Llama, 1).unwrap();
    let tokenizer = verity_worker::trainer::testing::tiny_tokenizer().unwrap();
    let lm = LoadedModel { model, tokenizer };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("tiny.gguf");
    let error = export_gguf(&lm, "tiny", GgufQuant::F16, &out).unwrap_err().to_string();
    assert!(error.contains("byte-level BPE"), "{error}");
    assert!(!out.exists() && !tmp.path().join("tiny.gguf.partial").exists());
}
