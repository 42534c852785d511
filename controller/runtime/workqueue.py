"""A keyed work queue: many requests reconciled at once, each key by one worker at a time.

Like controller-runtime's queue: adding a key that is waiting is a no-op; adding a key that
is being processed marks it to run once more afterwards, so no event is lost and no key is
reconciled concurrently with itself. ``add_after`` schedules a later run on the injected
clock (booking expiry, retry backoff). A long reconcile (waiting for nodes) holds only its
own key, never the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from controller.common.clock import Clock
from controller.kube import ApiError
from controller.runtime.problems import ProblemLog, describe, transient

log = logging.getLogger(__name__)

ERROR_BACKOFF_BASE = 0.5
ERROR_BACKOFF_MAX = 30.0
"""A key whose reconcile raised (API down, 5xx) is retried after 0.5 s, doubling to 30 s."""

Worker = Callable[[str], Awaitable[float | None]]
"""Reconciles one key; returns a delay to run again after, or None."""


class WorkQueue:
    def __init__(self, worker: Worker, *, clock: Clock, concurrency: int = 256) -> None:
        self._worker = worker
        self._clock = clock
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._running: set[str] = set()
        self._dirty: set[str] = set()
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._concurrency = concurrency
        self._failures: dict[str, int] = {}
        self._problems = ProblemLog(log)
        """Transient failures (API down, 5xx): one line per kind per interval for all
        keys, not a traceback per key and attempt."""

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._loop(), name=f"reconcile-{i}")
                for i in range(self._concurrency)
            ]

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._timers.values()]
        self._tasks = []
        self._timers.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def halt(self) -> None:
        """Cancel every worker and timer now, without waiting (leadership lost: no reconcile
        may run past its next await). :meth:`stop` still awaits them."""
        for task in [*self._tasks, *self._timers.values()]:
            task.cancel()

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The worker tasks (for liveness: a worker that died means keys nobody serves)."""
        return list(self._tasks)

    def add(self, key: str) -> None:
        if key in self._running:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.put_nowait(key)

    def add_after(self, key: str, delay: float) -> None:
        """Run ``key`` after ``delay`` seconds; an earlier pending timer for it is replaced."""
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        self._timers[key] = asyncio.create_task(self._later(key, delay))

    def forget(self, key: str) -> None:
        """The key's object is gone: drop its timer and error count."""
        self._failures.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    @property
    def busy(self) -> int:
        return len(self._running) + len(self._queued)

    @property
    def depth(self) -> int:
        """Keys waiting for a worker."""
        return len(self._queued)

    @property
    def running(self) -> int:
        """Keys being reconciled now."""
        return len(self._running)

    async def _later(self, key: str, delay: float) -> None:
        await self._clock.sleep(delay)
        if self._timers.get(key) is asyncio.current_task():
            del self._timers[key]
        self.add(key)

    async def _loop(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._running.add(key)
            delay: float | None = None
            try:
                delay = await self._worker(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                delay = min(ERROR_BACKOFF_MAX, ERROR_BACKOFF_BASE * 2 ** (failures - 1))
                # An API server's answer (a 403 while a restarted server's authorizer
                # syncs, a 422) is no bug: said once per interval, without a traceback.
                if transient(exc) or isinstance(exc, ApiError):
                    self._problems.warning(
                        f"reconcile {describe(exc)}",
                        "reconciling %s failed (%s, %d in a row); retrying in %.1fs",
                        key, describe(exc), failures, delay)
                else:
                    log.exception("reconciling %s failed (%d in a row); retrying in %.1fs",
                                  key, failures, delay)
            finally:
                self._running.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            elif delay is not None:
                self.add_after(key, delay)
