//! Readiness that tells the truth fast: with Postgres stopped an API call answers 503
//! `database_unavailable` with `Retry-After` within seconds and `/readyz` answers 503; an
//! unwritable object store makes `/readyz` 503; stale temporary files of interrupted local
//! writes are swept while a write in progress keeps its own, and so are readiness-probe objects
//! a probe could not delete.

use verity_tests::api_support;

use api_support::*;
use axum::http::{header, Method, StatusCode};
use std::time::{Duration, Instant, SystemTime};
use verity_cli::commands::postgres_cluster::PrivateCluster;
use verity_core::storage::{LocalStore, ObjectStore};

/// The API server's default acquire timeout (`--db-acquire-timeout-seconds`).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_postgres_down_requests_answer_503_with_retry_after_within_seconds() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("pg");
    let mut cluster =
        tokio::task::spawn_blocking(move || PrivateCluster::start(&dir)).await.unwrap().unwrap();
    cluster.ensure_database().await.unwrap();
    let pool = verity_core::db::connect_with_timeout(&cluster.database_url(), 4, ACQUIRE_TIMEOUT)
        .await
        .unwrap();
    verity_core::db::migrate(&pool).await.unwrap();
    let key = user(&pool, "ops@x.io", "acme", "admin").await;
    let app = app(pool.clone()).await;
    assert_eq!(get(&app.router, "/v1/files", &key).await.status, StatusCode::OK);
    let started = Instant::now();
    let ready = call(&app.router, Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.json());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "healthy /readyz took {:?}",
        started.elapsed()
    );

    let cluster = tokio::task::spawn_blocking(move || {
        cluster.stop_immediately();
        cluster
    })
    .await
    .unwrap();

    // Twice: the first request meets the pooled connection the stop broke, the second has to
    // open a new one (refused at once: the socket is gone).
    for attempt in 0..2 {
        let started = Instant::now();
        let reply = get(&app.router, "/v1/files", &key).await;
        let took = started.elapsed();
        eprintln!("attempt {attempt}: {} in {took:?}", reply.status);
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "attempt {attempt}: {}",
            reply.json()
        );
        assert!(took < Duration::from_secs(10), "attempt {attempt} took {took:?}");
        let retry_after = reply.headers.get(header::RETRY_AFTER).expect("Retry-After");
        assert!(retry_after.to_str().unwrap().parse::<u64>().unwrap() >= 1);
        let body = reply.json();
        assert_eq!(body["error"]["code"], "database_unavailable", "{body}");
        assert_eq!(body["error"]["type"], "server_error", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(!message.contains("/"), "the message names no socket or host: {message}");
    }

    let started = Instant::now();
    let ready = call(&app.router, Method::GET, "/readyz", None, None).await;
    let took = started.elapsed();
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{}", ready.json());
    assert!(took < Duration::from_secs(5), "/readyz took {took:?}");
    let body = ready.json();
    assert_eq!(body["checks"]["database"], "unavailable", "{body}");
    assert_eq!(body["checks"]["object_store"], "ok", "{body}");
    drop(cluster);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn readyz_writes_to_the_store_and_fails_when_it_cannot(pool: sqlx::PgPool) {
    let app = app(pool).await;
    let ready = call(&app.router, Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.json());
    assert_eq!(ready.json()["checks"]["object_store"], "ok");
    // The probe deletes its object again.
    assert!(app.state.store.list(".readyz").await.unwrap().is_empty());

    // The root replaced by a file: reads of absent keys could still look fine, writes cannot.
    let root = app.dir.path().to_path_buf();
    let moved = root.with_extension("away");
    std::fs::rename(&root, &moved).unwrap();
    std::fs::write(&root, b"not a directory").unwrap();
    let started = Instant::now();
    let ready = call(&app.router, Method::GET, "/readyz", None, None).await;
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{}", ready.json());
    let body = ready.json();
    assert_eq!(body["checks"]["object_store"], "unavailable", "{body}");
    assert_eq!(body["checks"]["database"], "ok", "{body}");
    assert!(body["reason"].as_str().unwrap().contains("object store"), "{body}");

    // The root gone altogether: still 503, and the probe does not recreate it.
    std::fs::remove_file(&root).unwrap();
    let ready = call(&app.router, Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE, "{}", ready.json());
    assert!(!root.exists(), "the probe recreated the store root");

    std::fs::rename(&moved, &root).unwrap();
    let ready = call(&app.router, Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.json());
}

