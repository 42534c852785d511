#!/usr/bin/env bash
# The kind suite for the Kueue integration: a kind cluster with REAL Kueue, Muster running
# against it, and one batch Job through each path. Needs kind, kubectl, docker and network
# access to download Kueue's release. Usage (from the repository root):
#
#   KUEUE_VERSION=v0.15.2 e2e/kind/kueue-suite.sh
#
# What it checks: path A - a Job with kueue.x-k8s.io/podset-required-topology on a TAS
# flavor is Admitted after Muster provisioned one rack (Kueue's own provisioning check,
# class atomic-provisioning.muster.dev) and its pods are scheduled inside that rack; path B -
# a Job with muster.dev/required-topology on a flavor without a Topology is Admitted through
# Muster's check and its pods carry the podSetUpdates' rack nodeSelector.
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.15.2}"
CLUSTER="${CLUSTER:-muster-kueue}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SAMPLES="$ROOT/config/samples/kueue"
LOG="$(mktemp -t muster-kueue-suite.XXXXXX.log)"
cd "$ROOT"  # python3 -m controller.cli runs from the repository root

kind create cluster --name "$CLUSTER"
export KUBECONFIG="$(mktemp)"
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"

# Muster's CRDs first: Kueue starts its provisioning controller only when the
# ProvisioningRequest CRD exists at its start-up.
kubectl apply -f "$ROOT/crds/"
kubectl apply --server-side -f \
  "https://github.com/kubernetes-sigs/kueue/releases/download/${KUEUE_VERSION}/manifests.yaml"
kubectl -n kueue-system wait deploy/kueue-controller-manager --for=condition=Available --timeout=300s

kubectl apply -f "$HERE/kueue-pool.yaml"
python3 -m controller.cli run --config "$SAMPLES/muster-kueue.yaml" > "$LOG" 2>&1 &
MUSTER=$!
trap 'kill $MUSTER 2>/dev/null || true; echo "Muster log: $LOG"' EXIT

kubectl apply -f "$SAMPLES/path-a/kueue-wiring.yaml"
kubectl apply -f "$SAMPLES/path-b/kueue-wiring.yaml"
kubectl wait admissioncheck/muster-provisioning admissioncheck/muster-gang \
  --for=condition=Active --timeout=60s

check_job() {  # <job manifest> <queue label>: the Job is admitted and its pods share a rack
  local job
  job="$(kubectl create -f "$1" -o jsonpath='{.metadata.name}')"
  kubectl wait "job/$job" --for=jsonpath='{.spec.suspend}'=false --timeout=300s
  kubectl wait pods -l "batch.kubernetes.io/job-name=$job" \
    --for=jsonpath='{.spec.nodeName}' --timeout=300s || true
  local racks
  racks="$(kubectl get pods -l "batch.kubernetes.io/job-name=$job" \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u |
    xargs -I{} kubectl get node {} -o jsonpath='{.metadata.labels.topology\.muster\.dev/rack}{"\n"}' |
    sort -u)"
  echo "$2: job $job pods in rack(s): $racks"
  [ "$(echo "$racks" | wc -l)" -eq 1 ]
}

check_job "$SAMPLES/path-a/job.yaml" "path A"
# Path B's sample asks for 16 nodes in a rack; the kind pool allows 8 per rack.
sed 's/parallelism: 16/parallelism: 4/; s/completions: 16/completions: 4/' \
  "$SAMPLES/path-b/job.yaml" > "$HERE/.path-b-job.yaml"
check_job "$HERE/.path-b-job.yaml" "path B"
rm -f "$HERE/.path-b-job.yaml"
echo "kind Kueue suite passed"
kind delete cluster --name "$CLUSTER"
