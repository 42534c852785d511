"""The discrete-event core every strategy shares: simulated time, nodes, jobs, scale-down,
start timeouts, the other tenants' clock, and the accounting of paid versus used GPUs.

A strategy (``strategies.py``) decides only two things: when and how nodes are requested,
and which job or pod gets which free GPUs. Everything else (boot, idle removal after
``idle_timeout_s``, cancellation of a job not running ``start_timeout_s`` after submit, the
slowdown of a gang spread over blocks) is the same for all, so the numbers differ only by
strategy.

Jobs map to pods like this: a job of ``g <= gpus_per_node`` GPUs is one pod of ``g`` GPUs on
one node (several small pods may share a node); a job of more GPUs is a gang of
``ceil(g / gpus_per_node)`` pods of ``gpus_per_node`` GPUs each, one per node (a 12-GPU job
holds two whole nodes, as a real data-parallel job of 8-GPU workers would). A job runs only
when every pod has its GPUs on a ready node, and then for its trace duration (times
``cross_block_slowdown`` when its pods span more than one block).

Time is a float of seconds since the first submit. Events at equal times run in the order
they were scheduled; arrivals at time ``t`` run after every other event at ``t`` (a job
finishing at ``t`` frees its GPUs before a job submitted at ``t`` looks for some).
"""

from __future__ import annotations

import abc
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controller.simulate.cloud import Cloud, CloudConfig
from controller.simulate.metrics import Meter, StrategyResult, percentile
from controller.simulate.trace import Job, Trace

# Event kinds (indices into the handler table).
NODE_READY = 0
FINISH = 1
IDLE_CHECK = 2
TIMEOUT = 3
TICK = 4
SCAN = 5
RELEASE_PODS = 6
DEADLOCK_CHECK = 7
TIMER = 8
"""A strategy's own timer: ``on_timer(obj)`` (backoff ends, bookings expire, waits relax)."""

# Job status.
PENDING = 0
"""Waiting for capacity (under pod-by-pod, possibly with some pods bound)."""
PLACED = 1
"""Every pod has its GPUs; some nodes still boot."""
RUNNING = 2
DONE = 3
TIMED_OUT = 4
NEVER_FITS = 5
FAILED = 6
"""muster-retry: the controller marked the request Failed after ``retry_attempts``."""


def _controller_default_order() -> str:
    from controller.config import RetryConfig

    return str(RetryConfig().replan_order)


def _controller_default_relax_after() -> float | None:
    from controller.config import TopologyConfig

    return TopologyConfig().relax_after_seconds


def _controller_default_reserve() -> float:
    from controller.config import TopologyConfig

    return TopologyConfig().reserve_seconds or 0.0


