#!/usr/bin/env bash
# The DeepSeek-R1 recipe in miniature, on a laptop CPU with SmolLM2-135M-Instruct and the
# arithmetic example set (examples/arithmetic), driven through Verity's CLI:
#
#   1. cold-start SFT on a few chats answering in a fixed format   (method.type "supervised")
#   2. RL with the math grader, starting from the SFT model         (method.type "reinforcement")
#   3. rejection sampling of the RL model on the training prompts   (/v1/verity/rejection_sampling)
#   4. SFT of a fresh copy of the base on the kept samples           (distillation into the base)
#   5. one evaluation report of base, SFT, RL and the distilled model on the validation set
#
# Usage: examples/r1-recipe/run.sh            (VERITY_BIN, DATA_DIR, PORT, VALIDATION_ROWS)
# It starts `verity up` in DATA_DIR (a private Postgres cluster and object store), registers the
# SmolLM2 folder from the model cache (`scripts/fetch-test-model.sh` or `verity up --demo` puts it
# there), runs the stages, prints the report and stops the server.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
V=${VERITY_BIN:-verity}
DATA=${DATA_DIR:-$root/.verity-recipe}
PORT=${PORT:-8091}
VALIDATION_ROWS=${VALIDATION_ROWS:-32}
MODEL=smollm2-135m-instruct
MODEL_DIR=${VERITY_MODEL_DIR:-${VERITY_MODEL_CACHE:-$HOME/.cache/verity/models}/$MODEL}
work=$(mktemp -d)
export VERITY_URL="http://127.0.0.1:$PORT" VERITY_DATA_DIR="$DATA"
cli() { "$V" "$@" --url "$VERITY_URL" --data-dir "$DATA"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
stage() { echo; echo "== $(date +%T) $*"; }

[ -d "$MODEL_DIR" ] || { echo "no $MODEL folder at $MODEL_DIR (run scripts/fetch-test-model.sh)" >&2; exit 1; }
"$V" up --data-dir "$DATA" --port "$PORT" >"$work/up.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1 120); do
  curl -fsS "$VERITY_URL/readyz" >/dev/null 2>&1 && break
  kill -0 $up 2>/dev/null || { cat "$work/up.log" >&2; exit 1; }
  sleep 1
done
if ! curl -fsS "$VERITY_URL/v1/models" -H "Authorization: Bearer $(cat "$DATA/admin-key")" | grep -q "\"$MODEL\""; then
  DATABASE_URL="postgres://verity@localhost/verity?host=$DATA/pg/run" VERITY_STORAGE="$DATA/objects" \
    "$V" models import --name "$MODEL" --hf "$MODEL_DIR"
fi

# The data: the arithmetic prompts, a cold-start set answering in the format the grader reads
# (64 chats), and the first VALIDATION_ROWS validation rows.
python3 - "$root/examples/arithmetic" "$work" "$VALIDATION_ROWS" <<'PY'
import json, sys
src, out, n_valid = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{src}/train.jsonl")]
with open(f"{out}/cold_start.jsonl", "w") as f:
    for row in rows[:64]:
        answer = {"role": "assistant", "content": f"The answer is \\boxed{{{row['reference_answer']}}}."}
        f.write(json.dumps({"messages": row["messages"] + [answer]}) + "\n")
with open(f"{out}/validation.jsonl", "w") as f:
    for line in list(open(f"{src}/validation.jsonl"))[:n_valid]:
        f.write(line)
PY
train=$(cli files upload "$root/examples/arithmetic/train.jsonl")
cold=$(cli files upload "$work/cold_start.jsonl")
valid=$(cli files upload "$work/validation.jsonl")
grader=$(cat "$root/examples/arithmetic/grader.json")

sft() {  # sft FILE MODEL -> the job's fine_tuned_model
  local job
  job=$(cli jobs create --method supervised --training-file "$1" --model "$2" \
    --hyperparameters '{"batch_size": 8, "n_epochs": 1, "learning_rate": 2e-5, "checkpoint_interval": 100}')
  cli jobs watch "$job" >&2
  cli jobs show "$job" --json | field '["fine_tuned_model"]'
}

stage "1. cold-start SFT of $MODEL on 64 formatted chats"
sft_model=$(sft "$cold" "$MODEL")
echo "SFT model: $sft_model"

stage "2. RL (GRPO, math grader) from $sft_model"
cat >"$work/rl.json" <<JSON
{"model": "$sft_model", "training_file": "$train", "seed": 7,
 "method": {"type": "reinforcement", "reinforcement": {"grader": $grader, "hyperparameters": {
   "batch_size": 2, "group_size": 4, "max_completion_tokens": 40, "max_steps": 12,
   "learning_rate": 5e-6, "temperature": 0.8, "checkpoint_interval": 12, "micro_batch_size": 8}}}}
JSON
rl_job=$(cli jobs create --file "$work/rl.json")
cli jobs watch "$rl_job"
rl_model=$(cli jobs show "$rl_job" --json | field '["fine_tuned_model"]')
echo "RL model: $rl_model"

stage "3. rejection sampling: 4 samples of each of 128 training prompts from $rl_model"
python3 - "$root/examples/arithmetic/train.jsonl" "$work/prompts.jsonl" <<'PY'
import sys
lines = list(open(sys.argv[1]))[64:192]
open(sys.argv[2], "w").writelines(lines)
PY
prompts=$(cli files upload "$work/prompts.jsonl")
cat >"$work/rs.json" <<JSON
{"model": "$rl_model", "file": "$prompts", "grader": $grader, "k": 4, "policy": "best",
 "min_score": 1.0, "temperature": 0.8, "max_tokens": 40, "seed": 11}
JSON
rs=$(cli rejection-sampling create --body "$work/rs.json" --watch --json)
kept=$(echo "$rs" | field '["output_file"]')
echo "$rs" | python3 -c "import json,sys; s=json.load(sys.stdin)['summary']; s.pop('per_prompt', None); print(s)"

stage "4. SFT of a fresh $MODEL on the kept samples ($kept)"
distilled=$(sft "$kept" "$MODEL")
echo "distilled model: $distilled"

stage "5. evaluation of base, SFT, RL and distilled models on $VALIDATION_ROWS validation rows"
cat >"$work/eval.json" <<JSON
{"models": ["$MODEL", "$sft_model", "$rl_model", "$distilled"], "file": "$valid",
 "grader": $grader, "n": 4, "temperature": 0.8, "max_tokens": 40, "seed": 5}
JSON
evaluation=$(cli evaluations create --body "$work/eval.json" --watch --json | field '["id"]')
cli evaluations results "$evaluation" --csv
