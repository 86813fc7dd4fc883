//! The inference engine gives back the memory of a model nobody used for its idle time: the
//! model is unloaded (never while it serves a request) and loaded again by the next request.

use candle_core::Device;
use std::sync::Arc;
use std::time::Duration;
use verity_core::storage::{publish_folder, LocalStore, ObjectStore};
use verity_worker::inference::request::{
    GenerationEvent, GenerationParams, GenerationRequest, ModelSource, PromptInput,
};
use verity_worker::inference::{Engine, EngineConfig};
use verity_worker::trainer::testing::write_tiny_model_dir;
use verity_worker::Family;

/// Three tokens of the tiny model, waited for to the end of the generation.
async fn answer(engine: &Engine) {
    let request = GenerationRequest {
        model: ModelSource {
            base_prefix: "models/tiny".into(),
            base_format: "hf".into(),
            merged: Vec::new(),
            checkpoint_prefix: None,
        },
        prompt: PromptInput::Text("t1 t2".into()),
        params: GenerationParams { max_tokens: Some(3), seed: 1, ..GenerationParams::default() },
    };
    let mut generation = engine.generate(request).await.unwrap();
    while let Some(event) = generation.events.recv().await {
        if let GenerationEvent::Failed { .. } | GenerationEvent::Refused { .. } = event {
            panic!("{event:?}");
        }
    }
}

#[tokio::test]
async fn an_idle_model_is_unloaded_and_loaded_again_on_the_next_request() {
    let scratch = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalStore::open(scratch.path().join("objects"), None).await.unwrap());
    let dir = scratch.path().join("tiny");
    write_tiny_model_dir(&dir, Family::Llama, 3).unwrap();
    publish_folder(store.as_ref(), &dir, "models/tiny").await.unwrap();
    let idle = Duration::from_millis(300);
    let config = |idle_unload| EngineConfig {
        cache_dir: scratch.path().join("cache"),
        device: Device::Cpu,
        memory_budget_bytes: 1 << 30,
        max_batch: 4,
        decode_dtype: Default::default(),
        idle_unload,
    };
    let engine = Engine::new(store.clone(), config(Some(idle)));
    answer(&engine).await;
    assert_eq!(engine.loaded_models().await.len(), 1);
    assert!(engine.unload_idle().await.is_empty(), "used just now: kept");
    tokio::time::sleep(idle + Duration::from_millis(100)).await;
    let gone = engine.unload_idle().await;
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert!(engine.loaded_models().await.is_empty());
    answer(&engine).await;
    assert_eq!(engine.loaded_models().await.len(), 1, "loaded again by the next request");

    // Without an idle time, models stay until the budget needs the room.
    let keeping = Engine::new(store, config(None));
    answer(&keeping).await;
    tokio::time::sleep(idle + Duration::from_millis(100)).await;
    assert!(keeping.unload_idle().await.is_empty());
    assert_eq!(keeping.loaded_models().await.len(), 1);
}
