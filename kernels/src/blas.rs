//! Single-precision matrix products through the machine's OpenBLAS when it can be loaded at run
//! time, else the `gemm` crate candle uses.
//!
//! On the 2-core AMD EPYC test machine OpenBLAS 0.3 reaches ~145–165 GFLOP/s on the model's
//! shapes where `gemm` reaches ~70, and matrix products are three quarters of a training step.
//! Nothing links against BLAS: `libopenblas.so.0` (Debian/Ubuntu `libopenblas0`) is opened on
//! first use; where the machine has none, the OpenBLAS build a caller registered with
//! [`set_fetched_openblas`] (the worker fetches SciPy's, `scipy-openblas32`, from PyPI once).
//! `VERITY_BLAS=/path/to/libopenblas.so` picks another build, `VERITY_BLAS=pypi` the fetched
//! one only, `VERITY_BLAS=off` keeps everything on `gemm`.

use super::{f32_slice, use_cpu_kernel};
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::OnceLock;

/// `cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`.
type CblasSgemm = unsafe extern "C" fn(
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    f32,
    *const f32,
    i32,
    *const f32,
    i32,
    f32,
    *mut f32,
    i32,
);

const CBLAS_ROW_MAJOR: i32 = 101;
const CBLAS_NO_TRANS: i32 = 111;
const CBLAS_TRANS: i32 = 112;

/// A loaded BLAS library and its `cblas_sgemm`.
struct Blas {
    sgemm: CblasSgemm,
    /// The kernel family OpenBLAS chose (`openblas_get_corename`), when it says.
    core: Option<String>,
    /// The family Verity asked for through `OPENBLAS_CORETYPE` (none when the user set it).
    requested_core: Option<&'static str>,
    /// The library's file or soname, as it was opened.
    name: String,
    _library: libloading::Library,
}

static BLAS: OnceLock<Option<Blas>> = OnceLock::new();

/// Fetches an OpenBLAS shared library to the given path (an error says why it could not).
pub type FetchOpenblas = fn(&std::path::Path) -> std::result::Result<(), String>;

/// An OpenBLAS build kept by Verity: where it is, and how to get it when it is not there.
struct FetchedOpenblas {
    path: std::path::PathBuf,
    fetch: Option<FetchOpenblas>,
}

static FETCHED: OnceLock<FetchedOpenblas> = OnceLock::new();

/// Registers the OpenBLAS build at `path`, tried when no system OpenBLAS loads (and alone with
/// `VERITY_BLAS=pypi`); `fetch`, if given, gets it there first when it is missing. Call before
/// the first matrix product; only the first registration counts.
pub fn set_fetched_openblas(path: std::path::PathBuf, fetch: Option<FetchOpenblas>) {
    let _ = FETCHED.set(FetchedOpenblas { path, fetch });
}

/// The registered build's path when it is there, fetching it first if it may.
fn fetched_openblas() -> Option<String> {
    let fetched = FETCHED.get()?;
    if !fetched.path.is_file() {
        let fetch = fetched.fetch?;
        tracing::info!(path = %fetched.path.display(), "no OpenBLAS on this machine: fetching SciPy's build from PyPI (once)");
        if let Err(error) = fetch(&fetched.path) {
            tracing::warn!(%error, "OpenBLAS could not be fetched; matrix products use gemm (slower)");
            return None;
        }
    }
    Some(fetched.path.display().to_string())
}

/// The prefixes OpenBLAS builds give their symbols: none, and SciPy's wheels' `scipy_`.
const SYMBOL_PREFIXES: [&str; 2] = ["", "scipy_"];

/// `symbol` of `library` under the first prefix that has it (else the last lookup's error).
///
/// # Safety
/// `T` must be the symbol's type.
unsafe fn symbol<T: Copy>(
    library: &libloading::Library,
    symbol: &str,
) -> std::result::Result<T, libloading::Error> {
    let mut last = libloading::Error::DlSymUnknown;
    for prefix in SYMBOL_PREFIXES {
        let name = format!("{prefix}{symbol}\0");
        // SAFETY: the caller names the symbol's type.
        match unsafe { library.get::<T>(name.as_bytes()) } {
            Ok(found) => return Ok(*found),
            Err(error) => last = error,
        }
    }
    Err(last)
}

