"""What a run measures, and how.

Every GPU the cluster pays for is, at each instant, in exactly one of four states:

* **used**: allocated to a job that runs (all its pods run);
* **waiting**: on a ready node, allocated to a job that does not run yet (bound pods of a
  partial gang under pod-by-pod; GPUs booked for a gang whose new nodes still boot);
* **idle**: on a ready node, allocated to nothing (nodes before scale-down, fragments);
* **booting**: on a node that was requested but is not ready yet (paid from the request on).

``paid = used + waiting + idle + booting`` and **stranded = paid - used = waiting + idle +
booting**: paid GPU-time that no running job used. The :class:`Meter` integrates the four
counts over simulated time and keeps per-bin averages of paid and used GPUs for the plot.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


class Meter:
    """Integrates GPU counts over simulated time (call :meth:`advance` before each change)."""

    __slots__ = (
        "bin_seconds",
        "booting",
        "booting_s",
        "paid",
        "paid_bins",
        "paid_s",
        "peak_paid",
        "t",
        "used",
        "used_bins",
        "used_s",
        "waiting",
        "waiting_s",
    )

    def __init__(self, bin_seconds: float) -> None:
        self.bin_seconds = bin_seconds
        self.t = 0.0
        self.paid = 0
        self.used = 0
        self.waiting = 0
        self.booting = 0
        self.peak_paid = 0
        self.paid_s = 0.0
        self.used_s = 0.0
        self.waiting_s = 0.0
        self.booting_s = 0.0
        self.paid_bins: list[float] = []
        self.used_bins: list[float] = []

    def advance(self, now: float) -> None:
        t0 = self.t
        dt = now - t0
        if dt <= 0.0:
            return
        self.t = now
        paid = self.paid
        if not paid:
            return  # nothing held, so nothing used, waiting or booting either
        used = self.used
        self.paid_s += paid * dt
        self.used_s += used * dt
        self.waiting_s += self.waiting * dt
        self.booting_s += self.booting * dt
        width = self.bin_seconds
        i = int(t0 // width)
        paid_bins = self.paid_bins
        used_bins = self.used_bins
        if len(paid_bins) <= int(now // width):
            grow = int(now // width) + 1 - len(paid_bins)
            paid_bins.extend([0.0] * grow)
            used_bins.extend([0.0] * grow)
        while t0 < now:
            edge = (i + 1) * width
            seg = (edge if edge < now else now) - t0
            paid_bins[i] += paid * seg
            used_bins[i] += used * seg
            t0 = edge
            i += 1

    def note_peak(self) -> None:
        if self.paid > self.peak_paid:
            self.peak_paid = self.paid


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list; None when it is empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True, slots=True)
class StrategyResult:
    strategy: str
    jobs: int
    started: int
    never_started: int
    """timed_out + never_fits + failed."""
    timed_out: int
    """Not running ``start_timeout`` after submit (deadlocked gangs land here), then cancelled."""
    never_fits: int
    """Rejected at once: the gang can never fit (larger than the quota or a block)."""
    failed: int
    """muster-retry: the request was marked Failed after ``retry_attempts`` attempts found no
    capacity (the controller's ``RetriesExhausted``), before the start timeout."""
    gangs: int
    """Jobs of more than one pod."""
    gangs_started: int
    gangs_one_rack: int
    gangs_cross_block: int
    gangs_deadlocked: int
    """Gangs that, at some check, held GPUs while unable to start because other partially
    bound gangs held the rest (see ``Simulation.check_deadlocks``)."""
    deadlocked_gpu_h: float
    """GPU-hours those gangs held while in that state (sampled every ``deadlock_check_s``)."""
    paid_gpu_h: float
    used_gpu_h: float
    slowdown_gpu_h: float
    """Part of ``used_gpu_h``: the extra run time of gangs spread over blocks."""
    stranded_gpu_h: float
    stranded_waiting_gpu_h: float
    stranded_idle_gpu_h: float
    stranded_booting_gpu_h: float
    cost: float
    wait_p50_s: float | None
    wait_p95_s: float | None
    wait_p99_s: float | None
    gang_wait_p50_s: float | None
    gang_wait_p95_s: float | None
    gang_wait_p99_s: float | None
    nodes_acquired: int
    peak_paid_gpus: int
    end_s: float
    events: int
    fit_calls: int
    retries: int
    """muster-retry: planning attempts that found no capacity; the controller writes the
    request twice for each (its annotations, its Provisioned condition)."""
    retries_peak_per_min: int
    """muster-retry: the most such attempts within one minute of simulated time."""
    wall_s: float
    series_bin_s: float = 0.0
    series_paid: tuple[float, ...] = field(default=(), repr=False)
    """Average paid GPUs per bin of ``series_bin_s`` seconds from the first submit."""
    series_used: tuple[float, ...] = field(default=(), repr=False)

    @property
    def one_rack_fraction(self) -> float | None:
        return self.gangs_one_rack / self.gangs_started if self.gangs_started else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("series_bin_s", "series_paid", "series_used"):
            data.pop(key)
        data["gangs_one_rack_fraction"] = self.one_rack_fraction
        return data
