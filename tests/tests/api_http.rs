//! The API over real HTTP (hyper server, reqwest client) with the S3 backend (the S3-protocol
//! server of `scripts/test-services.sh`): a multi-part streamed upload, download, job creation,
//! and checkpoint download both as a streamed tar and through a presigned S3 redirect.

use verity_tests::api_support;

use api_support::*;
use serde_json::json;
use std::future::IntoFuture;
use std::io::Read;
use std::sync::Arc;
use verity_core::queue::{DeviceKind, WorkerInfo};
use verity_core::storage::{publish_folder, ObjectStore, S3Store};

async fn s3_store() -> Option<S3Store> {
    verity_core::testing::s3_test_store("API over S3", "verity-api", "api").await
}

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn files_jobs_and_checkpoints_over_http_and_s3(pool: sqlx::PgPool) {
    let Some(store) = s3_store().await else { return };
    let store: Arc<dyn ObjectStore> = Arc::new(store);
    let state = app_on(pool.clone(), store.clone()).await;
    store.put_bytes("models/tiny/config.json", bytes::Bytes::from_static(b"{}")).await.unwrap();
    verity_core::models::insert_base_model(&pool, None, "tiny", "models/tiny", "hf", &json!({}))
        .await
        .unwrap();
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server =
        tokio::spawn(axum::serve(listener, verity_server::app::app(state.clone())).into_future());
    let client =
        reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let auth = format!("Bearer {key}");

    // 6 MiB of records, sent as a stream of chunks: the store receives a multi-part upload.
    let line = b"{\"prompt\": \"What is 12345 * 6789? Show the steps.\", \"reference_answer\": \"83810205\"}\n";
    let count = 6 * 1024 * 1024 / line.len() + 1;
    let dataset: Vec<u8> = line.iter().copied().cycle().take(line.len() * count).collect();
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        dataset.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let part =
        reqwest::multipart::Part::stream(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
            .file_name("big.jsonl");
    let form = reqwest::multipart::Form::new().text("purpose", "fine-tune").part("file", part);
    let file: serde_json::Value = client
        .post(format!("{base}/v1/files"))
        .header("authorization", &auth)
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(file["status"], "processed", "{file}");
    assert_eq!(file["bytes"], dataset.len());
    assert_eq!(file["records"], count);
    let file_id = file["id"].as_str().unwrap();
    let content = client
        .get(format!("{base}/v1/files/{file_id}/content"))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap();
    assert_eq!(content.status(), 200);
    assert!(content.bytes().await.unwrap() == dataset, "downloaded content differs");

    let job: serde_json::Value = client
        .post(format!("{base}/v1/fine_tuning/jobs"))
        .header("authorization", &auth)
        .json(&json!({"model": "tiny", "training_file": file_id, "method": method()}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(job["status"], "queued", "{job}");
    let job_id = job["id"].as_str().unwrap().to_string();

    // A worker publishes a checkpoint to S3.
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    state.queue.register_worker(&worker).await.unwrap();
    let lease = state.queue.claim(&worker).await.unwrap().unwrap();
    let folder = tempfile::tempdir().unwrap();
    let weights: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(folder.path().join("model.safetensors"), &weights).unwrap();
    std::fs::write(folder.path().join("config.json"), b"{}").unwrap();
    let prefix = format!("jobs/{job_id}/checkpoints/step-5");
    publish_folder(store.as_ref(), folder.path(), &prefix).await.unwrap();
    let ckpt = lease.checkpoint(5, &prefix, weights.len() as i64 + 2, None).await.unwrap();
    let url = format!("{base}/v1/fine_tuning/jobs/{job_id}/checkpoints/{ckpt}/content");

    let archive = client.get(&url).header("authorization", &auth).send().await.unwrap();
    assert_eq!(archive.status(), 200);
    let archive = archive.bytes().await.unwrap();
    let mut found = false;
    for entry in tar::Archive::new(&archive[..]).entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path().unwrap().ends_with("model.safetensors") {
            let mut content = Vec::new();
            entry.read_to_end(&mut content).unwrap();
            assert!(content == weights);
            found = true;
        }
    }
    assert!(found, "weights missing from the archive");

    let redirect = client
        .get(format!("{url}?redirect=1&path=model.safetensors"))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), 302);
    let location = redirect.headers()["location"].to_str().unwrap().to_string();
    let direct = reqwest::get(&location).await.unwrap();
    assert_eq!(direct.status(), 200, "{location}");
    assert!(direct.bytes().await.unwrap() == weights);

    let cancelled: serde_json::Value = client
        .post(format!("{base}/v1/fine_tuning/jobs/{job_id}/cancel"))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cancelled["pending_control"], "cancel");
    server.abort();
}
