"""From a Workload with reserved quota to the ProvisioningRequest and PodTemplates Muster
creates for it (pure).

Mirrors Kueue's ``syncOwnedProvisionRequest``: one request pod set per Workload pod set that
uses a managed resource and has an assigned count above zero, the count from the pod set
assignment, the template merged with the assigned flavors' nodeLabels and tolerations.
Muster's additions: pod sets Kueue TAS already placed (``topologyAssignment``) become one
pod set per assigned domain pinned there and are booked with the check-capacity class, and,
with ``tolerate_pool_taints``, a pod set whose selector picks a CapacityPool tolerates that
pool's taints.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.kueue.decisions import (
    expand_topology_assignment,
    merge_flavors,
    taint_tolerations,
    template_name,
    tolerates,
    uses_managed_resource,
)
from controller.kueue.models import ResourceFlavor, TopologyAssignment, Workload
from controller.lifecycle import POD_SETS_ANNOTATION

MANAGED_LABEL = "muster.dev/kueue-check"
"""On every ProvisioningRequest and PodTemplate Muster creates for a Workload."""
CHECK_ANNOTATION = "muster.dev/admission-check"
WORKLOAD_ANNOTATION = "muster.dev/workload"
WORKLOAD_UID_ANNOTATION = "muster.dev/workload-uid"
"""On a request Muster creates: the check and the Workload (name, uid) it serves. The request
is not owned by the Workload (see :func:`request_body`), so these say whose it is."""


class DraftError(ValueError):
    """The Workload cannot be turned into a request (the check is Rejected with this)."""


@dataclass(frozen=True, slots=True)
class RequestPodSet:
    pod_set: str
    """The Workload pod set."""
    template_name: str
    template: dict[str, Any]
    count: int
    pinned: bool = False
    """Placed by Kueue TAS: pinned to one assigned domain, not re-planned."""


@dataclass(frozen=True, slots=True)
class RequestDraft:
    class_name: str
    parameters: dict[str, str]
    pod_sets: list[RequestPodSet] = field(default_factory=list)

    @property
    def needed(self) -> bool:
        return bool(self.pod_sets)


@dataclass(frozen=True, slots=True)
class PoolTaints:
    """A CapacityPool's node template labels and taints, as a draft needs them."""

    name: str
    labels: Mapping[str, str]
    taints: Sequence[Mapping[str, Any]]


def pools_selected(selector: Mapping[str, str], pools: Sequence[PoolTaints]) -> list[PoolTaints]:
    """Pools every one of whose new nodes matches ``selector`` (an empty selector selects no
    pool: tolerating a taint must be an explicit choice of the flavor or the user)."""
    if not selector:
        return []
    return [p for p in pools if all(p.labels.get(k) == v for k, v in selector.items())]


def draft_request(
    wl: Workload,
    request: str,
    *,
    flavors: Mapping[str, ResourceFlavor],
    class_name: str,
    check_capacity_class: str,
    parameters: Mapping[str, str],
    managed_resources: Sequence[str],
    pools: Sequence[PoolTaints] = (),
    tolerate_pool_taints: bool = True,
) -> RequestDraft:
    admission = wl.status.admission
    if admission is None:
        raise DraftError("the Workload has no status.admission (quota not reserved)")
    assigned = {a.name: a for a in admission.pod_set_assignments}
    out: list[RequestPodSet] = []
    all_pinned = True
    any_set = False
    for ps in wl.spec.pod_sets:
        a = assigned.get(ps.name)
        count = a.count if a is not None and a.count is not None else ps.count
        if count <= 0 or not uses_managed_resource(ps.template, managed_resources):
            continue
        any_set = True
        flavor_objs = []
        for flavor_name in sorted(set((a.flavors if a else {}).values())):
            flavor = flavors.get(flavor_name)
            if flavor is None:
                raise DraftError(
                    f"pod set {ps.name}: ResourceFlavor {flavor_name} not found"
                )
            flavor_objs.append(flavor)
        try:
            base = merge_flavors(ps.template, flavor_objs, pod_set=ps.name)
        except ValueError as exc:
            raise DraftError(str(exc)) from None
        if tolerate_pool_taints:
            base = _tolerate_selected_pools(base, pools)
        ta = a.topology_assignment if a is not None else None
        if ta is not None and ta.slices:
            out.extend(_pinned_pod_sets(ps.name, request, base, ta))
        else:
            all_pinned = False
            out.append(RequestPodSet(ps.name, template_name(request, ps.name), base, count))
    chosen = check_capacity_class if any_set and all_pinned else class_name
    params = dict(parameters)
    if chosen == check_capacity_class and all_pinned and any_set:
        # A TAS placement that no longer fits must come back as Retry at once.
        params["noRetry"] = "true"
    return RequestDraft(chosen, params, out)


