//! `forward_backward`'s protobuf (`tinker_public.proto` of `tinker` 0.38.0): the request the SDK
//! always sends as protobuf, read into [`ForwardBackward`] with every problem named by its
//! field, and the [`ForwardBackwardOutput`] it must read back as protobuf.

use super::proto::float32s;
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use verity_core::tinker::training::{
    ClipThresholds, Datum, FieldError, ForwardBackward, ForwardBackwardOutput, LossFn,
};

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum DType {
    /// Not set.
    Unspecified = 0,
    /// `float32`.
    Float32 = 1,
    /// `int64`.
    Int64 = 2,
    /// `int32`.
    Int32 = 3,
    /// `bfloat16`.
    Bfloat16 = 4,
}

/// A 2-D tensor's compressed-sparse-row form.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SparseCsr {
    /// Non-zero values.
    #[prost(bytes = "vec", tag = "1")]
    pub values: Vec<u8>,
    /// Row starts (`int64`).
    #[prost(bytes = "vec", tag = "2")]
    pub crow_indices: Vec<u8>,
    /// Columns (`int64`).
    #[prost(bytes = "vec", tag = "3")]
    pub col_indices: Vec<u8>,
}

/// How a tensor's values are stored.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Encoding {
    /// Packed little-endian values.
    #[prost(bytes, tag = "1")]
    Dense(Vec<u8>),
    /// Compressed sparse rows.
    #[prost(message, tag = "2")]
    SparseCsr(SparseCsr),
}

/// One tensor of a datum's `loss_fn_inputs`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Tensor {
    /// Its values.
    #[prost(oneof = "Encoding", tags = "1, 2")]
    pub encoding: Option<Encoding>,
    /// Their type.
    #[prost(enumeration = "DType", tag = "3")]
    pub dtype: i32,
    /// Its shape.
    #[prost(int64, repeated, tag = "4")]
    pub shape: Vec<i64>,
}

/// Tokens of a text chunk.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EncodedTextChunk {
    /// Packed little-endian `int32`s.
    #[prost(bytes = "vec", tag = "1")]
    pub tokens: Vec<u8>,
}

/// What a chunk holds (image and audio chunks are not read: they decode as `None`).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ChunkKind {
    /// Text tokens.
    #[prost(message, tag = "1")]
    EncodedText(EncodedTextChunk),
}

/// One chunk of a model input.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Chunk {
    /// Its content.
    #[prost(oneof = "ChunkKind", tags = "1")]
    pub chunk: Option<ChunkKind>,
}

/// One example on the wire.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireDatum {
    /// The model input's chunks.
    #[prost(message, repeated, tag = "1")]
    pub model_input: Vec<Chunk>,
    /// The loss's inputs by name.
    #[prost(map = "string, message", tag = "2")]
    pub loss_fn_inputs: HashMap<String, Tensor>,
}

/// A loss setting: a number or a text.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ConfigValue {
    /// A number.
    #[prost(double, tag = "1")]
    Number(f64),
    /// A text.
    #[prost(string, tag = "2")]
    Text(String),
}

/// A `loss_fn_config_v2` value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LossConfigValue {
    /// The value.
    #[prost(oneof = "ConfigValue", tags = "1, 2")]
    pub value: Option<ConfigValue>,
}

/// `POST /api/v1/forward_backward`'s body.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardBackwardRequest {
    /// The training client.
    #[prost(string, tag = "1")]
    pub model_id: String,
    /// The call's place in the client's order.
    #[prost(int32, tag = "2")]
    pub seq_id: i32,
    /// The examples.
    #[prost(message, repeated, tag = "3")]
    pub data: Vec<WireDatum>,
    /// The loss's name.
    #[prost(string, tag = "4")]
    pub loss_fn: String,
    /// Numeric loss settings.
    #[prost(map = "string, double", tag = "5")]
    pub loss_fn_config: HashMap<String, f64>,
    /// `forward` rather than `forward_backward`.
    #[prost(bool, tag = "6")]
    pub forward_only: bool,
    /// Loss settings, numbers or texts.
    #[prost(map = "string, message", tag = "7")]
    pub loss_fn_config_v2: HashMap<String, LossConfigValue>,
}

/// Per-datum values of one output field, concatenated.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BatchedTensor {
    /// Every datum's values, packed little-endian.
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    /// `int64` byte offsets into `data`, one more than datums.
    #[prost(bytes = "vec", tag = "2")]
    pub offsets: Vec<u8>,
    /// The values' type.
    #[prost(enumeration = "DType", tag = "3")]
    pub dtype: i32,
    /// Each datum's shape after its first axis (empty: a vector).
    #[prost(int64, repeated, tag = "4")]
    pub trailing_shape: Vec<i64>,
}

