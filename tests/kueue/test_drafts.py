"""How a Workload with reserved quota becomes Muster's ProvisioningRequest and templates."""

from __future__ import annotations

from typing import Any

import pytest

from controller.commands import kueue_objects as kq
from controller.kueue.drafts import DraftError, PoolTaints, draft_request
from controller.kueue.models import ResourceFlavor, Workload

GPU = "nvidia.com/gpu"
TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
POOL = PoolTaints("h100", {"accel": "h100", "muster.dev/pool": "h100"}, [TAINT])
FLAVORS = {
    "h100": ResourceFlavor.model_validate(
        kq.resource_flavor("h100", node_labels={"accel": "h100"})),
    "cpu": ResourceFlavor.model_validate(kq.resource_flavor("cpu")),
}


def reserved(pod_sets: list[dict[str, Any]], flavors: dict[str, dict[str, str]],
             **kw: Any) -> Workload:
    body = kq.workload("job", "ns", queue="q", pod_sets=pod_sets)
    body["metadata"]["uid"] = "u1"
    body["status"] = kq.reserve_quota(body, cluster_queue="cq", flavors=flavors,
                                      checks=["c"], now="t", **kw)
    return Workload.model_validate(body)


def draft(wl: Workload, **kw: Any) -> Any:
    args: dict[str, Any] = {"flavors": FLAVORS, "class_name": "atomic",
                            "check_capacity_class": "check", "parameters": {},
                            "managed_resources": (), "pools": [POOL]}
    args.update(kw)
    return draft_request(wl, "job-c-1", **args)


def gang() -> list[dict[str, Any]]:
    return [
        kq.pod_set("workers", 16, requests={GPU: "8"},
                   annotations={"muster.dev/required-topology": "rack",
                                "autoscaling.x-k8s.io/consume-provisioning-request": "old"}),
        kq.pod_set("launcher", 1, requests={"cpu": "1"}),
    ]


def test_pod_sets_become_templates_with_flavor_labels_and_pool_tolerations() -> None:
    wl = reserved(gang(), {"workers": {GPU: "h100"}, "launcher": {"cpu": "cpu"}})
    p = draft(wl)
    assert p.class_name == "atomic"
    workers, launcher = p.pod_sets
    assert (workers.template_name, workers.count) == ("ppt-job-c-1-workers", 16)
    spec = workers.template["spec"]
    assert spec["nodeSelector"] == {"accel": "h100"}
    assert spec["tolerations"] == [{"key": GPU, "operator": "Equal", "value": "present",
                                    "effect": "NoSchedule"}]
    anns = workers.template["metadata"]["annotations"]
    assert anns["muster.dev/required-topology"] == "rack", "Muster's topology is carried over"
    assert "autoscaling.x-k8s.io/consume-provisioning-request" not in anns, "stale key dropped"
    assert "tolerations" not in launcher.template["spec"], "no selector, no pool, no toleration"


def test_pool_tolerations_can_be_switched_off() -> None:
    wl = reserved(gang(), {"workers": {GPU: "h100"}, "launcher": {"cpu": "cpu"}})
    workers = draft(wl, tolerate_pool_taints=False).pod_sets[0]
    assert "tolerations" not in workers.template["spec"]


def test_managed_resources_filter_pod_sets_and_counts_come_from_the_assignment() -> None:
    wl = reserved(gang(), {"workers": {GPU: "h100"}, "launcher": {"cpu": "cpu"}})
    wl.status.admission.pod_set_assignments[0].count = 12  # type: ignore[union-attr]
    p = draft(wl, managed_resources=[GPU])
    assert [(ps.pod_set, ps.count) for ps in p.pod_sets] == [("workers", 12)]
    assert not draft(wl, managed_resources=["example.com/fpga"]).needed


def test_a_missing_flavor_is_a_draft_error() -> None:
    wl = reserved(gang(), {"workers": {GPU: "a100"}, "launcher": {"cpu": "cpu"}})
    with pytest.raises(DraftError, match="ResourceFlavor a100 not found"):
        draft(wl)


def test_tas_placed_pod_sets_are_pinned_per_domain_and_checked_not_planned() -> None:
    ta = {"levels": ["rack", "kubernetes.io/hostname"],
          "slices": [{"domainCount": 2,
                      "valuesPerLevel": [{"universal": "r1"},
                                         {"individual": {"prefix": "n", "roots": ["1", "2"]}}],
                      "podCounts": {"individual": [3, 1]}}]}
    wl = reserved([gang()[0]], {"workers": {GPU: "h100"}},
                  topology_assignments={"workers": ta})
    p = draft(wl)
    assert p.class_name == "check" and p.parameters == {"noRetry": "true"}
    assert [(ps.template_name, ps.count, ps.pinned) for ps in p.pod_sets] == [
        ("ppt-job-c-1-workers-0", 3, True), ("ppt-job-c-1-workers-1", 1, True)]
    assert p.pod_sets[1].template["spec"]["nodeSelector"] == {
        "accel": "h100", "rack": "r1", "kubernetes.io/hostname": "n2"}
    assert "muster.dev/required-topology" not in p.pod_sets[0].template["metadata"][
        "annotations"], "no second topology plan"


