"""Path B life cycle, the parts the real-Kueue scenarios (``e2e/test_kueue_real.py``: Ready,
Rejected for a gang that never fits, Retry and Kueue's requeue after a stock-out, a Workload
Kueue TAS placed on existing nodes) do not reach: a booking that expires before admission
(needs a controller with a 2 s booking; the real tier's Muster runs the session's config)
and Workload names only a hand-written Workload has (Kueue's Job integration caps them far
below 253).

The test plays Kueue (quota, admission). Podset-update conflicts and the retry/rejection
table are unit-tested in ``tests/kueue/test_decisions.py``.
"""

from __future__ import annotations

from typing import Any

from controller.commands import kueue_objects as kq
from controller.commands import objects
from controller.common.topology_defaults import MUSTER_REQUIRED
from controller.kube.resources import CAPACITY_POOLS, PROVISIONING_REQUESTS
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    WORKLOADS,
)
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


async def setup(env: KueueEnv) -> None:
    await env.kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu-h100", blocks=2))
    await env.kube.create(RESOURCE_FLAVORS, kq.resource_flavor(
        "h100", node_labels={"muster.dev/accelerator": "h100"}))
    await env.kube.create(RESOURCE_FLAVORS, kq.resource_flavor("cpu"))
    await env.kube.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
        "cfg", class_name="atomic-provisioning.muster.dev", backoff_limit=3,
        backoff_base_seconds=7))
    await env.kube.create(ADMISSION_CHECKS, kq.admission_check(
        CHECK, controller_name="muster.dev/provisioning", config="cfg"))


async def submit(env: KueueEnv, name: str, pod_sets: list[dict[str, Any]],
                 flavors: dict[str, dict[str, str]]) -> None:
    await env.kube.create(WORKLOADS, kq.workload(name, env.namespace, queue="q",
                                                 pod_sets=pod_sets), namespace=env.namespace)
    await env.update_status(name, lambda wl: kq.reserve_quota(
        wl, cluster_queue="cq", flavors=flavors, checks=[CHECK], now=now()))


def workers(count: int, **kw: Any) -> dict[str, Any]:
    return kq.pod_set("workers", count, requests={"cpu": "90", "memory": "900Gi",
                                                  objects.GPU: "8"}, **kw)


async def request_exists(env: KueueEnv, name: str) -> bool:
    return await env.kube.get_or_none(
        PROVISIONING_REQUESTS, name, namespace=env.namespace) is not None


async def test_a_booking_that_expires_before_admission_turns_ready_into_retry(
    sandbox_only: None,
) -> None:
    """Sandbox only: needs a controller whose booking lasts 2 s; the real tier's Muster runs
    with the session's config, and restarting it for one scenario would slow every other."""
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
    """Played by the test: a 240-character Workload name, which Kueue's Job integration never
    produces (Job names are at most 63 characters) but a hand-written Workload or another
    integration's owner can have; Kueue then hashes the request's name, and so must Muster."""
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
