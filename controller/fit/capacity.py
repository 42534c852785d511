"""Booking: take a Plan's usage out of a Snapshot, so two requests never count the same
free capacity and the same pool headroom."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from controller.fit.devices import book
from controller.fit.dra_types import DeviceResult
from controller.fit.ports import unlisted
from controller.fit.types import NodeState, Plan, PoolDomain, PoolState, Snapshot

BookedMemo = dict[str, tuple[NodeState, dict[str, int], NodeState]]
"""Node name -> (node, amounts taken, the node with them taken), from an earlier call."""


def apply_plan(snapshot: Snapshot, plan: Plan, *, memo: BookedMemo | None = None) -> Snapshot:
    """``snapshot`` with the plan's pods taken from their nodes' free capacity and the
    plan's new nodes taken from their pools' headroom (per domain and pool-wide), and the
    plan's DRA device allocations marked as used on their nodes.

    New-node slots are not added as nodes: their leftover capacity stays unbooked until the
    nodes register and show up in the next snapshot. Unknown node or pool names are ignored
    (the object may have gone away since the plan was made).

    ``memo``: a caller applying every booking of the cluster on each planning pass keeps
    this between calls; a node whose state object and booked amounts did not change is then
    not rebuilt. The caller drops entries of nodes that are gone.
    """
    used: dict[str, dict[str, int]] = {}
    devices: dict[str, list[DeviceResult]] = {}
    for a in plan.assignments:
        if a.node is None:
            continue
        for pod in a.devices:
            for claim in pod:
                devices.setdefault(a.node, []).extend(claim.results)
        slot = used.setdefault(a.node, {})
        for res, amount in a.requests.items():
            slot[res] = slot.get(res, 0) + amount * a.pods
    # A plan of new nodes only leaves existing nodes as they are; skipping the walk over
    # every node keeps a planning pass of N such requests O(N), not O(N x nodes).
    if not used:
        nodes = snapshot.nodes
    elif memo is None:
        nodes = tuple(_taken(n, used[n.name]) if n.name in used else n for n in snapshot.nodes)
    else:
        nodes = tuple(
            _remembered(n, used[n.name], memo) if n.name in used else n for n in snapshot.nodes
        )
    if devices:
        nodes = tuple(
            replace(n, devices=book(n.devices, devices[n.name]))
            if n.devices is not None and n.name in devices else n
            for n in nodes
        )
    added: dict[str, list[tuple[Mapping[str, str], int]]] = {}
    for nn in plan.new_nodes:
        added.setdefault(nn.pool, []).append((nn.domain, nn.count))
    pools = tuple(_book_pool(p, added[p.name]) if p.name in added else p for p in snapshot.pools)
    return replace(snapshot, nodes=nodes, pools=pools)


def _remembered(node: NodeState, amounts: dict[str, int], memo: BookedMemo) -> NodeState:
    hit = memo.get(node.name)
    if hit is not None and hit[0] is node and hit[1] == amounts:
        return hit[2]
    booked = _taken(node, amounts)
    memo[node.name] = (node, amounts, booked)
    return booked


def _taken(node: NodeState, amounts: Mapping[str, int]) -> NodeState:
    """``node`` with ``amounts`` taken from its free capacity (a resource it lacks goes
    negative). Built directly: ``dataclasses.replace`` costs several times more, and the
    snapshot applies every booking of the cluster to its nodes on each planning pass."""
    free = dict(node.free)
    for res, amount in amounts.items():
        have = free.get(res)
        free[res] = (unlisted(res) if have is None else have) - amount
    return NodeState(node.name, node.labels, node.taints, node.allocatable, free,
                     node.schedulable, node.pool, node.devices)


def _book_pool(pool: PoolState, added: list[tuple[Mapping[str, str], int]]) -> PoolState:
    total = sum(n for _, n in added)
    if total == 0:
        return pool
    domains: list[PoolDomain] = []
    for d in pool.domains:
        # Dict equality: a pool of hundreds of domains is matched without sorting labels.
        n = sum(count for labels, count in added if labels == d.labels)
        domains.append(
            replace(d, max_new_nodes=max(0, d.max_new_nodes - n), booked_nodes=d.booked_nodes + n)
            if n else d
        )
    return replace(
        pool,
        domains=tuple(domains),
        max_new_nodes=max(0, pool.max_new_nodes - total),
        booked_nodes=pool.booked_nodes + total,
    )
