"""Kueue TAS slice annotations, read (pure).

Kueue's ``kueue.x-k8s.io/podset-slice-required-topology: <level>`` with
``kueue.x-k8s.io/podset-slice-size: <n>`` asks that every consecutive group of ``n`` pods
of the pod set share one domain of ``level``, together with the pod set's own required or
preferred topology. They become ``TopologyRequest.slice_level`` / ``slice_size``, which the
fit engine plans as one pod set (:mod:`controller.fit.slices`).

``podset-slice-required-topology-constraints`` (multi-layer, alpha) is not planned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"


class BadSlices(ValueError):
    """Slice annotations Muster cannot use (names the annotation and the value)."""


def slice_request(
    annotations: Mapping[str, str], levels: Sequence[str]
) -> tuple[str, int] | None:
    """(level, size) of the slice annotations, None when absent; :class:`BadSlices` when
    only one of the pair is set or the size is not a positive integer."""
    level = annotations.get(SLICE_REQUIRED)
    size = annotations.get(SLICE_SIZE)
    if not level and not size:
        return None
    if not level or not size:
        raise BadSlices(f"{SLICE_REQUIRED} and {SLICE_SIZE} must be set together")
    try:
        n = int(size)
    except ValueError:
        raise BadSlices(f"{SLICE_SIZE} must be a positive integer, got {size!r}") from None
    if n < 1:
        raise BadSlices(f"{SLICE_SIZE} must be a positive integer, got {size!r}")
    short = [lv for lv in levels if lv.rsplit("/", 1)[-1] == level]
    return (level if level in levels or len(short) != 1 else short[0]), n
