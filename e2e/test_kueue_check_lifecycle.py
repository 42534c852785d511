"""Path B life cycle: Retry with Kueue's backoff and attempts, Rejected on a podSetUpdates
conflict and after the backoff limit, cleanup on eviction, Workloads Kueue TAS already placed
(booked with check-capacity, Ready or Retry), and CapacityRevoked after admission.

As in ``test_kueue_admission_check.py`` the test plays Kueue (quota, eviction, reset to
Pending with retryCount + 1, admission).
"""

from __future__ import annotations

from typing import Any

from controller.commands import kueue_objects as kq
from controller.commands import objects
from controller.kube.resources import CAPACITY_POOLS, NODES, POD_TEMPLATES, PROVISIONING_REQUESTS
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    WORKLOADS,
)
from controller.topology_defaults import HOSTNAME, MUSTER_REQUIRED, POOL_LABEL
from e2e.conftest import eventually
from e2e.kueue_support import (
    KueueEnv,
    kueue_env,
    make_env,
    now,
    sandbox_only,
)

__all__ = ["kueue_env", "sandbox_only"]

CHECK = "muster-prov"
GPU_FLAVORS = {"cpu": "h100", "memory": "h100", objects.GPU: "h100"}
CPU_FLAVORS = {"cpu": "cpu", "memory": "cpu"}


async def setup(env: KueueEnv, *, backoff_limit: int = 3, blocks: int = 2,
                selector_details: dict[str, str] | None = None,
                stock: int | None = None) -> None:
    params = {"defaultStock": stock} if stock is not None else None
    await env.kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu-h100", blocks=blocks,
                                                           parameters=params))
    await env.kube.create(RESOURCE_FLAVORS, kq.resource_flavor(
        "h100", node_labels={"muster.dev/accelerator": "h100"}))
    await env.kube.create(RESOURCE_FLAVORS, kq.resource_flavor("cpu"))
    await env.kube.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
        "cfg", class_name="atomic-provisioning.muster.dev", backoff_limit=backoff_limit,
        backoff_base_seconds=7, selector_details=selector_details))
    await env.kube.create(ADMISSION_CHECKS, kq.admission_check(
        CHECK, controller_name="muster.dev/provisioning", config="cfg"))


async def submit(env: KueueEnv, name: str, pod_sets: list[dict[str, Any]],
                 flavors: dict[str, dict[str, str]],
                 topology_assignments: dict[str, Any] | None = None) -> None:
    await env.kube.create(WORKLOADS, kq.workload(name, env.namespace, queue="q",
                                                 pod_sets=pod_sets), namespace=env.namespace)
    await env.update_status(name, lambda wl: kq.reserve_quota(
        wl, cluster_queue="cq", flavors=flavors, checks=[CHECK], now=now(),
        topology_assignments=topology_assignments))


def workers(count: int, **kw: Any) -> dict[str, Any]:
    return kq.pod_set("workers", count, requests={"cpu": "90", "memory": "900Gi",
                                                  objects.GPU: "8"}, **kw)


def evict_and_reset(wl: dict[str, Any]) -> dict[str, Any]:
    """Kueue on Retry: evict (quota released), reset every non-Pending check to Pending with
    retryCount + 1, keep requeueAfterSeconds."""
    status = kq.set_condition(wl["status"], "Evicted", True, "AdmissionCheck", now())
    status = kq.set_condition(status, "QuotaReserved", False, "Pending", now())
    status["admission"] = None
    status["admissionChecks"] = [
        {**c, "state": "Pending", "retryCount": int(c.get("retryCount") or 0) + 1,
         "message": f"Reset to Pending after eviction. Previously: {c['state']}"}
        for c in status["admissionChecks"]
    ]
    return status


async def request_exists(env: KueueEnv, name: str) -> bool:
    return await env.kube.get_or_none(
        PROVISIONING_REQUESTS, name, namespace=env.namespace) is not None


