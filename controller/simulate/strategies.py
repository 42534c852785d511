"""The three provisioning strategies the simulator compares on the same jobs and seed.

* :class:`PodByPod` mimics cluster-autoscaler plus kube-scheduler and deliberately does not
  use the fit engine: every ``scan_interval_s`` it asks for as many nodes as the pending pods
  need (minus nodes already booting), non-atomically, wherever the cloud has stock; pods bind
  one by one to ready nodes as they land; a gang runs only once all its pods are bound.
* :class:`GangFit` asks the real fit engine (:func:`controller.fit.plan`) where the whole
  job fits on the current nodes plus the stock the cloud has, then acquires every new node
  it named or none. ``muster`` asks for one rack (``required`` at the rack level) and, when no
  rack can hold the job, one block; ``gang-no-topology`` asks without any topology.

Both queue in arrival order and backfill (Kueue's BestEffortFIFO): a job that does not fit
does not block a later job that does. Pods go to the most-allocated node that holds them
(bin-packing, the usual GPU cluster scoring) under every strategy.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

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
from controller.simulate.engine import (
    PENDING,
    PLACED,
    SCAN,
    JobRun,
    SimConfig,
    SimNode,
    Simulation,
)
from controller.simulate.trace import Trace
from controller.topology_defaults import DEFAULT_LEVELS

GPU = "nvidia.com/gpu"
BLOCK_LABEL, RACK_LABEL = DEFAULT_LEVELS[0], DEFAULT_LEVELS[1]
LEVELS = (BLOCK_LABEL, RACK_LABEL)
POOL = "gpu-nodes"

Planner = Callable[[GangRequest, Snapshot, Mode], Plan | NoFit]


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
        # Pending pods per GPU size: heap of ((submit, pod index, seq), run). Pods of jobs
        # submitted in the same second interleave, as concurrent job controllers create them.
        self.pending: dict[int, list[tuple[tuple[float, int, int], JobRun]]] = {}
        self.pending_pods: dict[int, int] = {}
        self.scan_scheduled = False

    def on_arrival(self, run: JobRun) -> None:
        size = run.pod_gpus
        queue = self.pending.setdefault(size, [])
        submit, seq = run.job.submit, run.job.seq
        for k in range(run.pods):
            heapq.heappush(queue, ((submit, k, seq), run))
        self.pending_pods[size] = self.pending_pods.get(size, 0) + run.pods
        self.bind()
        if self.pending_pods[size]:
            self.request_scan()

    def on_capacity_freed(self) -> None:
        self.bind()

    def on_node_ready(self, node: SimNode) -> None:
        self.bind()

    def on_room(self) -> None:
        if any(self.pending_pods.values()):
            self.request_scan()

    def on_cancel(self, run: JobRun) -> None:
        self.pending_pods[run.pod_gpus] -= run.pods - run.bound

    def request_scan(self) -> None:
        if self.scan_scheduled:
            return
        self.scan_scheduled = True
        interval = self.config.scan_interval_s
        self.push((self.now // interval + 1) * interval, SCAN, None)

    def on_scan(self, _: Any) -> None:
        self.scan_scheduled = False
        needed = bins_needed(self.pending_pods, self.gpus_per_node) - self.booting_nodes
        if needed <= 0:
            return
        for rack, boot_s in self.cloud.acquire_any(needed):
            self.add_node(rack, boot_s)

    def bind(self) -> None:
        """kube-scheduler: bind pending pods, oldest first, to the fullest ready node that
        holds them. A size that finds no node stops every larger size this round."""
        pending = self.pending
        free_index = self.free_index
        g = self.gpus_per_node
        blocked = g + 1
        while True:
            best_key: tuple[float, int, int] | None = None
            best_size = 0
            for size, queue in pending.items():
                if size >= blocked:
                    continue
                while queue and queue[0][1].status != PENDING:
                    heapq.heappop(queue)  # a cancelled job's pods
                if queue and (best_key is None or queue[0][0] < best_key):
                    best_key = queue[0][0]
                    best_size = size
            if best_key is None:
                return
            node = None
            for free in range(best_size, g + 1):
                bucket = free_index[free]
                if bucket:
                    node = next(iter(bucket.values()))
                    break
            if node is None:
                blocked = best_size
                continue
            _, run = heapq.heappop(pending[best_size])
            self.pending_pods[best_size] -= 1
            self.allocate(run, node, best_size)
            run.bound += 1
            if run.bound == run.pods:
                self.start(run)


class GangFit(Simulation):
    """All-or-nothing through the real fit engine; ``topology`` selects muster's rack-then-
    block request or no topology at all."""

    index_booting = True

    def __init__(
        self,
        trace: Trace,
        config: SimConfig,
        *,
        topology: bool,
        planner: Planner | None = None,
    ) -> None:
        super().__init__(trace, config)
        if planner is None:
            from controller.fit import plan

            planner = plan
        self.planner: Planner = planner
        self.topology = topology
        self.name = "muster" if topology else "gang-no-topology"
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
            self._largest = min(cc.quota_nodes, cc.racks_per_block * cc.nodes_per_rack)
        else:
            self._attempts = (TopologyRequest(),)
            self._largest = min(cc.quota_nodes, cc.racks * cc.nodes_per_rack)

    # ------------------------------------------------------------------ hooks
    def on_arrival(self, run: JobRun) -> None:
        if run.pods * -(-run.pod_gpus // self.gpus_per_node) > self._largest:
            # More nodes than the quota (or, for muster, one block) can ever hold.
            self.reject(run)
            return
        key = (run.pods, run.pod_gpus)
        queue = self.queues.get(key)
        while queue and queue[0].status != PENDING:
            queue.popleft()
        if queue:
            # Others of this shape wait already: this one cannot fit either.
            queue.append(run)
            return
        if not self.try_place(run):
            self.queues.setdefault(key, deque()).append(run)

    def on_capacity_freed(self) -> None:
        self.drain()

    def on_room(self) -> None:
        self.drain()

    def on_node_ready(self, node: SimNode) -> None:
        """Nothing to do: a booting node's free GPUs were placeable already."""

    def on_cancel(self, run: JobRun) -> None:
        """Nothing to do: a cancelled run stays in its queue and is skipped there."""

    # ------------------------------------------------------------------ queue
    def drain(self) -> None:
        """Place waiting jobs, oldest first across shapes; a shape that does not fit stops
        every shape at least as large in both pods and GPUs per pod this round."""
        queues = self.queues
        if not queues:
            return
        failed: list[tuple[int, int]] = []
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
            if self.try_place(run):
                best.popleft()
            else:
                failed.append((run.pods, run.pod_gpus))

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
    def try_place(self, run: JobRun) -> bool:
        if not self._may_fit(run):
            return False
        # One pod is always inside one rack: the block fallback could not place it either.
        attempts = self._attempts if run.pods > 1 else self._attempts[:1]
        for topology in attempts:
            request = GangRequest(
                name=f"job-{run.job.seq}",
                pod_sets=(
                    PodSetRequest("workers", run.pods, self._shape(run.pod_gpus), topology),
                ),
            )
            self.fit_calls += 1
            result = self.planner(request, self._snapshot(run.pods, run.pod_gpus), Mode.PROVISION)
            if isinstance(result, Plan):
                self._commit(run, result)
                return True
        return False

    def _shape(self, gpus: int) -> PodShape:
        shape = self._shapes.get(gpus)
        if shape is None:
            shape = self._shapes[gpus] = PodShape(requests={GPU: gpus})
        return shape

    def _snapshot(self, pods: int, gpus: int) -> Snapshot:
        """The cluster as the engine needs it for ``pods`` pods of ``gpus`` GPUs.

        Per rack only the ``pods`` fullest nodes that hold a pod are shown: each pod needs
        at most one node, so any placement within a rack the full cluster allows is still
        possible (placements are exact, not approximated), while the engine's input stays
        at a few dozen nodes instead of every node. Node views are cached per node and
        rebuilt only when its free GPUs change.
        """
        g = self.gpus_per_node
        nodes: list[NodeState] = []
        levels = range(gpus, g + 1)
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
        return Snapshot(nodes=tuple(nodes), pools=(self._pool_state(),), levels=LEVELS)

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


STRATEGIES = ("muster", "pod-by-pod", "gang-no-topology")


def make(name: str, trace: Trace, config: SimConfig, planner: Planner | None = None) -> Simulation:
    """The simulation of strategy ``name`` (one of :data:`STRATEGIES`)."""
    if name == "muster":
        return GangFit(trace, config, topology=True, planner=planner)
    if name == "gang-no-topology":
        return GangFit(trace, config, topology=False, planner=planner)
    if name == "pod-by-pod":
        return PodByPod(trace, config)
    raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
