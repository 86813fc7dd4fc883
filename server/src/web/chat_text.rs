//! Chat-formatted text (`<|im_start|>role\n…<|im_end|>`, as ChatML templates render prompts) as
//! turns with roles, for display; other text is one turn without a role.

/// One turn of a rendered chat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// `system`, `user`, `assistant`…; empty for text outside any turn.
    pub role: String,
    /// The turn's text, without the special tokens.
    pub content: String,
}

const START: &str = "<|im_start|>";
/// Special tokens removed from what is shown.
const SPECIALS: [&str; 3] = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>"];

fn strip_specials(text: &str) -> String {
    SPECIALS.iter().fold(text.to_string(), |t, s| t.replace(s, ""))
}

/// The turns of `text`; turns with no content (such as the open assistant turn a generation
/// prompt ends with) are dropped.
pub fn turns(text: &str) -> Vec<Turn> {
    let mut out = Vec::new();
    let mut parts = text.split(START);
    let before = strip_specials(parts.next().unwrap_or(""));
    if !before.trim().is_empty() {
        out.push(Turn { role: String::new(), content: before.trim().to_string() });
    }
    for part in parts {
        let (role, content) = part.split_once('\n').unwrap_or((part, ""));
        let content = strip_specials(content).trim().to_string();
        if !content.is_empty() {
            out.push(Turn { role: strip_specials(role).trim().to_string(), content });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_becomes_roles_and_plain_text_stays_whole() {
        let prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n";
        let t = turns(prompt);
        assert_eq!(
            t,
            vec![
                Turn { role: "system".into(), content: "Be brief.".into() },
                Turn { role: "user".into(), content: "2+2?".into() },
            ]
        );
        assert_eq!(turns("4<|im_end|>"), vec![Turn { role: String::new(), content: "4".into() }]);
        assert!(turns("").is_empty());
    }
}
