"""The working copy a gang is planned on: free capacity and pool headroom, forkable.

Pod sets of one gang compete for the same nodes and the same pool headroom, so each pod set
is placed on a :class:`Workspace` that already carries the usage of the pod sets before it.
A gang is planned on a fork; if any pod set does not fit the fork is dropped, so a gang
lands whole or not at all (check, then commit). New nodes a pod set adds become *slots*:
leaves like existing nodes, whose leftover capacity later pod sets may use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from controller.fit.topology import Levels
from controller.fit.types import NewNodeSlot, NodeState, PoolDomain, PoolState, Resources, Taint

NEW_NODE_PREFIX = "~new"
"""Sort key prefix of new-node slots: after every real node name, so existing nodes win ties."""


@dataclass(frozen=True, slots=True)
class Leaf:
    """An existing node or a new-node slot: the unit pods are assigned to."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    path: tuple[str, ...]
    node: str | None = None
    slot: NewNodeSlot | None = None


@dataclass(frozen=True, slots=True)
class PoolRef:
    """One (pool, domain) a pool can add nodes into, with the labels a new node there has."""

    pool_index: int
    domain_index: int
    pool: PoolState
    domain: PoolDomain
    labels: Mapping[str, str]
    path: tuple[str, ...]

    @property
    def sort_name(self) -> str:
        return f"{self.pool.name}/{self.domain_index:06d}"


class Workspace:
    """Mutable planning state; :meth:`fork` gives an independent copy to try a gang on."""

    def __init__(self, nodes: tuple[NodeState, ...], pools: tuple[PoolState, ...], levels: Levels):
        self.levels = levels
        self.pools = pools
        ordered = sorted((n for n in nodes if n.schedulable), key=lambda n: n.name)
        self.nodes: list[Leaf] = [
            Leaf(n.name, n.labels, n.taints, levels.path(n.labels), node=n.name) for n in ordered
        ]
        self._base_free: dict[str, Resources] = {n.name: n.free for n in ordered}
        self._free: dict[str, dict[str, int]] = {}
        self.slots: list[Leaf] = []
        self.pool_used: dict[int, int] = {}
        self.domain_used: dict[tuple[int, int], int] = {}
        self.refs: list[PoolRef] = []
        for pi, pool in enumerate(pools):
            for di, dom in enumerate(pool.domains):
                labels = {**pool.labels, **dom.labels}
                self.refs.append(PoolRef(pi, di, pool, dom, labels, levels.path(labels)))

    def fork(self) -> Workspace:
        other = Workspace.__new__(Workspace)
        other.levels = self.levels
        other.pools = self.pools
        other.nodes = self.nodes
        other._base_free = self._base_free
        other._free = {k: dict(v) for k, v in self._free.items()}
        other.slots = list(self.slots)
        other.pool_used = dict(self.pool_used)
        other.domain_used = dict(self.domain_used)
        other.refs = self.refs
        return other

    def leaves(self) -> list[Leaf]:
        return self.nodes + self.slots if self.slots else self.nodes

    def free(self, leaf: Leaf) -> Resources:
        got = self._free.get(leaf.name)
        return got if got is not None else self._base_free[leaf.name]

    def consume(self, leaf: Leaf, requests: Resources, pods: int) -> None:
        free = dict(self.free(leaf))
        for res, amount in requests.items():
            if amount > 0:
                free[res] = free.get(res, 0) - amount * pods
        self._free[leaf.name] = free

    def headroom(self, ref: PoolRef) -> int:
        """New nodes this (pool, domain) may still add, honouring the pool-wide limit."""
        dom_left = ref.domain.max_new_nodes - self.domain_used.get(
            (ref.pool_index, ref.domain_index), 0
        )
        pool_left = ref.pool.max_new_nodes - self.pool_used.get(ref.pool_index, 0)
        return max(0, min(dom_left, pool_left))

    def pool_headroom(self, pool_index: int) -> int:
        return max(0, self.pools[pool_index].max_new_nodes - self.pool_used.get(pool_index, 0))

    def add_nodes(self, ref: PoolRef, count: int) -> list[Leaf]:
        """Commit ``count`` new nodes of ``ref``; they become slots with empty capacity."""
        key = (ref.pool_index, ref.domain_index)
        start = self.domain_used.get(key, 0)
        self.domain_used[key] = start + count
        self.pool_used[ref.pool_index] = self.pool_used.get(ref.pool_index, 0) + count
        added: list[Leaf] = []
        for index in range(start, start + count):
            name = f"{NEW_NODE_PREFIX}/{ref.sort_name}/{index:06d}"
            slot = NewNodeSlot(pool=ref.pool.name, domain=dict(ref.domain.labels), index=index)
            leaf = Leaf(name, ref.labels, ref.pool.taints, ref.path, slot=slot)
            self._base_free[name] = ref.pool.allocatable
            added.append(leaf)
        # _base_free is shared between forks; slot names are unique per (pool, domain, index)
        # and a slot's base is always the template's allocatable, so sharing is harmless.
        self.slots.extend(added)
        return added