/// A file in the store's temporary folder last modified `age` ago.
fn temp_file(root: &std::path::Path, name: &str, age: Duration) -> std::path::PathBuf {
    let path = root.join(".tmp").join(name);
    let file = std::fs::File::create(&path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
    path
}

#[tokio::test]
async fn stale_temporary_files_are_swept_and_writes_in_progress_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path(), None).await.unwrap();
    let stale = temp_file(store.root(), "interrupted", Duration::from_secs(2 * 3600));
    let fresh = temp_file(store.root(), "in-progress", Duration::from_secs(5));
    store.put_bytes("files/a", bytes::Bytes::from_static(b"kept")).await.unwrap();

    let removed = store.sweep_stale_temp(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(removed, 1);
    assert!(!stale.exists(), "the stale temporary file is gone");
    assert!(fresh.exists(), "a write in progress keeps its temporary file");
    assert_eq!(store.get_bytes("files/a").await.unwrap().as_ref(), b"kept");

    // Opening the store sweeps too (STALE_TEMP_AGE).
    let stale = temp_file(store.root(), "crashed", verity_core::storage::STALE_TEMP_AGE * 2);
    let reopened = LocalStore::open(dir.path(), None).await.unwrap();
    assert!(!stale.exists(), "opening the store swept it");
    assert!(fresh.exists());
    // Through the trait (what the periodic sweeper calls).
    let shared: &dyn ObjectStore = &reopened;
    assert_eq!(shared.sweep_stale_temp(Duration::from_secs(1)).await.unwrap(), 1);
    assert!(!fresh.exists());
}

#[tokio::test]
async fn stale_readiness_probe_objects_are_swept_and_probes_in_flight_are_kept() {
    use verity_core::storage::{sweep_stale_probes, PROBE_PREFIX, STALE_PROBE_AGE};
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path(), None).await.unwrap();
    let bytes = || bytes::Bytes::from_static(b"verity readiness probe");
    // A probe whose delete failed (the store went away mid-probe) 20 minutes ago, and one in flight.
    store.put_bytes(&format!("{PROBE_PREFIX}/left-over"), bytes()).await.unwrap();
    store.put_bytes(&format!("{PROBE_PREFIX}/in-flight"), bytes()).await.unwrap();
    store.put_bytes("files/a.jsonl", bytes()).await.unwrap();
    let old = store.root().join(PROBE_PREFIX).join("left-over");
    let file = std::fs::File::options().write(true).open(&old).unwrap();
    file.set_modified(SystemTime::now() - 2 * STALE_PROBE_AGE).unwrap();

    let shared: &dyn ObjectStore = &store;
    assert_eq!(sweep_stale_probes(shared, STALE_PROBE_AGE).await.unwrap(), 1);
    assert!(!old.exists(), "the left-over probe object is gone");
    let left: Vec<String> = store.list("").await.unwrap().into_iter().map(|o| o.key).collect();
    assert_eq!(left, [format!("{PROBE_PREFIX}/in-flight"), "files/a.jsonl".to_string()]);

    // (What /readyz itself writes it deletes: readyz_writes_to_the_store_and_fails_when_it_cannot.)
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_request_that_cannot_get_a_connection_answers_503_after_the_acquire_timeout(
    pool: sqlx::PgPool,
) {
    // A stopped server refuses at once (above); a hung one, a black-holed network or an
    // exhausted pool is what the acquire timeout bounds. Exhaust a one-connection pool.
    let key = user(&pool, "ops@x.io", "acme", "admin").await;
    let url = verity_testkit::db::database_url_of(&pool).await.unwrap();
    let timeout = Duration::from_secs(1);
    let small = verity_core::db::connect_with_timeout(&url, 1, timeout).await.unwrap();
    let app = app(small.clone()).await;
    let held = small.acquire().await.unwrap();
    let started = Instant::now();
    let reply = get(&app.router, "/v1/files", &key).await;
    let took = started.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.json());
    assert_eq!(reply.json()["error"]["code"], "database_unavailable");
    assert!(reply.headers.contains_key(header::RETRY_AFTER));
    assert!(took >= timeout && took < Duration::from_secs(5), "took {took:?}");
    drop(held);
    assert_eq!(get(&app.router, "/v1/files", &key).await.status, StatusCode::OK);
}
