"""Placement of one pod set on a :class:`Workspace`: the topology rules and the pool choice.

Order of preference, for every topology mode:

1. existing free capacity only (check mode stops here);
2. existing capacity plus new nodes, the cheapest new capacity first.

Within a pass: ``required`` keeps every pod in one domain of the level, choosing the tightest
domain that fits (best fit, limits fragmentation) or, when new nodes are needed, the domain
that needs the cheapest new capacity; ``preferred`` tries one domain at the level and climbs
to wider levels, then spreads over the fewest top-level domains (Kueue TAS); ``none`` uses the
fewest nodes anywhere. Inside a chosen domain the pods descend through the fewest child
domains (:func:`controller.fit.topology.fill`).

A pod set is placed only when all its pods fit; the workspace changes only on success.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.fit.shapes import ShapeCounter, pods_that_fit
from controller.fit.topology import NEW_HOSTNAME, fill
from controller.fit.types import Mode, PodSetPlacement, PodSetRequest, TopologyMode
from controller.fit.workspace import NodeClass, PoolRef, Workspace


@dataclass(frozen=True, slots=True)
class Batch:
    """New nodes a (pool, domain) can add for this pod set: ``per_node`` pods each."""

    ref: PoolRef
    per_node: int
    nodes: int
    price: float = field(init=False)
    """The pool's planning price per node-hour (kept: purchases sort and walk many
    batches)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "price", self.ref.pool.planning_price)


@dataclass(frozen=True, slots=True)
class Purchase:
    takes: tuple[tuple[Batch, int, int], ...]
    """(batch, nodes, pods)."""
    cost: float
    nodes: int


@dataclass(frozen=True, slots=True)
class Outcome:
    pods: tuple[tuple[str, int], ...]
    """(node or slot name, pods)."""
    placement: PodSetPlacement


