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


def test_apply_plan_changes_only_the_free_capacity_of_used_nodes() -> None:
    from dataclasses import fields, replace

    from controller.fit import Taint, Toleration
    from tests.builders import shape

    used = replace(node("a", rack="r0", free_gpus=8, taints=(Taint("gpu", "", "NoSchedule"),),
                        pool="p5"), schedulable=True)
    snap = Cluster().add(used, node("b", rack="r0")).snapshot()
    wanted = shape(3, selector={"kubernetes.io/hostname": "a"},
                   tolerations=(Toleration("gpu", "Exists"),))
    gang = Gang("g").pod_set("w", 1, pod_shape=wanted).build()
    result = plan(gang, snap, Mode.CHECK)
    assert isinstance(result, Plan)
    after = apply_plan(snap, result).nodes[0]
    assert after.free[GPU] == 5
    for f in fields(after):
        if f.name != "free":
            assert getattr(after, f.name) == getattr(used, f.name), f.name
