#!/usr/bin/env bash
# llama.cpp's own batched decode benchmark (`llama-batched-bench`, built from the llama.cpp
# sources: see README.md) at 1 and 8 parallel sequences: a 32-token prompt each, 64 new tokens.
#   llamacpp_batched.sh LLAMA_BATCHED_BENCH MODEL.gguf THREADS   -> SUMMARY {"b1_tok_s", "b8_tok_s"}
set -euo pipefail
bin=$1 gguf=$2 threads=$3
"$bin" -m "$gguf" -c 2048 -b 512 -ub 512 -npp 32 -ntg 64 -npl 1,8 -t "$threads" -tb "$threads" \
  --output-format jsonl 2>&1 | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{\"n_kv_max")]
speed = {r["pl"]: r["speed_tg"] for r in rows}
print("SUMMARY " + json.dumps({"b1_tok_s": round(speed[1], 1), "b8_tok_s": round(speed[8], 1), "threads": int(sys.argv[1])}))
' "$threads"
