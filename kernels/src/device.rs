//! The device path of the trainable forward: RMS norm and the attention softmax as single fused
//! kernels in the forward (candle's CUDA `rmsnorm` and `softmax` kernels on a GPU; plain loops on
//! the CPU), each with a backward composed of candle tensor ops, so the gradients are the same
//! code on every device. This is what a CUDA worker runs, and what the CPU tests run when the
//! model is switched to `Kernels::Device` (verity-worker). Both compute in f32 whatever the input
//! dtype (bf16 activations under mixed precision) and return the input's dtype.
//!
//! The CUDA launches follow candle-nn 0.11's `softmax_last_dim` and `rms_norm` (which have no
//! backward); the kernels are candle's own (`candle_kernels::REDUCE`).

use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, D,
};

/// RMS norm `x / sqrt(mean(x²) + eps) * w` over the last dim, computed in f32 and returned in
/// `x`'s dtype; differentiable in `x` and `w`.
pub fn rms_norm_device(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let dtype = x.dtype();
    let x32 = x.to_dtype(DType::F32)?.contiguous()?;
    let w32 = w.to_dtype(DType::F32)?.contiguous()?;
    if x32.dim(D::Minus1)? != w32.elem_count() {
        bail!("rms_norm: x is {:?}, weight {:?}", x.dims(), w.dims());
    }
    x32.apply_op2(&w32, RmsNormF32 { eps })?.to_dtype(dtype)
}

/// `softmax(scale * q k^T + mask) v` for `q (B, H, Tq, Dh)`, `k`, `v` `(B, Hkv, Tk, Dh)` and an
/// additive f32 `mask (B, Tq, Tk)`; the scores and their softmax are f32, the products run in
/// the inputs' dtype. Returns `(B * Tq, H * Dh)`, differentiable in `q`, `k`, `v`.
pub fn attention_device(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    scale: f32,
) -> Result<Tensor> {
    let mask = mask.to_dtype(DType::F32)?.unsqueeze(1)?;
    super::attention_train::attention_composed(q, k, v, |scores| {
        let x = (scores.to_dtype(DType::F32)? * scale as f64)?.broadcast_add(&mask)?;
        softmax_last_dim(&x)?.to_dtype(q.dtype())
    })
}

/// Softmax over the last dim (f32 in and out) with a composed backward.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if x.dtype() != DType::F32 {
        bail!("softmax_last_dim: expects f32, got {:?}", x.dtype());
    }
    x.contiguous()?.apply_op1(SoftmaxF32)
}

/// The contiguous f32 data of a CPU storage.
fn cpu_f32<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else { bail!("expects f32") };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => bail!("expects a contiguous tensor"),
    }
}

/// Rows and columns of a tensor over its last dim.
fn rows_cols(l: &Layout) -> Result<(usize, usize)> {
    let cols = *l.dims().last().ok_or_else(|| candle_core::Error::Msg("scalar input".into()))?;
    if cols == 0 {
        bail!("empty last dim");
    }
    Ok((l.shape().elem_count() / cols, cols))
}

struct SoftmaxF32;

impl CustomOp1 for SoftmaxF32 {
    fn name(&self) -> &'static str {
        "verity-softmax-last-dim"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_f32(s, l)?;
        let (_, cols) = rows_cols(l)?;
        let mut out = vec![0f32; x.len()];
        for (o, r) in out.chunks_mut(cols).zip(x.chunks(cols)) {
            let max = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if max == f32::NEG_INFINITY {
                continue; // a fully masked row: zeros
            }
            let mut sum = 0f32;
            for (o, &v) in o.iter_mut().zip(r) {
                *o = (v - max).exp();
                sum += *o;
            }
            o.iter_mut().for_each(|o| *o /= sum);
        }
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{kernels, WrapErr};
        let (rows, cols) = rows_cols(l)?;
        let dev = s.device().clone();
        let src = s.as_cuda_slice::<f32>()?;
        let src = match l.contiguous_offsets() {
            Some((a, b)) => src.slice(a..b),
            None => bail!("softmax: input must be contiguous"),
        };
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (1, 32, 1),
            shared_mem_bytes: 0,
        };
        let func = dev.get_or_load_func("softmax_f32", &kernels::REDUCE)?;
        // SAFETY: every element is written by the kernel.
        let dst = unsafe { dev.alloc::<f32>(rows * cols)? };
        let mut builder = func.builder();
        builder.arg(&src);
        builder.arg(&dst);
        candle_core::builder_arg!(builder, cols as i32);
        // SAFETY: the arguments match the kernel's signature (candle-nn launches it the same way).
        unsafe { builder.launch(cfg) }.w()?;
        Ok((candle_core::CudaStorage::wrap_cuda_slice(dst, dev), l.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        // dx = y ⊙ (dy − Σ_j dy_j y_j)
        let dot = (dy * y)?.sum_keepdim(D::Minus1)?;
        Ok(Some((y * dy.broadcast_sub(&dot)?)?))
    }
}

