//! `GET …/checkpoints/{id}/gguf`: a LoRA checkpoint of the real SmolLM2-135M-Instruct exported
//! as GGUF (the adapter merged into its base), kept in the store for the next download, with its
//! Ollama Modelfile; bad parameters and other orgs refused (skipped loudly without the fixture).

use verity_tests::api_support;

use api_support::*;
use axum::http::StatusCode;
use candle_core::{Device, Tensor};
use serde_json::json;
use verity_core::queue::{DeviceKind, WorkerInfo};
use verity_core::storage::publish_folder;
use verity_worker::model::lora::LoraConfig;
use verity_worker::testing::{chat_prompt_ids, smollm2_dir};
use verity_worker::{load_model, loader::load_stack};

#[sqlx::test(migrator = "verity_core::db::MIGRATOR")]
async fn a_lora_checkpoint_downloads_as_gguf_with_its_adapter_merged(pool: sqlx::PgPool) {
    let Some(base_dir) = smollm2_dir("a_lora_checkpoint_downloads_as_gguf_with_its_adapter_merged")
    else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let mut config = api_config();
    config.judge_cache_dir = cache.path().to_path_buf();
    let app = app_with(pool.clone(), config, |_| {}).await;
    verity_core::testing::publish_base_model(&pool, app.state.store.as_ref(), &base_dir, "smollm2")
        .await;
    let key = user(&pool, "a@x.io", "acme", "member").await;
    let other = user(&pool, "b@y.io", "other", "member").await;
    let file = upload(&app.router, &key, "train.jsonl", DATASET).await.json();
    let job = post(
        &app.router,
        "/v1/fine_tuning/jobs",
        &key,
        json!({"model": "smollm2", "training_file": file["id"], "method": method()}),
    )
    .await;
    assert_eq!(job.status, StatusCode::OK, "{:?}", job.json());
    let job = job.json()["id"].as_str().unwrap().to_string();

    // Play the worker: a LoRA adapter with a non-zero update, published as step 2.
    let adapter = tempfile::tempdir().unwrap();
    let mut lm = load_model(&base_dir, &Device::Cpu).unwrap();
    let targets = ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec();
    let lora = LoraConfig { r: 4, lora_alpha: 8.0, target_modules: targets, lora_dropout: 0.0 };
    lm.model.enable_lora(lora, 3).unwrap();
    for (name, var) in lm.model.lora_params() {
        if name.contains("lora_B") {
            let noise = Tensor::randn(0f32, 0.02, var.dims(), &Device::Cpu).unwrap();
            var.set(&noise).unwrap();
        }
    }
    verity_worker::checkpoint::save_checkpoint(adapter.path(), &lm.model, None, None, "smollm2")
        .unwrap();
    let worker = WorkerInfo::new(DeviceKind::Cpu, 1000);
    app.state.queue.register_worker(&worker).await.unwrap();
    let lease = app.state.queue.claim(&worker).await.unwrap().unwrap();
    let prefix = format!("jobs/{job}/checkpoints/step-2");
    publish_folder(app.state.store.as_ref(), adapter.path(), &prefix).await.unwrap();
    let ckpt = lease.checkpoint(2, &prefix, 1, None).await.unwrap();
    let url = format!("/v1/fine_tuning/jobs/{job}/checkpoints/{ckpt}/gguf");

    let reply = get(&app.router, &format!("{url}?quantization=f16"), &key).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-length"], reply.bytes.len().to_string());
    let disposition = reply.headers["content-disposition"].to_str().unwrap();
    assert_eq!(disposition, format!("attachment; filename=\"{job}-step-2.f16.gguf\""));
    let stored = format!("{prefix}/gguf/{job}-step-2.f16.gguf");
    assert_eq!(app.state.store.get_bytes(&stored).await.unwrap(), reply.bytes, "kept in the store");

    // The file computes what the adapted model does: the adapter merged into SmolLM2.
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("model.gguf");
    std::fs::write(&path, &reply.bytes).unwrap();
    let exported = load_model(&path, &Device::Cpu).unwrap();
    let merged =
        load_stack(Some(&base_dir), &[adapter.path().to_path_buf()], &Device::Cpu).unwrap();
    let plain = load_model(&base_dir, &Device::Cpu).unwrap();
    let ids = chat_prompt_ids(&merged, "What is 7 + 5?").unwrap();
    let logits = |lm: &verity_worker::LoadedModel| -> Vec<f32> {
        verity_worker::testing::flat_logits(&lm.model, &ids).unwrap()
    };
    let (want, got, base) = (logits(&merged), logits(&exported), logits(&plain));
    let diff =
        |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let (export_error, adapter_effect) = (diff(&want, &got), diff(&want, &base));
    eprintln!("export error {export_error}, adapter effect {adapter_effect}");
    assert!(export_error < adapter_effect / 5.0, "{export_error} vs {adapter_effect}");

    // The Modelfile names the file, chats in ChatML and stops at its end-of-turn token.
    let modelfile = get(&app.router, &format!("{url}?quantization=f16&file=modelfile"), &key).await;
    assert_eq!(modelfile.status, StatusCode::OK);
    let text = String::from_utf8(modelfile.bytes.to_vec()).unwrap();
    assert!(text.starts_with(&format!("FROM ./{job}-step-2.f16.gguf\nTEMPLATE")), "{text}");
    assert!(text.contains("PARAMETER stop \"<|im_end|>\""), "{text}");
    let again = get(&app.router, &format!("{url}?quantization=f16"), &key).await;
    assert_eq!(again.bytes, reply.bytes, "the second download streams the kept file");
    assert!(
        std::fs::read_dir(cache.path().join(".gguf-exports")).unwrap().next().is_none(),
        "the export's working folder is removed"
    );

    for (query, param) in
        [("quantization=q3_k", "quantization"), ("file=tar", "file"), ("redirect=2", "redirect")]
    {
        let reply = get(&app.router, &format!("{url}?{query}"), &key).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, Some(param));
    }
    assert_eq!(get(&app.router, &url, &other).await.status, StatusCode::NOT_FOUND);
}
