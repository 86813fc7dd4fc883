#!/usr/bin/env bash
# Makes the two base images deploy/Dockerfile.server and Dockerfile.worker-cpu start from, for a
# machine that reaches Debian's packages and crates.io but no image registry (as these VMs):
#   docker.io/library/debian:bookworm-slim  Debian bookworm, minbase, made by mmdebstrap
#   docker.io/library/rust:1.95-bookworm    a stand-in: that Debian, gcc/make/pkg-config/git,
#                                           and this machine's Rust toolchain (rustc -V below)
# With a registry, skip this: the Dockerfiles pull the real images. Needs mmdebstrap and podman
# (ENGINE=docker for Docker); apt-get install mmdebstrap podman runc.
#
#   scripts/local-base-images.sh                # both
#   scripts/local-base-images.sh --debian-only  # only bookworm-slim (the runtime stages; the
#                                               # worker image test in cli/tests/worker_image.rs)
#   scripts/local-base-images.sh --services     # stand-ins for the compose file's third-party
#                                               # images, on bookworm-slim (made if missing):
#                                               # postgres:16, minio/minio, minio/mc
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${ENGINE:-podman}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

debian=docker.io/library/debian:bookworm-slim
rust=docker.io/library/rust:1.95-bookworm

if [ "${1:-}" = --services ]; then
  "$engine" image exists "$debian" || "$0" --debian-only
  echo "== docker.io/library/postgres:16 (a stand-in: Debian's PostgreSQL 15, deploy/local-base/Containerfile.postgres)"
  "$engine" build --build-arg "BASE_IMAGE=$debian" -t docker.io/library/postgres:16 \
    -f deploy/local-base/Containerfile.postgres deploy/local-base
  echo "== docker.io/minio/minio:latest and minio/mc:latest (a stand-in: moto, deploy/local-base/Containerfile.minio)"
  "$engine" build --build-arg "BASE_IMAGE=$debian" -t docker.io/minio/minio:latest \
    -f deploy/local-base/Containerfile.minio deploy/local-base
  "$engine" tag docker.io/minio/minio:latest docker.io/minio/mc:latest
  echo "local-base-images: OK (postgres:16, minio/minio:latest, minio/mc:latest stand-ins)"
  exit 0
fi

echo "== $debian (mmdebstrap bookworm, minbase, with this machine's extra CAs)"
mmdebstrap --variant=minbase --include=ca-certificates bookworm "$work/bookworm.tar"
"$engine" import "$work/bookworm.tar" localhost/verity-bookworm-minbase
rm "$work/bookworm.tar"
mkdir -p "$work/ca/extra-ca"
cp /usr/local/share/ca-certificates/*.crt "$work/ca/extra-ca/" 2>/dev/null || true
"$engine" build --build-arg BASE_IMAGE=localhost/verity-bookworm-minbase -t "$debian" \
  -f deploy/local-base/Containerfile.debian "$work/ca"

if [ "${1:-}" = --debian-only ]; then
  echo "local-base-images: OK ($debian)"
  exit 0
fi

echo "== $rust (Debian + this machine's toolchain: $(rustc -V))"
toolchain=$(rustc --print sysroot)
mkdir "$work/context"
cp -a "$toolchain" "$work/context/toolchain"
# Documentation is most of a toolchain's size and no build needs it.
rm -rf "$work/context/toolchain/share/doc"
"$engine" build --build-arg "BASE_IMAGE=$debian" -t "$rust" \
  -f deploy/local-base/Containerfile.rust "$work/context"
echo "local-base-images: OK ($debian, $rust)"
