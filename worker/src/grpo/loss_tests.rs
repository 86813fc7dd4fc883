//! Tests of the policy loss: shared vectors, micro-batch additivity, padding, stats, errors.

use candle_core::{Device, Var};

use super::*;
use crate::grpo::test_vectors::{load_test_vectors, PolicyLossCase};

fn matrix(rows: &[Vec<f64>]) -> Tensor {
    Tensor::new(rows.to_vec(), &Device::Cpu).unwrap()
}

fn config_of(case: &PolicyLossCase) -> LossConfig {
    LossConfig {
        mode: case.mode.parse().unwrap(),
        epsilon_low: case.epsilon_low,
        epsilon_high: case.epsilon_high,
        beta: case.beta,
        max_completion_tokens: case.max_completion_tokens,
        tis_cap: None,
    }
}

/// Loss value and d loss / d logp for rows `rows` of a case under a given normaliser.
fn loss_and_grad(
    case: &PolicyLossCase,
    config: &LossConfig,
    rows: std::ops::Range<usize>,
    normalizer: &StepNormalizer,
) -> (f64, Vec<Vec<f64>>, LossStats) {
    let logp = Var::from_tensor(&matrix(&case.logp[rows.clone()])).unwrap();
    let logp_old = matrix(&case.logp_old[rows.clone()]);
    let logp_ref = case.logp_ref.as_ref().map(|r| matrix(&r[rows.clone()]));
    let mask = matrix(&case.mask[rows.clone()]);
    let advantages = Tensor::new(&case.advantages[rows], &Device::Cpu).unwrap();
    let inputs = PolicyLossInputs {
        logp: logp.as_tensor(),
        logp_old: &logp_old,
        logp_ref: logp_ref.as_ref(),
        mask: &mask,
        advantages: &advantages,
        is_weights: None,
    };
    let output = policy_loss(&inputs, config, normalizer).unwrap();
    let grads = output.loss.backward().unwrap();
    let grad = grads.get(logp.as_tensor()).unwrap().to_vec2::<f64>().unwrap();
    (output.loss.to_scalar::<f64>().unwrap(), grad, output.stats)
}

fn assert_rows_close(actual: &[Vec<f64>], expected: &[Vec<f64>], tolerance: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: row count");
    for (row, (a, e)) in actual.iter().zip(expected).enumerate() {
        for (column, (x, y)) in a.iter().zip(e).enumerate() {
            assert!((x - y).abs() <= tolerance, "{what} [{row}][{column}]: {x} vs {y}");
        }
    }
}

#[test]
fn reproduces_the_loss_vectors() {
    let vectors = load_test_vectors();
    assert!(!vectors.policy_loss.is_empty());
    for case in &vectors.policy_loss {
        let config = config_of(case);
        let normalizer = StepNormalizer::from_masks([&matrix(&case.mask)]).unwrap();
        let (loss, grad, _) = loss_and_grad(case, &config, 0..case.logp.len(), &normalizer);
        assert!(
            (loss - case.expected_loss).abs() <= 1e-6,
            "{}: loss {loss} vs {}",
            case.name,
            case.expected_loss
        );
        assert_rows_close(&grad, &case.expected_grad_logp, 1e-6, &case.name);
        let grad_error = grad
            .iter()
            .flatten()
            .zip(case.expected_grad_logp.iter().flatten())
            .map(|(a, e)| (a - e).abs())
            .fold(0.0, f64::max);
        eprintln!(
            "{}: |loss error| {:.1e}, max |grad error| {grad_error:.1e}",
            case.name,
            (loss - case.expected_loss).abs()
        );
    }
}

#[test]
fn micro_batches_sum_to_the_full_batch_for_every_mode() {
    let vectors = load_test_vectors();
    for case in &vectors.policy_loss {
        for mode in Loss::ALL {
            let config = LossConfig { mode, ..config_of(case) };
            let responses = case.logp.len();
            let split = responses / 2 + 1;
            let masks = [matrix(&case.mask[..split]), matrix(&case.mask[split..])];
            let normalizer = StepNormalizer::from_masks(&masks).unwrap();
            let (full_loss, full_grad, full_stats) =
                loss_and_grad(case, &config, 0..responses, &normalizer);
            let (loss_a, grad_a, stats_a) = loss_and_grad(case, &config, 0..split, &normalizer);
            let (loss_b, grad_b, stats_b) =
                loss_and_grad(case, &config, split..responses, &normalizer);
            let what = format!("{} as {mode}", case.name);
            assert!((loss_a + loss_b - full_loss).abs() < 1e-12, "{what}: loss");
            let joined: Vec<Vec<f64>> = grad_a.into_iter().chain(grad_b).collect();
            assert_rows_close(&joined, &full_grad, 1e-12, &what);
            let mut merged = stats_a;
            merged.merge(&stats_b);
            assert_eq!(merged.tokens, full_stats.tokens, "{what}: tokens");
            assert!((merged.loss_sum - full_loss).abs() < 1e-12, "{what}: loss_sum");
            assert_eq!(merged.clipped_low_tokens, full_stats.clipped_low_tokens);
            assert_eq!(merged.clipped_high_tokens, full_stats.clipped_high_tokens);
            assert!((merged.kl_sum - full_stats.kl_sum).abs() < 1e-12, "{what}: kl");
        }
    }
}

