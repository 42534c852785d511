"""Transient trouble: what counts as it, retrying through it, and saying so once.

An API server that is down for a minute must cost neither the process (nothing exits on a
transient error: start-up steps retry with backoff, loops go on) nor the log (each problem
is logged once per interval with how often it recurred, without a traceback; a traceback
is for what looks like a bug).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from controller.common.problem_log import LOG_INTERVAL, ProblemLog
from controller.kube.client import ApiError
from providers.base import ProviderError

__all__ = ["LOG_INTERVAL", "ProblemLog", "describe", "retrying", "transient"]

T = TypeVar("T")

def transient(exc: BaseException) -> bool:
    """Worth retrying as it is: no answer (status 0), throttling, a server error, a
    timeout, a retryable provider error. 4xx other than 429 need someone to act."""
    if isinstance(exc, ApiError):
        return exc.status == 0 or exc.status == 429 or exc.status >= 500
    if isinstance(exc, ProviderError):
        return exc.retryable
    return isinstance(exc, TimeoutError | ConnectionError)


def describe(exc: BaseException) -> str:
    """One line for a log: an API error's status and reason, not its whole body."""
    if isinstance(exc, ApiError):
        return f"{exc.status or 'no answer'} {exc.reason}".strip()
    return str(exc) or type(exc).__name__


async def retrying(
    step: Callable[[], Awaitable[T]],
    what: str,
    problems: ProblemLog,
    *,
    first_delay: float = 0.5,
    max_delay: float = 10.0,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """``step()`` until it returns, backing off (doubling up to ``max_delay``) over
    transient errors; anything else propagates."""
    delay = first_delay
    while True:
        try:
            result = await step()
        except Exception as exc:
            if not transient(exc):
                raise
            problems.warning(what, "%s failed (%s); retrying", what, describe(exc))
            await sleep(delay)
            delay = min(max_delay, delay * 2)
            continue
        problems.resolved(what, "%s succeeded", what)
        return result
