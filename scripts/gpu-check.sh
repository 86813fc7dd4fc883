#!/usr/bin/env bash
# The GPU check: builds Verity with `--features cuda`, runs the device tests on cuda:0, then
# `verity bench rollout | train-step | grpo-step` on SmolLM2-135M and larger shapes, writing one
# JSON line per result and printing each one's MFU (model FLOPs per second / the GPU's peak).
#
#   scripts/gpu-check.sh          build, then run (a machine with cargo and a GPU)
#   scripts/gpu-check.sh build    build the bundle only (a machine with cargo, no GPU needed)
#   scripts/gpu-check.sh run      run a bundle built earlier (the GPU machine; no cargo, no network)
#
# The bundle (VERITY_GPU_CHECK_DIR, default .gpu-check/, about 40 MB) holds the stripped
# binaries, xz-compressed, and what the benchmark model folders are made of: the
# bench/models/*.json configs and one copy of SmolLM2's tokenizer files.
# The benchmarks draw random weights of each shape (`--random-weights`), so no weights travel.
# Results go to $OUT (or the bundle's out/): gpu-check.jsonl, and the log.
#
# Without nvcc, the build uses a CUDA 13.0 toolchain from PyPI (scripts/cuda-from-pypi.sh); its
# PTX runs on any CUDA 13 driver. CUDA_COMPUTE_CAP defaults to the GPU's (nvidia-smi), else 90.
# Budget: the run took 4.5 minutes on one H200 (2026-12-04: device tests 15 s, the rest benchmarks).
# VERITY_GPU_CHECK_PARTS (default "tests bench peers") picks what `run` runs: the device tests,
# Verity's benchmarks, and the same benchmarks through transformers / PyTorch on the same GPU
# (bench/peers/gpu_bench.py; needs the machine's own torch). VERITY_GPU_CHECK_DEADLINE (seconds)
# skips every benchmark that would start after it, so that a leased machine's minutes suffice.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bundle=${VERITY_GPU_CHECK_DIR:-$root/.gpu-check}
mode=${1:-all}

