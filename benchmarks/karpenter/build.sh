#!/usr/bin/env bash
# Build Karpenter's scheduling benchmark (BenchmarkScheduling<N> in
# sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling, build tag test_performance) as a
# Go test binary, from the module at the version pinned below. The module ships its _test.go
# files, so a throwaway module that requires it can compile that package's tests.
#
# The binary goes to a cache outside the clone (like hack/cluster/build.sh), keyed by version;
# a second run with the cache prints its path and does nothing else, and a flock keeps two
# concurrent runs from building twice.
#
#   benchmarks/karpenter/build.sh          build if missing, print the test binary's path
#   benchmarks/karpenter/build.sh --print  print the path only (exit 1 if not built)
set -euo pipefail

# The newest release whose go directive the machine's Go (1.26.8) accepts.
KARPENTER_VERSION="${MUSTER_KARPENTER_VERSION:-v1.14.1}"
here="$(cd "$(dirname "$0")" && pwd)"
bench="$here/muster_bench_test.go"
cache_root="${MUSTER_KARPENTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/muster/karpenter}"
# Keyed by the version and the added benchmark file, so editing either rebuilds exactly once.
out="$cache_root/$KARPENTER_VERSION/$(cat "$bench" "$0" | sha256sum | cut -c1-12)"
bin="$out/scheduling.test"
pkg="sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"

if [[ "${1:-}" == "--print" ]]; then
    [[ -f "$out/.complete" ]] || exit 1
    echo "$bin"
    exit 0
fi
if [[ -f "$out/.complete" ]]; then
    echo "$bin"
    exit 0
fi

command -v go >/dev/null || { echo "build.sh: the go command is needed (Go >= 1.26)" >&2; exit 2; }
mkdir -p "$out/src"
exec 9>"$out/.lock"
flock 9
# Another run may have finished the build while this one waited for the lock.
if [[ -f "$out/.complete" ]]; then
    echo "$bin"
    exit 0
fi

export GOFLAGS="-trimpath -mod=mod"
export CGO_ENABLED=0
export GOTOOLCHAIN=local
src="$out/src"
cat >"$src/go.mod" <<MOD
module muster.dev/bench/karpenter

go 1.26.0

require sigs.k8s.io/karpenter $KARPENTER_VERSION
MOD
cat >"$src/tools.go" <<'GO'
//go:build tools

package tools

import _ "sigs.k8s.io/karpenter/pkg/controllers/provisioning/scheduling"
GO
echo "[karpenter build] resolving $pkg@$KARPENTER_VERSION" >&2
(cd "$src" && go get "sigs.k8s.io/karpenter@$KARPENTER_VERSION" 2>&1 | grep -v '^go: downloading' >&2 || true)
# The package's tests import test-only helpers (ginkgo, gomega, the fake cloud provider and the
# environment) that go get of the package alone does not record.
(cd "$src" && go get -t "$pkg@$KARPENTER_VERSION" 2>&1 | grep -v '^go: downloading' >&2 || true)
# BenchmarkSchedulingMix (muster_bench_test.go) joins the package's own test files: it reuses
# their pod generators and scheduler setup. The go command does not let a build add files to
# the module cache (not even by -overlay), so the module is copied next to the throwaway one
# and required through a replace directive; its dependencies stay in the module cache.
moddir="$(cd "$src" && go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)"
rm -rf "$src/karpenter"
cp -r "$moddir" "$src/karpenter"
chmod -R u+w "$src/karpenter"
cp "$bench" "$src/karpenter/pkg/controllers/provisioning/scheduling/muster_bench_test.go"
(cd "$src" && go mod edit -replace "sigs.k8s.io/karpenter=./karpenter")
echo "[karpenter build] compiling the test binary" >&2
(cd "$src" && go test -c -vet=off -tags test_performance -o "$bin.tmp" "$pkg")
mv "$bin.tmp" "$bin"
echo "$KARPENTER_VERSION" >"$out/.complete"
echo "$bin"
