#!/usr/bin/env bash
# Stop every process of the real control plane and check that none is left.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 -m e2e.cluster down "$@"
