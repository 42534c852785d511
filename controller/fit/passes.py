"""Planning many gangs against one snapshot, each seeing the bookings of those before it.

``PlanningPass(snapshot)`` then ``plan`` / ``commit`` per gang gives exactly what calling
:func:`controller.fit.plan` and :func:`controller.fit.apply_plan` in turn gives, but a gang
like the one just committed is planned on the workspace that plan left behind (its new-node
slots removed, its new nodes moved into the pools' headroom) instead of a workspace rebuilt
over every node of the cluster. A burst of similar requests, the common case for a
controller, then costs one node scan per pass instead of one per request.

Gangs that claim DRA devices, and gangs that do not fit, take the full path, unless the
caller needs no explanation of a NoFit (``explain=False``: a request planned again only to
see whether it fits now); then a gang equal to one that missed since the last commit misses
again without being planned.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.fit.capacity import apply_plan
from controller.fit.explain import validate
from controller.fit.gang import plan, plan_on
from controller.fit.topology import Levels
from controller.fit.types import (
    GangRequest,
    Mode,
    NoFit,
    Plan,
    PodSetRequest,
    Result,
    Snapshot,
    usable_for,
)
from controller.fit.workspace import GangView, Workspace


@dataclass(slots=True)
class _Base:
    mode: Mode
    view: GangView
    ws: Workspace
    run_seconds: float | None = None


class PlanningPass:
    """Sequential planning on one snapshot; see the module docstring."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        """The snapshot with every committed plan applied."""
        self._levels = Levels.of(snapshot.levels)
        self._base: _Base | None = None
        """A workspace equal to one built from :attr:`snapshot` for ``view`` and ``mode``."""
        self._last: tuple[Plan, _Base] | None = None
        """The latest plan made on a workspace, with the workspace carrying its usage."""
        self.reused = 0
        """Plans made on a kept workspace (for benchmarks and tests)."""
        self._missed: list[tuple[Mode, tuple[PodSetRequest, ...], float | None]] = []
        """Gangs (mode, pod sets) that did not fit since the last commit."""
        self.skipped = 0
        """NoFits answered from :attr:`_missed` (for benchmarks and tests)."""

    def plan(self, request: GangRequest, mode: Mode, *, explain: bool = True) -> Result:
        """Plan ``request`` on the current snapshot; nothing is booked until :meth:`commit`.

        ``explain=False``: a NoFit may come without reasons (not permanent)."""
        self._last = None
        if not explain and (mode, request.pod_sets, request.run_seconds) in self._missed:
            self.skipped += 1
            return NoFit(request.name, mode, ())
        shapes = [ps.shape for ps in request.pod_sets]
        view = GangView.of(shapes)
        if view.claims or validate(request, self.snapshot):
            return self._missing(plan(request, self.snapshot, mode), request, mode)
        base = self._base
        if (base is None or base.mode is not mode or base.view != view
                or base.run_seconds != request.run_seconds):
            pools = (usable_for(self.snapshot.pools, request.run_seconds)
                     if mode is Mode.PROVISION else ())
            base = _Base(mode, view, Workspace(self.snapshot.nodes, pools, self._levels, shapes),
                         request.run_seconds)
            self._base = base
        else:
            self.reused += 1
        got = plan_on(request, base.ws, mode)
        if got is None:
            if not explain:
                return self._missing(NoFit(request.name, mode, ()), request, mode)
            # The full path explains the NoFit (it also tries an empty cluster).
            return self._missing(plan(request, self.snapshot, mode), request, mode)
        result, after = got
        self._last = (result, _Base(mode, view, after, request.run_seconds))
        return result

    def _missing(self, result: Result, request: GangRequest, mode: Mode) -> Result:
        if isinstance(result, NoFit):
            self._missed.append((mode, request.pod_sets, request.run_seconds))
        return result

    def commit(self, result: Plan) -> None:
        """Book ``result``: later plans do not count its capacity."""
        self._missed.clear()
        self.snapshot = apply_plan(self.snapshot, result)
        last, self._last = self._last, None
        if last is not None and last[0] is result:
            self._base = _Base(last[1].mode, last[1].view, last[1].ws.rebased(),
                               last[1].run_seconds)
        else:
            self._base = None
