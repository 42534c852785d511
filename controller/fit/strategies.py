"""Which strategy places a pod set: the one place that chooses, so the strategies depend on
the plain placer (:mod:`controller.fit.placement`) and never the other way round.

* slices that constrain more than the pod set's own topology: :mod:`controller.fit.slices`;
* a DoNotSchedule topology spread: :mod:`controller.fit.spread`;
* otherwise the pod set's topology mode: :meth:`PodSetPlacer.place`.
"""

from __future__ import annotations

from controller.fit import slices, spread
from controller.fit.placement import PodSetPlacer
from controller.fit.purchase import Outcome
from controller.fit.types import Mode, PodSetRequest
from controller.fit.workspace import Workspace


def place(
    ws: Workspace, ps: PodSetRequest, mode: Mode, *, cautious: bool = False
) -> Outcome | None:
    """Place ``ps`` on ``ws`` (changed only on success), or None when it does not fit.

    ``cautious``: a spread that the gang's later pod sets cannot break
    (:attr:`PodSetPlacer.cautious`)."""
    p = PodSetPlacer(ws, ps, mode, cautious=cautious)
    if ps.topology.slice_level is not None and slices.applies(ps.topology, ws.index.levels):
        return slices.sliced_place(p)
    if ps.shape.spread is not None:
        return spread.spread_place(p, ps.shape.spreads)
    return p.place()
