//! Property tests (bounded fuzzing) of the JSONL validator that reads uploaded files: any bytes,
//! cut into any chunks, give one answer (the same for every chunking) and never a panic.

use proptest::prelude::*;
use verity_server::api::files::jsonl::{JsonlValidator, RowFormat};

/// Bytes biased toward JSONL rows and the ways they break.
fn rows() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop::sample::select(vec![
        &b"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}"[..],
        b"{\"prompt\":\"2+2?\",\"reference_answer\":\"4\"}",
        b"{\"input\":{\"messages\":[]},\"preferred_output\":[],\"non_preferred_output\":[]}",
        b"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{}}]}]}",
        b"{\"tools\":[{\"type\":\"function\"}]}",
        b"\n",
        b"\r\n",
        b"{",
        b"}",
        b"[",
        b"]",
        b"\"",
        b"\\",
        b"null",
        b"1e999",
        b"\xff\xfe",
        b"\xe2\x82",
        b" ",
        b",",
        b":",
    ]);
    prop::collection::vec(piece, 0..40).prop_map(|p| p.concat())
}

fn validate(format: RowFormat, bytes: &[u8], chunk: usize) -> String {
    let mut v = JsonlValidator::for_format(format);
    for piece in bytes.chunks(chunk.max(1)) {
        v.feed(piece);
    }
    format!("{:?}", v.finish_all())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn every_chunking_of_any_bytes_gets_the_same_answer(
        bytes in prop_oneof![rows(), prop::collection::vec(any::<u8>(), 0..300)],
        chunk in 1usize..17,
        format in prop::sample::select(vec![
            RowFormat::Any, RowFormat::Prompt, RowFormat::Supervised, RowFormat::Preference,
        ]),
    ) {
        let whole = validate(format, &bytes, bytes.len());
        prop_assert_eq!(validate(format, &bytes, chunk), whole);
    }
}
