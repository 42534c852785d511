#!/usr/bin/env bash
# Build Muster's image from the Dockerfile with podman (no Docker engine, no image registry):
#
#   1. the base layer: a Debian bookworm root filesystem with Python 3.11, built from Debian
#      packages by hack/image/base.sh, cached as a tar under
#      $MUSTER_CACHE/image/<key>/base.tar (key: SHA-256 of base.sh's commands, the recipe:
#      comments do not count) and imported
#      as localhost/muster-base:<key>. Built once; later runs reuse the image or the tar.
#   2. the Dockerfile, with PYTHON_IMAGE pointing at that base, `podman build --isolation
#      chroot` (no daemon, no runtime needed), layers cached by podman: a source change
#      rebuilds only Muster's own layer, a lock-file change the dependencies'.
#
#   hack/build-image.sh                 # -> localhost/muster:dev
#   IMAGE=localhost/muster:test hack/build-image.sh
#
# Prints progress lines "muster-image: ..." on stderr and the image name on stdout. Needs
# root (debootstrap, chroot builds), podman and debootstrap (Debian: apt-get install -y
# podman debootstrap), PyPI and a Debian mirror. Elsewhere, `docker build .` builds the same
# Dockerfile on the public python:3.11-slim-bookworm.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGE=${IMAGE:-localhost/muster:dev}
CACHE=${MUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/muster}

step() { printf 'muster-image: %s\n' "$*" >&2; }
need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "error: $1 is required (Debian: apt-get install -y $1)" >&2
        exit 2
    fi
}

need podman
key=$(grep -v '^[[:space:]]*#' "$ROOT/hack/image/base.sh" | sha256sum | cut -c1-16)
base=localhost/muster-base:$key
dir=$CACHE/image/$key
start=$SECONDS

if podman image exists "$base"; then
    step "base $base: cached"
else
    if [[ -f $dir/base.tar ]]; then
        step "base: root filesystem cached in $dir"
    else
        need debootstrap
        step "base: building a Debian root filesystem (cold cache: a few minutes) into $dir"
        mkdir -p "$dir"
        "$ROOT/hack/image/base.sh" "$dir/base.tar"
    fi
    step "base: importing $base"
    podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' \
        "$dir/base.tar" "$base" >/dev/null
fi

args=(--isolation chroot --layers --pull=never --tag "$IMAGE"
      --build-arg "PYTHON_IMAGE=$base"
      --build-arg "VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")"
      --build-arg "REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)")
# Behind a TLS-inspecting proxy pip needs the host's CA bundle; only the build steps see it.
ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [[ -n $ca && -f $ca ]]; then
    args+=(--volume "$ca:/run/muster-build-ca.crt:ro" --build-arg PIP_CERT=/run/muster-build-ca.crt)
fi
step "building $IMAGE from the Dockerfile on $base"
podman build "${args[@]}" "$ROOT" >&2
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
step "built $IMAGE: $((size / 1000000)) MB, in $((SECONDS - start)) s"
echo "$IMAGE"
