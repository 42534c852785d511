"""Process-wide settings for a long-running controller process (``muster run``).

A controller allocates many short-lived dicts per API call (JSON bodies, watch events) and
keeps a large, long-lived cache of the cluster. With CPython's default collector thresholds
(700, 10, 10) a burst of requests triggers full collections that rescan that cache, pausing
every request in flight. Fewer young collections, and the heap that exists once the caches
have synced moved out of the collector's sight, keep those pauses rare (figures:
docs/benchmarks/controller-throughput.md). Only the program's entry point calls these: a
library must not change its host's collector.

The same process frees most of what it allocates within a request, but glibc's heap (where
objects over 512 bytes and the C libraries allocate) gives freed memory back to the system
only from its top: one live block above a freed run keeps the run resident, so a process
whose memory in use is flat can still grow. ``muster run`` therefore trims the heap with
``malloc_trim(0)`` once a minute, a sub-millisecond call (figures: docs/benchmarks/soak.md).
Where the C library has no ``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
from collections.abc import Callable

GC_THRESHOLDS = (10_000, 20, 20)
HEAP_TRIM_SECONDS = 60.0


def tune_gc() -> None:
    """Collect young objects every 10,000 allocations instead of 700."""
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_heap() -> None:
    """Move everything alive now (modules, synced caches) out of future collections."""
    gc.collect()
    gc.freeze()


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    trim: Callable[[int], int] | None = getattr(libc, "malloc_trim", None)
    return trim


_MALLOC_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Give the free memory of the C heap back to the system. False where it cannot."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


async def trim_heap_every(seconds: float = HEAP_TRIM_SECONDS) -> None:
    """Trim the heap every ``seconds`` until cancelled (nothing to do without glibc)."""
    if _MALLOC_TRIM is None:
        return
    while True:
        await asyncio.sleep(seconds)
        trim_heap()
