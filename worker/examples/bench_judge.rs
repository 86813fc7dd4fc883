//! Judge throughput of a `score_model` grader on the CPU: gradings per second when a batch of
//! samples is judged in one batched generation (what a training step does) and when each
//! sample is judged on its own. Prints one JSON line per repeat and one with the medians.
//!
//!     cargo build --workspace --locked --examples
//!     target/debug/examples/bench_judge MODEL_DIR [ROWS=32] [MAX_TOKENS=8] [REPEATS=3]
//!
//! (verity-worker is built with opt-level 3 even in the dev profile.)

use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use verity_verifiers::{Grader, GraderPool, Sample};
use verity_worker::judge::LocalJudge;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).ok_or_else(|| {
        anyhow::anyhow!("usage: bench_judge MODEL_DIR [ROWS] [MAX_TOKENS] [REPEATS]")
    })?;
    let rows: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(32);
    let max_tokens: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(8);
    let repeats: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(3);
    let loaded = verity_worker::load_model(dir.as_ref(), &candle_core::Device::Cpu)?;
    let judge = Arc::new(LocalJudge::new(BTreeMap::from([(
        "judge".to_string(),
        Arc::new(Mutex::new(loaded)),
    )])));
    let grader = Grader::from_json(
        &json!({"type": "score_model", "name": "judge", "model": "judge", "range": [0, 10],
                "input": [{"role": "system", "content": "You grade answers to arithmetic questions. Reply with a single number from 0 (wrong) to 10 (right)."},
                          {"role": "user", "content": "Question: {{item.question}}\nStudent answer: {{sample.output_text}}\nScore from 0 to 10:"}],
                "sampling_params": {"temperature": 0, "max_completions_tokens": max_tokens}})
        .to_string(),
    )?;
    // distinct rows, so the cache answers nothing
    let batch: Vec<(serde_json::Value, Sample)> = (0..rows)
        .map(|i| {
            let (a, b) = (3 + i % 17, 5 + i / 17);
            let answer = if i % 3 == 0 { a + b + 1 } else { a + b };
            (
                json!({"question": format!("What is {a} + {b}?")}),
                Sample::from_text(format!("The answer is {answer}.")),
            )
        })
        .collect();
    let pool = GraderPool::new(0);
    let (mut batched, mut single) = (Vec::new(), Vec::new());
    for repeat in 0..repeats {
        let g = grader.clone().with_judge(judge.clone());
        let started = Instant::now();
        let results = pool.grade_batch_blocking(&g, &batch);
        let batched_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        for (item, sample) in &batch {
            let _ = grader.clone().with_judge(judge.clone()).grade(item, sample);
        }
        let single_s = started.elapsed().as_secs_f64();
        let errors = results.iter().filter(|r| r.error.is_some()).count();
        batched.push(rows as f64 / batched_s);
        single.push(rows as f64 / single_s);
        println!(
            "{}",
            json!({"repeat": repeat, "rows": rows, "max_completions_tokens": max_tokens,
                   "batched_gradings_per_s": rows as f64 / batched_s,
                   "one_by_one_gradings_per_s": rows as f64 / single_s,
                   "judge_reply_errors": errors})
        );
    }
    let (b, s) = (median(batched), median(single));
    println!(
        "{}",
        json!({"median_batched_gradings_per_s": b, "median_one_by_one_gradings_per_s": s,
               "speedup": b / s, "rows": rows, "max_completions_tokens": max_tokens,
               "threads": std::thread::available_parallelism().map(usize::from).unwrap_or(1)})
    );
    Ok(())
}
