"""``muster simulate --sweep``: the strategies across regimes instead of one default table.

Two axes, each run on several windows of the trace (``windows`` x ``window_days``, spread
evenly over it, each with its own seed):

* **Supply scarcity** (:data:`SCARCITY`, ample to starved): the quota as a fraction of the
  window's peak demand (every job running from its submit), the stock each rack starts with,
  and how fast other tenants free (``refill_prob``) and take (``drain_prob``) nodes. The
  cloud is sized from the peak too (racks of 8 nodes, 4 racks per block, about twice the peak
  in node slots), so a level means the same across windows and mixes.
* **Gang-size mix** (:data:`MIXES`): the trace as it is (95% 1-GPU jobs, about 120
  multi-node gangs); every job's GPUs x4 keeping one job in four (seeded: about the same GPU
  demand, 2-GPU jobs fill a node, 4- and 8-GPU jobs become 2- and 4-node gangs, 16-GPU jobs
  a full rack); and only the jobs of 2+ GPUs, x4 (gang-heavy: most jobs are gangs).

Every (window, mix, level, strategy) run is independent; they run over ``workers``
processes. The rows go to a CSV (one per run); the points (summed over windows; the gang
wait p95 is the mean of the windows' p95) go to the plot and the Markdown summary.
"""

from __future__ import annotations

import csv
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from controller.simulate.engine import SimConfig, pods_for
from controller.simulate.runner import parallel_map
from controller.simulate.strategies import STRATEGIES, make
from controller.simulate.trace import Job, Trace

DAY = 86400.0


@dataclass(frozen=True, slots=True)
class Scarcity:
    name: str
    quota_fraction: float
    """Quota = this x the window's peak demand (GPUs, whole nodes for gangs)."""
    initial_stock_min: int
    """Each rack starts with a seeded stock between this and its node slots."""
    refill_prob: float
    drain_prob: float

    @property
    def label(self) -> str:
        return f"{self.name}\n{self.quota_fraction:g}x peak"


SCARCITY: tuple[Scarcity, ...] = (
    Scarcity("ample", 1.5, 8, 0.5, 0.1),
    Scarcity("loose", 1.0, 6, 0.5, 0.2),
    Scarcity("tight", 0.75, 4, 0.5, 0.3),
    Scarcity("scarce", 0.5, 2, 0.4, 0.4),
    Scarcity("starved", 0.35, 0, 0.3, 0.5),
)
@dataclass(frozen=True, slots=True)
class Mix:
    name: str
    factor: int = 1
    """Every job's GPUs times this."""
    keep: float = 1.0
    """Keep each job with this probability (seeded)."""
    min_gpus: int = 1
    """Keep only jobs of at least this many GPUs (before the factor)."""


MIXES: tuple[Mix, ...] = (
    Mix("as traced"),
    Mix("x4 GPUs, 1/4 of jobs", factor=4, keep=0.25),
    Mix("2+ GPU jobs, x4", factor=4, min_gpus=2),
)


@dataclass(frozen=True, slots=True)
class SweepSpec:
    windows: int = 2
    window_days: float = 14.0
    seed: int = 0
    strategies: tuple[str, ...] = STRATEGIES
    mixes: tuple[Mix, ...] = MIXES
    levels: tuple[Scarcity, ...] = SCARCITY
    base: SimConfig = field(default_factory=SimConfig)
    """Everything the sweep does not vary (boot latency, timeouts, policies, price)."""
    nodes_per_rack: int = 8
    racks_per_block: int = 4

    def validate(self) -> None:
        if self.windows < 1:
            raise ValueError(f"windows must be >= 1, got {self.windows}")
        if self.window_days <= 0:
            raise ValueError(f"window days must be > 0, got {self.window_days}")
        if any(m.factor < 1 or not 0.0 < m.keep <= 1.0 for m in self.mixes):
            raise ValueError("gang-size mixes need factor >= 1 and keep in (0, 1]")
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown:
            raise ValueError(f"unknown strategy {', '.join(unknown)}")
        self.base.validate()


