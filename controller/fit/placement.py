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
from collections.abc import Sequence

from controller.fit.purchase import Batch, Outcome, PoolLeft, Purchase, Take, buy
from controller.fit.shapes import ShapeCounter, pods_that_fit
from controller.fit.topology import NEW_HOSTNAME, fill, within
from controller.fit.types import Mode, PodSetPlacement, PodSetRequest, TopologyMode
from controller.fit.workspace import BaseFit, NodeClass, PoolRef, Workspace, fit_key


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
        # On the base classes of a snapshot (the first pod set of every plan against it) the
        # candidates and per-domain capacities are the same for every plan of this shape.
        self._shared: BaseFit | None = None
        key = fit_key(ps.shape) if ws.usage.pristine and ws.usage.classes else None
        if key is not None:
            shared = ws.index.base_fits.get(key)
            if shared is None:
                shared = ws.index.base_fits[key] = BaseFit(self._candidates(), {})
            self._shared = shared
            self.cands: list[tuple[NodeClass, int]] = shared.cands
        else:
            self.cands = self._candidates()
        self.per_node = {cls.key: c for cls, c in self.cands}
        self._batches: list[Batch] | None = None
        self._per_node: list[int] | None = None
        self._pool_room: dict[int, int] = {}
        self._left: PoolLeft | None = None

    @property
    def batches(self) -> list[Batch]:
        """Every (pool, domain) that can add a node holding a pod of this pod set, in
        catalogue order; built on first use. Choosing the cheapest new capacity does not
        need it (:meth:`_scan` walks the catalogue by price and stops early): only the
        strategies that weigh every domain (slices, explanations) build it."""
        if self._batches is None:
            self._batches = []
            if self.mode is Mode.PROVISION:
                usage = self.ws.usage
                touched = {*usage.pool_used, *usage.pool_booked}
                touched.update(pi for pi, _ in usage.domain_used)
                touched.update(pi for pi, _ in usage.domain_booked)
                # Pools this plan (or a booked one) has not taken from have the headroom
                # of the catalogue's pools: their batches are the catalogue's, per shape.
                fresh = self.ws.index.catalogue.fresh_batches(self.ps.shape, self._fresh_batches)
                if not touched:
                    self._batches = list(fresh)
                else:
                    self._batches = [b for b in fresh if b.ref.pool_index not in touched]
                    for ref in self.ws.index.refs:
                        if ref.pool_index in touched:
                            b = self.batch_of(ref)
                            if b is not None:
                                self._batches.append(b)
                    self._batches.sort(key=lambda b: b.ref.ordinal)
        return self._batches

    def _fresh_batches(self) -> list[Batch]:
        """What every ref can add while nothing is taken from its pool: from the catalogue
        alone, not this workspace, since the catalogue keeps it for every later plan."""
        per_node = self.pool_per_node()
        headroom = self.ws.index.catalogue.fresh_headroom
        out: list[Batch] = []
        for ref in self.ws.index.refs:
            c = per_node[ref.ordinal]
            if c > 0:
                nodes = min(headroom[ref.pool_index], ref.domain.max_new_nodes)
                if nodes > 0:
                    out.append(Batch(ref, c, nodes))
        return out

    def pool_per_node(self) -> list[int]:
        if self._per_node is None:
            counter = self.counter

            def count(ref: PoolRef) -> int:
                return pods_that_fit(counter.shape, ref.pool.allocatable, ref.labels,
                                     ref.pool.taints, devices=ref.pool.devices,
                                     fitter=counter.fitter)

            self._per_node = self.ws.index.catalogue.per_node(self.ps.shape, count)
        return self._per_node

    def batch_of(self, ref: PoolRef) -> Batch | None:
        """What ``ref`` can add for this pod set now, or None (no room, or no pod fits)."""
        per_node = self.pool_per_node()[ref.ordinal]
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

    def most_per_node(self, cap: int) -> int:
        """The most pods of the set one new node can hold now, at most ``cap`` (0 when no
        pool can add a node that holds one): the largest ``per_node`` of :attr:`batches`
        without sizing every (pool, domain); the walk stops at the roomiest ref that can
        still add a node."""
        if self.mode is not Mode.PROVISION:
            return 0
        fits = self.pool_per_node()
        refs = self.ws.index.refs
        for o in self.ws.index.catalogue.roomiest(self.ps.shape, fits):
            if self.batch_of(refs[o]) is not None:
                return min(cap, fits[o])
        return 0

    def cheapest(self, need: int, cap: int | None = None) -> list[Batch]:
        """The batches the cheapest purchase of ``need`` pods anywhere can use, at most
        ``cap`` pods on a node: for :func:`buy`, instead of :attr:`batches`."""
        return self._scan(self.ws.index.catalogue.by_price, need, cap)

    def _scan(self, refs: Sequence[PoolRef], need: int, cap: int | None = None) -> list[Batch]:
        """The batches of ``refs`` (cheapest node first) that the cheapest purchase of
        ``need`` pods can use: a node of a pool priced above the cheapest single-batch way
        found so far cannot be part of a cheaper purchase, so the walk stops there. Nor can a
        ref holding no more pods a node than an earlier batch that holds all ``need`` alone
        (its nodes would do at no more cost): such refs (another zone of the same pool, a
        smaller node at the same price) are not sized."""
        out: list[Batch] = []
        if self.mode is not Mode.PROVISION:
            return out
        best = math.inf
        covered = 0
        fits = self.pool_per_node()
        for ref in refs:
            price = ref.pool.planning_price
            if price > best:
                break
            fit = fits[ref.ordinal]
            if cap is not None and fit > cap:
                fit = cap
            if fit <= covered:
                continue
            b = self.batch_of(ref)
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
                if b.per_node > covered:
                    covered = b.per_node
        return out

    # ------------------------------------------------------------------ helpers

    def pool_left(self) -> PoolLeft:
        """Pool-wide headroom now (a copy to change): the catalogue's, with the pools this
        plan (or a booked one) took from. Kept until the placement commits, like
        :meth:`batch_of`'s pool room: nothing changes the workspace before."""
        if self._left is None:
            usage = self.ws.usage
            taken = {*usage.pool_used, *usage.pool_booked}
            self._left = PoolLeft(self.ws.index.catalogue.fresh_headroom,
                                  {i: self.ws.pool_headroom(i) for i in taken})
        return self._left.copy()

    def _candidates(self) -> list[tuple[NodeClass, int]]:
        """The classes a pod of the set fits on, with how many pods each node holds."""
        cands: list[tuple[NodeClass, int]] = []
        shape = self.ps.shape
        fitter = self.counter.fitter
        # Classes already agree on everything the shape reads except the topology path, so
        # memoise on the class key without it.
        memo: dict[tuple[object, ...], int] = {}
        for cls in self.ws.usage.classes.values():
            k = cls.key
            mkey = (k.free, k.selected, k.taint_token, k.node_name, k.device_token)
            c = memo.get(mkey)
            if c is None:
                c = pods_that_fit(shape, cls.free, cls.labels, cls.taints, node_name=cls.node_name,
                                  devices=cls.devices, fitter=fitter)
                memo[mkey] = c
            if c > 0:
                cands.append((cls, c))
        return cands

    def existing_room(self) -> int:
        return sum(c * len(cls.members) for cls, c in self.cands)

    def domain_caps(self, depth: int) -> dict[tuple[str, ...], int]:
        """Existing capacity per domain at domain-level index ``depth`` (not to be changed:
        it may be shared, see :attr:`WorkspaceIndex.base_fits`)."""
        shared = self._shared
        if shared is not None:
            got = shared.caps.get(depth)
            if got is not None:
                return got
        caps: dict[tuple[str, ...], int] = {}
        for cls, c in self.cands:
            if within(cls.path, depth):
                key = cls.path[: depth + 1]
                caps[key] = caps.get(key, 0) + c * len(cls.members)
        if shared is not None:
            shared.caps[depth] = caps
        return caps

    def members(self, key: tuple[str, ...]) -> list[NodeClass]:
        n = len(key)
        return [cls for cls, _ in self.cands if cls.path[:n] == key]

    def fill_in(self, classes: Sequence[NodeClass], need: int, depth: int) -> list[Take]:
        return fill(
            classes, need, depth, path=lambda x: x.path, per_node=lambda x: self.per_node[x.key],
            nodes=lambda x: len(x.members), name=lambda x: x.first,
        )

    def commit(
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

    def placement_of(
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
        """A pod set without slices or spreads (:func:`controller.fit.strategies.place`
        sends the others to their own strategies)."""
        topo = self.ps.topology
        if topo.mode is TopologyMode.NONE or topo.level is None:
            return self._anywhere(fewest_nodes=True)
        levels = self.ws.index.levels
        depth = levels.index(topo.level)
        if topo.mode is TopologyMode.REQUIRED:
            return self.single_existing(depth) or self.single_with_new(depth)
        # Preferred: one domain at the level, climbing; spread only as a last resort.
        for d in range(depth, -1, -1):
            got = self.single_existing(d)
            if got is not None:
                return got
        got = self._anywhere(fewest_nodes=False, allow_new=False)
        if got is not None:
            return got
        for d in range(depth, -1, -1):
            got = self.single_with_new(d)
            if got is not None:
                return got
        return self._anywhere(fewest_nodes=False)

    def single_existing(self, depth: int) -> Outcome | None:
        need = self.ps.count
        levels = self.ws.index.levels
        if depth == len(levels.domain):  # node level: one node
            fitting = [(c, cls.first, cls) for cls, c in self.cands if c >= need]
            if not fitting:
                return None
            _, _, cls = min(fitting, key=lambda x: x[:2])
            pods = self.commit([(cls, need, 1)], None)
            return Outcome(pods, self._node_placement(pods[0][0]))
        caps = self.domain_caps(depth)
        fitting_keys = [(cap, key) for key, cap in caps.items() if cap >= need]
        if not fitting_keys:
            return None
        _, key = min(fitting_keys)
        pods = self.commit(self.fill_in(self.members(key), need, depth + 1), None)
        return Outcome(pods, self.placement_of(levels.domain[depth], key, pods))

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

    def single_with_new(self, depth: int) -> Outcome | None:
        if self.mode is not Mode.PROVISION:
            return None
        need = self.ps.count
        levels = self.ws.index.levels
        catalogue = self.ws.index.catalogue
        if depth == len(levels.domain):  # node level: one new node holding every pod
            best: Batch | None = None
            for ref in catalogue.by_price:  # the first that holds them is the cheapest
                b = self.batch_of(ref)
                if b is not None and b.per_node >= need:
                    best = b
                    break
            if best is None:
                return None
            pods = self.commit([], Purchase(((best, 1, need),), best.price, 1))
            return Outcome(pods, self._node_placement(pods[0][0]))
        caps = self.domain_caps(depth)
        got = self._cheapest_domain(depth, caps)
        if got is None:
            return None
        key, chosen = got
        existing = caps.get(key, 0)
        taken = self.fill_in(self.members(key), existing, depth + 1) if existing else []
        pods = self.commit(taken, chosen)
        return Outcome(pods, self.placement_of(levels.domain[depth], key, pods))

    def _cheapest_domain(
        self, depth: int, caps: dict[tuple[str, ...], int]
    ) -> tuple[tuple[str, ...], Purchase] | None:
        """The domain at ``depth`` whose new capacity for the pods its existing room
        (``caps``) leaves costs least (then fewest nodes, then the first), and that purchase."""
        need = self.ps.count
        best_rank: tuple[float, int, tuple[str, ...]] | None = None
        chosen: Purchase | None = None
        fits = self.pool_per_node()
        for key, refs in sorted(self.ws.index.catalogue.by_domain(depth).items()):
            rest = need - caps.get(key, 0)
            if best_rank is not None and rest > 0:
                # New capacity here costs at least its cheapest node that holds a pod, in one
                # node at least, and ties go to the earlier domain: a domain whose floor
                # cannot beat the best so far is not priced (so a pod set that one node
                # holds, offered the same pools in every domain, prices the first only).
                floor = next((r.pool.planning_price for r in refs if fits[r.ordinal] > 0),
                             math.inf)
                if (floor, 1) >= best_rank[:2]:
                    continue
            batches = self._scan(refs, rest)
            if not batches:
                continue
            purchase = buy(batches, rest, self.pool_left())
            if purchase is None:
                continue
            rank = (purchase.cost, purchase.nodes, key)
            if best_rank is None or rank < best_rank:
                best_rank, chosen = rank, purchase
        if best_rank is None or chosen is None:
            return None
        return best_rank[2], chosen

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
            purchase = buy(scanned, need - take, self.pool_left())
            if purchase is None:
                return None
        classes = [cls for cls, _ in self.cands]
        if take == 0:
            existing: list[Take] = []
        elif fewest_nodes:
            # No topology: fewest nodes anywhere, ignoring domains.
            existing = self.fill_in(classes, take, depth=1 << 20)
        else:
            existing = self.fill_in(classes, take, depth=0)
        pods = self.commit(existing, purchase)
        topo = self.ps.topology
        if topo.mode is TopologyMode.NONE or topo.level is None:
            return Outcome(pods, self.placement_of(None, None, pods))
        levels = self.ws.index.levels
        top = levels.domain[0] if levels.domain else levels.node_level
        return Outcome(pods, self.placement_of(top, None, pods))
