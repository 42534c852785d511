"""The single planner: plans and books requests one pass at a time.

Every planning call goes through :class:`Planner`, which runs the fit engine for all
requests waiting at that moment against ONE snapshot, taking each plan's usage out of it
before planning the next (:class:`controller.fit.PlanningPass`) and reserving the booking in
:class:`ClusterState` in the same synchronous step. So two requests never count the same
free capacity, and 1,000 requests arriving at once cost one snapshot build, not 1,000.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.common.conditions import Reason
from controller.fit import PlanningPass
from controller.fit.shapes import pods_that_fit
from controller.fit.types import (
    GangRequest,
    Mode,
    NoFit,
    Plan,
    PodShape,
    ReasonCode,
    Result,
    Snapshot,
)
from controller.fit.types import (
    Reason as FitReason,
)
from controller.state.bookings import Booking
from controller.state.cache import ClusterState

log = logging.getLogger(__name__)

MAX_COALESCE_SECONDS = 0.1
"""Upper bound of the adaptive batching window: the most a request waits for its pass to
start."""

@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a plan is not booked: ``reason`` is the condition reason the request gets
    (``OverBudget``: never; ``NamespaceLimitReached``: once the namespace holds less, so
    retried as for a full pool), ``text`` its message."""

    reason: Reason
    text: str

    @property
    def wait(self) -> bool:
        return self.reason is Reason.NAMESPACE_LIMIT_REACHED


BookFn = Callable[[Plan], Booking | Refusal]
"""Turns a plan into the booking to reserve, or returns why it must be refused."""


@dataclass(slots=True)
class _Item:
    key: str
    gang: GangRequest
    mode: Mode
    book: BookFn
    future: asyncio.Future[Result | Refusal]
    order: tuple[Any, ...]
    fallbacks: tuple[GangRequest, ...]
    explain: bool
    hold_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class _Hold:
    """A gang past its topology wait that holds a reservation against younger requests
    (``topology.reserve_seconds``): until ``until``, a younger request may not take a node
    as good as empty for the gang's pods, nor buy a node from a pool they could use."""

    key: str
    arrival: tuple[Any, ...]
    shapes: tuple[PodShape, ...]
    until: datetime

    def held(self, snapshot: Snapshot) -> tuple[frozenset[str], frozenset[str]]:
        """The nodes and pools of ``snapshot`` the reservation keeps from younger requests:
        nodes where the gang could put as many pods as on the node empty, pools whose new
        nodes could take its pods."""
        nodes = frozenset(
            n.name for n in snapshot.nodes if n.schedulable and any(
                0 < pods_that_fit(s, n.allocatable, n.labels, n.taints, node_name=n.name)
                <= pods_that_fit(s, n.free, n.labels, n.taints, node_name=n.name)
                for s in self.shapes))
        pools = frozenset(
            p.name for p in snapshot.pools
            if any(pods_that_fit(s, p.allocatable, p.labels, p.taints) > 0 for s in self.shapes))
        return nodes, pools


