"""Builders of Kueue objects and of what Kueue does to them, for ``muster demo --kueue``, the
e2e tests and the samples: plain dicts in the shape ``kubectl apply`` takes. Pure.

The "as Kueue would" helpers (:func:`reserve_quota`, :func:`admitted_pod`) play Kueue's part
in the sandbox, where no Kueue runs: they write what Kueue's scheduler writes when it
reserves quota, and build the pods a Job admitted by Kueue gets (flavor nodeLabels and
tolerations plus every Ready check's podSetUpdates).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from controller.api.validation import not_overcommitable
from controller.kueue.models import API_VERSION, GROUP

Body = dict[str, Any]


def resource_flavor(
    name: str,
    *,
    node_labels: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    topology: str | None = None,
) -> Body:
    spec: Body = {}
    if node_labels:
        spec["nodeLabels"] = dict(node_labels)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if topology:
        spec["topologyName"] = topology
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": spec}


def topology(name: str, levels: Sequence[str]) -> Body:
    return {"apiVersion": API_VERSION, "kind": "Topology", "metadata": {"name": name},
            "spec": {"levels": [{"nodeLabel": lv} for lv in levels]}}


def provisioning_request_config(
    name: str,
    *,
    class_name: str,
    selector_details: Mapping[str, str] | None = None,
    parameters: Mapping[str, str] | None = None,
    backoff_limit: int = 3,
    backoff_base_seconds: int = 60,
) -> Body:
    """``selector_details``: nodeSelector key -> provisioningClassDetails key
    (``podSetUpdates.nodeSelector[].valueFromProvisioningClassDetail``)."""
    spec: Body = {
        "provisioningClassName": class_name,
        "retryStrategy": {"backoffLimitCount": backoff_limit,
                          "backoffBaseSeconds": backoff_base_seconds,
                          "backoffMaxSeconds": 1800},
    }
    if parameters:
        spec["parameters"] = dict(parameters)
    if selector_details:
        spec["podSetUpdates"] = {"nodeSelector": [
            {"key": k, "valueFromProvisioningClassDetail": v}
            for k, v in selector_details.items()
        ]}
    return {"apiVersion": API_VERSION, "kind": "ProvisioningRequestConfig",
            "metadata": {"name": name}, "spec": spec}


def admission_check(name: str, *, controller_name: str, config: str | None = None) -> Body:
    spec: Body = {"controllerName": controller_name}
    if config:
        spec["parameters"] = {"apiGroup": GROUP, "kind": "ProvisioningRequestConfig",
                              "name": config}
    return {"apiVersion": API_VERSION, "kind": "AdmissionCheck", "metadata": {"name": name},
            "spec": spec}


def cluster_queue(
    name: str, *, flavors: Mapping[str, Mapping[str, str]], checks: Sequence[str]
) -> Body:
    """``flavors``: flavor name -> resource -> nominal quota (one resource group)."""
    covered = sorted({r for quotas in flavors.values() for r in quotas})
    return {
        "apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [{
                "coveredResources": covered,
                "flavors": [
                    {"name": f, "resources": [
                        {"name": r, "nominalQuota": quotas.get(r, "0")} for r in covered]}
                    for f, quotas in flavors.items()
                ],
            }],
            "admissionChecksStrategy": {"admissionChecks": [{"name": c} for c in checks]},
        },
    }


def local_queue(name: str, namespace: str, cluster_queue: str) -> Body:
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue}}


def pod_set(
    name: str,
    count: int,
    *,
    requests: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> Body:
    spec: Body = {
        "containers": [{
            "name": "main", "image": "registry.k8s.io/pause:3.9",
            # Extended resources need limits equal to requests (API server validation).
            "resources": {"requests": dict(requests), "limits": {
                k: v for k, v in requests.items() if not_overcommitable(k)}},
        }],
        "restartPolicy": "Never",
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {
        "name": name, "count": count,
        "template": {"metadata": {"labels": {"app": name},
                                  "annotations": dict(annotations or {})},
                     "spec": spec},
    }


def workload(name: str, namespace: str, *, queue: str, pod_sets: Sequence[Body]) -> Body:
    return {
        "apiVersion": API_VERSION, "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queueName": queue, "podSets": [copy.deepcopy(p) for p in pod_sets],
                 "active": True},
    }


def reserve_quota(
    wl: Mapping[str, Any],
    *,
    cluster_queue: str,
    flavors: Mapping[str, Mapping[str, str]],
    checks: Sequence[str],
    now: str,
    topology_assignments: Mapping[str, Body] | None = None,
) -> Body:
    """The status Kueue's scheduler writes when it reserves quota: ``admission`` with one
    pod set assignment per pod set (``flavors``: pod set -> resource -> flavor), the
    QuotaReserved and Admitted=False conditions, and a Pending entry per check (entries
    that already exist are kept, as Kueue does)."""
    status = copy.deepcopy(dict(wl.get("status") or {}))
    assignments = []
    for ps in (wl.get("spec") or {}).get("podSets") or []:
        entry: Body = {"name": ps["name"], "flavors": dict(flavors.get(ps["name"], {})),
                       "count": ps["count"]}
        if topology_assignments and ps["name"] in topology_assignments:
            entry["topologyAssignment"] = topology_assignments[ps["name"]]
        assignments.append(entry)
    status["admission"] = {"clusterQueue": cluster_queue, "podSetAssignments": assignments}
    conditions = [c for c in status.get("conditions") or []
                  if c.get("type") not in ("QuotaReserved", "Admitted", "Evicted")]
    conditions += [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
         "message": f"Quota reserved in ClusterQueue {cluster_queue}",
         "lastTransitionTime": now},
        {"type": "Admitted", "status": "False", "reason": "UnsatisfiedAdmissionChecks",
         "message": "The workload has not all checks ready", "lastTransitionTime": now},
    ]
    status["conditions"] = conditions
    have = {c["name"] for c in status.get("admissionChecks") or []}
    status["admissionChecks"] = list(status.get("admissionChecks") or []) + [
        {"name": c, "state": "Pending", "message": "", "lastTransitionTime": now}
        for c in checks if c not in have
    ]
    return status


def set_condition(status: Mapping[str, Any], type_: str, value: bool, reason: str,
                  now: str, message: str = "") -> Body:
    out = copy.deepcopy(dict(status))
    out["conditions"] = [c for c in out.get("conditions") or [] if c.get("type") != type_] + [
        {"type": type_, "status": "True" if value else "False", "reason": reason,
         "message": message, "lastTransitionTime": now}]
    return out


def admitted_pod(
    wl: Mapping[str, Any],
    pod_set: str,
    index: int,
    *,
    flavors: Mapping[str, Mapping[str, Any]],
) -> Body:
    """A pod of ``pod_set`` as the admitted Job creates it: the pod set template with the
    assigned flavors' nodeLabels and tolerations and every Ready check's podSetUpdates."""
    ps = next(p for p in wl["spec"]["podSets"] if p["name"] == pod_set)
    tpl = copy.deepcopy(ps["template"])
    meta = tpl.setdefault("metadata", {})
    spec = tpl.setdefault("spec", {})
    selector = dict(spec.get("nodeSelector") or {})
    tolerations = list(spec.get("tolerations") or [])
    annotations = dict(meta.get("annotations") or {})
    labels = dict(meta.get("labels") or {})
    assignment = next(a for a in wl["status"]["admission"]["podSetAssignments"]
                      if a["name"] == pod_set)
    for fname in set(assignment.get("flavors", {}).values()):
        fspec = (flavors.get(fname) or {}).get("spec") or {}
        selector.update(fspec.get("nodeLabels") or {})
        tolerations += [t for t in fspec.get("tolerations") or [] if t not in tolerations]
    for check in wl["status"].get("admissionChecks") or []:
        for update in check.get("podSetUpdates") or []:
            if update.get("name") != pod_set:
                continue
            selector.update(update.get("nodeSelector") or {})
            annotations.update(update.get("annotations") or {})
            labels.update(update.get("labels") or {})
            tolerations += [t for t in update.get("tolerations") or [] if t not in tolerations]
    labels["kueue.x-k8s.io/podset"] = pod_set
    annotations["kueue.x-k8s.io/workload"] = wl["metadata"]["name"]
    spec["nodeSelector"] = selector
    spec["tolerations"] = tolerations
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{wl['metadata']['name']}-{pod_set}-{index}",
                     "namespace": wl["metadata"]["namespace"], "labels": labels,
                     "annotations": annotations},
        "spec": spec,
    }
