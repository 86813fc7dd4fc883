//! Jobs created with OpenAI's `integrations: [{type: "wandb", …}]` are exported to W&B: the run is
//! created with the job's id, name, tags and config; each metrics row the worker writes becomes a
//! history line (the newest held back while the job runs); the end sends the summary and closes
//! the run. Against a loopback server speaking W&B's run protocol (no W&B is reachable here),
//! over the real API, queue and Postgres.

use axum::http::StatusCode;
use serde_json::{json, Value};
use verity_core::queue::{DeviceKind, WorkerInfo};
use verity_server::api::state::ApiConfig;
use verity_server::integrations::export::{export_due, Exported};
use verity_server::integrations::{WandbArgs, WandbClient};
use verity_testkit::wandb::{WandbServer, DEFAULT_ENTITY};
use verity_tests::api_support::*;

const KEY: &str = "wandb-test-key-0123456789";

fn wandb_body(file: &str, wandb: Value) -> Value {
    json!({"model": "tiny", "training_file": file, "method": method(),
           "integrations": [{"type": "wandb", "wandb": wandb}]})
}

async fn app_exporting_to(pool: sqlx::PgPool, server: &WandbServer) -> TestApp {
    let wandb = WandbArgs { api_key: Some(KEY.into()), base_url: server.base_url.clone() };
    app_with(pool, ApiConfig { wandb, ..api_config() }, |_| {}).await
}

