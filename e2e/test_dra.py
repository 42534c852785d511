"""Gangs whose pods claim DRA devices through a ResourceClaimTemplate, end to end: Muster
plans the claims on nodes that do not exist yet (the pool's node template publishes GPUs and
NICs), acquires them, the provider publishes the nodes' ResourceSlices, and the pods bind;
two requests never count the same devices."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.api.capacitypool import CapacityPool
from controller.commands import objects
from controller.inputs.dra_templates import NVIDIA_DRIVER, nvidia_gpu_node, render_resource_slices
from controller.kube.resources import (
    CAPACITY_POOLS,
    DEVICE_CLASSES,
    NODES,
    POD_TEMPLATES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from e2e.conftest import Env, eventually

ATOMIC = "atomic-provisioning.muster.dev"
CHECK = "check-capacity.muster.dev"
PCIE = "resource.kubernetes.io/pcieRoot"


async def _needs_dra(env: Env) -> None:
    """Skip on an API server that does not serve DRA (a capability of the cluster under
    test, not a hidden failure: the project's own tiers serve it)."""
    if not await env.kube.serves("resource.k8s.io/v1"):
        pytest.skip("this API server does not serve resource.k8s.io/v1 (DRA, Kubernetes "
                    ">= 1.34)")


async def _device_class(env: Env, name: str, expression: str) -> str:
    await _needs_dra(env)
    full = env.name(name)
    await env.kube.create(DEVICE_CLASSES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": full},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    })
    env.cleanup.append(lambda: env.kube.delete(DEVICE_CLASSES, full))
    return full


async def _pair_template(env: Env) -> None:
    """Each pod: 2 GPUs and 1 NIC on one PCIe root (4 pods per 8-GPU node)."""
    gpu = await _device_class(env, "gpu", f'device.driver == "{NVIDIA_DRIVER}" && '
                              f'device.attributes["{NVIDIA_DRIVER}"].type == "gpu"')
    nic = await _device_class(env, "nic", 'device.driver == "nic.example.com"')
    await env.kube.create(RESOURCE_CLAIM_TEMPLATES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu-pair", "namespace": env.namespace},
        "spec": {"spec": {"devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": gpu, "count": 2}},
                {"name": "nic", "exactly": {"deviceClassName": nic}},
            ],
            "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": PCIE}],
        }}},
    }, namespace=env.namespace)