#[test]
fn padding_values_do_not_leak_into_loss_or_gradient() {
    let vectors = load_test_vectors();
    for case in &vectors.policy_loss {
        let config = config_of(case);
        let normalizer = StepNormalizer::from_masks([&matrix(&case.mask)]).unwrap();
        let (clean_loss, clean_grad, _) =
            loss_and_grad(case, &config, 0..case.logp.len(), &normalizer);
        let poison = |rows: &[Vec<f64>]| -> Vec<Vec<f64>> {
            rows.iter()
                .zip(&case.mask)
                .map(|(row, mask)| {
                    row.iter()
                        .zip(mask)
                        .map(|(&v, &m)| if m == 0.0 { f64::NEG_INFINITY } else { v })
                        .collect()
                })
                .collect()
        };
        let poisoned = PolicyLossCase {
            logp: poison(&case.logp),
            logp_old: poison(&case.logp_old),
            logp_ref: case.logp_ref.as_deref().map(poison),
            name: case.name.clone(),
            mode: case.mode.clone(),
            mask: case.mask.clone(),
            advantages: case.advantages.clone(),
            expected_grad_logp: case.expected_grad_logp.clone(),
            ..*case
        };
        let (loss, grad, _) = loss_and_grad(&poisoned, &config, 0..case.logp.len(), &normalizer);
        assert!((loss - clean_loss).abs() < 1e-12, "{}", case.name);
        assert_rows_close(&grad, &clean_grad, 1e-12, &case.name);
    }
}

#[test]
fn clip_statistics_count_the_clipped_tokens() {
    // Ratios e^{0.5} ≈ 1.65 (A > 0: clipped high) and e^{-0.5} ≈ 0.61 (A < 0: clipped low),
    // plus an unclipped token and a padded one.
    let logp = matrix(&[vec![0.0, -1.0, 0.0], vec![-1.0, -1.0, 0.0]]);
    let logp_old = matrix(&[vec![-0.5, -1.0, 0.0], vec![-0.5, -1.05, 0.0]]);
    let mask = matrix(&[vec![1.0, 1.0, 0.0], vec![1.0, 1.0, 1.0]]);
    let advantages = Tensor::new(&[1.0f64, -1.0], &Device::Cpu).unwrap();
    let inputs = PolicyLossInputs {
        logp: &logp,
        logp_old: &logp_old,
        logp_ref: None,
        mask: &mask,
        advantages: &advantages,
        is_weights: None,
    };
    let config = LossConfig::for_mode(Loss::Dapo, 3);
    let normalizer = StepNormalizer::from_masks([&mask]).unwrap();
    let stats = policy_loss(&inputs, &config, &normalizer).unwrap().stats;
    assert_eq!(stats.tokens, 5.0);
    assert_eq!(stats.clipped_high_tokens, 1.0);
    assert_eq!(stats.clipped_low_tokens, 1.0);
    assert!((stats.clip_fraction_high() - 0.2).abs() < 1e-12);
    assert!((stats.ratio_max - 0.5f64.exp()).abs() < 1e-12);
    assert!((stats.ratio_min - (-0.5f64).exp()).abs() < 1e-12);
    assert_eq!(stats.kl_mean(), 0.0);
}

#[test]
fn f32_inputs_work_and_match_f64() {
    let vectors = load_test_vectors();
    let case = &vectors.policy_loss[0];
    let to_f32 = |t: Tensor| t.to_dtype(DType::F32).unwrap();
    let logp = Var::from_tensor(&to_f32(matrix(&case.logp))).unwrap();
    let logp_old = to_f32(matrix(&case.logp_old));
    let mask = to_f32(matrix(&case.mask));
    let advantages = Tensor::new(&case.advantages[..], &Device::Cpu).unwrap();
    let inputs = PolicyLossInputs {
        logp: logp.as_tensor(),
        logp_old: &logp_old,
        logp_ref: None,
        mask: &mask,
        advantages: &advantages,
        is_weights: None,
    };
    let normalizer = StepNormalizer::from_masks([&mask]).unwrap();
    let output = policy_loss(&inputs, &config_of(case), &normalizer).unwrap();
    assert_eq!(output.loss.dtype(), DType::F32);
    let loss = output.loss.to_scalar::<f32>().unwrap() as f64;
    assert!((loss - case.expected_loss).abs() < 1e-5);
    assert!(output.loss.backward().unwrap().get(logp.as_tensor()).is_some());
}

#[test]
fn rejects_bad_inputs_and_configs() {
    let logp = matrix(&[vec![-1.0, -1.0]]);
    let mask = matrix(&[vec![1.0, 1.0]]);
    let advantages = Tensor::new(&[1.0f64], &Device::Cpu).unwrap();
    let wrong = matrix(&[vec![-1.0, -1.0, -1.0]]);
    let normalizer = StepNormalizer::from_masks([&mask]).unwrap();
    let inputs = PolicyLossInputs {
        logp: &logp,
        logp_old: &wrong,
        logp_ref: None,
        mask: &mask,
        advantages: &advantages,
        is_weights: None,
    };
    let config = LossConfig::for_mode(Loss::Grpo, 2);
    let error = policy_loss(&inputs, &config, &normalizer).unwrap_err();
    assert!(error.to_string().contains("logp_old"), "{error}");
    let inputs = PolicyLossInputs { logp_old: &logp, ..inputs };
    let with_kl = LossConfig { beta: 0.1, ..config.clone() };
    let error = policy_loss(&inputs, &with_kl, &normalizer).unwrap_err();
    assert!(error.to_string().contains("logp_ref"), "{error}");
    let negative = LossConfig { epsilon_high: -0.1, ..config };
    assert!(negative.validate().is_err());
    assert!("ppo".parse::<Loss>().is_err());
    for mode in Loss::ALL {
        assert_eq!(mode.as_str().parse::<Loss>().unwrap(), mode);
        let json = serde_json::to_string(&mode).unwrap();
        assert_eq!(json, format!("\"{mode}\""));
        LossConfig::for_mode(mode, 16).validate().unwrap();
    }
}
