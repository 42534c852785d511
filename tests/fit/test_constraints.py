"""Pod-spec constraints beyond node selection: planned (anti-affinity, self-affinity,
pod-level resources) or refused with the field named (controller.inputs.constraints)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.api.pod import PodSpec
from controller.common.topology_defaults import DEFAULT_LEVELS
from controller.fit import Mode, NoFit, Plan, ReasonCode, plan
from controller.fit.types import TopologyMode
from controller.inputs.snapshot import request_from_documents, snapshot_from_documents

RACK = "topology.muster.dev/rack"
HOST = "kubernetes.io/hostname"


def node(name: str, rack: str = "r1", cpu: str = "8") -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {
        HOST: name, "topology.muster.dev/block": "b1", RACK: rack}},
        "status": {"allocatable": {"cpu": cpu, "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}


def running(name: str, on: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"nodeName": on, "containers": [{"name": "c"}], **spec},
            "status": {"phase": "Running"}}


def request(*pod_sets: tuple[str, int, dict[str, Any], dict[str, str]]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = [{
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io",
                 "podSets": [{"podTemplateRef": {"name": n}, "count": c}
                             for n, c, _, _ in pod_sets]}}]
    for name, _, extra, labels in pod_sets:
        spec = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}], **extra}
        docs.append({"kind": "PodTemplate", "metadata": {"name": name, "namespace": "ns"},
                     "template": {"metadata": {"labels": labels}, "spec": spec}})
    return docs


def check(docs: list[dict[str, Any]], cluster: list[dict[str, Any]]) -> Plan | NoFit:
    _, gang = request_from_documents(docs, DEFAULT_LEVELS, cluster)
    return plan(gang, snapshot_from_documents(cluster), Mode.CHECK)


def anti(labels: dict[str, str], key: str = HOST) -> dict[str, Any]:
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": labels}, "topologyKey": key}]}}}


def affinity(labels: dict[str, str], key: str) -> dict[str, Any]:
    return {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": labels}, "topologyKey": key}]}}}


CLUSTER = [node("a"), node("b"), node("c", rack="r2")]


def test_self_anti_affinity_on_hostname_is_one_pod_per_node() -> None:
    got = check(request(("w", 3, anti({"app": "w"}), {"app": "w"})), CLUSTER)
    assert isinstance(got, Plan)
    assert sorted(a.pods for a in got.assignments) == [1, 1, 1]
    assert isinstance(check(request(("w", 4, anti({"app": "w"}), {"app": "w"})), CLUSTER), NoFit)


def test_anti_affinity_keeps_off_nodes_running_a_selected_pod() -> None:
    cluster = [*CLUSTER, running("x", "a", {"app": "db"})]
    got = check(request(("w", 2, anti({"app": "db"}), {"app": "w"})), cluster)
    assert isinstance(got, Plan)
    assert "a" not in {a.node for a in got.assignments}


def test_running_pods_anti_affinity_repels_the_gang() -> None:
    cluster = [*CLUSTER, running("x", "c", {"app": "db"}, **anti({"app": "w"}, RACK))]
    got = check(request(("w", 16, {}, {"app": "w"})), cluster)
    assert isinstance(got, Plan)
    assert "c" not in {a.node for a in got.assignments}


def test_self_affinity_on_a_level_is_a_required_topology() -> None:
    _, gang = request_from_documents(request(("w", 3, affinity({"app": "w"}, RACK),
                                              {"app": "w"})), DEFAULT_LEVELS, CLUSTER)
    topo = gang.pod_sets[0].topology
    assert (topo.mode, topo.level) == (TopologyMode.REQUIRED, RACK)
    got = check(request(("w", 12, affinity({"app": "w"}, RACK), {"app": "w"})), CLUSTER)
    assert isinstance(got, Plan)
    assert {a.domain[RACK] for a in got.assignments} == {"r1"}


@pytest.mark.parametrize("extra, labels, field", [
    (affinity({"app": "other"}, RACK), {"app": "w"}, "podAffinity.required[0]"),
    (affinity({"app": "w"}, "zone"), {"app": "w"}, "not a topology level"),
    ({**anti({"app": "w"}, RACK), "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.muster.dev/block",
         "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "w"}}}]},
     {"app": "w"}, "self anti-affinity) on topology.muster.dev/rack and "
     "topology.muster.dev/block together is not planned"),
    ({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]}, {},
     "spec.volumes[0] (data) is a persistentVolumeClaim volume"),
    ({"runtimeClassName": "gvisor"}, {}, "spec.runtimeClassName gvisor"),
    ({"schedulerName": "volcano"}, {}, "spec.schedulerName volcano"),
    ({"hostNetwork": True, "hostUsers": False}, {}, "spec.hostNetwork with spec.hostUsers"),
    ({"containers": [{"name": "c", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}]}, {},
     "spec.containers[0].restartPolicyRules"),
    ({"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": {"app": "w"}}}
        for key in (RACK, "topology.muster.dev/block")]},
     {"app": "w"}, f"on {RACK} and topology.muster.dev/block together is not planned"),
])
def test_refused_with_the_field_named(extra: dict[str, Any], labels: dict[str, str],
                                      field: str) -> None:
    got = check(request(("w", 1, extra, labels)), CLUSTER)
    assert isinstance(got, NoFit)
    assert got.permanent
    assert [r.code for r in got.reasons] == [ReasonCode.UNSUPPORTED]
    assert field in got.reasons[0].message


def test_anti_affinity_between_pod_sets_is_refused() -> None:
    got = check(request(("w", 1, anti({"app": "l"}), {"app": "w"}),
                        ("l", 1, {}, {"app": "l"})), CLUSTER)
    assert isinstance(got, NoFit)
    assert "pod set(s) l" in got.reasons[0].message


def test_neutral_volumes_and_soft_spread_are_planned() -> None:
    extra = {"volumes": [{"name": "cfg", "configMap": {"name": "x"}},
                         {"name": "tmp", "emptyDir": {}}],
             "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": RACK,
                                            "whenUnsatisfiable": "ScheduleAnyway"}]}
    assert isinstance(check(request(("w", 2, extra, {})), CLUSTER), Plan)


def test_pod_level_resources_replace_the_containers() -> None:
    spec = PodSpec.model_validate({
        "resources": {"requests": {"cpu": "4"}, "limits": {"memory": "1Gi"}},
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "64Mi",
                                                                 "nvidia.com/gpu": "1"}}}],
        "overhead": {"cpu": "100m"}})
    assert spec.effective_requests() == {"cpu": 4100, "memory": 1 << 30, "nvidia.com/gpu": 1}


def test_misspelt_constraint_field_is_an_error() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="labelSelecter"):
        PodSpec.model_validate({"containers": [{"name": "c"}], "affinity": {"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelecter": {}, "topologyKey": HOST}]}}})


def test_pods_naming_their_node_are_admitted_without_inter_pod_rules() -> None:
    """The kubelet admits a pod with spec.nodeName (resources, ports, node name and affinity,
    NoExecute taints) and never checks pod (anti-)affinity or spread: three pods with
    anti-affinity to each other on one node all run (found by the reference scheduler)."""
    cluster = [node("a"), running("db", "a", {"app": "db"}, **anti({"app": "w"}))]
    docs = request(("w", 3, {"nodeName": "a", **anti({"app": "w"})}, {"app": "w"}))
    assert isinstance(check(docs, cluster), Plan)
    docs = request(("w", 9, {"nodeName": "a"}, {"app": "w"}))
    assert isinstance(check(docs, cluster), NoFit)  # 8 cpu: resources still count


def test_affinity_to_running_pods_keeps_the_pods_in_their_domains() -> None:
    """Required pod affinity to running pods: the scheduler admits a pod only into a domain
    of the key holding a selected pod, on existing nodes and on new ones there."""
    from controller.fit import PoolDomain, PoolState, Snapshot

    cluster = [*CLUSTER, running("x", "c", {"app": "db"})]
    got = check(request(("w", 3, affinity({"app": "db"}, RACK), {"app": "w"})), cluster)
    assert isinstance(got, Plan)
    assert {a.node for a in got.assignments} == {"c"}  # rack r2 only
    on_host = check(request(("w", 3, affinity({"app": "db"}, HOST), {"app": "w"})), cluster)
    assert isinstance(on_host, Plan) and {a.node for a in on_host.assignments} == {"c"}
    # Too many for rack r2's only node: a pool adding nodes in r2 makes room, one in r1 not.
    _, gang = request_from_documents(
        request(("w", 12, affinity({"app": "db"}, RACK), {"app": "w"})), DEFAULT_LEVELS, cluster)
    snap = snapshot_from_documents(cluster)
    for rack, fits in (("r2", True), ("r1", False)):
        pool = PoolState("p", {}, (), {"cpu": 8_000, "pods": 110}, (PoolDomain(
            {"topology.muster.dev/block": "b1", RACK: rack}, 2),), 2, 1.0)
        with_pool = Snapshot(snap.nodes, (pool,), snap.levels)
        assert isinstance(plan(gang, with_pool, Mode.PROVISION), Plan) is fits, rack
    # Pods in another namespace are not selected (the term's namespaces default to its own).
    other = [*CLUSTER, {**running("x", "c", {"app": "db"}),
                        "metadata": {"name": "x", "namespace": "other", "labels": {"app": "db"}}}]
    refused = check(request(("w", 1, affinity({"app": "db"}, RACK), {"app": "w"})), other)
    assert isinstance(refused, NoFit)


def test_self_anti_affinity_on_a_zone_key_is_one_pod_per_domain() -> None:
    """Required anti-affinity of a pod set with itself on a key other than the hostname: at
    most one of its pods per domain of the key, new domains included."""
    from controller.fit import PoolDomain, PoolState, Snapshot

    got = check(request(("w", 2, anti({"app": "w"}, RACK), {"app": "w"})), CLUSTER)
    assert isinstance(got, Plan)
    racks = {"a": "r1", "b": "r1", "c": "r2"}
    assert sorted(racks[a.node or ""] for a in got.assignments) == ["r1", "r2"]
    assert isinstance(check(request(("w", 3, anti({"app": "w"}, RACK), {"app": "w"})),
                            CLUSTER), NoFit)
    _, gang = request_from_documents(request(("w", 4, anti({"app": "w"}, RACK), {"app": "w"})),
                                     DEFAULT_LEVELS, CLUSTER)
    snap = snapshot_from_documents(CLUSTER)
    pool = PoolState("p", {}, (), {"cpu": 8_000, "pods": 110}, tuple(
        PoolDomain({"topology.muster.dev/block": "b1", RACK: r}, 2) for r in ("r3", "r4")),
        4, 1.0)
    grown = plan(gang, Snapshot(snap.nodes, (pool,), snap.levels), Mode.PROVISION)
    assert isinstance(grown, Plan), grown
    assert sum(n.count for n in grown.new_nodes) == 2  # one in r3, one in r4