async def _worker(env: Env) -> dict[str, Any]:
    worker: dict[str, Any] = objects.pod_template(
        "workers", namespace=env.namespace, requests={"cpu": "8", "memory": "64Gi"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
        node_selector=env.selector,
    )
    spec = worker["template"]["spec"]
    spec["resourceClaims"] = [{"name": "pair", "resourceClaimTemplateName": "gpu-pair"}]
    spec["containers"][0]["resources"]["claims"] = [{"name": "pair"}]
    await env.kube.create(POD_TEMPLATES, worker, namespace=env.namespace)
    return worker


async def test_gang_with_claim_template_is_provisioned_and_bound(env: Env) -> None:
    # Nodes of this pool have no nvidia.com/gpu extended resource: only DRA devices, 8 GPUs
    # and 8 NICs over 4 PCIe roots.
    pool = objects.gpu_pool(env.name("dra"), blocks=1, racks_per_block=1, nodes_per_rack=4,
                            max_nodes=4)
    template = pool["spec"]["nodeTemplate"]
    template["allocatable"].pop(objects.GPU)
    template["labels"].update(env.selector)
    template["resourceSlices"] = nvidia_gpu_node(gpus=8, nics=8, roots=4)
    await env.kube.create(CAPACITY_POOLS, pool)
    pool_name = pool["metadata"]["name"]
    env.cleanup.append(lambda: env.kube.delete(CAPACITY_POOLS, pool_name))
    await _pair_template(env)
    worker = await _worker(env)

    # 4 pods per node by devices (cpu alone would allow 12): 6 pods need 2 new nodes.
    await env.request("dra", [("workers", 6)], class_name=ATOMIC)
    cond = await env.wait_condition("dra", "Provisioned")
    assert cond["reason"] == "CapacityIsProvisioned"
    nodes = await env.pool_nodes(pool_name)
    assert len(nodes) == 2

    # The provider published the devices a driver on each new node would.
    names = {n["metadata"]["name"] for n in nodes}

    async def published() -> list[dict[str, Any]] | None:
        listing = await env.kube.list(RESOURCE_SLICES)
        mine = [s for s in listing.get("items") or [] if s["spec"].get("nodeName") in names]
        return mine if len(mine) == 4 else None

    slices = await eventually(published)
    gpus = [d for s in slices if s["spec"]["driver"] == NVIDIA_DRIVER
            for d in s["spec"]["devices"]]
    assert len(gpus) == 16
    assert len({d["attributes"]["uuid"]["string"] for d in gpus}) == 16

    await env.pods_for("dra", worker, 6)
    assert await eventually(lambda: _bound(env, 6), within=60) == 6
    if env.external:
        # The real kube-scheduler's DRA allocator, not Muster, allocated the claims: every
        # placement Muster planned must be one it accepts.
        await _claims_allocated_on_their_pods_nodes(env, slices, names, pods=6)


@pytest.mark.timeout(240)
async def test_a_native_gang_with_claim_templates_is_allocated_by_the_real_scheduler(
    env: Env,
) -> None:
    """A gang PodGroup (no request of the user's) of 6 pods, each claiming 2 GPUs and a NIC
    on one PCIe root through the ResourceClaimTemplate, in one rack: Muster plans the claims
    on nodes that do not exist yet and acquires 2 (4 pods' pairs per node); the fake provider
    publishes their ResourceSlices; the kube-scheduler's gang scheduling binds all 6 and its
    DRA allocator allocates every claim on the pod's node, as Muster planned."""
    from e2e.test_podgroups_real import _real, cleanup_groups, gang

    await _real(env)
    pool = objects.gpu_pool(env.name("dra"), blocks=1, racks_per_block=2, nodes_per_rack=4,
                            max_nodes=8)
    template = pool["spec"]["nodeTemplate"]
    template["allocatable"].pop(objects.GPU)
    template["labels"].update(env.selector)
    template["resourceSlices"] = nvidia_gpu_node(gpus=8, nics=8, roots=4)
    await env.kube.create(CAPACITY_POOLS, pool)
    pool_name = pool["metadata"]["name"]
    env.cleanup.append(lambda: env.kube.delete(CAPACITY_POOLS, pool_name))
    await _pair_template(env)
    env.cleanup.append(lambda: cleanup_groups(env))
    try:
        await gang(env, "pairs", 6, gpus=0, claim_template="gpu-pair")
        assert await eventually(lambda: _bound(env, 6), within=90,
                                what="the scheduler to bind the 6 pods") == 6
        nodes = await env.pool_nodes(pool_name)
        assert len(nodes) == 2
        assert len({n["metadata"]["labels"][objects.RACK] for n in nodes}) == 1
        names = {n["metadata"]["name"] for n in nodes}
        listing = await env.kube.list(RESOURCE_SLICES)
        slices = [s for s in listing.get("items") or [] if s["spec"].get("nodeName") in names]
        await _claims_allocated_on_their_pods_nodes(env, slices, names, pods=6)
    finally:
        await cleanup_groups(env)


async def _claims_allocated_on_their_pods_nodes(
    env: Env, slices: list[dict[str, Any]], nodes: set[str], *, pods: int,
) -> None:
    """Each bound pod's claim is allocated by the scheduler on the pod's node, one of
    ``nodes``: 2 GPUs and a NIC from that node's slices, all three on one PCIe root."""
    devices = {(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]):
               (s["spec"]["nodeName"], d["attributes"][PCIE]["string"])
               for s in slices for d in s["spec"]["devices"]}
    claims = {c["metadata"]["name"]: c for c in
              (await env.kube.list(RESOURCE_CLAIMS, namespace=env.namespace))["items"]}
    listing = await env.kube.list(PODS, namespace=env.namespace)
    seen = 0
    for pod in listing["items"]:
        node = pod["spec"]["nodeName"]
        assert node in nodes, f"{pod['metadata']['name']} bound on {node}, not Muster's"
        [status] = pod["status"]["resourceClaimStatuses"]
        allocation = claims[status["resourceClaimName"]]["status"]["allocation"]
        results = allocation["devices"]["results"]
        where = {devices[(r["driver"], r["pool"], r["device"])] for r in results}
        assert sorted(r["request"] for r in results) == ["gpu", "gpu", "nic"]
        assert len(where) == 1 and next(iter(where))[0] == node, (pod["metadata"]["name"],
                                                                  where)
        seen += 1
    assert seen == pods


