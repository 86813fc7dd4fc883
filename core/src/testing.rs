//! Support shared by the crates' test suites, so that each does not re-spell it: the real
//! S3-protocol server on loopback (moto, started by `scripts/test-services.sh`) and a placeholder
//! base model.

use crate::storage::{ObjectStore, S3Options, S3Store};
use sqlx::PgPool;

/// The test server's endpoint (`VERITY_TEST_S3_ENDPOINT`), or `None` after a loud `SKIPPED` note
/// naming `what`; panics when `VERITY_REQUIRE_S3` demands a server that is not configured.
pub fn s3_test_endpoint(what: &str) -> Option<String> {
    match std::env::var("VERITY_TEST_S3_ENDPOINT") {
        Ok(endpoint) => Some(endpoint),
        Err(_) if std::env::var("VERITY_REQUIRE_S3").is_ok() => {
            panic!("VERITY_REQUIRE_S3 is set but VERITY_TEST_S3_ENDPOINT is not")
        }
        Err(_) => {
            eprintln!(
                "SKIPPED: {what} (set VERITY_TEST_S3_ENDPOINT; scripts/test-services.sh starts a server)"
            );
            None
        }
    }
}

/// Options for a new, uniquely named bucket `{bucket_stem}-{uuid}` on the test server at
/// `endpoint`: its static credentials, path-style addressing, 5 MiB parts, 3 attempts.
pub fn s3_test_options(endpoint: &str, bucket_stem: &str, prefix: &str) -> S3Options {
    S3Options {
        bucket: format!("{bucket_stem}-{}", uuid::Uuid::new_v4().simple()),
        prefix: prefix.to_string(),
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".into()),
        credentials: Some(("test".into(), "test".into())),
        path_style: true,
        multipart_threshold: 5 * 1024 * 1024,
        max_attempts: 3,
    }
}

/// A store over a new bucket on the test server (see [`s3_test_options`]), or `None` when no
/// server is configured (see [`s3_test_endpoint`]). Panics if the server refuses: tests only.
pub async fn s3_test_store(what: &str, bucket_stem: &str, prefix: &str) -> Option<S3Store> {
    let endpoint = s3_test_endpoint(what)?;
    let store = S3Store::connect(s3_test_options(&endpoint, bucket_stem, prefix))
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test S3 server {endpoint}: {e}"));
    store
        .create_bucket_if_missing()
        .await
        .unwrap_or_else(|e| panic!("cannot create a bucket on the test S3 server {endpoint}: {e}"));
    Some(store)
}

/// Publishes the model folder `dir` under `models/{name}` and registers it as a shared base
/// model named `name`. Panics on failure.
pub async fn publish_base_model(
    pool: &PgPool,
    store: &dyn ObjectStore,
    dir: &std::path::Path,
    name: &str,
) {
    let prefix = format!("models/{name}");
    crate::storage::publish_folder(store, dir, &prefix).await.expect("publishing the model folder");
    crate::models::insert_base_model(pool, None, name, &prefix, "hf", &serde_json::json!({}))
        .await
        .expect("registering the model");
}

/// Publishes and registers the shared base model `tiny`: a folder holding one empty
/// `config.json`, enough for the API's model checks (nothing loads it). Panics on failure.
pub async fn tiny_base_model(pool: &PgPool, store: &dyn ObjectStore) {
    store
        .put_bytes("models/tiny/config.json", bytes::Bytes::from_static(b"{}"))
        .await
        .expect("storing the tiny model's config");
    crate::models::insert_base_model(
        pool,
        None,
        "tiny",
        "models/tiny",
        "hf",
        &serde_json::json!({}),
    )
    .await
    .expect("registering the tiny model");
}
