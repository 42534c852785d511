"""Path A: Kueue's built-in provisioning check (``kueue.x-k8s.io/provisioning-request``) with a
Muster class. Kueue writes the ProvisioningRequest and PodTemplates; Muster only serves them.

The test plays Kueue's provisioning controller for a Workload on a TAS flavor with a
required rack-level topology annotation: PodTemplates ``ppt-<request>-<pod set>`` created
first (labelled ``kueue.x-k8s.io/managed=true``, controlled by the Workload, the flavor's
nodeLabels and tolerations merged in), then the request ``<workload>-<check>-<attempt>``
controlled by the Workload, then template ownership moved to the request.
"""

from __future__ import annotations

import copy
from typing import Any

from controller.commands import objects
from controller.kube.resources import (
    CAPACITY_POOLS,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
)
from controller.kueue import objects as kq
from controller.kueue.decisions import CLASS_ANNOTATION, CONSUME_ANNOTATION, verdict
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    TOPOLOGIES,
    WORKLOADS,
)
from controller.topology_defaults import DEFAULT_LEVELS, KUEUE_REQUIRED, POOL_LABEL
from e2e.conftest import eventually
from e2e.kueue_support import KueueEnv, kueue_env, sandbox_only

__all__ = ["kueue_env", "sandbox_only"]

MANAGED = {"kueue.x-k8s.io/managed": "true"}
CLASS = "atomic-provisioning.muster.dev"
TAS_FLAVOR = kq.resource_flavor(
    "tas-h100", node_labels={"muster.dev/accelerator": "h100"},
    tolerations=[objects.GPU_TOLERATION], topology="default")


def owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


async def setup(env: KueueEnv) -> None:
    await env.kube.create(NODES, objects.node(
        "cpu-1", allocatable={"cpu": "16", "memory": "64Gi"},
        labels={objects.BLOCK: "b1", objects.RACK: "b1-r1"}))
    await env.kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu-h100", rack_limits={"b1-r1": 4}))
    await env.kube.create(TOPOLOGIES, kq.topology("default", DEFAULT_LEVELS))
    await env.kube.create(RESOURCE_FLAVORS, TAS_FLAVOR)
    await env.kube.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
        "muster-tas", class_name=CLASS,
        selector_details={objects.RACK: objects.RACK}))
    await env.kube.create(ADMISSION_CHECKS, kq.admission_check(
        "prov", controller_name="kueue.x-k8s.io/provisioning-request", config="muster-tas"))


async def kueue_creates_request(
    env: KueueEnv, workload: str, workers: int, *, attempt: int = 1,
    annotations: dict[str, str] | None = None,
) -> str:
    """What Kueue's provisioning controller writes for the Workload (syncOwnedProvisionRequest)."""
    wl = await env.kube.create(WORKLOADS, kq.workload(
        workload, env.namespace, queue="team", pod_sets=[
            kq.pod_set("workers", workers,
                       requests={"cpu": "90", "memory": "900Gi", objects.GPU: "8"},
                       annotations=annotations or {KUEUE_REQUIRED: objects.RACK}),
            kq.pod_set("launcher", 1, requests={"cpu": "2", "memory": "4Gi"}),
        ]), namespace=env.namespace)
    name = f"{workload}-prov-{attempt}"
    templates = []
    for ps in wl["spec"]["podSets"]:
        template = copy.deepcopy(ps["template"])
        if ps["name"] == "workers":  # the TAS flavor's nodeLabels and tolerations
            template["spec"]["nodeSelector"] = {"muster.dev/accelerator": "h100"}
            template["spec"]["tolerations"] = [objects.GPU_TOLERATION]
        tname = f"ppt-{name}-{ps['name']}"
        await env.kube.create(POD_TEMPLATES, {
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": tname, "namespace": env.namespace, "labels": MANAGED,
                         "ownerReferences": [owner(wl)]},
            "template": template,
        }, namespace=env.namespace)
        templates.append((tname, ps["count"]))
    pr = await env.kube.create(PROVISIONING_REQUESTS, {
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": env.namespace, "labels": MANAGED,
                     "ownerReferences": [owner(wl)]},
        "spec": {"provisioningClassName": CLASS,
                 "podSets": [{"podTemplateRef": {"name": t}, "count": c} for t, c in templates]},
    }, namespace=env.namespace)
    for tname, _ in templates:
        await env.kube.merge_patch(POD_TEMPLATES, tname,
                                   {"metadata": {"ownerReferences": [owner(pr)]}},
                                   namespace=env.namespace)
    return name


async def condition(env: KueueEnv, name: str, type_: str) -> dict[str, Any] | None:
    pr = await env.kube.get(PROVISIONING_REQUESTS, name, namespace=env.namespace)
    for c in (pr.get("status") or {}).get("conditions") or []:
        if c["type"] == type_ and c["status"] == "True":
            return dict(c)
    return None


def kueue_check_state(pr: dict[str, Any], *, attempt: int = 1, retry_count: int = 0) -> Any:
    return verdict(pr["status"]["conditions"], attempt=attempt, retry_count=retry_count,
                   backoff_limit=3, backoff_base=60, backoff_max=1800, admitted=False,
                   active=True, finished=False)


