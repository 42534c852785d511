# Muster controller image.
#
#   docker build -t muster:dev .                  # on the public python:3.11-slim-bookworm
#   hack/build-image.sh                           # podman, on a base built from Debian packages
#
# Three stages. `deps` makes a virtual environment at /opt/muster holding exactly the pinned,
# hash-checked runtime dependencies of requirements.lock (wheels only, no compiler); `app`
# builds Muster's own wheel (CRDs included, for `muster demo`) with the locked setuptools and
# installs it apart, under /opt/app, for that same environment. The final stage is the Python
# base plus those two directories, merged at /opt/muster, and nothing else: no pip, no build
# tools, no dev or `simulate` extras. A source change rebuilds only the small `app` layer; the
# dependencies' layer stays cached until the lock file changes. The image runs as a numeric
# non-root user and writes nowhere but /tmp, so it works with `readOnlyRootFilesystem: true`
# and an emptyDir at /tmp (see config/manager).
#
# PYTHON_IMAGE must be a Debian-based CPython 3.11 image with `python3 -m venv` (the public
# python:3.11-slim-bookworm, or hack/image/base.sh's Debian bookworm). Both stages use it,
# so the environment's interpreter path is the same in both.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS deps
# Only for builds behind a TLS-inspecting proxy: a CA bundle file for pip (hack/build-image.sh
# mounts the host's). Unset elsewhere; never part of the final image.
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY requirements.lock /tmp/requirements.lock
RUN python3 -m venv /opt/muster \
 && /opt/muster/bin/pip install --quiet --require-hashes --only-binary=:all: --no-deps \
        -r /tmp/requirements.lock \
 && /opt/muster/bin/pip uninstall --quiet --yes pip setuptools

FROM deps AS app
ARG PIP_CERT
WORKDIR /src
COPY requirements-build.lock ./
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install --quiet --require-hashes --only-binary=:all: --no-deps \
        -r requirements-build.lock
# The packages and CRDs only (see .dockerignore).
COPY pyproject.toml README.md ./
COPY controller/ controller/
COPY providers/ providers/
COPY sandbox/ sandbox/
COPY crds/ crds/
COPY e2e/kueue-crds/ e2e/kueue-crds/
# Installed for /opt/muster's interpreter (the `muster` script's shebang) under /opt/app;
# the bytecode is compiled with the paths it will have at /opt/muster.
RUN /opt/build/bin/pip wheel --quiet --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/build/bin/pip --python /opt/muster/bin/python3 install --quiet --no-deps --no-index \
        --no-compile --no-warn-script-location --prefix /opt/app /wheels/muster-*.whl \
 && /opt/muster/bin/python3 -m compileall -q --invalidation-mode unchecked-hash \
        -s /opt/app -p /opt/muster /opt/app/lib

FROM ${PYTHON_IMAGE}
# HOME and caches point into /tmp: the root filesystem is read-only in the cluster, and
# bytecode was compiled at build time instead of written at run time.
ENV PATH=/opt/muster/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=deps /opt/muster /opt/muster
COPY --from=app /opt/app /opt/muster
# 65532 is the conventional "nonroot" uid/gid (distroless); numeric so that the kubelet can
# verify runAsNonRoot without an /etc/passwd lookup.
USER 65532:65532
WORKDIR /tmp
# Metrics (HTTPS, authenticated) and probes (config: server.metrics_port, server.probe_port).
EXPOSE 8443 8080
ENTRYPOINT ["muster", "run"]
CMD ["--in-cluster"]
# Last, so that a new revision changes only this layer.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="muster" \
      org.opencontainers.image.description="Gang-atomic, topology-aware provisioning for Kubernetes: ProvisioningRequests and Kueue admission checks served by one fit engine." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
