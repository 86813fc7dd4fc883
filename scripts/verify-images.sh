#!/usr/bin/env bash
# For an operator with Docker (BuildKit) and the Compose plugin: builds the server and CPU worker
# images from this checkout and checks them the way the cluster test checks the processes.
# Never run here (these machines have no Docker daemon); see docs/deployment.md.
#
#   scripts/verify-images.sh            # build, smoke-test each image, then the compose stack
#   KEEP=1 scripts/verify-images.sh     # leave the compose stack running afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
compose=(docker compose -f deploy/docker-compose.yml -p verity-verify)
export VERITY_JWT_SECRET=${VERITY_JWT_SECRET:-$(openssl rand -hex 32)}

echo "== static checks of deploy/ (the same as CI)"
scripts/check-deploy.sh
docker compose -f deploy/docker-compose.yml config --quiet

echo "== build"
docker build -f deploy/Dockerfile.server -t verity-server:local .
docker build -f deploy/Dockerfile.worker-cpu -t verity-worker-cpu:local .

echo "== each image runs its binary as uid 10001"
docker run --rm verity-server:local --version
docker run --rm --entrypoint id verity-server:local -u | grep -qx 10001
docker run --rm verity-worker-cpu:local --version
echo "== the worker image's sandbox starts (bubblewrap + python3, as the compose file runs it)"
docker run --rm --security-opt seccomp=deploy/seccomp/verity-sandbox.json --security-opt apparmor=unconfined \
  --security-opt systempaths=unconfined --entrypoint bwrap verity-worker-cpu:local \
  --unshare-all --unshare-user --die-with-parent --new-session \
  --ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin \
  --proc /proc --dev /dev --tmpfs /tmp python3 -c 'print("sandbox ok")'

echo "== the compose stack: Postgres, MinIO, migrate, server, 2 workers"
cleanup() { [ -n "${KEEP:-}" ] || "${compose[@]}" down -v; }
trap cleanup EXIT
"${compose[@]}" up -d --scale worker=2
for _ in $(seq 1 90); do
  curl -fsS http://127.0.0.1:8080/readyz >/dev/null 2>&1 && break
  sleep 2
done
curl -fsS http://127.0.0.1:8080/readyz
echo
"${compose[@]}" exec -T server verity admin create-user --email ops@example.com --org ops --role admin
key=$("${compose[@]}" exec -T server verity admin create-key --email ops@example.com --name verify \
  | sed -n 's/.*"api_key":"\([^"]*\)".*/\1/p')
[ -n "$key" ] || { echo "verify-images: no API key printed" >&2; exit 1; }
curl -fsS -H "Authorization: Bearer $key" http://127.0.0.1:8080/v1/fine_tuning/jobs >/dev/null
echo "== ${compose[*]}: the API answers with a key; workers:"
"${compose[@]}" ps worker
echo "verify-images: OK (next: a job end to end, e.g. VERITY_URL=http://127.0.0.1:8080 VERITY_API_KEY=\$key verity jobs create …)"
