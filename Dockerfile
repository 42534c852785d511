# Muster controller image.
#
#   docker build -t muster:dev .
#   docker run --rm muster:dev --help
#
# Two stages: the builder turns the project and every runtime dependency into wheels; the
# final stage installs only those wheels (no compiler, no dev extras, no source tree). The
# final image runs as a numeric non-root user and writes nowhere but /tmp, so it works with
# `readOnlyRootFilesystem: true` and an emptyDir mounted at /tmp (see config/manager).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the wheel is built from (see .dockerignore): tests, CRDs and docs stay out.
COPY pyproject.toml README.md ./
COPY controller/ controller/
COPY providers/ providers/
COPY sandbox/ sandbox/
# One wheel for Muster plus one per runtime dependency ([dev] extras are not installed).
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="muster" \
      org.opencontainers.image.description="Gang-atomic, topology-aware provisioning for Kubernetes: ProvisioningRequests and Kueue admission checks served by one fit engine." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# HOME, caches and matplotlib's config point into /tmp: the root filesystem is read-only in
# the cluster, and bytecode is compiled at install time instead of written at run time.
ENV HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels --compile muster
# 65532 is the conventional "nonroot" uid/gid (distroless); numeric so that the kubelet can
# verify runAsNonRoot without an /etc/passwd lookup.
USER 65532:65532
WORKDIR /tmp
# Metrics and probes (config: server.metrics_port, server.probe_port).
EXPOSE 9090 8080
ENTRYPOINT ["muster", "run"]
CMD ["--in-cluster"]
