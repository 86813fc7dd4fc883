//! Additive attention masks of a left-padded batch: which keys each query may see.

use candle_core::{Device, Result, Tensor};

/// Additive attention mask `(batch, tq, past + tq)`: query `i` of row `b` sees keys
/// `first_valid[b] ..= past + i`; a pad query (before `first_valid`) sees only itself.
pub fn attention_mask(
    first_valid: &[usize],
    past: usize,
    tq: usize,
    device: &Device,
) -> Result<Tensor> {
    attention_mask_hiding(first_valid, &[], past, tq, device)
}

/// [`attention_mask`] where row `b` also does not see the keys at the positions in
/// `hidden[b]` (rows beyond `hidden`'s length hide nothing): the positions a decoding row
/// skipped while it waited for a tool. A query that would see no key still sees itself.
pub fn attention_mask_hiding(
    first_valid: &[usize],
    hidden: &[Vec<std::ops::Range<usize>>],
    past: usize,
    tq: usize,
    device: &Device,
) -> Result<Tensor> {
    let tk = past + tq;
    let mut m = vec![f32::NEG_INFINITY; first_valid.len() * tq * tk];
    for (b, &fv) in first_valid.iter().enumerate() {
        for i in 0..tq {
            let q = past + i;
            let row = &mut m[(b * tq + i) * tk..(b * tq + i + 1) * tk];
            if q < fv {
                row[q] = 0.0;
                continue;
            }
            row[fv..=q].iter_mut().for_each(|x| *x = 0.0);
            let Some(ranges) = hidden.get(b).filter(|r| !r.is_empty()) else { continue };
            for range in ranges {
                row[range.start.min(tk)..range.end.min(tk)].fill(f32::NEG_INFINITY);
            }
            if row.iter().all(|x| x.is_infinite()) {
                row[q] = 0.0;
            }
        }
    }
    Tensor::from_vec(m, (first_valid.len(), tq, tk), device)
}

/// `mask` `(batch, tq, tk)`, whose queries are the last `tq` of the `tk` keys, with every key
/// `window` or more positions before its query hidden too (sliding-window attention: a query
/// sees itself and the `window - 1` keys before it). Unchanged when no query reaches that far.
pub fn sliding_window(mask: &Tensor, window: usize) -> Result<Tensor> {
    let (_, tq, tk) = mask.dims3()?;
    if tk <= window {
        return Ok(mask.clone());
    }
    let past = tk - tq;
    let band: Vec<f32> = (0..tq * tk)
        .map(|n| {
            let (q, key) = (past + n / tk, n % tk);
            if q >= key + window {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    mask.broadcast_add(&Tensor::from_vec(band, (1, tq, tk), mask.device())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_window_hides_keys_that_far_back() {
        let inf = f32::NEG_INFINITY;
        let causal = attention_mask(&[0], 2, 2, &Device::Cpu).unwrap();
        let m: Vec<Vec<Vec<f32>>> = sliding_window(&causal, 2).unwrap().to_vec3().unwrap();
        assert_eq!(m[0][0], [inf, 0.0, 0.0, inf], "query 2 sees keys 1 and 2");
        assert_eq!(m[0][1], [inf, inf, 0.0, 0.0], "query 3 sees keys 2 and 3");
        let wide = sliding_window(&causal, 4).unwrap();
        assert_eq!(wide.to_vec3::<f32>().unwrap(), causal.to_vec3::<f32>().unwrap());
    }

    #[test]
    fn masks_hide_pads_and_the_future() {
        let m: Vec<Vec<Vec<f32>>> =
            attention_mask(&[2], 0, 4, &Device::Cpu).unwrap().to_vec3().unwrap();
        let inf = f32::NEG_INFINITY;
        assert_eq!(m[0][0], [0.0, inf, inf, inf]);
        assert_eq!(m[0][2], [inf, inf, 0.0, inf]);
        assert_eq!(m[0][3], [inf, inf, 0.0, 0.0]);
    }

    #[test]
    fn hidden_positions_are_masked_and_a_query_always_sees_a_key() {
        let inf = f32::NEG_INFINITY;
        // row 0 skipped positions 2..4 and is past them; row 1 hides nothing; row 2 is paused
        // from position 1 on (its own query is hidden too, so it sees only what came before)
        let one = |range: std::ops::Range<usize>| vec![range];
        let hidden = [one(2..4), vec![], one(1..usize::MAX)];
        let m: Vec<Vec<Vec<f32>>> = attention_mask_hiding(&[0, 1, 0], &hidden, 5, 1, &Device::Cpu)
            .unwrap()
            .to_vec3()
            .unwrap();
        assert_eq!(m[0][0], [0.0, 0.0, inf, inf, 0.0, 0.0]);
        assert_eq!(m[1][0], [inf, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(m[2][0], [0.0, inf, inf, inf, inf, inf]);
        let alone = attention_mask_hiding(&[0], &[one(0..usize::MAX)], 2, 1, &Device::Cpu);
        let alone: Vec<Vec<Vec<f32>>> = alone.unwrap().to_vec3().unwrap();
        assert_eq!(alone[0][0], [inf, inf, 0.0], "a query that would see nothing sees itself");
    }
}
