#!/usr/bin/env bash
# Trains a 2-step reinforcement job (the addition example, its math grader) through the API at
# BASE with the API key KEY on model MODEL, waits for it, and checks that it succeeded with a
# checkpoint listed; on failure runs LOGS_COMMAND (e.g. `podman logs --tail 50 NAME`) if given.
# Used by scripts/verify-images-podman.sh and scripts/verify-compose-podman.sh.
#
#   scripts/train-through-api.sh BASE KEY MODEL [LOGS_COMMAND]
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: $0 BASE KEY MODEL [LOGS_COMMAND]}
auth=(-H "Authorization: Bearer ${2:?KEY}")
model=${3:?MODEL}
logs=${4:-}
json_field() { python3 -c "import json, sys; print(json.load(sys.stdin)$1)"; }

file=$(curl -fsS "${auth[@]}" -F purpose=fine-tune -F file=@examples/addition/train.jsonl \
  "$base/v1/files" | json_field '["id"]')
grader=$(cat examples/addition/grader.json)
job=$(curl -fsS "${auth[@]}" -H 'Content-Type: application/json' "$base/v1/fine_tuning/jobs" -d "{
  \"model\": \"$model\", \"training_file\": \"$file\",
  \"method\": {\"type\": \"reinforcement\", \"reinforcement\": {\"grader\": $grader,
    \"hyperparameters\": {\"max_steps\": 2, \"batch_size\": 1, \"group_size\": 2,
                          \"max_completion_tokens\": 16}}}}" | json_field '["id"]')
echo "job $job"
status=queued
for _ in $(seq 1 300); do
  status=$(curl -fsS "${auth[@]}" "$base/v1/fine_tuning/jobs/$job" | json_field '["status"]')
  case $status in succeeded|failed|cancelled) break ;; esac
  sleep 2
done
echo "job $job: $status"
if [ "$status" != succeeded ]; then
  [ -z "$logs" ] || bash -c "$logs" >&2
  exit 1
fi
checkpoints=$(curl -fsS "${auth[@]}" "$base/v1/fine_tuning/jobs/$job/checkpoints" \
  | json_field '["data"].__len__()')
echo "checkpoints listed: $checkpoints"
[ "$checkpoints" -ge 1 ]
