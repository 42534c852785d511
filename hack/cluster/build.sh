#!/usr/bin/env bash
# Build the real control plane Muster's real-cluster tier runs against, from Go modules at the
# versions pinned in versions.env: kube-apiserver, kube-controller-manager, kube-scheduler, etcd,
# kwok and the Kueue manager (plus Kueue's CRDs, copied from its module).
#
# The binaries go to a cache outside the clone, keyed by versions.env, so every clone, session
# and CI run on this machine shares one build; a second run with the cache prints its path and
# does nothing else. Go's own module and build caches (GOMODCACHE, GOCACHE) make a rebuild after
# a version bump incremental. A lock beside the cache directory (flock) lets one build write it
# at a time: a second build (another clone's tests, CI beside a developer) waits for the first,
# says so, and then finds the cache complete.
#
#   hack/cluster/build.sh            build what is missing, print the bin directory
#   hack/cluster/build.sh --print    print the bin directory only (exit 1 if not built)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env disable=SC1091  # shellcheck is not given -x by the tests
source "$here/versions.env"

key="$(sha256sum "$here/versions.env" | cut -c1-12)"
cache_root="${MUSTER_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/muster/cluster}"
out="$cache_root/$KUBERNETES_VERSION-$key"
bin="$out/bin"
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kueue)

if [[ "${1:-}" == "--print" ]]; then
    [[ -f "$out/.complete" ]] || exit 1
    echo "$bin"
    exit 0
fi
if [[ -f "$out/.complete" ]]; then
    echo "$bin"
    exit 0
fi

mkdir -p "$cache_root"
exec 9>"$out.lock"
if ! flock --nonblock 9; then
    echo "build.sh: another build is writing $out (it holds $out.lock); waiting for it" >&2
    flock 9
    if [[ -f "$out/.complete" ]]; then
        echo "build.sh: the other build completed $out" >&2
        echo "$bin"
        exit 0
    fi
    echo "build.sh: the other build stopped before completing $out; building" >&2
fi

command -v go >/dev/null || { echo "build.sh: the go command is needed (Go >= 1.26)" >&2; exit 2; }
mkdir -p "$bin" "$out/src"
export GOFLAGS="-trimpath -mod=mod"
export CGO_ENABLED=0
# A module's toolchain line must not send the go command looking for another Go release.
export GOTOOLCHAIN=local
start=$SECONDS
step() { printf '[cluster build %4ds] %s\n' "$((SECONDS - start))" "$*" >&2; }

build_kubernetes() {
    local src="$out/src/kubernetes" minor staging=()
    mkdir -p "$src"
    minor="${KUBERNETES_VERSION#v1.}"
    # k8s.io/kubernetes points every staging module at ./staging with v0.0.0; a module that
    # depends on it must replace each one with its published v0.X.Y tag.
    go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" >/dev/null
    local kmod
    kmod="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBERNETES_VERSION.mod"
    mapfile -t staging < <(sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$kmod")
    {
        echo "module muster.dev/cluster/kubernetes"
        echo
        echo "go 1.26.0"
        echo
        echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
        echo
        echo "replace ("
        for m in "${staging[@]}"; do printf '\t%s => %s v0.%s\n' "$m" "$m" "$minor"; done
        echo ")"
    } >"$src/go.mod"
    local ver="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
    ver+=" -X k8s.io/component-base/version.gitMajor=1"
    ver+=" -X k8s.io/component-base/version.gitMinor=${minor%%.*}"
    ver+=" -X k8s.io/component-base/version.gitTreeState=clean"
    for c in kube-apiserver kube-controller-manager kube-scheduler; do
        [[ -x "$bin/$c" ]] && continue
        step "resolving $c dependencies (k8s.io/kubernetes $KUBERNETES_VERSION)"
        (cd "$src" || exit; go get "k8s.io/kubernetes/cmd/$c@$KUBERNETES_VERSION" 2>&1 | grep -v '^go: downloading' >&2 || true)
        step "compiling $c"
        (cd "$src" && go build -ldflags "-s -w $ver" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c")
        mv "$bin/$c.tmp" "$bin/$c"
    done
}

build_etcd() {
    [[ -x "$bin/etcd" ]] && return
    local src="$out/src/etcd"
    mkdir -p "$src"
    # etcd's own main module carries replace directives, so wrap its server in a two-line main.
    cat >"$src/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    printf 'module muster.dev/cluster/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
        "$ETCD_VERSION" >"$src/go.mod"
    step "resolving etcd $ETCD_VERSION"
    (cd "$src" || exit; go mod tidy 2>&1 | grep -v '^go: downloading' >&2 || true)
    step "compiling etcd"
    (cd "$src" && go build -ldflags "-s -w" -o "$bin/etcd.tmp" .)
    mv "$bin/etcd.tmp" "$bin/etcd"
}

install_module_binary() {
    local name="$1" pkg="$2" version="$3"
    [[ -x "$bin/$name" ]] && return
    step "compiling $name ($pkg@$version)"
    GOBIN="$out/gobin" go install -ldflags "-s -w" "$pkg@$version"
    mv "$out/gobin/$(basename "$pkg")" "$bin/$name"
}

build_kueue() {
    install_module_binary kueue sigs.k8s.io/kueue/cmd/kueue "$KUEUE_VERSION"
    # Kueue's CRDs and webhook configurations come from the same module as its binary.
    local dir
    dir="$(go env GOMODCACHE)/sigs.k8s.io/kueue@$KUEUE_VERSION"
    rm -rf "$out/kueue-crds"
    mkdir -p "$out/kueue-crds"
    cp "$dir"/config/components/crd/bases/*.yaml "$out/kueue-crds/"
    cp "$dir"/config/components/webhook/manifests.yaml "$out/kueue-webhooks.yaml"
    chmod -R u+w "$out/kueue-crds" "$out/kueue-webhooks.yaml"
}

copy_kwok_stages() {
    # kwok's "fast" stages: nodes initialised and heartbeated through their Lease, pods
    # Ready at once, deleted pods finished (no kubelet would ever do that here).
    local dir
    dir="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
    rm -rf "$out/kwok-stages"
    mkdir -p "$out/kwok-stages"
    cp "$dir"/node/fast/node-initialize.yaml "$dir"/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        "$dir"/pod/fast/pod-*.yaml "$out/kwok-stages/"
    chmod -R u+w "$out/kwok-stages"
}

step "building into $out"
build_etcd
build_kubernetes
install_module_binary kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
copy_kwok_stages
build_kueue
for c in "${components[@]}"; do [[ -x "$bin/$c" ]] || { echo "build.sh: $c missing" >&2; exit 1; }; done
rm -rf "$out/gobin"
du -sh "$out" | awk '{print $1}' >"$out/.disk"
touch "$out/.complete"
step "done in $((SECONDS - start)) s; binaries $(du -sh "$bin" | cut -f1)"
echo "$bin"
