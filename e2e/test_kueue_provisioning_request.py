"""Path A: Kueue's built-in provisioning check (``kueue.x-k8s.io/provisioning-request``) with a
Muster class. Kueue writes the ProvisioningRequest and PodTemplates; Muster only serves them.

The whole path with the real Kueue (one rack provisioned, Kueue's TAS assignment in it, pods
bound; parameters Kueue passes) is ``e2e/test_kueue_real.py``. What stays here: a request
whose pod set carries Kueue's slice annotations (``podset-slice-required-topology``,
``podset-slice-size``), which the real tier has no scenario for yet.

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
    PROVISIONING_REQUESTS,
)
from controller.kueue import objects as kq
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


async def test_path_a_keeps_every_tas_slice_inside_one_rack(kueue_env: KueueEnv) -> None:
    """Played by the test: Kueue's slice annotations on a path A request. Real Kueue can send
    them; the real tier has no slice scenario yet, so this stays until one exists."""
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
