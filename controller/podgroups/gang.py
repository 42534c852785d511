"""From a gang PodGroup (``scheduling.k8s.io/v1beta1``) and its pending pods to the
ProvisioningRequest and PodTemplates Muster serves for it, and from that request's
conditions back to what the PodGroup's owner is told (pure).

Kubernetes 1.37's workload-aware scheduling (gate ``GenericWorkload``): a PodGroup with
``schedulingPolicy.gang.minCount`` makes the kube-scheduler place at least ``minCount`` of
its pods (those with ``spec.schedulingGroup.podGroupName``) at once or none; with
``TopologyAwareWorkloadScheduling`` its ``schedulingConstraints.topology[0].key`` keeps them
all in one value of that node label. When the scheduler finds no room (condition
``PodGroupInitiallyScheduled=False``, reason ``Unschedulable``), Muster turns the group's
unbound pods into one atomic request: one pod set per distinct pod spec, the topology key as
the pod sets' required level, so the fit engine plans the group as one gang and the provider
acquires every node or none. The scheduler then binds the group on the new nodes.

The request is owned by the PodGroup (deleting the group deletes it and releases what it
booked); its pods count as its consumers (see :func:`request_name`), so the booking ends
``CapacityBookingConsumed`` once the scheduler bound them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.api.validation import limit_object_name
from controller.common.topology_defaults import MUSTER_REQUIRED
from controller.inputs.podgroup_membership import group_of, request_name

GROUP = "scheduling.k8s.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
SCHEDULED = "PodGroupInitiallyScheduled"
UNSCHEDULABLE = "Unschedulable"
LABEL = "muster.dev/podgroup"
"""On the requests and templates Muster creates for a PodGroup: the PodGroup's name."""
UID_ANNOTATION = "muster.dev/podgroup-uid"

# Fields of a pod's spec that say who runs it, not where it fits; a PodTemplate built from
# the pod leaves them out (``schedulingGroup`` would tie the template to the group).
_RUNTIME_FIELDS = ("nodeName", "schedulingGroup", "hostname", "subdomain")
_INERT_VOLUMES = frozenset({"projected", "configMap", "secret", "downwardAPI", "emptyDir"})
"""Volume sources no scheduler filter looks at. Dropped (with their mounts) because the
service-account admission gives every pod a projected volume of its own random name, which
would make each pod of a gang a pod set of its own."""


@dataclass(frozen=True, slots=True)
class GangPodGroup:
    namespace: str
    name: str
    uid: str
    min_count: int | None
    """None: not a gang (``basic`` policy), which the scheduler places pod by pod."""
    topology_key: str | None
    scheduled: bool
    """``PodGroupInitiallyScheduled=True``: placed once; never revisited."""
    unschedulable: bool
    """The scheduler tried and found no room (the condition False, reason Unschedulable)."""
    message: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> GangPodGroup:
        meta = body.get("metadata") or {}
        spec = body.get("spec") or {}
        gang = (spec.get("schedulingPolicy") or {}).get("gang")
        topology = ((spec.get("schedulingConstraints") or {}).get("topology") or [{}])[0]
        conditions = (body.get("status") or {}).get("conditions") or []
        cond: Mapping[str, Any] = next(
            (c for c in conditions if c.get("type") == SCHEDULED), {})
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name")),
            uid=str(meta.get("uid") or ""),
            min_count=int(gang.get("minCount") or 1) if isinstance(gang, Mapping) else None,
            topology_key=topology.get("key") or None,
            scheduled=cond.get("status") == "True",
            unschedulable=cond.get("status") == "False" and cond.get("reason") == UNSCHEDULABLE,
            message=str(cond.get("message") or ""),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class GangDraft:
    """What Muster will create for a gang PodGroup: its PodTemplates and the one
    ProvisioningRequest (drafted here, created by the integration)."""

    templates: list[dict[str, Any]]
    request: dict[str, Any]
    pods: int


