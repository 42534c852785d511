"""Real Kueue, the real scheduler and Muster: the whole path a user takes, from a batch/v1 Job
to its pods bound on nodes Muster acquired.

Path A (Kueue's built-in ``kueue.x-k8s.io/provisioning-request`` check with a
ProvisioningRequestConfig naming a Muster class) on a TAS flavor: Kueue creates the Workload,
the ProvisioningRequest and its PodTemplates; Muster provisions one rack; Kueue computes its
topology assignment on the new nodes and admits; the kube-scheduler binds every pod, and
each pod's node is in the rack that ``provisioningClassDetails`` names.

Only the real tier runs Kueue; on the sandbox tier these scenarios are skipped (the sandbox
tests play Kueue by hand instead: test_kueue_provisioning_request.py and friends).
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.commands import objects
from controller.kube import Body
from controller.kube.resources import NODES, PODS, PROVISIONING_REQUESTS, Resource
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    TOPOLOGIES,
    WORKLOADS,
)
from controller.topology_defaults import DEFAULT_LEVELS
from e2e.conftest import Env, eventually

JOBS = Resource("batch", "v1", "jobs", namespaced=True, kind="Job")
ATOMIC = "atomic-provisioning.muster.dev"
KUEUE_CHECK = "kueue.x-k8s.io/provisioning-request"
RACK_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"


def _real_kueue(env: Env) -> None:
    if not env.external:
        pytest.skip("needs real Kueue, which runs only on the real tier")


async def _create(env: Env, res: Resource, body: Body) -> Body:
    namespace = env.namespace if res.namespaced else None
    created = await env.kube.create(res, body, namespace=namespace)
    if not res.namespaced:
        name = body["metadata"]["name"]
        env.cleanup.append(lambda: env.kube.delete(res, name))
    return created


async def path_a_wiring(env: Env, *, tas: bool = True) -> dict[str, str]:
    """A CapacityPool, Topology, flavor, ProvisioningRequestConfig, AdmissionCheck,
    ClusterQueue and LocalQueue for this run; the flavor's nodeLabels pin every pod to this
    run's nodes."""
    pool = await env.gpu_pool(blocks=1, racks_per_block=3, nodes_per_rack=4)
    names = {k: env.name(k) for k in ("topology", "flavor", "config", "check", "cq")}
    names["pool"] = pool
    k = "kueue.x-k8s.io/v1beta2"
    if tas:
        await _create(env, TOPOLOGIES, {
            "apiVersion": k, "kind": "Topology", "metadata": {"name": names["topology"]},
            "spec": {"levels": [{"nodeLabel": level} for level in DEFAULT_LEVELS]}})
    flavor: Body = {
        "apiVersion": k, "kind": "ResourceFlavor", "metadata": {"name": names["flavor"]},
        "spec": {"nodeLabels": {**env.selector, "muster.dev/accelerator": "h100"},
                 "tolerations": [objects.GPU_TOLERATION]}}
    if tas:
        flavor["spec"]["topologyName"] = names["topology"]
    await _create(env, RESOURCE_FLAVORS, flavor)
    await _create(env, PROVISIONING_REQUEST_CONFIGS, {
        "apiVersion": k, "kind": "ProvisioningRequestConfig",
        "metadata": {"name": names["config"]},
        "spec": {
            "provisioningClassName": ATOMIC,
            "managedResources": [objects.GPU],
            "retryStrategy": {"backoffLimitCount": 2, "backoffBaseSeconds": 1,
                              "backoffMaxSeconds": 4},
            "podSetUpdates": {"nodeSelector": [
                {"key": objects.RACK, "valueFromProvisioningClassDetail": objects.RACK}]},
        }})
    await _create(env, ADMISSION_CHECKS, {
        "apiVersion": k, "kind": "AdmissionCheck", "metadata": {"name": names["check"]},
        "spec": {"controllerName": KUEUE_CHECK, "parameters": {
            "apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
            "name": names["config"]}}})
    await _create(env, CLUSTER_QUEUES, {
        "apiVersion": k, "kind": "ClusterQueue", "metadata": {"name": names["cq"]},
        "spec": {
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": env.namespace}},
            "resourceGroups": [{
                "coveredResources": ["cpu", "memory", objects.GPU],
                "flavors": [{"name": names["flavor"], "resources": [
                    {"name": "cpu", "nominalQuota": "1000"},
                    {"name": "memory", "nominalQuota": "10Ti"},
                    {"name": objects.GPU, "nominalQuota": "96"}]}]}],
            "admissionChecksStrategy": {"admissionChecks": [
                {"name": names["check"], "onFlavors": [names["flavor"]]}]},
        }})
    await env.kube.create(LOCAL_QUEUES, {
        "apiVersion": k, "kind": "LocalQueue",
        "metadata": {"name": "training", "namespace": env.namespace},
        "spec": {"clusterQueue": names["cq"]}}, namespace=env.namespace)

    async def active() -> bool:
        cq = await env.kube.get(CLUSTER_QUEUES, names["cq"])
        return any(c["type"] == "Active" and c["status"] == "True"
                   for c in (cq.get("status") or {}).get("conditions") or [])

    await eventually(active, within=30, what=f"ClusterQueue {names['cq']} to be Active")
    return names


