#!/usr/bin/env bash
# GPU smoke test: build with the `cuda` feature, fetch SmolLM2, run the GPU-marked tests on cuda:0.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
command -v nvcc >/dev/null || { echo "nvcc not found (pip install nvidia-cuda-nvcc-cu12 and put its bin/ on PATH)"; exit 1; }
eval "$(scripts/fetch-test-model.sh | sed 's/^/export /')"
VERITY_TEST_DEVICE=cuda:0 cargo test --release -p verity-worker --features cuda --test gpu -- --nocapture
