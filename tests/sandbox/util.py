"""Small helpers shared by the sandbox tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(predicate: Callable[[], bool], within: float = 10.0) -> None:
    """Wait until ``predicate()`` holds; fail the test after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached within {within}s")
        await asyncio.sleep(0.02)
