//! Prints `verity bench graders` numbers as JSON (until the CLI wires `cli::bench`):
//! `cargo run --release -p verity-verifiers --example bench_graders [jobs] [math_rounds] [code_gradings]`.

use verity_verifiers::cli::{bench, BenchOptions};

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    let defaults = BenchOptions::default();
    let options = BenchOptions {
        jobs: arg(1, defaults.jobs),
        math_rounds: arg(2, defaults.math_rounds),
        code_gradings: arg(3, defaults.code_gradings),
    };
    let report = bench(&options);
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    );
}