def _pinned_pod_sets(
    pod_set: str, request: str, base: dict[str, Any], ta: TopologyAssignment
) -> list[RequestPodSet]:
    """One request pod set per domain Kueue TAS assigned, pinned there by nodeSelector."""
    try:
        domains = expand_topology_assignment(ta)
    except ValueError as exc:
        raise DraftError(f"pod set {pod_set}: topologyAssignment: {exc}") from None
    out = []
    for i, (labels, n) in enumerate(domains):
        pinned = copy.deepcopy(base)
        spec = pinned.setdefault("spec", {})
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **labels}
        # Kueue TAS already chose these nodes: no second topology plan.
        anns = pinned["metadata"]["annotations"]
        for key in [k for k in anns if k.endswith("-topology")]:
            anns.pop(key)
        sub = f"{pod_set}-{i}" if len(domains) > 1 else pod_set
        out.append(RequestPodSet(pod_set, template_name(request, sub), pinned, n, pinned=True))
    return out


def _tolerate_selected_pools(
    template: dict[str, Any], pools: Sequence[PoolTaints]
) -> dict[str, Any]:
    spec = template.setdefault("spec", {})
    selected = pools_selected(spec.get("nodeSelector") or {}, pools)
    have = list(spec.get("tolerations") or [])
    for pool in selected:
        for tol in taint_tolerations(
            t for t in pool.taints if not tolerates(have, t)
        ):
            have.append(tol)
    if have:
        spec["tolerations"] = have
    return template


def pod_template_body(
    name: str, namespace: str, template: Mapping[str, Any], owner: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_LABEL: "true"},
            "ownerReferences": [dict(owner)],
        },
        "template": dict(template),
    }


def request_body(
    name: str,
    namespace: str,
    draft: RequestDraft,
    owners: Sequence[Mapping[str, Any]],
    check: str,
    workload: Mapping[str, Any],
) -> dict[str, Any]:
    """The request, owned by its PodTemplates (``owners``), which the Workload owns.

    Not owned by the Workload itself: Kueue's built-in provisioning controller (0.17,
    ``deleteUnusedProvisioningRequests``) deletes every ProvisioningRequest with an
    ownerReference named like a Workload that is not the live request of one of Kueue's own
    checks, so a Workload-owned request of Muster's check would be deleted as soon as it is
    created. The chain Workload -> PodTemplates -> request keeps the garbage collection:
    deleting the Workload takes the templates, and the templates the request."""
    spec: dict[str, Any] = {
        "provisioningClassName": draft.class_name,
        "podSets": [
            {"podTemplateRef": {"name": ps.template_name}, "count": ps.count}
            for ps in draft.pod_sets
        ],
    }
    if draft.parameters:
        spec["parameters"] = dict(draft.parameters)
    return {
        "apiVersion": "autoscaling.x-k8s.io/v1",
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_LABEL: "true"},
            "annotations": {
                CHECK_ANNOTATION: check,
                WORKLOAD_ANNOTATION: str((workload.get("metadata") or {}).get("name")),
                WORKLOAD_UID_ANNOTATION: str((workload.get("metadata") or {}).get("uid")),
                # Which template is which pod set: read back when the check turns Ready.
                POD_SETS_ANNOTATION: json.dumps(
                    {ps.template_name: ps.pod_set for ps in draft.pod_sets},
                    sort_keys=True, separators=(",", ":")),
            },
            # At most one controller among the owners.
            "ownerReferences": [dict(o, controller=i == 0) for i, o in enumerate(owners)],
        },
        "spec": spec,
    }


def workload_of(request: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(name, uid) of the Workload a request of Muster's check serves: its annotations, or,
    for requests created before them, a Workload ownerReference."""
    meta = request.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if annotations.get(WORKLOAD_UID_ANNOTATION):
        return annotations.get(WORKLOAD_ANNOTATION), annotations[WORKLOAD_UID_ANNOTATION]
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "Workload":
            return ref.get("name"), ref.get("uid")
    return None, None


def owner_reference(obj: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": controller,
        "blockOwnerDeletion": True,
    }