@dataclass(frozen=True, slots=True)
class Task:
    window: int
    start_s: float
    mix: int
    level: int
    strategy: str
    seed: int


@dataclass(frozen=True, slots=True)
class SweepPoint:
    mix: str
    level: str
    strategy: str
    metrics: dict[str, float | None]


# ---------------------------------------------------------------------- trace transforms
def cut(trace: Trace, start_s: float, days: float) -> Trace:
    """Jobs submitted in ``[start_s, start_s + days)``, times relative to the first one."""
    end_s = start_s + days * DAY
    jobs = [j for j in trace.jobs if start_s <= j.submit < end_s]
    if not jobs:
        return Trace(jobs=(), origin=trace.origin, source=trace.source)
    t0 = jobs[0].submit
    return Trace(
        jobs=tuple(
            Job(seq=i, submit=j.submit - t0, duration=j.duration, gpus=j.gpus, cluster=j.cluster)
            for i, j in enumerate(jobs)
        ),
        origin=trace.origin + timedelta(seconds=t0),
        source=trace.source,
    )


def mix(trace: Trace, m: Mix, seed: int) -> Trace:
    """``trace`` in the gang-size mix ``m`` (seeded), times relative to its first job."""
    if m.factor == 1 and m.keep == 1.0 and m.min_gpus <= 1:
        return trace
    rng = random.Random(f"{seed}/mix/{m.name}")
    kept = [j for j in trace.jobs if j.gpus >= m.min_gpus and rng.random() < m.keep]
    if not kept:
        return Trace(jobs=(), origin=trace.origin, source=trace.source)
    t0 = kept[0].submit
    return Trace(
        jobs=tuple(
            Job(seq=i, submit=j.submit - t0, duration=j.duration, gpus=j.gpus * m.factor,
                cluster=j.cluster)
            for i, j in enumerate(kept)
        ),
        origin=trace.origin + timedelta(seconds=t0),
        source=trace.source,
    )


def peak_demand_gpus(trace: Trace, gpus_per_node: int) -> int:
    """Most GPUs held at once if every job ran from its submit (gangs in whole nodes)."""
    deltas: list[tuple[float, int]] = []
    for j in trace.jobs:
        pods, per_pod = pods_for(j.gpus, gpus_per_node)
        deltas.append((j.submit, pods * per_pod))
        deltas.append((j.submit + j.duration, -pods * per_pod))
    deltas.sort(key=lambda d: (d[0], d[1]))
    peak = held = 0
    for _, d in deltas:
        held += d
        peak = max(peak, held)
    return peak


def window_starts(trace: Trace, spec: SweepSpec) -> list[float]:
    """Start of each window, spread evenly over the trace (clipped to it)."""
    span = trace.span_seconds
    width = spec.window_days * DAY
    last = max(0.0, span - width)
    return [
        min(last, max(0.0, (i + 0.5) * span / spec.windows - width / 2))
        for i in range(spec.windows)
    ]


def level_config(spec: SweepSpec, level: Scarcity, peak_gpus: int, seed: int) -> SimConfig:
    g = spec.base.cloud.gpus_per_node
    peak_nodes = max(1, math.ceil(peak_gpus / g))
    per_block = spec.racks_per_block * spec.nodes_per_rack
    blocks = max(2, math.ceil(2.0 * peak_nodes / per_block))
    quota_nodes = max(1, round(level.quota_fraction * peak_nodes))
    cloud = replace(
        spec.base.cloud,
        blocks=blocks,
        racks_per_block=spec.racks_per_block,
        nodes_per_rack=spec.nodes_per_rack,
        quota_gpus=quota_nodes * g,
        initial_stock=None,
        initial_stock_min=min(level.initial_stock_min, spec.nodes_per_rack),
        refill_prob=level.refill_prob,
        drain_prob=level.drain_prob,
    )
    return replace(spec.base, cloud=cloud, seed=seed)


