"""Test helpers shared across the test packages (import as ``tests.helpers``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def bounded(awaitable: Awaitable[T], within: float, what: str) -> T:
    """``awaitable``'s result, or the test fails after ``within`` seconds naming ``what``
    (instead of hanging until the runner's timeout, which names nothing)."""
    try:
        return await asyncio.wait_for(awaitable, within)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g}s waiting for {what}") from None


async def eventually(
    probe: Callable[[], Awaitable[Any]], *, within: float = 20.0, step: float = 0.1,
    what: str = "the condition",
) -> Any:
    """Poll ``probe`` every ``step`` seconds until it returns something truthy, and return it.

    Fails the test after ``within`` seconds, naming ``what`` and showing the last value to
    tell "never changed" from "changed to the wrong thing". A probe that does not answer is
    cut off at the same deadline.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    value: Any = None
    while True:
        try:
            value = await asyncio.wait_for(probe(), max(deadline - loop.time(), step))
        except TimeoutError:
            raise AssertionError(
                f"timed out after {within:g}s waiting for {what}: the probe did not answer "
                f"(last answer: {value!r})") from None
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {within:g}s (last: {value!r})")
        await asyncio.sleep(step)
