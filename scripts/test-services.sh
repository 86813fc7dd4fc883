#!/usr/bin/env bash
# Makes sure every service the test suite needs is up, installing what is missing.
# Source it (it exports the variables the tests read):  . scripts/test-services.sh
# Idempotent: a running service is left alone.

VERITY_CACHE=${VERITY_CACHE:-/var/cache/verity-ci}
mkdir -p "$VERITY_CACHE"

_apt_updated=
_apt_install() {
  if [ -z "$_apt_updated" ]; then apt-get update -qq >/dev/null; _apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- PostgreSQL on 127.0.0.1:5432 (trust auth) ---
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "test-services: starting PostgreSQL" >&2
  if ! command -v pg_ctlcluster >/dev/null; then _apt_install postgresql; fi
  cluster_version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  pg_ctlcluster --skip-systemctl-redirect "$cluster_version" main start
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
pg_isready -h 127.0.0.1 -p 5432 -q || { echo "test-services: PostgreSQL is not reachable" >&2; return 1 2>/dev/null || exit 1; }

# --- OpenBLAS (the worker's matrix products; without it they fall back to the slower gemm crate) ---
if ! ldconfig -p | grep -q 'libopenblas\.so\.0'; then
  echo "test-services: installing OpenBLAS" >&2
  _apt_install libopenblas0-pthread
fi
export VERITY_REQUIRE_BLAS=1

# --- bubblewrap (the grader sandbox) ---
command -v bwrap >/dev/null || { echo "test-services: installing bubblewrap" >&2; _apt_install bubblewrap; }

# --- An S3-protocol server on loopback (moto) ---
S3_PORT=${VERITY_TEST_S3_PORT:-9000}
export VERITY_TEST_S3_ENDPOINT="http://127.0.0.1:${S3_PORT}"
export VERITY_REQUIRE_S3=1
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test} AWS_REGION=${AWS_REGION:-us-east-1}
if ! curl -fsS "$VERITY_TEST_S3_ENDPOINT/moto-api/" >/dev/null 2>&1; then
  venv="$VERITY_CACHE/moto-venv"
  if [ ! -x "$venv/bin/moto_server" ]; then
    echo "test-services: installing moto[server]" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q 'moto[server]==5.1.*'
  fi
  echo "test-services: starting moto S3 on port $S3_PORT" >&2
  setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$S3_PORT" >"$VERITY_CACHE/moto.log" 2>&1 < /dev/null &
  for _ in $(seq 1 60); do curl -fsS "$VERITY_TEST_S3_ENDPOINT/moto-api/" >/dev/null 2>&1 && break; sleep 0.5; done
fi
curl -fsS "$VERITY_TEST_S3_ENDPOINT/moto-api/" >/dev/null || { echo "test-services: S3 server did not start; see $VERITY_CACHE/moto.log" >&2; return 1 2>/dev/null || exit 1; }

# --- Python clients the API tests drive: the official openai SDK and schemathesis ---
# Two SDK environments: the newest 3.x release (VERITY_TEST_PYTHON, with schemathesis, and gguf:
# llama.cpp's own reader and quantisers, which check GGUF exports) and the
# oldest release docs/api.md promises (VERITY_TEST_PYTHON_OLDEST); the SDK tests run under both.
OPENAI_SDK_NEWEST='openai>=3,<4'
OPENAI_SDK_OLDEST='openai==1.99.0'
api_venv="$VERITY_CACHE/api-tools-venv-3"
api_tools_stamp="$api_venv/.verity-api-tools-3"  # bump when the pins below change
if [ ! -f "$api_tools_stamp" ]; then
  echo "test-services: installing $OPENAI_SDK_NEWEST and schemathesis" >&2
  python3 -m venv "$api_venv"
  "$api_venv/bin/pip" install -q "$OPENAI_SDK_NEWEST" 'schemathesis==3.39.*' 'hypothesis==6.131.*' \
    'gguf==0.19.0' && touch "$api_tools_stamp"
fi
oldest_venv="$VERITY_CACHE/openai-oldest-venv"
oldest_stamp="$oldest_venv/.verity-openai-oldest-1"  # bump when OPENAI_SDK_OLDEST changes
if [ ! -f "$oldest_stamp" ]; then
  echo "test-services: installing $OPENAI_SDK_OLDEST" >&2
  python3 -m venv "$oldest_venv"
  "$oldest_venv/bin/pip" install -q "$OPENAI_SDK_OLDEST" && touch "$oldest_stamp"
fi
# The official Tinker SDK (docs/tinker.md), pinned: the protocol it speaks is what Verity serves.
TINKER_SDK='tinker==0.38.0'
tinker_venv="$VERITY_CACHE/tinker-sdk-venv"
tinker_stamp="$tinker_venv/.verity-tinker-1"  # bump when TINKER_SDK changes
if [ ! -f "$tinker_stamp" ]; then
  echo "test-services: installing $TINKER_SDK" >&2
  python3 -m venv "$tinker_venv"
  "$tinker_venv/bin/pip" install -q "$TINKER_SDK" && touch "$tinker_stamp"
