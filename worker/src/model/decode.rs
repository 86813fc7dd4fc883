//! Rows decoding together over one KV cache: the step loop shared by the rollout sampler
//! ([`crate::sampler::sample`]) and the serving engine's continuous batches.
//!
//! Rows are left-padded to a common cache length; each row remembers its first real key and
//! its next RoPE position, so rows of different lengths (and rows admitted later) decode in one
//! forward per step.

use super::compact::CompactWeights;
use super::inputs::PaddedBatch;
use super::kv_cache::KvCache;
use super::Transformer;
use crate::error::{Result, WorkerError};
use candle_core::Tensor;
use std::sync::Arc;

/// A batch of sequences being decoded one token per step.
pub struct DecodeBatch {
    cache: KvCache,
    first_valid: Vec<usize>,
    next_pos: Vec<u32>,
}

impl DecodeBatch {
    /// Prefills the (left-padded) prompts, reserving room for `extra` decoded positions;
    /// returns the batch and each row's next-token logits. `compact` weight copies (bf16
    /// rollouts) serve every forward through the batch when given.
    pub fn prefill(
        model: &Transformer,
        prompts: &[&[u32]],
        pad_id: u32,
        extra: usize,
        compact: Option<Arc<CompactWeights>>,
    ) -> Result<(DecodeBatch, Vec<Vec<f32>>)> {
        let pb = PaddedBatch::new(prompts, pad_id)?;
        let mut cache = model.new_cache(pb.batch, pb.len + extra)?;
        if let Some(weights) = compact {
            cache.use_weights(weights);
        }
        let hidden = model.hidden_states(
            &pb.ids,
            &pb.positions(),
            pb.batch,
            &pb.pads,
            Some(&mut cache),
            false,
        )?;
        let last: Vec<u32> = (0..pb.batch).map(|i| ((i + 1) * pb.len - 1) as u32).collect();
        let last = hidden.index_select(&Tensor::new(last.as_slice(), model.device())?, 0)?;
        let logits: Vec<Vec<f32>> = model.logits(&last, Some(&cache))?.to_vec2()?;
        let next_pos = prompts.iter().map(|p| p.len() as u32).collect();
        Ok((DecodeBatch { cache, first_valid: pb.pads, next_pos }, logits))
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.first_valid.len()
    }

    /// Positions held per row (the longest row's length; shorter rows are padded in front).
    pub fn cached_len(&self) -> usize {
        self.cache.len()
    }

    /// Keeps (and repeats) the given rows, in order, and drops the padding no kept row needs.
    pub fn select_rows(&mut self, rows: &[usize]) -> Result<()> {
        if rows.iter().any(|&r| r >= self.rows()) {
            return Err(WorkerError::InvalidArgument("row outside the batch".into()));
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        self.cache.select_rows(&idx)?;
        self.first_valid = rows.iter().map(|&r| self.first_valid[r]).collect();
        self.next_pos = rows.iter().map(|&r| self.next_pos[r]).collect();
        Ok(())
    }

    /// Drops cache positions that every row masks out (common front padding); call after rows
    /// left, so a long-running batch does not keep the padding of sequences long gone.
    pub fn trim(&mut self) -> Result<()> {
        let common = self.first_valid.iter().copied().min().unwrap_or(0);
        if common == 0 {
            return Ok(());
        }
        self.cache.drop_front(common)?;
        for fv in &mut self.first_valid {
            *fv -= common;
        }
        Ok(())
    }

    /// Appends the rows of `other` after this batch's rows (continuous batching: a newly
    /// prefilled request joins between decode steps).
    pub fn append(&mut self, other: DecodeBatch) -> Result<()> {
        if self.rows() == 0 {
            *self = other;
            return Ok(());
        }
        let (pad_self, pad_other) = self.cache.append_rows(other.cache)?;
        for fv in &mut self.first_valid {
            *fv += pad_self;
        }
        self.first_valid.extend(other.first_valid.iter().map(|fv| fv + pad_other));
        self.next_pos.extend(other.next_pos);
        Ok(())
    }

    /// Feeds one token per row (at each row's next position) and returns each row's
    /// next-token logits.
    pub fn step(&mut self, model: &Transformer, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        if tokens.len() != self.rows() || tokens.is_empty() {
            return Err(WorkerError::InvalidArgument("one token per row".into()));
        }
        let pos = self.next_pos.clone();
        let hidden = model.hidden_states(
            tokens,
            &pos,
            tokens.len(),
            &self.first_valid,
            Some(&mut self.cache),
            false,
        )?;
        for p in &mut self.next_pos {
            *p += 1;
        }
        Ok(model.logits(&hidden, Some(&self.cache))?.to_vec2()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-4)
    }

    /// Greedy tokens of `prompt` decoded alone for `steps` steps.
    fn alone(model: &Transformer, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
        let (mut batch, mut logits) =
            DecodeBatch::prefill(model, &[prompt], 0, steps, None).unwrap();
        let mut out = vec![logits[0].clone()];
        for _ in 0..steps {
            let next = argmax(&logits[0]);
            logits = batch.step(model, &[next]).unwrap();
            out.push(logits[0].clone());
        }
        out
    }

    fn argmax(row: &[f32]) -> u32 {
        row.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
            as u32
    }

    #[test]
    fn a_row_joining_a_running_batch_decodes_as_it_would_alone() {
        let model = crate::testing::tiny_model(Family::Llama, 5).unwrap();
        let (long, short) = ([5u32, 9, 12, 40, 41, 7], [33u32, 3]);
        let want_long = alone(&model, &long, 8);
        let want_short = alone(&model, &short, 4);
        // The long one runs 3 steps, then the short one joins (shorter: padded in front), then
        // the long one leaves after step 5 and the short one's padding is trimmed.
        let (mut batch, logits) = DecodeBatch::prefill(&model, &[&long], 0, 16, None).unwrap();
        let mut rows = vec![logits[0].clone()];
        for step in 0..3 {
            rows = batch.step(&model, &[argmax(&rows[0])]).unwrap();
            assert!(close(&rows[0], &want_long[step + 1]));
        }
        let (joining, joined_logits) =
            DecodeBatch::prefill(&model, &[&short], 0, 16, None).unwrap();
        batch.append(joining).unwrap();
        assert!(close(&joined_logits[0], &want_short[0]));
        rows.push(joined_logits[0].clone());
        for step in 0..2 {
            let next: Vec<u32> = rows.iter().map(|r| argmax(r)).collect();
            rows = batch.step(&model, &next).unwrap();
            assert!(close(&rows[0], &want_long[step + 4]), "long row, step {step}");
            assert!(close(&rows[1], &want_short[step + 1]), "joined row, step {step}");
        }
        batch.select_rows(&[1]).unwrap();
        batch.trim().unwrap();
        assert_eq!(batch.cached_len(), short.len() + 2);
        let mut row = rows[1].clone();
        for step in 2..4 {
            row = batch.step(&model, &[argmax(&row)]).unwrap().remove(0);
            assert!(close(&row, &want_short[step + 1]), "after trimming, step {step}");
        }
    }
}
