"""The keyed work queue: concurrent across keys, never concurrent with itself, no lost event."""

from __future__ import annotations

import asyncio

from controller.common.clock import ManualClock
from controller.runtime.workqueue import WorkQueue


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_one_slow_key_does_not_hold_up_the_others() -> None:
    gate = asyncio.Event()
    done: list[str] = []

    async def work(key: str) -> float | None:
        if key == "slow":
            await gate.wait()
        done.append(key)
        return None

    queue = WorkQueue(work, clock=ManualClock(), concurrency=4)
    queue.start()
    try:
        for key in ("slow", "a", "b"):
            queue.add(key)
        await _settle()
        assert done == ["a", "b"]
        gate.set()
        await _settle()
        assert done == ["a", "b", "slow"]
    finally:
        await queue.stop()


async def test_an_event_during_a_run_reruns_the_key_once_afterwards() -> None:
    gate = asyncio.Event()
    running = 0
    peak = 0
    runs = 0

    async def work(key: str) -> float | None:
        nonlocal running, peak, runs
        running += 1
        peak = max(peak, running)
        runs += 1
        await gate.wait()
        running -= 1
        return None

    queue = WorkQueue(work, clock=ManualClock(), concurrency=4)
    queue.start()
    try:
        queue.add("k")
        await _settle()
        for _ in range(3):
            queue.add("k")
        gate.set()
        await _settle()
        assert runs == 2 and peak == 1
    finally:
        await queue.stop()


async def test_requeue_after_follows_the_injected_clock() -> None:
    clock = ManualClock()
    runs: list[str] = []

    async def work(key: str) -> float | None:
        runs.append(key)
        return 600.0 if len(runs) == 1 else None

    queue = WorkQueue(work, clock=clock, concurrency=1)
    queue.start()
    try:
        queue.add("k")
        await _settle()
        await clock.advance(599)
        assert runs == ["k"]
        await clock.advance(1)
        await _settle()
        assert runs == ["k", "k"]
    finally:
        await queue.stop()
