"""Tenancy end to end: per-namespace limits, and no request holding or consuming capacity
through objects of another namespace or another request (docs/concepts/tenancy.md).

``e2e/muster-e2e.yaml`` limits namespace ``e2e-limited`` to 4 nodes (32 GPUs, 400/h; the
scenario pool's nodes have 8 GPUs and cost 98/h). Scenarios that need a second namespace make
it beside the test's own and delete it before the fixture cleans up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

from controller.commands import objects
from controller.common.topology_defaults import KEY_LABEL
from controller.kube import ApiError
from controller.kube.resources import (
    NAMESPACES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
    Resource,
)
from controller.state.tenancy import owner_uid_of_key
from e2e.conftest import Env, eventually

ATOMIC = "atomic-provisioning.muster.dev"
LIMITED = "e2e-limited"
CONFIG_MAPS = Resource("", "v1", "configmaps", namespaced=True, kind="ConfigMap")


@contextlib.asynccontextmanager
async def namespace(env: Env, name: str) -> AsyncIterator[Env]:
    """``env`` in namespace ``name`` (same run label, pools and cleanup of capacity)."""
    other = dataclasses.replace(env, namespace=name, cleanup=[])
    with contextlib.suppress(ApiError):
        await env.kube.create(NAMESPACES, {"metadata": {"name": name}})
    try:
        yield other
    finally:
        listing = await env.kube.list(PROVISIONING_REQUESTS, namespace=name)
        for pr in listing.get("items") or []:
            with contextlib.suppress(ApiError):
                await env.kube.delete(PROVISIONING_REQUESTS, pr["metadata"]["name"],
                                      namespace=name)

        async def requests_gone() -> bool:
            left = await env.kube.list(PROVISIONING_REQUESTS, namespace=name)
            return not left.get("items")

        await eventually(requests_gone, within=30, what=f"the requests of {name} to go")
        for undo in reversed(other.cleanup):
            with contextlib.suppress(ApiError):
                await undo()
        with contextlib.suppress(ApiError):
            await env.kube.delete(NAMESPACES, name)

        async def gone() -> bool:
            return await env.kube.get_or_none(NAMESPACES, name) is None

        await eventually(gone, within=60, what=f"namespace {name} to be deleted")


async def _uid(env: Env, name: str) -> str:
    return str((await env.get(name))["metadata"]["uid"])


async def _outcome(env: Env, name: str) -> str | None:
    """``Provisioned`` or ``Failed/<reason>`` once the request has one, else None."""
    for type_ in ("Failed", "Provisioned"):
        cond = await env.condition(name, type_)
        if cond is not None and cond["status"] == "True":
            return type_ if type_ == "Provisioned" else f"Failed/{cond['reason']}"
    return None


async def test_a_burst_in_one_namespace_never_exceeds_its_limit(env: Env) -> None:
    pool = await env.gpu_pool()
    async with namespace(env, LIMITED) as limited:
        await limited.worker_template()
        await env.worker_template()
        samples: list[list[tuple[str, str]]] = []  # (node, its acquisition key's uid)

        async def sample() -> None:
            while True:
                samples.append([
                    (n["metadata"]["name"],
                     owner_uid_of_key(n["metadata"]["labels"].get(KEY_LABEL, "")))
                    for n in await env.pool_nodes(pool)])
                await asyncio.sleep(0.05)

        names = [f"burst-{i}" for i in range(5)]
        sampler = asyncio.create_task(sample())
        try:
            # A request alone over the limit (6 nodes > 4), five of 2 nodes at once, and a
            # request of another namespace (no limits) at the same time.
            await limited.request("too-big", [("workers", 6)], class_name=ATOMIC)
            await asyncio.gather(*(limited.request(n, [("workers", 2)], class_name=ATOMIC)
                                   for n in names))
            await env.request("control", [("workers", 6)], class_name=ATOMIC)
            control = await env.wait_condition("control", "Provisioned", within=60)
            assert control["reason"] == "CapacityIsProvisioned"

            async def settled() -> list[str] | None:
                got = [await _outcome(limited, n) for n in names]
                return None if None in got else [str(g) for g in got]

            outcomes = await eventually(settled, within=60, what="every burst request to end")
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        big = await limited.condition("too-big", "Failed")
        assert big is not None and big["reason"] == "OverBudget", big
        assert "alone exceed namespace e2e-limited's limits (6 nodes > max_nodes 4" in (
            big["message"])
        assert sorted(outcomes) == ["Failed/RetriesExhausted"] * 3 + ["Provisioned"] * 2, outcomes
        for name, outcome in zip(names, outcomes, strict=True):
            if outcome != "Provisioned":
                failed = await limited.condition(name, "Failed")
                assert failed is not None
                assert "namespace e2e-limited holds 4 node(s)" in failed["message"], failed
        # Never more than the limit at once, and never half-acquired: no node was ever
        # bought for a request of the namespace that did not provision.
        uids = {n: await _uid(limited, n) for n in [*names, "too-big"]}
        provisioned = {uids[n] for n, o in zip(names, outcomes, strict=True)
                       if o == "Provisioned"}
        held = [{node for node, uid in s if uid in uids.values()} for s in samples]
        assert max(len(h) for h in held) <= 4, f"namespace {LIMITED} held more than 4 nodes"
        bought = {uid for s in samples for _, uid in s if uid in uids.values()}
        assert bought == provisioned
        assert len(set().union(*held)) == 4

async def test_a_template_of_another_namespace_is_never_used(env: Env) -> None:
    pool = await env.gpu_pool()
    await env.worker_template()  # in the test's namespace only
    async with namespace(env, f"{env.namespace}-b") as other:
        await other.request("borrow", [("workers", 2)], class_name=ATOMIC)
        failed = await other.wait_condition("borrow", "Failed", within=30)
        assert failed["reason"] == "FailedToCreatePods"
        assert f"PodTemplate {other.namespace}/workers not found" in failed["message"]
        assert await env.pool_nodes(pool) == []
        # The template's own namespace is unaffected.
        await env.request("own", [("workers", 2)], class_name=ATOMIC)
        await env.wait_condition("own", "Provisioned", within=60)


async def test_a_template_another_request_owns_is_refused(env: Env) -> None:
    pool = await env.gpu_pool()
    await env.worker_template("mine")
    await env.request("owner", [("mine", 1)], class_name=ATOMIC)
    await env.wait_condition("owner", "Provisioned", within=60)
    owner = await env.get("owner")
    # Kueue (path A) hands the templates it makes to their request like this.
    body = objects.pod_template(
        "owned", namespace=env.namespace, requests={"cpu": "90", objects.GPU: "8"},
        required_level=objects.RACK, tolerations=[objects.GPU_TOLERATION],
        node_selector=env.selector)
    body["metadata"]["ownerReferences"] = [{
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "name": "owner", "uid": owner["metadata"]["uid"]}]
    await env.kube.create(POD_TEMPLATES, body, namespace=env.namespace)
    await env.request("intruder", [("owned", 2)], class_name=ATOMIC)
    failed = await env.wait_condition("intruder", "Failed", within=30)
    assert failed["reason"] == "InvalidParameters"
    assert "belongs to ProvisioningRequest owner" in failed["message"]
    assert len(await env.pool_nodes(pool)) == 1  # the owner's node only
    assert (await env.condition("owner", "CapacityRevoked")) is None


async def test_a_booked_template_reowned_by_another_request_revokes_the_booking(
    env: Env,
) -> None:
    pool = await env.gpu_pool()
    await env.worker_template()
    other = objects.pod_template("other", namespace=env.namespace, requests={"cpu": "1"},
                                 node_selector=env.selector)
    await env.kube.create(POD_TEMPLATES, other, namespace=env.namespace)
    await env.request("first", [("workers", 2)], class_name=ATOMIC)
    await env.wait_condition("first", "Provisioned", within=60)
    await env.request("second", [("other", 1)], class_name="check-capacity.muster.dev")
    second = await env.get("second")
    await env.kube.merge_patch(POD_TEMPLATES, "workers", {"metadata": {"ownerReferences": [{
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "name": "second", "uid": second["metadata"]["uid"]}]}}, namespace=env.namespace)
    # Noticed when the template changes hands, not when the booking is next due (its expiry).
    revoked = await env.wait_condition("first", "CapacityRevoked",
                                       within=env.config.booking.duration_seconds / 2)
    assert revoked["reason"] == "PodTemplateChanged"
    assert "now owned by ProvisioningRequest second" in revoked["message"]

    async def released() -> bool:
        return not await env.pool_nodes(pool)

    await eventually(released, within=30, what="the revoked booking's nodes to be released")


async def test_a_deleted_owner_takes_its_request_and_nodes(env: Env) -> None:
    pool = await env.gpu_pool()
    await env.worker_template()
    owner = await env.kube.create(CONFIG_MAPS, {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "job", "namespace": env.namespace}}, namespace=env.namespace)
    body = objects.provisioning_request("owned", pod_sets=[("workers", 2)],
                                        namespace=env.namespace, class_name=ATOMIC)
    body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap",
                                            "name": "job", "uid": owner["metadata"]["uid"]}]
    await env.kube.create(PROVISIONING_REQUESTS, body, namespace=env.namespace)
    await env.wait_condition("owned", "Provisioned", within=60)
    assert len(await env.pool_nodes(pool)) == 2
    await env.kube.delete(CONFIG_MAPS, "job", namespace=env.namespace)

    async def gone() -> bool:
        request = await env.kube.get_or_none(PROVISIONING_REQUESTS, "owned",
                                             namespace=env.namespace)
        return request is None and not await env.pool_nodes(pool)

    await eventually(gone, within=60, what="the garbage collector to delete the request "
                     "and Muster to release its nodes")


async def test_pods_of_another_namespace_cannot_consume_a_booking(env: Env) -> None:
    pool = await env.gpu_pool()
    worker = await env.worker_template()
    await env.request("mine", [("workers", 1)], class_name=ATOMIC)
    await env.wait_condition("mine", "Provisioned", within=60)
    details = (await env.get("mine"))["status"]["provisioningClassDetails"]
    async with namespace(env, f"{env.namespace}-b") as other:
        # A pod of another namespace naming the request, pinned to its rack.
        pod = objects.consumer_pod("squatter", request="mine", template={
            **worker, "metadata": {**worker["metadata"], "namespace": other.namespace}},
            node_selector=objects.placement_selector(details))
        await env.kube.create(PODS, pod, namespace=other.namespace)

        async def bound() -> bool:
            got = await env.kube.get(PODS, "squatter", namespace=other.namespace)
            return bool(got["spec"].get("nodeName"))

        await eventually(bound, within=30, what="the other namespace's pod to be bound")
        expired = await env.wait_condition(
            "mine", "BookingExpired", within=env.config.booking.duration_seconds + 20)
        assert expired["reason"] == "CapacityReservationTimeExpired", expired
        assert "0 of 1 pod(s)" in expired["message"]
        await env.kube.delete(PODS, "squatter", namespace=other.namespace)
    del pool

