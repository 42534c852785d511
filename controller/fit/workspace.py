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

A workspace is two parts: a :class:`WorkspaceIndex` that every fork shares (the snapshot's
nodes and pools as the gang sees them, the topology, the token caches), and a small
:class:`Usage` overlay (the node classes and what the plan so far has added or booked),
which is all :meth:`Workspace.fork` copies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, NamedTuple, TypeVar

from controller.fit.devices import ClaimFitter, PodAllocation, emptied
from controller.fit.dra_types import NodeDevices, PodDevices
from controller.fit.ports import unlisted
from controller.fit.shapes import ShapeCounter, label_keys, selector_keys, uses_node_name
from controller.fit.taints import lasting_taints, transient
from controller.fit.topology import HOSTNAME, NEW_HOSTNAME, Levels, domain_path, within
from controller.fit.types import (
    NewNodeSlot,
    NodeState,
    PodShape,
    PoolDomain,
    PoolState,
    Resources,
    Taint,
)

T = TypeVar("T")

NEW_NODE_PREFIX = "~new"
"""Name prefix of new-node slots: sorts after every real node name, so existing nodes are
taken first among equals."""


class ClassKey(NamedTuple):
    """What the gang can tell apart of a node: nodes with equal keys are one class.

    A NamedTuple: built per class (the per-node hot loop groups on plain tuples of the same
    fields) and hashed like a tuple.
    """

    free: tuple[int, ...]
    """Free amounts of the gang's resources, in :attr:`GangView.resources` order (empty for
    the template of new nodes)."""
    selected: tuple[str | None, ...]
    """Values of the label keys the gang's selectors read (:attr:`GangView.label_keys`)."""
    taint_token: int
    """:meth:`WorkspaceIndex.taint_token` of the node's taints."""
    path: tuple[str, ...]
    """Topology path (domain values from the top level down)."""
    node_name: str | None
    """The node's own name when the gang matches on ``metadata.name``, else None."""
    device_token: int | None
    """:meth:`WorkspaceIndex.device_token` of the node's devices (None without claims)."""


