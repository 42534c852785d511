"""The working copy a gang is planned on: node equivalence classes and pool headroom.

Nodes that agree on everything the gang can tell apart (free amounts of the resources it
requests, the label values its selectors read, taints, topology path) are interchangeable,
so the workspace keeps *classes* of nodes with their member names; a 10,000-node cluster
collapses to about one class per rack and occupancy pattern. Pods taken from a node move it
to the class of its new free vector.

Pod sets of one gang compete for the same nodes and pool headroom, so each is placed on a
workspace that already carries the usage of the pod sets before it. A gang is planned on a
:meth:`Workspace.fork`; if a pod set does not fit the fork is dropped, so the gang lands
whole or not at all (check, then commit). New nodes become slot classes whose leftover
capacity later pod sets may use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any, NamedTuple

from controller.fit.shapes import label_keys, uses_node_name
from controller.fit.topology import Levels
from controller.fit.types import (
    NewNodeSlot,
    NodeState,
    PodShape,
    PoolDomain,
    PoolState,
    Resources,
    Taint,
)

NEW_NODE_PREFIX = "~new"
"""Name prefix of new-node slots: sorts after every real node name, so existing nodes are
taken first among equals."""

ClassKey = tuple[object, ...]


def _name(node: NodeState) -> str:
    return node.name


def _getter(keys: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A C-level getter returning a tuple of the values at ``keys`` (KeyError if missing)."""
    if not keys:
        return lambda _: ()
    if len(keys) == 1:
        one = keys[0]
        return lambda m: (m[one],)
    return itemgetter(*keys)


