//! SciPy's OpenBLAS from PyPI (`verity_worker::pypi_blas`): fetched into Verity's cache and
//! opened by the kernels on a machine without OpenBLAS (`VERITY_BLAS=pypi` stands in for one
//! here, since CI's machine has the system library), its products equal to `gemm`'s.
//! Its own test binary: the kernels open a BLAS once per process.

use candle_core::{Device, Tensor};

#[test]
fn the_pypi_openblas_is_fetched_opened_and_multiplies_as_gemm_does() {
    std::env::set_var("VERITY_BLAS", "pypi");
    verity_worker::pypi_blas::register(true);
    if !verity_kernels::blas_in_use() {
        // PyPI unreachable: only a failure where the suite requires BLAS.
        let required = std::env::var("VERITY_REQUIRE_BLAS").as_deref() == Ok("1");
        assert!(!required, "VERITY_REQUIRE_BLAS=1 but SciPy's OpenBLAS could not be fetched");
        return;
    }
    let path = verity_worker::pypi_blas::library_path();
    assert!(path.is_file() && path.with_file_name("LICENSE.txt").is_file(), "{path:?}");
    assert_eq!(verity_kernels::blas_library(), path.to_str());
    assert!(
        verity_kernels::blas_core().starts_with("openblas:"),
        "{}",
        verity_kernels::blas_core()
    );
    let a = Tensor::randn(0f32, 1.0, (37, 300), &Device::Cpu).unwrap();
    let b = Tensor::randn(0f32, 1.0, (300, 29), &Device::Cpu).unwrap();
    let ours = verity_kernels::matmul(&a, &b).unwrap();
    let gemm = a.matmul(&b).unwrap();
    let diff = (ours - gemm).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(diff < 1e-3, "SciPy's OpenBLAS and gemm differ by {diff}");
}
