//! Small tensor helpers shared by the loss, mismatch and metrics modules.

use candle_core::{DType, Tensor};

use super::error::{invalid_input, Result, TensorContext};

/// Checks that `tensor` has exactly `expected` dims, naming it in the error.
pub(crate) fn check_dims(tensor: &Tensor, expected: &[usize], name: &str) -> Result<()> {
    if tensor.dims() != expected {
        return Err(invalid_input(format!(
            "{name} has shape {:?}, expected {expected:?}",
            tensor.dims()
        )));
    }
    Ok(())
}

/// The `[N, T]` dims of a per-token tensor, or an error naming it.
pub(crate) fn token_dims(tensor: &Tensor, name: &str) -> Result<(usize, usize)> {
    tensor
        .dims2()
        .map_err(|_| invalid_input(format!("{name} must be [N, T], got {:?}", tensor.dims())))
}

/// A u8 tensor that is 1 where `mask` is non-zero.
pub(crate) fn mask_predicate(mask: &Tensor) -> Result<Tensor> {
    mask.ne(0.0).ctx("building the mask predicate")
}

/// `values` where the predicate holds and 0 elsewhere, so padding (even -inf or NaN) cannot leak.
pub(crate) fn zero_outside(values: &Tensor, predicate: &Tensor) -> Result<Tensor> {
    let zeros = values.zeros_like().ctx("allocating zeros")?;
    predicate.where_cond(values, &zeros).ctx("zeroing masked-out positions")
}

/// Copies a 2-D tensor to host memory as f64 rows.
pub(crate) fn to_rows(tensor: &Tensor) -> Result<Vec<Vec<f64>>> {
    tensor
        .detach()
        .to_dtype(DType::F64)
        .and_then(|values| values.to_vec2::<f64>())
        .ctx("copying a tensor to the host")
}

/// Mean of `values` over positions where `mask` is non-zero (0 when the mask is empty).
pub fn masked_mean(values: &Tensor, mask: &Tensor) -> Result<f64> {
    let values = to_rows(values)?;
    let mask = to_rows(mask)?;
    let mut sum = 0.0;
    let mut count = 0.0;
    for (value_row, mask_row) in values.iter().zip(&mask) {
        for (value, weight) in value_row.iter().zip(mask_row) {
            if *weight != 0.0 {
                sum += value;
                count += 1.0;
            }
        }
    }
    Ok(if count > 0.0 { sum / count } else { 0.0 })
}
