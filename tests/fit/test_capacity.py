"""Booking a plan: its pods leave their nodes' free capacity, its new nodes the pools'."""

from __future__ import annotations

from controller.fit import Mode, NoFit, Plan, apply_plan, plan
from tests.builders import GPU, Cluster, Gang, PoolB, node


def test_apply_plan_books_nodes_and_pools() -> None:
    snap = (
        Cluster().rack("b0", "r0", hosts=2)
        .pool(PoolB("p").domain("b0", "r0", 3).domain("b0", "r1", 3).max_new(4))
        .snapshot()
    )
    first = plan(Gang("ns/a").pod_set("w", 4, gpu=8, required="rack").build(), snap,
                 Mode.PROVISION)
    assert isinstance(first, Plan)
    booked = apply_plan(snap, first)
    assert [n.free[GPU] for n in booked.nodes] == [0, 0]
    assert [n.free["cpu"] for n in booked.nodes] == [64_000, 64_000]  # untouched resources
    (pool,) = booked.pools
    assert pool.max_new_nodes == 2
    assert [d.max_new_nodes for d in pool.domains] == [1, 3]
    # The same request again cannot reuse what the first one booked.
    second = plan(Gang("ns/b").pod_set("w", 4, gpu=8, required="rack").build(), booked,
                  Mode.PROVISION)
    assert isinstance(second, NoFit)
    assert not second.permanent  # it would fit once the first request's pods are gone


def test_apply_plan_ignores_vanished_objects() -> None:
    snap = Cluster().add(node("a")).snapshot()
    result = plan(Gang().pod_set("w", 1, gpu=8).build(), snap, Mode.CHECK)
    assert isinstance(result, Plan)
    other = Cluster().add(node("b")).snapshot()
    assert apply_plan(other, result) == other