/// The BLAS in use, loading it on first call.
fn blas() -> Option<&'static Blas> {
    BLAS.get_or_init(load_blas).as_ref()
}

/// Whether matrix products go through a BLAS library.
pub fn blas_in_use() -> bool {
    blas().is_some()
}

/// The BLAS library matrix products go through (its soname or path), if any.
pub fn blas_library() -> Option<&'static str> {
    blas().map(|b| b.name.as_str())
}

/// The matrix-product backend, for benchmark reports: `openblas:<kernel family>` or `gemm`.
pub fn blas_core() -> String {
    match blas() {
        Some(b) => format!("openblas:{}", b.core.as_deref().unwrap_or("unknown")),
        None => "gemm".into(),
    }
}

/// The OpenBLAS kernel family this CPU can run, by its instruction sets.
///
/// OpenBLAS picks its kernels from the CPU model, and a model it does not know — as virtual
/// machines often report ("Intel(R) Xeon(R) Processor") — sends it to its oldest SSE3 kernels:
/// measured on such a 2-core AVX-512 VM, a training step took 19.3 s with those, 11.2 s with the
/// AVX2 ("Haswell") and 7.4 s with the AVX-512 ("SkylakeX") ones. The families named here have
/// the same single-precision kernels as OpenBLAS's newer names for these instruction sets.
fn openblas_core_for_this_cpu() -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            return Some("SkylakeX");
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Some("Haswell");
        }
    }
    None
}

fn load_blas() -> Option<Blas> {
    let requested = std::env::var("VERITY_BLAS").ok().filter(|v| !v.is_empty());
    let mut requested_core = None;
    if requested.as_deref() != Some("off") && std::env::var_os("OPENBLAS_CORETYPE").is_none() {
        if let Some(core) = openblas_core_for_this_cpu() {
            // OpenBLAS reads this when it is loaded, just below. Set once, on first use of a
            // matrix product, by the thread that loads the library.
            std::env::set_var("OPENBLAS_CORETYPE", core);
            requested_core = Some(core);
        }
    }
    let system = ["libopenblas.so.0", "libopenblas.so"];
    let candidates: Vec<String> = match requested.as_deref() {
        Some("off") => return None,
        Some("pypi") => fetched_openblas().into_iter().collect(),
        Some(path) => vec![path.to_string()],
        None => system.iter().map(|name| name.to_string()).collect(),
    };
    // The fetched build only where no system one loads (it may be fetched just then).
    let fallback = requested.is_none();
    let fetched = std::iter::once_with(move || fallback.then(fetched_openblas).flatten()).flatten();
    for name in candidates.into_iter().chain(fetched) {
        // SAFETY: loading OpenBLAS runs only its library initialisers; the symbol types below
        // are the CBLAS and OpenBLAS C interfaces.
        let loaded = unsafe {
            libloading::Library::new(&name).and_then(|library| {
                let sgemm = symbol::<CblasSgemm>(&library, "cblas_sgemm")?;
                if let Ok(set_threads) =
                    symbol::<unsafe extern "C" fn(i32)>(&library, "openblas_set_num_threads")
                {
                    // Products are split across rayon's threads (see `blas_sgemm`): one
                    // thread pool, not two contending for the same cores.
                    set_threads(1);
                }
                let core = symbol::<unsafe extern "C" fn() -> *const std::ffi::c_char>(
                    &library,
                    "openblas_get_corename",
                )
                .ok()
                .map(|corename| corename())
                .filter(|name| !name.is_null())
                .map(|name| std::ffi::CStr::from_ptr(name).to_string_lossy().into_owned());
                Ok(Blas { sgemm, core, requested_core, name: name.clone(), _library: library })
            })
        };
        match loaded {
            Ok(blas) => {
                tracing::info!(library = %name, core = ?blas.core, requested_core = ?blas.requested_core, "matrix products use BLAS");
                warn_of_older_kernels(blas.core.as_deref(), blas.requested_core);
                return Some(blas);
            }
            Err(error) if requested.is_some() => {
                tracing::warn!(library = %name, %error, "VERITY_BLAS could not be loaded; matrix products use gemm")
            }
            Err(_) => {}
        }
    }
    tracing::info!(
        "no OpenBLAS found or fetched (install libopenblas0 for faster training); matrix products use gemm"
    );
    None
}

