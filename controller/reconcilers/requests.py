"""A read-only view of one ProvisioningRequest body, as the service needs it. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.conditions import ConditionType, find, is_true
from controller.state.bookings import (
    ATTEMPT_ANNOTATION,
    BOOKED_AT_ANNOTATION,
    FINALIZER,
    PHASE_ANNOTATION,
    RETRY_AT_ANNOTATION,
    UNREADY_ANNOTATION,
    Booking,
    Phase,
)


@dataclass(frozen=True, slots=True)
class RequestView:
    body: Mapping[str, Any]

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.body.get("metadata") or {}

    @property
    def name(self) -> str:
        return str(self.meta.get("name"))

    @property
    def namespace(self) -> str:
        return str(self.meta.get("namespace") or "default")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def uid(self) -> str:
        return str(self.meta.get("uid") or "")

    @property
    def generation(self) -> int | None:
        gen = self.meta.get("generation")
        return int(gen) if gen is not None else None

    @property
    def resource_version(self) -> str | None:
        rv = self.meta.get("resourceVersion")
        return str(rv) if rv is not None else None

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.meta.get("annotations") or {}

    @property
    def created_at(self) -> datetime | None:
        return parse_time(self.meta.get("creationTimestamp"))

    @property
    def finalizers(self) -> list[str]:
        return list(self.meta.get("finalizers") or [])

    @property
    def has_finalizer(self) -> bool:
        return FINALIZER in self.finalizers

    @property
    def deleting(self) -> bool:
        return bool(self.meta.get("deletionTimestamp"))

    @property
    def spec(self) -> Mapping[str, Any]:
        # Shapes the CRD schema would refuse can still arrive (a cluster without the schema,
        # the sandbox): every accessor reads them as absent, and the service fails the
        # request naming the field (gang()).
        spec = self.body.get("spec")
        return spec if isinstance(spec, Mapping) else {}

    @property
    def class_name(self) -> str:
        return str(self.spec.get("provisioningClassName") or "")

    @property
    def parameters(self) -> Mapping[str, str]:
        params = self.spec.get("parameters")
        return params if isinstance(params, Mapping) else {}

    @property
    def template_names(self) -> list[str]:
        """The PodTemplates ``spec.podSets`` refers to."""
        out = []
        pod_sets = self.spec.get("podSets")
        for ps in pod_sets if isinstance(pod_sets, list) else []:
            ref = ps.get("podTemplateRef") if isinstance(ps, dict) else None
            name = ref.get("name") if isinstance(ref, dict) else None
            if name and name not in out:
                out.append(str(name))
        return out

    @property
    def total_pods(self) -> int:
        total = 0
        pod_sets = self.spec.get("podSets")
        for ps in pod_sets if isinstance(pod_sets, list) else []:
            try:
                total += int(ps.get("count", 0))
            except (AttributeError, TypeError, ValueError):
                continue
        return total

    @property
    def conditions(self) -> Sequence[Mapping[str, Any]]:
        return list((self.body.get("status") or {}).get("conditions") or [])

    def condition_true(self, type_: ConditionType) -> bool:
        return is_true(self.conditions, type_)

    def condition(self, type_: ConditionType) -> Mapping[str, Any] | None:
        return find(self.conditions, type_)

    @property
    def phase(self) -> Phase:
        """Where the request is. The status decides a terminal outcome (Failed, booking
        ended): it is written first, so an annotation still saying otherwise is only a
        write a crash or an error cut short, repaired by the reconcile."""
        if self.condition_true(ConditionType.FAILED):
            return Phase.FAILED
        if self.ended_condition is not None:
            return Phase.ENDED
        phase = self.annotated_phase
        if phase is Phase.ACQUIRING and self.condition_true(ConditionType.PROVISIONED):
            return Phase.BOOKED
        return phase

    @property
    def annotated_phase(self) -> Phase:
        """The ``muster.dev/phase`` annotation alone (what the cache and collector read)."""
        try:
            return Phase(self.annotations.get(PHASE_ANNOTATION, ""))
        except ValueError:
            return Phase.NEW

    @property
    def ended_condition(self) -> Mapping[str, Any] | None:
        """BookingExpired=True or CapacityRevoked=True, if the booking ended."""
        for type_ in (ConditionType.CAPACITY_REVOKED, ConditionType.BOOKING_EXPIRED):
            cond = self.condition(type_)
            if cond is not None and cond.get("status") == "True":
                return cond
        return None

    @property
    def attempt(self) -> int:
        try:
            return int(self.annotations.get(ATTEMPT_ANNOTATION, "0"))
        except ValueError:
            return 0

    @property
    def unready_acquisitions(self) -> int:
        try:
            return int(self.annotations.get(UNREADY_ANNOTATION, "0"))
        except ValueError:
            return 0

    @property
    def booking(self) -> Booking | None:
        return Booking.of(self.annotations)

    @property
    def retry_at(self) -> datetime | None:
        return parse_time(self.annotations.get(RETRY_AT_ANNOTATION))

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


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
