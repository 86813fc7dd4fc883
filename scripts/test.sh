#!/usr/bin/env bash
# Runs Verity's whole test suite, installing and starting what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/test-services.sh
# Compile-time checked queries use the committed .sqlx/ data; no database is needed to build.
export SQLX_OFFLINE=true
cargo test --workspace --locked "$@"
