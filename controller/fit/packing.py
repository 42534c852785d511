"""Buying new nodes for several pod sets of a gang together.

Pod sets are placed one after another, each buying the cheapest new capacity for itself
(:mod:`controller.fit.placement`); a later pod set uses what earlier ones left free on their
new nodes, but every pod set still rounds up to whole nodes of the size that suits it alone.
A gang of many small pod sets then buys many part-empty nodes where one larger node would
hold them all for less.

So once a gang fits, the pod sets free to go anywhere (no topology level, spread, slices,
one-per-node limit, devices or named node) that bought new nodes are sized together: the
pods they put on new nodes are packed (first fit, largest pods first) into nodes of each
pool in turn, cheapest node first, and the cheapest such purchase is added to the workspace
as empty new nodes before the gang is placed again. The placer then fills them like any free
capacity. The packed plan is kept only when every node bought up front holds pods and the
whole plan costs less than the first one, so packing never makes a plan worse or leaves an
empty node in it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

from controller.fit.ports import unlisted
from controller.fit.shapes import pods_that_fit
from controller.fit.types import PodSetRequest, PodShape, TopologyMode
from controller.fit.workspace import PoolRef, Workspace

MAX_PACKED_NODES = 4096
"""Sizing a purchase by simulation costs a pass over its nodes per pod set: beyond this
many nodes the per-pod-set purchase stands."""


def packable(ps: PodSetRequest) -> bool:
    """A pod set whose pods may go to any node that fits them."""
    shape, topo = ps.shape, ps.topology
    return (
        (topo.mode is TopologyMode.NONE or topo.level is None)
        and topo.slice_level is None
        and shape.spread is None
        and shape.max_per_node is None
        and not shape.claims
        and shape.node_name is None
        and not shape.unsupported
    )


def new_pods(ws: Workspace, pods: Sequence[tuple[str, int]]) -> int:
    """Pods of an outcome that went to new-node slots."""
    slots = ws.usage.slots
    return sum(n for name, n in pods if name in slots)


def cost(ws: Workspace) -> float:
    """Hourly price of the new nodes a workspace's plan adds."""
    pools = ws.index.pools
    return sum(n * pools[pi].price_per_node_hour for (pi, _), n in ws.usage.domain_used.items())


def _nodes_for(
    ref: PoolRef, resources: Sequence[str], demand: Sequence[tuple[list[int], int]], limit: int
) -> int | None:
    """Nodes of ``ref``'s pool that first-fit packing puts ``demand`` (requests in
    ``resources`` order, pod count) on, or None beyond ``limit`` nodes."""
    alloc = [ref.pool.allocatable.get(r, unlisted(r)) for r in resources]

    def share(item: tuple[list[int], int]) -> float:
        return max((v / a if a > 0 else math.inf) for v, a in zip(item[0], alloc, strict=True))

    nodes: list[list[int]] = []
    for req, count in sorted(demand, key=share, reverse=True):  # largest pods first
        rest = count
        for free in nodes:
            take = min(rest, min(f // v for f, v in zip(free, req, strict=True) if v > 0))
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
            take = min(rest, min(f // v for f, v in zip(free, req, strict=True) if v > 0))
            for i, v in enumerate(req):
                free[i] -= v * take
            rest -= take
            nodes.append(free)
    return len(nodes)


def _fits(shape: PodShape, ref: PoolRef) -> int:
    return pods_that_fit(shape, ref.pool.allocatable, ref.labels, ref.pool.taints)


SIMULATED = 8
"""Pools sized by simulation per packing: the cheapest by the resource lower bound."""


def choose(
    ws: Workspace, demand: Sequence[tuple[PodShape, int]], budget: float
) -> tuple[PoolRef, int] | None:
    """The cheapest (ref, nodes) found to hold all of ``demand`` for less than ``budget``:
    every ref ranked by the nodes its pool needs for the summed requests (a lower bound),
    the few cheapest by that bound sized by first-fit packing."""
    resources = sorted({r for shape, _ in demand for r, v in shape.requests.items() if v > 0})
    if not resources:
        return None
    items = [([shape.requests.get(r, 0) for r in resources], count) for shape, count in demand]
    totals = [sum(req[i] * count for req, count in items) for i in range(len(resources))]
    catalogue = ws.index.catalogue
    fits = [
        catalogue.per_node(shape, partial(_fits, shape)) for shape, _ in demand
    ]
    ranked: list[tuple[float, int, PoolRef]] = []
    for ref in catalogue.by_price:
        price = ref.pool.price_per_node_hour
        if price >= budget:
            break
        if any(f[ref.ordinal] <= 0 for f in fits):
            continue
        alloc = ref.pool.allocatable
        lower = 1
        for r, total in zip(resources, totals, strict=True):
            have = alloc.get(r, unlisted(r))
            if have <= 0:
                lower = 0
                break
            lower = max(lower, -(-total // have))
        if lower and lower * price < budget:
            ranked.append((lower * price, ref.ordinal, ref))
    ranked.sort(key=lambda x: (x[0], x[1]))
    best: tuple[float, PoolRef, int] | None = None
    bound = budget
    for _, _, ref in ranked[:SIMULATED]:
        price = ref.pool.price_per_node_hour
        room = min(ws.headroom(ref), MAX_PACKED_NODES)
        if price > 0:
            room = min(room, math.ceil(bound / price) - 1)
        if room <= 0:
            continue
        k = _nodes_for(ref, resources, items, room)
        if k is not None and k * price < bound:
            best, bound = (k * price, ref, k), k * price
    return None if best is None else (best[1], best[2])
