//! The default embedding model, fetched on first use by a `cosine` grading (here found in the
//! fixture's cache, as after `scripts/fetch-embedding-model.sh`), is registered once for every
//! org as `all-minilm-l6-v2`: `GET /v1/models` lists it as an embedding model, and a grader of
//! another org can name it. Its own binary: the process's embedding model is set once.

use verity_tests::api_support;

use api_support::{get, post, user};
use serde_json::json;
use sqlx::PgPool;
use verity_worker::embedding::{configure, EmbeddingModel};
use verity_worker::embedding_models::DEFAULT_MODEL_NAME;

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_fetched_default_embedding_model_is_registered_for_every_org(pool: PgPool) {
    let test = "the_fetched_default_embedding_model_is_registered_for_every_org";
    let Some(fixture) = verity_worker::testing::minilm_dir(test) else { return };
    // A model cache holding the model under the name the PyPI fetch gives it.
    let cache = tempfile::tempdir().unwrap();
    let folder = cache.path().join(verity_worker::pypi_models::MINILM_DIR);
    std::os::unix::fs::symlink(&fixture, &folder).unwrap();
    assert!(configure(EmbeddingModel::fetched_minilm(cache.path().to_path_buf())));

    let app = api_support::app(pool.clone()).await;
    let ada = user(&pool, "ada@example.com", "acme", "admin").await;
    let bob = user(&pool, "bob@example.com", "globex", "member").await;
    let models = |key: String| {
        let router = app.router.clone();
        async move { get(&router, "/v1/models", &key).await.json()["data"].clone() }
    };
    let listed = |data: &serde_json::Value| {
        data.as_array().unwrap().iter().find(|m| m["id"] == DEFAULT_MODEL_NAME).cloned()
    };
    assert!(listed(&models(bob.clone()).await).is_none(), "not registered before its first use");

    let unnamed = json!({"type": "text_similarity", "name": "c", "input": "{{sample.output_text}}",
                         "reference": "{{item.r}}", "evaluation_metric": "cosine"});
    let body = |grader: &serde_json::Value| json!({"grader": grader, "model_sample": "a cat sat", "item": {"r": "a cat sat"}});
    let run = post(&app.router, "/v1/fine_tuning/alpha/graders/run", &ada, body(&unnamed)).await;
    assert_eq!(run.status, 200, "{:?}", run.json());
    let reward = run.json()["reward"].as_f64();
    assert!(reward.is_some_and(|r| r > 0.99), "identical texts: {:?}", run.json());

    // Registered for every org, once.
    let entry = listed(&models(bob.clone()).await).expect("listed for another org");
    assert_eq!(entry["kind"], "embedding", "{entry}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM models WHERE id = $1")
        .bind(DEFAULT_MODEL_NAME)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let again = post(&app.router, "/v1/fine_tuning/alpha/graders/run", &bob, body(&unnamed)).await;
    assert_eq!(again.status, 200, "{:?}", again.json());

    // Another org's grader names it.
    let mut named = unnamed.clone();
    named["model"] = json!(DEFAULT_MODEL_NAME);
    let by_name = post(&app.router, "/v1/fine_tuning/alpha/graders/run", &bob, body(&named)).await;
    assert_eq!(by_name.status, 200, "{:?}", by_name.json());
}
