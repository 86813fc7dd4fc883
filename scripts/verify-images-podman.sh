#!/usr/bin/env bash
# The images built and run with podman, on a machine without Docker or an image registry (make
# the base images first: scripts/local-base-images.sh). Builds the server and CPU worker images
# from deploy/Dockerfile.* unchanged, checks each runs `verity` as uid 10001 and that the
# worker image's sandbox starts under the compose file's security options, then runs the
# images as a small cluster on the host's network — `verity migrate`, `verity serve` and
# `verity worker` in containers, against a scratch database on the host's Postgres and a local
# object store shared by bind mount — registers a model through the server image, and trains a
# 2-step reinforcement job through the API to success.
#
#   scripts/verify-images-podman.sh MODEL_DIR    # an HF folder, e.g. the SmolLM2 test model
#   (env: DATABASE_ADMIN_URL, default postgres://postgres@127.0.0.1:5432/postgres;
#    PORT, default 18095; SKIP_BUILD=1 uses the images already built)
set -euo pipefail
cd "$(dirname "$0")/.."
model_dir=$(realpath "${1:?usage: $0 MODEL_DIR (an HF folder)}")
admin_url=${DATABASE_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres}
port=${PORT:-18095}
db=verity_images_$$
database_url=${admin_url%/*}/$db
store=$(mktemp -d /tmp/verity-images-store.XXXXXX)
chown 10001:10001 "$store"
# The images run as uid 10001: the model goes in through a copy that uid can read.
model_copy=$(mktemp -d /tmp/verity-images-model.XXXXXX)
cp -r "$model_dir/." "$model_copy/"
chmod -R a+rX "$model_copy"
name=verity-verify-$$
server=localhost/verity-server:local
worker=localhost/verity-worker-cpu:local
sandbox=(--security-opt seccomp=deploy/seccomp/verity-sandbox.json --security-opt apparmor=unconfined
  --security-opt systempaths=unconfined)

cleanup() {
  podman rm -f "$name-server" "$name-worker" >/dev/null 2>&1 || true
  psql "$admin_url" -q -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
  rm -rf "$store" "$model_copy"
}
trap cleanup EXIT

if [ -z "${SKIP_BUILD:-}" ]; then
  echo "== build (deploy/Dockerfile.server, deploy/Dockerfile.worker-cpu)"
  podman build -f deploy/Dockerfile.server -t "$server" .
  podman build -f deploy/Dockerfile.worker-cpu -t "$worker" .
fi

echo "== each image runs its binary as uid 10001"
podman run --rm "$server" --version
[ "$(podman run --rm --entrypoint id "$server" -u)" = 10001 ]
podman run --rm "$worker" --version
[ "$(podman run --rm --entrypoint id "$worker" -u)" = 10001 ]
echo "== the worker image's sandbox starts (bubblewrap + python3, the compose file's options)"
podman run --rm "${sandbox[@]}" --entrypoint bwrap "$worker" \
  --unshare-all --unshare-user --die-with-parent --new-session \
  --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin \
  --proc /proc --dev /dev --tmpfs /tmp python3 -c 'print("sandbox ok")'

echo "== the cluster: migrate, serve and a worker in containers (database $db, store $store)"
psql "$admin_url" -q -c "CREATE DATABASE $db"
env_args=(-e "DATABASE_URL=$database_url" -e VERITY_STORAGE=/store -e RUST_LOG=warn)
podman run --rm --network host "${env_args[@]}" -v "$store:/store" "$server" migrate
podman run --rm --network host "${env_args[@]}" -v "$store:/store" -v "$model_copy:/model:ro" \
  "$server" models import --name verify-model --hf /model
podman run -d --name "$name-server" --network host "${env_args[@]}" -v "$store:/store" \
  -e "VERITY_BIND=127.0.0.1:$port" -e "VERITY_JWT_SECRET=$(openssl rand -hex 32)" "$server" serve
podman run -d --name "$name-worker" --network host "${env_args[@]}" -v "$store:/store" \
  "${sandbox[@]}" "$worker" worker --device cpu --memory-mb 8192
base=http://127.0.0.1:$port
for _ in $(seq 1 60); do
  curl -fsS "$base/readyz" >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS "$base/readyz"
echo
podman exec "$name-server" verity admin create-user --email ops@example.com --org ops --role admin \
  --password 'a long password for the check'
key=$(podman exec "$name-server" verity admin create-key --email ops@example.com --name verify \
  | sed -n 's/.*"api_key":"\([^"]*\)".*/\1/p')
[ -n "$key" ] || { echo "verify-images-podman: no API key printed" >&2; exit 1; }

echo "== a reinforcement job through the API, trained by the worker container"
scripts/train-through-api.sh "$base" "$key" verify-model "podman logs --tail 50 $name-worker"
echo "verify-images-podman: OK"