def _getter(keys: Sequence[str]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """A C-level getter returning a tuple of the values at ``keys`` (KeyError if missing)."""
    if not keys:
        return lambda _: ()
    if len(keys) == 1:
        one = keys[0]
        return lambda m: (m[one],)
    return itemgetter(*keys)


def _summed(a: Mapping[Any, int], b: Mapping[Any, int]) -> dict[Any, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out




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
    ordinal: int = 0
    """Position in :attr:`Catalogue.refs`."""
    sort_name: str = ""
    """``<pool>/<domain index>``: ties between equal prices break on it (kept, not formatted
    per comparison: purchases sort many refs)."""
    slot_ident: tuple[int, tuple[tuple[str, str], ...]] = field(init=False)
    """(pool index, domain labels sorted): what new-node slots are numbered by."""

    def __post_init__(self) -> None:
        if not self.sort_name:
            object.__setattr__(self, "sort_name", f"{self.pool.name}/{self.domain_index:06d}")
        object.__setattr__(self, "slot_ident",
                           (self.pool_index, tuple(sorted(self.domain.labels.items()))))


def _at_maximum(pool: PoolState) -> PoolState:
    """The pool as if nothing were booked: bookings end; a domain's total limit bounds it.

    The pool's nodes that exist in a domain are nodes of the empty cluster already, so only
    the rest of the limit is new: counting them twice let a gang larger than the domain
    limit pass for "not now" and burn every retry.
    """
    domains = tuple(
        replace(d, max_new_nodes=max(
            d.max_new_nodes + d.booked_nodes,
            0 if d.max_nodes is None else d.max_nodes - d.pool_nodes,
        ))
        for d in pool.domains
    )
    return replace(pool, domains=domains, max_new_nodes=pool.max_new_nodes + pool.booked_nodes
                   + pool.reserved_busy)


class Catalogue:
    """The pools as one planning sees them: every (pool, domain) a new node can go to, and
    the same refs ordered by price, whole and per topology domain, so that choosing new
    capacity for a pod set can stop at the first price that cannot beat what it found
    instead of sizing every pool's every domain.

    Depends on the pools and levels only, not on the gang: built once per pools tuple and
    shared by every plan and fork against it (:meth:`of` keeps the last few), which is what
    makes a plan's cost independent of the pools that cannot serve it.
    """

    __slots__ = ("_batches", "_by_domain", "_by_label", "_per_node", "_roomiest", "by_price",
                 "fresh_headroom", "pool_index", "pools", "refs", "source")

    def __init__(self, pools: Sequence[PoolState], levels: Levels, empty: bool) -> None:
        self.source = pools
        self.pools = tuple(_at_maximum(p) for p in pools) if empty else tuple(pools)
        self.pool_index = {p.name: i for i, p in enumerate(pools)}
        self.refs: list[PoolRef] = []
        for pi, pool in enumerate(self.pools):
            for di, dom in enumerate(pool.domains):
                labels = {**pool.labels, **dom.labels}
                labels.setdefault(HOSTNAME, NEW_HOSTNAME)
                self.refs.append(
                    PoolRef(pi, di, pool, dom, labels, levels.path(labels), len(self.refs))
                )
        self.by_price: list[PoolRef] = sorted(self.refs, key=_price_order)
        """Every ref, cheapest node first (ties by :attr:`PoolRef.sort_name`)."""
        self._by_domain: dict[int, dict[tuple[str, ...], list[PoolRef]]] = {}
        self._by_label: dict[str, dict[str, list[PoolRef]]] = {}
        self.fresh_headroom = {i: max(0, p.max_new_nodes) for i, p in enumerate(self.pools)}
        """Pool-wide headroom while nothing is taken (the caller copies it to change it)."""
        self._per_node: dict[tuple[object, ...], list[int]] = {}
        self._batches: dict[tuple[object, ...], Sequence[Any]] = {}
        self._roomiest: dict[tuple[object, ...], list[int]] = {}

    def fresh_batches(self, shape: PodShape, build: Callable[[], Sequence[T]]) -> Sequence[T]:
        """``build()``: what every ref can add for a pod set of ``shape`` while nothing has
        been taken from the pools, shared by every such pod set (not kept for shapes with
        device claims). The caller does not change it."""
        key = fit_key(shape)
        if key is None:
            return build()
        got = self._batches.get(key)
        if got is None:
            got = build()
            if len(self._batches) >= _SHAPES_KEPT:
                del self._batches[next(iter(self._batches))]
            self._batches[key] = got
        return got

    def per_node(self, shape: PodShape, count: Callable[[PoolRef], int]) -> list[int]:
        """Pods of ``shape`` a new node of each ref holds (aligned with :attr:`refs`), by
        ``count`` once per pool and selected label values, shared by every pod set of
        that shape planned against these pools (kept for the last few hundred shapes;
        shapes with device claims are counted afresh: their fit depends on the devices)."""
        key = fit_key(shape)
        got = self._per_node.get(key) if key is not None else None
        if got is not None:
            return got
        keys = selector_keys(shape)
        memo: dict[tuple[int, tuple[str | None, ...]], int] = {}
        got = []
        for ref in self.refs:
            mkey = (ref.pool_index, tuple([ref.labels.get(k) for k in keys]))
            c = memo.get(mkey)
            if c is None:
                c = memo[mkey] = count(ref)
            got.append(c)
        if key is not None:
            if len(self._per_node) >= _SHAPES_KEPT:
                del self._per_node[next(iter(self._per_node))]
            self._per_node[key] = got
        return got

    def roomiest(self, shape: PodShape, per_node: Sequence[int]) -> list[int]:
        """Ordinals of the refs whose new nodes hold a pod of ``shape`` (``per_node``: what
        :meth:`per_node` gave for it), most pods a node first (ties in :attr:`refs` order);
        kept per shape like :meth:`per_node`."""
        key = fit_key(shape)
        got = self._roomiest.get(key) if key is not None else None
        if got is not None:
            return got
        got = sorted((o for o, c in enumerate(per_node) if c > 0), key=lambda o: -per_node[o])
        if key is not None:
            if len(self._roomiest) >= _SHAPES_KEPT:
                del self._roomiest[next(iter(self._roomiest))]
            self._roomiest[key] = got
        return got

    def by_domain(self, depth: int) -> dict[tuple[str, ...], list[PoolRef]]:
        """The refs under each domain of domain-level index ``depth`` (keys: topology path
        prefixes), each list in :attr:`by_price` order."""
        got = self._by_domain.get(depth)
        if got is None:
            got = {}
            for ref in self.by_price:
                if within(ref.path, depth):
                    got.setdefault(ref.path[: depth + 1], []).append(ref)
            self._by_domain[depth] = got
        return got

    def by_label(self, key: str) -> dict[str, list[PoolRef]]:
        """The refs whose new nodes carry label ``key``, per value, each list in
        :attr:`by_price` order (any key, a topology level or not)."""
        got = self._by_label.get(key)
        if got is None:
            got = {}
            for ref in self.by_price:
                value = ref.labels.get(key)
                if value is not None:
                    got.setdefault(value, []).append(ref)
            self._by_label[key] = got
        return got

    @classmethod
    def of(cls, pools: Sequence[PoolState], levels: Levels, empty: bool) -> Catalogue:
        """The catalogue of ``pools``, shared while the same pools tuple is planned against
        (a planning pass, a benchmark); a list is never cached (it could change)."""
        if not isinstance(pools, tuple):
            return cls(pools, levels, empty)
        key = (id(pools), empty, levels.all)
        got = _CATALOGUES.get(key)
        if got is not None and got.source is pools:
            return got
        got = cls(pools, levels, empty)
        if len(_CATALOGUES) >= _CATALOGUES_KEPT:
            del _CATALOGUES[next(iter(_CATALOGUES))]
        _CATALOGUES[key] = got  # holds ``pools``, so the id stays this tuple's
        return got


def fit_key(shape: PodShape) -> tuple[object, ...] | None:
    """Everything of ``shape`` that decides how many of its pods a new node holds (None
    with device claims). Remembered per shape object: a plan asks for it at every
    placement and catalogue lookup of the shape."""
    hit = _FIT_KEYS.get(id(shape))
    if hit is not None and hit[0] is shape:
        return hit[1]
    key: tuple[object, ...] | None = None
    if not shape.claims:
        key = (tuple(sorted(shape.requests.items())), tuple(sorted(shape.node_selector.items())),
               shape.affinity_terms, shape.tolerations, shape.max_per_node, shape.node_name)
    if len(_FIT_KEYS) >= _SHAPES_KEPT:
        del _FIT_KEYS[next(iter(_FIT_KEYS))]
    _FIT_KEYS[id(shape)] = (shape, key)  # holds the shape, so the id stays its own
    return key


_FIT_KEYS: dict[int, tuple[PodShape, tuple[object, ...] | None]] = {}


_SHAPES_KEPT = 512


def _price_order(ref: PoolRef) -> tuple[float, bool, str]:
    """Cheapest node first by planning price; reserved capacity before on-demand at a tie."""
    return (ref.pool.planning_price, not ref.pool.reserved, ref.sort_name)


_CATALOGUES: dict[tuple[int, bool, tuple[str, ...]], Catalogue] = {}
"""Recent catalogues by pools tuple (a memo: the same pools give the same catalogue)."""
_CATALOGUES_KEPT = 8


class _NodeIndex:
    """Node name -> node, built on first use (only assigned nodes are ever looked up)."""

    def __init__(self, nodes: Sequence[NodeState]) -> None:
        self.nodes = nodes
        self._by_name: dict[str, NodeState] | None = None

    def _node(self, name: str) -> NodeState:
        if self._by_name is None:
            self._by_name = {n.name: n for n in self.nodes}
        return self._by_name[name]

    def labels(self, name: str) -> Mapping[str, str]:
        return self._node(name).labels

    def devices(self, name: str) -> NodeDevices | None:
        return self._node(name).devices


class GangView(NamedTuple):
    """What a workspace's node classes depend on, of a gang: gangs with equal views group
    the cluster's nodes into the same classes."""

    resources: tuple[str, ...]
    label_keys: tuple[str, ...]
    by_name: bool
    floor: tuple[tuple[int, int], ...]
    """Resources every pod set requests, with the smallest such request: a node with less
    free than that of any of them cannot take a single pod of the gang."""
    claims: bool

    @classmethod
    def of(cls, shapes: Sequence[PodShape]) -> GangView:
        """The view of a gang of ``shapes`` (remembered for the last few gangs: a planning
        pass asks again for every plan of the same request)."""
        key = tuple(map(id, shapes))
        hit = _VIEWS.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], shapes, strict=True)):
            return hit[1]
        view = cls._of(shapes)
        if len(_VIEWS) >= _VIEWS_KEPT:
            del _VIEWS[next(iter(_VIEWS))]
        _VIEWS[key] = (tuple(shapes), view)  # holds the shapes, so the ids stay theirs
        return view

    @classmethod
    def _of(cls, shapes: Sequence[PodShape]) -> GangView:
        resources: set[str] = set()
        keys: set[str] = set()
        for shape in shapes:
            resources.update(r for r, v in shape.requests.items() if v > 0)
            keys.update(label_keys(shape))
        ordered = tuple(sorted(resources))
        floor = tuple(
            (i, min(s.requests[r] for s in shapes))
            for i, r in enumerate(ordered)
            if shapes and all(s.requests.get(r, 0) > 0 for s in shapes)
        )
        return cls(ordered, tuple(sorted(keys)), any(uses_node_name(s) for s in shapes), floor,
                   any(shape.claims for shape in shapes))


