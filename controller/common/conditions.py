"""Condition types and reasons Muster writes on ProvisioningRequests, in one place.

Reasons reuse cluster-autoscaler's names where the meaning is the same (Kueue and dashboards
already know them); Muster-only reasons are added for failures CA never reports (invalid
input, acquisition rollback, revoked capacity). Every message says what happened and what to
do about it. :func:`set_condition` is pure: it returns the new conditions list for a
``/status`` merge patch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal


class ConditionType(enum.StrEnum):
    ACCEPTED = "Accepted"
    PROVISIONED = "Provisioned"
    FAILED = "Failed"
    BOOKING_EXPIRED = "BookingExpired"
    CAPACITY_REVOKED = "CapacityRevoked"


class Reason(enum.StrEnum):
    # upstream (cluster-autoscaler provisioningrequest/conditions/conditions.go)
    ACCEPTED = "Accepted"
    CAPACITY_IS_FOUND = "CapacityIsFound"
    CAPACITY_IS_NOT_FOUND = "CapacityIsNotFound"
    CAPACITY_IS_PROVISIONED = "CapacityIsProvisioned"
    FAILED_TO_CREATE_PODS = "FailedToCreatePods"
    FAILED_TO_BOOK_CAPACITY = "FailedToBookCapacity"
    RESERVATION_TIME_EXPIRED = "CapacityReservationTimeExpired"
    BOOKING_CONSUMED = "CapacityBookingConsumed"
    # Muster's own
    INVALID_PARAMETERS = "InvalidParameters"
    NEVER_FITS = "CapacityNeverFits"
    RETRIES_EXHAUSTED = "RetriesExhausted"
    PROVISIONING = "Provisioning"
    ACQUISITION_FAILED = "AcquisitionFailed"
    NODES_NOT_READY = "NodesNotReady"
    NODES_VANISHED = "BookedNodesVanished"
    NODES_UNUSABLE = "BookedNodesUnusable"
    OVER_BUDGET = "OverBudget"
    NAMESPACE_LIMIT_REACHED = "NamespaceLimitReached"
    UNSUPPORTED_CONSTRAINT = "UnsupportedConstraint"
    TEMPLATE_DELETED = "PodTemplateDeleted"
    TEMPLATE_CHANGED = "PodTemplateChanged"
    POOL_UNUSABLE = "PoolUnusable"
    QUEUED_FOR_CAPACITY = "QueuedForCapacity"
    RUN_DURATION_EXPIRED = "RunDurationExpired"
    POOL_DELETED = "CapacityPoolDeleted"


MESSAGES: Mapping[Reason, str] = {
    Reason.ACCEPTED: "ProvisioningRequest is accepted by Muster.",
    Reason.CAPACITY_IS_FOUND: "Capacity is found in the cluster and booked: {where}.",
    Reason.CAPACITY_IS_NOT_FOUND: (
        "Capacity is not found: {detail}. Muster retries (attempt {attempt} of {max_attempts}, "
        "next in {delay:.0f}s); free capacity, raise the pool's limits or stock, or delete "
        "the request."
    ),
    Reason.CAPACITY_IS_PROVISIONED: (
        "Capacity is provisioned and booked: {where} ({new_nodes} new node(s))."
    ),
    Reason.FAILED_TO_CREATE_PODS: (
        "Cannot build the pods of this request: {detail}. Create {missing}, then recreate "
        "the request (its spec is immutable)."
    ),
    Reason.FAILED_TO_BOOK_CAPACITY: (
        "Lost the PodTemplate(s) while booking: {detail}. Recreate them and the request."
    ),
    Reason.RESERVATION_TIME_EXPIRED: (
        "Capacity reservation time is expired: {booked} of {total} pod(s) were scheduled "
        "within {seconds:.0f}s; unused new nodes are released. Create the pods sooner or "
        "raise booking.duration_seconds."
    ),
    Reason.BOOKING_CONSUMED: "Capacity booking consumed: all {total} pod(s) scheduled.",
    Reason.INVALID_PARAMETERS: (
        "Invalid request: {detail}. Fix it and recreate the request (its spec is immutable)."
    ),
    Reason.NEVER_FITS: (
        "The request can never fit: {detail}. No amount of waiting helps; make the gang "
        "smaller, relax its topology, or add a CapacityPool that can hold it."
    ),
    Reason.RETRIES_EXHAUSTED: (
        "Capacity is not found after {attempts} attempt(s): {detail}. Free capacity or add "
        "stock, then recreate the request."
    ),
    Reason.PROVISIONING: "Acquiring {new_nodes} node(s) all or nothing (attempt {attempt}).",
    Reason.ACQUISITION_FAILED: (
        "Acquisition attempt {attempt} failed and was rolled back: {detail}. Muster retries "
        "(next in {delay:.0f}s)."
    ),
    Reason.NODES_NOT_READY: (
        "Acquired nodes were not Ready within {seconds:.0f}s: {detail}. They were released; "
        "check the provider and the pool's bootstrap, or raise the pool's "
        "spec.registrationTimeoutSeconds (default acquisition.node_ready_timeout_seconds)."
    ),
    Reason.NODES_VANISHED: (
        "Booked node(s) disappeared before the pods used them: {detail}. Create a new "
        "request to book capacity again."
    ),
    Reason.NODES_UNUSABLE: (
        "Booked existing node(s) can no longer take the gang's pods: {detail}. Create a new "
        "request to book capacity again."
    ),
    Reason.UNSUPPORTED_CONSTRAINT: (
        "The pods carry a placement constraint Muster does not plan: {detail}. Muster refuses "
        "rather than book capacity the scheduler might not use; remove the constraint or "
        "provision this gang another way (see docs/design/filter-parity.md)."
    ),
    Reason.TEMPLATE_DELETED: (
        "PodTemplate(s) {detail} the booking was planned from were deleted before the "
        "booking was consumed: the booking is revoked (not re-planned) and unused new nodes "
        "are released. Recreate the templates and the request to book again."
    ),
    Reason.TEMPLATE_CHANGED: (
        "PodTemplate(s) {detail} changed after the booking was planned from them: the "
        "booking is revoked (not re-planned) and unused new nodes are released. Create a new "
        "request to book for the new pods."
    ),
    Reason.NAMESPACE_LIMIT_REACHED: (
        "Waiting for the namespace's limits: {detail}. Muster retries (attempt {attempt} of "
        "{max_attempts}, next in {delay:.0f}s); delete requests of this namespace or let "
        "their nodes go idle, or raise budgets.namespaces in Muster's config."
    ),
    Reason.POOL_UNUSABLE: (
        "Waiting for a CapacityPool that would hold the gang but is unusable: {detail}. "
        "Muster retries (attempt {attempt} of {max_attempts}, next in {delay:.0f}s); fix the "
        "pool (its status names the problem) and the request provisions at its next attempt, "
        "or delete the request."
    ),
    Reason.QUEUED_FOR_CAPACITY: (
        "Queued for capacity since {since}: {detail}. The request waits without a retry "
        "limit; delete it to leave the queue."
    ),
    Reason.RUN_DURATION_EXPIRED: (
        "The run duration ended at {end} ({why}): the booking's new nodes are released."
    ),
    Reason.POOL_DELETED: (
        "CapacityPool {pools} was deleted while the gang waited in its cloud queue: "
        "{cancelled}; whatever a grant had created was released. Create the request again "
        "to queue through another pool."
    ),
    Reason.OVER_BUDGET: (
        "The plan exceeds the budget: {detail}. Raise budgets.* in Muster's config or make "
        "the gang smaller."
    ),
}


def message(reason: Reason, **fields: Any) -> str:
    """The reason's message with ``fields`` filled in."""
    return MESSAGES[reason].format(**fields)


def rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: Sequence[Mapping[str, Any]], type_: ConditionType) -> Mapping[str, Any] | None:
    for cond in conditions:
        if cond.get("type") == type_:
            return cond
    return None


def is_true(conditions: Sequence[Mapping[str, Any]], type_: ConditionType) -> bool:
    cond = find(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    *,
    type_: ConditionType,
    status: bool,
    reason: Reason,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """Return ``conditions`` with ``type_`` set (metav1.Condition semantics).

    ``lastTransitionTime`` only moves when the status flips, as the API conventions require;
    a new reason or message alone keeps the old time.
    """
    new_status = "True" if status else "False"
    out: list[dict[str, Any]] = []
    replaced = False
    for cond in conditions:
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        replaced = True
        ltt = cond.get("lastTransitionTime") if cond.get("status") == new_status else None
        out.append(_condition(type_, new_status, reason, message, ltt or rfc3339(now), generation))
    if not replaced:
        out.append(_condition(type_, new_status, reason, message, rfc3339(now), generation))
    return out


def _condition(
    type_: ConditionType,
    status: str,
    reason: Reason,
    msg: str,
    ltt: str,
    generation: int | None,
) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": str(type_),
        "status": status,
        "reason": str(reason),
        "message": msg[:32768],
        "lastTransitionTime": ltt,
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    return cond


@dataclass(frozen=True, slots=True)
class Transition:
    """A condition whose status or reason a status write changed (or that it added)."""

    type: str
    status: bool
    reason: str
    message: str


def transitions(
    before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]
) -> list[Transition]:
    """The conditions of ``after`` that are new or differ from ``before`` in status or
    reason; a new message alone (the next retry's attempt number) is not a transition."""
    old = {c.get("type"): (c.get("status"), c.get("reason")) for c in before}
    return [
        Transition(type=str(c.get("type")), status=c.get("status") == "True",
                   reason=str(c.get("reason") or ""), message=str(c.get("message") or ""))
        for c in after
        if old.get(c.get("type")) != (c.get("status"), c.get("reason"))
    ]


EventType = Literal["Normal", "Warning"]

RETRY_REASONS = frozenset({
    Reason.CAPACITY_IS_NOT_FOUND, Reason.ACQUISITION_FAILED, Reason.NODES_NOT_READY,
    Reason.POOL_UNUSABLE,
})
"""Provisioned=False reasons of a request that Muster retries."""

OUTCOME_EVENTS: tuple[tuple[ConditionType, EventType], ...] = (
    (ConditionType.FAILED, "Warning"),
    (ConditionType.CAPACITY_REVOKED, "Warning"),
    (ConditionType.PROVISIONED, "Normal"),
    (ConditionType.BOOKING_EXPIRED, "Normal"),
)
"""Conditions whose turning True is an Event, in order of precedence."""


def event_of(changes: Sequence[Transition]) -> tuple[EventType, Transition] | None:
    """The one Event a status write is worth, if any.

    Outcomes only, so the happy path costs a single Event (Provisioned=True): Accepted and
    Provisioning are routine. Failed wins over the Provisioned=False written with it.
    """
    by_type = {t.type: t for t in changes}
    for type_, kind in OUTCOME_EVENTS:
        t = by_type.get(type_)
        if t is not None and t.status:
            return kind, t
    t = by_type.get(ConditionType.PROVISIONED)
    if t is not None and not t.status and t.reason in RETRY_REASONS:
        return "Warning", t
    return None
