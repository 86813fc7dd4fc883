//! The judge of model graders: a tiny random model (and SmolLM2 when present) loaded from an HF
//! folder judges batched exactly as it judges one sample at a time (greedy and seeded
//! sampling), identical prompts are judged once, and an OpenAI-compatible endpoint judge (a
//! real HTTP server on loopback) is retried and reported as an outage when it stays down;
//! `VERITY_JUDGE_ENDPOINTS` entries parse.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use verity_verifiers::{ErrorKind, GradeResult, Grader, GraderPool, Sample};
use verity_worker::config::Family;
use verity_worker::judge::{EndpointJudge, JudgeEndpoint, JudgeSettings, LocalJudge};
use verity_worker::trainer::testing::write_tiny_model_dir;

/// Rows: 6 distinct questions, and a repeat of the first two (judged from the cache).
fn rows() -> Vec<(Value, Sample)> {
    let mut rows: Vec<(Value, Sample)> = (0..6)
        .map(|i| {
            (
                json!({"q": format!("t{} t{}", 3 + i, 20 + i)}),
                Sample::from_text(format!("t{}", 40 + i)),
            )
        })
        .collect();
    rows.extend(rows[..2].to_vec());
    rows
}

fn score_grader(model: &str, sampling: Value) -> Grader {
    Grader::from_json(
        &json!({"type": "score_model", "name": "judge", "model": model, "range": [0, 100],
                "input": [{"role": "system", "content": "t5 t6"},
                          {"role": "user", "content": "{{item.q}} t9 {{sample.output_text}}"}],
                "sampling_params": sampling})
        .to_string(),
    )
    .unwrap()
}

fn local_judge(name: &str, dir: &std::path::Path) -> Arc<LocalJudge> {
    let loaded = verity_worker::load_model(dir, &candle_core::Device::Cpu).unwrap();
    Arc::new(LocalJudge::new(BTreeMap::from([(name.to_string(), Arc::new(Mutex::new(loaded)))])))
}

/// Grades `rows` batched (one judge call) and one row at a time (a fresh judge cache per row).
fn batched_and_single(
    grader: &Grader,
    judge: Arc<LocalJudge>,
    rows: &[(Value, Sample)],
) -> (Vec<GradeResult>, Vec<GradeResult>) {
    let batched_grader = grader.clone().with_judge(judge.clone());
    let batched = GraderPool::new(2).grade_batch_blocking(&batched_grader, rows);
    let (hits, misses) = batched_grader.judge_cache().unwrap().stats();
    assert_eq!(misses, 6, "each distinct prompt is judged once");
    // the repeats in the batch, then every grading reads the prefetched reply
    assert_eq!(hits, rows.len() as u64 + 2);
    let single = rows
        .iter()
        .map(|(item, sample)| grader.clone().with_judge(judge.clone()).grade(item, sample))
        .collect();
    (batched, single)
}

#[test]
fn tiny_judge_batched_equals_one_by_one_greedy_and_seeded() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_dir(dir.path(), Family::Llama, 11).unwrap();
    let judge = local_judge("tiny-judge", dir.path());
    for sampling in [
        json!({"temperature": 0, "max_completions_tokens": 6}),
        json!({"temperature": 1.0, "top_p": 0.9, "seed": 42, "max_completions_tokens": 6}),
    ] {
        let grader = score_grader("tiny-judge", sampling.clone());
        let (batched, single) = batched_and_single(&grader, judge.clone(), &rows());
        assert_eq!(batched, single, "{sampling}");
        // the repeated rows got the same verdicts
        assert_eq!(batched[6], batched[0]);
        assert_eq!(batched[7], batched[1]);
        for result in &batched {
            // a reply is a score or a counted judge-reply error, never a silent 0
            match &result.error {
                None => assert!(result.reason.starts_with("judge tiny-judge scored"), "{result:?}"),
                Some(e) => assert_eq!(e.kind, ErrorKind::JudgeReply, "{result:?}"),
            }
        }
        assert!(batched.iter().any(|r| r.error.is_none()), "{batched:?}");
    }
}

#[test]
fn smollm2_judge_batched_equals_one_by_one_greedy() {
    let Some(dir) =
        verity_worker::testing::smollm2_dir("smollm2_judge_batched_equals_one_by_one_greedy")
    else {
        return;
    };
    let judge = local_judge("smollm2", &dir);
    let grader = Grader::from_json(
        &json!({"type": "score_model", "name": "judge", "model": "smollm2", "range": [0, 10],
                "input": [{"role": "system", "content": "You grade answers. Reply with one number from 0 to 10."},
                          {"role": "user", "content": "Question: {{item.q}}\nAnswer: {{sample.output_text}}\nScore:"}],
                "sampling_params": {"temperature": 0, "seed": 1, "max_completions_tokens": 8}})
        .to_string(),
    )
    .unwrap();
    let rows: Vec<(Value, Sample)> =
        [("2+2?", "4"), ("3+5?", "8"), ("7-2?", "9"), ("1+1?", "2"), ("6/3?", "2"), ("9-9?", "1")]
            .iter()
            .map(|(q, a)| (json!({"q": q}), Sample::from_text(*a)))
            .chain([(json!({"q": "2+2?"}), Sample::from_text("4"))])
            .collect();
    let batched_grader = grader.clone().with_judge(judge.clone());
    let batched = GraderPool::new(2).grade_batch_blocking(&batched_grader, &rows);
    assert_eq!(batched_grader.judge_cache().unwrap().stats().1, 6);
    let single: Vec<GradeResult> = rows
        .iter()
        .map(|(item, sample)| grader.clone().with_judge(judge.clone()).grade(item, sample))
        .collect();
    assert_eq!(batched, single);
    assert!(batched.iter().any(|r| r.error.is_none()), "{batched:?}");
}

