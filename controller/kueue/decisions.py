"""Pure decisions of Muster's admission check, mirroring Kueue's provisioning controller.

Everything here is a function of its arguments (no I/O, no clock): object names, the pod
templates a Workload's pod sets become, the check state a ProvisioningRequest's conditions
mean, the podSetUpdates a Ready check carries, and Kueue's retry backoff. The reconciler in
:mod:`controller.kueue.workloads` does the reading and writing.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.api.validation import limit_object_name
from controller.common.conditions import Reason
from controller.kueue.models import (
    AdmissionCheckState,
    CheckStateValue,
    FlavorToleration,
    PodSetUpdate,
    ResourceFlavor,
    TopologyAssignment,
)

TEMPLATE_PREFIX = "ppt"

CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
STALE_ANNOTATIONS = (
    "autoscaling.x-k8s.io/consume-provisioning-request",
    "autoscaling.x-k8s.io/provisioning-class-name",
    "kueue.x-k8s.io/workload",
    "kueue.x-k8s.io/workload-slice-name",
)
PODSET_DETAIL_PREFIX = "muster.dev/podset."
"""``provisioningClassDetails`` key prefix Muster's reconciler writes per placed pod set:
``muster.dev/podset.<pod set>`` = ``label=value,label=value`` (the chosen domain)."""

PERMANENT_FAILURES = frozenset({Reason.NEVER_FITS.value, Reason.INVALID_PARAMETERS.value})
"""Failed reasons of Muster's request reconciler that mean waiting cannot help: the same
request on the next attempt fails the same way, so Muster's check rejects at once instead of
cycling the Workload through evictions."""

PENDING: CheckStateValue = "Pending"
READY: CheckStateValue = "Ready"
RETRY: CheckStateValue = "Retry"
REJECTED: CheckStateValue = "Rejected"


# ---------------------------------------------------------------------------- names




def request_name(workload: str, check: str, attempt: int) -> str:
    """``<workload>-<check>-<attempt>``, limited like Kueue's."""
    return limit_object_name(f"{workload}-{check}-{attempt}")


def template_name(request: str, pod_set: str) -> str:
    """``ppt-<request>-<pod set>``, limited like Kueue's."""
    return limit_object_name(f"{TEMPLATE_PREFIX}-{request}-{pod_set}")


def attempt_of(name: str, workload: str, check: str) -> int | None:
    """The attempt a request name encodes, or None when it is not this check's request."""
    match = re.fullmatch(re.escape(f"{workload}-{check}-") + r"([0-9]+)", name)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------------------- templates


class MergeConflict(ValueError):
    """A flavor or an update would change a value the pod template already sets."""


def _toleration_dict(t: FlavorToleration) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in t.model_dump(by_alias=True).items()
                           if v not in (None, "")}
    return out


def merge_flavors(
    template: Mapping[str, Any], flavors: Sequence[ResourceFlavor], *, pod_set: str
) -> dict[str, Any]:
    """The pod template with the flavors' nodeLabels (as nodeSelector) and tolerations merged
    in, and limits copied to missing requests, as Kueue builds a PodTemplate.

    A flavor label that contradicts the template's own nodeSelector is a
    :class:`MergeConflict` (Kueue refuses it too).
    """
    out = copy.deepcopy(dict(template))
    # Kueue's sanitizeProvisioningRequestPodTemplate: a template describes capacity to add;
    # it must not consume an earlier request, and gated pods are never scheduled.
    annotations = (out.get("metadata") or {}).get("annotations") or {}
    for key in STALE_ANNOTATIONS:
        annotations.pop(key, None)
    spec = out.setdefault("spec", {})
    spec.pop("schedulingGates", None)
    selector: dict[str, str] = dict(spec.get("nodeSelector") or {})
    tolerations: list[dict[str, Any]] = [dict(t) for t in spec.get("tolerations") or []]
    for flavor in flavors:
        for key, value in flavor.spec.node_labels.items():
            if key in selector and selector[key] != value:
                raise MergeConflict(
                    f"pod set {pod_set}: ResourceFlavor {flavor.metadata.name} sets nodeSelector "
                    f"{key}={value} but the pod template has {key}={selector[key]}"
                )
            selector[key] = value
        for tol in flavor.spec.tolerations:
            as_dict = _toleration_dict(tol)
            if as_dict not in tolerations:
                tolerations.append(as_dict)
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            resources = container.setdefault("resources", {})
            requests = resources.setdefault("requests", {})
            for res, amount in (resources.get("limits") or {}).items():
                requests.setdefault(res, amount)
    return out


