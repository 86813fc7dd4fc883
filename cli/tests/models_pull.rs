//! `verity models pull` against a loopback server speaking the hub's protocol (the two endpoints
//! hf-hub uses: `GET /api/models/{owner}/{name}/revision/{revision}` with `?blobs=true`, and
//! `GET /{owner}/{name}/resolve/{revision}/{file}` with `Range`, answering `X-Repo-Commit`,
//! `ETag`/`X-Linked-Etag` and `Content-Range` as the hub does), serving a tiny model folder:
//! fetched into the HF cache layout, checked, imported and registered; fetched once; a gated
//! model needs its token; bad names, missing models and damaged files are clear errors.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use verity_core::storage::LocalStore;
use verity_testkit::hub::{serve_hub, HubRepo, COMMIT, TOKEN};
use verity_worker::config::Family;
use verity_worker::hub::{fetch, Hub};
use verity_worker::model_import::pull;

fn hub(endpoint: &str, cache: &Path, token: Option<&str>) -> Hub {
    Hub {
        endpoint: endpoint.to_string(),
        cache: cache.to_path_buf(),
        token: token.map(str::to_string),
        progress: false,
        max_bytes: None,
    }
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_hub_model_is_fetched_into_the_shared_cache_checked_and_registered(pool: sqlx::PgPool) {
    let files = verity_worker::trainer::testing::tiny_model_files(Family::Llama, 5).unwrap();
    let mut extra = files.clone();
    extra.insert("pytorch_model.bin".into(), b"not fetched".to_vec());
    extra.insert("README.md".into(), b"# tiny".to_vec());
    let repos = BTreeMap::from([
        ("acme/tiny-llama".to_string(), HubRepo { files: extra, gated: false, damaged: None }),
        ("acme/gated".to_string(), HubRepo { files: files.clone(), gated: true, damaged: None }),
        (
            "acme/damaged".to_string(),
            HubRepo {
                files: files.clone(),
                gated: false,
                damaged: Some("model.safetensors".into()),
            },
        ),
        (
            "acme/no-weights".to_string(),
            HubRepo {
                files: files
                    .iter()
                    .filter(|(f, _)| !f.ends_with(".safetensors"))
                    .map(|(f, b)| (f.clone(), b.clone()))
                    .collect(),
                gated: false,
                damaged: None,
            },
        ),
    ]);
    let (endpoint, state) = serve_hub(repos).await;
    let cache = tempfile::tempdir().unwrap();
    let objects = tempfile::tempdir().unwrap();
    let store = LocalStore::open(objects.path(), None).await.unwrap();
    let open = hub(&endpoint, cache.path(), None);

    // Pulled: the HF cache layout (refs, snapshots pointing at blobs), only what Verity loads,
    // imported under the repository's name and registered.
    let pulled = pull(&pool, &store, &open, "acme/tiny-llama", None, None).await.unwrap();
    let fetched = pulled.fetched;
    assert_eq!((pulled.name.as_str(), pulled.prefix.as_str()), ("tiny-llama", "models/tiny-llama"));
    let repo_dir = cache.path().join("models--acme--tiny-llama");
    assert_eq!(fetched.dir, repo_dir.join("snapshots").join(COMMIT));
    assert_eq!(std::fs::read_to_string(repo_dir.join("refs/main")).unwrap().trim(), COMMIT);
    let mut expected: Vec<String> = files.keys().cloned().collect();
    expected.sort();
    let mut got = fetched.files.clone();
    got.sort();
    assert_eq!(got, expected, "only the model's own files");
    assert_eq!(fetched.downloaded, files.len());
    for (file, bytes) in &files {
        assert_eq!(&std::fs::read(fetched.dir.join(file)).unwrap(), bytes, "{file}");
    }
    assert!(!fetched.dir.join("pytorch_model.bin").exists());
    let record = verity_core::models::model_by_id(&pool, "tiny-llama").await.unwrap().unwrap();
    assert_eq!(record.storage_prefix, "models/tiny-llama");

    // The hub id names the model too, for every org, wherever a model name is resolved.
    assert_eq!(pulled.hub_id.as_deref(), Some("acme/tiny-llama"));
    assert_eq!(record.hub_id.as_deref(), Some("acme/tiny-llama"));
    let any_org = uuid::Uuid::new_v4();
    let by_hub_id = verity_core::models::model_for_hub_id(&pool, any_org, "acme/tiny-llama");
    assert_eq!(by_hub_id.await.unwrap().as_deref(), Some("tiny-llama"));
    let stack = verity_core::lineage::resolve_stack(&pool, any_org, "acme/tiny-llama").await;
    assert_eq!(stack.unwrap().unwrap().base.id, "tiny-llama");

    // Pulled again under another name: nothing is downloaded again.
    let before = state.resolves.load(Ordering::SeqCst);
    let again =
        pull(&pool, &store, &open, "acme/tiny-llama@main", Some("tiny-2"), None).await.unwrap();
    assert_eq!((again.fetched.downloaded, state.resolves.load(Ordering::SeqCst)), (0, before));
    assert_eq!(again.hub_id, None, "one model per hub id: the first pull keeps it");
    let taken = pull(&pool, &store, &open, "acme/tiny-llama", None, None).await.unwrap_err();
    assert!(taken.to_string().contains("already exists"), "{taken}");

    // A gated model: refused without the token, fetched with it.
    let refused = fetch(&open, "acme/gated").await.unwrap_err();
    assert!(verity_worker::hub::is_refusal(&refused), "a refusal, not retried by a worker");
    let refused = refused.to_string();
    assert!(refused.contains("gated or private") && refused.contains("HF_TOKEN"), "{refused}");
    let wrong = fetch(&hub(&endpoint, cache.path(), Some("hf_wrong")), "acme/gated").await;
    assert!(wrong.unwrap_err().to_string().contains("refused the token"));
    fetch(&hub(&endpoint, cache.path(), Some(TOKEN)), "acme/gated").await.unwrap();

    // Damaged bytes fail the SHA-256 check and are not kept.
    let damaged = fetch(&open, "acme/damaged").await.unwrap_err().to_string();
    assert!(damaged.contains("SHA-256") && damaged.contains("model.safetensors"), "{damaged}");
    let kept =
        cache.path().join("models--acme--damaged/snapshots").join(COMMIT).join("model.safetensors");
    assert!(!kept.exists(), "the damaged copy is removed");

    // Names, missing models and models without what Verity loads: clear errors.
    let bad = fetch(&open, "../etc").await.unwrap_err().to_string();
    assert!(bad.contains("OWNER/NAME"), "{bad}");
    let bad = pull(&pool, &store, &open, "acme/", None, None).await.unwrap_err().to_string();
    assert!(bad.contains("OWNER/NAME"), "the hub's rule, before any name is derived: {bad}");
    let missing = fetch(&open, "acme/nothing").await.unwrap_err().to_string();
    assert!(missing.contains("acme/nothing has no model"), "{missing}");
    let unusable = fetch(&open, "acme/no-weights").await.unwrap_err().to_string();
    assert!(unusable.contains("*.safetensors") && unusable.contains("config.json"), "{unusable}");
}
