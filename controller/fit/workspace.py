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
from typing import Any

from controller.fit.devices import ClaimFitter, PodPlan, emptied
from controller.fit.dra_types import NodeDevices, PodDevices
from controller.fit.shapes import ShapeCounter, label_keys, uses_node_name
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




@dataclass(frozen=True, slots=True)
class NodeClass:
    """Interchangeable nodes (or slots) for this gang; ``members`` sorted by name."""

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
    devices: NodeDevices | None = None
    """A member's DRA devices (with what is allocated), when the gang claims devices."""

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
    """Node name -> node, built on first use (only assigned nodes are ever looked up)."""

    def __init__(self, nodes: Sequence[NodeState]) -> None:
        self._nodes = nodes
        self._by_name: dict[str, NodeState] | None = None

    def _node(self, name: str) -> NodeState:
        if self._by_name is None:
            self._by_name = {n.name: n for n in self._nodes}
        return self._by_name[name]

    def labels(self, name: str) -> Mapping[str, str]:
        return self._node(name).labels

    def devices(self, name: str) -> NodeDevices | None:
        return self._node(name).devices


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
        claims = [c for shape in shapes for c in shape.claims]
        self.device_keys = ClaimFitter(claims) if claims else None
        """Device equivalence (None: the gang claims no devices, devices are ignored)."""
        self.allocations: dict[tuple[str, str], list[PodDevices]] = {}
        """(node or slot name, pod set) -> device allocations of the pods placed there."""
        self._index = _NodeIndex(nodes)
        self.slots: dict[str, NewNodeSlot] = {}
        self.slot_labels: dict[str, Mapping[str, str]] = {}
        self.classes: dict[ClassKey, NodeClass] = {}
        self.pool_used: dict[int, int] = {}
        self.domain_used: dict[tuple[int, int], int] = {}
        self.slot_count: dict[tuple[int, tuple[tuple[str, str], ...]], int] = {}
        self._build(nodes, empty)
        self._pool_index = {p.name: i for i, p in enumerate(self.pools)}
        self.refs: list[PoolRef] = []
        for pi, pool in enumerate(self.pools):
            for di, dom in enumerate(pool.domains):
                labels = {**pool.labels, **dom.labels}
                self.refs.append(PoolRef(pi, di, pool, dom, labels, levels.path(labels)))

    def _build(self, nodes: Sequence[NodeState], empty: bool) -> None:
        # The hot loop of a plan over a large cluster. Keys are built with C-level
        # itemgetters (a node missing a key takes the slow path), and taints are keyed by
        # the identity of the node's taint tuple, merged by content afterwards: the
        # snapshot builder shares equal taint tuples, so this avoids hashing dataclasses.
        res = self.resources
        free_of = _getter(res)
        sel_of = _getter(self.label_keys)
        path_of = _getter(self.levels.domain)
        dlevels = self.levels.domain
        by_name = self.by_name
        dev_key = self._fast_device_key() if self.device_keys else None
        shape_keys: dict[int, int] = {}
        groups: dict[
            tuple[tuple[Any, ...], tuple[Any, ...], int, tuple[Any, ...], str | None, object],
            list[NodeState],
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
            try:
                lkey = sel_of(labels)
            except KeyError:
                lkey = tuple([labels.get(k) for k in self.label_keys])
            try:
                path = path_of(labels)
            except KeyError:
                path = _trimmed_path(labels, dlevels)
            dk: object = None
            if dev_key is not None:
                devs = node.devices
                if devs is not None:
                    # Inline fast path: shapes are interned, most nodes hit this cache.
                    dk = shape_keys.get(id(devs.shape))
                    if dk is None:
                        dk = dev_key(devs)
                        if isinstance(dk, int):
                            shape_keys[id(devs.shape)] = dk
            key = (fkey, lkey, id(node.taints), path, node.name if by_name else None, dk)
            members = groups.get(key)
            if members is None:
                groups[key] = [node]
            else:
                members.append(node)
        self._merge(groups, empty)

    def _merge(
        self,
        groups: Mapping[tuple[Any, ...], list[NodeState]],
        empty: bool,
    ) -> None:
        """Groups keyed by object identities -> classes keyed by content."""
        res = self.resources
        by_name = self.by_name
        merged: dict[ClassKey, tuple[tuple[Any, ...], tuple[str, ...], list[NodeState],
                                     NodeDevices | None]] = {}
        for (fkey, lkey, _, path, name, _d), members in groups.items():
            devices = members[0].devices if self.device_keys else None
            if empty and devices is not None:
                devices = emptied(devices)  # nothing allocated, like nothing running
            ckey: ClassKey = (fkey, lkey, members[0].taints, path, name,
                              self.device_keys.key(devices) if self.device_keys else None)
            have = merged.get(ckey)
            if have is None:
                merged[ckey] = (fkey, path, members, devices)
            else:
                have[2].extend(members)
        for ckey, (fkey, path, members, devices) in merged.items():
            members.sort(key=_name)
            node = members[0]
            self.classes[ckey] = NodeClass(
                ckey,
                dict(zip(res, fkey, strict=True)),
                node.labels,
                node.taints,
                path,
                tuple(m.name for m in members),
                node.name if by_name else None,
                devices,
            )

    def _fast_device_key(self) -> Callable[[NodeDevices | None], object]:
        """Grouping key of a node's devices: the identity of its shared shape (the snapshot
        builder interns shapes), plus the identity attributes the gang reads, if any."""
        fitter = self.device_keys
        assert fitter is not None
        reads: dict[int, bool] = {}

        def key(devices: NodeDevices | None) -> object:
            if devices is None:
                return None
            shape = devices.shape
            inv = id(shape.inventory)
            needs = reads.get(inv)
            if needs is None:
                needs = fitter.key(devices)[2] is not None
                reads[inv] = needs
            return fitter.key(devices) if needs else id(shape)

        return key

    def fork(self) -> Workspace:
        other = Workspace.__new__(Workspace)
        other.levels = self.levels
        other.pools = self.pools
        other.resources = self.resources
        other.label_keys = self.label_keys
        other.by_name = self.by_name
        other._index = self._index
        other.device_keys = self.device_keys
        other.allocations = {k: list(v) for k, v in self.allocations.items()}
        other.refs = self.refs
        other._pool_index = self._pool_index
        other.slots = dict(self.slots)
        other.slot_labels = dict(self.slot_labels)
        other.classes = dict(self.classes)
        other.pool_used = dict(self.pool_used)
        other.domain_used = dict(self.domain_used)
        other.slot_count = dict(self.slot_count)
        return other

    def labels(self, name: str) -> Mapping[str, str]:
        """Labels of a node or slot (a slot carries its pool template's and domain's)."""
        got = self.slot_labels.get(name)
        return got if got is not None else self._index.labels(name)

    def _place(
        self,
        cls: NodeClass,
        names: Sequence[str],
        free: Mapping[str, int],
        devices: NodeDevices | None = None,
    ) -> None:
        dkey = self.device_keys.key(devices) if self.device_keys else None
        key: ClassKey = (tuple(free[r] for r in self.resources), *cls.key[1:-1], dkey)
        have = self.classes.get(key)
        members = tuple(sorted((*have.members, *names))) if have else tuple(names)
        self.classes[key] = NodeClass(
            key, free, cls.labels, cls.taints, cls.path, members, cls.node_name, devices
        )

    def device_of(self, name: str) -> NodeDevices | None:
        """The devices a node (or slot) had before this plan: pool names and identity."""
        slot = self.slots.get(name)
        if slot is not None:
            return self.pools[self._pool_index[slot.pool]].devices
        return self._index.devices(name)

    def take(
        self,
        key: ClassKey,
        nodes: int,
        pods_each: int,
        requests: Resources,
        counter: ShapeCounter | None = None,
    ) -> list[str]:
        """Put ``pods_each`` pods on each of the first ``nodes`` members of class ``key``
        (``counter``: the pod set's shape, to allocate its device claims)."""
        cls = self.classes[key]
        names = list(cls.members[:nodes])
        rest = cls.members[nodes:]
        if rest:
            self.classes[key] = NodeClass(
                key, cls.free, cls.labels, cls.taints, cls.path, rest, cls.node_name,
                cls.devices,
            )
        else:
            del self.classes[key]
        free = {r: v - requests.get(r, 0) * pods_each for r, v in cls.free.items()}
        devices = cls.devices
        if counter is not None and counter.fitter is not None:
            devices, plans = counter.after(cls.devices, pods_each)
            self._record(names, counter, plans)
        self._place(cls, names, free, devices)
        return names

    def _record(
        self, names: Sequence[str], counter: ShapeCounter, plans: Sequence[PodPlan]
    ) -> None:
        for name in names:
            own = self.device_of(name)
            if own is None:
                continue
            self.allocations.setdefault((name, counter.owner), []).extend(
                counter.resolve(own, plans)
            )

    def headroom(self, ref: PoolRef) -> int:
        """New nodes this (pool, domain) may still add, honouring the pool-wide limit."""
        dom_left = ref.domain.max_new_nodes - self.domain_used.get(
            (ref.pool_index, ref.domain_index), 0
        )
        return max(0, min(dom_left, self.pool_headroom(ref.pool_index)))

    def pool_headroom(self, pool_index: int) -> int:
        return max(0, self.pools[pool_index].max_new_nodes - self.pool_used.get(pool_index, 0))

    def add_nodes(
        self,
        ref: PoolRef,
        pods: Sequence[int],
        requests: Resources,
        counter: ShapeCounter | None = None,
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
            (None, tuple(ref.labels.get(k) for k in self.label_keys), ref.pool.taints,
             ref.path, None, None),
            {}, ref.labels, ref.pool.taints, ref.path, (), None, ref.pool.devices,
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
            devices = ref.pool.devices if self.device_keys else None
            if counter is not None and counter.fitter is not None and count > 0:
                devices, plans = counter.after(ref.pool.devices, count)
                self._record([name], counter, plans)
            self._place(template, [name], free, devices)
            names.append(name)
        return names