async def test_a_stock_out_retries_with_backoff_then_is_rejected(kueue_env: KueueEnv) -> None:
    env = kueue_env
    # The cloud has no stock: every acquisition fails, Muster's request ends Failed
    # (RetriesExhausted) and Kueue's retry cycle takes over.
    await setup(env, backoff_limit=1, stock=0)
    await submit(env, "big", [workers(4, annotations={MUSTER_REQUIRED: objects.RACK})],
                 {"workers": GPU_FLAVORS})
    retry = await env.wait_check("big", CHECK, "Retry", within=30)
    assert retry["message"].startswith("Retrying after failure: Capacity is not found after")
    assert retry["requeueAfterSeconds"] == 7, "backoff base x 2^0 for the first retry"

    await env.update_status("big", evict_and_reset)

    async def first_gone() -> bool:
        return not await request_exists(env, "big-muster-prov-1")
    await eventually(first_gone, what="evicted Workload's request deleted")

    # Kueue requeues after the delay and reserves quota again: attempt 2.
    await env.update_status("big", lambda wl: kq.reserve_quota(
        {**wl, "status": kq.set_condition(wl["status"], "Evicted", False, "Requeued", now())},
        cluster_queue="cq", flavors={"workers": GPU_FLAVORS}, checks=[CHECK], now=now()))
    rejected = await env.wait_check("big", CHECK, "Rejected", within=30)
    assert await request_exists(env, "big-muster-prov-2")
    assert rejected["message"].startswith("Capacity is not found after"), (
        "past backoffLimitCount the Failed message is the rejection reason")
    assert rejected["retryCount"] == 1, "Muster never touches Kueue's retryCount"


async def test_a_gang_that_can_never_fit_is_rejected_without_retries(
    kueue_env: KueueEnv,
) -> None:
    env = kueue_env
    await setup(env)
    # 20 nodes in one rack of at most 16: no retry can help.
    await submit(env, "huge", [workers(20, annotations={MUSTER_REQUIRED: objects.RACK})],
                 {"workers": GPU_FLAVORS})
    rejected = await env.wait_check("huge", CHECK, "Rejected", within=30)
    assert rejected["message"].startswith("The request can never fit")
    assert "rack" in rejected["message"]
    assert await request_exists(env, "huge-muster-prov-1")

    # Deleting the Workload takes its request (and the request's templates) with it.
    await env.kube.delete(WORKLOADS, "huge", namespace=env.namespace)

    async def gone() -> bool:
        templates = (await env.kube.list(POD_TEMPLATES, namespace=env.namespace)).get("items")
        return not await request_exists(env, "huge-muster-prov-1") and not templates
    await eventually(gone, what="request and templates collected")


async def test_a_podsetupdate_conflicting_with_the_workload_is_rejected(
    kueue_env: KueueEnv,
) -> None:
    env = kueue_env
    # The config pins every pod set to the booked block; the launcher insists on block b2,
    # while the pool only has racks in block b1.
    await setup(env, blocks=1, selector_details={objects.BLOCK: objects.BLOCK})
    await env.kube.create(NODES, objects.node(
        "cpu-b2", allocatable={"cpu": "16", "memory": "64Gi"},
        labels={objects.BLOCK: "b2", objects.RACK: "b2-r1"}))
    await submit(env, "split", [
        workers(4, annotations={MUSTER_REQUIRED: objects.RACK}),
        kq.pod_set("launcher", 1, requests={"cpu": "2", "memory": "4Gi"},
                   node_selector={objects.BLOCK: "b2"}),
    ], {"workers": GPU_FLAVORS, "launcher": CPU_FLAVORS})
    rejected = await env.wait_check("split", CHECK, "Rejected", within=30)
    assert "pod set launcher" in rejected["message"]
    assert f"{objects.BLOCK}=b2" in rejected["message"]
    assert f"{objects.BLOCK}=b1" in rejected["message"]
    assert not rejected.get("podSetUpdates"), "no update overrides the user's selector"


