#!/usr/bin/env bash
# deploy/docker-compose.yml run by Docker Compose on podman (its Docker API): Postgres, the S3
# store and its bucket, the migration, the server, a worker and the inference worker, each from
# the image the file names, in the order its health and completion conditions give; then a
# user, an API key and a model registered inside the server container, a reinforcement job
# trained through the API to success by the worker container, a `code` grader run through
# graders/run in the server container's sandbox, and the stack torn down with its volumes.
#
#   scripts/verify-compose-podman.sh MODEL_DIR [VERITY_BINARY]
#
# MODEL_DIR: an HF folder (e.g. the SmolLM2 test model). With VERITY_BINARY, the images
# `verity-server:local` and `verity-worker-cpu:local` are the Dockerfiles' `runtime` stages plus
# that binary (no release build); without it, the full Dockerfiles are built. Where no registry
# is reachable, the third-party images are stand-ins made by `scripts/local-base-images.sh
# --services` (postgres:16 from Debian's PostgreSQL, minio from moto).
#
# What this machine's tools change, in a copy of the compose file (deploy/.verify-compose.yml,
# removed after): Debian's Docker Compose is 1.29, which does not know the top-level `name:`
# (the project is named with -p instead); and podman 4.3's Docker API cannot take a seccomp
# profile inline, which is how Compose sends a file, so the sandbox runs `seccomp=unconfined`
# here (the profile itself is checked under podman by cli/tests/worker_image.rs and the
# container cluster test). podman 4.3 also runs healthchecks only through systemd, absent here:
# this script runs them. Needs podman and docker-compose (`apt-get install podman
# docker-compose`); port 8080 must be free (the compose file publishes the API there).
set -euo pipefail
cd "$(dirname "$0")/.."
model_dir=$(realpath "${1:?usage: $0 MODEL_DIR [VERITY_BINARY]}")
binary=${2:-}
project=verifycompose
work=$(mktemp -d)
socket=$work/podman.sock
podman system service --time=0 "unix://$socket" >"$work/podman-service.log" 2>&1 &
service=$!
export DOCKER_HOST=unix://$socket
grep -v '^name: ' deploy/docker-compose.yml \
  | sed 's#seccomp=./seccomp/verity-sandbox.json#seccomp=unconfined#' >deploy/.verify-compose.yml
compose=(docker-compose -p "$project" -f deploy/.verify-compose.yml)
export VERITY_JWT_SECRET
VERITY_JWT_SECRET=$(openssl rand -hex 32)
down() { "${compose[@]}" down -v >/dev/null 2>&1 || true; }
healthchecks=
trap 'down; [ -z "$healthchecks" ] || kill "$healthchecks"; kill "$service"; rm -rf "$work" deploy/.verify-compose.yml' EXIT
for _ in $(seq 1 50); do [ -S "$socket" ] && break; sleep 0.1; done
down # a stack left by an interrupted run
# podman runs a container's healthcheck through a systemd timer; without systemd, run them here.
(while true; do
  for name in $(podman ps --filter health=starting --format '{{.Names}}'); do
    podman healthcheck run "$name" >/dev/null 2>&1 || true
  done
  sleep 2
done) &
healthchecks=$!

if [ -n "$binary" ]; then
  echo "== the images: the Dockerfiles' runtime stages with $binary"
  cp "$binary" "$work/verity"
  mkdir "$work/empty"
  for image in server worker-cpu; do
    podman build -q --target runtime -t "localhost/verity-$image-runtime:compose" \
      -f "deploy/Dockerfile.$image" "$work/empty" >/dev/null
    printf 'FROM localhost/verity-%s-runtime:compose\nCOPY verity /usr/local/bin/verity\n' \
      "$image" >"$work/Containerfile"
    podman build -q -t "localhost/verity-$image:local" -f "$work/Containerfile" "$work" >/dev/null
  done
else
  echo "== the images: deploy/Dockerfile.server and deploy/Dockerfile.worker-cpu (release builds)"
  podman build -t localhost/verity-server:local -f deploy/Dockerfile.server .
  podman build -t localhost/verity-worker-cpu:local -f deploy/Dockerfile.worker-cpu .
fi

echo "== ${compose[*]} up"
"${compose[@]}" up -d
base=http://127.0.0.1:8080
ready=
for _ in $(seq 1 120); do
  if curl -fsS "$base/readyz" >/dev/null 2>&1; then ready=1; break; fi
  sleep 1
done
if [ -z "$ready" ]; then
  "${compose[@]}" ps >&2 || true
  "${compose[@]}" logs >&2 || true
  echo "verify-compose-podman: the server never answered /readyz" >&2
  exit 1
fi
curl -fsS "$base/readyz"
echo
server=${project}_server_1
worker=${project}_worker_1
podman exec "$server" verity admin create-user --email ops@example.com --org ops --role admin \
  --password 'a long password for the check' >/dev/null
key=$(podman exec "$server" verity admin create-key --email ops@example.com --name verify \
  | sed -n 's/.*"api_key":"\([^"]*\)".*/\1/p')
[ -n "$key" ] || { echo "verify-compose-podman: no API key printed" >&2; exit 1; }
echo "== the model, registered through the server container (into the S3 store)"
podman cp "$model_dir" "$server:/tmp/model"
podman exec "$server" verity models import --name compose-model --hf /tmp/model

echo "== a reinforcement job, trained by the worker container"
scripts/train-through-api.sh "$base" "$key" compose-model "podman logs --tail 50 $worker"

echo "== graders/run with a code grader, in the server container's sandbox"
reward=$(curl -fsS -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  "$base/v1/fine_tuning/alpha/graders/run" -d '{"item": {},
    "grader": {"type": "code", "name": "double", "language": "python",
               "tests": "assert double(2) == 4", "scoring": "all_pass"},
    "model_sample": "```python\ndef double(x):\n    return 2 * x\n```"}' \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["reward"])')
echo "reward $reward"
[ "$reward" = 1.0 ]
echo "verify-compose-podman: OK"