async def test_path_a_provisions_one_rack_labelled_with_the_topology_levels(
    kueue_env: KueueEnv,
) -> None:
    env = kueue_env
    await setup(env)
    name = await kueue_creates_request(env, "tas-job", 16)
    await eventually(lambda: condition(env, name, "Provisioned"), within=40,
                     what="Provisioned=True")
    pr = await env.kube.get(PROVISIONING_REQUESTS, name, namespace=env.namespace)
    details = pr["status"]["provisioningClassDetails"]
    rack = details[objects.RACK]
    assert rack != "b1-r1"
    state = kueue_check_state(pr)
    assert state.state == "Ready", "Kueue would mark its check Ready"

    nodes = (await env.kube.list(NODES, label_selector=f"{POOL_LABEL}=gpu-h100")).get("items")
    assert len(nodes or []) == 16
    for node in nodes or []:
        labels = node["metadata"]["labels"]
        assert all(level in labels for level in DEFAULT_LEVELS), (
            "every Topology level label is on the node, for Kueue's second TAS pass")
        assert labels[objects.RACK] == rack
        assert node["spec"]["taints"] == [objects.GPU_TAINT]

    # Kueue's podSetUpdates: consume annotations + nodeSelector from the class detail the
    # ProvisioningRequestConfig names; the Job's pods then land in the booked rack.
    selector = {objects.RACK: details[objects.RACK]}
    wl = await env.kube.get(WORKLOADS, "tas-job", namespace=env.namespace)
    for i in range(16):
        spec = copy.deepcopy(wl["spec"]["podSets"][0]["template"]["spec"])
        spec["nodeSelector"] = {"muster.dev/accelerator": "h100", **selector}
        spec["tolerations"] = [objects.GPU_TOLERATION]
        await env.kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"tas-job-workers-{i}", "namespace": env.namespace,
                         "annotations": {CONSUME_ANNOTATION: name, CLASS_ANNOTATION: CLASS}},
            "spec": spec,
        }, namespace=env.namespace)
    launcher = copy.deepcopy(wl["spec"]["podSets"][1]["template"]["spec"])
    await env.kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "tas-job-launcher-0", "namespace": env.namespace,
                     "annotations": {CONSUME_ANNOTATION: name, CLASS_ANNOTATION: CLASS}},
        "spec": launcher,
    }, namespace=env.namespace)

    async def consumed() -> dict[str, Any] | None:
        return await condition(env, name, "BookingExpired")
    expired = await eventually(consumed, within=30, what="booking consumed")
    assert expired["reason"] == "CapacityBookingConsumed"
    pods = (await env.kube.list(PODS, namespace=env.namespace)).get("items") or []
    node_rack = {n["metadata"]["name"]: n["metadata"]["labels"][objects.RACK]
                 for n in (await env.kube.list(NODES)).get("items") or []}
    workers = [p for p in pods if p["metadata"]["name"].startswith("tas-job-workers-")]
    assert len(workers) == 16
    assert {node_rack[p["spec"]["nodeName"]] for p in workers} == {rack}
    after = kueue_check_state(
        await env.kube.get(PROVISIONING_REQUESTS, name, namespace=env.namespace))
    assert after.state == "Retry", (
        "before admission Kueue treats BookingExpired as a failure, after it ignores it")


async def test_path_a_fails_only_a_request_that_can_never_fit(kueue_env: KueueEnv) -> None:
    env = kueue_env
    await setup(env)
    # 20 nodes in one rack: every rack holds at most 16, so waiting cannot help.
    name = await kueue_creates_request(env, "huge", 20)
    failed = await eventually(lambda: condition(env, name, "Failed"), within=30,
                              what="Failed=True")
    assert failed["reason"] == "CapacityNeverFits"
    assert "rack" in failed["message"]
    pr = await env.kube.get(PROVISIONING_REQUESTS, name, namespace=env.namespace)
    state = kueue_check_state(pr)
    assert state.state == "Retry"
    assert state.message.startswith("Retrying after failure: The request can never fit")
    assert not (await env.kube.list(NODES, label_selector=f"{POOL_LABEL}=gpu-h100")).get(
        "items"), "nothing acquired for a request that never fits"


async def test_path_a_keeps_every_tas_slice_inside_one_rack(kueue_env: KueueEnv) -> None:
    env = kueue_env
    await setup(env)
    # Racks hold at most 6 more nodes each: 12 workers in slices of 4 need 3 racks, 4 + 4 + 4,
    # never 6 + 6 (which would split a slice across racks).
    pool = await env.kube.get(CAPACITY_POOLS, "gpu-h100")
    for d in pool["spec"]["topology"]["domains"]:
        d["maxNodes"] = 6
    await env.kube.merge_patch(CAPACITY_POOLS, "gpu-h100",
                               {"spec": {"topology": pool["spec"]["topology"]}})
    name = await kueue_creates_request(env, "sliced", 12, annotations={
        "kueue.x-k8s.io/podset-slice-required-topology": objects.RACK,
        "kueue.x-k8s.io/podset-slice-size": "4"})
    await eventually(lambda: condition(env, name, "Provisioned"), within=40,
                     what="Provisioned=True")
    nodes = (await env.kube.list(NODES, label_selector=f"{POOL_LABEL}=gpu-h100")).get("items")
    per_rack: dict[str, int] = {}
    for node in nodes or []:
        rack = node["metadata"]["labels"][objects.RACK]
        per_rack[rack] = per_rack.get(rack, 0) + 1
    assert sum(per_rack.values()) == 12
    assert all(n % 4 == 0 for n in per_rack.values()), per_rack
    pr = await env.kube.get(PROVISIONING_REQUESTS, name, namespace=env.namespace)
    details = pr["status"]["provisioningClassDetails"]
    assert objects.RACK not in details, (
        "slices in several racks: no single rack for Kueue to pin every pod to")
    # One pod set in three racks: no single domain to pin it to either.
    assert "muster.dev/podset.workers" not in details, details
