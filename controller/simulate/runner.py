"""Run several strategies on one trace and one seed, in a fixed order, in parallel processes
when asked (each strategy's replay is independent and single-threaded)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from controller.simulate.engine import SimConfig
from controller.simulate.metrics import StrategyResult
from controller.simulate.strategies import STRATEGIES, Planner, make
from controller.simulate.trace import Trace

T = TypeVar("T")
R = TypeVar("R")

# The fit-engine strategies take ~10x longer than the others: start them first.
_SLOW_FIRST = ("muster", "muster-relax", "muster-retry", "muster-shipped", "gang-no-topology")


def default_workers() -> int:
    """Processes to use: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def parallel_map(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(x) for x in items]`` over ``workers`` processes (in order; in this process when
    ``workers`` is 1). Forked where the platform allows it, so ``fn``'s module state (a
    loaded trace) is shared without being pickled."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    with ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=context) as pool:
        return list(pool.map(fn, items, chunksize=1))


_JOB: tuple[Trace, SimConfig] | None = None


def _run_one(name: str) -> StrategyResult:
    if _JOB is None:
        raise RuntimeError("no trace loaded for the worker")
    trace, config = _JOB
    return make(name, trace, config).run()


def run_strategies(
    trace: Trace,
    config: SimConfig,
    strategies: Sequence[str] = STRATEGIES,
    planner: Planner | None = None,
    workers: int = 1,
) -> list[StrategyResult]:
    """Each strategy replays ``trace`` from scratch with the same seed; results come back in
    the order of ``strategies`` whatever ``workers`` is."""
    global _JOB
    config.validate()
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(
            f"unknown strateg{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
            f"choose from {', '.join(STRATEGIES)}"
        )
    if planner is not None or workers <= 1:
        return [make(name, trace, config, planner).run() for name in strategies]
    order = sorted(strategies, key=lambda s: s not in _SLOW_FIRST)
    _JOB = (trace, config)
    try:
        done = dict(zip(order, parallel_map(_run_one, order, workers), strict=True))
    finally:
        _JOB = None
    return [done[name] for name in strategies]

