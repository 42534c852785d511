"""Native gangs without Kueue: Kubernetes 1.37's workload-aware scheduling (``PodGroup``
``scheduling.k8s.io/v1beta1``, gang policy ``minCount``, a topology constraint) with the real
kube-scheduler's gang scheduling, and Muster provisioning for the group as one gang.

The user creates a PodGroup and its pods (``spec.schedulingGroup.podGroupName``) and nothing
else. The scheduler finds no room and says so on the PodGroup; Muster plans the group's
pending pods as one gang (in one rack when the PodGroup asks for it), acquires every node or
none, and the scheduler binds the whole group on those nodes. A group that can never fit gets
no node and a Warning Event on the PodGroup saying why; two groups competing for stock that
holds one of them end with one group running and the other told it cannot be provisioned, no
pod of it bound (no partial gang) and no node left to it.

Real tier only: the sandbox does not serve the API, and its scheduler has no gangs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.commands import objects
from controller.inputs.podgroup_membership import request_name
from controller.kube import Body
from controller.kube.resources import EVENTS, NODES, PODS, PROVISIONING_REQUESTS
from controller.podgroups.integration import POD_GROUPS
from e2e.conftest import Env, eventually


async def _real(env: Env) -> None:
    if not env.external or not await env.kube.serves("scheduling.k8s.io/v1beta1"):
        pytest.skip("needs scheduling.k8s.io/v1beta1 PodGroups and a gang-scheduling "
                    "kube-scheduler: the real tier's 1.37 control plane")


async def gang(env: Env, name: str, pods: int, *, min_count: int | None = None,
               topology: str | None = objects.RACK, gpus: int = 8,
               claim_template: str | None = None) -> None:
    """A PodGroup and its ``pods`` pods of ``gpus`` GPUs each (extended resource; or a claim
    from ``claim_template``), pinned to this run's nodes."""
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count or pods}}}
    if topology:
        spec["schedulingConstraints"] = {"topology": [{"key": topology}]}
    await env.kube.create(POD_GROUPS, {
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": env.namespace}, "spec": spec,
    }, namespace=env.namespace)
    requests = {"cpu": "8", "memory": "64Gi"}
    if gpus:
        requests[objects.GPU] = str(gpus)
    for i in range(pods):
        container: dict[str, Any] = {"name": "w", "image": "trainer",
                                     "resources": {"requests": dict(requests)}}
        if gpus:
            container["resources"]["limits"] = {objects.GPU: str(gpus)}
        extra: dict[str, Any] = {}
        if claim_template:
            container["resources"]["claims"] = [{"name": "pair"}]
            extra["resourceClaims"] = [{"name": "pair",
                                        "resourceClaimTemplateName": claim_template}]
        await env.kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{i}", "namespace": env.namespace,
                         "labels": {"app": name}},
            "spec": {
                "schedulingGroup": {"podGroupName": name},
                "nodeSelector": dict(env.selector),
                "tolerations": [objects.GPU_TOLERATION],
                "containers": [container],
                **extra,
            },
        }, namespace=env.namespace)


async def _pods(env: Env, group: str) -> list[Body]:
    listing = await env.kube.list(PODS, namespace=env.namespace)
    return [p for p in listing.get("items") or []
            if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == group]


async def _bound(env: Env, group: str, count: int) -> list[Body] | None:
    pods = await _pods(env, group)
    bound = [p for p in pods if p["spec"].get("nodeName")]
    return bound if len(bound) == count else None


async def _events(env: Env, group: str) -> list[Body]:
    listing = await env.kube.list(EVENTS, namespace=env.namespace)
    return [e for e in listing.get("items") or []
            if e["involvedObject"].get("kind") == "PodGroup"
            and e["involvedObject"].get("name") == group]


async def _event(env: Env, group: str, reason: str, *, within: float = 60) -> Body:
    async def probe() -> Body | None:
        return next((e for e in await _events(env, group) if e["reason"] == reason), None)
    return await eventually(probe, within=within, what=f"Event {reason} on PodGroup {group}")


async def cleanup_groups(env: Env) -> None:
    """Before the fixture deletes the namespace's requests: the PodGroups (which own their
    requests) and their pods go first, so Muster does not plan a still-pending group again."""
    listing = await env.kube.list(POD_GROUPS, namespace=env.namespace)
    for pg in listing.get("items") or []:
        await env.kube.delete(POD_GROUPS, pg["metadata"]["name"], namespace=env.namespace)
    for pod in (await env.kube.list(PODS, namespace=env.namespace)).get("items") or []:
        await env.kube.delete(PODS, pod["metadata"]["name"], namespace=env.namespace)


def _true(obj: Body, type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == type_ and c["status"] == "True"), None)