fn client(app: &TestApp) -> WandbClient {
    app.state.wandb.clone().expect("the app has a W&B client")
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_job_s_metrics_reach_its_wandb_run_and_the_run_closes_with_the_job(pool: sqlx::PgPool) {
    let server = WandbServer::start(KEY).await.unwrap();
    let app = app_exporting_to(pool.clone(), &server).await;
    base_model(&app).await;
    let token = user(&pool, "ana@a.io", "org-a", "admin").await;
    let file = upload(&app.router, &token, "train.jsonl", DATASET).await.json()["id"].clone();
    let body = wandb_body(
        file.as_str().unwrap(),
        json!({"project": "my-wandb-project", "name": "ft-run-display-name", "tags": ["first-experiment", "v2"]}),
    );
    let created = post(&app.router, "/v1/fine_tuning/jobs", &token, body).await;
    assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
    let job = created.json()["id"].as_str().unwrap().to_string();
    // OpenAI's shape: the run id is the job id.
    assert_eq!(
        created.json()["integrations"],
        json!([{"type": "wandb", "wandb": {"project": "my-wandb-project", "name": "ft-run-display-name",
                "entity": null, "tags": ["first-experiment", "v2"], "run_id": job}}])
    );
    let client = client(&app);

    // Created: the run exists, with no history yet.
    let pass = export_due(&pool, &client).await.unwrap();
    assert_eq!(pass, vec![(job.clone(), Exported::Sent { lines: 0, closed: false })]);
    let run = server.run(&job).expect("the run was created");
    assert_eq!((run.entity.as_str(), run.project.as_str()), (DEFAULT_ENTITY, "my-wandb-project"));
    assert_eq!(run.display_name.as_deref(), Some("ft-run-display-name"));
    assert!(run.tags.starts_with(&["first-experiment".into(), "v2".into()]), "{:?}", run.tags);
    assert!(run.tags.contains(&format!("verity/{job}")), "{:?}", run.tags);
    assert_eq!(run.config["model"]["value"], "tiny");
    assert_eq!(run.config["method"]["value"]["type"], "reinforcement");

    // The worker writes three steps: two are sent, the newest waits for its evaluation.
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();
    for step in 0..3 {
        let data = json!({"reward_mean": step as f64 / 4.0, "grad_norm": 1.5, "phase": "training"});
        lease.metric(step, &data).await.unwrap();
    }
    let pass = export_due(&pool, &client).await.unwrap();
    assert_eq!(pass, vec![(job.clone(), Exported::Sent { lines: 2, closed: false })]);
    let run = server.run(&job).unwrap();
    assert_eq!(run.upserts, 1, "the run is created once");
    let steps: Vec<i64> = run.history.iter().map(|l| l["_step"].as_i64().unwrap()).collect();
    assert_eq!(steps, vec![0, 1]);
    assert_eq!(run.history[1]["reward_mean"], 0.25);
    assert!(run.history[1].get("phase").is_none(), "only numbers are history");
    assert!(run.history[1]["_runtime"].as_f64().unwrap() >= 0.0);

    // W&B is down for a while: the job's events say so once, nothing is lost or sent twice.
    lease.metric(2, &json!({"reward_mean": 0.5, "eval": {"pass@1": 0.75}})).await.unwrap();
    lease.metric(3, &json!({"reward_mean": 0.75})).await.unwrap();
    server.fail_next(1);
    let pass = export_due(&pool, &client).await.unwrap();
    assert!(matches!(&pass[..], [(_, Exported::Failed(m))] if m.contains("503")), "{pass:?}");
    let export = verity_core::integrations::get_export(&pool, &job).await.unwrap().unwrap();
    assert_eq!((export.failures, export.exported_step), (1, 1));
    assert!(export_due(&pool, &client).await.unwrap().is_empty(), "a failed export waits");
    let events =
        get(&app.router, &format!("/v1/fine_tuning/jobs/{job}/events"), &token).await.json();
    let messages: Vec<&str> =
        events["data"].as_array().unwrap().iter().filter_map(|e| e["message"].as_str()).collect();
    assert!(messages.iter().any(|m| m.contains("W&B") && m.contains("503")), "{messages:?}");
    sqlx::query("UPDATE wandb_exports SET updated_at = now() - interval '1 hour'")
        .execute(&pool)
        .await
        .unwrap();

    // The job ends: the rest of the rows, the summary and the close.
    lease.complete(&json!({"trained_tokens": 1234}), None).await.unwrap();
    let pass = export_due(&pool, &client).await.unwrap();
    assert_eq!(pass, vec![(job.clone(), Exported::Sent { lines: 2, closed: true })]);
    let run = server.run(&job).unwrap();
    let steps: Vec<i64> = run.history.iter().map(|l| l["_step"].as_i64().unwrap()).collect();
    assert_eq!(steps, vec![0, 1, 2, 3]);
    assert_eq!(run.history[2]["eval/pass@1"], 0.75);
    let summary = run.summary.expect("a summary");
    assert_eq!(
        (summary["state"].clone(), summary["reward_mean"].clone()),
        (json!("succeeded"), json!(0.75))
    );
    assert_eq!(
        (summary["eval/pass@1"].clone(), summary["trained_tokens"].clone()),
        (json!(0.75), json!(1234))
    );
    assert_eq!(run.exitcode, Some(0));
    assert!(export_due(&pool, &client).await.unwrap().is_empty(), "a closed run is done");
    assert_eq!(server.unauthorised(), 0);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn wandb_integrations_are_checked_at_creation(pool: sqlx::PgPool) {
    let server = WandbServer::start(KEY).await.unwrap();
    let app = app_exporting_to(pool.clone(), &server).await;
    base_model(&app).await;
    let token = user(&pool, "ana@a.io", "org-a", "admin").await;
    let file = upload(&app.router, &token, "train.jsonl", DATASET).await.json()["id"].clone();
    let file = file.as_str().unwrap();
    for (wandb, param) in [
        (json!({}), "integrations[0].wandb.project"),
        (json!({"project": "../x"}), "integrations[0].wandb.project"),
        (json!({"project": "p", "entity": "a/b"}), "integrations[0].wandb.entity"),
        (json!({"project": "p", "tags": [7]}), "integrations[0].wandb.tags[0]"),
    ] {
        let reply =
            post(&app.router, "/v1/fine_tuning/jobs", &token, wandb_body(file, wandb)).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, Some(param));
    }
    let mlflow = json!({"model": "tiny", "training_file": file, "method": method(),
                        "integrations": [{"type": "mlflow"}]});
    let reply = post(&app.router, "/v1/fine_tuning/jobs", &token, mlflow).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, Some("integrations[0].type"));
    let jobs = get(&app.router, "/v1/fine_tuning/jobs", &token).await.json();
    assert_eq!(jobs["data"], json!([]), "a refused job changes nothing");

    // A server without a W&B key refuses the integration rather than dropping it.
    let plain = verity_tests::api_support::app(pool.clone()).await;
    let body = wandb_body(file, json!({"project": "p"}));
    let reply = post(&plain.router, "/v1/fine_tuning/jobs", &token, body).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, Some("integrations"));
    assert!(reply.json()["error"]["message"].as_str().unwrap().contains("WANDB_API_KEY"));
}
