//! One storage suite, run against the local backend and against a real S3-protocol server
//! (`VERITY_TEST_S3_ENDPOINT`, started by `.ci/run`).

use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use verity_core::storage::{
    download_folder, publish_folder, read_manifest, LocalStore, ObjectStore, S3Store, StorageError,
    UrlSigner, MANIFEST,
};

/// Deterministic pseudo-random bytes.
fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn digest(bytes: &[u8]) -> Vec<u8> {
    Sha256::digest(bytes).to_vec()
}

async fn suite(store: Arc<dyn ObjectStore>) {
    // Put, get, overwrite, head.
    store.put_bytes("files/a.jsonl", Bytes::from_static(b"{\"x\":1}\n")).await.unwrap();
    assert_eq!(&store.get_bytes("files/a.jsonl").await.unwrap()[..], b"{\"x\":1}\n");
    store.put_bytes("files/a.jsonl", Bytes::from_static(b"new")).await.unwrap();
    assert_eq!(&store.get_bytes("files/a.jsonl").await.unwrap()[..], b"new");
    assert_eq!(store.head("files/a.jsonl").await.unwrap().unwrap().size, 3);
    assert!(store.head("files/none").await.unwrap().is_none());
    assert!(matches!(store.get_bytes("files/none").await, Err(StorageError::NotFound(_))));

    // Bad keys are refused before anything is touched.
    for bad in ["../escape", "/abs", "a//b", ""] {
        assert!(
            matches!(
                store.put_bytes(bad, Bytes::new()).await,
                Err(StorageError::InvalidKey { .. })
            ),
            "{bad}"
        );
    }

    // Listing by prefix, including a prefix that ends inside a name.
    for key in
        ["jobs/j1/samples/step-1.jsonl", "jobs/j1/samples/step-2.jsonl", "jobs/j10/x", "jobs/j2/y"]
    {
        store.put_bytes(key, Bytes::from(key.as_bytes().to_vec())).await.unwrap();
    }
    let keys = |list: Vec<verity_core::storage::ObjectMeta>| {
        list.into_iter().map(|o| o.key).collect::<Vec<_>>()
    };
    assert_eq!(
        keys(store.list("jobs/j1/").await.unwrap()),
        vec!["jobs/j1/samples/step-1.jsonl", "jobs/j1/samples/step-2.jsonl"]
    );
    assert_eq!(keys(store.list("jobs/j1").await.unwrap()).len(), 3);
    assert_eq!(store.list("jobs/j1/samples/step-2").await.unwrap()[0].size, 28);
    assert!(store.list("nothing/").await.unwrap().is_empty());

    // Delete (absent keys are fine) and delete by prefix.
    store.delete("jobs/j2/y").await.unwrap();
    store.delete("jobs/j2/y").await.unwrap();
    assert!(store.head("jobs/j2/y").await.unwrap().is_none());
    assert_eq!(store.delete_prefix("jobs/j1").await.unwrap(), 3);
    assert!(store.list("jobs/j1").await.unwrap().is_empty());

    // A 12 MiB object streamed in and out (multipart on S3 with a 5 MiB threshold).
    let big = payload(12 * 1024 * 1024 + 123, 7);
    let written = store
        .put_reader("models/big.bin", Box::pin(std::io::Cursor::new(big.clone())))
        .await
        .unwrap();
    assert_eq!(written, big.len() as u64);
    let mut reader = store.get_reader("models/big.bin").await.unwrap();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    loop {
        let n = reader.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        total += n;
        hasher.update(&buf[..n]);
    }
    assert_eq!(total, big.len());
    assert_eq!(hasher.finalize().to_vec(), digest(&big));

    // Files in and out.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, payload(100_000, 3)).unwrap();
    store.put_file("models/file.bin", &src).await.unwrap();
    let dst = dir.path().join("out/dst.bin");
    assert_eq!(store.get_to_file("models/file.bin", &dst).await.unwrap(), 100_000);
    assert_eq!(std::fs::read(&dst).unwrap(), payload(100_000, 3));

    // Publishing a folder: complete only once the manifest is there; downloads are verified.
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir_all(ckpt.join("sub")).unwrap();
    std::fs::write(ckpt.join("model.safetensors"), payload(6 * 1024 * 1024, 11)).unwrap();
    std::fs::write(ckpt.join("config.json"), b"{}").unwrap();
    std::fs::write(ckpt.join("sub/extra.txt"), b"x").unwrap();
    let prefix = "jobs/j3/checkpoints/step-2";
    assert!(read_manifest(store.as_ref(), prefix).await.unwrap().is_none());
    let manifest = publish_folder(store.as_ref(), &ckpt, prefix).await.unwrap();
    assert_eq!(
        manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        vec!["config.json", "model.safetensors", "sub/extra.txt"]
    );
    assert_eq!(read_manifest(store.as_ref(), prefix).await.unwrap().unwrap(), manifest);
    let copy = dir.path().join("copy");
    download_folder(store.as_ref(), prefix, &copy).await.unwrap();
    assert_eq!(
        std::fs::read(copy.join("model.safetensors")).unwrap(),
        payload(6 * 1024 * 1024, 11)
    );
    assert_eq!(std::fs::read(copy.join("sub/extra.txt")).unwrap(), b"x");
    // A half-written folder (files, no manifest) is invisible to readers.
    store
        .put_bytes("jobs/j3/checkpoints/step-3/model.safetensors", Bytes::from_static(b"partial"))
        .await
        .unwrap();
    assert!(read_manifest(store.as_ref(), "jobs/j3/checkpoints/step-3").await.unwrap().is_none());
    assert!(matches!(
        download_folder(store.as_ref(), "jobs/j3/checkpoints/step-3", &dir.path().join("x")).await,
        Err(StorageError::NotFound(_))
    ));
    // A corrupted file is caught on download.
    store
        .put_bytes(&format!("{prefix}/config.json"), Bytes::from_static(b"{\"tampered\":1}"))
        .await
        .unwrap();
    assert!(matches!(
        download_folder(store.as_ref(), prefix, &dir.path().join("y")).await,
        Err(StorageError::Integrity { .. })
    ));
    // The manifest itself cannot be smuggled in.
    std::fs::write(ckpt.join(MANIFEST), b"{}").unwrap();
    assert!(publish_folder(store.as_ref(), &ckpt, "jobs/j4").await.is_err());
}

