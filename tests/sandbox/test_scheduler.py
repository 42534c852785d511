"""The sandbox scheduler binds pending pods like kube-scheduler would: resource requests
(cpu, memory, extended resources, pod count), nodeSelector, required node affinity operators,
taints and tolerations, node readiness and cordoning, scheduling gates; deterministic
most-allocated choice; Running once bound."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import SandboxServer, Store
from sandbox.quantity import QuantityError, parse_quantity, pod_requests
from sandbox.scheduler import SandboxScheduler
from tests.sandbox.util import eventually


def node(
    name: str, *, cpu: str = "8", memory: str = "32Gi", gpu: str | None = None,
    labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
    ready: bool = True, unschedulable: bool = False,
) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpu is not None:
        alloc["nvidia.com/gpu"] = gpu
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": alloc, "capacity": alloc,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pending(name: str, *, cpu: str = "1", gpu: str | None = None, **spec: Any) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": "1Gi"}
    if gpu is not None:
        requests["nvidia.com/gpu"] = gpu
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i",
                                 "resources": {"requests": requests}}], **spec},
    }


def placed(store: Store, name: str) -> str | None:
    return store.get("pods", name)["spec"].get("nodeName")


@pytest.fixture
def store() -> Store:
    return Store()


def test_binds_to_the_node_with_room_and_sets_running(store: Store) -> None:
    store.create("nodes", node("small", cpu="1"))
    store.create("nodes", node("big", cpu="16"))
    store.create("pods", pending("p", cpu="2"))
    made = SandboxScheduler(store).schedule_once()
    assert [(m.name, m.node) for m in made] == [("p", "big")]
    obj = store.get("pods", "p")
    assert obj["status"]["phase"] == "Running"
    assert any(c["type"] == "PodScheduled" and c["status"] == "True"
               for c in obj["status"]["conditions"])


def test_requests_of_bound_pods_use_up_allocatable_including_gpus(store: Store) -> None:
    store.create("nodes", node("g1", gpu="8"))
    store.create("nodes", node("g2", gpu="8"))
    for i in range(3):
        store.create("pods", pending(f"w{i}", gpu="4"))
    SandboxScheduler(store).schedule_once()
    nodes = [placed(store, f"w{i}") for i in range(3)]
    # Most-allocated packing: two 4-GPU pods fill g1, the third goes to g2.
    assert nodes == ["g1", "g1", "g2"]
    store.create("pods", pending("w3", gpu="5"))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "w3") is None
    cond = next(c for c in store.get("pods", "w3")["status"]["conditions"]
                if c["type"] == "PodScheduled")
    assert cond["status"] == "False" and cond["reason"] == "Unschedulable"


def test_finished_pods_free_their_requests(store: Store) -> None:
    store.create("nodes", node("n", cpu="2"))
    store.create("pods", pending("a", cpu="2"))
    SandboxScheduler(store).schedule_once()
    store.patch("pods", "a", {"status": {"phase": "Succeeded"}}, subresource="status")
    store.create("pods", pending("b", cpu="2"))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "b") == "n"


def test_pod_count_limit_of_a_node(store: Store) -> None:
    tiny = node("n")
    tiny["status"]["allocatable"]["pods"] = "1"
    store.create("nodes", tiny)
    store.create("pods", pending("a", cpu="0"))
    store.create("pods", pending("b", cpu="0"))
    SandboxScheduler(store).schedule_once()
    assert [placed(store, "a"), placed(store, "b")] == ["n", None]


def test_node_selector(store: Store) -> None:
    store.create("nodes", node("a", labels={"pool": "cpu"}))
    store.create("nodes", node("b", labels={"pool": "gpu"}))
    store.create("pods", pending("p", nodeSelector={"pool": "gpu"}))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "p") == "b"


@pytest.mark.parametrize(("expr", "expected"), [
    ({"key": "rack", "operator": "In", "values": ["r2", "r3"]}, "n2"),
    ({"key": "rack", "operator": "NotIn", "values": ["r1"]}, "n2"),
    ({"key": "spot", "operator": "Exists"}, "n3"),
    ({"key": "spot", "operator": "DoesNotExist"}, "n1"),
    ({"key": "gen", "operator": "Gt", "values": ["4"]}, "n3"),
    ({"key": "gen", "operator": "Lt", "values": ["4"]}, "n1"),
    ({"key": "rack", "operator": "In", "values": ["nowhere"]}, None),
])
def test_required_node_affinity_operators(
    store: Store, expr: dict[str, Any], expected: str | None,
) -> None:
    store.create("nodes", node("n1", labels={"rack": "r1", "gen": "3"}))
    store.create("nodes", node("n2", labels={"rack": "r2", "gen": "4"}))
    store.create("nodes", node("n3", labels={"rack": "r3", "gen": "5", "spot": "yes"}))
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}
    store.create("pods", pending("p", affinity=affinity))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "p") == expected


def test_node_affinity_terms_are_ored_and_match_fields_by_name(store: Store) -> None:
    store.create("nodes", node("a", labels={"zone": "z1"}))
    store.create("nodes", node("b", labels={"zone": "z2"}))
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z9"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]},
    ]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}
    store.create("pods", pending("p", affinity=affinity))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "p") == "b"


@pytest.mark.parametrize(("tolerations", "expected"), [
    ([], "plain"),
    ([{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}], "gpu"),
    ([{"key": "gpu", "operator": "Exists"}], "gpu"),
    ([{"operator": "Exists"}], "gpu"),
    ([{"key": "gpu", "operator": "Equal", "value": "false", "effect": "NoSchedule"}], "plain"),
])
def test_taints_need_tolerations(
    store: Store, tolerations: list[dict[str, str]], expected: str,
) -> None:
    # "gpu" sorts before "plain": it wins ties whenever the pod may go there.
    store.create("nodes", node("gpu", taints=[
        {"key": "gpu", "value": "true", "effect": "NoSchedule"}]))
    store.create("nodes", node("plain"))
    store.create("pods", pending("p", tolerations=tolerations))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "p") == expected


def test_no_execute_taints_block_and_prefer_no_schedule_does_not(store: Store) -> None:
    store.create("nodes", node("a", taints=[{"key": "x", "effect": "NoExecute"}]))
    store.create("nodes", node("b", taints=[{"key": "y", "effect": "PreferNoSchedule"}]))
    store.create("pods", pending("p"))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "p") == "b"


def test_not_ready_and_cordoned_nodes_are_skipped(store: Store) -> None:
    store.create("nodes", node("a", ready=False))
    store.create("nodes", node("b", unschedulable=True))
    store.create("nodes", node("c"))
    store.create("pods", pending("p"))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "p") == "c"


def test_gated_deleting_and_foreign_scheduler_pods_are_left_alone(store: Store) -> None:
    store.create("nodes", node("n"))
    store.create("pods", pending("gated", schedulingGates=[{"name": "kueue.x-k8s.io/admission"}]))
    store.create("pods", pending("other", schedulerName="someone-else"))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "gated") is None and placed(store, "other") is None


def test_most_allocated_choice_is_deterministic_with_ties_by_name(store: Store) -> None:
    for name in ("c", "a", "b"):
        store.create("nodes", node(name))
    store.create("pods", pending("p1"))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "p1") == "a"
    store.create("pods", pending("p2"))
    SandboxScheduler(store).schedule_once()
    assert placed(store, "p2") == "a"


def test_running_phase_is_configurable(store: Store) -> None:
    store.create("nodes", node("n"))
    store.create("pods", pending("p"))
    SandboxScheduler(store, running_phase=None).schedule_once()
    assert store.get("pods", "p")["status"]["phase"] == "Pending"
    assert placed(store, "p") == "n"


def test_pods_created_with_a_node_name_go_running(store: Store) -> None:
    store.create("nodes", node("n"))
    store.create("pods", {**pending("p"), "spec": {**pending("p")["spec"], "nodeName": "n"}})
    SandboxScheduler(store).schedule_once()
    assert store.get("pods", "p")["status"]["phase"] == "Running"


async def test_background_scheduler_binds_pods_as_nodes_appear(server: SandboxServer) -> None:
    store = server.store
    scheduler = SandboxScheduler(store)
    await scheduler.start()
    try:
        store.create("pods", pending("p", gpu="8"))
        await eventually(lambda: any(
            c.get("reason") == "Unschedulable"
            for c in store.get("pods", "p")["status"].get("conditions", [])), within=5)
        store.create("nodes", node("gpu-1", gpu="8"))
        await eventually(lambda: placed(store, "p") == "gpu-1", within=5)
        assert store.get("pods", "p")["status"]["phase"] == "Running"
        store.create("pods", {**pending("direct"),
                              "spec": {**pending("direct")["spec"], "nodeName": "gpu-1"}})
        await eventually(
            lambda: store.get("pods", "direct")["status"]["phase"] == "Running", within=5)
        for i in range(20):
            store.create("pods", pending(f"bulk-{i}", cpu="100m"))
        await eventually(lambda: all(placed(store, f"bulk-{i}") for i in range(20)), within=5)
    finally:
        await scheduler.stop()


def test_quantities_and_effective_pod_requests() -> None:
    assert parse_quantity("500m", "cpu") == 500
    assert parse_quantity("2", "cpu") == 2000
    assert parse_quantity("1Gi", "memory") == 2**30
    assert parse_quantity("1e3", "memory") == 1000
    assert parse_quantity("1.5k") == 1500
    with pytest.raises(QuantityError):
        parse_quantity("lots", "cpu")
    p = {"spec": {
        "containers": [{"resources": {"requests": {"cpu": "1"}}},
                       {"resources": {"limits": {"cpu": "500m", "nvidia.com/gpu": "2"}}}],
        "initContainers": [{"resources": {"requests": {"cpu": "4"}}}],
        "overhead": {"cpu": "100m"},
    }}
    assert pod_requests(p) == {"cpu": 4100, "nvidia.com/gpu": 2, "pods": 1}
