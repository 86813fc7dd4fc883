//! Pulls from the API and the dashboard (`/v1/verity/model_pulls`, the models page's form): an
//! org admin names a hub model, the real queue hands the pull to a CPU worker, which fetches it
//! from a loopback hub (`verity_testkit::hub`) into its cache, checks and registers it for that
//! org with its hub id; requests are checked before anything is queued; the hub's refusals fail
//! the pull with the reason; hub ids are per org; members cannot pull.

use verity_tests::api_support;
use verity_tests::training_support;

use api_support::{dashboard_cookie, dashboard_page, get, post, send, user};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use training_support::{cpu_training_handler, prepare_store};
use verity_core::queue::{run_worker, DeviceKind, Queue, QueueSettings, RunnerOptions, WorkerInfo};
use verity_core::storage::ObjectStore;
use verity_testkit::hub::{serve_hub, HubRepo};
use verity_worker::config::Family;
use verity_worker::hub::Hub;

struct Setup {
    router: axum::Router,
    pool: PgPool,
    store: Arc<dyn ObjectStore>,
    queue: Queue,
    hub: Hub,
    root: tempfile::TempDir,
}

async fn setup(pool: PgPool) -> Setup {
    let files = verity_worker::trainer::testing::tiny_model_files(Family::Llama, 5).unwrap();
    let mut gated = HubRepo::open(files.clone());
    gated.gated = true;
    let repos = BTreeMap::from([
        ("acme/pico-llama".to_string(), HubRepo::open(files.clone())),
        ("acme/tiny-two".to_string(), HubRepo::open(files)),
        ("acme/gated".to_string(), gated),
    ]);
    let (endpoint, _) = serve_hub(repos).await;
    let root = tempfile::tempdir().unwrap();
    let store = prepare_store(&pool, root.path()).await;
    let state = api_support::app_on(pool.clone(), store.clone()).await;
    let router = verity_server::app::app(state);
    let queue = Queue::new(pool.clone(), QueueSettings::default());
    let hub = Hub {
        endpoint,
        cache: root.path().join("hf"),
        token: None,
        progress: false,
        max_bytes: Some(verity_worker::hub::api_pull_limit()),
    };
    Setup { router, pool, store, queue, hub, root }
}

impl Setup {
    /// Runs one queued row on a CPU worker whose hub is the loopback one.
    async fn run_one(&self) {
        self.run_one_with(self.hub.clone()).await;
    }

    /// Runs one queued row on a CPU worker fetching from `hub`.
    async fn run_one_with(&self, hub: Hub) {
        let handler =
            cpu_training_handler(self.store.clone(), &self.root.path().join("cache")).with_hub(hub);
        let options = RunnerOptions { max_jobs: Some(1), ..RunnerOptions::default() };
        let worker = WorkerInfo::new(DeviceKind::Cpu, 1024);
        let cancel = CancellationToken::new();
        let done = run_worker(self.queue.clone(), worker, Arc::new(handler), options, cancel).await;
        assert_eq!(done, 1);
    }

    /// Queues a pull as `key`; the pull object.
    async fn pull(&self, key: &str, body: Value) -> Value {
        let created = post(&self.router, "/v1/verity/model_pulls", key, body).await;
        assert_eq!(created.status, StatusCode::OK, "{:?}", created.json());
        created.json()
    }

    async fn get_pull(&self, key: &str, id: &str) -> Value {
        get(&self.router, &format!("/v1/verity/model_pulls/{id}"), key).await.json()
    }

    async fn rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM jobs").fetch_one(&self.pool).await.unwrap()
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn an_admin_pulls_a_hub_model_that_a_worker_fetches_checks_and_registers(pool: PgPool) {
    let s = setup(pool.clone()).await;
    let admin = user(&pool, "ada@example.com", "acme", "admin").await;
    let member = user(&pool, "bob@example.com", "acme", "member").await;
    let other = user(&pool, "eve@example.com", "globex", "admin").await;

    // Checked before anything is queued: the role, the hub name, the model name, the body.
    let body = json!({"model": "acme/pico-llama"});
    let refused = post(&s.router, "/v1/verity/model_pulls", &member, body.clone()).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{:?}", refused.json());
    for (body, param) in [
        (json!({"model": "../etc"}), "model"),
        (json!({"model": "acme/pico-llama@../x"}), "model"),
        (json!({"model": "acme/pico-llama", "name": "has space"}), "name"),
        (json!({"model": "acme/pico-llama", "name": "a/b"}), "name"),
    ] {
        let reply = post(&s.router, "/v1/verity/model_pulls", &admin, body.clone()).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {:?}", reply.json());
        assert_eq!(reply.json()["error"]["param"], param, "{body}");
    }
    let unknown = json!({"model": "acme/pico-llama", "revison": "main"});
    let reply = post(&s.router, "/v1/verity/model_pulls", &admin, unknown).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "an unknown field, as everywhere");
    assert_eq!(s.rows().await, 0, "nothing queued by a refused request");

