//! The row layout of a scoring batch in which completions that share a prompt share its forward:
//! each distinct prompt's tokens appear once, followed by its completions (right-padded to a
//! common width). A GRPO micro-batch holds G samples of each prompt, so the prompt part of the
//! model runs once per group instead of G times.

use crate::error::{Result, WorkerError};
use std::collections::HashMap;

/// One distinct prompt and the completions that continue it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptGroup {
    /// First row of the prompt's tokens.
    pub offset: usize,
    /// Prompt length (rows `offset .. offset + prompt_len`).
    pub prompt_len: usize,
    /// Indices (in the caller's order) of the completions in this group.
    pub members: Vec<usize>,
    /// Completion rows per member: its tokens but the last (which predicts nothing), right-padded.
    pub width: usize,
}

impl PromptGroup {
    /// First row of the completion rows (member `m` occupies `width` rows from `+ m * width`).
    pub fn completion_offset(&self) -> usize {
        self.offset + self.prompt_len
    }

    /// Rows this group occupies.
    pub fn rows(&self) -> usize {
        self.prompt_len + self.members.len() * self.width
    }
}

/// Prompts and completions laid out as rows, one copy of each distinct prompt.
#[derive(Debug, Clone)]
pub struct PromptGroups {
    /// Token id of every row.
    pub ids: Vec<u32>,
    /// RoPE position of every row (prompt tokens from 0, completion tokens after their prompt).
    pub positions: Vec<u32>,
    /// The groups, in order of each prompt's first appearance.
    pub groups: Vec<PromptGroup>,
    /// For completion `i`, token `j`: the row whose hidden state predicts it
    /// (`predicting_rows[i][j]`).
    pub predicting_rows: Vec<Vec<u32>>,
}

impl PromptGroups {
    /// Lays out `completions[i]` after `prompts[i]`; identical prompts are stored once. Prompts
    /// must be non-empty; completions may be empty.
    pub fn new(prompts: &[Vec<u32>], completions: &[Vec<u32>], pad_id: u32) -> Result<Self> {
        if prompts.len() != completions.len() || prompts.iter().any(Vec::is_empty) {
            return Err(WorkerError::InvalidArgument(
                "need one non-empty prompt per completion".into(),
            ));
        }
        let mut index: HashMap<&[u32], usize> = HashMap::new();
        let mut members: Vec<(&[u32], Vec<usize>)> = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let g = *index.entry(p.as_slice()).or_insert_with(|| {
                members.push((p.as_slice(), Vec::new()));
                members.len() - 1
            });
            members[g].1.push(i);
        }
        let mut out = Self {
            ids: Vec::new(),
            positions: Vec::new(),
            groups: Vec::with_capacity(members.len()),
            predicting_rows: vec![Vec::new(); completions.len()],
        };
        for (prompt, members) in members {
            let width =
                members.iter().map(|&i| completions[i].len()).max().unwrap_or(0).saturating_sub(1);
            let group =
                PromptGroup { offset: out.ids.len(), prompt_len: prompt.len(), members, width };
            out.ids.extend_from_slice(prompt);
            out.positions.extend(0..prompt.len() as u32);
            for (m, &i) in group.members.iter().enumerate() {
                let c = &completions[i];
                let fed = &c[..c.len().saturating_sub(1)];
                out.ids.extend_from_slice(fed);
                out.ids.extend(std::iter::repeat_n(pad_id, group.width - fed.len()));
                out.positions.extend((0..group.width as u32).map(|j| prompt.len() as u32 + j));
                let first = group.completion_offset() + m * group.width;
                out.predicting_rows[i] = (0..c.len())
                    .map(|j| if j == 0 { group.completion_offset() - 1 } else { first + j - 1 } as u32)
                    .collect();
            }
            out.groups.push(group);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prompts_are_laid_out_once_and_rows_predict_the_next_token() {
        let prompts = vec![vec![1, 2], vec![5], vec![1, 2]];
        let completions = vec![vec![3, 4, 9], vec![6, 7], vec![8]];
        let g = PromptGroups::new(&prompts, &completions, 0).unwrap();
        // [1 2 | 3 4 | 8 0] [5 | 6]
        assert_eq!(g.ids, [1, 2, 3, 4, 0, 0, 5, 6]);
        assert_eq!(g.positions, [0, 1, 2, 3, 2, 3, 0, 1]);
        assert_eq!(g.groups.len(), 2);
        assert_eq!(
            g.groups[0],
            PromptGroup { offset: 0, prompt_len: 2, members: vec![0, 2], width: 2 }
        );
        assert_eq!(
            g.groups[1],
            PromptGroup { offset: 6, prompt_len: 1, members: vec![1], width: 1 }
        );
        // Token 3 is predicted by the prompt's last row (1), 4 by row 2 (token 3), 9 by row 3.
        assert_eq!(g.predicting_rows, vec![vec![1, 2, 3], vec![6, 7], vec![1]]);
        for (i, rows) in g.predicting_rows.iter().enumerate() {
            for (j, &r) in rows.iter().enumerate().skip(1) {
                assert_eq!(
                    g.ids[r as usize],
                    completions[i][j - 1],
                    "row {r} holds the previous token"
                );
            }
        }
    }

    #[test]
    fn empty_completions_and_mismatched_inputs() {
        let g = PromptGroups::new(&[vec![4, 5]], &[vec![]], 0).unwrap();
        assert_eq!(g.ids, [4, 5]);
        assert_eq!(g.groups[0].width, 0);
        assert!(g.predicting_rows[0].is_empty());
        assert!(PromptGroups::new(&[vec![]], &[vec![1]], 0).is_err());
        assert!(PromptGroups::new(&[vec![1]], &[], 0).is_err());
    }
}
