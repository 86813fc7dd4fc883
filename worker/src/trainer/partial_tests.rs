//! Partial rollouts (`partial_rollout_tokens`) on a tiny model: groups still decoding are
//! carried across steps, continue their own tokens, keep each token's sampler log-prob, and a
//! checkpoint keeps them.

use super::draw::PartialGroup;
use super::Trainer;
use verity_core::spec::Hyperparameters;

const MODEL_SEED: u64 = 5;
/// Tokens per completion.
const LIMIT: usize = 6;
/// Tokens per step's segment of a completion: three segments.
const SEGMENT: usize = 2;

fn trainer(learning_rate: f64) -> Trainer {
    let hp = Hyperparameters {
        batch_size: Some(2),
        group_size: Some(4),
        learning_rate,
        max_steps: Some(8),
        max_completion_tokens: Some(LIMIT),
        partial_rollout_tokens: Some(SEGMENT),
        tis_cap: Some(2.0),
        micro_batch_size: 8,
        temperature: 1.5,
        seed: Some(4),
        ..Hyperparameters::default()
    };
    hp.validate("hyperparameters").unwrap();
    super::testing::tiny_rollout_trainer(hp, 8, MODEL_SEED).unwrap()
}

fn ended(completions: &[crate::sampler::Completion]) -> bool {
    completions.iter().all(|c| super::draw::has_ended(c, LIMIT))
}

/// Draws four steps without training (the weights never change, so every token's sampler
/// log-prob must be the log-prob of the finished completion re-scored as one sequence).
#[test]
fn carried_groups_continue_their_own_tokens_with_their_own_logprobs() {
    let mut t = trainer(0.05);
    let mut before: Vec<PartialGroup> = Vec::new();
    let mut trained = Vec::new();
    for step in 1..=4u64 {
        let drawn = t.draw_groups(step).unwrap();
        // Every group carried on continues its own completions: earlier tokens are a prefix.
        for g in &t.partial {
            if let Some(old) =
                before.iter().find(|o| o.first_step == g.first_step && o.example == g.example)
            {
                for (now, was) in g.completions.iter().zip(&old.completions) {
                    assert!(now.token_ids.starts_with(&was.token_ids), "step {step}: tokens mixed");
                    assert!(
                        now.logprobs.starts_with(&was.logprobs),
                        "step {step}: log-probs changed"
                    );
                    assert!(now.token_ids.len() <= was.token_ids.len() + SEGMENT);
                }
            }
            assert!(!ended(&g.completions), "a finished group was carried");
            assert!(g.completions.iter().all(|c| c.token_ids.len() == c.logprobs.len()));
        }
        // What trains has ended; the batch is the carried groups plus the new ones.
        for g in &drawn.groups {
            assert!(ended(&g.completions), "step {step}: an unfinished group was trained");
        }
        assert_eq!(t.partial.len() + drawn.groups.len(), 2, "step {step}: batch of 2");
        if step == 3 {
            // The groups started at step 1 have had three segments: all of them ended.
            assert!(t.partial.iter().all(|g| g.first_step > 1), "{:?}", t.partial);
        }
        if let Some(oldest) = drawn.oldest_policy_step {
            assert!(oldest < step - 1, "step {step}: oldest weights {oldest}");
        }
        trained.extend(drawn.groups);
        before = t.partial.clone();
        t.step = step;
    }
    assert!(trained.len() >= 2, "groups were trained once they ended ({})", trained.len());
    assert!(
        trained.iter().any(|g| g.completions.iter().any(|c| c.token_ids.len() > SEGMENT)),
        "some group spanned several steps"
    );
    let (pad, temperature) = (t.tokenizer.pad_id(), t.hp.temperature as f32);
    for g in &trained {
        let prompt = t.train.examples[g.example].prompt_ids.clone();
        let prompts = vec![prompt; g.completions.len()];
        let tokens: Vec<Vec<u32>> = g.completions.iter().map(|c| c.token_ids.clone()).collect();
        let scored =
            t.model.completion_logprobs(&prompts, &tokens, temperature, pad, false).unwrap();
        let scored: Vec<Vec<f32>> = scored.logprobs.to_vec2().unwrap();
        for (c, row) in g.completions.iter().zip(&scored) {
            assert_eq!(c.token_ids.len(), c.logprobs.len());
            for (j, (&sampled, &rescored)) in c.logprobs.iter().zip(row).enumerate() {
                assert!((sampled - rescored).abs() < 1e-4, "token {j}: {sampled} vs {rescored}");
            }
        }
    }
}

/// Training steps report the carried groups and the staleness of the tokens they trained on,
/// and a checkpoint taken while groups are still decoding resumes exactly.
#[test]
fn steps_report_carried_groups_and_a_checkpoint_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = trainer(0.05);
    let first = t.train_step().unwrap().metrics;
    assert_eq!(first.groups_carried as usize, t.partial.len());
    assert!(first.groups_carried > 0, "{first:?}");
    t.save(dir.path()).unwrap();
    let saved = t.partial.clone();
    let mut metrics = Vec::new();
    for _ in 0..3 {
        metrics.push(t.train_step().unwrap().metrics);
    }
    assert!(metrics.iter().any(|m| m.staleness > 0), "carried tokens were trained off-policy");
    let mut resumed = trainer(0.05);
    resumed.restore(dir.path()).unwrap();
    assert_eq!(resumed.partial, saved);
    for want in &metrics {
        let got = resumed.train_step().unwrap().metrics;
        let key = |m: &crate::grpo::StepMetrics| {
            (
                m.step,
                m.groups_kept,
                m.groups_carried,
                m.staleness,
                m.trained_tokens,
                m.reward_mean.to_bits(),
                m.loss.to_bits(),
            )
        };
        assert_eq!(key(&got), key(want));
    }
}