#[tokio::test]
async fn local_backend_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(dir.path().join("objects"), None).await.unwrap();
    suite(Arc::new(store.clone())).await;
    // Without a signer the "presigned" URL is a plain file path.
    store.put_bytes("p/x", Bytes::from_static(b"hello")).await.unwrap();
    let url = store.presign_get("p/x", Duration::from_secs(60)).await.unwrap();
    let path = url.strip_prefix("file://").unwrap();
    assert_eq!(std::fs::read(path).unwrap(), b"hello");
    // Nothing ever lands outside the root.
    assert!(store.put_bytes(".tmp/x", Bytes::new()).await.is_err());
    assert!(!dir.path().join("escape").exists());
}

/// A local store whose root is gone (an unmounted volume, a moved directory) fails with
/// transient I/O errors — never "no such object" — and does not recreate its root; once the
/// root is back everything works again.
#[tokio::test]
async fn local_backend_with_its_root_gone_fails_transiently_without_recreating_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("objects");
    let store = LocalStore::open(&root, None).await.unwrap();
    store.put_bytes("jobs/a/one.txt", Bytes::from_static(b"1")).await.unwrap();
    let away = dir.path().join("away");
    std::fs::rename(&root, &away).unwrap();

    let put = store.put_bytes("jobs/b/two.txt", Bytes::from_static(b"2")).await.unwrap_err();
    assert!(put.is_transient(), "{put}");
    let head = store.head("jobs/a/one.txt").await.unwrap_err();
    assert!(head.is_transient(), "{head}");
    let get = store.get_bytes("jobs/a/one.txt").await.unwrap_err();
    assert!(get.is_transient() && !matches!(get, StorageError::NotFound(_)), "{get}");
    assert!(store.list("jobs/").await.unwrap_err().is_transient());
    assert!(!root.exists(), "the root was not recreated");

    std::fs::rename(&away, &root).unwrap();
    store.put_bytes("jobs/b/two.txt", Bytes::from_static(b"2")).await.unwrap();
    assert_eq!(store.list("jobs/").await.unwrap().len(), 2);
    assert!(matches!(store.get_bytes("jobs/none").await, Err(StorageError::NotFound(_))));
}

