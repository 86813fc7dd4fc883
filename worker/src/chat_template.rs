//! Chat templates rendered with minijinja the way HF `apply_chat_template` renders them
//! (trim_blocks, lstrip_blocks, `raise_exception`, `tojson`, Python string methods).

use crate::error::{Result, WorkerError};
use minijinja::{context, Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// Builds a message from a role and its text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
}

fn template_err(e: Error) -> WorkerError {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(&format!(": {s}"));
        src = s.source();
    }
    WorkerError::Template(msg)
}

impl ChatTemplate {
    /// Compiles a Jinja chat template.
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |_fmt: String| -> String { String::new() });
        env.add_template_owned("chat", source.to_owned()).map_err(template_err)?;
        Ok(Self { env })
    }

    /// Renders `messages`, optionally opening an assistant turn (`add_generation_prompt`).
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt, bos_token, eos_token)
    }

    /// [`ChatTemplate::render`] for messages of any serializable shape (OpenAI's chat messages
    /// with `tool_calls`, `name`, …) and the chat's `tools` (left undefined when `None`).
    pub fn render_with_tools<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        bos_token: Option<&str>,
        eos_token: Option<&str>,
    ) -> Result<String> {
        let tmpl = self.env.get_template("chat").map_err(template_err)?;
        let (bos_token, eos_token) = (bos_token.unwrap_or(""), eos_token.unwrap_or(""));
        match tools {
            None => tmpl.render(context! {
                messages => messages, add_generation_prompt => add_generation_prompt,
                bos_token => bos_token, eos_token => eos_token,
            }),
            Some(tools) => tmpl.render(context! {
                messages => messages, tools => tools, add_generation_prompt => add_generation_prompt,
                bos_token => bos_token, eos_token => eos_token,
            }),
        }
        .map_err(template_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_generation_prompt() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n'}}{% endfor %}\
             {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        )
        .unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi")], true, None, None).unwrap();
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn raise_exception_and_python_methods_work() {
        let t = ChatTemplate::new("{% if messages[0]['role'] == 'bad' %}{{ raise_exception('no') }}{% endif %}{{ messages[0]['content'].strip() }}").unwrap();
        assert_eq!(t.render(&[ChatMessage::new("user", "  x ")], false, None, None).unwrap(), "x");
        assert!(t.render(&[ChatMessage::new("bad", "x")], false, None, None).is_err());
        assert!(ChatTemplate::new("{% if %}").is_err());
    }
}
