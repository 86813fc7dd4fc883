//! The candle BERT embedder against sentence-transformers' all-MiniLM-L6-v2, and `cosine`
//! grading through it. Needs the fixture of `scripts/fetch-embedding-model.sh` (SKIPPED without).

use std::sync::Arc;

use serde_json::json;
use verity_verifiers::{Embedder, Grader, Sample};
use verity_worker::embedding::{BertEmbedder, EmbeddingModel, EmbeddingModelError};
use verity_worker::testing::minilm_dir;

/// (sentence, first 8 components of its embedding). Produced by
/// scripts/reference/minilm_numpy.py: an independent float64 NumPy implementation of
/// sentence-transformers' pipeline for all-MiniLM-L6-v2 (BERT, mean pooling, L2 norm) reading
/// the same safetensors; its "This is an example sentence" matches the model card's published
/// values (0.0677, 0.0635, 0.0488, 0.0793, …).
const REFERENCE: &[(&str, [f32; 8])] = &[
    (
        "The cat sits on the mat.",
        [0.134177, -0.032900, -0.024804, 0.041439, -0.036348, 0.041814, 0.031217, 0.037202],
    ),
    (
        "A cat is sitting on a rug.",
        [0.100130, -0.019275, 0.017466, 0.055746, -0.072660, 0.040779, 0.030093, 0.040514],
    ),
    (
        "Stock markets fell sharply on Monday.",
        [0.026722, -0.039124, 0.074647, 0.044596, -0.016923, 0.023000, -0.072788, 0.038787],
    ),
    (
        "The answer is 42",
        [0.025489, 0.058308, -0.066106, 0.104602, -0.091314, 0.021908, 0.048321, 0.037421],
    ),
    (
        "This is an example sentence",
        [0.067657, 0.063496, 0.048713, 0.079305, 0.037448, 0.002653, 0.039375, -0.007098],
    ),
];

/// Cosines of REFERENCE pairs from the same script.
const COSINES: &[(usize, usize, f64)] =
    &[(0, 1, 0.768879), (0, 2, 0.026716), (1, 3, 0.049784), (3, 4, 0.129426), (0, 4, -0.070175)];

/// 300 words, more than the 256 tokens the model reads; its first 8 components (same script,
/// truncated to 255 tokens plus the closing [SEP]).
fn long_text() -> String {
    vec!["apples and oranges"; 100].join(" ")
}
const LONG: [f32; 8] =
    [0.039183, -0.033399, -0.029506, -0.042824, 0.065193, 0.000301, 0.077206, -0.032033];

fn close(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4)
}

#[test]
fn minilm_matches_sentence_transformers() {
    let Some(dir) = minilm_dir("minilm_matches_sentence_transformers") else { return };
    let model = BertEmbedder::load(&dir).unwrap();
    assert_eq!(model.max_tokens(), 256);
    let texts: Vec<&str> = REFERENCE.iter().map(|(t, _)| *t).collect();
    // one padded batch and one text at a time give the same vectors
    let batch = model.embed(&texts).unwrap();
    for ((text, expected), got) in REFERENCE.iter().zip(&batch) {
        assert_eq!(got.vector.len(), 384);
        assert!(close(&got.vector[..8], expected), "{text}: {:?}", &got.vector[..8]);
        let norm: f32 = got.vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        assert_eq!(got.tokens_read, got.tokens_total);
        let alone = model.embed(&[text]).unwrap();
        assert!(close(&alone[0].vector, &got.vector), "{text}: batch and single differ");
    }
    for &(i, j, expected) in COSINES {
        let got = verity_verifiers::embed::cosine(&batch[i].vector, &batch[j].vector);
        assert!((got - expected).abs() < 1e-4, "cosine({i}, {j}) = {got}, want {expected}");
    }
    let long = model.embed(&[&long_text()]).unwrap().remove(0);
    assert!(close(&long.vector[..8], &LONG), "{:?}", &long.vector[..8]);
    assert_eq!((long.tokens_read, long.tokens_total), (256, 402));
}

