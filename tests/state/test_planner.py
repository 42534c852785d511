"""The single planner: requests planned in one pass never share free capacity."""

from __future__ import annotations

import asyncio

from controller.common.conditions import Reason
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.fit.types import Mode, NoFit, Plan
from controller.state.bookings import Booking
from controller.state.cache import ClusterState
from controller.state.ledger import BookingLedger
from controller.state.planner import Planner, Refusal
from tests.cluster_objects import gang, gpu_node


async def _planned(state: ClusterState, names: list[str], workers: int) -> list[object]:
    planner = Planner(state)
    planner.start()
    try:
        return list(await asyncio.gather(*(
            planner.plan(n, gang(n, workers), Mode.CHECK, lambda p: Booking(p, attempt=1))
            for n in names
        )))
    finally:
        await planner.stop()


async def test_concurrent_requests_never_count_the_same_capacity() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_nodes([gpu_node(f"n{i}") for i in range(4)])
    results = await _planned(state, ["a", "b", "c"], 2)
    plans = [r for r in results if isinstance(r, Plan)]
    assert len(plans) == 2 and sum(isinstance(r, NoFit) for r in results) == 1
    used = [a.node for p in plans for a in p.assignments]
    assert len(used) == len(set(used)) == 4
    assert set(state.ledger.bookings()) == {"a", "b", "c"} - {
        n for n, r in zip(["a", "b", "c"], results, strict=True) if isinstance(r, NoFit)
    }


async def test_a_refused_plan_books_nothing() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_nodes([gpu_node(f"n{i}") for i in range(2)])
    planner = Planner(state)
    planner.start()
    try:
        refused = await planner.plan("a", gang("a", 2), Mode.CHECK,
                                     lambda p: Refusal(Reason.OVER_BUDGET, "over budget"))
        assert refused == Refusal(Reason.OVER_BUDGET, "over budget")
        assert not state.ledger.bookings()
        second = await planner.plan("b", gang("b", 2), Mode.CHECK, lambda p: Booking(p, 1))
        assert isinstance(second, Plan)
    finally:
        await planner.stop()


def test_booked_capacity_is_missing_from_the_next_snapshot() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_nodes([gpu_node("n0"), gpu_node("n1")])
    free_before = [n.free["nvidia.com/gpu"] for n in state.snapshot().nodes]
    from tests.cluster_objects import plan_on

    state.ledger.reserve("x", Booking(plan_on(["n0"]), attempt=1))
    after = {n.name: n.free["nvidia.com/gpu"] for n in state.snapshot().nodes}
    assert free_before == [8, 8] and after == {"n0": 0, "n1": 8}
    assert {n.name: n.free["nvidia.com/gpu"] for n in state.snapshot(exclude="x").nodes} == {
        "n0": 8, "n1": 8
    }


def test_pool_headroom_follows_node_registration_relabeling_and_deletion() -> None:
    from controller.commands import objects
    from controller.common.topology_defaults import POOL_LABEL

    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([objects.gpu_pool("gpu", blocks=1, racks_per_block=2, nodes_per_rack=4,
                                          max_nodes=6)])
    state.replace_nodes([])

    def headroom() -> tuple[int, dict[str, int]]:
        (pool,) = state.snapshot().pools
        return pool.max_new_nodes, {d.labels[objects.RACK]: d.max_new_nodes
                                    for d in pool.domains}

    assert headroom() == (6, {"b1-r1": 4, "b1-r2": 4})
    node = gpu_node("a", rack="b1-r1", **{POOL_LABEL: "gpu"})
    state.upsert_node(node)
    assert headroom() == (5, {"b1-r1": 3, "b1-r2": 4})
    # A status-only update (a heartbeat) changes nothing.
    state.upsert_node({**node, "status": {**node["status"], "conditions": []}})
    assert headroom() == (5, {"b1-r1": 3, "b1-r2": 4})
    # Relabeled into the other rack: the count moves with it.
    moved = gpu_node("a", rack="b1-r2", **{POOL_LABEL: "gpu"})
    state.upsert_node(moved)
    assert headroom() == (5, {"b1-r1": 4, "b1-r2": 3})
    # No longer the pool's node, then gone.
    state.upsert_node(gpu_node("a", rack="b1-r2"))
    assert headroom() == (6, {"b1-r1": 4, "b1-r2": 4})
    state.upsert_node(moved)
    state.delete_node("a")
    assert headroom() == (6, {"b1-r1": 4, "b1-r2": 4})