@pytest.mark.timeout(240)
async def test_a_gang_podgroup_is_provisioned_in_one_rack_and_bound_there(env: Env) -> None:
    """4 pods of 8 GPUs, minCount 4, one rack; no node exists. The scheduler marks the group
    Unschedulable; Muster books 4 new nodes in one rack; the scheduler binds all 4 pods on
    them; the booking is consumed by the group's pods."""
    await _real(env)
    pool = await env.gpu_pool(blocks=1, racks_per_block=3, nodes_per_rack=4)
    env.cleanup.append(lambda: cleanup_groups(env))
    try:
        await gang(env, "train", 4)
        started = await _event(env, "train", "GangProvisioning")
        assert "minCount 4" in started["message"] and objects.RACK in started["message"]
        pr_name = request_name("train")

        async def provisioned() -> Body | None:
            pr = await env.kube.get_or_none(PROVISIONING_REQUESTS, pr_name,
                                            namespace=env.namespace)
            return pr if pr and _true(pr, "Provisioned") else None

        pr = await eventually(provisioned, within=60, what="the gang's request Provisioned")
        (owner,) = pr["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("PodGroup", "train")
        rack = pr["status"]["provisioningClassDetails"][objects.RACK]
        pods = await eventually(lambda: _bound(env, "train", 4), within=90,
                                what="the scheduler to bind all 4 pods")
        nodes = {n["metadata"]["name"]: n for n in await env.pool_nodes(pool)}
        assert len(nodes) == 4, "all nodes or none: exactly the gang's 4"
        for pod in pods:
            node = pod["spec"]["nodeName"]
            assert node in nodes, f"{pod['metadata']['name']} on {node}, not Muster's"
            assert nodes[node]["metadata"]["labels"][objects.RACK] == rack
        assert len({p["spec"]["nodeName"] for p in pods}) == 4
        await _event(env, "train", "GangProvisioned")
        await _event(env, "train", "GangPlaced", within=30)
        pr = await env.kube.get(PROVISIONING_REQUESTS, pr_name, namespace=env.namespace)
        ended = _true(pr, "BookingExpired")
        assert ended is not None and ended["reason"] == "CapacityBookingConsumed", ended
    finally:
        await cleanup_groups(env)


@pytest.mark.timeout(180)
async def test_a_gang_that_can_never_fit_gets_no_node_and_a_warning(env: Env) -> None:
    """8 pods in one rack of at most 4 nodes: never fits. No node is acquired, and the
    PodGroup carries a Warning Event naming the reason."""
    await _real(env)
    pool = await env.gpu_pool(blocks=1, racks_per_block=3, nodes_per_rack=4)
    env.cleanup.append(lambda: cleanup_groups(env))
    try:
        await gang(env, "huge", 8)
        warning = await _event(env, "huge", "GangNotProvisioned")
        assert warning["type"] == "Warning"
        assert "CapacityNeverFits" in warning["message"], warning["message"]
        assert "rack" in warning["message"]
        assert await env.pool_nodes(pool) == []
        assert not [p for p in await _pods(env, "huge") if p["spec"].get("nodeName")]
    finally:
        await cleanup_groups(env)


@pytest.mark.timeout(240)
async def test_two_gangs_competing_for_one_gangs_stock_never_split(env: Env) -> None:
    """Stock for 4 nodes (one rack of 4), two groups of 3 pods each created together: one
    group is provisioned and bound whole; the other gets no node, no bound pod (no partial
    gang) and a Warning Event; nothing deadlocks (the first runs)."""
    await _real(env)
    pool = await env.gpu_pool(blocks=1, racks_per_block=1, nodes_per_rack=4, max_nodes=4)
    env.cleanup.append(lambda: cleanup_groups(env))
    try:
        await asyncio.gather(gang(env, "alpha", 3), gang(env, "beta", 3))

        async def settled() -> tuple[str, str] | None:
            for winner, loser in (("alpha", "beta"), ("beta", "alpha")):
                if await _bound(env, winner, 3) and any(
                        e["reason"] == "GangNotProvisioned" for e in await _events(env, loser)):
                    return winner, loser
            return None

        winner, loser = await eventually(settled, within=150, step=0.5,
                                         what="one gang bound and the other refused")
        assert not [p for p in await _pods(env, loser) if p["spec"].get("nodeName")], (
            "no pod of the refused gang is bound")
        nodes = await env.pool_nodes(pool)
        assert len(nodes) <= 4
        used = {p["spec"]["nodeName"] for p in await _pods(env, winner)}
        assert used <= {n["metadata"]["name"] for n in nodes}
        warning = next(e for e in await _events(env, loser) if e["reason"] == "GangNotProvisioned")
        assert warning["type"] == "Warning"
        # Nothing is left acquired for the refused gang: once the winner's booking is
        # consumed, every node of the pool runs a pod of the winner or is released.

        async def only_the_winners() -> bool:
            left = {n["metadata"]["name"] for n in await env.pool_nodes(pool)}
            return left == used

        await eventually(only_the_winners, within=30, what="no node held for the loser")
        listing = await env.kube.list(NODES, label_selector=f"fake.muster.dev/pool={pool}")
        assert len(listing.get("items") or []) == 3
    finally:
        await cleanup_groups(env)
