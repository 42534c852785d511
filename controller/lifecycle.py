"""A ProvisioningRequest's life cycle in one place: its phases, the ``muster.dev/*`` keys
Muster keeps on it, the rule that reads the phase, and the transition table the reconcile
(:mod:`controller.reconcilers.provisioning`) follows. Pure data and pure functions.

Muster's own state lives in annotations; conditions are written with ``/status`` merge
patches. Both cannot go in one write, so each row's writes are ordered for repair: a plan is
persisted (phase Acquiring) before the status write that makes it a booking, and an outcome
(Failed, booking ended) is written to the status first, where it decides the phase
(:func:`phase_of`), with the annotations following. Whatever a crash or a failed write cuts
short, the next reconcile redoes: the repair rows below.

The reconcile takes every transition through :func:`take`, which refuses a (phase, event)
pair the table does not hold; ``tests/test_lifecycle_table.py`` drives every row
and checks its writes and next phase, and ``docs/design/state-machine.md`` holds the table
as :func:`markdown` renders it (a test compares them).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.common.conditions import ConditionType, is_true

PLAN_ANNOTATION = "muster.dev/plan"
ATTEMPT_ANNOTATION = "muster.dev/attempt"
UNREADY_ANNOTATION = "muster.dev/unready-acquisitions"
"""Acquisitions of this request whose nodes were not Ready in time (launched, paid, released)."""
PHASE_ANNOTATION = "muster.dev/phase"
RETRY_AT_ANNOTATION = "muster.dev/retry-at"
BOOKED_AT_ANNOTATION = "muster.dev/booked-at"
TEMPLATES_ANNOTATION = "muster.dev/templates"
"""PodTemplate name -> digest of what the plan was made from (``template_digest``)."""
QUEUED_SINCE_ANNOTATION = "muster.dev/queued-since"
"""When a queued-class request first waited for capacity (its queued message says since when)."""
QUEUED_THROUGH_ANNOTATION = "muster.dev/queued-through"
"""JSON, acquisition key -> the provider and parameters of the pool its gang was queued
through: a pool whose provider changes meanwhile is cancelled through the one that queued."""
POD_SETS_ANNOTATION = "muster.dev/pod-sets"
"""On the requests Muster's Kueue check creates: JSON, PodTemplate name -> the Workload pod set
it was drafted from (a pod set Kueue TAS split over domains has one template per domain)."""
FINALIZER = "muster.dev/release-nodes"


class Phase(enum.StrEnum):
    """Where a request is in Muster's life cycle (``muster.dev/phase``)."""

    NEW = ""
    ACQUIRING = "Acquiring"
    """Plan and keys persisted; provider calls may be in flight (resumed after a restart)."""
    BOOKED = "Booked"
    """Provisioned=True; capacity held for the request's pods. Written right after the
    Provisioned=True status write (two writes: the status and the metadata are separate
    endpoints); until it lands, Acquiring plus Provisioned=True reads as Booked."""
    ENDED = "Ended"
    """Booking consumed, expired or revoked; nodes in use stay until idle."""
    FAILED = "Failed"


def annotated_phase(annotations: Mapping[str, str]) -> Phase:
    """The ``muster.dev/phase`` annotation alone (an unknown value reads as new)."""
    try:
        return Phase(annotations.get(PHASE_ANNOTATION, ""))
    except ValueError:
        return Phase.NEW


