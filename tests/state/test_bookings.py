"""Bookings survive a restart (annotation round trip) and hold exactly what is still owed."""

from __future__ import annotations

import pytest

from controller.acquire.keys import acquisition_key, groups_for
from controller.state.bookings import Booking, effective_plan
from tests.cluster_objects import plan_on


def test_booking_round_trips_through_its_annotation() -> None:
    plan = plan_on(["n1", "n2"], new=3)
    booking = Booking(plan, attempt=2, groups=groups_for(plan, owner_uid="u-1", attempt=2))
    again = Booking.from_annotation(booking.to_annotation())
    assert again == booking


@pytest.mark.parametrize("text", ["{", "{}", '{"plan": 1, "attempt": 1}', "[]"])
def test_a_mangled_annotation_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match=r"muster\.dev/plan"):
        Booking.from_annotation(text)


def test_keys_are_deterministic_label_values() -> None:
    key = acquisition_key("0f3c2a8e-1b2c-4d5e-9f00-aabbccddeeff", 12, 3)
    assert key == acquisition_key("0f3c2a8e-1b2c-4d5e-9f00-aabbccddeeff", 12, 3)
    assert len(key) <= 63 and key[0].isalnum() and key[-1].isalnum()
    assert key != acquisition_key("0f3c2a8e-1b2c-4d5e-9f00-aabbccddeeff", 13, 3)


def test_scheduled_pods_leave_the_booking() -> None:
    booking = Booking(plan_on(["n1", "n2"]), attempt=1)
    held = effective_plan(booking, existing={"n1": True, "n2": True}, scheduled_on={"n1": 1})
    assert [(a.node, a.pods) for a in held.assignments] == [("n2", 1)]


def test_new_nodes_become_node_bookings_once_registered() -> None:
    plan = plan_on([], new=2)
    booking = Booking(plan, attempt=1, groups=groups_for(plan, owner_uid="u", attempt=1))
    before = effective_plan(booking, existing={}, scheduled_on={})
    assert before.new_nodes[0].count == 2 and not before.assignments
    key = booking.groups[0].key
    after = effective_plan(
        booking, existing={"a": True, "b": True}, scheduled_on={}, nodes_by_key={key: ["b", "a"]}
    )
    assert not after.new_nodes
    assert sorted(a.node or "" for a in after.assignments) == ["a", "b"]


def test_deleting_a_booked_new_node_wakes_its_request_at_once() -> None:
    """The persisted booking names its groups, not their nodes: the node's acquisition-key
    label ties it to the request. Before this was checked, a vanished node was noticed only
    when the booking was next due (at its expiry), so CapacityRevoked came up to
    ``booking.duration_seconds`` late."""
    from controller.commands import objects
    from controller.common.topology_defaults import DEFAULT_LEVELS, KEY_LABEL, POOL_LABEL
    from controller.lifecycle import PHASE_ANNOTATION, PLAN_ANNOTATION
    from controller.state.cache import ClusterState

    woken: list[str] = []
    state = ClusterState(levels=DEFAULT_LEVELS, notify=woken.append)
    state.replace_pools([objects.gpu_pool("p", price=10.0)])
    plan = plan_on([], new=2)
    booking = Booking(plan, attempt=1, groups=groups_for(plan, owner_uid="uid-1", attempt=1))
    assert booking.acquired_nodes == ()  # as persisted: no node names
    state.upsert_request({"metadata": {
        "name": "r", "namespace": "a", "uid": "uid-1", "resourceVersion": "1",
        "annotations": {PLAN_ANNOTATION: booking.to_annotation(), PHASE_ANNOTATION: "Booked"},
    }})
    key = booking.groups[0].key
    state.replace_nodes([
        objects.node(f"n{i}", allocatable={"cpu": "96", objects.GPU: "8"},
                     labels={KEY_LABEL: key, POOL_LABEL: "p"})
        for i in range(2)
    ] + [objects.node("other", allocatable={"cpu": "96"})])
    woken.clear()

    state.delete_node("other")
    assert woken == []
    state.delete_node("n0")
    assert woken == ["a/r"]


def test_a_groups_nodes_are_known_by_provider_id_whatever_their_names_and_labels() -> None:
    """A cloud node registers under the name its kubelet picks (not necessarily the
    provider's hint) and without Muster's labels: the booking persisted with the launched
    providerIDs still finds it, holds it, and is woken when it goes."""
    from controller.commands import objects
    from controller.common.topology_defaults import DEFAULT_LEVELS
    from controller.lifecycle import PHASE_ANNOTATION, PLAN_ANNOTATION
    from controller.state.cache import ClusterState

    woken: list[str] = []
    state = ClusterState(levels=DEFAULT_LEVELS, notify=woken.append)
    state.replace_pools([objects.gpu_pool("p", price=10.0)])
    plan = plan_on([], new=2)
    booking = Booking(plan, attempt=1, groups=groups_for(plan, owner_uid="uid-1", attempt=1))
    key = booking.groups[0].key
    pids = ["aws:///us-east-1a/i-0a", "aws:///us-east-1a/i-0b"]
    booking = booking.with_nodes({key: ["ip-hint-a", "ip-hint-b"]}, {key: pids})
    again = Booking.from_annotation(booking.to_annotation())
    assert again.groups[0].provider_ids == tuple(pids)
    state.upsert_request({"metadata": {
        "name": "r", "namespace": "a", "uid": "uid-1", "resourceVersion": "1",
        "annotations": {PLAN_ANNOTATION: again.to_annotation(), PHASE_ANNOTATION: "Booked"},
    }})
    nodes = [objects.node(n, allocatable={"cpu": "96", objects.GPU: "8"}) for n in ("i-0a", "i-0b")]
    for body, pid in zip(nodes, pids, strict=True):
        body.setdefault("spec", {})["providerID"] = pid
    stranger = objects.node("i-0c", allocatable={"cpu": "96"})
    stranger.setdefault("spec", {})["providerID"] = "aws:///us-east-1a/i-0c"
    state.replace_nodes([*nodes, stranger])
    assert state.objects.group_node_names(again.groups[0]) == ("i-0a", "i-0b")
    assert {"i-0a", "i-0b"} <= state.booked_nodes()
    assert "i-0c" not in state.booked_nodes()
    woken.clear()
    state.delete_node("i-0c")
    assert woken == []
    state.delete_node("i-0b")
    assert woken == ["a/r"]
    assert state.objects.group_node_names(again.groups[0]) == ("i-0a",)
