//! Batched sampler on a tiny random model: determinism, batch-composition invariance,
//! log-probabilities consistent with the trainable forward, finish reasons.

use verity_worker::model::compact::RolloutDtype;
use verity_worker::sampler::{sample_seeded, sample_stream, sample_with_progress};
use verity_worker::testing::tiny_model;
use verity_worker::{sample, Family, FinishReason, Kernels, SamplingParams, WorkerError};

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![5, 6, 7, 8, 9, 10], vec![11, 12], vec![13, 14, 15]]
}

fn params() -> SamplingParams {
    SamplingParams {
        n: 3,
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
        max_new_tokens: 12,
        seed: 42,
        ..Default::default()
    }
}

#[test]
fn same_seed_same_samples_and_independent_of_batch_composition() {
    let model = tiny_model(Family::Llama, 1).unwrap();
    let all = sample(&model, &prompts(), &params(), &[], 0, None).unwrap();
    assert_eq!(all.len(), 9);
    assert_eq!(all, sample(&model, &prompts(), &params(), &[], 0, None).unwrap());
    // Prompt 1 sampled alone gets the same completions as inside the batch (its RNG streams
    // are keyed by prompt index, so pass it at the same index with other prompts around).
    let alone = sample(&model, &prompts()[1..2], &params(), &[], 0, None).unwrap();
    let in_batch: Vec<_> = all.iter().filter(|c| c.prompt_index == 1).collect();
    let other =
        sample(&model, &[prompts()[1].clone(), prompts()[0].clone()], &params(), &[], 0, None)
            .unwrap();
    for s in 0..3 {
        assert_eq!(alone[s].token_ids.len(), 12);
        // Same prompt index (0) in both single-prompt runs and the swapped batch: identical.
        assert_eq!(alone[s].token_ids, other[s].token_ids);
        assert!(in_batch[s].token_ids.len() == 12);
    }
    // Different samples of one prompt differ.
    assert_ne!(all[0].token_ids, all[1].token_ids);
}

#[test]
fn sampling_logprobs_match_the_trainable_forward() {
    let model = tiny_model(Family::Qwen2, 2).unwrap();
    let p = SamplingParams { top_p: 1.0, top_k: 0, temperature: 0.8, ..params() };
    let out = sample(&model, &prompts(), &p, &[], 0, None).unwrap();
    let prompt_ids: Vec<Vec<u32>> = out.iter().map(|c| prompts()[c.prompt_index].clone()).collect();
    let completions: Vec<Vec<u32>> = out.iter().map(|c| c.token_ids.clone()).collect();
    for track in [false, true] {
        let lp = model.completion_logprobs(&prompt_ids, &completions, 0.8, 0, track).unwrap();
        let grid: Vec<Vec<f32>> = lp.logprobs.to_vec2().unwrap();
        for (row, c) in out.iter().enumerate() {
            for (j, &want) in c.logprobs.iter().enumerate() {
                assert!(
                    (grid[row][j] - want).abs() < 1e-4,
                    "row {row} tok {j}: {} vs {want}",
                    grid[row][j]
                );
            }
        }
    }
}

#[test]
fn low_precision_rollouts_are_batch_invariant_and_close_to_the_f32_policy() {
    let model = tiny_model(Family::Llama, 1).unwrap();
    // (precision, bound on the mean |log-prob gap| to the f32 trainer)
    for (dtype, bound) in [(RolloutDtype::Bf16, 0.02), (RolloutDtype::Int8, 0.02)] {
        let p = SamplingParams { rollout_dtype: dtype, top_p: 1.0, top_k: 0, ..params() };
        let all = sample(&model, &prompts(), &p, &[], 0, None).unwrap();
        let alone = sample(&model, &prompts()[..1], &p, &[], 0, None).unwrap();
        for s in 0..3 {
            assert_eq!(alone[s].token_ids, all[s].token_ids, "{dtype:?}");
            assert_eq!(alone[s].logprobs, all[s].logprobs, "{dtype:?}");
        }
        // The trainer (f32) scores the sampler's tokens close to, but not exactly at, the
        // sampler's own log-probabilities.
        let prompt_ids: Vec<Vec<u32>> =
            all.iter().map(|c| prompts()[c.prompt_index].clone()).collect();
        let completions: Vec<Vec<u32>> = all.iter().map(|c| c.token_ids.clone()).collect();
        let lp =
            model.completion_logprobs(&prompt_ids, &completions, p.temperature, 0, false).unwrap();
        let grid: Vec<Vec<f32>> = lp.logprobs.to_vec2().unwrap();
        let diffs: Vec<f32> = all
            .iter()
            .enumerate()
            .flat_map(|(row, c)| c.logprobs.iter().enumerate().map(move |(j, &s)| (s, row, j)))
            .map(|(s, row, j)| (grid[row][j] - s).abs())
            .collect();
        let mean = diffs.iter().sum::<f32>() / diffs.len() as f32;
        eprintln!("{dtype:?}: mean |logp_f32 - logp_sampler| = {mean}");
        assert!(mean > 0.0 && mean < bound, "{dtype:?}: mean |logp_f32 - logp_sampler| = {mean}");
    }
}

