"""Process-wide settings for a long-running controller process (``muster run``).

A controller allocates many short-lived dicts per API call (JSON bodies, watch events) and
keeps a large, long-lived cache of the cluster. With CPython's default collector thresholds
(700, 10, 10) a burst of 1,000 ProvisioningRequests spent about 1.3 s of an 8 s run in
garbage collection, most of it in full collections rescanning that cache, with pauses up to
200 ms that stall every request in flight (``benchmarks/controller_bench.py``). Fewer young
collections, and the heap that exists once the caches have synced moved out of the
collector's sight, cut that to about a third. Only the program's entry point calls these:
a library must not change its host's collector.

The same process frees most of what it allocates within a request, but glibc's heap (where
objects over 512 bytes and the C libraries allocate) gives freed memory back to the system
only from its top: one live block above a freed run keeps the run resident. In a soak on
the real control plane (``benchmarks/soak.py``) the memory in use stayed flat at 37 MB while
the heap the process held grew by about 3 MB an hour, and ``malloc_trim(0)`` gave 2.2 MB of
it back at once. So ``muster run`` trims the heap once a minute: on the soak's process a trim
took 0.1-0.3 ms and gave back about 0.57 MB each time (perf and strace on ``malloc_trim``).
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
