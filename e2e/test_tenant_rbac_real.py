"""A tenant under the sample Role of docs/concepts/tenancy.md (``config/samples/tenancy``), on the
real control plane with its RBAC authorizer: it gets capacity from Muster in its own namespace, and
is refused everything that would let it spend beyond its limits or forge Muster's state
(CapacityPools, Nodes, other namespaces, the requests' annotations and status)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
import yaml

from controller.commands import objects
from controller.kube import ApiError, KubeClient
from controller.kube.resources import (
    CAPACITY_POOLS,
    NAMESPACES,
    NODES,
    POD_TEMPLATES,
    PROVISIONING_REQUESTS,
)
from e2e import cluster as cp
from e2e.conftest import RUN_LABEL, eventually

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "config" / "samples" / "tenancy" / "tenant-role.yaml"
ATOMIC = "atomic-provisioning.muster.dev"


async def _status(call: Awaitable[object]) -> int:
    try:
        await call
    except ApiError as exc:
        return exc.status
    return 200


@pytest.fixture
async def tenancy(muster_rbac_clean: object, tmp_path: Path
                  ) -> AsyncIterator[tuple[KubeClient, KubeClient, str, str, str]]:
    """(admin, tenant, the tenant's namespace, another namespace, the run id): the sample
    Role bound to ServiceAccount ``tenant`` of its namespace, whose token the tenant uses."""
    cluster = cp.default_cluster()
    run = uuid.uuid4().hex[:8]
    mine, other = f"tenant-{run}", f"other-{run}"
    async with await KubeClient.from_kubeconfig(cluster.admin_kubeconfig) as admin:
        for ns in (mine, other):
            await admin.create(NAMESPACES, {"metadata": {"name": ns}})
        docs = list(yaml.safe_load_all(ROLE.read_text()))
        for doc in docs:
            doc["metadata"]["namespace"] = mine
            if doc["kind"] == "RoleBinding":
                doc["subjects"] = [{"kind": "ServiceAccount", "name": "tenant",
                                    "namespace": mine}]
        await asyncio.to_thread(cp.kubectl, cluster, "create", "serviceaccount", "tenant",
                                "-n", mine)
        await asyncio.to_thread(cp.kubectl, cluster, "apply", "-f", "-",
                                stdin=yaml.safe_dump_all(docs))
        token = await asyncio.to_thread(cp.service_account_token, cluster, "tenant", mine,
                                        duration="1h")
        path = tmp_path / "tenant.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {
                "server": cluster.server,
                "certificate-authority": str(cluster.state / "pki" / "ca.crt")}}],
            "users": [{"name": "tenant", "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "tenant"}}],
            "current-context": "c",
        }))
        pool = objects.gpu_pool(f"gpu-{run}")
        pool["spec"]["nodeTemplate"]["labels"][RUN_LABEL] = run
        await admin.create(CAPACITY_POOLS, pool)
        try:
            async with await KubeClient.from_kubeconfig(path) as tenant:
                yield admin, tenant, mine, other, run
        finally:
            listing = await admin.list(PROVISIONING_REQUESTS, namespace=mine)
            for pr in listing.get("items") or []:
                with contextlib.suppress(ApiError):
                    await admin.delete(PROVISIONING_REQUESTS, pr["metadata"]["name"],
                                       namespace=mine)

            async def released() -> bool:
                left = await admin.list(NODES, label_selector=f"{RUN_LABEL}={run}")
                reqs = await admin.list(PROVISIONING_REQUESTS, namespace=mine)
                return not left.get("items") and not reqs.get("items")

            await eventually(released, within=60, what="the tenant's nodes to be released")
            with contextlib.suppress(ApiError):
                await admin.delete(CAPACITY_POOLS, pool["metadata"]["name"])
            for ns in (mine, other):
                with contextlib.suppress(ApiError):
                    await admin.delete(NAMESPACES, ns)


async def test_a_tenant_gets_capacity_in_its_namespace_and_nothing_more(
    tenancy: tuple[KubeClient, KubeClient, str, str, str],
) -> None:
    _, tenant, mine, other, run = tenancy
    template = objects.pod_template(
        "workers", namespace=mine, requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
        node_selector={RUN_LABEL: run})
    await tenant.create(POD_TEMPLATES, template, namespace=mine)
    await tenant.create(PROVISIONING_REQUESTS, objects.provisioning_request(
        "train", pod_sets=[("workers", 2)], namespace=mine, class_name=ATOMIC), namespace=mine)

    async def provisioned() -> bool:
        pr = await tenant.get(PROVISIONING_REQUESTS, "train", namespace=mine)
        return any(c["type"] == "Provisioned" and c["status"] == "True"
                   for c in (pr.get("status") or {}).get("conditions") or [])

    await eventually(provisioned, within=60, what="Muster to provision the tenant's request")

    # Refused: another namespace, CapacityPools, Nodes, Muster's state on its own request.
    elsewhere = objects.provisioning_request("x", pod_sets=[("workers", 1)], namespace=other)
    assert await _status(tenant.create(PROVISIONING_REQUESTS, elsewhere, namespace=other)) == 403
    assert await _status(tenant.create(POD_TEMPLATES, {**template, "metadata": {
        "name": "workers", "namespace": other}}, namespace=other)) == 403
    assert await _status(tenant.create(CAPACITY_POOLS, objects.gpu_pool(f"mine-{run}"))) == 403
    assert await _status(tenant.list(CAPACITY_POOLS)) == 403
    assert await _status(tenant.list(NODES)) == 403
    assert await _status(tenant.create(NODES, objects.node(
        f"fake-{run}", allocatable={"cpu": "1"}))) == 403
    forged = {"metadata": {"annotations": {"muster.dev/plan": "{}",
                                           "muster.dev/phase": "Booked"}}}
    assert await _status(tenant.merge_patch(PROVISIONING_REQUESTS, "train", forged,
                                            namespace=mine)) == 403
    assert await _status(tenant.patch_status(PROVISIONING_REQUESTS, "train", {"conditions": []},
                                             namespace=mine)) == 403
    # Its own request it may delete: Muster releases the nodes (the fixture checks).
    await tenant.delete(PROVISIONING_REQUESTS, "train", namespace=mine)