#[test]
fn no_grad_path_matches_training_and_reference_paths() {
    let mut model = tiny_model(Family::Qwen3, 3).unwrap();
    let comps = vec![vec![1, 2, 3], vec![4], vec![5, 6, 7, 8]];
    let a = model.completion_logprobs(&prompts(), &comps, 1.0, 0, false).unwrap().logprobs;
    let b = model.completion_logprobs(&prompts(), &comps, 1.0, 0, true).unwrap().logprobs;
    model.set_kernels(Kernels::Reference);
    let c = model.completion_logprobs(&prompts(), &comps, 1.0, 0, false).unwrap().logprobs;
    for other in [&b, &c] {
        let d = verity_worker::testing::max_abs_diff(&a, other);
        assert!(d < 1e-4, "{d}");
    }
}

#[test]
fn finish_reasons_and_greedy() {
    let model = tiny_model(Family::Llama, 4).unwrap();
    let greedy = SamplingParams { temperature: 0.0, n: 2, max_new_tokens: 5, ..Default::default() };
    let out = sample(&model, &prompts(), &greedy, &[], 0, None).unwrap();
    assert!(out.iter().all(|c| c.finish_reason == FinishReason::Length && c.token_ids.len() == 5));
    assert_eq!(out[0].token_ids, out[1].token_ids, "greedy samples agree");
    let top1 = SamplingParams { temperature: 1.3, top_k: 1, ..greedy.clone() };
    let out_top1 = sample(&model, &prompts(), &top1, &[], 0, None).unwrap();
    for (g, t) in out.iter().zip(&out_top1) {
        assert_eq!(g.token_ids, t.token_ids, "top-k 1 is greedy");
    }
    // Every token is EOS: each sequence stops after one token; others keep going.
    let all_eos: Vec<u32> = (0..64).collect();
    let out = sample(&model, &prompts(), &greedy, &all_eos, 0, None).unwrap();
    assert!(out.iter().all(|c| c.finish_reason == FinishReason::Eos && c.token_ids.len() == 1));
    let first = out[0].token_ids[0];
    let stop_on_first: Vec<u32> = vec![first];
    let out = sample(&model, &prompts(), &greedy, &stop_on_first, 0, None).unwrap();
    assert_eq!(out[0].finish_reason, FinishReason::Eos);
    assert!(out.iter().any(|c| c.finish_reason == FinishReason::Length), "other prompts continue");
}

#[test]
fn bad_arguments_are_errors() {
    let model = tiny_model(Family::Llama, 4).unwrap();
    let bad = [
        SamplingParams { n: 0, ..params() },
        SamplingParams { max_new_tokens: 0, ..params() },
        SamplingParams { top_p: 0.0, ..params() },
        SamplingParams { stop_strings: vec!["x".into()], ..params() },
    ];
    for p in bad {
        assert!(sample(&model, &prompts(), &p, &[], 0, None).is_err(), "{p:?}");
    }
    assert!(sample(&model, &[vec![]], &params(), &[], 0, None).is_err());
    assert!(sample(&model, &[vec![1000]], &params(), &[], 0, None).is_err());
}