# ---------------------------------------------------------------------- workers
_STATE: tuple[Trace, SweepSpec] | None = None
_CACHE: dict[tuple[int, int], tuple[Trace, int]] = {}


def _prepared(task: Task) -> tuple[Trace, int]:
    key = (task.window, task.mix)
    hit = _CACHE.get(key)
    if hit is None:
        if _STATE is None:
            raise RuntimeError("sweep worker without a trace")
        trace, spec = _STATE
        window = cut(trace, task.start_s, spec.window_days)
        mixed = mix(window, spec.mixes[task.mix], task.seed)
        hit = _CACHE[key] = (mixed, peak_demand_gpus(mixed, spec.base.cloud.gpus_per_node))
    return hit


def run_task(task: Task) -> dict[str, Any]:
    """One run; a flat row for the CSV."""
    if _STATE is None:
        raise RuntimeError("sweep worker without a trace")
    _, spec = _STATE
    trace, peak = _prepared(task)
    level = spec.levels[task.level]
    config = level_config(spec, level, peak, task.seed)
    r = make(task.strategy, trace, config).run()
    cc = config.cloud
    return {
        "mix": spec.mixes[task.mix].name,
        "level": level.name,
        "level_index": task.level,
        "quota_fraction": level.quota_fraction,
        "initial_stock_min": cc.initial_stock_min,
        "refill_prob": cc.refill_prob,
        "drain_prob": cc.drain_prob,
        "window": task.window,
        "window_start": (trace.origin.isoformat() if trace.jobs else ""),
        "seed": task.seed,
        "peak_demand_gpus": peak,
        "quota_gpus": cc.quota_gpus,
        "cloud_gpus": cc.racks * cc.nodes_per_rack * cc.gpus_per_node,
        "strategy": task.strategy,
        "jobs": r.jobs,
        "gangs": r.gangs,
        "started": r.started,
        "never_started": r.never_started,
        "failed": r.failed,
        "gangs_started": r.gangs_started,
        "gangs_one_rack": r.gangs_one_rack,
        "gangs_cross_block": r.gangs_cross_block,
        "gangs_deadlocked": r.gangs_deadlocked,
        "deadlocked_gpu_h": round(r.deadlocked_gpu_h, 3),
        "paid_gpu_h": round(r.paid_gpu_h, 3),
        "used_gpu_h": round(r.used_gpu_h, 3),
        "slowdown_gpu_h": round(r.slowdown_gpu_h, 3),
        "stranded_gpu_h": round(r.stranded_gpu_h, 3),
        "stranded_waiting_gpu_h": round(r.stranded_waiting_gpu_h, 3),
        "retries": r.retries,
        "retries_peak_per_min": r.retries_peak_per_min,
        "gang_wait_p95_s": r.gang_wait_p95_s,
        "wait_p95_s": r.wait_p95_s,
        "wall_s": round(r.wall_s, 3),
    }


@dataclass(frozen=True, slots=True)
class SweepResult:
    rows: list[dict[str, Any]]
    points: list[SweepPoint]
    wall_s: float
    workers: int


def tasks_for(trace: Trace, spec: SweepSpec) -> list[Task]:
    starts = window_starts(trace, spec)
    tasks = [
        Task(w, start, k, li, name, spec.seed + w)
        for w, start in enumerate(starts)
        for k in range(len(spec.mixes))
        for li in range(len(spec.levels))
        for name in spec.strategies
    ]
    # Longest first (fit-engine strategies on the full mix), so the processes end together.
    slow = {"muster", "muster-relax", "muster-retry", "muster-shipped", "gang-no-topology"}
    return sorted(tasks, key=lambda t: (t.strategy not in slow, t.mix))


