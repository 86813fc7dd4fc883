//! What shapes a reinforcement trainer's rollouts: multi-turn tool episodes
//! ([`crate::episodes`]; the environment joins the objective and every prompt is rendered
//! again with the tools' schemas), or a grammar the completions follow (`response_format`).

use super::dataset::Dataset;
use super::error::{Result, TrainerError};
use super::step::Trainer;
use super::tuning::Objective;
use crate::constrained::OutputConstraint;
use crate::episodes::format::render_prompt;
use crate::episodes::tools::schemas;
use crate::tokenizer::ChatTokenizer;
use verity_core::environment::{Environment, HttpAllowList};
use verity_core::response_format::{FormatConflict, ResponseFormat};

impl Trainer {
    /// Makes every rollout (training and evaluation) a multi-turn episode in `environment`;
    /// prompts are rendered again with the row's `tools` or the environment's schemas, and must
    /// leave room for the episode's token budget. HTTP tools must be on this worker's
    /// allow-list.
    pub fn with_environment(mut self, environment: Environment) -> Result<Trainer> {
        if self.constraint.is_some() {
            return Err(TrainerError::Config(FormatConflict::ToolEpisodes.to_string()));
        }
        let max_completion = self.hp.max_completion_tokens();
        environment
            .validate("environment", max_completion, &HttpAllowList::from_env())
            .map_err(|e| TrainerError::Config(e.to_string()))?;
        let Objective::Reinforcement { environment: slot, .. } = &mut self.objective else {
            return Err(TrainerError::Config("only reinforcement jobs have environments".into()));
        };
        let budget = environment.max_episode_tokens(max_completion);
        let max_prompt = self.model.config.max_position_embeddings.saturating_sub(budget).max(1);
        let tools = schemas(&environment);
        render_all(&mut self.train, &self.tokenizer, &tools, max_prompt, "training file")?;
        if let Some(validation) = &mut self.validation {
            render_all(validation, &self.tokenizer, &tools, max_prompt, "validation file")?;
        }
        *slot = Some(Box::new(environment));
        Ok(self)
    }

    /// Makes every rollout (training and evaluation) follow `format` by constrained decoding
    /// ([`crate::constrained`]); free text changes nothing. Tool episodes and partial rollouts,
    /// which the grammar cannot follow, are refused with it.
    pub fn with_response_format(mut self, format: &ResponseFormat) -> Result<Trainer> {
        let vocab = self.model.config.vocab_size;
        let compiled = OutputConstraint::compile(format, &self.tokenizer, vocab)
            .map_err(|e| TrainerError::Config(e.to_string()))?;
        let Some(constraint) = compiled else { return Ok(self) };
        let tools =
            matches!(&self.objective, Objective::Reinforcement { environment: Some(_), .. });
        if let Some(conflict) = format.conflict(tools, self.hp.partial_rollout_tokens.is_some()) {
            return Err(TrainerError::Config(conflict.to_string()));
        }
        self.constraint = Some(constraint);
        Ok(self)
    }
}

fn render_all(
    data: &mut Dataset,
    tokenizer: &ChatTokenizer,
    tools: &[serde_json::Value],
    max_prompt: usize,
    file: &str,
) -> Result<()> {
    for (index, example) in data.examples.iter_mut().enumerate() {
        let data_error = |message: String| TrainerError::Data {
            file: file.to_string(),
            line: 0,
            message: format!("row {index} (0-based): {message}"),
        };
        let text = render_prompt(tokenizer, &example.item, tools)
            .map_err(|e| data_error(format!("chat template with tools failed: {e}")))?;
        let ids = tokenizer.encode(&text)?;
        if ids.len() >= max_prompt {
            return Err(data_error(format!(
                "the prompt with its tools has {} tokens; with the episode budget the model allows at most {}",
                ids.len(),
                max_prompt.saturating_sub(1)
            )));
        }
        example.prompt_text = text;
        example.prompt_ids = ids;
    }
    Ok(())
}