fn cosine_grader() -> Grader {
    Grader::from_json(
        &json!({"type": "text_similarity", "name": "sim", "input": "{{sample.output_text}}",
                "reference": "{{item.reference}}", "evaluation_metric": "cosine", "pass_threshold": 0.7})
        .to_string(),
    )
    .unwrap()
}

#[test]
fn cosine_grader_scores_with_the_model() {
    let Some(dir) = minilm_dir("cosine_grader_scores_with_the_model") else { return };
    let model = EmbeddingModel::new(Some(dir));
    let grader = model.attach(cosine_grader()).unwrap();
    let item = json!({"reference": REFERENCE[1].0});
    let result = grader.grade(&item, &Sample::from_text(REFERENCE[0].0.to_string()));
    assert!(result.error.is_none(), "{result:?}");
    assert!((result.score - 0.768879).abs() < 1e-4, "{result:?}");
    assert_eq!(result.sub_scores.get("passed"), Some(&1.0));
    assert!(result.reason.starts_with("similarity 0.768"), "{}", result.reason);
    // texts pointing apart (negative cosine) score 0
    let apart = grader.grade(
        &json!({"reference": REFERENCE[4].0}),
        &Sample::from_text(REFERENCE[0].0.to_string()),
    );
    assert_eq!((apart.score, apart.error.is_none()), (0.0, true), "{apart:?}");
    // an over-long text: the reason says only a prefix was read
    let long = grader.grade(&json!({"reference": "apples"}), &Sample::from_text(long_text()));
    assert!(
        long.reason.contains("compared only the first 256 tokens of each text (input has 402"),
        "{}",
        long.reason
    );
    // the loaded model is shared, not loaded again
    assert!(Arc::ptr_eq(&model.get().unwrap(), &model.get().unwrap()));
}

#[test]
fn missing_model_is_an_error_naming_the_grader() {
    let multi = Grader::from_json(
        &json!({"type": "multi", "calculate_output": "sim",
                "graders": {"sim": {"type": "text_similarity", "input": "{{sample.output_text}}",
                                    "reference": "x", "evaluation_metric": "cosine"}}})
        .to_string(),
    )
    .unwrap();
    assert_eq!(multi.embedding_paths(), vec!["graders.sim.evaluation_metric".to_string()]);
    // `check` says the same without loading anything (what a request's async thread may call).
    let (path, error) = EmbeddingModel::new(None).check(&multi).unwrap_err();
    assert_eq!(
        (path.as_str(), error),
        ("graders.sim.evaluation_metric", EmbeddingModelError::NotConfigured)
    );
    let (path, error) = EmbeddingModel::new(None).attach(multi).unwrap_err();
    assert_eq!(
        (path.as_str(), error),
        ("graders.sim.evaluation_metric", EmbeddingModelError::NotConfigured)
    );
    let missing = std::path::PathBuf::from("/nonexistent/embedding-model");
    assert!(EmbeddingModel::new(Some(missing.clone())).check(&cosine_grader()).is_ok());
    let (_, error) = EmbeddingModel::new(Some(missing)).attach(cosine_grader()).unwrap_err();
    assert!(matches!(error, EmbeddingModelError::Load { .. }), "{error}");
    // a grader without cosine needs no model
    let lexical = Grader::from_json(
        r#"{"type":"text_similarity","input":"a","reference":"b","evaluation_metric":"meteor"}"#,
    )
    .unwrap();
    assert!(EmbeddingModel::new(None).attach(lexical).is_ok());
    // grading cosine without a model is an error, never a silent 0
    let result = cosine_grader().grade(&json!({"reference": "x"}), &Sample::from_text("x"));
    assert_eq!(result.error.map(|e| e.kind), Some(verity_verifiers::ErrorKind::Embedding));
}
