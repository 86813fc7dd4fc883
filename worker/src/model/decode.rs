//! Rows decoding together over one KV cache: the step loop shared by the rollout sampler
//! ([`crate::sampler::sample`]) and the serving engine's continuous batches.
//!
//! Rows are left-padded to a common cache length; each row remembers its first real key and
//! its next RoPE position, so rows of different lengths (and rows admitted later) decode in one
//! forward per step. A row may pause (an episode waiting for a tool): it stays in the batch, the
//! cache positions written while it waits are hidden from it, and it resumes at its own next
//! position, so no cache is copied for it.

use super::compact::CompactWeights;
use super::inputs::{PaddedBatch, VisibleKeys};
use super::kv_cache::KvCache;
use super::Transformer;
use crate::error::{Result, WorkerError};
use candle_core::Tensor;
use std::ops::Range;
use std::sync::Arc;

/// A batch of sequences being decoded one token per step.
pub struct DecodeBatch {
    cache: KvCache,
    first_valid: Vec<usize>,
    next_pos: Vec<u32>,
    /// Cache positions each row skipped while paused.
    hidden: Vec<Vec<Range<usize>>>,
    /// Where each paused row's pause began (its first skipped position).
    paused: Vec<Option<usize>>,
}

impl DecodeBatch {
    /// Prefills the (left-padded) prompts, reserving room for `extra` decoded positions;
    /// returns the batch and each row's next-token logits. `compact` weight copies (bf16
    /// or int8 rollouts) serve every forward through the batch when given.
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
        let rows = prompts.len();
        let batch = DecodeBatch {
            cache,
            first_valid: pb.pads,
            next_pos,
            hidden: vec![Vec::new(); rows],
            paused: vec![None; rows],
        };
        Ok((batch, logits))
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
        self.hidden = rows.iter().map(|&r| self.hidden[r].clone()).collect();
        self.paused = rows.iter().map(|&r| self.paused[r]).collect();
        Ok(())
    }

    /// Pauses `row`: from the next step on it is fed a placeholder that it never sees, and its
    /// position does not advance, until [`DecodeBatch::resume`].
    pub fn pause(&mut self, row: usize) -> Result<()> {
        let len = self.cache.len();
        let paused = self.paused.get_mut(row).ok_or_else(|| outside(row))?;
        paused.get_or_insert(len);
        Ok(())
    }

    /// Resumes a paused `row`: the positions written while it waited stay hidden from it, and
    /// its next token goes at its own next position.
    pub fn resume(&mut self, row: usize) -> Result<()> {
        let len = self.cache.len();
        let start = self.paused.get_mut(row).ok_or_else(|| outside(row))?.take();
        if let Some(start) = start.filter(|&s| s < len) {
            self.hidden[row].push(start..len);
        }
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
        self.shift_rows(0..self.rows(), common, false);
        Ok(())
    }

    /// Moves the recorded cache positions of `rows` by `by`, forward or back.
    fn shift_rows(&mut self, rows: Range<usize>, by: usize, forward: bool) {
        let shift = |p: usize| if forward { p + by } else { p - by };
        for r in rows {
            self.first_valid[r] = shift(self.first_valid[r]);
            for range in &mut self.hidden[r] {
                *range = shift(range.start)..shift(range.end);
            }
            if let Some(start) = self.paused[r].as_mut() {
                *start = shift(*start);
            }
        }
    }

    /// Appends the rows of `other` after this batch's rows (continuous batching: a newly
    /// prefilled request joins between decode steps).
    pub fn append(&mut self, other: DecodeBatch) -> Result<()> {
        if self.rows() == 0 {
            *self = other;
            return Ok(());
        }
        let (pad_self, pad_other) = self.cache.append_rows(other.cache)?;
        let (mine, theirs) = (self.rows(), other.first_valid.len());
        self.first_valid.extend(other.first_valid);
        self.next_pos.extend(other.next_pos);
        self.hidden.extend(other.hidden);
        self.paused.extend(other.paused);
        self.shift_rows(0..mine, pad_self, true);
        self.shift_rows(mine..mine + theirs, pad_other, true);
        Ok(())
    }

    /// Feeds one token per row (at each row's next position) and returns each row's
    /// next-token logits.
    pub fn step(&mut self, model: &Transformer, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        if tokens.len() != self.rows() || tokens.is_empty() {
            return Err(WorkerError::InvalidArgument("one token per row".into()));
        }
        let pos = self.next_pos.clone();
        let any_hidden =
            self.paused.iter().any(Option::is_some) || self.hidden.iter().any(|h| !h.is_empty());
        let hidden_positions: Vec<Vec<Range<usize>>> = if any_hidden {
            (0..self.rows())
                .map(|r| {
                    let open = self.paused[r].map(|start| start..usize::MAX);
                    self.hidden[r].iter().cloned().chain(open).collect()
                })
                .collect()
        } else {
            Vec::new()
        };
        let keys = VisibleKeys { first_valid: &self.first_valid, hidden: &hidden_positions };
        let states = model.hidden_states_of(
            tokens,
            &pos,
            tokens.len(),
            keys,
            Some(&mut self.cache),
            false,
        )?;
        for (p, paused) in self.next_pos.iter_mut().zip(&self.paused) {
            if paused.is_none() {
                *p += 1;
            }
        }
        Ok(model.logits(&states, Some(&self.cache))?.to_vec2()?)
    }
}