def ended_condition(conditions: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """BookingExpired=True or CapacityRevoked=True, if the booking ended."""
    for type_ in (ConditionType.CAPACITY_REVOKED, ConditionType.BOOKING_EXPIRED):
        cond = next((c for c in conditions if c.get("type") == type_), None)
        if cond is not None and cond.get("status") == "True":
            return cond
    return None


def phase_of(conditions: Sequence[Mapping[str, Any]], annotated: Phase) -> Phase:
    """Where the request is. The status decides a terminal outcome (Failed, booking
    ended): it is written first, so an annotation still saying otherwise is only a write a
    crash or an error cut short, repaired by the reconcile."""
    if is_true(conditions, ConditionType.FAILED):
        return Phase.FAILED
    if ended_condition(conditions) is not None:
        return Phase.ENDED
    if annotated is Phase.ACQUIRING and is_true(conditions, ConditionType.PROVISIONED):
        return Phase.BOOKED
    return annotated


class Step(enum.StrEnum):
    """What the reconcile does with a request in a phase (:data:`STEPS`)."""

    PLAN = "plan"
    ACQUIRE = "acquire"
    """Resume the persisted acquisition (re-read from the API server first)."""
    HOLD = "hold"
    """Check the booking: consumed, revoked, expired, or still holding."""
    REPAIR_ENDED = "repair ended"
    REPAIR_FAILED = "repair failed"
    FINALIZE = "finalize"
    """The request is being deleted (whatever its phase)."""


STEPS: Mapping[Phase, Step] = {
    Phase.NEW: Step.PLAN,
    Phase.ACQUIRING: Step.ACQUIRE,
    Phase.BOOKED: Step.HOLD,
    Phase.ENDED: Step.REPAIR_ENDED,
    Phase.FAILED: Step.REPAIR_FAILED,
}


def step_for(phase: Phase, *, deleting: bool) -> Step:
    return Step.FINALIZE if deleting else STEPS[phase]


class Event(enum.StrEnum):
    """What happened in a reconcile, deciding its writes."""

    BACKING_OFF = "backing off"
    """The retry timer has not fired (and no capacity change woke the request)."""
    AWAITING_OBJECTS = "awaiting objects"
    """A PodTemplate, pool, node or DRA object it needs may only be late."""
    STILL_NO_FIT = "still no fit"
    """Woken ahead of its timer, still no fit: the timer and condition stand."""
    PLANNED = "planned"
    ANNOUNCED = "announced"
    """The acquisition still runs after ``acquisition.announce_after_seconds``."""
    LAUNCHED = "launched"
    """The provider answered: its nodes' names and providerIDs go on the plan."""
    CONFIRMED = "confirmed"
    """Nodes Ready (or none needed): Provisioned=True, then phase Booked."""
    RETRY = "retry"
    FAILED = "failed"
    HOLDING = "holding"
    ENDED = "ended"
    """Consumed, expired or revoked."""
    REPAIRED = "repaired"
    """A write a crash or an error cut short, redone."""
    DELETED = "deleted"
    QUEUED = "queued"
    """A queued-class gang waits in the cloud's queue (enqueued, not yet granted)."""
    WAITING = "waiting"
    """A queued-class gang found no capacity: it waits in Muster's own queue, no retry limit."""


@dataclass(frozen=True, slots=True)
class Row:
    phase: Phase
    event: Event
    writes: tuple[str, ...]
    """In order. ``status: T=S`` sets condition T; ``annotations: k=v`` (``k=-``: removed)
    patches the ``muster.dev/k`` annotations; ``finalizer: +``/``-``; a trailing ``?``:
    only when it changes something."""
    next: Phase | None
    """None: the request is gone (its finalizer dropped)."""


_PLAN = ("annotations: plan=…, attempt=n, phase=Acquiring, retry-at=-, templates=…",
         "finalizer: + ?")
_RETRY = ("annotations: attempt=n, unready-acquisitions=n|-, retry-at=…, phase=-, plan=-",
          "status: Accepted=True, Provisioned=False")
_FAIL = ("status: Accepted=True, Provisioned=False, Failed=True",
         "annotations: phase=Failed, plan=-, retry-at=-, attempt=n ?")
_CONFIRM = ("status: Accepted=True, Provisioned=True ?", "annotations: phase=Booked ?")
_END = ("status: BookingExpired|CapacityRevoked=True", "annotations: phase=Ended")
_DELETE = ("finalizer: - ?",)
_WAIT = ("annotations: attempt=n, retry-at=…, phase=-, plan=-, queued-since=…",
         "status: Accepted=True, Provisioned=False")

TABLE: tuple[Row, ...] = (
    Row(Phase.NEW, Event.BACKING_OFF, (), Phase.NEW),
    Row(Phase.NEW, Event.AWAITING_OBJECTS, (), Phase.NEW),
    Row(Phase.NEW, Event.STILL_NO_FIT, (), Phase.NEW),
    Row(Phase.NEW, Event.PLANNED, _PLAN, Phase.ACQUIRING),
    Row(Phase.NEW, Event.RETRY, _RETRY, Phase.NEW),
    Row(Phase.NEW, Event.FAILED, _FAIL, Phase.FAILED),
    Row(Phase.ACQUIRING, Event.ANNOUNCED, ("status: Accepted=True, Provisioned=False",),
        Phase.ACQUIRING),
    Row(Phase.ACQUIRING, Event.LAUNCHED, ("annotations: plan=…",), Phase.ACQUIRING),
    Row(Phase.ACQUIRING, Event.CONFIRMED, _CONFIRM, Phase.BOOKED),
    Row(Phase.ACQUIRING, Event.RETRY, _RETRY, Phase.NEW),
    Row(Phase.ACQUIRING, Event.FAILED, _FAIL, Phase.FAILED),
    Row(Phase.NEW, Event.WAITING, _WAIT, Phase.NEW),
    Row(Phase.ACQUIRING, Event.QUEUED, ("annotations: queued-since=…, queued-through=… ?",
                                        "status: Accepted=True, Provisioned=False"),
        Phase.ACQUIRING),
    Row(Phase.ACQUIRING, Event.WAITING, _WAIT, Phase.NEW),
    Row(Phase.BOOKED, Event.CONFIRMED, _CONFIRM, Phase.BOOKED),
    Row(Phase.BOOKED, Event.HOLDING, ("annotations: phase=Booked ?",), Phase.BOOKED),
    Row(Phase.BOOKED, Event.ENDED, ("annotations: phase=Booked ?", *_END), Phase.ENDED),
    Row(Phase.ENDED, Event.REPAIRED, ("status: BookingExpired|CapacityRevoked=True ?",
                                      "annotations: phase=Ended ?"), Phase.ENDED),
    Row(Phase.FAILED, Event.REPAIRED, ("status: Accepted=True, Provisioned=False, "
                                       "Failed=True ?",
                                       "annotations: phase=Failed, plan=-, retry-at=- ?"),
        Phase.FAILED),
    *(Row(phase, Event.DELETED, _DELETE, None) for phase in Phase),
)

_BY_KEY: dict[tuple[Phase, Event], Row] = {(r.phase, r.event): r for r in TABLE}


class NotInTable(RuntimeError):
    """The reconcile took a transition the table does not hold (a bug of Muster's)."""


def take(phase: Phase, event: Event, table: Sequence[Row] = TABLE) -> Row:
    """The row for ``event`` in ``phase``; :class:`NotInTable` when there is none."""
    row = _BY_KEY.get((phase, event)) if table is TABLE else next(
        (r for r in table if r.phase is phase and r.event is event), None)
    if row is None:
        raise NotInTable(f"no transition for event {event.value!r} in phase "
                         f"{phase.value or 'new'!r}")
    return row


def markdown(table: Sequence[Row] = TABLE) -> str:
    """The table as ``docs/design/state-machine.md`` shows it."""
    lines = ["| Phase | Event | Writes, in order | Next phase |", "|---|---|---|---|"]
    for r in table:
        writes = "<br>".join(f"`{w}`" for w in r.writes) or "none"
        nxt = "(gone)" if r.next is None else (r.next.value or "new")
        lines.append(f"| {r.phase.value or 'new'} | {r.event.value} | {writes} | {nxt} |")
    return "\n".join(lines) + "\n"
