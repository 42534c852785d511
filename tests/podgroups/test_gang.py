"""The pure half of native gangs: PodGroup + pods -> request and templates, request ->
what the PodGroup's owner is told, and the pods counted as the request's consumers."""

from __future__ import annotations

from typing import Any

from controller.common.topology_defaults import DEFAULT_LEVELS, MUSTER_REQUIRED
from controller.inputs.podgroup_membership import request_name
from controller.podgroups.gang import (
    GangPodGroup,
    draft,
    members,
    outcome,
    owner_reference,
    unbound,
)
from controller.state.cache import ClusterState

RACK = "topology.muster.dev/rack"


def group(*, min_count: int | None = 2, key: str | None = RACK,
          condition: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}
                            if min_count else {"basic": {}}}
    if key:
        spec["schedulingConstraints"] = {"topology": [{"key": key}]}
    body: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1"}, "spec": spec}
    if condition:
        body["status"] = {"conditions": [{"type": "PodGroupInitiallyScheduled", **condition}]}
    return body


def pod(name: str, *, gpus: str = "8", node: str | None = None, group: str = "train",
        token: str = "kube-api-access-abcde") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulingGroup": {"podGroupName": group},
        "containers": [{"name": "w", "image": "x",
                        "resources": {"requests": {"nvidia.com/gpu": gpus}},
                        "volumeMounts": [{"name": token, "mountPath": "/var/run/secrets"}]}],
        "volumes": [{"name": token, "projected": {"sources": []}}],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "labels": {"app": "train"}},
            "spec": spec, "status": {"phase": "Pending"}}


def test_a_podgroup_reads_its_gang_topology_and_scheduler_verdict() -> None:
    g = GangPodGroup.of(group(condition={"status": "False", "reason": "Unschedulable",
                                         "message": "no feasible placements found"}))
    assert (g.min_count, g.topology_key, g.unschedulable, g.scheduled) == (2, RACK, True, False)
    assert GangPodGroup.of(group(min_count=None)).min_count is None, "basic: not a gang"
    assert GangPodGroup.of(group(condition={"status": "True", "reason": "Scheduled"})).scheduled


def test_pods_of_one_spec_become_one_pod_set_whatever_their_token_volume() -> None:
    pods = [pod("a", token="kube-api-access-1"), pod("b", token="kube-api-access-2"),
            pod("c", gpus="4"), pod("d", node="n1"), pod("e", group="other")]
    pending = unbound(members(pods, "train"))
    assert [p["metadata"]["name"] for p in pending] == ["a", "b", "c"]
    g = GangPodGroup.of(group())
    gang = draft(g, pending, owner_reference(group()), "atomic-provisioning.muster.dev")
    assert [ps["count"] for ps in gang.request["spec"]["podSets"]] == [2, 1]
    tpl = gang.templates[0]["template"]
    assert tpl["metadata"] == {"labels": {"app": "train"},
                               "annotations": {MUSTER_REQUIRED: RACK}}
    assert "schedulingGroup" not in tpl["spec"] and "volumes" not in tpl["spec"]
    assert tpl["spec"]["containers"][0]["volumeMounts"] == []
    meta = gang.request["metadata"]
    assert meta["name"] == request_name("train") == "train-gang"
    assert [(o["kind"], o["uid"], o["controller"]) for o in meta["ownerReferences"]] == [
        ("PodGroup", "u-1", True)]
    assert all(t["metadata"]["ownerReferences"][0]["uid"] == "u-1" for t in gang.templates)


def test_a_pvc_volume_is_kept_so_muster_can_refuse_it_by_name() -> None:
    p = pod("a")
    p["spec"]["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": "d"}})
    gang = draft(GangPodGroup.of(group()), [p], owner_reference(group()), "c")
    assert gang.templates[0]["template"]["spec"]["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]


def _request(*conditions: dict[str, str], details: dict[str, str] | None = None
             ) -> dict[str, Any]:
    return {"metadata": {"name": "train-gang"},
            "status": {"conditions": list(conditions),
                       "provisioningClassDetails": details or {}}}


def test_the_requests_conditions_become_events_on_the_podgroup() -> None:
    g = GangPodGroup.of(group())
    assert outcome(_request(), g) is None
    waiting = outcome(_request({"type": "Provisioned", "status": "False",
                                "reason": "CapacityIsNotFound", "message": "m"}), g)
    assert waiting is not None and waiting.reason == "GangWaitingForCapacity"
    booked = outcome(_request({"type": "Provisioned", "status": "True",
                               "reason": "CapacityIsProvisioned", "message": "m"},
                              details={"muster.dev/topology-level": RACK,
                                       "muster.dev/topology-domain": "b1-r2"}), g)
    assert booked is not None and f"{RACK}=b1-r2" in booked.message
    failed = outcome(_request({"type": "Failed", "status": "True",
                               "reason": "CapacityNeverFits", "message": "too big"}), g)
    assert failed is not None and (failed.type, failed.reason) == ("Warning",
                                                                   "GangNotProvisioned")
    assert "CapacityNeverFits" in failed.message and "too big" in failed.message
    consumed = outcome(_request({"type": "BookingExpired", "status": "True",
                                 "reason": "CapacityBookingConsumed", "message": "m"}), g)
    assert consumed is not None and consumed.reason == "GangPlaced" and not consumed.retry
    lost = outcome(_request({"type": "BookingExpired", "status": "True",
                             "reason": "CapacityReservationTimeExpired", "message": "m"}), g)
    assert lost is not None and lost.retry and lost.type == "Warning"


def test_a_groups_bound_pods_consume_its_request() -> None:
    state = ClusterState(levels=DEFAULT_LEVELS)
    state.upsert_pod(pod("a", node="n1"))
    state.upsert_pod(pod("b", node="n2"))
    state.upsert_pod(pod("c"))
    assert dict(state.objects.scheduled_consumers("ml/train-gang")) == {"n1": 1, "n2": 1}
