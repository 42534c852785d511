"""``muster run``'s process settings: the C heap's free memory goes back to the system."""

from __future__ import annotations

import asyncio
import platform
from pathlib import Path

import pytest

from controller.runtime import memory as runtime

GLIBC = platform.libc_ver()[0] == "glibc"


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's; elsewhere trim_heap is a no-op")
def test_trimming_gives_freed_heap_back_that_freeing_alone_keeps() -> None:
    # 1.5 KB blocks come from glibc's heap (pymalloc takes only up to 512 bytes); the
    # blocks allocated after them stay alive, so the freed run is not at the heap's top
    # and free() alone cannot shrink the heap.
    freed = [bytes(1500) + str(i).encode() for i in range(40_000)]  # about 60 MB
    pinned = [bytes(1500) + str(i).encode() for i in range(100)]
    del freed
    before = _rss_kb()
    assert runtime.trim_heap()
    after = _rss_kb()
    assert before - after > 40_000, (before, after)
    assert len(pinned) == 100


async def test_the_trimmer_trims_on_its_period_until_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def trim(pad: int) -> int:
        calls.append(pad)
        return 1

    monkeypatch.setattr(runtime, "_MALLOC_TRIM", trim)
    task = asyncio.ensure_future(runtime.trim_heap_every(0.01))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    seen = len(calls)
    assert seen >= 3 and set(calls) == {0}
    await asyncio.sleep(0.05)
    assert len(calls) == seen


async def test_without_malloc_trim_the_trimmer_ends_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime, "_MALLOC_TRIM", None)
    assert not runtime.trim_heap()
    await asyncio.wait_for(runtime.trim_heap_every(0.01), timeout=1)