async def test_two_requests_never_count_the_same_devices(env: Env) -> None:
    # One existing node whose driver publishes 8 GPUs and 8 NICs: room for 4 pods' pairs.
    name = env.name("dra-node")
    node = objects.node(name, allocatable={"cpu": "96", "memory": "1024Gi"},
                        labels={**env.selector, objects.BLOCK: "b1", objects.RACK: "b1-r1"},
                        taints=[objects.GPU_TAINT])
    await env.kube.create(NODES, node)
    env.cleanup.append(lambda: env.kube.delete(NODES, name))
    publisher = CapacityPool.model_validate(
        {"metadata": {"name": "publisher"},
         "spec": {"provider": "kind", "maxNodes": 1,
                  "nodeTemplate": {"allocatable": {"cpu": "1"},
                                   "resourceSlices": nvidia_gpu_node()}}})
    for body in render_resource_slices(publisher, name):
        await env.kube.create(RESOURCE_SLICES, body)
        slice_name = body["metadata"]["name"]
        env.cleanup.append(lambda n=slice_name: env.kube.delete(RESOURCE_SLICES, n))
    await _pair_template(env)
    await _worker(env)
    reasons = await env.compete(("first", "second"), [("workers", 3)], class_name=CHECK)
    # 3 + 3 pods need 6 same-root GPU pairs; the node has 4: one request must wait.
    assert reasons[1] == "True/CapacityIsFound"
    assert reasons[0] in ("False/CapacityIsNotFound", "False/RetriesExhausted")


async def test_claim_template_and_device_classes_created_after_the_request(env: Env) -> None:
    """``kubectl apply`` in the order request, PodTemplate, DeviceClasses, claim template:
    the request waits for what its pods claim through (retry.arrival_wait_seconds) and is
    planned once they arrive, instead of failing as an invalid request."""
    await _needs_dra(env)
    name = env.name("dra-node")
    node = objects.node(name, allocatable={"cpu": "96", "memory": "1024Gi"},
                        labels={**env.selector, objects.BLOCK: "b1", objects.RACK: "b1-r1"},
                        taints=[objects.GPU_TAINT])
    await env.kube.create(NODES, node)
    env.cleanup.append(lambda: env.kube.delete(NODES, name))
    publisher = CapacityPool.model_validate(
        {"metadata": {"name": "publisher"},
         "spec": {"provider": "kind", "maxNodes": 1,
                  "nodeTemplate": {"allocatable": {"cpu": "1"},
                                   "resourceSlices": nvidia_gpu_node()}}})
    for body in render_resource_slices(publisher, name):
        await env.kube.create(RESOURCE_SLICES, body)
        slice_name = body["metadata"]["name"]
        env.cleanup.append(lambda n=slice_name: env.kube.delete(RESOURCE_SLICES, n))
    await env.request("late", [("workers", 2)], class_name=CHECK)
    await _worker(env)
    await asyncio.sleep(2)
    assert await env.condition("late", "Failed") is None
    await _pair_template(env)
    cond = await env.wait_condition("late", "Provisioned")
    assert cond["reason"] == "CapacityIsFound", cond
    assert await env.condition("late", "Failed") is None


async def _bound(env: Env, want: int) -> int | None:
    got = await env.bound_pods()
    return got if got == want else None