/// Warns when `OPENBLAS_CORETYPE`, set outside Verity, holds OpenBLAS to older kernels than this
/// CPU runs (an AVX-512 CPU on the AVX2 kernels trains about 1.5× slower).
fn warn_of_older_kernels(core: Option<&str>, requested: Option<&str>) {
    let (Some(best), Some(core)) = (openblas_core_for_this_cpu(), core) else {
        return;
    };
    if requested.is_none()
        && std::env::var_os("OPENBLAS_CORETYPE").is_some()
        && !core.eq_ignore_ascii_case(best)
    {
        tracing::warn!(
            core,
            supported = best,
            "OPENBLAS_CORETYPE keeps OpenBLAS on older kernels than this CPU supports; unset it (or set it to the supported family) for faster training"
        );
    }
}

/// CBLAS transpose flag and leading dimension of a `rows × cols` operand with row stride `rs`
/// and column stride `cs`, when BLAS can read it in place.
fn operand_layout(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<(i32, i32)> {
    let ld = if cs == 1 && (rows <= 1 || rs >= cols as isize) {
        (CBLAS_NO_TRANS, rs.max(cols as isize).max(1))
    } else if rs == 1 && (cols <= 1 || cs >= rows as isize) {
        (CBLAS_TRANS, cs.max(rows as isize).max(1))
    } else {
        return None;
    };
    Some((ld.0, i32::try_from(ld.1).ok()?))
}

/// One `dst = lhs · rhs` (or `dst += lhs · rhs`) of an `m × k` by a `k × n` f32 matrix, each
/// given as a pointer with column and row strides in elements (the conventions of `gemm::gemm`).
#[derive(Debug, Clone, Copy)]
pub struct Product {
    /// Rows of `lhs` and `dst`.
    pub m: usize,
    /// Columns of `rhs` and `dst`.
    pub n: usize,
    /// Columns of `lhs`, rows of `rhs`.
    pub k: usize,
    /// The output.
    pub dst: *mut f32,
    /// Column stride of `dst`.
    pub dst_cs: isize,
    /// Row stride of `dst`.
    pub dst_rs: isize,
    /// Add to `dst` instead of overwriting it.
    pub accumulate: bool,
    /// The left operand.
    pub lhs: *const f32,
    /// Column stride of `lhs`.
    pub lhs_cs: isize,
    /// Row stride of `lhs`.
    pub lhs_rs: isize,
    /// The right operand.
    pub rhs: *const f32,
    /// Column stride of `rhs`.
    pub rhs_cs: isize,
    /// Row stride of `rhs`.
    pub rhs_rs: isize,
}

/// Computes `p`: through BLAS when it is loaded and can read the layouts, else `gemm`.
///
/// # Safety
/// Every pointer must address its whole matrix under the given strides, and `dst` must not
/// overlap the inputs.
pub unsafe fn sgemm(p: Product) {
    // SAFETY (both calls): forwarded from the caller.
    if !unsafe { blas_sgemm(&p) } {
        unsafe { gemm_sgemm(&p) };
    }
}

/// [`sgemm`] through BLAS, split across the rayon threads when large; false (nothing written)
/// when BLAS is not loaded or cannot read a layout.
unsafe fn blas_sgemm(p: &Product) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe { blas_sgemm_with(p, true) }
}

