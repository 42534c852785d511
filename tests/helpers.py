"""Test helpers shared across the test packages (import as ``tests.helpers``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(
    probe: Callable[[], Awaitable[Any]], *, within: float = 20.0, step: float = 0.1
) -> Any:
    """Poll ``probe`` every ``step`` seconds until it returns something truthy, and return it.

    Fails the test after ``within`` seconds, showing the last value to tell "never changed"
    from "changed to the wrong thing".
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"not reached within {within}s (last: {value!r})")
        await asyncio.sleep(step)
