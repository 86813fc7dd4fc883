//! The protobuf messages the Tinker SDK reads its sampling results as (`tinker_public.proto`
//! of `tinker` 0.38.0, package `tinker_public`): packed little-endian arrays in `bytes` fields.

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum StopReason {
    /// An end-of-sequence token or a stop sequence.
    Stop = 0,
    /// The token budget.
    Length = 1,
}

/// One sampled sequence.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SampledSequence {
    /// Why it ended.
    #[prost(enumeration = "StopReason", tag = "1")]
    pub stop_reason: i32,
    /// Its tokens: little-endian `int32`s.
    #[prost(bytes = "vec", tag = "2")]
    pub tokens: Vec<u8>,
    /// Each token's log-probability: little-endian `float32`s.
    #[prost(bytes = "vec", optional, tag = "3")]
    pub logprobs: Option<Vec<u8>>,
}

/// The result of `asample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SampleResponse {
    /// The sequences, in the order of the request's `sample_sequence_ids`.
    #[prost(message, repeated, tag = "1")]
    pub sequences: Vec<SampledSequence>,
    /// Each prompt token's log-probability (little-endian `float32`s, NaN where not scored: the
    /// first token, and any before `prompt_logprobs_last_n`), when asked for.
    #[prost(bytes = "vec", optional, tag = "2")]
    pub prompt_logprobs: Option<Vec<u8>>,
    /// Prompt tokens served from a cache (none here).
    #[prost(int32, tag = "4")]
    pub prompt_cache_hit_tokens: i32,
}

/// `values` as packed little-endian `int32`s.
pub fn int32s(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
}

/// `values` as packed little-endian `float32`s.
pub fn float32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_sample_response_encodes_as_the_sdk_reads_it() {
        let response = SampleResponse {
            sequences: vec![SampledSequence {
                stop_reason: StopReason::Length as i32,
                tokens: int32s(&[100, 101]),
                logprobs: Some(float32s(&[-0.5, -0.25])),
            }],
            prompt_logprobs: None,
            prompt_cache_hit_tokens: 0,
        };
        let bytes = response.encode_to_vec();
        // field 1 (sequences, length-delimited): stop_reason=1, tokens (8 bytes), logprobs (8)
        let sequence = [
            &[0x08, 0x01, 0x12, 0x08][..],
            &[100, 0, 0, 0, 101, 0, 0, 0],
            &[0x1a, 0x08],
            &(-0.5f32).to_le_bytes(),
            &(-0.25f32).to_le_bytes(),
        ]
        .concat();
        assert_eq!(bytes, [&[0x0a, sequence.len() as u8][..], &sequence].concat());
        assert_eq!(SampleResponse::decode(bytes.as_slice()).unwrap(), response);
    }
}