def one_batch_nodes(b: Batch, need: int, pool_left: Mapping[int, int]) -> int | None:
    """New nodes of ``b`` holding ``need`` (> 0) pods, or None when its room is short."""
    if min(b.nodes, pool_left.get(b.ref.pool_index, 0)) * b.per_node < need:
        return None
    return -(-need // b.per_node)


def buy(batches: Sequence[Batch], need: int, pool_left: dict[int, int]) -> Purchase | None:
    """Cheapest new nodes for ``need`` pods, or None if the batches cannot hold them.

    Walks the batches by price per pod, taking each whole; before each step it prices
    finishing with the single batch that covers the rest most cheaply (so one pod does not
    buy an expensive 8-pod node when a 1-pod node is cheaper), and keeps the cheapest of
    those finishes. ``pool_left`` (pool-wide headroom) is updated for the chosen purchase.
    """
    if need <= 0:
        return Purchase((), 0.0, 0)
    if len(batches) == 1:
        # The common case (one pool per topology domain): the general walk below reduces to
        # this, and a gang with a required level prices every domain of the cluster.
        b = batches[0]
        k = one_batch_nodes(b, need, pool_left)
        if k is None:
            return None
        pool_left[b.ref.pool_index] = pool_left.get(b.ref.pool_index, 0) - k
        return Purchase(((b, k, need),), k * b.price, k)
    ordered = sorted(batches, key=lambda b: (b.price / b.per_node, b.price,
                                                   not b.ref.pool.reserved, b.ref.sort_name))
    n = len(ordered)
    # The finishing candidates of a step cost at least what has been spent plus one node, so
    # walking them cheapest node first stops at the first price that cannot beat the best
    # found; ties keep the earliest in ``ordered``, as a walk over all of them would.
    cheap = sorted(range(n), key=lambda i: ordered[i].price)
    left = [b.nodes for b in ordered]
    pools = dict(pool_left)
    prefix: list[tuple[Batch, int, int]] = []
    best: tuple[tuple[float, int], tuple[tuple[Batch, int, int], ...]] | None = None
    spent, nodes_so_far, rem = 0.0, 0, need
    first = 0
    while rem > 0:
        bound = math.inf if best is None else best[0][0]
        step = _finish(ordered, cheap, left, pools, rem, spent, nodes_so_far, bound)
        if step is not None and (best is None or step[0] < best[0]):
            best = (step[0], (*prefix, (ordered[step[1]], step[2], rem)))
        # Rooms only shrink, so the first batch with room only moves forward.
        while first < n and min(left[first], pools.get(ordered[first].ref.pool_index, 0)) <= 0:
            first += 1
        if first == n:
            break
        b = ordered[first]
        k = min(left[first], pools.get(b.ref.pool_index, 0))
        if k * b.per_node >= rem:
            break  # finishing with this batch was priced above
        prefix.append((b, k, k * b.per_node))
        left[first] -= k
        pools[b.ref.pool_index] -= k
        spent += k * b.price
        nodes_so_far += k
        rem -= k * b.per_node
    if best is None:
        return None
    takes = best[1]
    for b, k, _ in takes:
        pool_left[b.ref.pool_index] = pool_left.get(b.ref.pool_index, 0) - k
    return Purchase(takes, best[0][0], best[0][1])


def _finish(
    ordered: Sequence[Batch], cheap: Sequence[int], left: Sequence[int], pools: Mapping[int, int],
    rem: int, spent: float, nodes_so_far: int, bound: float,
) -> tuple[tuple[float, int], int, int] | None:
    """The cheapest way to finish ``rem`` pods with one batch of ``ordered`` (walked in
    ``cheap`` order, cheapest node first), costing no more than ``bound``: (rank, index,
    nodes), ties to the earliest in ``ordered``."""
    step: tuple[tuple[float, int], int, int] | None = None
    for i in cheap:
        b = ordered[i]
        floor = spent + b.price
        if floor > bound or (step is not None and floor > step[0][0]):
            break
        room = min(left[i], pools.get(b.ref.pool_index, 0))
        if room * b.per_node >= rem:
            k = -(-rem // b.per_node)
            rank = (spent + k * b.price, nodes_so_far + k)
            if step is None or (rank, i) < (step[0], step[1]):
                step = (rank, i, k)
    return step


Take = tuple[NodeClass, int, int]
"""(class, pods per node, nodes)."""


class PodSetPlacer:
    """Places one pod set on a workspace (see the module docstring for the rules)."""

    def __init__(
        self, ws: Workspace, ps: PodSetRequest, mode: Mode, *, cautious: bool = False
    ) -> None:
        self.ws = ws
        self.ps = ps
        self.mode = mode
        # A spread that other pod sets' new nodes cannot break: every domain the pools offer
        # opened, at most maxSkew pods on a new hostname domain (controller.fit.spread).
        self.cautious = cautious
        self.counter = ShapeCounter(ps.shape, ps.name)
        self.cands: list[tuple[NodeClass, int]] = []
        shape = ps.shape
        # Classes already agree on everything the shape reads except the topology path, so
        # memoise on the class key without it (cheaper than the counter's own key).
        memo: dict[tuple[object, ...], int] = {}
        for cls in ws.usage.classes.values():
            k = cls.key
            mkey = (k.free, k.selected, k.taint_token, k.node_name, k.device_token)
            c = memo.get(mkey)
            if c is None:
                c = pods_that_fit(shape, cls.free, cls.labels, cls.taints, node_name=cls.node_name,
                                  devices=cls.devices, fitter=self.counter.fitter)
                memo[mkey] = c
            if c > 0:
                self.cands.append((cls, c))
        self.per_node = {cls.key: c for cls, c in self.cands}
        self._batches: list[Batch] | None = None
        self._per_node: list[int] | None = None
        self._pool_room: dict[int, int] = {}

    @property
    def batches(self) -> list[Batch]:
        """Every (pool, domain) that can add a node holding a pod of this pod set, in
        catalogue order; built on first use. Choosing the cheapest new capacity does not
        need it (:meth:`_scan` walks the catalogue by price and stops early): only the
        strategies that weigh every domain (spread, slices, explanations) build it."""
        if self._batches is None:
            self._batches = []
            if self.mode is Mode.PROVISION:
                usage = self.ws.usage
                touched = {*usage.pool_used, *usage.pool_booked}
                touched.update(pi for pi, _ in usage.domain_used)
                touched.update(pi for pi, _ in usage.domain_booked)
                # Pools this plan (or a booked one) has not taken from have the headroom
                # of the catalogue's pools: their batches are the catalogue's, per shape.
                fresh = self.ws.index.catalogue.fresh_batches(self.ps.shape, self._all_batches)
                if not touched:
                    self._batches = list(fresh)
                else:
                    self._batches = [b for b in fresh if b.ref.pool_index not in touched]
                    for ref in self.ws.index.refs:
                        if ref.pool_index in touched:
                            b = self._batch(ref)
                            if b is not None:
                                self._batches.append(b)
                    self._batches.sort(key=lambda b: b.ref.ordinal)
        return self._batches

    def _all_batches(self) -> list[Batch]:
        per_node = self._pool_per_node()
        out: list[Batch] = []
        for ref in self.ws.index.refs:
            if per_node[ref.ordinal] > 0:
                b = self._batch(ref)
                if b is not None:
                    out.append(b)
        return out

    def _pool_per_node(self) -> list[int]:
        if self._per_node is None:
            counter = self.counter

            def count(ref: PoolRef) -> int:
                return pods_that_fit(counter.shape, ref.pool.allocatable, ref.labels,
                                     ref.pool.taints, devices=ref.pool.devices,
                                     fitter=counter.fitter)

            self._per_node = self.ws.index.catalogue.per_node(self.ps.shape, count)
        return self._per_node

    def _batch(self, ref: PoolRef) -> Batch | None:
        """What ``ref`` can add for this pod set now, or None (no room, or no pod fits)."""
        per_node = self._pool_per_node()[ref.ordinal]
        if per_node <= 0:
            return None
        pi = ref.pool_index
        room = self._pool_room.get(pi)
        if room is None:
            room = self._pool_room[pi] = self.ws.pool_headroom(pi)
        if room <= 0:
            return None
        usage = self.ws.usage
        dkey = (pi, ref.domain_index)
        nodes = min(room, ref.domain.max_new_nodes - usage.domain_used.get(dkey, 0)
                    - usage.domain_booked.get(dkey, 0))
        return Batch(ref, per_node, nodes) if nodes > 0 else None

    def cheapest(self, need: int, cap: int | None = None) -> list[Batch]:
        """The batches the cheapest purchase of ``need`` pods anywhere can use, at most
        ``cap`` pods on a node: for :func:`buy`, instead of :attr:`batches`."""
        return self._scan(self.ws.index.catalogue.by_price, need, cap)

    def _scan(self, refs: Sequence[PoolRef], need: int, cap: int | None = None) -> list[Batch]:
        """The batches of ``refs`` (cheapest node first) that the cheapest purchase of
        ``need`` pods can use: a node of a pool priced above the cheapest single-batch way
        found so far cannot be part of a cheaper purchase, so the walk stops there."""
        out: list[Batch] = []
        if self.mode is not Mode.PROVISION:
            return out
        best = math.inf
        for ref in refs:
            price = ref.pool.planning_price
            if price > best:
                break
            b = self._batch(ref)
            if b is None:
                continue
            if cap is not None and b.per_node > cap:
                b = Batch(b.ref, cap, b.nodes)
            out.append(b)
            if need <= 0:
                break
            if b.nodes * b.per_node >= need:
                cost = -(-need // b.per_node) * price
                if cost < best:
                    best = cost
        return out

    def _pool_left_of(self, batches: Sequence[Batch]) -> dict[int, int]:
        """Pool-wide headroom of the pools of ``batches`` (what :func:`buy` reads)."""
        return {b.ref.pool_index: self.ws.pool_headroom(b.ref.pool_index) for b in batches}

    # ------------------------------------------------------------------ helpers

    def pool_left(self) -> dict[int, int]:
        usage = self.ws.usage
        left = dict(self.ws.index.catalogue.fresh_headroom)
        for i in {*usage.pool_used, *usage.pool_booked}:
            left[i] = self.ws.pool_headroom(i)
        return left

    def existing_room(self) -> int:
        return sum(c * len(cls.members) for cls, c in self.cands)

    def domain_caps(self, depth: int) -> dict[tuple[str, ...], int]:
        """Existing capacity per domain at domain-level index ``depth``."""
        caps: dict[tuple[str, ...], int] = {}
        for cls, c in self.cands:
            if len(cls.path) > depth:
                key = cls.path[: depth + 1]
                caps[key] = caps.get(key, 0) + c * len(cls.members)
        return caps

    def members(self, key: tuple[str, ...]) -> list[NodeClass]:
        n = len(key)
        return [cls for cls, _ in self.cands if cls.path[:n] == key]

    def _fill(self, classes: Sequence[NodeClass], need: int, depth: int) -> list[Take]:
        return fill(
            classes, need, depth, path=lambda x: x.path, per_node=lambda x: self.per_node[x.key],
            nodes=lambda x: len(x.members), name=lambda x: x.first,
        )

    def _commit(
        self, existing: list[Take], purchase: Purchase | None, *, even: bool = False
    ) -> tuple[tuple[str, int], ...]:
        """Take the nodes and add the new ones; ``even``: a purchase's pods spread evenly
        over its new nodes (topology spread on the hostname), not packed."""
        requests = self.ps.shape.requests
        out: list[tuple[str, int]] = []
        for cls, pods_each, nodes in existing:
            for name in self.ws.take(cls.key, nodes, pods_each, requests, self.counter):
                out.append((name, pods_each))
        if purchase is not None:
            for batch, nodes, pods in purchase.takes:
                if even:
                    q, r = divmod(pods, nodes)
                    spread = [q + 1] * r + [q] * (nodes - r)
                else:
                    spread = [batch.per_node] * (pods // batch.per_node)
                    if pods % batch.per_node:
                        spread.append(pods % batch.per_node)
                    spread.extend([0] * (nodes - len(spread)))
                added = self.ws.add_nodes(batch.ref, spread, requests, self.counter)
                for name, n in zip(added, spread, strict=True):
                    out.append((name, n))
        placed = self.ws.usage.placed
        placed[self.ps.name] = (*placed.get(self.ps.name, ()), *out)
        return tuple(out)

    def _placement(
        self, level: str | None, key: tuple[str, ...] | None, used: Sequence[tuple[str, int]]
    ) -> PodSetPlacement:
        levels = self.ws.index.levels
        if key is not None and level is not None:
            return PodSetPlacement(
                self.ps.name, level, key[-1], 1, domain_labels=levels.labels_of(key)
            )
        if level is None or level == levels.node_level:
            return PodSetPlacement(self.ps.name, level, None, len(used))
        depth = levels.index(level)
        tops = {levels.path(self.ws.labels(name))[: depth + 1] for name, _ in used}
        return PodSetPlacement(self.ps.name, level, None, len(tops))

    # ------------------------------------------------------------------ strategies

    def place(self) -> Outcome | None:
        if self.ps.topology.slice_level is not None:
            from controller.fit.slices import applies, sliced_place  # it builds on this module

            if applies(self.ps.topology, self.ws.index.levels):
                return sliced_place(self)
        if self.ps.shape.spread is not None:
            from controller.fit.spread import spread_place  # it builds on this module

            return spread_place(self, self.ps.shape.spreads)
        topo = self.ps.topology
        if topo.mode is TopologyMode.NONE or topo.level is None:
            return self._anywhere(fewest_nodes=True)
        levels = self.ws.index.levels
        depth = levels.index(topo.level)
        if topo.mode is TopologyMode.REQUIRED:
            return self._single_existing(depth) or self._single_with_new(depth)
        # Preferred: one domain at the level, climbing; spread only as a last resort.
        for d in range(depth, -1, -1):
            got = self._single_existing(d)
            if got is not None:
                return got
        got = self._anywhere(fewest_nodes=False, allow_new=False)
        if got is not None:
            return got
        for d in range(depth, -1, -1):
            got = self._single_with_new(d)
            if got is not None:
                return got
        return self._anywhere(fewest_nodes=False)

    def _single_existing(self, depth: int) -> Outcome | None:
        need = self.ps.count
        levels = self.ws.index.levels
        if depth == len(levels.domain):  # node level: one node
            fitting = [(c, cls.first, cls) for cls, c in self.cands if c >= need]
            if not fitting:
                return None
            _, _, cls = min(fitting, key=lambda x: x[:2])
            pods = self._commit([(cls, need, 1)], None)
            return Outcome(pods, self._node_placement(pods[0][0]))
        caps = self.domain_caps(depth)
        fitting_keys = [(cap, key) for key, cap in caps.items() if cap >= need]
        if not fitting_keys:
            return None
        _, key = min(fitting_keys)
        pods = self._commit(self._fill(self.members(key), need, depth + 1), None)
        return Outcome(pods, self._placement(levels.domain[depth], key, pods))

    def _node_placement(self, name: str) -> PodSetPlacement:
        level = self.ws.index.levels.node_level
        node_labels = self.ws.labels(name)
        value = node_labels.get(level) if level else None
        if value == NEW_HOSTNAME:
            value = None
        labels = dict(self.ws.index.levels.labels_of(self.ws.index.levels.path(node_labels)))
        if level and value is not None:
            labels[level] = value
        return PodSetPlacement(self.ps.name, level, value, 1, domain_labels=labels)

    def _single_with_new(self, depth: int) -> Outcome | None:
        if self.mode is not Mode.PROVISION:
            return None
        need = self.ps.count
        levels = self.ws.index.levels
        catalogue = self.ws.index.catalogue
        if depth == len(levels.domain):  # node level: one new node holding every pod
            best: Batch | None = None
            for ref in catalogue.by_price:  # the first that holds them is the cheapest
                b = self._batch(ref)
                if b is not None and b.per_node >= need:
                    best = b
                    break
            if best is None:
                return None
            pods = self._commit([], Purchase(((best, 1, need),), best.price, 1))
            return Outcome(pods, self._node_placement(pods[0][0]))
        caps = self.domain_caps(depth)
        best_rank: tuple[float, int, tuple[str, ...]] | None = None
        chosen: Purchase | None = None
        for key, refs in sorted(catalogue.by_domain(depth).items()):
            rest = need - caps.get(key, 0)
            batches = self._scan(refs, rest)
            if not batches:
                continue
            purchase = buy(batches, rest, self._pool_left_of(batches))
            if purchase is None:
                continue
            rank = (purchase.cost, purchase.nodes, key)
            if best_rank is None or rank < best_rank:
                best_rank, chosen = rank, purchase
        if best_rank is None or chosen is None:
            return None
        key = best_rank[2]
        existing = caps.get(key, 0)
        taken = self._fill(self.members(key), existing, depth + 1) if existing else []
        pods = self._commit(taken, chosen)
        return Outcome(pods, self._placement(levels.domain[depth], key, pods))

    def _anywhere(self, *, fewest_nodes: bool, allow_new: bool = True) -> Outcome | None:
        need = self.ps.count
        take = min(need, self.existing_room())
        purchase: Purchase | None = None
        if take < need:
            if not allow_new:
                return None
            scanned = self._scan(self.ws.index.catalogue.by_price, need - take)
            if not scanned:
                return None
            purchase = buy(scanned, need - take, self._pool_left_of(scanned))
            if purchase is None:
                return None
        classes = [cls for cls, _ in self.cands]
        if take == 0:
            existing: list[Take] = []
        elif fewest_nodes:
            # No topology: fewest nodes anywhere, ignoring domains.
            existing = self._fill(classes, take, depth=1 << 20)
        else:
            existing = self._fill(classes, take, depth=0)
        pods = self._commit(existing, purchase)
        topo = self.ps.topology
        if topo.mode is TopologyMode.NONE or topo.level is None:
            return Outcome(pods, self._placement(None, None, pods))
        levels = self.ws.index.levels
        top = levels.domain[0] if levels.domain else levels.node_level
        return Outcome(pods, self._placement(top, None, pods))
