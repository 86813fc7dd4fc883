//! Helpers for kernel tests: tensor differences, smooth test variables, and the check that a
//! fused kernel and its reference compute the same function (values and gradients).

use candle_core::{Device, Tensor, Var};

/// Largest absolute elementwise difference of two tensors of the same shape (test helper).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_dtype(candle_core::DType::F32))
        .and_then(|d| d.to_scalar::<f32>())
        .unwrap_or(f32::INFINITY)
}

/// A trainable 2-D tensor of smooth, distinct values (`sin(0.37·i + seed) / 2`), for kernel tests.
pub fn wave_var(shape: (usize, usize), seed: f32) -> Var {
    let values: Vec<f32> =
        (0..shape.0 * shape.1).map(|i| (i as f32 * 0.37 + seed).sin() * 0.5).collect();
    Var::from_tensor(&Tensor::from_vec(values, shape, &Device::Cpu).expect("shape matches"))
        .expect("a new variable")
}

/// Asserts that two computations of one function agree in value (within `tol`) and in the
/// gradients of a position-weighted sum with respect to each of `vars` (within `10·tol`).
pub fn assert_same_function(fused: &Tensor, plain: &Tensor, vars: &[&Var], tol: f32) {
    assert!(max_abs_diff(fused, plain) < tol, "values differ by {}", max_abs_diff(fused, plain));
    let n = fused.elem_count();
    let weights = Tensor::arange(0f32, n as f32, &Device::Cpu)
        .and_then(|w| w.reshape(fused.shape()))
        .expect("weights");
    let loss = |t: &Tensor| {
        (t * &weights).and_then(|p| p.sum_all()).and_then(|s| s.backward()).expect("backward")
    };
    let (g1, g2) = (loss(fused), loss(plain));
    for v in vars {
        let (a, b) =
            (g1.get(v.as_tensor()).expect("gradient"), g2.get(v.as_tensor()).expect("gradient"));
        assert!(max_abs_diff(a, b) < 10.0 * tol, "gradients differ by {}", max_abs_diff(a, b));
    }
}
