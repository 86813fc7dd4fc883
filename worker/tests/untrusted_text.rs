//! Property tests (bounded fuzzing) of what reads model output and user text: tool calls in
//! completions, and chat templates rendering arbitrary messages. Never a panic; the text before
//! a call is a prefix of the turn; a message's content is rendered verbatim, never evaluated.

use proptest::prelude::*;
use verity_worker::episodes::format::{
    llama_call, mistral_calls, openai_tool_calls, parse_tool_calls, text_before_call,
};
use verity_worker::trainer::testing::{
    tiny_llama3_tokenizer, tiny_mistral_tokenizer, tiny_tool_tokenizer,
};
use verity_worker::ChatMessage;

/// Text biased toward the tool-call formats a model writes (and breaks).
fn turn() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "<tool_call>",
        "</tool_call>",
        "[TOOL_CALLS]",
        "<|python_tag|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "</s>",
        "{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
        "{\"name\":",
        "\"arguments\":",
        "{",
        "}",
        "[",
        "]",
        "\"",
        ",",
        ":",
        "\\",
        "null",
        "add",
        " ",
        "\n",
        "é",
        "{\"parameters\": {}}",
    ]);
    prop_oneof![prop::collection::vec(piece, 0..24).prop_map(|p| p.concat()), any::<String>(),]
}

/// Message text biased toward template syntax and special tokens.
fn content() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "{{ 7 * 7 }}",
        "{% for x in range(9) %}",
        "{% endfor %}",
        "{#",
        "#}",
        "<|im_end|>",
        "<|im_start|>",
        "<|eot_id|>",
        "[INST]",
        "\n",
        "hi",
        "é",
        "\"",
        "'",
        "}}",
        "{{",
    ]);
    prop_oneof![prop::collection::vec(piece, 0..12).prop_map(|p| p.concat()), any::<String>(),]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn tool_calls_in_any_completion_parse_or_are_errors(turn in turn()) {
        let _ = parse_tool_calls(&turn);
        let _ = openai_tool_calls(&turn);
        let _ = llama_call(&turn);
        let _ = mistral_calls(&turn);
        prop_assert!(turn.starts_with(text_before_call(&turn)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn chat_templates_render_any_message_verbatim(
        role in prop::sample::select(vec!["system", "user", "assistant", "tool", "", "{{x}}"]),
        text in content(),
    ) {
        for tokenizer in [
            tiny_tool_tokenizer().unwrap(),
            tiny_llama3_tokenizer().unwrap(),
            tiny_mistral_tokenizer(&["hi"]).unwrap(),
        ] {
            let messages = [ChatMessage::new(role, text.clone())];
            if let Ok(rendered) = tokenizer.apply_chat_template(&messages, true) {
                if matches!(role, "user" | "system") {
                    prop_assert!(rendered.contains(text.trim()), "{rendered:?} lost {text:?}");
                }
            }
        }
    }
}