@dataclass(frozen=True, slots=True)
class SimConfig:
    cloud: CloudConfig = field(default_factory=CloudConfig)
    seed: int = 0
    idle_timeout_s: float = 600.0
    """cluster-autoscaler's scale-down-unneeded-time: an empty node is removed after this."""
    start_timeout_s: float = 6 * 3600.0
    """A job not running this long after submit is cancelled (its owner gives up)."""
    cancel_grace_s: float = 30.0
    """A cancelled job's bound pods hold their GPUs this long (terminationGracePeriodSeconds)."""
    cross_block_slowdown: float = 1.3
    """Run-time factor of a gang whose pods span more than one block."""
    price_per_gpu_hour: float = 2.5
    scan_interval_s: float = 10.0
    """cluster-autoscaler ``--scan-interval`` (the two cluster-autoscaler strategies)."""
    scale_down_delay_after_add_s: float = 600.0
    """cluster-autoscaler ``--scale-down-delay-after-add``: no node is removed this long after
    a scale-up (cluster-autoscaler strategies only; Muster releases its own nodes)."""
    backoff_initial_s: float = 300.0
    """cluster-autoscaler ``--initial-node-group-backoff-duration`` after a failed scale-up."""
    backoff_max_s: float = 1800.0
    """cluster-autoscaler ``--max-node-group-backoff-duration``."""
    backoff_reset_s: float = 3 * 3600.0
    """cluster-autoscaler ``--node-group-backoff-reset-timeout``."""
    max_node_provision_time_s: float = 900.0
    """cluster-autoscaler ``--max-node-provision-time``: how long nodes the cloud silently
    did not create count as upcoming before the scale-up is declared failed."""
    stockout_reported: bool = True
    """The cloud reports the nodes it could not create (an out-of-resources instance error,
    handled at once); False: they never register and count as upcoming until
    ``max_node_provision_time_s``."""
    provreq_backoff_initial_s: float = 60.0
    """cluster-autoscaler ``--provisioning-request-initial-backoff-time``."""
    provreq_backoff_max_s: float = 600.0
    """cluster-autoscaler ``--provisioning-request-max-backoff-time``."""
    provreq_atomic: bool = True
    """The node group implements ``AtomicIncreaseSize`` (all the nodes or none); False: the
    best-effort-atomic class falls back to ``IncreaseSize`` and may get part of them."""
    booking_s: float = 600.0
    """How long a Provisioned request's capacity is kept for its pods (10 min upstream)."""
    relax_after_s: float = 900.0
    """muster-relax: a gang waits this long for one rack or block, then takes the most
    compact placement anywhere (preferred topology)."""
    reserve_s: float = 0.0
    """muster-relax: how long, once past ``relax_after_s``, a gang holds a reservation
    (younger jobs use only GPUs left on busy nodes); 0 (default): none."""
    retry_initial_s: float = 10.0
    """muster-retry: delay before a request that found no capacity is planned again,
    doubling per attempt (the controller's ``retry.initial_backoff_seconds``)."""
    retry_max_s: float = 60.0
    """muster-retry: cap of that delay (the controller's ``retry.max_backoff_seconds``)."""
    retry_attempts: int = 720
    """muster-retry: planning attempts before the request is marked Failed and its job never
    starts (the controller's ``retry.max_attempts``)."""
    shipped_relax_after_s: float | None = field(
        default_factory=lambda: _controller_default_relax_after())
    """muster-shipped: the controller's ``topology.relax_after_seconds`` (None: never
    relax; the default is the controller's)."""
    shipped_replan_order: str = field(default_factory=lambda: _controller_default_order())
    """muster-shipped: the controller's ``retry.replan_order`` (arrival or backoff)."""
    shipped_reserve_s: float = field(default_factory=lambda: _controller_default_reserve())
    """muster-shipped: the controller's ``topology.reserve_seconds`` (0: off, the
    controller's default): once past its relaxation, the oldest waiting gang holds a
    reservation this long (younger requests use only GPUs left on busy nodes)."""
    deadlock_check_s: float = 60.0
    """How often partially bound gangs are checked for a deadlock."""
    bin_seconds: float | None = None
    """Width of the plot's time bins; default: the trace span / 500, at least 60 s."""

    def validate(self) -> None:
        self.cloud.validate()
        checks: list[tuple[bool, str]] = [
            (self.idle_timeout_s >= 0, "idle timeout must be >= 0 seconds"),
            (self.start_timeout_s > 0, "start timeout must be > 0 seconds"),
            (self.cancel_grace_s >= 0, "cancel grace must be >= 0 seconds"),
            (self.cross_block_slowdown >= 1.0, "cross-block slowdown must be >= 1"),
            (self.price_per_gpu_hour >= 0, "price per GPU-hour must be >= 0"),
            (self.scan_interval_s > 0, "scan interval must be > 0 seconds"),
            (self.scale_down_delay_after_add_s >= 0, "scale-down delay after add must be >= 0"),
            (
                0 < self.backoff_initial_s <= self.backoff_max_s,
                "node-group backoff needs 0 < initial <= max",
            ),
            (self.backoff_reset_s > 0, "backoff reset timeout must be > 0 seconds"),
            (self.max_node_provision_time_s > 0, "max node provision time must be > 0 seconds"),
            (
                0 < self.provreq_backoff_initial_s <= self.provreq_backoff_max_s,
                "ProvisioningRequest backoff needs 0 < initial <= max",
            ),
            (self.booking_s >= 0, "booking duration must be >= 0 seconds"),
            (self.shipped_relax_after_s is None or self.shipped_relax_after_s >= 0,
             "shipped relax-after must be >= 0 seconds"),
            (self.shipped_replan_order in ("arrival", "backoff"),
             "shipped replan order must be arrival or backoff"),
            (self.relax_after_s >= 0, "relax-after must be >= 0 seconds"),
            (self.reserve_s >= 0, "reservation time must be >= 0 seconds"),
            (self.shipped_reserve_s >= 0, "shipped reservation time must be >= 0 seconds"),
            (
                0 < self.retry_initial_s <= self.retry_max_s,
                "retry backoff needs 0 < initial <= max",
            ),
            (self.retry_attempts >= 1, "retry attempts must be >= 1"),
            (self.deadlock_check_s > 0, "deadlock check interval must be > 0 seconds"),
            (self.bin_seconds is None or self.bin_seconds > 0, "bin width must be > 0 seconds"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def pods_for(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(pods, GPUs per pod) of a job of ``gpus`` GPUs (see the module docstring)."""
    if gpus <= gpus_per_node:
        return 1, gpus
    return -(-gpus // gpus_per_node), gpus_per_node


class SimNode:
    __slots__ = (
        "alive",
        "block",
        "free",
        "id",
        "idle_token",
        "indexed",
        "name",
        "rack",
        "ready",
        "state",
        "waiters",
    )

    def __init__(self, node_id: int, rack: int, block: int, gpus: int) -> None:
        self.id = node_id
        self.name = f"node-{node_id:06d}"
        self.rack = rack
        self.block = block
        self.free = gpus
        self.ready = False
        self.alive = True
        self.indexed = False
        self.idle_token = 0
        self.waiters: list[JobRun] = []
        self.state: Any = None
        """Cached fit-engine view of the node (strategies own it); None when stale."""


class JobRun:
    __slots__ = (
        "allocs",
        "blocks",
        "bound",
        "deadlocked",
        "job",
        "nodes_waiting",
        "pod_gpus",
        "pods",
        "racks",
        "start",
        "status",
        "total_gpus",
    )

    def __init__(self, job: Job, gpus_per_node: int) -> None:
        self.job = job
        self.pods, self.pod_gpus = pods_for(job.gpus, gpus_per_node)
        self.total_gpus = self.pods * self.pod_gpus
        self.status = PENDING
        self.start = -1.0
        self.allocs: list[tuple[SimNode, int]] = []
        self.bound = 0
        self.deadlocked = False
        """Held GPUs at some check while other partial gangs held what it still needed."""
        self.nodes_waiting = 0
        self.racks = 0
        """Distinct racks (and blocks) the job's pods ran in; set when it starts."""
        self.blocks = 0


class Simulation(abc.ABC):
    """One replay of a trace under one strategy. Subclasses fill in the hooks."""

    name = "base"
    index_booting = False
    """Whether a booting node's free GPUs can be handed out (a strategy that plans onto
    nodes it has just requested) or only a ready node's (the kube-scheduler binds to ready
    nodes only)."""

    def __init__(self, trace: Trace, config: SimConfig) -> None:
        config.validate()
        self.config = config
        self.trace = trace
        self.cloud = Cloud(config.cloud, config.seed)
        cc = config.cloud
        self.gpus_per_node = cc.gpus_per_node
        span = trace.span_seconds
        bin_s = config.bin_seconds or max(60.0, span / 500.0)
        self.meter = Meter(bin_s)
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.now = 0.0
        self.next_node_id = 0
        self.nodes: dict[str, SimNode] = {}
        g = cc.gpus_per_node
        # Nodes whose free GPUs may be handed out, by free count: globally and per rack.
        self.free_index: list[dict[int, SimNode]] = [{} for _ in range(g + 1)]
        self.rack_index: list[list[dict[int, SimNode]]] = [
            [{} for _ in range(g + 1)] for _ in range(cc.racks)
        ]
        self.runs = [JobRun(job, g) for job in trace.jobs]
        self.open_jobs = 0
        self.booting_nodes = 0
        self.nodes_acquired = 0
        self.events = 0
        self.fit_calls = 0
        self.retries = 0
        """muster-retry: planning attempts that found no capacity (each costs the controller
        two writes of the request: its annotations and its condition)."""
        self.retries_peak_per_min = 0
        self._retry_minute = -1
        self._retries_this_minute = 0
        self.capacity_version = 0
        """Bumped whenever a node's placeable free GPUs change (a strategy may reuse an
        answer computed on the same version)."""
        # Gangs with some but not all pods holding GPUs, by job seq (see check_deadlocks).
        self.partial: dict[int, JobRun] = {}
        self.deadlock_check_scheduled = False
        self.deadlocked_gpu_s = 0.0
        self.slowdown_gpu_s = 0.0
        """GPU-time gangs ran longer because their pods spanned blocks (inside ``used``)."""
        self.handlers: list[Callable[[Any], None]] = [
            self._on_node_ready,
            self._on_finish,
            self._on_idle_check,
            self._on_timeout,
            self._on_tick,
            self.on_scan,
            self._on_release_pods,
            self._on_deadlock_check,
            self.on_timer,
        ]

    # ------------------------------------------------------------------ hooks
    @abc.abstractmethod
    def on_arrival(self, run: JobRun) -> None:
        """``run`` was just submitted (its start timeout is already scheduled)."""

    @abc.abstractmethod
    def on_capacity_freed(self) -> None:
        """GPUs on existing nodes became free (a job ended or was cancelled)."""

    @abc.abstractmethod
    def on_node_ready(self, node: SimNode) -> None:
        """``node`` finished booting (waiting jobs were already told)."""

    @abc.abstractmethod
    def on_room(self) -> None:
        """Stock or quota room grew (a node was released, other tenants freed stock)."""

    def on_node_released(self) -> None:
        """An idle node was released (quota room grew; the cluster saw the node go)."""
        self.on_room()

    @abc.abstractmethod
    def on_cancel(self, run: JobRun) -> None:
        """``run`` was cancelled while pending; forget its queued pods."""

    def on_scan(self, _: Any) -> None:
        """A periodic scan a strategy scheduled with ``push(at, SCAN, None)``."""
        raise RuntimeError(f"{self.name} scheduled a scan it does not handle")

    def on_timer(self, obj: Any) -> None:
        """A timer a strategy scheduled with ``push(at, TIMER, obj)``."""
        raise RuntimeError(f"{self.name} scheduled a timer it does not handle")

    def scale_down_not_before(self) -> float:
        """No empty node is removed before this time (cluster-autoscaler's cooldown)."""
        return 0.0

    # ------------------------------------------------------------------ loop
    def push(self, at: float, kind: int, obj: Any) -> None:
        heapq.heappush(self.heap, (at, self.seq, kind, obj))
        self.seq += 1

    def run(self) -> StrategyResult:
        wall0 = time.perf_counter()
        runs = self.runs
        n = len(runs)
        heap = self.heap
        handlers = self.handlers
        meter = self.meter
        cloud = self.cloud
        heappop = heapq.heappop
        self.push(self.config.cloud.refill_interval_s, TICK, None)
        i = 0
        events = 0
        while True:
            if i < n:
                t_arrival = runs[i].job.submit
            elif self.open_jobs == 0 and cloud.held_nodes == 0:
                break
            else:
                t_arrival = math.inf
            if heap and heap[0][0] <= t_arrival:
                at, _, kind, obj = heappop(heap)
                if at > meter.t:
                    meter.advance(at)
                self.now = at
                handlers[kind](obj)
            elif i < n:
                if t_arrival > meter.t:
                    meter.advance(t_arrival)
                self.now = t_arrival
                run = runs[i]
                i += 1
                self.open_jobs += 1
                self.push(t_arrival + self.config.start_timeout_s, TIMEOUT, run)
                self.on_arrival(run)
            else:
                break
            events += 1
        self.events = events
        return self._result(time.perf_counter() - wall0)

    # ------------------------------------------------------------------ nodes
    def add_node(self, rack: int, boot_s: float) -> SimNode:
        """A node the cloud granted: paid from now, ready after ``boot_s``."""
        g = self.gpus_per_node
        node = SimNode(self.next_node_id, rack, self.cloud.rack_block[rack], g)
        self.next_node_id += 1
        self.nodes[node.name] = node
        self.nodes_acquired += 1
        self.booting_nodes += 1
        meter = self.meter
        meter.paid += g
        meter.booting += g
        meter.note_peak()
        if self.index_booting:
            self._index_add(node)
        self.push(self.now + boot_s, NODE_READY, node)
        return node

    def _on_node_ready(self, node: SimNode) -> None:
        node.ready = True
        self.booting_nodes -= 1
        g = self.gpus_per_node
        meter = self.meter
        meter.booting -= g
        # Whatever is allocated on a node that was booting belongs to jobs not running yet.
        meter.waiting += g - node.free
        if not node.indexed:
            self._index_add(node)
        waiters = node.waiters
        node.waiters = []
        for run in waiters:
            run.nodes_waiting -= 1
            if run.nodes_waiting == 0 and run.status == PLACED:
                self.start(run)
        if node.free == g:
            self._arm_idle(node)
        self.on_node_ready(node)

    def _arm_idle(self, node: SimNode) -> None:
        node.idle_token += 1
        self.push(self.now + self.config.idle_timeout_s, IDLE_CHECK, (node, node.idle_token))

    def _on_idle_check(self, obj: tuple[SimNode, int]) -> None:
        node, token = obj
        if not node.alive or node.idle_token != token or node.free != self.gpus_per_node:
            return
        if not node.ready:
            return  # a booting node is never idle; it is armed again once ready
        not_before = self.scale_down_not_before()
        if self.now < not_before:
            self.push(not_before, IDLE_CHECK, obj)  # same token: still void if it fills up
            return
        self._index_remove(node)
        node.alive = False
        del self.nodes[node.name]
        self.meter.paid -= self.gpus_per_node
        self.cloud.release(node.rack)
        self.on_node_released()

    def _index_add(self, node: SimNode) -> None:
        self.capacity_version += 1
        node.indexed = True
        self.free_index[node.free][node.id] = node
        self.rack_index[node.rack][node.free][node.id] = node

    def _index_remove(self, node: SimNode) -> None:
        self.capacity_version += 1
        if node.indexed:
            node.indexed = False
            del self.free_index[node.free][node.id]
            del self.rack_index[node.rack][node.free][node.id]

    def _set_free(self, node: SimNode, free: int) -> None:
        self.capacity_version += 1
        if node.indexed:
            old = node.free
            del self.free_index[old][node.id]
            del self.rack_index[node.rack][old][node.id]
            self.free_index[free][node.id] = node
            self.rack_index[node.rack][free][node.id] = node
        node.free = free
        node.state = None

    # ------------------------------------------------------------------ jobs
    def allocate(self, run: JobRun, node: SimNode, gpus: int) -> None:
        """Give ``gpus`` of ``node`` to ``run`` (not running yet)."""
        if gpus > node.free:
            raise RuntimeError(f"{node.name}: {gpus} GPUs asked, {node.free} free")
        self._set_free(node, node.free - gpus)
        node.idle_token += 1  # no longer empty: disarm a pending idle check
        run.allocs.append((node, gpus))
        if node.ready:
            self.meter.waiting += gpus

    def _free_allocs(self, run: JobRun) -> None:
        g = self.gpus_per_node
        for node, gpus in run.allocs:
            self._set_free(node, node.free + gpus)
            if node.free == g and node.ready:
                self._arm_idle(node)
        run.allocs = []

    def start(self, run: JobRun) -> None:
        """Every pod of ``run`` has its GPUs on a ready node: it runs from now."""
        run.status = RUNNING
        run.start = self.now
        self.partial.pop(run.job.seq, None)
        meter = self.meter
        meter.waiting -= run.total_gpus
        meter.used += run.total_gpus
        duration = run.job.duration
        if run.pods > 1:
            run.racks = len({node.rack for node, _ in run.allocs})
            run.blocks = len({node.block for node, _ in run.allocs})
            if run.blocks > 1:
                extra = duration * (self.config.cross_block_slowdown - 1.0)
                self.slowdown_gpu_s += run.total_gpus * extra
                duration += extra
        else:
            run.racks = run.blocks = 1
        self.push(self.now + duration, FINISH, run)

    def _on_finish(self, run: JobRun) -> None:
        run.status = DONE
        self.meter.used -= run.total_gpus
        self.open_jobs -= 1
        self._free_allocs(run)
        self.on_capacity_freed()

    def _on_timeout(self, run: JobRun) -> None:
        if run.status != PENDING:
            return  # running, done, rejected, or placed and about to start
        run.status = TIMED_OUT
        self.open_jobs -= 1
        self.partial.pop(run.job.seq, None)
        self.on_cancel(run)
        if run.allocs:
            self.push(self.now + self.config.cancel_grace_s, RELEASE_PODS, run)

    def _on_release_pods(self, run: JobRun) -> None:
        meter = self.meter
        for node, gpus in run.allocs:
            if node.ready:
                meter.waiting -= gpus
        self._free_allocs(run)
        self.on_capacity_freed()

    # ------------------------------------------------------------------ deadlocks
    def note_bound(self, run: JobRun) -> None:
        """One more pod of ``run`` holds GPUs (pod-by-pod binding); starts it when complete."""
        run.bound += 1
        if run.bound == run.pods:
            self.start(run)
        elif run.bound == 1:
            self.partial[run.job.seq] = run
            if not self.deadlock_check_scheduled:
                self.deadlock_check_scheduled = True
                self.push(self.now + self.config.deadlock_check_s, DEADLOCK_CHECK, None)

    def _on_deadlock_check(self, _: Any) -> None:
        self.deadlock_check_scheduled = False
        if not self.partial:
            return
        self.check_deadlocks()
        self.deadlock_check_scheduled = True
        self.push(self.now + self.config.deadlock_check_s, DEADLOCK_CHECK, None)

    def slots_obtainable(self, gpus: int) -> int:
        """Pods of ``gpus`` GPUs that free capacity could still take: free GPUs on ready
        nodes, empty booting nodes, and nodes the cloud has in stock within the quota."""
        g = self.gpus_per_node
        per_node = g // gpus
        free_index = self.free_index
        slots = sum(len(free_index[f]) * (f // gpus) for f in range(gpus, g + 1))
        cloud = self.cloud
        new = min(cloud.quota_room_nodes(), cloud.total_stock())
        return slots + (self.booting_nodes + new) * per_node

    def check_deadlocks(self) -> None:
        """Flag every partial gang that cannot complete with the capacity that is free or
        obtainable, but could if the other partial gangs let go of what they hold: it holds
        GPUs while other gangs hold the rest (pods hold whole GPUs, so the held GPUs of the
        others are counted in pods of this gang's size)."""
        partial = list(self.partial.values())
        held = [r.bound * r.pod_gpus for r in partial]
        total_held = sum(held)
        interval = self.config.deadlock_check_s
        for run, mine in zip(partial, held, strict=True):
            need = run.pods - run.bound
            free = self.slots_obtainable(run.pod_gpus)
            if need <= free:
                continue
            if need <= free + (total_held - mine) // run.pod_gpus:
                run.deadlocked = True
                self.deadlocked_gpu_s += mine * interval

    def reject(self, run: JobRun) -> None:
        """``run`` can never fit: it is counted as never started, at once."""
        run.status = NEVER_FITS
        self.open_jobs -= 1

    def note_retry(self) -> None:
        """A request found no capacity and will be planned again (or fail): count it, and
        the most such attempts within one minute of simulated time."""
        self.retries += 1
        minute = int(self.now // 60.0)
        if minute != self._retry_minute:
            self._retry_minute = minute
            self._retries_this_minute = 0
        self._retries_this_minute += 1
        if self._retries_this_minute > self.retries_peak_per_min:
            self.retries_peak_per_min = self._retries_this_minute

    def fail(self, run: JobRun) -> None:
        """``run`` (pending, nothing bound) gave up before its start timeout: its request was
        marked Failed. It is counted as never started, apart from timeouts."""
        run.status = FAILED
        self.open_jobs -= 1

    def _on_tick(self, _: Any) -> None:
        if self.cloud.tick():
            self.on_room()
        self.push(self.now + self.config.cloud.refill_interval_s, TICK, None)

    # ------------------------------------------------------------------ result
    def _result(self, wall_s: float) -> StrategyResult:
        runs = self.runs
        waits: list[float] = []
        gang_waits: list[float] = []
        gangs = gangs_started = one_rack = cross_block = deadlocked = 0
        timed_out = never_fits = failed = 0
        for run in runs:
            if run.status == TIMED_OUT:
                timed_out += 1
            elif run.status == NEVER_FITS:
                never_fits += 1
            elif run.status == FAILED:
                failed += 1
            if run.pods > 1:
                gangs += 1
                deadlocked += run.deadlocked
            if run.start < 0:
                continue
            wait = run.start - run.job.submit
            waits.append(wait)
            if run.pods > 1:
                gang_waits.append(wait)
                gangs_started += 1
                one_rack += run.racks == 1
                cross_block += run.blocks > 1
        waits.sort()
        gang_waits.sort()
        m = self.meter
        hour = 3600.0
        paid = m.paid_s / hour
        used = m.used_s / hour
        return StrategyResult(
            strategy=self.name,
            jobs=len(runs),
            started=len(waits),
            never_started=timed_out + never_fits + failed,
            timed_out=timed_out,
            never_fits=never_fits,
            failed=failed,
            gangs=gangs,
            gangs_started=gangs_started,
            gangs_one_rack=one_rack,
            gangs_cross_block=cross_block,
            gangs_deadlocked=deadlocked,
            deadlocked_gpu_h=self.deadlocked_gpu_s / hour,
            paid_gpu_h=paid,
            used_gpu_h=used,
            slowdown_gpu_h=self.slowdown_gpu_s / hour,
            stranded_gpu_h=paid - used,
            stranded_waiting_gpu_h=m.waiting_s / hour,
            stranded_idle_gpu_h=(m.paid_s - m.used_s - m.waiting_s - m.booting_s) / hour,
            stranded_booting_gpu_h=m.booting_s / hour,
            cost=paid * self.config.price_per_gpu_hour,
            wait_p50_s=percentile(waits, 50),
            wait_p95_s=percentile(waits, 95),
            wait_p99_s=percentile(waits, 99),
            gang_wait_p50_s=percentile(gang_waits, 50),
            gang_wait_p95_s=percentile(gang_waits, 95),
            gang_wait_p99_s=percentile(gang_waits, 99),
            nodes_acquired=self.nodes_acquired,
            peak_paid_gpus=m.peak_paid,
            end_s=self.now,
            events=self.events,
            fit_calls=self.fit_calls,
            retries=self.retries,
            retries_peak_per_min=self.retries_peak_per_min,
            wall_s=wall_s,
            series_bin_s=m.bin_seconds,
            series_paid=tuple(v / m.bin_seconds for v in m.paid_bins),
            series_used=tuple(v / m.bin_seconds for v in m.used_bins),
        )
