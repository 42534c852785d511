"""Real Kueue, the real scheduler and Muster: the whole path a user takes, from a batch/v1 Job
to its pods bound on nodes Muster acquired.

Path A (Kueue's built-in ``kueue.x-k8s.io/provisioning-request`` check with a
ProvisioningRequestConfig naming a Muster class) on a TAS flavor: Kueue creates the Workload,
the ProvisioningRequest and its PodTemplates; Muster provisions one rack; Kueue computes its
topology assignment on the new nodes and admits; the kube-scheduler binds every pod, and
each pod's node is in the rack that ``provisioningClassDetails`` names, which is also the rack
of Kueue's ``topologyAssignment``. Also on path A: the parameters Kueue passes from the config
and the Job (Muster ignores what it does not act on, saying so); where Kueue TAS and Muster
could disagree (a rack freed while Muster acquires) and how the config's rack nodeSelector
settles it, and what happens without it; Kueue's slice annotations (every slice of 4 in one
rack, 12 workers in three racks).

Path B (Muster's own check, ``controllerName: muster.dev/provisioning``; the session's Muster
runs with ``kueue.enabled``): Active, Pending -> Ready with podSetUpdates and pods bound on
Muster's nodes; a gang that can never fit Rejected and the Workload deactivated; a stock-out
Retry, Kueue's eviction and requeue after backoffBaseSeconds, attempt 2 succeeding. On a TAS
flavor, where Kueue places the gang at quota reservation: Muster books the existing nodes
Kueue chose (check-capacity, noRetry; Retry while another request holds them), and leaves a
booked node that vanishes after admission to Kueue's node-failure handling.

Only the real tier runs Kueue; on the sandbox tier these scenarios are skipped (the sandbox
tests that play Kueue by hand, test_kueue_admission_check.py and
test_kueue_check_lifecycle.py, keep what the real tier cannot reach).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pytest

from controller.commands import objects
from controller.common.topology_defaults import DEFAULT_LEVELS, HOSTNAME, MUSTER_REQUIRED
from controller.config import CHECK_CAPACITY_CLASS, QUEUED_CLASS
from controller.inputs.tas_slices import SLICE_REQUIRED, SLICE_SIZE
from controller.kube import Body, whole_listing
from controller.kube.client import WatchEvent
from controller.kube.resources import (
    CAPACITY_POOLS,
    EVENTS,
    NODES,
    POD_TEMPLATES,
    PODS,
    PROVISIONING_REQUESTS,
    Resource,
)
from controller.kueue.decisions import (
    CLASS_ANNOTATION,
    CONSUME_ANNOTATION,
    PODSET_DETAIL_PREFIX,
    expand_topology_assignment,
)
from controller.kueue.drafts import MANAGED_LABEL, WORKLOAD_UID_ANNOTATION
from controller.kueue.models import TopologyAssignment
from controller.kueue.resources import (
    ADMISSION_CHECKS,
    CLUSTER_QUEUES,
    LOCAL_QUEUES,
    PROVISIONING_REQUEST_CONFIGS,
    RESOURCE_FLAVORS,
    TOPOLOGIES,
    WORKLOADS,
)
from e2e.conftest import Env, eventually

JOBS = Resource("batch", "v1", "jobs", namespaced=True, kind="Job")
ATOMIC = "atomic-provisioning.muster.dev"
KUEUE_CHECK = "kueue.x-k8s.io/provisioning-request"
MUSTER_CHECK = "muster.dev/provisioning"
RACK_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
PROVREQ_PREFIX = "provreq.kueue.x-k8s.io/"


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


async def path_a_wiring(
    env: Env, *, tas: bool = True, parameters: dict[str, str] | None = None,
    rack_selector: bool = True, pool_parameters: dict[str, Any] | None = None,
    nodes_per_rack: int = 4, class_name: str = ATOMIC,
) -> dict[str, str]:
    """A CapacityPool (three racks of ``nodes_per_rack``), Topology, flavor,
    ProvisioningRequestConfig, AdmissionCheck, ClusterQueue and LocalQueue for this run; the
    flavor's nodeLabels pin every pod to this run's nodes. ``parameters``: the
    ProvisioningRequestConfig's; ``rack_selector``: its podSetUpdates copy the rack from
    provisioningClassDetails into a nodeSelector; ``class_name``: the class it names."""
    pool = await env.gpu_pool(blocks=1, racks_per_block=3, nodes_per_rack=nodes_per_rack,
                              parameters=pool_parameters)
    names = {k: env.name(k) for k in ("config", "check", "cq")}
    names.update(await _flavor(env, tas=tas))
    names["pool"] = pool
    prc: Body = {
        "provisioningClassName": class_name,
        "managedResources": [objects.GPU],
        "retryStrategy": {"backoffLimitCount": 2, "backoffBaseSeconds": 1,
                          "backoffMaxSeconds": 4},
    }
    if rack_selector:
        prc["podSetUpdates"] = {"nodeSelector": [
            {"key": objects.RACK, "valueFromProvisioningClassDetail": objects.RACK}]}
    if parameters:
        prc["parameters"] = dict(parameters)
    await _check_and_queues(env, names, prc, KUEUE_CHECK, queue="training",
                            on_flavors=[names["flavor"]])
    return names


async def _flavor(env: Env, *, tas: bool) -> dict[str, str]:
    """The run's ResourceFlavor of 8-GPU nodes (its nodeLabels pick only this run's nodes),
    on a Topology of block, rack and hostname when ``tas``; their names."""
    k = "kueue.x-k8s.io/v1beta2"
    names = {"flavor": env.name("flavor")}
    flavor: Body = {
        "apiVersion": k, "kind": "ResourceFlavor", "metadata": {"name": names["flavor"]},
        "spec": {"nodeLabels": {**env.selector, "muster.dev/accelerator": "h100"},
                 "tolerations": [objects.GPU_TOLERATION]}}
    if tas:
        names["topology"] = env.name("topology")
        await _create(env, TOPOLOGIES, {
            "apiVersion": k, "kind": "Topology", "metadata": {"name": names["topology"]},
            "spec": {"levels": [{"nodeLabel": level} for level in DEFAULT_LEVELS]}})
        flavor["spec"]["topologyName"] = names["topology"]
    await _create(env, RESOURCE_FLAVORS, flavor)
    return names


async def _check_and_queues(
    env: Env, names: dict[str, str], prc: Body, controller: str, *, queue: str,
    on_flavors: list[str] | None = None,
) -> None:
    """The ProvisioningRequestConfig, an AdmissionCheck of ``controller`` using it, a
    ClusterQueue of this run's namespace guarded by the check, and the LocalQueue ``queue``;
    waits for the ClusterQueue to be Active."""
    k = "kueue.x-k8s.io/v1beta2"
    await _create(env, PROVISIONING_REQUEST_CONFIGS, {
        "apiVersion": k, "kind": "ProvisioningRequestConfig",
        "metadata": {"name": names["config"]}, "spec": prc})
    await _create(env, ADMISSION_CHECKS, {
        "apiVersion": k, "kind": "AdmissionCheck", "metadata": {"name": names["check"]},
        "spec": {"controllerName": controller, "parameters": {
            "apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
            "name": names["config"]}}})
    check: Body = {"name": names["check"]}
    if on_flavors:
        check["onFlavors"] = on_flavors
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
                    # Twice the largest gang (12 x 8): Kueue 0.17's second TAS pass
                    # (path A) re-checks the quota of all but one (at random) resource with the
                    # Workload's own reservation still counted, so a gang needing more
                    # than half of what is left is never admitted (SecondPassFailed:
                    # "insufficient unused quota"; kubernetes-sigs/kueue#9048).
                    {"name": objects.GPU, "nominalQuota": "192"}]}]}],
            "admissionChecksStrategy": {"admissionChecks": [check]},
        }})
    await env.kube.create(LOCAL_QUEUES, {
        "apiVersion": k, "kind": "LocalQueue",
        "metadata": {"name": queue, "namespace": env.namespace},
        "spec": {"clusterQueue": names["cq"]}}, namespace=env.namespace)

    async def active() -> dict[str, Any] | None:
        return _true(await env.kube.get(CLUSTER_QUEUES, names["cq"]), "Active")

    await eventually(active, within=30, what=f"ClusterQueue {names['cq']} to be Active")


def gang_job(name: str, namespace: str, workers: int, *, rack_annotation: bool = True,
             annotations: dict[str, str] | None = None, queue: str = "training",
             pod_annotations: dict[str, str] | None = None) -> Body:
    """An Indexed Job of ``workers`` 8-GPU pods (one per node); ``annotations`` on the Job
    (Kueue copies ``provreq.kueue.x-k8s.io/*`` ones to its Workload). The pods require one
    rack through Kueue's TAS annotation unless ``pod_annotations`` says otherwise."""
    if pod_annotations is None:
        pod_annotations = {RACK_ANNOTATION: objects.RACK} if rack_annotation else {}
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": dict(annotations or {}),
                     "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {
            "suspend": True, "parallelism": workers, "completions": workers,
            "completionMode": "Indexed",
            "template": {
                "metadata": {"annotations": pod_annotations},
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


async def _kueue_request(env: Env, wl_name: str, check: str, attempt: int = 1
                         ) -> Body | None:
    return await env.kube.get_or_none(PROVISIONING_REQUESTS, f"{wl_name}-{check}-{attempt}",
                                      namespace=env.namespace)


async def _provisioned(env: Env, pr_name: str) -> Body | None:
    got = await env.kube.get(PROVISIONING_REQUESTS, pr_name, namespace=env.namespace)
    cond = _condition(got, "Provisioned")
    return got if cond and cond["status"] == "True" else None


async def _admitted(env: Env, wl_name: str) -> Body | None:
    got = await env.kube.get(WORKLOADS, wl_name, namespace=env.namespace)
    cond = _condition(got, "Admitted")
    return got if cond and cond["status"] == "True" else None


def _check_entry(wl: Body, check: str) -> dict[str, Any]:
    for entry in (wl.get("status") or {}).get("admissionChecks") or []:
        if entry.get("name") == check:
            return dict(entry)
    raise AssertionError(f"Workload {wl['metadata']['name']} has no check {check}")


async def _assigned_racks(env: Env, wl: Body, known: Mapping[str, Body] | None = None
                         ) -> tuple[set[str], set[str]]:
    """The racks and nodes of every pod set's Kueue TAS ``topologyAssignment``. With
    ``kubernetes.io/hostname`` as its lowest level Kueue records the hostname level alone,
    so a rack is read from the node's labels when the assignment does not name it: from
    ``known`` (nodes listed earlier) first, since kwok finishes the gang's pods at once and
    the idle collector may already have released their nodes."""
    racks: set[str] = set()
    hosts: set[str] = set()
    for psa in wl["status"]["admission"]["podSetAssignments"]:
        ta = psa.get("topologyAssignment")
        assert ta, f"pod set {psa['name']} has no topologyAssignment: {psa}"
        for labels, _count in expand_topology_assignment(TopologyAssignment.model_validate(ta)):
            host = labels.get(HOSTNAME)
            if host is not None:
                hosts.add(host)
            if objects.RACK in labels:
                racks.add(labels[objects.RACK])
            elif host is not None:
                node = (known or {}).get(host) or await env.kube.get(NODES, host)
                racks.add(node["metadata"]["labels"][objects.RACK])
    return racks, hosts


async def test_path_a_job_to_pods_bound_in_the_provisioned_rack(env: Env) -> None:
    _real_kueue(env)
    names = await path_a_wiring(env)
    await env.kube.create(JOBS, gang_job("train", env.namespace, 4), namespace=env.namespace)

    wl = await eventually(lambda: _workload_of(env, "train"), what="Kueue's Workload")
    wl_name = wl["metadata"]["name"]
    pr = await eventually(lambda: _kueue_request(env, wl_name, names["check"]), within=30,
                          what="Kueue's ProvisioningRequest")
    assert pr["spec"]["provisioningClassName"] == ATOMIC
    assert pr["metadata"]["labels"]["kueue.x-k8s.io/managed"] == "true"

    pr = await eventually(lambda: _provisioned(env, pr["metadata"]["name"]), within=60,
                          what="Muster to provision Kueue's request")
    rack = pr["status"]["provisioningClassDetails"][objects.RACK]

    wl = await eventually(lambda: _admitted(env, wl_name), within=60,
                          what=f"Kueue to admit {wl_name}")
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
    # Kueue's topology assignment, computed after provisioning, is Muster's rack and nodes.
    racks, hosts = await _assigned_racks(env, wl, pool_nodes)
    assert racks == {rack}, f"Kueue TAS assigned {racks}, Muster provisioned {rack}"
    assert hosts == set(pool_nodes)

    # No other node was bought (the gang's own may be released already: its pods are done).
    existing = await env.kube.list(NODES, label_selector=f"e2e.muster.dev/run={env.run}")
    assert {n["metadata"]["name"] for n in existing["items"]} <= set(pool_nodes)


async def test_path_a_a_config_naming_the_queued_class_runs_the_gang_through_the_queue(
    env: Env,
) -> None:
    """A ProvisioningRequestConfig naming ``queued-provisioning.muster.dev`` (and a run
    duration, which Kueue forwards as a parameter): Kueue's request waits in the pool's cloud
    queue (the fake cloud's, which grants a gang whole once its stock holds it), is
    provisioned, and Kueue admits the Job onto the granted nodes (the queue itself, granted
    and cancelled, is the cloud tier's to show)."""
    _real_kueue(env)
    names = await path_a_wiring(env, class_name=QUEUED_CLASS, pool_parameters={"queue": True},
                                parameters={"maxRunDurationSeconds": "3600"})
    await env.kube.create(JOBS, gang_job("queued", env.namespace, 2), namespace=env.namespace)

    wl = await eventually(lambda: _workload_of(env, "queued"), what="Kueue's Workload")
    wl_name = wl["metadata"]["name"]
    pr = await eventually(lambda: _kueue_request(env, wl_name, names["check"]), within=30,
                          what="Kueue's ProvisioningRequest")
    assert pr["spec"]["provisioningClassName"] == QUEUED_CLASS
    assert pr["spec"]["parameters"]["maxRunDurationSeconds"] == "3600"

    pr = await eventually(lambda: _provisioned(env, pr["metadata"]["name"]), within=60,
                          what="Muster to provision Kueue's queued request")
    rack = pr["status"]["provisioningClassDetails"][objects.RACK]
    await eventually(lambda: _admitted(env, wl_name), within=60,
                     what=f"Kueue to admit {wl_name}")
    pods = await eventually(lambda: _bound_pods(env, "queued", 2), within=60,
                            what="the scheduler to bind both pods")
    pool_nodes = {n["metadata"]["name"]: n for n in await env.pool_nodes(names["pool"])}
    assert len(pool_nodes) == 2, f"Muster acquired {sorted(pool_nodes)} for a gang of 2"
    for pod in pods:
        node = pod["spec"]["nodeName"]
        assert node in pool_nodes, f"{pod['metadata']['name']} ran on {node}, not Muster's"
        assert pool_nodes[node]["metadata"]["labels"][objects.RACK] == rack


async def test_path_a_parameters_from_the_config_and_the_job_are_accepted(env: Env) -> None:
    """Kueue passes every ProvisioningRequestConfig parameter and every
    ``provreq.kueue.x-k8s.io/<name>`` annotation (Job -> Workload -> request) unchecked;
    Muster honours what it knows and ignores the rest, saying so. (An annotation that
    overrides a parameter the config also sets is Kueue's churn, the next test.)"""
    _real_kueue(env)
    names = await path_a_wiring(env, parameters={
        "maxRunDurationSeconds": "3600", "noRetry": "false"})
    job = gang_job("params", env.namespace, 2, annotations={
        f"{PROVREQ_PREFIX}ValidUntilSeconds": "900", f"{PROVREQ_PREFIX}colour": "blue"})
    await env.kube.create(JOBS, job, namespace=env.namespace)

    wl = await eventually(lambda: _workload_of(env, "params"), what="Kueue's Workload")
    wl_name = wl["metadata"]["name"]
    assert {k: v for k, v in wl["metadata"].get("annotations", {}).items()
            if k.startswith(PROVREQ_PREFIX)} == job["metadata"]["annotations"]
    pr = await eventually(lambda: _kueue_request(env, wl_name, names["check"]), within=30,
                          what="Kueue's ProvisioningRequest")
    assert pr["spec"]["parameters"] == {
        "ValidUntilSeconds": "900", "maxRunDurationSeconds": "3600", "noRetry": "false",
        "colour": "blue"}

    pr = await eventually(lambda: _provisioned(env, pr["metadata"]["name"]), within=60,
                          what="Muster to provision a request with parameters it ignores")
    assert _condition(pr, "Failed") is None
    accepted = _condition(pr, "Accepted")
    assert accepted is not None and accepted["status"] == "True", accepted
    assert "Muster ignores parameter(s) colour (not a parameter of" in accepted["message"]
    # maxRunDurationSeconds is honoured (a one-hour run), so it is not in the note.
    assert "maxRunDurationSeconds" not in accepted["message"]

    wl = await eventually(lambda: _admitted(env, wl_name), within=60,
                          what=f"Kueue to admit {wl_name}")
    # Kueue copied the Provisioned message, with Muster's note, into the Workload.
    entry = _check_entry(wl, names["check"])
    assert entry["state"] == "Ready"
    assert "Ignored parameter(s): colour (" in entry["message"]
    await eventually(lambda: _bound_pods(env, "params", 2), within=60,
                     what="the scheduler to bind both pods")

    async def warned() -> list[Body]:
        listing = await env.kube.list(EVENTS, namespace=env.namespace)
        return [e for e in listing.get("items") or []
                if e.get("reason") == "ParametersIgnored"
                and e["involvedObject"]["name"] == pr["metadata"]["name"]]

    (event,) = await eventually(warned, within=20, what="the ParametersIgnored Event")
    assert event["type"] == "Warning"


async def test_path_a_an_annotation_overriding_a_config_parameter_churns_in_kueue(
    env: Env,
) -> None:
    """A limit of Kueue 0.17, not of Muster: Kueue's docs let a Job annotation override a
    parameter the ProvisioningRequestConfig sets, but its controller keeps a request only
    while it carries every config parameter with the config's value
    (``provReqSyncedWithConfig``), so it deletes the request it just created with the
    annotation's value and creates it again, forever; the Workload is never admitted. Muster
    takes each incarnation as a new request and releases what a deleted one acquired (the
    fixture's clean-up checks no node is left). docs/concepts/kueue.md: set such a
    parameter in the config or on the Job, not both."""
    _real_kueue(env)
    names = await path_a_wiring(env, parameters={"ValidUntilSeconds": "600"})
    job = gang_job("override", env.namespace, 2,
                   annotations={f"{PROVREQ_PREFIX}ValidUntilSeconds": "900"})
    await env.kube.create(JOBS, job, namespace=env.namespace)
    wl = await eventually(lambda: _workload_of(env, "override"), what="Kueue's Workload")
    wl_name = wl["metadata"]["name"]
    uids: set[str] = set()

    async def recreated() -> bool:
        pr = await _kueue_request(env, wl_name, names["check"])
        if pr is not None:
            assert pr["spec"]["parameters"] == {"ValidUntilSeconds": "900"}
            uids.add(pr["metadata"]["uid"])
        return len(uids) >= 3

    await eventually(recreated, within=30, step=0.05,
                     what="Kueue to delete and recreate its request")
    assert await _admitted(env, wl_name) is None
    await env.kube.delete(JOBS, "override", namespace=env.namespace)


# ------------------------------------------------------------------ TAS: Kueue vs Muster


async def _kwok_rack(env: Env, rack: str, count: int) -> list[str]:
    """``count`` idle 8-GPU kwok nodes of this run in ``rack`` (outside the pool), matching
    the run's flavor."""
    return [await _kwok_node(env, rack, i) for i in range(count)]


async def _kwok_node(env: Env, rack: str, index: int) -> str:
    name = env.name(f"{rack}-{index}")
    body = objects.node(
        name, allocatable={"cpu": "96", "memory": "1024Gi", objects.GPU: "8"},
        labels={**env.selector, "muster.dev/accelerator": "h100",
                objects.BLOCK: rack.split("-")[0], objects.RACK: rack},
        taints=[objects.GPU_TAINT])
    body["metadata"]["annotations"] = {"kwok.x-k8s.io/node": "fake"}
    await env.kube.create(NODES, body)
    env.cleanup.append(lambda: env.kube.delete(NODES, name))
    return name


async def _busy_rack(env: Env, rack: str, count: int) -> list[str]:
    """``count`` kwok nodes of this run in ``rack`` (outside the pool), each full with a
    running 8-GPU pod, like a rack another job still holds."""
    names = await _kwok_rack(env, rack, count)
    for i, name in enumerate(names):
        await env.kube.create(PODS, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"holder-{i}", "namespace": env.namespace,
                         "labels": {"e2e.muster.dev/holder": "true"}},
            "spec": {
                "nodeName": name, "terminationGracePeriodSeconds": 0,
                "tolerations": [objects.GPU_TOLERATION],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {objects.GPU: "8"},
                                              "limits": {objects.GPU: "8"}}}]},
        }, namespace=env.namespace)
    return names


async def _free(env: Env, count: int) -> None:
    for i in range(count):
        await env.kube.delete(PODS, f"holder-{i}", namespace=env.namespace)

    async def gone() -> bool:
        left = await env.kube.list(PODS, namespace=env.namespace,
                                   label_selector="e2e.muster.dev/holder=true")
        return not left.get("items")

    await eventually(gone, within=20, what="the holder pods to be gone")


async def _another_rack_frees_up_while_muster_acquires(
    env: Env, *, rack_selector: bool
) -> tuple[dict[str, str], str, Body, list[str]]:
    """Rack b0-r1 (outside the pool) is full when Muster plans, so Muster acquires a pool
    rack; while the acquisition runs (the fake provider's latencySeconds) b0-r1 frees up,
    so when Kueue computes its topology assignment after provisioning, two racks fit the
    gang. Kueue TAS breaks the tie towards b0 (its BestFit orders equal domains by label
    values). Returns the wiring, Muster's rack, the admitted Workload and b0-r1's nodes."""
    names = await path_a_wiring(env, rack_selector=rack_selector,
                                pool_parameters={"latencySeconds": 6})
    busy = await _busy_rack(env, "b0-r1", 4)
    await env.kube.create(JOBS, gang_job("tas", env.namespace, 4), namespace=env.namespace)
    wl = await eventually(lambda: _workload_of(env, "tas"), what="Kueue's Workload")
    wl_name = wl["metadata"]["name"]
    pr = await eventually(lambda: _kueue_request(env, wl_name, names["check"]), within=30,
                          what="Kueue's ProvisioningRequest")

    async def planned() -> Body | None:
        got = await env.kube.get(PROVISIONING_REQUESTS, pr["metadata"]["name"],
                                 namespace=env.namespace)
        phase = (got["metadata"].get("annotations") or {}).get("muster.dev/phase")
        return got if phase == "Acquiring" else None

    await eventually(planned, within=30, what="Muster to plan and start acquiring")
    await _free(env, 4)
    pr = await eventually(lambda: _provisioned(env, pr["metadata"]["name"]), within=60,
                          what="Muster to provision")
    rack = pr["status"]["provisioningClassDetails"][objects.RACK]
    assert rack != "b0-r1" and rack.startswith("b1-"), rack
    wl = await eventually(lambda: _admitted(env, wl_name), within=60,
                          what=f"Kueue to admit {wl_name}")
    return names, rack, wl, busy


async def test_path_a_tas_places_the_gang_in_musters_rack_when_another_rack_frees_up(
    env: Env,
) -> None:
    """With the ProvisioningRequestConfig's ``podSetUpdates.nodeSelector`` copying the rack
    from provisioningClassDetails, Kueue TAS computes its assignment under that selector
    (it merges a Ready check's podSetUpdates, for a Topology whose lowest level is
    kubernetes.io/hostname): Muster's rack wins even when another rack fits as well."""
    _real_kueue(env)
    names, rack, wl, busy = await _another_rack_frees_up_while_muster_acquires(
        env, rack_selector=True)
    racks, hosts = await _assigned_racks(env, wl)
    assert racks == {rack}, f"Kueue TAS assigned {racks}, Muster provisioned {rack}"
    pool_nodes = {n["metadata"]["name"] for n in await env.pool_nodes(names["pool"])}
    assert hosts == pool_nodes and not hosts & set(busy)
    pods = await eventually(lambda: _bound_pods(env, "tas", 4), within=60,
                            what="the scheduler to bind all 4 pods")
    assert {p["spec"]["nodeName"] for p in pods} == pool_nodes


async def test_path_a_tas_without_the_rack_selector_runs_the_gang_elsewhere(
    env: Env,
) -> None:
    """The failure mode when the ProvisioningRequestConfig does not copy the rack into a
    nodeSelector: Kueue TAS, free to choose, places the gang in the other free rack, the
    pods run there, and the nodes Muster acquired are never used (the booking ends consumed,
    its message saying the pods run elsewhere, and Muster releases the unused nodes at once:
    an acquisition wasted, nothing leaked). Avoid it with
    ``podSetUpdates.nodeSelector: [{key: <rack label>, valueFromProvisioningClassDetail:
    <rack label>}]`` (docs/concepts/kueue.md)."""
    _real_kueue(env)
    names, rack, wl, busy = await _another_rack_frees_up_while_muster_acquires(
        env, rack_selector=False)
    racks, hosts = await _assigned_racks(env, wl)
    assert racks == {"b0-r1"} and hosts == set(busy), (racks, hosts, rack)
    pods = await eventually(lambda: _bound_pods(env, "tas", 4), within=60,
                            what="the scheduler to bind all 4 pods")
    assert {p["spec"]["nodeName"] for p in pods} == set(busy), (pods, busy)

    # Muster says so on the request and releases the nodes the gang left unused at once.
    pr_name = f"{wl['metadata']['name']}-{names['check']}-1"
    consumes = {(p["metadata"].get("annotations") or {}).get(CONSUME_ANNOTATION) for p in pods}
    assert consumes == {pr_name}, f"Kueue made the pods consume {consumes}, not {pr_name}"

    async def ended() -> dict[str, Any] | None:
        got = await env.get(pr_name)
        return _condition(got, "BookingExpired") or _condition(got, "CapacityRevoked")

    cond = await eventually(ended, within=30, what="the booking to end")
    assert (cond["type"], cond["reason"]) == ("BookingExpired", "CapacityBookingConsumed"), cond
    assert "4 of them run outside the booked nodes" in cond["message"], cond

    async def released() -> bool:
        return not await env.pool_nodes(names["pool"])

    await eventually(released, within=30, what="Muster to release the unused nodes")


async def test_path_a_keeps_every_tas_slice_inside_one_rack(env: Env) -> None:
    """Kueue's slice annotations on a path A Job (``podset-slice-required-topology: rack``,
    ``podset-slice-size: 4``, no topology for the pod set as a whole). Racks hold at most 6
    new nodes, so 12 workers go 4 + 4 + 4 (6 + 6 would split a slice): Muster acquires
    three racks of four, provisioningClassDetails names no single rack (so Kueue, which
    skips a missing detail, pins none), Kueue's TAS assignment after provisioning keeps 4
    pods in each rack, and every pod runs on Muster's nodes there."""
    _real_kueue(env)
    names = await path_a_wiring(env, nodes_per_rack=6)
    job = gang_job("sliced", env.namespace, 12, pod_annotations={
        SLICE_REQUIRED: objects.RACK, SLICE_SIZE: "4"})
    await env.kube.create(JOBS, job, namespace=env.namespace)
    wl = await eventually(lambda: _workload_of(env, "sliced"), what="Kueue's Workload")
    wl_name = wl["metadata"]["name"]
    pr = await eventually(lambda: _kueue_request(env, wl_name, names["check"]), within=30,
                          what="Kueue's ProvisioningRequest")
    (ps,) = pr["spec"]["podSets"]
    assert ps["count"] == 12
    tpl = await env.kube.get(POD_TEMPLATES, ps["podTemplateRef"]["name"],
                             namespace=env.namespace)
    annotations = tpl["template"]["metadata"]["annotations"]
    assert annotations[SLICE_REQUIRED] == objects.RACK and annotations[SLICE_SIZE] == "4"

    pr = await eventually(lambda: _provisioned(env, pr["metadata"]["name"]), within=60,
                          what="Muster to provision the sliced gang")
    details = pr["status"]["provisioningClassDetails"]
    assert objects.RACK not in details, (
        "slices in several racks: no single rack for Kueue to pin every pod to", details)
    assert not [k for k in details if k.startswith(PODSET_DETAIL_PREFIX)], details
    pool_nodes = {n["metadata"]["name"]: n["metadata"]["labels"][objects.RACK]
                  for n in await env.pool_nodes(names["pool"])}
    assert sorted(Counter(pool_nodes.values()).values()) == [4, 4, 4], pool_nodes

    wl = await eventually(lambda: _admitted(env, wl_name), within=60,
                          what=f"Kueue to admit {wl_name}")
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    assigned: Counter[str] = Counter()
    for labels, count in expand_topology_assignment(
            TopologyAssignment.model_validate(psa["topologyAssignment"])):
        assigned[pool_nodes[labels[HOSTNAME]]] += count
    assert assigned == Counter(pool_nodes.values()), (assigned, pool_nodes)
    pods = await eventually(lambda: _bound_pods(env, "sliced", 12), within=60,
                            what="the scheduler to bind all 12 pods")
    ran = Counter(pool_nodes[p["spec"]["nodeName"]] for p in pods
                  if p["spec"]["nodeName"] in pool_nodes)
    assert ran == assigned, f"pods per rack {ran}, Kueue assigned {assigned}"


# ------------------------------------------------------------------ path B: Muster's check


async def path_b_wiring(
    env: Env, *, parameters: dict[str, str] | None = None, backoff_limit: int = 2,
    backoff_base: int = 3, pool_parameters: dict[str, Any] | None = None, tas: bool = False,
) -> dict[str, str]:
    """A pool of two 4-node racks, a flavor (without a Topology unless ``tas``), a
    ProvisioningRequestConfig, an AdmissionCheck with Muster's controllerName, a
    ClusterQueue and the LocalQueue ``gangs``; returns once Muster marked the check Active
    and Kueue the queue."""
    pool = await env.gpu_pool(blocks=1, racks_per_block=2, nodes_per_rack=4,
                              parameters=pool_parameters)
    names = {k: env.name(k) for k in ("config", "check", "cq")}
    names.update(await _flavor(env, tas=tas))
    names["pool"] = pool
    prc: Body = {
        "provisioningClassName": ATOMIC, "managedResources": [objects.GPU],
        "retryStrategy": {"backoffLimitCount": backoff_limit,
                          "backoffBaseSeconds": backoff_base, "backoffMaxSeconds": 60},
    }
    if parameters:
        prc["parameters"] = dict(parameters)
    await _check_and_queues(env, names, prc, MUSTER_CHECK, queue="gangs")

    # The ClusterQueue is Active only once Muster marked its AdmissionCheck Active.
    active = _true(await env.kube.get(ADMISSION_CHECKS, names["check"]), "Active")
    assert active is not None, "Muster did not mark its AdmissionCheck Active"
    assert active["reason"] == "Active" and "Muster serves" in active["message"]
    return names


def _true(obj: Body, type_: str) -> dict[str, Any] | None:
    cond = _condition(obj, type_)
    return cond if cond is not None and cond["status"] == "True" else None


def rack_gang(name: str, namespace: str, workers: int) -> Body:
    """A path-B gang: ``workers`` 8-GPU pods required in one rack through Muster's own
    annotation (Kueue ignores it on a flavor without a Topology)."""
    return gang_job(name, namespace, workers, queue="gangs",
                    pod_annotations={MUSTER_REQUIRED: objects.RACK})


class CheckStates:
    """Every state the check named ``check`` goes through on each Workload of the run's
    namespace, from a watch started before the Job is created (polling misses a state that
    lasts less than one poll: Muster can turn Pending into Ready within milliseconds)."""

    def __init__(self, env: Env, check: str) -> None:
        self.env, self.check = env, check
        self.history: dict[str, list[dict[str, Any]]] = {}
        """Workload -> the check's entry at each change of its state."""
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _record(self, wl: Body) -> None:
        name = wl["metadata"]["name"]
        entry = next((dict(e) for e in (wl.get("status") or {}).get("admissionChecks") or []
                      if e.get("name") == self.check), None)
        if entry is None or not entry.get("state"):
            return
        history = self.history.setdefault(name, [])
        if not history or history[-1]["state"] != entry["state"]:
            history.append(entry)

    def seen(self, wl_name: str) -> list[str]:
        return [e["state"] for e in self.history.get(wl_name, [])]

    def _sync(self, items: list[Body]) -> None:
        for wl in items:
            self._record(wl)
        self._synced.set()

    def _event(self, event: WatchEvent) -> None:
        if event.type != "DELETED":
            self._record(event.object)

    async def __aenter__(self) -> CheckStates:
        self._task = asyncio.create_task(self.env.kube.watch(
            WORKLOADS, whole_listing(self._sync), self._event, namespace=self.env.namespace))
        await asyncio.wait_for(self._synced.wait(), 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def reach(self, wl_name: str, state: str, *, after: int = 0,
                    within: float = 60) -> dict[str, Any]:
        """The check's entry when it first went to ``state`` (at or after the ``after``-th
        change); on a timeout, the states seen, the requests' conditions and the Workload's
        conditions, to tell whose step stalled."""

        async def there() -> dict[str, Any] | None:
            history = self.history.get(wl_name, [])[after:]
            return next((e for e in history if e["state"] == state), None)

        try:
            return await eventually(there, within=within, step=0.05,
                                    what=f"the check to be {state}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {await self.explain(wl_name)}") from None

    async def explain(self, wl_name: str) -> str:
        wl = await self.env.kube.get_or_none(WORKLOADS, wl_name, namespace=self.env.namespace)
        requests = (await self.env.kube.list(PROVISIONING_REQUESTS,
                                             namespace=self.env.namespace)).get("items") or []
        prs = {r["metadata"]["name"]: [
            (c["type"], c["status"], c.get("reason"), c.get("message", "")[:200])
            for c in (r.get("status") or {}).get("conditions") or []] for r in requests}
        wl_conditions = [(c["type"], c["status"], c.get("reason"))
                         for c in ((wl or {}).get("status") or {}).get("conditions") or []]
        return (f"states seen {self.seen(wl_name)}, last entry "
                f"{(self.history.get(wl_name) or [{}])[-1]}, "
                f"Workload conditions {wl_conditions}, requests {prs}")


async def _submit_and_reach(env: Env, check: str, job: Body, state: str
                           ) -> tuple[str, dict[str, Any], list[str]]:
    """Create ``job`` and wait for its Workload's ``check`` to reach ``state``: the
    Workload's name, the check's entry then, and every state the check went through."""
    async with CheckStates(env, check) as states:
        await env.kube.create(JOBS, job, namespace=env.namespace)
        name = job["metadata"]["name"]
        wl = await eventually(lambda: _workload_of(env, name), what="Kueue's Workload")
        wl_name = wl["metadata"]["name"]
        entry = await states.reach(wl_name, state)
    return wl_name, entry, states.seen(wl_name)


async def test_path_b_job_to_pods_bound_on_musters_nodes(env: Env) -> None:
    """Muster's check with real Kueue: Active, Pending while Muster provisions, Ready with
    podSetUpdates pinning the gang to the booked rack, Kueue admits, the scheduler binds
    every pod on Muster's nodes in that rack."""
    _real_kueue(env)
    names = await path_b_wiring(env)
    wl_name, entry, seen = await _submit_and_reach(
        env, names["check"], rack_gang("gang", env.namespace, 4), "Ready")
    assert seen == ["Pending", "Ready"], seen
    wl = await env.kube.get(WORKLOADS, wl_name, namespace=env.namespace)
    pr = await env.get(f"{wl_name}-{names['check']}-1")
    assert pr["spec"]["provisioningClassName"] == ATOMIC
    assert pr["metadata"]["labels"][MANAGED_LABEL] == "true"
    # Workload -> templates -> request; a Workload-owned request would be deleted by Kueue's
    # own provisioning controller (it takes it for an unused request of its checks).
    assert pr["metadata"]["annotations"][WORKLOAD_UID_ANNOTATION] == wl["metadata"]["uid"]
    (owner,) = pr["metadata"]["ownerReferences"]
    assert owner["kind"] == "PodTemplate"
    tpl = await env.kube.get(POD_TEMPLATES, owner["name"], namespace=env.namespace)
    assert [o["uid"] for o in tpl["metadata"]["ownerReferences"]] == [wl["metadata"]["uid"]]
    rack = pr["status"]["provisioningClassDetails"][objects.RACK]
    (update,) = entry["podSetUpdates"]
    assert update["nodeSelector"] == {objects.BLOCK: rack.split("-")[0], objects.RACK: rack}
    assert update["annotations"] == {CONSUME_ANNOTATION: pr["metadata"]["name"],
                                     CLASS_ANNOTATION: ATOMIC}

    await eventually(lambda: _admitted(env, wl_name), within=60,
                     what=f"Kueue to admit {wl_name}")
    pods = await eventually(lambda: _bound_pods(env, "gang", 4), within=60,
                            what="the scheduler to bind all 4 pods")
    pool_nodes = {n["metadata"]["name"]: n for n in await env.pool_nodes(names["pool"])}
    assert len(pool_nodes) == 4
    for pod in pods:
        assert pod["spec"]["nodeSelector"][objects.RACK] == rack
        assert pod["metadata"]["annotations"][CONSUME_ANNOTATION] == pr["metadata"]["name"]
        node = pod["spec"]["nodeName"]
        assert node in pool_nodes and pool_nodes[node]["metadata"]["labels"][
            objects.RACK] == rack


async def test_path_b_a_gang_that_can_never_fit_is_rejected_and_deactivated(env: Env) -> None:
    """Eight nodes in one rack of at most four: Muster's request fails CapacityNeverFits
    (once retry.arrival_wait_seconds have passed without a pool that could hold it), its
    check is Rejected without a Retry (none can help), and Kueue deactivates the Workload.
    Nothing is acquired."""
    _real_kueue(env)
    names = await path_b_wiring(env)
    wl_name, entry, seen = await _submit_and_reach(
        env, names["check"], rack_gang("huge", env.namespace, 8), "Rejected")
    assert "Retry" not in seen, seen
    assert entry["message"].startswith("The request can never fit"), entry
    # The request may already be gone (Muster deletes it once Kueue deactivates the
    # Workload); its Warning Event stays.
    pr_name = f"{wl_name}-{names['check']}-1"
    events = (await env.kube.list(EVENTS, namespace=env.namespace)).get("items") or []
    reasons = {e["reason"] for e in events if e["involvedObject"].get("name") == pr_name}
    assert "CapacityNeverFits" in reasons, reasons

    async def deactivated() -> bool:
        got = await env.kube.get(WORKLOADS, wl_name, namespace=env.namespace)
        return got["spec"].get("active") is False

    await eventually(deactivated, within=30, what="Kueue to deactivate the Workload")
    assert await env.pool_nodes(names["pool"]) == []


async def _retried_after_backoff(
    env: Env, names: dict[str, str], wl_name: str, entry: dict[str, Any]
) -> None:
    """Attempt 1's Retry says why and asks for Kueue's backoff; the cloud restocks; Kueue
    creates attempt 2 no sooner than the backoff and deletes attempt 1's request."""
    assert entry["requeueAfterSeconds"] == 3, entry
    assert entry["message"].startswith("Retrying after failure: Attempt 1 failed "
                                       "(AcquisitionFailed)"), entry
    assert "noRetry is set" in entry["message"]
    retried_at = _time(entry["lastTransitionTime"])
    await env.kube.merge_patch(CAPACITY_POOLS, names["pool"],
                               {"spec": {"parameters": {"defaultStock": None}}})
    second = f"{wl_name}-{names['check']}-2"
    pr2 = await eventually(lambda: env.kube.get_or_none(
        PROVISIONING_REQUESTS, second, namespace=env.namespace), within=60,
        what="Muster's second attempt after Kueue requeued the Workload")
    created = _time(pr2["metadata"]["creationTimestamp"])
    # Timestamps have whole seconds: allow the one the truncation may cost.
    assert (created - retried_at).total_seconds() >= 3 - 1, (retried_at, created)
    assert await _kueue_request(env, wl_name, names["check"], 1) is None, (
        "the evicted attempt's request is deleted")


async def test_path_b_a_stock_out_is_retried_after_kueues_backoff(env: Env) -> None:
    """The provider has 2 nodes per rack for a gang of 4. With ``noRetry`` in the config,
    Muster fails the first attempt at once; its check goes Retry with requeueAfterSeconds =
    backoffBaseSeconds; Kueue evicts the Workload, requeues it no sooner than that, reserves
    quota again and resets the check to Pending (retryCount 1); Muster creates attempt 2,
    which finds the stock restored, and the gang runs."""
    _real_kueue(env)
    names = await path_b_wiring(env, parameters={"noRetry": "true"}, backoff_base=3,
                                pool_parameters={"defaultStock": 2})
    async with CheckStates(env, names["check"]) as states:
        await env.kube.create(JOBS, rack_gang("starved", env.namespace, 4),
                              namespace=env.namespace)
        wl = await eventually(lambda: _workload_of(env, "starved"), what="Kueue's Workload")
        wl_name = wl["metadata"]["name"]
        entry = await states.reach(wl_name, "Retry")
        await _retried_after_backoff(env, names, wl_name, entry)
        entry = await states.reach(wl_name, "Ready", after=states.seen(wl_name).index("Retry"),
                                   within=60)
    seen = states.seen(wl_name)
    assert entry.get("retryCount") == 1, entry
    assert "Retry" in seen and seen.index("Retry") < len(seen) - 1, seen
    wl = await eventually(lambda: _admitted(env, wl_name), within=60,
                          what=f"Kueue to admit {wl_name}")
    # Kueue evicted it for the Retry, then admitted it again.
    evicted = _condition(wl, "Evicted")
    assert evicted is not None and evicted["status"] == "False", evicted
    assert "At least one admission check is false" in evicted["message"], evicted
    await eventually(lambda: _bound_pods(env, "starved", 4), within=60,
                     what="the scheduler to bind all 4 pods")


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


async def test_path_b_books_the_existing_nodes_kueue_tas_placed_the_gang_on(env: Env) -> None:
    """Muster's check on a TAS flavor: Kueue computes the topology assignment at quota
    reservation (it delays TAS only for its own provisioning check), on four existing
    nodes. Muster books those nodes with the check-capacity class and noRetry, and plans
    no new ones. Another platform's ProvisioningRequest, which Kueue does not see, holds the
    nodes at first: attempt 1 fails at once (check Retry, "Capacity is not found"); once it
    is gone, Kueue's requeue places the gang there again, attempt 2 books them, the check is
    Ready with podSetUpdates adding no nodeSelector (Kueue TAS pins the pods itself), and the
    pods run on those nodes. Nothing is acquired."""
    _real_kueue(env)
    names = await path_b_wiring(env, tas=True, parameters={"noRetry": "false"},
                                backoff_base=3)
    hosts = await _kwok_rack(env, "b0-r1", 4)
    await env.worker_template("platform", level=None)
    await env.request("platform", [("platform", 4)], class_name=CHECK_CAPACITY_CLASS)
    await env.wait_condition("platform", "Provisioned")
    async with CheckStates(env, names["check"]) as states:
        await env.kube.create(JOBS, gang_job("placed", env.namespace, 4, queue="gangs"),
                              namespace=env.namespace)
        wl = await eventually(lambda: _workload_of(env, "placed"), what="Kueue's Workload")
        wl_name = wl["metadata"]["name"]
        retry = await states.reach(wl_name, "Retry")
        assert retry["message"].startswith("Retrying after failure: Capacity is not found"), (
            retry)
        assert retry["requeueAfterSeconds"] == 3, retry
        first = await env.get(f"{wl_name}-{names['check']}-1")
        assert first["spec"]["provisioningClassName"] == CHECK_CAPACITY_CLASS
        # The config says noRetry=false; a TAS placement that no longer fits must still
        # come back at once, so Kueue places the gang anew.
        assert first["spec"]["parameters"]["noRetry"] == "true"
        await env.kube.delete(PROVISIONING_REQUESTS, "platform", namespace=env.namespace)
        ready = await states.reach(wl_name, "Ready", after=states.seen(wl_name).index("Retry"),
                                   within=60)
    pr = await env.get(f"{wl_name}-{names['check']}-2")
    assert pr["spec"]["provisioningClassName"] == CHECK_CAPACITY_CLASS
    assert pr["spec"]["parameters"]["noRetry"] == "true"
    # One pod set per node Kueue TAS assigned, each pinned to its node.
    assert [p["count"] for p in pr["spec"]["podSets"]] == [1, 1, 1, 1]
    pinned = set()
    for ps in pr["spec"]["podSets"]:
        tpl = await env.kube.get(POD_TEMPLATES, ps["podTemplateRef"]["name"],
                                 namespace=env.namespace)
        pinned.add(tpl["template"]["spec"]["nodeSelector"][HOSTNAME])
    assert pinned == set(hosts)
    (update,) = ready["podSetUpdates"]
    assert "nodeSelector" not in update, "Kueue TAS pins the pods itself"
    assert update["annotations"] == {CONSUME_ANNOTATION: pr["metadata"]["name"],
                                     CLASS_ANNOTATION: CHECK_CAPACITY_CLASS}

    wl = await eventually(lambda: _admitted(env, wl_name), within=60,
                          what=f"Kueue to admit {wl_name}")
    racks, assigned = await _assigned_racks(env, wl)
    assert racks == {"b0-r1"} and assigned == set(hosts), (racks, assigned)
    pods = await eventually(lambda: _bound_pods(env, "placed", 4), within=60,
                            what="the scheduler to bind all 4 pods")
    assert {p["spec"]["nodeName"] for p in pods} == set(hosts)
    assert await env.pool_nodes(names["pool"]) == [], "nothing new: the nodes existed"


async def test_path_b_leaves_a_vanished_node_kueue_tas_placed_the_gang_on_to_kueue(
    env: Env,
) -> None:
    """After Kueue admitted a gang Muster booked on the existing nodes Kueue TAS chose, one
    of those nodes is deleted before the pods use it (they wait on a scheduling gate of the
    user's). Muster says so on its request (CapacityRevoked, BookedNodesVanished, naming the
    node) but does not reject the check: Kueue's own TAS node-failure handling evicts the
    Workload for the node failure and requeues it, where a Rejected check would deactivate
    it (both used to write, and either could land last). Kueue may reserve quota again on an
    assignment still naming the gone node; Muster's request for it then fails
    CapacityNeverFits and the check goes Retry, not Rejected, so Kueue places the gang anew.
    Once a node joins the rack, Kueue places the gang there and admits it with Muster's
    check Ready on the four nodes. The check is never Rejected; the Workload stays active.
    (The pods stay gated: in these runs Kueue 0.17 at times also counted nodes nobody deleted
    as failed, "multiple TAS assigned node failures", and evicted the gang again; binding a
    TAS-placed gang is the previous scenario.)"""
    _real_kueue(env)
    names = await path_b_wiring(env, tas=True)
    hosts = await _kwok_rack(env, "b0-r1", 4)
    job = gang_job("held", env.namespace, 4, queue="gangs")
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": HOLD_GATE}]
    async with CheckStates(env, names["check"]) as states:
        await env.kube.create(JOBS, job, namespace=env.namespace)
        wl = await eventually(lambda: _workload_of(env, "held"), what="Kueue's Workload")
        wl_name = wl["metadata"]["name"]
        await states.reach(wl_name, "Ready")
        wl = await eventually(lambda: _admitted(env, wl_name), within=30,
                              what=f"Kueue to admit {wl_name}")
        await env.kube.delete(NODES, hosts[2])

        # Kueue's eviction and Muster's note on its request, as Events (the Workload's
        # conditions move on when Kueue reserves quota again).
        evicted = await eventually(lambda: _events(env, "EvictedDueToNodeFailures"),
                                   within=30, what="Kueue to evict for the node failure")
        assert any(hosts[2] in e["message"] for e in evicted), evicted
        revoked = await eventually(lambda: _events(env, "BookedNodesVanished"), within=20,
                                   what="Muster's BookedNodesVanished Event")
        assert hosts[2] in revoked[0]["message"], revoked

        # A node joins the rack: Kueue places the gang again and Muster books it.
        spare = await _kwok_node(env, "b0-r1", 9)

        async def admitted_with_spare() -> Body | None:
            got = await _admitted(env, wl_name)
            return got if got is not None and spare in _assigned_hosts(got) else None

        wl = await eventually(admitted_with_spare, within=60,
                              what=f"Kueue to admit {wl_name} again, on {spare}")
        seen = states.seen(wl_name)
    assert "Rejected" not in seen, seen
    assert seen[-1] == "Ready", seen
    got = await env.kube.get(WORKLOADS, wl_name, namespace=env.namespace)
    assert got["spec"].get("active", True) is True, "requeued, never deactivated"
    assigned = _assigned_hosts(wl)
    assert assigned == {*hosts[:2], hosts[3], spare}, assigned
    assert await env.pool_nodes(names["pool"]) == [], "nothing new: the nodes existed"


HOLD_GATE = "e2e.muster.dev/hold"


def _assigned_hosts(wl: Body) -> set[str]:
    """The nodes of every pod set's Kueue TAS ``topologyAssignment``."""
    return {labels[HOSTNAME]
            for psa in wl["status"]["admission"]["podSetAssignments"]
            if psa.get("topologyAssignment")
            for labels, _ in expand_topology_assignment(
                TopologyAssignment.model_validate(psa["topologyAssignment"]))}


async def _events(env: Env, reason: str) -> list[Body]:
    listing = await env.kube.list(EVENTS, namespace=env.namespace)
    return [e for e in listing.get("items") or [] if e.get("reason") == reason]
