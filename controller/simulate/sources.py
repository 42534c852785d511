"""Where gangs get capacity: on demand, from a reservation, or from the cloud's queue.

A regime of its own (``muster simulate --capacity-sources``), replaying the trace's jobs as
gangs of whole nodes (``ceil(gpus / gpus_per_node)`` nodes each) under three strategies:

* **on-demand-only**: every gang asks the on-demand cloud (:class:`Cloud`: stock per rack that
  other tenants drain and refill, the quota, boot latency) all or nothing, and waits for the
  next stock change when it is short.
* **reservation-first**: ``reserved_share`` of the quota is a reservation (an ODCR, a GCP
  specific reservation), paid every hour of the replay whether used or not, its nodes up
  from the start. A gang goes into it when its free nodes hold the whole gang (a reservation
  too small for the gang is not used partly) and on demand otherwise, as Muster's planner
  does with a reserved pool beside an on-demand one.
* **queued**: every gang is a queued request (GCP flex-start, a Capacity Block bought at its
  start): granted whole after a seeded exponential delay of mean ``queue_delay_s``, not
  limited by the on-demand stock, paid at ``queue_price`` of the on-demand price, and ended
  at ``max_run_s`` (a job longer than that cannot be queued and goes on demand).

Every strategy keeps the quota (reserved nodes count against it) and cancels a job not
started ``start_timeout_s`` after its submit. Waiting jobs are tried in arrival order,
each on its own (a large gang does not hold back a small one). The cloud's other tenants
draw from their own seeded stream, so they behave the same whatever the strategy does.

What it leaves out: pod packing (a job of 1 GPU holds a node), topology inside a source,
the queue's own stock-outs (a grant only waits), a reservation's start and end (it spans the
replay), and the price of a Capacity Block beyond one factor.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.simulate.cloud import Cloud, CloudConfig
from controller.simulate.trace import Trace

SOURCE_STRATEGIES = ("on-demand-only", "reservation-first", "queued")

_ARRIVE, _FINISH, _TICK, _GRANT, _TIMEOUT = range(5)


@dataclass(frozen=True, slots=True)
class SourcesConfig:
    cloud: CloudConfig = field(default_factory=CloudConfig)
    seed: int = 0
    reserved_share: float = 0.25
    """Share of the quota's nodes held as a reservation (reservation-first)."""
    reserved_price: float = 1.0
    """Price of a reserved node-hour, as a share of on-demand (an ODCR bills on-demand)."""
    queue_delay_s: float = 3600.0
    """Mean wait before the queue grants a request (exponential, seeded)."""
    queue_price: float = 0.6
    """Price of a queued node-hour, as a share of on-demand."""
    max_run_s: float = 7 * 24 * 3600.0
    """Longest run the queue grants (flex-start's 7 days)."""
    start_timeout_s: float = 6 * 3600.0
    price_per_gpu_hour: float = 2.5

    def validate(self) -> None:
        """Raise ValueError naming the first setting that makes no sense."""
        self.cloud.validate()
        checks = [
            (0.0 <= self.reserved_share <= 1.0, "reserved share must be in [0, 1]"),
            (self.reserved_price >= 0, "reserved price must be >= 0"),
            (self.queue_delay_s >= 0, "queue delay must be >= 0 seconds"),
            (self.queue_price >= 0, "queue price must be >= 0"),
            (self.max_run_s > 0, "max run must be > 0 seconds"),
            (self.start_timeout_s > 0, "start timeout must be > 0 seconds"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(slots=True)
class SourcesResult:
    strategy: str
    jobs: int = 0
    started: int = 0
    never_started: int = 0
    waits_s: list[float] = field(default_factory=list)
    paid_gpu_h: float = 0.0
    used_gpu_h: float = 0.0
    reserved_idle_gpu_h: float = 0.0
    cost: float = 0.0
    from_reservation: int = 0
    on_demand: int = 0
    queued: int = 0

    def wait_h(self, q: float) -> float:
        if not self.waits_s:
            return 0.0
        ordered = sorted(self.waits_s)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] / 3600.0

    @property
    def cost_per_used_gpu_h(self) -> float:
        return self.cost / self.used_gpu_h if self.used_gpu_h else 0.0


@dataclass(slots=True)
class _Job:
    seq: int
    submit: float
    duration: float
    gpus: int
    nodes: int
    state: str = "waiting"
    """waiting, queued, running, done, cancelled."""
    source: str = ""
    racks: list[int] = field(default_factory=list)


class SourcesSimulation:
    """One strategy over the trace (mutable, one per run)."""

    def __init__(self, strategy: str, trace: Trace, config: SourcesConfig) -> None:
        if strategy not in SOURCE_STRATEGIES:
            raise ValueError(f"unknown strategy {strategy}; choose from "
                             f"{', '.join(SOURCE_STRATEGIES)}")
        config.validate()
        self.strategy = strategy
        self.config = config
        per = config.cloud.gpus_per_node
        self.jobs = [_Job(j.seq, j.submit, j.duration, j.gpus, -(-j.gpus // per))
                     for j in trace.jobs]
        self.cloud = Cloud(config.cloud, config.seed)
        quota = config.cloud.quota_nodes
        self.reserved = (round(config.reserved_share * quota)
                         if strategy == "reservation-first" else 0)
        self.reserved_free = self.reserved
        self.queued_nodes = 0
        """Nodes granted by the queue and held (they count against the quota)."""
        self._queue = random.Random(f"{config.seed}/queue")
        self._boot = random.Random(f"{config.seed}/queue-boot")
        self._reserved_used_gpu_h = 0.0
        self._events: list[tuple[float, int, int, int]] = []
        self._n = 0
        self.waiting: list[_Job] = []
        self.result = SourcesResult(strategy, jobs=len(self.jobs))

    def _push(self, at: float, kind: int, index: int) -> None:
        self._n += 1
        heapq.heappush(self._events, (at, kind, self._n, index))

    def _room(self) -> int:
        """Nodes the quota still allows beyond the reservation and what is held."""
        return (self.config.cloud.quota_nodes - self.reserved - self.cloud.held_nodes
                - self.queued_nodes)

    def run(self) -> SourcesResult:
        cfg = self.config
        for i, job in enumerate(self.jobs):
            self._push(job.submit, _ARRIVE, i)
        end = max((j.submit for j in self.jobs), default=0.0)
        t = 0.0
        while t <= end + cfg.start_timeout_s:
            self._push(t, _TICK, -1)
            t += cfg.cloud.refill_interval_s
        horizon = 0.0
        """The replay's end: the last arrival, finish or cancellation (the reservation is
        paid until then)."""
        while self._events:
            at, kind, _, index = heapq.heappop(self._events)
            if kind in (_ARRIVE, _FINISH):
                horizon = max(horizon, at)
            if kind == _TICK:
                if index == -1 and self.cloud.tick():
                    self._try_waiting(at)
                continue
            job = self.jobs[index]
            if kind == _ARRIVE:
                self.waiting.append(job)
                self._push(at + cfg.start_timeout_s, _TIMEOUT, index)
                self._try_waiting(at)
            elif kind == _TIMEOUT and job.state in ("waiting", "queued"):
                horizon = max(horizon, at)
                job.state = "cancelled"
                self.result.never_started += 1
                self.waiting = [j for j in self.waiting if j is not job]
            elif kind == _GRANT and job.state == "queued":
                self._grant(job, at)
            elif kind == _FINISH:
                self._finish(job)
                self._try_waiting(at)
        reserved_gpu_h = self.reserved * cfg.cloud.gpus_per_node * horizon / 3600.0
        self.result.paid_gpu_h += reserved_gpu_h
        self.result.cost += reserved_gpu_h * cfg.price_per_gpu_hour * cfg.reserved_price
        self.result.reserved_idle_gpu_h = reserved_gpu_h - self._reserved_used_gpu_h
        return self.result

    # ------------------------------------------------------------------ placement
    def _try_waiting(self, now: float) -> None:
        still: list[_Job] = []
        for job in self.waiting:
            if (job.state == "waiting" and not self._place(job, now)) or job.state == "queued":
                still.append(job)
        self.waiting = still

    def _place(self, job: _Job, now: float) -> bool:
        if self.strategy == "reservation-first" and self.reserved_free >= job.nodes:
            self.reserved_free -= job.nodes
            self.result.from_reservation += 1
            self._start(job, now, "reservation", boot_s=0.0)
            return True
        if self.strategy == "queued" and job.duration <= self.config.max_run_s:
            job.state = "queued"
            self._push(now + self._queue.expovariate(1.0 / self.config.queue_delay_s)
                       if self.config.queue_delay_s > 0 else now, _GRANT, job.seq)
            return True
        if job.nodes > self._room():
            return False
        granted = self.cloud.acquire_count_atomic(job.nodes)
        if granted is None:
            return False
        job.racks = [rack for rack, _ in granted]
        self.result.on_demand += 1
        self._start(job, now, "on-demand", boot_s=max(b for _, b in granted))
        return True

    def _grant(self, job: _Job, now: float) -> None:
        """The queue grants the whole request, if the quota has room; else it waits for
        room (re-checked when a job ends)."""
        if job.nodes > self._room():
            self._push(now + self.config.cloud.refill_interval_s, _GRANT, job.seq)
            return
        self.queued_nodes += job.nodes
        self.result.queued += 1
        boot = self._boot.uniform(self.config.cloud.boot_min_s, self.config.cloud.boot_max_s)
        self._start(job, now, "queued", boot_s=boot)

    def _start(self, job: _Job, now: float, source: str, boot_s: float) -> None:
        cfg = self.config
        job.state, job.source = "running", source
        self.result.started += 1
        self.result.waits_s.append(now + boot_s - job.submit)
        run_s = job.duration if source != "queued" else min(job.duration, cfg.max_run_s)
        gpu_h = job.gpus * run_s / 3600.0
        self.result.used_gpu_h += gpu_h
        node_gpu_h = job.nodes * cfg.cloud.gpus_per_node * (boot_s + run_s) / 3600.0
        if source == "reservation":
            self._reserved_used_gpu_h += job.nodes * cfg.cloud.gpus_per_node * run_s / 3600.0
        else:
            self.result.paid_gpu_h += node_gpu_h
            factor = 1.0 if source == "on-demand" else cfg.queue_price
            self.result.cost += node_gpu_h * cfg.price_per_gpu_hour * factor
        self._push(now + boot_s + run_s, _FINISH, job.seq)

    def _finish(self, job: _Job) -> None:
        job.state = "done"
        if job.source == "reservation":
            self.reserved_free += job.nodes
        elif job.source == "queued":
            self.queued_nodes -= job.nodes
        else:
            for rack in job.racks:
                self.cloud.release(rack)


def run_sources(trace: Trace, config: SourcesConfig,
                strategies: Sequence[str] = SOURCE_STRATEGIES) -> list[SourcesResult]:
    return [SourcesSimulation(s, trace, config).run() for s in strategies]


def sources_markdown(results: Sequence[SourcesResult]) -> str:
    rows = [
        "| strategy | jobs | started | never started | from reservation / on demand / "
        "queued | wait p50 (h) | wait p95 (h) | paid GPU-h | used GPU-h | reserved idle "
        "GPU-h | cost ($k) | $ per used GPU-h |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        rows.append(
            f"| {r.strategy} | {r.jobs} | {r.started} | {r.never_started} | "
            f"{r.from_reservation} / {r.on_demand} / {r.queued} | {r.wait_h(0.5):.2f} | "
            f"{r.wait_h(0.95):.2f} | {r.paid_gpu_h:,.0f} | {r.used_gpu_h:,.0f} | "
            f"{r.reserved_idle_gpu_h:,.0f} | {r.cost / 1000:,.1f} | "
            f"{r.cost_per_used_gpu_h:.2f} |"
        )
    return "\n".join(rows)
