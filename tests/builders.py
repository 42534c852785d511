"""Fluent builders for fit-engine inputs, so test tables read like the cluster they describe.

    cluster = Cluster().rack("b0", "r0", hosts=4, gpus=8).rack("b0", "r1", hosts=2, gpus=8)
    snap = cluster.pool(PoolB("p5").domain("b0", "r1", 4).price(3)).snapshot()
    gang = Gang("g").pod_set("w", 4, gpu=8, required="rack").build()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from controller.fit import (
    GangRequest,
    NodeState,
    PodSetRequest,
    PodShape,
    PoolDomain,
    PoolState,
    SelectorRequirement,
    SelectorTerm,
    Snapshot,
    Taint,
    Toleration,
    TopologyMode,
    TopologyRequest,
)

BLOCK = "topology.muster.dev/block"
RACK = "topology.muster.dev/rack"
HOST = "kubernetes.io/hostname"
LEVELS = (BLOCK, RACK, HOST)
GPU = "nvidia.com/gpu"
SHORT = {"block": BLOCK, "rack": RACK, "host": HOST, "hostname": HOST}


def level(name: str | None) -> str | None:
    return SHORT.get(name, name) if name is not None else None


def node(
    name: str,
    *,
    block: str | None = None,
    rack: str | None = None,
    gpus: int = 8,
    free_gpus: int | None = None,
    cpu: int = 64_000,
    free_cpu: int | None = None,
    labels: Mapping[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    schedulable: bool = True,
    pool: str | None = None,
) -> NodeState:
    all_labels = {HOST: name, **(labels or {})}
    if block is not None:
        all_labels[BLOCK] = block
    if rack is not None:
        all_labels[RACK] = rack
    allocatable = {GPU: gpus, "cpu": cpu}
    free = {GPU: gpus if free_gpus is None else free_gpus, "cpu": cpu if free_cpu is None
            else free_cpu}
    return NodeState(name, all_labels, taints, allocatable, free, schedulable, pool)


class PoolB:
    """A CapacityPool as the engine sees it."""

    def __init__(self, name: str, *, gpus: int = 8, cpu: int = 64_000) -> None:
        self._state = PoolState(name, {}, (), {GPU: gpus, "cpu": cpu}, (), 1_000, 1.0)

    def domain(
        self, block: str | None, rack: str | None = None, max_new: int = 4,
        max_nodes: int | None = None,
    ) -> PoolB:
        labels = {}
        if block is not None:
            labels[BLOCK] = block
        if rack is not None:
            labels[RACK] = rack
        dom = PoolDomain(labels, max_new, max_nodes=max_nodes)
        self._state = replace(self._state, domains=(*self._state.domains, dom))
        return self

    def anywhere(self, max_new: int = 4) -> PoolB:
        dom = PoolDomain({}, max_new)
        self._state = replace(self._state, domains=(*self._state.domains, dom))
        return self

    def price(self, per_hour: float) -> PoolB:
        self._state = replace(self._state, price_per_node_hour=per_hour)
        return self

    def reserved(self) -> PoolB:
        """New nodes come out of a reservation already paid for."""
        self._state = replace(self._state, reserved=True)
        return self

    def max_new(self, n: int) -> PoolB:
        self._state = replace(self._state, max_new_nodes=n)
        return self

    def labels(self, **labels: str) -> PoolB:
        self._state = replace(self._state, labels=dict(labels))
        return self

    def taint(self, key: str, value: str = "", effect: str = "NoSchedule") -> PoolB:
        self._state = replace(self._state, taints=(*self._state.taints, Taint(key, value,
                                                                                effect)))
        return self

    def build(self) -> PoolState:
        return self._state


class Cluster:
    def __init__(self) -> None:
        self.nodes: list[NodeState] = []
        self.pools: list[PoolState] = []

    def rack(
        self, block: str, rack: str, *, hosts: int, gpus: int = 8, free: list[int] | None = None,
        taints: tuple[Taint, ...] = (),
    ) -> Cluster:
        """``hosts`` nodes named ``<rack>-h<i>``; ``free`` gives each one's free GPUs."""
        for h in range(hosts):
            free_gpus = free[h] if free is not None else None
            self.nodes.append(
                node(f"{rack}-h{h}", block=block, rack=rack, gpus=gpus, free_gpus=free_gpus,
                     taints=taints)
            )
        return self

    def add(self, *nodes: NodeState) -> Cluster:
        self.nodes.extend(nodes)
        return self

    def pool(self, pool: PoolB | PoolState) -> Cluster:
        self.pools.append(pool.build() if isinstance(pool, PoolB) else pool)
        return self

    def snapshot(self, levels: tuple[str, ...] = LEVELS) -> Snapshot:
        return Snapshot(tuple(self.nodes), tuple(self.pools), levels)


def shape(
    gpu: int = 0,
    cpu: int = 0,
    *,
    selector: Mapping[str, str] | None = None,
    terms: tuple[SelectorTerm, ...] = (),
    tolerations: tuple[Toleration, ...] = (),
) -> PodShape:
    requests = {}
    if gpu:
        requests[GPU] = gpu
    if cpu:
        requests["cpu"] = cpu
    return PodShape(requests, dict(selector or {}), terms, tolerations)


def term(*reqs: tuple[str, str, tuple[str, ...]]) -> SelectorTerm:
    return SelectorTerm(tuple(SelectorRequirement(k, op, vals) for k, op, vals in reqs))


class Gang:
    def __init__(self, name: str = "ns/gang") -> None:
        self.name = name
        self.sets: list[PodSetRequest] = []

    def pod_set(
        self,
        name: str,
        count: int,
        *,
        gpu: int = 0,
        cpu: int = 0,
        required: str | None = None,
        preferred: str | None = None,
        pod_shape: PodShape | None = None,
        slices: tuple[str, int] | None = None,
    ) -> Gang:
        """``slices``: (level, size), Kueue's podset-slice-required-topology and -size."""
        if required is not None:
            topo = TopologyRequest(TopologyMode.REQUIRED, level(required))
        elif preferred is not None:
            topo = TopologyRequest(TopologyMode.PREFERRED, level(preferred))
        else:
            topo = TopologyRequest()
        if slices is not None:
            topo = replace(topo, slice_level=level(slices[0]), slice_size=slices[1])
        self.sets.append(PodSetRequest(name, count, pod_shape or shape(gpu, cpu), topo))
        return self

    def build(self) -> GangRequest:
        return GangRequest(self.name, tuple(self.sets))