async def test_a_tas_placed_workload_is_booked_not_replanned(kueue_env: KueueEnv) -> None:
    env = kueue_env
    await setup(env)
    hosts = [f"gpu-{i}" for i in range(4)]
    for host in hosts:
        await env.kube.create(NODES, objects.node(
            host, allocatable={"cpu": "96", "memory": "1024Gi", objects.GPU: "8"},
            labels={objects.BLOCK: "b2", objects.RACK: "b2-r1",
                    "muster.dev/accelerator": "h100"},
            taints=[objects.GPU_TAINT]))
    assignment = {
        "levels": [objects.RACK, HOSTNAME],
        "slices": [{"domainCount": 4,
                    "valuesPerLevel": [{"universal": "b2-r1"},
                                       {"individual": {"prefix": "gpu-",
                                                       "roots": ["0", "1", "2", "3"]}}],
                    "podCounts": {"universal": 1}}],
    }
    tol = {"tolerations": [objects.GPU_TOLERATION]}
    await submit(env, "placed", [workers(4, **tol)], {"workers": GPU_FLAVORS},
                 topology_assignments={"workers": assignment})
    ready = await env.wait_check("placed", CHECK, "Ready", within=30)
    pr = await env.kube.get(PROVISIONING_REQUESTS, "placed-muster-prov-1",
                            namespace=env.namespace)
    assert pr["spec"]["provisioningClassName"] == "check-capacity.muster.dev"
    assert pr["spec"]["parameters"] == {"noRetry": "true"}
    assert [p["count"] for p in pr["spec"]["podSets"]] == [1, 1, 1, 1]
    assert not (await env.kube.list(NODES, label_selector=f"{POOL_LABEL}=gpu-h100")).get(
        "items"), "nothing new: Kueue TAS already chose existing nodes"
    (update,) = ready["podSetUpdates"]
    assert "nodeSelector" not in update, "Kueue TAS pins the pods itself"

    # The same nodes again while booked: check-capacity cannot book them twice -> Retry.
    await submit(env, "again", [workers(4, **tol)], {"workers": GPU_FLAVORS},
                 topology_assignments={"workers": assignment})
    retry = await env.wait_check("again", CHECK, "Retry", within=30)
    assert retry["message"].startswith("Retrying after failure: Capacity is not found")

    # Admitted, then a booked node disappears before use: Rejected even after admission.
    await env.update_status("placed", lambda wl: kq.set_condition(
        wl["status"], "Admitted", True, "Admitted", now()))
    await env.kube.delete(NODES, "gpu-2")
    rejected = await env.wait_check("placed", CHECK, "Rejected", within=30)
    assert "gpu-2" in rejected["message"]


async def test_a_booking_that_expires_before_admission_turns_ready_into_retry(
    sandbox_only: None,
) -> None:
    # Another check keeps the Workload from being admitted past Muster's booking time.
    async with make_env(booking={"duration_seconds": 2}) as env:
        await setup(env)
        await submit(env, "slow", [workers(4, annotations={MUSTER_REQUIRED: objects.RACK})],
                     {"workers": GPU_FLAVORS})
        ready = await env.wait_check("slow", CHECK, "Ready", within=30)
        assert ready["podSetUpdates"]
        retry = await env.wait_check("slow", CHECK, "Retry", within=30)
        assert retry["message"].startswith("Retrying after booking expired: Capacity "
                                           "reservation time is expired")
        assert retry["requeueAfterSeconds"] == 7


async def test_long_workload_names_get_kueues_hashed_names_and_still_pin(
    kueue_env: KueueEnv,
) -> None:
    from controller.kueue.decisions import request_name, template_name

    env = kueue_env
    await setup(env)
    name = "w" * 240
    await submit(env, name, [workers(4, annotations={MUSTER_REQUIRED: objects.RACK})],
                 {"workers": GPU_FLAVORS})
    ready = await env.wait_check(name, CHECK, "Ready", within=30)
    pr_name = request_name(name, CHECK, 1)
    assert len(pr_name) == 253 and await request_exists(env, pr_name)
    pr = await env.kube.get(PROVISIONING_REQUESTS, pr_name, namespace=env.namespace)
    assert pr["spec"]["podSets"][0]["podTemplateRef"]["name"] == template_name(pr_name, "workers")
    (update,) = ready["podSetUpdates"]
    assert objects.RACK in update["nodeSelector"], "the hashed pod set is still pinned"
