//! OpenBLAS for machines without one: SciPy's own build of OpenBLAS, the `scipy-openblas32`
//! wheel on PyPI (one self-contained shared library for every x86-64 and aarch64 CPU, linked
//! against libc and libm only, its symbols prefixed `scipy_`), fetched once into Verity's cache
//! and opened by the kernels when no system OpenBLAS loads. Without it matrix products fall
//! back to the `gemm` crate, which made a training step 2.7× slower on a fresh 2-core VM.

use crate::pypi_models::{from_wheel, FetchError};
use std::path::{Path, PathBuf};

/// The pinned wheel.
pub const OPENBLAS_PACKAGE: &str = "scipy-openblas32==0.3.34.481.3";
/// The library's file name inside the wheel and in the cache.
const LIBRARY: &str = "libscipy_openblas.so";

/// Takes the library (and OpenBLAS's licence) out of the wheel:
/// `python3 -c EXTRACT WHEEL_DIR DEST`, DEST written under a temporary name, then renamed.
const EXTRACT: &str = r#"
import glob, os, sys, zipfile
folder, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(folder, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    library = [n for n in names if n.endswith("/lib/libscipy_openblas.so")][0]
    licences = [n for n in names if n.endswith("LICENSE.txt")]
    if licences:
        with open(os.path.join(os.path.dirname(dest), "LICENSE.txt"), "wb") as f:
            f.write(z.read(licences[0]))
    temp = dest + ".%d.tmp" % os.getpid()
    with open(temp, "wb") as f:
        f.write(z.read(library))
    os.chmod(temp, 0o755)
    os.replace(temp, dest)
"#;

/// Where the fetched library is kept: `blas/scipy-openblas32-<version>/` in Verity's cache
/// folder (`~/.cache/verity`, beside the models and the grader packages).
pub fn library_path() -> PathBuf {
    let version = OPENBLAS_PACKAGE.replace("==", "-");
    verity_verifiers::sandbox::packages::cache_root().join("blas").join(version).join(LIBRARY)
}

/// Fetches the wheel and puts its library at `dest`.
pub fn fetch(dest: &Path) -> Result<(), FetchError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|source| FetchError::Io {
        action: "creating",
        path: dir.to_path_buf(),
        source,
    })?;
    let staging = dir.join(format!("download.{}", std::process::id()));
    let what = format!("could not extract {LIBRARY} from the {OPENBLAS_PACKAGE} wheel");
    from_wheel(OPENBLAS_PACKAGE, &staging, EXTRACT, &[dest], &what)
}

fn fetch_for_kernels(dest: &Path) -> Result<(), String> {
    fetch(dest).map_err(|e| e.to_string())
}

/// Tells the kernels where the fetched OpenBLAS is, to open when no system OpenBLAS loads;
/// with `may_fetch`, they fetch it first when it is not there yet. Call before the first
/// matrix product.
pub fn register(may_fetch: bool) {
    let fetch: Option<verity_kernels::FetchOpenblas> =
        if may_fetch { Some(fetch_for_kernels) } else { None };
    verity_kernels::set_fetched_openblas(library_path(), fetch);
}
