//! Sentence embeddings for `text_similarity` with `cosine`: the [`Embedder`] trait the grader
//! calls (the model behind it lives in the worker crate) and the cosine similarity of two texts.

use std::fmt;
use std::sync::Arc;

use thiserror::Error;

use crate::graders::text_similarity::{Cap, Similarity};

/// One text's embedding and how much of the text the model read.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    /// The sentence vector.
    pub vector: Vec<f32>,
    /// Tokens of the text the model read (at most its sequence limit).
    pub tokens_read: usize,
    /// Tokens of the whole text.
    pub tokens_total: usize,
}

/// Why texts could not be embedded (the model failed to load or to run).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("embedding model {model}: {message}")]
pub struct EmbedError {
    /// The embedding model's name.
    pub model: String,
    /// What went wrong.
    pub message: String,
}

/// A sentence-embedding model: texts in, one vector per text out.
pub trait Embedder: Send + Sync + fmt::Debug {
    /// The model's name, shown in grading reasons.
    fn name(&self) -> &str;
    /// The embeddings of `texts`, in order.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedding>, EmbedError>;
}

/// A shared embedder, as graders hold it.
pub type SharedEmbedder = Arc<dyn Embedder>;

/// Cosine similarity of two vectors (0 when either is zero or their lengths differ).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return 0.0;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na.sqrt() * nb.sqrt())
}

/// The cosine similarity of the embeddings of `candidate` and `reference`, clamped to [0, 1]
/// (a negative cosine, texts pointing apart, scores 0), with the cap when the model read only a
/// prefix of either text.
pub fn cosine_similarity(
    embedder: &dyn Embedder,
    candidate: &str,
    reference: &str,
) -> Result<Similarity, EmbedError> {
    let embeddings = embedder.embed(&[candidate, reference])?;
    let [a, b] = embeddings.as_slice() else {
        return Err(EmbedError {
            model: embedder.name().to_string(),
            message: format!("returned {} embeddings for 2 texts", embeddings.len()),
        });
    };
    let capped = (a.tokens_read < a.tokens_total || b.tokens_read < b.tokens_total).then(|| Cap {
        unit: "tokens",
        limit: a.tokens_read.max(b.tokens_read),
        candidate_len: a.tokens_total,
        reference_len: b.tokens_total,
    });
    Ok(Similarity { value: cosine(&a.vector, &b.vector).clamp(0.0, 1.0), capped })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_of_known_vectors() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 1.0]) - 0.5f64.sqrt()).abs() < 1e-9);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 0.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 2.0]), 0.0);
        assert!((cosine(&[1.0, 2.0], &[-1.0, -2.0]) + 1.0).abs() < 1e-9);
    }
}
