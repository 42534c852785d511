"""API-object builders for the DRA tests: clusters are written as the objects a real cluster
would hold (Nodes, ResourceSlices, DeviceClasses, ResourceClaimTemplates, CapacityPools) and
go through the same snapshot builder as the controller."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.api.capacitypool import CapacityPool
from controller.fit import Mode, Result, Snapshot, plan
from controller.fit.types import GangRequest
from controller.inputs.dra_templates import NVIDIA_DRIVER, render_resource_slices
from controller.inputs.snapshot import request_from_documents, snapshot_from_documents

NIC_DRIVER = "nic.example.com"
PCIE = "resource.kubernetes.io/pcieRoot"
NS = "team-a"

Doc = dict[str, Any]


def device_class(name: str, *expressions: str) -> Doc:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


CLASSES: list[Doc] = [
    device_class("gpu.nvidia.com",
                 f'device.driver == "{NVIDIA_DRIVER}" && '
                 f'device.attributes["{NVIDIA_DRIVER}"].type == "gpu"'),
    device_class("mig.nvidia.com",
                 f'device.driver == "{NVIDIA_DRIVER}" && '
                 f'device.attributes["{NVIDIA_DRIVER}"].type == "mig"'),
    device_class("nic", f'device.driver == "{NIC_DRIVER}"'),
    device_class("any"),
]


def node(name: str, labels: Mapping[str, str] | None = None, cpu: str = "190",
         memory: str = "2000Gi", pods: str = "110") -> Doc:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                              **(labels or {})}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pool_doc(name: str, slices: Sequence[Doc], *, max_nodes: int = 4, price: float = 10.0,
             labels: Mapping[str, str] | None = None, cpu: str = "190") -> Doc:
    return {
        "apiVersion": "muster.dev/v1alpha1", "kind": "CapacityPool",
        "metadata": {"name": name},
        "spec": {
            "provider": "fake",
            "nodeTemplate": {"labels": dict(labels or {}),
                             "allocatable": {"cpu": cpu, "memory": "2000Gi", "pods": "110"},
                             "resourceSlices": list(slices)},
            "maxNodes": max_nodes,
            "pricePerNodeHour": price,
        },
    }


def published(name: str, slices: Sequence[Doc]) -> list[Doc]:
    """The ResourceSlices a node with these template slices publishes."""
    pool = CapacityPool.model_validate(pool_doc("publisher", slices))
    return render_resource_slices(pool, name)


def dra_node(name: str, slices: Sequence[Doc], labels: Mapping[str, str] | None = None,
             cpu: str = "190") -> list[Doc]:
    return [node(name, labels, cpu=cpu), *published(name, slices)]


def exactly(name: str, device_class: str, count: int | None = 1, *, selectors: Sequence[str] = (),
            mode: str | None = None, capacity: Mapping[str, str] | None = None) -> Doc:
    body: Doc = {"deviceClassName": device_class}
    if mode is not None:
        body["allocationMode"] = mode
    elif count is not None:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        body["capacity"] = {"requests": dict(capacity)}
    return {"name": name, "exactly": body}


def first_available(name: str, *subs: tuple[str, str, int]) -> Doc:
    return {"name": name, "firstAvailable": [
        {"name": n, "deviceClassName": c, "count": k} for n, c, k in subs
    ]}


def claim_template(name: str, requests: Sequence[Doc], *, match: Sequence[tuple[str, Sequence[str]]]
                   = (), distinct: Sequence[tuple[str, Sequence[str]]] = ()) -> Doc:
    constraints = [{"matchAttribute": a, "requests": list(r)} for a, r in match]
    constraints += [{"distinctAttribute": a, "requests": list(r)} for a, r in distinct]
    devices: Doc = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": devices}},
    }


def gang_docs(name: str, pod_sets: Sequence[tuple[str, int, Sequence[str]]], *,
              cpu: str = "8", required: str | None = None) -> list[Doc]:
    """A ProvisioningRequest whose pod sets each claim the given templates per pod."""
    docs: list[Doc] = [{
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"provisioningClassName": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
                 "podSets": [{"podTemplateRef": {"name": f"ppt-{name}-{ps}"}, "count": n}
                             for ps, n, _ in pod_sets]},
    }]
    for ps, _, templates in pod_sets:
        meta: Doc = {}
        if required:
            meta["annotations"] = {"kueue.x-k8s.io/podset-required-topology": required}
        docs.append({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": f"ppt-{name}-{ps}", "namespace": NS},
            "template": {
                "metadata": meta,
                "spec": {
                    "containers": [{"name": "main", "resources": {
                        "requests": {"cpu": cpu},
                        "claims": [{"name": f"c{i}"} for i in range(len(templates))],
                    }}],
                    "resourceClaims": [{"name": f"c{i}", "resourceClaimTemplateName": t}
                                       for i, t in enumerate(templates)],
                },
            },
        })
    return docs


def build(cluster: Sequence[Doc], request: Sequence[Doc], pools: Sequence[Doc] = ()
          ) -> tuple[GangRequest, Snapshot]:
    _, gang = request_from_documents(list(request), cluster=list(cluster))
    snap = snapshot_from_documents(list(cluster), list(pools))
    return gang, snap


def run(cluster: Sequence[Doc], request: Sequence[Doc], pools: Sequence[Doc] = (),
        mode: Mode = Mode.CHECK) -> Result:
    gang, snap = build(cluster, request, pools)
    return plan(gang, snap, mode)