build() {
  if ! command -v nvcc >/dev/null; then
    prefix=${VERITY_CUDA_PREFIX:-$HOME/.cache/verity/cuda-${VERITY_CUDA_VERSION:-13.0}}
    [ -f "$prefix/env.sh" ] || scripts/cuda-from-pypi.sh "$prefix"
    # shellcheck disable=SC1091
    . "$prefix/env.sh"
  fi
  export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d . || true)}
  export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
  export SQLX_OFFLINE=true
  echo "gpu-check: building with CUDA for sm_$CUDA_COMPUTE_CAP"
  # The dev profile: it builds candle and the worker at opt-level 3 (Cargo.toml) and shares the
  # dependencies CI's clippy pass and the test build already compiled (same packages, same
  # features); the GPU does the timed work either way. VERITY_GPU_CHECK_PROFILE=release for a
  # release build.
  local profile=${VERITY_GPU_CHECK_PROFILE:-dev} features=(--workspace --features verity-worker/cuda)
  cargo build --locked --profile "$profile" "${features[@]}" --bin verity
  local tests
  tests=$(cargo test --locked --profile "$profile" "${features[@]}" \
    --test device_path --test gpu --test families --no-run --message-format=json |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])')
  rm -rf "$bundle/bin" "$bundle/models" "$bundle/bin.tar.xz" && mkdir -p "$bundle/bin" "$bundle/models"
  local target=${CARGO_TARGET_DIR:-target} dir=$profile
  [ "$profile" = dev ] && dir=debug
  cp "$target/$dir/verity" "$bundle/bin/verity"
  while read -r name path; do cp "$path" "$bundle/bin/test-$name"; done <<<"$tests"
  strip "$bundle"/bin/* 2>/dev/null || true
  tar -C "$bundle" -cJf "$bundle/bin.tar.xz" bin && rm -rf "$bundle/bin"
  # The model shapes' configs and one copy of SmolLM2's tokenizer files (the test fixture);
  # `run` puts them together into a model folder per shape.
  local fixture
  fixture=$(scripts/fetch-test-model.sh | sed -n 's/^VERITY_TEST_MODEL_DIR=//p')
  mkdir -p "$bundle/models/tokenizer"
  cp bench/models/*.json "$bundle/models/"
  for f in "$fixture"/*.json; do
    case $(basename "$f") in config.json) ;; *) cp "$f" "$bundle/models/tokenizer/" ;; esac
  done
  du -sh "$bundle"
}

# The dense bf16 tensor-core peak (TFLOP/s) of the GPU's name, as its maker publishes it.
peak_tflops() {
  case "$1" in
    *H200* | *H100*SXM* | *H100*HBM3*) echo 989 ;;
    *H100*NVL*) echo 835 ;;
    *H100*) echo 756 ;;
    *A100*) echo 312 ;;
    *L40S*) echo 362 ;;
    *L4*) echo 121 ;;
    *A10*) echo 125 ;;
    *4090*) echo 165 ;;
    *) echo 0 ;;
  esac
}

run() {
  local out=${OUT:-$bundle/out}
  mkdir -p "$out"
  local results="$out/gpu-check.jsonl" work
  : >"$results"
  work=$(mktemp -d)
  tar -C "$work" -xJf "$bundle/bin.tar.xz"
  # The CUDA libraries cudarc links (cuBLAS, cuRAND, NVRTC, the runtime): the toolkit's, or the
  # nvidia-* Python packages' (PyTorch's) where no toolkit is installed.
  local libs
  libs=$(python3 -c 'import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
print(":".join(sorted({os.path.dirname(p) for d in dirs for p in glob.glob(d + "/nvidia/**/lib*.so*", recursive=True)})))' 2>/dev/null || true)
  local driver=""
  [ -d /usr/local/nvidia/lib64 ] && driver=/usr/local/nvidia/lib64
  export LD_LIBRARY_PATH="${libs}${driver:+:$driver}${CUDA_HOME:+:$CUDA_HOME/lib64}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ldd "$work/bin/verity" | grep "not found"; then
    echo "gpu-check: the libraries above are missing (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)" >&2
    return 1
  fi
  local gpu peak
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  peak=$(peak_tflops "$gpu")
  echo "gpu-check: $gpu (bf16 dense peak $peak TFLOP/s)"
  local failed=0 parts=${VERITY_GPU_CHECK_PARTS:-tests bench peers} deadline=${VERITY_GPU_CHECK_DEADLINE:-0}
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee -a "$out/bench.log"
  if [[ " $parts " == *" tests "* ]]; then
    for t in "$work"/bin/test-*; do
      echo "gpu-check: $(basename "$t")"
      # The family fixtures travel with the working tree (worker/tests/data/families).
      VERITY_TEST_DEVICE=cuda:0 VERITY_FAMILY_FIXTURES="$root/worker/tests/data/families" \
        timeout 150 "$t" --test-threads 1 2>&1 | tee -a "$out/tests.log" || failed=1
    done
  fi
  local verity="$work/bin/verity" m="$work/models" config name
  for config in "$bundle"/models/*.json; do
    name=$(basename "$config" .json)
    mkdir -p "$m/$name"
    cp "$bundle"/models/tokenizer/* "$m/$name/"
    cp "$config" "$m/$name/config.json"
  done
  # Prints one result line and its MFU.
  report() {
    python3 -c 'import json, sys
r = json.loads(sys.argv[1]); peak = float(sys.argv[2])
t, kind, dtype = r.get("model_tflops", 0.0), r["bench"], r["compute_dtype"]
mfu = "%.1f%%" % (100 * t / peak) if peak else "n/a"
name = r["model"].rstrip("/").split("/")[-1] + (" (peer)" if "peer" in r else "")
keys = ("seconds", "seconds_per_step", "tokens_per_s", "batch", "prompts", "seq_len", "group", "peak_gpu_gib", "peak_gpu_mib", "peak_gpu_forward_mib", "peak_gpu_backward_mib")
shown = json.dumps({k: round(r[k], 4) if isinstance(r[k], float) else r[k] for k in keys if k in r})
print("%10s %-21s %-5s %8.1f TFLOP/s  MFU %s  %s" % (kind, name, dtype, t, mfu, shown))' "$1" "$peak"
  }
  # True while the deadline (if any) has not passed.
  in_time() { [ "$deadline" = 0 ] || [ "$SECONDS" -lt "$deadline" ]; }
  bench() {
    local line
    [[ " $parts " == *" bench "* ]] || return 0
    in_time || { echo "gpu-check: skipped (deadline): verity bench $*"; return 0; }
    if line=$(timeout 150 "$verity" bench "$@" --device cuda:0 --random-weights 2>>"$out/bench.log"); then
      echo "$line" >>"$results"
      report "$line"
    else
      echo "gpu-check: FAILED: verity bench $*" | tee -a "$results"
      failed=1
    fi
  }
  # The same work through transformers / PyTorch (the machine's own), when it has them.
  peer() {
    local line
    [[ " $parts " == *" peers "* ]] || return 0
    in_time || { echo "gpu-check: skipped (deadline): peer $*"; return 0; }
    if line=$(timeout 150 python3 "$root/bench/peers/gpu_bench.py" "$@" 2>>"$out/peers.log" | tail -n 1); then
      echo "$line" >>"$results"
      report "$line"
    else
      echo "gpu-check: FAILED: peer $*" | tee -a "$results"
    fi
  }
  # Each of Verity's benchmarks next to its peer's, the most telling first.
  local s="$m/smollm2-135m" q="$m/qwen2.5-1.5b"
  bench rollout --model "$s" --batch 1 --new-tokens 128
  peer --model "$s" rollout --batch 1 --new-tokens 128
  bench rollout --model "$s" --batch 64 --new-tokens 128
  peer --model "$s" rollout --batch 64 --new-tokens 128
  bench train-step --model "$s" --batch 8 --seq-len 512
  peer --model "$s" train-step --batch 8 --seq-len 512
  bench grpo-step --model "$s" --prompts 8 --group 8 --max-tokens 128 --steps 3
  # How the GPU memory grows with the batch (the peaks are in the JSON lines).
  bench train-step --model "$q" --batch 2 --seq-len 512
  bench train-step --model "$q" --batch 4 --seq-len 512
  bench train-step --model "$q" --batch 8 --seq-len 512
  peer --model "$q" train-step --batch 8 --seq-len 512
  bench rollout --model "$q" --batch 64 --new-tokens 128
  peer --model "$q" rollout --batch 64 --new-tokens 128
  bench rollout --model "$q" --batch 1 --new-tokens 128
  peer --model "$q" rollout --batch 1 --new-tokens 128
  bench grpo-step --model "$q" --prompts 2 --group 8 --max-tokens 128 --steps 2
  bench grpo-step --model "$q" --prompts 8 --group 8 --max-tokens 128 --steps 2
  bench train-step --model "$m/qwen2.5-0.5b" --batch 8 --seq-len 512
  bench train-step --model "$m/qwen2.5-3b" --batch 4 --seq-len 512 --steps 2
  peer --model "$m/qwen2.5-3b" train-step --batch 4 --seq-len 512 --steps 2
  VERITY_PRECISION=f32 bench train-step --model "$q" --batch 8 --seq-len 512
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv >>"$out/bench.log" || true
  rm -rf "$work"
  echo "gpu-check: results in $results"
  return "$failed"
}

case "$mode" in
  build) build ;;
  run) run ;;
  all) build && run ;;
  *) echo "usage: scripts/gpu-check.sh [build|run|all]" >&2; exit 2 ;;
esac