def uses_managed_resource(template: Mapping[str, Any], managed: Iterable[str]) -> bool:
    """Whether any container requests or limits one of ``managed`` (empty = all)."""
    wanted = set(managed)
    if not wanted:
        return True
    spec = template.get("spec") or {}
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            res = container.get("resources") or {}
            if wanted & (set(res.get("requests") or {}) | set(res.get("limits") or {})):
                return True
    return False


# ---------------------------------------------------------------------------- check states


@dataclass(frozen=True, slots=True)
class CheckVerdict:
    state: CheckStateValue
    message: str = ""
    requeue_after_seconds: int | None = None
    ready: bool = False
    """Provisioned=True: the caller computes podSetUpdates."""


def _true(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    for cond in conditions:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def backoff_seconds(retry_count: int, *, base: int, maximum: int) -> int:
    """Kueue's requeue delay after ``retry_count`` earlier retries: base x 2^(n-1) with
    n = retryCount + 1, capped at ``maximum`` (pkg/util/wait/backoff.go, jitter dropped)."""
    return int(min(base * 2 ** max(0, retry_count), maximum))


def verdict(
    conditions: Sequence[Mapping[str, Any]],
    *,
    attempt: int,
    retry_count: int,
    backoff_limit: int,
    backoff_base: int,
    backoff_max: int,
    admitted: bool,
    active: bool,
    finished: bool,
    reject_at_once: Collection[str] = (),
    placed_by_kueue: bool = False,
) -> CheckVerdict:
    """The check state a request's conditions mean, in the order Kueue evaluates them
    (``syncCheckStates``): Failed, CapacityRevoked, BookingExpired (before admission only),
    Provisioned, Accepted-with-Provisioned, otherwise Pending.

    ``reject_at_once``: Failed reasons that no retry can cure (Muster's own check passes
    :data:`PERMANENT_FAILURES`; Kueue's controller retries every failure).

    ``placed_by_kueue``: the request books the existing nodes Kueue TAS assigned. A booked
    node that vanishes (or a placement that can never fit, naming a node that is gone) is
    then Kueue's to handle, not a reason to reject: once admitted, Kueue's TAS node-failure
    handling (``TASFailedNodeReplacement``, on by default since Kueue 0.14) replaces the node
    or evicts and requeues the Workload, where a Rejected check would deactivate it, racing
    Kueue's own eviction (on the real tier either write could land last); before admission,
    Retry lets Kueue place the gang again."""
    failed = _true(conditions, "Failed")
    if failed is not None:
        reason = str(failed.get("reason"))
        # Kueue's placement that can never fit names nodes that are gone: after a Retry,
        # Kueue places the gang anew.
        anew = placed_by_kueue and reason == Reason.NEVER_FITS.value
        if reason in reject_at_once and not anew:
            return CheckVerdict(REJECTED, str(failed.get("message") or reason))
        return _retry_or_reject(
            "Retrying after failure", failed, attempt=attempt, retry_count=retry_count,
            limit=backoff_limit, base=backoff_base, maximum=backoff_max,
        )
    revoked = _true(conditions, "CapacityRevoked")
    if revoked is not None and active and not finished:
        vanished = revoked.get("reason") == Reason.NODES_VANISHED.value
        unusable = revoked.get("reason") == Reason.NODES_UNUSABLE.value
        if placed_by_kueue and vanished and admitted:
            return CheckVerdict(READY, str(revoked.get("message") or ""))
        if placed_by_kueue and (vanished or unusable):
            # A tainted or cordoned node is no node failure to Kueue's TAS: only a Retry
            # (evict and requeue, once admitted) has it place the gang elsewhere.
            return _retry_or_reject(
                f"Retrying after booked nodes {'vanished' if vanished else 'became unusable'}",
                revoked, attempt=attempt, retry_count=retry_count, limit=backoff_limit,
                base=backoff_base, maximum=backoff_max,
            )
        return CheckVerdict(REJECTED, str(revoked.get("message") or "capacity revoked"))
    expired = _true(conditions, "BookingExpired")
    if expired is not None and not admitted:
        return _retry_or_reject(
            "Retrying after booking expired", expired, attempt=attempt,
            retry_count=retry_count, limit=backoff_limit, base=backoff_base,
            maximum=backoff_max,
        )
    provisioned = _true(conditions, "Provisioned")
    if provisioned is not None:
        return CheckVerdict(READY, str(provisioned.get("message") or ""), ready=True)
    if _true(conditions, "Accepted") is not None:
        prov = next((c for c in conditions if c.get("type") == "Provisioned"), None)
        if prov is not None:
            return CheckVerdict(PENDING, str(prov.get("message") or ""))
    return CheckVerdict(PENDING, "")


def _retry_or_reject(
    prefix: str,
    cond: Mapping[str, Any],
    *,
    attempt: int,
    retry_count: int,
    limit: int,
    base: int,
    maximum: int,
) -> CheckVerdict:
    text = str(cond.get("message") or cond.get("reason") or "")
    if attempt <= limit:
        if attempt <= retry_count:
            # A request from an attempt already retried: stale, nothing new to report.
            return CheckVerdict(PENDING, "")
        return CheckVerdict(
            RETRY, f"{prefix}: {text}",
            requeue_after_seconds=backoff_seconds(retry_count, base=base, maximum=maximum),
        )
    return CheckVerdict(REJECTED, text)


def set_check_state(
    states: Sequence[Mapping[str, Any]],
    new: AdmissionCheckState,
    *,
    now: str,
) -> list[dict[str, Any]]:
    """``status.admissionChecks`` with ``new`` replacing the entry of the same name; every
    other check's entry is kept verbatim. lastTransitionTime moves only when the state
    changes; Kueue's retryCount is never touched."""
    out: list[dict[str, Any]] = []
    replaced = False
    for entry in states:
        if entry.get("name") != new.name:
            out.append(dict(entry))
            continue
        replaced = True
        ltt = entry.get("lastTransitionTime") if entry.get("state") == new.state else None
        out.append(_state_dict(new, ltt or now, entry.get("retryCount")))
    if not replaced:
        out.append(_state_dict(new, now, None))
    return out


def _state_dict(state: AdmissionCheckState, ltt: str, retry_count: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": state.name,
        "state": state.state,
        "lastTransitionTime": ltt,
        "message": state.message[:32768],
    }
    if state.requeue_after_seconds is not None:
        body["requeueAfterSeconds"] = state.requeue_after_seconds
    if retry_count is not None:
        body["retryCount"] = retry_count
    if state.pod_set_updates:
        body["podSetUpdates"] = [
            u.model_dump(by_alias=True, exclude_defaults=True) | {"name": u.name}
            for u in state.pod_set_updates
        ]
    return body


def same_state(entry: Mapping[str, Any] | None, new: AdmissionCheckState) -> bool:
    """Whether writing ``new`` would change nothing but lastTransitionTime."""
    if entry is None:
        return False
    probe = _state_dict(new, str(entry.get("lastTransitionTime")), entry.get("retryCount"))
    return dict(entry) == probe


# ---------------------------------------------------------------------------- podSetUpdates


@dataclass(frozen=True, slots=True)
class PodSetTarget:
    """What a Ready check adds to one pod set, and what the pod set already has."""

    name: str
    request: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """The chosen domain's labels (empty when the pod set is not confined)."""
    tolerations: Sequence[Mapping[str, Any]] = ()
    existing_selector: Mapping[str, str] = field(default_factory=dict)
    """The Workload's own nodeSelector plus its flavors' nodeLabels."""
    existing_annotations: Mapping[str, str] = field(default_factory=dict)
    existing_tolerations: Sequence[Mapping[str, Any]] = ()


def pod_set_updates(targets: Sequence[PodSetTarget], class_name: str) -> list[PodSetUpdate]:
    """podSetUpdates for a Ready check. They can only add: a key the pod set already sets to
    another value is a :class:`MergeConflict` naming the pod set, key and both values (the
    caller rejects the Workload with it rather than override the user's selector)."""
    updates = []
    for t in targets:
        annotations = {CONSUME_ANNOTATION: t.request, CLASS_ANNOTATION: class_name}
        for key, value in annotations.items():
            have = t.existing_annotations.get(key)
            if have is not None and have != value:
                raise MergeConflict(
                    f"pod set {t.name}: annotation {key} is {have!r} in the Workload, "
                    f"the booking needs {value!r}"
                )
        selector: dict[str, str] = {}
        for key, value in t.node_selector.items():
            have = t.existing_selector.get(key)
            if have is None:
                selector[key] = value
            elif have != value:
                raise MergeConflict(
                    f"pod set {t.name}: nodeSelector {key}={have} in the Workload or its "
                    f"flavor conflicts with the booked domain {key}={value}"
                )
        tolerations = [dict(x) for x in t.tolerations if dict(x) not in
                       [dict(e) for e in t.existing_tolerations]]
        updates.append(PodSetUpdate(
            name=t.name, annotations=annotations, nodeSelector=selector,
            tolerations=tolerations[:8],
        ))
    return updates


def parse_domain_detail(value: str) -> dict[str, str]:
    """``label=value,label=value`` (a ``muster.dev/podset.<name>`` detail) as a dict."""
    out: dict[str, str] = {}
    for part in value.split(","):
        key, sep, val = part.partition("=")
        if sep and key:
            out[key] = val
    return out


def taint_tolerations(taints: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Exact tolerations for ``taints`` (key, value and effect), deduplicated, in order."""
    out: list[dict[str, Any]] = []
    for taint in taints:
        tol: dict[str, Any] = {"key": str(taint.get("key", "")), "operator": "Equal",
                               "value": str(taint.get("value") or ""),
                               "effect": str(taint.get("effect") or "")}
        if tol not in out:
            out.append(tol)
    return out


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
            continue
        if tol.get("key") == taint.get("key") and (tol.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


# ---------------------------------------------------------------------------- TAS


class BadTopologyAssignment(ValueError):
    """A topologyAssignment Muster cannot read (names the slice and the problem)."""


def expand_topology_assignment(ta: TopologyAssignment) -> list[tuple[dict[str, str], int]]:
    """The (domain labels, pod count) pairs a v1beta2 topologyAssignment encodes."""
    out: list[tuple[dict[str, str], int]] = []
    for i, sl in enumerate(ta.slices):
        if len(sl.values_per_level) != len(ta.levels):
            raise BadTopologyAssignment(
                f"slice {i}: {len(sl.values_per_level)} valuesPerLevel for "
                f"{len(ta.levels)} levels"
            )
        columns: list[list[str]] = []
        for j, vals in enumerate(sl.values_per_level):
            if vals.universal is not None:
                columns.append([vals.universal] * sl.domain_count)
            elif vals.individual is not None:
                prefix = str(vals.individual.get("prefix") or "")
                suffix = str(vals.individual.get("suffix") or "")
                roots = [str(r) for r in vals.individual.get("roots") or []]
                if len(roots) != sl.domain_count:
                    raise BadTopologyAssignment(
                        f"slice {i} level {j}: {len(roots)} roots for domainCount "
                        f"{sl.domain_count}"
                    )
                columns.append([f"{prefix}{r}{suffix}" for r in roots])
            else:
                raise BadTopologyAssignment(f"slice {i} level {j}: no universal or individual")
        counts = sl.pod_counts
        if counts.universal is not None:
            per = [counts.universal] * sl.domain_count
        elif counts.individual is not None and len(counts.individual) == sl.domain_count:
            per = list(counts.individual)
        else:
            raise BadTopologyAssignment(f"slice {i}: podCounts do not match domainCount")
        for d in range(sl.domain_count):
            out.append(({lv: columns[k][d] for k, lv in enumerate(ta.levels)}, per[d]))
    return out