class Planner:
    def __init__(
        self,
        state: ClusterState,
        *,
        coalesce_seconds: float = 0.01,
        now: Callable[[], datetime] | None = None,
        on_pass: Callable[[int, float], None] | None = None,
    ) -> None:
        """``on_pass(requests, seconds)`` is told about every pass (metrics)."""
        self._state = state
        self._now = now
        self._on_pass = on_pass
        self.coalesce_seconds = coalesce_seconds
        self._pending: list[_Item] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        self._last_pass_seconds = 0.0
        self._what_if: tuple[int, PlanningPass] | None = None
        """The pass it was built after, and the planning as if refused pools were usable."""
        self.hold: _Hold | None = None
        """The oldest waiting gang holding a reservation (``hold_until``), if any."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="planner")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def plan(
        self, key: str, gang: GangRequest, mode: Mode, book: BookFn,
        order: tuple[Any, ...] = (),
        fallbacks: tuple[GangRequest, ...] = (),
        explain: bool = True,
        hold_until: datetime | None = None,
    ) -> Result | Refusal:
        """Plan ``gang``; a Plan returned has been reserved under ``key`` already.

        A pass plans its requests by ``order`` (the request's arrival: older first, so a
        round of woken waiting requests goes to the one that waited longest), then in the
        order they came to the planner. ``fallbacks``: gangs tried in turn, in the same
        pass, when ``gang`` does not fit (a relaxed topology); the NoFit returned is the last
        one's. ``explain=False``: a NoFit may come without reasons (the caller only needs
        to know whether it fits now: a woken waiting request), which makes it cheap.
        ``hold_until``: should ``gang`` (with its fallbacks) not fit, it holds a reservation
        until then against requests that arrived after it, unless an older gang holds one
        (see :class:`_Hold`); the gang's next plan that fits ends it.

        Returns the fit engine's NoFit, or the :class:`Refusal` of ``book``. ``book`` runs in
        the pass's synchronous step, right before the booking is reserved: what it reads of
        the state (e.g. a namespace's usage) includes every booking of the pass so far.
        """
        future: asyncio.Future[Result | Refusal] = asyncio.get_running_loop().create_future()
        self._pending.append(
            _Item(key, gang, mode, book, future, order, fallbacks, explain, hold_until))
        self._wakeup.set()
        return await future

    def refused_pools_serving(self, gang: GangRequest, mode: Mode,
                              now: datetime | None = None) -> dict[str, tuple[str, ...]]:
        """The pools the provider refuses that would serve ``gang`` were they fixed: those
        of the plan made as if they were usable (nothing is reserved), with their problems.
        Empty when none is refused or the gang would not fit even with them.

        For a request that found no fit (so it holds no booking): the snapshot is built
        once per planning pass, so a burst of such requests costs one, as planning does."""
        if not self._state.pool_registry.unusable_pools():
            return {}
        if self._what_if is None or self._what_if[0] != self.passes:
            snap = self._state.snapshot(now=now, with_unusable=True)
            self._what_if = (self.passes, PlanningPass(snap))
        unusable = self._state.pool_registry.unusable_pools()
        return pools_to_fix(self._what_if[1], unusable, gang, mode)

    async def _loop(self) -> None:
        while True:
            await self._wakeup.wait()
            # Requests arriving within a few milliseconds share one pass: a snapshot with
            # every booking subtracted costs O(nodes + bookings), so one pass per request
            # would make a burst of N requests cost O(N^2).
            # The window also grows with the last pass's cost (capped): when requests trickle
            # in one by one under load, back-to-back passes would each pay the snapshot for
            # a handful of requests and starve the event loop; this keeps planning to at most
            # about half of the loop's time.
            await asyncio.sleep(
                min(max(self.coalesce_seconds, self._last_pass_seconds), MAX_COALESCE_SECONDS)
            )
            self._wakeup.clear()
            batch, self._pending = self._pending, []
            if batch:
                started = time.monotonic()
                self._pass(batch)
                self._last_pass_seconds = time.monotonic() - started
                if self._on_pass is not None:
                    self._on_pass(len(batch), self._last_pass_seconds)

    def _pass(self, batch: list[_Item]) -> None:
        self.passes += 1
        keys = {item.key for item in batch}
        for key in keys:
            self._state.ledger.unreserve(key)
        now = self._now() if self._now else None
        planning = PlanningPass(self._state.snapshot(now=now))
        if any(item.order for item in batch):
            batch = sorted(batch, key=lambda item: item.order)
        self._current_hold(now)
        held = self.hold.held(planning.snapshot) if self.hold is not None else None
        for item in batch:
            if item.future.done():
                continue
            try:
                for gang in (item.gang, *item.fallbacks):
                    result = planning.plan(gang, item.mode, explain=item.explain)
                    if isinstance(result, Plan):
                        break
                result = self._held_back(item, result, held)
                if self._update_hold(item, result, now):
                    held = self.hold.held(planning.snapshot) if self.hold is not None else None
                if isinstance(result, Plan):
                    booking = item.book(result)
                    if isinstance(booking, Refusal):
                        item.future.set_result(booking)
                        continue
                    planning.commit(result)
                    self._state.ledger.reserve(item.key, booking)
                item.future.set_result(result)
            except Exception as exc:  # a bug in one request's planning must not stop others
                log.exception("planning %s failed", item.key)
                item.future.set_exception(exc)


    def _held_back(self, item: _Item, result: Result,
                   held: tuple[frozenset[str], frozenset[str]] | None) -> Result:
        """``result``, or a NoFit when it is a younger request's plan that takes capacity
        the reservation holds."""
        hold = self.hold
        if not isinstance(result, Plan) or hold is None or held is None \
                or item.key == hold.key or self._state.objects.arrival(item.key) < hold.arrival:
            return result
        nodes, pools = held
        if not (any(a.node in nodes for a in result.assignments)
                or any(n.pool in pools for n in result.new_nodes)):
            return result
        return NoFit(item.gang.name, item.mode, (FitReason(
            ReasonCode.INSUFFICIENT_CAPACITY, None,
            f"capacity is held for {hold.key}, which waited past its relaxTopologyAfter "
            "(topology.reserve_seconds)"),))

    def _update_hold(self, item: _Item, result: Result, now: datetime | None) -> bool:
        """End the reservation when its gang fits; let ``item`` take it when it found no fit,
        asks for one and is older than the gang holding it. Whether it changed."""
        hold = self.hold
        if hold is not None and item.key == hold.key and isinstance(result, Plan):
            self.hold = None
            return True
        until = item.hold_until
        if (not isinstance(result, NoFit) or until is None
                or (now is not None and until <= now)):
            return False
        arrival = self._state.objects.arrival(item.key)
        if hold is not None and (hold.key == item.key or arrival >= hold.arrival):
            return False
        self.hold = _Hold(item.key, arrival, tuple(ps.shape for ps in item.gang.pod_sets), until)
        return True

    def _current_hold(self, now: datetime | None) -> _Hold | None:
        """The reservation, unless it ended or its request is gone or no longer waiting."""
        hold = self.hold
        if hold is None:
            return None
        req = self._state.objects.request(hold.key)
        if (now is not None and hold.until <= now) or req is None or req.deleting \
                or req.booking is not None:
            self.hold = None
        return self.hold


def pools_to_fix(
    with_unusable: PlanningPass, refused: Mapping[str, tuple[str, ...]], gang: GangRequest,
    mode: Mode,
) -> dict[str, tuple[str, ...]]:
    """Of the ``refused`` pools (name: the provider's problems), those the gang's plan would
    buy from were they usable; ``with_unusable`` plans as if they were. Empty when the gang
    would not fit even with them. The controller and ``kubectl muster`` both decide with it
    whether a gang that found no fit waits for a pool's fix."""
    if not refused:
        return {}
    result = with_unusable.plan(gang, mode)
    if not isinstance(result, Plan):
        return {}
    return {pool: refused[pool] for pool in sorted({n.pool for n in result.new_nodes})
            if pool in refused}
