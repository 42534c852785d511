"""From API objects to engine inputs: requests, free capacity, pools, topology annotations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.api.capacitypool import CapacityPool
from controller.api.node import Node
from controller.api.pod import Pod
from controller.common.topology_defaults import DEFAULT_LEVELS, POOL_LABEL
from controller.fit import TopologyMode, TopologyRequest
from controller.inputs.snapshot import (
    SnapshotError,
    build_snapshot,
    load_documents,
    pool_state,
    request_from_documents,
    snapshot_from_documents,
    topology_of,
)

BLOCK, RACK, HOST = DEFAULT_LEVELS
SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param({}, TopologyRequest(), id="none"),
        pytest.param({"kueue.x-k8s.io/podset-required-topology": RACK},
                     TopologyRequest(TopologyMode.REQUIRED, RACK), id="kueue-required"),
        pytest.param({"kueue.x-k8s.io/podset-preferred-topology": BLOCK},
                     TopologyRequest(TopologyMode.PREFERRED, BLOCK), id="kueue-preferred"),
        pytest.param({"kueue.x-k8s.io/podset-unconstrained-topology": "true",
                      "kueue.x-k8s.io/podset-preferred-topology": BLOCK},
                     TopologyRequest(), id="kueue-unconstrained"),
        pytest.param({"kueue.x-k8s.io/podset-required-topology": BLOCK,
                      "muster.dev/preferred-topology": RACK},
                     TopologyRequest(TopologyMode.PREFERRED, RACK), id="muster-wins"),
        pytest.param({"muster.dev/required-topology": "rack"},
                     TopologyRequest(TopologyMode.REQUIRED, RACK), id="short-level-name"),
        pytest.param({"muster.dev/required-topology": "zone"},
                     TopologyRequest(TopologyMode.REQUIRED, "zone"), id="unknown-kept-for-invalid"),
    ],
)
def test_topology_annotations(annotations: dict[str, str], expected: TopologyRequest) -> None:
    assert topology_of(annotations, DEFAULT_LEVELS) == expected


def gpu_node(name: str, *, ready: bool = True, labels: dict[str, str] | None = None) -> Node:
    return Node.model_validate({
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8",
                                   "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    })


def pod(node: str | None, phase: str = "Running", gpus: str = "2") -> Pod:
    return Pod.model_validate({
        "metadata": {"name": f"p-{node}-{phase}"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
            "requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": phase},
    })


def test_free_capacity_from_bound_pods_and_bookings() -> None:
    snap = build_snapshot(
        [gpu_node("a"), gpu_node("b", ready=False), gpu_node("c")],
        [pod("a"), pod("a", "Succeeded"), pod(None, "Pending")],
        booked={"a": {"nvidia.com/gpu": 4}},
    )
    a, b, c = snap.nodes
    assert a.free["nvidia.com/gpu"] == 8 - 2 - 4
    assert a.free["cpu"] == 7000
    assert a.free["pods"] == 110 - 1
    assert not b.schedulable
    assert a.taints is c.taints  # equal taint tuples are shared (engine fast path)
    assert b.taints[-1].key == "node.kubernetes.io/not-ready"  # NotReady: the taint follows


def test_an_existing_node_that_lists_no_pod_count_takes_no_pod() -> None:
    """The scheduler allows ``allocatable.pods`` pods on a node, 0 when it is not listed
    (found by the scheduler oracle, e2e/scheduler_oracle.py); the API server defaults
    allocatable to capacity only when a node reports no allocatable at all."""
    def node(status: dict[str, Any]) -> Node:
        return Node.model_validate({"metadata": {"name": "n"}, "status": {
            **status, "conditions": [{"type": "Ready", "status": "True"}]}})

    unlisted = build_snapshot([node({"allocatable": {"cpu": "8"},
                                     "capacity": {"cpu": "8", "pods": "110"}})]).nodes[0]
    assert unlisted.free.get("pods", 0) == 0
    from_capacity = build_snapshot([node({"capacity": {"cpu": "8", "pods": "20"}})]).nodes[0]
    assert from_capacity.free["pods"] == 20


def pool(topology: dict[str, Any] | None, max_nodes: int = 10, booked: int = 0) -> CapacityPool:
    spec: dict[str, Any] = {
        "provider": "fake", "maxNodes": max_nodes, "pricePerNodeHour": 2.5,
        "nodeTemplate": {"labels": {"kind": "gpu"}, "allocatable": {"nvidia.com/gpu": "8"}},
    }
    if topology:
        spec["topology"] = topology
    return CapacityPool.model_validate({"metadata": {"name": "p"}, "spec": spec,
                                        "status": {"inFlightNodes": booked}})


def test_pool_headroom_counts_existing_and_in_flight_nodes() -> None:
    mine = [gpu_node(f"n{i}", labels={POOL_LABEL: "p", BLOCK: "b0", RACK: "r0"})
            for i in range(3)]
    state = pool_state(
        pool({"level": RACK, "maxNodesPerDomain": 4,
              "domains": [{"labels": {BLOCK: "b0", RACK: "r0"}},
                          {"labels": {BLOCK: "b0", RACK: "r1"}, "maxNodes": 2}]},
             booked=1),
        [*mine, gpu_node("other")],
    )
    assert state.max_new_nodes == 10 - 3 - 1
    assert [d.max_new_nodes for d in state.domains] == [1, 2]
    assert [d.max_nodes for d in state.domains] == [4, 2]
    # The template's labels and what every kubelet sets (the hostname is the engine's).
    assert state.labels == {"kind": "gpu", POOL_LABEL: "p", "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                            "beta.kubernetes.io/arch": "amd64"}
    assert state.allocatable["pods"] == 110
    assert state.price_per_node_hour == 2.5


def test_a_node_counts_in_every_declared_domain_whose_labels_it_carries() -> None:
    """Domains declaring different label keys (a block, a rack in it, a rack named alike
    in another block) each count the pool's nodes that carry all of their labels."""
    domains = [{"labels": {BLOCK: "b0"}, "maxNodes": 8},
               {"labels": {BLOCK: "b0", RACK: "r0"}},
               {"labels": {RACK: "r0"}},
               {"labels": {BLOCK: "b1", RACK: "r0"}}]
    nodes = [
        gpu_node("a", labels={POOL_LABEL: "p", BLOCK: "b0", RACK: "r0"}),
        gpu_node("b", labels={POOL_LABEL: "p", BLOCK: "b0", RACK: "r1"}),
        gpu_node("c", labels={POOL_LABEL: "p", BLOCK: "b1", RACK: "r0"}),
        gpu_node("d", labels={POOL_LABEL: "q", BLOCK: "b0", RACK: "r0"}),  # another pool's
    ]
    state = pool_state(pool({"level": RACK, "maxNodesPerDomain": 4, "domains": domains},
                            max_nodes=20), nodes)
    assert state.max_new_nodes == 20 - 3
    assert [d.pool_nodes for d in state.domains] == [2, 1, 2, 1]
    assert [d.max_new_nodes for d in state.domains] == [6, 3, 2, 3]


