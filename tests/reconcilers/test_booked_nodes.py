"""A booked existing node that stops being one the gang's pods can be scheduled on (a taint
they do not tolerate, a cordon, a label their selector or booked domain needs) revokes the
booking (``BookedNodesUnusable``); what the scheduler would still accept does not
(controller/reconcilers/provisioning/booking.py ``_unusable_for``), and the node's change
reaches the booking through the node watch (controller/state/cache.py)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.api.node import Node
from controller.commands import objects
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.fit.types import PodShape, Toleration
from controller.lifecycle import PHASE_ANNOTATION, PLAN_ANNOTATION
from controller.reconcilers.provisioning.booking import _unusable_for
from controller.state.bookings import Booking
from controller.state.cache import ClusterState
from tests.cluster_objects import gpu_node, plan_on

SHAPE = PodShape(
    requests={"cpu": 1000},
    node_selector={"team": "a"},
    tolerations=(Toleration(key=objects.GPU, operator="Exists", effect="NoSchedule"),),
)
DOMAIN = {objects.BLOCK: "b1", objects.RACK: "b1-r1"}


def _node(**changes: Any) -> Node:
    body = gpu_node("n1", team="a")
    for key, value in changes.items():
        if key == "taints":
            body["spec"]["taints"] = [objects.GPU_TAINT, *value]
        elif key == "unschedulable":
            body["spec"]["unschedulable"] = value
        elif key == "labels":
            body["metadata"]["labels"].update(value)
            body["metadata"]["labels"] = {
                k: v for k, v in body["metadata"]["labels"].items() if v is not None
            }
        elif key == "ready":
            body["status"]["conditions"][0]["status"] = "True" if value else "False"
    return Node.model_validate(body)


STILL_USABLE: dict[str, dict[str, Any]] = {
    "unchanged": {},
    "tolerated taint": {"taints": [{"key": objects.GPU, "value": "x", "effect": "NoSchedule"}]},
    "soft taint": {"taints": [{"key": "example.com/soon", "effect": "PreferNoSchedule"}]},
    # The lifecycle controller lifts a condition's taint when the condition clears.
    "not ready for a moment": {
        "ready": False,
        "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}],
    },
    "an unrelated label": {"labels": {"other": "x"}},
}


@pytest.mark.parametrize("case", sorted(STILL_USABLE))
def test_what_the_scheduler_still_accepts_keeps_the_booking(case: str) -> None:
    assert _unusable_for(SHAPE, _node(**STILL_USABLE[case]), DOMAIN) is None


UNUSABLE: dict[str, tuple[dict[str, Any], str]] = {
    "untolerated NoSchedule": (
        {"taints": [{"key": "example.com/maint", "value": "1", "effect": "NoSchedule"}]},
        "taint example.com/maint=1:NoSchedule not tolerated",
    ),
    "untolerated NoExecute": (
        {"taints": [{"key": "example.com/drain", "effect": "NoExecute"}]},
        "taint example.com/drain:NoExecute not tolerated",
    ),
    "cordoned": ({"unschedulable": True}, "cordoned"),
    "selector label removed": ({"labels": {"team": None}}, "no longer match the node selector"),
    "booked rack relabelled": ({"labels": {objects.RACK: "b1-r9"}},
                               f"label {objects.RACK} is no longer 'b1-r1'"),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_a_node_the_pods_can_no_longer_use_is_named_with_why(case: str) -> None:
    changes, words = UNUSABLE[case]
    why = _unusable_for(SHAPE, _node(**changes), DOMAIN)
    assert why is not None and words in why, why


def test_pods_that_tolerate_the_cordon_keep_it() -> None:
    shape = PodShape(requests={}, node_selector={"team": "a"}, tolerations=(
        Toleration(operator="Exists"),))
    assert _unusable_for(shape, _node(unschedulable=True), DOMAIN) is None


def test_pods_bound_by_name_mind_only_no_execute() -> None:
    """Pods naming their node skip the scheduler: the kubelet admits them under any
    NoSchedule taint or cordon."""
    shape = PodShape(requests={}, node_selector={"team": "a"}, node_name="n1")
    assert _unusable_for(shape, _node(unschedulable=True), DOMAIN) is None
    why = _unusable_for(shape, _node(taints=[{"key": "x", "effect": "NoExecute"}]), DOMAIN)
    assert why is not None and "NoExecute" in why


def test_a_booked_nodes_change_wakes_its_request() -> None:
    woken: list[str] = []
    state = ClusterState(levels=DEFAULT_LEVELS, notify=woken.append)
    state.replace_nodes([gpu_node("n1", team="a"), gpu_node("n2", team="a")])
    booking = Booking(plan_on(["n1"]), attempt=1)
    state.upsert_request({"metadata": {
        "name": "r", "namespace": "a", "uid": "uid-1", "resourceVersion": "1",
        "annotations": {PLAN_ANNOTATION: booking.to_annotation(), PHASE_ANNOTATION: "Booked"},
    }})
    woken.clear()

    heartbeat = gpu_node("n1", team="a")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z"
    state.upsert_node(heartbeat)
    tainted_other = gpu_node("n2", team="a")
    tainted_other["spec"]["unschedulable"] = True
    state.upsert_node(tainted_other)
    assert woken == []

    cordoned = gpu_node("n1", team="a")
    cordoned["spec"]["unschedulable"] = True
    state.upsert_node(cordoned)
    assert woken == ["a/r"]
