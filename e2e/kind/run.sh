#!/usr/bin/env bash
# Muster's end-to-end suite on a kind cluster. Needs Docker, kind, kubectl, python3 with
# Muster's dev dependencies (pip install -e '.[dev]'), and network access to pull images and
# Kueue's release.
#
#   e2e/kind/run.sh                     # create, install, test, delete
#   KEEP_CLUSTER=1 e2e/kind/run.sh -k booking   # keep the cluster; extra args go to pytest
#
# Variables: CLUSTER_NAME, KIND_NODE_IMAGE (default: kind's), KUEUE_VERSION, IMAGE,
# KEEP_CLUSTER=1, ARTIFACTS (logs on failure), PROVREQ_CRD (file or URL of the
# ProvisioningRequest CRD; default: config/crds/provisioningrequest).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER_NAME=${CLUSTER_NAME:-muster-e2e}
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}
KUEUE_VERSION=${KUEUE_VERSION:-v0.19.2}
IMAGE=${IMAGE:-muster:dev}
KEEP_CLUSTER=${KEEP_CLUSTER:-0}
ARTIFACTS=${ARTIFACTS:-$ROOT/e2e/kind/artifacts}
PROVREQ_CRD=${PROVREQ_CRD:-}
KUEUE_MANIFEST="https://github.com/kubernetes-sigs/kueue/releases/download/${KUEUE_VERSION}/manifests.yaml"
NAMESPACE=muster-system

log() { printf '\n==> %s\n' "$*" >&2; }

need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "error: $1 is required: $2" >&2
        exit 2
    fi
}

collect_logs() {
    log "collecting logs into $ARTIFACTS"
    mkdir -p "$ARTIFACTS"
    # Best effort: each command may fail on a half-created cluster.
    kubectl get nodes -o wide >"$ARTIFACTS/nodes.txt" 2>&1 || true
    kubectl get all,events -A -o wide >"$ARTIFACTS/all.txt" 2>&1 || true
    kubectl -n "$NAMESPACE" describe pods >"$ARTIFACTS/muster-pods.txt" 2>&1 || true
    # Every replica, each line prefixed with its pod: the leader's is the interesting one,
    # and `logs deployment/...` would pick a single pod (maybe the standby).
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/name=muster --prefix --all-containers \
        --tail=-1 >"$ARTIFACTS/muster.log" 2>&1 || true
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/name=muster --prefix --all-containers \
        --previous --tail=-1 >"$ARTIFACTS/muster-previous.log" 2>&1 || true
    kubectl -n kueue-system logs deployment/kueue-controller-manager --all-containers \
        --tail=-1 >"$ARTIFACTS/kueue.log" 2>&1 || true
    kubectl get provisioningrequests,podtemplates -A -o yaml \
        >"$ARTIFACTS/provisioningrequests.yaml" 2>&1 || true
    kubectl get capacitypools -o yaml >"$ARTIFACTS/capacitypools.yaml" 2>&1 || true
    kind export logs "$ARTIFACTS/kind" --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
}

finish() {
    local rc=$?
    trap - EXIT
    if [[ $rc -ne 0 ]]; then
        collect_logs
        echo "e2e FAILED (exit $rc); logs in $ARTIFACTS" >&2
    fi
    if [[ $KEEP_CLUSTER == 1 ]]; then
        log "keeping cluster $CLUSTER_NAME (KUBECONFIG=$KUBECONFIG)"
    else
        log "deleting cluster $CLUSTER_NAME"
        kind delete cluster --name "$CLUSTER_NAME" || true
    fi
    exit "$rc"
}

need docker "https://docs.docker.com/engine/install/"
need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "https://kubernetes.io/docs/tasks/tools/"
need python3 "Python 3.11 with: pip install -e '.[dev]'"
docker info >/dev/null 2>&1 || { echo "error: the Docker engine is not reachable" >&2; exit 2; }

mkdir -p "$ARTIFACTS"
export KUBECONFIG="$ARTIFACTS/kubeconfig"
trap finish EXIT

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
    log "reusing kind cluster $CLUSTER_NAME"
    kind export kubeconfig --name "$CLUSTER_NAME" --kubeconfig "$KUBECONFIG"
else
    log "creating kind cluster $CLUSTER_NAME"
    create=(kind create cluster --name "$CLUSTER_NAME" --kubeconfig "$KUBECONFIG" --wait 120s)
    if [[ -n $KIND_NODE_IMAGE ]]; then
        create+=(--image "$KIND_NODE_IMAGE")
    fi
    "${create[@]}"
fi

log "building $IMAGE"
revision=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
DOCKER_BUILDKIT=1 docker build --tag "$IMAGE" --build-arg "REVISION=$revision" "$ROOT"
kind load docker-image "$IMAGE" --name "$CLUSTER_NAME"

# Before Kueue: its provisioning admission check looks for this CRD when it starts.
log "installing the ProvisioningRequest CRD"
if [[ -n $PROVREQ_CRD ]]; then
    kubectl apply --server-side -f "$PROVREQ_CRD"
else
    kubectl apply --server-side -k "$ROOT/config/crds/provisioningrequest"
fi
kubectl wait --for=condition=Established --timeout=60s \
    crd/provisioningrequests.autoscaling.x-k8s.io

log "installing Kueue $KUEUE_VERSION"
kubectl apply --server-side -f "$KUEUE_MANIFEST"
kubectl -n kueue-system wait deployment/kueue-controller-manager \
    --for=condition=Available --timeout=300s

# config/default, with the e2e suite's config file in the ConfigMap (see kustomization.yaml).
log "installing Muster (config/default + e2e/muster-e2e.yaml)"
kubectl kustomize --load-restrictor=LoadRestrictionsNone "$ROOT/e2e/kind" | kubectl apply -f -
if [[ $IMAGE != muster:dev ]]; then
    kubectl -n "$NAMESPACE" set image deployment/muster "muster=$IMAGE"
fi
kubectl wait --for=condition=Established --timeout=60s crd/capacitypools.muster.dev
kubectl -n "$NAMESPACE" rollout status deployment/muster --timeout=300s

log "running the e2e suite against $KUBECONFIG"
cd "$ROOT"
python3 -m pytest e2e -m real --kubeconfig "$KUBECONFIG" -q "$@"
