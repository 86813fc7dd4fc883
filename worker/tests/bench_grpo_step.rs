//! `bench_grpo_step` on SmolLM2 (a benchmark, not a test: run with `--ignored --nocapture`,
//! preferably with the worker crate optimised).

#[test]
#[ignore = "benchmark; run explicitly"]
fn bench_grpo_step_on_smollm2() {
    let Some(dir) = verity_worker::testing::smollm2_dir("bench_grpo_step_on_smollm2") else {
        return;
    };
    let steps = std::env::var("BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let report =
        verity_worker::trainer::bench_grpo_step(&dir, (1, 8, 64, steps), Default::default(), 0)
            .unwrap();
    println!("{report}");
}
