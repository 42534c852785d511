"""Process-wide settings for a long-running controller process (``muster run``).

A controller allocates many short-lived dicts per API call (JSON bodies, watch events) and
keeps a large, long-lived cache of the cluster. With CPython's default collector thresholds
(700, 10, 10) a burst of 1,000 ProvisioningRequests spent about 1.3 s of an 8 s run in
garbage collection, most of it in full collections rescanning that cache, with pauses up to
200 ms that stall every request in flight (``benchmarks/controller_bench.py``). Fewer young
collections, and the heap that exists once the caches have synced moved out of the
collector's sight, cut that to about a third. Only the program's entry point calls these:
a library must not change its host's collector.
"""

from __future__ import annotations

import gc

GC_THRESHOLDS = (10_000, 20, 20)


def tune_gc() -> None:
    """Collect young objects every 10,000 allocations instead of 700."""
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_heap() -> None:
    """Move everything alive now (modules, synced caches) out of future collections."""
    gc.collect()
    gc.freeze()
