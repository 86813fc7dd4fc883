use super::*;
use crate::api::tinker::proto::int32s;

fn dense(values: Vec<u8>, dtype: DType, n: usize) -> Tensor {
    Tensor { encoding: Some(Encoding::Dense(values)), dtype: dtype as i32, shape: vec![n as i64] }
}

fn int64s(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A datum as the SDK sends one: `target_tokens` int64, the rest float32.
fn wire_datum(tokens: &[u32], targets: &[i64], floats: &[(&str, &[f32])]) -> WireDatum {
    let mut inputs = HashMap::new();
    inputs.insert("target_tokens".to_string(), dense(int64s(targets), DType::Int64, targets.len()));
    for (name, values) in floats {
        inputs.insert(name.to_string(), dense(float32s(values), DType::Float32, values.len()));
    }
    let text =
        Chunk { chunk: Some(ChunkKind::EncodedText(EncodedTextChunk { tokens: int32s(tokens) })) };
    WireDatum { model_input: vec![text], loss_fn_inputs: inputs }
}

fn request(loss_fn: &str, data: Vec<WireDatum>) -> ForwardBackwardRequest {
    ForwardBackwardRequest {
        model_id: "sess-1:train:0".into(),
        seq_id: 3,
        data,
        loss_fn: loss_fn.into(),
        ..ForwardBackwardRequest::default()
    }
}

#[test]
fn a_request_as_the_sdk_sends_it_reads_into_the_call() {
    let mut body = request(
        "ppo",
        vec![wire_datum(
            &[1, 2, 3],
            &[2, 3, 4],
            &[("advantages", &[1.0, 0.0, -1.0]), ("logprobs", &[-0.5; 3])],
        )],
    );
    body.loss_fn_config.insert("clip_high_threshold".into(), 1.28);
    let number = LossConfigValue { value: Some(ConfigValue::Number(1.28)) };
    body.loss_fn_config_v2.insert("clip_high_threshold".into(), number);
    let decoded = decode_forward_backward(&body.encode_to_vec()).unwrap();
    assert_eq!(decoded.model_id, "sess-1:train:0");
    assert_eq!(decoded.seq_id, 3);
    let call = decoded.call;
    assert_eq!(call.loss_fn, LossFn::Ppo);
    assert_eq!(call.clip, ClipThresholds { low: 0.8, high: 1.28 });
    assert!(!call.forward_only);
    assert_eq!(
        call.data,
        [Datum {
            tokens: vec![1, 2, 3],
            target_tokens: vec![2, 3, 4],
            weights: None,
            advantages: Some(vec![1.0, 0.0, -1.0]),
            logprobs: Some(vec![-0.5; 3]),
        }]
    );
}

#[test]
fn a_bad_request_names_its_field() {
    let error = |body: ForwardBackwardRequest| {
        decode_forward_backward(&body.encode_to_vec()).unwrap_err().error
    };
    let err = error(request("dro", vec![]));
    assert_eq!(err.field, "loss_fn");
    assert!(err.message.contains("cross_entropy, importance_sampling, ppo, cispo"), "{err:?}");
    let err = error(request(
        "cross_entropy",
        vec![wire_datum(&[1], &[2], &[]), wire_datum(&[1], &[2], &[("advantages", &[1.0])])],
    ));
    assert_eq!(err.field, "data[1].loss_fn_inputs.advantages");
    let mut image = wire_datum(&[1], &[2], &[]);
    image.model_input.push(Chunk { chunk: None });
    let err = error(request("cross_entropy", vec![image]));
    assert_eq!(err.field, "data[0].model_input.chunks[1]");
    let mut no_targets = wire_datum(&[1], &[2], &[]);
    no_targets.loss_fn_inputs.remove("target_tokens");
    assert_eq!(
        error(request("cross_entropy", vec![no_targets])).field,
        "data[0].loss_fn_inputs.target_tokens"
    );
    let mut negative = wire_datum(&[1], &[-3], &[]);
    negative.loss_fn_inputs.get_mut("target_tokens").unwrap().dtype = DType::Int64 as i32;
    assert!(error(request("cross_entropy", vec![negative])).message.contains("-3"));
    let mut config = request("cross_entropy", vec![wire_datum(&[1], &[2], &[])]);
    config.loss_fn_config.insert("clip_low_threshold".into(), 0.5);
    let err = error(config);
    assert_eq!(err.field, "loss_fn_config.clip_low_threshold");
    assert!(err.message.contains("cross_entropy"), "{err:?}");
    let mut matrix = wire_datum(&[1, 2], &[2, 3], &[]);
    matrix.loss_fn_inputs.get_mut("target_tokens").unwrap().shape = vec![1, 2];
    assert!(error(request("cross_entropy", vec![matrix])).message.contains("shape"));
    let unreadable = decode_forward_backward(b"\xff\xff").unwrap_err();
    assert_eq!((unreadable.error.field.as_str(), unreadable.order), ("body", None));
    let named = decode_forward_backward(&request("dro", vec![]).encode_to_vec()).unwrap_err();
    assert_eq!(named.order, Some(("sess-1:train:0".to_string(), 3)), "the call's place is known");
}

#[test]
fn the_output_is_one_record_with_byte_offsets_per_datum() {
    let mut first = BTreeMap::new();
    first.insert("logprobs".to_string(), vec![-1.0f32, -2.0, -3.0]);
    let mut second = BTreeMap::new();
    second.insert("logprobs".to_string(), vec![-4.0f32]);
    let mut metrics = BTreeMap::new();
    metrics.insert("loss:sum".to_string(), 10.0);
    let bytes = encode_output(&ForwardBackwardOutput { outputs: vec![first, second], metrics });
    let wire = WireForwardBackwardOutput::decode(bytes.as_slice()).unwrap();
    assert_eq!(wire.metrics["loss:sum"], 10.0);
    let [record] = wire.loss_fn_outputs.as_slice() else { panic!("one record") };
    assert_eq!(record.num_datums, 2);
    let logprobs = &record.fields["logprobs"];
    assert_eq!(logprobs.dtype, DType::Float32 as i32);
    assert_eq!(logprobs.data, float32s(&[-1.0, -2.0, -3.0, -4.0]));
    assert_eq!(logprobs.offsets, int64s(&[0, 12, 16]));
    assert!(logprobs.trailing_shape.is_empty());
}