/// The output fields of some datums.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ArrayRecord {
    /// The record's type.
    #[prost(string, tag = "1")]
    pub type_tag: String,
    /// Field name → values.
    #[prost(map = "string, message", tag = "2")]
    pub fields: HashMap<String, BatchedTensor>,
    /// Datums covered.
    #[prost(int64, tag = "3")]
    pub num_datums: i64,
}

/// `forward_backward`'s result as the SDK reads it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireForwardBackwardOutput {
    /// The output's type (the SDK keeps the text after the last `:`).
    #[prost(string, tag = "1")]
    pub loss_fn_output_type: String,
    /// The per-datum outputs.
    #[prost(message, repeated, tag = "2")]
    pub loss_fn_outputs: Vec<ArrayRecord>,
    /// `name:reduction` → value.
    #[prost(map = "string, double", tag = "3")]
    pub metrics: HashMap<String, f64>,
}

/// A decoded `forward_backward` request: which client, its order, and the call.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedForwardBackward {
    /// The training client.
    pub model_id: String,
    /// The call's place in the client's order.
    pub seq_id: i32,
    /// The call.
    pub call: ForwardBackward,
}

/// A refused `forward_backward` body: its problem and, when the body could be read, the client
/// and the place in its order the call took (which must still be filled, or the client's later
/// calls would wait for it forever).
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// `(model_id, seq_id)` the body named.
    pub order: Option<(String, i32)>,
    /// What is wrong.
    pub error: FieldError,
}

/// Reads a `forward_backward` body; every problem names its field (`data[2].loss_fn_inputs.weights`).
pub fn decode_forward_backward(body: &[u8]) -> Result<DecodedForwardBackward, Refused> {
    let request = ForwardBackwardRequest::decode(body).map_err(|e| Refused {
        order: None,
        error: FieldError::new("body", format!("not a ForwardBackwardRequest protobuf: {e}")),
    })?;
    let refused =
        |error| Refused { order: Some((request.model_id.clone(), request.seq_id)), error };
    let call = read_call(&request).map_err(refused)?;
    Ok(DecodedForwardBackward { model_id: request.model_id, seq_id: request.seq_id, call })
}

/// The call a readable request describes.
fn read_call(request: &ForwardBackwardRequest) -> Result<ForwardBackward, FieldError> {
    let loss_fn = LossFn::parse(&request.loss_fn).ok_or_else(|| {
        let served: Vec<&str> = LossFn::ALL.iter().map(|l| l.as_str()).collect();
        FieldError::new(
            "loss_fn",
            format!("{:?} is not served; Verity serves {}", request.loss_fn, served.join(", ")),
        )
    })?;
    let clip = clip_thresholds(request, loss_fn)?;
    let data = request
        .data
        .iter()
        .enumerate()
        .map(|(i, datum)| read_datum(i, datum, loss_fn))
        .collect::<Result<Vec<_>, _>>()?;
    let call = ForwardBackward { data, loss_fn, clip, forward_only: request.forward_only };
    call.check(usize::MAX)?;
    Ok(call)
}

/// The clip range from `loss_fn_config` (numbers are sent to both maps; texts only to v2).
fn clip_thresholds(
    request: &ForwardBackwardRequest,
    loss_fn: LossFn,
) -> Result<ClipThresholds, FieldError> {
    let mut settings: BTreeMap<&str, f64> = BTreeMap::new();
    for (key, value) in &request.loss_fn_config_v2 {
        match &value.value {
            Some(ConfigValue::Number(n)) => {
                settings.insert(key, *n);
            }
            _ => {
                return Err(FieldError::new(
                    format!("loss_fn_config.{key}"),
                    "must be a number for the built-in losses",
                ))
            }
        }
    }
    for (key, value) in &request.loss_fn_config {
        settings.insert(key, *value);
    }
    let mut clip = ClipThresholds::default();
    for (key, value) in settings {
        match key {
            "clip_low_threshold" if loss_fn.known_config().contains(&key) => clip.low = value,
            "clip_high_threshold" if loss_fn.known_config().contains(&key) => clip.high = value,
            _ => {
                let known = loss_fn.known_config();
                let reads = if known.is_empty() { "nothing".into() } else { known.join(", ") };
                return Err(FieldError::new(
                    format!("loss_fn_config.{key}"),
                    format!("not a setting of the {} loss (it reads {reads})", loss_fn.as_str()),
                ));
            }
        }
    }
    Ok(clip)
}

