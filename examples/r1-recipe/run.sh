#!/usr/bin/env bash
# The DeepSeek-R1 recipe in miniature, on a laptop CPU with SmolLM2-135M-Instruct and the
# addition set (examples/addition, the demo's task; TASK=arithmetic for examples/arithmetic), as
# ONE recipe (POST /v1/verity/recipes, docs/recipes.md) that the queue runs stage by stage:
#
#   1. cold_start: light SFT on a few chats answering in a fixed format    (fine_tuning_job)
#   2. rl: GRPO with the math grader from the cold-start model, after its   (fine_tuning_job)
#      guard (a difficulty profile) predicted groups with an advantage
#   3. rs: rejection sampling of the RL model on other training prompts     (rejection_sampling)
#   4. distill: SFT of a fresh base on the kept samples                     (fresh_base: true)
#   5. eval: base, cold-start, RL and distilled models on held-out rows     (evaluation)
#
# Usage: examples/r1-recipe/run.sh   (VERITY_BIN, DATA_DIR, PORT, SEED, TASK, OUT; for the
# addition task COLD_START_EPOCHS and COLD_START_LR set the cold start's strength)
# It starts `verity up` in DATA_DIR (a private Postgres cluster and object store), registers the
# SmolLM2 folder from the model cache (`scripts/fetch-test-model.sh` or `verity up --demo` puts it
# there), creates the recipe, follows it to its end, writes the recipe object and the report's
# CSV to OUT (default ./r1-recipe-seed-SEED.{json,csv}) and stops the server. A guard that pauses
# the recipe is reported and, with RESUME_PAST_GUARD=1, resumed past.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
V=${VERITY_BIN:-verity}
DATA=${DATA_DIR:-$root/.verity-recipe}
PORT=${PORT:-8091}
SEED=${SEED:-7}
TASK=${TASK:-addition}
OUT=${OUT:-$PWD/r1-recipe-$TASK-seed-$SEED}
MODEL=smollm2-135m-instruct
MODEL_DIR=${VERITY_MODEL_DIR:-${VERITY_MODEL_CACHE:-$HOME/.cache/verity/models}/$MODEL}
work=$(mktemp -d)
export VERITY_URL="http://127.0.0.1:$PORT" VERITY_DATA_DIR="$DATA"
cli() { "$V" "$@" --url "$VERITY_URL" --data-dir "$DATA"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

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

# The files (all from examples/$TASK): the cold-start chats, the RL prompts, the prompts to
# rejection-sample, the held-out rows; then the recipe: examples/recipes/r1.json with these
# files, this seed and the task's settings (README.md says why these).
python3 - "$root/examples/$TASK" "$work" "$TASK" <<'PY'
import json, sys
src, out, task = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{src}/train.jsonl")]
valid = list(open(f"{src}/validation.jsonl"))
if task == "addition":
    # 16 of the 65 training sums as chats answering in one line; RL and rejection sampling on
    # all 65; the 16 held-out sums.
    cold, rl, rs, held_out = rows[:16], rows, rows, valid
else:
    # 32 chats; RL on the training file; 128 other prompts to sample; 32 held-out rows.
    cold, rl, rs, held_out = rows[:32], rows, rows[64:192], valid[:32]
with open(f"{out}/cold_start.jsonl", "w") as f:
    for row in cold:
        answer = {"role": "assistant", "content": f"The answer is \\boxed{{{row['reference_answer']}}}."}
        f.write(json.dumps({"messages": row["messages"] + [answer]}) + "\n")
for name, part in [("rl", rl), ("rs", rs)]:
    with open(f"{out}/{name}.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in part)
open(f"{out}/validation.jsonl", "w").writelines(held_out)
PY
cold=$(cli files upload "$work/cold_start.jsonl")
train=$(cli files upload "$work/rl.jsonl")
prompts=$(cli files upload "$work/rs.jsonl")
valid=$(cli files upload "$work/validation.jsonl")
python3 - "$root/examples/recipes/r1.json" "$work/recipe.json" "$SEED" "$TASK" "$cold" "$train" "$prompts" "$valid" <<'PY'
import json, os, sys
template, out, seed, task, cold, train, prompts, valid = sys.argv[1:]
recipe = json.load(open(template))
recipe["name"] = f"R1 recipe, {task}, seed {seed}"
recipe["seed"] = int(seed)
stages = {s["name"]: s for s in recipe["stages"]}
stages["cold_start"]["fine_tuning_job"]["training_file"] = cold
stages["rl"]["fine_tuning_job"]["training_file"] = train
stages["rs"]["rejection_sampling"]["file"] = prompts
stages["eval"]["evaluation"]["file"] = valid
if task == "addition":
    # The demo's RL settings (verity up --demo: pass@1 ~0.1 -> ~0.9 in 12 steps), 32 tokens.
    sft = {"n_epochs": int(os.environ.get("COLD_START_EPOCHS", "1")), "batch_size": 4,
           "learning_rate": float(os.environ.get("COLD_START_LR", "1e-5"))}
    stages["cold_start"]["fine_tuning_job"]["method"]["supervised"]["hyperparameters"] = sft
    stages["rl"]["fine_tuning_job"]["method"]["reinforcement"]["hyperparameters"] = {
        "batch_size": 4, "group_size": 8, "max_completion_tokens": 32, "max_steps": 12,
        "learning_rate": 2e-5, "temperature": 1.0, "micro_batch_size": 16}
    stages["rs"]["rejection_sampling"].update({"k": 4, "temperature": 1.0, "max_tokens": 32})
    stages["distill"]["fine_tuning_job"]["method"]["supervised"]["hyperparameters"] = {
        "n_epochs": 2, "batch_size": 8, "learning_rate": 2e-5}
    stages["eval"]["evaluation"].update({"n": 8, "temperature": 1.0, "max_tokens": 32})
# Only the final checkpoint of each job: a full-weights checkpoint of this model with its
# optimizer state is ~1.6 GB.
for stage in recipe["stages"]:
    method = stage.get("fine_tuning_job", {}).get("method")
    if method:
        hp = method[method["type"]].setdefault("hyperparameters", {})
        hp["checkpoint_interval"] = 1000
json.dump(recipe, open(out, "w"), indent=1)
PY
started=$(date +%s)
id=$(cli recipes create --body "$work/recipe.json")
echo "recipe $id"
while true; do
  if cli recipes watch "$id" >"$work/watch.txt" 2>&1; then break; fi
  status=$(cli recipes show "$id" --json | field '["status"]')
  if [ "$status" = paused ] && [ "${RESUME_PAST_GUARD:-0}" = 1 ]; then
    cli recipes show "$id" --json | field '["error"]["message"]' >&2
    echo "resuming past the guard (RESUME_PAST_GUARD=1)" >&2
    cli recipes resume "$id" >/dev/null
    continue
  fi
  cat "$work/watch.txt" >&2
  cli recipes show "$id" --json >"$OUT.json"
  exit 1
done
cli recipes show "$id"
cli recipes show "$id" --json >"$OUT.json"
evaluation=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print([s for s in r['stages'] if s['name']=='eval'][0]['id'])" "$OUT.json")
cli evaluations results "$evaluation" --csv | tee "$OUT.csv"
echo "wall time: $(( $(date +%s) - started )) s"
echo "$(du -sh "$DATA" | cut -f1) in $DATA (its models and checkpoints; delete it when done)"
