//! The whole RL loop on a tiny model through the public API: sample with log-probs, score with
//! gradients, policy-gradient loss, clipped AdamW step. The rewarded behaviour must become
//! more likely.

use candle_core::{Device, Tensor};
use verity_worker::testing::tiny_model;
use verity_worker::{
    sample, AdamWConfig, Family, LrSchedule, PolicyOptimizer, SamplingParams, Transformer,
};

const PROMPT: [u32; 3] = [5, 6, 7];

/// Probability mass the policy puts on "low" tokens (< 32) right after the prompt.
fn low_token_mass(model: &Transformer) -> f32 {
    let logits = model.sequence_logits(&[&PROMPT], 0).unwrap();
    let last = logits.get(0).unwrap().get(PROMPT.len() - 1).unwrap();
    let p: Vec<f32> = candle_nn::ops::softmax(&last, 0).unwrap().to_vec1().unwrap();
    p[..32].iter().sum()
}

#[test]
fn policy_gradient_makes_rewarded_tokens_more_likely() {
    let model = tiny_model(Family::Llama, 21).unwrap();
    let before = low_token_mass(&model);
    let mut opt =
        PolicyOptimizer::new(&model, AdamWConfig::default(), LrSchedule::constant(2e-2), 1.0)
            .unwrap();
    for step in 0..12u64 {
        let params = SamplingParams {
            n: 8,
            temperature: 1.0,
            max_new_tokens: 3,
            seed: step,
            ..Default::default()
        };
        let out = sample(&model, &[PROMPT.to_vec()], &params, &[], 0, None).unwrap();
        let rewards: Vec<f32> = out
            .iter()
            .map(|c| {
                c.token_ids.iter().filter(|&&t| t < 32).count() as f32 / c.token_ids.len() as f32
            })
            .collect();
        let mean = rewards.iter().sum::<f32>() / rewards.len() as f32;
        let adv: Vec<f32> = rewards.iter().map(|r| r - mean).collect();
        let prompts = vec![PROMPT.to_vec(); out.len()];
        let completions: Vec<Vec<u32>> = out.iter().map(|c| c.token_ids.clone()).collect();
        let lp = model.completion_logprobs(&prompts, &completions, 1.0, 0, true).unwrap();
        let (b, l) = lp.logprobs.dims2().unwrap();
        let adv = Tensor::from_vec(adv, (b, 1), &Device::Cpu).unwrap();
        let loss = (lp.logprobs * lp.mask).unwrap().broadcast_mul(&adv).unwrap().sum_all().unwrap();
        let loss = (loss / -((b * l) as f64)).unwrap();
        opt.backward(&loss, 1.0).unwrap();
        let stats = opt.step().unwrap();
        assert!(stats.grad_norm.is_finite());
    }
    let after = low_token_mass(&model);
    eprintln!("low-token mass {before} -> {after}");
    assert!(after > before + 0.1, "low-token mass {before} -> {after}");
}
