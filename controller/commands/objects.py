"""Builders of the Kubernetes objects the demo, the e2e tests and the benchmark submit.

Plain dicts in the shape ``kubectl apply`` takes, so the same objects work against the
sandbox and a kind cluster. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.common.topology_defaults import DEFAULT_LEVELS, MUSTER_REQUIRED
from controller.state.object_store import CONSUME_ANNOTATION

BLOCK, RACK, HOSTNAME = DEFAULT_LEVELS
GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}

Body = dict[str, Any]


def node(
    name: str,
    *,
    allocatable: Mapping[str, str],
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    ready: bool = True,
) -> Body:
    """An existing node (as a kubelet or kwok would register it)."""
    alloc = {"pods": "110", **allocatable}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {HOSTNAME: name, **(labels or {})}},
        "spec": {"taints": [dict(t) for t in taints]},
        "status": {
            "capacity": alloc,
            "allocatable": alloc,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}
            ],
        },
    }


def gpu_pool(
    name: str = "gpu-h100",
    *,
    blocks: int = 2,
    racks_per_block: int = 4,
    nodes_per_rack: int = 16,
    max_nodes: int = 128,
    rack_limits: Mapping[str, int] | None = None,
    parameters: Mapping[str, Any] | None = None,
    gpus: int = 8,
    price: float = 98.0,
) -> Body:
    """A CapacityPool of 8-GPU nodes in racks grouped into blocks (``b1-r1`` ...); one
    acquisition lands in one rack."""
    limits = rack_limits or {}
    domains = []
    for b in range(1, blocks + 1):
        for r in range(1, racks_per_block + 1):
            rack = f"b{b}-r{r}"
            domain: Body = {"labels": {BLOCK: f"b{b}", RACK: rack}}
            if rack in limits:
                domain["maxNodes"] = limits[rack]
            domains.append(domain)
    return {
        "apiVersion": "muster.dev/v1alpha1",
        "kind": "CapacityPool",
        "metadata": {"name": name},
        "spec": {
            "provider": "kind",
            "parameters": dict(parameters or {}),
            "nodeTemplate": {
                "labels": {"muster.dev/accelerator": "h100"},
                "taints": [GPU_TAINT],
                "allocatable": {"cpu": "96", "memory": "1024Gi", GPU: str(gpus), "pods": "110"},
            },
            "topology": {"level": RACK, "maxNodesPerDomain": nodes_per_rack, "domains": domains},
            "maxNodes": max_nodes,
            "pricePerNodeHour": price,
            "expectedReadySeconds": 1,
        },
    }


def pod_template(
    name: str,
    *,
    namespace: str = "default",
    requests: Mapping[str, str],
    required_level: str | None = None,
    tolerations: Sequence[Mapping[str, str]] = (),
    node_selector: Mapping[str, str] | None = None,
) -> Body:
    annotations = {MUSTER_REQUIRED: required_level} if required_level else {}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "template": {
            "metadata": {"annotations": annotations, "labels": {"app": name}},
            "spec": _pod_spec(requests, tolerations, node_selector),
        },
    }


def provisioning_request(
    name: str,
    *,
    pod_sets: Sequence[tuple[str, int]],
    namespace: str = "default",
    class_name: str = "atomic-provisioning.muster.dev",
    parameters: Mapping[str, str] | None = None,
) -> Body:
    spec: Body = {
        "provisioningClassName": class_name,
        "podSets": [{"podTemplateRef": {"name": t}, "count": c} for t, c in pod_sets],
    }
    if parameters:
        spec["parameters"] = dict(parameters)
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def consumer_pod(
    name: str,
    *,
    request: str,
    template: Body,
    node_selector: Mapping[str, str] | None = None,
) -> Body:
    """A pod of ``template`` that consumes ProvisioningRequest ``request`` (what a Job
    admitted by Kueue would create), optionally pinned with ``node_selector``."""
    meta = template["metadata"]
    spec = dict(template["template"]["spec"])
    if node_selector:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), **node_selector}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": dict(template["template"]["metadata"].get("labels", {})),
            "annotations": {CONSUME_ANNOTATION: request},
        },
        "spec": spec,
    }


def _pod_spec(
    requests: Mapping[str, str],
    tolerations: Sequence[Mapping[str, str]],
    node_selector: Mapping[str, str] | None,
) -> Body:
    spec: Body = {
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.9",
                "resources": {"requests": dict(requests), "limits": {
                    k: v for k, v in requests.items() if k == GPU
                }},
            }
        ],
        "tolerations": [dict(t) for t in tolerations],
        "restartPolicy": "Never",
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return spec


def placement_selector(details: Mapping[str, str], levels: Sequence[str] = DEFAULT_LEVELS) -> dict[
    str, str
]:
    """The nodeSelector Kueue would build from ``provisioningClassDetails``
    (``valueFromProvisioningClassDetail`` for each topology level label present)."""
    return {level: details[level] for level in levels if level in details}
