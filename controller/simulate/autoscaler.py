"""The two cluster-autoscaler strategies, modelled on its code (kubernetes/autoscaler,
``cluster-autoscaler/``) and deliberately without the fit engine.

:class:`PodByPod` is cluster-autoscaler plus kube-scheduler with ordinary pods:

* **Loop** (``--scan-interval``, 10 s): pending pods are looked at on the next scan tick,
  not at once (``core/static_autoscaler.go`` ``RunOnce``).
* **Estimate** (``estimator/binpacking_estimator.go``): the nodes the pending pods need,
  first-fit decreasing on empty template nodes; nodes already requested and not ready yet
  (upcoming nodes) are subtracted, as the orchestrator puts them in its snapshot first.
* **Limits** (``core/scaleup/orchestrator/orchestrator.go`` ``applyLimits``): the request is
  capped by the quota (``--max-nodes-total`` / ``--gpu-total``): a partial scale-up.
* **Partial scale-ups** (``clusterstate/clusterstate.go``
  ``handleInstanceCreationErrorsForNodeGroup``): nodes the cloud could not create (out of
  stock) are reported as instance errors; the scale-up is reduced and the node group backs
  off: 5 min, doubling to 30 min, forgotten 3 h after the last failure
  (``utils/backoff/exponential_backoff.go``). While backed off, the group is not scaled up.
  With ``stockout_reported=False`` the missing nodes instead count as upcoming until
  ``--max-node-provision-time`` (15 min), then the scale-up fails the same way
  (``updateScaleRequests``).
* **Scale-down**: an empty node goes after ``--scale-down-unneeded-time`` (the shared
  ``idle_timeout_s``), never within ``--scale-down-delay-after-add`` (10 min) of the last
  scale-up (``isScaleDownInCooldown``). Training pods are assumed
  ``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"``, so non-empty nodes stay.
* **Binding** (kube-scheduler): pods bind one at a time, oldest first, to the fullest ready
  node that holds them; a bound pod of a gang holds its GPUs while the rest wait.

:class:`BestEffortAtomic` adds the ``best-effort-atomic-scale-up.autoscaling.x-k8s.io``
ProvisioningRequest class as Kueue's ProvisioningRequest admission check uses it: gangs wait
in Kueue until their request is ``Provisioned``, single-pod jobs stay ordinary pods.

* One request per loop, the oldest that is not backing off
  (``processors/provreq/injector.go``); loops alternate between requests and ordinary pods
  when both wait (``core/scaleup/orchestrator/wrapper_orchestrator.go``).
* Pods that fit free capacity (ready nodes and upcoming ones, minus capacity booked by other
  requests) need no new node (``provisioningrequest/besteffortatomic/provisioning_class.go``
  ``filterOutSchedulable``); the rest is asked for all or nothing: not at all when the quota
  or a backed-off node group cannot give every node (``allOrNothing`` in
  ``orchestrator.go``), with ``AtomicIncreaseSize`` (``executor.go``); when the cloud has too
  little stock the call fails and the node group backs off as above. With
  ``provreq_atomic=False`` the node group has no atomic call, ``IncreaseSize`` is used and
  the request may get part of its nodes.
* A request that fails is retried after 1 min, doubling to 10 min
  (``--provisioning-request-initial-backoff-time``, ``--provisioning-request-max-backoff-time``).
* ``Provisioned=True`` is set when the scale-up call succeeds, before the nodes are ready
  ("best effort"); Kueue then admits the job and its pods are created and bound by the
  scheduler like any others. Their capacity is booked against other requests for 10 min;
  pods still unbound after that count as ordinary pending pods.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from controller.simulate.engine import PENDING, SCAN, TIMER, JobRun, SimConfig, SimNode, Simulation
from controller.simulate.trace import Trace

_PROVISION_TIMEOUT = "provision-timeout"
_BIND = "bind"
_BIND_NOW = "bind-now"
_POD_MAX_BACKOFF_S = 10.0
_BOOKING_END = "booking-end"


def bins_needed(pending: Mapping[int, int], capacity: int) -> int:
    """Nodes of ``capacity`` GPUs that first-fit-decreasing needs for the pending pods
    (GPUs per pod -> count), as cluster-autoscaler's binpacking estimator does."""
    sizes = [s for s in pending if pending[s] > 0]
    if not sizes:
        return 0
    if all(capacity % s == 0 for s in sizes):
        # Sizes that divide the node pack perfectly: FFD is exactly the volume bound.
        total = sum(s * pending[s] for s in sizes)
        return -(-total // capacity)
    # General case: first-fit-decreasing over open bins grouped by remaining capacity.
    open_bins = [0] * (capacity + 1)
    bins = 0
    for size in sorted(sizes, reverse=True):
        for _ in range(pending[size]):
            for room in range(size, capacity + 1):
                if open_bins[room]:
                    open_bins[room] -= 1
                    open_bins[room - size] += 1
                    break
            else:
                bins += 1
                open_bins[capacity - size] += 1
    return bins


class PodByPod(Simulation):
    """cluster-autoscaler + kube-scheduler, pod by pod (no fit engine, by design)."""

    name = "pod-by-pod"
    index_booting = False

    def __init__(self, trace: Trace, config: SimConfig) -> None:
        super().__init__(trace, config)
        # Pods never tried yet per GPU size: heap of ((queued at, queued at, pod index, seq),
        # run). Pods of jobs queued in the same second interleave, as concurrent job
        # controllers create them.
        self.pending: dict[int, list[tuple[tuple[float, float, int, int], JobRun]]] = {}
        self.pending_pods: dict[int, int] = {}
        # Pods that were tried and found no node, per size, in cohorts that failed together.
        self.cohorts: dict[int, list[_Cohort]] = {}
        self.bind_timer_at = math.inf
        self.bind_now_at = -math.inf
        self.scan_at = math.inf
        """Time of the one scan scheduled (inf: none)."""
        self.last_scale_up = -math.inf
        # The node group's backoff (utils/backoff/exponential_backoff.go).
        self.backoff_until = -math.inf
        self.backoff_duration = 0.0
        self.backoff_last_fail = -math.inf
        self.phantom_nodes = 0
        """Nodes asked for that the cloud silently did not create (still 'upcoming')."""
        self.scale_ups = 0
        self.failed_scale_ups = 0

    # ------------------------------------------------------------------ hooks
    def on_arrival(self, run: JobRun) -> None:
        self.enqueue(run, run.job.submit)
        self.request_bind()
        self.request_scan()

    def enqueue(self, run: JobRun, queued_at: float) -> None:
        size = run.pod_gpus
        queue = self.pending.setdefault(size, [])
        seq = run.job.seq
        for k in range(run.bound, run.pods):
            heapq.heappush(queue, ((queued_at, queued_at, k, seq), run))
        self.pending_pods[size] = self.pending_pods.get(size, 0) + run.pods - run.bound

    def on_capacity_freed(self) -> None:
        self.request_bind()

    def on_node_ready(self, node: SimNode) -> None:
        self.request_bind()

    def request_bind(self) -> None:
        """Run the scheduler once every event of this instant is in (nodes that become ready
        together are all seen, pods that arrive together fail together)."""
        if self.bind_now_at != self.now:
            self.bind_now_at = self.now
            self.push(self.now, TIMER, (_BIND_NOW, self.now))

    def on_room(self) -> None:
        if any(self.pending_pods.values()):
            self.request_scan()

    def on_cancel(self, run: JobRun) -> None:
        self.pending_pods[run.pod_gpus] -= run.pods - run.bound

    def scale_down_not_before(self) -> float:
        return self.last_scale_up + self.config.scale_down_delay_after_add_s

    def on_timer(self, obj: Any) -> None:
        kind, payload = obj
        if kind == _BIND_NOW:
            self.bind_now_at = -math.inf
            self.bind()
        elif kind == _BIND:
            if payload == self.bind_timer_at:
                self.bind_timer_at = math.inf
                self.bind()
        elif kind == _PROVISION_TIMEOUT:
            # The missing nodes never registered: the scale-up timed out.
            self.phantom_nodes -= payload
            self.fail_scale_up()
        else:
            raise RuntimeError(f"{self.name}: unknown timer {kind!r}")

    # ------------------------------------------------------------------ the loop
    def request_scan(self, not_before: float | None = None) -> None:
        """Make sure a loop runs at the next scan tick after now (and at or after
        ``not_before``: a backoff that ends at ``t`` is over for a loop at ``t``)."""
        interval = self.config.scan_interval_s
        at = (self.now // interval + 1) * interval
        if not_before is not None and not_before > at:
            at = math.ceil(not_before / interval) * interval
        if at < self.scan_at:
            self.scan_at = at
            self.push(at, SCAN, at)

    def on_scan(self, at: Any) -> None:
        if at != self.scan_at:
            return  # superseded by an earlier scan
        self.scan_at = math.inf
        self.loop()

    def loop(self) -> None:
        """One scale-up step of cluster-autoscaler's RunOnce."""
        self.scale_up_pods(self.pending_pods, self.booting_nodes)

    def scale_up_pods(self, pending: Mapping[int, int], upcoming: int) -> None:
        if not any(pending.values()):
            return
        if self.now < self.backoff_until:
            self.request_scan(self.backoff_until)  # the only node group is backed off
            return
        needed = bins_needed(pending, self.gpus_per_node) - upcoming - self.phantom_nodes
        if needed > 0:
            self.increase_size(needed)

    def increase_size(self, count: int) -> int:
        """``IncreaseSize`` capped by the quota; returns the nodes the cloud created."""
        want = min(count, self.cloud.quota_room_nodes())
        if want <= 0:
            return 0  # no room at all: no scale-up, the pods stay pending
        granted = self.cloud.acquire_any(want)
        self.add_nodes(granted)
        missing = want - len(granted)
        if missing:
            self.nodes_not_created(missing)
        else:
            self.scale_up_succeeded()
        return len(granted)

    def add_nodes(self, granted: list[tuple[int, float]]) -> None:
        for rack, boot_s in granted:
            self.add_node(rack, boot_s)
        self.last_scale_up = self.now
        self.scale_ups += 1

    def nodes_not_created(self, missing: int) -> None:
        if self.config.stockout_reported:
            self.fail_scale_up()
        else:
            self.phantom_nodes += missing
            self.push(
                self.now + self.config.max_node_provision_time_s,
                TIMER,
                (_PROVISION_TIMEOUT, missing),
            )

    def scale_up_succeeded(self) -> None:
        if self.now >= self.backoff_until:
            self.backoff_duration = 0.0  # RemoveBackoff once a scale-up completes

    def fail_scale_up(self) -> None:
        """``Backoff`` of utils/backoff/exponential_backoff.go for the node group."""
        cfg = self.config
        now = self.now
        self.failed_scale_ups += 1
        if self.backoff_duration and self.backoff_last_fail + cfg.backoff_reset_s < now:
            self.backoff_duration = 0.0  # RemoveStaleBackoffData
        duration = cfg.backoff_initial_s
        # Doubles only when not backed off right now (IsBackedOff: until > now).
        if self.backoff_duration and self.backoff_until <= now:
            duration = min(2.0 * self.backoff_duration, cfg.backoff_max_s)
        self.backoff_duration = duration
        self.backoff_until = now + duration
        self.backoff_last_fail = now
        self.request_scan(self.backoff_until)

    # ------------------------------------------------------------------ the scheduler
    def bind(self) -> None:
        """kube-scheduler's queue. A pod is tried when it arrives; one that finds no node
        backs off 1 s, doubling to 10 s per failed try (``podInitialBackoffSeconds``,
        ``podMaxBackoffSeconds``) and is stamped with the time it failed. Pods out of backoff
        are tried oldest stamp first (pods that failed together in arrival order) and bind
        to the fullest ready node that holds them; a size that finds no node fails every
        eligible pod at least as large. So a new gang's pods can take capacity that frees up
        while an older gang's last pods back off, as in a real cluster."""
        free_index = self.free_index
        g = self.gpus_per_node
        blocked = g + 1
        while True:
            size, cohort = self._next_pod(blocked)
            if not size:
                break
            node = None
            for free in range(size, g + 1):
                bucket = free_index[free]
                if bucket:
                    node = next(iter(bucket.values()))
                    break
            if node is None:
                self._fail_sizes(size)
                blocked = size
                continue
            if cohort is not None:
                run = cohort.pods.popleft()[3]
            else:
                run = heapq.heappop(self.pending[size])[1]
            self.pending_pods[size] -= 1
            self.allocate(run, node, size)
            self.note_bound(run)
        self._arm_bind_timer()

    def _next_pod(self, blocked: int) -> tuple[int, _Cohort | None]:
        """(size, cohort or None for a pod never tried) of the eligible pod with the oldest
        stamp among sizes below ``blocked``; (0, None) when there is none."""
        now = self.now
        best_key: tuple[float, float, int, int] | None = None
        best_size = 0
        best_cohort: _Cohort | None = None
        for size, queue in self.pending.items():
            if size >= blocked:
                continue
            while queue and queue[0][1].status != PENDING:
                heapq.heappop(queue)  # a cancelled job's pods
            if queue and (best_key is None or queue[0][0] < best_key):
                best_key, best_size, best_cohort = queue[0][0], size, None
            for cohort in self.cohorts.get(size, ()):
                if cohort.until > now:
                    continue
                pods = cohort.pods
                while pods and pods[0][3].status != PENDING:
                    pods.popleft()
                if pods:
                    head = pods[0]
                    key = (cohort.stamp, head[0], head[1], head[2])
                    if best_key is None or key < best_key:
                        best_key, best_size, best_cohort = key, size, cohort
        return best_size, best_cohort

    def _fail_sizes(self, smallest: int) -> None:
        """Every eligible pod of ``smallest`` GPUs or more was tried and found no node: pods
        with the same number of failed tries fail together, in one cohort."""
        now = self.now
        for size, queue in self.pending.items():
            if size < smallest:
                continue
            by_tries: dict[int, list[_Pod]] = {}
            if queue:
                by_tries[1] = [(q, k, seq, run) for (_, q, k, seq), run in queue]
                queue.clear()
            keep: list[_Cohort] = []
            for cohort in self.cohorts.get(size, ()):
                if cohort.until > now:
                    if cohort.pods:
                        keep.append(cohort)
                    continue
                tries = min(cohort.tries + 1, 5)
                by_tries.setdefault(tries, []).extend(cohort.pods)
            for tries, pods in by_tries.items():
                pods = [p for p in pods if p[3].status == PENDING]
                if pods:
                    pods.sort(key=_pod_order)
                    until = now + min(2.0 ** (tries - 1), _POD_MAX_BACKOFF_S)
                    keep.append(_Cohort(until, now, tries, deque(pods)))
            self.cohorts[size] = keep

    def _arm_bind_timer(self) -> None:
        """Wake the scheduler when a backed-off pod could bind on a node that has room."""
        now = self.now
        soonest = math.inf
        g = self.gpus_per_node
        for size, cohorts in self.cohorts.items():
            for cohort in cohorts:
                if (
                    now < cohort.until < soonest
                    and cohort.pods
                    and any(self.free_index[f] for f in range(size, g + 1))
                ):
                    soonest = cohort.until
        if soonest < math.inf and (soonest < self.bind_timer_at or self.bind_timer_at <= now):
            self.bind_timer_at = soonest
            self.push(soonest, TIMER, (_BIND, soonest))


_Pod = tuple[float, int, int, JobRun]
"""A pod that was tried: (queued at, pod index, job seq, run)."""


def _pod_order(pod: _Pod) -> tuple[float, int, int]:
    return pod[0], pod[1], pod[2]


class _Cohort:
    """Pods of one size that failed together with as many tries: one backoff, one stamp."""

    __slots__ = ("pods", "stamp", "tries", "until")

    def __init__(self, until: float, stamp: float, tries: int, pods: deque[_Pod]) -> None:
        self.until = until
        self.stamp = stamp
        self.tries = tries
        self.pods = pods


class BestEffortAtomic(PodByPod):
    """Gangs through ProvisioningRequests of the best-effort-atomic class (Kueue's
    admission check); single-pod jobs as ordinary pods."""

    name = "best-effort-atomic"

    def __init__(self, trace: Trace, config: SimConfig) -> None:
        super().__init__(trace, config)
        self.requests: list[JobRun] = []
        """Gangs whose request is not Provisioned yet, oldest first."""
        self.retry_at: dict[int, float] = {}
        self.retry_wait: dict[int, float] = {}
        self.admitted: set[int] = set()
        self.booked: list[tuple[JobRun, float]] = []
        """Admitted gangs and the end of their booking."""
        self.regular_turn = False
        self.provreq_attempts = 0

    def on_arrival(self, run: JobRun) -> None:
        if run.pods == 1:
            super().on_arrival(run)
            return
        self.requests.append(run)
        self.request_scan()

    def on_cancel(self, run: JobRun) -> None:
        if run.pods == 1 or run.job.seq in self.admitted:
            super().on_cancel(run)
        # else: a waiting request, dropped from self.requests when next looked at

    def on_capacity_freed(self) -> None:
        self.request_bind()
        if self.requests:
            self.request_scan()

    def on_room(self) -> None:
        if self.requests or any(self.pending_pods.values()):
            self.request_scan()

    def on_timer(self, obj: Any) -> None:
        kind, payload = obj
        if kind == _BOOKING_END:
            if payload.status == PENDING and payload.bound < payload.pods:
                self.request_scan()  # its unbound pods are ordinary pending pods now
        else:
            super().on_timer(obj)

    # ------------------------------------------------------------------ bookings
    def booked_unbound(self) -> int:
        """Pods of admitted gangs not bound yet whose booking still runs (whole nodes)."""
        now = self.now
        keep = [(r, until) for r, until in self.booked if r.status == PENDING and now < until]
        self.booked = keep
        return sum(r.pods - r.bound for r, _ in keep)

    # ------------------------------------------------------------------ the loop
    def loop(self) -> None:
        g = self.gpus_per_node
        booked = self.booked_unbound()
        ordinary = dict(self.pending_pods)
        ordinary[g] = ordinary.get(g, 0) - booked
        has_ordinary = any(v > 0 for v in ordinary.values())
        request = self._next_request()
        if request is not None and (not has_ordinary or not self.regular_turn):
            self.regular_turn = has_ordinary
            self.provision(request, booked)
        elif has_ordinary:
            self.regular_turn = False
            self.scale_up_pods(ordinary, max(0, self.booting_nodes - booked))
        if self.requests:
            now = self.now
            soonest = min(self.retry_at.get(r.job.seq, now) for r in self.requests)
            self.request_scan(soonest)

    def _next_request(self) -> JobRun | None:
        self.requests = [r for r in self.requests if r.status == PENDING]
        now = self.now
        for run in self.requests:
            if self.retry_at.get(run.job.seq, now) <= now:
                return run
        return None

    def provision(self, run: JobRun, booked: int) -> None:
        """``Provision`` of the best-effort-atomic class for one gang (whole-node pods)."""
        self.provreq_attempts += 1
        free_nodes = len(self.free_index[self.gpus_per_node]) + self.booting_nodes - booked
        new = run.pods - max(0, min(run.pods, free_nodes))
        if new == 0:
            self.admit(run)  # CapacityIsFound
            return
        if self.now < self.backoff_until or new > self.cloud.quota_room_nodes():
            self._not_provisioned(run)  # no option for every pod: all or nothing
            return
        if self.config.provreq_atomic:
            granted = self.cloud.acquire_count_atomic(new)
            if granted is None:
                self.fail_scale_up()  # AtomicIncreaseSize failed: the group backs off
                self._not_provisioned(run)
                return
            self.add_nodes(granted)
            self.scale_up_succeeded()
        else:
            granted = self.cloud.acquire_any(new)
            self.add_nodes(granted)
            if len(granted) < new:
                self.nodes_not_created(new - len(granted))
            else:
                self.scale_up_succeeded()
        self.admit(run)  # CapacityIsProvisioned: the call succeeded, nodes still boot

    def _not_provisioned(self, run: JobRun) -> None:
        cfg = self.config
        seq = run.job.seq
        wait = self.retry_wait.get(seq, cfg.provreq_backoff_initial_s)
        self.retry_at[seq] = self.now + wait
        self.retry_wait[seq] = min(2.0 * wait, cfg.provreq_backoff_max_s)

    def admit(self, run: JobRun) -> None:
        """Provisioned=True: Kueue admits the job, its pods are created and queue for the
        scheduler; the request's capacity stays booked for ``booking_s``."""
        seq = run.job.seq
        self.requests.remove(run)
        self.retry_at.pop(seq, None)
        self.retry_wait.pop(seq, None)
        self.admitted.add(seq)
        until = self.now + self.config.booking_s
        self.booked.append((run, until))
        self.push(until, TIMER, (_BOOKING_END, run))
        self.enqueue(run, self.now)
        self.request_bind()
