//! Device smoke test: runs on `VERITY_TEST_DEVICE` (e.g. `cuda:0`, set by
//! `scripts/gpu-check.sh`); on the CPU it is the same check through the device code path.

use verity_worker::testing::{smollm2_dir, tiny_model};
use verity_worker::{parse_device, Family};

fn device() -> candle_core::Device {
    let spec = std::env::var("VERITY_TEST_DEVICE").unwrap_or_else(|_| "cpu".into());
    parse_device(&spec).expect("VERITY_TEST_DEVICE must name a usable device")
}

#[test]
fn tiny_model_trains_on_the_device() {
    let dev = device();
    let cpu = tiny_model(Family::Llama, 1).unwrap();
    let cfg = cpu.config.clone();
    let weights = verity_worker::weights::random_weights(&cfg, 1, &dev).unwrap();
    let mut model = verity_worker::Transformer::from_weights(cfg, weights, &dev).unwrap();
    // Compared with the CPU's f32 below (a GPU defaults to bf16; tests/device_path.rs checks it).
    model.set_compute_dtype(candle_core::DType::F32).unwrap();
    let lp = model.completion_logprobs(&[vec![1, 2, 3]], &[vec![4, 5]], 1.0, 0, true).unwrap();
    let loss = (lp.logprobs * lp.mask).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let params = model.trainable_params();
    assert!(params.iter().all(|(_, v)| grads.get(v.as_tensor()).is_some()));
    // The trainer's layer-by-layer backward gives the same gradients on the device.
    let (layered, tape) =
        model.completion_logprobs_layered(&[vec![1, 2, 3]], &[vec![4, 5]], &[], 1.0, 0).unwrap();
    let layered_loss = (layered.logprobs * layered.mask).unwrap().sum_all().unwrap();
    let mut acc = verity_worker::optim::GradAccumulator::new(&params);
    acc.accumulate_layered(&layered_loss, tape, &params, 1.0).unwrap();
    for (name, var) in &params {
        let whole: Vec<f32> = grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_device(&candle_core::Device::Cpu)
            .unwrap()
            .to_vec1()
            .unwrap();
        let by_layer = acc.get(name).unwrap();
        let d = whole.iter().zip(&by_layer).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d < 1e-4, "{name}: layered gradient differs by {d}");
    }
    let want =
        cpu.completion_logprobs(&[vec![1, 2, 3]], &[vec![4, 5]], 1.0, 0, false).unwrap().logprobs;
    let got =
        model.completion_logprobs(&[vec![1, 2, 3]], &[vec![4, 5]], 1.0, 0, false).unwrap().logprobs;
    let d: f32 = (want - got.to_device(&candle_core::Device::Cpu).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert!(d < 1e-3, "device and CPU disagree by {d}");
}

#[test]
fn smollm2_greedy_on_the_device() {
    if std::env::var_os("VERITY_TEST_DEVICE").is_none() {
        eprintln!("SKIPPED: smollm2_greedy_on_the_device: VERITY_TEST_DEVICE not set (the CPU case is tests/smollm2.rs)");
        return;
    }
    let Some(dir) = smollm2_dir("smollm2_greedy_on_the_device") else {
        return;
    };
    let lm = verity_worker::load_model(&dir, &device()).unwrap();
    let ids =
        verity_worker::testing::chat_prompt_ids(&lm, "What is 7 + 5? Answer with just the number.")
            .unwrap();
    let answer = lm
        .tokenizer
        .decode(&verity_worker::testing::greedy_ids(&lm, ids, 8).unwrap(), true)
        .unwrap();
    assert!(answer.contains("12"), "{answer:?}");
}