def members(pods: Sequence[Mapping[str, Any]], group: str) -> list[Mapping[str, Any]]:
    """The group's live pods (not terminating, not finished)."""
    return [p for p in pods if group_of(p) == group
            and not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def unbound(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods the scheduler still has to place (gated pods are not yet its business)."""
    return [p for p in pods if not (p.get("spec") or {}).get("nodeName")
            and not (p.get("spec") or {}).get("schedulingGates")]


def template_of(pod: Mapping[str, Any], topology_key: str | None) -> dict[str, Any]:
    """The PodTemplate ``template`` a pod was made from, as far as placement goes: its
    labels (pod affinity and spread match them) and spec, minus who-runs-it fields; the
    group's topology key as Muster's required level."""
    spec = copy.deepcopy(dict(pod.get("spec") or {}))
    for f in _RUNTIME_FIELDS:
        spec.pop(f, None)
    inert = {v.get("name") for v in spec.get("volumes") or [] if _INERT_VOLUMES & set(v)}
    if inert:
        spec["volumes"] = [v for v in spec["volumes"] if v.get("name") not in inert]
        if not spec["volumes"]:
            del spec["volumes"]
        for key in ("containers", "initContainers", "ephemeralContainers"):
            for c in spec.get(key) or []:
                if c.get("volumeMounts"):
                    c["volumeMounts"] = [m for m in c["volumeMounts"]
                                         if m.get("name") not in inert]
    meta = pod.get("metadata") or {}
    out_meta: dict[str, Any] = {}
    if meta.get("labels"):
        out_meta["labels"] = dict(meta["labels"])
    if topology_key:
        out_meta["annotations"] = {MUSTER_REQUIRED: topology_key}
    return {"metadata": out_meta, "spec": spec}


def draft(
    group: GangPodGroup, pending: Sequence[Mapping[str, Any]], owner: Mapping[str, Any],
    class_name: str,
) -> GangDraft:
    """The templates (one per distinct pod spec, in order of first pod) and the request
    for the group's ``pending`` pods, all owned by the PodGroup (``owner``: its
    ownerReference)."""
    name = request_name(group.name)
    by_spec: dict[str, tuple[dict[str, Any], int]] = {}
    for pod in pending:
        tpl = template_of(pod, group.topology_key)
        sig = json.dumps(tpl, sort_keys=True)
        prev = by_spec.get(sig)
        by_spec[sig] = (tpl, (prev[1] if prev else 0) + 1)
    labels = {LABEL: label_value(group.name)}
    templates: list[dict[str, Any]] = []
    pod_sets: list[dict[str, Any]] = []
    for i, (tpl, count) in enumerate(by_spec.values()):
        # The group's uid in the name: a template left by an earlier group of the same
        # name (awaiting garbage collection) is never mistaken for this one's.
        tname = limit_object_name(f"{name}-{group.uid[:8]}-{i}")
        templates.append({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": tname, "namespace": group.namespace, "labels": dict(labels),
                         "ownerReferences": [dict(owner)]},
            "template": tpl,
        })
        pod_sets.append({"podTemplateRef": {"name": tname}, "count": count})
    request = {
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": group.namespace, "labels": dict(labels),
                     "annotations": {UID_ANNOTATION: group.uid},
                     "ownerReferences": [dict(owner)]},
        "spec": {"provisioningClassName": class_name, "podSets": pod_sets},
    }
    return GangDraft(templates=templates, request=request, pods=len(pending))


def label_value(name: str) -> str:
    """A PodGroup's name as a label value (at most 63 characters: longer names keep 57 and a
    hash)."""
    if len(name) <= 63:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:5]  # naming, not security
    return f"{name[:57]}-{digest}"


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {"apiVersion": API_VERSION, "kind": "PodGroup", "name": meta.get("name"),
            "uid": meta.get("uid"), "controller": True, "blockOwnerDeletion": True}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the PodGroup's owner is told about the request (an Event on the PodGroup)."""

    type: str
    reason: str
    message: str
    retry: bool = False
    """The booking ended without the group placed: a fresh request is made."""


def outcome(request: Mapping[str, Any], group: GangPodGroup) -> Outcome | None:
    """The request's state as an Event on the group, or None while nothing new is known."""
    name = (request.get("metadata") or {}).get("name")
    conds = {c.get("type"): c for c in (request.get("status") or {}).get("conditions") or []}

    def true(t: str) -> Mapping[str, Any] | None:
        c = conds.get(t)
        return c if c is not None and c.get("status") == "True" else None

    failed = true("Failed")
    if failed is not None:
        return Outcome("Warning", "GangNotProvisioned",
                       f"Muster cannot provision the gang ({failed.get('reason')}): "
                       f"{failed.get('message')} (ProvisioningRequest {name}; nothing was "
                       "acquired for it; recreate the PodGroup to try again)")
    ended = true("CapacityRevoked") or true("BookingExpired")
    if ended is not None:
        if ended.get("reason") == "CapacityBookingConsumed" or group.scheduled:
            return Outcome("Normal", "GangPlaced",
                           f"the scheduler placed the gang on the capacity Muster booked "
                           f"(ProvisioningRequest {name}: {ended.get('message')})")
        return Outcome("Warning", "GangBookingLost",
                       f"the booking ended before the scheduler placed the gang "
                       f"({ended.get('reason')}: {ended.get('message')}); Muster plans it "
                       "again", retry=True)
    provisioned = conds.get("Provisioned")
    if provisioned is None:
        return None
    details = (request.get("status") or {}).get("provisioningClassDetails") or {}
    where = ""
    if details.get("muster.dev/topology-domain"):
        where = (f" in {details.get('muster.dev/topology-level')}="
                 f"{details['muster.dev/topology-domain']}")
    if provisioned.get("status") == "True":
        return Outcome("Normal", "GangProvisioned",
                       f"Muster booked capacity for the whole gang{where} "
                       f"({provisioned.get('reason')}; ProvisioningRequest {name}): "
                       f"{provisioned.get('message')}")
    return Outcome("Normal", "GangWaitingForCapacity",
                   f"no capacity for the whole gang yet ({provisioned.get('reason')}; "
                   f"ProvisioningRequest {name}): {provisioned.get('message')}")
