//! Layer-by-layer back-propagation. The trainable forward cuts its graph at the input of every
//! decoder layer; the backward then runs one segment at a time, from the loss back to the
//! embedding, and frees each segment's activations as soon as its gradients are out. The
//! gradients are the same as one backward over the whole graph (sums are only regrouped), but
//! the activations of all layers and the gradients of all weights are never held at once.

use crate::error::Result;
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

/// The cuts of one tracked forward: for each, the tensor that ended the segment before it and
/// the fresh leaf the next segment started from.
#[derive(Default)]
pub struct Tape {
    cuts: Vec<(Tensor, Var)>,
}

impl Tape {
    /// Cuts the graph at `x`: returns a leaf holding the same values (the same memory, not a
    /// copy) that the forward goes on from. A tensor that records no operation is returned as is
    /// (nothing before it trains).
    pub fn cut(&mut self, x: Tensor) -> Result<Tensor> {
        if !x.track_op() {
            return Ok(x);
        }
        let leaf = Var::from_tensor(&x.detach_as_var())?;
        let next = leaf.as_tensor().clone();
        self.cuts.push((x, leaf));
        Ok(next)
    }

    /// Back-propagates the scalar `loss` (built from the forward that recorded this tape) and
    /// hands the gradients of each segment's parameters to `sink`, last segment first; summed,
    /// they are what `loss.backward()` over the uncut graph gives. A parameter used in several
    /// segments (a tied embedding) reaches `sink` once per segment, so `sink` must add.
    pub fn backward(
        self,
        loss: &Tensor,
        mut sink: impl FnMut(GradStore) -> Result<()>,
    ) -> Result<()> {
        let mut grads = loss.backward()?;
        for (end, leaf) in self.cuts.into_iter().rev() {
            let upstream = grads.remove(leaf.as_tensor());
            sink(grads)?;
            drop(leaf);
            let Some(upstream) = upstream else {
                return Ok(());
            };
            // d(sum(end ⊙ g))/d(end) = g continues the chain rule through the earlier segment;
            // dropping `end` afterwards frees that segment's activations (`g` records nothing,
            // so no gradient is kept for it: see vendor/VERITY-PATCH.md).
            grads = (end * upstream)?.sum_all()?.backward()?;
        }
        sink(grads)
    }
}