/// [`blas_sgemm`], split across threads only when `parallel`.
unsafe fn blas_sgemm_with(p: &Product, parallel: bool) -> bool {
    let (Some(blas), Ok(m), Ok(n), Ok(k)) =
        (blas(), i32::try_from(p.m), i32::try_from(p.n), i32::try_from(p.k))
    else {
        return false;
    };
    let a = operand_layout(p.m, p.k, p.lhs_rs, p.lhs_cs);
    let b = operand_layout(p.k, p.n, p.rhs_rs, p.rhs_cs);
    let c =
        operand_layout(p.m, p.n, p.dst_rs, p.dst_cs).filter(|(trans, _)| *trans == CBLAS_NO_TRANS);
    let (Some((ta, lda)), Some((tb, ldb)), Some((_, ldc)), true) =
        (a, b, c, m > 0 && n > 0 && k > 0)
    else {
        return false;
    };
    let beta = if p.accumulate { 1.0 } else { 0.0 };
    let Some(split) = Split::of(p).filter(|_| parallel) else {
        // SAFETY: the layouts were checked to address each matrix as CBLAS expects.
        unsafe {
            (blas.sgemm)(
                CBLAS_ROW_MAJOR,
                ta,
                tb,
                m,
                n,
                k,
                1.0,
                p.lhs,
                lda,
                p.rhs,
                ldb,
                beta,
                p.dst,
                ldc,
            )
        };
        return true;
    };
    // Blocks of rows of `dst` and `lhs`, or of columns of `dst` and `rhs`: one single-threaded
    // BLAS call each.
    let (total, lhs_step, rhs_step, dst_step) =
        if split.rows { (p.m, p.lhs_rs, 0, p.dst_rs) } else { (p.n, 0, p.rhs_cs, p.dst_cs) };
    let size = total.div_ceil(split.parts);
    let (lhs, rhs, dst) = (p.lhs as usize, p.rhs as usize, p.dst as usize);
    (0..split.parts).into_par_iter().for_each(|part| {
        let first = part * size;
        let count = size.min(total - first) as i32;
        let (bm, bn) = if split.rows { (count, n) } else { (m, count) };
        let at = |step: isize| first as isize * step;
        // SAFETY: the block `first..first + count` of `lhs`'s rows or `rhs`'s columns, and of
        // `dst`, lies inside the matrices the caller passed; the blocks of `dst` are disjoint.
        unsafe {
            let lhs = (lhs as *const f32).offset(at(lhs_step));
            let rhs = (rhs as *const f32).offset(at(rhs_step));
            let dst = (dst as *mut f32).offset(at(dst_step));
            (blas.sgemm)(
                CBLAS_ROW_MAJOR,
                ta,
                tb,
                bm,
                bn,
                k,
                1.0,
                lhs,
                lda,
                rhs,
                ldb,
                beta,
                dst,
                ldc,
            )
        };
    });
    true
}

/// Smallest product (multiply-adds) worth splitting across threads.
const SPLIT_MIN_WORK: usize = 1 << 20;

/// Fewest rows or columns in one block of a split product.
const SPLIT_MIN_BLOCK: usize = 16;

/// How a product is computed in parallel: in `parts` blocks of rows (or of columns).
struct Split {
    parts: usize,
    rows: bool,
}

impl Split {
    /// One block per rayon thread along the longer of `dst`'s dimensions, for products large
    /// enough; `None` to run it as one call.
    fn of(p: &Product) -> Option<Split> {
        let threads = rayon::current_num_threads().max(1);
        if p.m.saturating_mul(p.n).saturating_mul(p.k) < SPLIT_MIN_WORK {
            return None;
        }
        let rows = p.m >= p.n;
        let parts = threads.min(if rows { p.m } else { p.n } / SPLIT_MIN_BLOCK);
        (parts > 1).then_some(Split { parts, rows })
    }
}

/// [`sgemm`] on the calling thread only (one single-threaded BLAS call, else the `gemm`
/// crate): for the many small products that kernels run in parallel themselves.
///
/// # Safety
/// As for [`sgemm`].
pub unsafe fn serial_sgemm(p: Product) {
    // SAFETY (both calls): forwarded from the caller.
    if !unsafe { blas_sgemm_with(&p, false) } {
        unsafe { gemm_with(&p, gemm::Parallelism::None) }
    }
}