    // Queued, then run by a worker: fetched, registered for the org under the hub name's last
    // part, and answering to its hub id.
    let pull = s.pull(&admin, body).await;
    let id = pull["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("pulljob-"), "{pull}");
    assert_eq!(pull["object"], "verity.model_pull");
    assert_eq!(pull["status"], "queued");
    assert_eq!(
        (pull["hub_id"].as_str(), pull["revision"].as_str()),
        (Some("acme/pico-llama"), Some("main"))
    );
    assert_eq!(pull["name"], "pico-llama");
    let jobs = get(&s.router, "/v1/fine_tuning/jobs", &admin).await.json();
    assert!(jobs["data"].as_array().unwrap().is_empty(), "a pull is not a fine-tuning job: {jobs}");
    s.run_one().await;
    let done = s.get_pull(&admin, &id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["result"]["model"], "pico-llama");
    assert_eq!(done["result"]["hub_id"], "acme/pico-llama");
    assert_eq!(done["result"]["storage_prefix"], "models/pico-llama");
    let files = done["result"]["files"].as_array().unwrap().len();
    assert_eq!(done["result"]["downloaded"].as_u64(), Some(files as u64));
    assert!(
        s.hub.cache.join("models--acme--pico-llama/snapshots").is_dir(),
        "the worker's hub cache"
    );
    let model = get(&s.router, "/v1/models/acme/pico-llama", &member).await;
    assert_eq!(model.status, StatusCode::OK, "{:?}", model.json());
    assert_eq!(model.json()["id"], "pico-llama");
    assert_eq!(model.json()["hub_id"], "acme/pico-llama");
    let listed = get(&s.router, "/v1/verity/model_pulls", &member).await.json();
    assert_eq!(listed["data"][0]["id"], id.as_str(), "members see the org's pulls");

    // The org's own: another org sees neither the model nor the pull.
    let hidden = get(&s.router, "/v1/models/pico-llama", &other).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    let hidden = get(&s.router, &format!("/v1/verity/model_pulls/{id}"), &other).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);