@dataclass(frozen=True, slots=True)
class BaseFit:
    """A shape's candidates on a snapshot's base classes, and the capacity per domain they
    give per level depth (filled as asked for); kept in :attr:`WorkspaceIndex.base_fits`
    for :class:`controller.fit.placement.PodSetPlacer`."""

    cands: list[tuple[NodeClass, int]]
    caps: dict[int, dict[tuple[str, ...], int]]


_VIEWS: dict[tuple[int, ...], tuple[tuple[PodShape, ...], GangView]] = {}
"""Recent gang views by the identity of their shapes (a memo)."""
_VIEWS_KEPT = 64


class WorkspaceIndex:
    """What every fork of a workspace shares and none changes: the snapshot's nodes and
    pools as this gang sees them, the topology, and where new nodes can go.

    The token caches grow as tokens are asked for, but a token means the same content in
    every fork, so they are shared too.
    """

    def __init__(
        self,
        nodes: Sequence[NodeState],
        pools: Sequence[PoolState],
        levels: Levels,
        shapes: Sequence[PodShape],
        *,
        empty: bool,
    ) -> None:
        self.levels = levels
        self.view = GangView.of(shapes)
        claims = [c for shape in shapes for c in shape.claims]
        self.device_keys = ClaimFitter(claims) if claims else None
        """Device equivalence (None: the gang claims no devices, devices are ignored)."""
        self.nodes = _NodeIndex(nodes)
        self.catalogue = Catalogue.of(pools, levels, empty)
        self.pools = self.catalogue.pools
        self.pool_index = self.catalogue.pool_index
        self.refs = self.catalogue.refs
        self.taint_ids: dict[int, int] = {}
        self.taint_tokens: dict[tuple[Taint, ...], int] = {}
        self._taint_keep: list[tuple[Taint, ...]] = []
        self._device_tokens: dict[object, int] = {}
        self.shape_tokens: dict[int, tuple[int, NodeDevices]] = {}
        self._templates: dict[int, tuple[NodeClass, tuple[int, ...]]] = {}
        self.base_fits: dict[tuple[object, ...], BaseFit] = {}
        """What a placer derives from the base classes for a shape (:func:`fit_key`), shared
        by every placement on a workspace whose classes are still the base ones
        (:attr:`Usage.pristine`): the first pod set of every plan against a snapshot
        otherwise counts every class of the cluster again."""

    def template(self, ref: PoolRef) -> tuple[NodeClass, tuple[int, ...]]:
        """The class a new node of ``ref`` starts from (no members yet) and its allocatable
        amounts of the gang's resources: the same for every node a plan adds there."""
        got = self._templates.get(ref.ordinal)
        if got is None:
            key = ClassKey((), tuple([ref.labels.get(k) for k in self.view.label_keys]),
                           self.taint_token(ref.pool.taints), ref.path, None, None)
            got = self._templates[ref.ordinal] = (
                NodeClass(key, {}, ref.labels, ref.pool.taints, ref.path, (), None,
                          ref.pool.devices),
                tuple([ref.pool.allocatable.get(r, unlisted(r)) for r in self.view.resources]),
            )
        return got

    def taint_token(self, taints: tuple[Taint, ...]) -> int:
        """A small int equal for equal taint tuples; hashes a tuple's content only the first
        time that tuple object is seen (the snapshot builder shares equal tuples)."""
        token = self.taint_ids.get(id(taints))
        if token is None:
            token = self.taint_tokens.setdefault(taints, len(self.taint_tokens))
            self.taint_ids[id(taints)] = token
            self._taint_keep.append(taints)  # keeps the id valid while the token is cached
        return token

    def device_token(self, devices: NodeDevices | None) -> int | None:
        """A small int equal for devices the gang cannot tell apart: same inventory, same
        allocations, same identity attributes the gang reads (None without claims)."""
        if self.device_keys is None or devices is None:
            return None
        key = self.device_keys.key(devices)
        return self._device_tokens.setdefault(key, len(self._device_tokens))

    def node_devices(self, node: NodeState, empty: bool) -> tuple[int | None, NodeDevices | None]:
        """(token, devices) of a node; per interned shape when the gang reads no identity
        attribute of it (the usual case: one dict lookup per node)."""
        devs = node.devices
        if self.device_keys is None or devs is None:
            return None, None
        hit = self.shape_tokens.get(id(devs.shape))
        if hit is not None:
            return hit
        use = emptied(devs) if empty else devs  # nothing allocated, like nothing running
        token = self.device_token(use)
        assert token is not None
        if self.device_keys.key(use)[2] is None:
            self.shape_tokens[id(devs.shape)] = (token, use)
        return token, use


