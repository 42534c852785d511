"""Host ports (the scheduler's NodePorts filter) as synthetic resources."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from controller.api.node import Node
from controller.api.pod import Pod, PodSpec
from controller.fit import (
    GangRequest,
    Mode,
    NoFit,
    Plan,
    PodSetRequest,
    PoolDomain,
    PoolState,
    Snapshot,
    apply_plan,
    plan,
)
from controller.fit.ports import port_resources, unlisted
from controller.fit.shapes import resource_fit
from controller.inputs.snapshot import build_snapshot, shape_of
from tests.builders import LEVELS

IPS = ["", "0.0.0.0", "10.0.0.1", "10.0.0.2"]


def conflict(a: tuple[str, str, int], b: tuple[str, str, int]) -> bool:
    """The scheduler's HostPortInfo.CheckConflict for one claim against one other."""
    wild = {"", "0.0.0.0"}
    if a[0] != b[0] or a[2] != b[2]:
        return False
    return a[1] in wild or b[1] in wild or a[1] == b[1]


claims = st.tuples(st.sampled_from(["TCP", "UDP"]), st.sampled_from(IPS),
                   st.sampled_from([80, 443]))


@given(st.lists(claims, max_size=4, unique=True), st.lists(claims, min_size=1, max_size=3,
                                                            unique=True))
def test_resources_conflict_exactly_when_the_scheduler_says(
    used: list[tuple[str, str, int]], want: list[tuple[str, str, int]]
) -> None:
    free: dict[str, int] = {}
    for res, amount in port_resources(used).items():
        free[res] = free.get(res, unlisted(res)) - amount
    if any(v < 0 for v in free.values()) or any(
        conflict(a, b) for i, a in enumerate(want) for b in want[i + 1:]
    ):
        return  # claims that conflict among themselves: no pod gets them (kubelet)
    expected = not any(conflict(w, u) for w in want for u in used)
    assert (resource_fit(port_resources(want), free) > 0) == expected


def spec(ports: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c", "ports": ports,
                            "resources": {"requests": {"cpu": "1"}}}], **extra}


def k8s_node(name: str) -> Node:
    return Node.model_validate({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "16", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })


def gang(count: int, ports: list[dict[str, Any]], **extra: Any) -> GangRequest:
    shape = shape_of(PodSpec.model_validate(spec(ports, **extra)))
    return GangRequest("ns/g", (PodSetRequest("w", count, shape),))


def test_one_pod_per_node_with_a_host_port() -> None:
    snap = build_snapshot([k8s_node("a"), k8s_node("b")], levels=LEVELS)
    port = [{"containerPort": 80, "hostPort": 8080}]
    got = plan(gang(2, port), snap, Mode.CHECK)
    assert isinstance(got, Plan)
    assert sorted((a.node, a.pods) for a in got.assignments) == [("a", 1), ("b", 1)]
    assert isinstance(plan(gang(3, port), snap, Mode.CHECK), NoFit)
    # Without the host port the three pods fit on one node.
    assert isinstance(plan(gang(3, [{"containerPort": 80}]), snap, Mode.CHECK), Plan)


def test_bound_pods_hold_their_ports() -> None:
    bound = Pod.model_validate({"metadata": {"name": "x"}, "status": {"phase": "Running"},
                                "spec": {**spec([{"containerPort": 1, "hostPort": 8080}]),
                                         "nodeName": "a"}})
    snap = build_snapshot([k8s_node("a"), k8s_node("b")], [bound], levels=LEVELS)
    port = [{"containerPort": 80, "hostPort": 8080}]
    got = plan(gang(1, port), snap, Mode.CHECK)
    assert isinstance(got, Plan)
    assert got.assignments[0].node == "b"
    assert isinstance(plan(gang(2, port), snap, Mode.CHECK), NoFit)
    # Another protocol, or another IP of the port on a node where an IP is held: free.
    assert isinstance(plan(gang(2, [{"containerPort": 80, "hostPort": 8080,
                                     "protocol": "UDP"}]), snap, Mode.CHECK), Plan)


def test_host_network_claims_the_container_ports() -> None:
    snap = build_snapshot([k8s_node("a")], levels=LEVELS)
    assert isinstance(plan(gang(2, [{"containerPort": 80}], hostNetwork=True), snap,
                           Mode.CHECK), NoFit)


def test_sidecars_claim_their_host_ports_and_init_containers_do_not() -> None:
    """k8s ``schedutil.GetHostPorts``: sidecars (restartPolicy Always) run for the pod's
    whole life and hold their ports; ordinary init containers have exited (found reading
    the scheduler's code when the oracle's cases gained sidecars)."""
    snap = build_snapshot([k8s_node("a")], levels=LEVELS)
    port = [{"containerPort": 80, "hostPort": 8082}]
    sidecar = {"name": "s", "restartPolicy": "Always", "ports": port}
    assert isinstance(plan(gang(2, [], initContainers=[sidecar]), snap, Mode.CHECK), NoFit)
    init = {"name": "i", "ports": port}
    assert isinstance(plan(gang(2, [], initContainers=[init]), snap, Mode.CHECK), Plan)
    # With hostNetwork the sidecar's container port is its host port too.
    net = {"name": "s", "restartPolicy": "Always", "ports": [{"containerPort": 9000}]}
    assert isinstance(plan(gang(2, [], initContainers=[net], hostNetwork=True), snap,
                           Mode.CHECK), NoFit)
    # A running pod's sidecar holds its port against the gang.
    bound = Pod.model_validate({"metadata": {"name": "x"}, "status": {"phase": "Running"},
                                "spec": {**spec([], initContainers=[sidecar]),
                                         "nodeName": "a"}})
    held = build_snapshot([k8s_node("a")], [bound], levels=LEVELS)
    assert isinstance(plan(gang(1, port), held, Mode.CHECK), NoFit)


def test_a_booking_holds_the_port_for_the_next_gang() -> None:
    snap = build_snapshot([k8s_node("a"), k8s_node("b")], levels=LEVELS)
    port = [{"containerPort": 80, "hostPort": 8080}]
    first = plan(gang(1, port), snap, Mode.CHECK)
    assert isinstance(first, Plan)
    booked = apply_plan(snap, first)
    second = plan(gang(1, port), booked, Mode.CHECK)
    assert isinstance(second, Plan)
    assert second.assignments[0].node != first.assignments[0].node
    assert isinstance(plan(gang(1, port), apply_plan(booked, second), Mode.CHECK), NoFit)


def test_new_nodes_have_every_port_free() -> None:
    pool = PoolState("p", {}, (), {"cpu": 16_000, "pods": 110}, (PoolDomain({}, 4),), 4, 1.0)
    snap = Snapshot((), (pool,), LEVELS)
    got = plan(gang(3, [{"containerPort": 80, "hostPort": 8080}]), snap, Mode.PROVISION)
    assert isinstance(got, Plan)
    assert sum(n.count for n in got.new_nodes) == 3
