#!/usr/bin/env bash
# Start the real control plane on 127.0.0.1 (building it first if the cache is cold) and print
# the admin KUBECONFIG line; a running cluster is reused. State: .cluster/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 -m e2e.cluster up "$@"
