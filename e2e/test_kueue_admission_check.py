"""Path B: Muster's own admission check (``controllerName: muster.dev/provisioning``).

The test plays Kueue: it creates the Kueue objects, reserves quota on Workloads as Kueue's
scheduler would, and creates the pods of an admitted Workload with the check's podSetUpdates
applied. Muster must do the rest: mark the AdmissionCheck Active, create and own the
ProvisioningRequest, provision one rack, report Ready with updates that pin the gang there,
keep the booked rack away from other Workloads, and clean up when the Workload finishes.
"""

from __future__ import annotations

from typing import Any

from controller.commands import kueue_objects as kq
from controller.commands import objects
from controller.kube.resources import (
    CAPACITY_POOLS,
    EVENTS,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
)
from controller.kueue.decisions import CLASS_ANNOTATION, CONSUME_ANNOTATION
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    WORKLOADS,
)
from controller.topology_defaults import MUSTER_REQUIRED, POOL_LABEL
from e2e.conftest import eventually
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


async def run_pods(env: KueueEnv, name: str, workers: int) -> None:
    """Kueue admits the Workload (all checks Ready) and the Job creates its pods."""
    await env.update_status(name, lambda wl: kq.set_condition(
        wl["status"], "Admitted", True, "Admitted", now()))
    wl = await env.workload(name)
    for ps, count in (("workers", workers), ("launcher", 1)):
        for i in range(count):
            await env.kube.create(PODS, kq.admitted_pod(wl, ps, i, flavors=FLAVORS),
                                  namespace=env.namespace)


async def pods_of(env: KueueEnv, name: str) -> list[dict[str, Any]]:
    listing = await env.kube.list(PODS, namespace=env.namespace)
    return [p for p in listing.get("items") or []
            if p["metadata"]["annotations"].get("kueue.x-k8s.io/workload") == name]


async def all_bound(env: KueueEnv, name: str, count: int) -> list[dict[str, Any]] | None:
    pods = await pods_of(env, name)
    return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else None


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


