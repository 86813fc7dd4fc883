//! Loads the GRPO-family test vectors: `worker/tests/data/loss_vectors.json`, data computed from
//! the reference code of the source chapter (copied from the project's `shared/reference/`).

use std::path::PathBuf;

use serde::Deserialize;

/// The whole vectors file.
#[derive(Debug, Deserialize)]
pub struct TestVectors {
    /// Policy-loss cases.
    pub policy_loss: Vec<PolicyLossCase>,
    /// Advantage cases.
    pub advantages: Vec<AdvantageCase>,
}

/// One policy-loss case with its expected loss and gradient.
#[derive(Debug, Deserialize)]
pub struct PolicyLossCase {
    pub name: String,
    pub mode: String,
    pub epsilon_low: f64,
    pub epsilon_high: f64,
    pub beta: f64,
    pub max_completion_tokens: usize,
    pub logp: Vec<Vec<f64>>,
    pub logp_old: Vec<Vec<f64>>,
    pub logp_ref: Option<Vec<Vec<f64>>>,
    pub mask: Vec<Vec<f64>>,
    pub advantages: Vec<f64>,
    pub expected_loss: f64,
    pub expected_grad_logp: Vec<Vec<f64>>,
}

/// One advantage case.
#[derive(Debug, Deserialize)]
pub struct AdvantageCase {
    pub rewards: Vec<f64>,
    pub group_size: usize,
    pub scale_by_std: bool,
    pub expected: Vec<f64>,
    pub informative_groups: Vec<usize>,
}

/// The vectors file, kept in the repository beside the worker's tests.
pub fn vectors_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/loss_vectors.json")
}

/// Reads and parses the vectors file, panicking with the path on failure (tests only).
pub fn load_test_vectors() -> TestVectors {
    let path = vectors_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read loss vectors {}: {error}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|error| panic!("cannot parse loss vectors {}: {error}", path.display()))
}