/// A `/v1/chat/completions` server: the first `fail_first` requests answer 503, then it replies
/// with the last user message's first word; counts requests.
async fn chat_server(fail_first: usize) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    async fn chat(
        State((count, fail_first)): State<(Arc<AtomicUsize>, usize)>,
        Json(body): Json<Value>,
    ) -> Result<Json<Value>, StatusCode> {
        let n = count.fetch_add(1, Ordering::SeqCst);
        if n < fail_first {
            return Err(StatusCode::SERVICE_UNAVAILABLE);
        }
        assert_eq!(body["model"], "remote-judge");
        let text = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("");
        let word = text.split_whitespace().next().unwrap_or("").to_string();
        Ok(Json(
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": format!("{{\"result\": {word}}}")}}]}),
        ))
    }
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state((count.clone(), fail_first));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}/v1"), count)
}

fn endpoint_grader(judge: EndpointJudge) -> Grader {
    Grader::from_json(
        &json!({"type": "score_model", "name": "remote", "model": "remote-judge", "range": [0, 10],
                "input": [{"role": "user", "content": "{{sample.output_text}}"}]})
        .to_string(),
    )
    .unwrap()
    .with_judge(Arc::new(judge))
}

fn settings(retries: u32) -> JudgeSettings {
    JudgeSettings { timeout: Duration::from_secs(5), retries, ..JudgeSettings::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_judge_retries_then_scores() {
    let (url, count) = chat_server(2).await;
    let endpoint = JudgeEndpoint { name: "remote-judge".into(), base_url: url, key_env: None };
    let grader = endpoint_grader(EndpointJudge::new(endpoint, &settings(3)));
    let rows: Vec<(Value, Sample)> =
        ["7 stars", "3 ok", "7 stars"].iter().map(|t| (json!({}), Sample::from_text(*t))).collect();
    let results = GraderPool::new(2).grade_batch(&grader, rows).await;
    let scores: Vec<f64> = results.iter().map(|r| r.score).collect();
    assert_eq!(scores, vec![0.7, 0.3, 0.7], "{results:?}");
    assert!(results.iter().all(|r| r.error.is_none()));
    // two 503s retried, then two distinct prompts (the repeat came from the cache)
    assert_eq!(count.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_outage_is_an_outage_not_a_score() {
    let (url, count) = chat_server(usize::MAX).await;
    let endpoint = JudgeEndpoint { name: "remote-judge".into(), base_url: url, key_env: None };
    let grader = endpoint_grader(EndpointJudge::new(endpoint, &settings(2)));
    let rows = vec![(json!({}), Sample::from_text("5"))];
    let results = GraderPool::new(1).grade_batch(&grader, rows).await;
    let error = results[0].error.as_ref().expect("an outage is an error");
    assert_eq!(error.kind, ErrorKind::JudgeUnavailable, "{results:?}");
    assert!(error.message.contains("503"), "{}", error.message);
    assert_eq!(count.load(Ordering::SeqCst), 3, "one try and two retries");
    // nothing listens here at all: a connection error, retried, is an outage too
    let closed = JudgeEndpoint {
        name: "remote-judge".into(),
        base_url: "http://127.0.0.1:9/v1".into(),
        key_env: None,
    };
    let grader = endpoint_grader(EndpointJudge::new(closed, &settings(1)));
    let results =
        GraderPool::new(1).grade_batch(&grader, vec![(json!({}), Sample::from_text("5"))]).await;
    assert_eq!(results[0].error.as_ref().map(|e| e.kind), Some(ErrorKind::JudgeUnavailable));
}

#[test]
fn endpoints_parse_with_optional_key_variable() {
    let parsed = verity_worker::judge::parse_endpoints(
        "big=https://api.example.com/v1/|JUDGE_KEY, small=http://127.0.0.1:8000/v1",
    )
    .unwrap();
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed[0].base_url, "https://api.example.com/v1");
    assert_eq!(parsed[0].key_env.as_deref(), Some("JUDGE_KEY"));
    assert_eq!(parsed[1].key_env, None);
    assert!(verity_worker::judge::parse_endpoints("noequals").is_err());
    assert!(verity_worker::judge::parse_endpoints("a=ftp://x").is_err());
    // Issue #43: the outbound URL parser refuses userinfo and encoded dot segments here too.
    assert!(verity_worker::judge::parse_endpoints("a=http://127.0.0.1:8080@127.0.0.2:9/").is_err());
    assert!(verity_worker::judge::parse_endpoints("a=http://127.0.0.1/v1/a%2fb").is_err());
    assert!(verity_worker::judge::parse_endpoints("a=http://x,a=http://y").is_err());
    assert_eq!(verity_worker::judge::parse_endpoints("").unwrap(), vec![]);
}
