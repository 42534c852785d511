#!/usr/bin/env bash
# Refresh the image's lock files, every entry pinned with the SHA-256 of each file PyPI
# serves for it (the Dockerfile installs them with pip --require-hashes):
#   requirements.lock        Muster's runtime dependencies (pyproject.toml's
#                            [project.dependencies], no extras: no matplotlib, no dev tools)
#   requirements-build.lock  what builds Muster's own wheel (build-system.requires)
#
#   pip install -e '.[dev]'     # brings pip-tools
#   hack/lock.sh                # re-resolve within pyproject's ranges, keep current pins
#   hack/lock.sh --upgrade      # move every pin to the newest allowed version
#   hack/lock.sh --upgrade-package aiohttp
#
# Resolved for CPython 3.11 on Linux, the image's platform: run it with Python 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), "run hack/lock.sh with Python 3.11"'
CUSTOM_COMPILE_COMMAND="hack/lock.sh" python3 -m piptools compile --quiet \
    --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links \
    --output-file requirements.lock "$@" pyproject.toml
CUSTOM_COMPILE_COMMAND="hack/lock.sh" python3 -m piptools compile --quiet \
    --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links \
    --build-deps-for wheel --only-build-deps \
    --output-file requirements-build.lock "$@" pyproject.toml
