"""ResourceSlices for nodes Muster creates, and node templates shaped like real DRA drivers.

:func:`render_resource_slices` is what a provider (the fake provider in particular)
publishes for a node it created from a CapacityPool: the pool's
``spec.nodeTemplate.resourceSlices`` bound to the node (``nodeName``, pool named after the
node unless the template names it, one pool per driver), with per-device identity the real
driver would report (``uuid`` for NVIDIA GPUs, derived deterministically from the node and
device names so re-publishing is idempotent).

:func:`nvidia_gpu_node` / :func:`nvidia_mig_node` build template slices the way the NVIDIA
DRA driver (``gpu.nvidia.com``) publishes devices: ``gpu-<minor>`` with ``type``, ``uuid``,
``productName``, ``brand``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
``index``, ``resource.kubernetes.io/pcieRoot`` and ``memory`` capacity, plus NICs sharing the
PCIe roots; MIG partitions as partitionable devices consuming counters of their GPU.

Pure functions (no I/O): the caller applies the objects.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from controller.api.capacitypool import CapacityPool
from controller.api.dra import ResourceSliceTemplate

NVIDIA_DRIVER = "gpu.nvidia.com"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
_NAMESPACE = uuid.UUID("5f0e1a52-6d0b-4cf4-9a57-2f3c1e0d9b11")
"""Namespace of the deterministic device uuids (any fixed value works)."""


def _dns(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:200]


def device_uuid(node_name: str, device: str) -> str:
    """A stable ``GPU-<uuid>`` for one device of one node."""
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{node_name}/{device}')}"


def render_resource_slices(pool: CapacityPool, node_name: str) -> list[dict[str, Any]]:
    """The ResourceSlice objects a new node of ``pool`` publishes (empty without templates)."""
    # Since Kubernetes 1.35 a slice holds devices or sharedCounters, not both: a template
    # with both is published as two slices of the same pool.
    parts: list[tuple[ResourceSliceTemplate, bool, bool]] = []
    for t in pool.spec.node_template.resource_slices:
        if t.devices and t.shared_counters:
            parts.extend([(t, False, True), (t, True, False)])
        else:
            parts.append((t, True, True))
    per_pool: dict[tuple[str, str], int] = {}
    for t, _, _ in parts:
        key = (t.driver, t.pool.name if t.pool else node_name)
        per_pool[key] = per_pool.get(key, 0) + 1
    out: list[dict[str, Any]] = []
    for i, (t, with_devices, with_counters) in enumerate(parts):
        pool_name = t.pool.name if t.pool else node_name
        generation = t.pool.generation if t.pool else 1
        spec: dict[str, Any] = {
            "driver": t.driver,
            "pool": {
                "name": pool_name,
                "generation": generation,
                "resourceSliceCount": per_pool[(t.driver, pool_name)],
            },
            "nodeName": node_name,
        }
        devices = [d.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
                   for d in (t.devices if with_devices else ())]
        for dev in devices:
            attrs = dev.setdefault("attributes", {})
            if t.driver == NVIDIA_DRIVER and attrs.get("type", {}).get("string") in (
                "gpu", "mig",
            ) and "uuid" not in attrs:
                attrs["uuid"] = {"string": device_uuid(node_name, dev["name"])}
            if not attrs:
                del dev["attributes"]
        if devices:
            spec["devices"] = devices
        if t.shared_counters and with_counters:
            spec["sharedCounters"] = [
                c.model_dump(by_alias=True, exclude_none=True) for c in t.shared_counters
            ]
        out.append({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": f"{_dns(node_name)}-{_dns(t.driver)}-{i}",
                "labels": {"muster.dev/pool": pool.metadata.name},
            },
            "spec": spec,
        })
    return out


# ---------------------------------------------------------------------------- templates


def _gpu(minor: int, root: str, product: str, memory: str, arch: str, cc: str,
         driver_version: str) -> dict[str, Any]:
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": minor},
            "productName": {"string": product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": arch},
            "cudaComputeCapability": {"version": cc},
            "driverVersion": {"version": driver_version},
            PCIE_ROOT: {"string": root},
        },
        "capacity": {"memory": {"value": memory}},
    }


def pcie_root(index: int) -> str:
    return f"pci0000:{0x10 * (index + 1):02x}"


def nvidia_gpu_node(
    gpus: int = 8,
    nics: int = 8,
    roots: int = 4,
    *,
    product: str = "NVIDIA H100 80GB HBM3",
    memory: str = "80Gi",
    architecture: str = "Hopper",
    compute_capability: str = "9.0.0",
    driver_version: str = "550.54.15",
    nic_driver: str = "nic.example.com",
) -> list[dict[str, Any]]:
    """Template slices for a node with ``gpus`` GPUs and ``nics`` NICs spread evenly over
    ``roots`` PCIe roots (GPU i and NIC i on root ``i * roots // count``)."""
    out: list[dict[str, Any]] = [{
        "driver": NVIDIA_DRIVER,
        "devices": [
            _gpu(i, pcie_root(i * roots // gpus), product, memory, architecture,
                 compute_capability, driver_version)
            for i in range(gpus)
        ],
    }]
    if nics:
        out.append({
            "driver": nic_driver,
            "devices": [
                {
                    "name": f"nic-{i}",
                    "attributes": {
                        "type": {"string": "nic"},
                        "speedGbps": {"int": 400},
                        PCIE_ROOT: {"string": pcie_root(i * roots // nics)},
                    },
                }
                for i in range(nics)
            ],
        })
    return out


MIG_PROFILES: Mapping[str, tuple[int, int]] = {
    # profile -> (memory slices, multiprocessors) on an 80 GB H100 with 8 memory slices.
    "1g.10gb": (1, 16),
    "2g.20gb": (2, 32),
    "3g.40gb": (4, 60),
    "7g.80gb": (8, 132),
}


def nvidia_mig_node(
    gpus: int = 1,
    profiles: Sequence[str] = ("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"),
) -> list[dict[str, Any]]:
    """Partitionable GPUs (the driver's DynamicMIG mode): per GPU one counter set
    ``gpu-<minor>-counter-set`` with ``memory`` and ``multiprocessors``; the full GPU and
    every MIG placement consume from it, so taking one partition shrinks what is left."""
    slices = 8
    devices: list[dict[str, Any]] = []
    counter_sets: list[dict[str, Any]] = []
    for g in range(gpus):
        cset = f"gpu-{g}-counter-set"
        counter_sets.append({
            "name": cset,
            "counters": {
                "memory": {"value": f"{80 * (2**30)}"},
                "multiprocessors": {"value": "132"},
                **{f"memorySlice{k}": {"value": "1"} for k in range(slices)},
            },
        })
        full = _gpu(g, pcie_root(g), "NVIDIA H100 80GB HBM3", "80Gi", "Hopper", "9.0.0",
                    "550.54.15")
        full["consumesCounters"] = [{
            "counterSet": cset,
            "counters": {
                "memory": {"value": f"{80 * (2**30)}"},
                "multiprocessors": {"value": "132"},
                **{f"memorySlice{k}": {"value": "1"} for k in range(slices)},
            },
        }]
        devices.append(full)
        for profile in profiles:
            mem_slices, sms = MIG_PROFILES[profile]
            for start in range(0, slices - mem_slices + 1, mem_slices):
                devices.append({
                    "name": f"gpu-{g}-mig-{profile}-{start}",
                    "attributes": {
                        "type": {"string": "mig"},
                        "profile": {"string": profile},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                        PCIE_ROOT: {"string": pcie_root(g)},
                    },
                    "capacity": {"memory": {"value": f"{mem_slices * 10}Gi"},
                                 "multiprocessors": {"value": str(sms)}},
                    "consumesCounters": [{
                        "counterSet": cset,
                        "counters": {
                            "memory": {"value": f"{mem_slices * 10 * (2**30)}"},
                            "multiprocessors": {"value": str(sms)},
                            **{f"memorySlice{start + k}": {"value": "1"}
                               for k in range(mem_slices)},
                        },
                    }],
                })
    return [{"driver": NVIDIA_DRIVER, "sharedCounters": counter_sets, "devices": devices}]
