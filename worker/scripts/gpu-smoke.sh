#!/usr/bin/env bash
# GPU smoke test: build with the `cuda` feature, fetch SmolLM2, run the GPU-marked tests on cuda:0.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if ! command -v nvcc >/dev/null; then
  # No toolkit: a CUDA 13.4 toolchain from PyPI (see docs/gpu.md).
  prefix=${VERITY_CUDA_PREFIX:-$HOME/.cache/verity/cuda}
  [ -f "$prefix/env.sh" ] || scripts/cuda-from-pypi.sh "$prefix"
  export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)}
  . "$prefix/env.sh"
  # The PyPI libraries are not on the loader's path; the driver's libcuda is.
  export LD_LIBRARY_PATH="$CUDA_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
eval "$(scripts/fetch-test-model.sh | sed 's/^/export /')"
VERITY_TEST_DEVICE=cuda:0 cargo test --release -p verity-worker --features cuda --test gpu -- --nocapture
