"""Namespace limits (budgets.namespaces) and what a namespace is charged for."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from controller.acquire.keys import acquisition_key
from controller.commands import objects
from controller.common.topology_defaults import (
    DEFAULT_LEVELS,
    KEY_LABEL,
    OWNER_ANNOTATION,
    POOL_LABEL,
)
from controller.config import MusterConfig
from controller.fit.types import Mode, Plan
from controller.lifecycle import PHASE_ANNOTATION, PLAN_ANNOTATION
from controller.reconcilers.provisioning.service import ProvisioningService
from controller.state.bookings import Booking, Group
from controller.state.cache import ClusterState
from controller.state.planner import Planner, Refusal
from controller.state.requests import RequestRecord
from controller.state.tenancy import Usage, foreign_request_owner
from tests.cluster_objects import gang, plan_on

POOL = objects.gpu_pool("p", price=10.0)  # 8 GPUs, 10/h per node


def _state() -> ClusterState:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.replace_pools([POOL])
    return state


def _service(state: ClusterState, **namespaces: dict[str, Any]) -> ProvisioningService:
    none = cast(Any, None)
    config = MusterConfig(budgets={"namespaces": namespaces})
    return ProvisioningService(kube=none, state=state, planner=none, providers=none,
                               config=config, clock=none)


def _req(namespace: str, name: str, uid: str) -> RequestRecord:
    return RequestRecord.parse({"metadata": {"name": name, "namespace": namespace, "uid": uid}})


def _booking(uid: str, count: int, *, nodes: tuple[str, ...] = ()) -> Booking:
    return Booking(plan=plan_on([], new=count), attempt=1,
                   groups=(Group(acquisition_key(uid, 1, 0), "p", {}, count, nodes),))


def _request_body(namespace: str, name: str, uid: str, booking: Booking, phase: str) -> Any:
    return {"metadata": {
        "name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1",
        "annotations": {PLAN_ANNOTATION: booking.to_annotation(), PHASE_ANNOTATION: phase},
    }}


def _acquired_node(name: str, key: str, owner: str = "") -> Any:
    body = objects.node(name, allocatable={"cpu": "96", objects.GPU: "8"},
                        labels={KEY_LABEL: key, POOL_LABEL: "p"})
    if owner:
        body["metadata"].setdefault("annotations", {})[OWNER_ANNOTATION] = owner
    return body


def test_live_bookings_count_for_their_namespace_only() -> None:
    state = _state()
    state.upsert_request(_request_body("a", "r1", "uid-a1", _booking("uid-a1", 2), "Acquiring"))
    state.upsert_request(_request_body("b", "r1", "uid-b1", _booking("uid-b1", 3), "Acquiring"))
    state.ledger.reserve("a/r2", _booking("uid-a2", 1))  # planned, not persisted yet
    assert state.namespace_usage("a") == Usage(3, 24, 30.0)
    assert state.namespace_usage("b") == Usage(3, 24, 30.0)
    assert state.namespace_usage("c") == Usage()


def test_nodes_outliving_their_booking_still_count() -> None:
    state = _state()
    key = acquisition_key("uid-a1", 1, 0)
    ended = _booking("uid-a1", 2, nodes=("n1", "n2"))
    state.upsert_request(_request_body("a", "r1", "uid-a1", ended, "Ended"))
    state.replace_nodes([_acquired_node("n1", key), _acquired_node("n2", key)])
    assert state.namespace_usage("a") == Usage(2, 16, 20.0)
    # The request is deleted while its pods still run on the nodes: they still cost.
    state.delete_request("a/r1")
    state.prune_vanished(datetime.now(UTC))
    assert state.namespace_usage("a").nodes == 2
    state.delete_node("n1")
    assert state.namespace_usage("a").nodes == 1


def test_a_restarted_controller_attributes_a_deleted_requests_nodes_by_their_owner() -> None:
    state = _state()  # never saw the request
    key = acquisition_key("uid-gone", 1, 0)
    state.replace_nodes([_acquired_node("n1", key, owner="a/r1")])
    assert state.namespace_usage("a").nodes == 1
    assert state.namespace_usage("b").nodes == 0


def test_a_live_booking_and_its_registered_nodes_count_once() -> None:
    state = _state()
    booking = _booking("uid-a1", 2, nodes=("n1", "n2"))
    state.upsert_request(_request_body("a", "r1", "uid-a1", booking, "Acquiring"))
    key = booking.groups[0].key
    state.replace_nodes([_acquired_node("n1", key), _acquired_node("n2", key)])
    assert state.namespace_usage("a").nodes == 2


@pytest.mark.parametrize(("limits", "new", "held", "outcome"), [
    pytest.param({"max_nodes": 4}, 4, 0, "booked", id="at-the-node-limit"),
    pytest.param({"max_nodes": 4}, 5, 0, "refused", id="alone-over-the-node-limit"),
    pytest.param({"max_nodes": 4}, 2, 3, "waits", id="over-beside-what-is-held"),
    pytest.param({"max_gpus": 16}, 3, 0, "refused", id="gpu-limit"),
    pytest.param({"max_cost_per_hour": 25.0}, 2, 1, "waits", id="cost-limit"),
    pytest.param({"max_nodes": 0}, 0, 5, "booked", id="existing-nodes-cost-nothing"),
])
def test_book_against_the_namespace_limits(
    limits: dict[str, Any], new: int, held: int, outcome: str,
) -> None:
    state = _state()
    if held:
        state.upsert_request(_request_body("a", "old", "uid-old", _booking("uid-old", held),
                                           "Acquiring"))
    plan = plan_on(["x"] if not new else [], new=new)
    result = _service(state, a=limits).book(_req("a", "new", "uid-new"), plan, attempt=1)
    if outcome == "booked":
        assert isinstance(result, Booking)
    else:
        assert isinstance(result, Refusal)
        assert result.wait == (outcome == "waits")
        assert "namespace a" in result.text
    # Another namespace is not limited by a's limits.
    other = _service(state, a=limits).book(_req("b", "new", "uid-b"), plan, attempt=1)
    assert isinstance(other, Booking)


async def test_a_burst_in_one_namespace_never_jointly_exceeds_its_limit() -> None:
    state = _state()
    service = _service(state, a={"max_nodes": 5})
    planner = Planner(state)
    planner.start()

    def book(i: int) -> Any:
        return lambda plan: service.book(_req("a", f"r{i}", f"uid-{i}"), plan, 1)

    try:
        results = await asyncio.gather(*(
            planner.plan(f"a/r{i}", gang(f"r{i}", 2), Mode.PROVISION, book(i))
            for i in range(8)
        ))
    finally:
        await planner.stop()
    booked = [r for r in results if isinstance(r, Plan)]
    waiting = [r for r in results if isinstance(r, Refusal)]
    assert all(sum(n.count for n in p.new_nodes) == 2 for p in booked)
    assert len(booked) == 2 and len(waiting) == 6, results
    assert all(r.wait and "holds 4 node(s)" in r.text for r in waiting)
    assert state.namespace_usage("a").nodes == 4


def test_a_template_owned_by_another_request_is_foreign() -> None:
    ref = {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
           "name": "other", "uid": "u-other"}
    assert foreign_request_owner({"ownerReferences": [ref]}, "u-mine") == "other (uid u-other)"
    assert foreign_request_owner({"ownerReferences": [ref]}, "u-other") is None
    workload = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "name": "w",
                "uid": "u-w"}
    assert foreign_request_owner({"ownerReferences": [workload]}, "u-mine") is None
    assert foreign_request_owner({}, "u-mine") is None
