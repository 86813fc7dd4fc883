//! Stand-in for the `verity` subcommands until the CLI wires them in:
//! `verity_model generate MODEL PROMPT [MAX_TOKENS] [TEMPERATURE] [N] [SEED]`,
//! `verity_model bench-rollout MODEL BATCH NEW_TOKENS`,
//! `verity_model bench-train-step MODEL BATCH SEQ_LEN`.

use std::path::Path;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(2).map(String::as_str).unwrap_or("");
    let result = match args.get(1).map(String::as_str) {
        Some("generate") => {
            let opts = verity_worker::GenerateOptions {
                max_tokens: arg(&args, 4, 64),
                temperature: arg(&args, 5, 0.0),
                n: arg(&args, 6, 1),
                seed: arg(&args, 7, 0),
                ..Default::default()
            };
            verity_worker::generate(
                Path::new(model),
                args.get(3).map(String::as_str).unwrap_or("Hello"),
                &opts,
            )
            .map(|outs| serde_json::to_value(outs).unwrap_or_default())
        }
        Some("bench-rollout") => verity_worker::bench_rollout(
            Path::new(model),
            &verity_worker::RolloutBench::new(arg(&args, 3, 1), arg(&args, 4, 64)),
        ),
        Some("bench-train-step") => verity_worker::bench_train_step(
            Path::new(model),
            (arg(&args, 3, 8), arg(&args, 4, 128)),
            3,
            0,
        ),
        _ => {
            eprintln!("usage: verity_model generate|bench-rollout|bench-train-step MODEL ...");
            std::process::exit(2);
        }
    };
    match result {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
