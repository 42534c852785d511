"""The injected clock: every place that asks "what time is it" or waits goes through one.

Logic never calls ``datetime.now()`` or ``asyncio.sleep`` directly, so tests can drive time
(:class:`ManualClock`) and a booking that expires after ten minutes is tested in
milliseconds.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""


class RealClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """Time moves only when a test calls :meth:`advance`; sleepers wake in time order."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._sleepers, (self._now + timedelta(seconds=seconds), next(self._seq), fut)
        )
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper due by then (and letting them run)."""
        target = self._now + timedelta(seconds=seconds)
        while self._sleepers and self._sleepers[0][0] <= target:
            when, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, when)
            if not fut.done():
                fut.set_result(None)
            for _ in range(5):
                await asyncio.sleep(0)
        self._now = target
        for _ in range(5):
            await asyncio.sleep(0)
