"""Running pods as inter-pod constraints see them: the cache keeps their labels and their
anti-affinity; a gang whose own constraints select running pods gets all of them."""

from __future__ import annotations

from typing import Any

from controller.api.pod import PodSpec
from controller.inputs.constraints import needs_running_pods
from controller.state.cache import ClusterState


def pod(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"nodeName": "a", "containers": [{"name": "c"}], **spec},
            "status": {"phase": "Running"}}


def test_bound_pods_every_or_only_the_repellers() -> None:
    state = ClusterState(levels=("kubernetes.io/hostname",))
    state.upsert_node({"metadata": {"name": "a", "labels": {"zone": "z1"}},
                       "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    anti = {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "w"}}, "topologyKey": "zone"}]}}}
    state.upsert_pod(pod("plain", {"app": "db"}))
    state.upsert_pod(pod("repeller", {"app": "x"}, **anti))
    every = state.objects.bound_pods(every=True)
    assert sorted(p.labels["app"] for p in every) == ["db", "x"]
    assert all(p.node_labels == {"zone": "z1"} for p in every)
    only = state.objects.bound_pods(every=False)
    assert [p.labels["app"] for p in only] == ["x"]
    assert only[0].anti_affinity[0].topology_key == "zone"
    state.delete_pod("ns/repeller")
    assert state.objects.bound_pods(every=False) == []


def test_which_gangs_need_every_running_pod() -> None:
    def spec(**fields: Any) -> PodSpec:
        return PodSpec.model_validate({"containers": [{"name": "c"}], **fields})

    assert not needs_running_pods(spec())
    assert not needs_running_pods(spec(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]))
    assert needs_running_pods(spec(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]))
    assert needs_running_pods(spec(affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone"}]}}))