/// [`sgemm`] through the `gemm` crate.
unsafe fn gemm_sgemm(p: &Product) {
    // SAFETY: forwarded from the caller.
    unsafe { gemm_with(p, super::gemm_parallelism()) }
}

/// `p` through the `gemm` crate with the given threads.
unsafe fn gemm_with(p: &Product, parallelism: gemm::Parallelism) {
    // SAFETY: forwarded from the caller.
    unsafe {
        gemm::gemm(
            p.m,
            p.n,
            p.k,
            p.dst,
            p.dst_cs,
            p.dst_rs,
            p.accumulate,
            p.lhs,
            p.lhs_cs,
            p.lhs_rs,
            p.rhs,
            p.rhs_cs,
            p.rhs_rs,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    };
}

/// `x · w` for 2-D tensors, differentiable in both; through [`sgemm`] for f32 CPU tensors when
/// BLAS is in use, else `Tensor::matmul`.
pub fn matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if use_cpu_kernel(x) && use_cpu_kernel(w) && x.rank() == 2 && w.rank() == 2 && blas_in_use() {
        x.apply_op2(w, Matmul)
    } else {
        x.matmul(w)
    }
}

pub(super) struct Matmul;

/// A 2-D f32 operand checked to lie inside its data: elements from `data[0]` with row stride
/// `rs` and column stride `cs`.
#[derive(Clone, Copy)]
pub(super) struct Strided<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
}

impl<'a> Strided<'a> {
    /// `rows × cols` elements of `data` at strides `(rs, cs)`; an error if they run past its end.
    pub(super) fn new(
        data: &'a [f32],
        (rows, cols): (usize, usize),
        (rs, cs): (usize, usize),
    ) -> Result<Self> {
        let last = if rows == 0 || cols == 0 { 0 } else { (rows - 1) * rs + (cols - 1) * cs + 1 };
        if last > data.len() {
            bail!("matrix operand of {rows}×{cols} with strides ({rs}, {cs}) exceeds its storage");
        }
        Ok(Self { data, rows, cols, rs: rs as isize, cs: cs as isize })
    }

    /// A contiguous row-major `rows × cols` matrix.
    pub(super) fn dense(data: &'a [f32], rows: usize, cols: usize) -> Result<Self> {
        Self::new(data, (rows, cols), (cols, 1))
    }

    /// The transpose of this operand (a view: strides swapped).
    pub(super) fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }
}

