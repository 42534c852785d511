"""One ProvisioningRequest as Muster reads it: parsed once, when it arrives. Pure.

:func:`RequestRecord.parse` reads a request body (a watch event, a list, the answer to one
of Muster's own writes) into a frozen record; :class:`controller.state.cache.ClusterState`
holds one per request, and the service, the collector, the telemetry and ``kubectl muster``
read its fields instead of the body. The ``muster.dev/plan`` annotation is decoded here and
nowhere else (:attr:`RequestRecord.booking`); an unchanged annotation keeps the Booking of
the previous record (the snapshot's memoised plans hang on its identity).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.common.conditions import ConditionType, find, is_true
from controller.lifecycle import (
    ATTEMPT_ANNOTATION,
    BOOKED_AT_ANNOTATION,
    FINALIZER,
    PLAN_ANNOTATION,
    POD_SETS_ANNOTATION,
    RETRY_AT_ANNOTATION,
    UNREADY_ANNOTATION,
    Phase,
    annotated_phase,
    ended_condition,
    phase_of,
)
from controller.state.bookings import Booking


@dataclass(frozen=True, slots=True)
class RequestRecord:
    body: Mapping[str, Any]
    """The object as received (status writes start from its conditions)."""
    name: str
    namespace: str
    uid: str
    generation: int | None
    resource_version: str | None
    annotations: Mapping[str, str]
    finalizers: tuple[str, ...]
    deleting: bool
    created_at: datetime | None
    class_name: str
    parameters: Mapping[str, str]
    template_names: tuple[str, ...]
    """The PodTemplates ``spec.podSets`` refers to, each once, in order."""
    total_pods: int
    conditions: tuple[Mapping[str, Any], ...]
    annotated_phase: Phase
    """The ``muster.dev/phase`` annotation alone (what the cache and collector read)."""
    attempt: int
    unready_acquisitions: int
    retry_at: datetime | None
    booking: Booking | None
    """The ``muster.dev/plan`` annotation, decoded; None when absent or unreadable."""
    booking_error: str | None
    """Why the annotation could not be read (a hand edit), None when it could."""
    template_pod_sets: Mapping[str, str]
    """``muster.dev/pod-sets``: template name -> Workload pod set (empty when absent)."""

    @classmethod
    def parse(cls, body: Mapping[str, Any], previous: RequestRecord | None = None) -> RequestRecord:
        """``previous``: the record this body replaces; its Booking is kept when the plan
        annotation did not change (most events of a booked request touch its status only)."""
        meta = body.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        # Shapes the CRD schema would refuse can still arrive (a cluster without the schema,
        # the sandbox): every field reads them as absent, and the service fails the request
        # naming the field (build_gang).
        spec = body.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        params = spec.get("parameters")
        pod_sets = spec.get("podSets")
        pod_sets = pod_sets if isinstance(pod_sets, list) else []
        names: list[str] = []
        total = 0
        for ps in pod_sets:
            ref = ps.get("podTemplateRef") if isinstance(ps, dict) else None
            name = ref.get("name") if isinstance(ref, dict) else None
            if name and str(name) not in names:
                names.append(str(name))
            try:
                total += int(ps.get("count", 0))
            except (AttributeError, TypeError, ValueError):
                continue
        text = annotations.get(PLAN_ANNOTATION)
        booking: Booking | None = None
        error: str | None = None
        if text:
            if previous is not None and previous.annotations.get(PLAN_ANNOTATION) == text:
                booking, error = previous.booking, previous.booking_error
            else:
                try:
                    booking = Booking.from_annotation(text)
                except ValueError as exc:
                    error = str(exc)
        gen = meta.get("generation")
        rv = meta.get("resourceVersion")
        phase = annotated_phase(annotations)
        return cls(
            body=body,
            name=str(meta.get("name")),
            namespace=str(meta.get("namespace") or "default"),
            uid=str(meta.get("uid") or ""),
            generation=int(gen) if gen is not None else None,
            resource_version=str(rv) if rv is not None else None,
            annotations=annotations,
            finalizers=tuple(meta.get("finalizers") or ()),
            deleting=bool(meta.get("deletionTimestamp")),
            created_at=parse_time(meta.get("creationTimestamp")),
            class_name=str(spec.get("provisioningClassName") or ""),
            parameters=params if isinstance(params, Mapping) else {},
            template_names=tuple(names),
            total_pods=total,
            conditions=tuple((body.get("status") or {}).get("conditions") or ()),
            annotated_phase=phase,
            attempt=_int(annotations.get(ATTEMPT_ANNOTATION)),
            unready_acquisitions=_int(annotations.get(UNREADY_ANNOTATION)),
            retry_at=parse_time(annotations.get(RETRY_AT_ANNOTATION)),
            booking=booking,
            booking_error=error,
            template_pod_sets=_pod_sets(annotations.get(POD_SETS_ANNOTATION)),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def has_finalizer(self) -> bool:
        return FINALIZER in self.finalizers

    def condition_true(self, type_: ConditionType) -> bool:
        return is_true(self.conditions, type_)

    def condition(self, type_: ConditionType) -> Mapping[str, Any] | None:
        return find(self.conditions, type_)

    @property
    def class_details(self) -> Mapping[str, str]:
        return (self.body.get("status") or {}).get("provisioningClassDetails") or {}

    @property
    def phase(self) -> Phase:
        """Where the request is (:func:`controller.lifecycle.phase_of`)."""
        return phase_of(self.conditions, self.annotated_phase)

    @property
    def ended_condition(self) -> Mapping[str, Any] | None:
        """BookingExpired=True or CapacityRevoked=True, if the booking ended."""
        return ended_condition(self.conditions)

    @property
    def booked_at(self) -> datetime | None:
        """When Provisioned became True (the booking's start)."""
        stamp = parse_time(self.annotations.get(BOOKED_AT_ANNOTATION))
        if stamp is not None:
            return stamp
        cond = self.condition(ConditionType.PROVISIONED)
        if cond is not None and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
        return None


def _pod_sets(text: str | None) -> Mapping[str, str]:
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def _int(text: str | None) -> int:
    try:
        return int(text or "0")
    except ValueError:
        return 0


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None