fn outside(row: usize) -> WorkerError {
    WorkerError::InvalidArgument(format!("row {row} is outside the batch"))
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

    /// A row that pauses for three steps (fed placeholders while the other row decodes) and
    /// then resumes decodes exactly as it would alone, also after a new row joins the batch
    /// (which shifts the positions it hides) and after the batch is trimmed.
    #[test]
    fn a_paused_row_resumes_as_if_it_had_not_waited() {
        let model = crate::testing::tiny_model(Family::Llama, 5).unwrap();
        let (a, b, c) = ([5u32, 9, 12, 40], [33u32, 3, 17], [7u32, 8]);
        let (want_a, want_b, want_c) =
            (alone(&model, &a, 7), alone(&model, &b, 10), alone(&model, &c, 3));
        let (mut batch, logits) = DecodeBatch::prefill(&model, &[&a, &b], 0, 4, None).unwrap();
        let mut last = logits;
        let mut a_steps = 0;
        for step in 0..10 {
            if step == 2 {
                batch.pause(0).unwrap();
            }
            if step == 5 {
                batch.resume(0).unwrap();
            }
            if step == 6 {
                let (joining, joined) = DecodeBatch::prefill(&model, &[&c], 0, 4, None).unwrap();
                batch.append(joining).unwrap();
                assert!(close(&joined[0], &want_c[0]));
                last.push(joined[0].clone());
            }
            if step == 9 {
                batch.select_rows(&[0, 1]).unwrap();
                batch.trim().unwrap();
                last.truncate(2);
            }
            let paused = (2..5).contains(&step);
            let feed: Vec<u32> = last
                .iter()
                .enumerate()
                .map(|(r, l)| if r == 0 && paused { 0 } else { argmax(l) })
                .collect();
            let out = batch.step(&model, &feed).unwrap();
            assert!(close(&out[1], &want_b[step + 1]), "row b, step {step}");
            if (6..9).contains(&step) {
                assert!(close(&out[2], &want_c[step - 5]), "row c, step {step}");
            }
            if paused {
                last = vec![last[0].clone()].into_iter().chain(out.into_iter().skip(1)).collect();
                continue;
            }
            a_steps += 1;
            assert!(close(&out[0], &want_a[a_steps]), "row a, step {step}");
            last = out;
        }
        assert_eq!(a_steps, 7);
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