/// A 2-D operand of a custom op, as stored.
pub(super) fn strided_matrix<'a>(s: &'a CpuStorage, l: &Layout) -> Result<Strided<'a>> {
    let (rows, cols) = l.shape().dims2()?;
    let (rs, cs) = match l.stride() {
        [rs, cs] => (*rs, *cs),
        _ => bail!("matmul operands must be 2-D"),
    };
    let data = match l.contiguous_offsets() {
        Some(_) => f32_slice(s, l)?,
        None => &s.as_slice::<f32>()?[l.start_offset()..],
    };
    Strided::new(data, (rows, cols), (rs, cs))
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` with `accumulate`; `dst` is contiguous row-major.
pub(super) fn product_into(
    dst: &mut [f32],
    lhs: Strided,
    rhs: Strided,
    accumulate: bool,
) -> Result<()> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    if rhs.rows != k || dst.len() != m * n {
        bail!("product of {m}×{k} by {}×{n} into {} elements", rhs.rows, dst.len());
    }
    // SAFETY: `Strided::new` checked both operands against their data; `dst` holds m×n floats.
    unsafe {
        sgemm(Product {
            m,
            n,
            k,
            dst: dst.as_mut_ptr(),
            dst_cs: 1,
            dst_rs: n as isize,
            accumulate,
            lhs: lhs.data.as_ptr(),
            lhs_cs: lhs.cs,
            lhs_rs: lhs.rs,
            rhs: rhs.data.as_ptr(),
            rhs_cs: rhs.cs,
            rhs_rs: rhs.rs,
        })
    };
    Ok(())
}

/// `lhs · rhs` in a new contiguous row-major buffer.
pub(super) fn product(lhs: Strided, rhs: Strided) -> Result<Vec<f32>> {
    let mut out = vec![0f32; lhs.rows * rhs.cols];
    product_into(&mut out, lhs, rhs, false)?;
    Ok(out)
}

impl CustomOp2 for Matmul {
    fn name(&self) -> &'static str {
        "verity-blas-matmul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (strided_matrix(s1, l1)?, strided_matrix(s2, l2)?);
        let out = product(x, w)?;
        let (m, n) = (x.rows, w.cols);
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // An operand that records nothing (a frozen base weight under LoRA, the first layer's
        // input) needs no gradient: skipping it saves a product as large as the forward's.
        let grad = grad.contiguous()?;
        let grad_x = x.track_op().then(|| grad.apply_op2_no_bwd(&w.t()?, &Matmul)).transpose()?;
        let grad_w = w.track_op().then(|| x.t()?.apply_op2_no_bwd(&grad, &Matmul)).transpose()?;
        Ok((grad_x, grad_w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::max_abs_diff;
    use candle_core::{Device, Var};

    #[test]
    fn openblas_loads_where_the_environment_requires_it() {
        // scripts/test-services.sh installs OpenBLAS and sets VERITY_REQUIRE_BLAS=1, so the
        // suite exercises the BLAS path rather than silently testing only the fallback.
        if std::env::var("VERITY_REQUIRE_BLAS").as_deref() == Ok("1") {
            assert!(blas_in_use(), "VERITY_REQUIRE_BLAS=1 but no OpenBLAS could be loaded");
        }
    }

    #[test]
    fn openblas_runs_the_kernels_this_cpu_supports() {
        // Unless the user chose a family, OpenBLAS must run the widest kernels the CPU has,
        // not the SSE3 fallback it picks for CPU models it does not recognise.
        let Some(blas) = blas() else { return };
        if let (Some(requested), Some(core)) = (blas.requested_core, &blas.core) {
            assert!(
                core.eq_ignore_ascii_case(requested),
                "OpenBLAS chose {core} kernels on a CPU that runs {requested} ones"
            );
        }
    }

    #[test]
    fn operand_layouts() {
        assert_eq!(operand_layout(4, 3, 3, 1), Some((CBLAS_NO_TRANS, 3)));
        assert_eq!(operand_layout(4, 3, 1, 4), Some((CBLAS_TRANS, 4)));
        assert_eq!(operand_layout(1, 3, 0, 1), Some((CBLAS_NO_TRANS, 3)));
        assert_eq!(operand_layout(4, 3, 6, 2), None, "neither stride is 1");
        assert_eq!(operand_layout(4, 3, 2, 1), None, "rows overlap");
    }

    #[test]
    fn products_and_gradients_match_candle_for_every_layout() {
        let dev = Device::Cpu;
        for (m, k, n) in [(7, 5, 3), (1, 9, 4), (33, 64, 17)] {
            for (x_t, w_t) in [(false, false), (true, false), (false, true), (true, true)] {
                let x = if x_t {
                    Tensor::randn(0f32, 1.0, (k, m), &dev).unwrap().t().unwrap()
                } else {
                    Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap()
                };
                let w = if w_t {
                    Tensor::randn(0f32, 1.0, (n, k), &dev).unwrap().t().unwrap()
                } else {
                    Tensor::randn(0f32, 1.0, (k, n), &dev).unwrap()
                };
                let (xv, wv) = (
                    Var::from_tensor(&x.contiguous().unwrap()).unwrap(),
                    Var::from_tensor(&w.contiguous().unwrap()).unwrap(),
                );
                let weights = Tensor::randn(0f32, 1.0, (m, n), &dev).unwrap();
                let ours = x.apply_op2(&w, Matmul).unwrap();
                let reference = x.matmul(&w).unwrap();
                assert!(max_abs_diff(&ours, &reference) < 1e-4, "{m}×{k}×{n} {x_t} {w_t}");
                let loss = |y: Tensor| (y * &weights).unwrap().sum_all().unwrap();
                let g1 = loss(xv.as_tensor().apply_op2(wv.as_tensor(), Matmul).unwrap())
                    .backward()
                    .unwrap();
                let g2 = loss(xv.as_tensor().matmul(wv.as_tensor()).unwrap()).backward().unwrap();
                for v in [&xv, &wv] {
                    assert!(
                        max_abs_diff(g1.get(v).unwrap(), g2.get(v).unwrap()) < 1e-4,
                        "gradient {m}×{k}×{n}"
                    );
                }
            }
        }
    }

    #[test]
    fn large_products_split_along_their_longer_side() {
        let product = |m: usize, n: usize, k: usize| Product {
            m,
            n,
            k,
            dst: std::ptr::null_mut(),
            dst_cs: 1,
            dst_rs: n as isize,
            accumulate: false,
            lhs: std::ptr::null(),
            lhs_cs: 1,
            lhs_rs: k as isize,
            rhs: std::ptr::null(),
            rhs_cs: 1,
            rhs_rs: n as isize,
        };
        let split = |m, n, k| Split::of(&product(m, n, k)).map(|s| (s.parts, s.rows));
        assert_eq!(split(37, 19, 70), None, "small products run as one call");
        let threads = rayon::current_num_threads();
        if threads > 1 {
            assert_eq!(split(257, 61, 90), Some((threads.min(257 / 16), true)));
            assert_eq!(split(9, 301, 400), Some((threads.min(301 / 16), false)));
        }
        assert_eq!(split(8, 8, 1 << 20), None, "no block under 16 rows or columns");
    }

    #[test]
    fn blas_and_gemm_agree_and_accumulate() {
        // The second size is split into blocks of rows across threads, the third (a few rows,
        // many columns: a decode step of a larger batch) into blocks of columns.
        for (m, k, n) in [(37, 70, 19), (257, 90, 61), (9, 400, 301)] {
            let lhs: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
            // rhs read transposed: stored n × k, used as k × n with strides (1, k).
            let rhs: Vec<f32> = (0..n * k).map(|i| ((i * 5) % 11) as f32 * 0.5 - 2.0).collect();
            let run = |blas: bool, accumulate_twice: bool| {
                let mut out = vec![0f32; m * n];
                for accumulate in if accumulate_twice { vec![false, true] } else { vec![false] } {
                    let product = Product {
                        m,
                        n,
                        k,
                        dst: out.as_mut_ptr(),
                        dst_cs: 1,
                        dst_rs: n as isize,
                        accumulate,
                        lhs: lhs.as_ptr(),
                        lhs_cs: 1,
                        lhs_rs: k as isize,
                        rhs: rhs.as_ptr(),
                        rhs_cs: k as isize,
                        rhs_rs: 1,
                    };
                    // SAFETY: buffers of the stated sizes; rhs is addressed through its transpose.
                    unsafe {
                        if !(blas && blas_sgemm(&product)) {
                            gemm_sgemm(&product);
                        }
                    }
                }
                out
            };
            let (fallback, fast) = (run(false, false), run(true, false));
            let expected: Vec<f32> = (0..m * n)
                .map(|ij| (0..k).map(|p| lhs[(ij / n) * k + p] * rhs[(ij % n) * k + p]).sum())
                .collect();
            for (label, got) in [("gemm", &fallback), ("blas", &fast)] {
                assert!(
                    got.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-3),
                    "{label} differs from the naive product"
                );
            }
            let twice = run(true, true);
            assert!(
                twice.iter().zip(&expected).all(|(a, b)| (a - 2.0 * b).abs() < 2e-3),
                "accumulate adds to dst"
            );
        }
    }
}