# ---------------------------------------------------------------------------- TAS slices


def test_slice_annotations_become_the_pod_sets_slices() -> None:
    from controller.api.pod import PodTemplate
    from controller.api.provisioningrequest import ProvisioningRequest
    from controller.common.topology_defaults import DEFAULT_LEVELS
    from controller.fit.types import TopologyMode, TopologyRequest
    from controller.inputs.snapshot import SnapshotError, gang_of

    def gang(annotations: dict[str, str], count: int = 10) -> Any:
        tpl = PodTemplate.model_validate({
            "metadata": {"name": "ppt-r-workers"},
            "template": {"metadata": {"annotations": annotations},
                         "spec": {"containers": [{"name": "c", "resources": {
                             "requests": {GPU: "8"}, "limits": {GPU: "8"}}}]}},
        })
        pr = ProvisioningRequest.model_validate({
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"provisioningClassName": "c", "podSets": [
                {"podTemplateRef": {"name": "ppt-r-workers"}, "count": count}]},
        })
        return gang_of(pr, {"ppt-r-workers": tpl}, DEFAULT_LEVELS)

    slices = {"kueue.x-k8s.io/podset-slice-required-topology": "topology.muster.dev/rack",
              "kueue.x-k8s.io/podset-slice-size": "4"}
    g = gang(slices, count=12)
    assert [(p.name, p.count, p.topology) for p in g.pod_sets] == [
        ("workers", 12, TopologyRequest(slice_level="topology.muster.dev/rack", slice_size=4))]
    with pytest.raises(SnapshotError, match=r"podset-slice-size\]: 4 does not divide "
                       r"spec.podSets\[0\].count 10"):
        gang(slices)
    outer = gang({**slices, "kueue.x-k8s.io/podset-required-topology":
                  "topology.muster.dev/block"}, count=12)
    assert [(p.name, p.topology) for p in outer.pod_sets] == [
        ("workers", TopologyRequest(TopologyMode.REQUIRED, "topology.muster.dev/block",
                                    "topology.muster.dev/rack", 4))], "both hold"
    with pytest.raises(SnapshotError, match=r"may not be set when kueue\.x-k8s\.io/podset-slice-r"):
        gang({"kueue.x-k8s.io/podset-slice-size": "4"})
    with pytest.raises(SnapshotError, match="greater than or equal to 1"):
        gang({**slices, "kueue.x-k8s.io/podset-slice-size": "0"})


def test_the_request_records_each_templates_pod_set_and_ready_reads_it_back() -> None:
    """The Ready check maps the request's pod sets back to the Workload's through the
    ``muster.dev/pod-sets`` record, also behind a hashed template name (nothing of the pod
    set's name is left in it)."""
    from controller.common.clock import ManualClock
    from controller.config import KueueConfig
    from controller.kueue.drafts import request_body
    from controller.kueue.workloads import CheckReconciler, KueueCache
    from controller.lifecycle import POD_SETS_ANNOTATION
    from controller.state.requests import RequestRecord

    wl = reserved([kq.pod_set("workers", 16, requests={GPU: "8"}),
                   kq.pod_set("launcher", 1, requests={"cpu": "1"})],
                  {"workers": {GPU: "h100"}, "launcher": {"cpu": "cpu"}})
    long_request = "r" * 245
    p = draft_request(wl, long_request, flavors=FLAVORS, class_name="atomic",
                      check_capacity_class="check", parameters={}, managed_resources=(),
                      pools=[POOL])
    workers = next(ps.template_name for ps in p.pod_sets if ps.pod_set == "workers")
    assert len(workers) == 253 and not workers.endswith("workers"), "hashed"
    body = request_body(long_request, "ns", p, [], "c",
                        {"metadata": {"name": "job", "uid": "u1"}})
    record = RequestRecord.parse(body)
    assert record.template_pod_sets == {ps.template_name: ps.pod_set for ps in p.pod_sets}
    assert POD_SETS_ANNOTATION in body["metadata"]["annotations"]
    # The request reconciler keys each pod set's domain by its own pod set name.
    from controller.inputs.snapshot import pod_set_name
    body["status"] = {"provisioningClassDetails": {
        f"muster.dev/podset.{pod_set_name(workers, long_request)}": "rack=r7"}}
    reconciler = CheckReconciler(kube=None, cache=KueueCache(),  # type: ignore[arg-type]
                                 config=KueueConfig(), clock=ManualClock(),
                                 events=None)  # type: ignore[arg-type]
    updates = reconciler.ready_updates(wl, RequestRecord.parse(body), None)
    by_name = {u.name: u for u in updates}
    assert by_name["workers"].node_selector == {"rack": "r7"}
    assert set(by_name) == {"workers", "launcher"}