def run_sweep(trace: Trace, spec: SweepSpec, workers: int) -> SweepResult:
    global _STATE
    spec.validate()
    if not trace.jobs:
        raise ValueError("the trace has no job")
    tasks = tasks_for(trace, spec)
    wall0 = time.perf_counter()
    _STATE = (trace, spec)
    _CACHE.clear()
    try:
        rows = parallel_map(run_task, tasks, workers)
    finally:
        _STATE = None
        _CACHE.clear()
    wall = time.perf_counter() - wall0
    order = {
        (t.window, t.mix, t.level, t.strategy): i
        for i, t in enumerate(
            sorted(
                tasks, key=lambda t: (t.mix, t.level, spec.strategies.index(t.strategy), t.window)
            )
        )
    }
    keyed = sorted(
        zip(tasks, rows, strict=True),
        key=lambda tr: order[(tr[0].window, tr[0].mix, tr[0].level, tr[0].strategy)],
    )
    rows = [row for _, row in keyed]
    return SweepResult(rows=rows, points=aggregate(rows), wall_s=wall, workers=workers)


SUMMED = (
    "jobs", "gangs", "never_started", "failed", "gangs_started", "gangs_cross_block",
    "gangs_deadlocked", "deadlocked_gpu_h", "paid_gpu_h", "used_gpu_h", "slowdown_gpu_h",
    "stranded_gpu_h", "stranded_waiting_gpu_h",
)


def aggregate(rows: Sequence[dict[str, Any]]) -> list[SweepPoint]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["mix"], row["level"], row["strategy"]), []).append(row)
    points = []
    for (mix_name, level, strategy), group in groups.items():
        metrics: dict[str, float | None] = {k: float(sum(r[k] for r in group)) for k in SUMMED}
        waits = [r["gang_wait_p95_s"] for r in group if r["gang_wait_p95_s"] is not None]
        metrics["gang_wait_p95_h"] = sum(waits) / len(waits) / 3600.0 if waits else None
        paid = metrics["paid_gpu_h"] or 0.0
        metrics["stranded_share"] = (metrics["stranded_gpu_h"] or 0.0) / paid if paid else None
        points.append(SweepPoint(mix_name, level, strategy, metrics))
    return points


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown(result: SweepResult, spec: SweepSpec) -> str:
    """Per mix, one table: a row per scarcity level, a cell per strategy with
    stranded GPU-h / gang wait p95 / never started / gangs across blocks / gangs deadlocked."""
    by_key = {(p.mix, p.level, p.strategy): p.metrics for p in result.points}
    out: list[str] = []
    for mx in spec.mixes:
        name = mx.name
        out.append(f"**{name}** (stranded GPU-h / gang wait p95 / never started / "
                   "gangs across blocks / gangs deadlocked, summed over windows)\n")
        out.append("| scarcity | " + " | ".join(spec.strategies) + " |")
        out.append("| --- |" + " ---: |" * len(spec.strategies))
        for level in spec.levels:
            cells = []
            for strategy in spec.strategies:
                m = by_key.get((name, level.name, strategy))
                if m is None:
                    cells.append("-")
                    continue
                wait = m["gang_wait_p95_h"]
                cells.append(
                    f"{m['stranded_gpu_h'] or 0:,.0f} / "
                    f"{'-' if wait is None else f'{wait:.1f} h'} / "
                    f"{m['never_started'] or 0:,.0f} / {m['gangs_cross_block'] or 0:,.0f} / "
                    f"{m['gangs_deadlocked'] or 0:,.0f}"
                )
            out.append(f"| {level.name} ({level.quota_fraction:g}x peak) | " + " | ".join(cells)
                       + " |")
        out.append("")
    return "\n".join(out)


def subtitle(trace: Trace, spec: SweepSpec, result: SweepResult) -> str:
    return (
        f"{Path(trace.source).name}: {spec.windows} window(s) of {spec.window_days:g} days, "
        f"seeds {spec.seed}..{spec.seed + spec.windows - 1}; quota as a multiple of each "
        f"window's peak demand; {len(result.rows)} runs in {result.wall_s:.0f} s on "
        f"{result.workers} processes"
    )
