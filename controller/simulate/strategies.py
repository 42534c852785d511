"""The provisioning strategies the simulator compares on the same jobs and seed.

* :class:`~controller.simulate.autoscaler.PodByPod` and
  :class:`~controller.simulate.autoscaler.BestEffortAtomic` model cluster-autoscaler
  (ordinary pods; its best-effort-atomic ProvisioningRequest class) and do not use the fit
  engine.
* :class:`GangFit` asks the real fit engine (:func:`controller.fit.plan`) where the whole
  job fits on the current nodes plus the stock the cloud has, then acquires every new node
  it named or none. ``muster`` asks for one rack (``required`` at the rack level) and, when no
  rack can hold the job, one block; ``muster-relax`` does the same for at most
  ``relax_after_s`` of waiting, then asks for the most compact placement anywhere
  (``preferred`` at the rack level: one rack, else one block, else the fewest blocks); with
  ``reserve_s`` (off by default) it also holds a reservation for that long: younger jobs may
  only use GPUs left on busy nodes;
  ``gang-no-topology`` asks without any topology.
``muster-shipped`` is the controller as it ships, with its defaults: ``muster-retry``'s
per-request backoff for what the controller cannot watch (the cloud's stock), plus the
re-planning of every waiting request (in ``retry.replan_order``) the moment something it
watches frees capacity (a job's pods end, an idle node is released:
:mod:`controller.state.wakeups`; such a re-plan that misses counts no attempt), plus
topology relaxation after ``shipped_relax_after_s`` (the controller's
``topology.relax_after_seconds``; None: never): then the most compact placement
(``preferred`` at the rack level), the next attempt no later than the relaxation, and a gang
no block can hold waits for it instead of being refused.

``muster``, ``muster-relax`` and ``gang-no-topology`` queue in arrival order and backfill
(Kueue's BestEffortFIFO in front of Muster): a job that does not fit does not block a later
job that does, and capacity that frees goes to the oldest waiting job that fits it.
``muster-retry`` asks as ``muster`` does but orders the requests as Muster's controller does
when they reach it without a queue in front: a request is planned when it is created, and
one that found no capacity is planned again after its own backoff
(:meth:`controller.config.RetryConfig.backoff`, the controller's ``retry`` settings), not
when capacity frees; so a new request never waits behind older ones that do not fit. After
``retry_attempts`` attempts that found nothing (``retry.max_attempts``) the request is
Failed, as the controller marks it ``RetriesExhausted``, and its job never starts.
Pods go to the most-allocated node that holds them (bin-packing, the usual GPU cluster
scoring) under every strategy.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.config import RetryConfig
from controller.fit import (
    GangRequest,
    Mode,
    NodeState,
    NoFit,
    Plan,
    PodSetRequest,
    PodShape,
    PoolDomain,
    PoolState,
    Snapshot,
    TopologyMode,
    TopologyRequest,
)
from controller.simulate.autoscaler import BestEffortAtomic, PodByPod
from controller.simulate.engine import (
    PENDING,
    PLACED,
    TIMER,
    JobRun,
    SimConfig,
    SimNode,
    Simulation,
)
from controller.simulate.trace import Trace

GPU = "nvidia.com/gpu"
BLOCK_LABEL, RACK_LABEL = DEFAULT_LEVELS[0], DEFAULT_LEVELS[1]
LEVELS = (BLOCK_LABEL, RACK_LABEL)
POOL = "gpu-nodes"

Planner = Callable[[GangRequest, Snapshot, Mode], Plan | NoFit]


class GangFit(Simulation):
    """All-or-nothing through the real fit engine; ``topology`` selects muster's rack-then-
    block request or no topology at all; ``relax`` lets a gang that waited
    ``relax_after_s`` take the most compact placement anywhere; ``retry`` replaces the
    arrival-order queue with the controller's per-request retry backoff."""

    index_booting = True

    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        *,
        topology: bool,
        relax: bool = False,
        retry: bool = False,
        wake: bool = False,
        planner: Planner | None = None,
    ) -> None:
        super().__init__(trace, config)
        if planner is None:
            from controller.fit import plan

            planner = plan
        self.planner: Planner = planner
        self.topology = topology
        self.wake = wake and retry
        self.relax_after: float | None = (
            config.shipped_relax_after_s if self.wake else config.relax_after_s if relax else None)
        self.relax = self.relax_after is not None and topology
        self.retry: RetryConfig | None = None
        self.waiting: dict[int, JobRun] = {}
        """muster-shipped: job seq -> run, of the requests waiting for capacity."""
        self.due: dict[int, float] = {}
        """muster-shipped: job seq -> when its backoff timer is due (a timer that is not is
        stale: the attempt was moved earlier, to the relaxation)."""
        if retry:
            if relax:
                raise ValueError("muster-retry does not relax topology")
            self.retry = RetryConfig(
                initial_backoff_seconds=config.retry_initial_s,
                max_backoff_seconds=config.retry_max_s,
                max_attempts=config.retry_attempts,
            )
        self.attempts: dict[int, int] = {}
        """muster-retry: job seq -> planning attempts that found no capacity."""
        self._no_fit: dict[tuple[int, int, bool], tuple[int, int]] = {}
        """muster-retry: shape -> (capacity version, cloud version) it last found no fit
        at; the same shape on the same cluster gets the same answer without the engine."""
        if not topology:
            self.name = "gang-no-topology"
        else:
            self.name = ("muster-shipped" if self.wake else "muster-relax" if relax
                         else "muster-retry" if retry else "muster")
        cc = config.cloud
        # Shapes of pending jobs -> their runs in arrival order.
        self.queues: dict[tuple[int, int], deque[JobRun]] = {}
        # Rack values are unique across blocks, so a rack label alone names a rack.
        self.rack_labels = [
            {BLOCK_LABEL: f"b{block}", RACK_LABEL: f"b{block}-r{r}"}
            for r, block in enumerate(self.cloud.rack_block)
        ]
        self.rack_of = {labels[RACK_LABEL]: r for r, labels in enumerate(self.rack_labels)}
        g = cc.gpus_per_node
        self._allocatable = {GPU: g}
        self._free_maps = [{GPU: f} for f in range(g + 1)]
        self._shapes: dict[int, PodShape] = {}
        self._pool: PoolState | None = None
        self._pool_version = -1
        self._price_node_hour = config.price_per_gpu_hour * g
        self._ready_s = (cc.boot_min_s + cc.boot_max_s) / 2.0
        self._attempts: tuple[TopologyRequest, ...]
        if topology:
            self._attempts = (
                TopologyRequest(TopologyMode.REQUIRED, RACK_LABEL),
                TopologyRequest(TopologyMode.REQUIRED, BLOCK_LABEL),
            )
            self._relaxed = (TopologyRequest(TopologyMode.PREFERRED, RACK_LABEL),)
            block = cc.racks_per_block * cc.nodes_per_rack
            self._largest = min(cc.quota_nodes,
                                cc.racks * cc.nodes_per_rack if self.relax else block)
        else:
            self._attempts = (TopologyRequest(),)
            self._largest = min(cc.quota_nodes, cc.racks * cc.nodes_per_rack)

    # ------------------------------------------------------------------ hooks
    def on_arrival(self, run: JobRun) -> None:
        if run.pods * -(-run.pod_gpus // self.gpus_per_node) > self._largest:
            # More nodes than the quota (or, for muster, one block) can ever hold.
            self.reject(run)
            return
        if self.retry is not None:
            self._attempt(run)
            return
        key = (run.pods, run.pod_gpus)
        queue = self.queues.get(key)
        while queue and queue[0].status != PENDING:
            queue.popleft()
        reserve = self._reserving()
        if queue:
            # Others of this shape wait already: this one cannot fit either.
            queue.append(run)
        elif self.try_place(run, restricted=reserve is not None):
            return
        else:
            self.queues.setdefault(key, deque()).append(run)
        if self.relax and run.pods > 1:
            relaxed = run.job.submit + self.config.relax_after_s
            self.push(relaxed, TIMER, run)
            if self.config.reserve_s:
                self.push(relaxed + self.config.reserve_s, TIMER, run)  # reservation ends

    def on_capacity_freed(self) -> None:
        if self.retry is None:
            self.drain()
        elif self.wake:
            self._wake()

    def on_node_released(self) -> None:
        if self.wake:
            self._wake()
        else:
            self.on_room()

    def on_room(self) -> None:
        # muster-retry: the controller plans a waiting request again on its own timer only
        # (nothing enqueues it when pods end or stock returns).
        if self.retry is None:
            self.drain()

    def on_node_ready(self, node: SimNode) -> None:
        """Nothing to do: a booting node's free GPUs were placeable already."""

    def on_cancel(self, run: JobRun) -> None:
        """Nothing to do: a cancelled run stays in its queue and is skipped there."""

    def on_timer(self, run: Any) -> None:
        """muster-relax: ``run`` (a gang) has waited ``relax_after_s``: try again, relaxed.
        muster-retry: ``run``'s backoff ended: plan it again."""
        if run.status != PENDING:
            return
        if self.retry is not None:
            due = self.due.get(run.job.seq)
            if due is not None and due != self.now:
                return  # replaced by an earlier attempt (the relaxation)
            self._attempt(run)
        else:
            self.drain()

    def _wake(self) -> None:
        """muster-shipped: plan every waiting request again, in the controller's
        ``retry.replan_order`` (arrival: oldest first; backoff: the one whose timer is due
        first), as one planner pass does; a shape that missed stops every shape at least as
        large this round (it could not fit either). A miss counts no attempt and leaves the
        backoff timer."""
        if not self.waiting:
            return
        failed: list[tuple[int, int, bool]] = []
        hold = self._shipped_hold()
        order = (sorted(self.waiting) if self.config.shipped_replan_order == "arrival"
                 else sorted(self.waiting, key=lambda seq: (self.due.get(seq, math.inf), seq)))
        for seq in order:
            run = self.waiting[seq]
            if run.status != PENDING:
                del self.waiting[seq]
                continue
            relaxed = self._relaxed_now(run)
            if any(run.pods >= fp and run.pod_gpus >= fg and relaxed <= fr
                   for fp, fg, fr in failed):
                continue
            if self.try_place(run, restricted=hold is not None and seq > hold.job.seq):
                del self.waiting[seq]
                self.attempts.pop(seq, None)
                self.due.pop(seq, None)
                if run is hold:
                    hold = self._shipped_hold()
            else:
                failed.append((run.pods, run.pod_gpus, relaxed))

    def _shipped_hold(self) -> JobRun | None:
        """muster-shipped with the controller's ``topology.reserve_seconds``: the oldest
        waiting gang whose relaxation came less than that long ago (it holds a reservation
        against younger requests, as the controller's planner does)."""
        reserve = self.config.shipped_reserve_s
        if not (self.wake and self.relax and reserve) or self.relax_after is None:
            return None
        since = self.now - self.relax_after
        for seq in sorted(self.waiting):  # arrival order
            run = self.waiting[seq]
            submit = run.job.submit
            if submit > since:
                return None
            if run.pods > 1 and run.status == PENDING and submit > since - reserve:
                return run
        return None

    def _relaxed_now(self, run: JobRun) -> bool:
        return (self.relax and run.pods > 1 and self.relax_after is not None
                and self.now - run.job.submit >= self.relax_after)

    def _attempt(self, run: JobRun) -> None:
        """muster-retry: plan ``run`` now; if it does not fit, again after the backoff of
        its attempt, or, if that was attempt ``retry.max_attempts``, fail it (as
        :meth:`ProvisioningService.retry_or_fail` does; the job's start timeout, the
        controller's ``ValidUntilSeconds``, may end the retries first)."""
        hold = self._shipped_hold()
        if self.try_place(run, restricted=hold is not None and run.job.seq > hold.job.seq):
            self.attempts.pop(run.job.seq, None)
            self.waiting.pop(run.job.seq, None)
            self.due.pop(run.job.seq, None)
            return
        retry = self.retry
        if retry is None:
            raise RuntimeError(f"{self.name}: a retry without a retry policy")
        attempt = self.attempts.get(run.job.seq, 0) + 1
        self.note_retry()
        if attempt >= retry.max_attempts:
            self.attempts.pop(run.job.seq, None)
            self.waiting.pop(run.job.seq, None)
            self.fail(run)
            return
        self.attempts[run.job.seq] = attempt
        # Past the cap the delay no longer grows; clamping keeps 2**attempt a small number.
        delay = retry.backoff(min(attempt, 64))
        if self.wake:
            self.waiting[run.job.seq] = run
            if self.relax and run.pods > 1 and self.relax_after is not None:
                # As retry_or_fail: the next attempt no later than the relaxation.
                until = run.job.submit + self.relax_after - self.now
                if until > 0:
                    delay = min(delay, until)
            self.due[run.job.seq] = self.now + delay
        self.push(self.now + delay, TIMER, run)

    # ------------------------------------------------------------------ queue
    def drain(self) -> None:
        """Place waiting jobs, oldest first across shapes; a shape that does not fit stops
        every shape at least as large in both pods and GPUs per pod this round. Under
        muster-relax, jobs younger than a gang that has waited ``relax_after_s`` may only
        use GPUs left on nodes that are already busy (the gang holds a reservation)."""
        queues = self.queues
        if not queues:
            return
        failed: list[tuple[int, int]] = []
        reserve = self._reserving()
        while True:
            best: deque[JobRun] | None = None
            best_seq = -1
            for (pods, gpus), queue in list(queues.items()):
                while queue and queue[0].status != PENDING:
                    queue.popleft()
                if not queue:
                    del queues[(pods, gpus)]
                    continue
                if any(pods >= fp and gpus >= fg for fp, fg in failed):
                    continue
                head_seq = queue[0].job.seq
                if best is None or head_seq < best_seq:
                    best, best_seq = queue, head_seq
            if best is None:
                return
            run = best[0]
            restricted = reserve is not None and run.job.seq > reserve.job.seq
            if self.try_place(run, restricted=restricted):
                best.popleft()
                if run is reserve:
                    reserve = self._reserving()
            else:
                failed.append((run.pods, run.pod_gpus))

    def _reserving(self) -> JobRun | None:
        """muster-relax: the oldest waiting gang whose wait is in
        ``[relax_after_s, relax_after_s + reserve_s)``."""
        if not self.relax or not self.config.reserve_s:
            return None
        oldest_submit = self.now - self.config.relax_after_s
        newest_submit = oldest_submit - self.config.reserve_s
        best: JobRun | None = None
        for (pods, _), queue in self.queues.items():
            if pods == 1:
                continue
            for run in queue:  # arrival order
                submit = run.job.submit
                if submit > oldest_submit:
                    break
                if run.status == PENDING and submit > newest_submit:
                    if best is None or run.job.seq < best.job.seq:
                        best = run
                    break
        return best

    def _may_fit(self, run: JobRun) -> bool:
        """Cheap necessary condition, so hopeless engine calls are skipped: enough pod slots
        on nodes with room plus nodes the cloud could still add, ignoring topology."""
        need, gpus = run.pods, run.pod_gpus
        g = self.gpus_per_node
        cloud = self.cloud
        room = min(cloud.quota_room_nodes(), cloud.total_stock()) * (g // gpus)
        if room >= need:
            return True
        free_index = self.free_index
        slots = room
        for free in range(gpus, g + 1):
            bucket = free_index[free]
            if bucket:
                slots += len(bucket) * (free // gpus)
                if slots >= need:
                    return True
        return False

    # ------------------------------------------------------------------ fit engine
    def try_place(self, run: JobRun, restricted: bool = False) -> bool:
        """Ask the engine for ``run`` and commit the plan; ``restricted``: only free GPUs
        on nodes that are already busy, no new node."""
        if restricted and run.pod_gpus >= self.gpus_per_node:
            return False  # it needs empty nodes, which the reservation keeps
        if not restricted and not self._may_fit(run):
            return False
        relaxed = (self.relax and run.pods > 1 and self.relax_after is not None
                   and self.now - run.job.submit >= self.relax_after)
        key = (run.pods, run.pod_gpus, relaxed)
        if self.retry is not None:
            version = (self.capacity_version, self.cloud.version)
            if self._no_fit.get(key) == version:
                return False
        # One pod is always inside one rack: the block fallback could not place it either.
        attempts = self._attempts if run.pods > 1 else self._attempts[:1]
        if relaxed:
            attempts = attempts + self._relaxed
        for topology in attempts:
            request = GangRequest(
                name=f"job-{run.job.seq}",
                pod_sets=(
                    PodSetRequest("workers", run.pods, self._shape(run.pod_gpus), topology),
                ),
            )
            self.fit_calls += 1
            snapshot = self._snapshot(run.pods, run.pod_gpus, restricted)
            result = self.planner(request, snapshot, Mode.PROVISION)
            if isinstance(result, Plan):
                self._commit(run, result)
                return True
        if self.retry is not None and not restricted:
            self._no_fit[key] = (self.capacity_version, self.cloud.version)
        return False

    def _shape(self, gpus: int) -> PodShape:
        shape = self._shapes.get(gpus)
        if shape is None:
            shape = self._shapes[gpus] = PodShape(requests={GPU: gpus})
        return shape

    def _snapshot(self, pods: int, gpus: int, restricted: bool = False) -> Snapshot:
        """The cluster as the engine needs it for ``pods`` pods of ``gpus`` GPUs.

        Per rack only the ``pods`` fullest nodes that hold a pod are shown: each pod needs
        at most one node, so any placement within a rack the full cluster allows is still
        possible (placements are exact, not approximated), while the engine's input stays
        at a few dozen nodes instead of every node. Node views are cached per node and
        rebuilt only when its free GPUs change.
        """
        g = self.gpus_per_node
        nodes: list[NodeState] = []
        levels = range(gpus, g if restricted else g + 1)
        for rack, buckets in enumerate(self.rack_index):
            left = pods
            for free in levels:
                bucket = buckets[free]
                if not bucket:
                    continue
                for node in bucket.values():
                    state = node.state
                    if state is None:
                        state = node.state = NodeState(
                            name=node.name,
                            labels=self.rack_labels[rack],
                            taints=(),
                            allocatable=self._allocatable,
                            free=self._free_maps[node.free],
                            pool=POOL,
                        )
                    nodes.append(state)
                    left -= free // gpus
                    if left <= 0:
                        break
                if left <= 0:
                    break
        pools = () if restricted else (self._pool_state(),)
        return Snapshot(nodes=tuple(nodes), pools=pools, levels=LEVELS)

    def _pool_state(self) -> PoolState:
        cloud = self.cloud
        if self._pool is not None and self._pool_version == cloud.version:
            return self._pool
        room = cloud.quota_room_nodes()
        domains = tuple(
            PoolDomain(labels=self.rack_labels[r], max_new_nodes=min(stock, room))
            for r, stock in enumerate(cloud.stock)
            if stock > 0 and room > 0
        )
        self._pool = PoolState(
            name=POOL,
            labels={},
            taints=(),
            allocatable=self._allocatable,
            domains=domains,
            max_new_nodes=room,
            price_per_node_hour=self._price_node_hour,
            acquisition_level=RACK_LABEL,
            ready_seconds=self._ready_s,
        )
        self._pool_version = cloud.version
        return self._pool

    def _commit(self, run: JobRun, plan: Plan) -> None:
        """Acquire the plan's new nodes (all or none), then book every pod's GPUs."""
        new: dict[tuple[int, int], SimNode] = {}
        if plan.new_nodes:
            units = [(self.rack_of[nn.domain[RACK_LABEL]], nn.count) for nn in plan.new_nodes]
            granted = self.cloud.acquire_atomic(units)
            if granted is None:
                raise RuntimeError(
                    f"{plan.request}: the fit engine planned {units} (rack, nodes) beyond the "
                    "stock and quota the snapshot offered"
                )
            per_rack: dict[int, int] = {}
            for rack, boot_s in granted:
                index = per_rack.get(rack, 0)
                per_rack[rack] = index + 1
                new[(rack, index)] = self.add_node(rack, boot_s)
        waiting: set[int] = set()
        for a in plan.assignments:
            if a.node is not None:
                node = self.nodes[a.node]
            elif a.new_node is not None:
                node = new[(self.rack_of[a.new_node.domain[RACK_LABEL]], a.new_node.index)]
            else:
                raise RuntimeError(f"{plan.request}: assignment without a node")
            self.allocate(run, node, a.pods * run.pod_gpus)
            if not node.ready and node.id not in waiting:
                waiting.add(node.id)
                node.waiters.append(run)
        run.bound = run.pods
        if waiting:
            run.status = PLACED
            run.nodes_waiting = len(waiting)
        else:
            self.start(run)


STRATEGIES = (
    "muster",
    "muster-relax",
    "muster-retry",
    "muster-shipped",
    "pod-by-pod",
    "best-effort-atomic",
    "gang-no-topology",
)


def make(name: str, trace: Trace, config: SimConfig, planner: Planner | None = None) -> Simulation:
    """The simulation of strategy ``name`` (one of :data:`STRATEGIES`)."""
    if name == "muster":
        return GangFit(trace, config, topology=True, planner=planner)
    if name == "muster-relax":
        return GangFit(trace, config, topology=True, relax=True, planner=planner)
    if name == "muster-retry":
        return GangFit(trace, config, topology=True, retry=True, planner=planner)
    if name == "muster-shipped":
        return GangFit(trace, config, topology=True, retry=True, wake=True, planner=planner)
    if name == "gang-no-topology":
        return GangFit(trace, config, topology=False, planner=planner)
    if name == "pod-by-pod":
        return PodByPod(trace, config)
    if name == "best-effort-atomic":
        return BestEffortAtomic(trace, config)
    raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
