"""Retry wrapper: transient errors retried with backoff, permanent ones not, budget ends
in TransientProviderError; blocking calls bounded."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from providers.base import QuotaExceeded, TransientProviderError
from providers.retry import BlockingCalls, RetryPolicy, call_with_retry


class Busy(Exception):
    pass


def transient(exc: BaseException) -> bool:
    return isinstance(exc, Busy)


async def test_transient_errors_are_retried_with_growing_jittered_waits() -> None:
    calls = 0
    waits: list[float] = []

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise Busy("throttled")
        return "ok"

    async def record(seconds: float) -> None:
        waits.append(seconds)

    policy = RetryPolicy(attempts=5, initial_backoff=1.0, max_backoff=3.0)
    assert await call_with_retry(flaky, is_transient=transient, policy=policy, what="op",
                                 sleep=record) == "ok"
    assert calls == 4 and len(waits) == 3
    assert all(0 <= w <= 3.0 for w in waits)


async def test_budget_spent_becomes_transient_provider_error() -> None:
    async def always_busy() -> None:
        raise Busy("RequestLimitExceeded")

    async def no_wait(_: float) -> None:
        return None

    with pytest.raises(TransientProviderError, match="after 3 tries: RequestLimitExceeded"):
        await call_with_retry(always_busy, is_transient=transient,
                              policy=RetryPolicy(attempts=3), what="CreateFleet", sleep=no_wait)


async def test_permanent_errors_are_raised_at_once() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad parameter")

    with pytest.raises(ValueError):
        await call_with_retry(broken, is_transient=transient, policy=RetryPolicy(), what="op")
    assert calls == 1

    async def quota() -> None:
        raise QuotaExceeded("limit")

    with pytest.raises(QuotaExceeded):
        await call_with_retry(quota, is_transient=lambda _e: True, policy=RetryPolicy(),
                              what="op")


def test_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


async def test_blocking_calls_never_exceed_the_bound() -> None:
    calls = BlockingCalls(2)
    running = 0
    peak = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    await asyncio.gather(*(calls.run(work) for _ in range(8)))
    assert peak == 2
