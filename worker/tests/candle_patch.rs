//! Verity's patch to candle's backward pass (vendor/VERITY-PATCH.md) is in effect: these tests
//! fail against the unpatched candle-core 0.11.1.

use candle_core::{Device, Tensor, Var};

fn values(t: &Tensor) -> Vec<f32> {
    t.to_vec1().unwrap()
}

/// A constant (a tensor that records no operation and is not a variable) gets no gradient: a
/// product with a variable, on either side, and a sum with it. Upstream stored `grad * x` as the
/// constant's gradient, a tensor never read that references `x` and so the forward graph.
#[test]
fn constants_get_no_gradient() {
    let x = Var::new(&[1f32, 2., 3.], &Device::Cpu).unwrap();
    let c = Tensor::new(&[4f32, 5., 6.], &Device::Cpu).unwrap();
    let d = Tensor::new(&[0.5f32, 0.5, 0.5], &Device::Cpu).unwrap();
    // y = sum(x ⊙ c) + sum(d ⊙ x) + sum(x + d): dy/dx = c + d + 1.
    let y = ((x.as_tensor() * &c).unwrap().sum_all().unwrap()
        + (&d * x.as_tensor()).unwrap().sum_all().unwrap()
        + (x.as_tensor() + &d).unwrap().sum_all().unwrap())
    .unwrap();
    let grads = y.backward().unwrap();

    assert_eq!(values(grads.get(x.as_tensor()).unwrap()), vec![5.5, 6.5, 7.5]);
    assert!(grads.get(&c).is_none(), "a gradient was stored for the constant rhs of a mul");
    assert!(grads.get(&d).is_none(), "a gradient was stored for the constant lhs of a mul");
    // Nothing else is left behind: every node's gradient is taken out as the backward passes it.
    assert_eq!(grads.get_ids().count(), 1);
}

/// The layer-by-layer backward of `model::tape` continues the chain rule with
/// `sum(end ⊙ upstream)`, `upstream` a constant: `end`'s segment gets its gradients, and nothing
/// is kept for `upstream` (upstream candle kept `ones ⊙ end`, holding the segment alive).
#[test]
fn a_constant_upstream_gradient_keeps_nothing() {
    let x = Var::new(&[1f32, -2., 3.], &Device::Cpu).unwrap();
    let end = x.as_tensor().sqr().unwrap();
    let upstream = Tensor::new(&[0.25f32, 1., -1.], &Device::Cpu).unwrap();
    let grads = (&end * &upstream).unwrap().sum_all().unwrap().backward().unwrap();

    // d/dx sum(x² ⊙ u) = 2 x ⊙ u.
    assert_eq!(values(grads.get(x.as_tensor()).unwrap()), vec![0.5, -4., -6.]);
    assert!(grads.get(&upstream).is_none());
    assert_eq!(grads.get_ids().count(), 1);
}

/// A tensor's first gradient contribution is stored as it is instead of being added to a fresh
/// tensor of zeros: both operands of an `add` get the very same tensor (upstream: each its own
/// `zeros + grad`), with unchanged values.
#[test]
fn a_first_gradient_contribution_is_stored_as_it_is() {
    let a = Var::new(&[1f32, 2.], &Device::Cpu).unwrap();
    let b = Var::new(&[3f32, 4.], &Device::Cpu).unwrap();
    let y = (a.as_tensor() + b.as_tensor()).unwrap().sqr().unwrap().sum_all().unwrap();
    let grads = y.backward().unwrap();

    let (ga, gb) = (grads.get(a.as_tensor()).unwrap(), grads.get(b.as_tensor()).unwrap());
    // d/da (a + b)² = 2 (a + b), and the same for b.
    assert_eq!(values(ga), vec![8., 12.]);
    assert_eq!(values(gb), vec![8., 12.]);
    let (sa, _) = ga.storage_and_layout();
    let (sb, _) = gb.storage_and_layout();
    assert!(std::ptr::eq(&*sa, &*sb), "the two gradients are separate copies");
}

/// `Tensor::detach_as_var` (added by the patch) makes a variable of a tensor's values without
/// copying them, where `Var::from_tensor` copies: the layer-by-layer backward cuts its graph at
/// every layer this way, so no layer input is held twice. The variable gets its gradient.
#[test]
fn a_tensor_becomes_a_variable_without_a_copy() {
    let x = Var::new(&[1f32, -2., 3.], &Device::Cpu).unwrap();
    let end = x.as_tensor().sqr().unwrap();
    let leaf = Var::from_tensor(&end.detach_as_var()).unwrap();
    assert!(leaf.as_tensor().is_variable());
    let shares = |a: &Tensor, b: &Tensor| {
        let (sa, _) = a.storage_and_layout();
        let (sb, _) = b.storage_and_layout();
        std::ptr::eq(&*sa, &*sb)
    };
    assert!(shares(leaf.as_tensor(), &end), "the variable holds its own copy");
    assert!(!shares(Var::from_tensor(&end).unwrap().as_tensor(), &end));
    assert_eq!(values(leaf.as_tensor()), vec![1., 4., 9.]);
    let grads = (leaf.as_tensor() * 2.0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(values(grads.get(leaf.as_tensor()).unwrap()), vec![2., 2., 2.]);
    assert!(grads.get(x.as_tensor()).is_none(), "the variable starts a new graph");
}