def test_fresh_domain_pool_gets_placeholder_domains() -> None:
    state = pool_state(pool({"level": RACK, "maxNodesPerDomain": 4}, max_nodes=10), [])
    assert len(state.domains) == 3  # ceil(10 / 4)
    assert {d.labels[RACK] for d in state.domains} == {"muster-new-p-0", "muster-new-p-1",
                                                        "muster-new-p-2"}
    assert all(d.labels[BLOCK] == d.labels[RACK] for d in state.domains)


def test_pool_without_topology_adds_anywhere() -> None:
    state = pool_state(pool(None, max_nodes=5), [])
    assert [(dict(d.labels), d.max_new_nodes) for d in state.domains] == [({}, 5)]


def test_request_from_samples() -> None:
    pr, gang = request_from_documents(load_documents(SAMPLES / "fit-request.yaml"))
    assert pr.metadata.name == "llm-train"
    workers, launcher = gang.pod_sets
    assert (workers.name, workers.count) == ("workers", 6)  # "ppt-llm-train-" stripped
    assert workers.topology == TopologyRequest(TopologyMode.REQUIRED, RACK)
    assert workers.shape.requests["nvidia.com/gpu"] == 8
    assert workers.shape.requests["pods"] == 1
    assert launcher.topology.mode is TopologyMode.NONE


def test_missing_template_names_the_field() -> None:
    docs = [d for d in load_documents(SAMPLES / "fit-request.yaml")
            if d["metadata"]["name"] != "ppt-llm-train-launcher"]
    with pytest.raises(SnapshotError, match=r"spec\.podSets\[1\]\.podTemplateRef\.name"):
        request_from_documents(docs)


def test_validation_error_is_one_line_with_the_field() -> None:
    docs = load_documents(SAMPLES / "fit-request.yaml")
    docs[0]["spec"]["podSets"][0]["count"] = 0
    with pytest.raises(SnapshotError) as err:
        request_from_documents(docs)
    assert str(err.value) == (
        "ProvisioningRequest llm-train: spec.podSets[0].count: "
        "Input should be greater than or equal to 1"
    )


