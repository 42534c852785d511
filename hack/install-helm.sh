#!/usr/bin/env bash
# Build helm from its Go module (no prebuilt binary can be downloaded on our machines) into a
# cache outside the clone, and print the binary's path. Cached by version: the second call
# prints the path at once. A lock beside the cache (flock) lets one build run at a time: a
# second call waits for the first, says so, and then finds helm built.
#
#   hack/install-helm.sh                  # -> ~/.cache/muster/helm/v3.22.0/helm
#   HELM_VERSION=v3.22.0 MUSTER_CACHE=/somewhere hack/install-helm.sh
#
# Needs the go command (1.24 or newer) and the Go module proxy. The first build took 7 min on a
# 2-core machine with cold Go caches (while other builds shared the CPU).
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${MUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/muster}
DIR="$CACHE/helm/$HELM_VERSION"

if [[ -x $DIR/helm ]]; then
    echo "$DIR/helm"
    exit 0
fi
mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
if ! flock --nonblock 9; then
    echo "install-helm.sh: another build is writing $DIR (it holds $DIR.lock); waiting for it" >&2
    flock 9
    if [[ -x $DIR/helm ]]; then
        echo "install-helm.sh: the other build completed $DIR" >&2
        echo "$DIR/helm"
        exit 0
    fi
    echo "install-helm.sh: the other build stopped before completing $DIR; building" >&2
fi
if ! command -v go >/dev/null 2>&1; then
    echo "error: go is required to build helm (Debian: apt-get install -y golang-go)" >&2
    exit 2
fi
echo "building helm $HELM_VERSION from helm.sh/helm/v3 into $DIR" >&2
tmp="$DIR.tmp.$$"
rm -rf "$tmp"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
# The machine's own toolchain (GOTOOLCHAIN=local): a build must never fetch another one.
GOBIN="$tmp" GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod \
    go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
"$tmp/helm" version --short >&2
rm -rf "$DIR"
mv "$tmp" "$DIR"
echo "$DIR/helm"
