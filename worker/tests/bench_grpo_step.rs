//! `bench_grpo_step` on SmolLM2 (a benchmark, not a test: run with `--ignored --nocapture`,
//! preferably with the worker crate optimised).

#[test]
#[ignore = "benchmark; run explicitly"]
fn bench_grpo_step_on_smollm2() {
    let Some(dir) = verity_worker::testing::smollm2_dir("bench_grpo_step_on_smollm2") else {
        return;
    };
    let steps = std::env::var("BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let report = verity_worker::bench::grpo_step::bench_grpo_step(
        &verity_worker::bench::BenchModel::cpu(&dir),
        (1, 8, 64, steps),
        Default::default(),
    )
    .unwrap();
    println!("{report}");
}

/// Back to back, alternating: evaluation-shaped decoding (16 prompts × 4 samples, ≤ 64 tokens,
/// EOS honoured, 8 rows) in chunks of 8 rows against one continuous batch of 8 rows.
#[test]
#[ignore = "benchmark; run explicitly"]
fn bench_continuous_batching_on_smollm2() {
    let Some(model) = verity_worker::testing::smollm2_gguf("bench_continuous_batching") else {
        return;
    };
    let model = verity_worker::bench::BenchModel::cpu(&model);
    let repeats = std::env::var("BENCH_REPEATS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    for _ in 0..repeats {
        for chunked in [true, false] {
            let bench = verity_worker::bench::RolloutBench {
                prompts: 16,
                samples: 4,
                stop_at_eos: true,
                chunked,
                ..verity_worker::bench::RolloutBench::new(8, 64)
            };
            println!("{}", verity_worker::bench::bench_rollout(&model, &bench).unwrap());
        }
    }
}

/// Back to back: GRPO steps (1 × 8, ≤ 64 tokens) synchronous, then with the asynchronous
/// pipeline (`max_staleness` 1).
#[test]
#[ignore = "benchmark; run explicitly"]
fn bench_asynchronous_pipeline_on_smollm2() {
    let Some(model) = verity_worker::testing::smollm2_gguf("bench_asynchronous_pipeline") else {
        return;
    };
    let model = verity_worker::bench::BenchModel::cpu(&model);
    let steps = std::env::var("BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    for staleness in [0, 1] {
        let report = verity_worker::bench::grpo_step::bench_grpo_step(
            &model,
            (1, 8, 64, steps),
            verity_worker::bench::grpo_step::GrpoBenchRecipe {
                max_staleness: staleness,
                ..Default::default()
            },
        )
        .unwrap();
        println!("{report}");
    }
}