def test_cluster_sample_builds() -> None:
    snap = snapshot_from_documents(load_documents(SAMPLES / "fit-cluster.yaml"),
                                   load_documents(SAMPLES / "fit-pools.yaml"))
    assert len(snap.nodes) == 18
    # One NotReady node; one cordoned, which keeps only pods tolerating the cordon's taint.
    assert sum(1 for n in snap.nodes if not n.schedulable) == 1
    assert sum(1 for n in snap.nodes
               if any(t.key == "node.kubernetes.io/unschedulable" for t in n.taints)) == 1
    assert [p.name for p in snap.pools] == ["p5-b1", "p5-placement-groups"]


def _plan_on_pool(spec: dict[str, Any], template_labels: dict[str, str] | None = None,
                  parameters: dict[str, Any] | None = None) -> Any:
    from controller.fit import GangRequest, Mode, PodSetRequest, plan
    from controller.inputs.snapshot import shape_of

    tpl: dict[str, Any] = {"labels": template_labels or {}, "allocatable": {"cpu": "8"}}
    cap = CapacityPool.model_validate({"metadata": {"name": "p"}, "spec": {
        "provider": "fake", "maxNodes": 4, "nodeTemplate": tpl,
        "parameters": parameters or {}}})
    snap = build_snapshot([], pools=[cap])
    pod_spec = Pod.model_validate({"metadata": {"name": "x"}, "spec": {
        **spec, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}).spec
    gang = GangRequest("ns/g", (PodSetRequest("w", 2, shape_of(pod_spec)),))
    return plan(gang, snap, Mode.PROVISION)


def _affinity(key: str, op: str, values: tuple[str, ...] = ()) -> dict[str, Any]:
    expr: dict[str, Any] = {"key": key, "operator": op}
    if values:
        expr["values"] = list(values)
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}}


@pytest.mark.parametrize(
    ("spec", "fits"),
    [
        pytest.param({"nodeSelector": {"kubernetes.io/os": "linux"}}, True, id="os-selector"),
        pytest.param({"nodeSelector": {"kubernetes.io/arch": "amd64"}}, True, id="arch-selector"),
        pytest.param({"nodeSelector": {"beta.kubernetes.io/os": "linux"}}, True, id="beta-os"),
        pytest.param({"nodeSelector": {"kubernetes.io/os": "windows"}}, False, id="windows"),
        pytest.param(_affinity("kubernetes.io/os", "DoesNotExist"), False, id="os-absent"),
        pytest.param(_affinity("kubernetes.io/hostname", "Exists"), True, id="hostname-exists"),
        pytest.param(_affinity("kubernetes.io/hostname", "DoesNotExist"), False,
                     id="hostname-absent"),
        pytest.param(_affinity("kubernetes.io/hostname", "NotIn", ("n1",)), True,
                     id="hostname-not-in"),
        # a new node's name is not known: no selector can name it
        pytest.param(_affinity("kubernetes.io/hostname", "In", ("n1",)), False,
                     id="hostname-in"),
    ],
)
def test_a_new_node_carries_what_its_kubelet_sets(spec: dict[str, Any], fits: bool) -> None:
    from controller.fit import Plan

    got = _plan_on_pool(spec)
    assert isinstance(got, Plan) is fits, got
    if fits:  # the placeholder hostname is never reported as a domain
        assert all("kubernetes.io/hostname" not in a.domain for a in got.assignments)


def test_the_pool_template_names_the_architecture_and_instance_type() -> None:
    from controller.fit import Plan

    arm = {"kubernetes.io/arch": "arm64"}
    assert isinstance(_plan_on_pool({"nodeSelector": {"kubernetes.io/arch": "arm64"}}, arm), Plan)
    assert not isinstance(_plan_on_pool({"nodeSelector": {"kubernetes.io/arch": "amd64"}}, arm),
                          Plan)
    state = pool_state(CapacityPool.model_validate({"metadata": {"name": "p"}, "spec": {
        "provider": "gcp", "maxNodes": 1, "nodeTemplate": {"allocatable": {"cpu": "1"}},
        "parameters": {"machineType": "a3-highgpu-8g", "zone": "us-central1-a"}}}), [])
    assert state.labels["node.kubernetes.io/instance-type"] == "a3-highgpu-8g"
    assert state.labels["beta.kubernetes.io/instance-type"] == "a3-highgpu-8g"
    assert state.labels["topology.kubernetes.io/zone"] == "us-central1-a"
    assert state.labels["topology.kubernetes.io/region"] == "us-central1"
