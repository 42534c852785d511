"""Buying new nodes for several pod sets of a gang together.

Pod sets are placed one after another, each buying the cheapest new capacity for itself
(:mod:`controller.fit.placement`); a later pod set uses what earlier ones left free on their
new nodes, but every pod set still rounds up to whole nodes of the size that suits it alone.
A gang of many small pod sets then buys many part-empty nodes where one larger node would
hold them all for less.

So once a gang fits, the pod sets that may share nodes (:func:`packable`) and bought new
nodes are sized together: the pods they put on new nodes are packed (first fit, largest
pods first, at most a pod set's per-node limit on one node) into nodes of the pools that
hold them cheapest per unit of the scarcest resource, the last node from the cheapest pool
that holds what it carries, all in one topology domain; the cheapest such purchase is added
to the workspace as empty new nodes before the gang is placed again, which fills them like
any free capacity. The packed plan is kept only when every node bought up front holds pods and the
whole plan costs less than the first one, so packing never makes a plan worse or leaves an
empty node in it.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from functools import partial

from controller.fit.ports import unlisted
from controller.fit.shapes import pods_that_fit
from controller.fit.topology import HOSTNAME, Levels
from controller.fit.types import PodSetRequest, PodShape, Spread, TopologyMode
from controller.fit.workspace import PoolRef, Workspace

MAX_PACKED_NODES = 4096
"""Sizing a purchase by simulation costs a pass over its nodes per pod set: beyond this
many nodes the per-pod-set purchase stands."""


def packable(ps: PodSetRequest, levels: Levels, *, spreads: bool = True) -> bool:
    """A pod set whose pods may share new nodes with the gang's others: no slices, devices or
    named node; a topology level, if any, above the node (the nodes bought up front are all
    in one domain); a spread, if any, that its pod count cannot break or (``spreads``) one
    over its own pods only. A one-per-node limit is honoured by the packing itself."""
    shape, topo = ps.shape, ps.topology
    if topo.slice_level is not None or shape.claims or shape.node_name is not None:
        return False
    if shape.unsupported:
        return False
    if (
        topo.mode is not TopologyMode.NONE
        and topo.level is not None
        and (topo.level not in levels.domain)
    ):
        return False
    return all(ps.count <= s.max_skew or (spreads and _own_spread(s)) for s in shape.spreads)


def _own_spread(spread: Spread) -> bool:
    """A spread over the pod set's own pods only: the nodes bought up front decide its
    domains, and the gang's final check (:func:`controller.fit.spread.spreads_hold`) judges
    the packed plan like any other, so packing cannot make it break."""
    return spread.counts_self and not spread.peers and not spread.running \
        and spread.min_domains <= 1


def even(shape: PodShape) -> bool:
    """A pod set spread over the hostname: every node of the plan is one of its domains, so
    the nodes bought up front must each hold an even share of it (:func:`_even`)."""
    return any(s.key == HOSTNAME for s in shape.spreads)


def first(pod_sets: Sequence[PodSetRequest]) -> tuple[PodSetRequest, ...]:
    """The order the packed gang is placed in: hostname spreads first (each takes an even
    share of every node bought up front, which the sizing reserved), then pod sets with a
    per-node limit, then the rest, which fill the room left."""
    def rank(ps: PodSetRequest) -> int:
        return 0 if even(ps.shape) else 1 if ps.shape.max_per_node else 2
    return tuple(sorted(pod_sets, key=rank))


def new_pods(ws: Workspace, pods: Sequence[tuple[str, int]]) -> int:
    """Pods of an outcome that went to new-node slots."""
    slots = ws.usage.slots
    return sum(n for name, n in pods if name in slots)


def cost(ws: Workspace) -> float:
    """Hourly price of the new nodes a workspace's plan adds."""
    pools = ws.index.pools
    return sum(n * pools[pi].planning_price for (pi, _), n in ws.usage.domain_used.items())


Item = tuple[list[int], int, int]
"""Requests (in the packing's resources order), pod count, most pods on one node."""


