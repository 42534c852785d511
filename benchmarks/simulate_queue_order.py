"""Why arrival order loses small jobs in the sweep's worst regime for Muster: replay one
sweep run (a window, mix and scarcity level of ``muster simulate --sweep``) under muster,
muster-retry and pod-by-pod and print, per hour of submit, the jobs submitted, their mean
run time, how many never started, the mean wait of those that did and the GPUs paid and
used in that hour (mean); then how many jobs
never start at other cloud seeds (is the gap the seed's?). No plot, no assertion: numbers
for "Why Muster loses small jobs" in docs/benchmarks/simulator.md.

    python3 -m benchmarks.simulate_queue_order [--trace PATH] [--window 0] [--mix 0]
        [--level scarce] [--hours 244-262] [--seeds 4]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from benchmarks.simulate_full_trace import DEFAULT_TRACE
from controller.simulate import sweep as sw
from controller.simulate.engine import TIMED_OUT, Simulation
from controller.simulate.metrics import StrategyResult
from controller.simulate.strategies import make
from controller.simulate.trace import load_trace

HOUR = 3600.0
STRATEGIES = ("muster", "muster-retry", "pod-by-pod")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--mix", type=int, default=0, help="index into the sweep's mixes")
    parser.add_argument("--level", default="scarce")
    parser.add_argument("--hours", default="244-262", help="submit hours to list, FROM-TO")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    spec = sw.SweepSpec()
    names = [level.name for level in spec.levels]
    if args.level not in names or not 0 <= args.mix < len(spec.mixes):
        parser.error(f"--level is one of {', '.join(names)}; --mix 0..{len(spec.mixes) - 1}")
    first, _, last = args.hours.partition("-")
    trace = load_trace(args.trace)
    starts = sw.window_starts(trace, spec)
    if not 0 <= args.window < len(starts):
        parser.error(f"--window 0..{len(starts) - 1}")
    seed = spec.seed + args.window
    jobs = sw.mix(sw.cut(trace, starts[args.window], spec.window_days), spec.mixes[args.mix], seed)
    peak = sw.peak_demand_gpus(jobs, spec.base.cloud.gpus_per_node)
    config = sw.level_config(spec, spec.levels[names.index(args.level)], peak, seed)
    sims: dict[str, Simulation] = {}
    results: dict[str, StrategyResult] = {}
    for name in STRATEGIES:
        sim = sims[name] = make(name, jobs, config)
        results[name] = sim.run()
    print(f"{spec.mixes[args.mix].name}, {args.level}, window {args.window} (seed {seed}), "
          f"quota {config.cloud.quota_gpus} GPUs")
    print("hour  jobs  mean run h  " + "  ".join(
        f"{n}: never / mean wait h / GPUs paid / used" for n in STRATEGIES))
    for hour in range(int(first), int(last) + 1):
        cells = []
        for name in STRATEGIES:
            runs = [r for r in sims[name].runs if int(r.job.submit // HOUR) == hour]
            gave_up = sum(r.status == TIMED_OUT for r in runs)
            waits = [r.start - r.job.submit for r in runs if r.start >= 0]
            mean = sum(waits) / len(waits) / HOUR if waits else 0.0
            res = results[name]
            lo = int(hour * HOUR / res.series_bin_s)
            hi = int((hour + 1) * HOUR / res.series_bin_s)
            bins = max(1, hi - lo)
            paid = sum(res.series_paid[lo:hi]) / bins
            used = sum(res.series_used[lo:hi]) / bins
            cells.append(f"{gave_up:5d} / {mean:4.1f} / {paid:4.0f} / {used:4.0f}")
        runs = [r for r in sims[STRATEGIES[0]].runs if int(r.job.submit // HOUR) == hour]
        mean_run = sum(r.job.duration for r in runs) / len(runs) / HOUR if runs else 0.0
        print(f"{hour:4d}  {len(runs):4d}  {mean_run:10.1f}  " + "  ".join(cells))
    for name in STRATEGIES:
        never = [r for r in sims[name].runs if r.status == TIMED_OUT]
        mean = sum(r.job.duration for r in never) / len(never) / HOUR if never else 0.0
        print(f"{name}: {len(never)} never started (timed out), mean run time {mean:.1f} h")
    for s in range(args.seeds):
        row = []
        for name in STRATEGIES:
            result = make(name, jobs, replace(config, seed=s)).run()
            row.append(f"{name} {result.never_started}")
        print(f"cloud seed {s}: " + ", ".join(row))


if __name__ == "__main__":
    main()
