"""Replay the full Philly trace under every strategy; print wall time per strategy and in
all (strategies run in ``--workers`` processes, as ``muster simulate`` does), where the time
goes (``--profile``) and how much the headline numbers move with the seed (``--seeds``).

    python3 -m benchmarks.simulate_full_trace [--trace PATH] [--workers N] [--profile] [--seeds 5]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

from controller.simulate.engine import SimConfig
from controller.simulate.metrics import StrategyResult
from controller.simulate.runner import default_workers, run_strategies
from controller.simulate.strategies import STRATEGIES, make
from controller.simulate.trace import load_trace

_ROOT = Path(__file__).resolve().parents[1]
# The shared data folder sits next to the repository (or next to its worktree folder).
DEFAULT_TRACE = next(
    (
        p
        for p in (
            _ROOT.parent / "shared/data/philly-gpu-jobs.csv",
            _ROOT.parent.parent / "shared/data/philly-gpu-jobs.csv",
        )
        if p.exists()
    ),
    _ROOT.parent / "shared/data/philly-gpu-jobs.csv",
)


def _profile(trace_path: Path, name: str, top: int) -> str:
    trace = load_trace(trace_path)
    profiler = cProfile.Profile()
    profiler.enable()
    make(name, trace, SimConfig()).run()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--profile", action="store_true", help="cProfile each strategy")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1")
    parser.add_argument("--workers", type=int, default=default_workers())
    args = parser.parse_args()

    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    print(f"load {len(trace.jobs):,} jobs: {time.perf_counter() - t0:.2f} s")
    by_strategy: dict[str, list[StrategyResult]] = {name: [] for name in STRATEGIES}
    total = 0.0
    wall0 = time.perf_counter()
    for seed in range(args.seeds):
        t_seed = time.perf_counter()
        results = run_strategies(trace, SimConfig(seed=seed), STRATEGIES, workers=args.workers)
        for result in results:
            name = result.strategy
            total += result.wall_s
            by_strategy[name].append(result)
            print(
                f"seed {seed} {name:18s} {result.wall_s:6.1f} s  events {result.events:,}  "
                f"fit calls {result.fit_calls:,}  paid {result.paid_gpu_h:,.0f}  "
                f"stranded {result.stranded_gpu_h:,.0f} "
                f"(waiting {result.stranded_waiting_gpu_h:,.0f})  "
                f"never started {result.never_started:,}  "
                f"deadlocked gangs {result.gangs_deadlocked}",
                flush=True,
            )
        print(f"seed {seed}: {time.perf_counter() - t_seed:.1f} s wall on {args.workers} processes")
    print(
        f"total: {time.perf_counter() - wall0:.1f} s wall, {total:.1f} s of simulation "
        f"(sum over strategies)"
    )
    if args.seeds > 1:
        for name, results in by_strategy.items():
            stranded = [r.stranded_gpu_h for r in results]
            paid = [r.paid_gpu_h for r in results]
            print(
                f"{name:17s} stranded mean {statistics.mean(stranded):,.0f} "
                f"[{min(stranded):,.0f}..{max(stranded):,.0f}]  paid mean "
                f"{statistics.mean(paid):,.0f} [{min(paid):,.0f}..{max(paid):,.0f}]"
            )
    if args.profile:
        for name in STRATEGIES:
            print(f"--- cProfile {name} (top {args.top} by own time)")
            print(_profile(args.trace, name, args.top))


if __name__ == "__main__":
    main()