fi
export VERITY_TEST_TINKER_PYTHON="$tinker_venv/bin/python"
# tinker-cookbook's RL recipe (tests/tests/tinker_cookbook.rs), beside the same SDK. The cookbook
# imports torch at module level (PyPI's wheel brings CUDA libraries: about 2.5 GB to download,
# 6 GB installed, once per machine); its pin `tml-renderers>=0.4.1` does not exist on PyPI (only
# 0.2.1, which the arithmetic recipe never imports), hence `--no-deps` for the cookbook itself.
# sympy and pylatexenc are imported by the math_rl command line.
cookbook_venv="$VERITY_CACHE/tinker-cookbook-venv"
cookbook_stamp="$cookbook_venv/.verity-cookbook-1"  # bump when the pins below change
if [ ! -f "$cookbook_stamp" ]; then
  echo "test-services: installing tinker-cookbook 0.6.1 and torch (about 2.5 GB, once)" >&2
  python3 -m venv "$cookbook_venv"
  "$cookbook_venv/bin/pip" install -q "$TINKER_SDK" 'torch==2.15.0' 'transformers==5.2.0' \
    'datasets==5.2.0' 'chz==0.4.0' 'tml-renderers==0.2.1' 'sympy==1.14.0' 'pylatexenc==2.11' \
    blobfile termcolor cloudpickle pillow tiktoken pyrage rich safetensors tqdm \
    && "$cookbook_venv/bin/pip" install -q --no-deps 'tinker-cookbook==0.6.1' \
    && touch "$cookbook_stamp"
fi
if [ -f "$cookbook_stamp" ]; then
  export VERITY_TEST_TINKER_COOKBOOK_PYTHON="$cookbook_venv/bin/python"
fi
export VERITY_TEST_PYTHON="$api_venv/bin/python"
export VERITY_TEST_PYTHON_OLDEST="$oldest_venv/bin/python"
export VERITY_TEST_SCHEMATHESIS="$api_venv/bin/st"

# --- Headless Chromium and its WebDriver (the dashboard's browser tests) ---
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "test-services: installing chromium and chromium-driver" >&2
  _apt_install chromium chromium-driver
fi
export VERITY_TEST_CHROMEDRIVER=${VERITY_TEST_CHROMEDRIVER:-$(command -v chromedriver)}
export VERITY_TEST_CHROMIUM=${VERITY_TEST_CHROMIUM:-$(command -v chromium)}

# --- deploy/ validators (scripts/check-deploy.sh) and PyYAML for scripts/manifest-env.py ---
export VERITY_DEPLOY_VENV="$VERITY_CACHE/deploy-check-venv"
if [ ! -x "$VERITY_DEPLOY_VENV/bin/kubernetes-validate" ] || [ ! -x "$VERITY_DEPLOY_VENV/bin/check-jsonschema" ]; then
  echo "test-services: installing kubernetes-validate and check-jsonschema" >&2
  python3 -m venv "$VERITY_DEPLOY_VENV"
  "$VERITY_DEPLOY_VENV/bin/pip" install -q 'kubernetes-validate==1.37.*' 'check-jsonschema==0.39.*'
fi
# The interpreter the cluster topology test reads the manifests' env with.
export VERITY_DEPLOY_PYTHON="$VERITY_DEPLOY_VENV/bin/python"

# --- podman, the base image and the compose file's images (cli/tests/worker_image.rs, the
# container cluster test, scripts/verify-compose-podman.sh) ---
# podman, runc, mmdebstrap and docker-compose from Debian. CONTAINERS_CONF points podman at this
# repository's settings for machines like these VMs (scripts/podman-containers.conf; nothing
# under /etc changes). The images are pulled from their registry; where none is reachable they
# are made once: debian:bookworm-slim with mmdebstrap, and stand-ins for the compose file's
# postgres:16 and minio images (scripts/local-base-images.sh, a few minutes).
_verity_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$_verity_repo/scripts/podman-containers.conf}
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v mmdebstrap >/dev/null \
  || ! command -v docker-compose >/dev/null; then
  echo "test-services: installing podman, runc, mmdebstrap and docker-compose" >&2
  _apt_install podman runc mmdebstrap docker-compose \
    || echo "test-services: WARNING: podman could not be installed" >&2
fi
# Pulls IMAGE, else runs local-base-images.sh with ARG (once: the result is kept by podman).
_verity_image() {
  podman image exists "$1" && return 0
  timeout 120 podman pull -q "$1" >/dev/null 2>&1 && return 0
  echo "test-services: no registry gives $1; making it locally (scripts/local-base-images.sh $2)" >&2
  "$_verity_repo/scripts/local-base-images.sh" "$2" >>"$VERITY_CACHE/local-base-images.log" 2>&1 \
    || echo "test-services: WARNING: see $VERITY_CACHE/local-base-images.log" >&2
}
_verity_base=docker.io/library/debian:bookworm-slim
if command -v podman >/dev/null; then
  _verity_image "$_verity_base" --debian-only
  if command -v docker-compose >/dev/null; then
    for _verity_service in docker.io/library/postgres:16 docker.io/minio/minio:latest docker.io/minio/mc:latest; do
      _verity_image "$_verity_service" --services
    done
  fi
fi
if command -v podman >/dev/null && podman image exists "$_verity_base"; then
  VERITY_TEST_PODMAN=$(command -v podman)
  export VERITY_TEST_PODMAN
else
  echo "test-services: WARNING: no podman or no $_verity_base; the worker image tests say SKIPPED" >&2
fi
