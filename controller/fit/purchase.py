"""What a placement buys and returns: new-node batches, purchases and the cheapest purchase
of new nodes for a count of pods (:func:`buy`).

Shared by every placement strategy (:mod:`controller.fit.placement` for plain pod sets,
:mod:`controller.fit.slices`, :mod:`controller.fit.spread`) and by the explanations, so it
depends on the workspace's records only, never on a strategy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, overload

from controller.fit.types import PodSetPlacement
from controller.fit.workspace import NodeClass, PoolRef

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Batch:
    """New nodes a (pool, domain) can add for this pod set: ``per_node`` pods each."""

    ref: PoolRef
    per_node: int
    nodes: int
    price: float = field(init=False)
    """The pool's price per node-hour (kept: purchases sort and walk many batches)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "price", self.ref.pool.planning_price)


class PoolLeft(dict[int, int]):
    """Pool-wide headroom (new nodes each pool may still add), by pool index: the
    catalogue's headroom while nothing is taken (``base``, shared, never changed) under
    this purchase's own changes. Only the pools read or changed are held, so copying one
    to try a purchase costs the pools it touches, not the catalogue's size. Read it by
    index (``left[i]``): a pool not held yet is read from ``base``."""

    __slots__ = ("_base",)

    def __init__(self, base: Mapping[int, int], own: Mapping[int, int] | None = None) -> None:
        super().__init__(own or {})
        self._base = base

    def __missing__(self, pool_index: int) -> int:
        left = self[pool_index] = self._base.get(pool_index, 0)
        return left

    @overload
    def get(self, pool_index: int, default: None = None, /) -> int | None: ...
    @overload
    def get(self, pool_index: int, default: int, /) -> int: ...
    @overload
    def get(self, pool_index: int, default: T, /) -> int | T: ...
    def get(self, pool_index: int, default: object = None, /) -> object:
        """As ``left[pool_index]``: every pool has a headroom (``dict.get`` would miss
        the pools not held yet)."""
        return self[pool_index]

    def copy(self) -> PoolLeft:
        return PoolLeft(self._base, self)


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


def one_batch_nodes(b: Batch, need: int, pool_left: PoolLeft) -> int | None:
    """New nodes of ``b`` holding ``need`` (> 0) pods, or None when its room is short."""
    if min(b.nodes, pool_left[b.ref.pool_index]) * b.per_node < need:
        return None
    return -(-need // b.per_node)


def buy(batches: Sequence[Batch], need: int, pool_left: PoolLeft) -> Purchase | None:
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
        pool_left[b.ref.pool_index] = pool_left[b.ref.pool_index] - k
        return Purchase(((b, k, need),), k * b.price, k)
    ordered = sorted(batches, key=lambda b: (b.price / b.per_node, b.price,
                                             not b.ref.pool.reserved, b.ref.sort_name))
    n = len(ordered)
    # The finishing candidates of a step cost at least what has been spent plus one node, so
    # walking them cheapest node first stops at the first price that cannot beat the best
    # found; ties keep the earliest in ``ordered``, as a walk over all of them would.
    cheap = sorted(range(n), key=lambda i: ordered[i].price)
    left = [b.nodes for b in ordered]
    pools = pool_left.copy()
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
        while first < n and min(left[first], pools[ordered[first].ref.pool_index]) <= 0:
            first += 1
        if first == n:
            break
        b = ordered[first]
        k = min(left[first], pools[b.ref.pool_index])
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
        pool_left[b.ref.pool_index] = pool_left[b.ref.pool_index] - k
    return Purchase(takes, best[0][0], best[0][1])


def _finish(
    ordered: Sequence[Batch], cheap: Sequence[int], left: Sequence[int], pools: PoolLeft,
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
        room = min(left[i], pools[b.ref.pool_index])
        if room * b.per_node >= rem:
            k = -(-rem // b.per_node)
            rank = (spent + k * b.price, nodes_so_far + k)
            if step is None or (rank, i) < (step[0], step[1]):
                step = (rank, i, k)
    return step


Take = tuple[NodeClass, int, int]
"""(class, pods per node, nodes)."""