def gang_job(name: str, namespace: str, workers: int, *, rack_annotation: bool = True
             ) -> Body:
    annotations = {RACK_ANNOTATION: objects.RACK} if rack_annotation else {}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"kueue.x-k8s.io/queue-name": "training"}},
        "spec": {
            "suspend": True, "parallelism": workers, "completions": workers,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "worker", "image": "registry.k8s.io/pause:3.10",
                        "resources": {
                            "requests": {"cpu": "8", "memory": "64Gi", objects.GPU: "8"},
                            "limits": {objects.GPU: "8"}},
                    }],
                },
            },
        },
    }


async def _workload_of(env: Env, job: str) -> Body | None:
    listing = await env.kube.list(WORKLOADS, namespace=env.namespace)
    for wl in listing.get("items") or []:
        owners = wl["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Job" and o.get("name") == job for o in owners):
            return dict(wl)
    return None


def _condition(obj: Body, type_: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


async def _bound_pods(env: Env, job: str, count: int) -> list[Body] | None:
    listing = await env.kube.list(PODS, namespace=env.namespace,
                                  label_selector=f"batch.kubernetes.io/job-name={job}")
    pods = [p for p in listing.get("items") or [] if p["spec"].get("nodeName")]
    return pods if len(pods) >= count else None


async def test_path_a_job_to_pods_bound_in_the_provisioned_rack(env: Env) -> None:
    _real_kueue(env)
    names = await path_a_wiring(env)
    await env.kube.create(JOBS, gang_job("train", env.namespace, 4), namespace=env.namespace)

    wl = await eventually(lambda: _workload_of(env, "train"), what="Kueue's Workload")
    wl_name = wl["metadata"]["name"]

    async def kueue_request() -> Body | None:
        listing = await env.kube.list(PROVISIONING_REQUESTS, namespace=env.namespace)
        items = [p for p in listing.get("items") or []
                 if p["metadata"]["name"].startswith(f"{wl_name}-{names['check']}-")]
        return items[0] if items else None

    pr = await eventually(kueue_request, within=30, what="Kueue's ProvisioningRequest")
    assert pr["spec"]["provisioningClassName"] == ATOMIC
    assert pr["metadata"]["labels"]["kueue.x-k8s.io/managed"] == "true"

    async def provisioned() -> Body | None:
        got = await env.kube.get(PROVISIONING_REQUESTS, pr["metadata"]["name"],
                                 namespace=env.namespace)
        cond = _condition(got, "Provisioned")
        return got if cond and cond["status"] == "True" else None

    pr = await eventually(provisioned, within=60, what="Muster to provision Kueue's request")
    rack = pr["status"]["provisioningClassDetails"][objects.RACK]

    async def admitted() -> Body | None:
        got = await env.kube.get(WORKLOADS, wl_name, namespace=env.namespace)
        cond = _condition(got, "Admitted")
        return got if cond and cond["status"] == "True" else None

    await eventually(admitted, within=60, what=f"Kueue to admit {wl_name}")
    pods = await eventually(lambda: _bound_pods(env, "train", 4), within=60,
                            what="the scheduler to bind all 4 pods")
    pool_nodes = {n["metadata"]["name"]: n for n in await env.pool_nodes(names["pool"])}
    assert len(pool_nodes) == 4, f"Muster acquired {sorted(pool_nodes)} for a gang of 4"
    for pod in pods:
        node = pod["spec"]["nodeName"]
        assert node in pool_nodes, f"{pod['metadata']['name']} ran on {node}, not Muster's"
        assert pool_nodes[node]["metadata"]["labels"][objects.RACK] == rack
    # Every pod of the gang on its own 8-GPU node.
    assert len({p["spec"]["nodeName"] for p in pods}) == 4

    existing = await env.kube.list(NODES, label_selector=f"e2e.muster.dev/run={env.run}")
    assert {n["metadata"]["name"] for n in existing["items"]} == set(pool_nodes)
