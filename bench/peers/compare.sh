#!/usr/bin/env bash
# Verity against its peers, back to back on this machine: decode at batch 1 and 8
# (transformers, llama.cpp; Verity with its f32 weights and with bf16 and int8 copies), forward +
# backward of 8 x 128 tokens (torch), and a GRPO step (f32, bf16 and int8 rollouts) of 1 prompt x 8 completions
# of at most 64 tokens (TRL), REPS rounds of every measurement in turn so that a noisy minute hits
# all sides alike; compare_summary.py prints the medians and ratios.
#
#   bench/peers/compare.sh VERITY HF_DIR GGUFS [REPS] [OUT]
#
# VERITY: the `verity` binary; HF_DIR: the model folder (both sides load it); GGUFS: the same
# model for llama.cpp, one or more files separated by `:` (e.g. the Q4_1 file a llama.cpp user
# runs and an F32 one with Verity's precision). PEER_PY (default /tmp/peer-venv/bin/python, see README.md) runs the
# peers; LLAMA_BATCHED_BENCH, when set, is llama.cpp's `llama-batched-bench` (decode at 8
# parallel sequences). THREADS (default 2) is given to every side.
set -euo pipefail
verity=$1 hf=$2 ggufs=$3 reps=${4:-3} out=${5:-bench-compare-$(date +%Y%m%d-%H%M%S)}
py=${PEER_PY:-/tmp/peer-venv/bin/python} threads=${THREADS:-2}
export PEER_MODEL=$hf  # the peer scripts' model folder
here=$(cd "$(dirname "$0")" && pwd)
out=$(mkdir -p "$out" && cd "$out" && pwd)
log() { echo "compare: $*" >&2; }
# Each measurement appends one line `NAME <json>` to results.txt (the JSON a bench printed).
record() {
  local name=$1; shift
  log "round $round: $name"
  if "$@" > "$out/last.txt" 2> "$out/last.err"; then
    json=$(grep -E '^(SUMMARY )?\{' "$out/last.txt" | tail -n 1 | sed 's/^SUMMARY //')
    echo "$name $json" >> "$out/results.txt"
  else
    log "$name failed: $(tail -n 3 "$out/last.err")"
  fi
  cat "$out/last.txt" "$out/last.err" >> "$out/raw.log"
}
{ lscpu | grep -E 'Model name|Flags' | cut -c1-200; nproc; date -u; } > "$out/machine.txt"
for round in $(seq 1 "$reps"); do
  for batch in 1 8; do
    record "verity-decode-b$batch" "$verity" bench rollout --model "$hf" --batch "$batch" --new-tokens 64
    for dtype in bf16 int8; do
      record "verity-decode-b$batch-$dtype" "$verity" bench rollout --model "$hf" --batch "$batch" --new-tokens 64 \
        --rollout-dtype "$dtype"
    done
  done
  record verity-train-step "$verity" bench train-step --model "$hf" --batch 8 --seq-len 128 --steps 3
  record transformers "$py" "$here/gen_bench.py" --threads "$threads" --reps 3
  IFS=: read -r -a files <<< "$ggufs"
  for gguf in "${files[@]}"; do
    kind=$(basename "$gguf" .gguf)
    if "$py" -c 'import llama_cpp' 2> /dev/null; then
      record "llama-cpp-b1:$kind" "$py" "$here/llamacpp_bench.py" "$gguf" --threads "$threads" --reps 3
    fi
    if [ -n "${LLAMA_BATCHED_BENCH:-}" ]; then
      record "llama-cpp-batched:$kind" "$here/llamacpp_batched.sh" "$LLAMA_BATCHED_BENCH" "$gguf" "$threads"
    fi
  done
  record verity-grpo-step "$verity" bench grpo-step --model "$hf" --prompts 1 --group 8 --max-tokens 64 --steps 3
  for dtype in bf16 int8; do
    record "verity-grpo-step-$dtype" "$verity" bench grpo-step --model "$hf" --prompts 1 --group 8 --max-tokens 64 \
      --steps 3 --rollout-dtype "$dtype"
  done
  (cd "$out" && record trl-grpo-step "$py" "$here/grpo_bench.py" --threads "$threads" --max-steps 4 --out "$out/grpo_out")
done
log "done: $out/results.txt"
"$py" "$here/compare_summary.py" "$out/results.txt" | tee "$out/summary.md"