def _trimmed_path(labels: Mapping[str, str], levels: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for level in levels:
        value = labels.get(level)
        if value is None:
            break
        out.append(value)
    return tuple(out)




class NodeClass(NamedTuple):
    """Interchangeable nodes (or slots) for this gang; ``members`` sorted by name.

    A NamedTuple rather than a dataclass: a large cluster has thousands of classes and
    tuples are the cheapest immutable records to build.
    """

    key: ClassKey
    free: Mapping[str, int]
    """Free amounts of the gang's requested resources (identical for every member)."""
    labels: Mapping[str, str]
    """A member's labels: every member has the same values for the keys that matter."""
    taints: tuple[Taint, ...]
    path: tuple[str, ...]
    members: tuple[str, ...]
    node_name: str | None
    """The single member's name when the gang matches on ``metadata.name``."""

    @property
    def first(self) -> str:
        return self.members[0]


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


def _at_maximum(pool: PoolState) -> PoolState:
    """The pool as if nothing were booked: bookings end; a domain's total limit bounds it.

    Errs on the generous side (a domain's pool nodes that exist are counted both as nodes
    and within ``max_nodes``): NeverFits is permanent, so it must never be claimed wrongly.
    """
    domains = tuple(
        replace(d, max_new_nodes=max(d.max_new_nodes + d.booked_nodes, d.max_nodes or 0))
        for d in pool.domains
    )
    return replace(pool, domains=domains, max_new_nodes=pool.max_new_nodes + pool.booked_nodes)


class _NodeIndex:
    """Node name -> labels, built on first use (only assigned nodes are ever looked up)."""

    def __init__(self, nodes: Sequence[NodeState]) -> None:
        self._nodes = nodes
        self._labels: dict[str, Mapping[str, str]] | None = None

    def labels(self, name: str) -> Mapping[str, str]:
        if self._labels is None:
            self._labels = {n.name: n.labels for n in self._nodes}
        return self._labels[name]


class Workspace:
    """Mutable planning state; :meth:`fork` gives an independent copy to try a gang on."""

    def __init__(
        self,
        nodes: Sequence[NodeState],
        pools: Sequence[PoolState],
        levels: Levels,
        shapes: Sequence[PodShape],
        *,
        empty: bool = False,
    ) -> None:
        """``empty``: every node as if nothing ran on it and it were schedulable (the
        best the cluster could ever offer, for the NeverFits test)."""
        self.levels = levels
        self.pools = tuple(_at_maximum(p) for p in pools) if empty else tuple(pools)
        resources: set[str] = set()
        keys: set[str] = set()
        for shape in shapes:
            resources.update(r for r, v in shape.requests.items() if v > 0)
            keys.update(label_keys(shape))
        self.resources = tuple(sorted(resources))
        self.label_keys = tuple(sorted(keys))
        self.by_name = any(uses_node_name(s) for s in shapes)
        # Resources every pod set requests, with the smallest such request: a node with less
        # free than that of any of them cannot take a single pod of the gang.
        self._floor = tuple(
            (i, min(s.requests[r] for s in shapes))
            for i, r in enumerate(self.resources)
            if shapes and all(s.requests.get(r, 0) > 0 for s in shapes)
        )
        self._index = _NodeIndex(nodes)
        self.slots: dict[str, NewNodeSlot] = {}
        self.slot_labels: dict[str, Mapping[str, str]] = {}
        self.classes: dict[ClassKey, NodeClass] = {}
        self.pool_used: dict[int, int] = {}
        self.domain_used: dict[tuple[int, int], int] = {}
        self.slot_count: dict[tuple[int, tuple[tuple[str, str], ...]], int] = {}
        self._taint_ids: dict[int, int] = {}
        self._taint_tokens: dict[tuple[Taint, ...], int] = {}
        self._taint_keep: list[tuple[Taint, ...]] = []
        self._build(nodes, empty)
        self.refs: list[PoolRef] = []
        for pi, pool in enumerate(self.pools):
            for di, dom in enumerate(pool.domains):
                labels = {**pool.labels, **dom.labels}
                self.refs.append(PoolRef(pi, di, pool, dom, labels, levels.path(labels)))

    def taint_token(self, taints: tuple[Taint, ...]) -> int:
        """A small int equal for equal taint tuples; hashes a tuple's content only the first
        time that tuple object is seen (the snapshot builder shares equal tuples)."""
        token = self._taint_ids.get(id(taints))
        if token is None:
            token = self._taint_tokens.setdefault(taints, len(self._taint_tokens))
            self._taint_ids[id(taints)] = token
            self._taint_keep.append(taints)  # keeps the id valid while the token is cached
        return token

    def _build(self, nodes: Sequence[NodeState], empty: bool) -> None:
        # The hot loop of a plan over a large cluster: keys from C-level itemgetters (a node
        # missing a key takes the slow path), taints as tokens, member names sorted once.
        res = self.resources
        free_of = _getter(res)
        sel_of = _getter(self.label_keys)
        path_of = _getter(self.levels.domain)
        dlevels = self.levels.domain
        by_name = self.by_name
        taint_ids = self._taint_ids
        floor = self._floor
        groups: dict[
            tuple[tuple[Any, ...], tuple[Any, ...], int, tuple[str, ...], str | None],
            tuple[NodeState, list[str]],
        ] = {}
        for node in nodes:
            if not (node.schedulable or empty):
                continue
            free = node.allocatable if empty else node.free
            labels = node.labels
            try:
                fkey = free_of(free)
            except KeyError:
                fkey = tuple([free.get(r, 0) for r in res])
            useless = False
            for i, least in floor:
                if fkey[i] < least:
                    useless = True
                    break
            if useless:
                continue
            try:
                lkey = sel_of(labels)
            except KeyError:
                lkey = tuple([labels.get(k) for k in self.label_keys])
            try:
                path = path_of(labels)
            except KeyError:
                path = _trimmed_path(labels, dlevels)
            token = taint_ids.get(id(node.taints))
            if token is None:
                token = self.taint_token(node.taints)
            key = (fkey, lkey, token, path, node.name if by_name else None)
            group = groups.get(key)
            if group is None:
                groups[key] = (node, [node.name])
            else:
                group[1].append(node.name)
        for gkey, (node, names) in groups.items():
            names.sort()
            self.classes[gkey] = NodeClass(
                gkey,
                dict(zip(res, gkey[0], strict=True)),
                node.labels,
                node.taints,
                gkey[3],
                tuple(names),
                node.name if by_name else None,
            )

    def fork(self) -> Workspace:
        other = Workspace.__new__(Workspace)
        other.levels = self.levels
        other.pools = self.pools
        other.resources = self.resources
        other.label_keys = self.label_keys
        other.by_name = self.by_name
        other._index = self._index
        other.refs = self.refs
        other.slots = dict(self.slots)
        other.slot_labels = dict(self.slot_labels)
        other.classes = dict(self.classes)
        other.pool_used = dict(self.pool_used)
        other.domain_used = dict(self.domain_used)
        other.slot_count = dict(self.slot_count)
        # Taint tokens are a cache of content -> small int, valid for every fork alike.
        other._taint_ids = self._taint_ids
        other._taint_tokens = self._taint_tokens
        other._taint_keep = self._taint_keep
        return other

    def labels(self, name: str) -> Mapping[str, str]:
        """Labels of a node or slot (a slot carries its pool template's and domain's)."""
        got = self.slot_labels.get(name)
        return got if got is not None else self._index.labels(name)

    def _place(self, cls: NodeClass, names: Sequence[str], free: Mapping[str, int]) -> None:
        key: ClassKey = (tuple(free[r] for r in self.resources), *cls.key[1:])
        have = self.classes.get(key)
        members = tuple(sorted((*have.members, *names))) if have else tuple(names)
        self.classes[key] = NodeClass(
            key, free, cls.labels, cls.taints, cls.path, members, cls.node_name
        )

    def take(self, key: ClassKey, nodes: int, pods_each: int, requests: Resources) -> list[str]:
        """Put ``pods_each`` pods on each of the first ``nodes`` members of class ``key``."""
        cls = self.classes[key]
        names = list(cls.members[:nodes])
        rest = cls.members[nodes:]
        if rest:
            self.classes[key] = NodeClass(
                key, cls.free, cls.labels, cls.taints, cls.path, rest, cls.node_name
            )
        else:
            del self.classes[key]
        free = {r: v - requests.get(r, 0) * pods_each for r, v in cls.free.items()}
        self._place(cls, names, free)
        return names

    def headroom(self, ref: PoolRef) -> int:
        """New nodes this (pool, domain) may still add, honouring the pool-wide limit."""
        dom_left = ref.domain.max_new_nodes - self.domain_used.get(
            (ref.pool_index, ref.domain_index), 0
        )
        return max(0, min(dom_left, self.pool_headroom(ref.pool_index)))

    def pool_headroom(self, pool_index: int) -> int:
        return max(0, self.pools[pool_index].max_new_nodes - self.pool_used.get(pool_index, 0))

    def add_nodes(
        self, ref: PoolRef, pods: Sequence[int], requests: Resources
    ) -> list[str]:
        """Commit one new node of ``ref`` per entry of ``pods`` (pods placed on it)."""
        key = (ref.pool_index, ref.domain_index)
        self.domain_used[key] = self.domain_used.get(key, 0) + len(pods)
        # Slots are numbered per (pool, domain labels): a pool listing the same labels
        # twice must still give every new node a distinct identity.
        ident = (ref.pool_index, tuple(sorted(ref.domain.labels.items())))
        start = self.slot_count.get(ident, 0)
        self.slot_count[ident] = start + len(pods)
        self.pool_used[ref.pool_index] = self.pool_used.get(ref.pool_index, 0) + len(pods)
        template = NodeClass(
            (None, tuple(ref.labels.get(k) for k in self.label_keys),
             self.taint_token(ref.pool.taints), ref.path, None),
            {}, ref.labels, ref.pool.taints, ref.path, (), None,
        )
        names: list[str] = []
        for offset, count in enumerate(pods):
            index = start + offset
            name = f"{NEW_NODE_PREFIX}/{ref.sort_name}/{index:06d}"
            self.slots[name] = NewNodeSlot(ref.pool.name, dict(ref.domain.labels), index)
            self.slot_labels[name] = ref.labels
            free = {
                r: ref.pool.allocatable.get(r, 0) - requests.get(r, 0) * count
                for r in self.resources
            }
            self._place(template, [name], free)
            names.append(name)
        return names