    // Asked again: the org already has it (under either name), so nothing is queued.
    let before = s.rows().await;
    let again = post(
        &s.router,
        "/v1/verity/model_pulls",
        &admin,
        json!({"model": "acme/pico-llama@main", "name": "tiny-again"}),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{:?}", again.json());
    assert_eq!(again.json()["error"]["param"], "model");
    assert!(again.json()["error"]["message"].as_str().unwrap().contains("\"pico-llama\""));
    let taken = post(
        &s.router,
        "/v1/verity/model_pulls",
        &admin,
        json!({"model": "acme/tiny-two", "name": "pico-llama"}),
    )
    .await;
    assert_eq!(taken.status, StatusCode::CONFLICT);
    assert_eq!(taken.json()["error"]["param"], "name");
    assert_eq!(s.rows().await, before);

    // Hub ids are per org: another org pulls the same model under its own name and names it by
    // the same hub id.
    let theirs = s.pull(&other, json!({"model": "acme/pico-llama", "name": "globex-tiny"})).await;
    s.run_one().await;
    let theirs = s.get_pull(&other, theirs["id"].as_str().unwrap()).await;
    assert_eq!(theirs["status"], "succeeded", "{theirs}");
    assert_eq!(theirs["result"]["hub_id"], "acme/pico-llama");
    assert_eq!(theirs["result"]["downloaded"], 0, "the worker's cache had every file");
    let by_hub_id = get(&s.router, "/v1/models/acme/pico-llama", &other).await.json();
    assert_eq!(by_hub_id["id"], "globex-tiny");
    let ours = get(&s.router, "/v1/models/acme/pico-llama", &admin).await.json();
    assert_eq!(ours["id"], "pico-llama");

    // What the hub refuses fails the pull at once, with the reason (no retries).
    for (model, reason) in [("acme/gated", "gated or private"), ("acme/nothing", "has no model")] {
        let pull = s.pull(&admin, json!({"model": model})).await;
        s.run_one().await;
        let failed = s.get_pull(&admin, pull["id"].as_str().unwrap()).await;
        assert_eq!(failed["status"], "failed", "{failed}");
        let message = failed["error"]["message"].as_str().unwrap();
        assert!(message.contains(reason), "{message}");
    }

    // A worker fetches at most VERITY_PULL_MAX_GB (here a few bytes): a larger model is refused
    // before anything is downloaded.
    let pull = s.pull(&admin, json!({"model": "acme/tiny-two", "name": "two-big"})).await;
    s.run_one_with(Hub { max_bytes: Some(100), ..s.hub.clone() }).await;
    let failed = s.get_pull(&admin, pull["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(message.contains("VERITY_PULL_MAX_GB") && message.contains("verity models pull"));
    assert!(!s.hub.cache.join("models--acme--tiny-two").exists(), "nothing fetched");

    // A queued pull can be cancelled (admins only).
    let pull = s.pull(&admin, json!({"model": "acme/tiny-two"})).await;
    let cancel = format!("/v1/verity/model_pulls/{}/cancel", pull["id"].as_str().unwrap());
    let refused = post(&s.router, &cancel, &member, json!({})).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let cancelled = post(&s.router, &cancel, &admin, json!({})).await;
    assert_eq!(cancelled.json()["status"], "cancelled", "{:?}", cancelled.json());
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn the_models_page_pulls_a_model_and_lists_the_pulls(pool: PgPool) {
    let s = setup(pool.clone()).await;
    user(&pool, "ada@example.com", "acme", "admin").await;
    user(&pool, "bob@example.com", "acme", "member").await;
    let admin = dashboard_cookie(&s.router, "ada@example.com").await;
    let member = dashboard_cookie(&s.router, "bob@example.com").await;
    let form = |cookie: &str, body: &str| {
        Request::builder()
            .method("POST")
            .uri("/models/pull")
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", cookie)
            .body(Body::from(body.to_string()))
            .unwrap()
    };

    let (status, html) = dashboard_page(&s.router, "/models", &admin).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("action=\"/models/pull\""), "admins get the form");
    let (_, html) = dashboard_page(&s.router, "/models", &member).await;
    assert!(!html.contains("action=\"/models/pull\""), "members do not");

    // A bad name comes back with the reason and what was typed; nothing is queued.
    let reply = send(&s.router, form(&admin, "model=acme%2F..%2Fx&name=")).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let html = String::from_utf8_lossy(&reply.bytes).into_owned();
    assert!(html.contains("id=\"pull-error\"") && html.contains("OWNER/NAME"), "{html}");
    assert!(html.contains("value=\"acme/../x\""), "what was typed is kept");
    assert_eq!(s.rows().await, 0);

    // Queued from the form, listed on the page, then shown as succeeded once a worker ran it.
    let reply = send(&s.router, form(&admin, "model=acme%2Ftiny-two&name=two")).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    assert_eq!(reply.headers["location"], "/models");
    let (_, html) = dashboard_page(&s.router, "/models", &admin).await;
    assert!(html.contains("acme/tiny-two") && html.contains("status-queued"), "{html}");
    s.run_one().await;
    let (_, html) = dashboard_page(&s.router, "/models", &member).await;
    assert!(html.contains("status-succeeded"), "{html}");
    assert!(html.contains("data-model=\"two\""), "the pulled model is listed: {html}");

    // A member's post is refused.
    let reply = send(&s.router, form(&member, "model=acme%2Fpico-llama")).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_retried_pull_finishes_what_an_earlier_attempt_registered(pool: PgPool) {
    let s = setup(pool.clone()).await;
    let admin = user(&pool, "ada@example.com", "acme", "admin").await;
    let pull = s.pull(&admin, json!({"model": "acme/pico-llama"})).await;
    let id = pull["id"].as_str().unwrap().to_string();
    // An earlier attempt fetched, published and registered the model, then its worker died
    // before the hub id was set.
    let org: uuid::Uuid = sqlx::query_scalar("SELECT org_id FROM jobs WHERE id = $1")
        .bind(&id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let files = verity_worker::trainer::testing::tiny_model_files(Family::Llama, 5).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in &files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    let store = s.store.as_ref();
    verity_worker::model_import::import_model(
        &pool,
        store,
        Some(org),
        "pico-llama",
        dir.path(),
        "hf",
    )
    .await
    .unwrap();
    s.run_one().await;
    let done = s.get_pull(&admin, &id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(done["result"]["hub_id"], "acme/pico-llama");
    let model = get(&s.router, "/v1/models/acme/pico-llama", &admin).await.json();
    assert_eq!(model["id"], "pico-llama");

    // A model of the same name that is not the pull's (another folder) is left alone: the pull
    // fails before it downloads anything, and says why.
    let pull = s.pull(&admin, json!({"model": "acme/tiny-two", "name": "two"})).await;
    verity_core::models::insert_base_model(
        &pool,
        Some(org),
        "two",
        "files/elsewhere",
        "hf",
        &json!({}),
    )
    .await
    .unwrap();
    s.run_one().await;
    let failed = s.get_pull(&admin, pull["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert!(failed["error"]["message"]
        .as_str()
        .unwrap()
        .contains("registered while the pull waited"));
    assert!(!s.hub.cache.join("models--acme--tiny-two").exists(), "refused before any download");
}