def _pack(
    ref: PoolRef, resources: Sequence[str], demand: Sequence[Item], limit: int
) -> list[list[int]] | None:
    """The free amounts (in ``resources`` order) of the nodes of ``ref``'s pool that
    first-fit packing puts ``demand`` on, or None beyond ``limit`` nodes."""
    alloc = [ref.pool.allocatable.get(r, unlisted(r)) for r in resources]

    def share(item: Item) -> float:
        return max((v / a if a > 0 else math.inf) for v, a in zip(item[0], alloc, strict=True))

    nodes: list[list[int]] = []
    for req, count, cap in sorted(demand, key=share, reverse=True):  # largest pods first
        rest = count
        for free in nodes:
            take = min(rest, cap, min(f // v for f, v in zip(free, req, strict=True) if v > 0))
            if take > 0:
                for i, v in enumerate(req):
                    free[i] -= v * take
                rest -= take
                if rest == 0:
                    break
        while rest > 0:
            if len(nodes) >= limit:
                return None
            free = list(alloc)
            take = min(rest, cap, min(f // v for f, v in zip(free, req, strict=True) if v > 0))
            for i, v in enumerate(req):
                free[i] -= v * take
            rest -= take
            nodes.append(free)
    return nodes


def _fits(shape: PodShape, ref: PoolRef) -> int:
    return pods_that_fit(shape, ref.pool.allocatable, ref.labels, ref.pool.taints)


SIMULATED = 8
"""Pools sized by simulation per packing: the cheapest per unit of the gang's scarcest
resource."""

Purchase = tuple[tuple[PoolRef, int], ...]
"""(ref, new nodes) to buy up front."""


def choose(ws: Workspace, demand: Sequence[tuple[PodShape, int]], budget: float) -> Purchase | None:
    """The cheapest purchase found to hold all of ``demand`` for less than ``budget``.

    When one node holds every pod, the cheapest such node. Otherwise pools are ranked by
    their price per unit of the demand's scarcest resource on them; the few best are sized
    by first-fit packing, and the last (least full) node of each
    packing is bought from the cheapest pool that holds what it carries, as a scheduler
    that sizes each new node to its pods would.
    """
    resources = sorted({r for shape, _ in demand for r, v in shape.requests.items() if v > 0})
    if not resources:
        return None
    items = [
        ([shape.requests.get(r, 0) for r in resources], count, shape.max_per_node or count)
        for shape, count in demand
    ]
    totals = [sum(req[i] * count for req, count, _ in items) for i in range(len(resources))]
    spread_out = max(-(-count // cap) for _, count, cap in items)  # nodes a per-node cap needs
    catalogue = ws.index.catalogue
    fits = [catalogue.per_node(shape, partial(_fits, shape)) for shape, _ in demand]
    usable, one = _usable(ws, fits, budget, resources, totals if spread_out <= 1 else None)
    if one is not None:
        # Requests that add up within one node fit it (nothing to fragment): the cheapest
        # node that holds them all is the purchase.
        return ((one, 1),)
    if any(even(shape) for shape, _ in demand):
        return _even(ws, usable, resources, items, budget)
    ranked = _ranked(usable, resources, totals, spread_out)
    best: tuple[float, Purchase] | None = None
    bound = budget
    for ref in ranked[:SIMULATED]:
        price = ref.pool.planning_price
        room = min(ws.headroom(ref), MAX_PACKED_NODES)
        if price > 0:  # all but the last node at this price must cost less than the bound
            room = min(room, math.floor(bound / price) + 1)
        nodes = _pack(ref, resources, items, room)
        if not nodes:
            continue
        full = [ref.pool.allocatable.get(r, unlisted(r)) for r in resources]
        carried = [a - f for a, f in zip(full, nodes[-1], strict=True)]
        same = [u for u in usable if u.path == ref.path]  # the purchase stays in one domain
        last = _smallest(same, resources, carried, ref) or ref
        k = len(nodes)
        buys: Purchase = ((ref, k),) if last is ref else ((ref, k - 1), (last, 1))
        total = sum(r.pool.planning_price * n for r, n in buys if n > 0)
        if total < bound:
            best, bound = (total, tuple((r, n) for r, n in buys if n > 0)), total
    return None if best is None else best[1]


def _ranked(
    usable: Sequence[PoolRef], resources: Sequence[str], totals: Sequence[int], spread_out: int
) -> list[PoolRef]:
    """One ref per pool (another domain of a pool sizes the same), cheapest per unit of the
    scarcest resource first."""
    ranked: list[tuple[float, int, PoolRef]] = []
    seen: set[int] = set()
    for ref in usable:
        if ref.pool_index in seen:
            continue
        seen.add(ref.pool_index)
        alloc = ref.pool.allocatable
        haves = [alloc.get(r, unlisted(r)) for r in resources]
        if min(haves) <= 0:
            continue
        units = max(max(t / h for t, h in zip(totals, haves, strict=True)), spread_out)
        ranked.append((ref.pool.planning_price * units, ref.ordinal, ref))
    ranked.sort(key=lambda x: (x[0], x[1]))
    return [ref for _, _, ref in ranked]


def _usable(
    ws: Workspace, fits: Sequence[Sequence[int]], budget: float, resources: Sequence[str],
    totals: Sequence[int] | None,
) -> tuple[list[PoolRef], PoolRef | None]:
    """The refs priced below ``budget`` that hold a pod of every shape and can add a node,
    cheapest first; with ``totals``, the walk stops at the first that holds them all
    (returned second)."""
    usable: list[PoolRef] = []
    holds: dict[int, bool] = {}  # per pool: its other domains' nodes are the same size
    for ref in ws.index.catalogue.by_price:
        if ref.pool.planning_price >= budget:
            break  # a purchase holds at least one node of a pool it ranks
        o = ref.ordinal
        for f in fits:
            if f[o] <= 0:
                break
        else:
            if ws.headroom(ref) > 0:
                if totals is not None:
                    held = holds.get(ref.pool_index)
                    if held is None:
                        held = holds[ref.pool_index] = _holds(ref, resources, totals)
                    if held:
                        return usable, ref
                usable.append(ref)
    return usable, None


def _holds(ref: PoolRef, resources: Sequence[str], carried: Sequence[int]) -> bool:
    alloc = ref.pool.allocatable
    return all(alloc.get(r, unlisted(r)) >= c for r, c in zip(resources, carried, strict=True))


def _smallest(
    usable: Sequence[PoolRef],
    resources: Sequence[str],
    carried: Sequence[int],
    default: PoolRef | None,
) -> PoolRef | None:
    """The cheapest ref (``usable`` is cheapest first) whose nodes hold ``carried``, if
    cheaper than ``default``."""
    for ref in usable:
        if default is not None and (
            ref.pool.planning_price >= default.pool.planning_price
        ):
            break
        if _holds(ref, resources, carried):
            return ref
    return default


MAX_EVEN_COUNTS = 512
"""Node counts sized for a gang with a hostname spread (the counts where some pod set's
share per node changes, fewest nodes first)."""


def _even(
    ws: Workspace, usable: Sequence[PoolRef], resources: Sequence[str], items: Sequence[Item],
    budget: float,
) -> Purchase | None:
    """N nodes of one ref, each holding an even share of every pod set (``ceil(count / N)``
    pods of each): what a hostname spread needs, since every node of the plan is a domain
    of it and must hold within maxSkew of the fewest. The cheapest N found below ``budget``.

    A node must hold the largest share of each pod set at once (the shares' remainders may
    fall on the same nodes), so the bundle sized per N is the sum of the rounded-up shares.
    """
    if not usable:
        return None
    fewest = max(-(-count // cap) for _, count, cap in items)
    most = max(fewest, max(count for _, count, _ in items))
    counts: set[int] = set()
    for _, count, _ in items:
        # ceil(count / N) changes at N = ceil(count / s) for s = 1, 2, ...: only there can a
        # node count need a smaller node than the count before it.
        share = 1
        while share <= count:
            n = -(-count // share)
            if fewest <= n <= most:
                counts.add(n)
            share = -(-count // (n - 1)) if n > 1 else count + 1
    counts.add(fewest)
    prices = [ref.pool.planning_price for ref in usable]
    # The least any ref must cost per unit of each resource: a ref that holds a bundle costs
    # at least the bundle's units at that price, so the walk starts there.
    unit = [min((r.pool.planning_price / a for r in usable
                 if (a := r.pool.allocatable.get(res, unlisted(res))) > 0), default=0.0)
            for res in resources]
    best: tuple[float, Purchase] | None = None
    bound = budget
    for n in sorted(counts)[:MAX_EVEN_COUNTS]:
        bundle = [0] * len(resources)
        for req, count, _ in items:
            share = -(-count // n)
            for i, v in enumerate(req):
                bundle[i] += v * share
        floor = max(b * u for b, u in zip(bundle, unit, strict=True))
        if n * floor >= bound:
            continue
        for i in range(bisect_left(prices, floor * (1 - 1e-9)), len(usable)):
            ref = usable[i]
            price = prices[i]
            if n * price >= bound:
                break
            alloc = ref.pool.allocatable
            if all(alloc.get(r, unlisted(r)) >= b for r, b in zip(resources, bundle, strict=True)) \
                    and ws.headroom(ref) >= n:
                best, bound = (n * price, ((ref, n),)), n * price
                break
    return None if best is None else best[1]
