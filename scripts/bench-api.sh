#!/usr/bin/env bash
# API latency benchmark (a benchmark, not a test): wrk on loopback against `verity serve`, for
# `GET /v1/fine_tuning/jobs/{id}` and the metrics of a job with 10,000 steps (whole document,
# and the incremental `?after_step=` poll a dashboard makes).
#
#   scripts/bench-api.sh [VERITY_BINARY]      # default: target/release/verity
#
# Needs wrk (`apt install wrk`), psql, curl, a PostgreSQL on DATABASE_URL's server (default
# postgres://postgres@127.0.0.1:5432/postgres; a scratch database verity_bench_api is created
# and dropped) and the SmolLM2 test model folder (VERITY_TEST_MODEL_DIR, from
# scripts/fetch-test-model.sh) to register as the job's base model.
set -euo pipefail
cd "$(dirname "$0")/.."
verity=${1:-${CARGO_TARGET_DIR:-target}/release/verity}
model=${VERITY_TEST_MODEL_DIR:?set VERITY_TEST_MODEL_DIR (scripts/fetch-test-model.sh)}
connections=${BENCH_CONNECTIONS:-200}
duration=${BENCH_DURATION:-20s}
admin_url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
database=verity_bench_api
url="${admin_url%/*}/$database"
port=${BENCH_PORT:-18080}
work=$(mktemp -d)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  psql "$admin_url" -qc "DROP DATABASE IF EXISTS $database" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
command -v wrk >/dev/null || { echo "bench-api: wrk is not installed (apt install wrk)" >&2; exit 1; }
psql "$admin_url" -qc "DROP DATABASE IF EXISTS $database" -c "CREATE DATABASE $database" >/dev/null
export DATABASE_URL=$url VERITY_STORAGE=$work/objects
"$verity" migrate >/dev/null
"$verity" admin create-user --email bench@example.com --org bench --role admin >/dev/null
key=$("$verity" admin create-key --email bench@example.com --name bench | grep -o 'vt-[A-Za-z0-9_-]*' | head -n 1)
"$verity" models import --name smollm2 --hf "$model" >/dev/null
"$verity" serve --bind "127.0.0.1:$port" --jwt-secret bench-secret-0123456789abcdef0123456789 \
  --rate-limit-rps 1000000 --rate-limit-burst 1000000 > "$work/server.log" 2>&1 &
server=$!
base="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -fs "$base/healthz" >/dev/null && break; sleep 0.2; done
auth="Authorization: Bearer $key"
file=$(curl -fsS -H "$auth" -F purpose=fine-tune -F file=@examples/arithmetic/train.jsonl "$base/v1/files" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
body=$(python3 -c '
import json, sys
grader = json.load(open("examples/arithmetic/grader.json"))
print(json.dumps({"model": "smollm2", "training_file": sys.argv[1],
                  "method": {"type": "reinforcement", "reinforcement": {"grader": grader}}}))' "$file")
job=$(curl -fsS -H "$auth" -H 'Content-Type: application/json' -d "$body" "$base/v1/fine_tuning/jobs" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
# 10,000 steps of the metrics a GRPO step records, written as if by a worker (the session skips
# the trigger that fences writes to the attempt holding the job).
psql "$url" -q <<SQL
SET session_replication_role = replica;
INSERT INTO job_metrics (job_id, step, attempt, data)
SELECT '$job', s, 1, jsonb_build_object(
  'reward_mean', random(), 'reward_std', random(), 'accuracy', random(), 'grader_errors', 0,
  'completion_length_mean', 40 + 20 * random(), 'completion_length_max', 64, 'truncated_fraction', random(),
  'entropy', random(), 'kl', random() / 100, 'clip_fraction_low', random() / 10, 'clip_fraction_high', random() / 10,
  'zero_advantage_fraction', random(), 'groups_drawn', 2, 'grad_norm', random(), 'learning_rate', 1e-5,
  'tokens_per_second', 100 * random(), 'sampling_seconds', 10 * random(), 'grading_seconds', random() / 100,
  'training_seconds', 10 * random(), 'loss', random() - 0.5, 'sampler_kl', random() / 1000)
FROM generate_series(1, 10000) AS s;
SQL
metrics_bytes=$(curl -fsS -H "$auth" "$base/v1/fine_tuning/jobs/$job/metrics" | wc -c)
echo "bench-api: job $job, metrics document $metrics_bytes bytes; wrk -c $connections -d $duration"
run() {
  local label=$1 path=$2 conns=$3
  echo "== $label ($conns connections)"
  wrk -t "$(( conns < 2 ? 1 : 2 ))" -c "$conns" -d "$duration" --latency -H "$auth" "$base$path" |
    grep -E 'Requests/sec|^ +(50|99)%|Non-2xx|Socket errors|timeout'
}
run "GET /v1/fine_tuning/jobs/{id}" "/v1/fine_tuning/jobs/$job" "$connections"
run "GET …/metrics?after_step=9990 (incremental poll)" "/v1/fine_tuning/jobs/$job/metrics?after_step=9990" "$connections"
run "GET …/metrics?limit=100" "/v1/fine_tuning/jobs/$job/metrics?limit=100" "$connections"
run "GET …/metrics (whole job, cached)" "/v1/fine_tuning/jobs/$job/metrics" 1
run "GET …/metrics (whole job, cached)" "/v1/fine_tuning/jobs/$job/metrics" "$connections"