fn read_datum(i: usize, datum: &WireDatum, loss_fn: LossFn) -> Result<Datum, FieldError> {
    let mut tokens = Vec::new();
    for (c, chunk) in datum.model_input.iter().enumerate() {
        match &chunk.chunk {
            Some(ChunkKind::EncodedText(text)) => {
                let field = format!("data[{i}].model_input.chunks[{c}].tokens");
                tokens.extend(token_ids(&text.tokens, 4, &field)?);
            }
            None => {
                return Err(FieldError::new(
                    format!("data[{i}].model_input.chunks[{c}]"),
                    "only text chunks are served (no image or audio chunks)",
                ))
            }
        }
    }
    let mut inputs = BTreeMap::new();
    for (name, tensor) in &datum.loss_fn_inputs {
        let field = format!("data[{i}].loss_fn_inputs.{name}");
        if !loss_fn.known_inputs().contains(&name.as_str()) {
            return Err(FieldError::new(
                field,
                format!(
                    "not an input of the {} loss (it reads {})",
                    loss_fn.as_str(),
                    loss_fn.known_inputs().join(", ")
                ),
            ));
        }
        inputs.insert(name.as_str(), (field, tensor));
    }
    let Some((field, targets)) = inputs.remove("target_tokens") else {
        return Err(FieldError::new(format!("data[{i}].loss_fn_inputs.target_tokens"), "required"));
    };
    let target_tokens = match (DType::try_from(targets.dtype), vector(targets, &field)?) {
        (Ok(DType::Int64), bytes) => token_ids(bytes, 8, &field)?,
        (Ok(DType::Int32), bytes) => token_ids(bytes, 4, &field)?,
        _ => return Err(FieldError::new(field, "must be int64 or int32 token ids")),
    };
    let mut floats = |name: &str| -> Result<Option<Vec<f32>>, FieldError> {
        let Some((field, tensor)) = inputs.remove(name) else { return Ok(None) };
        let bytes = vector(tensor, &field)?;
        let values = match DType::try_from(tensor.dtype) {
            Ok(DType::Float32) if bytes.len().is_multiple_of(4) => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Ok(DType::Bfloat16) if bytes.len().is_multiple_of(2) => bytes
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect(),
            _ => return Err(FieldError::new(field, "must be float32 (or bfloat16) values")),
        };
        Ok(Some(values))
    };
    Ok(Datum {
        tokens,
        target_tokens,
        weights: floats("weights")?,
        advantages: floats("advantages")?,
        logprobs: floats("logprobs")?,
    })
}

/// A one-dimensional dense tensor's bytes (the shape, when given, must be `[n]`).
fn vector<'a>(tensor: &'a Tensor, field: &str) -> Result<&'a [u8], FieldError> {
    match &tensor.encoding {
        Some(Encoding::Dense(bytes)) if tensor.shape.len() <= 1 => Ok(bytes),
        Some(Encoding::Dense(_)) => Err(FieldError::new(
            field,
            format!("must be one value per position, got shape {:?}", tensor.shape),
        )),
        Some(Encoding::SparseCsr(_)) => Err(FieldError::new(
            field,
            "sparse tensors are not served; send one value per position",
        )),
        None => Err(FieldError::new(field, "has no values")),
    }
}

/// Little-endian signed integers of `width` bytes as token ids.
fn token_ids(bytes: &[u8], width: usize, field: &str) -> Result<Vec<u32>, FieldError> {
    if !bytes.len().is_multiple_of(width) {
        return Err(FieldError::new(
            field,
            format!("{} bytes is not a whole number of ids", bytes.len()),
        ));
    }
    bytes
        .chunks_exact(width)
        .map(|b| {
            let id = if width == 8 {
                i64::from_le_bytes(b.try_into().unwrap_or_default())
            } else {
                i64::from(i32::from_le_bytes(b.try_into().unwrap_or_default()))
            };
            u32::try_from(id).map_err(|_| FieldError::new(field, format!("{id} is not a token id")))
        })
        .collect()
}

/// The result as the SDK reads it: one record over all datums, each field a `float32` vector
/// per datum.
pub fn encode_output(output: &ForwardBackwardOutput) -> Vec<u8> {
    let names: std::collections::BTreeSet<&String> =
        output.outputs.iter().flat_map(|fields| fields.keys()).collect();
    let fields = names
        .into_iter()
        .map(|name| {
            let mut data = Vec::new();
            let mut offsets = vec![0i64];
            for datum in &output.outputs {
                data.extend(float32s(datum.get(name).map_or(&[][..], Vec::as_slice)));
                offsets.push(data.len() as i64);
            }
            let tensor = BatchedTensor {
                data,
                offsets: offsets.iter().flat_map(|o| o.to_le_bytes()).collect(),
                dtype: DType::Float32 as i32,
                trailing_shape: Vec::new(),
            };
            (name.clone(), tensor)
        })
        .collect();
    WireForwardBackwardOutput {
        loss_fn_output_type: "ArrayRecord".into(),
        loss_fn_outputs: vec![ArrayRecord {
            type_tag: "ArrayRecord".into(),
            fields,
            num_datums: output.outputs.len() as i64,
        }],
        metrics: output.metrics.iter().map(|(k, v)| (k.clone(), *v)).collect(),
    }
    .encode_to_vec()
}

#[cfg(test)]
#[path = "training_proto_tests.rs"]
mod tests;