async def test_path_b_pins_the_gang_to_one_provisioned_rack(kueue_env: KueueEnv) -> None:
    env = kueue_env
    await setup(env)

    async def active() -> bool:
        ac = await env.kube.get(ADMISSION_CHECKS, CHECK)
        return any(c["type"] == "Active" and c["status"] == "True"
                   for c in (ac.get("status") or {}).get("conditions") or [])
    await eventually(active, what="AdmissionCheck Active=True")
    foreign = await env.kube.get(ADMISSION_CHECKS, OTHER_CHECK)
    assert not (foreign.get("status") or {}).get("conditions"), "not Muster's check"

    await submit(env, "train", 16)
    # Another controller writes its own entry while Muster works on its one.
    await env.update_status("train", other_ready)

    ready = await env.wait_check("train", CHECK, "Ready", within=40)
    pr_name = "train-muster-prov-1"
    pr = await env.kube.get(PROVISIONING_REQUESTS, pr_name, namespace=env.namespace)
    wl = await env.workload("train")
    assert pr["spec"]["provisioningClassName"] == "atomic-provisioning.muster.dev"
    assert {p["podTemplateRef"]["name"]: p["count"] for p in pr["spec"]["podSets"]} == {
        f"ppt-{pr_name}-workers": 16, f"ppt-{pr_name}-launcher": 1}
    # Workload -> templates -> request: the request has no Workload owner, which real Kueue's
    # provisioning controller would take for an unused request of its own and delete.
    templates = {t: await env.kube.get(POD_TEMPLATES, f"ppt-{pr_name}-{t}",
                                       namespace=env.namespace)
                 for t in ("workers", "launcher")}
    assert [(o["kind"], o["uid"], o["controller"]) for o in pr["metadata"]["ownerReferences"]
            ] == [("PodTemplate", templates["workers"]["metadata"]["uid"], True),
                  ("PodTemplate", templates["launcher"]["metadata"]["uid"], False)]
    assert pr["metadata"]["annotations"]["muster.dev/workload-uid"] == wl["metadata"]["uid"]
    tpl = templates["workers"]
    assert [o["uid"] for o in tpl["metadata"]["ownerReferences"]] == [wl["metadata"]["uid"]]
    assert tpl["template"]["spec"]["nodeSelector"] == {"muster.dev/accelerator": "h100"}
    assert tpl["template"]["metadata"]["annotations"][MUSTER_REQUIRED] == objects.RACK

    updates = {u["name"]: u for u in ready["podSetUpdates"]}
    rack = updates["workers"]["nodeSelector"][objects.RACK]
    assert rack != "b1-r1", "the nearly full rack cannot hold the gang"
    assert updates["workers"]["annotations"] == {
        CONSUME_ANNOTATION: pr_name, CLASS_ANNOTATION: "atomic-provisioning.muster.dev"}
    assert updates["workers"]["tolerations"] == [
        {"key": objects.GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    assert "nodeSelector" not in updates["launcher"], "the launcher is not confined"
    other = next(c for c in wl["status"]["admissionChecks"] if c["name"] == OTHER_CHECK)
    assert other["state"] == "Ready" and other["podSetUpdates"][0]["labels"] == {
        "example.com/ok": "yes"}, "Muster's writes kept the other check's entry"

    async def posted() -> bool:  # Events are posted in the background, shortly after
        events = (await env.kube.list(EVENTS, namespace=env.namespace)).get("items") or []
        reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
        return {("train", "ProvisioningRequestCreated"),
                ("train", "AdmissionCheckUpdated")} <= reasons

    await eventually(posted, within=10, what="the Workload's Events")

    rack_nodes = (await env.kube.list(
        NODES, label_selector=f"{objects.RACK}={rack},{POOL_LABEL}=gpu-h100")).get("items")
    assert len(rack_nodes or []) == 16, "Muster provisioned the whole gang in that rack"

    # While train's booking holds (its pods do not exist yet), a second gang asks too.
    await submit(env, "other", 8)
    await env.update_status("other", other_ready)
    other_state = await env.wait_check("other", CHECK, "Ready", within=40)
    other_rack = {u["name"]: u for u in other_state["podSetUpdates"]}["workers"][
        "nodeSelector"][objects.RACK]
    assert other_rack != rack, "the booked rack is not offered to another Workload"

    # A GPU pod of a Workload admitted without Muster's check (the flavor's nodeLabels, no
    # toleration for the pool's taint): it must not take a booked node.
    intruder = kq.admitted_pod(gang("plain", env.namespace, 1) | {"status": {
        "admission": {"clusterQueue": "x", "podSetAssignments": [
            {"name": "workers", "flavors": GPU_FLAVORS, "count": 1}]}}},
        "workers", 0, flavors=FLAVORS)
    await env.kube.create(PODS, intruder, namespace=env.namespace)
    await run_pods(env, "other", 8)
    await run_pods(env, "train", 16)
    train_pods = await eventually(lambda: all_bound(env, "train", 17), within=30,
                                  what="train's 17 pods bound")
    other_pods = await eventually(lambda: all_bound(env, "other", 9), within=30,
                                  what="other's 9 pods bound")
    names = {n["metadata"]["name"] for n in rack_nodes or []}
    workers = [p for p in train_pods if p["metadata"]["labels"]["kueue.x-k8s.io/podset"]
               == "workers"]
    assert len(workers) == 16 and {p["spec"]["nodeName"] for p in workers} <= names
    assert len({p["spec"]["nodeName"] for p in workers}) == 16
    assert not names & {p["spec"]["nodeName"] for p in other_pods}, (
        "no pod of another Workload runs on train's booked nodes")
    plain = await env.kube.get(PODS, intruder["metadata"]["name"], namespace=env.namespace)
    assert not plain["spec"].get("nodeName"), "a pod without the check's updates stays off"

    # Finished: Muster deletes its request (Kueue's CleanupProvisioningRequestsOnEviction).
    await env.update_status("train", lambda wl: kq.set_condition(
        wl["status"], "Finished", True, "Succeeded", now()))

    async def gone() -> bool:
        return await env.kube.get_or_none(
            PROVISIONING_REQUESTS, pr_name, namespace=env.namespace) is None
    await eventually(gone, what="train's ProvisioningRequest deleted")


async def test_path_b_survives_conflict_storms_and_dropped_watches(kueue_env: KueueEnv) -> None:
    env = kueue_env
    await setup(env)
    # Half of all Workload patches answer 409 and every watch stream ends after a few events:
    # the read-modify-write retries and the re-listing watches must still get there, without
    # losing the other controller's entry.
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