def test_nodes_of_an_acquisition_not_yet_confirmed_are_offered_to_nobody_else() -> None:
    """Found by the crash harness on the real control plane: a request booked the spare
    capacity of nodes whose acquisition was resumed after a crash; the resumed attempt
    failed and rolled back, deleting the nodes under that live booking."""
    import json

    from controller.common.topology_defaults import KEY_LABEL
    from controller.state.bookings import Group

    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_nodes([gpu_node("n0", **{KEY_LABEL: "k1"}), gpu_node("n1")])
    from tests.cluster_objects import plan_on

    booking = Booking(plan_on(["n0"]), attempt=1,
                      groups=(Group(key="k1", pool="p", domain={}, count=1),))
    body = {"metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                         "annotations": {"muster.dev/phase": "Acquiring",
                                         "muster.dev/plan": booking.to_annotation()}},
            "spec": {}, "status": {"conditions": []}}
    state.upsert_request(json.loads(json.dumps(body)))
    schedulable = {n.name: n.schedulable for n in state.snapshot(exclude="ns/b").nodes}
    assert schedulable == {"n0": False, "n1": True}
    body["metadata"]["resourceVersion"] = "2"
    body["status"]["conditions"] = [{"type": "Provisioned", "status": "True"}]
    state.upsert_request(body)
    assert all(n.schedulable for n in state.snapshot(exclude="ns/b").nodes), \
        "once Provisioned=True, its spare capacity is anyone's (release_unused protects it)"


def test_nodes_being_released_are_offered_to_no_plan() -> None:
    """Found by the crash harness: a request planned onto the nodes of a group while their
    release was in flight got Provisioned=True on nodes deleted a moment later."""
    from controller.common.topology_defaults import KEY_LABEL

    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_nodes([gpu_node("n0", **{KEY_LABEL: "k2"}), gpu_node("n1")])
    mine = state.ledger.start_release({"k2"})
    assert {n.name: n.schedulable for n in state.snapshot().nodes} == {"n0": False, "n1": True}
    state.ledger.end_release(mine, released=())
    assert all(n.schedulable for n in state.snapshot().nodes)


async def test_release_groups_holds_the_keys_while_it_deletes() -> None:
    from controller.acquire.groups import release_groups
    from controller.state.bookings import Group

    seen: list[set[str]] = []
    ledger = BookingLedger()

    class Provider:
        async def release(self, pool: object, key: str) -> int:
            seen.append(set(ledger.releasing_keys()))
            await asyncio.sleep(0)
            return 1

    count = await release_groups([Group(key="k", pool="p", domain={}, count=1)],
                                 pools={"p": object()},  # type: ignore[dict-item]
                                 provider_for=lambda pool: Provider(),  # type: ignore[arg-type,return-value]
                                 ledger=ledger)
    assert count == 1 and seen == [{"k"}] and ledger.releasing_keys() == set()


async def test_released_nodes_are_offered_to_no_plan_until_the_cache_sees_them_go() -> None:
    """Found by the fault storm on the real tier: a rollback deleted a group's nodes, the
    node watch (cut by the storm) had not reported it yet, and the retry booked one of them
    as an existing node: Provisioned=True on a node deleted a moment before."""
    from controller.acquire.groups import release_groups
    from controller.common.topology_defaults import KEY_LABEL
    from controller.state.bookings import Group

    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_nodes([gpu_node("n0", **{KEY_LABEL: "k"}), gpu_node("n1")])

    class Provider:
        async def release(self, pool: object, key: str) -> int:
            return 1

    await release_groups([Group(key="k", pool="p", domain={}, count=1)],
                         pools={"p": object()},  # type: ignore[dict-item]
                         provider_for=lambda pool: Provider(),  # type: ignore[arg-type,return-value]
                         ledger=state.ledger)
    assert state.ledger.releasing_keys() == set()
    assert {n.name: n.schedulable for n in state.snapshot().nodes} == {"n0": False, "n1": True}
    state.replace_nodes([gpu_node("n1")])  # the watch reports the deletion
    assert all(n.schedulable for n in state.snapshot().nodes)
    assert state.ledger.released_keys() == set()
