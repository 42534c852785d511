"""Kueue TAS slice annotations as fit-engine pod sets (pure).

Kueue's ``kueue.x-k8s.io/podset-slice-required-topology: <level>`` with
``kueue.x-k8s.io/podset-slice-size: <n>`` asks that every consecutive group of ``n`` pods
of the pod set share one domain of ``level``. The fit engine places pod sets, so a sliced
pod set becomes one pod set per slice, each required in one domain of the slice level
(slices may share a domain). How this combines with the pod set's own constraint:

* none or preferred: the slices are split out (a preference does not outrank a requirement);
* required at the slice level or finer: kept as is, it already keeps every slice together;
* required at a coarser level (a block with rack slices): kept as is; the engine cannot
  nest two requirements, and the outer one decides where capacity is added. Kueue's second
  TAS pass then places the slices on the nodes of that block.

``podset-slice-required-topology-constraints`` (multi-layer, alpha) is not planned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.fit.types import PodSetRequest, PodShape, TopologyMode, TopologyRequest

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


def expand_slices(
    name: str,
    count: int,
    shape: PodShape,
    topology: TopologyRequest,
    sliced: tuple[str, int] | None,
    levels: Sequence[str],
) -> list[PodSetRequest]:
    """The pod set, or one pod set ``<name>-slice-<i>`` per slice (see module docstring)."""
    if sliced is None or count <= 0:
        return [PodSetRequest(name, count, shape, topology)]
    level, size = sliced
    if topology.mode is TopologyMode.REQUIRED:
        return [PodSetRequest(name, count, shape, topology)]
    if level not in levels:
        # Let the engine report the unknown level, as for any other topology annotation.
        return [PodSetRequest(name, count, shape, TopologyRequest(TopologyMode.REQUIRED, level))]
    out = []
    for i, start in enumerate(range(0, count, size)):
        out.append(PodSetRequest(
            f"{name}-slice-{i}", min(size, count - start), shape,
            TopologyRequest(TopologyMode.REQUIRED, level),
        ))
    return out