#[tokio::test]
async fn local_backend_signs_download_urls() {
    let dir = tempfile::tempdir().unwrap();
    let signer = UrlSigner::new("http://127.0.0.1:8080", b"k");
    let store = LocalStore::open(dir.path(), Some(signer.clone())).await.unwrap();
    store.put_bytes("jobs/a/model.bin", Bytes::from_static(b"w")).await.unwrap();
    let url = store.presign_get("jobs/a/model.bin", Duration::from_secs(60)).await.unwrap();
    let query = url.split_once('?').unwrap().1;
    let params: std::collections::HashMap<_, _> =
        query.split('&').filter_map(|p| p.split_once('=')).collect();
    let expires: i64 = params["expires"].parse().unwrap();
    assert!(signer.verify(
        "jobs/a/model.bin",
        expires,
        params["signature"],
        chrono::Utc::now().timestamp()
    ));
    assert!(matches!(
        store.presign_get("jobs/none", Duration::from_secs(60)).await,
        Err(StorageError::NotFound(_))
    ));
}

async fn s3_store(prefix: &str) -> Option<S3Store> {
    verity_core::testing::s3_test_store("S3 storage tests", "verity-test", prefix).await
}

#[tokio::test]
async fn s3_backend_passes_the_suite() {
    let Some(store) = s3_store("").await else { return };
    suite(Arc::new(store)).await;
}

#[tokio::test]
async fn s3_backend_with_a_key_prefix_passes_the_suite() {
    let Some(store) = s3_store("tenant/verity").await else { return };
    suite(Arc::new(store)).await;
}

#[tokio::test]
async fn s3_presigned_url_downloads_over_http() {
    let Some(store) = s3_store("").await else { return };
    let body = payload(200_000, 5);
    store
        .put_bytes("jobs/j/checkpoints/step-1/model.safetensors", Bytes::from(body.clone()))
        .await
        .unwrap();
    let url = store
        .presign_get("jobs/j/checkpoints/step-1/model.safetensors", Duration::from_secs(300))
        .await
        .unwrap();
    assert!(url.contains("X-Amz-Signature="), "{url}");
    let response = reqwest::get(&url).await.unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    assert_eq!(response.bytes().await.unwrap().to_vec(), body);
}

#[tokio::test]
async fn s3_stale_probe_objects_are_swept() {
    use verity_core::storage::{sweep_stale_probes, PROBE_PREFIX};
    let Some(store) = s3_store("probes").await else { return };
    let key = format!("{PROBE_PREFIX}/left-over");
    store.put_bytes(&key, Bytes::from_static(b"verity readiness probe")).await.unwrap();
    store.put_bytes("files/kept.jsonl", Bytes::from_static(b"{}")).await.unwrap();
    // Younger than the age limit: a probe in flight keeps its object.
    assert_eq!(sweep_stale_probes(&store, Duration::from_secs(3600)).await.unwrap(), 0);
    assert!(store.head(&key).await.unwrap().is_some());
    assert_eq!(sweep_stale_probes(&store, Duration::ZERO).await.unwrap(), 1);
    assert!(store.head(&key).await.unwrap().is_none());
    assert!(store.head("files/kept.jsonl").await.unwrap().is_some());
}
