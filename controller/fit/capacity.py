"""Booking: take a Plan's usage out of a Snapshot, so two requests never count the same
free capacity and the same pool headroom."""

from __future__ import annotations

from dataclasses import replace

from controller.fit.types import Plan, PoolDomain, PoolState, Snapshot


def apply_plan(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """``snapshot`` with the plan's pods taken from their nodes' free capacity and the
    plan's new nodes taken from their pools' headroom (per domain and pool-wide).

    New-node slots are not added as nodes: their leftover capacity stays unbooked until the
    nodes register and show up in the next snapshot. Unknown node or pool names are ignored
    (the object may have gone away since the plan was made).
    """
    used: dict[str, dict[str, int]] = {}
    for a in plan.assignments:
        if a.node is None:
            continue
        slot = used.setdefault(a.node, {})
        for res, amount in a.requests.items():
            slot[res] = slot.get(res, 0) + amount * a.pods
    nodes = tuple(
        replace(n, free={r: v - used[n.name].get(r, 0) for r, v in
                         {**{k: 0 for k in used[n.name]}, **n.free}.items()})
        if n.name in used
        else n
        for n in snapshot.nodes
    )
    added: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    per_pool: dict[str, int] = {}
    for nn in plan.new_nodes:
        key = (nn.pool, tuple(sorted(nn.domain.items())))
        added[key] = added.get(key, 0) + nn.count
        per_pool[nn.pool] = per_pool.get(nn.pool, 0) + nn.count
    pools = tuple(_book_pool(p, added, per_pool.get(p.name, 0)) for p in snapshot.pools)
    return replace(snapshot, nodes=nodes, pools=pools)


def _book_pool(
    pool: PoolState, added: dict[tuple[str, tuple[tuple[str, str], ...]], int], total: int
) -> PoolState:
    if total == 0:
        return pool
    domains: list[PoolDomain] = []
    for d in pool.domains:
        n = added.get((pool.name, tuple(sorted(d.labels.items()))), 0)
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
