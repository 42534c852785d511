"""Re-planning waiting requests when capacity may have freed.

A request that found no fit waits for its backoff timer (``retry``: 10 s doubling to 60 s).
Much of what lets it fit happens inside the cluster, where Muster sees it: another gang's
nodes released or freed, a booking ended, a request deleted, a CapacityPool created or its
limits raised, a refused pool fixed, a stock-out's avoidance window over.
:class:`ClusterState` reports each such change (``capacity_changed``); :class:`Wakeups` then
wakes every waiting request, oldest first, so they are planned again at once, together, in
one planner pass (:class:`controller.state.planner.Planner` orders a pass by arrival). The
backoff timer stays for what Muster cannot observe (a cloud's stock).

Bounded, so a churn of events (every pod that finishes is one) cannot starve the planner or
the API server:

* events are coalesced (``coalesce_seconds``), and at most ``max_per_second`` rounds start
  per second;
* a round starts only once the previous one was planned (or ``ROUND_TIMEOUT_SECONDS``
  passed): at most one round is ever in the planner;
* a woken request that still does not fit writes nothing (no attempt counted, no condition
  rewritten): only its backoff timer does, as before.

Times here are real time (like the planner's batching window): they bound CPU, not the
cluster's clock. The end of a stock-out's window is on the injected clock, as the window is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from datetime import datetime

from controller.common.clock import Clock

log = logging.getLogger(__name__)

ROUND_TIMEOUT_SECONDS = 5.0
"""The most a round waits for its requests to be planned before the next may start (a key
the work queue never reaches again, e.g. deleted meanwhile)."""


class Wakeups:
    def __init__(
        self,
        *,
        clock: Clock,
        waiting: Callable[[], Iterable[str]],
        enqueue: Callable[[str], None],
        coalesce_seconds: float = 0.02,
        max_per_second: float = 4.0,
        on_round: Callable[[str, int], None] | None = None,
    ) -> None:
        """``waiting()`` lists the keys to wake, in the order to plan them; ``enqueue``
        hands one to the work queue; ``on_round(why, keys)`` is told of every round."""
        self._clock = clock
        self._waiting = waiting
        self._enqueue = enqueue
        self.coalesce_seconds = coalesce_seconds
        self.min_interval = 1.0 / max_per_second
        self._on_round = on_round
        self._poked = asyncio.Event()
        self._why: list[str] = []
        self._woken: set[str] = set()
        self._round_done = asyncio.Event()
        self._round_done.set()
        self._task: asyncio.Task[None] | None = None
        self._timers: dict[datetime, asyncio.Task[None]] = {}
        self.rounds = 0
        """Rounds started (for tests and benchmarks)."""
        self.woken = 0
        """Keys woken, over all rounds."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="wakeups")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._timers.values()) if t is not None]
        self._task = None
        self._timers.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def halt(self) -> None:
        for task in (self._task, *self._timers.values()):
            if task is not None:
                task.cancel()

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        return [self._task] if self._task is not None else []

    def poke(self, why: str) -> None:
        """Something changed that could let a waiting request fit (synchronous: called from
        the cache's watch callbacks)."""
        if len(self._why) < 16 and why not in self._why:
            self._why.append(why)
        self._poked.set()

    def poke_at(self, when: datetime, why: str) -> None:
        """Poke at ``when`` on the injected clock (a stock-out's avoidance window ends)."""
        if when in self._timers or self._task is None:
            return

        async def later() -> None:
            delay = (when - self._clock.now()).total_seconds()
            if delay > 0:
                await self._clock.sleep(delay)
            self._timers.pop(when, None)
            self.poke(why)

        self._timers[when] = asyncio.create_task(later(), name="wakeup-timer")

    def claim(self, key: str) -> bool:
        """Whether ``key`` was woken and not yet planned since; the caller plans it now
        (its backoff timer notwithstanding)."""
        if key not in self._woken:
            return False
        self._woken.discard(key)
        if not self._woken:
            self._round_done.set()
        return True

    async def _loop(self) -> None:
        while True:
            await self._poked.wait()
            # The round's requests have to be planned before another round: under churn
            # the planner holds at most one round at a time.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._round_done.wait(), ROUND_TIMEOUT_SECONDS)
            await asyncio.sleep(self.coalesce_seconds)
            self._poked.clear()
            why, self._why = self._why, []
            keys = list(self._waiting())
            if keys:
                self._start_round(keys, why)
            await asyncio.sleep(self.min_interval)

    def _start_round(self, keys: list[str], why: list[str]) -> None:
        self.rounds += 1
        self.woken += len(keys)
        self._woken = set(keys)
        self._round_done.clear()
        log.debug("waking %d waiting request(s): %s", len(keys), ", ".join(why))
        for key in keys:
            self._enqueue(key)
        if self._on_round is not None:
            self._on_round(why[0] if why else "", len(keys))