struct RmsNormF32 {
    eps: f32,
}

impl CustomOp2 for RmsNormF32 {
    fn name(&self) -> &'static str {
        "verity-rms-norm"
    }

    fn cpu_fwd(
        &self,
        sx: &CpuStorage,
        lx: &Layout,
        sw: &CpuStorage,
        lw: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (cpu_f32(sx, lx)?, cpu_f32(sw, lw)?);
        let (_, cols) = rows_cols(lx)?;
        if w.len() != cols {
            bail!("rms_norm: weight has {} values for rows of {cols}", w.len());
        }
        let mut out = vec![0f32; x.len()];
        for (o, r) in out.chunks_mut(cols).zip(x.chunks(cols)) {
            let ms = r.iter().map(|v| v * v).sum::<f32>() / cols as f32;
            let inv = 1.0 / (ms + self.eps).sqrt();
            for ((o, &v), &g) in o.iter_mut().zip(r).zip(w) {
                *o = v * inv * g;
            }
        }
        Ok((CpuStorage::F32(out), lx.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        sx: &candle_core::CudaStorage,
        lx: &Layout,
        sw: &candle_core::CudaStorage,
        lw: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{kernels, WrapErr};
        let (rows, cols) = rows_cols(lx)?;
        let dev = sx.device().clone();
        let (x, w) = (sx.as_cuda_slice::<f32>()?, sw.as_cuda_slice::<f32>()?);
        let (Some((xa, xb)), Some((wa, wb))) = (lx.contiguous_offsets(), lw.contiguous_offsets())
        else {
            bail!("rms_norm: inputs must be contiguous")
        };
        let (x, w) = (x.slice(xa..xb), w.slice(wa..wb));
        let block = if cols < 1024 { 32 } else { 1024 };
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let func = dev.get_or_load_func("rmsnorm_f32", &kernels::REDUCE)?;
        // SAFETY: every element is written by the kernel.
        let dst = unsafe { dev.alloc::<f32>(rows * cols)? };
        let mut builder = func.builder();
        builder.arg(&x);
        builder.arg(&dst);
        builder.arg(&w);
        candle_core::builder_arg!(builder, cols as i32, block as i32, self.eps);
        // SAFETY: the arguments match the kernel's signature (candle-nn launches it the same way).
        unsafe { builder.launch(cfg) }.w()?;
        Ok((candle_core::CudaStorage::wrap_cuda_slice(dst, dev), lx.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // With r = 1/sqrt(mean(x²)+eps) and x̂ = x r:  dw = Σ_rows dy ⊙ x̂,
        // dx = r ⊙ (g − x̂ ⊙ mean(g ⊙ x̂)) where g = dy ⊙ w.
        let r = (x.sqr()?.mean_keepdim(D::Minus1)? + self.eps as f64)?.sqrt()?.recip()?;
        let xhat = x.broadcast_mul(&r)?;
        let cols = x.dim(D::Minus1)?;
        let dw = (dy * &xhat)?.reshape(((), cols))?.sum(0)?;
        let g = dy.broadcast_mul(w)?;
        let inner = (&g * &xhat)?.mean_keepdim(D::Minus1)?;
        let dx = (g - xhat.broadcast_mul(&inner)?)?.broadcast_mul(&r)?;
        Ok((Some(dx), Some(dw)))
    }
}