#[test]
fn continuous_batching_samples_the_tokens_of_unbatched_sampling() {
    let model = tiny_model(Family::Llama, 6).unwrap();
    let prompts: Vec<Vec<u32>> = vec![
        vec![5, 6, 7, 8, 9, 10],
        vec![11, 12],
        vec![13, 14, 15],
        vec![40],
        vec![20, 21, 22, 23],
    ];
    let seeds: Vec<u64> = (0..prompts.len() as u64).map(|p| 100 + p).collect();
    let greedy =
        SamplingParams { n: 2, temperature: 0.0, max_new_tokens: 10, ..Default::default() };
    for params in [params(), greedy] {
        let alone = |eos: &[u32]| -> Vec<_> {
            prompts
                .iter()
                .zip(&seeds)
                .flat_map(|(p, &seed)| {
                    sample_seeded(&model, std::slice::from_ref(p), &[seed], &params, eos, 0, None)
                        .unwrap()
                })
                .collect()
        };
        // EOS ids picked from the samples' middles, so samples end at different steps and rows
        // free up mid-decode.
        let free = alone(&[]);
        let eos = vec![free[0].token_ids[3], free[2 * params.n].token_ids[6]];
        let alone = alone(&eos);
        let lengths: Vec<usize> = alone.iter().map(|c| c.token_ids.len()).collect();
        assert!(
            lengths.iter().min() < lengths.iter().max(),
            "samples end at different steps: {lengths:?}"
        );
        // One prompt at a time (rows = n), a prompt and a half, and everything at once.
        for rows in [params.n, params.n + params.n / 2 + 1, 0] {
            let p = SamplingParams { max_batch_rows: rows, ..params.clone() };
            let batched = sample_seeded(&model, &prompts, &seeds, &p, &eos, 0, None).unwrap();
            assert_eq!(batched.len(), alone.len());
            for (b, a) in batched.iter().zip(&alone) {
                assert_eq!(b.token_ids, a.token_ids, "rows {rows}, prompt {}", a.prompt_index);
                assert_eq!(b.finish_reason, a.finish_reason);
                assert_eq!((b.sample_index, b.logprobs.len()), (a.sample_index, a.logprobs.len()));
                for (x, y) in b.logprobs.iter().zip(&a.logprobs) {
                    assert!((x - y).abs() < 1e-4, "rows {rows}: {x} vs {y}");
                }
            }
        }
    }
}

#[test]
fn continuous_batching_reports_prompts_as_they_finish() {
    let model = tiny_model(Family::Llama, 6).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| vec![10 + i, 20 + i]).collect();
    let p = SamplingParams { n: 2, max_batch_rows: 3, ..params() };
    let seen = std::sync::Mutex::new(Vec::new());
    let progress = |done: usize| seen.lock().unwrap().push(done);
    let eos: Vec<u32> = (0..10).collect();
    let out = sample_with_progress(&model, &prompts, &p, (&eos, 0), None, &progress).unwrap();
    assert_eq!(out.len(), 12);
    assert_eq!(out, sample(&model, &prompts, &p, &eos, 0, None).unwrap());
    let seen = seen.into_inner().unwrap();
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "grows: {seen:?}");
    assert_eq!(seen.last(), Some(&6));
}

#[test]
fn a_stream_takes_prompts_as_groups_end_and_samples_what_sample_gives_them() {
    let model = tiny_model(Family::Llama, 6).unwrap();
    let all: Vec<Vec<u32>> = (0..6).map(|i| vec![10 + i, 20 + i, 30]).collect();
    // Many EOS ids: samples end after different numbers of steps.
    let eos: Vec<u32> = (0..12).collect();
    for rows in [4, 0] {
        let p = SamplingParams { n: 2, max_batch_rows: rows, ..params() };
        let expected = sample(&model, &all, &p, &eos, 0, None).unwrap();
        let mut handed = Vec::new();
        let mut queued = 2;
        // Each prompt whose samples all ended brings in the next one.
        let mut on_group = |index: usize, group: Vec<_>| -> Result<Vec<Vec<u32>>, WorkerError> {
            handed.push((index, group));
            queued += 1;
            Ok(all.get(queued - 1).cloned().into_iter().collect())
        };
        let first = all[..2].to_vec();
        sample_stream(&model, first, &p, (&eos, 0), (None, None), &mut on_group).unwrap();
        let order: Vec<usize> = handed.iter().map(|(i, _)| *i).collect();
        assert_eq!(order.len(), all.len(), "rows {rows}: every prompt handed over once");
        handed.sort_by_key(|(i, _)| *i);
        for (i, group) in &handed {
            assert_eq!(group.len(), 2);
            assert!(group
                .iter()
                .enumerate()
                .all(|(s, c)| c.prompt_index == *i && c.sample_index == s));
        }
        // The same tokens; log-probs up to the rounding of another batch composition.
        let streamed: Vec<_> = handed.into_iter().flat_map(|(_, g)| g).collect();
        assert_eq!(streamed.len(), expected.len());
        for (s, e) in streamed.iter().zip(&expected) {
            assert_eq!(s.token_ids, e.token_ids, "rows {rows}, prompt {}", e.prompt_index);
            assert_eq!(s.finish_reason, e.finish_reason);
            for (x, y) in s.logprobs.iter().zip(&e.logprobs) {
                assert!((x - y).abs() < 1e-4, "rows {rows}: {x} vs {y}");
            }
        }
    }
}