@dataclass(slots=True)
class Usage:
    """What placing pods changes: the node classes, the new-node slots and the pool headroom
    they take. The only part of a workspace :meth:`Workspace.fork` copies."""

    classes: dict[ClassKey, NodeClass]
    slot_keys: set[ClassKey] = field(default_factory=set)
    """Classes that have (or had) new-node slots among their members."""
    slots: dict[str, NewNodeSlot] = field(default_factory=dict)
    slot_labels: dict[str, Mapping[str, str]] = field(default_factory=dict)
    slot_count: dict[tuple[int, tuple[tuple[str, str], ...]], int] = field(default_factory=dict)
    """Slots numbered so far per (pool, domain labels)."""
    pool_used: dict[int, int] = field(default_factory=dict)
    domain_used: dict[tuple[int, int], int] = field(default_factory=dict)
    """New nodes this plan adds, per pool and per (pool, domain)."""
    pool_booked: Mapping[int, int] = field(default_factory=dict)
    domain_booked: Mapping[tuple[int, int], int] = field(default_factory=dict)
    """New nodes earlier plans booked (:meth:`Workspace.rebased`); never changed in place,
    so copies share them."""
    allocations: dict[tuple[str, str], list[PodDevices]] = field(default_factory=dict)
    """(node or slot name, pod set) -> device allocations of the pods placed there."""
    placed: dict[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    """Pod set -> (node or slot name, pods) of this plan, for topology spread counting the
    pods of other pod sets."""
    pristine: bool = False
    """The classes are the index's base classes, unchanged (:attr:`WorkspaceIndex.base_fits`
    holds for them)."""

    def copy(self) -> Usage:
        return Usage(
            dict(self.classes), set(self.slot_keys), dict(self.slots), dict(self.slot_labels),
            dict(self.slot_count), dict(self.pool_used), dict(self.domain_used),
            self.pool_booked, self.domain_booked,
            {k: list(v) for k, v in self.allocations.items()}, dict(self.placed), self.pristine,
        )


class Workspace:
    """Planning state: a shared :attr:`index` and the mutable :attr:`usage`; :meth:`fork`
    gives an independent copy to try a gang on."""

    __slots__ = ("index", "usage")

    def __init__(
        self,
        nodes: Sequence[NodeState],
        pools: Sequence[PoolState],
        levels: Levels,
        shapes: Sequence[PodShape],
        *,
        empty: bool = False,
    ) -> None:
        """``empty``: every node as if nothing ran on it, it were Ready and not cordoned,
        and its condition taints were gone (the best the cluster could ever offer, for the
        NeverFits test)."""
        view = GangView.of(shapes)
        memo_key = None
        if isinstance(nodes, tuple) and isinstance(pools, tuple) and not view.claims:
            memo_key = (id(nodes), id(pools), view, levels, empty)
            hit = _BASES.get(memo_key)
            if hit is not None and hit[0] is nodes and hit[1] is pools:
                self.index = hit[2]
                self.usage = Usage(dict(hit[3]), pristine=True)
                return
        self.index = WorkspaceIndex(nodes, pools, levels, shapes, empty=empty)
        self.usage = Usage(_classes(self.index, nodes, empty))
        if empty:
            self._heal()
        self.usage.pristine = True
        if memo_key is not None:
            _remember(memo_key, (nodes, pools, self.index, dict(self.usage.classes)))

    @classmethod
    def _of(cls, index: WorkspaceIndex, usage: Usage) -> Workspace:
        ws = cls.__new__(cls)
        ws.index = index
        ws.usage = usage
        return ws

    def _heal(self) -> None:
        """Classes as if their nodes were healthy and uncordoned: condition and cordon
        taints dropped (:mod:`controller.fit.taints`); classes that become equal merge. Per
        class, not per node: the NeverFits judgement runs after every plan that fails."""
        index = self.index
        if not any(transient(t) for taints in index.taint_tokens for t in taints):
            return
        healed: dict[ClassKey, NodeClass] = {}
        for key, cls in self.usage.classes.items():
            taints = lasting_taints(cls.taints)
            if taints is not cls.taints:
                key = key._replace(taint_token=index.taint_token(taints))
                cls = cls._replace(key=key, taints=taints)
            have = healed.get(key)
            healed[key] = cls if have is None else have._replace(
                members=tuple(sorted((*have.members, *cls.members))))
        self.usage.classes = healed

    def fork(self) -> Workspace:
        return Workspace._of(self.index, self.usage.copy())

    def rebased(self) -> Workspace:
        """This workspace once its plan is booked: what :class:`Workspace` would build from
        the snapshot with the plan applied (:func:`controller.fit.capacity.apply_plan`).

        Existing nodes keep the usage the plan put on them; new-node slots leave (another
        request may not use their leftover capacity before they register, as in
        ``apply_plan``); the plan's new nodes count as booked pool headroom. Nodes the plan
        left too full for the gang stay as classes no pod fits, which placement skips. Only
        for gangs without device claims.
        """
        assert self.index.device_keys is None, "device allocations are not rebased"
        usage = self.usage
        classes = dict(usage.classes)
        for key in usage.slot_keys:
            cls = classes.get(key)
            if cls is None:
                continue
            kept = tuple(m for m in cls.members if m not in usage.slots)
            if kept:
                classes[key] = cls._replace(members=kept)
            else:
                del classes[key]
        # As apply_plan books them: a plan's new nodes are known by (pool, domain labels),
        # so every domain of the pool listing the same labels loses that headroom.
        booked = dict(usage.domain_booked)
        for (pi, di), count in usage.domain_used.items():
            domains = self.index.pools[pi].domains
            for dj, dom in enumerate(domains):
                if dom.labels == domains[di].labels:
                    booked[(pi, dj)] = booked.get((pi, dj), 0) + count
        return Workspace._of(self.index, Usage(
            classes, pool_booked=_summed(usage.pool_booked, usage.pool_used),
            domain_booked=booked,
        ))

    def all_nodes(self) -> Sequence[NodeState]:
        """Every node of the snapshot, usable or not (topology spread counts them all)."""
        return self.index.nodes.nodes

    def slot_nodes(self) -> list[tuple[str, Mapping[str, str], tuple[Taint, ...]]]:
        """(name, labels, taints) of every new node this plan adds so far (spread domains)."""
        pools = self.index.pools
        index = self.index.pool_index
        return [(name, self.usage.slot_labels[name], pools[index[slot.pool]].taints)
                for name, slot in self.usage.slots.items()]

    def labels(self, name: str) -> Mapping[str, str]:
        """Labels of a node or slot (a slot carries its pool template's and domain's)."""
        got = self.usage.slot_labels.get(name)
        return got if got is not None else self.index.nodes.labels(name)

    def _place(
        self,
        cls: NodeClass,
        names: Sequence[str],
        free: Mapping[str, int],
        devices: NodeDevices | None = None,
    ) -> None:
        old = cls.key
        key = ClassKey(tuple([free[r] for r in self.index.view.resources]), old.selected,
                       old.taint_token, old.path, old.node_name,
                       self.index.device_token(devices))
        usage = self.usage
        usage.pristine = False
        have = usage.classes.get(key)
        members = tuple(sorted((*have.members, *names))) if have else tuple(names)
        if usage.slots and any(n in usage.slots for n in names):
            usage.slot_keys.add(key)
        usage.classes[key] = NodeClass(
            key, free, cls.labels, cls.taints, cls.path, members, cls.node_name, devices
        )

    def device_of(self, name: str) -> NodeDevices | None:
        """The devices a node (or slot) had before this plan: pool names and identity."""
        slot = self.usage.slots.get(name)
        if slot is not None:
            return self.index.pools[self.index.pool_index[slot.pool]].devices
        return self.index.nodes.devices(name)

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
        self.usage.pristine = False
        classes = self.usage.classes
        cls = classes[key]
        names = list(cls.members[:nodes])
        rest = cls.members[nodes:]
        if rest:
            classes[key] = cls._replace(members=rest)
        else:
            del classes[key]
        free = {r: v - requests.get(r, 0) * pods_each for r, v in cls.free.items()}
        devices = cls.devices
        if counter is not None and counter.fitter is not None:
            devices, plans = counter.after(cls.devices, pods_each)
            self._record(names, counter, plans)
        self._place(cls, names, free, devices)
        return names

    def _record(
        self, names: Sequence[str], counter: ShapeCounter, plans: Sequence[PodAllocation]
    ) -> None:
        for name in names:
            own = self.device_of(name)
            if own is None:
                continue
            self.usage.allocations.setdefault((name, counter.owner), []).extend(
                counter.resolve(own, plans)
            )

    def headroom(self, ref: PoolRef) -> int:
        """New nodes this (pool, domain) may still add, honouring the pool-wide limit."""
        key = (ref.pool_index, ref.domain_index)
        usage = self.usage
        dom_left = (ref.domain.max_new_nodes - usage.domain_used.get(key, 0)
                    - usage.domain_booked.get(key, 0))
        return max(0, min(dom_left, self.pool_headroom(ref.pool_index)))

    def pool_headroom(self, pool_index: int) -> int:
        usage = self.usage
        return max(0, self.index.pools[pool_index].max_new_nodes
                   - usage.pool_used.get(pool_index, 0) - usage.pool_booked.get(pool_index, 0))

    def add_nodes(
        self,
        ref: PoolRef,
        pods: Sequence[int],
        requests: Resources,
        counter: ShapeCounter | None = None,
    ) -> list[str]:
        """Commit one new node of ``ref`` per entry of ``pods`` (pods placed on it)."""
        index, usage = self.index, self.usage
        key = (ref.pool_index, ref.domain_index)
        usage.domain_used[key] = usage.domain_used.get(key, 0) + len(pods)
        # Slots are numbered per (pool, domain labels): a pool listing the same labels
        # twice must still give every new node a distinct identity.
        ident = ref.slot_ident
        start = usage.slot_count.get(ident, 0)
        usage.slot_count[ident] = start + len(pods)
        usage.pool_used[ref.pool_index] = usage.pool_used.get(ref.pool_index, 0) + len(pods)
        template, full = index.template(ref)
        resources = index.view.resources
        names: list[str] = []
        for offset, count in enumerate(pods):
            slot_index = start + offset
            name = f"{NEW_NODE_PREFIX}/{ref.sort_name}/{slot_index:06d}"
            usage.slots[name] = NewNodeSlot(ref.pool.name, dict(ref.domain.labels), slot_index)
            usage.slot_labels[name] = ref.labels
            free = {r: f - requests.get(r, 0) * count
                    for r, f in zip(resources, full, strict=True)}
            devices = ref.pool.devices if index.device_keys else None
            if counter is not None and counter.fitter is not None and count > 0:
                devices, plans = counter.after(ref.pool.devices, count)
                self._record([name], counter, plans)
            self._place(template, [name], free, devices)
            names.append(name)
        return names


_BASES: dict[
    tuple[Any, ...],
    tuple[Sequence[NodeState], Sequence[PoolState], WorkspaceIndex, dict[ClassKey, NodeClass]],
] = {}
"""Recent base workspaces by (nodes tuple, pools tuple, gang view, levels, empty): a memo,
since the same snapshot seen by gangs that tell nodes apart the same way gives the same
index and classes. Requests planned against one snapshot (a planning pass, the NeverFits
judgement after each failure, a benchmark) scan its nodes once, not once per request. Not
for gangs with device claims (their classes depend on the claims, not only on the view).
Only the class dict is copied per workspace: classes are immutable, the index is shared
like between forks."""
_BASES_KEPT = 8


def _remember(
    key: tuple[Any, ...],
    entry: tuple[Sequence[NodeState], Sequence[PoolState], WorkspaceIndex,
                 dict[ClassKey, NodeClass]],
) -> None:
    """Keep ``entry``, with the entries of the snapshot (nodes tuple) seen just before it at
    most: a controller builds a new snapshot per pass, and an older one is not planned
    against again, so it is not held in memory."""
    if _BASES:
        latest = next(reversed(_BASES.values()))[0]
        if latest is not entry[0]:
            for k in [k for k, v in _BASES.items() if v[0] is not latest]:
                del _BASES[k]
    while len(_BASES) >= _BASES_KEPT:
        del _BASES[next(iter(_BASES))]
    _BASES[key] = entry

_Group = tuple[NodeState, list[str], NodeDevices | None]
"""A class being built: its first node, its members' names, a member's devices."""


def _classes(
    index: WorkspaceIndex, nodes: Sequence[NodeState], empty: bool
) -> dict[ClassKey, NodeClass]:
    """The schedulable nodes grouped into classes."""
    res = index.view.resources
    by_name = index.view.by_name
    classes: dict[ClassKey, NodeClass] = {}
    for gkey, (node, names, devices) in _groups(index, nodes, empty).items():
        names.sort()
        ckey = ClassKey._make(gkey)
        classes[ckey] = NodeClass(
            ckey,
            dict(zip(res, ckey.free, strict=True)),
            node.labels,
            node.taints,
            ckey.path,
            tuple(names),
            node.name if by_name else None,
            devices,
        )
    return classes


def _groups(
    index: WorkspaceIndex, nodes: Sequence[NodeState], empty: bool
) -> dict[tuple[Any, ...], _Group]:
    """The schedulable nodes by class key, as plain tuples.

    The hot loop of a plan over a large cluster: keys from C-level itemgetters (a node
    missing a key takes the slow path), taints as tokens, member names sorted once, plain
    tuples as group keys (a :class:`ClassKey` is made per class, not per node).
    """
    view = index.view
    res = view.resources
    label_keys = view.label_keys
    defaults = [(r, unlisted(r)) for r in res]
    free_of = _getter(res)
    sel_of = _getter(label_keys)
    path_of = _getter(index.levels.domain)
    dlevels = index.levels.domain
    by_name = view.by_name
    taint_ids = index.taint_ids
    floor = view.floor
    with_devices = index.device_keys is not None
    shape_tokens = index.shape_tokens
    groups: dict[tuple[Any, ...], _Group] = {}
    for node in nodes:
        if not (node.schedulable or empty):
            continue
        free = node.allocatable if empty else node.free
        labels = node.labels
        try:
            fkey = free_of(free)
        except KeyError:
            fkey = tuple([free.get(r, d) for r, d in defaults])
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
            lkey = tuple([labels.get(k) for k in label_keys])
        try:
            path = path_of(labels)
        except KeyError:
            path = domain_path(labels, dlevels)
        token = taint_ids.get(id(node.taints))
        if token is None:
            token = index.taint_token(node.taints)
        dtoken = devices = None
        if with_devices and node.devices is not None:
            # Inline fast path: interned shapes make this one dict lookup per node.
            hit = shape_tokens.get(id(node.devices.shape))
            dtoken, devices = hit if hit is not None else index.node_devices(node, empty)
        key = (fkey, lkey, token, path, node.name if by_name else None, dtoken)
        group = groups.get(key)
        if group is None:
            groups[key] = (node, [node.name], devices)
        else:
            group[1].append(node.name)
    return groups
