"""Path B: Muster's own admission check (``controllerName: muster.dev/provisioning``) under
faults only the API sandbox can inject.

The test plays Kueue (it creates the Kueue objects and reserves quota on Workloads as
Kueue's scheduler would). The path a user takes, from a Job to pods bound on Muster's nodes
with the real Kueue and scheduler, is ``e2e/test_kueue_real.py``; what stays here is what the
real tier cannot reach: a storm of 409s on Workload writes and watch streams cut every few
events, injected by the sandbox (a real API server cannot be told to do either).
"""

from __future__ import annotations

from typing import Any

from controller.commands import kueue_objects as kq
from controller.commands import objects
from controller.common.topology_defaults import MUSTER_REQUIRED
from controller.kube.resources import (
    CAPACITY_POOLS,
    NODES,
)
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    WORKLOADS,
)
from e2e.kueue_support import KueueEnv, kueue_env, now, sandbox_only

__all__ = ["kueue_env", "sandbox_only"]

CHECK = "muster-prov"
OTHER_CHECK = "other-check"
GPU_FLAVORS = {"cpu": "h100", "memory": "h100", objects.GPU: "h100"}
CPU_FLAVORS = {"cpu": "cpu", "memory": "cpu"}
H100 = kq.resource_flavor("h100", node_labels={"muster.dev/accelerator": "h100"})
CPU = kq.resource_flavor("cpu")
FLAVORS = {"h100": H100, "cpu": CPU}


async def setup(env: KueueEnv) -> None:
    kube = env.kube
    for i in (1, 2):
        await kube.create(NODES, objects.node(
            f"cpu-{i}", allocatable={"cpu": "16", "memory": "64Gi"},
            labels={objects.BLOCK: "b1", objects.RACK: "b1-r1"}))
    # Rack b1-r1 can take only 4 more GPU nodes: too small for a 16-node gang.
    await kube.create(CAPACITY_POOLS, objects.gpu_pool("gpu-h100", rack_limits={"b1-r1": 4}))
    await kube.create(RESOURCE_FLAVORS, H100)
    await kube.create(RESOURCE_FLAVORS, CPU)
    await kube.create(PROVISIONING_REQUEST_CONFIGS, kq.provisioning_request_config(
        "muster-atomic", class_name="atomic-provisioning.muster.dev",
        backoff_base_seconds=1))
    await kube.create(ADMISSION_CHECKS, kq.admission_check(
        CHECK, controller_name="muster.dev/provisioning", config="muster-atomic"))
    await kube.create(ADMISSION_CHECKS, kq.admission_check(
        OTHER_CHECK, controller_name="example.com/other"))
    await kube.create(CLUSTER_QUEUES, kq.cluster_queue(
        "gpu-cq", flavors={"h100": {"cpu": "10000", "memory": "100Ti", objects.GPU: "1024"},
                           "cpu": {"cpu": "100", "memory": "1Ti"}},
        checks=[CHECK, OTHER_CHECK]))
    await kube.create(LOCAL_QUEUES, kq.local_queue("team", env.namespace, "gpu-cq"),
                      namespace=env.namespace)


def gang(name: str, namespace: str, workers: int) -> dict[str, Any]:
    return kq.workload(name, namespace, queue="team", pod_sets=[
        kq.pod_set("workers", workers,
                   requests={"cpu": "90", "memory": "900Gi", objects.GPU: "8"},
                   annotations={MUSTER_REQUIRED: objects.RACK}),
        kq.pod_set("launcher", 1, requests={"cpu": "2", "memory": "4Gi"}),
    ])


async def submit(env: KueueEnv, name: str, workers: int) -> None:
    await env.kube.create(WORKLOADS, gang(name, env.namespace, workers), namespace=env.namespace)
    await env.update_status(name, lambda wl: kq.reserve_quota(
        wl, cluster_queue="gpu-cq", flavors={"workers": GPU_FLAVORS, "launcher": CPU_FLAVORS},
        checks=[CHECK, OTHER_CHECK], now=now()))


def other_ready(wl: dict[str, Any]) -> dict[str, Any]:
    """Another check controller marks its own entry Ready (with its own update)."""
    status = wl["status"]
    status["admissionChecks"] = [
        {**c, "state": "Ready", "message": "other ok",
         "podSetUpdates": [{"name": "workers", "labels": {"example.com/ok": "yes"}}]}
        if c["name"] == OTHER_CHECK else c
        for c in status["admissionChecks"]
    ]
    return status


async def test_path_b_survives_conflict_storms_and_dropped_watches(kueue_env: KueueEnv) -> None:
    """Sandbox only: the faults (half of all Workload patches answer 409, every watch ends
    after a few events) are the sandbox's fault injection; no real API server offers it."""
    env = kueue_env
    await setup(env)
    # Half of all Workload patches answer 409 and every watch stream ends after a few events:
    # the read-modify-write retries and the re-listing watches must still get there, without
    # losing the other controller's entry.
    # The first two for certain: with a handful of patches, half alone left no storm at all
    # one run in several (CI saw one).
    env.server.faults.add_conflicts(1.0, verbs="patch", resources="workloads", times=2)
    env.server.faults.add_conflicts(0.5, verbs="patch", resources="workloads")
    env.server.faults.drop_watches_every(5)
    await submit(env, "storm", 8)
    await env.update_status("storm", other_ready)
    ready = await env.wait_check("storm", CHECK, "Ready", within=60)
    assert {u["name"] for u in ready["podSetUpdates"]} == {"workers", "launcher"}
    assert env.server.faults.injected > 0, "the storm happened"
    env.server.faults.clear()
    other = await env.check_state("storm", OTHER_CHECK)
    assert other is not None and other["state"] == "Ready"
