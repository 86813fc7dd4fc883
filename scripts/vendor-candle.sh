#!/usr/bin/env bash
# Re-creates vendor/candle-core from the crates.io release of candle-core and Verity's patch
# (vendor/patches/candle-core-verity.patch; what it changes and why: vendor/VERITY-PATCH.md).
#
#   scripts/vendor-candle.sh                 replace vendor/candle-core with release + patch
#   scripts/vendor-candle.sh --check         exit 1 unless vendor/candle-core == release + patch
#   scripts/vendor-candle.sh --update-patch  rewrite the patch from the edited vendor/candle-core
#
# The release is fetched with cargo (from its registry cache when it is there) and its
# .crate file must have the sha256 below, the checksum the crates.io index publishes for it.
# To move to another release: change VERSION and SHA256, run --update-patch on the old tree
# first if it has edits, then re-create, and fix whatever part of the patch no longer applies.
set -euo pipefail

VERSION=0.11.1
SHA256=d11c8be87cfbaef9ebb62fb3f850d1fc8e00cc1d11d393fdbe55a4d5c2cdb325

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
vendored=$root/vendor/candle-core
patch_file=$root/vendor/patches/candle-core-verity.patch
mode=${1:-apply}
case $mode in
    apply | --check | --update-patch) ;;
    *)
        echo "usage: $0 [--check | --update-patch]" >&2
        exit 2
        ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The .crate file: cargo downloads it (checking it against the index) into its registry cache.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
find_crate() {
    find "$cargo_home/registry/cache" -name "candle-core-$VERSION.crate" -print -quit 2>/dev/null
}
crate=$(find_crate || true)
if [ -z "$crate" ]; then
    mkdir -p "$work/fetch/src"
    printf '[package]\nname = "fetch"\nversion = "0.0.0"\nedition = "2021"\n\n[dependencies]\ncandle-core = "=%s"\n' \
        "$VERSION" >"$work/fetch/Cargo.toml"
    : >"$work/fetch/src/lib.rs"
    # Resolve candle-core's dependencies to the workspace's versions: nothing new to download.
    cp "$root/Cargo.lock" "$work/fetch/"
    cargo fetch --quiet --manifest-path "$work/fetch/Cargo.toml"
    crate=$(find_crate)
fi
if [ -z "$crate" ]; then
    echo "candle-core-$VERSION.crate not found under $cargo_home/registry/cache" >&2
    exit 1
fi
if [ "$(sha256sum "$crate" | cut -d' ' -f1)" != "$SHA256" ]; then
    echo "$crate does not have the sha256 $SHA256" >&2
    exit 1
fi

# a/: the release as published; b/: the release with the patch (or, for --update-patch, the
# vendored tree). The patch's paths are a/... and b/..., relative to the crate's root.
tar -xzf "$crate" -C "$work"
mv "$work/candle-core-$VERSION" "$work/a"

if [ "$mode" = --update-patch ]; then
    cp -a "$vendored" "$work/b"
    # diff exits 1 when the trees differ; the timestamps are dropped from the file headers.
    (cd "$work" && diff -ruN a b || [ $? -eq 1 ]) |
        sed -E 's/^((---|\+\+\+) [^\t]*)\t.*$/\1/' >"$work/patch"
    mv "$work/patch" "$patch_file"
    echo "wrote $patch_file"
    exit 0
fi

cp -a "$work/a" "$work/b"
patch --quiet --directory="$work/b" --strip=1 --fuzz=0 --force --no-backup-if-mismatch \
    --reject-file=- <"$patch_file" || {
    echo "$patch_file does not apply cleanly to candle-core $VERSION" >&2
    exit 1
}

if [ "$mode" = --check ]; then
    if diff -r "$work/b" "$vendored" >"$work/differences"; then
        echo "vendor/candle-core is candle-core $VERSION with vendor/patches/candle-core-verity.patch"
        exit 0
    fi
    echo "vendor/candle-core differs from candle-core $VERSION + the patch:" >&2
    cat "$work/differences" >&2
    exit 1
fi

rm -rf "$vendored"
cp -a "$work/b" "$vendored"
echo "re-created vendor/candle-core: candle-core $VERSION + vendor/patches/candle-core-verity.patch"
